"""-k auto in a batch: one cap on K for the rows whose K is chosen by the policy, chosen for the
batch as a whole from the measured costs of batched verify passes and of drafting
(docs/bench/batching.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specx.runtime.adaptive import AdaptiveK
from specx.runtime.drafters.base import MODEL, NONE

if TYPE_CHECKING:
    from specx.runtime.batching import BatchSequence


def on_batched_graph(rows: int, width: int) -> bool:
    """Whether a pass over `rows` rows `width` tokens wide needs the batched graph (several
    tokens in each of several rows), where the target's gqa graph, if it has one, takes the
    others (one token per row, or one row): the decoder routes its passes by this."""
    return rows > 1 and width > 1


# what a plan expects of its step: (rows, whether any row drafts, tokens, seconds)
Expected = tuple[int, bool, float, float]


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
    whole batch, a row's drafts only while no row has more tokens left to make.
    """

    PER_TOKEN = 0.04
    # a catch-up token read by a draft model, as a share of a one-row one-token target pass,
    # until measured (int8 SmolLM2 on 2 cores: about 1 ms against a 30 ms target pass)
    CATCHUP_PRIOR = 0.05
    CATCHUP_MEASURED = 16  # tokens a catch-up must read to measure the cost of one
    # a draft model's pass, as a share of a one-row one-token target pass, until measured
    # (the int8/int4 drafts of SmolLM2 measured 0.36-0.58: docs/bench/measurements.md)
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
        # rows on the batched graph, whose passes cost more from the first extra token on
        # (8 rows, 2 wide: 1.35x one wide where 1.25x was expected from one-token passes)
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
        self, s: BatchSequence, one_token_s: float, tokens_per_step: float, rows: int
    ) -> float:
        """What drafting costs a row first, beyond its usual passes: the committed tokens its
        draft row lacks beyond the one or two a step feeds (its prompt, if it never drafted
        with the model; the steps since it last did). Spread over the steps it is expected to
        go on drafting once caught up (`drafting_run` at `rows` rows), at most the steps it has
        left (its remaining tokens at `tokens_per_step`): where rows seldom draft, the next
        step falls behind again, and the step that drafts pays the whole catch-up (the read
        of a row's context for one drafting step at the end of a 2-request batch took up to 0.29
        s on SmolLM2's int8 draft: scripts/catchup_trace.py)."""
        return self.catchups_s(s, one_token_s, [tokens_per_step], rows)[0]

    def catchups_s(
        self, s: BatchSequence, one_token_s: float, tokens_per_step: list[float], rows: int
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
    def catchup_tokens(s: BatchSequence) -> int:
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

    def plan(
        self,
        active: list[BatchSequence],
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
        (`row_weight`)."""
        if not self.plans(active, joining):
            return None
        adaptive = [s for s in active if isinstance(s.policy, AdaptiveK) and s.source != NONE]
        for s in active:
            if isinstance(s.policy, AdaptiveK) and s.source == NONE:
                s.k = 0  # nothing to draft from
        one_token_s = self.pass_s(1, 1)
        assert one_token_s is not None  # (plans)
        fixed = [s for s in active if not isinstance(s.policy, AdaptiveK)]
        fixed_width = 1 + max((s.k for s in fixed), default=0)
        fixed_shared = [s for s in fixed if s.shares_draft and s.k > 0]
        widest = 1 + max(s.k_limit for s in adaptive)
        regime = rows + joining  # the rows the catch-ups are spread over the drafting of
        options = [self._options(s, widest, one_token_s, regime) for s in adaptive]

        # the costs a plan is made of, looked up once per step (the search weighs dozens of
        # plans)
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
        plans = Plans(
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
        best_ks = plans.search(widest)
        for s, k in zip(adaptive, best_ks, strict=True):
            s.k = k
        self.observe_drafting(
            regime, [k for s, k in zip(adaptive, best_ks, strict=True) if s.shares_draft]
        )
        return (rows, *plans.outcome(best_ks))

    def plans(self, active: list[BatchSequence], joining: int = 0) -> bool:
        """Whether `plan` sets the K of this step's -k auto rows (the rows' sources are known):
        then their policies need not choose one (AdaptiveK.decide with choose=False). Not
        before a pass was measured (there is no batch to weigh yet), nor without a -k auto row
        that has something to draft; nor for a row alone in the pass (a batch of one, or the
        last of a batch): its policy's own K stands, chosen as alone (with its probes and the
        draft's confidence) from the costs of the one-row passes it has seen. A row alone is
        still planned while others read their prompts (it is not alone for long), and where it
        shared passes and its draft row lacks more than a step feeds: the last row of a batch
        that did not draft would read its whole context into the draft model (about 100
        tokens, 0.15-0.3 s on SmolLM2's int8 draft at 64 new tokens) for its last few tokens,
        which that read must pay for. A row that never shared a pass decodes as alone,
        catch-ups and all (it was planned whenever its hybrid's lookups had left its draft row
        behind: 67 of 311 steps in a diagnostic, batching.md)."""
        if self.pass_s(1, 1) is None:
            return False
        if not any(isinstance(s.policy, AdaptiveK) and s.source != NONE for s in active):
            return False
        alone = active[0]
        return (
            len(active) > 1 or joining > 0 or bool(alone.shared_pass and self.catchup_tokens(alone))
        )

    @staticmethod
    def row_weight(s: BatchSequence, last_to_finish: int | None) -> float:
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
        self, s: BatchSequence, widest: int, one_token_s: float, rows: int
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


@dataclass(frozen=True)
class Plans:
    """What the plans of one step are weighed by: per -k auto row i, its expected tokens and
    own drafting seconds at each K (expected[i][k], own_s[i][k]), whether it drafts in the
    shared draft passes and the most it may draft; what the other rows add; the pass at each
    width; shared drafting by (rows, K); and the realized share of plain and drafting steps."""

    expected: list[list[float]]
    own_s: list[list[float]]
    shares: list[bool]
    limits: list[int]
    base_tokens: float  # tokens of the rows with a fixed K (at least one each)
    fixed_width: int  # the pass's width without any -k auto row drafting
    fixed_shared_rows: int  # fixed-K rows drafting in the shared passes
    fixed_shared_k: int  # the most they draft
    pass_by_width: list[float]
    shared_draft_s: Callable[[int, int], float]
    share: dict[bool, float]

    def outcome(self, ks: list[int]) -> tuple[bool, float, float]:
        """(whether any row drafts, expected tokens, expected seconds) of the plan in which row
        i drafts up to ks[i]."""
        tokens, draft_s = self.base_tokens, 0.0
        shared_k, shared_rows, width = self.fixed_shared_k, self.fixed_shared_rows, self.fixed_width
        for i, k in enumerate(ks):
            tokens += self.expected[i][k]
            draft_s += self.own_s[i][k]
            if k:
                width = max(width, k + 1)
                if self.shares[i]:
                    shared_k, shared_rows = max(shared_k, k), shared_rows + 1
        draft_s += self.shared_draft_s(shared_rows, shared_k) if shared_rows else 0.0
        return width > 1, tokens, draft_s + self.pass_by_width[width]

    def rate(self, ks: list[int]) -> float:
        """Expected tokens per second of a plan, corrected by what such steps gave."""
        drafted, tokens, seconds = self.outcome(ks)
        return tokens / seconds * self.share[drafted]

    def search(self, widest: int) -> list[int]:
        """The plan with the most expected tokens per second found thus: for each width w (1 ..
        widest), every row drafts up to w - 1 but for those whose drafting costs the batch
        more than it brings, dropped one at a time, the worst first. A plan without one row's
        drafting is weighed from the current plan's sums (O(1) a row, not a pass over all
        rows: a step at 8 rows weighs about a hundred such plans)."""
        best_ks, best_rate = [0] * len(self.expected), -1.0
        # (one row's plans cost less to weigh than to bound)
        bound = self._bounds(widest) if len(self.expected) > 1 else None
        for w in range(1, widest + 1):
            if w > 1 and bound is not None and bound(w) <= best_rate:
                continue  # no plan drafting up to w - 1 can beat the best so far
            ks = [min(limit, w - 1) for limit in self.limits]
            current = self.rate(ks)
            while True:
                worst, gain = -1, current
                sums = self._sums(ks)
                for i, k in enumerate(ks):
                    if k and (without := self._rate_without(ks, sums, i)) > gain:
                        worst, gain = i, without
                if worst < 0:
                    break
                ks[worst] = 0
                current = self.rate(ks)
            if current > best_rate:
                best_ks, best_rate = ks, current
        return best_ks

    def _bounds(self, widest: int) -> Callable[[int], float]:
        """An upper bound on the rate of every plan the search weighs at width w in which some
        row drafts (row i drafts min(limit_i, w - 1) tokens or none; the plan in which none
        drafts is weighed at w = 1). Such a plan's pass has a width c from the least a drafting
        plan needs up to max(w, fixed_width), and a row drafting in a pass of width c drafts at
        most c - 1 tokens (its expected tokens grow with K), so the plan's tokens are at most
        `base` plus each row's gain at min(limit, c - 1), over the pass at c plus, where m rows
        draft in the shared passes (the m largest gains at most), the cheapest shared drafting
        of m rows (and the fixed rows sharing) at any K up to c - 1; drafting of a row's own
        costs at least nothing. The bound at w is the largest over those c, computed once for
        every w. Where drafting does not pay (a full batch), the search skips every width but
        the first. (A bound that paired every row's largest gain with the cheapest pass and
        the cheapest shared drafting of one row skipped few: at 4 rows of SmolLM2's chat
        prompts it let through a median 7 of 9 widths: scripts/plan_costs.py.)"""
        base = self.base_tokens + sum(e[0] for e in self.expected)
        fixed_rows, least_k = self.fixed_shared_rows, max(1, self.fixed_shared_k)
        n_shared = sum(self.shares)
        low, top = max(2, self.fixed_width), max(widest, self.fixed_width)
        # shared_cost[m]: the cheapest shared drafting of m -k auto rows (and the fixed ones)
        # at any K from least_k up to the width's c - 1
        shared_cost = [0.0] + [float("inf")] * n_shared
        next_k = least_k
        by_width = [0.0] * (top + 1)  # the bound at each w
        best = 0.0
        for c in range(low, top + 1):
            for k in range(next_k, c):
                for m in range(1, n_shared + 1):
                    shared_cost[m] = min(shared_cost[m], self.shared_draft_s(fixed_rows + m, k))
            next_k = max(next_k, c)
            own, shared = base, []
            for e, limit, shares in zip(self.expected, self.limits, self.shares, strict=True):
                k = min(limit, c - 1)
                gain = max(0.0, e[k] - e[0])
                if shares and k:
                    shared.append(gain)
                else:
                    own += gain
            seconds = self.pass_by_width[c]
            best = max(best, own / seconds)
            tokens = own
            for m, gain in enumerate(sorted(shared, reverse=True), start=1):
                tokens += gain
                best = max(best, tokens / (seconds + shared_cost[m]))
            by_width[c] = best * self.share[True]

        def bound(w: int) -> float:
            return by_width[max(w, self.fixed_width)]

        return bound

    def _sums(self, ks: list[int]) -> tuple[float, float, list[int], list[int]]:
        """A plan's expected tokens, own drafting seconds, and the K of its drafting rows and of
        its rows drafting in shared passes (each largest first)."""
        tokens = self.base_tokens + sum(e[k] for e, k in zip(self.expected, ks, strict=True))
        own = sum(o[k] for o, k in zip(self.own_s, ks, strict=True))
        drafting = sorted((k for k in ks if k), reverse=True)
        shared = sorted(
            (k for k, sh in zip(ks, self.shares, strict=True) if k and sh), reverse=True
        )
        return tokens, own, drafting, shared

    def _rate_without(
        self, ks: list[int], sums: tuple[float, float, list[int], list[int]], i: int
    ) -> float:
        """`rate` of plan ks with row i (which drafts) not drafting."""
        tokens, own, drafting, shared = sums
        k = ks[i]
        tokens += self.expected[i][0] - self.expected[i][k]
        own += self.own_s[i][0] - self.own_s[i][k]
        width = max(self.fixed_width, _largest_but_one(drafting, k) + 1)
        shared_rows = self.fixed_shared_rows + len(shared)
        shared_k = max(self.fixed_shared_k, shared[0] if shared else 0)
        if self.shares[i]:
            shared_rows -= 1
            shared_k = max(self.fixed_shared_k, _largest_but_one(shared, k))
        draft_s = own + (self.shared_draft_s(shared_rows, shared_k) if shared_rows else 0.0)
        seconds = draft_s + self.pass_by_width[width]
        return tokens / seconds * self.share[width > 1]


def _largest_but_one(values: list[int], k: int) -> int:
    """The largest of `values` (largest first, k among them) once one k is taken out (0 if
    none is left)."""
    if values[0] != k:
        return values[0]
    return values[1] if len(values) > 1 else 0
