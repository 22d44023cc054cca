"""What each row of a batch did: its target passes, and the draft tokens it proposed and got
accepted, for speculation off, a fixed K and -k auto.

    python scripts/diagnostics/batch_rows.py ARTIFACT [--concurrency 2] [--rounds 2] [--k 2]

Runs the chat workload's first five prompts as `specx bench --concurrency` does (batch after batch
of `--concurrency` requests until every prompt ran, 64 new tokens, drafter ngram+int8, max K 4),
`--rounds` times each mode in turn, and prints per batch and row (new tokens, target passes,
proposed, accepted). A batch takes as many steps as its slowest row: batching.md reads from it
whether a mode's drafting shortened the batches or only some rows. It counts, it does not time.
"""

from __future__ import annotations

import argparse

import numpy as np

from specx.apps.bench.concurrency import together_batches
from specx.apps.bench.runner import load_workloads
from specx.runtime import Pipeline
from specx.runtime.settings import GenerationSettings

Row = tuple[int, int, int, int]  # new tokens, target passes, proposed, accepted


def batch_rows(
    pipe: Pipeline,
    prompts: list[np.ndarray],
    concurrency: int,
    k: int | str,
    new_tokens: int = 64,
    drafter: str = "ngram+int8",
) -> list[list[Row]]:
    """Per batch (together_batches of repeat 0), per row: what it made and how."""
    settings = GenerationSettings(
        max_new_tokens=new_tokens, k=k, drafter="none" if k == 0 else drafter, max_k=4
    )
    out = []
    for batch in together_batches(len(prompts), concurrency, 0):
        results = pipe.generate_batch([prompts[i] for i in batch], settings, max_batch=concurrency)
        out.append(
            [
                (r.stats.new_tokens, r.stats.target_passes, r.stats.proposed, r.stats.accepted)
                for r in results
            ]
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifact")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--k", type=int, default=2, help="the fixed K shown beside off and auto")
    args = parser.parse_args()
    pipe = Pipeline.load(args.artifact)
    prompts = [pipe.codec.encode_chat(t) for t in load_workloads()["chat"]["prompts"]][:5]
    print(
        "per batch: [(new tokens, target passes, proposed, accepted) per row]; steps = max passes"
    )
    for r in range(args.rounds):
        for name, k in (("off", 0), (f"K={args.k}", args.k), ("-k auto", "auto")):
            batches = batch_rows(pipe, prompts, args.concurrency, k)
            steps = [max(row[1] for row in b) for b in batches]
            print(f"round {r + 1} {name:>8}: steps {steps} {batches}")


if __name__ == "__main__":
    main()
