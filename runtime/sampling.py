"""Sampling settings and logit warping, pure numpy.

``warp`` turns logits into the exact distribution the target alone would sample from
(temperature, then top-k, top-p, min-p, in that order, as Hugging Face transformers applies them).
Speculative sampling applies the same warp to the draft's and the target's logits before the
rejection test, so the output follows the warped target distribution exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specx.runtime.errors import InputError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy (argmax); the exact path
    top_k: int = 0  # 0 disables
    top_p: float = 1.0  # 1 disables
    min_p: float = 0.0  # 0 disables
    seed: int | None = None

    def __post_init__(self) -> None:
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise InputError(
                f"temperature must be >= 0, got {self.temperature}",
                "use 0 for greedy decoding, e.g. 0.7 for sampling",
            )
        if self.top_k < 0:
            raise InputError(f"top-k must be >= 0, got {self.top_k}", "use 0 to disable top-k")
        if not 0.0 < self.top_p <= 1.0:
            raise InputError(
                f"top-p must be in (0, 1], got {self.top_p}", "use 1.0 to disable top-p"
            )
        if not 0.0 <= self.min_p < 1.0:
            raise InputError(f"min-p must be in [0, 1), got {self.min_p}", "use 0 to disable")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64; -inf entries get probability 0."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - np.max(x, axis=-1, keepdims=True)
    e = np.exp(x)
    return e / np.sum(e, axis=-1, keepdims=True)


def warp(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Logits [..., vocab] -> probabilities [..., vocab] after temperature/top-k/top-p/min-p.

    Greedy params give a one-hot distribution on the argmax (first index on ties).
    """
    x = np.asarray(logits, dtype=np.float64)
    if params.greedy:
        probs = np.zeros_like(x)
        np.put_along_axis(probs, np.argmax(x, axis=-1)[..., None], 1.0, axis=-1)
        return probs
    x = x / params.temperature
    vocab = x.shape[-1]
    if 0 < params.top_k < vocab:
        # keep every token whose logit reaches the k-th largest (ties at the boundary stay)
        kth = np.partition(x, vocab - params.top_k, axis=-1)[..., vocab - params.top_k, None]
        x = np.where(x < kth, -np.inf, x)
    probs = softmax(x)
    if params.top_p < 1.0:
        order = np.argsort(-probs, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(probs, order, axis=-1)
        mass_before = np.cumsum(sorted_p, axis=-1) - sorted_p
        keep_sorted = mass_before < params.top_p  # the smallest prefix reaching top_p
        keep_sorted[..., 0] = True
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        probs = np.where(keep, probs, 0.0)
        probs = probs / probs.sum(axis=-1, keepdims=True)
    if params.min_p > 0.0:
        threshold = params.min_p * probs.max(axis=-1, keepdims=True)
        probs = np.where(probs >= threshold, probs, 0.0)
        probs = probs / probs.sum(axis=-1, keepdims=True)
    return probs


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one index from a 1-D distribution (need not be normalised; must have mass)."""
    cdf = np.cumsum(probs)
    total = cdf[-1]
    if not total > 0.0:
        raise ValueError("cannot sample from a distribution with no mass")
    u = rng.random() * total
    index = int(np.searchsorted(cdf, u, side="right"))
    # guard the u == total edge and trailing zero-probability entries
    index = min(index, probs.shape[0] - 1)
    while probs[index] <= 0.0:
        index -= 1
    return index
