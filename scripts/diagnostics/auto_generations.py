"""What `-k auto` learns about a model draft generation after generation, as a pipeline's
later requests inherit it (runtime/decode/adaptive.py: inherit, MIN_JUDGED, probes).

Runs one short warm-up generation and then the bench prompts of a workload with `-k auto`, and
prints after each: proposals and acceptances, the policy's `judged` count, its decayed counts and
estimated acceptance per position, and the K it chose at each step. With `--fixed` it first
prints each fixed K's proposals and acceptances per position on the same prompts (what the draft
really does over whole answers).

    python scripts/diagnostics/auto_generations.py ARTIFACT --drafter int8 [--workload chat]
        [--prompts 2] [--rounds 2] [--tokens 64] [--max-k 4] [--fixed 1,2,4]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from specx.apps.bench import load_workloads
from specx.runtime import Pipeline
from specx.runtime.drafters import MODEL
from specx.runtime.settings import GenerationSettings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--drafter", default="int8")
    parser.add_argument("--workload", default="chat")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--max-k", type=int, default=4)
    parser.add_argument("--fixed", default="", help="fixed K values to show first, e.g. 1,2,4")
    args = parser.parse_args()
    pipe = Pipeline.load(args.artifact)
    spec = load_workloads()[args.workload]
    prompts = [
        pipe.encode_prompt(t, chat=bool(spec.get("chat"))) for t in spec["prompts"][: args.prompts]
    ]

    def generate(prompt: object, k: int | str, tokens: int) -> dict[str, object]:
        settings = GenerationSettings(
            max_new_tokens=tokens, k=k, drafter=args.drafter, max_k=args.max_k, cache_scope=None
        )
        return vars(pipe.generate(prompt, settings).stats)

    for k in [int(x) for x in args.fixed.split(",") if x]:
        for i, prompt in enumerate(prompts):
            st = generate(prompt, k, args.tokens)
            print(
                f"K={k} prompt {i}: proposed per position {st['proposed_per_position']}, "
                f"accepted {st['accepted_per_position']}"
            )
    for n, (i, prompt) in enumerate(
        [(0, prompts[0])] + [(i, p) for _ in range(args.rounds) for i, p in enumerate(prompts)]
    ):
        tokens = 16 if n == 0 else args.tokens  # the first: a warm-up, as specx bench runs one
        st = generate(prompt, "auto", tokens)
        policy = pipe.learned_policy(args.drafter)
        assert policy is not None
        est = policy.sources.get(MODEL)
        learned = (
            f"judged {est.judged}, reached {[round(x, 1) for x in est.reached]}, "
            f"accepted {[round(x, 1) for x in est.accepted]}, "
            f"estimate {[round(x, 2) for x in policy.acceptances(MODEL)]}"
            if est is not None
            else "no model steps yet"
        )
        print(
            f"auto, prompt {i}, {tokens} tokens: proposed {st['proposed']}, accepted "
            f"{st['accepted']}; {learned}; K per step {policy.history[:40]}"
        )


if __name__ == "__main__":
    main()
