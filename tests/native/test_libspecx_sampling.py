"""Sampling through libspecx: its counter-based random numbers are the Python runtime's, a seed
gives the Python runtime's text (drafter-invariant verification: for every K, K auto and every
drafter; rejection: for a fixed K and drafter), and the first two sampled tokens follow the
target's own distribution (chi-square), with a negative control that the same test rejects."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from libspecx_tools import K_AUTO, Library, library_path

from conftest import TinyPair, needs_exporter
from specx.runtime import Pipeline, SamplingParams
from specx.runtime.verification.sampling import counter_key, counter_uniforms
from stats_tools import STOP, chi_square_p_value, exact_first_two

pytestmark = needs_exporter
ALPHA = 1e-3
SAMPLES = 2500
PROMPT = [0, 5, 9, 4]


@pytest.fixture(scope="module")
def lib() -> Library:
    if not library_path().is_file():
        pytest.skip("libspecx is not built (scripts/build_libspecx.sh)")
    return Library()


@pytest.mark.parametrize(
    ("seed", "stream", "position"), [(0, 0, 0), (1, 3, 7), (2**64 - 1, 2, 123456), (42, 0, 2**40)]
)
def test_the_counter_generator_draws_the_python_runtimes_numbers(
    lib: Library, seed: int, stream: int, position: int
) -> None:
    want = counter_uniforms(counter_key(seed, stream, position), 64)
    got = [lib.lib.specx_counter_uniform(seed, stream, position, i) for i in range(64)]
    assert got == want.tolist()


SETTINGS = [
    {"temperature": 1.0},
    {"temperature": 0.8, "top_k": 50, "top_p": 0.9, "min_p": 0.05},
]


@pytest.mark.parametrize("params", SETTINGS, ids=["temperature 1", "top-k top-p min-p"])
def test_a_seed_gives_the_python_runtimes_text_under_invariant_verification(
    lib: Library, llama_pair: Any, params: dict[str, Any]
) -> None:
    model = lib.load(llama_pair.artifact)
    pipeline = Pipeline.load(llama_pair.artifact)
    prompt = np.random.default_rng(2).integers(0, model.vocab_size, size=12).tolist()
    for seed in (1, 2):
        texts = set()
        for name in model.drafters:
            for k in [0] if name == "none" else [1, 4, K_AUTO]:
                got = model.generate(prompt, 30, k, name, seed=seed, **params).tokens
                py_k = "auto" if k == K_AUTO else k
                want = pipeline.generate(
                    prompt, k=py_k, drafter=name, max_new_tokens=30, seed=seed, **params
                ).token_ids
                assert got == want, f"{name}, K={py_k}, seed {seed}"
                texts.add(tuple(got))
        assert len(texts) == 1  # the same text for every K and drafter
    model.close()


@pytest.mark.parametrize("params", SETTINGS, ids=["temperature 1", "top-k top-p min-p"])
def test_a_seed_gives_the_python_runtimes_text_under_rejection_sampling(
    lib: Library, llama_pair: Any, params: dict[str, Any]
) -> None:
    model = lib.load(llama_pair.artifact)
    pipeline = Pipeline.load(llama_pair.artifact)
    prompt = np.random.default_rng(3).integers(0, model.vocab_size, size=12).tolist()
    for name in model.drafters:
        for k in [0] if name == "none" else [1, 4]:
            for seed in (1, 2):
                got = model.generate(
                    prompt, 30, k, name, seed=seed, verification="rejection", **params
                ).tokens
                want = pipeline.generate(
                    prompt,
                    k=k,
                    drafter=name,
                    max_new_tokens=30,
                    seed=seed,
                    verification="rejection",
                    **params,
                ).token_ids
                assert got == want, f"{name}, K={k}, seed {seed}"
    model.close()


def sampled_pairs(lib: Library, pair: TinyPair, k: int, verification: str) -> list[Any]:
    model = lib.load(pair.artifact)
    eos = Pipeline.load(pair.artifact).manifest.special_tokens.eos_token_ids[0]
    drafter = None if k else "none"
    pairs = []
    for seed in range(SAMPLES):
        ids = model.generate(PROMPT, 6, k, drafter, 1.0, seed=seed, verification=verification)
        first = ids.tokens[0]
        pairs.append((first, STOP if first == eos else ids.tokens[1]))
    model.close()
    return pairs


@pytest.mark.parametrize(
    ("k", "verification"),
    [(0, "invariant"), (1, "invariant"), (4, "invariant"), (K_AUTO, "invariant"), (1, "rejection")],
)
def test_the_first_two_tokens_sampled_through_c_follow_the_targets_distribution(
    lib: Library, small_vocab_pair: TinyPair, k: int, verification: str
) -> None:
    eos = Pipeline.load(small_vocab_pair.artifact).manifest.special_tokens.eos_token_ids[0]
    expected = exact_first_two(
        small_vocab_pair.target, PROMPT, SamplingParams(temperature=1.0), eos
    )
    assert sum(1 for p in expected.values() if p * SAMPLES >= 5) >= 10  # a meaningful test
    pairs = sampled_pairs(lib, small_vocab_pair, k, verification)
    assert chi_square_p_value(pairs, expected) > ALPHA


def test_the_negative_control_the_same_test_rejects_another_distribution(
    lib: Library, small_vocab_pair: TinyPair
) -> None:
    """Sampled at temperature 1, compared with the target's distribution at temperature 0.6:
    the chi-square test must see the difference."""
    eos = Pipeline.load(small_vocab_pair.artifact).manifest.special_tokens.eos_token_ids[0]
    other = exact_first_two(small_vocab_pair.target, PROMPT, SamplingParams(temperature=0.6), eos)
    pairs = sampled_pairs(lib, small_vocab_pair, 4, "invariant")
    assert chi_square_p_value(pairs, other) < 1e-6
