"""Sampling settings, logit warping and the random numbers of a generation; pure numpy.

``warp`` turns logits into the exact distribution the target alone would sample from
(temperature, then top-k, top-p, min-p, in that order, as Hugging Face transformers applies them).
Speculative sampling applies the same warp to the draft's and the target's logits.

Random numbers are keyed by the position they decide (``PositionNoise``): the draw that picks the
token at position p is a pure function of (seed, stream, p, index), whoever asks for it, in
whatever order, in any process and in any runtime (``counter_words``: a counter-based generator
written down in docs/artifact-format.md; libspecx implements the same). Nothing random depends on
how many tokens were drafted, so with the drafter-invariant verification (verify.py) the same
seed gives the same text for every K and every drafter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specx.runtime.errors import InputError

# How sampled drafts are verified (verify.py): "invariant" keeps the text a function of the seed
# alone; "rejection" (Leviathan et al.) accepts more draft tokens, but its text also depends on
# which tokens were drafted, so only a fixed K and drafter repeat it.
VERIFICATIONS = ("invariant", "rejection")

# Random streams: independent draws for the same position.
RACE = 0  # the exponential race that picks a position's token (invariant verification)
DRAFT = 1  # the draft's own draw (rejection verification)
ACCEPT = 2  # the acceptance test of a draft token (rejection verification)
RESAMPLE = 3  # the correction or bonus token (rejection verification)

# The counter-based generator (docs/artifact-format.md, "Random numbers"): SplitMix64's finalizer
# keys (seed, stream, position), and word i of a key is the finalizer of key + (i + 1) * golden.
MASK64 = (1 << 64) - 1
_MIX1, _MIX2, _GOLDEN = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0x9E3779B97F4A7C15


def _mix(z: int) -> int:
    """SplitMix64's finalizer on a Python int (mod 2^64)."""
    z &= MASK64
    z ^= z >> 30
    z = (z * _MIX1) & MASK64
    z ^= z >> 27
    z = (z * _MIX2) & MASK64
    return z ^ (z >> 31)


def counter_key(seed: int, stream: int, position: int) -> int:
    """The key of the draws that decide `position` in `stream` under `seed` (all mod 2^64)."""
    return _mix(_mix(_mix(seed) + stream) + position)


def counter_words(key: int, count: int) -> np.ndarray:
    """[count] uint64: words 0 .. count - 1 of a key, mix(key + (i + 1) * golden)."""
    z = np.uint64(key) + np.arange(1, count + 1, dtype=np.uint64) * np.uint64(_GOLDEN)
    z ^= z >> np.uint64(30)
    z *= np.uint64(_MIX1)
    z ^= z >> np.uint64(27)
    z *= np.uint64(_MIX2)
    return z ^ (z >> np.uint64(31))


