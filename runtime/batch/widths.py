"""-k auto in a batch: one cap on K for the rows whose K is chosen by the policy, chosen for the
batch as a whole from the measured costs of batched verify passes and of drafting
(docs/bench/batching.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from specx.runtime.batch.plans import Plans
from specx.runtime.decode.adaptive import AdaptiveK
from specx.runtime.drafters.base import MODEL, NONE

if TYPE_CHECKING:
    from specx.runtime.decode.sequence import Sequence


def on_batched_graph(rows: int, width: int) -> bool:
    """Whether a pass over `rows` rows `width` tokens wide needs the batched graph (several
    tokens in each of several rows), where the target's gqa graph, if it has one, takes the
    others (one token per row, or one row): the decoder routes its passes by this."""
    return rows > 1 and width > 1


# what a plan expects of its step: (rows, whether any row drafts, tokens, seconds)
Expected = tuple[int, bool, float, float]
# a batch as a plain run knows it: (decoding rows, rows its pass spans, rows reading prompts)
Batch = tuple[int, int, int]


class WidthPlanner:
    """K for the -k auto rows of a batch, chosen for the batch as a whole.

    Alone, a policy weighs its expected tokens against its drafting plus a pass that is nearly
    free to widen. In a batch the pass is as wide as its longest row, its cost grows with the
    rows times the width, and every row's drafting holds up all rows. So before drafting, the
    rows whose K is chosen by -k auto all draft up to a common cap w - 1, the w (1 .. the most
    any may draft) with the most expected tokens per second over the batch: the sum of their
    expected tokens at that K (each policy's own acceptance estimates) over the sum of their
    drafting (each policy's measured costs) plus the pass at that width. Rows with a fixed K keep
    it (the pass is then at least that wide). Pass costs per (rows, width) are measured as the
    decoder runs; a cell not yet measured is scaled from the nearest measured one of the same
    kind (`on_batched_graph`) by a prior charging each extra token 4% of a one-token pass
    (docs/bench/batching.md); a draft model not
    yet measured is guessed at half a one-token pass per token. Until a pass was measured the
    policies' own K stand, as they do for a row alone in its pass (there is no batch to weigh).
    The expected rates of plain steps and of steps that draft are each scaled by what such steps
    gave against what was expected (`realized_share`). A row's tokens count as `row_weight`
    says: all of them where each request waits for its own; where the caller waits for the
    whole batch, a row's drafts only while no row has more tokens left to make. Plans that
    draft nothing earn runs of steps that are not planned (PLAIN_MOST), as long as the batch
    and the sources its rows draft from stay ones those plans weighed.
    """

    PER_TOKEN = 0.04
    # a catch-up token read by a draft model, as a share of a one-row one-token target pass,
    # until measured: a catch-up reads many tokens in one pass, so each costs a small part of a
    # one-token pass (docs/performance.md)
    CATCHUP_PRIOR = 0.05
    CATCHUP_MEASURED = 16  # tokens a catch-up must read to measure the cost of one
    # a draft model's pass, as a share of a one-row one-token target pass, until measured
    # (what quantized drafts measure: docs/performance.md)
    DRAFT_PRIOR = 0.5
    # steps of evidence before a kind of step's realized rate counts as much as the estimate
    OUTCOME_PRIOR = 16.0
    OUTCOME_DECAY = 0.98  # per step of that kind
    # how long a draft row, once caught up, is expected to go on drafting: from the share of
    # recent steps at that many rows in which the -k auto rows that could draft with a shared
    # draft model did (decayed per step), with DRAFTING_PRIOR steps' worth of drafting, so that
    # with nothing seen yet a catch-up is spread over the steps a row has left
    DRAFTING_PRIOR = 2.0
    DRAFTING_DECAY = 0.95
    # after a plan in which no -k auto row drafts, the next steps of the same batch run plain
    # without a plan (`_in_plain_run`) while each row drafts from a source the run's plans
    # weighed for it: 1 step after the first such plan, twice as many after each next, up to
    # PLAIN_MOST; a plan that drafts, a row with a source not weighed yet, or a change of the
    # batch's rows plans again (alone, AdaptiveK probes after runs of K = 0 likewise). Where
    # nothing pays to draft (a full batch on a CPU) planning every step costs time for nothing
    # (what it costs: scripts/diagnostics/plan_costs.py). A run does not weigh the rows'
    # sources together (two rows with lookups, each weighed beside model rows): PLAIN_MOST
    # bounds what that misses. The rows' lookups are still asked during a run: drafting from
    # them pays at a few rows of input-grounded prompts (scripts/diagnostics/pass_mix.py)
    PLAIN_MOST = 16

    def __init__(self, decay: float = 0.9) -> None:
        self.decay = decay
        self.cost_s: dict[tuple[int, int], float] = {}  # (rows, width) -> a verify pass
        self.draft_cost_s: dict[tuple[int, int], float] = {}  # (rows, K) -> shared drafting
        self.catchup_token_s: float | None = None  # a token a draft row reads to catch up
        # (rows, whether any row drafted) -> decayed sums over such steps of what the plan
        # expected and what the step gave: [steps, expected tokens, expected seconds, tokens,
        # seconds]. A step's seconds are its wall time (bookkeeping, catch-ups and the rest of
        # what the estimates leave out); drafting is chosen where it is expected to win, so its
        # expected rate is biased upward (the winner's curse): both are corrected by what such
        # steps gave.
        self.outcomes: dict[tuple[int, bool], list[float]] = {}
        # rows -> decayed [steps with rows that could draft with a shared draft model, the
        # share of those rows that did]
        self.model_drafting: dict[int, list[float]] = {}
        self.weights: dict[int, float] = {}  # row -> its row_weight in the last plan
        # a cell not measured -> the measured cell it is scaled from; found once for each set of
        # measured cells (a plan asks dozens of cells a step, and the search for the nearest
        # over every measured cell cost more than the plan's search itself)
        self._nearest_pass: dict[tuple[int, int], tuple[int, int]] = {}
        self._nearest_draft: dict[tuple[int, int], tuple[int, int]] = {}
        # the plain run: the batch it is for, its length, the steps of it left
        self._plain_batch: Batch | None = None
        self._plain_sources: dict[int, set[str]] = {}  # row -> its sources the run's plans saw
        self._plain_run = 0
        self._plain_left = 0

    def observe(self, rows: int, width: int, seconds: float) -> None:
        old = self.cost_s.get((rows, width))
        if old is None:
            self._nearest_pass.clear()  # a new cell: the nearest to each other may change
        self.cost_s[(rows, width)] = (
            seconds if old is None else self.decay * old + (1 - self.decay) * seconds
        )

    def pass_s(self, rows: int, width: int) -> float | None:
        if (rows, width) in self.cost_s:
            return self.cost_s[(rows, width)]
        if not self.cost_s:
            return None

        def prior(r: int, w: int) -> float:
            return 1.0 + self.PER_TOKEN * (r * w - 1)

        # scaled from a pass of the same kind where one was measured: the decoder runs one
        # token per row (or one row) on the target's gqa graph and several tokens over several
        # rows on the batched graph, whose passes cost more from the first extra token on than
        # the one-token passes' costs would predict
        near = self._nearest_pass.get((rows, width))
        if near is None:
            kind = on_batched_graph(rows, width)
            same = [c for c in self.cost_s if on_batched_graph(*c) == kind]
            near = self._nearest_pass[(rows, width)] = min(
                same or self.cost_s, key=lambda c: (abs(c[0] - rows), abs(c[1] - width))
            )
        return self.cost_s[near] * prior(rows, width) / prior(*near)

    def observe_draft(self, rows: int, k: int, seconds: float) -> None:
        """A shared drafting run: `rows` rows drafted up to `k` tokens in lockstep."""
        old = self.draft_cost_s.get((rows, k))
        if old is None:
            self._nearest_draft.clear()
        self.draft_cost_s[(rows, k)] = (
            seconds if old is None else self.decay * old + (1 - self.decay) * seconds
        )

    def shared_draft_s(self, rows: int, k: int, one_token_s: float) -> float:
        """What `rows` rows drafting up to `k` tokens in shared passes cost: measured, else
        scaled from the nearest measurement (k passes), else k passes guessed at DRAFT_PRIOR
        of a target pass over as many rows."""
        if k <= 0:
            return 0.0
        if (rows, k) in self.draft_cost_s:
            return self.draft_cost_s[(rows, k)]
        if self.draft_cost_s:
            near = self._nearest_draft.get((rows, k))
            if near is None:
                near = self._nearest_draft[(rows, k)] = min(
                    self.draft_cost_s, key=lambda c: (abs(c[0] - rows), abs(c[1] - k))
                )
            (r, kk), t = near, self.draft_cost_s[near]
            # more rows: each pass grows as a target pass over as many rows does
            scale = 1.0
            if r != rows and (wide := self.pass_s(rows, 1)) and (narrow := self.pass_s(r, 1)):
                scale = wide / narrow
            return t * k / kk * scale
        target = self.pass_s(rows, 1)
        return k * self.DRAFT_PRIOR * (target if target is not None else one_token_s)

    def observe_catchup(self, tokens: int, seconds: float) -> None:
        """Shared draft rows read `tokens` committed tokens they lacked, alone, in `seconds`
        (a prompt, or the steps a row did not draft): taken as the cost of a token read among
        many only from long reads, where a pass's fixed cost is spread thin."""
        if tokens >= self.CATCHUP_MEASURED:
            per_token = seconds / tokens
            old = self.catchup_token_s
            self.catchup_token_s = (
                per_token if old is None else self.decay * old + (1 - self.decay) * per_token
            )

    def catchup_s(
        self, s: Sequence, one_token_s: float, tokens_per_step: float, rows: int
    ) -> float:
        """What drafting costs a row first, beyond its usual passes: the committed tokens its
        draft row lacks beyond the one or two a step feeds (its prompt, if it never drafted
        with the model; the steps since it last did). Spread over the steps it is expected to
        go on drafting once caught up (`drafting_run` at `rows` rows), at most the steps it has
        left (its remaining tokens at `tokens_per_step`): where rows seldom draft, the next
        step falls behind again, and the step that drafts pays the whole catch-up (a row's whole
        context read for one drafting step can cost several target passes)."""
        return self.catchups_s(s, one_token_s, [tokens_per_step], rows)[0]

    def catchups_s(
        self, s: Sequence, one_token_s: float, tokens_per_step: list[float], rows: int
    ) -> list[float]:
        """`catchup_s` at each of several tokens per step (a row's expected tokens at each K),
        what they share looked up once."""
        extra = self.catchup_tokens(s)
        if extra <= 0:
            return [0.0] * len(tokens_per_step)
        per_token = self.catchup_token_s
        whole = extra * (self.CATCHUP_PRIOR * one_token_s if per_token is None else per_token)
        run, left = self.drafting_run(rows), s.tokens_left
        return [whole / max(1.0, min(left / max(1.0, t), run)) for t in tokens_per_step]

    @staticmethod
    def catchup_tokens(s: Sequence) -> int:
        """Committed tokens a row drafting with a shared draft model this step would read
        first, beyond the one or two a step feeds (0: none)."""
        if not s.shares_draft or s.draft_rows is None:
            return 0
        return max(0, s.n_context - s.draft_rows.length(s.row) - 1 - s.draft_rows.CATCHUP_SHARED)

    def drafting_run(self, rows: int) -> float:
        """Steps a draft row is expected to draft in a row at `rows` rows: 1 / (1 - p), p the
        recent share of the rows that could draft with a shared draft model that did (inf
        while nothing but the prior is known, and for a row alone: once caught up, its
        policy's own K goes on)."""
        if rows <= 1:
            return float("inf")
        steps, drafted = self.model_drafting.get(rows, (0.0, 0.0))
        p = (drafted + self.DRAFTING_PRIOR) / (steps + self.DRAFTING_PRIOR)
        return float("inf") if p >= 1.0 else 1.0 / (1.0 - p)

    def observe_drafting(self, rows: int, model_ks: list[int]) -> None:
        """A step's K for the -k auto rows that could draft with a shared draft model."""
        if model_ks:
            sums = self.model_drafting.setdefault(rows, [0.0, 0.0])
            d = self.DRAFTING_DECAY
            sums[0] = d * sums[0] + 1.0
            sums[1] = d * sums[1] + sum(k > 0 for k in model_ks) / len(model_ks)

    def observe_step(self, expected: Expected, tokens: float, seconds: float) -> None:
        """What a step gave that `plan` expected `expected` of: `tokens` committed in `seconds`
        of wall time."""
        rows, drafted, expected_tokens, expected_s = expected
        d = self.OUTCOME_DECAY
        sums = self.outcomes.setdefault((rows, drafted), [0.0] * 5)
        for i, x in enumerate((1.0, expected_tokens, expected_s, float(tokens), seconds)):
            sums[i] = d * sums[i] + x

    def realized_share(self, rows: int, drafted: bool) -> float:
        """Realized over expected tokens per second of such steps so far, shrunk toward 1 by
        OUTCOME_PRIOR steps' worth of the estimates."""
        sums = self.outcomes.get((rows, drafted))
        if sums is None or sums[0] <= 0:
            return 1.0
        n, expected_tokens, expected_s, tokens, seconds = sums
        w = self.OUTCOME_PRIOR / n  # the prior, in the sums' units
        return ((tokens + w * expected_tokens) / (seconds + w * expected_s)) / (
            expected_tokens / expected_s
        )

    def _in_plain_run(self, batch: Batch, sources: dict[int, str]) -> bool:
        """Whether this step is one of the plain run (PLAIN_MOST) that the last plans at `batch`
        earned: the same batch, and every -k auto row drafting from a source the run's plans
        weighed for it (a lookup that matched where they weighed the model: the plan's inputs
        changed, so it plans again). A batch other than the run's ends the run."""
        if batch != self._plain_batch:
            self._plain_batch, self._plain_run, self._plain_left = batch, 0, 0
            self._plain_sources = {}
            return False
        if self._plain_left <= 0 or any(
            source not in self._plain_sources.get(row, ()) for row, source in sources.items()
        ):
            return False
        self._plain_left -= 1
        return True

    def _planned(self, batch: Batch, sources: dict[int, str], drafts: bool) -> None:
        """A plan at `batch` was made, the -k auto rows' sources `sources`: a plain one
        lengthens the plain run that follows it (1, 2, 4 .. PLAIN_MOST steps), one that drafts
        ends it."""
        if batch != self._plain_batch or drafts:
            self._plain_batch, self._plain_run, self._plain_sources = batch, 0, {}
        if drafts:
            self._plain_left = 0
            return
        self._plain_run = min(self.PLAIN_MOST, max(1, 2 * self._plain_run))
        self._plain_left = self._plain_run
        for row, source in sources.items():
            self._plain_sources.setdefault(row, set()).add(source)

    def plan(
        self,
        active: list[Sequence],
        rows: int,
        joining: int = 0,
        last_to_finish: int | None = None,
    ) -> Expected | None:
        """Set the K of this step's -k auto rows; returns what the plan expects of the step
        (None: nothing was planned), for `observe_step`. `joining`: rows still reading their
        prompts, which decode in the next steps: a catch-up is spread over the steps the rows
        are expected to draft as many rows. `last_to_finish`: where the batch's caller waits
        for every row (and no request waits for a row), the most tokens any row of the batch
        still has to make; then only the drafts of the rows that have that many left count
        (`row_weight`). A step of a plain run (`_in_plain_run`) is not planned: its -k auto rows
        draft nothing, and it returns None."""
        if not self.plans(active, joining):
            return None
        adaptive = [s for s in active if isinstance(s.policy, AdaptiveK) and s.source != NONE]
        for s in active:
            if isinstance(s.policy, AdaptiveK) and s.source == NONE:
                s.k = 0  # nothing to draft from
        regime = rows + joining  # the rows the catch-ups are spread over the drafting of
        batch, sources = (len(active), rows, joining), {s.row: s.source for s in adaptive}
        if self._in_plain_run(batch, sources):
            for s in adaptive:
                s.k = 0
            self.observe_drafting(regime, [0 for s in adaptive if s.shares_draft])
            return None
        widest = 1 + max(s.k_limit for s in adaptive)
        plans = self._plans(active, adaptive, rows, regime, last_to_finish)
        best_ks = plans.search(widest)
        for s, k in zip(adaptive, best_ks, strict=True):
            s.k = k
        self._planned(batch, sources, any(best_ks))
        self.observe_drafting(
            regime, [k for s, k in zip(adaptive, best_ks, strict=True) if s.shares_draft]
        )
        return (rows, *plans.outcome(best_ks))

    def _plans(
        self,
        active: list[Sequence],
        adaptive: list[Sequence],
        rows: int,
        regime: int,
        last_to_finish: int | None,
    ) -> Plans:
        """What the plans of this step are made of: each -k auto row's expected tokens by K
        (weighted by `row_weight`) and own drafting cost, the fixed rows, and the costs of the
        passes and shared drafts, looked up once per step (the search weighs dozens of plans)."""
        one_token_s = self.pass_s(1, 1)
        assert one_token_s is not None  # (plans)
        fixed = [s for s in active if not isinstance(s.policy, AdaptiveK)]
        fixed_width = 1 + max((s.k for s in fixed), default=0)
        fixed_shared = [s for s in fixed if s.shares_draft and s.k > 0]
        widest = 1 + max(s.k_limit for s in adaptive)
        options = [self._options(s, widest, one_token_s, regime) for s in adaptive]

        pass_by_width = [0.0]
        for w in range(1, max(widest, fixed_width) + 1):
            t = self.pass_s(rows, w)
            assert t is not None  # one pass was measured (one_token_s)
            pass_by_width.append(t)
        shared_s: dict[tuple[int, int], float] = {}

        def shared_draft_s(n: int, k: int) -> float:
            if (n, k) not in shared_s:
                shared_s[(n, k)] = self.shared_draft_s(n, k, one_token_s)
            return shared_s[(n, k)]

        self.weights = {s.row: self.row_weight(s, last_to_finish) for s in adaptive}
        return Plans(
            expected=[
                [e[0] + self.weights[s.row] * (x - e[0]) for x in e]
                for s, (e, _) in zip(adaptive, options, strict=True)
            ],
            own_s=[o[1] for o in options],
            shares=[s.shares_draft for s in adaptive],
            limits=[s.k_limit for s in adaptive],
            base_tokens=float(len(active) - len(adaptive)),  # rows that yield at least one
            fixed_width=fixed_width,
            fixed_shared_rows=len(fixed_shared),
            fixed_shared_k=max((s.k for s in fixed_shared), default=0),
            pass_by_width=pass_by_width,
            shared_draft_s=shared_draft_s,
            share={drafted: self.realized_share(rows, drafted) for drafted in (False, True)},
        )

    def plans(self, active: list[Sequence], joining: int = 0) -> bool:
        """Whether `plan` sets the K of this step's -k auto rows (the rows' sources are known):
        then their policies need not choose one (AdaptiveK.decide with choose=False). Not
        before a pass was measured (there is no batch to weigh yet), nor without a -k auto row
        that has something to draft; nor for a row alone in the pass (a batch of one, or the
        last of a batch): its policy's own K stands, chosen as alone (with its probes and the
        draft's confidence) from the costs of the one-row passes it has seen. A row alone is
        still planned while others read their prompts (it is not alone for long), and where it
        shared passes and its draft row lacks more than a step feeds: the last row of a batch
        that did not draft would read its whole context into the draft model for its last few
        tokens, which that read must pay for. A row that never shared a pass decodes as alone,
        catch-ups and all (planning it whenever its hybrid's lookups had left its draft row
        behind charged it for catch-ups that a row alone does not weigh)."""
        if self.pass_s(1, 1) is None:
            return False
        if not any(isinstance(s.policy, AdaptiveK) and s.source != NONE for s in active):
            return False
        alone = active[0]
        return (
            len(active) > 1 or joining > 0 or bool(alone.shared_pass and self.catchup_tokens(alone))
        )

    @staticmethod
    def row_weight(s: Sequence, last_to_finish: int | None) -> float:
        """What a row's tokens beyond its one a step are worth to the batch. Where each request
        waits for its own tokens (a server), or a request waits for a row to free, 1: a row
        done sooner is a request answered sooner, or a row taken sooner (a step's tokens per
        second is then what counts; it also minimizes the requests' mean latency, since a
        wider pass delays every row and a draft speeds up its own). Where the caller waits for
        the whole batch (`Pipeline.generate_batch`'s last rows) the batch is done when its last
        row is: a row with fewer tokens left than another gains nothing from drafting (the
        steps go on for the other), 0; the rows with the most left, 1."""
        if last_to_finish is None:
            return 1.0
        return 1.0 if s.tokens_left >= last_to_finish else 0.0

    def weighted_tokens(self, made: dict[int, int]) -> float:
        """A step's tokens (row -> tokens it committed) as the last plan weighed them: each
        row's first token in full, the rest by its `row_weight` (rows the plan did not weigh:
        1), so that `observe_step` compares like with like."""
        return sum(
            min(n, 1) + self.weights.get(row, 1.0) * max(0, n - 1) for row, n in made.items()
        )

    def _options(
        self, s: Sequence, widest: int, one_token_s: float, rows: int
    ) -> tuple[list[float], list[float]]:
        """A -k auto row's expected tokens and its own drafting seconds at K = 0 .. widest - 1
        (own: what it does not share with other rows; a catch-up is its own)."""
        policy = s.policy
        assert isinstance(policy, AdaptiveK)
        limit = min(s.k_limit, widest - 1)
        expected = policy.expected_tokens(s.source)[: limit + 1] if limit else [1.0]
        if s.shares_draft:
            own = [0.0, *self.catchups_s(s, one_token_s, expected[1 : limit + 1], rows)]
        else:
            measured = [policy.draft_cost_s(k, s.source) for k in range(limit + 1)]
            guess = self.DRAFT_PRIOR * one_token_s if s.source == MODEL else 0.0
            own = [k * guess if c is None else c for k, c in enumerate(measured)]
        return expected, own
