"""Draft-model passes shared by the rows of a batch.

Alone, a draft model costs a pass per drafted token. In a batch, each row drafting on its own
would cost rows x K passes before every verify pass, though a one-token pass over several rows
costs little more than over one (int8 SmolLM2 on 2 cores: 4 rows 21 ms, one row 17 ms;
docs/bench/batching.md). So the rows whose drafts run the same draft graph keep their draft
caches as rows of one ``BatchKVCache`` here, and their proposals advance in lockstep: each
round feeds every row's next token in one pass (one token per row: a pass GroupQueryAttention
takes over rows of different lengths), and a row whose proposal ends drops out of the next
rounds. A row that must first catch up on a few committed tokens feeds them one per pass with
the other rows that are behind; a long catch-up (its first proposal reads the prompt) runs alone,
in chunks.

What a row drafts does not depend on the other rows (up to float near-ties between passes of
different shapes); verification keeps every row's output exact either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specx.runtime.backends.base import GraphSession
from specx.runtime.backends.ort_session import OrtSession
from specx.runtime.drafters.base import Proposal, ProposalSteps
from specx.runtime.kv_cache import BatchKVCache


def can_share_passes(session: GraphSession) -> bool:
    """Whether a draft graph takes one-token passes over rows of a batch cache."""
    return isinstance(session, OrtSession) and session.spec.attention in ("gqa", "batched")


@dataclass
class RowSteps:
    """One row's proposal in a shared drafting round."""

    row: int
    steps: ProposalSteps


class DraftRows:
    """The draft caches of a batch's rows in one buffer, for one draft graph."""

    CATCHUP_SHARED = 1  # catch-up tokens a row feeds in shared passes; more: alone, in chunks

    def __init__(self, session: OrtSession, rows: int, capacity: int) -> None:
        self.session = session  # a fork: its own bindings and logits buffers
        self.cache: BatchKVCache = session.new_batch_cache(rows, capacity)
        self.passes = 0  # shared rounds run (one pass each)
        self.caught_up = 0  # committed tokens the last propose fed rows alone before its rounds

    def length(self, row: int) -> int:
        return int(self.cache.lengths[row])

    def truncate(self, row: int, length: int) -> None:
        self.cache.lengths[row] = min(length, int(self.cache.lengths[row]))

    def feed(self, row: int, tokens: np.ndarray) -> np.ndarray:
        """Tokens into one row alone (in chunks); the last logits row (a view: used at once)."""
        chunk = self.session.max_chunk
        logits = None
        for start in range(0, int(tokens.shape[0]), chunk):
            part = tokens[start : start + chunk]
            logits = self.session.forward_rows(
                part[None], np.array([part.shape[0]]), self.cache, row
            )
        assert logits is not None, "feed takes at least one token"
        return logits[0, -1]

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
        one, two after a fully accepted proposal (its last token was never fed), more after
        steps it did not draft. Up to CATCHUP_SHARED of them go one per shared pass with the
        other rows that are behind; a longer catch-up (a prompt) is read alone, in chunks."""
        done: dict[int, Proposal] = {}
        pending: dict[int, np.ndarray] = {}  # row -> the tokens its next pass feeds
        steps = {job.row: job.steps for job in jobs}
        self.caught_up = 0
        for row, s in steps.items():
            try:
                pending[row] = next(s)
            except StopIteration as stop:
                done[row] = stop.value
        while pending:
            for row, tokens in pending.items():
                if tokens.shape[0] > self.CATCHUP_SHARED + 1:
                    self.feed(row, tokens[:-1])
                    self.caught_up += int(tokens.shape[0]) - 1
                    pending[row] = tokens[-1:]
            while behind := {row: t for row, t in pending.items() if t.shape[0] > 1}:
                self._round({row: int(t[0]) for row, t in behind.items()})
                pending.update({row: t[1:] for row, t in behind.items()})
            logits, first = self._round({row: int(t[0]) for row, t in pending.items()})
            fed, pending = pending, {}
            for row in fed:
                try:
                    pending[row] = steps[row].send(logits[row - first, 0])
                except StopIteration as stop:
                    done[row] = stop.value
        return done
