"""A feature draft (EAGLE-1/2/3 style): one small decoder layer that reads the target's own hidden
states, so that a draft pass costs a few percent of a target pass.

Pairs. The head's position t reads the pair (f_t, x_{t+1}): the target's features at position t
and the token after it, and predicts the token after that. The target hands over its features
as it commits positions (``observe_features``); since its cache holds every committed token but
the last, the features of positions 0 .. m - 2 are known when m tokens are committed, and every
pair up to (f_{m-2}, x_{m-1}) is complete: the head's last row predicts x_m.

Cache invariant between calls: the head's cache holds only pairs read with the target's true
features. ``propose`` feeds the pairs it lacks (a catch-up pass of 1 .. K + 1 rows, whose last
row gives d_1), then drafts d_2 .. d_k from its own hidden_out in place of the feature it does not
have yet (one pass per token); ``commit`` drops those guessed pairs again, so that the accepted
positions are read anew with true features after the target's pass (as EAGLE does).
"""

from __future__ import annotations

import numpy as np

from specx.runtime.backends.base import GraphSession
from specx.runtime.drafters.base import EMPTY, MODEL, NONE, DraftPlan, DraftRequest, Proposal
from specx.runtime.drafters.model import DraftChain, pick_token
from specx.runtime.errors import InputError
from specx.runtime.verification.sampling import PositionNoise, SamplingParams


class EagleDrafter:
    needs_features = True  # of every prompt position: no prompt prefix is reused for it

    def __init__(
        self,
        session: GraphSession,
        capacity: int,
        target_vocab: int,
        eos_token_ids: tuple[int, ...] = (),
        name: str = "eagle",
    ) -> None:
        head = session.spec.head
        if head is None:
            raise InputError(f"{session.path.name} is not a feature draft's graph")
        self.name = name
        self.session = session
        self.cache = session.new_cache(capacity)
        self.target_vocab = target_vocab
        self.eos = np.asarray(eos_token_ids, dtype=np.int64)
        self._features = np.zeros((capacity, head.feature_size), np.float32)  # [capacity, F]
        self._known = 0  # positions whose target features arrived
        self._request = DraftRequest(SamplingParams(), PositionNoise(0, target_vocab))
        self._context_len = 0

    def start(self, prompt: np.ndarray, request: DraftRequest) -> None:
        self._request = request
        self.cache.reset()
        self._known = 0

    def observe_features(self, position: int, features: np.ndarray) -> None:
        n = int(features.shape[0])
        self._features[position : position + n] = features  # [n, F]
        self._known = position + n
        if self.cache.length > position:  # the target rewrote positions the head has read
            self.cache.truncate(position)

    def source(self, context: np.ndarray) -> str:
        # A one-token prompt has no pair before the target's first pass: nothing to read yet.
        return MODEL if min(self._known, int(context.shape[0]) - 1) > 0 else NONE

    def _catch_up(self, context: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Feed the complete pairs the head lacks; (logits, hidden_out) of the last pair. Every
        target pass adds at least one pair and commit drops the guessed ones, so there is always
        one to feed. The logits are a view the next pass overwrites; hidden_out is copied, since
        the next pass reads it while writing its own."""
        end = min(self._known, int(context.shape[0]) - 1)  # pairs (f_t, x_{t+1}) for t < end
        chunk = self.session.max_chunk
        logits = hidden = None
        while self.cache.length < end:
            t = self.cache.length
            stop = min(end, t + chunk)
            logits, hidden = self.session.forward_head(
                context[t + 1 : stop + 1], self._features[t:stop], None, self.cache
            )
        if logits is None or hidden is None or self.cache.length != end:
            raise InputError(
                "the feature draft has no target features for the tokens so far",
                "a feature draft needs the target's features after every pass (specx's loops "
                "hand them over; a custom loop must call observe_features)",
            )
        return logits[-1], hidden[-1:].copy()

    def propose(self, context: np.ndarray, k: int, plan: DraftPlan | None = None) -> Proposal:
        self._context_len = int(context.shape[0])
        if k <= 0 or self.source(context) == NONE:
            return Proposal(EMPTY)
        passes_before = self.session.passes
        catchup = self._context_len - 1 - self.cache.length
        logits, hidden = self._catch_up(context)  # [vocab], [1, hidden]: predicts x_m
        chain = DraftChain(k, plan, self._request, self.eos)
        for i in range(k):
            row = chain.restrict(logits)
            if row is None:
                break
            token, probs, top = pick_token(
                row, self._context_len + i, self._request, self.target_vocab, chain.want_top
            )
            if not chain.offer(i, token, probs, top):
                break
            # the pair (the head's own guess of the feature, the token it just drafted)
            step_logits, step_hidden = self.session.forward_head(
                np.array([token], dtype=np.int64), None, hidden, self.cache
            )
            logits, hidden = step_logits[0], step_hidden.copy()
        return chain.proposal(catchup, self.session.passes - passes_before)

    def commit(self, num_accepted: int) -> None:
        """Drop the pairs read with guessed features: they are read again with true ones."""
        self.cache.truncate(min(self._known, self.cache.length))
