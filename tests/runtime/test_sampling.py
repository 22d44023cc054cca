"""Speculative sampling is lossless: proven by statistics on a small vocabulary, no model.

A toy "language model" is a next-token table (Markov chain) over V tokens, one for the target and
one for the draft. Speculative steps run with the real `warp`, `sample`, `race` and verifiers
(rejection and drafter-invariant), with random numbers keyed by position as the runtime keys
them, until two tokens are emitted; the observed distribution of the first token, and of the
(first, second) pair, is tested against the exactly computed distribution of the warped target
chain with a chi-square test at significance ALPHA. Seeds are fixed, so the tests cannot flake;
deliberately wrong verifiers must fail the same test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from specx.runtime.errors import InputError
from specx.runtime.verification.sampling import SamplingParams, race, sample, warp
from specx.runtime.verification.verify import verify_invariant, verify_rejection
from stats_tools import chi_square_p_value, joint_of_pairs

ALPHA = 1e-3  # significance of each test
SAMPLES = 12_000
VOCAB = 8
START = 0


@dataclass
class Draws:
    """A generation's random numbers, drawn once per position (as
    runtime/verification/sampling.py keys them): whoever asks for a position's draw gets the
    same one."""

    rng: np.random.Generator
    by_position: dict[int, tuple[np.ndarray, float, float, float]] = field(default_factory=dict)

    def at(self, position: int) -> tuple[np.ndarray, float, float, float]:
        """(exponentials [vocab], u_draft, u_accept, u_sample) of a position."""
        if position not in self.by_position:
            r = self.rng
            self.by_position[position] = (
                r.standard_exponential(VOCAB),
                r.random(),
                r.random(),
                r.random(),
            )
        return self.by_position[position]

    def rows(self, position: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For rows deciding positions position .. position + n - 1: exponentials [n, vocab],
        u_accept [n], u_sample [n]."""
        got = [self.at(position + i) for i in range(n)]
        return (
            np.stack([g[0] for g in got]),
            np.array([g[2] for g in got]),
            np.array([g[3] for g in got]),
        )


# (draft tokens, p_draft or None, p_target rows, exponentials, u_accept, u_sample) -> verdict
Verifier = Callable[
    [np.ndarray, Any, np.ndarray, np.ndarray, np.ndarray, np.ndarray], tuple[int, int]
]


def rejection(
    draft: np.ndarray, p_draft: Any, p_target: np.ndarray, e: Any, ua: Any, us: Any
) -> tuple[int, int]:
    return verify_rejection(draft, p_draft, p_target, ua[: len(draft)], us)


def invariant(
    draft: np.ndarray, p_draft: Any, p_target: np.ndarray, e: Any, ua: Any, us: Any
) -> tuple[int, int]:
    return verify_invariant(draft, p_target, e)


def accept_everything(
    draft: np.ndarray, p_draft: Any, p_target: np.ndarray, e: Any, ua: Any, us: Any
) -> tuple[int, int]:
    """The negative control: a broken verifier that trusts the draft."""
    k = int(draft.shape[0])
    return k, sample(p_target[k], float(us[k]))


def resample_from_target_on_rejection(
    draft: np.ndarray, p_draft: Any, p_target: np.ndarray, e: Any, ua: Any, us: Any
) -> tuple[int, int]:
    """The classic bug: after a rejection, draw from p_target instead of the residual."""
    for i, x in enumerate(draft.tolist()):
        if ua[i] * p_draft[i, x] >= p_target[i, x]:
            return i, sample(p_target[i], float(us[i]))
    return len(draft), sample(p_target[-1], float(us[-1]))


def tables(seed: int, vocab: int = VOCAB) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    target_logits = rng.normal(0.0, 1.5, size=(vocab, vocab))  # [prev, next]
    draft_logits = target_logits + rng.normal(0.0, 1.0, size=(vocab, vocab))  # related, not equal
    return target_logits, draft_logits


