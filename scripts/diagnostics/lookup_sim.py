"""Replay `-k auto` over lookup drafters (ngram, suffix) without timing noise.

A lookup's proposal depends only on the text so far, so greedy speculation with it is fixed by
the target's greedy text: this script records that text for the bench prompts once, measures the
target's pass time at each verify width once (interleaved, median), and then replays the decode
loop step by step: the drafter's source and proposal at each position, the policy's K (the real
`AdaptiveK`, carried from one generation to the next as the pipeline does), the accepted length,
and a pass time drawn from the measured ones with a few percent of noise. Lookups are free to
ask, as in the runtime (sequence.lookup_guess): a step that drafts nothing still tells the policy
whether the lookup's first token was right. It prints tokens/s of the target alone, each fixed K
and `-k auto`, per workload, as ratios to the target alone: whether `-k auto` loses where no K
pays, with nothing but the policy moving.

    python scripts/diagnostics/lookup_sim.py ARTIFACT [--drafters ngram,suffix] [--prompts 2]
        [--tokens 128] [--traces FILE] [--seeds 3]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from specx.apps.bench import load_workloads, pass_times
from specx.runtime import Pipeline
from specx.runtime.decode.adaptive import AdaptiveK
from specx.runtime.decode.policy import StepResult
from specx.runtime.drafters import DraftRequest, NgramDrafter, SuffixDrafter, is_lookup
from specx.runtime.verification.sampling import PositionNoise, SamplingParams

FIXED_KS = (1, 2, 3, 4, 8)
MAX_K = 8


def make_drafter(name: str, eos: tuple[int, ...]) -> Any:
    return NgramDrafter(eos_token_ids=eos) if name == "ngram" else SuffixDrafter(None, eos)


def record(pipe: Pipeline, prompts: dict[str, list[Any]], tokens: int) -> dict[str, Any]:
    """The target's greedy text for every prompt, and its pass times by verify width."""
    texts, prompt_s = {}, {}
    for key, (prompt, _) in prompts.items():
        result = pipe.generate(prompt, max_new_tokens=tokens, k=0, cache_scope=None)
        texts[key] = result.token_ids
        prompt_s[key] = result.stats.prefill_s
        print(f"recorded {key}: {len(result.token_ids)} tokens", flush=True)
    widths = list(range(1, MAX_K + 2))
    times = pass_times(pipe.target.fork(), widths, 256, 15)
    return {"texts": texts, "prompt_s": prompt_s, "pass_s": {str(w): s for w, s in times.items()}}


PASSES: dict[str, list[float]] = {}  # per policy name: [passes, seconds / one-token pass]


def replay(
    prompt: np.ndarray,
    text: list[int],
    drafter: Any,
    pass_s: dict[int, float],
    policy: AdaptiveK | None,
    k_fixed: int,
    rng: Any,
) -> tuple[int, float]:
    """Decode `text` after `prompt` under a policy (None: K fixed); (tokens, seconds)."""
    vocab = 1 << 20
    drafter.start(prompt, DraftRequest(SamplingParams(), PositionNoise(0, vocab), scope=None))
    t, seconds, n = 0, 0.0, len(text)
    truth = np.asarray(text, dtype=np.int64)
    while t < n:
        context = np.concatenate([prompt, truth[:t]])
        source = drafter.source(context)
        if policy is not None:
            k = policy.decide(source, True, 0, n - t).k
        else:
            k = k_fixed if is_lookup(source) else 0
        k = max(0, min(k, n - t - 1))
        proposal = drafter.propose(context, k).tokens if k else np.zeros(0, np.int64)
        proposed = int(proposal.shape[0])
        accepted = 0
        while accepted < proposed and proposal[accepted] == truth[t + accepted]:
            accepted += 1
        guess = None
        if not proposed and is_lookup(source):
            offered = drafter.propose(context, 1).tokens
            guess = bool(offered.shape[0]) and int(offered[0]) == int(truth[t])
            if not offered.shape[0]:
                guess = None
        drafter.forget()
        verify_s = pass_s[proposed + 1] * rng.uniform(0.95, 1.05)
        if policy is not None:
            policy.observe(
                StepResult(
                    tokens=np.zeros(1, np.int64),
                    source=source,
                    proposed=proposed,
                    accepted=accepted,
                    k=k,
                    draft_s=1e-5 * proposed,
                    verify_s=verify_s,
                    draft_passes=0,
                    catchup=0,
                    lookup_first_hit=guess,
                )
            )
        seconds += verify_s
        t += accepted + 1
        tally = PASSES.setdefault("auto" if policy is not None else str(k_fixed), [0.0, 0.0])
        tally[0] += 1
        tally[1] += verify_s / pass_s[1]
    return n, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--drafters", default="ngram,suffix")
    parser.add_argument("--workloads", default="code,chat")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--traces", type=Path, help="reuse (or write) the recorded texts here")
    args = parser.parse_args()
    pipe = Pipeline.load(args.artifact)
    workloads = load_workloads()
    prompts: dict[str, list[Any]] = {}
    for w in args.workloads.split(","):
        spec = workloads[w]
        for i, text in enumerate(spec["prompts"][: args.prompts]):
            ids = pipe.encode_prompt(text, chat=bool(spec.get("chat")))
            prompts[f"{w}/{i}"] = [ids, w]
    if args.traces and args.traces.exists():
        data = json.loads(args.traces.read_text())
    else:
        data = record(pipe, prompts, args.tokens)
        if args.traces:
            args.traces.write_text(json.dumps(data))
    pass_s = {int(w): s for w, s in data["pass_s"].items()}
    print(
        "target pass by width, x one token: "
        + ", ".join(f"{w}: {s / pass_s[1]:.2f}" for w, s in sorted(pass_s.items()))
    )
    eos = tuple(pipe.manifest.special_tokens.eos_token_ids)
    for d in args.drafters.split(","):
        for seed in range(args.seeds):
            rates: dict[str, dict[str, float]] = {}
            for name in ["0", *map(str, FIXED_KS), "auto"]:
                rng = np.random.default_rng(seed)
                totals: dict[str, list[float]] = {}
                previous: AdaptiveK | None = None
                for _ in range(args.repeats):
                    for key, (prompt, w) in prompts.items():
                        policy = None
                        if name == "auto":
                            policy = AdaptiveK(max_k=MAX_K)
                            policy.lazy_draft = True
                            if previous is not None:
                                policy.inherit(previous)
                            previous = policy
                            policy.observe_prefill(len(prompt), data["prompt_s"][key])
                        k = 0 if name == "auto" else int(name)
                        drafter = make_drafter(d, eos)
                        n, s = replay(prompt, data["texts"][key], drafter, pass_s, policy, k, rng)
                        acc = totals.setdefault(w, [0.0, 0.0])
                        acc[0] += n
                        acc[1] += s
                rates[name] = {w: a[0] / a[1] for w, a in totals.items()}
            cells = []
            for w in rates["auto"]:
                fixed = " ".join(f"K={k} {rates[str(k)][w] / rates['0'][w]:.3f}" for k in FIXED_KS)
                cells.append(f"{w}: auto {rates['auto'][w] / rates['0'][w]:.3f} ({fixed})")
            print(f"{d} seed {seed}: x target alone: " + "; ".join(cells), flush=True)
            tally = PASSES.pop("auto")
            total = sum(len(data["texts"][key]) for key in prompts) * args.repeats
            print(f"  auto: tokens/pass {total / tally[0]:.2f}, r {tally[1] / tally[0]:.2f}")
            PASSES.clear()


if __name__ == "__main__":
    main()
