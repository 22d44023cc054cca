"""K policies: what a policy decides before a step and what it learns after one.

A K policy decides each step (``decide(source) -> StepDecision``) and learns from its result
(``observe(step)``); the step carries everything there is to learn in declared fields, so the two
calls share no hidden state. ``FixedK`` is the plain policy; ``-k auto`` is adaptive.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from specx.runtime.drafters.base import DraftPlan


@dataclass(frozen=True)
class StepDecision:
    """What a K policy decides before a step."""

    k: int  # draft tokens to ask for (the step caps it near the context and token limits)
    plan: DraftPlan | None = None  # a rule the drafter applies token by token (None: take all)


@dataclass(frozen=True)
class StepResult:
    """What a step did, for its K policy and its statistics."""

    tokens: np.ndarray  # [n_accepted + 1] the committed tokens of this step
    source: str  # where the proposal came from (the drafter's answer before the step)
    proposed: int
    accepted: int
    draft_s: float = 0.0
    verify_s: float = 0.0
    draft_passes: int = 0  # draft-model passes of this step
    catchup: int = 0  # committed tokens the drafter had to feed before drafting
    confidence: np.ndarray | None = None  # [proposed] the draft's top probability per token
    # a step that drafted nothing though a lookup had tokens to offer: whether the first of them
    # is the token the target committed (None: no such offer; see sequence.lookup_guess)
    lookup_first_hit: bool | None = None
    k: int = 0  # the K the step asked for (what the policy decided, capped near the limits)


class KPolicy(Protocol):
    def decide(self, source: str) -> StepDecision:
        """K (and a drafting plan) for the next step, whose proposal comes from `source`."""
        ...

    def observe(self, step: StepResult) -> None:
        """Told after every step how its proposal fared."""
        ...


class FixedK:
    """The same K for every step."""

    def __init__(self, k: int) -> None:
        self.k = k

    def decide(self, source: str) -> StepDecision:
        return StepDecision(self.k)

    def observe(self, step: StepResult) -> None:
        """A fixed K learns nothing."""
