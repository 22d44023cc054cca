"""Continuous batching: several sequences share every target pass.

Each active sequence owns a row of a ``BatchKVCache`` and keeps its own length, drafter, K
policy, sampling settings, keyed random numbers and statistics. A step is the speculative step of
generate.py done for all rows at once:

    propose   every sequence asks its drafter for up to its own K tokens; the rows whose drafts
              run the same draft model share its passes (one pass per drafted position for
              all of them: drafters/shared_passes.py)
    verify    one pass of the batched graph: row b is ``[last_committed_b, d_1 .. d_kb]`` at
              positions n_b .. n_b + k_b, padded to the longest row (padded positions land past
              the row's length, where nothing reads them)
    accept    each row is verified on its own logits rows, exactly as alone
    commit    each row's length is set to what it kept; its drafter is told

A sequence's prompt is read into its row one chunk per step (a long prompt never stalls the
others for longer than a chunk; rows joining in the same step read theirs in one pass), then it
decodes with them, and it leaves at its own stop; the others never wait for it. What a sequence
produces depends only on its own prompt, settings and seed, not on what shares its batch (up to
float near-ties between differently shaped passes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter
from typing import TYPE_CHECKING

import numpy as np

from specx.runtime.adaptive import AdaptiveK
from specx.runtime.backends.ort_session import OrtSession
from specx.runtime.batch_prefill import PromptRows
from specx.runtime.batch_widths import WidthPlanner, on_batched_graph
from specx.runtime.constraint import Constraint
from specx.runtime.drafters.base import (
    MODEL,
    NO_PROPOSAL,
    NONE,
    Drafter,
    DraftRequest,
    FeatureReader,
    Proposal,
    SharedPassDrafter,
)
from specx.runtime.drafters.shared_passes import DraftRows, RowSteps, can_share_passes
from specx.runtime.errors import InputError
from specx.runtime.generate import (
    KPolicy,
    StepDecision,
    StepResult,
    Verifier,
    lookup_guess,
    make_verifier,
)
from specx.runtime.logprobs import TokenLogprob, score
from specx.runtime.sampling import PositionNoise
from specx.runtime.settings import GenerationSettings
from specx.runtime.stats import Stats

if TYPE_CHECKING:
    from specx.runtime.pipeline import Pipeline

NO_DECISION = StepDecision(0)

# tokens of one committed step -> None; called as soon as a step commits them
Emit = Callable[[np.ndarray], None]


@dataclass
class BatchSequence:
    """One sequence of a batch: its row, its settings and everything it has committed."""

    row: int
    settings: GenerationSettings
    policy: KPolicy
    drafter: Drafter | None
    stats: Stats
    emit: Emit | None
    verify: Verifier
    context: np.ndarray  # [capacity + 1] every committed token
    n_context: int
    done: bool = False
    tokens: list[int] = field(default_factory=list)  # the generated ids
    # this step's plan (set by _decide and _draft, used by _accept)
    proposal: Proposal = NO_PROPOSAL
    decision: StepDecision = NO_DECISION
    k: int = 0
    k_limit: int = 0  # the most this step may draft (room in the row, tokens still wanted)
    source: str = NONE
    shares_draft: bool = False  # this step's proposal runs in the shared draft passes
    draft_rows: DraftRows | None = None  # where the drafter's cache lives while in the batch
    shared_drafter: SharedPassDrafter | None = None  # the drafter, while bound to draft_rows
    draft_s: float = 0.0
    guess: int | None = None  # what a lookup offered at a step that drafts nothing
    decode_start: float = 0.0  # when it joined the decoding rows
    prefilled: int = -1  # prompt tokens in the cache while it joins; -1 once it decodes
    shared_pass: bool = False  # it has decoded in a pass with other rows
    constraint: Constraint | None = None  # its grammar's matcher (generate.speculative_step)
    logprobs: list[TokenLogprob] | None = None  # one per emitted token, when asked for

    @property
    def committed(self) -> np.ndarray:
        return self.context[: self.n_context]

    @property
    def tokens_left(self) -> int:
        """New tokens it may still make before max_new_tokens stops it."""
        return self.settings.max_new_tokens - self.stats.new_tokens


class BatchDecoder(PromptRows):
    """Up to `rows` sequences decoding together through one batched graph (their prompts are
    read by PromptRows, batch_prefill.py)."""

    def __init__(
        self,
        session: OrtSession,
        rows: int,
        capacity: int,
        eos_token_ids: tuple[int, ...],
        single: OrtSession | None = None,
        widths: WidthPlanner | None = None,
    ) -> None:
        """session: the batched graph. single: the target's gqa graph, if it can share the
        cache (same layout): then passes GroupQueryAttention can take (one row, or one token per
        row) run there, faster than the batched graph's attention over whole rows."""
        self.session = session
        self.single = single if single is not None and single.spec.attention == "gqa" else None
        self.cache = session.new_batch_cache(rows, capacity)
        self.capacity = capacity
        self.eos = set(eos_token_ids)
        self._rows: list[BatchSequence | None] = [None] * rows
        self.widths = widths or WidthPlanner()  # shared by a pipeline's batches: what passes cost
        self.passes = 0  # passes after prefill
        self.single_passes = 0  # of them, passes of the gqa graph
        self.prefill_passes = 0  # passes that read prompt chunks
        self.rows_per_pass: list[int] = []  # sequences in each of them
        self._draft_rows: dict[str, DraftRows] = {}  # per draft graph: the rows' draft caches
        # whether the caller waits for every row (and nothing waits for a free row): then -k
        # auto plans for the time until the last row is done (WidthPlanner.row_weight), else
        # for each row's own (a server's requests, or a batch with prompts still waiting)
        self.finish_together = False

    @property
    def active(self) -> list[BatchSequence]:
        """The sequences that decode in the next pass (their prefill is done)."""
        return [s for s in self._rows if s is not None and s.prefilled < 0]

    @property
    def busy(self) -> bool:
        """Whether any row is taken (decoding, or still reading its prompt)."""
        return any(s is not None for s in self._rows)

    @property
    def draft_rows(self) -> list[DraftRows]:
        """The shared draft caches (one per draft graph the rows have used)."""
        return list(self._draft_rows.values())

    @property
    def free_rows(self) -> int:
        return sum(s is None for s in self._rows)

    def add(
        self,
        prompt: np.ndarray,
        settings: GenerationSettings,
        policy: KPolicy,
        drafter: Drafter | None,
        stats: Stats,
        emit: Emit | None = None,
        constraint: Constraint | None = None,
        logprobs: list[TokenLogprob] | None = None,
    ) -> BatchSequence:
        """Take a free row for a new sequence: the next steps read its prompt (a chunk each),
        then it decodes with the others."""
        n = int(prompt.shape[0])
        if not 1 <= n < self.capacity:
            raise InputError(
                f"the prompt has {n} tokens; a batch row holds at most {self.capacity - 1}",
                "shorten the prompt",
            )
        try:
            row = self._rows.index(None)
        except ValueError as e:
            raise InputError(f"all {len(self._rows)} batch rows are busy") from e
        noise = PositionNoise(settings.sampling.seed, self.session.vocab_size)
        context = np.zeros(self.capacity + 1, dtype=np.int64)
        context[:n] = prompt
        seq = BatchSequence(
            row,
            settings,
            policy,
            drafter,
            stats,
            emit,
            make_verifier(settings.sampling, noise),
            context,
            n,
            constraint=constraint,
            logprobs=logprobs,
        )
        stats.prompt_tokens = n
        self.cache.lengths[row] = 0
        if drafter is not None:
            seq.draft_rows = self._bind_draft(drafter, row)
            if seq.draft_rows is not None:
                assert isinstance(drafter, SharedPassDrafter)  # once, not per step
                seq.shared_drafter = drafter
            request = DraftRequest(
                settings.sampling, noise, settings.draft_p_min, False, constraint
            )
            drafter.start(prompt, request)
        seq.prefilled = 0 if n > 1 else -1  # -1: nothing (left) to prefill
        seq.decode_start = perf_counter()
        self._rows[row] = seq
        if settings.max_new_tokens <= 0:
            self._finish(seq, "max_new_tokens")
        return seq

    def cancel(self, seq: BatchSequence) -> None:
        """Stop a sequence now (a client went away); its row is free at once."""
        if not seq.done:
            self._finish(seq, "interrupted")

    def step(self) -> None:
        """One batched pass over every active sequence, after one prefill chunk of a row that
        is joining (if any)."""
        joining = [s for s in self._rows if s is not None and s.prefilled >= 0]
        if joining:
            self._prefill(joining)
        active = self.active
        if not active:
            return
        # every row of the pass (a joining one too) needs room for its width
        longest = int(max(self.cache.lengths[s.row] for s in self._rows if s is not None))
        first = min(s.row for s in active)
        last = max(s.row for s in active)
        started, before = perf_counter(), {s.row: s.stats.new_tokens for s in active}
        if len(active) > 1:
            for s in active:
                s.shared_pass = True
        for s in active:
            s.source = s.drafter.source(s.committed) if s.drafter is not None else NONE
            s.shares_draft = (
                s.shared_drafter is not None
                and s.shared_drafter.draft_session(s.source) is not None
            )
        reading = sum(1 for s in self._rows if s is not None and s.prefilled >= 0)
        planned = self.widths.plans(active, reading)  # -k auto's K set for the batch below
        for s in active:
            self._decide(s, room=self.capacity - longest - 1, planned=planned)
        last_to_finish = None
        if self.finish_together:  # the caller waits for the last row: the rows most behind
            last_to_finish = max(s.tokens_left for s in self._rows if s is not None)
        expected = self.widths.plan(active, last - first + 1, reading, last_to_finish)
        self._draft_all(active)
        for s in active:
            if s.constraint is not None:  # cut what the grammar could never accept
                s.proposal = s.proposal.head(s.constraint.admit(s.proposal.tokens))
        width = 1 + max(s.proposal.tokens.shape[0] for s in active)
        tokens = np.zeros((last - first + 1, width), dtype=np.int64)  # [rows, width], 0: padding
        counts = np.zeros(last - first + 1, dtype=np.int64)
        committed = {s.row: int(self.cache.lengths[s.row]) for s in active}
        for s in active:
            n = s.proposal.tokens.shape[0]
            tokens[s.row - first, 0] = s.context[s.n_context - 1]
            tokens[s.row - first, 1 : 1 + n] = s.proposal.tokens
            counts[s.row - first] = 1 + n
        runner = self.session
        if self.single is not None and not on_batched_graph(last - first + 1, width):
            runner = self.single
            self.single_passes += 1
        t0 = perf_counter()
        logits = runner.forward_rows(tokens, counts, self.cache, first)  # [rows, width, V]
        verify_s = perf_counter() - t0
        self.widths.observe(last - first + 1, width, verify_s)
        self.passes += 1
        self.rows_per_pass.append(len(active))
        features = runner.last_features  # [rows, width, F] where a feature draft reads them
        for s in active:
            n = s.proposal.tokens.shape[0]
            row_features = None if features is None else features[s.row - first]
            self._accept(
                s, logits[s.row - first, : 1 + n], committed[s.row], verify_s, row_features
            )
        if expected is not None:  # what -k auto's plan gave
            made = {s.row: s.stats.new_tokens - before[s.row] for s in active}
            gave = self.widths.weighted_tokens(made)
            self.widths.observe_step(expected, gave, perf_counter() - started)

    def run(self) -> None:
        """Step until every sequence has stopped."""
        while self.busy:
            self.step()

    # -- one sequence's part of a step -------------------------------------------------------
    def _decide(self, s: BatchSequence, room: int, planned: bool) -> None:
        """The row's K and drafting plan (its source is known); `planned`: the batch planner
        sets a -k auto row's K, its policy only makes the plan."""
        if isinstance(s.policy, AdaptiveK):
            s.decision = s.policy.decide(s.source, choose=not planned)
            most = s.policy.max_k
        else:
            s.decision = s.policy.decide(s.source)
            most = s.decision.k
        s.k_limit = max(0, min(room, s.tokens_left - 1, most))
        s.k = max(0, min(s.decision.k, s.k_limit))

    def _bind_draft(self, drafter: Drafter, row: int) -> DraftRows | None:
        """Put a model drafter's cache in `row` of its draft graph's shared rows, so that its
        passes can be shared (None: it drafts alone)."""
        if not isinstance(drafter, SharedPassDrafter):
            return None
        session = drafter.draft_session(MODEL)
        if session is None or not can_share_passes(session):
            return None
        assert isinstance(session, OrtSession)
        if session.spec.max_length < self.capacity:
            return None  # its graph was exported for shorter sequences than the rows hold
        key = str(session.path)
        if key not in self._draft_rows:
            self._draft_rows[key] = DraftRows(session.fork(), len(self._rows), self.capacity)
        rows = self._draft_rows[key]
        rows.truncate(row, 0)
        drafter.bind_row(rows, row)
        return rows

    def _draft_all(self, active: list[BatchSequence]) -> None:
        """Every row's proposal: the rows sharing a draft graph's passes together (their
        drafting time is the shared run's), the others one by one."""
        groups: dict[int, list[BatchSequence]] = {}
        for s in active:
            if s.shares_draft and s.k > 0:
                assert s.draft_rows is not None
                groups.setdefault(id(s.draft_rows), []).append(s)
            else:
                self._draft(s)
        for group in groups.values():
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
                s.guess = None

    def _draft(self, s: BatchSequence) -> None:
        t0 = perf_counter()
        if s.drafter is not None and s.k > 0:
            s.proposal = s.drafter.propose(s.committed, s.k, s.decision.plan)
        else:
            s.proposal = NO_PROPOSAL
        s.draft_s = perf_counter() - t0
        s.guess = (
            None if s.proposal.tokens.shape[0] else lookup_guess(s.drafter, s.committed, s.source)
        )

    def _accept(
        self,
        s: BatchSequence,
        logits: np.ndarray,
        committed: int,
        verify_s: float,
        features: np.ndarray | None = None,  # [width, F]: the row's features, if the graph has
    ) -> None:
        """Verify and commit one row, and tell its policy how its proposal fared."""
        proposal = s.proposal
        if s.constraint is not None:
            logits = s.constraint.mask(proposal.tokens, logits)
        n_accepted, next_token = s.verify(proposal, logits, s.n_context)
        self.cache.lengths[s.row] = committed + 1 + n_accepted
        if s.drafter is not None and s.k > 0:
            s.drafter.commit(n_accepted)
        if features is not None and isinstance(s.drafter, FeatureReader):
            s.drafter.observe_features(committed, features[: 1 + n_accepted])
        tokens = np.append(proposal.tokens[:n_accepted], np.int64(next_token))
        if s.constraint is not None:
            s.constraint.commit(tokens)
        step = StepResult(
            tokens=tokens,
            source=s.source,
            proposed=int(proposal.tokens.shape[0]),
            accepted=n_accepted,
            draft_s=s.draft_s,
            verify_s=verify_s,
            draft_passes=proposal.model_passes,
            catchup=proposal.catchup,
            confidence=proposal.confidence,
            lookup_first_hit=None if s.guess is None else s.guess == next_token,
        )
        s.policy.observe(step)
        stats = s.stats
        stats.record_step(step.proposed, step.accepted, s.k)
        stats.draft_s += s.draft_s
        stats.verify_s += verify_s
        stats.draft_passes += step.draft_passes
        stats.decode_s = perf_counter() - s.decode_start  # wall time, others' work included
        new = step.tokens[: s.tokens_left]
        hits = [i for i, t in enumerate(new.tolist()) if t in self.eos]
        if hits:
            new = new[: hits[0] + 1]
        s.context[s.n_context : s.n_context + new.shape[0]] = new
        s.n_context += int(new.shape[0])
        stats.new_tokens += int(new.shape[0])
        s.tokens.extend(new.tolist())
        if s.logprobs is not None:
            top = s.settings.logprobs or 0
            s.logprobs.extend(score(logits, new, s.settings.sampling, top))
        if s.emit is not None:
            s.emit(new)
        if hits:
            self._finish(s, "eos")
        elif stats.new_tokens >= s.settings.max_new_tokens:
            self._finish(s, "max_new_tokens")
        elif self.cache.lengths[s.row] + 1 > self.capacity:
            self._finish(s, "max_length")

    def _finish(self, s: BatchSequence, reason: str) -> None:
        s.done = True
        s.stats.stop_reason = s.stats.stop_reason or reason
        self.cache.lengths[s.row] = 0
        if s.draft_rows is not None and s.shared_drafter is not None:
            s.draft_rows.truncate(s.row, 0)
            s.shared_drafter.bind_row(None)  # the drafter may serve a generation alone next
            s.draft_rows = s.shared_drafter = None
        self._rows[s.row] = None


def single_graph(pipeline: Pipeline) -> OrtSession | None:
    """A fork of the target's own graph for the passes it can take in a batch (gqa only)."""
    target = pipeline.target
    if isinstance(target, OrtSession) and target.spec.attention == "gqa":
        return target.fork()
    return None
