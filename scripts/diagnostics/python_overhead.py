"""How much of a Python generation is not ONNX Runtime: the bound on what a C loop can gain.

    python scripts/diagnostics/python_overhead.py ARTIFACT [--modes none:0 int8:4] [--repeats 3]

Runs the first two prompts of `specx bench`'s code and chat workloads (greedy, 128 new tokens)
with the Python runtime and splits each generation's wall time into ONNX Runtime's runs
(`InferenceSession.run_with_iobinding`, target and draft graphs) and the rest (the runtime's
own work: binding, argmax, acceptance, bookkeeping). A loop with no cost of its own outside
ONNX Runtime (libspecx at best) runs at most total / runs times faster. Medians over prompts and
repeats; nothing else may run meanwhile.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from onnxruntime.capi.onnxruntime_inference_collection import InferenceSession

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from bench_libspecx import encoded_prompts, parse_mode  # noqa: E402

from specx.runtime import Pipeline  # noqa: E402

INSIDE = [0.0]


def timed_runs() -> None:
    """Count the time spent inside every InferenceSession.run_with_iobinding."""
    original = InferenceSession.run_with_iobinding

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            INSIDE[0] += time.perf_counter() - t0

    InferenceSession.run_with_iobinding = run  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--modes", nargs="+", default=["none:0"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    timed_runs()
    pipeline = Pipeline.load(args.artifact, threads=args.threads)
    prompts = [p for w in ("code", "chat") for p in encoded_prompts(pipeline, w, 2)]
    pipeline.generate(prompts[0], k=0, drafter="none", max_new_tokens=8)  # warm the sessions
    print(f"{'mode':18} {'total ms':>9} {'ORT ms':>9} {'rest ms':>8} {'rest %':>7} {'bound':>6}")
    for mode in args.modes:
        name, k = parse_mode(mode)
        rest_share, totals, inside = [], [], []
        for _ in range(args.repeats):
            for prompt in prompts:
                INSIDE[0] = 0.0
                t0 = time.perf_counter()
                pipeline.generate(prompt, k=k, drafter=name, max_new_tokens=args.new_tokens)
                total = time.perf_counter() - t0
                totals.append(total)
                inside.append(INSIDE[0])
                rest_share.append(1 - INSIDE[0] / total)
        share = statistics.median(rest_share)
        total_ms, ort_ms = statistics.median(totals) * 1e3, statistics.median(inside) * 1e3
        print(
            f"{mode:18} {total_ms:9.1f} {ort_ms:9.1f} {total_ms - ort_ms:8.1f} "
            f"{share * 100:6.1f}% {1 / (1 - share):6.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
