"""Continuous batching: several sequences share every target pass.

Each active sequence owns a row of a ``BatchKVCache`` and keeps its own length, drafter, K
policy, sampling settings, keyed random numbers and statistics (decode/sequence.py). A step is
the speculative step of decode/loop.py done for all rows at once:

    propose   every sequence asks its drafter for up to its own K tokens; the rows whose drafts
              run the same draft model share its passes (one pass per drafted position for
              all of them: drafters/shared_passes.py)
    verify    one pass of the batched graph: row b is ``[last_committed_b, d_1 .. d_kb]`` at
              positions n_b .. n_b + k_b, padded to the longest row (padded positions land past
              the row's length, where nothing reads them)
    accept    each row is verified on its own logits rows, exactly as alone
    commit    Sequence.commit, the same function as alone: the row's length is set to what it
              kept, its drafter, grammar, policy and stats are told

A sequence's prompt is read into its row one chunk per step (prefill.py: a long prompt never
stalls the others for longer than a chunk; rows joining in the same step read theirs in one
pass), then it decodes with them, and it leaves at its own stop; the others never wait for it.
A row keeps what it holds after its sequence leaves: a new sequence takes the free row holding
the longest prefix of its prompt for its scope, and reads only the rest (runtime/prefix).
What a sequence produces depends only on its own prompt, settings and seed, not on what shares
its batch (up to float near-ties between differently shaped passes).
"""

from __future__ import annotations

from time import perf_counter

import numpy as np

from specx.runtime.backends.base import BatchedGraph
from specx.runtime.batch.prefill import PromptReader
from specx.runtime.batch.widths import Expected, WidthPlanner, on_batched_graph
from specx.runtime.decode.sequence import Sequence
from specx.runtime.drafters.base import MODEL, Drafter, SharedPassDrafter, reads_prompt_features
from specx.runtime.drafters.shared_passes import DraftRows, RowSteps
from specx.runtime.errors import InputError
from specx.runtime.prefix.cache import PrefixCache
from specx.runtime.settings import MAX_K

# the widest verify pass: a free row keeps at most capacity - IDLE_ROOM positions, since a pass
# over rows around it writes padding at its length too (a prompt pass over several rows checks
# that every row in its span has room, else reads them one by one: prefill.py)
IDLE_ROOM = MAX_K + 1


