"""Draft-model passes shared by the rows of a batch.

Alone, a draft model costs a pass per drafted token. In a batch, each row drafting on its own would
cost rows x K passes before every verify pass, though a one-token pass over several rows costs
little more than over one (measured by `scripts/diagnostics/batch_costs.py --one-token`;
docs/bench/batching.md). So the rows whose drafts run the same draft graph keep their
draft caches as rows of one ``BatchKVCache`` here, and their proposals advance in lockstep: each
round feeds every row's next token in one pass (one token per row: a pass GroupQueryAttention takes
over rows of different lengths), and a row whose proposal ends drops out of the next rounds. Rows
that must first catch up on a committed token or two feed them one per pass together; a row alone
in being behind, or far behind (its first proposal reads the prompt), reads them alone in one pass
(chunks for a prompt) and joins the next round; an empty row first copies the longest prefix of its
tokens another row holds (a shared system prompt).

What a row drafts does not depend on the other rows (up to float near-ties between passes of
different shapes); verification keeps every row's output exact either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter

import numpy as np

from specx.runtime.backends.base import BatchedGraph
from specx.runtime.drafters.base import Proposal, ProposalSteps
from specx.runtime.kv_cache import BatchKVCache


@dataclass
class RowSteps:
    """One row's proposal in a shared drafting round."""

    row: int
    steps: ProposalSteps


class DraftRows:
    """The draft caches of a batch's rows in one buffer, for one draft graph."""

    CATCHUP_SHARED = 1  # catch-up tokens a row feeds in shared passes; more: alone, in chunks
    SHARED_PREFIX_MIN = 8  # prompt tokens worth copying from another row instead of computing

    def __init__(self, session: BatchedGraph, rows: int, capacity: int) -> None:
        self.session = session  # a fork: its own bindings and logits buffers
        self.cache: BatchKVCache = session.new_batch_cache(rows, capacity)
        self.passes = 0  # shared rounds run (one pass each)
        # tokens of long catch-ups (a prompt) the last propose read alone: not a usual step's
        # cost; and the seconds they took
        self.caught_up = 0
        self.caught_up_s = 0.0

    def length(self, row: int) -> int:
        return int(self.cache.lengths[row])

    def truncate(self, row: int, length: int) -> None:
        self.cache.lengths[row] = min(length, int(self.cache.lengths[row]))

    def release(self, row: int) -> None:
        """The row's generation is over: it keeps its prefix for the row's next one, with room
        for the one-token rounds of its neighbours."""
        self.cache.release(row, 1)

    def feed(self, row: int, tokens: np.ndarray) -> np.ndarray:
        """Tokens into one row alone (in chunks); the last logits row (a view: used at once).
        An empty row first copies the longest prefix of them another row holds (a shared
        system prompt) instead of computing it."""
        if tokens.shape[0] > self.SHARED_PREFIX_MIN:
            have = self.length(row)
            tokens = tokens[self._reuse_prefix(row, tokens[:-1], have) - have :]
        chunk = self.session.max_chunk
        logits = None
        for start in range(0, int(tokens.shape[0]), chunk):
            part = tokens[start : start + chunk]
            logits = self.session.forward_rows(
                part[None], np.array([part.shape[0]]), self.cache, row
            )
        assert logits is not None, "feed takes at least one token"
        return logits[0, -1]

    def _reuse_prefix(self, row: int, tokens: np.ndarray, have: int) -> int:
        """Copy into `row` (which holds its context's first `have` tokens) the longest prefix of
        its context another row of its scope holds, ending where `tokens` (the rest of it but
        the last token) ends; returns the row's length."""
        context = np.concatenate([self.cache.held(row), tokens])
        return self.cache.reuse_prefix(row, context, self.SHARED_PREFIX_MIN + have)

    def _round(self, tokens: dict[int, int]) -> tuple[np.ndarray, int]:
        """One pass feeding one token to each row in `tokens` (the rows between sit it out):
        the logits [rows, 1, V] (a view: used at once) and the first row of the pass."""
        first, last = min(tokens), max(tokens)
        batch = np.zeros((last - first + 1, 1), dtype=np.int64)  # [rows, 1]
        counts = np.zeros(last - first + 1, dtype=np.int64)  # 0: the row sits this pass out
        for row, token in tokens.items():
            batch[row - first, 0] = token
            counts[row - first] = 1
        logits = self.session.forward_rows(batch, counts, self.cache, first)  # [rows, 1, V]
        self.passes += 1
        return logits, first

    def propose(self, jobs: list[RowSteps]) -> dict[int, Proposal]:
        """Run every row's proposal steps together: one pass per round over all rows still
        drafting. Returns each row's proposal.

        A row's first pass of a proposal feeds the committed tokens its cache lacks: usually
        one; two after a fully accepted proposal (its last token was never fed); more after
        steps it did not draft. Rows with up to CATCHUP_SHARED extra tokens feed them one per
        shared pass when at least two rows are behind; otherwise a row that is behind reads
        its tokens alone, in one pass (chunks for a prompt), and joins the next round."""
        done: dict[int, Proposal] = {}
        pending: dict[int, np.ndarray] = {}  # row -> the tokens its next pass feeds
        steps = {job.row: job.steps for job in jobs}
        self.caught_up, self.caught_up_s = 0, 0.0

        def advance(row: int, logits: np.ndarray | None) -> None:
            """The row's next step: its first tokens (logits None), or after this pass."""
            try:
                pending[row] = next(steps[row]) if logits is None else steps[row].send(logits)
            except StopIteration as stop:
                done[row] = stop.value

        for row in steps:
            advance(row, None)
        while pending:
            behind = [row for row, t in pending.items() if t.shape[0] > 1]
            short = [row for row in behind if pending[row].shape[0] <= self.CATCHUP_SHARED + 1]
            for row in behind:
                if len(short) < 2 or row not in short:
                    tokens = pending.pop(row)
                    t0 = perf_counter()
                    logits = self.feed(row, tokens)
                    if row not in short:  # a prompt's worth: not what a usual step costs
                        self.caught_up += int(tokens.shape[0]) - 1
                        self.caught_up_s += perf_counter() - t0
                    advance(row, logits)  # at once: the next pass reuses it
            while lagging := {row: t for row, t in pending.items() if t.shape[0] > 1}:
                self._round({row: int(t[0]) for row, t in lagging.items()})
                pending.update({row: t[1:] for row, t in lagging.items()})
            if pending:
                logits, first = self._round({row: int(t[0]) for row, t in pending.items()})
                fed, pending = pending, {}
                for row in fed:
                    advance(row, logits[row - first, 0])
        return done
