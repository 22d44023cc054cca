"""End to end with exported models: speculative sampling follows the target's distribution.

Tiny target and draft over 12 tokens. The exact distribution of the first two generated tokens is
computed from the source model (12 + 1 forward passes); target-alone sampling and speculative
sampling with K in {1, 4, auto}, under both verifications (invariant, rejection), are each tested
against it (chi-square, significance ALPHA, fixed seeds), and broken verifiers must fail the same
test. Temperature 0 stays greedy-exact. (Seeds and the same text for every K: test_seeds.py.)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from conftest import TinyPair, needs_exporter
from specx.runtime import Pipeline, SamplingParams
from specx.runtime.verification.sampling import sample
from stats_tools import (
    accept_everything_invariant,
    chi_square_p_value,
    exact_first_two,
    sampled_first_two,
)

pytestmark = needs_exporter

ALPHA = 1e-3
SAMPLES = 2500
PROMPT = np.array([0, 5, 9, 4], dtype=np.int64)


def sampled_pairs(pipe: Pipeline, params: SamplingParams, k: int | str, eos: int) -> list[Any]:
    return sampled_first_two(pipe, PROMPT, params, k, eos, SAMPLES, max_new_tokens=6)


CASES = [
    pytest.param(0, "invariant", id="target alone"),
    *(
        pytest.param(k, verification, id=f"K={k} {verification}")
        for verification in ("invariant", "rejection")
        for k in (1, 4, "auto")
    ),
]


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=6, top_p=0.9)],
    ids=["temperature 1", "temperature 0.8 top-k 6 top-p 0.9"],
)
# "auto": the pipeline carries the policy between generations, so after the first one the draft
# is cut token by token by its confidence (AdaptiveK.plan); the output must not notice
@pytest.mark.parametrize(("k", "verification"), CASES)
def test_first_two_tokens_follow_the_targets_distribution(
    small_vocab_pair: TinyPair,
    params: SamplingParams,
    k: int | str,
    verification: str,
    cheap_drafts: None,
) -> None:
    params = dataclasses.replace(params, verification=verification)
    pipe = Pipeline.load(small_vocab_pair.artifact)
    eos = pipe.manifest.special_tokens.eos_token_ids[0]
    expected = exact_first_two(small_vocab_pair.target, PROMPT, params, eos)
    assert sum(1 for p in expected.values() if p * SAMPLES >= 5) >= 10  # a meaningful test
    pairs = sampled_pairs(pipe, params, k, eos)
    first = {}
    for (a, _b), p in expected.items():
        first[a] = first.get(a, 0.0) + p
    assert chi_square_p_value([a for a, _ in pairs], first) > ALPHA
    assert chi_square_p_value(pairs, expected) > ALPHA
    if k == "auto":  # the confidence plan really cut proposals here
        policy = pipe.learned_policy(pipe.default_drafter)
        assert policy is not None and any(e.confidence_seen for e in policy.sources.values())


def test_the_draft_is_neither_always_right_nor_always_wrong(small_vocab_pair: TinyPair) -> None:
    pipe = Pipeline.load(small_vocab_pair.artifact)
    stats = pipe.generate(PROMPT, max_new_tokens=40, k=4, temperature=1.0, seed=3).stats
    assert 0.1 < stats.acceptance_rate < 0.95


def test_temperature_zero_is_the_exact_greedy_path(small_vocab_pair: TinyPair) -> None:
    pipe = Pipeline.load(small_vocab_pair.artifact)
    greedy = pipe.generate(PROMPT, max_new_tokens=30, k=0).token_ids
    spec = pipe.generate(PROMPT, max_new_tokens=30, k=4, temperature=0.0, seed=1).token_ids
    assert spec == greedy


def accept_everything_rejection(
    draft: np.ndarray, p_draft: Any, p_target: Any, ua: Any, us: Any
) -> tuple[int, int]:
    k = len(draft)
    return k, sample(p_target[k], float(us[k]))


@pytest.mark.parametrize(
    ("verification", "broken"),
    [
        ("invariant", accept_everything_invariant),
        ("rejection", accept_everything_rejection),
    ],
)
def test_the_same_test_catches_a_broken_verifier_end_to_end(
    small_vocab_pair: TinyPair, monkeypatch: pytest.MonkeyPatch, verification: str, broken: Any
) -> None:
    import specx.runtime.verification.verifier as generate

    monkeypatch.setattr(generate, f"verify_{verification}", broken)
    pipe = Pipeline.load(small_vocab_pair.artifact)
    params = SamplingParams(temperature=1.0, verification=verification)
    eos = pipe.manifest.special_tokens.eos_token_ids[0]
    expected = exact_first_two(small_vocab_pair.target, PROMPT, params, eos)
    assert chi_square_p_value(sampled_pairs(pipe, params, 4, eos), expected) < 1e-6
