"""-k auto: the adaptive K policy, fed scripted steps (no model)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from specx.runtime.decode.adaptive import AdaptiveK
from specx.runtime.decode.policy import StepResult
from specx.runtime.drafters import LOOKUP, MODEL, NONE


def ids(*tokens: int) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int64)


def step(proposed: int, accepted: int, draft_s: float = 0.01, verify_s: float = 0.03) -> StepResult:
    """A model draft's step: a pass per drafted token, one token of catch-up."""
    return StepResult(ids(0), MODEL, proposed, accepted, draft_s * proposed, verify_s, proposed, 1)


def test_adaptive_k_grows_on_an_all_accept_streak_and_stays_in_bounds() -> None:
    policy = AdaptiveK(max_k=6, start_k=2)
    ks = []
    for _ in range(30):
        k = policy.decide(MODEL).k
        ks.append(k)
        policy.observe(step(k, k, draft_s=0.003, verify_s=0.03 + 0.001 * k))
    assert all(0 <= k <= 6 for k in ks)
    assert ks[-1] == 6 and policy.acceptance(0) > 0.9


def test_adaptive_k_shrinks_on_an_all_reject_streak_and_probes_again() -> None:
    policy = AdaptiveK(max_k=6, start_k=4, probe_every=5)
    policy.PROBE_BUDGET = 1.0  # probes as often as the doubling allows
    ks = []
    for _ in range(40):
        k = policy.decide(MODEL).k
        ks.append(k)
        policy.observe(step(k, 0, draft_s=0.02, verify_s=0.03))
    assert 0 in ks[5:] and ks[20:].count(0) >= 12  # mostly the target alone
    assert 2 in ks[20:]  # a probe after a run of K = 0


def test_probes_cost_at_most_their_budget_of_the_time_at_k_0() -> None:
    """A draft that is never accepted and costs two thirds of a target pass per token: each
    probe (K = 2) costs 1.33 passes more than a plain step, so probes come at most every
    1.33 / PROBE_BUDGET steps once the first has failed."""
    policy = AdaptiveK(max_k=4, probe_every=4)
    ks = []
    for _ in range(600):
        k = policy.decide(MODEL).k
        ks.append(k)
        policy.observe(step(k, 0, draft_s=0.02, verify_s=0.03))
    probes = [i for i, k in enumerate(ks) if k == 2]
    gaps = [b - a - 1 for a, b in itertools.pairwise(probes)]
    assert gaps and min(gaps) >= int(0.04 / (policy.PROBE_BUDGET * 0.03))
    extra = sum(0.02 * k for k in ks[60:])  # drafting is what a step at K > 0 costs more here
    assert extra <= 1.5 * policy.PROBE_BUDGET * 0.03 * len(ks[60:])


