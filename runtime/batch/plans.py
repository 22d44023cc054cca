"""The plans of one batch step weighed: which -k auto rows draft how far, for the most expected
tokens per second over the batch (WidthPlanner.plan gathers the costs; docs/bench/batching.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Plans:
    """What the plans of one step are weighed by: per -k auto row i, its expected tokens and
    own drafting seconds at each K (expected[i][k], own_s[i][k]), whether it drafts in the
    shared draft passes and the most it may draft; what the other rows add; the pass at each
    width; shared drafting by (rows, K); and the realized share of plain and drafting steps."""

    expected: list[list[float]]
    own_s: list[list[float]]
    shares: list[bool]
    limits: list[int]
    base_tokens: float  # tokens of the rows with a fixed K (at least one each)
    fixed_width: int  # the pass's width without any -k auto row drafting
    fixed_shared_rows: int  # fixed-K rows drafting in the shared passes
    fixed_shared_k: int  # the most they draft
    pass_by_width: list[float]
    shared_draft_s: Callable[[int, int], float]
    share: dict[bool, float]

    def outcome(self, ks: list[int]) -> tuple[bool, float, float]:
        """(whether any row drafts, expected tokens, expected seconds) of the plan in which row
        i drafts up to ks[i]."""
        tokens, draft_s = self.base_tokens, 0.0
        shared_k, shared_rows, width = self.fixed_shared_k, self.fixed_shared_rows, self.fixed_width
        for i, k in enumerate(ks):
            tokens += self.expected[i][k]
            draft_s += self.own_s[i][k]
            if k:
                width = max(width, k + 1)
                if self.shares[i]:
                    shared_k, shared_rows = max(shared_k, k), shared_rows + 1
        draft_s += self.shared_draft_s(shared_rows, shared_k) if shared_rows else 0.0
        return width > 1, tokens, draft_s + self.pass_by_width[width]

    def rate(self, ks: list[int]) -> float:
        """Expected tokens per second of a plan, corrected by what such steps gave."""
        drafted, tokens, seconds = self.outcome(ks)
        return tokens / seconds * self.share[drafted]

    def search(self, widest: int) -> list[int]:
        """The plan with the most expected tokens per second found thus: for each width w (1 ..
        widest), every row drafts up to w - 1 but for those whose drafting costs the batch
        more than it brings, dropped one at a time, the worst first. A plan without one row's
        drafting is weighed from the current plan's sums (O(1) a row, not a pass over all
        rows: a step at 8 rows weighs about a hundred such plans)."""
        best_ks, best_rate = [0] * len(self.expected), -1.0
        # (one row's plans cost less to weigh than to bound)
        bound = self._bounds(widest) if len(self.expected) > 1 else None
        for w in range(1, widest + 1):
            if w > 1 and bound is not None and bound(w) <= best_rate:
                continue  # no plan drafting up to w - 1 can beat the best so far
            ks = [min(limit, w - 1) for limit in self.limits]
            current = self.rate(ks)
            while True:
                worst, gain = -1, current
                sums = self._sums(ks)
                for i, k in enumerate(ks):
                    if k and (without := self._rate_without(ks, sums, i)) > gain:
                        worst, gain = i, without
                if worst < 0:
                    break
                ks[worst] = 0
                current = self.rate(ks)
            if current > best_rate:
                best_ks, best_rate = ks, current
        return best_ks

    def _bounds(self, widest: int) -> Callable[[int], float]:
        """An upper bound on the rate of every plan the search weighs at width w in which some
        row drafts (row i drafts min(limit_i, w - 1) tokens or none; the plan in which none
        drafts is weighed at w = 1). Such a plan's pass has a width c from the least a drafting
        plan needs up to max(w, fixed_width), and a row drafting in a pass of width c drafts at
        most c - 1 tokens (its expected tokens grow with K), so the plan's tokens are at most
        `base` plus each row's gain at min(limit, c - 1), over the pass at c plus, where m rows
        draft in the shared passes (the m largest gains at most), the cheapest shared drafting
        of m rows (and the fixed rows sharing) at any K up to c - 1; drafting of a row's own
        costs at least nothing. The bound at w is the largest over those c, computed once for
        every w. Where drafting does not pay (a full batch), the search skips every width but
        the first. (A bound that paired every row's largest gain with the cheapest pass and
        the cheapest shared drafting of one row let most widths through: the plan searches
        per row count are printed by scripts/diagnostics/plan_costs.py.)"""
        base = self.base_tokens + sum(e[0] for e in self.expected)
        fixed_rows, least_k = self.fixed_shared_rows, max(1, self.fixed_shared_k)
        n_shared = sum(self.shares)
        low, top = max(2, self.fixed_width), max(widest, self.fixed_width)
        # shared_cost[m]: the cheapest shared drafting of m -k auto rows (and the fixed ones)
        # at any K from least_k up to the width's c - 1
        shared_cost = [0.0] + [float("inf")] * n_shared
        next_k = least_k
        by_width = [0.0] * (top + 1)  # the bound at each w
        best = 0.0
        for c in range(low, top + 1):
            for k in range(next_k, c):
                for m in range(1, n_shared + 1):
                    shared_cost[m] = min(shared_cost[m], self.shared_draft_s(fixed_rows + m, k))
            next_k = max(next_k, c)
            own, shared = base, []
            for e, limit, shares in zip(self.expected, self.limits, self.shares, strict=True):
                k = min(limit, c - 1)
                gain = max(0.0, e[k] - e[0])
                if shares and k:
                    shared.append(gain)
                else:
                    own += gain
            seconds = self.pass_by_width[c]
            best = max(best, own / seconds)
            tokens = own
            for m, gain in enumerate(sorted(shared, reverse=True), start=1):
                tokens += gain
                best = max(best, tokens / (seconds + shared_cost[m]))
            by_width[c] = best * self.share[True]

        def bound(w: int) -> float:
            return by_width[max(w, self.fixed_width)]

        return bound

    def _sums(self, ks: list[int]) -> tuple[float, float, list[int], list[int]]:
        """A plan's expected tokens, own drafting seconds, and the K of its drafting rows and of
        its rows drafting in shared passes (each largest first)."""
        tokens = self.base_tokens + sum(e[k] for e, k in zip(self.expected, ks, strict=True))
        own = sum(o[k] for o, k in zip(self.own_s, ks, strict=True))
        drafting = sorted((k for k in ks if k), reverse=True)
        shared = sorted(
            (k for k, sh in zip(ks, self.shares, strict=True) if k and sh), reverse=True
        )
        return tokens, own, drafting, shared

    def _rate_without(
        self, ks: list[int], sums: tuple[float, float, list[int], list[int]], i: int
    ) -> float:
        """`rate` of plan ks with row i (which drafts) not drafting."""
        tokens, own, drafting, shared = sums
        k = ks[i]
        tokens += self.expected[i][0] - self.expected[i][k]
        own += self.own_s[i][0] - self.own_s[i][k]
        width = max(self.fixed_width, _largest_but_one(drafting, k) + 1)
        shared_rows = self.fixed_shared_rows + len(shared)
        shared_k = max(self.fixed_shared_k, shared[0] if shared else 0)
        if self.shares[i]:
            shared_rows -= 1
            shared_k = max(self.fixed_shared_k, _largest_but_one(shared, k))
        draft_s = own + (self.shared_draft_s(shared_rows, shared_k) if shared_rows else 0.0)
        seconds = draft_s + self.pass_by_width[width]
        return tokens / seconds * self.share[width > 1]


def _largest_but_one(values: list[int], k: int) -> int:
    """The largest of `values` (largest first, k among them) once one k is taken out (0 if
    none is left)."""
    if values[0] != k:
        return values[0]
    return values[1] if len(values) > 1 else 0
