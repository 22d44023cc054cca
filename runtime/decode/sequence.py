"""One generation's state, alone or as a row of a batch, and the commit that ends its every step.

A step is propose, verify, accept, commit. Alone (loop.py) the target's pass verifies one
sequence; in a batch (batch/decoder.py) one pass verifies every row's proposal. Either way the
sequence decides its K (``decide``), its drafter proposes (``propose``, or a batch's shared draft
passes), the grammar cuts what it could never accept (``admit``), and ``commit`` accepts on the
sequence's own logits rows, rolls its cache back to what it kept, tells the drafter, the grammar,
the K policy and the stats, and appends what it may emit (up to max_new_tokens and an end
token). The one function is what keeps a batch row's output its output alone.

Cache invariant: the target cache holds every committed token but the last one. A step feeds
``[last_committed, d_1 .. d_k]`` at positions n .. n + k (n = the cache's length), which both
verifies the draft and extends the cache; the rejected tail is dropped by setting the length.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter
from typing import TYPE_CHECKING, Protocol

import numpy as np

from specx.runtime.constraint import Constraint
from specx.runtime.decode.adaptive import AdaptiveK
from specx.runtime.decode.policy import KPolicy, StepDecision, StepResult
from specx.runtime.decode.stats import Stats
from specx.runtime.drafters.base import (
    MODEL,
    NO_PROPOSAL,
    NONE,
    Drafter,
    DraftRequest,
    FeatureReader,
    HistoryKeeper,
    Proposal,
    SharedPassDrafter,
    is_lookup,
    tokens_behind,
)
from specx.runtime.grammar_limits import GrammarError
from specx.runtime.settings import GenerationSettings
from specx.runtime.verification.logprobs import TokenLogprob, score
from specx.runtime.verification.sampling import PositionNoise
from specx.runtime.verification.verifier import Verifier, make_verifier

if TYPE_CHECKING:
    from specx.runtime.drafters.shared_passes import DraftRows
    from specx.runtime.prefix.cache import PrefixCache

NO_DECISION = StepDecision(0)

# the tokens one step emits -> None; called as soon as the step commits them
Emit = Callable[[np.ndarray], None]


class CacheRows(Protocol):
    """What a commit needs of a cache: setting a row's length (rollback)."""

    def truncate(self, length: int, row: int = 0) -> None: ...


