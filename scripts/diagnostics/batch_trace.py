"""What -k auto's batch planner expected of its steps, and what they gave, next to speculation off.

    python scripts/diagnostics/batch_trace.py ARTIFACT [--concurrency 2] [--rounds 2] [--drafter D]
    python scripts/diagnostics/batch_trace.py ARTIFACT --bench [--rounds 2] [--drafter D]

Runs the chat workload's prompts (as `specx bench --concurrency` does: batch after batch of
`--concurrency` requests until every prompt ran, 64 new tokens) first once per mode to warm up
(speculation off, K = 2, -k auto at 1 and 2 requests, so that the planner starts from what it
learned, as in the bench), then `--rounds` times: -k auto, then speculation off. For each -k auto
round it prints aggregate tokens/s of both modes and, per row count and kind of step (plain, or
some row drafted), the planned steps, their expected and realized tokens per second
(`WidthPlanner.observe_step`) and the planner's current correction (`realized_share`). Nothing else
may run meanwhile.

--bench: runs `specx bench --concurrency 1,2,4,8 --k 1,2,3 --workloads chat --prompts 5` itself
(its own code, `--rounds` repeats), prints its table, then the same sums over the whole run per
row count and kind of step, and the shared draft-model runs per row count (how many, and their
seconds): what -k auto's steps did inside the bench, where the other modes and concurrencies run
between its batches.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

from specx.apps.bench.concurrency import (
    concurrency_modes,
    format_concurrency,
    run_concurrency,
    together_batches,
)
from specx.apps.bench.runner import load_workloads
from specx.runtime import Pipeline
from specx.runtime.batch.widths import Expected, WidthPlanner
from specx.runtime.settings import GenerationSettings

# (rows, drafted) -> [steps, expected tokens, expected s, tokens, s], since the last clear()
Sums = defaultdict[tuple[int, bool], list[float]]
# rows -> [shared draft-model runs, their seconds]
DraftRuns = defaultdict[int, list[float]]


class TracingPlanner(WidthPlanner):
    """The pipeline's planner, also summing what each kind of step expected and gave."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: Sums = defaultdict(lambda: [0.0] * 5)
        self.draft_runs: DraftRuns = defaultdict(lambda: [0.0, 0.0])

    def observe_step(self, expected: Expected, tokens: int, seconds: float) -> None:
        rows, drafted, expected_tokens, expected_s = expected
        sums = self.steps[(rows, drafted)]
        for i, x in enumerate((1.0, expected_tokens, expected_s, float(tokens), seconds)):
            sums[i] += x
        super().observe_step(expected, tokens, seconds)

    def observe_draft(self, rows: int, k: int, seconds: float) -> None:
        runs = self.draft_runs[rows]
        runs[0] += 1
        runs[1] += seconds
        super().observe_draft(rows, k, seconds)

    def report(self) -> list[str]:
        """The sums, a line per row count and kind of step."""
        lines = []
        for (rows, drafted), (n, et, es, t, s) in sorted(self.steps.items()):
            share = self.realized_share(rows, drafted)
            kind = "drafted" if drafted else "plain"
            lines.append(
                f"  {rows} rows {kind:8} steps {n:4.0f}  expected {et / es:6.1f} tok/s "
                f"({et / n:.2f} tok, {1000 * es / n:.1f} ms)  realized {t / s:6.1f} tok/s "
                f"({t / n:.2f} tok, {1000 * s / n:.1f} ms)  correction {share:.3f}"
            )
        return lines


def bench_steps(
    pipe: Pipeline, repeats: int, drafter: str, prompts: int = 5, new_tokens: int = 64
) -> list[str]:
    """The concurrency bench's run (its own code) with a tracing planner: its table, then what
    -k auto's planned steps expected and gave, and the shared draft-model runs, per row count."""
    planner = pipe.batch_pass_costs = TracingPlanner()
    texts = load_workloads()["chat"]["prompts"][:prompts]
    chat = pipe.manifest.chat_template is not None  # as the bench encodes them
    ids = [pipe.codec.encode_chat(t) if chat else pipe.codec.encode(t) for t in texts]
    modes = concurrency_modes(drafter, (1, 2, 3), True)
    results = run_concurrency(pipe, ids, (1, 2, 4, 8), modes, new_tokens, repeats, lambda _m: None)
    lines = [format_concurrency(results), "-k auto's planned steps over the run:"]
    lines += planner.report()
    lines += [
        f"  {rows} rows: {n:.0f} shared draft-model runs, {s:.2f} s"
        for rows, (n, s) in sorted(planner.draft_runs.items())
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifact")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--drafter", default="ngram+int8")
    parser.add_argument("--bench", action="store_true", help="trace the concurrency bench's run")
    args = parser.parse_args()
    pipe = Pipeline.load(args.artifact)
    if args.bench:
        print("\n".join(bench_steps(pipe, args.rounds, args.drafter)))
        return
    planner = pipe.batch_pass_costs = TracingPlanner()
    prompts = [pipe.codec.encode_chat(t) for t in load_workloads()["chat"]["prompts"]]

    def run(c: int, k: int | str) -> float:
        drafter = "none" if k == 0 else args.drafter
        settings = GenerationSettings(max_new_tokens=64, k=k, drafter=drafter, max_k=4)
        tokens, t0 = 0, time.perf_counter()
        for batch in together_batches(len(prompts), c, 0):
            results = pipe.generate_batch([prompts[i] for i in batch], settings, max_batch=c)
            tokens += sum(r.stats.new_tokens for r in results)
        return tokens / (time.perf_counter() - t0)

    for k in (0, 2, "auto"):
        for c in sorted({1, 2, args.concurrency}):
            run(c, k)
    for round_ in range(args.rounds):
        planner.steps.clear()
        auto = run(args.concurrency, "auto")
        off = run(args.concurrency, 0)
        c = args.concurrency
        print(f"round {round_ + 1}: {c} requests, -k auto {auto:.1f} tok/s, off {off:.1f}")
        print("\n".join(planner.report()))


if __name__ == "__main__":
    main()
