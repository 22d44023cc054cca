"""Choosing K per step from what the run has seen (`-k auto`).

Leviathan et al. 2023 (eq. 1): with per-token acceptance rate alpha, a proposal of K tokens
yields on average (1 - alpha^(K+1)) / (1 - alpha) tokens. Its cost is K draft passes plus one
target pass over K + 1 tokens. The policy estimates all three from the run itself (decayed sums,
so it follows a text whose predictability changes) and picks the K in 0..max_k with the most
expected tokens per second. A short run of K = 0 is followed by a K = 1 probe, so a drafter
that starts to agree again is noticed.
"""

from __future__ import annotations

from dataclasses import dataclass

from specx.runtime.generate import KPolicy, StepResult


@dataclass
class _Decayed:
    """An exponentially decayed sum."""

    value: float
    decay: float

    def add(self, x: float) -> None:
        self.value = self.decay * self.value + x


class AdaptiveK(KPolicy):
    def __init__(
        self,
        max_k: int = 8,
        start_k: int = 3,
        decay: float = 0.92,
        prior_alpha: float = 0.6,
        probe_every: int = 8,
    ) -> None:
        super().__init__(start_k)
        self.max_k = max_k
        self.probe_every = probe_every
        # acceptance: maximum likelihood of a geometric model, successes / (successes + failures)
        self._accepted = _Decayed(4 * prior_alpha, decay)
        self._rejected = _Decayed(4 * (1 - prior_alpha), decay)
        # costs (seconds): per draft pass, and a target pass as a + b * width (least squares)
        self._draft_time = _Decayed(0.0, decay)
        self._draft_passes = _Decayed(0.0, decay)
        self._sw = _Decayed(0.0, decay)  # sums for the verify-time line fit
        self._sx = _Decayed(0.0, decay)
        self._sy = _Decayed(0.0, decay)
        self._sxx = _Decayed(0.0, decay)
        self._sxy = _Decayed(0.0, decay)
        self._zero_streak = 0
        self.history: list[int] = []

    @property
    def alpha(self) -> float:
        a, r = self._accepted.value, self._rejected.value
        return min(0.99, max(0.01, a / (a + r)))

    def _verify_cost(self, width: int) -> float:
        n = self._sw.value
        if n < 1e-9:
            return 1.0  # no measurement yet: only ratios matter, assume flat
        mean_x, mean_y = self._sx.value / n, self._sy.value / n
        var = self._sxx.value / n - mean_x * mean_x
        slope = (self._sxy.value / n - mean_x * mean_y) / var if var > 1e-9 else 0.0
        slope = max(0.0, slope)
        return max(1e-6, mean_y + slope * (width - mean_x))

    def _draft_cost(self) -> float:
        passes = self._draft_passes.value
        return self._draft_time.value / passes if passes > 1e-9 else 0.0

    def expected_rate(self, k: int) -> float:
        """Expected tokens per second for K = k under the current estimates."""
        alpha = self.alpha
        tokens = (1 - alpha ** (k + 1)) / (1 - alpha)
        return tokens / (k * self._draft_cost() + self._verify_cost(k + 1))

    def next_k(self) -> int:
        if self._sw.value < 1e-9:
            k = self.k  # first step: nothing measured yet
        elif self._zero_streak >= self.probe_every:
            k = 1
        else:
            k = max(range(self.max_k + 1), key=self.expected_rate)
        self.history.append(k)
        return k

    def observe(self, step: StepResult) -> None:
        width = step.proposed + 1
        for acc in (self._sw, self._sx, self._sy, self._sxx, self._sxy):
            acc.decay = self._accepted.decay
        self._sw.add(1.0)
        self._sx.add(width)
        self._sy.add(step.verify_s)
        self._sxx.add(width * width)
        self._sxy.add(width * step.verify_s)
        if step.draft_passes:
            self._draft_time.add(step.draft_s)
            self._draft_passes.add(step.draft_passes)
        if step.proposed:
            self._accepted.add(step.accepted)
            self._rejected.add(1.0 if step.accepted < step.proposed else 0.0)
            self._zero_streak = 0
        else:
            self._zero_streak += 1
