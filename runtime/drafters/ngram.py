"""Prompt lookup (Saxena 2023): propose what followed the latest earlier occurrence of the
context's last n tokens, for n from max_ngram down to min_ngram. No model; the only state is the
current step's search result. Its source names n (lookup_source): -k auto keeps an estimate per
match length, since a continuation after a 3-token match is right far more often than after one.

The search is one vectorized comparison over the context (where the last token occurred before),
then max_ngram - 1 comparisons over those places only, so it costs microseconds even for
thousands of tokens. Proposals stop after an EOS token.
"""

from __future__ import annotations

import numpy as np

from specx.runtime.drafters.base import (
    EMPTY,
    NONE,
    DraftPlan,
    DraftRequest,
    Proposal,
    lookup_source,
)

LOOKAHEAD = 64  # the most tokens a continuation is read ahead (K never exceeds 16)


class NgramDrafter:
    def __init__(
        self, max_ngram: int = 3, min_ngram: int = 1, eos_token_ids: tuple[int, ...] = ()
    ) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.name = "ngram"
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.eos = np.asarray(eos_token_ids, dtype=np.int64)
        # (context length, continuation, tokens matched)
        self._found: tuple[int, np.ndarray, int] = (-1, EMPTY, 0)

    def start(self, prompt: np.ndarray, request: DraftRequest) -> None:
        self._found = (-1, EMPTY, 0)  # nothing looked up yet

    def continuation(self, context: np.ndarray) -> np.ndarray:
        """What followed the best earlier match of the context's suffix (up to LOOKAHEAD tokens,
        cut after an EOS), or nothing. Kept until the step's `propose`, so one step searches
        once however often it asks."""
        length = int(context.shape[0])
        if self._found[0] != length:
            self._found = (length, *self._search(context, length))
        return self._found[1]

    def forget(self) -> None:
        """The step is over: the next context is a new one."""
        self._found = (-1, EMPTY, 0)

    def _search(self, context: np.ndarray, length: int) -> tuple[np.ndarray, int]:
        """(the continuation, how many tokens matched); (EMPTY, 0): no match."""
        if length < 2:
            return EMPTY, 0
        # every earlier position holding the last token ends a match of length >= 1 (positions
        # up to length - 2, so that every match is followed by at least one token)
        ends = np.flatnonzero(context[: length - 1] == context[length - 1])  # [m]
        longest = min(self.max_ngram, length - 1)
        if ends.size == 0 or longest < self.min_ngram:
            return EMPTY, 0
        matched = np.ones(ends.size, dtype=np.int64)  # [m] suffix tokens each match shares
        going = np.ones(ends.size, dtype=bool)
        for back in range(1, longest):
            going &= ends >= back
            going[going] = context[ends[going] - back] == context[length - 1 - back]
            matched += going
        for n in range(longest, self.min_ngram - 1, -1):
            hits = ends[matched >= n]
            if hits.size == 0:
                continue
            start = int(hits[-1]) + 1  # the latest occurrence: closest to the current topic
            tokens = context[start : start + LOOKAHEAD]
            if self.eos.size:
                # [n, eos] compared at once: np.isin costs ~50 us here, ten times as much
                stops = np.flatnonzero((tokens[:, None] == self.eos).any(axis=1))
                if stops.size:
                    tokens = tokens[: int(stops[0]) + 1]
            return tokens.astype(np.int64, copy=True), n
        return EMPTY, 0

    def source(self, context: np.ndarray) -> str:
        found = self.continuation(context)
        return lookup_source(self._found[2]) if found.size else NONE

    def propose(self, context: np.ndarray, k: int, plan: DraftPlan | None = None) -> Proposal:
        """`plan` is not asked: a lookup has no confidence, and its tokens cost nothing."""
        found = self.continuation(context)
        self.forget()
        return Proposal(found[:k] if k > 0 else EMPTY)

    def commit(self, num_accepted: int) -> None:
        """Nothing to keep: the next lookup reads the updated context."""
