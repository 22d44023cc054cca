"""Resident memory of one process while threads share a batching pipeline: a leak check.

    python scripts/diagnostics/batch_memory.py ARTIFACT [--phases 5] [--per-phase 150]

Four threads stream short chat generations (-k auto, the artifact's default drafter) through
`Pipeline.enable_batching(4)`; the process's VmRSS is printed after each phase. A flat line
after the first phases (warm-up: drafter pools, buffers sized on first use) means no leak.
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ThreadPoolExecutor

from specx.apps.bench.runner import load_workloads
from specx.runtime import Pipeline
from specx.runtime.settings import GenerationSettings


def rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("artifact")
    parser.add_argument("--phases", type=int, default=5)
    parser.add_argument("--per-phase", type=int, default=150)
    args = parser.parse_args()
    pipe = Pipeline.load(args.artifact)
    pipe.enable_batching(4, 512)
    prompts = load_workloads()["chat"]["prompts"]
    settings = GenerationSettings(
        max_new_tokens=8, k="auto", drafter=pipe.default_drafter, max_k=4, chat=True
    )

    def one(i: int) -> str:
        return "".join(pipe.stream(prompts[i % len(prompts)], settings))

    with ThreadPoolExecutor(4) as pool:
        for phase in range(args.phases):
            list(pool.map(one, range(args.per_phase)))
            print(
                f"after {(phase + 1) * args.per_phase} generations: {rss_mb():.0f} MB", flush=True
            )
    pipe.disable_batching()


if __name__ == "__main__":
    main()