def test_a_draft_that_could_not_pay_even_if_always_accepted_is_never_probed() -> None:
    """Each draft token costs as much as the target's pass: no K can beat the target alone."""
    policy = AdaptiveK(max_k=4, probe_every=4)
    ks = []
    for _ in range(300):
        k = policy.decide(MODEL).k
        ks.append(k)
        policy.observe(step(k, k // 2, draft_s=0.03, verify_s=0.03 + 0.01 * k))
    assert not policy.can_pay(MODEL)
    assert ks[20:].count(0) == len(ks[20:])


def test_adaptive_k_probes_half_as_often_after_each_probe_that_fails_and_resets_on_success() -> (
    None
):
    policy = AdaptiveK(max_k=4, start_k=2, probe_every=4)
    policy.PROBE_MOST = 16
    policy.PROBE_BUDGET = 1.0  # the doubling alone (a probe's cost: a pass and a third)
    ks = []
    for _ in range(120):
        k = policy.decide(MODEL).k
        ks.append(k)
        policy.observe(step(k, 0, draft_s=0.02, verify_s=0.03))  # nothing is ever accepted
    settled = ks.index(0)  # the first positions judged (MIN_JUDGED) before giving up
    assert settled <= 8, ks
    probes = [i for i, k in enumerate(ks) if k > 0 and i > settled]
    gaps = [b - a - 1 for a, b in itertools.pairwise([settled - 1, *probes])]
    assert gaps[:4] == [4, 8, 16, 16], ks  # K = 0 steps between probes: doubling, at most 16
    assert set(gaps[4:]) == {16}
    # a drafter that starts to agree: a probe that pays brings K back and the short gap with it
    for _ in range(60):
        k = policy.decide(MODEL).k
        policy.observe(step(k, k, draft_s=0.002, verify_s=0.03))
    assert policy.decide(MODEL).k > 0
    assert policy.sources[MODEL].probe_after == policy.probe_every


def test_two_unlucky_first_steps_do_not_stop_a_model_draft_that_pays() -> None:
    """A draft that costs half a target pass a token (a small pair on a CPU): its first three
    proposals are rejected, every later one accepted whole. A policy that gave up after three
    would leave the draft idle for good (its catch-up then rules out probes)."""
    policy = AdaptiveK(max_k=4)
    policy.draft_ratio = 0.3
    policy.observe_prefill(100, 0.1)  # an extra verify row priced at a prompt token: 1 ms
    ks = []
    for i in range(40):
        k = policy.decide(MODEL).k
        ks.append(k)
        accepted = 0 if i < 3 else k
        policy.observe(step(k, accepted, draft_s=0.01, verify_s=0.02 + 0.0008 * k))
    assert all(ks[3:8]), ks  # still drafting while few positions were judged
    assert ks[-1] == 4 and ks[8:].count(0) <= 2, ks
    # the negative control: a draft that is never accepted is given up once enough was judged
    never = AdaptiveK(max_k=4)
    never.draft_ratio = 0.3
    never.observe_prefill(100, 0.1)
    ks = []
    for _ in range(40):
        k = never.decide(MODEL).k
        ks.append(k)
        never.observe(step(k, 0, draft_s=0.01, verify_s=0.02 + 0.0008 * k))
    assert ks[10:].count(0) >= 25, ks


def test_a_draft_not_yet_judged_is_not_made_to_read_a_long_prompt_that_cannot_pay_back() -> None:
    """MIN_JUDGED keeps a draft on its acceptance's prior, not on any cost: a lazy draft model
    that would first read an 800-token prompt (8 s at its measured 10 ms a token) for 160 tokens
    left stays idle, though none of its proposals was judged yet."""
    policy = AdaptiveK(max_k=4)
    policy.draft_ratio = 0.3
    policy.lazy_draft = True
    policy.observe_prefill(800, 8.0)
    assert policy.decide(MODEL, True, 800, 160).k == 0  # the first step: never the draft
    policy.observe(StepResult(ids(0), NONE, 0, 0, 0.0, 0.03))
    ks = []
    for _ in range(20):
        k = policy.decide(MODEL, True, 800 + len(ks), 160 - len(ks)).k
        ks.append(k)
        policy.observe(StepResult(ids(0), MODEL, 0, 0, 0.0, 0.03))
    assert ks == [0] * 20
    # the negative control: the same draft caught up (2 behind) is asked
    assert policy.decide(MODEL, True, 2, 140).k > 0


def test_adaptive_k_prefers_small_k_for_an_expensive_draft() -> None:
    cheap, costly = AdaptiveK(max_k=8), AdaptiveK(max_k=8)
    for _ in range(20):
        for policy, draft_s in ((cheap, 0.001), (costly, 0.025)):
            k = policy.decide(MODEL).k
            policy.observe(step(k, int(0.7 * k), draft_s=draft_s, verify_s=0.03))
    assert costly.decide(MODEL).k < cheap.decide(MODEL).k


def test_adaptive_k_learns_correlated_acceptance_and_drafts_long_runs() -> None:
    """An n-gram-like drafter: the first token is often wrong, but a run that starts right goes
    on (independent-acceptance models would pick a short K here)."""
    policy = AdaptiveK(max_k=8, start_k=2)
    rng = np.random.default_rng(0)
    for _ in range(60):
        k = policy.decide(MODEL).k
        accepted = k if (k and rng.random() < 0.4) else 0
        policy.observe(StepResult(ids(0), MODEL, k, accepted, 1e-5 * k, 0.03 + 0.0005 * k, 0, 0))
    assert policy.acceptance(0) < 0.6 and policy.acceptance(2) > 0.9
    assert policy.decide(MODEL).k >= 6


def test_adaptive_k_keeps_separate_estimates_for_lookups_and_model_drafts() -> None:
    """A hybrid drafter: free lookups whose matches run on, and a draft model that pays a pass per
    token and is right 60% of the time. One K for both would fit neither."""
    policy = AdaptiveK(max_k=8, start_k=2)
    rng = np.random.default_rng(1)
    chosen: dict[str, list[int]] = {LOOKUP: [], MODEL: []}
    for _ in range(120):
        source = LOOKUP if rng.random() < 0.5 else MODEL
        k = policy.decide(source).k
        chosen[source].append(k)
        if source == LOOKUP:
            accepted = k if (k and rng.random() < 0.6) else 0
            policy.observe(StepResult(ids(0), source, k, accepted, 2e-5 * k, 0.03 + 0.0015 * k))
        else:
            accepted = 0
            while accepted < k and rng.random() < 0.6:
                accepted += 1
            policy.observe(
                StepResult(ids(0), source, k, accepted, 0.015 * k, 0.03 + 0.0015 * k, k, 1)
            )
    assert policy.sources[LOOKUP].draft_pass_s < 1e-3 < policy.sources[MODEL].draft_pass_s
    assert policy.acceptance(3, LOOKUP) > 0.9 > 0.7 > policy.acceptance(3, MODEL)
    late_lookup, late_model = chosen[LOOKUP][-20:], chosen[MODEL][-20:]
    assert min(late_lookup) >= 6 and max(late_model) <= 3
    assert policy.decide(NONE).k == 0  # a lookup without a match: a plain decode step


def test_a_lookup_the_policy_does_not_draft_still_teaches_its_first_position() -> None:
    """Steps that draft nothing though a lookup offered tokens (a batch's wide passes do not pay)
    tell the policy whether the offer's first token was right: its first position's acceptance
    follows them, the later positions borrow it, and the steps stay K = 0 steps (a probe still
    comes after a run of them). Steps without an offer teach nothing."""
    policy = AdaptiveK(max_k=4, probe_every=4)
    policy.observe(StepResult(ids(0), LOOKUP, 4, 4, 1e-5, 0.03))  # one lookup drafted, all right
    before = policy.acceptances(LOOKUP)
    for _ in range(3):
        policy.observe(StepResult(ids(0), LOOKUP, 0, 0, 0.0, 0.03))  # no offer: nothing learned
    assert policy.acceptances(LOOKUP) == before
    for i in range(30):  # offers right one time in five
        policy.observe(StepResult(ids(0), LOOKUP, 0, 0, 0.0, 0.03, lookup_first_hit=i % 5 == 0))
    after = policy.acceptances(LOOKUP)
    assert before[0] > 0.6 and 0.15 < after[0] < 0.3
    assert after[3] < before[3]  # the later positions are shrunk toward the first
    assert policy.sources[LOOKUP].zero_streak == 33
    # no probe after the run of K = 0 steps: the offers keep the estimate current for free
    assert not policy.sources[LOOKUP].probing


def test_a_decision_whose_k_a_batch_planner_sets_allows_max_k_and_leaves_the_probes_alone() -> None:
    """In a planned batch step the planner sets K: the policy's decision allows up to max_k
    (0 with nothing to draft) and carries the drafting plan, without the policy's own choice,
    so a run of K = 0 steps still ends in the probe the policy would have made."""
    policy = AdaptiveK(max_k=4, start_k=2, probe_every=4)
    for _ in range(50):  # a drafter that never agrees: K falls to 0
        k = policy.decide().k
        if k == 0:
            break
        policy.observe(step(k, 0))
    assert k == 0
    for _ in range(6):
        policy.observe(step(0, 0))  # a run of K = 0 steps: alone, the next step would probe
    est = policy.sources[MODEL]
    planned = policy.decide(MODEL, choose=False)
    assert planned.k == 4 and planned.plan is not None
    assert policy.decide(NONE, choose=False).k == 0
    assert not est.probing and est.zero_streak == 6  # the planned steps made no probe
    policy.observe(step(0, 0))  # the planner kept the row plain
    assert policy.decide().k == 2  # the probe, as alone


def test_adaptive_k_charges_each_verify_width_what_it_was_measured_to_cost() -> None:
    """Pass time is not linear in the width (3 to 5 tokens cost the same here, 7 a third more):
    a line would overcharge K = 4 and undercharge K = 6."""
    policy = AdaptiveK(max_k=6)
    measured = {1: 0.030, 2: 0.031, 3: 0.032, 4: 0.032, 5: 0.032, 6: 0.037, 7: 0.043}
    for _ in range(12):
        for width, seconds in measured.items():
            policy.decide(MODEL)
            policy.observe(StepResult(ids(0), MODEL, width - 1, 0, 0.01 * (width - 1), seconds))
    for width, seconds in measured.items():
        assert policy.verify_s(width) == pytest.approx(seconds, rel=0.05)
    assert policy.verify_line_s(5) > 1.05 * policy.verify_s(5)
    assert policy.verify_line_s(7) < 0.95 * policy.verify_s(7)
    assert AdaptiveK(max_k=2).verify_s(9) == 1.0  # nothing measured, width beyond any K


def test_adaptive_k_drafts_while_the_draft_is_confident_and_stops_when_it_is_not() -> None:
    """A draft whose confident tokens are accepted and whose unsure ones are rejected: once the
    run has learned that, drafting goes on through confident stretches (up to max_k) and stops
    at the first unsure token."""
    policy = AdaptiveK(max_k=6, start_k=3)
    rng = np.random.default_rng(2)
    lengths = []
    for _ in range(80):
        decision = policy.decide(MODEL)
        k, plan = decision.k, decision.plan
        tops: list[float] = []
        for i in range(k):  # what a draft model does with the plan
            top = 0.95 if rng.random() < 0.7 else 0.2
            take, more = plan(i, top) if plan is not None else (True, True)
            if not take:
                break
            tops.append(top)
            if not more:
                break
        n, unsure = len(tops), [i for i, t in enumerate(tops) if t < 0.5]
        accepted = unsure[0] if unsure else n
        result = StepResult(
            ids(0), MODEL, n, accepted, 0.01 * n, 0.03 + 0.003 * n, n, 1, np.array(tops)
        )
        policy.observe(result)
        lengths.append(n)
    assert max(lengths[-30:]) == 6  # confident stretches are drafted to max_k
    assert policy.decide(MODEL).k == 6
    plan = policy.decide(MODEL).plan
    assert plan is not None
    assert [plan(i, 0.99) for i in range(3)] == [(True, True)] * 3
    assert plan(3, 0.1)[0] is False  # an unsure token is not worth verifying
    assert plan(0, 0.99) == (True, True)  # a new proposal starts a new chain
    assert AdaptiveK().plan(MODEL)(5, 0.01) == (True, True)  # nothing learned: draft all of K


def test_adaptive_k_inherits_what_an_earlier_generation_learned() -> None:
    learned = AdaptiveK(max_k=6)
    for _ in range(30):
        k = learned.decide(MODEL).k
        learned.observe(step(k, k, draft_s=0.002, verify_s=0.03))
    fresh = AdaptiveK(max_k=6)
    assert fresh.decide(MODEL).k == 3  # nothing known: the default start
    warm = AdaptiveK(max_k=6)
    warm.inherit(learned)
    assert warm.decide(MODEL).k == 6  # cheap, always-accepted drafts: the longest K from step one


def test_generations_that_do_not_draft_keep_the_acceptance_learned_not_the_prior() -> None:
    """Counts are weighted down at each new generation; the estimate must not drift back to the
    fixed prior (0.6) across generations that draft nothing: a draft accepted 90% of the time
    would be talked out of drafting for good, one accepted 20% talked back into it."""
    for rate, low, high in ((0.9, 0.85, 1.0), (0.2, 0.0, 0.3)):
        policy = AdaptiveK(max_k=4)
        for i in range(40):
            policy.observe(step(1, int((i * rate) % 1.0 + rate >= 1.0), verify_s=0.03))
        learned = policy.acceptance(0)
        assert low <= learned <= high, (rate, learned)
        for _ in range(8):  # generations that only read their prompt
            fresh = AdaptiveK(max_k=4)
            fresh.inherit(policy)
            policy = fresh
        assert low <= policy.acceptance(0) <= high, (rate, policy.acceptance(0))
    # the negative control: with the anchor dropped the estimate goes back to the prior
    for est in policy.sources.values():
        est.anchor = []
    assert policy.acceptance(0) > 0.5


def test_an_idle_draft_model_is_probed_where_the_generation_left_can_pay_its_catch_up() -> None:
    """A lazy draft model falls one token further behind at every K = 0 step. Its catch-up grows
    as fast as the probe budget of the time at K = 0, so a budget of the steps behind alone never
    allows a probe; the tokens the generation can still make fund one (within 2% of them)."""

    def probes(left: int) -> int:
        policy = AdaptiveK(max_k=4)
        policy.draft_ratio = 0.5
        policy.observe_prefill(100, 0.1)  # a draft row: 0.5 ms, a target pass 20 ms
        for _ in range(12):  # rejected drafts: the policy settles at K = 0
            k = policy.decide(MODEL, True, 2, 500).k
            policy.observe(step(k, 0, draft_s=0.01, verify_s=0.02 + 0.001 * k))
        behind, count = 40, 0
        for _ in range(200):
            k = policy.decide(MODEL, True, behind, left).k
            count += k > 0
            behind = 2 if k else behind + 1
            policy.observe(step(k, 0, draft_s=0.01, verify_s=0.02 + 0.001 * k))
        return count

    assert probes(left=1000) >= 2
    assert probes(left=0) == 0  # the negative control: catch-up against the steps behind only


def test_a_long_catch_up_teaches_what_the_draft_pays_a_token_read() -> None:
    """Before measuring, a draft's catch-up is priced by its size (draft_ratio of a prompt row);
    an int8 draft reads its prompt at far more than a quarter of the target's cost. A catch-up
    of 200 tokens that took 0.2 s (two draft passes of 5 ms each aside) prices the next one."""
    policy = AdaptiveK(max_k=4)
    policy.draft_ratio = 0.1
    policy.observe_prefill(100, 0.1)  # a target row: 1 ms, so a draft row guessed at 0.1 ms
    policy.observe(step(2, 2, draft_s=0.005))  # a draft pass measured: 5 ms
    assert policy.catchup_s(102) == pytest.approx(0.01)
    long = StepResult(ids(0, 0, 0), MODEL, 2, 2, 0.01 + 0.2, 0.03, 2, 200)
    policy.observe(long)
    assert policy.catchup_s(102) == pytest.approx(0.1)
    fresh = AdaptiveK(max_k=4)
    fresh.inherit(policy)  # what was measured goes on to later generations
    assert fresh.catchup_s(102) == pytest.approx(0.1)
    # the negative control: a short catch-up is mostly the passes and teaches nothing
    short = AdaptiveK(max_k=4)
    short.draft_ratio = 0.1
    short.observe_prefill(100, 0.1)
    short.observe(StepResult(ids(0, 0, 0), MODEL, 2, 2, 0.05, 0.03, 2, 10))
    assert short.catchup_s(102) == pytest.approx(0.01)


def test_a_first_draft_that_also_reads_the_prompt_does_not_price_drafting_out() -> None:
    # a batch row's first model draft reads its whole prompt (45 tokens) in its first pass:
    # 3 drafts in 0.16 s, where a draft pass costs 0.02 s and the target's 0.04 s
    policy = AdaptiveK(max_k=4)
    policy.decide(MODEL)
    policy.observe(StepResult(ids(0, 0, 0, 0), MODEL, 3, 3, 0.16, 0.045, 3, 45))
    assert policy.decide(MODEL).k > 0  # priced per proposed token (0.053 s) it would stop here
    assert not policy.sources[MODEL].draft_seen  # provisional until a step drafts without it
    for _ in range(5):
        k = policy.decide(MODEL).k
        policy.observe(step(k, k, draft_s=0.02, verify_s=0.04))
    assert policy.sources[MODEL].draft_pass_s == pytest.approx(0.02)
    assert policy.decide(MODEL).k > 0


def test_a_later_generation_keeps_the_probe_rhythm_of_the_one_before() -> None:
    # a drafter that never agrees: the probes back off to every 16 K = 0 steps; generations of
    # 10 steps each must still probe, every 16 steps across them, not never
    policy = AdaptiveK(max_k=4, probe_every=4)
    policy.PROBE_MOST = 16
    ks = []
    for _ in range(12):
        fresh = AdaptiveK(max_k=4, probe_every=4)
        fresh.PROBE_MOST = 16
        fresh.inherit(policy)
        policy = fresh
        for _ in range(10):
            k = policy.decide(MODEL).k
            ks.append(k)
            policy.observe(step(k, 0, draft_s=0.02, verify_s=0.03))
    probes = [i for i, k in enumerate(ks) if k > 0]
    assert probes[-1] > 80 and len(probes) >= 6, ks
    gaps = [b - a - 1 for a, b in itertools.pairwise(probes)]
    assert set(gaps[-2:]) == {16}


@pytest.fixture
def costly_verify(monkeypatch: pytest.MonkeyPatch) -> float:
    """A test backend whose passes cost BASE seconds plus ROW for every extra token: a verify
    pass over K + 1 tokens costs 1 + 1.5 K one-token passes, so that no K pays, however well
    drafts are accepted. Returns ROW / BASE."""
    import time

    from specx.runtime.backends import OrtSession

    base, row = 0.004, 0.006
    run = OrtSession._pass  # every pass: verify, decode and the prompt's (forward_last)

    def slow(self: OrtSession, tokens: np.ndarray, cache: object, keep: int) -> np.ndarray:
        time.sleep(base + row * (int(tokens.shape[0]) - 1))
        return run(self, tokens, cache, keep)  # type: ignore[arg-type]

    monkeypatch.setattr(OrtSession, "_pass", slow)
    return row / base


def cost_in_passes(stats: object, row: float) -> float:
    """The test backend's time of a generation's decode steps, in one-token passes."""
    return stats.target_passes + row * stats.proposed  # type: ignore[attr-defined]


@pytest.mark.parametrize("drafter", ["ngram", "suffix", "mixed", "ngram+mixed"])
def test_where_speculation_cannot_pay_k_auto_settles_at_0_and_keeps_the_target_s_pace(
    llama_pair: object, costly_verify: float, drafter: str
) -> None:
    """On repetitive text the lookups would be accepted, and the mixed draft agrees with the
    target most of the time; still every verify row costs 1.5 passes, so -k auto must settle at
    K = 0 within a few steps and stay within 3% of the target alone; the next request starts
    there at once."""
    from specx.runtime import Pipeline

    pipe = Pipeline.load(llama_pair.artifact)  # type: ignore[attr-defined]
    prompt = np.tile(np.arange(20, 30), 4)  # a prompt that repeats: lookups find matches
    for request in range(2):
        result = pipe.generate(prompt, max_new_tokens=60, k="auto", drafter=drafter)
        ks = result.stats.k_used
        settled = next((i for i in range(len(ks)) if not any(ks[i:])), len(ks))
        assert settled <= (4 if request == 0 else 0), ks
        ratio = result.stats.new_tokens / cost_in_passes(result.stats, costly_verify)
        assert ratio >= 0.97, (ratio, ks)
    short = pipe.generate(np.array([25]), max_new_tokens=40, k="auto", drafter=drafter)
    assert not any(short.stats.k_used[4:])  # a one-token prompt: learned from the last ones
