"""-k auto in a batch (runtime/batch/widths.py): one cap on K for the adaptive rows, chosen from
measured pass and drafting costs; drafting that rows share is counted once."""

from __future__ import annotations

import numpy as np
import pytest

from specx.runtime.batch.plans import Plans
from specx.runtime.batch.widths import WidthPlanner
from specx.runtime.decode.adaptive import AdaptiveK
from specx.runtime.decode.sequence import Sequence
from specx.runtime.decode.stats import Stats
from specx.runtime.drafters.base import LOOKUP, MODEL
from specx.runtime.settings import GenerationSettings


class KnownPolicy(AdaptiveK):
    """An adaptive policy whose estimates are given: acceptance per position, drafting seconds
    per token."""

    def __init__(self, accept: float, draft_s_per_token: float, max_k: int = 4) -> None:
        super().__init__(max_k=max_k)
        self.accept = accept
        self.per_token = draft_s_per_token

    def expected_tokens(self, source: str = MODEL) -> list[float]:
        return [sum(self.accept**j for j in range(k + 1)) for k in range(self.max_k + 1)]

    def draft_cost_s(self, k: int, source: str = MODEL) -> float | None:
        return k * self.per_token


def row(row: int, policy: AdaptiveK, source: str = MODEL, shares: bool = False) -> Sequence:
    seq = Sequence(np.zeros(1, dtype=np.int64), GenerationSettings(), policy, None, Stats(), 8)
    seq.start(7)
    seq.row, seq.source, seq.k_limit, seq.shares_draft = row, source, 4, shares
    return seq


def planner(one_token_s: float, per_extra_position: float, rows: int) -> WidthPlanner:
    """Pass costs measured for `rows` rows at widths 1..5: each position per row beyond the
    first costs `per_extra_position` of the one-token pass."""
    widths = WidthPlanner()
    widths.observe(1, 1, one_token_s)
    for w in range(1, 6):
        widths.observe(rows, w, one_token_s * (1 + per_extra_position * (w - 1)))
    return widths


def test_a_pass_that_widens_for_free_lets_rows_draft_and_a_costly_one_does_not() -> None:
    free = planner(0.040, 0.02, rows=4)
    rows = [row(r, KnownPolicy(0.8, 0.0), LOOKUP) for r in range(4)]
    free.plan(rows, 4)
    assert [s.k for s in rows] == [4, 4, 4, 4]
    # each extra position per row costs 60% of the pass: one more token at 0.8 still pays
    # (4 x 1.8 tokens / 1.6 passes > 4 / 1), two do not (4 x 2.44 / 2.2 < 4 x 1.8 / 1.6)
    costly = planner(0.040, 0.6, rows=4)
    costly.plan(rows, 4)
    assert [s.k for s in rows] == [1, 1, 1, 1]
    # compute-bound: every position costs a full pass
    bound = planner(0.040, 1.0, rows=4)
    bound.plan(rows, 4)
    assert [s.k for s in rows] == [0, 0, 0, 0]


def test_drafting_the_rows_share_is_counted_once() -> None:
    """Four model rows, 10 ms a drafted token each alone; a shared run costs 12 ms a token for
    all four. Alone their drafting outweighs what it brings; shared, it pays."""
    rows = [row(r, KnownPolicy(0.85, 0.010)) for r in range(4)]
    alone = planner(0.040, 0.1, rows=4)
    alone.plan(rows, 4)
    assert max(s.k for s in rows) <= 1
    shared_rows = [row(r, KnownPolicy(0.85, 0.010), shares=True) for r in range(4)]
    shared = planner(0.040, 0.1, rows=4)
    for k in range(1, 5):
        shared.observe_draft(4, k, 0.012 * k)
    shared.plan(shared_rows, 4)
    assert min(s.k for s in shared_rows) >= 2


