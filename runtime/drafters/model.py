"""A draft model: a smaller graph (another model, a quantized copy, the target itself) with its
own preallocated cache.

Invariant between calls: the cache holds a prefix of the committed tokens. ``propose`` first feeds
the committed tokens the cache lacks (one after a verify: the catch-up), then drafts token by
token, each from the logits of the one before; ``commit`` truncates the cache to what the target
kept. The draft picks each token the way the target would check it: the argmax when greedy; with
sampling, the exponential race under the position's draws (invariant verification) or its own
keyed draw, returning its distributions (rejection verification).

The proposal is written once, as ``proposal_steps``: a generator that yields the tokens to feed
and is sent the last logits row of each pass. Alone, ``propose`` runs its passes on the drafter's
own cache. In a batch, the decoder binds the drafter to a row of a shared draft cache
(``DraftRows``, shared_passes.py) and runs the steps of every row in lockstep, one pass per
drafted position for all rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from specx.runtime.backends.base import GraphSession
from specx.runtime.drafters.base import (
    EMPTY,
    MODEL,
    DraftPlan,
    DraftRequest,
    Proposal,
    ProposalSteps,
)
from specx.runtime.verification.sampling import (
    DRAFT,
    PositionNoise,
    SamplingParams,
    race,
    sample,
    top_probability,
    warp,
)

if TYPE_CHECKING:
    from specx.runtime.drafters.shared_passes import DraftRows


def pick_token(
    row: np.ndarray, position: int, request: DraftRequest, target_vocab: int, want_top: bool
) -> tuple[int, np.ndarray | None, float]:
    """The draft's token for `position` from its logits `row` (over the ids it can emit, the
    first ids of the target vocabulary): (token, its distribution over the target vocabulary
    when rejection sampling needs it, else None; the draft's top probability). Greedy: the
    argmax; invariant verification: the exponential race under the position's draws; rejection:
    the draft's own keyed draw."""
    sampling = request.sampling
    if sampling.greedy:
        token = int(np.argmax(row))
        return token, None, top_probability(row, token) if want_top else 1.0
    probs = warp(row, sampling)  # [len(row)]
    noise = request.noise
    if sampling.verification == "invariant":
        exponentials = noise.exponentials(position)[: row.shape[0]]
        return int(race(probs, exponentials)), None, float(probs.max())
    token = sample(probs, noise.uniform(DRAFT, position))
    full = np.zeros(target_vocab, dtype=np.float64)  # [target_vocab]
    full[: row.shape[0]] = probs
    return token, full, float(probs.max())


class DraftChain:
    """The token-by-token part of a proposal, shared by the drafters that run a model: each
    token is taken or ends the proposal as the draft's confidence and the policy's plan say."""

    def __init__(
        self, k: int, plan: DraftPlan | None, request: DraftRequest, eos: np.ndarray
    ) -> None:
        self.k = k
        self.plan = plan
        self.min_confidence = request.min_confidence
        self.want_top = plan is not None or self.min_confidence > 0.0  # compute confidences
        self.eos = eos
        self.grammar = request.grammar
        self.tokens: list[int] = []
        self.rows: list[np.ndarray] = []  # p_draft rows (rejection sampling)
        self.tops: list[float] = []

    def restrict(self, row: np.ndarray) -> np.ndarray | None:
        """The draft's logits row [width] with what the grammar refuses at -inf (None: the
        grammar allows nothing the draft can emit; the proposal ends)."""
        if self.grammar is None:
            return row
        allowed = self.grammar.draft_allowed()
        width = row.shape[0]
        if allowed.shape[0] < width:
            allowed = np.pad(allowed, (0, width - allowed.shape[0]))
        allowed = allowed[:width]
        if not allowed.any():
            return None
        return np.where(allowed, row, -np.inf)

    def offer(self, i: int, token: int, probs: np.ndarray | None, top: float) -> bool:
        """Draft token i: take it or not; True when the draft should propose another."""
        if i > 0 and top < self.min_confidence:
            return False  # the draft is unsure: verify what we have
        take, more = self.plan(i, top) if self.plan is not None else (True, True)
        if not take or (self.grammar is not None and not self.grammar.draft_push(token)):
            return False
        self.tokens.append(token)
        self.tops.append(top)
        if probs is not None:
            self.rows.append(probs)
        return more and i < self.k - 1 and not (self.eos.size and token in self.eos)

    def proposal(self, catchup: int, model_passes: int) -> Proposal:
        if self.grammar is not None:
            self.grammar.draft_end()
        return Proposal(
            np.asarray(self.tokens, dtype=np.int64),
            np.stack(self.rows) if self.rows else None,  # [n, target_vocab]
            np.asarray(self.tops) if self.want_top else None,  # [n]
            catchup=catchup,
            model_passes=model_passes,
        )


class ModelDrafter:
    def __init__(
        self,
        session: GraphSession,
        capacity: int,
        target_vocab: int,
        eos_token_ids: tuple[int, ...] = (),
        name: str = "draft",
    ) -> None:
        self.name = name
        self.session = session
        self.cache = session.new_cache(capacity)
        self.target_vocab = target_vocab
        # Tokens both models can emit; the rest are padding rows of the larger vocabulary.
        self.shared_vocab = min(session.vocab_size, target_vocab)
        self.eos = np.asarray(eos_token_ids, dtype=np.int64)
        self._request = DraftRequest(SamplingParams(), PositionNoise(0, target_vocab))
        self._context_len = 0
        self._fed_from_proposal = 0
        self._rows: DraftRows | None = None  # a shared draft cache while in a batch
        self._row = 0

    # -- where the draft's cache lives: its own, or a row of a batch's shared one -----------
    def draft_session(self, source: str) -> GraphSession | None:
        """The draft model a proposal from `source` runs (for a batch to share its passes)."""
        return self.session if source == MODEL else None

    def bind_row(self, rows: DraftRows | None, row: int = 0) -> None:
        """Use row `row` of a batch's shared draft cache (None: the drafter's own cache)."""
        self._rows, self._row = rows, row

    @property
    def _length(self) -> int:
        return self._rows.length(self._row) if self._rows is not None else self.cache.length

    def _truncate(self, length: int) -> None:
        if self._rows is not None:
            self._rows.truncate(self._row, length)
        else:
            self.cache.truncate(length)

    def _feed(self, tokens: np.ndarray) -> np.ndarray:
        """One proposal step alone: a pass (or chunks) over `tokens`; their last logits row."""
        if self._rows is not None:
            return self._rows.feed(self._row, tokens)
        logits = self.session.prefill(tokens, self.cache)  # a view: used at once
        assert logits is not None
        return logits

    # -- the drafter interface ---------------------------------------------------------------
    def _input(self, tokens: np.ndarray) -> np.ndarray:
        # A target padding-row id (possible only with untrained targets) is not a valid draft
        # input; feed token 0 instead. The draft then guesses worse, the output stays exact.
        if tokens.size and int(tokens.max()) >= self.session.vocab_size:
            return np.where(tokens < self.session.vocab_size, tokens, 0)
        return tokens

    def start(self, prompt: np.ndarray, request: DraftRequest) -> None:
        """Keep the prefix of the prompt the draft cache holds for this scope (or bring one back
        from the store), then read the rest of the prompt now (request.prefill) or at the first
        proposal."""
        self._request = request
        reading = self._input(prompt[:-1])
        cache, row = (self._rows.cache, self._row) if self._rows is not None else (self.cache, 0)
        if request.prefixes is not None:
            key = (self._rows.session if self._rows is not None else self.session).path.name
            request.prefixes.resume(cache, row, key, reading, request.scope)
        else:
            cache.claim(row, request.scope, 0)
        if request.prefill and reading.shape[0] > self._length:
            self._feed(reading[self._length :])

    def source(self, context: np.ndarray) -> str:
        return MODEL

    def behind(self, context: np.ndarray) -> int:
        """Committed tokens the draft cache lacks (its first proposal reads them)."""
        return int(context.shape[0]) - self._length

    def propose(self, context: np.ndarray, k: int, plan: DraftPlan | None = None) -> Proposal:
        steps = self.proposal_steps(context, k, plan)
        try:
            tokens = next(steps)
            while True:
                tokens = steps.send(self._feed(tokens))
        except StopIteration as done:
            return done.value

    def proposal_steps(
        self, context: np.ndarray, k: int, plan: DraftPlan | None = None
    ) -> ProposalSteps:
        """The proposal as steps: yields the tokens of each pass (first the committed tokens
        the cache lacks, then each drafted token but the last), is sent that pass's last logits
        row, and returns the proposal."""
        self._context_len = int(context.shape[0])
        self._fed_from_proposal = 0
        if k <= 0:
            return Proposal(EMPTY)
        pending = context[self._length :]  # committed tokens the draft has not seen (>= 1)
        logits = yield self._input(pending)
        passes = 1
        chain = DraftChain(k, plan, self._request, self.eos)
        for i in range(k):
            row = chain.restrict(logits[: self.shared_vocab])
            if row is None:
                break
            token, probs, top = pick_token(
                row, self._context_len + i, self._request, self.target_vocab, chain.want_top
            )
            if not chain.offer(i, token, probs, top):
                break
            logits = yield self._input(np.array([token], dtype=np.int64))
            passes += 1
            self._fed_from_proposal += 1
        return chain.proposal(int(pending.shape[0]), passes)

    def commit(self, num_accepted: int) -> None:
        kept = self._context_len + min(num_accepted, self._fed_from_proposal)
        self._truncate(min(kept, self._length))