def counter_uniforms(key: int, count: int) -> np.ndarray:
    """[count] float64 in [0, 1): the top 53 bits of each word, times 2^-53."""
    return (counter_words(key, count) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def counter_uniform(key: int) -> float:
    """Word 0 of a key as a uniform in [0, 1) (scalar; the same value as counter_uniforms)."""
    return (_mix(key + _GOLDEN) >> 11) * 2.0**-53


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy (argmax); any finite value > 0 samples
    top_k: int = 0  # 0 disables
    top_p: float = 1.0  # 1 disables
    min_p: float = 0.0  # 0 disables
    seed: int | None = None  # None: fresh randomness for every generation
    verification: str = "invariant"  # one of VERIFICATIONS

    def __post_init__(self) -> None:
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise InputError(
                f"temperature must be >= 0, got {self.temperature}",
                "use 0 for greedy decoding, e.g. 0.7 for sampling",
                "temperature",
            )
        if self.top_k < 0:
            raise InputError(
                f"top-k must be >= 0, got {self.top_k}", "use 0 to disable top-k", "top_k"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise InputError(
                f"top-p must be in (0, 1], got {self.top_p}", "use 1.0 to disable top-p", "top_p"
            )
        if not 0.0 <= self.min_p < 1.0:
            raise InputError(
                f"min-p must be in [0, 1), got {self.min_p}", "use 0 to disable", "min_p"
            )
        if self.seed is not None and not 0 <= self.seed <= MASK64:
            raise InputError(
                f"the seed must be in 0..2^64 - 1, got {self.seed}", "e.g. --seed 1", "seed"
            )
        if self.verification not in VERIFICATIONS:
            raise InputError(
                f"verification must be one of {', '.join(VERIFICATIONS)}, "
                f"got {self.verification!r}",
                field="verification",
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def fresh_seed() -> int:
    """A seed from the operating system's entropy (a generation without --seed)."""
    return int(np.random.SeedSequence().generate_state(1, np.uint64)[0])


class PositionNoise:
    """The random numbers of one generation, keyed by (seed, stream, position): the counter-based
    generator above, so that libspecx draws the same numbers.

    Exponentials for the race at a position are drawn once and kept while the loop still works
    near that position (a draft asks for them first, the verifier again)."""

    KEEP = 40  # positions kept: more than one step's draft and verify rows

    def __init__(self, seed: int | None, vocab_size: int) -> None:
        self.seed = fresh_seed() if seed is None else seed
        self.vocab_size = vocab_size
        self._exponentials: dict[int, np.ndarray] = {}

    def exponentials(self, position: int) -> np.ndarray:
        """[vocab] i.i.d. Exp(1) draws for the race at `position`: -log1p(-u) of its uniforms."""
        found = self._exponentials.get(position)
        if found is None:
            uniforms = counter_uniforms(counter_key(self.seed, RACE, position), self.vocab_size)
            found = -np.log1p(-uniforms)
            if len(self._exponentials) >= self.KEEP:
                del self._exponentials[min(self._exponentials)]
            self._exponentials[position] = found
        return found

    def uniform(self, stream: int, position: int) -> float:
        """One U[0, 1) draw for `position` in `stream` (word 0 of its key)."""
        return counter_uniform(counter_key(self.seed, stream, position))


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64; -inf entries get probability 0."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - np.max(x, axis=-1, keepdims=True)
    e = np.exp(x)
    return e / np.sum(e, axis=-1, keepdims=True)


def top_probability(logits: np.ndarray, token: int) -> float:
    """Softmax of a 1-D logits row at `token` (the draft's confidence in its argmax)."""
    row = np.asarray(logits, dtype=np.float64)
    return float(1.0 / np.sum(np.exp(row - row[token])))


def warp(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Logits [..., vocab] -> probabilities [..., vocab] after temperature/top-k/top-p/min-p.

    Greedy params give a one-hot distribution on the argmax (first index on ties).
    """
    x = np.asarray(logits, dtype=np.float64)
    if params.greedy:
        probs = np.zeros_like(x)
        np.put_along_axis(probs, np.argmax(x, axis=-1)[..., None], 1.0, axis=-1)
        return probs
    # Shift by the max before dividing: the top logit becomes 0 and the rest negative, so any
    # finite temperature > 0 is safe; a tiny one sends all but the top logits to -inf (exp -> 0):
    # the greedy limit, ties kept.
    with np.errstate(over="ignore"):
        x = (x - np.max(x, axis=-1, keepdims=True)) / params.temperature
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


def sample(probs: np.ndarray, u: float) -> int:
    """The index that the uniform draw `u` in [0, 1) picks from a 1-D distribution (inverse CDF;
    need not be normalised; must have mass)."""
    cdf = np.cumsum(probs)
    total = cdf[-1]
    if not total > 0.0:
        raise ValueError("cannot sample from a distribution with no mass")
    index = int(np.searchsorted(cdf, u * total, side="right"))
    # guard the u * total == total edge and trailing zero-probability entries
    index = min(index, probs.shape[0] - 1)
    while probs[index] <= 0.0:
        index -= 1
    return index


def race(probs: np.ndarray, exponentials: np.ndarray) -> np.ndarray:
    """The exponential race (the Gumbel-max trick in another form): argmax of p(x) / E_x, with
    E_x i.i.d. Exp(1), picks x with probability exactly p(x). probs and exponentials: [..., n];
    returns the winners, [...]. Zero-probability entries never win."""
    return np.argmax(probs / exponentials, axis=-1)
