"""What `specx distill` trains and reports: the head unrolled as at run time ("training-time
test", EAGLE-3), its soft targets and loss, the batches, the draft vocabulary, and the held-out
acceptance of greedy chain drafts (the figures the report gives and
scripts/diagnostics/head_acceptance.py
reproduces)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from specx.exporter.graph.ops import apply_rotary
from specx.exporter.heads.distill.data import TOP, Sequence
from specx.exporter.heads.feature_head import FeatureHead


def draft_vocabulary(sequences: list[Sequence], size: int, vocab: int) -> np.ndarray:
    """The `size` ids the answers use most (ties: lower id), sorted; all ids when size is 0 or
    not smaller than the vocabulary."""
    if size <= 0 or size >= vocab:
        return np.arange(vocab)
    counts = np.zeros(vocab, np.int64)
    for s in sequences:
        np.add.at(counts, s.ids[s.first_label :], 1)
        if s.top_ids is not None:
            np.add.at(counts, s.top_ids[s.first_label :, 0], 1)
    order = np.lexsort((np.arange(vocab), -counts))
    return np.sort(order[:size])


# -- the unrolled head ---------------------------------------------------------------------------


def unrolled_logits(
    head: FeatureHead, ids: Any, features: Any, valid: Any, steps: int
) -> list[Any]:
    """Draft logits over the head's own vocabulary for every position and unroll step.

    ids [B, T], features [B, T, F], valid [B, T] bool. Step j (1-based) at position t reads the
    pair (step j - 1's hidden_out at t, or fc(features[t]) for j = 1; token t + j) at position
    t + j - 1, attends to the true pairs 0..t (step 1's keys) and to its own chain (the keys of
    steps 2..j at t), and predicts token t + j + 1. Returns [B, T, draft_vocab] per step.
    """
    import torch

    cfg = head.cfg
    batch, length = ids.shape
    heads, kv, dim = cfg.num_heads, cfg.kv_heads, cfg.head_dim
    groups = heads // kv
    emb_all = head.embed_tokens(ids)  # [B, T, d]
    base = torch.arange(length, device=ids.device)[None].expand(batch, -1)
    causal = base[:, None, :] <= base[:, :, None]  # [B, T(query), T(key)]
    causal = causal & valid[:, None, :]
    fused = head.fc(features)  # [B, T, d]
    keys1 = values1 = None
    chain_keys: list[Any] = []
    chain_values: list[Any] = []
    outputs = []
    scale = 1.0 / math.sqrt(dim)
    for j in range(1, steps + 1):
        # pair at position t + j - 1: token t + j (shifted left by j), the fused state
        token_emb = torch.roll(emb_all, shifts=-j, dims=1)
        normed = head.hidden_norm(fused)
        residual = normed if cfg.norm_before_residual else fused
        x = torch.cat([head.input_norm(token_emb), normed], dim=-1)
        positions = base + (j - 1)
        cos, sin = head.rotary(x, positions)  # [B, T, dim]
        q = head.q_proj(x).view(batch, length, heads, dim).transpose(1, 2)
        k = head.k_proj(x).view(batch, length, kv, dim).transpose(1, 2)
        v = head.v_proj(x).view(batch, length, kv, dim).transpose(1, 2)
        q = apply_rotary(q, cos[:, None], sin[:, None])  # [B, H, T, dim]
        k = apply_rotary(k, cos[:, None], sin[:, None])  # [B, kv, T, dim]
        qg = q.view(batch, kv, groups, length, dim)
        if j == 1:
            keys1, values1 = k, v
        else:
            chain_keys.append(k)
            chain_values.append(v)
        assert keys1 is not None and values1 is not None
        out = _unrolled_attention(qg, keys1, values1, chain_keys, chain_values, causal, scale)
        out = out.reshape(batch, heads, length, dim).transpose(1, 2).reshape(batch, length, -1)
        hidden = residual + head.o_proj(out)
        y = head.post_norm(hidden)
        hidden = hidden + head.down_proj(
            torch.nn.functional.silu(head.gate_proj(y)) * head.up_proj(y)
        )
        outputs.append(head.lm_head(head.norm(hidden)).float())
        fused = hidden
    return outputs


def _unrolled_attention(
    qg: Any,
    keys1: Any,
    values1: Any,
    chain_keys: list[Any],
    chain_values: list[Any],
    causal: Any,
    scale: float,
) -> Any:
    """One unroll step's attention: to the true pairs (step 1's keys and values [B, kv, T, dim]
    under `causal` [B, T, T]) and to the step's own chain, the keys of steps 2..j at the same
    position. qg [B, kv, groups, T, dim] -> [B, kv, groups, T, dim]."""
    import torch

    scores1 = torch.einsum("bkgqd,bksd->bkgqs", qg, keys1) * scale
    scores1 = scores1.masked_fill(~causal[:, None, None], float("-inf"))
    if not chain_keys:
        return torch.einsum("bkgqs,bksd->bkgqd", torch.softmax(scores1, dim=-1), values1)
    length = scores1.shape[-1]
    own = [torch.einsum("bkgqd,bkqd->bkgq", qg, ck)[..., None] * scale for ck in chain_keys]
    probs = torch.softmax(torch.cat([scores1, *own], dim=-1), dim=-1)
    out = torch.einsum("bkgqs,bksd->bkgqd", probs[..., :length], values1)
    for i, cv in enumerate(chain_values):
        out = out + probs[..., length + i, None] * cv[:, :, None]
    return out


def soft_targets(
    top_ids: Any, top_probs: Any, to_draft: Any, steps: int, first_label: Any, valid: Any
) -> list[tuple[Any, Any, Any]]:
    """Per step j: (draft ids [B, T, TOP], probabilities [B, T, TOP], mask [B, T]) of the target's
    distribution of token t + j + 1 (its row t + j), renormalised over the draft vocabulary."""
    import torch

    out = []
    length = top_ids.shape[1]
    positions = torch.arange(length, device=top_ids.device)[None]
    for j in range(1, steps + 1):
        ids = torch.roll(top_ids, shifts=-j, dims=1)
        probs = torch.roll(top_probs, shifts=-j, dims=1).float()
        draft = to_draft[ids]  # [B, T, TOP], -1 outside the draft vocabulary
        probs = torch.where(draft >= 0, probs, torch.zeros_like(probs))
        total = probs.sum(-1, keepdim=True)
        label_pos = positions + j + 1  # the token predicted
        mask = (
            (label_pos < length)
            & (label_pos >= first_label[:, None])
            & torch.roll(valid, shifts=-(j + 1), dims=1)
            & (total[..., 0] > 0)
        )
        out.append((draft.clamp(min=0), probs / total.clamp(min=1e-9), mask))
    return out


def length_batches(
    sequences: list[Sequence], size: int, rng: np.random.Generator
) -> list[list[int]]:
    """Sequences of similar length together (less padding), batches in random order."""
    order = sorted(range(len(sequences)), key=lambda i: (len(sequences[i].ids), rng.random()))
    batches = [order[i : i + size] for i in range(0, len(order), size)]
    rng.shuffle(batches)
    return batches


def batch_tensors(sequences: list[Sequence], device: Any) -> dict[str, Any]:
    import torch

    width = max(len(s.ids) for s in sequences)
    n = len(sequences)
    feature_size = sequences[0].features.shape[1]  # type: ignore[union-attr]
    ids = torch.zeros((n, width), dtype=torch.long)
    features = torch.zeros((n, width, feature_size))
    top_ids = torch.zeros((n, width, TOP), dtype=torch.long)
    top_probs = torch.zeros((n, width, TOP))
    valid = torch.zeros((n, width), dtype=torch.bool)
    first = torch.zeros(n, dtype=torch.long)
    for row, s in enumerate(sequences):
        length = len(s.ids)
        ids[row, :length] = torch.from_numpy(s.ids)
        features[row, :length] = torch.from_numpy(s.features.astype(np.float32))  # type: ignore[union-attr]
        top_ids[row, :length] = torch.from_numpy(s.top_ids.astype(np.int64))  # type: ignore[union-attr]
        top_probs[row, :length] = torch.from_numpy(s.top_probs.astype(np.float32))  # type: ignore[union-attr]
        valid[row, :length] = True
        first[row] = s.first_label
    return {
        k: v.to(device)
        for k, v in dict(
            ids=ids,
            features=features,
            top_ids=top_ids,
            top_probs=top_probs,
            valid=valid,
            first=first,
        ).items()
    }


def distill_loss(head: FeatureHead, batch: dict[str, Any], to_draft: Any, steps: int) -> Any:
    import torch

    logits = unrolled_logits(head, batch["ids"], batch["features"], batch["valid"], steps)
    targets = soft_targets(
        batch["top_ids"], batch["top_probs"], to_draft, steps, batch["first"], batch["valid"]
    )
    total = torch.zeros(())
    weight = 0.0
    for j, (lg, (ids, probs, mask)) in enumerate(zip(logits, targets, strict=True)):
        logp = torch.log_softmax(lg, dim=-1).gather(-1, ids)  # [B, T, TOP]
        per_position = -(probs * logp).sum(-1)  # [B, T]
        count = mask.sum().clamp(min=1)
        total = total + 0.8**j * (per_position * mask).sum() / count
        weight += 0.8**j
    return total / weight


OUTSIDE = 1 << 30  # the rank of a target token outside the head's draft vocabulary


def true_token_ranks(
    head: FeatureHead, sequences: list[Sequence], to_draft: Any, steps: int, device: Any
) -> tuple[np.ndarray, float]:
    """Greedy drafting along the target's own answers. For every start (an answer position whose
    next token the head drafts first) and unroll step j = 1..steps: the rank of the target's
    greedy token among the head's draft logits, the head having read the target's tokens before
    it (what it drafts after its earlier drafts were accepted). 0: the head's argmax (a tie for
    the top broken as argmax breaks it), OUTSIDE: not in the draft vocabulary, -1: past the
    answer's end.
    Returns the ranks [starts, steps] and the share of answer tokens in the draft vocabulary."""
    import torch

    out = [np.zeros((0, steps), np.int64)]
    inside = total = 0
    with torch.no_grad():
        for start in range(0, len(sequences), 8):
            batch = batch_tensors(sequences[start : start + 8], device)
            logits = unrolled_logits(head, batch["ids"], batch["features"], batch["valid"], steps)
            length = batch["ids"].shape[1]
            positions = torch.arange(length, device=device)[None]
            columns, starts = [], None
            for j, lg in enumerate(logits, start=1):  # lg: [B, T, draft_vocab]
                greedy = torch.roll(batch["top_ids"][..., 0], shifts=-j, dims=1)  # target argmax
                label_pos = positions + j + 1
                ok = (
                    (label_pos < length)
                    & (label_pos >= batch["first"][:, None])
                    & torch.roll(batch["valid"], shifts=-(j + 1), dims=1)
                )
                starts = ok if starts is None else starts
                index = to_draft[greedy]  # [B, T] the token's draft id, -1 outside
                value = lg.gather(-1, index.clamp(min=0)[..., None])  # [B, T, 1]
                rank = (lg > value).sum(-1)  # [B, T]
                rank += (rank == 0) & (lg.argmax(-1) != index)  # a tie for the top: argmax's
                rank = torch.where(index < 0, OUTSIDE, rank)
                columns.append(torch.where(ok, rank, -1))
            out.append(torch.stack(columns, -1)[starts].cpu().numpy().astype(np.int64))
            answer = [s.ids[s.first_label :] for s in sequences[start : start + 8]]
            for a in answer:
                total += len(a)
                inside += int((to_draft[torch.from_numpy(a)] >= 0).sum())
    return np.concatenate(out), inside / max(1, total)


def chain_acceptance(ranks: np.ndarray) -> list[float]:
    """Per position j of a greedy chain draft: the share of chains whose draft j is the target's
    token, of those whose drafts 1..j - 1 all were (what verification would accept). ranks:
    [starts, steps] from true_token_ranks."""
    alive = np.ones(ranks.shape[0], dtype=bool)
    conditional = []
    for j in range(ranks.shape[1]):
        reached = alive & (ranks[:, j] >= 0)
        alive = reached & (ranks[:, j] == 0)
        conditional.append(float(alive.sum() / max(1, int(reached.sum()))))
    return conditional


def held_out_acceptance(
    head: FeatureHead, sequences: list[Sequence], to_draft: Any, steps: int, device: Any
) -> tuple[list[float], float]:
    """Greedy chain drafting on held-out answers: per position j, the share of chains whose
    first j drafts all equal the target's greedy tokens, conditional on the first j - 1
    (what verification would accept); and the share of answer tokens in the draft vocabulary."""
    ranks, coverage = true_token_ranks(head, sequences, to_draft, steps, device)
    return chain_acceptance(ranks), coverage


def tokens_per_pass(conditional: list[float], k: int) -> float:
    """Expected tokens a target pass commits with K chained drafts: 1 + the expected accepted
    prefix (each draft accepted only if all before it were)."""
    expected, alive = 1.0, 1.0
    for j in range(k):
        alive *= conditional[j]
        expected += alive
    return expected
