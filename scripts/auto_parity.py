"""-k auto against fixed K where they run level, back to back, and what an 8-request batch runs.

    .venv/bin/python scripts/auto_parity.py ARTIFACT [--rounds 3] [--drafter ngram+int8]

The chat workload's first five prompts, 64 new tokens, as `specx bench --concurrency` runs them
(max K 4). Three measurements, the first two `--rounds` times (after one warm-up round), the
third twice:

1. alone (Pipeline.generate, the gqa graph): K = 2, K = 3 and -k auto in turn, the order turning
   each round; tokens/s of the five prompts per round, and the K -k auto chose;
2. a batch of one (Pipeline.generate_batch, max_batch 1) right after an 8-request -k auto batch,
   -k auto and K = 2 in turn (the order turning each round): whether what -k auto learned in
   big batches holds it back alone;
3. the bench's sequence for -k auto (alone, then batches of 1, 2 and 4 requests), then one
   8-request batch: how many of its steps ran on the batched graph (where some row drafted)
   and how many on the gqa graph.

`--graphs-only`: the third alone (run with runtime/batch_widths.py of e7812f5 it gives
batching.md's count before the planner's change).
Reads the figures batching.md quotes for issue 16's goal 3; nothing else may run meanwhile.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from specx.apps.bench.concurrency import together_batches
from specx.apps.bench.runner import load_workloads
from specx.runtime import Pipeline
from specx.runtime.settings import GenerationSettings


def settings(k: int | str, drafter: str) -> GenerationSettings:
    return GenerationSettings(max_new_tokens=64, k=k, drafter=drafter, max_k=4)


def rounds_of(
    title: str,
    prompts: list[np.ndarray],
    modes: list[tuple[str, int | str]],
    generate: Callable[[np.ndarray, GenerationSettings], Any],
    before: Callable[[int], None],
    drafter: str,
    rounds: int,
) -> None:
    """Each round (after a warm-up one): `before(round)`, then the prompts through
    `generate` in every mode, the modes' order turning each round; prints tokens/s per round."""
    rates: dict[str, list[float]] = {name: [] for name, _ in modes}
    chosen: Counter[int] = Counter()
    for r in range(rounds + 1):
        before(r)
        turn = r % len(modes)
        for name, k in modes[turn:] + modes[:turn]:
            tokens, wall = 0, 0.0
            for p in prompts:
                t0 = time.perf_counter()
                stats = generate(p, settings(k, drafter)).stats
                wall += time.perf_counter() - t0
                tokens += stats.new_tokens
                if r and k == "auto":
                    chosen.update(stats.k_used)
            if r:
                rates[name].append(tokens / wall)
    print(f"{title}, tokens/s per round:")
    for name, values in rates.items():
        print(f"   {name:5s} {' / '.join(f'{v:.1f}' for v in values)}")
    print(f"   -k auto chose K (steps): {dict(sorted(chosen.items()))}")


def eight_batch_graphs(pipe: Pipeline, prompts: list, drafter: str, rounds: int) -> None:
    passes: Counter[str] = Counter()
    counting = [False]
    inner = ort.InferenceSession.run_with_iobinding

    def counted(self: ort.InferenceSession, *args: object, **kwargs: object) -> object:
        if counting[0]:
            passes[Path(self._model_path).name] += 1
        return inner(self, *args, **kwargs)

    auto = settings("auto", drafter)
    print("3. one 8-request -k auto batch after the bench's sequence, passes per graph:")
    ort.InferenceSession.run_with_iobinding = counted
    try:
        for r in range(rounds):
            for p in prompts:
                pipe.generate(p, auto)
            for c in (1, 2, 4):
                for batch in together_batches(len(prompts), c, r):
                    pipe.generate_batch([prompts[i] for i in batch], auto, max_batch=c)
            passes.clear()
            counting[0] = True
            pipe.generate_batch(
                [prompts[i] for i in together_batches(len(prompts), 8, r)[0]], auto, 8
            )
            counting[0] = False
            print(f"   round {r + 1}: {dict(sorted(passes.items()))} (prompt chunks included)")
    finally:
        ort.InferenceSession.run_with_iobinding = inner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifact")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--drafter", default="ngram+int8")
    parser.add_argument("--graphs-only", action="store_true", help="measurement 3 only")
    args = parser.parse_args()
    pipe = Pipeline.load(args.artifact)
    prompts = [pipe.codec.encode_chat(t) for t in load_workloads()["chat"]["prompts"]][:5]
    print(f"chat workload, 5 prompts, 64 new tokens, {args.drafter}, max K 4")
    if args.graphs_only:
        eight_batch_graphs(pipe, prompts, args.drafter, 2)
        return
    rounds_of(
        "1. alone", prompts, [("K=2", 2), ("K=3", 3), ("auto", "auto")], pipe.generate,
        lambda _r: None, args.drafter, args.rounds,
    )  # fmt: skip

    def eight(r: int) -> None:
        for batch in together_batches(len(prompts), 8, r):
            pipe.generate_batch([prompts[i] for i in batch], settings("auto", args.drafter), 8)

    rounds_of(
        "2. a batch of one after an 8-request -k auto batch", prompts,
        [("auto", "auto"), ("K=2", 2)],
        lambda p, s: pipe.generate_batch([p], s, max_batch=1)[0], eight, args.drafter,
        args.rounds,
    )  # fmt: skip
    eight_batch_graphs(pipe, prompts, args.drafter, 2)


if __name__ == "__main__":
    main()
