"""Suffix drafting (runtime/drafters/suffix.py): proposals from the longest match in the context
and in the scope's earlier outputs, as long as the match and the continuation's observed
frequency allow, and nothing where nothing matches."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import TinyPair, needs_exporter
from specx.runtime import Pipeline
from specx.runtime.drafters.base import DraftRequest
from specx.runtime.drafters.suffix import (
    MAX_OCCURRENCES,
    HistoryBounds,
    SuffixDrafter,
    SuffixHistory,
    TokenIndex,
    follow,
    match_source,
)
from specx.runtime.verification.sampling import PositionNoise, SamplingParams


def request(scope: str | None = "") -> DraftRequest:
    return DraftRequest(SamplingParams(), PositionNoise(0, 1000), scope=scope)


def drafter(history: SuffixHistory | None = None, eos: tuple[int, ...] = ()) -> SuffixDrafter:
    d = SuffixDrafter(history, eos)
    d.start(np.zeros(1, np.int64), request())
    return d


def ids(*values: int) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def test_a_long_match_proposes_a_long_run_and_a_short_one_a_short_run() -> None:
    run = np.arange(100, 140)  # 40 distinct tokens
    context = np.concatenate([run, ids(7, 8), run[:20]])  # the run again, 20 tokens in
    d = drafter()
    assert d.source(context) == "lookup16"
    proposal = d.propose(context, 16)
    assert proposal.tokens.tolist() == run[20:36].tolist()
    assert proposal.confidence is not None and (proposal.confidence == 1.0).all()
    short = np.concatenate([run, ids(7, 8), run[:2]])  # a 2-token match: at most 2 tokens
    assert d.propose(short, 16).tokens.tolist() == run[2:4].tolist()
    assert d.source(short) == "lookup2"


def test_nothing_is_proposed_where_nothing_matches() -> None:
    d = drafter()
    context = np.arange(10, 60)
    assert d.source(context) == "none"
    assert d.propose(context, 8).tokens.size == 0


def test_the_continuation_seen_most_often_is_followed_while_it_is_likely() -> None:
    """After [5, 6]: 7 follows three times, 9 once; after [5, 6, 7]: 1 then 2 twice, 3 once."""
    index = TokenIndex()
    corpus = ids(5, 6, 7, 1, 2, 0, 5, 6, 7, 1, 2, 0, 5, 6, 7, 3, 0, 5, 6, 9)
    index.extend(corpus)
    ends, matched = index.longest_match(ids(5, 6), index.size)
    assert matched == 2 and ends.tolist() == [1, 7, 13, 18]
    tokens, probs = follow(index, ends, matched, np.zeros(0, np.int64))
    assert tokens.tolist() == [7, 1] and probs.tolist() == pytest.approx([0.75, 0.5])
    # the most recent continuation wins a tie
    tie = TokenIndex()
    tie.extend(ids(5, 6, 1, 0, 5, 6, 2, 0))
    ends, matched = tie.longest_match(ids(5, 6), tie.size)
    assert follow(tie, ends, matched, np.zeros(0, np.int64))[0].tolist() == [2, 0]
    # below MIN_PROBABILITY (0.1) it stops: ten continuations, none twice
    spread = TokenIndex()
    spread.extend(np.concatenate([ids(5, 6, 100 + i) for i in range(10)]))
    ends, matched = spread.longest_match(ids(5, 6), spread.size)
    assert follow(spread, ends, matched, np.zeros(0, np.int64))[0].tolist() == [109]
    spread.extend(ids(5, 6, 200))  # an eleventh: each has less than 0.1
    ends, matched = spread.longest_match(ids(5, 6), spread.size)
    assert follow(spread, ends, matched, np.zeros(0, np.int64))[0].size == 0


def test_only_the_most_recent_occurrences_are_read() -> None:
    index = TokenIndex()
    index.extend(np.tile(ids(5, 6, 7), 400))
    ends, _ = index.longest_match(ids(5, 6), index.size)
    assert ends.shape[0] == MAX_OCCURRENCES and int(ends[-1]) == index.size - 2


def test_a_proposal_stops_after_an_end_token() -> None:
    context = ids(1, 2, 3, 4, 1, 5, 6, 9, 9, 1, 2, 3, 4, 1)
    assert drafter(eos=(5,)).propose(context, 8).tokens.tolist() == [5]
    assert drafter().propose(context, 8).tokens.tolist() == [5, 6, 9, 9, 1]


def test_a_scope_drafts_from_its_own_earlier_outputs_only() -> None:
    history = SuffixHistory()
    output = np.arange(500, 540)
    first = SuffixDrafter(history)
    first.start(ids(1, 2, 3), request("alice"))
    first.finish(output)
    prompt_again = ids(1, 2, 3)
    for scope, want in (("alice", output[:3].tolist()), ("bob", []), (None, [])):
        again = SuffixDrafter(history)
        again.start(prompt_again, request(scope))
        assert again.propose(prompt_again, 3).tokens.tolist() == want
    # a generation without a scope leaves nothing
    anonymous = SuffixDrafter(history)
    anonymous.start(ids(4), request(None))
    anonymous.finish(np.arange(600, 650))
    assert history.index("") is None and history.tokens == 3 + 40


def test_the_history_keeps_within_its_bounds() -> None:
    history = SuffixHistory(HistoryBounds(tokens_per_scope=100, tokens=250))
    for i in range(30):
        history.add(f"scope{i % 5}", np.arange(i * 100, i * 100 + 30))
    assert history.tokens <= 250
    for scope in ("scope0", "scope4"):
        index = history.index(scope)
        if index is not None:
            assert index.size <= 100 + 10  # 100 tokens and a separator per document
    newest = history.index("scope4")
    assert newest is not None and int(newest.tokens[newest.size - 2]) == 29 * 100 + 29


def test_match_lengths_are_learned_in_buckets() -> None:
    assert [match_source(n) for n in (1, 2, 3, 4, 7, 8, 15, 16, 64)] == [
        "lookup1",
        "lookup2",
        "lookup3",
        "lookup4",
        "lookup4",
        "lookup8",
        "lookup8",
        "lookup16",
        "lookup16",
    ]


@needs_exporter
def test_a_repeated_request_is_drafted_almost_entirely_from_history(
    llama_pair: TinyPair,
) -> None:
    pipe = Pipeline.load(llama_pair.artifact)
    prompt = np.random.default_rng(0).integers(3, 300, size=20)
    first = pipe.generate(prompt, max_new_tokens=64, k=16, drafter="suffix")
    again = pipe.generate(prompt, max_new_tokens=64, k=16, drafter="suffix")
    assert (
        again.token_ids
        == first.token_ids
        == pipe.generate(prompt, max_new_tokens=64, k=0).token_ids
    )
    assert again.stats.acceptance_rate == 1.0
    assert again.stats.target_passes <= 5  # 64 tokens at up to 17 a pass
    assert again.stats.tokens_per_pass > 12
    other = pipe.generate(prompt, max_new_tokens=64, k=16, drafter="suffix", cache_scope="b")
    assert other.stats.target_passes > 3 * again.stats.target_passes


@needs_exporter
@pytest.mark.parametrize("drafter_name", ["suffix", "suffix+mixed", "suffix+other"])
@pytest.mark.parametrize("k", [1, 4, "auto"])
def test_suffix_drafting_keeps_the_target_s_greedy_output(
    llama_pair: TinyPair, drafter_name: str, k: int | str
) -> None:
    pipe = Pipeline.load(llama_pair.artifact)
    rng = np.random.default_rng(3)
    for length in (1, 12):
        prompt = rng.integers(3, 300, size=length)
        want = pipe.generate(prompt, max_new_tokens=40, k=0).token_ids
        for _ in range(2):  # the second time with the first's output in the history
            got = pipe.generate(prompt, max_new_tokens=40, k=k, drafter=drafter_name)
            assert got.token_ids == want


@needs_exporter
def test_a_request_that_matches_nothing_verifies_no_draft(llama_pair: TinyPair) -> None:
    """No match, no proposal: every pass is a one-token pass, as with -k 0."""
    pipe = Pipeline.load(llama_pair.artifact)
    prompt = np.arange(3, 40)
    alone = pipe.generate(prompt, max_new_tokens=3, k=0)
    got = pipe.generate(prompt, max_new_tokens=3, k=8, drafter="suffix", cache_scope="new")
    assert got.token_ids == alone.token_ids
    assert got.stats.proposed == 0 and got.stats.target_passes == alone.stats.target_passes
