"""Speculative sampling is lossless: proven by statistics on a small vocabulary, no model.

A toy "language model" is a next-token table (Markov chain) over V tokens, one for the target and
one for the draft. Speculative steps run with the real `warp`, `sample` and `verify_stochastic`
until two tokens are emitted; the observed distribution of the first token, and of the
(first, second) pair, is tested against the exactly computed distribution of the warped target
chain with a chi-square test at significance ALPHA. Seeds are fixed, so the tests cannot flake;
a deliberately wrong verifier (accept every draft token) must fail the same test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from specx.runtime.errors import InputError
from specx.runtime.sampling import SamplingParams, sample, warp
from specx.runtime.verify import verify_stochastic
from stats_tools import chi_square_p_value, joint_of_pairs

ALPHA = 1e-3  # significance of each test
SAMPLES = 12_000
VOCAB = 8
START = 0

Verifier = Callable[[np.ndarray, Any, np.ndarray, np.random.Generator], tuple[int, int]]


def accept_everything(
    draft_tokens: np.ndarray, p_draft: Any, p_target: np.ndarray, rng: np.random.Generator
) -> tuple[int, int]:
    """The negative control: a broken verifier that trusts the draft."""
    k = int(draft_tokens.shape[0])
    return k, sample(p_target[k], rng)


def resample_from_target_on_rejection(
    draft_tokens: np.ndarray, p_draft: Any, p_target: np.ndarray, rng: np.random.Generator
) -> tuple[int, int]:
    """The classic bug: after a rejection, draw from p_target instead of the residual."""
    for i, x in enumerate(draft_tokens.tolist()):
        if rng.random() * p_draft[i, x] >= p_target[i, x]:
            return i, sample(p_target[i], rng)
    return len(draft_tokens), sample(p_target[-1], rng)


def tables(seed: int, vocab: int = VOCAB) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    target_logits = rng.normal(0.0, 1.5, size=(vocab, vocab))  # [prev, next]
    draft_logits = target_logits + rng.normal(0.0, 1.0, size=(vocab, vocab))  # related, not equal
    return target_logits, draft_logits


def emit_two(
    p_target: np.ndarray,
    p_draft: np.ndarray,
    k: int,
    rng: np.random.Generator,
    verifier: Verifier = verify_stochastic,
    drafter: str = "sampled",
) -> tuple[int, int]:
    """Run speculative steps from START until two tokens are emitted; return them."""
    context = [START]
    out: list[int] = []
    while len(out) < 2:
        prev = context[-1]
        tokens, rows = [], []
        for _ in range(k):
            row = p_draft[prev]  # [vocab]
            if drafter == "sampled":
                token = sample(row, rng)
            elif drafter == "argmax":
                token = int(np.argmax(row))  # deterministic: no probabilities given
            else:  # "off-support": proposes a token its own distribution excludes
                token = int(np.argmin(row))
            tokens.append(token)
            rows.append(row)
            prev = token
        p_target_rows = p_target[[context[-1], *tokens]]  # [k + 1, vocab]
        given = np.stack(rows) if drafter != "argmax" else None
        n, nxt = verifier(np.asarray(tokens), given, p_target_rows, rng)
        new = [*tokens[:n], nxt]
        out += new
        context += new
    return out[0], out[1]


def p_values(
    params: SamplingParams,
    k: int,
    seed: int,
    verifier: Verifier = verify_stochastic,
    drafter: str = "sampled",
    draft_params: SamplingParams | None = None,
) -> tuple[float, float]:
    target_logits, draft_logits = tables(seed)
    p_target = warp(target_logits, params)  # [vocab, vocab], rows are contexts
    p_draft = warp(draft_logits, draft_params or params)
    rng = np.random.default_rng(seed + 1000)
    pairs = [emit_two(p_target, p_draft, k, rng, verifier, drafter) for _ in range(SAMPLES)]
    first_expected = {a: float(p_target[START, a]) for a in range(VOCAB)}
    p_first = chi_square_p_value([a for a, _ in pairs], first_expected)
    p_pair = chi_square_p_value(pairs, joint_of_pairs(p_target[START], p_target))
    return p_first, p_pair


SETTINGS = {
    "temperature 1": SamplingParams(temperature=1.0),
    "temperature 0.7": SamplingParams(temperature=0.7),
    "top-k 3": SamplingParams(temperature=1.0, top_k=3),
    "top-p 0.8": SamplingParams(temperature=1.0, top_p=0.8),
    "min-p 0.2": SamplingParams(temperature=1.0, min_p=0.2),
    "temperature 0.8, top-k 5, top-p 0.9": SamplingParams(temperature=0.8, top_k=5, top_p=0.9),
    "top-k 1": SamplingParams(temperature=1.0, top_k=1),
    "top-p keeps one token": SamplingParams(temperature=1.0, top_p=1e-6),
    "temperature 0.01": SamplingParams(temperature=0.01),
}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_speculative_sampling_emits_the_target_distribution(name: str) -> None:
    params = SETTINGS[name]
    seed = list(SETTINGS).index(name)
    p_first, p_pair = p_values(params, k=3, seed=seed)
    assert p_first > ALPHA and p_pair > ALPHA, (p_first, p_pair)


@pytest.mark.parametrize("k", [1, 2, 5])
def test_the_distribution_holds_for_every_k(k: int) -> None:
    p_first, p_pair = p_values(SamplingParams(temperature=1.0), k=k, seed=40 + k)
    assert p_first > ALPHA and p_pair > ALPHA, (p_first, p_pair)


def test_a_deterministic_drafter_counts_as_a_point_mass_and_stays_exact() -> None:
    p_first, p_pair = p_values(SamplingParams(temperature=0.9), k=3, seed=50, drafter="argmax")
    assert p_first > ALPHA and p_pair > ALPHA, (p_first, p_pair)


def test_a_proposal_the_draft_gives_zero_probability_is_rejected_and_stays_exact() -> None:
    # top-k 4 on the draft leaves zeros; the drafter proposes exactly such tokens.
    p_first, p_pair = p_values(
        SamplingParams(temperature=1.0),
        k=2,
        seed=60,
        drafter="off-support",
        draft_params=SamplingParams(temperature=1.0, top_k=4),
    )
    assert p_first > ALPHA and p_pair > ALPHA, (p_first, p_pair)


@pytest.mark.parametrize("broken", [accept_everything, resample_from_target_on_rejection])
def test_the_negative_controls_broken_verifiers_are_caught(broken: Verifier) -> None:
    p_first, p_pair = p_values(SamplingParams(temperature=1.0), k=3, seed=70, verifier=broken)
    assert p_first < 1e-6 and p_pair < 1e-6, (p_first, p_pair)


def test_a_numerically_zero_residual_falls_back_to_the_target_row() -> None:
    p_target = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    p_draft = np.array([[0.5 + 1e-14, 0.5 - 1e-14, 0.0]])  # p_target <= p_draft + eps everywhere

    class AlmostOne:
        def random(self) -> float:
            return 1.0 - 1e-15  # forces the (numerically possible) rejection of token 0

    n, token = verify_stochastic(np.array([0]), p_draft, p_target, AlmostOne())  # type: ignore[arg-type]
    assert n == 0 and token in (0, 1)


def test_warp_matches_transformers_logits_processors() -> None:
    torch = pytest.importorskip("torch")
    from transformers import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    logits = np.random.default_rng(1).normal(0, 2, size=(4, 50))
    params = SamplingParams(temperature=0.7, top_k=20, top_p=0.85, min_p=0.05)
    scores = torch.from_numpy(logits)
    for processor in (
        TemperatureLogitsWarper(0.7),
        TopKLogitsWarper(20),
        TopPLogitsWarper(0.85),
        MinPLogitsWarper(0.05),
    ):
        scores = processor(None, scores)
    want = torch.softmax(scores, dim=-1).numpy()
    np.testing.assert_allclose(warp(logits, params), want, atol=1e-12)


def test_greedy_params_warp_to_a_one_hot_argmax() -> None:
    probs = warp(np.array([[0.1, 3.0, 3.0, -1.0]]), SamplingParams())
    np.testing.assert_array_equal(probs, [[0.0, 1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -0.5}, "temperature must be >= 0"),
        ({"temperature": float("nan")}, "temperature must be >= 0"),
        ({"top_p": 0.0}, r"top-p must be in \(0, 1\]"),
        ({"top_p": 1.5}, r"top-p must be in \(0, 1\]"),
        ({"top_k": -1}, "top-k must be >= 0"),
        ({"min_p": 1.0}, r"min-p must be in \[0, 1\)"),
    ],
)
def test_invalid_sampling_values_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(InputError, match=message):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_sample_never_returns_a_zero_probability_index() -> None:
    rng = np.random.default_rng(0)
    probs = np.array([0.0, 0.3, 0.0, 0.7, 0.0])
    drawn = {sample(probs, rng) for _ in range(2000)}
    assert drawn == {1, 3}