@dataclass(eq=False)
class Sequence:
    """Everything one generation is and has committed, from its prompt to its stop."""

    prompt: np.ndarray  # [n] the prompt's token ids
    settings: GenerationSettings
    policy: KPolicy
    drafter: Drafter | None
    stats: Stats
    vocab_size: int  # the target's (its random numbers are drawn over it)
    eos: frozenset[int] = frozenset()
    constraint: Constraint | None = None  # its grammar's matcher, fresh
    logprobs: list[TokenLogprob] | None = None  # one per emitted token, when the settings ask
    emit: Emit | None = None
    prefixes: PrefixCache | None = None  # the pipeline's prompt reuse (None: off)
    done: bool = False
    tokens: list[int] = field(default_factory=list)  # the generated ids
    context: np.ndarray = field(init=False)  # [capacity + 1] every committed token
    n_context: int = field(init=False)
    row: int = 0  # the row of the cache it decodes in (0 alone)
    decode_start: float = 0.0  # when its decoding (re)started: stats.decode_s counts from here
    # this step's (decide, propose, admit; read by commit)
    source: str = NONE
    decision: StepDecision = NO_DECISION
    k: int = 0
    k_limit: int = 0  # the most this step may draft (room in the cache, tokens still wanted)
    proposal: Proposal = NO_PROPOSAL
    draft_s: float = 0.0
    guess: int | None = None  # what a lookup offered at a step that drafts nothing
    # a batch row's (batch/decoder.py): its prompt read a chunk per step, its draft passes shared
    prefilled: int = -1  # prompt tokens in the cache while it joins; -1 once it decodes
    reading: bool = False  # it has looked for its prompt's prefix in the other rows
    shared_pass: bool = False  # it has decoded in a pass with other rows
    shares_draft: bool = False  # this step's proposal runs in the shared draft passes
    draft_rows: DraftRows | None = None  # where the drafter's cache lives while in the batch
    shared_drafter: SharedPassDrafter | None = None  # the drafter, while bound to draft_rows

    def __post_init__(self) -> None:
        self.prompt = np.asarray(self.prompt, dtype=np.int64).reshape(-1)
        self.noise = PositionNoise(self.settings.sampling.seed, self.vocab_size)
        self.verify: Verifier = make_verifier(self.settings.sampling, self.noise)
        self.context = self.prompt
        self.n_context = int(self.prompt.shape[0])
        self.stats.prompt_tokens = self.n_context
        self.created = perf_counter()  # the time to its first token counts from here

    @property
    def committed(self) -> np.ndarray:
        """Every committed token, the prompt included."""
        return self.context[: self.n_context]

    @property
    def capacity(self) -> int:
        return int(self.context.shape[0]) - 1

    @property
    def tokens_left(self) -> int:
        """New tokens it may still make before max_new_tokens stops it."""
        return self.settings.max_new_tokens - self.stats.new_tokens

    def start(self, capacity: int, prefill: bool = True) -> None:
        """Begin in a cache of `capacity` positions: its token buffer, its drafter's start
        (prefill False: a draft model reads the prompt only when first asked to propose; a
        draft cache that holds a prefix of the prompt keeps it either way)."""
        self.context = np.zeros(capacity + 1, dtype=np.int64)
        self.context[: self.n_context] = self.prompt
        if self.drafter is not None:
            sampling, p_min = self.settings.sampling, self.settings.draft_p_min
            scope = self.settings.cache_scope
            request = DraftRequest(
                sampling, self.noise, p_min, prefill, self.constraint, scope, self.prefixes
            )
            self.drafter.start(self.prompt, request)

    # -- a step --------------------------------------------------------------------------------
    def find_source(self) -> str:
        """Where this step's proposal will come from (the drafter says, before it proposes)."""
        drafter = self.drafter
        self.source = drafter.source(self.committed) if drafter is not None else NONE
        return self.source

    def decide(self, room: int, planned: bool = False) -> None:
        """This step's K and drafting plan (its source found); `room`: draft tokens the cache
        still fits. planned: a batch's planner sets a -k auto row's K; its policy only makes the
        plan."""
        if isinstance(self.policy, AdaptiveK):
            behind = tokens_behind(self.drafter, self.committed) if self.source == MODEL else 0
            self.decision = self.policy.decide(self.source, not planned, behind, self.tokens_left)
            most = self.policy.max_k
        else:
            self.decision = self.policy.decide(self.source)
            most = self.decision.k
        self.k_limit = max(0, min(room, self.tokens_left - 1, most))
        self.k = max(0, min(self.decision.k, self.k_limit))

    def propose(self) -> None:
        """Its drafter's proposal of up to K tokens (a batch's shared passes set it instead)."""
        t0 = perf_counter()
        if self.drafter is not None and self.k > 0:
            self.proposal = self.drafter.propose(self.committed, self.k, self.decision.plan)
        else:
            self.proposal = NO_PROPOSAL
        self.draft_s = perf_counter() - t0

    def admit(self) -> None:
        """Cut the proposal to what the grammar could ever accept; where nothing is left to
        verify, note what a lookup would have offered (lookup_guess)."""
        if self.constraint is not None:
            self.proposal = self.proposal.head(self.constraint.admit(self.proposal.tokens))
        empty = not self.proposal.tokens.shape[0]
        self.guess = lookup_guess(self.drafter, self.committed, self.source) if empty else None

    def verify_input(self) -> np.ndarray:
        """[n + 1] the last committed token and the proposal: what the verify pass feeds."""
        last = self.context[self.n_context - 1 : self.n_context]
        return np.concatenate([last, self.proposal.tokens])

    def commit(
        self,
        logits: np.ndarray,
        cache: CacheRows,
        committed: int,
        verify_s: float,
        features: np.ndarray | None = None,
    ) -> np.ndarray:
        """Accept and commit this step's proposal; returns the tokens the step emits.

        logits [n + 1, vocab]: the sequence's rows of the verify pass, which started at cache
        length `committed`; features [>= n + 1, F]: that pass's features where the target
        returns them."""
        proposal = self.proposal
        try:
            if self.constraint is not None:
                logits = self.constraint.mask(proposal.tokens, logits)
            n_accepted, next_token = self.verify(proposal, logits, self.n_context)
            tokens = np.append(proposal.tokens[:n_accepted], np.int64(next_token))
            if self.constraint is not None:
                self.constraint.commit(tokens)
        except GrammarError as e:
            return self._end_on_grammar(e, cache, committed)
        cache.truncate(committed + 1 + n_accepted, self.row)  # last committed + accepted drafts
        if self.drafter is not None and self.k > 0:
            self.drafter.commit(n_accepted)
        if features is not None and isinstance(self.drafter, FeatureReader):
            self.drafter.observe_features(committed, features[: 1 + n_accepted])
        step = StepResult(
            tokens=tokens,
            source=self.source,
            proposed=int(proposal.tokens.shape[0]),
            accepted=n_accepted,
            k=self.k,
            draft_s=self.draft_s,
            verify_s=verify_s,
            draft_passes=proposal.model_passes,
            catchup=proposal.catchup,
            confidence=proposal.confidence,
            lookup_first_hit=None if self.guess is None else self.guess == next_token,
        )
        self.policy.observe(step)
        self.stats.observe(step)
        return self._append(tokens, logits, committed + 1 + n_accepted)

    def _append(self, tokens: np.ndarray, logits: np.ndarray, cached: int) -> np.ndarray:
        """Append the step's tokens up to the token limit and the first end token; stop where
        that, the grammar or the cache (`cached` positions now) says so."""
        new = tokens[: self.tokens_left]
        hits = [i for i, t in enumerate(new.tolist()) if t in self.eos]
        if hits:
            new = new[: hits[0] + 1]
        n = int(new.shape[0])
        if n and not self.stats.new_tokens:
            self.stats.first_token_s = perf_counter() - self.created
        self.context[self.n_context : self.n_context + n] = new
        self.n_context += n
        self.stats.new_tokens += n
        self.tokens.extend(new.tolist())
        if self.logprobs is not None:
            top = self.settings.logprobs or 0
            self.logprobs.extend(score(logits, new, self.settings.sampling, top))
        self.stats.decode_s = perf_counter() - self.decode_start
        if self.emit is not None:
            self.emit(new)
        if hits:
            self.finish("eos")
        elif self.constraint is not None and self.constraint.finished and not self.eos:
            self.finish("eos")  # complete, and no end token to force: stop here
        elif self.stats.new_tokens >= self.settings.max_new_tokens:
            self.finish("max_new_tokens")
        elif cached + 1 > self.capacity:
            self.finish("max_length")
        return new

    def _end_on_grammar(self, error: GrammarError, cache: CacheRows, committed: int) -> np.ndarray:
        """The grammar's matcher failed at this step (a limit no check before generation could
        foresee): the step commits nothing, and the sequence ends with the text it has and the
        error's message (stats.stop_detail) for its caller."""
        cache.truncate(committed, self.row)
        if self.drafter is not None and self.k > 0:
            self.drafter.commit(0)
        self.stats.stop_detail = error.message + (f" ({error.hint})" if error.hint else "")
        self.finish("grammar")
        return np.zeros(0, dtype=np.int64)

    def finish(self, reason: str) -> None:
        """It stops here (the first reason given stands); a drafter that learns from whole
        generations is handed its output once."""
        if not self.done and isinstance(self.drafter, HistoryKeeper):
            self.drafter.finish(np.asarray(self.tokens, dtype=np.int64))
        self.done = True
        self.stats.stop_reason = self.stats.stop_reason or reason


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
