"""Log-probabilities of the emitted tokens, read off the verify pass that committed them.

Row i of a step's verify logits is the target's distribution of the token at that position, so
every committed token's log-probability (and the most likely alternatives) comes for free: the
accepted draft tokens from rows 0 .. n - 1, the correction or bonus token from row n.

The distribution reported is the one the token was drawn from: the target's logits under the
grammar (if any), then temperature, top-k, top-p and min-p (sampling.warp); tokens those filters
remove have probability 0 and are never among the alternatives. Greedy decoding draws from a
point mass, which says nothing: there the report is the target's softmax at temperature 1 under
the grammar (what OpenAI's API reports at temperature 0).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from specx.runtime.errors import InputError
from specx.runtime.verification.sampling import SamplingParams, warp

MAX_TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token, logprob), most likely first


# (the step's verify logits [n + 1, vocab], its committed tokens [n + 1]) -> one per token
Scorer = Callable[[np.ndarray, np.ndarray], list[TokenLogprob]]


def check_top(top: int) -> None:
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise InputError(
            f"top logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {top}",
            "e.g. --logprobs 5, or 0 for the emitted tokens' alone",
            "logprobs",
        )


def log_distribution(logits: np.ndarray, sampling: SamplingParams) -> np.ndarray:
    """[rows, vocab] logits -> [rows, vocab] float64 log-probabilities as the tokens are drawn
    (module docstring); -inf where a token cannot be drawn."""
    x = np.asarray(logits, dtype=np.float64)
    if sampling.greedy:
        x = x - np.max(x, axis=-1, keepdims=True)
        with np.errstate(divide="ignore"):
            return x - np.log(np.sum(np.exp(x), axis=-1, keepdims=True))
    with np.errstate(divide="ignore"):
        return np.log(warp(x, sampling))


def score(
    logits: np.ndarray, tokens: np.ndarray, sampling: SamplingParams, top: int
) -> list[TokenLogprob]:
    """Each token's log-probability under its row, with the `top` most likely alternatives.
    logits: [n, vocab] (row i decides tokens[i]); tokens: [n]."""
    n = int(tokens.shape[0])
    logp = log_distribution(logits[:n], sampling)  # [n, vocab]
    out = []
    for i in range(n):
        row = logp[i]
        alternatives: tuple[tuple[int, float], ...] = ()
        if top:
            best = (
                np.argpartition(-row, top - 1)[:top]
                if top < row.shape[0]
                else np.arange(row.shape[0])
            )
            best = best[np.lexsort((best, -row[best]))]  # by log-probability, then token id
            alternatives = tuple((int(t), float(row[t])) for t in best if np.isfinite(row[t]))
        out.append(TokenLogprob(int(tokens[i]), float(row[int(tokens[i])]), alternatives))
    return out


def make_scorer(sampling: SamplingParams, top: int | None) -> Scorer | None:
    """The scorer a generation asks for (`top`: alternatives per token; None: no logprobs)."""
    if top is None:
        return None
    check_top(top)
    return lambda logits, tokens: score(logits, tokens, sampling, top)
