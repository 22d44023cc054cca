"""Where each mode's time goes inside the concurrency bench's own run, at one concurrency.

    .venv/bin/python scripts/bench_parts.py ARTIFACT [--concurrency 4] [--repeats 5]
        [--drafter ngram+int8]

Runs `specx bench`'s concurrency code as the CLI does (one global thread pool; every mode, fixed K
1..3, -k auto and speculation off, unit by unit in the bench's turning order; the chat workload's
first five prompts, 64 new tokens), at one concurrency only, and sums per mode over the run: the
batches' wall time and tokens, and inside it the prompt reads (`BatchDecoder._prefill`), the
decoding steps' target passes (`OrtSession.forward_rows` outside a prefill), drafting
(`BatchDecoder._draft_all`), deciding (`_decide`), planning (`WidthPlanner.plan`), the rest of the
steps, and what lies outside the steps (setting the batch up, collecting results). Prints one line
per mode and -k auto's difference from speculation off in each part. Nothing else may run
meanwhile.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter, defaultdict
from typing import Any

from specx.apps.bench import concurrency as bench
from specx.apps.bench.runner import load_workloads
from specx.runtime import Pipeline
from specx.runtime.backends.ort_session import OrtSession, use_global_thread_pool
from specx.runtime.batch_widths import WidthPlanner
from specx.runtime.batching import BatchDecoder

PARTS = ("prefill", "target passes", "drafting", "deciding", "planning", "steps")
spent: defaultdict[str, Counter[str]] = defaultdict(Counter)
current = ["?"]  # the mode whose batch runs now
inside = [""]  # the part being timed (a prefill's passes count as the prefill's)


def timed(cls: Any, name: str, part: str) -> None:
    inner = getattr(cls, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if inside[0] == "prefill" and part == "target passes":
            return inner(*args, **kwargs)  # a pass inside a prefill: the prefill's time
        outer, inside[0] = inside[0], part if part == "prefill" else inside[0]
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[current[0]][part] += time.perf_counter() - t0
            inside[0] = outer

    setattr(cls, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifact")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--drafter", default="ngram+int8")
    args = parser.parse_args()
    use_global_thread_pool()  # as the CLI's bench
    pipe = Pipeline.load(args.artifact)
    chat = pipe.manifest.chat_template is not None
    texts = load_workloads()["chat"]["prompts"][:5]
    prompts = [pipe.codec.encode_chat(t) if chat else pipe.codec.encode(t) for t in texts]
    modes = bench.concurrency_modes(args.drafter, (1, 2, 3), True)

    together = bench._together

    def traced_together(p: Pipeline, batch: list, settings: Any) -> dict[str, Any]:
        current[0] = "off" if settings.k == 0 else f"K={settings.k}"
        run = together(p, batch, settings)
        spent[current[0]]["wall"] += run["wall_s"]
        spent[current[0]]["tokens"] += run["tokens"]
        return run

    bench._together = traced_together  # type: ignore[assignment]
    timed(BatchDecoder, "_prefill", "prefill")
    timed(BatchDecoder, "step", "steps")
    timed(OrtSession, "forward_rows", "target passes")
    timed(BatchDecoder, "_draft_all", "drafting")
    timed(BatchDecoder, "_decide", "deciding")
    timed(WidthPlanner, "plan", "planning")
    # warm up as the bench's earlier units would have (every mode at 1 and 2 requests)
    bench.run_concurrency(pipe, prompts, (1, 2), modes, 64, 1, lambda _m: None)
    spent.clear()
    bench.run_concurrency(pipe, prompts, (args.concurrency,), modes, 64, args.repeats, print)
    print(f"\n{args.concurrency} requests, seconds summed over {args.repeats} repeats:")
    for mode, t in spent.items():
        steps = t["steps"] - t["prefill"]  # step() includes its prefill
        rest = steps - sum(t[p] for p in ("target passes", "drafting", "deciding", "planning"))
        outside = t["wall"] - t["steps"]
        print(
            f"  {mode:7s} {t['tokens'] / t['wall']:6.1f} tok/s  wall {t['wall']:6.2f}  "
            + "  ".join(f"{p} {t[p]:.2f}" for p in PARTS[:5])
            + f"  rest of steps {rest:.2f}  outside steps {outside:.2f}"
        )
    auto, off = spent.get("K=auto"), spent.get("off")
    if auto and off:
        scale = off["tokens"] / auto["tokens"]  # per the same tokens
        print(
            "  -k auto minus off, per off's tokens: "
            + "  ".join(f"{p} {scale * auto[p] - off[p]:+.2f}" for p in ("wall", *PARTS))
        )


if __name__ == "__main__":
    main()
