"""The verification a generation's sampling settings call for, bound to its random numbers.

Greedy decoding verifies by argmax (verify.verify_greedy); sampling either by the
drafter-invariant race or by Leviathan et al.'s rejection sampling (verify.py), with the keyed
random numbers of the positions a step's rows decide (sampling.PositionNoise), so that a seed
fixes the text whatever K, drafter or batch the generation runs with.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from specx.runtime.drafters.base import Proposal
from specx.runtime.verification.sampling import (
    ACCEPT,
    RESAMPLE,
    PositionNoise,
    SamplingParams,
    warp,
)
from specx.runtime.verification.verify import verify_greedy, verify_invariant, verify_rejection

# (the proposal, the target's logits [n + 1, vocab], the position row 0 decides) -> verdict:
# (draft tokens accepted, the token the target adds)
Verifier = Callable[[Proposal, np.ndarray, int], tuple[int, int]]


def make_verifier(sampling: SamplingParams, noise: PositionNoise) -> Verifier:
    """The verification these sampling settings call for, with its random numbers drawn for the
    positions the rows decide."""
    if sampling.greedy:
        return lambda proposal, logits, position: verify_greedy(proposal.tokens, logits)

    def invariant(proposal: Proposal, logits: np.ndarray, position: int) -> tuple[int, int]:
        p_target = warp(logits, sampling)  # [n + 1, vocab]
        rows = range(position, position + logits.shape[0])
        exponentials = np.stack([noise.exponentials(p) for p in rows])  # [n + 1, vocab]
        return verify_invariant(proposal.tokens, p_target, exponentials)

    def rejection(proposal: Proposal, logits: np.ndarray, position: int) -> tuple[int, int]:
        p_target = warp(logits, sampling)  # [n + 1, vocab]
        rows = range(position, position + logits.shape[0])
        u_accept = np.array([noise.uniform(ACCEPT, p) for p in rows][:-1])  # [n]
        u_sample = np.array([noise.uniform(RESAMPLE, p) for p in rows])  # [n + 1]
        return verify_rejection(proposal.tokens, proposal.p_draft, p_target, u_accept, u_sample)

    return invariant if sampling.verification == "invariant" else rejection
