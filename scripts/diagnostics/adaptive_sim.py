"""Compare K policies without timing noise: record, then replay.

On a noisy 2-core machine, the tokens/s of K=auto and of the best fixed K differ by less than
the noise between runs. This script separates the two questions. It records, once, for every
position of the target's greedy text on the bench workloads, what a model draft would propose
there (8 tokens, with the draft's top probability at each) and how many of them the target
accepts; that is all greedy speculation depends on. It times the target and draft passes. Then it
replays generation under fixed K = 1, 2, 3, 4, 6 and under the real `AdaptiveK` (its K choice and
its token-by-token plan), with pass times drawn from the measured ones plus a few percent of
noise, in the bench's order (repeat > workload > prompt, the policy carried over between
generations as the pipeline does). The output: tokens/s per policy and K=auto / best fixed K.

    python scripts/diagnostics/adaptive_sim.py ARTIFACT [--drafters int8,int4] [--prompts 3]
        [--seeds 3]
"""

from __future__ import annotations

import argparse
import bisect
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from specx.apps.bench import load_workloads, pass_times
from specx.runtime import Pipeline
from specx.runtime.decode.adaptive import CONFIDENCE_EDGES, AdaptiveK
from specx.runtime.decode.policy import StepResult
from specx.runtime.drafters import MODEL, DraftRequest, ModelDrafter
from specx.runtime.verification.sampling import PositionNoise, SamplingParams, top_probability

DEPTH = 8  # draft tokens recorded per position
FIXED_KS = (1, 2, 3, 4, 6)
MAX_K = 6
NEW_TOKENS = 64


def draft_model(pipe: Pipeline, drafter: str) -> ModelDrafter:
    """A draft model of the artifact on its own fork and cache, without EOS stops (a recorded
    proposal always has DEPTH tokens)."""
    spec = pipe.manifest.find_draft(drafter)
    target_vocab = pipe.manifest.target.vocab_size
    return ModelDrafter(pipe.draft_session(spec).fork(), pipe.manifest.max_length, target_vocab)


def take_all(position: int, top: float) -> tuple[bool, bool]:
    return True, True  # draft every token, reporting confidences


def record(pipe: Pipeline, drafter: str, prompt: np.ndarray, text: np.ndarray) -> dict[str, Any]:
    """Per position of `text`: accepted length of an 8-token greedy draft, and its confidences."""
    draft = draft_model(pipe, drafter)
    draft.start(prompt, DraftRequest(SamplingParams(), PositionNoise(0, draft.target_vocab)))
    accepted, confidences = [], []
    for pos in range(min(NEW_TOKENS, len(text) - 1)):
        context = np.concatenate([prompt, text[:pos]])
        proposal = draft.propose(context, DEPTH, take_all)
        draft.commit(0)  # back to the committed context: the next position is one token on
        tokens = proposal.tokens.tolist()
        assert proposal.confidence is not None  # a plan makes the draft report them
        tops = proposal.confidence.tolist()
        truth = text[pos : pos + DEPTH]
        n = 0
        while n < min(len(tokens), len(truth)) and tokens[n] == truth[n]:
            n += 1
        accepted.append(n)
        confidences.append(tops)
    return {"accepted": accepted, "confidence": confidences}


def model_pass_times(pipe: Pipeline, drafter: str, reps: int = 30) -> dict[str, Any]:
    """Median seconds of a target pass over 1..MAX_K+1 tokens and of a draft pass over 1, 2."""
    spec = pipe.manifest.find_draft(drafter)
    return {
        "target": pass_times(pipe.target.fork(), list(range(1, MAX_K + 2)), 128, reps),
        "draft": pass_times(pipe.draft_session(spec).fork(), [1, 2], 128, reps),
    }


def confidence_cost(pipe: Pipeline, reps: int = 200) -> float:
    """Median seconds the draft's top probability adds to choosing a draft token."""
    vocab = pipe.manifest.target.vocab_size
    logits = np.random.default_rng(0).standard_normal(vocab).astype(np.float32)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        top_probability(logits, int(np.argmax(logits)))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def calibration(traces: dict[str, Any], drafter: str) -> str:
    """Acceptance of a draft token (given the earlier ones accepted) by the draft's confidence."""
    edges = [0.0, *CONFIDENCE_EDGES, 1.0]
    reached = np.zeros(len(edges) - 1)
    accepted = np.zeros(len(edges) - 1)
    for key, trace in traces.items():
        if key.endswith("/" + drafter):
            for n, tops in zip(trace["accepted"], trace["confidence"], strict=True):
                for i in range(min(n + 1, DEPTH)):
                    b = bisect.bisect_right(CONFIDENCE_EDGES, tops[i])
                    reached[b] += 1
                    accepted[b] += i < n
    return ", ".join(
        f"{edges[b]:.2f}-{edges[b + 1]:.2f}: {accepted[b] / reached[b]:.2f} (n={int(reached[b])})"
        for b in range(len(reached))
        if reached[b]
    )


