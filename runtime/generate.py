"""The speculative decoding loop: propose, verify, accept, commit.

Cache invariant: the target cache holds every committed token but the last one. A step feeds
``[last_committed, d_1 .. d_k]`` at positions n .. n + k (n = target cache length), which both
verifies the draft and extends the cache; the rejected tail is dropped by truncating the length.
With no drafter (k = 0) the same step is plain one-token decoding: the baseline.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from specx.runtime.drafters import Drafter, DraftPlan
from specx.runtime.kv_cache import KVCache
from specx.runtime.sampling import SamplingParams, warp
from specx.runtime.session import ModelSession
from specx.runtime.stats import Stats
from specx.runtime.verify import verify_greedy, verify_stochastic


@dataclass(frozen=True)
class StepResult:
    tokens: np.ndarray  # [n_accepted + 1] the committed tokens of this step
    proposed: int
    accepted: int
    draft_s: float = 0.0
    verify_s: float = 0.0
    draft_passes: int = 0
    catchup: int = 0  # committed tokens the drafter had to feed before drafting
    confidence: np.ndarray | None = None  # [proposed] the draft's top probability per token


def speculative_step(
    target: ModelSession,
    cache: KVCache,
    drafter: Drafter | None,
    context: np.ndarray,
    k: int,
    sampling: SamplingParams,
    rng: np.random.Generator,
    stats: Stats,
    plan: DraftPlan | None = None,
) -> StepResult:
    """One round: the drafter proposes up to k tokens, the target verifies them in one pass."""
    t0 = time.perf_counter()
    passes_before = drafter.model_passes if drafter is not None else 0
    proposal = drafter.propose(context, k, plan) if drafter is not None and k > 0 else None
    draft_tokens = proposal.tokens if proposal is not None else np.zeros(0, np.int64)  # [n]
    t1 = time.perf_counter()
    committed = cache.length
    verify_input = np.concatenate([context[-1:], draft_tokens])  # [n + 1]
    target_logits = target.forward(verify_input, cache)  # [n + 1, vocab]
    t2 = time.perf_counter()
    if sampling.greedy:
        n_accepted, next_token = verify_greedy(draft_tokens, target_logits)
    else:
        p_target = warp(target_logits, sampling)  # [n + 1, vocab]
        p_draft = proposal.p_draft if proposal is not None else None
        n_accepted, next_token = verify_stochastic(draft_tokens, p_draft, p_target, rng)
    cache.truncate(committed + 1 + n_accepted)  # keep last_committed + accepted drafts
    if drafter is not None and proposal is not None:
        drafter.commit(n_accepted)
    stats.draft_s += t1 - t0
    stats.verify_s += t2 - t1
    stats.record_step(int(draft_tokens.shape[0]), n_accepted, k)
    tokens = np.append(draft_tokens[:n_accepted], np.int64(next_token))
    draft_passes = drafter.model_passes - passes_before if drafter is not None else 0
    catchup = int(getattr(drafter, "last_catchup", 0))
    confidence = proposal.confidence if proposal is not None else None
    return StepResult(
        tokens,
        int(draft_tokens.shape[0]),
        n_accepted,
        t1 - t0,
        t2 - t1,
        draft_passes,
        catchup,
        confidence,
    )


class KPolicy:
    """Chooses K for each step. The fixed policy always answers the same K."""

    def __init__(self, k: int) -> None:
        self.k = k

    def next_k(self, source: str = "draft") -> int:
        """K for the next step, whose proposal comes from `source` (see Drafter.source)."""
        return self.k

    def observe(self, step: StepResult) -> None:
        """Told after every step how the proposal fared (adaptive policies learn from it)."""

    def plan(self) -> DraftPlan | None:
        """A rule the drafter applies token by token while drafting (None: draft all k)."""
        return None


def decode_loop(
    target: ModelSession,
    cache: KVCache,
    drafter: Drafter | None,
    prompt: np.ndarray,
    max_new_tokens: int,
    policy: KPolicy,
    sampling: SamplingParams,
    eos_token_ids: tuple[int, ...],
    stats: Stats,
) -> Iterator[np.ndarray]:
    """Prefill, then yield the tokens committed by each step until a stop condition.

    The caller checks the prompt length (1..cache capacity). `stats` is updated as it goes, so it
    is complete even if the consumer stops early.
    """
    rng = sampling.rng()
    capacity = cache.capacity
    context_buf = np.zeros(capacity + 1, dtype=np.int64)  # every committed token
    n_context = int(prompt.shape[0])
    context_buf[:n_context] = prompt
    stats.prompt_tokens = n_context
    eos = set(eos_token_ids)

    t0 = time.perf_counter()
    cache.reset()
    if n_context > 1:
        target.prefill(prompt[:-1], cache)
    if drafter is not None:
        drafter.start(prompt, sampling, rng)
    draft_passes_before = drafter.model_passes if drafter is not None else 0
    stats.prefill_s = time.perf_counter() - t0

    start = time.perf_counter()
    try:
        while True:
            remaining = max_new_tokens - stats.new_tokens
            if remaining <= 0:
                stats.stop_reason = "max_new_tokens"
                return
            room = capacity - cache.length - 1  # draft tokens that still fit in the cache
            if room < 0:
                stats.stop_reason = "max_length"
                return
            context = context_buf[:n_context]
            source = drafter.source(context) if drafter is not None else "none"
            k = min(policy.next_k(source), room, remaining - 1)
            step = speculative_step(
                target, cache, drafter, context, k, sampling, rng, stats, policy.plan()
            )
            policy.observe(step)
            tokens = step.tokens[:remaining]
            hits = [i for i, t in enumerate(tokens.tolist()) if t in eos]
            if hits:
                tokens = tokens[: hits[0] + 1]
            context_buf[n_context : n_context + tokens.shape[0]] = tokens
            n_context += int(tokens.shape[0])
            stats.new_tokens += int(tokens.shape[0])
            stats.decode_s = time.perf_counter() - start
            if drafter is not None:
                stats.draft_passes = drafter.model_passes - draft_passes_before
            yield tokens
            if hits:
                stats.stop_reason = "eos"
                return
    finally:
        stats.decode_s = time.perf_counter() - start
        if drafter is not None:
            stats.draft_passes = drafter.model_passes - draft_passes_before
