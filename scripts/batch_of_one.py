"""-k auto in a batch of one (`generate_batch` with one prompt) against the same request alone.

    .venv/bin/python scripts/batch_of_one.py ARTIFACT [--rounds 3]

A batch of one should decode as alone. Runs the chat workload's first five prompts (64 new tokens,
ngram+int8, max K 4) each alone and as a batch of one, in turn (the order turning each round), and
prints tokens/s and target passes of each, the first round left out (warm-up). batching.md quotes
it for the bench's -k auto cell at 1 request; nothing else may run meanwhile.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from specx.apps.bench.runner import load_workloads
from specx.runtime import Pipeline
from specx.runtime.settings import GenerationSettings


def alone_and_batch_of_one(
    pipe: Pipeline,
    prompts: list[np.ndarray],
    rounds: int,
    new_tokens: int = 64,
    drafter: str = "ngram+int8",
) -> dict[str, dict[str, float]]:
    """Per way ("alone", "batch of one"): tokens, target passes and seconds over rounds 2..."""
    settings = GenerationSettings(max_new_tokens=new_tokens, k="auto", drafter=drafter, max_k=4)
    ways = ("alone", "batch of one")
    totals = {way: {"tokens": 0.0, "passes": 0.0, "seconds": 0.0} for way in ways}
    for r in range(rounds):
        for prompt in prompts:
            for way in ways if r % 2 == 0 else ways[::-1]:
                t0 = time.perf_counter()
                if way == "alone":
                    result = pipe.generate(prompt, settings)
                else:
                    result = pipe.generate_batch([prompt], settings, max_batch=1)[0]
                seconds = time.perf_counter() - t0
                if r:  # the first round warms up
                    totals[way]["tokens"] += result.stats.new_tokens
                    totals[way]["passes"] += result.stats.target_passes
                    totals[way]["seconds"] += seconds
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifact")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    pipe = Pipeline.load(args.artifact)
    prompts = [pipe.codec.encode_chat(t) for t in load_workloads()["chat"]["prompts"]][:5]
    for way, t in alone_and_batch_of_one(pipe, prompts, args.rounds).items():
        print(
            f"{way:>13}: {t['tokens'] / t['seconds']:.1f} tok/s, "
            f"{t['passes']:.0f} target passes for {t['tokens']:.0f} tokens"
        )


if __name__ == "__main__":
    main()
