"""Drafters behind the one interface: n-gram lookup, quantized drafts, adaptive K."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import TinyPair, needs_exporter
from specx.runtime import Pipeline
from specx.runtime.adaptive import AdaptiveK
from specx.runtime.contract import Manifest
from specx.runtime.drafters import NgramDrafter
from specx.runtime.generate import StepResult


def ids(*tokens: int) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int64)


def test_ngram_proposes_what_followed_the_last_occurrence_of_the_suffix() -> None:
    drafter = NgramDrafter(max_ngram=3)
    context = ids(5, 6, 7, 8, 9, 1, 2, 6, 7)
    assert drafter.propose(context, 3).tokens.tolist() == [8, 9, 1]


def test_ngram_prefers_the_longest_match_then_the_latest_occurrence() -> None:
    drafter = NgramDrafter(max_ngram=3)
    # "7" alone last occurred before 30; "6 7" occurred before 8: the longer match wins
    context = ids(6, 7, 8, 0, 7, 30, 0, 6, 7)
    assert drafter.propose(context, 2).tokens.tolist() == [8, 0]
    # two occurrences of "3 4": the latest one is used
    assert drafter.propose(ids(3, 4, 10, 3, 4, 11, 3, 4), 1).tokens.tolist() == [11]


def test_ngram_without_a_match_proposes_nothing() -> None:
    drafter = NgramDrafter(max_ngram=3)
    assert drafter.propose(ids(1, 2, 3, 4, 5), 4).tokens.size == 0
    assert drafter.propose(ids(9), 4).tokens.size == 0


def test_ngram_match_at_the_end_of_the_context_proposes_only_what_exists() -> None:
    drafter = NgramDrafter(max_ngram=2)
    # suffix "4 4": its earlier occurrence starts one token before the end
    assert drafter.propose(ids(1, 4, 4, 4), 5).tokens.tolist() == [4]


def test_ngram_never_proposes_past_eos() -> None:
    drafter = NgramDrafter(max_ngram=2, eos_token_ids=(1,))
    context = ids(5, 6, 7, 1, 8, 9, 5, 6)
    assert drafter.propose(context, 5).tokens.tolist() == [7, 1]


def test_ngram_names_its_source_and_proposes_the_continuation_it_found() -> None:
    drafter = NgramDrafter(max_ngram=2)
    assert drafter.source(ids(1, 2, 3, 9, 1, 2)) == "lookup"
    assert drafter.propose(ids(1, 2, 3, 9, 1, 2), 2).tokens.tolist() == [3, 9]
    assert drafter.source(ids(4, 5, 6, 7)) == "none"
    assert drafter.propose(ids(4, 5, 6, 7), 3).tokens.size == 0
    # a different context of the same length is searched anew (nothing stale from a source call)
    drafter.source(ids(1, 2, 3, 9, 1, 2))
    drafter.propose(ids(1, 2, 3, 9, 1, 2), 2)
    assert drafter.propose(ids(5, 6, 7, 8, 9, 5), 2).tokens.tolist() == [6, 7]


def test_ngram_lookup_handles_long_contexts_quickly() -> None:
    rng = np.random.default_rng(0)
    context = rng.integers(0, 50, size=4000).astype(np.int64)
    proposal = NgramDrafter(max_ngram=3).propose(context, 8)
    assert proposal.tokens.size <= 8 and proposal.p_draft is None


def step(proposed: int, accepted: int, draft_s: float = 0.01, verify_s: float = 0.03) -> StepResult:
    return StepResult(ids(0), proposed, accepted, draft_s * proposed, verify_s, proposed, 1)


def test_adaptive_k_grows_on_an_all_accept_streak_and_stays_in_bounds() -> None:
    policy = AdaptiveK(max_k=6, start_k=2)
    ks = []
    for _ in range(30):
        k = policy.next_k()
        ks.append(k)
        policy.observe(step(k, k, draft_s=0.003, verify_s=0.03 + 0.001 * k))
    assert all(0 <= k <= 6 for k in ks)
    assert ks[-1] == 6 and policy.acceptance(0) > 0.9


def test_adaptive_k_shrinks_on_an_all_reject_streak_and_probes_again() -> None:
    policy = AdaptiveK(max_k=6, start_k=4, probe_every=5)
    ks = []
    for _ in range(40):
        k = policy.next_k()
        ks.append(k)
        policy.observe(step(k, 0, draft_s=0.02, verify_s=0.03))
    assert 0 in ks[5:] and ks[20:].count(0) >= 12  # mostly the target alone
    assert 2 in ks[20:]  # a probe after a run of K = 0


def test_adaptive_k_prefers_small_k_for_an_expensive_draft() -> None:
    cheap, costly = AdaptiveK(max_k=8), AdaptiveK(max_k=8)
    for _ in range(20):
        for policy, draft_s in ((cheap, 0.001), (costly, 0.025)):
            k = policy.next_k()
            policy.observe(step(k, int(0.7 * k), draft_s=draft_s, verify_s=0.03))
    assert costly.next_k() < cheap.next_k()


@needs_exporter
@pytest.mark.parametrize("k", [2, 5, "auto"])
def test_greedy_equality_holds_with_the_ngram_drafter(llama_pair: TinyPair, k: Any) -> None:
    pipe = Pipeline.load(llama_pair.artifact)
    # a repetitive prompt so that lookups find matches
    prompt = np.tile(np.array([10, 11, 12, 13, 14, 15], dtype=np.int64), 5)
    want = pipe.generate(prompt, max_new_tokens=60, k=0).token_ids
    result = pipe.generate(prompt, max_new_tokens=60, k=k, drafter="ngram")
    assert result.token_ids == want
    assert result.stats.proposed > 0


@needs_exporter
@pytest.mark.parametrize("drafter", ["mixed", "other", "self"])
def test_greedy_equality_holds_with_adaptive_k(llama_pair: TinyPair, drafter: str) -> None:
    pipe = Pipeline.load(llama_pair.artifact)
    prompt = np.array([20, 30, 40, 50, 60], dtype=np.int64)
    want = pipe.generate(prompt, max_new_tokens=70, k=0).token_ids
    result = pipe.generate(prompt, max_new_tokens=70, k="auto", max_k=6, drafter=drafter)
    assert result.token_ids == want
    assert result.stats.adaptive and all(0 <= k <= 6 for k in result.stats.k_used)


@needs_exporter
def test_draft_confidence_threshold_shortens_proposals_and_keeps_output(
    llama_pair: TinyPair,
) -> None:
    pipe = Pipeline.load(llama_pair.artifact)
    prompt = np.array([20, 30, 40, 50, 60], dtype=np.int64)
    plain = pipe.generate(prompt, max_new_tokens=50, k=6, drafter="other")
    gated = pipe.generate(prompt, max_new_tokens=50, k=6, drafter="other", draft_p_min=0.9)
    assert gated.token_ids == plain.token_ids
    assert gated.stats.proposed < plain.stats.proposed


@pytest.fixture(scope="session")
def quantized_pair(tmp_path_factory: Any, llama_pair: TinyPair) -> Path:
    from specx.exporter import ExportOptions, export_pair

    out = tmp_path_factory.mktemp("quantized") / "artifact"
    export_pair(
        str(llama_pair.sources["target"]),
        ["ngram+int8", "int4", "ngram"],
        out,
        ExportOptions(max_length=128),
        log=lambda _m: None,
    )
    return out


@needs_exporter
def test_quantized_drafts_are_exported_checked_and_keep_greedy_equality(
    quantized_pair: Path, llama_pair: TinyPair
) -> None:
    manifest = Manifest.read(quantized_pair)
    assert [d.name for d in manifest.drafts] == ["int8", "int4"]
    assert manifest.default_drafter == "ngram+int8"
    target_bytes = manifest.target.weight_bytes
    for spec in manifest.drafts:
        assert spec.parity["kind"] == "quantized"
        assert 0.2 <= spec.parity["argmax_agreement"] <= 1.0
        assert spec.weight_bytes < target_bytes
    pipe = Pipeline.load(quantized_pair)
    prompt = np.array([20, 30, 40, 50, 60], dtype=np.int64)
    want = pipe.generate(prompt, max_new_tokens=40, k=0).token_ids
    for name in ("int8", "int4", "ngram", "ngram+int8", "ngram+int4"):
        result = pipe.generate(prompt, max_new_tokens=40, k=3, drafter=name)
        assert result.token_ids == want, name
    assert pipe.default_drafter == "ngram+int8"
    assert pipe.generate(prompt, max_new_tokens=40, k=3, drafter="int8").stats.accepted > 0


def test_adaptive_k_learns_correlated_acceptance_and_drafts_long_runs() -> None:
    """An n-gram-like drafter: the first token is often wrong, but a run that starts right goes
    on (independent-acceptance models would pick a short K here)."""
    policy = AdaptiveK(max_k=8, start_k=2)
    rng = np.random.default_rng(0)
    for _ in range(60):
        k = policy.next_k()
        accepted = k if (k and rng.random() < 0.4) else 0
        policy.observe(StepResult(ids(0), k, accepted, 1e-5 * k, 0.03 + 0.0005 * k, 0, 0))
    assert policy.acceptance(0) < 0.6 and policy.acceptance(2) > 0.9
    assert policy.next_k() >= 6


def test_adaptive_k_keeps_separate_estimates_for_lookups_and_model_drafts() -> None:
    """A hybrid drafter: free lookups whose matches run on, and a draft model that pays a pass per
    token and is right 60% of the time. One K for both would fit neither."""
    policy = AdaptiveK(max_k=8, start_k=2)
    rng = np.random.default_rng(1)
    chosen: dict[str, list[int]] = {"lookup": [], "model": []}
    for _ in range(120):
        source = "lookup" if rng.random() < 0.5 else "model"
        k = policy.next_k(source)
        chosen[source].append(k)
        if source == "lookup":
            accepted = k if (k and rng.random() < 0.6) else 0
            policy.observe(StepResult(ids(0), k, accepted, 2e-5 * k, 0.03 + 0.0015 * k, 0, 0))
        else:
            accepted = 0
            while accepted < k and rng.random() < 0.6:
                accepted += 1
            policy.observe(StepResult(ids(0), k, accepted, 0.015 * k, 0.03 + 0.0015 * k, k, 1))
    assert policy.sources["lookup"].draft_pass_s < 1e-3 < policy.sources["model"].draft_pass_s
    assert policy.acceptance(3, "lookup") > 0.9 > 0.7 > policy.acceptance(3, "model")
    late_lookup, late_model = chosen["lookup"][-20:], chosen["model"][-20:]
    assert min(late_lookup) >= 6 and max(late_model) <= 3
    assert policy.next_k("none") == 0  # a lookup without a match: a plain decode step


def test_adaptive_k_charges_each_verify_width_what_it_was_measured_to_cost() -> None:
    """Pass time is not linear in the width (3 to 5 tokens cost the same here, 7 a third more):
    a line would overcharge K = 4 and undercharge K = 6."""
    policy = AdaptiveK(max_k=6)
    measured = {1: 0.030, 2: 0.031, 3: 0.032, 4: 0.032, 5: 0.032, 6: 0.037, 7: 0.043}
    for _ in range(12):
        for width, seconds in measured.items():
            policy.next_k("model")
            policy.observe(StepResult(ids(0), width - 1, 0, 0.01 * (width - 1), seconds, 0, 1))
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
        k, plan = policy.next_k("model"), policy.plan()
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
        result = StepResult(ids(0), n, accepted, 0.01 * n, 0.03 + 0.003 * n, n, 1, np.array(tops))
        policy.observe(result)
        lengths.append(n)
    assert max(lengths[-30:]) == 6  # confident stretches are drafted to max_k
    assert policy.next_k("model") == 6
    plan = policy.plan()
    assert plan is not None
    assert [plan(i, 0.99) for i in range(3)] == [(True, True)] * 3
    assert plan(3, 0.1)[0] is False  # an unsure token is not worth verifying
    assert plan(0, 0.99) == (True, True)  # a new proposal starts a new chain
    assert AdaptiveK().plan()(5, 0.01) == (True, True)  # nothing learned: draft all of K


def test_adaptive_k_inherits_what_an_earlier_generation_learned() -> None:
    learned = AdaptiveK(max_k=6)
    for _ in range(30):
        k = learned.next_k()
        learned.observe(step(k, k, draft_s=0.002, verify_s=0.03))
    fresh = AdaptiveK(max_k=6)
    assert fresh.next_k() == 3  # nothing known: the default start
    warm = AdaptiveK(max_k=6)
    warm.inherit(learned)
    assert warm.next_k() == 6  # cheap, always-accepted drafts: the longest K from step one


@needs_exporter
def test_a_pipeline_keeps_the_adaptive_policy_per_drafter(llama_pair: TinyPair) -> None:
    pipe = Pipeline.load(llama_pair.artifact)
    prompt = np.array([20, 30, 40, 50, 60], dtype=np.int64)
    first = pipe.generate(prompt, max_new_tokens=40, k="auto", drafter="mixed")
    assert "mixed" in pipe._learned and pipe._learned["mixed"].history
    second = pipe.generate(prompt, max_new_tokens=40, k="auto", drafter="mixed")
    assert second.token_ids == first.token_ids


@needs_exporter
@pytest.mark.parametrize("k", [3, "auto"])
def test_the_hybrid_drafter_uses_lookups_and_the_model_and_stays_exact(
    llama_pair: TinyPair, k: Any
) -> None:
    pipe = Pipeline.load(llama_pair.artifact)
    assert "ngram+mixed" in pipe.drafter_names
    # half repetitive (lookups match), half not (the model drafts)
    prompt = np.concatenate(
        [
            np.tile(np.array([10, 11, 12, 13], dtype=np.int64), 4),
            np.array([50, 61, 72, 83, 94], dtype=np.int64),
        ]
    )
    want = pipe.generate(prompt, max_new_tokens=60, k=0).token_ids
    result = pipe.generate(prompt, max_new_tokens=60, k=k, drafter="ngram+mixed")
    assert result.token_ids == want
    assert result.stats.draft_passes > 0  # the model drafted some steps
    if k == "auto":  # and -k auto learned each source on its own
        assert set(pipe._learned["ngram+mixed"].sources) == {"lookup", "model"}
    sampled = pipe.generate(
        prompt, max_new_tokens=30, k=3, drafter="ngram+mixed", temperature=0.8, seed=5
    )
    again = pipe.generate(
        prompt, max_new_tokens=30, k=3, drafter="ngram+mixed", temperature=0.8, seed=5
    )
    assert sampled.token_ids == again.token_ids


def test_the_replay_simulation_runs_the_real_policy_on_a_recorded_trace() -> None:
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / "adaptive_sim.py"
    spec = importlib.util.spec_from_file_location("adaptive_sim", path)
    assert spec is not None and spec.loader is not None
    sim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sim)
    # an easy text (8 of 8 accepted, confident) followed by a hard one (nothing accepted, unsure)
    trace = {
        "accepted": [8] * 30 + [0] * 30,
        "confidence": [[0.99] * 8] * 30 + [[0.2] * 8] * 30,
    }
    costs = {"target": {w: 0.020 + 0.001 * w for w in range(1, 8)}, "draft": {1: 0.01, 2: 0.011}}
    rng = np.random.default_rng(0)
    rates = {}
    for k in (1, 4):
        tokens, seconds = sim.replay(trace, costs, None, k, rng)
        assert tokens == 60 and seconds > 0
        rates[k] = tokens / seconds
    policy = AdaptiveK(max_k=6)
    tokens, seconds = sim.replay(trace, costs, policy, 0, rng)
    assert tokens == 60 and policy.history
    assert tokens / seconds > max(rates.values())  # long where easy, nothing wasted where hard
