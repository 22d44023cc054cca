"""The speculative decoding loop: propose, verify, accept, commit.

Cache invariant: the target cache holds every committed token but the last one. A step feeds
``[last_committed, d_1 .. d_k]`` at positions n .. n + k (n = target cache length), which both
verifies the draft and extends the cache; the rejected tail is dropped by truncating the length.
With no drafter (k = 0) the same step is plain one-token decoding: the baseline.

A K policy decides each step (``decide(source) -> StepDecision``) and learns from its result
(``observe(step)``); the step carries everything there is to learn in declared fields, so the two
calls share no hidden state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from time import perf_counter
from typing import Protocol

import numpy as np

from specx.runtime.backends.base import GraphSession
from specx.runtime.constraint import Constraint
from specx.runtime.drafters.base import (
    NO_PROPOSAL,
    NONE,
    Drafter,
    DraftPlan,
    DraftRequest,
    FeatureReader,
    Proposal,
    is_lookup,
)
from specx.runtime.kv_cache import KVCache
from specx.runtime.logprobs import Scorer, TokenLogprob, make_scorer
from specx.runtime.sampling import ACCEPT, RESAMPLE, PositionNoise, SamplingParams, warp
from specx.runtime.settings import GenerationSettings
from specx.runtime.stats import Stats
from specx.runtime.verify import verify_greedy, verify_invariant, verify_rejection


@dataclass(frozen=True)
class StepDecision:
    """What a K policy decides before a step."""

    k: int  # draft tokens to ask for (the loop caps it near the context and token limits)
    plan: DraftPlan | None = None  # a rule the drafter applies token by token (None: take all)


@dataclass(frozen=True)
class StepResult:
    tokens: np.ndarray  # [n_accepted + 1] the committed tokens of this step
    source: str  # where the proposal came from (the drafter's answer before the step)
    proposed: int
    accepted: int
    draft_s: float = 0.0
    verify_s: float = 0.0
    draft_passes: int = 0  # draft-model passes of this step
    catchup: int = 0  # committed tokens the drafter had to feed before drafting
    confidence: np.ndarray | None = None  # [proposed] the draft's top probability per token
    # a step that drafted nothing though a lookup had tokens to offer: whether the first of them
    # is the token the target committed (None: no such offer; see lookup_guess)
    lookup_first_hit: bool | None = None
    logprobs: list[TokenLogprob] | None = None  # [n_accepted + 1] when the generation asks


class KPolicy(Protocol):
    def decide(self, source: str) -> StepDecision:
        """K (and a drafting plan) for the next step, whose proposal comes from `source`."""
        ...

    def observe(self, step: StepResult) -> None:
        """Told after every step how its proposal fared."""
        ...


class FixedK:
    """The same K for every step."""

    def __init__(self, k: int) -> None:
        self.k = k

    def decide(self, source: str) -> StepDecision:
        return StepDecision(self.k)

    def observe(self, step: StepResult) -> None:
        """A fixed K learns nothing."""


# (the proposal, the target's logits [n + 1, vocab], the position row 0 decides) -> verdict
Verifier = Callable[[Proposal, np.ndarray, int], tuple[int, int]]


def make_verifier(sampling: SamplingParams, noise: PositionNoise) -> Verifier:
    """The verification this generation's sampling settings call for, with its random numbers
    drawn for the positions the rows decide."""
    if sampling.greedy:
        return lambda proposal, logits, position: verify_greedy(proposal.tokens, logits)

    def invariant(proposal: Proposal, logits: np.ndarray, position: int) -> tuple[int, int]:
        p_target = warp(logits, sampling)  # [n + 1, vocab]
        rows = range(position, position + logits.shape[0])
        exponentials = np.stack([noise.exponentials(p) for p in rows])  # [n + 1, vocab]
        return verify_invariant(proposal.tokens, p_target, exponentials)

    def rejection(proposal: Proposal, logits: np.ndarray, position: int) -> tuple[int, int]:
        p_target = warp(logits, sampling)  # [n + 1, vocab]
        rows = range(position, position + logits.shape[0])
        u_accept = np.array([noise.uniform(ACCEPT, p) for p in rows][:-1])  # [n]
        u_sample = np.array([noise.uniform(RESAMPLE, p) for p in rows])  # [n + 1]
        return verify_rejection(proposal.tokens, proposal.p_draft, p_target, u_accept, u_sample)

    return invariant if sampling.verification == "invariant" else rejection


def lookup_guess(drafter: Drafter | None, context: np.ndarray, source: str) -> int | None:
    """The first token a lookup offers at a step that drafts nothing (None: it offers none).

    A lookup costs nothing to ask, so -k auto learns how often its first token is right at every
    step, not only at the steps it drafts: it stops drafting where drafting does not pay (a
    batch's wide passes), and the estimate it stopped on would otherwise stand until a probe.
    Comparing the guess with the committed token is what verifying it would have found: greedy,
    the same token; sampling, a point-mass draft is accepted with the target's probability of
    it, which is the chance that it is the token sampled (drafter-invariant sampling: exactly
    the token the race picks)."""
    if drafter is None or not is_lookup(source):
        return None
    tokens = drafter.propose(context, 1).tokens  # a lookup's proposal needs no commit
    return int(tokens[0]) if tokens.shape[0] else None


def speculative_step(
    target: GraphSession,
    cache: KVCache,
    drafter: Drafter | None,
    context: np.ndarray,
    k: int,
    plan: DraftPlan | None,
    verify: Verifier,
    source: str,
    constraint: Constraint | None = None,
    scorer: Scorer | None = None,
) -> StepResult:
    """One round: the drafter proposes up to k tokens, the target verifies them in one pass
    (under the grammar's masks when there is a `constraint`)."""
    t0 = perf_counter()
    proposal = drafter.propose(context, k, plan) if drafter is not None and k > 0 else NO_PROPOSAL
    if constraint is not None:
        proposal = proposal.head(constraint.admit(proposal.tokens))
    t1 = perf_counter()
    committed = cache.length
    verify_input = np.concatenate([context[-1:], proposal.tokens])  # [n + 1]
    target_logits = target.forward(verify_input, cache)  # [n + 1, vocab]
    if constraint is not None:
        target_logits = constraint.mask(proposal.tokens, target_logits)
    t2 = perf_counter()
    n_accepted, next_token = verify(proposal, target_logits, int(context.shape[0]))
    cache.truncate(committed + 1 + n_accepted)  # keep last_committed + accepted drafts
    if drafter is not None and k > 0:
        drafter.commit(n_accepted)
    if target.last_features is not None and isinstance(drafter, FeatureReader):
        drafter.observe_features(committed, target.last_features[: 1 + n_accepted])
    guess = lookup_guess(drafter, context, source) if not proposal.tokens.shape[0] else None
    tokens = np.append(proposal.tokens[:n_accepted], np.int64(next_token))
    if constraint is not None:
        constraint.commit(tokens)
    return StepResult(
        tokens=tokens,
        source=source,
        proposed=int(proposal.tokens.shape[0]),
        accepted=n_accepted,
        draft_s=t1 - t0,
        verify_s=t2 - t1,
        draft_passes=proposal.model_passes,
        catchup=proposal.catchup,
        confidence=proposal.confidence,
        lookup_first_hit=None if guess is None else guess == next_token,
        logprobs=None if scorer is None else scorer(target_logits[: n_accepted + 1], tokens),
    )


def decode_loop(
    target: GraphSession,
    cache: KVCache,
    drafter: Drafter | None,
    prompt: np.ndarray,
    settings: GenerationSettings,
    policy: KPolicy,
    eos_token_ids: tuple[int, ...],
    stats: Stats,
    constraint: Constraint | None = None,
    logprobs: list[TokenLogprob] | None = None,
) -> Iterator[np.ndarray]:
    """Prefill, then yield the tokens committed by each step until a stop condition.

    The caller checks the prompt length (1..cache capacity). `stats` is updated as it goes, so it
    is complete even if the consumer stops early; so is `logprobs` (one entry per emitted token,
    when settings.logprobs asks). `constraint`: the grammar's matcher, fresh (settings.grammar
    says what it is; the caller builds it with the artifact's tokenizer).
    """
    sampling = settings.sampling
    noise = PositionNoise(sampling.seed, target.vocab_size)
    verify = make_verifier(sampling, noise)
    scorer = make_scorer(sampling, settings.logprobs) if logprobs is not None else None
    capacity = cache.capacity
    context_buf = np.zeros(capacity + 1, dtype=np.int64)  # every committed token
    n_context = int(prompt.shape[0])
    context_buf[:n_context] = prompt
    stats.prompt_tokens = n_context
    eos = set(eos_token_ids)

    t0 = perf_counter()
    cache.reset()
    if drafter is not None:
        drafter.start(
            prompt, DraftRequest(sampling, noise, settings.draft_p_min, grammar=constraint)
        )
    if n_context > 1:
        reader = drafter.observe_features if isinstance(drafter, FeatureReader) else None
        target.prefill(prompt[:-1], cache, reader)
    stats.prefill_s = perf_counter() - t0

    start = perf_counter()
    try:
        while True:
            remaining = settings.max_new_tokens - stats.new_tokens
            if remaining <= 0:
                stats.stop_reason = "max_new_tokens"
                return
            room = capacity - cache.length - 1  # draft tokens that still fit in the cache
            if room < 0:
                stats.stop_reason = "max_length"
                return
            context = context_buf[:n_context]
            source = drafter.source(context) if drafter is not None else NONE
            decision = policy.decide(source)
            k = min(decision.k, room, remaining - 1)
            step = speculative_step(
                target,
                cache,
                drafter,
                context,
                k,
                decision.plan,
                verify,
                source,
                constraint,
                scorer,
            )
            policy.observe(step)
            stats.record_step(step.proposed, step.accepted, k)
            stats.draft_s += step.draft_s
            stats.verify_s += step.verify_s
            stats.draft_passes += step.draft_passes
            tokens = step.tokens[:remaining]
            hits = [i for i, t in enumerate(tokens.tolist()) if t in eos]
            if hits:
                tokens = tokens[: hits[0] + 1]
            context_buf[n_context : n_context + tokens.shape[0]] = tokens
            n_context += int(tokens.shape[0])
            stats.new_tokens += int(tokens.shape[0])
            stats.decode_s = perf_counter() - start
            if logprobs is not None and step.logprobs is not None:
                logprobs.extend(step.logprobs[: tokens.shape[0]])
            yield tokens
            if hits:
                stats.stop_reason = "eos"
                return
            if constraint is not None and constraint.finished and not eos:
                stats.stop_reason = "eos"  # complete, and no end token to force: stop here
                return
    finally:
        stats.decode_s = perf_counter() - start
