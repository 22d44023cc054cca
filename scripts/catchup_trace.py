"""What -k auto pays for draft-model catch-ups in small batches, against speculation off.

    .venv/bin/python scripts/catchup_trace.py ARTIFACT [--concurrency 2] [--rounds 6]

After the bench's sequence of -k auto runs (alone, then batches of 1, 2, 4 and 8 requests, twice;
the chat workload's first five prompts, 64 new tokens, ngram+int8, max K 4):

1. three rounds of the bench's --concurrency batches with -k auto, printing every shared
   draft-model run: its rows, how many tokens it read to catch up and in how long, and the step
   it ran in (active rows, planned or left to the row's policy);
2. `--rounds` rounds of the same batches, -k auto and speculation off in turn (the order turning
   each round): tokens/s, and the seconds each spent in target passes, drafting, deciding and
   planning, summed over the rounds.

batching.md quotes both for issue 16's goal 3 (part 1 also with runtime/batch_widths.py and
runtime/batching.py of 0e5e17d, before catch-ups were priced); nothing else may run meanwhile.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from typing import Any

from specx.apps.bench.concurrency import together_batches
from specx.apps.bench.runner import load_workloads
from specx.runtime import Pipeline
from specx.runtime.backends.ort_session import OrtSession
from specx.runtime.batch_widths import WidthPlanner
from specx.runtime.batching import BatchDecoder
from specx.runtime.drafters.shared_passes import DraftRows
from specx.runtime.settings import GenerationSettings

spent: Counter[str] = Counter()


def timed(cls: Any, name: str, key: str) -> None:
    inner = getattr(cls, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[key] += time.perf_counter() - t0

    setattr(cls, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifact")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    pipe = Pipeline.load(args.artifact)
    prompts = [pipe.codec.encode_chat(t) for t in load_workloads()["chat"]["prompts"]][:5]
    modes = {
        name: GenerationSettings(max_new_tokens=64, k=k, drafter="ngram+int8", max_k=4)
        for name, k in (("auto", "auto"), ("off", 0))
    }

    def batches(settings: GenerationSettings, c: int, r: int) -> int:
        done = [
            pipe.generate_batch([prompts[i] for i in batch], settings, max_batch=c)
            for batch in together_batches(len(prompts), c, r)
        ]
        return sum(x.stats.new_tokens for results in done for x in results)

    for r in range(2):
        for p in prompts:
            pipe.generate(p, modes["auto"])
        for c in (1, 2, 4, 8):
            batches(modes["auto"], c, r)

    step: list[Any] = [None]
    plan = WidthPlanner.plan

    def traced_plan(self: WidthPlanner, active: list, rows: int, *joining: int) -> Any:
        expected = plan(self, active, rows, *joining)  # (the planner of 0e5e17d takes two)
        step[0] = f"{len(active)} active, joining {joining}, planned: {expected is not None}"
        return expected

    propose = DraftRows.propose

    def traced_propose(self: DraftRows, jobs: list) -> Any:
        out = propose(self, jobs)
        print(
            f"   {len(jobs)} rows, caught up {self.caught_up} tokens in "
            f"{1e3 * self.caught_up_s:.0f} ms; step: {step[0]}"
        )
        return out

    WidthPlanner.plan, DraftRows.propose = traced_plan, traced_propose  # type: ignore[method-assign]
    print(f"1. shared draft-model runs in {args.concurrency}-request -k auto batches:")
    for r in range(3):
        batches(modes["auto"], args.concurrency, r)
    WidthPlanner.plan, DraftRows.propose = plan, propose  # type: ignore[method-assign]

    for cls, name, key in (
        (OrtSession, "forward_rows", "target passes"),
        (BatchDecoder, "_draft_all", "drafting"),
        (BatchDecoder, "_decide", "deciding"),
        (WidthPlanner, "plan", "planning"),
    ):
        timed(cls, name, key)
    totals = {name: Counter() for name in modes}
    for r in range(args.rounds):
        for name in list(modes)[r % 2 :] + list(modes)[: r % 2]:
            spent.clear()
            t0 = time.perf_counter()
            spent["tokens"] = batches(modes[name], args.concurrency, r)
            spent["wall"] = time.perf_counter() - t0
            totals[name].update(spent)
    print(f"2. {args.rounds} rounds of {args.concurrency}-request batches, seconds summed:")
    for name, t in totals.items():
        parts = ", ".join(f"{k} {v:.2f}" for k, v in t.items() if k not in ("tokens", "wall"))
        print(f"   {name:4s} {t['tokens'] / t['wall']:.1f} tok/s; {parts}")


if __name__ == "__main__":
    main()