class BatchDecoder:
    """Up to `rows` sequences decoding together through one batched graph."""

    def __init__(
        self,
        session: BatchedGraph,
        rows: int,
        capacity: int,
        single: BatchedGraph | None = None,
        widths: WidthPlanner | None = None,
        prefixes: PrefixCache | None = None,
    ) -> None:
        """session: the batched graph. single: the target's gqa graph, if it can share the
        cache (same layout): then passes GroupQueryAttention can take (one row, or one token per
        row) run there, faster than the batched graph's attention over whole rows. prefixes: the
        pipeline's prompt reuse (None: every prompt is read whole)."""
        self.session = session
        self.prefixes = prefixes
        self.cache_key = "rows:" + session.path.name  # what computes the rows' positions
        self.single = single if single is not None and single.spec.attention == "gqa" else None
        self.cache = session.new_batch_cache(rows, capacity)
        self.capacity = capacity
        self._rows: list[Sequence | None] = [None] * rows
        self._freed = list(range(rows))  # free rows, least recently freed first
        self.prompts = PromptReader(session, self.single, self.cache, prefixes)
        self.widths = widths or WidthPlanner()  # shared by a pipeline's batches: what passes cost
        self.passes = 0  # passes after prefill
        self.single_passes = 0  # of them, passes of the gqa graph
        self.rows_per_pass: list[int] = []  # sequences in each of them
        self._draft_rows: dict[str, DraftRows] = {}  # per draft graph: the rows' draft caches
        # whether the caller waits for every row (and nothing waits for a free row): then -k
        # auto plans for the time until the last row is done (WidthPlanner.row_weight), else
        # for each row's own (a server's requests, or a batch with prompts still waiting)
        self.finish_together = False

    @property
    def taken(self) -> list[Sequence]:
        """Every sequence that holds a row (decoding, or still reading its prompt)."""
        return [s for s in self._rows if s is not None]

    @property
    def active(self) -> list[Sequence]:
        """The sequences that decode in the next pass (their prefill is done)."""
        return [s for s in self.taken if s.prefilled < 0]

    @property
    def busy(self) -> bool:
        """Whether any row is taken."""
        return any(s is not None for s in self._rows)

    @property
    def draft_rows(self) -> list[DraftRows]:
        """The shared draft caches (one per draft graph the rows have used)."""
        return list(self._draft_rows.values())

    @property
    def free_rows(self) -> int:
        return sum(s is None for s in self._rows)

    @property
    def prefill_passes(self) -> int:
        """Passes that read prompt chunks."""
        return self.prompts.passes

    def add(self, seq: Sequence) -> Sequence:
        """Give a new sequence a free row: the next steps read its prompt (a chunk each), then
        it decodes with the others."""
        n = seq.n_context
        if not 1 <= n < self.capacity:
            raise InputError(
                f"the prompt has {n} tokens; a batch row holds at most {self.capacity - 1}",
                "shorten the prompt",
            )
        if not self._freed:
            raise InputError(f"all {len(self._rows)} batch rows are busy")
        row = seq.row = self._choose_row(seq)
        self._resume(seq)
        if seq.drafter is not None:
            seq.draft_rows = self._bind_draft(seq.drafter, row)
            if seq.draft_rows is not None:
                assert isinstance(seq.drafter, SharedPassDrafter)  # once, not per step
                seq.shared_drafter = seq.drafter
        seq.start(self.capacity, prefill=False)
        kept = int(self.cache.lengths[row])
        seq.prefilled = kept if kept < n - 1 else -1  # -1: nothing (left) to prefill
        seq.reading = False
        seq.decode_start = perf_counter()
        self._rows[row] = seq
        self._freed.remove(row)
        return seq

    def keep_prefixes(self) -> None:
        """Before the decoder is dropped: put what its free rows hold in the pipeline's store."""
        if self.prefixes is not None:
            for row in self._freed:
                self.prefixes.keep(self.cache, row, self.cache_key)

    def _choose_row(self, seq: Sequence) -> int:
        """The free row holding the longest prefix of the prompt for the sequence's scope; where
        none holds any, the least recently freed one."""
        reading, scope = seq.prompt[:-1], seq.settings.cache_scope
        shared = [self.cache.shared_prefix(r, reading, scope) for r in self._freed]
        best = max(range(len(shared)), key=lambda i: (shared[i], i))
        return self._freed[best if shared[best] else 0]

    def _resume(self, seq: Sequence) -> None:
        """Keep the prefix of the prompt the sequence's row holds, or bring one back from the
        store (prefill.py then looks for a longer one in the other rows)."""
        row, scope = seq.row, seq.settings.cache_scope
        if self.prefixes is None:
            self.cache.claim(row, scope, 0)
            return
        refuse = ""
        if reads_prompt_features(seq.drafter):
            refuse = "the feature draft reads the target's features of every prompt position"
        done = self.prefixes.resume(self.cache, row, self.cache_key, seq.prompt[:-1], scope, refuse)
        seq.stats.reused_prompt_tokens = done.tokens
        seq.stats.prompt_cache, seq.stats.prompt_cache_note = done.source, done.note

    def cancel(self, seq: Sequence) -> None:
        """Stop a sequence now (a client went away); its row is free at once."""
        if not seq.done:
            seq.finish("interrupted")
            self._release(seq)

    def step(self) -> None:
        """One batched pass over every active sequence, after one prefill chunk of the rows
        that are joining (if any)."""
        joining = [s for s in self.taken if s.prefilled >= 0]
        if joining:
            self.prompts.read(joining)
        active = self.active
        if not active:
            return
        started, before = perf_counter(), {s.row: s.stats.new_tokens for s in active}
        expected = self._decide_all(active, reading=len(self.taken) - len(active))
        self._draft_all(active)
        for s in active:
            s.admit()
        self._verify_and_commit(active)
        if expected is not None:  # what -k auto's plan gave
            made = {s.row: s.stats.new_tokens - before[s.row] for s in active}
            gave = self.widths.weighted_tokens(made)
            self.widths.observe_step(expected, gave, perf_counter() - started)

    def run(self) -> None:
        """Step until every sequence has stopped."""
        while self.busy:
            self.step()

    # -- the parts of a step -------------------------------------------------------------------
    def _decide_all(self, active: list[Sequence], reading: int) -> Expected | None:
        """Every row's source and K: -k auto rows planned for the batch as a whole where the
        planner does (batch/widths.py); what the plan expects of the step, if it planned."""
        # every row of the pass (a joining one too) needs room for its width
        longest = int(max(self.cache.lengths[s.row] for s in self.taken))
        if len(active) > 1:
            for s in active:
                s.shared_pass = True
        for s in active:
            s.find_source()
            s.shares_draft = (
                s.shared_drafter is not None
                and s.shared_drafter.draft_session(s.source) is not None
            )
        planned = self.widths.plans(active, reading)  # -k auto's K set for the batch below
        for s in active:
            s.decide(room=self.capacity - longest - 1, planned=planned)
        last_to_finish = None
        if self.finish_together:  # the caller waits for the last row: the rows most behind
            last_to_finish = max(s.tokens_left for s in self.taken)
        span = max(s.row for s in active) - min(s.row for s in active) + 1
        return self.widths.plan(active, span, reading, last_to_finish)

    def _verify_and_commit(self, active: list[Sequence]) -> None:
        """One pass over the rows first .. last of `active` (rows between them take no token),
        then every row accepts and commits on its own logits rows."""
        first = min(s.row for s in active)
        span = max(s.row for s in active) - first + 1
        width = 1 + max(s.proposal.tokens.shape[0] for s in active)
        tokens = np.zeros((span, width), dtype=np.int64)  # [rows, width], 0: padding
        counts = np.zeros(span, dtype=np.int64)
        committed = {s.row: int(self.cache.lengths[s.row]) for s in active}
        for s in active:
            fed = s.verify_input()  # [n + 1]
            tokens[s.row - first, : fed.shape[0]] = fed
            counts[s.row - first] = fed.shape[0]
        runner = self.session
        if self.single is not None and not on_batched_graph(span, width):
            runner = self.single
            self.single_passes += 1
        t0 = perf_counter()
        logits = runner.forward_rows(tokens, counts, self.cache, first)  # [rows, width, V]
        verify_s = perf_counter() - t0
        self.widths.observe(span, width, verify_s)
        self.passes += 1
        self.rows_per_pass.append(len(active))
        features = runner.last_features  # [rows, width, F] where a feature draft reads them
        for s in active:
            n = int(counts[s.row - first])
            row_features = None if features is None else features[s.row - first]
            s.commit(
                logits[s.row - first, :n], self.cache, committed[s.row], verify_s, row_features
            )
            if s.done:
                self._release(s)

    def _bind_draft(self, drafter: Drafter, row: int) -> DraftRows | None:
        """Put a model drafter's cache in `row` of its draft graph's shared rows, so that its
        passes can be shared (None: it drafts alone)."""
        if not isinstance(drafter, SharedPassDrafter):
            return None
        session = drafter.draft_session(MODEL)
        graph = session.batched() if session is not None else None
        if graph is None or graph.spec.max_length < self.capacity:
            return None  # no row passes, or exported for shorter sequences than the rows hold
        key = str(graph.path)
        if key not in self._draft_rows:
            self._draft_rows[key] = DraftRows(graph.fork(), len(self._rows), self.capacity)
        rows = self._draft_rows[key]
        drafter.bind_row(rows, row)  # its start keeps what the row holds of the prompt
        return rows

    def _draft_all(self, active: list[Sequence]) -> None:
        """Every row's proposal: the rows sharing a draft graph's passes together (their
        drafting time is the shared run's), the others one by one."""
        groups: dict[int, list[Sequence]] = {}
        for s in active:
            if s.shares_draft and s.k > 0:
                assert s.draft_rows is not None
                groups.setdefault(id(s.draft_rows), []).append(s)
            else:
                s.propose()
        for group in groups.values():
            self._draft_together(group)

    def _draft_together(self, group: list[Sequence]) -> None:
        """The proposals of rows whose drafts run one draft graph, in shared passes."""
        rows = group[0].draft_rows
        assert rows is not None
        t0 = perf_counter()
        jobs: list[RowSteps] = []
        for s in group:
            assert s.shared_drafter is not None
            steps = s.shared_drafter.proposal_steps(s.committed, s.k, s.decision.plan)
            jobs.append(RowSteps(s.row, steps))
        proposals = rows.propose(jobs)
        seconds = perf_counter() - t0
        if rows.caught_up:  # a row read its prompt, or steps it missed: not a usual cost
            self.widths.observe_catchup(rows.caught_up, rows.caught_up_s)
        else:
            self.widths.observe_draft(len(group), max(s.k for s in group), seconds)
        for s in group:
            s.proposal = proposals[s.row]
            s.draft_s = seconds

    def _release(self, s: Sequence) -> None:
        """Free a stopped sequence's row (and its draft row); they keep what they hold for a
        later prompt that starts the same way."""
        if self.prefixes is not None and self.cache.lengths[s.row] > self.capacity - IDLE_ROOM:
            self.prefixes.keep(self.cache, s.row, self.cache_key)  # what release drops of it
        self.cache.release(s.row, IDLE_ROOM)
        if s.draft_rows is not None and s.shared_drafter is not None:
            s.draft_rows.release(s.row)
            s.shared_drafter.bind_row(None)  # the drafter may serve a generation alone next
            s.draft_rows = s.shared_drafter = None
        self._rows[s.row] = None
        self._freed.append(s.row)
