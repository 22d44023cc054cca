"""A goodness-of-fit test for sampled tokens against an exactly computed distribution."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

STOP = -1  # the second element of a first-two pair whose first token is an end token
MIN_EXPECTED = 5.0  # cells with fewer expected samples are pooled (chi-square validity)


def chi_square_p_value(samples: list[Hashable], expected: Mapping[Hashable, float]) -> float:
    """p-value of Pearson's chi-square test of `samples` against the distribution `expected`.

    Outcomes the distribution gives zero probability must never occur: one such sample returns
    p = 0 (an exact failure, not a statistical one). Cells with an expected count below
    MIN_EXPECTED are pooled into one cell.
    """
    from scipy.stats import chisquare

    n = len(samples)
    counts = Counter(samples)
    impossible = [s for s in counts if expected.get(s, 0.0) <= 0.0]
    if impossible:
        return 0.0
    observed, wanted = [], []
    pooled_obs, pooled_exp = 0.0, 0.0
    for outcome, p in expected.items():
        if p <= 0.0:
            continue
        if n * p >= MIN_EXPECTED:
            observed.append(counts.get(outcome, 0))
            wanted.append(n * p)
        else:
            pooled_obs += counts.get(outcome, 0)
            pooled_exp += n * p
    if pooled_exp > 0:
        observed.append(pooled_obs)
        wanted.append(pooled_exp)
    if len(observed) < 2:
        return 1.0  # a single outcome: nothing to test beyond the impossibility check
    f_obs = np.asarray(observed, dtype=np.float64)
    f_exp = np.asarray(wanted, dtype=np.float64)
    f_exp *= f_obs.sum() / f_exp.sum()
    return float(chisquare(f_obs, f_exp).pvalue)


def joint_of_pairs(first: np.ndarray, second: np.ndarray) -> dict[tuple[int, int], float]:
    """P(a, b) = first[a] * second[a, b] for a Markov-style next-token table."""
    return {
        (a, b): float(first[a] * second[a, b])
        for a in range(first.shape[0])
        for b in range(second.shape[1])
    }


def exact_first_two(
    model: Any, prompt: Sequence[int], params: Any, eos: int
) -> dict[tuple[int, int], float]:
    """The exact distribution of the first two tokens a transformers `model` samples after
    `prompt` under sampling `params` (the runtime's warp): {(first, second or STOP): p}."""
    import torch

    from specx.runtime.verification.sampling import warp

    ids = np.asarray(prompt, dtype=np.int64)
    with torch.no_grad():
        first_logits = model(torch.from_numpy(ids)[None]).logits[0, -1].numpy()
        vocab = first_logits.shape[0]
        follow = np.concatenate([np.tile(ids, (vocab, 1)), np.arange(vocab)[:, None]], axis=1)
        second_logits = model(torch.from_numpy(follow)).logits[:, -1].numpy()  # [vocab, vocab]
    p1, p2 = warp(first_logits, params), warp(second_logits, params)
    joint: dict[tuple[int, int], float] = {}
    for a in range(vocab):
        if a == eos:
            joint[(a, STOP)] = float(p1[a])
            continue
        for b in range(vocab):
            joint[(a, b)] = float(p1[a] * p2[a, b])
    return joint


def sampled_first_two(
    pipe: Any,
    prompt: np.ndarray,
    params: Any,
    k: int | str,
    eos: int,
    samples: int,
    max_new_tokens: int = 4,
) -> list[tuple[int, int]]:
    """The first two tokens of `samples` seeded generations (seeds 0 .. samples - 1) as
    (first, second or STOP) pairs, for chi_square_p_value against exact_first_two."""
    import dataclasses

    pairs = []
    for seed in range(samples):
        seeded = dataclasses.replace(params, seed=seed)
        ids = pipe.generate(prompt, max_new_tokens=max_new_tokens, k=k, sampling=seeded).token_ids
        pairs.append((ids[0], STOP if ids[0] == eos else ids[1]))
    return pairs


def accept_everything_invariant(draft: np.ndarray, p_target: np.ndarray, e: Any) -> tuple[int, int]:
    """A broken invariant verifier, the negative control of the sampling tests: every draft token
    accepted, the next drawn from the target."""
    from specx.runtime.verification.sampling import race

    k = len(draft)
    return k, int(race(p_target[k], e[k]))