def test_a_shared_drafting_cost_not_measured_yet_is_scaled_or_guessed() -> None:
    widths = planner(0.040, 0.1, rows=4)
    # nothing measured: K passes at DRAFT_PRIOR of a target pass over as many rows
    assert np.isclose(widths.shared_draft_s(4, 2, 0.040), 2 * WidthPlanner.DRAFT_PRIOR * 0.040)
    widths.observe_draft(4, 2, 0.030)
    assert widths.shared_draft_s(4, 2, 0.040) == 0.030
    assert np.isclose(widths.shared_draft_s(4, 3, 0.040), 0.045)  # scaled by K
    assert widths.shared_draft_s(4, 0, 0.040) == 0.0


def test_a_row_alone_in_its_pass_keeps_its_policys_own_k_as_alone() -> None:
    """One row: nothing to weigh against, its policy chose K as alone (with its probes and the
    draft's confidence); the same row beside another is planned for the batch."""
    widths = planner(0.040, 1.0, rows=1)
    widths.observe(2, 1, 0.042)
    alone = row(0, KnownPolicy(0.3, 0.020))
    alone.k = 3  # what its policy decided
    assert not widths.plans([alone])  # (the decoder asks first: its policy then chooses K)
    assert widths.plan([alone], 1) is None
    assert alone.k == 3
    other = row(1, KnownPolicy(0.3, 0.020))
    other.k = 3
    assert widths.plans([alone, other]) and widths.plans([alone], joining=1)
    assert widths.plan([alone, other], 2) is not None
    assert (alone.k, other.k) == (0, 0)  # every position a full pass: drafting does not pay


def test_rows_with_a_fixed_k_keep_it_and_set_the_least_width() -> None:
    from specx.runtime.decode.policy import FixedK

    widths = planner(0.040, 0.6, rows=2)
    fixed = row(0, FixedK(3))
    fixed.k = 3
    adaptive = row(1, KnownPolicy(0.5, 0.0), LOOKUP)
    widths.plan([fixed, adaptive], 2)
    assert fixed.k == 3
    # the pass is 4 wide anyway: the adaptive row may use the width for free
    assert adaptive.k == 3


def test_a_row_whose_drafting_costs_the_batch_more_than_it_brings_is_left_out() -> None:
    """Three rows draft for free from a lookup that agrees; a fourth drafts alone with a model
    at 30 ms a token: the three draft, the fourth does not hold them up."""
    widths = planner(0.040, 0.05, rows=4)
    rows = [row(r, KnownPolicy(0.9, 0.0), LOOKUP) for r in range(3)]
    rows.append(row(3, KnownPolicy(0.5, 0.030), MODEL))
    widths.plan(rows, 4)
    assert [s.k for s in rows] == [4, 4, 4, 0]


class LaggingDraft:
    """A shared draft row `lag` committed tokens behind (what the planner reads of DraftRows)."""

    CATCHUP_SHARED = 1

    def __init__(self, length: int) -> None:
        self._length = length

    def length(self, row: int) -> int:
        return self._length


def test_a_draft_row_far_behind_is_charged_its_catch_up_spread_over_the_steps_left() -> None:
    widths = planner(0.040, 0.05, rows=1)
    widths.observe_catchup(40, 0.080)  # 2 ms a token read among many
    widths.observe_catchup(3, 0.030)  # a short read is mostly a pass's fixed cost: not taken
    assert widths.catchup_token_s == 0.002
    s = row(0, KnownPolicy(0.8, 0.0), MODEL, shares=True)
    s.context = np.zeros(256, dtype=np.int64)
    s.n_context, s.settings = 200, GenerationSettings(max_new_tokens=100)
    s.draft_rows = LaggingDraft(100)  # type: ignore[assignment]
    # 100 tokens behind: 98 beyond what a step feeds, 196 ms, over 100 tokens left at 2 a step
    # (nothing seen yet of how rows draft at 2 rows: a caught-up row is expected to go on)
    assert widths.drafting_run(2) == float("inf")
    assert np.isclose(widths.catchup_s(s, 0.040, 2.0, 2), 0.196 / 50)
    s.stats.new_tokens = 99  # one token left: the whole catch-up for one step
    assert np.isclose(widths.catchup_s(s, 0.040, 2.0, 2), 0.196)
    s.draft_rows = LaggingDraft(198)  # one token behind, as every step: nothing extra
    assert widths.catchup_s(s, 0.040, 2.0, 2) == 0.0
    s.draft_rows = LaggingDraft(0)  # its first proposal reads the prompt: a catch-up too
    assert np.isclose(widths.catchup_s(s, 0.040, 2.0, 2), 0.002 * 198)


