"""-k auto in a batch: one cap on K for the rows whose K is chosen by the policy, chosen for the
batch as a whole from the measured costs of batched verify passes and of drafting
(docs/bench/batching.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from specx.runtime.adaptive import AdaptiveK
from specx.runtime.drafters.base import MODEL, NONE

if TYPE_CHECKING:
    from specx.runtime.batching import BatchSequence


class WidthPlanner:
    """K for the -k auto rows of a batch, chosen for the batch as a whole.

    Alone, a policy weighs its expected tokens against its drafting plus a pass that is nearly
    free to widen. In a batch the pass is as wide as its longest row, its cost grows with the
    rows times the width, and every row's drafting holds up all rows. So before drafting, the
    rows whose K is chosen by -k auto all draft up to a common cap w - 1, the w (1 .. the most
    any may draft) with the most expected tokens per second over the batch: the sum of their
    expected tokens at that K (each policy's own acceptance estimates) over the sum of their
    drafting (each policy's measured costs) plus the pass at that width. Rows with a fixed K keep
    it (the pass is then at least that wide). Pass costs per (rows, width) are measured as the
    decoder runs; a cell not yet measured is scaled from the nearest measured one by a prior
    charging each extra token 4% of a one-token pass (docs/bench/batching.md); a draft model not
    yet measured is guessed at half a one-token pass per token. Until a pass was measured the
    policies' own K stand.
    """

    PER_TOKEN = 0.04
    # a draft model's pass, as a share of a one-row one-token target pass, until measured
    # (the int8/int4 drafts of SmolLM2 measured 0.36-0.58: docs/bench/measurements.md)
    DRAFT_PRIOR = 0.5

    def __init__(self, decay: float = 0.9) -> None:
        self.decay = decay
        self.cost_s: dict[tuple[int, int], float] = {}  # (rows, width) -> a verify pass
        self.draft_cost_s: dict[tuple[int, int], float] = {}  # (rows, K) -> shared drafting

    def observe(self, rows: int, width: int, seconds: float) -> None:
        old = self.cost_s.get((rows, width))
        self.cost_s[(rows, width)] = (
            seconds if old is None else self.decay * old + (1 - self.decay) * seconds
        )

    def pass_s(self, rows: int, width: int) -> float | None:
        if (rows, width) in self.cost_s:
            return self.cost_s[(rows, width)]
        if not self.cost_s:
            return None

        def prior(r: int, w: int) -> float:
            return 1.0 + self.PER_TOKEN * (r * w - 1)

        (r, w), t = min(
            self.cost_s.items(), key=lambda c: (abs(c[0][0] - rows), abs(c[0][1] - width))
        )
        return t * prior(rows, width) / prior(r, w)

    def observe_draft(self, rows: int, k: int, seconds: float) -> None:
        """A shared drafting run: `rows` rows drafted up to `k` tokens in lockstep."""
        old = self.draft_cost_s.get((rows, k))
        self.draft_cost_s[(rows, k)] = (
            seconds if old is None else self.decay * old + (1 - self.decay) * seconds
        )

    def shared_draft_s(self, rows: int, k: int, one_token_s: float) -> float:
        """What `rows` rows drafting up to `k` tokens in shared passes cost: measured, else
        scaled from the nearest measurement (k passes), else k passes guessed at DRAFT_PRIOR
        of a target pass over as many rows."""
        if k <= 0:
            return 0.0
        if (rows, k) in self.draft_cost_s:
            return self.draft_cost_s[(rows, k)]
        if self.draft_cost_s:
            (_, kk), t = min(
                self.draft_cost_s.items(), key=lambda c: (abs(c[0][0] - rows), abs(c[0][1] - k))
            )
            return t * k / kk
        target = self.pass_s(rows, 1)
        return k * self.DRAFT_PRIOR * (target if target is not None else one_token_s)

    def plan(self, active: list[BatchSequence], rows: int) -> None:
        adaptive = [s for s in active if isinstance(s.policy, AdaptiveK)]
        one_token_s = self.pass_s(1, 1)
        if not adaptive or one_token_s is None:
            return
        fixed = [s for s in active if s not in adaptive]
        fixed_width = 1 + max((s.k for s in fixed), default=0)
        # rows drafting in shared passes: their drafting costs the longest of them, once
        shared_rows = sum(s.shares_draft for s in active)
        shared_fixed_k = max((s.k for s in fixed if s.shares_draft), default=0)
        widest = 1 + max(s.k_limit for s in adaptive)
        tokens_at = np.zeros(widest)  # [width] expected tokens of the adaptive rows
        draft_at = np.zeros(widest)  # [width] their drafting, seconds
        shared_k_at = np.full(widest, shared_fixed_k)  # [width] the shared drafting's longest K
        for s in adaptive:
            policy = s.policy
            assert isinstance(policy, AdaptiveK)
            limit = s.k_limit if s.source != NONE else 0
            expected = policy.expected_tokens(s.source) if limit else [1.0]
            measured = [policy.draft_cost_s(k, s.source) for k in range(limit + 1)]
            guess = self.DRAFT_PRIOR * one_token_s if s.source == MODEL else 0.0
            costs = [k * guess if c is None else c for k, c in enumerate(measured)]
            for w in range(1, widest + 1):
                k = min(limit, w - 1)
                tokens_at[w - 1] += expected[k]
                if s.shares_draft:
                    shared_k_at[w - 1] = max(shared_k_at[w - 1], k)
                else:
                    draft_at[w - 1] += costs[k]
        best_w, best_rate = 1, -1.0
        for w in range(1, widest + 1):
            pass_s = self.pass_s(rows, max(w, fixed_width))
            assert pass_s is not None
            shared_s = self.shared_draft_s(shared_rows, int(shared_k_at[w - 1]), one_token_s)
            rate = tokens_at[w - 1] / (draft_at[w - 1] + shared_s + pass_s)
            if rate > best_rate:
                best_w, best_rate = w, rate
        for s in adaptive:
            s.k = min(s.k_limit, best_w - 1) if s.source != NONE else 0
