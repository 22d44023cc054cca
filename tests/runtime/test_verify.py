"""Greedy verification and the step bookkeeping, without any model."""

from __future__ import annotations

import numpy as np

from specx.runtime.verification.verify import residual_distribution, verify_greedy


def logits_for(choices: list[int], vocab: int = 10) -> np.ndarray:
    rows = np.zeros((len(choices), vocab), dtype=np.float32)
    for i, c in enumerate(choices):
        rows[i, c] = 5.0
    return rows  # [k + 1, vocab]


def test_all_draft_tokens_accepted_gives_the_bonus_token_from_the_last_row() -> None:
    n, nxt = verify_greedy(np.array([3, 4, 5]), logits_for([3, 4, 5, 9]))
    assert (n, nxt) == (3, 9)


def test_first_mismatch_stops_acceptance_and_the_target_token_replaces_it() -> None:
    n, nxt = verify_greedy(np.array([3, 7, 5]), logits_for([3, 4, 5, 9]))
    assert (n, nxt) == (1, 4)


def test_a_wrong_first_token_accepts_nothing() -> None:
    n, nxt = verify_greedy(np.array([1, 4]), logits_for([2, 4, 6]))
    assert (n, nxt) == (0, 2)


def test_later_matches_after_a_mismatch_do_not_count() -> None:
    n, nxt = verify_greedy(np.array([0, 4, 5]), logits_for([3, 4, 5, 9]))
    assert (n, nxt) == (0, 3)


def test_an_empty_proposal_is_plain_greedy_decoding() -> None:
    n, nxt = verify_greedy(np.zeros(0, np.int64), logits_for([6]))
    assert (n, nxt) == (0, 6)


def test_ties_resolve_to_the_lowest_token_id_like_argmax() -> None:
    rows = np.zeros((2, 5), dtype=np.float32)
    rows[0, [1, 3]] = 2.0
    assert verify_greedy(np.array([3]), rows) == (0, 1)


def test_the_residual_is_the_normalized_positive_part_and_none_when_empty() -> None:
    p_target = np.array([0.5, 0.3, 0.2])
    p_draft = np.array([0.2, 0.6, 0.2])
    np.testing.assert_allclose(residual_distribution(p_target, p_draft), [1.0, 0.0, 0.0])
    assert residual_distribution(p_target, p_target.copy()) is None