def test_a_catch_up_is_spread_only_over_the_steps_rows_are_expected_to_go_on_drafting() -> None:
    """Where rows that could draft with the draft model seldom did lately, a row that drafts
    now falls behind again at once: its step pays the whole catch-up (a prompt read, here), and
    the planner keeps the rows decoding plainly; where they kept drafting, the read is spread
    over the steps left, and they draft."""
    for drafting_lately in (True, False):
        widths = planner(0.040, 0.05, rows=2)
        widths.observe_catchup(40, 0.080)  # 2 ms a token read among many
        for k in range(1, 5):
            widths.observe_draft(2, k, 0.004 * k)  # the two rows' shared draft passes
        for _ in range(30):
            widths.observe_drafting(2, [2, 2] if drafting_lately else [0, 0])
        rows = [row(r, KnownPolicy(0.9, 0.004), MODEL, shares=True) for r in range(2)]
        for s in rows:
            s.context = np.zeros(256, dtype=np.int64)
            s.n_context, s.settings = 100, GenerationSettings(max_new_tokens=64)
            s.draft_rows = LaggingDraft(0)  # type: ignore[assignment]
        widths.plan(rows, 2)
        if drafting_lately:
            assert widths.drafting_run(2) > 100 and all(s.k > 0 for s in rows)
        else:
            assert widths.drafting_run(2) < 1.2 and [s.k for s in rows] == [0, 0]
            # and the plan itself counts: another step at 2 rows in which they did not draft
            assert widths.model_drafting[2][0] > 30 * 0.95**30


def test_drafting_whose_steps_give_less_than_expected_stops_being_chosen() -> None:
    """Lookups expected to pay a little (4 x 1.8 tokens for 1.3 passes against 4 for 1): when
    such steps keep giving one token a row, the planner learns it and decodes plainly; steps that
    give what was expected keep it drafting."""
    for gives_expected in (True, False):
        widths = planner(0.040, 0.3, rows=4)
        rows = [row(r, KnownPolicy(0.8, 0.0), LOOKUP) for r in range(4)]
        drafted = []
        for _ in range(60):
            expected = widths.plan(rows, 4)
            if expected is None:  # a step of a plain run that plain plans earned
                assert [s.k for s in rows] == [0, 0, 0, 0] and not gives_expected
                drafted.append(False)
                continue
            _, drafts, tokens, seconds = expected
            drafted.append(drafts)
            given = round(tokens) if gives_expected or not drafts else 4
            widths.observe_step(expected, given, seconds)
        assert all(drafted) if gives_expected else drafted[0] and not any(drafted[-20:])
        assert widths.realized_share(4, True) < 0.8 or gives_expected


def test_a_pass_not_measured_yet_is_scaled_from_one_of_its_own_kind() -> None:
    """Several tokens over several rows run on the batched graph, one token per row on the gqa
    graph: an unmeasured 8-row 2-wide pass is scaled from the 5-row 2-wide one measured, not
    from the cheaper 8-row one-token pass; with no pass of its kind measured, from the nearest."""
    widths = WidthPlanner()
    widths.observe(8, 1, 0.060)
    prior = WidthPlanner.PER_TOKEN
    from_one_token = 0.060 * (1 + prior * 15) / (1 + prior * 7)
    assert np.isclose(widths.pass_s(8, 2), from_one_token)  # nothing of its kind yet
    widths.observe(5, 2, 0.070)
    widths.observe(4, 2, 0.061)
    assert np.isclose(widths.pass_s(8, 2), 0.070 * (1 + prior * 15) / (1 + prior * 9))
    assert widths.pass_s(8, 2) > from_one_token
    # a one-token pass over 7 rows comes from the 8-row one-token pass, not a 2-wide one
    assert np.isclose(widths.pass_s(7, 1), 0.060 * (1 + prior * 6) / (1 + prior * 7))
    # one row of any width is the gqa graph's too
    widths.observe(1, 1, 0.040)
    assert np.isclose(widths.pass_s(1, 3), 0.040 * (1 + prior * 2))


