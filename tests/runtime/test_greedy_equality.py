"""Greedy speculative output equals the target's own greedy output, token for token.

The reference is transformers' `generate(do_sample=False)` on the source model. A verify pass over
K + 1 tokens multiplies other matrix shapes than a one-token pass, so two exact implementations
may still part at a floating-point near-tie of the target's two best logits; where the outputs
differ, the test demands that the first difference is such a tie (gap below TIE_MARGIN) and fails
otherwise. The tiny models are built with peaked logits so that ties are rare.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import TinyPair, needs_exporter
from reference import assert_same_or_near_tie, hf_greedy
from specx.runtime import Pipeline

pytestmark = needs_exporter


def prompt_ids(rng: np.random.Generator, length: int, vocab: int) -> np.ndarray:
    return rng.integers(3, vocab, size=length).astype(np.int64)  # avoid special ids 0..2


@pytest.mark.parametrize("drafter", ["self", "other", "mixed"])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_speculative_greedy_matches_transformers_generate_for_llama(
    llama_pair: TinyPair, drafter: str, k: int
) -> None:
    pipe = Pipeline.load(llama_pair.artifact)
    eos = pipe.manifest.special_tokens.eos_token_ids
    rng = np.random.default_rng(k)
    for length in (1, 7):
        prompt = prompt_ids(rng, length, 300)
        want = hf_greedy(llama_pair.target, prompt, 48, eos)
        result = pipe.generate(prompt, max_new_tokens=48, k=k, drafter=drafter)
        assert_same_or_near_tie(llama_pair.target, prompt, result.token_ids, want)


def test_drafters_span_always_never_and_sometimes_accepted(llama_pair: TinyPair) -> None:
    pipe = Pipeline.load(llama_pair.artifact)
    prompt = prompt_ids(np.random.default_rng(0), 5, 300)
    rates = {
        name: pipe.generate(prompt, max_new_tokens=60, k=4, drafter=name).stats.acceptance_rate
        for name in ("self", "other", "mixed")
    }
    assert rates["self"] == 1.0
    assert rates["other"] < 0.2
    assert 0.2 < rates["mixed"] < 1.0


@pytest.mark.parametrize(
    "pair_name",
    ["gpt2_pair", "gpt2_gqa_pair", "qwen2_padded_pair", "mistral_pair", "llama_plain_pair"],
)
@pytest.mark.parametrize("k", [1, 4])
def test_speculative_greedy_matches_transformers_generate_for_other_architectures(
    request: pytest.FixtureRequest, pair_name: str, k: int
) -> None:
    pair: TinyPair = request.getfixturevalue(pair_name)
    pipe = Pipeline.load(pair.artifact)
    eos = pipe.manifest.special_tokens.eos_token_ids
    rng = np.random.default_rng(10 + k)
    for drafter in ("mixed", "other", "self"):
        prompt = prompt_ids(rng, 6, 300)
        want = hf_greedy(pair.target, prompt, 40, eos)
        result = pipe.generate(prompt, max_new_tokens=40, k=k, drafter=drafter)
        assert_same_or_near_tie(pair.target, prompt, result.token_ids, want)


def test_target_alone_matches_transformers_generate(gpt2_pair: TinyPair) -> None:
    pipe = Pipeline.load(gpt2_pair.artifact)
    eos = pipe.manifest.special_tokens.eos_token_ids
    prompt = prompt_ids(np.random.default_rng(3), 4, 300)
    result = pipe.generate(prompt, max_new_tokens=50, k=0)
    assert result.stats.target_passes == len(result.token_ids)
    assert_same_or_near_tie(
        gpt2_pair.target, prompt, result.token_ids, hf_greedy(gpt2_pair.target, prompt, 50, eos)
    )


@pytest.mark.parametrize("k", [1, 4, 8])
def test_prompt_near_the_cache_limit_generates_to_the_limit_and_stays_exact(
    llama_pair: TinyPair, k: int
) -> None:
    pipe = Pipeline.load(llama_pair.artifact)
    limit = pipe.manifest.max_length
    eos = pipe.manifest.special_tokens.eos_token_ids
    prompt = prompt_ids(np.random.default_rng(100 + k), limit - 6, 300)
    result = pipe.generate(prompt, max_new_tokens=100, k=k, drafter="mixed")
    want = hf_greedy(llama_pair.target, prompt, len(result.token_ids), eos)
    assert_same_or_near_tie(llama_pair.target, prompt, result.token_ids, want)
    if result.stats.stop_reason != "eos":
        assert result.stats.stop_reason == "max_length"
        # every position of the cache was used: the last token comes from position limit - 1
        assert len(prompt) + len(result.token_ids) == limit + 1


def test_a_prompt_that_fills_the_whole_cache_still_yields_one_token(llama_pair: TinyPair) -> None:
    pipe = Pipeline.load(llama_pair.artifact)
    limit = pipe.manifest.max_length
    prompt = prompt_ids(np.random.default_rng(5), limit, 300)
    result = pipe.generate(prompt, max_new_tokens=10, k=4, drafter="mixed")
    assert len(result.token_ids) == 1
    assert result.stats.stop_reason in ("max_length", "eos")


def test_streamed_text_concatenates_to_the_decoded_tokens(llama_pair: TinyPair) -> None:
    pipe = Pipeline.load(llama_pair.artifact)
    generation = pipe.stream("The cat is", max_new_tokens=40, k=3, drafter="mixed")
    pieces = list(generation)
    result = generation.result
    assert "".join(pieces) == result.text == pipe.codec.decode(result.token_ids)
    assert result.finished
