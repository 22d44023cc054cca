"""What -k auto's bookkeeping costs per batch step: deciding, planning, the drafter's lookup.

    python scripts/diagnostics/plan_costs.py ARTIFACT [--concurrency 4] [--batches 6]
        [--drafter ngram+int8] [--plain-most 0]

Runs the chat workload's first five prompts with -k auto through `Pipeline.generate_batch`
(`--concurrency` rows, 64 new tokens; two batches to warm up, then `--batches` batches) and
prints, from timers wrapped around them in place:
- microseconds per call of a batch step, of deciding one row's K (`Sequence.decide`), of
  planning a step (`WidthPlanner.plan`) and of a drafter's `source` (its n-gram lookup); how
  many steps were steps of a plain run, which are not planned (`WidthPlanner.PLAIN_MOST`);
- per row count, the plan searches (`Plans.search`) of the measured batches: how many, how many
  widths got past the search's bound (a width whose bound does not beat the plan in which no row
  drafts is skipped), and the median microseconds of the same searches replayed afterwards, 20
  times each, with their shared drafting costs looked up from a table (in place, the first
  search of a step also computes those costs).
Nothing else may run meanwhile. It reads only interfaces older than itself, so it also runs
against earlier code: put a folder first on PYTHONPATH holding `specx/runtime`, `specx/apps`, ...
as links to that checkout's folders (as scripts/test.sh does for mypy).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from specx.apps.bench.runner import load_workloads
from specx.runtime import Pipeline
from specx.runtime.backends.ort_session import use_global_thread_pool
from specx.runtime.batch.decoder import BatchDecoder
from specx.runtime.batch.plans import Plans
from specx.runtime.batch.widths import WidthPlanner
from specx.runtime.decode.sequence import Sequence
from specx.runtime.drafters.hybrid import HybridDrafter

spent: defaultdict[str, list[float]] = defaultdict(list)  # part -> seconds of each call
searches: list[tuple[Plans, int, dict[tuple[int, int], float]]] = []
measuring = [False]
recording_s = [0.0]  # seconds spent recording searches, left out of every timer


def timed(cls: Any, name: str, label: str) -> None:
    inner = getattr(cls, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0, recorded = time.perf_counter(), recording_s[0]
        try:
            return inner(*args, **kwargs)
        finally:
            if measuring[0]:
                spent[label].append(time.perf_counter() - t0 - (recording_s[0] - recorded))

    setattr(cls, name, wrapper)


def recorded_search(inner: Callable[[Plans, int], list[int]]) -> Callable[[Plans, int], list[int]]:
    def search(plans: Plans, widest: int) -> list[int]:
        found = inner(plans, widest)
        t0 = time.perf_counter()
        if measuring[0]:  # the shared drafting costs it may ask, frozen for the replay
            rows = len(plans.expected) + plans.fixed_shared_rows
            costs = {
                (r, k): plans.shared_draft_s(r, k)
                for r in range(1, rows + 1)
                for k in range(1, max(widest, plans.fixed_shared_k + 1) + 1)
            }
            searches.append((plans, widest, costs))
        recording_s[0] += time.perf_counter() - t0
        return found

    return search


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifact")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--drafter", default="ngram+int8")
    parser.add_argument(
        "--plain-most",
        type=int,
        help="set WidthPlanner.PLAIN_MOST (0: every batch step planned, as before plain runs)",
    )
    args = parser.parse_args()
    if args.plain_most is not None:
        WidthPlanner.PLAIN_MOST = args.plain_most
    timed(BatchDecoder, "step", "step")
    timed(Sequence, "decide", "deciding a row")
    timed(WidthPlanner, "plan", "planning a step")
    timed(HybridDrafter, "source", "a drafter's source")
    Plans.search = recorded_search(Plans.search)  # type: ignore[method-assign]
    plain_steps = [0]
    if hasattr(WidthPlanner, "_in_plain_run"):  # (code before plain runs has none)
        in_run = WidthPlanner._in_plain_run

        def counted(self: WidthPlanner, *args: Any) -> bool:
            found = in_run(self, *args)
            plain_steps[0] += found and measuring[0]
            return found

        WidthPlanner._in_plain_run = counted  # type: ignore[method-assign]
    use_global_thread_pool()
    pipe = Pipeline.load(args.artifact)
    prompts = load_workloads()["chat"]["prompts"][:5]
    options = {"max_new_tokens": 64, "chat": True, "drafter": args.drafter, "k": "auto"}
    for batch in range(2 + args.batches):
        measuring[0] = batch >= 2
        pipe.generate_batch(prompts, max_batch=args.concurrency, **options)
    print(
        f"-k auto, {args.concurrency} rows, {args.batches} batches of the 5 chat prompts"
        + ("" if args.plain_most is None else f", PLAIN_MOST={args.plain_most}")
    )
    for label, seconds in spent.items():
        print(f"  {label:20s} {len(seconds):6d} calls {statistics.mean(seconds) * 1e6:8.1f} us")
    steps = len(spent["step"])
    print(f"  steps of plain runs (not planned): {plain_steps[0]} of {steps}")
    measuring[0] = False  # (the replay below searches too)
    by_rows: defaultdict[int, list[tuple[int, float]]] = defaultdict(list)
    for plans, widest, costs in searches:
        frozen = dataclasses.replace(plans, shared_draft_s=lambda r, k, c=costs: c[(r, k)])
        plain = frozen.rate([0] * len(frozen.expected))
        bound = frozen._bounds(widest)
        past = sum(bound(w) > plain for w in range(2, widest + 1))
        frozen.search(widest)  # warm
        t0 = time.perf_counter()
        for _ in range(20):
            frozen.search(widest)
        by_rows[len(plans.expected)].append((past, (time.perf_counter() - t0) / 20))
    for rows, found in sorted(by_rows.items()):
        widths = sorted(p for p, _ in found)
        print(
            f"  {rows} rows: {len(found):4d} searches, widths past the bound: median "
            f"{statistics.median(widths):.0f}, {sum(p == 0 for p in widths)} with none; "
            f"replayed {statistics.median(s for _, s in found) * 1e6:6.1f} us a search"
        )


if __name__ == "__main__":
    main()
