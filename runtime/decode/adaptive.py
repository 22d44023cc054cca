"""Choosing K per step from what the run has seen (`-k auto`).

Expected tokens from a proposal of K: 1 + sum over j <= K of P(draft tokens 1..j accepted). With
independent acceptances this is Leviathan et al.'s (1 - alpha^(K+1)) / (1 - alpha); real drafters
are not independent (an n-gram lookup that matches its first token tends to match a run), so the
policy estimates the acceptance of each draft position given that the previous ones were accepted,
from decayed counts, and multiplies them. The cost of a step is drafting K tokens plus one
target pass over K + 1 tokens, each as measured at that K (shrunk toward a cost per token, and a
line through all widths, where few were measured): neither is proportional to K. The policy takes
the K in 0..max_k with the most expected tokens per second, tries a neighbouring K now and then to
keep the estimates honest, and probes K = 2 after a run of K = 0 (runs twice as long after
each probe that changes nothing, up to PROBE_MOST steps).

Acceptance and drafting cost are kept per *source*: the drafter says before each step where its
proposal will come from (a hybrid drafter: a free n-gram lookup, or a draft-model pass per token).
A lookup that matched is cheap and tends to run on, so it deserves a longer K than the model,
which pays a pass for every token; one estimate for both would fit neither. The target's verify
cost is shared: it does not depend on who drafted. A lookup's first position is also learned at
the steps that do not draft it (asking a lookup costs nothing: sequence.lookup_guess), so that a
batch that stops drafting lookups does not keep the estimate it stopped on; lookups are never
probed for that reason.

Never losing to the target alone. Before anything is measured the costs are not guessed low: a
verify pass's extra row costs what a prompt pass paid per token (observe_prefill: an upper bound
on CPUs, where extra rows are compute), and a draft model's pass what its size predicts relative
to the target's (draft_ratio). A model draft is not asked at a generation's first step when it
reads the prompt lazily (lazy_draft: the first token is not delayed by the draft's prefill), and
not given up on its acceptance before MIN_JUDGED of its first positions were judged. Where
even drafts that are always accepted could not beat K = 0 at the measured costs, the policy no
longer probes; otherwise a probe comes no more often than its measured extra cost allows within
PROBE_BUDGET of the time spent at K = 0 since the last one. A later generation starts from what
the earlier ones learned (inherit), its acceptances shrunk toward where they were left rather
than toward the fixed prior, so that generations that draft nothing do not unlearn them.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from specx.runtime.decode.policy import StepDecision, StepResult
from specx.runtime.drafters.base import MODEL, NONE, DraftPlan, is_lookup

DEFAULT_SOURCE = MODEL
# Buckets of a draft model's own top probability, and the acceptance guessed for each before the
# run has measured it: a prior that the run's own counts soon outweigh (where the values come
# from: docs/bench/measurements.md).
CONFIDENCE_EDGES = (0.3, 0.5, 0.7, 0.9, 0.97)
CONFIDENCE_PRIOR = (0.35, 0.6, 0.8, 0.9, 0.95, 0.98)


@dataclass
class SourceEstimate:
    """What the run has learned about one source of proposals."""

    max_k: int
    # reached[i]: proposals whose position i was verified (all earlier ones accepted);
    # accepted[i]: of those, how many were accepted at position i. Decayed counts.
    reached: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)
    draft_pass_s: float = 0.0  # drafting cost per proposed token
    draft_seen: bool = False
    # per K: decayed (steps, seconds) of drafting K tokens. A step's drafting also pays for
    # feeding the draft what the target committed (two tokens after a full acceptance), a
    # cost per step, not per token; measured per K it is charged where it falls.
    draft_by_k: list[tuple[float, float]] = field(default_factory=list)
    # per confidence bucket: decayed tokens verified, and accepted, of a drafter that reports
    # its confidence (a draft model does, a lookup does not)
    confidence_reached: list[float] = field(default_factory=lambda: [0.0] * 6)
    confidence_accepted: list[float] = field(default_factory=lambda: [0.0] * 6)
    confidence_seen: bool = False
    steps: int = 0
    zero_streak: int = 0
    # K = 0 steps before the next probe: doubles each time a probe leaves the estimates still
    # choosing K = 0 (an idle draft model costs nothing; a probe costs drafting and catch-up)
    probe_after: int = 0
    probing: bool = False  # the last step of this source was a probe
    probe_cost_s: float = 0.0  # the last probe's seconds beyond a one-token pass
    judged: int = 0  # proposals whose first position was judged, in all generations (no decay)
    # [max_k] where an earlier generation left the acceptances: this one's shrinks toward them
    # (empty: toward prior_accept). Halved counts alone would drift back to the fixed prior over
    # generations that do not draft, and a draft that pays would be talked out of it for good.
    anchor: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.reached += [0.0] * (self.max_k - len(self.reached))
        self.accepted += [0.0] * (self.max_k - len(self.accepted))
        self.draft_by_k += [(0.0, 0.0)] * (self.max_k + 1 - len(self.draft_by_k))

    def draft_s(self, k: int, prior: float) -> float:
        """Drafting k tokens: what it cost at this K, shrunk toward k times the cost per token."""
        per_token = k * self.draft_pass_s
        if k >= len(self.draft_by_k):
            return per_token
        n, total = self.draft_by_k[k]
        return (total + prior * per_token) / (n + prior)

    def scaled(self, max_k: int, keep: float) -> SourceEstimate:
        """A copy for a later generation: counts weighted by `keep`, costs as they were."""
        return SourceEstimate(
            max_k,
            [keep * r for r in self.reached[:max_k]],
            [keep * a for a in self.accepted[:max_k]],
            self.draft_pass_s,
            self.draft_seen,
            [(keep * n, keep * t) for n, t in self.draft_by_k[: max_k + 1]],
            [keep * r for r in self.confidence_reached],
            [keep * a for a in self.confidence_accepted],
            self.confidence_seen,
            1 if self.steps else 0,
            self.zero_streak,  # the probes' rhythm goes on: short generations still probe
            self.probe_after,
            False,
            self.probe_cost_s,
            self.judged,  # what was seen stays seen: a later generation need not judge it again
        )  # the anchor is the caller's: inherit sets it from the earlier policy's acceptances

    def accept_given_confidence(self, top: float, prior_weight: float) -> float:
        """P(a draft token is accepted | the earlier ones were, the draft's top probability)."""
        b = bisect.bisect_right(CONFIDENCE_EDGES, top)
        prior = CONFIDENCE_PRIOR[b]
        reached, accepted = self.confidence_reached[b], self.confidence_accepted[b]
        return (accepted + prior_weight * prior) / (reached + prior_weight)


def _take_all(position: int, top: float) -> tuple[bool, bool]:
    return True, True


class AdaptiveK:
    PROBE_MOST = 1024  # the longest run of K = 0 steps between probes
    PROBE_BUDGET = 0.02  # what probes may cost: this share of the time spent at K = 0
    # keep a model draft at K = 1 while it is expected within this share of K = 0's rate (an idle
    # draft model must catch up when it drafts again); a lookup has nothing to catch up
    HOLD = 0.98
    # a model draft is not given up on its acceptance before this many of its proposals were
    # judged (in all generations): two unlucky first steps would otherwise stop a draft that
    # pays, for good, since an idle draft falls behind and its catch-up then rules probes out
    MIN_JUDGED = 6
    # a catch-up this long measures the draft's cost per token read (catchup_token_s)
    CATCHUP_MEASURED = 16

    def __init__(
        self,
        max_k: int = 8,
        start_k: int = 3,
        decay: float = 0.95,
        prior_accept: float = 0.6,
        prior_weight: float = 4.0,
        explore_every: int = 8,
        probe_every: int = 4,
    ) -> None:
        self.start_k = start_k
        self.max_k = max_k
        self.decay = decay
        self.explore_every = explore_every
        self.probe_every = probe_every
        self.prior_accept = prior_accept
        self.prior_weight = prior_weight
        self.sources: dict[str, SourceEstimate] = {}
        self._fit = [0.0] * 5  # target passes, decayed sums: n, sum w, sum t, sum w*w, sum w*t
        self._by_width = [(0.0, 0.0)] * (max_k + 2)  # per width: decayed (passes, seconds)
        self.confidence_decay = 0.98  # per step; buckets fill slower than positions
        self.width_prior = 1.0  # one pass's worth of weight for the line at each width
        self.token_s: float | None = None  # seconds per committed token, recent steps
        self.history: list[int] = []
        # what an extra row of a verify pass costs where the widths seen do not say: the last
        # slope the widths gave, else a prompt pass's seconds per token (observe_prefill)
        self.row_s: float | None = None
        # a draft model's one-token pass over the target's, assumed until a draft is measured
        self.draft_ratio: float | None = None
        self.lazy_draft = False  # the draft model reads the prompt only when first asked
        # seconds a draft model took per token it caught up on, measured on a long catch-up
        # (a draft's prompt pass costs more than its size says where its kernels are slower)
        self.catchup_token_s: float | None = None

    def _estimate(self, source: str) -> SourceEstimate:
        if source not in self.sources:
            self.sources[source] = SourceEstimate(self.max_k)
        return self.sources[source]

    def inherit(self, previous: AdaptiveK, keep: float = 0.5) -> None:
        """Start from what an earlier generation with the same drafter learned (its counts
        weighted by `keep`): a pipeline's later requests need no warm-up, and a few unlucky
        first steps cannot talk the policy out of drafting."""
        self.sources = {}
        for name, est in previous.sources.items():
            self.sources[name] = est.scaled(self.max_k, keep)
            self.sources[name].anchor = previous.acceptances(name)[: self.max_k]
        self._fit = [keep * x for x in previous._fit]
        self.token_s = previous.token_s
        self.row_s = previous.row_s
        self.catchup_token_s = previous.catchup_token_s
        widths = [(keep * n, keep * t) for n, t in previous._by_width]
        self._by_width = (widths + [(0.0, 0.0)] * len(self._by_width))[: len(self._by_width)]

    def acceptances(self, source: str = DEFAULT_SOURCE) -> list[float]:
        """[max_k] P(draft token at each position accepted | the earlier ones were).

        Each position's estimate is shrunk toward the previous position's (and the first toward
        `prior_accept`), so that positions rarely reached borrow what is known: acceptance given
        a run of accepted tokens is seldom lower than before it. A generation that inherited an
        estimate shrinks toward where the earlier one left each position instead."""
        est = self._estimate(source)
        p, out = self.prior_accept, []
        for i, (reached, accepted) in enumerate(zip(est.reached, est.accepted, strict=True)):
            toward = est.anchor[i] if i < len(est.anchor) else p
            p = (accepted + self.prior_weight * toward) / (reached + self.prior_weight)
            out.append(p)
        return out

    def acceptance(self, position: int, source: str = DEFAULT_SOURCE) -> float:
        return self.acceptances(source)[position]

    def expected_tokens(self, source: str = DEFAULT_SOURCE, prior: bool = False) -> list[float]:
        """[max_k + 1] expected tokens from a step proposing K = 0..max_k (prior: at the
        prior acceptance, what was seen aside)."""
        totals, chain = [1.0], 1.0
        seen = [self.prior_accept] * self.max_k if prior else self.acceptances(source)
        for p in seen:
            chain *= p
            totals.append(totals[-1] + chain)
        return totals

    def verify_line_s(self, width: int) -> float:
        """A target pass over `width` tokens, from a line fitted to every pass seen."""
        n, sw, st = self._fit[:3]
        if n < 1e-9:
            return 1.0
        mean_w, mean_t = sw / n, st / n
        fitted = self._fitted_slope()
        if fitted is not None:
            slope = fitted
        elif self.row_s is not None:
            slope = self.row_s  # the last slope measured, or a prompt pass's cost per token
        else:
            # nothing says: 5% more per extra token (memory-bound passes cost little more for a
            # few more tokens: docs/bench/measurements.md)
            slope = 0.05 * mean_t / mean_w
        return max(1e-6, mean_t + max(0.0, slope) * (width - mean_w))

    def _fitted_slope(self) -> float | None:
        """Seconds per extra token of the line through the passes seen (None: too little spread
        in their widths to say)."""
        n, sw, st, sww, swt = self._fit
        if n < 1e-9:
            return None
        mean_w, mean_t = sw / n, st / n
        var = sww / n - mean_w * mean_w
        return (swt / n - mean_w * mean_t) / var if var > 0.25 else None

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        """The prompt's passes read `tokens` in `seconds`: until the verify widths measured say
        otherwise, an extra row of a verify pass is assumed to cost as much as a prompt token
        (on a CPU extra rows are compute, as the prompt's are; where they are nearly free, as
        on a GPU, so is the prompt)."""
        if tokens >= 8 and seconds > 0:
            self.row_s = seconds / tokens

    def verify_s(self, width: int) -> float:
        """A target pass over `width` tokens: the passes measured at that width, shrunk toward
        the line. The cost is not linear in the width (docs/bench/measurements.md: steps where a few
        more tokens cost nothing, then a jump), and a line through all of it would overcharge
        some widths and undercharge others."""
        line = self.verify_line_s(width)
        if width >= len(self._by_width):
            return line
        n, total = self._by_width[width]
        return (total + self.width_prior * line) / (n + self.width_prior)

    def draft_cost_s(self, k: int, source: str = DEFAULT_SOURCE) -> float | None:
        """The expected seconds of drafting k tokens from `source` (None: not measured yet)."""
        if k <= 0:
            return 0.0
        est = self._estimate(source)
        return est.draft_s(k, self.width_prior) if est.draft_seen else None

    def _draft_s(self, est: SourceEstimate, source: str, k: int) -> float:
        """Drafting k tokens from `source`: as measured, or before that, for a draft model, k
        passes of draft_ratio times a one-token target pass (a lookup: free)."""
        if not est.draft_seen and source == MODEL and self.draft_ratio is not None:
            return k * self.draft_ratio * self.verify_s(1)
        return est.draft_s(k, self.width_prior)

    def catchup_s(self, behind: int) -> float:
        """Reading `behind` committed tokens into a draft model before it proposes (beyond the
        one or two every step reads, which its measured costs hold): as a long catch-up was
        measured to cost a token, else a prompt pass of the draft's size, draft_ratio times a
        target row's cost a token."""
        extra = behind - 2
        if extra <= 0:
            return 0.0
        if self.catchup_token_s is not None:
            return extra * self.catchup_token_s
        if self.row_s is None:
            return 0.0
        ratio = self.draft_ratio if self.draft_ratio is not None else 1.0
        return extra * ratio * self.row_s

    def expected_rates(
        self, source: str = DEFAULT_SOURCE, behind: int = 0, left: int = 0, prior: bool = False
    ) -> list[float]:
        """[max_k + 1] expected tokens per second for K = 0..max_k under the current estimates
        (prior: the acceptance at its prior). A draft model `behind` the committed tokens first
        reads them: a step that drafts is charged that catch-up's share of the `left` tokens it
        can still make."""
        est = self._estimate(source)
        catch = self.catchup_s(behind) if source == MODEL else 0.0
        rates = []
        for k, tokens in enumerate(self.expected_tokens(source, prior)):
            cost = self._draft_s(est, source, k) + self.verify_s(k + 1)
            if k and catch:
                cost += catch * tokens / max(left, tokens)
            rates.append(tokens / cost)
        return rates

    def can_pay(self, source: str = DEFAULT_SOURCE) -> bool:
        """Whether drafts from `source` that were always accepted would beat K = 0 at the
        measured costs (False: probing them is a pure loss)."""
        est = self._estimate(source)
        alone = 1.0 / self.verify_s(1)
        return any(
            (k + 1) / (self._draft_s(est, source, k) + self.verify_s(k + 1)) > alone
            for k in range(1, self.max_k + 1)
        )

    def decide(
        self, source: str = DEFAULT_SOURCE, choose: bool = True, behind: int = 0, left: int = 0
    ) -> StepDecision:
        """K for a step whose proposal comes from `source`, with the drafting plan for it.
        choose=False: a batch's planner sets K (batch/widths.py: WidthPlanner.plan); the decision
        then allows up to max_k and carries the plan, and the policy's own choice (with its
        probes and exploration, which a planned step would not follow) is not made."""
        k = self.choose_k(source, behind, left) if choose else (0 if source == NONE else self.max_k)
        self.history.append(k)
        return StepDecision(k, self.plan(source) if k > 0 else None)

    def choose_k(self, source: str = DEFAULT_SOURCE, behind: int = 0, left: int = 0) -> int:
        """K for a step from `source`; a draft model `behind` committed tokens (it reads them
        first), the generation able to make `left` more tokens."""
        if source == NONE:
            return 0  # the drafter has nothing to offer (a lookup without a match)
        if source == MODEL and self.lazy_draft and not self.history:
            return 0  # the first token is not kept waiting for the draft's prefill
        est = self._estimate(source)
        if self._fit[0] < 1e-9 and self.row_s is not None:
            k = 0  # what an extra row costs is known, a pass is not: one plain step measures it
        elif est.steps == 0 and self.row_s is None:
            k = self.start_k  # nothing measured at all
        elif self._probe_due(source, est, behind, left):
            k = min(2, self.max_k)  # a probe: has the drafter started to agree again?
            est.probing = True
        else:
            rates = self.expected_rates(source, behind, left)
            k = max(range(self.max_k + 1), key=rates.__getitem__)
            if k == 0 and source == MODEL and rates[1] >= self.HOLD * rates[0]:
                k = 1  # hysteresis: leaving the drafter idle makes it catch up later
            elif k == 0 and source == MODEL and est.judged < self.MIN_JUDGED:
                # too little seen to give up on its acceptance: what the prior acceptance says,
                # at the measured costs and the catch-up it would need
                hopeful = self.expected_rates(source, behind, left, prior=True)
                k = max(range(self.max_k + 1), key=hopeful.__getitem__)
            if est.steps % self.explore_every == 0 and k > 0:
                k = min(self.max_k, k + 1)  # look one further: is the next position worth it?
            if k > 0 and est.confidence_seen and self.token_s is not None:
                k = self.max_k  # the draft's confidence decides, token by token (see plan)
            if est.probing:  # the step after a probe: did it change the decision?
                est.probing = False
                est.probe_after = self.probe_every if k else self._next_gap(est)
        return k

    def _probe_due(self, source: str, est: SourceEstimate, behind: int = 0, left: int = 0) -> bool:
        """Whether a run of K = 0 steps has lasted long enough for a probe. A lookup is never
        probed (its first position is learned at every step for free); nor is a source that
        could not pay even if every draft were accepted; and a draft model that must first read
        what it missed waits until that catch-up fits PROBE_BUDGET of the time at K = 0, so far
        and still to come (`left` tokens): an idle draft falls a token further behind every step,
        as fast as the budget of the steps so far grows, which alone would never allow a probe."""
        if is_lookup(source) or est.zero_streak < max(self.probe_every, est.probe_after):
            return False
        if not self.can_pay(source):
            return False
        catch = self.catchup_s(behind) if source == MODEL else 0.0
        return catch <= self.PROBE_BUDGET * (est.zero_streak + left) * self.verify_s(1)

    def _next_gap(self, est: SourceEstimate) -> int:
        """The K = 0 steps before the next probe after one that changed nothing: twice the last
        gap, and long enough that the probe's measured extra cost stays within PROBE_BUDGET of
        the time spent at K = 0."""
        doubled = 2 * max(self.probe_every, est.probe_after)
        one = self.verify_s(1)
        budgeted = int(est.probe_cost_s / (self.PROBE_BUDGET * one)) if one > 0 else 0
        return min(self.PROBE_MOST, max(doubled, budgeted))

    def plan(self, source: str = DEFAULT_SOURCE) -> DraftPlan:
        """For a draft that reports its confidence: take each drafted token while the chance
        that it is accepted (it and all before it), times the time a token costs this run, pays
        for widening the verify pass; draft another while that chance times the acceptance
        expected of the next token pays for a draft pass as well (the rate-maximizing marginal
        rule: an action pays if it adds tokens at least as cheaply as the run makes them). The
        draft's confidence tells an easy stretch from a hard one before the target sees it, which
        no K fixed in advance can (SpecDec++, Huang et al. 2024, also stops on a learned
        acceptance estimate)."""
        est = self._estimate(source)
        token_s = self.token_s
        if not est.confidence_seen or token_s is None:
            return _take_all  # nothing calibrated yet: draft all of K, and report confidences
        chain = [1.0]  # P(every token so far accepted)

        def rule(position: int, top: float) -> tuple[bool, bool]:
            if position == 0:
                chain[0] = 1.0
            accept = est.accept_given_confidence(top, self.prior_weight)
            chain[0] *= accept
            gain_s = chain[0] * token_s  # expected time this token saves
            widen = self.verify_s(position + 2) - self.verify_s(position + 1)
            if gain_s < widen:
                return False, False
            if position + 1 >= self.max_k:
                return True, False
            # the next token's confidence is unknown until drafted; confident stretches tend to
            # go on, so expect what this token's confidence predicts
            next_gain_s = gain_s * accept
            widen_next = self.verify_s(position + 3) - self.verify_s(position + 2)
            return True, next_gain_s >= est.draft_pass_s + widen_next

        return rule

    def observe(self, step: StepResult) -> None:
        d = self.decay
        self._observe_verify(step)
        if step.source == NONE:
            return  # a plain decode step: its verify time is all there is to learn
        est = self._estimate(step.source)
        est.steps += 1
        if not step.proposed:
            if step.lookup_first_hit is not None:
                # what the lookup offered and the step did not draft: its first position's
                # acceptance, learned for free (sequence.lookup_guess)
                est.reached[0] = d * est.reached[0] + 1.0
                est.accepted[0] = d * est.accepted[0] + float(step.lookup_first_hit)
            est.zero_streak += 1
            return
        self._observe_draft_cost(est, step)
        if est.probing:  # what the probe cost beyond a one-token pass
            est.probe_cost_s = step.draft_s + step.verify_s - self.verify_s(1)
        est.zero_streak = 0
        verified = min(step.proposed, step.accepted + 1)  # positions the target judged
        est.judged += 1
        for i in range(verified):
            est.reached[i] = d * est.reached[i] + 1.0
            est.accepted[i] = d * est.accepted[i] + (1.0 if i < step.accepted else 0.0)
        if step.confidence is not None and step.confidence.shape[0] == step.proposed:
            est.confidence_seen = True
            dc = self.confidence_decay
            est.confidence_reached = [dc * r for r in est.confidence_reached]
            est.confidence_accepted = [dc * a for a in est.confidence_accepted]
            for i in range(verified):
                b = bisect.bisect_right(CONFIDENCE_EDGES, float(step.confidence[i]))
                est.confidence_reached[b] += 1.0
                est.confidence_accepted[b] += 1.0 if i < step.accepted else 0.0

    def _observe_verify(self, step: StepResult) -> None:
        """What a verify pass of the step's width cost, and the seconds per token kept."""
        d = self.decay
        width = step.proposed + 1
        for i, x in enumerate((1.0, width, step.verify_s, width * width, width * step.verify_s)):
            self._fit[i] = d * self._fit[i] + x
        self._by_width = [(d * n, d * t) for n, t in self._by_width]  # stale widths fade
        if width < len(self._by_width):
            n, t = self._by_width[width]
            self._by_width[width] = (n + 1.0, t + step.verify_s)
        fitted = self._fitted_slope()
        if fitted is not None:
            self.row_s = max(0.0, fitted)  # kept when the widths seen later stop varying
        step_s = step.draft_s + step.verify_s
        per_token = step_s / (step.accepted + 1)
        self.token_s = per_token if self.token_s is None else 0.9 * self.token_s + 0.1 * per_token

    def _observe_draft_cost(self, est: SourceEstimate, step: StepResult) -> None:
        """What drafting cost per proposed token: a model pass per token for a draft model,
        next to nothing for a lookup."""
        d = self.decay
        per_token = step.draft_s / step.proposed
        if step.catchup >= self.CATCHUP_MEASURED:  # what reading a token costs, the passes aside
            passes = step.proposed * est.draft_pass_s if est.draft_seen else 0.0
            self.catchup_token_s = max(0.0, step.draft_s - passes) / step.catchup
        if step.catchup <= 2:
            weight = 0.3 if est.draft_seen else 1.0
            est.draft_pass_s = (1 - weight) * est.draft_pass_s + weight * per_token
            est.draft_seen = True
            est.draft_by_k = [(d * n, d * t) for n, t in est.draft_by_k]
            if step.proposed < len(est.draft_by_k):
                n, t = est.draft_by_k[step.proposed]
                est.draft_by_k[step.proposed] = (n + 1.0, t + step.draft_s)
        elif est.draft_seen:
            # a first pass that also caught up several tokens costs at least a one-token
            # pass: an upper bound, which corrects an estimate inflated by a slow first step
            est.draft_pass_s = min(est.draft_pass_s, per_token)
        else:
            # nothing measured yet, and the step's first pass also read `catchup` tokens (a
            # batch row's first draft reads its whole prompt: priced per proposed token,
            # drafting would look several times dearer than it is, and a policy that stops
            # drafting never measures it again). Its seconds per token read are less than a
            # draft pass costs: a provisional, optimistic estimate, which the first step
            # that drafts without a catch-up replaces.
            est.draft_pass_s = step.draft_s / (step.proposed + step.catchup)