def replay(
    trace: dict[str, Any], costs: dict[str, Any], policy: AdaptiveK | None, k_fixed: int, rng: Any
) -> tuple[int, float]:
    """Generate along `trace` under a policy; (tokens, seconds)."""
    accepted_at, confidence_at = trace["accepted"], trace["confidence"]
    n, t, seconds, caught_up_two = len(accepted_at), 0, 0.0, False
    target, draft = costs["target"], costs["draft"]
    while t < n:
        decision = policy.decide(MODEL) if policy is not None else None
        k = decision.k if decision is not None else k_fixed
        k = max(0, min(k, n - t - 1, DEPTH))
        plan = decision.plan if decision is not None else None
        tops: list[float] = []
        examined = 0
        for i in range(k):
            examined += 1
            take, more = plan(i, confidence_at[t][i]) if plan is not None else (True, True)
            if not take:
                break
            tops.append(confidence_at[t][i])
            if not more:
                break
        proposed = len(tops)
        accepted = min(accepted_at[t], proposed)
        noise = rng.uniform(0.95, 1.05, 2)
        draft_s = 0.0
        if k:
            draft_s = (draft[2] if caught_up_two else draft[1]) + (examined - 1) * draft[1]
        draft_s *= noise[0]
        verify_s = target[proposed + 1] * noise[1]
        if policy is not None:
            policy.observe(
                StepResult(
                    np.zeros(1, np.int64),
                    MODEL,
                    proposed,
                    accepted,
                    draft_s,
                    verify_s,
                    examined,
                    2 if caught_up_two else 1,
                    np.asarray(tops),
                )
            )
        caught_up_two = proposed > 0 and accepted == proposed
        seconds += draft_s + verify_s
        t += accepted + 1
    return n, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--drafters", default="int8,int4")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--traces", type=Path, help="reuse (or write) recorded traces here")
    args = parser.parse_args()
    pipe = Pipeline.load(args.artifact)
    workloads = load_workloads()
    drafters = args.drafters.split(",")
    if args.traces and args.traces.exists():
        data = json.loads(args.traces.read_text())
    else:
        data = {"traces": {}, "costs": {}}
        for d in drafters:
            data["costs"][d] = model_pass_times(pipe, d)
        for w, spec in workloads.items():
            for i, text in enumerate(spec["prompts"][: args.prompts]):
                enc = pipe.codec.encode_chat if spec.get("chat") else pipe.codec.encode
                prompt = enc(text)
                greedy = pipe.generate(prompt, max_new_tokens=NEW_TOKENS + DEPTH, k=0)
                target_text = np.asarray(greedy.token_ids, dtype=np.int64)
                for d in drafters:
                    data["traces"][f"{w}/{i}/{d}"] = record(pipe, d, prompt, target_text)
                print(f"recorded {w} prompt {i + 1}", flush=True)
        if args.traces:
            args.traces.write_text(json.dumps(data))
    for d in drafters:
        costs = {
            part: {int(w): s for w, s in times.items()} for part, times in data["costs"][d].items()
        }
        c = costs["draft"][1] / costs["target"][1]
        print(
            f"\n{d}: draft pass / target pass c = {c:.2f}; target pass by width (ms): "
            + ", ".join(f"{w}: {1e3 * s:.1f}" for w, s in sorted(costs["target"].items()))
        )
        top_s = confidence_cost(pipe)
        print(
            f"  the draft's top probability costs {1e6 * top_s:.0f} us per draft token "
            f"({100 * top_s / costs['draft'][1]:.1f}% of a draft pass)"
        )
        print(f"  acceptance by the draft's confidence: {calibration(data['traces'], d)}")
        for seed in range(args.seeds):
            rates: dict[str, dict[str, float]] = {}
            for name in [*map(str, FIXED_KS), "auto"]:
                rng = np.random.default_rng(seed)
                totals: dict[str, list[float]] = {}
                previous: AdaptiveK | None = None
                for _ in range(args.repeats):
                    for w in workloads:
                        for i in range(args.prompts):
                            trace = data["traces"].get(f"{w}/{i}/{d}")
                            if trace is None:
                                continue
                            policy = None
                            if name == "auto":
                                policy = AdaptiveK(max_k=MAX_K)
                                if previous is not None:
                                    policy.inherit(previous)
                                previous = policy
                            k = 0 if name == "auto" else int(name)
                            tokens, seconds = replay(trace, costs, policy, k, rng)
                            acc = totals.setdefault(w, [0.0, 0.0])
                            acc[0] += tokens
                            acc[1] += seconds
                rates[name] = {w: a[0] / a[1] for w, a in totals.items()}
            cells = []
            for w in rates["auto"]:
                best = max(map(str, FIXED_KS), key=lambda k: rates[k][w])
                ratio = rates["auto"][w] / rates[best][w]
                cells.append(f"{w} {ratio:.3f} (best K={best})")
            print(f"  seed {seed}: K=auto / best fixed K: " + ", ".join(cells))


if __name__ == "__main__":
    main()