def test_the_last_row_of_a_batch_does_not_read_its_context_into_the_draft_for_a_few_tokens() -> (
    None
):
    """Alone in its batch, a row's policy chooses its own K, but not the last row of a batch
    while its draft row lacks its context (the batch decoded plainly): 98 tokens to read for the
    6 tokens it has left do not pay, and the planner keeps it decoding; once its draft row holds
    its context, its policy's own K stands again. A row that never shared a pass (a batch of
    one) decodes as alone whatever its draft row lacks."""
    widths = planner(0.040, 0.05, rows=1)
    widths.observe_catchup(40, 0.080)  # 2 ms a token read among many
    s = row(0, KnownPolicy(0.9, 0.004), MODEL, shares=True)
    s.context = np.zeros(256, dtype=np.int64)
    s.n_context, s.settings = 100, GenerationSettings(max_new_tokens=64)
    s.stats.new_tokens = 58
    s.draft_rows = LaggingDraft(0)  # type: ignore[assignment]
    s.k = 3  # what its policy decided
    assert widths.plan([s], 1) is None and s.k == 3  # a batch of one decodes as alone
    s.shared_pass = True  # the last row of a batch whose rows decoded plainly
    assert widths.plan([s], 1) is not None and s.k == 0
    s.draft_rows = LaggingDraft(99)  # type: ignore[assignment]
    assert widths.plan([s], 1) is None


def _random_plans(
    rng: np.random.Generator, most_rows: int, pass_growth: tuple[float, float], shared_per_k: float
) -> tuple[Plans, int]:
    """A random batch's Plans (fixed rows, rows drafting in shared passes or on their own,
    several of the largest K) and its widest width; `pass_growth`: the range of a pass's growth
    per width (below 0: a wider pass may cost less), `shared_per_k`: shared drafting a token."""
    n, widest = int(rng.integers(1, most_rows + 1)), int(rng.integers(2, 6))
    fixed_width = int(rng.integers(1, 4))
    accept = rng.uniform(0.0, 0.95, n)
    plans = Plans(
        expected=[[sum(a**j for j in range(k + 1)) for k in range(widest)] for a in accept],
        own_s=[[k * rng.uniform(0, 0.004) for k in range(widest)] for _ in range(n)],
        shares=[bool(x) for x in rng.integers(0, 2, n)],
        limits=[int(x) for x in rng.integers(0, widest, n)],
        base_tokens=float(rng.integers(0, 3)),
        fixed_width=fixed_width,
        fixed_shared_rows=int(rng.integers(0, 2)),
        fixed_shared_k=fixed_width - 1,
        pass_by_width=[0.0] + [0.04 * (1 + rng.uniform(*pass_growth) * w) for w in range(6)],
        shared_draft_s=lambda r, k: shared_per_k * k * (1 + 0.1 * r),
        share={False: rng.uniform(0.9, 1.0), True: rng.uniform(0.8, 1.0)},
    )
    return plans, widest


def test_the_plan_search_weighs_a_row_dropped_from_sums_as_a_full_recount_would() -> None:
    """Plans.search prices a plan without one row's drafting from the current plan's sums; on
    random batches (fixed rows, rows drafting in shared passes or on their own, several of the
    largest K) it picks the plan the same greedy search picks when it recounts every plan."""

    def recounting_search(plans: Plans, widest: int) -> list[int]:
        best_ks, best_rate = [0] * len(plans.expected), -1.0
        for w in range(1, widest + 1):
            ks = [min(limit, w - 1) for limit in plans.limits]
            current = plans.rate(ks)
            while True:
                worst, gain = -1, current
                for i, k in enumerate(ks):
                    if k:
                        ks[i] = 0
                        if (without := plans.rate(ks)) > gain:
                            worst, gain = i, without
                        ks[i] = k
                if worst < 0:
                    break
                ks[worst], current = 0, gain
            if current > best_rate:
                best_ks, best_rate = ks, current
        return best_ks

    rng = np.random.default_rng(7)
    drafted_plans = 0
    for _ in range(300):
        plans, widest = _random_plans(rng, 8, (0.02, 0.3), 0.01)
        found = plans.search(widest)
        assert found == recounting_search(plans, widest)
        drafted_plans += any(found)
    assert 30 < drafted_plans < 270  # the cases pick drafting plans and plain ones


