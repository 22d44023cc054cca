"""A batch of one (`generate_batch` with one prompt) against the same request alone.

    python scripts/diagnostics/batch_of_one.py ARTIFACT [--rounds 3] [--modes auto] [--between 0]

A batch of one should decode as alone. Runs the chat workload's first five prompts (64 new tokens,
ngram+int8, max K 4) each alone and as a batch of one in every mode of --modes (K values, "off",
"auto"), in turn (the order turning each round), and prints tokens/s and target passes of each,
the first round left out (warm-up). --between C runs one -k auto batch of C requests before each
prompt (what the bench runs between its batches of one: the pipeline's batched memory then holds
what a batch of C taught). The sessions share one thread pool, as under `specx bench`
(--session-pools: one each). batching.md quotes it for the bench's cells at 1 request; nothing
else may run meanwhile.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from specx.apps.bench.runner import load_workloads
from specx.runtime import Pipeline
from specx.runtime.backends import use_global_thread_pool
from specx.runtime.settings import GenerationSettings

WAYS = ("alone", "batch of one")


def _k(mode: str) -> int | str:
    return 0 if mode == "off" else mode if mode == "auto" else int(mode)


def alone_and_batch_of_one(
    pipe: Pipeline,
    prompts: list[np.ndarray],
    rounds: int,
    new_tokens: int = 64,
    drafter: str = "ngram+int8",
    modes: tuple[str, ...] = ("auto",),
    between: int = 0,
) -> dict[str, dict[str, dict[str, float]]]:
    """Per mode, per way ("alone", "batch of one"): tokens, target passes and seconds over
    rounds 2..."""
    settings = {
        m: GenerationSettings(
            max_new_tokens=new_tokens,
            k=_k(m),
            drafter=drafter if m != "off" else "none",
            max_k=4,
        )
        for m in modes
    }
    between_settings = GenerationSettings(
        max_new_tokens=new_tokens, k="auto", drafter=drafter, max_k=4
    )
    totals = {m: {w: {"tokens": 0.0, "passes": 0.0, "seconds": 0.0} for w in WAYS} for m in modes}
    cases = [(m, w) for m in modes for w in WAYS]
    for r in range(rounds):
        for p, prompt in enumerate(prompts):
            if between:
                others = [prompts[(p + j) % len(prompts)] for j in range(between)]
                pipe.generate_batch(others, between_settings, between)
            turn = (r * len(prompts) + p) % len(cases)
            for mode, way in cases[turn:] + cases[:turn]:
                t0 = time.perf_counter()
                if way == "alone":
                    result = pipe.generate(prompt, settings[mode])
                else:
                    result = pipe.generate_batch([prompt], settings[mode], max_batch=1)[0]
                seconds = time.perf_counter() - t0
                if r:  # the first round warms up
                    t = totals[mode][way]
                    t["tokens"] += result.stats.new_tokens
                    t["passes"] += result.stats.target_passes
                    t["seconds"] += seconds
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifact")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="auto", help="comma-separated: off, K values, auto")
    parser.add_argument("--between", type=int, default=0, help="a batch of C requests before each")
    parser.add_argument(
        "--session-pools",
        action="store_true",
        help="a thread pool per session (the CLI shares one)",
    )
    args = parser.parse_args()
    if not args.session_pools:
        use_global_thread_pool()  # as `specx bench` runs
    pipe = Pipeline.load(args.artifact)
    prompts = [pipe.codec.encode_chat(t) for t in load_workloads()["chat"]["prompts"]][:5]
    modes = tuple(args.modes.split(","))
    totals = alone_and_batch_of_one(pipe, prompts, args.rounds, modes=modes, between=args.between)
    for mode, ways in totals.items():
        rates = {w: t["tokens"] / t["seconds"] for w, t in ways.items()}
        for way, t in ways.items():
            print(
                f"{mode:>5} {way:>13}: {rates[way]:.1f} tok/s, "
                f"{t['passes']:.0f} target passes for {t['tokens']:.0f} tokens"
            )
        print(f"{mode:>5} batch of one / alone: {rates['batch of one'] / rates['alone']:.3f}")


if __name__ == "__main__":
    main()
