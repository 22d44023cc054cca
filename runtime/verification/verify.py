"""Verification of drafted tokens, as small pure numpy functions.

Inputs follow one convention: the target scored ``[last_committed, d_1 .. d_k]`` in one pass, so
row i of the target's output is the distribution of the token after ``d_i`` (row 0: after the
last committed token). With k draft tokens there are k + 1 rows; the last gives the bonus token
when every draft token is accepted. Random numbers come in as arguments (one per row, drawn for
the position the row decides), so every function here is deterministic.

Every function returns ``(n_accepted, next_token)``: the first ``n_accepted`` draft tokens are
kept, then ``next_token`` (the target's correction, or its bonus token) is appended.
"""

from __future__ import annotations

import numpy as np

from specx.runtime.verification.sampling import race, sample

# A residual max(0, p_target - p_draft) with less mass than this is numerically zero.
ZERO_RESIDUAL = 1e-12


def accepted_prefix(draft_tokens: np.ndarray, target_choice: np.ndarray) -> tuple[int, int]:
    """The longest prefix of the draft equal to the target's own choices, then the target's
    choice after it. draft_tokens: [k]; target_choice: [k + 1]."""
    k = int(draft_tokens.shape[0])
    mismatches = np.flatnonzero(target_choice[:k] != draft_tokens)
    n_accepted = int(mismatches[0]) if mismatches.size else k
    return n_accepted, int(target_choice[n_accepted])


def verify_greedy(draft_tokens: np.ndarray, target_logits: np.ndarray) -> tuple[int, int]:
    """Greedy: accept the longest prefix equal to the target's argmax, then the target's token.

    draft_tokens: [k] int; target_logits: [k + 1, vocab].
    """
    k = int(draft_tokens.shape[0])
    return accepted_prefix(draft_tokens, np.argmax(target_logits[: k + 1], axis=-1))


def verify_invariant(
    draft_tokens: np.ndarray, p_target: np.ndarray, exponentials: np.ndarray
) -> tuple[int, int]:
    """Drafter-invariant speculative sampling (Daliri, Musco, Suresh 2024, "Coupling without
    communication and drafter-invariant speculative decoding").

    draft_tokens: [k]; p_target: [k + 1, vocab], the target's warped distributions;
    exponentials: [k + 1, vocab], the Exp(1) draws of the positions the rows decide.

    The target's token at each position is its own exponential-race sample under that position's
    draws (exactly distributed as p_target); a draft token is accepted iff it equals it. A draft
    that races its own distribution with the same draws agrees with probability at least
    (1 - TV) / (1 + TV) (TV: total variation between draft and target), against 1 - TV for
    rejection sampling; in exchange the emitted text depends on the draws alone, never on what
    was drafted: the same seed gives the same text for every K and every drafter.
    """
    k = int(draft_tokens.shape[0])
    return accepted_prefix(draft_tokens, race(p_target[: k + 1], exponentials[: k + 1]))


def residual_distribution(p_target: np.ndarray, p_draft: np.ndarray) -> np.ndarray | None:
    """normalize(max(0, p_target - p_draft)) over the vocabulary, or None if it has no mass."""
    residual = np.maximum(p_target - p_draft, 0.0)
    mass = float(residual.sum())
    if mass <= ZERO_RESIDUAL:
        return None
    return residual / mass


def verify_rejection(
    draft_tokens: np.ndarray,
    p_draft: np.ndarray | None,
    p_target: np.ndarray,
    u_accept: np.ndarray,
    u_sample: np.ndarray,
) -> tuple[int, int]:
    """Speculative sampling by rejection (Leviathan et al. 2023, Alg. 1; Chen et al. 2023).

    draft_tokens: [k] int; p_draft: [k, vocab] (the warped distributions the draft sampled from)
    or None for a deterministic drafter (each token then counts as a point mass);
    p_target: [k + 1, vocab], the target's warped distributions; u_accept: [k] uniforms for the
    acceptance tests; u_sample: [k + 1] uniforms for the correction (row i) or bonus (row k).

    Draft token x at row i is accepted with probability min(1, p_target(x) / p_draft(x)). On the
    first rejection the replacement is drawn from normalize(max(0, p_target - p_draft)); if every
    token is accepted, a bonus token is drawn from p_target's last row. The emitted tokens are then
    distributed exactly as if sampled from p_target one at a time.
    """
    k = int(draft_tokens.shape[0])
    for i in range(k):
        x = int(draft_tokens[i])
        p_target_x = float(p_target[i, x])
        if p_draft is None:
            p_draft_row = np.zeros_like(p_target[i])
            p_draft_row[x] = 1.0  # point mass on the proposed token
        else:
            p_draft_row = p_draft[i]
        p_draft_x = float(p_draft_row[x])
        if p_draft_x <= 0.0:
            # The draft proposed a token it gives no probability: the ratio is undefined. Such a
            # proposal cannot come from sampling p_draft; keep the output exact by rejecting it
            # and drawing the replacement from the target's own row.
            return i, sample(p_target[i], float(u_sample[i]))
        if u_accept[i] * p_draft_x < p_target_x:  # u < p_target(x) / p_draft(x): accept
            continue
        residual = residual_distribution(p_target[i], p_draft_row)
        if residual is None:
            # p_target <= p_draft everywhere (numerically equal): a rejection had ~0 probability
            # and the residual is empty; fall back to the target's own distribution.
            return i, sample(p_target[i], float(u_sample[i]))
        return i, sample(residual, float(u_sample[i]))
    return k, sample(p_target[k], float(u_sample[k]))
