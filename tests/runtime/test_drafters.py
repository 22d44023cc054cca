"""Drafters behind the one interface: n-gram lookup, model drafts, the hybrid, with -k auto."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from conftest import TinyPair, needs_exporter
from specx.runtime import Pipeline
from specx.runtime.drafters import NgramDrafter, is_lookup, lookup_source


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
    assert drafter.source(ids(1, 2, 3, 9, 1, 2)) == "lookup2"  # named by the match's length
    assert drafter.source(ids(1, 2, 3, 9, 5, 4, 2)) == "lookup1"  # only "2" occurred before
    assert is_lookup("lookup1") and not is_lookup("model") and lookup_source(3) == "lookup3"
    assert drafter.propose(ids(1, 2, 3, 9, 1, 2), 2).tokens.tolist() == [3, 9]
    assert drafter.source(ids(4, 5, 6, 7)) == "none"
    assert drafter.propose(ids(4, 5, 6, 7), 3).tokens.size == 0
    # a different context of the same length is searched anew (nothing stale from a source call)
    drafter.source(ids(1, 2, 3, 9, 1, 2))
    drafter.propose(ids(1, 2, 3, 9, 1, 2), 2)
    assert drafter.propose(ids(5, 6, 7, 8, 9, 5), 2).tokens.tolist() == [6, 7]


def lookup_by_definition(context: np.ndarray, max_ngram: int, min_ngram: int, k: int) -> list[int]:
    """Prompt lookup spelled out: for n from the longest down, the latest earlier window equal
    to the last n tokens (and followed by a token); what follows it."""
    length = len(context)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        pattern = context[length - n :].tolist()
        starts = [h for h in range(length - n) if context[h : h + n].tolist() == pattern]
        if starts:
            return context[starts[-1] + n : starts[-1] + n + k].tolist()
    return []


@pytest.mark.parametrize(("max_ngram", "min_ngram"), [(3, 1), (4, 2), (1, 1)])
def test_ngram_lookup_matches_its_definition_on_random_contexts(
    max_ngram: int, min_ngram: int
) -> None:
    rng = np.random.default_rng(max_ngram * 10 + min_ngram)
    drafter = NgramDrafter(max_ngram=max_ngram, min_ngram=min_ngram)
    found = 0
    for _ in range(400):
        context = rng.integers(0, int(rng.integers(2, 6)), size=int(rng.integers(1, 30)))
        want = lookup_by_definition(context, max_ngram, min_ngram, 5)
        assert drafter.propose(context.astype(np.int64), 5).tokens.tolist() == want, context
        found += bool(want)
    assert 100 < found < 400  # both outcomes were exercised


def test_ngram_lookup_on_a_growing_context_matches_its_definition_at_every_step() -> None:
    """The index is kept up to date a step at a time: a generation's context grows by a few
    tokens a step; another context (a new generation, a shorter one) is indexed anew."""
    rng = np.random.default_rng(7)
    drafter = NgramDrafter(max_ngram=3, eos_token_ids=(0,))
    for _ in range(30):
        text = rng.integers(0, int(rng.integers(2, 8)), size=120).astype(np.int64)
        length = int(rng.integers(1, 10))
        while length <= text.size:
            context = text[:length]
            want = lookup_by_definition(context, 3, 1, 64)
            if 0 in want:  # the definition's continuation, cut after the EOS token
                want = want[: want.index(0) + 1]
            source = drafter.source(context)
            assert drafter.propose(context, 64).tokens.tolist() == want, context
            matched = max(
                (n for n in (1, 2, 3) if lookup_by_definition(context, n, n, 1)), default=0
            )
            assert source == (lookup_source(matched) if want else "none")
            length += int(rng.integers(1, 6))
        if rng.random() < 0.5:  # now and then a shorter context, without a new start
            context = text[: int(rng.integers(1, 40))]
            want = lookup_by_definition(context, 3, 1, 64)
            if 0 in want:
                want = want[: want.index(0) + 1]
            assert drafter.propose(context, 64).tokens.tolist() == want


def test_ngram_lookup_handles_long_contexts_quickly() -> None:
    rng = np.random.default_rng(0)
    context = rng.integers(0, 50, size=4000).astype(np.int64)
    proposal = NgramDrafter(max_ngram=3).propose(context, 8)
    assert proposal.tokens.size <= 8 and proposal.p_draft is None


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


@needs_exporter
def test_a_pipeline_keeps_the_adaptive_policy_per_drafter(llama_pair: TinyPair) -> None:
    pipe = Pipeline.load(llama_pair.artifact)
    prompt = np.array([20, 30, 40, 50, 60], dtype=np.int64)
    first = pipe.generate(prompt, max_new_tokens=40, k="auto", drafter="mixed")
    learned = pipe.learned_policy("mixed")
    assert learned is not None and learned.history
    second = pipe.generate(prompt, max_new_tokens=40, k="auto", drafter="mixed")
    assert second.token_ids == first.token_ids


@needs_exporter
@pytest.mark.parametrize("k", [3, "auto"])
def test_the_hybrid_drafter_uses_lookups_and_the_model_and_stays_exact(
    llama_pair: TinyPair, k: Any
) -> None:
    pipe = Pipeline.load(llama_pair.artifact)
    assert "ngram+mixed" in pipe.drafter_names
    # half repetitive (lookups match), half not (the model drafts); it ends on a bigram of the
    # repetitive half, so that the first step has a lookup to draft
    prompt = np.concatenate(
        [
            np.tile(np.array([10, 11, 12, 13], dtype=np.int64), 4),
            np.array([50, 61, 72, 83, 94, 10, 11], dtype=np.int64),
        ]
    )
    want = pipe.generate(prompt, max_new_tokens=60, k=0).token_ids
    result = pipe.generate(prompt, max_new_tokens=60, k=k, drafter="ngram+mixed")
    assert result.token_ids == want
    if k == 3:
        assert result.stats.draft_passes > 0  # the model drafted some steps
    if k == "auto":  # and -k auto learned each source on its own, a lookup per match length
        learned = pipe.learned_policy("ngram+mixed")
        assert learned is not None and "model" in learned.sources
        assert any(is_lookup(s) for s in learned.sources)
        assert set(learned.sources) <= {"lookup1", "lookup2", "lookup3", "model"}
        assert result.stats.proposed > 0  # the lookups drafted
        # "mixed" is as large as the target: its passes could not pay even if every draft were
        # accepted, so -k auto never asks it (the drafting plan's test: test_adaptive.py)
        assert not learned.can_pay("model") and result.stats.draft_passes == 0
    sampled = pipe.generate(
        prompt, max_new_tokens=30, k=3, drafter="ngram+mixed", temperature=0.8, seed=5
    )
    again = pipe.generate(
        prompt, max_new_tokens=30, k=3, drafter="ngram+mixed", temperature=0.8, seed=5
    )
    assert sampled.token_ids == again.token_ids