def draft_token(row: np.ndarray, drafter: str, position: int, draws: Draws) -> int:
    exponentials, u_draft, _, _ = draws.at(position)
    if drafter == "sampled":  # the rejection scheme's draft: its own keyed draw
        return sample(row, u_draft)
    if drafter == "raced":  # the invariant scheme's draft: the position's race
        return int(race(row, exponentials))
    if drafter == "argmax":  # deterministic: no probabilities given
        return int(np.argmax(row))
    return int(np.argmin(row))  # "off-support": a token its own distribution excludes


def emit(
    p_target: np.ndarray,
    p_draft: np.ndarray,
    k: int,
    draws: Draws,
    verifier: Verifier,
    drafter: str,
    count: int = 2,
) -> list[int]:
    """Run speculative steps from START until `count` tokens are emitted; return them."""
    context = [START]
    out: list[int] = []
    while len(out) < count:
        position = len(context)  # the position the first draft token (and row 0) decides
        prev = context[-1]
        tokens, rows = [], []
        for i in range(k):
            row = p_draft[prev]  # [vocab]
            token = draft_token(row, drafter, position + i, draws)
            tokens.append(token)
            rows.append(row)
            prev = token
        p_target_rows = p_target[[context[-1], *tokens]]  # [k + 1, vocab]
        given = np.stack(rows) if drafter not in ("argmax", "raced") else None
        exponentials, u_accept, u_sample = draws.rows(position, k + 1)
        draft = np.asarray(tokens, dtype=np.int64)
        n, nxt = verifier(draft, given, p_target_rows, exponentials, u_accept, u_sample)
        new = [*tokens[:n], nxt]
        out += new
        context += new
    return out[:count]


SCHEMES = {"rejection": (rejection, "sampled"), "invariant": (invariant, "raced")}


def p_values(
    params: SamplingParams,
    k: int,
    seed: int,
    scheme: str = "rejection",
    verifier: Verifier | None = None,
    drafter: str | None = None,
    draft_params: SamplingParams | None = None,
) -> tuple[float, float]:
    target_logits, draft_logits = tables(seed)
    p_target = warp(target_logits, params)  # [vocab, vocab], rows are contexts
    p_draft = warp(draft_logits, draft_params or params)
    rng = np.random.default_rng(seed + 1000)
    check, default_drafter = SCHEMES[scheme]
    verify, draft = verifier or check, drafter or default_drafter
    pairs = [tuple(emit(p_target, p_draft, k, Draws(rng), verify, draft)) for _ in range(SAMPLES)]
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


@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("name", list(SETTINGS))
def test_speculative_sampling_emits_the_target_distribution(name: str, scheme: str) -> None:
    params = SETTINGS[name]
    seed = list(SETTINGS).index(name)
    p_first, p_pair = p_values(params, k=3, seed=seed, scheme=scheme)
    assert p_first > ALPHA and p_pair > ALPHA, (p_first, p_pair)


@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("k", [1, 2, 5])
def test_the_distribution_holds_for_every_k(k: int, scheme: str) -> None:
    p_first, p_pair = p_values(SamplingParams(temperature=1.0), k=k, seed=40 + k, scheme=scheme)
    assert p_first > ALPHA and p_pair > ALPHA, (p_first, p_pair)


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_a_deterministic_drafter_counts_as_a_point_mass_and_stays_exact(scheme: str) -> None:
    p_first, p_pair = p_values(
        SamplingParams(temperature=0.9), k=3, seed=50, scheme=scheme, drafter="argmax"
    )
    assert p_first > ALPHA and p_pair > ALPHA, (p_first, p_pair)


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_a_proposal_the_draft_gives_zero_probability_is_rejected_and_stays_exact(
    scheme: str,
) -> None:
    # top-k 4 on the draft leaves zeros; the drafter proposes exactly such tokens.
    p_first, p_pair = p_values(
        SamplingParams(temperature=1.0),
        k=2,
        seed=60,
        scheme=scheme,
        drafter="off-support",
        draft_params=SamplingParams(temperature=1.0, top_k=4),
    )
    assert p_first > ALPHA and p_pair > ALPHA, (p_first, p_pair)