def test_the_bound_the_plan_search_skips_widths_by_holds_for_every_plan_it_skips() -> None:
    """Plans.search skips a width whose plans cannot beat the best so far: on random batches,
    every plan in which some row drafts (each up to w - 1, any subset of the rows) is priced at
    most the bound for w, and the bound lets the search skip widths in some of them."""
    import itertools

    rng = np.random.default_rng(11)
    skipped = 0
    for _ in range(200):
        plans, widest = _random_plans(rng, 6, (-0.1, 0.6), 0.004)
        n, fixed_width = len(plans.expected), plans.fixed_width
        bound = plans._bounds(widest)
        plain = plans.rate([0] * n)
        for w in range(2, widest + 1):
            most = [min(limit, w - 1) for limit in plans.limits]
            for drafting in itertools.product((False, True), repeat=n):
                ks = [k if d else 0 for k, d in zip(most, drafting, strict=True)]
                if any(ks) or fixed_width > 1:
                    assert plans.rate(ks) <= bound(w) * (1 + 1e-12)
            skipped += bound(w) <= plain
    assert skipped > 20  # the bound is tight enough to skip widths


def test_at_four_rows_whose_drafting_does_not_pay_the_search_weighs_only_the_plain_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Four rows drafting with a shared draft model (acceptance 0.6 a token, up to 8), a 4-row
    pass 40% dearer per extra token, shared drafting half a pass a token: every plan that
    drafts loses, and the bound shows it for every width, so the search weighs the plain plan
    only. (A bound that paired each row's gain at K = 8 with the cheapest pass and one row's
    shared drafting let every width through: 4 x 1.47 tokens more over a pass 1.4 dear plus
    0.55 of a pass of drafting beats 4 tokens a pass.)"""
    widest = 9
    gains = [sum(0.6**j for j in range(k + 1)) for k in range(widest)]
    plans = Plans(
        expected=[gains] * 4,
        own_s=[[0.0] * widest] * 4,
        shares=[True] * 4,
        limits=[widest - 1] * 4,
        base_tokens=0.0,
        fixed_width=1,
        fixed_shared_rows=0,
        fixed_shared_k=0,
        pass_by_width=[0.0] + [1.0 + 0.4 * (w - 1) for w in range(1, widest + 1)],
        shared_draft_s=lambda r, k: 0.5 * k * (1.0 + 0.1 * r),
        share={False: 1.0, True: 1.0},
    )
    plain = plans.rate([0] * 4)
    assert plain == 4.0
    bound = plans._bounds(widest)
    assert all(bound(w) <= plain for w in range(2, widest + 1))
    weighed: list[list[int]] = []
    rate = Plans.rate

    def counted(self: Plans, ks: list[int]) -> float:
        weighed.append(list(ks))
        return rate(self, ks)

    monkeypatch.setattr(Plans, "rate", counted)
    assert plans.search(widest) == [0, 0, 0, 0]
    assert weighed == [[0, 0, 0, 0]]


def test_where_the_caller_waits_for_the_whole_batch_only_the_rows_most_behind_draft() -> None:
    """Two rows whose lookups agree, over a pass that widens for little: where each request
    waits for its own tokens, both draft (row 0 may draft one token, row 1 four); where the
    caller waits for the batch, the row with fewer tokens left gains the batch nothing by
    drafting (the steps go on for the other) and does not widen the pass, and its tokens beyond
    one a step are weighed so."""
    widths = planner(0.040, 0.05, rows=2)

    def two_rows() -> list[Sequence]:
        rows = [row(r, KnownPolicy(0.9, 0.0), LOOKUP) for r in range(2)]
        rows[0].k_limit = 1
        for s, made in zip(rows, (4, 14), strict=True):
            s.settings = GenerationSettings(max_new_tokens=64)
            s.stats.new_tokens = made  # 60 and 50 tokens left
        return rows

    each = two_rows()
    widths.plan(each, 2)
    assert [s.k for s in each] == [1, 4]
    assert widths.weighted_tokens({0: 2, 1: 5}) == 7
    batch = two_rows()
    expected = widths.plan(batch, 2, last_to_finish=60)
    assert [s.k for s in batch] == [1, 1]  # row 1 only rides in the width row 0 takes
    assert expected is not None and np.isclose(expected[2], 1.9 + 1)  # tokens expected
    assert widths.weighted_tokens({0: 2, 1: 3}) == 2 + 1  # row 1's two extra count nothing
    # neither row behind the other: both count, both draft
    level = two_rows()
    level[1].stats.new_tokens = 4
    widths.plan(level, 2, last_to_finish=60)
    assert [s.k for s in level] == [1, 4]


def _plain_steps(widths: WidthPlanner, rows: list[Sequence], steps: int) -> list[bool]:
    """Whether each of `steps` steps was planned (its K set by a search): a plain run's steps
    are not, and their -k auto rows draft nothing."""
    planned = []
    for _ in range(steps):
        for s in rows:
            s.k = s.k_limit  # what a planned row's policy allows (decide with choose=False)
        planned.append(widths.plan(rows, len(rows)) is not None)
        assert all(s.k == 0 for s in rows)
    return planned


def test_plans_that_draft_nothing_earn_plain_runs_that_double_up_to_a_cap() -> None:
    """Four model rows whose drafting does not pay: after each plain plan the batch runs plain
    without planning for 1, 2, 4 .. PLAIN_MOST steps, then plans again."""
    widths = planner(0.040, 1.0, rows=4)
    rows = [row(r, KnownPolicy(0.3, 0.020)) for r in range(4)]
    planned = _plain_steps(widths, rows, 80)
    runs = "".join("P" if p else "." for p in planned).split("P")[1:]
    cap = WidthPlanner.PLAIN_MOST
    assert [len(r) for r in runs[:6]] == [1, 2, 4, 8, 16, 16][: len(runs[:6])]
    assert cap == 16 and max(len(r) for r in runs) == cap


def test_a_row_drafting_from_a_source_the_plain_plans_did_not_weigh_is_planned_at_once() -> None:
    """The negative control: a lookup where the plain plans saw the model (the plan's inputs
    changed) is planned in the same step, and drafts where that pays; so is a batch that
    changed (a row left)."""
    widths = planner(0.040, 0.02, rows=4)
    widths.observe(3, 1, 0.040)
    rows = [row(r, KnownPolicy(0.3, 0.030)) for r in range(4)]
    assert _plain_steps(widths, rows, 4) == [True, False, True, False]
    rows[2].source = LOOKUP
    rows[2].policy = KnownPolicy(0.9, 0.0)
    rows[2].k = 4
    assert widths.plan(rows, 4) is not None
    assert rows[2].k == 4  # a free lookup in a pass that widens for 2% a position
    # that plan drafted: the run is over, every step is planned again
    rows[2].source, rows[2].policy = MODEL, KnownPolicy(0.3, 0.030)
    assert _plain_steps(widths, rows, 4) == [True, False, True, False]
    assert _plain_steps(rows=rows[:3], widths=widths, steps=2) == [True, False]


def test_a_plain_run_skips_only_steps_whose_sources_its_plans_weighed() -> None:
    """Rows whose sources alternate between the model and a lookup that does not pay either:
    once the run's plans have weighed both for every row, steps go unplanned whichever each
    row has."""
    widths = planner(0.040, 1.0, rows=2)
    rows = [row(r, KnownPolicy(0.3, 0.020)) for r in range(2)]
    planned = []
    for step in range(40):
        for i, s in enumerate(rows):
            s.source = LOOKUP if (step + i) % 3 == 0 else MODEL
            s.k = s.k_limit
        planned.append(widths.plan(rows, 2) is not None)
    assert planned[:2] == [True, True]  # each new source is weighed first
    assert sum(planned[20:]) <= 2
