"""Run every bad input through the real CLI and write docs/errors.md: what the user sees.

    .venv/bin/python scripts/error_table.py [docs/errors.md]

Builds tiny models in a temporary folder (no network), breaks artifacts and inputs on purpose,
runs `specx` in a subprocess for each case, and records the exit code and the message. The table
is generated, not written by hand: rerun it after changing a message.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def specx(*args: str, stdin_bytes: bytes | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "specx.apps.cli.main", *args],
        input=stdin_bytes,
        capture_output=True,
        timeout=600,
    )
    out, err = (proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace"))
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def message(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
    picked = [
        ln
        for ln in lines
        if ln.startswith(("error:", "fix:", "note:", "removed", "Error:", "Usage:"))
        or " tokens in " in ln
    ]
    text = " / ".join(picked) if picked else (lines[-1] if lines else "(nothing)")
    if "Traceback" in proc.stderr:
        text += " [TRACEBACK]"
    return text.replace("|", "\\|")


def main() -> int:
    import tiny_models
    from specx.exporter import ExportOptions, export_pair

    out_path = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "errors.md"
    rows: list[tuple[str, str, int, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tok = tiny_models.build_tokenizer()
        target = tiny_models.save(
            tiny_models.build_model("llama", tok.get_vocab_size(), 1), tok, root / "target"
        )
        other_tok = tiny_models.build_tokenizer(300)
        foreign = tiny_models.save(
            tiny_models.build_model("llama", other_tok.get_vocab_size(), 2),
            other_tok,
            root / "foreign",
        )
        from transformers import BertConfig, OPTConfig

        OPTConfig(
            vocab_size=50, hidden_size=16, num_hidden_layers=1, ffn_dim=32, num_attention_heads=2
        ).save_pretrained(root / "opt")
        BertConfig(
            vocab_size=50,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            architectures=["BertForMaskedLM"],
        ).save_pretrained(root / "bert")
        art = root / "artifact"
        export_pair(
            str(target), [f"mixed={target}"], art, ExportOptions(max_length=64), log=lambda _m: None
        )

        def case(kind: str, what: str, *args: str) -> None:
            proc = specx(*args)
            rows.append((kind, what, proc.returncode, message(proc)))

        def broken(change: str) -> Path:
            folder = root / f"broken-{len(rows)}"
            shutil.copytree(art, folder)
            if change == "no-graph":
                (folder / "target.onnx").unlink()
            elif change == "no-tokenizer":
                (folder / "tokenizer.json").unlink()
            elif change == "truncated":
                data = (folder / "target.onnx").read_bytes()
                (folder / "target.onnx").write_bytes(data[: len(data) // 3])
            elif change in ("newer", "missing-field", "io", "huge", "outside", "type"):
                manifest = json.loads((folder / "manifest.json").read_text())
                if change == "newer":
                    manifest["format_version"] = 7
                elif change == "missing-field":
                    manifest.pop("pair_id")
                elif change == "huge":
                    manifest["max_length"] = 10**9
                    for model in (manifest["target"], *manifest["drafts"]):
                        model["max_length"] = 10**9
                elif change == "outside":
                    manifest["tokenizer"] = "../../etc/passwd"
                elif change == "type":
                    manifest["drafts"][0]["num_heads"] = "four"
                else:
                    manifest["target"]["num_layers"] += 1
                (folder / "manifest.json").write_text(json.dumps(manifest))
            elif change == "mixed":
                other = root / "other-export"
                export_pair(
                    str(target), [], other, ExportOptions(max_length=64), log=lambda _m: None
                )
                shutil.copy(other / "target.onnx", folder / "target.onnx")
            return folder

        exp = ("export", "--target")
        case("export", "missing model path", *exp, str(root / "nope"), "-o", str(root / "o1"))
        case("export", "folder without config.json", *exp, str(root), "-o", str(root / "o2"))
        case("export", "not a causal LM (BERT)", *exp, str(root / "bert"), "-o", str(root / "o3"))
        case(
            "export",
            "unsupported architecture (OPT)",
            *exp,
            str(root / "opt"),
            "-o",
            str(root / "o4"),
        )
        case(
            "export",
            "draft with another tokenizer",
            *exp,
            str(target),
            "--draft",
            str(foreign),
            "-o",
            str(root / "o5"),
        )
        case("export", "output folder exists", *exp, str(target), "-o", str(art))
        case(
            "export",
            "unknown profile",
            *exp,
            str(target),
            "--profile",
            "tpu",
            "-o",
            str(root / "o6"),
        )
        case(
            "export",
            "context above the model's limit (profile cpu, 2048 > 256)",
            *exp,
            str(target),
            "--profile",
            "cpu",
            "-o",
            str(root / "o7"),
        )
        case(
            "export",
            "--engines without TensorRT",
            *exp,
            str(target),
            "--profile",
            "gpu-datacenter",
            "--engines",
            "-o",
            str(root / "o8"),
        )
        run = ("run",)
        case("artifact", "missing folder", *run, str(root / "none"), "-p", "hi")
        case("artifact", "graph file missing", *run, str(broken("no-graph")), "-p", "hi")
        case("artifact", "tokenizer missing", *run, str(broken("no-tokenizer")), "-p", "hi")
        case("artifact", "truncated .onnx", *run, str(broken("truncated")), "-p", "hi")
        case("artifact", "manifest from a newer format", *run, str(broken("newer")), "-p", "hi")
        case("artifact", "manifest field missing", *run, str(broken("missing-field")), "-p", "hi")
        case("artifact", "graph I/O differ from the manifest", *run, str(broken("io")), "-p", "hi")
        case("artifact", "graph from another export", *run, str(broken("mixed")), "-p", "hi")
        case(
            "artifact",
            "manifest max_length 10**9 (graphs made for 64)",
            *run,
            str(broken("huge")),
            "-p",
            "hi",
        )
        case("artifact", "manifest file name outside the folder", "info", str(broken("outside")))
        case("artifact", "manifest field of the wrong type", "info", str(broken("type")))
        a = str(art)
        case("run", "empty prompt", *run, a, "-p", "  ")
        case("run", "prompt longer than the context", *run, a, "-p", "The cat sat. " * 40)
        case(
            "run", "max-new-tokens past the cache", *run, a, "-p", "The cat", "-n", "500", "-k", "0"
        )
        case("run", "K out of range", *run, a, "-p", "hi", "-k", "40")
        case("run", "K not a number", *run, a, "-p", "hi", "-k", "lots")
        case("run", "negative temperature", *run, a, "-p", "hi", "--temperature", "-1")
        case("run", "top-p outside (0, 1]", *run, a, "-p", "hi", "--top-p", "1.5")
        case("run", "top-k < 0", *run, a, "-p", "hi", "--top-k", "-3")
        case("run", "unknown drafter", *run, a, "-p", "hi", "--draft", "turbo")
        bad = root / "latin1.txt"
        bad.write_bytes(b"caf\xe9")
        case("run", "prompt file not UTF-8", *run, a, "--prompt-file", str(bad))
        case("run", "CUDA asked for, not installed", *run, a, "-p", "hi", "--provider", "cuda")
        binary = specx(*run, a, stdin_bytes=b"\xff\xfe\x00binary")
        rows.append(("run", "binary bytes on standard input", binary.returncode, message(binary)))
        case("run", "negative seed", *run, a, "-p", "hi", "--temperature", "1", "--seed", "-1")
        case(
            "run",
            "subnormal temperature (1e-310)",
            *run,
            a,
            "-p",
            "hi",
            "-n",
            "4",
            "--temperature",
            "1e-310",
        )
        case("run", "-k 4 with --draft none", *run, a, "-p", "hi", "--draft", "none", "-k", "4")
        case("run", "zero threads", *run, a, "-p", "hi", "--threads", "0")
        case("run", "unknown verification", *run, a, "-p", "hi", "--verification", "lucky")
        lark = root / "broken.lark"
        lark.write_text("start: missing_rule\n")
        schema = root / "schema.json"
        schema.write_text("{not json")
        case("run", "grammar with an undefined rule", *run, a, "-p", "hi", "--grammar", str(lark))
        case("run", "JSON Schema file not JSON", *run, a, "-p", "hi", "--json-schema", str(schema))
        case("run", "grammar of unknown format", *run, a, "-p", "hi", "--grammar", str(bad))
        cycle = root / "cycle.json"
        cycle.write_text(json.dumps({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}))
        wide = root / "wide.json"
        members = {f"p{i}": {"type": "integer"} for i in range(600)}
        wide.write_text(json.dumps({"type": "object", "properties": members}))
        case(
            "run",
            "JSON Schema that allows no text",
            *run,
            a,
            "-p",
            "hi",
            "--json-schema",
            str(cycle),
        )
        case(
            "run",
            "JSON Schema past a matcher limit",
            *run,
            a,
            "-p",
            "hi",
            "--json-schema",
            str(wide),
        )
        case("run", "two constraints", *run, a, "-p", "hi", "--json-object", "--grammar", str(lark))
        case("run", "--logprobs without --json", *run, a, "-p", "hi", "--logprobs", "2")
        case(
            "serve",
            "--batch without a batched graph",
            "serve",
            a,
            "--batch",
            "4",
            "--max-concurrency",
            "4",
        )
        case("serve", "--batch above --max-concurrency", "serve", a, "--batch", "8")
        case(
            "serve",
            "--batch without a batched graph (triton)",
            "triton",
            a,
            "-o",
            str(root / "t1"),
            "--batch",
            "4",
        )
        case("bench", "--concurrency 0", "bench", a, "--concurrency", "0,2")
        case("bench", "unknown session", "bench", a, "--sessions", "poetry")
        case("run", "negative --prompt-cache-mb", *run, a, "-p", "hi", "--prompt-cache-mb", "-1")
        case("serve", "negative --prompt-cache-mb", "serve", a, "--prompt-cache-mb", "-5")
        # an export killed by SIGKILL midway, then the next export to the same place
        killed = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "specx.apps.cli.main",
                "export",
                "--target",
                str(target),
                "--draft",
                "int8",
                "--max-length",
                "64",
                "-o",
                str(root / "o9"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        while not list(root.glob(".o9.partial-*/target.onnx")) and killed.poll() is None:
            time.sleep(0.02)
        killed.kill()
        killed.wait()
        case("export", "after an export killed midway", *exp, str(target), "-o", str(root / "o9"))
        # Ctrl-C during a generation
        long_model = tiny_models.build_model("llama", tok.get_vocab_size(), 1, max_positions=4096)
        long_src = tiny_models.save(long_model, tok, root / "long-src")
        long_art = root / "long"
        export_pair(
            str(long_src), [], long_art, ExportOptions(max_length=4096), log=lambda _m: None
        )
        command = ["run", str(long_art), "-p", "The cat", "-n", "4000", "-k", "0", "--threads", "1"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "specx.apps.cli.main", *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        proc.stdout.read(1)  # text is streamed: the first character means generation runs
        time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        rows.append(
            (
                "run",
                "Ctrl-C during generation",
                proc.returncode,
                message(subprocess.CompletedProcess([], proc.returncode, "", err)),
            )
        )
    lines = [
        "# Bad input and what the user sees",
        "",
        "Generated by `scripts/error_table.py`, which runs each case through the real `specx` "
        "CLI in a subprocess. Exit code 2 = the user's input, 130 = interrupted; no case prints "
        "a traceback (`--debug` shows one).",
        "",
        "| where | bad input | exit | message |",
        "|---|---|---|---|",
    ]
    lines += [f"| {k} | {w} | {c} | {m} |" for k, w, c, m in rows]
    out_path.write_text("\n".join(lines) + "\n")
    print(f"wrote {out_path} ({len(rows)} cases)")
    tracebacks = [w for _, w, _, m in rows if "[TRACEBACK]" in m]
    return 1 if tracebacks else 0


if __name__ == "__main__":
    os.environ.pop("SPECX_THREAD_POOL", None)
    sys.exit(main())
