#!/usr/bin/env python3
"""libspecx against the Python runtime on one artifact: the same prompts and settings, decode
tokens per second of each (medians over repeats, the two runtimes alternating so that the VM's
drift falls on both), their ratio, and a check that both produced the same tokens.

    .venv/bin/python scripts/bench_libspecx.py build/smollm2 --modes none:0 int8:4 int8:auto
    .venv/bin/python scripts/bench_libspecx.py build/qwen-int4 --threads 2 --json out.json
    .venv/bin/python scripts/bench_libspecx.py build/qwen-int4 --modes none:0 draft:3 \
        --genai ~/.cache/specx/genai/qwen-coder --genai-k 2 3 4

With --genai (a pair from scripts/setup_genai.sh, run by .venv-genai's python through
apps/bench/data/genai_runner.py on the same token ids) it also runs ONNX Runtime GenAI's target
alone and its speculation at each --genai-k, and compares the fastest modes, prefill included
(tokens over the whole generation's time, as GenAI's runner counts them).

A mode is DRAFTER:K (K a number or auto). Greedy, on the first --prompts prompts of `specx
bench`'s code and chat workloads (apps/bench/data/workloads.json), encoded as the bench encodes
them. Run nothing else meanwhile: the numbers are wall time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "native" / "libspecx" / "bindings" / "python"))

from specx_c import K_AUTO, Library  # noqa: E402

from specx.apps.bench import load_workloads  # noqa: E402
from specx.runtime import Pipeline  # noqa: E402

WORKLOADS = ("code", "chat")


def parse_mode(mode: str) -> tuple[str, int | str]:
    name, _, k = mode.partition(":")
    return name, "auto" if k == "auto" else int(k or 0)


def encoded_prompts(pipeline: Pipeline, workload: str, count: int) -> list[list[int]]:
    """The workload's first `count` prompts, through the chat template where it asks for one."""
    spec = load_workloads()[workload]
    chat = bool(spec.get("chat")) and pipeline.manifest.chat_template is not None
    texts = spec["prompts"][:count]
    return [pipeline.encode_prompt(t, chat=chat).tolist() for t in texts]


def run_mode(
    lib_model: Any,
    pipeline: Pipeline,
    prompts: list[list[int]],
    name: str,
    k: int | str,
    args: Any,
) -> dict[str, Any]:
    c_rates, c_overall, py_rates, same = [], [], [], True
    for _ in range(args.repeats):
        for prompt in prompts:
            c = lib_model.generate(prompt, args.new_tokens, K_AUTO if k == "auto" else k, name)
            py = pipeline.generate(prompt, k=k, drafter=name, max_new_tokens=args.new_tokens)
            c_rates.append(c.stats["decode_tokens_per_s"])
            c_overall.append(c.stats["tokens_per_s"])
            py_rates.append(py.stats.decode_tokens_per_s)
            same = same and c.tokens == py.token_ids
    c_med, py_med = statistics.median(c_rates), statistics.median(py_rates)
    return {
        "c_tok_s": round(c_med, 2),
        "c_tok_s_with_prefill": round(statistics.median(c_overall), 2),
        "python_tok_s": round(py_med, 2),
        "ratio": round(c_med / py_med, 3),
        "same_tokens": same,
        "c_runs": [round(r, 2) for r in c_rates],
        "python_runs": [round(r, 2) for r in py_rates],
    }


def genai_modes(pair: Path, prompts: list[list[int]], ks: list[int], args: Any) -> dict[str, float]:
    """GenAI's tokens/s (prefill included, median over prompts and repeats) per mode."""
    import subprocess
    import tempfile

    from specx.apps.bench.genai_peer import DEFAULT_PYTHON, model_folders

    target, draft = model_folders(pair)
    runner = ROOT / "apps" / "bench" / "data" / "genai_runner.py"
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        prompt_file = Path(tmp) / "prompts.json"
        prompt_file.write_text(json.dumps(prompts))
        modes = [("genai target", [])]
        modes += [(f"genai K={k}", ["--draft", str(draft), "--k", str(k)]) for k in ks if draft]
        for mode, extra in modes:
            cmd = [str(ROOT / DEFAULT_PYTHON), str(runner), "--target", str(target)]
            cmd += ["--prompts", str(prompt_file), "--max-new-tokens", str(args.new_tokens)]
            cmd += ["--repeats", str(args.repeats), *extra]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            out[mode] = float(json.loads(done.stdout)["median_tokens_per_s"])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--modes", nargs="+", default=["none:0"])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=2, help="prompts of each workload")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: default)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--genai", type=Path, help="a GenAI pair (scripts/setup_genai.sh)")
    parser.add_argument("--genai-k", type=int, nargs="+", default=[2, 3, 4])
    args = parser.parse_args()
    lib = Library()
    model = lib.load(args.artifact, threads=args.threads)
    pipeline = Pipeline.load(args.artifact, threads=args.threads or None)
    results: dict[str, Any] = {"artifact": str(args.artifact), "new_tokens": args.new_tokens}
    print(f"{'workload':8} {'mode':18} {'C tok/s':>8} {'Py tok/s':>8} {'C/Py':>6}  same")
    for workload in WORKLOADS:
        prompts = encoded_prompts(pipeline, workload, args.prompts)
        model.generate(prompts[0], 8, 0, "none")  # warm both runtimes' sessions
        pipeline.generate(prompts[0], k=0, drafter="none", max_new_tokens=8)
        for mode in args.modes:
            name, k = parse_mode(mode)
            row = run_mode(model, pipeline, prompts, name, k, args)
            results[f"{workload} {mode}"] = row
            print(
                f"{workload:8} {mode:18} {row['c_tok_s']:8.2f} {row['python_tok_s']:8.2f} "
                f"{row['ratio']:6.3f}  {row['same_tokens']}"
            )
        if args.genai:
            compare_genai(results, workload, genai_modes(args.genai, prompts, args.genai_k, args))
    model.close()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def compare_genai(results: dict[str, Any], workload: str, genai: dict[str, float]) -> None:
    """Print and record the C library's fastest mode against GenAI's, prefill included."""
    ours = {
        m.split(" ", 1)[1]: r["c_tok_s_with_prefill"]
        for m, r in results.items()
        if m.startswith(workload + " ") and isinstance(r, dict) and "c_tok_s" in r
    }
    best, best_rate = max(ours.items(), key=lambda m: m[1])
    theirs, their_rate = max(genai.items(), key=lambda m: m[1])
    for mode, rate in genai.items():
        print(f"{workload:8} {mode:18} {rate:8.2f}  (prefill included)")
    ratio = best_rate / their_rate
    print(
        f"{workload:8} C fastest {best} {best_rate:.2f} / GenAI fastest {theirs} "
        f"{their_rate:.2f} tok/s = {ratio:.2f}x (prefill included)"
    )
    results[f"{workload} genai"] = {
        **genai,
        "c_fastest": best,
        "c_fastest_tok_s": best_rate,
        "genai_fastest": theirs,
        "ratio": round(ratio, 3),
    }


if __name__ == "__main__":
    raise SystemExit(main())