@pytest.mark.parametrize(
    ("scheme", "broken"),
    [
        ("rejection", accept_everything),
        ("rejection", resample_from_target_on_rejection),
        ("invariant", accept_everything),
    ],
)
def test_the_negative_controls_broken_verifiers_are_caught(scheme: str, broken: Verifier) -> None:
    p_first, p_pair = p_values(
        SamplingParams(temperature=1.0), k=3, seed=70, scheme=scheme, verifier=broken
    )
    assert p_first < 1e-6 and p_pair < 1e-6, (p_first, p_pair)


def test_invariant_verification_emits_the_same_tokens_whatever_was_drafted() -> None:
    """The draws of a position decide its token: every K, any draft, the same text."""
    params = SamplingParams(temperature=1.0)
    target_logits, draft_logits = tables(80)
    p_target = warp(target_logits, params)
    drafts = {
        "related": warp(draft_logits, params),
        "unrelated": warp(np.random.default_rng(81).normal(size=(VOCAB, VOCAB)), params),
        "the target": p_target,
    }
    for seed in range(200):
        runs = set()
        for k in (0, 1, 3, 6):
            for p_draft in drafts.values():
                draws = Draws(np.random.default_rng(seed))
                runs.add(tuple(emit(p_target, p_draft, k, draws, invariant, "raced", 12)))
        assert len(runs) == 1, (seed, runs)


def test_rejection_verification_depends_on_what_was_drafted() -> None:
    """The contrast: rejection sampling's text changes with K (hence its caveat)."""
    params = SamplingParams(temperature=1.0)
    target_logits, draft_logits = tables(80)
    p_target, p_draft = warp(target_logits, params), warp(draft_logits, params)
    differ = 0
    for seed in range(50):
        texts = set()
        for k in (1, 3):
            draws = Draws(np.random.default_rng(seed))
            texts.add(tuple(emit(p_target, p_draft, k, draws, rejection, "sampled", 12)))
        differ += len(texts) > 1
    assert differ > 10


def test_a_numerically_zero_residual_falls_back_to_the_target_row() -> None:
    p_target = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    p_draft = np.array([[0.5 + 1e-14, 0.5 - 1e-14, 0.0]])  # p_target <= p_draft + eps everywhere
    u_accept = np.array([1.0 - 1e-15])  # forces the (numerically possible) rejection of token 0
    n, token = verify_rejection(np.array([0]), p_draft, p_target, u_accept, np.array([0.3, 0.3]))
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
        ({"seed": -1}, "the seed must be in 0..2\\^64"),
        ({"verification": "lucky"}, "verification must be one of invariant, rejection"),
    ],
)
def test_invalid_sampling_values_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(InputError, match=message):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_sample_never_returns_a_zero_probability_index() -> None:
    probs = np.array([0.0, 0.3, 0.0, 0.7, 0.0])
    drawn = {sample(probs, u) for u in [*np.linspace(0.0, 1.0, 2001)[:-1], 1.0 - 1e-17]}
    assert drawn == {1, 3}


def test_the_race_picks_each_token_with_its_probability() -> None:
    probs = np.array([0.1, 0.0, 0.6, 0.3])
    rng = np.random.default_rng(3)
    winners = race(probs, rng.standard_exponential((20_000, 4)))  # [20000]
    expected = {i: float(p) for i, p in enumerate(probs)}
    assert chi_square_p_value(winners.tolist(), expected) > ALPHA


@pytest.mark.parametrize("temperature", [5e-324, 1e-310, 1e-300, 1e-8, 1.0, 1e300, 1.7e308])
def test_every_accepted_temperature_gives_a_proper_distribution(temperature: float) -> None:
    logits = np.random.default_rng(2).normal(0, 3, size=(3, 50))
    with np.errstate(divide="raise", invalid="raise"):  # no NaN, no division warnings
        probs = warp(logits, SamplingParams(temperature=temperature))
    assert np.all(np.isfinite(probs)) and np.allclose(probs.sum(axis=-1), 1.0)
    if temperature < 1e-6:  # the greedy limit
        np.testing.assert_array_equal(np.argmax(probs, -1), np.argmax(logits, -1))
        assert np.all(probs.max(axis=-1) == 1.0)
