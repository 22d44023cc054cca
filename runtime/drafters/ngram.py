"""Prompt lookup (Saxena 2023): propose what followed the latest earlier occurrence of the
context's last n tokens, for n from max_ngram down to min_ngram. No model; the state is an index
of the text so far and the current step's search result. Its source names n (lookup_source):
-k auto keeps an estimate per match length, since a continuation after a 3-token match is right
far more often than after one.

The search reads an index: every n-gram of the text so far (n <= max_ngram) under the latest
position it ended at, kept up to date one step's new tokens at a time, so a step's lookup costs
max_ngram dictionary reads, plus a check that the context extends the one indexed: its cost
does not grow with the context, where a scan of the whole context each step would. Proposals
stop after an EOS token.
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
        self._latest: dict[tuple[int, ...], int] = {}  # n-gram -> where it last ended
        self._indexed = 0  # positions 0 .. _indexed - 1 are in _latest
        self._tokens = np.empty(0, dtype=np.int64)  # [>= _indexed] the tokens indexed first

    def start(self, prompt: np.ndarray, request: DraftRequest) -> None:
        self._found = (-1, EMPTY, 0)  # nothing looked up yet
        self._latest.clear()
        self._indexed = 0  # (the buffer stays: its first _indexed tokens are what count)

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
        longest = min(self.max_ngram, length - 1)
        if longest < self.min_ngram:
            return EMPTY, 0
        # every match must be followed by a token: it ends at position length - 2 or before
        self._index_to(context, length - 1)
        suffix = context[length - longest : length].tolist()
        for n in range(longest, self.min_ngram - 1, -1):
            end = self._latest.get(tuple(suffix[longest - n :]))
            if end is None:
                continue
            tokens = context[end + 1 : end + 1 + LOOKAHEAD]
            if self.eos.size:
                # [n, eos] compared at once: cheaper than np.isin's setup for a few tokens
                stops = np.flatnonzero((tokens[:, None] == self.eos).any(axis=1))
                if stops.size:
                    tokens = tokens[: int(stops[0]) + 1]
            return tokens.astype(np.int64, copy=True), n
        return EMPTY, 0

    def _index_to(self, context: np.ndarray, end: int) -> None:
        """Register every n-gram (n <= max_ngram) ending before position `end` under its latest
        end. The context grows from step to step, so only the new positions are added; a
        context that does not extend the one indexed (another generation) is indexed anew."""
        done = self._indexed
        if done > end or not (context[:done] == self._tokens[:done]).all():
            self._latest.clear()
            done = 0
        if done == end:
            return
        first = max(0, done - self.max_ngram + 1)  # the earliest token a new n-gram holds
        values = context[first:end].tolist()
        latest = self._latest
        for position in range(done, end):
            i = position - first
            for n in range(1, min(self.max_ngram, position + 1) + 1):
                latest[tuple(values[i - n + 1 : i + 1])] = position
        if end > self._tokens.shape[0]:  # room for the new tokens, doubled: no copy per step
            grown = np.empty(max(2 * end, 256), dtype=np.int64)
            grown[:done] = self._tokens[:done]
            self._tokens = grown
        self._tokens[done:end] = context[done:end]
        self._indexed = end

    def source(self, context: np.ndarray) -> str:
        found = self.continuation(context)
        return lookup_source(self._found[2]) if found.size else NONE

    def propose(self, context: np.ndarray, k: int, plan: DraftPlan | None = None) -> Proposal:
        """`plan` is not asked: this lookup has no confidence, and its tokens cost nothing."""
        found = self.continuation(context)
        self.forget()
        return Proposal(found[:k] if k > 0 else EMPTY)

    def commit(self, num_accepted: int) -> None:
        """Nothing to keep: the next lookup reads the updated context."""
