"""Which ONNX Runtime releases run specx graphs, measured: the reference consumer
(reference/consumer.py) on tiny artifacts of every graph kind, under older onnxruntime releases,
against specx's own token ids.

    python scripts/diagnostics/ort_versions.py [VERSION ...]    (default: 1.16.3 .. 1.20.1)

Builds tiny Llama artifacts in a temporary folder: a gqa fp32 target with int8 and int4 drafts,
and a plain fp32 target; and a tiny Qwen2 GGUF pair exported with --precision int4 (MatMulNBits
carrying every block type, GatherBlockQuantized). For each version it makes a venv
($TMPDIR/specx-ort-VERSION) with onnxruntime==VERSION, numpy and tokenizers from PyPI, runs the
consumer there on every graph (greedy, 24 tokens, the target alone and each draft at K=3), and
compares the token ids with specx's. Prints the operators each graph kind uses and a table:
version x graph kind -> ok, or the first line of the error.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
VERSIONS = (
    "1.16.3",
    "1.17.3",
    "1.18.1",
    "1.19.2",
    "1.20.1",
    "1.21.1",
    "1.22.1",
    "1.23.2",
    "1.24.4",
    "1.26.0",
    "1.28.0",
    "1.30.0",
    "1.32.0",
)
PROMPT = [11, 57, 103, 7, 42]
NEW = 24


def operators(graph: Path) -> list[str]:
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    return sorted({f"{n.domain or 'ai.onnx'}:{n.op_type}" for n in model.graph.node})


def build(root: Path) -> dict[str, tuple[Path, str, int]]:
    """graph kind -> (artifact, drafter, K); "self" drafts with the target's own graph, so its
    row tests the target's multi-token verify passes alone"""
    import tiny_models
    from specx.exporter import ExportOptions, export_pair

    tok = tiny_models.build_tokenizer()
    src = tiny_models.save(
        tiny_models.build_model("llama", tok.get_vocab_size(), 1), tok, root / "s"
    )
    quiet = lambda _m: None  # noqa: E731
    drafts = ["int8", "int4", f"self={src}"]
    export_pair(str(src), drafts, root / "gqa", ExportOptions(max_length=128), log=quiet)
    export_pair(
        str(src), [], root / "plain", ExportOptions(max_length=128, attention="plain"), log=quiet
    )
    gemma = tiny_models.build_model("gemma3", tok.get_vocab_size(), 1)  # windows of 5 positions
    gsrc = tiny_models.save(gemma, tok, root / "g")
    window = ExportOptions(max_length=128)
    export_pair(str(gsrc), [f"self={gsrc}"], root / "window", window, log=quiet)
    from tests.gguf_models import write_gguf  # a pair of GGUF files with every carried type

    target = write_gguf(root / "t.gguf", "qwen2", seed=0)
    draft = write_gguf(root / "d.gguf", "qwen2", seed=0, redraw=("blk.1.ffn_down.weight",))
    int4 = ExportOptions(max_length=128, precision="int4")
    export_pair(str(target), [str(draft)], root / "nbits", int4, log=quiet)
    return {
        "gqa fp32 target": (root / "gqa", "none", 0),
        "gqa verify passes (K=3)": (root / "gqa", "self", 3),
        "int8 draft": (root / "gqa", "int8", 3),
        "int4 draft": (root / "gqa", "int4", 3),
        "plain fp32 target": (root / "plain", "none", 0),
        "gqa sliding windows, verify (K=3)": (root / "window", "self", 3),
        "int4 model graphs (--precision), target": (root / "nbits", "none", 0),
        "int4 model graphs, draft (K=3)": (root / "nbits", "draft", 3),
    }


def main() -> int:
    from specx.runtime import Pipeline

    versions = sys.argv[1:] or list(VERSIONS)
    with tempfile.TemporaryDirectory() as tmp:
        kinds = build(Path(tmp))
        want = {}
        for kind, (artifact, drafter, k) in kinds.items():
            graph = artifact / ("target.onnx" if drafter in ("none", "self") else f"{drafter}.onnx")
            print(f"{kind}: {', '.join(operators(graph))}")
            result = Pipeline.load(artifact).generate(
                PROMPT, max_new_tokens=NEW, k=k, drafter=drafter
            )
            want[kind] = result.token_ids
        rows = []
        for version in versions:
            venv = Path(tempfile.gettempdir()) / f"specx-ort-{version}"
            if not (venv / "bin" / "python").exists():
                subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
                numpy = "numpy<2" if version < "1.19" else "numpy"
                subprocess.run(
                    [
                        str(venv / "bin" / "python"),
                        "-m",
                        "pip",
                        "install",
                        "-q",
                        f"onnxruntime=={version}",
                        numpy,
                        "tokenizers",
                    ],
                    check=True,
                )
            cells = []
            for kind, (artifact, drafter, k) in kinds.items():
                code = (
                    "import json, runpy\n"
                    f"c = runpy.run_path({str(ROOT / 'reference' / 'consumer.py')!r})\n"
                    f"r = c['generate'](__import__('pathlib').Path({str(artifact)!r}), {PROMPT}, "
                    f"{NEW}, {drafter!r}, {k}, None)\n"
                    "print(json.dumps(r['token_ids']))\n"
                )
                proc = subprocess.run(
                    [str(venv / "bin" / "python"), "-c", code],
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                if proc.returncode:
                    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
                    cells.append(f"error: {lines[-1][:90] if lines else '?'}")
                else:
                    same = json.loads(proc.stdout.splitlines()[-1]) == want[kind]
                    cells.append("ok" if same else "DIFFERENT TOKENS")
            rows.append((version, cells))
    print(f"\n| onnxruntime | {' | '.join(kinds)} |")
    print("|---|" + "---|" * len(kinds))
    for version, cells in rows:
        print(f"| {version} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
