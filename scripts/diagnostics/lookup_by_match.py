"""How often a prompt lookup is right, by the length of the match it follows (offline, no timing).

    python scripts/diagnostics/lookup_by_match.py ARTIFACT [--workloads chat,code,grounded]
        [--max-new-tokens 64]

The target answers each workload's prompts greedily (speculation off); then, at every position of
each answer, the n-gram lookup (`ngram`'s search: the longest match of the context's last 3, 2 or
1 tokens, its latest occurrence) offers its continuation, and the script counts, per match
length, the offers, how often the first token is the target's next token, and the mean run of
right tokens (up to 4). Greedy verification would accept exactly that run. It is why a lookup's
source names the length of its match (drafters/base.py: lookup_source): -k auto keeps an estimate
per length, and they differ several-fold.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

from specx.apps.bench.runner import load_workloads
from specx.runtime import Pipeline
from specx.runtime.drafters import NgramDrafter
from specx.runtime.settings import GenerationSettings

RUN_MOST = 4  # the longest run counted (the K -k auto usually drafts at most)


def offers_by_match(context: np.ndarray, start: int, eos: tuple[int, ...]) -> list[tuple[int, int]]:
    """(match length, right tokens in a row) for every position from `start` where the lookup
    offers a continuation."""
    drafter = NgramDrafter(eos_token_ids=eos)
    out = []
    for length in range(start, int(context.shape[0])):
        seen = context[:length]
        offered = drafter.continuation(seen)
        source = drafter.source(seen)
        drafter.forget()
        if not offered.size:
            continue
        truth = context[length : length + RUN_MOST]
        run = 0
        while run < min(offered.size, truth.size) and offered[run] == truth[run]:
            run += 1
        out.append((int(source.removeprefix("lookup")), run))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifact")
    parser.add_argument("--workloads", default="chat,code,grounded")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    pipe = Pipeline.load(args.artifact)
    eos = pipe.manifest.special_tokens.eos_token_ids
    specs = load_workloads()
    print("workload  match  offers  first right  mean run (up to 4)")
    for name in [w for w in args.workloads.split(",") if w]:
        spec = specs[name]
        counts: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])
        for text in spec["prompts"]:
            prompt = pipe.codec.encode_chat(text) if spec.get("chat") else pipe.codec.encode(text)
            settings = GenerationSettings(max_new_tokens=args.max_new_tokens, k=0)
            answer = pipe.generate(prompt, settings).token_ids
            context = np.concatenate([np.asarray(prompt), np.asarray(answer)]).astype(np.int64)
            for matched, run in offers_by_match(context, len(prompt), eos):
                c = counts[matched]
                c[0] += 1
                c[1] += run > 0
                c[2] += run
        for matched in sorted(counts, reverse=True):
            n, first, runs = counts[matched]
            print(f"{name:9s} {matched:5d}  {n:6d}  {first / n:11.2f}  {runs / n:8.2f}")


if __name__ == "__main__":
    main()
