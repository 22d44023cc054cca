"""The operations the traced graphs are written in: static reshapes, attention in the contract's
three variants (plain ONNX ops, ONNX Runtime's GroupQueryAttention, opset 24's TensorScatter for
batched rows), the LM head on a 2-D view, and rotary embeddings read from the model's own module.

graph/modules.py assembles them into one module per architecture family;
heads/feature_head.py and the distill trainer reuse them for the draft heads.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


class _StaticReshape(torch.autograd.Function):
    """Reshape to a constant ONNX shape, where 0 copies the input dim and -1 is inferred.

    torch's tracer turns every `view(batch, seq, ...)` into a Shape/Gather/Unsqueeze/Concat chain
    feeding the Reshape (about a thousand nodes for a 30-layer model, a third of a decode step's
    time on a CPU). With 0 for the dynamic dims the shape is one constant.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, *shape: int) -> torch.Tensor:
        resolved = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
        return x.reshape(resolved)

    @staticmethod
    def symbolic(g: Any, x: Any, *shape: int) -> Any:
        const = g.op("Constant", value_t=torch.tensor(list(shape), dtype=torch.int64))
        return g.op("Reshape", x, const)


def reshape(x: torch.Tensor, *shape: int) -> torch.Tensor:
    return _StaticReshape.apply(x, *shape)


class _LastRows(torch.autograd.Function):
    """The last `keep` positions of [batch, seq, hidden] (keep: a 0-d int64 tensor, 1..seq) as
    one ONNX Slice from -keep along the sequence axis: the LM head then runs on the rows a reader
    takes (contract.KEEP_LOGITS), each row computed as in a pass that keeps them all."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return x[:, x.shape[1] - int(keep) :]

    @staticmethod
    def symbolic(g: Any, x: Any, keep: Any) -> Any:
        one = g.op("Constant", value_t=torch.tensor([1], dtype=torch.int64))
        starts = g.op("Neg", g.op("Reshape", keep, one))  # [1], whether fed as [] or [1]
        ends = g.op("Constant", value_t=torch.tensor([2**63 - 1], dtype=torch.int64))
        axes = g.op("Constant", value_t=torch.tensor([1], dtype=torch.int64))
        return g.op("Slice", x, starts, ends, axes)


def last_rows(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return _LastRows.apply(x, keep)


def attention_bias(
    position_ids: torch.Tensor, total_len: Any, dtype: Any, groups: int, window: int | None = None
) -> torch.Tensor:
    """Additive mask [batch, 1, groups * seq, past_len + seq]: key j is visible to a query at
    position p iff j <= p, and with a sliding window also p - window < j (past keys sit at
    positions 0..past_len-1, new keys follow). Tiled `groups` times along the query axis to match
    `grouped_attention`'s folded layout."""
    key_positions = torch.arange(total_len, device=position_ids.device)  # [total]
    visible = key_positions[None, None, :] <= position_ids[:, :, None]  # [batch, seq, total]
    if window is not None:
        visible = visible & (key_positions[None, None, :] > position_ids[:, :, None] - window)
    blocked = torch.full((), torch.finfo(dtype).min, dtype=dtype)
    zero = torch.zeros((), dtype=dtype)
    bias = torch.where(visible, zero, blocked)[:, None, :, :]  # [batch, 1, seq, total]
    return bias.repeat(1, 1, groups, 1) if groups > 1 else bias


def grouped_attention(
    query: torch.Tensor,  # [batch, heads, seq, head_dim]
    keys: torch.Tensor,  # [batch, total, kv_heads, head_dim] ([batch, kv_heads, total, head_dim]
    values: torch.Tensor,  # and likewise when heads_first)
    bias: torch.Tensor,  # [batch, 1, groups * seq, total]
    scale: float,
    heads: int,
    kv_heads: int,
    head_dim: int,
    heads_first: bool = False,
) -> torch.Tensor:
    """Attention where `heads / kv_heads` query heads share each key/value head (GQA).

    The query heads of a group are folded into the sequence axis instead of repeating keys and
    values, so no copy of the cache is made. Returns [batch, seq, heads * head_dim].
    """
    if heads_first:
        k = keys.transpose(2, 3)  # [batch, kv_heads, head_dim, total]
        v = values
    else:
        k = keys.permute(0, 2, 3, 1)  # [batch, kv_heads, head_dim, total]
        v = values.transpose(1, 2)  # [batch, kv_heads, total, head_dim]
    q = reshape(query, 0, kv_heads, -1, head_dim)  # [batch, kv_heads, groups * seq, head_dim]
    scores = torch.matmul(q, k).float() * scale  # [batch, kv_heads, groups * seq, total]
    probs = torch.softmax(scores + bias.float(), dim=-1).to(v.dtype)
    out = torch.matmul(probs, v)  # [batch, kv_heads, groups * seq, head_dim]
    out = reshape(out, 0, heads, -1, head_dim).transpose(1, 2)  # [batch, seq, heads, head_dim]
    return reshape(out, 0, -1, heads * head_dim)


def lm_head_logits(hidden: torch.Tensor, head: nn.Module) -> torch.Tensor:
    """Logits in float32. The head runs on a 2-D view so it exports as Gemm(transB=1) on the
    weight as stored; a tied embedding is then kept once instead of adding a transposed copy."""
    batch, seq = hidden.shape[0], hidden.shape[1]
    weight: torch.Tensor = head.weight  # type: ignore[assignment]  # [vocab, hidden]
    bias = getattr(head, "bias", None)
    logits = F.linear(
        reshape(hidden, -1, int(weight.shape[1])), weight, bias
    )  # [batch * seq, vocab]
    return logits.reshape(batch, seq, int(weight.shape[0])).float()


class _GroupQueryAttention(torch.autograd.Function):
    """com.microsoft::GroupQueryAttention in the traced graph (its torch forward only has to get
    the shapes right: the tracer records the symbolic, ONNX Runtime computes the real thing)."""

    @staticmethod
    def forward(
        ctx: Any,
        query: torch.Tensor,  # [batch, seq, heads * head_dim]
        key: torch.Tensor,  # [batch, seq, kv_heads * head_dim]
        value: torch.Tensor,
        past_key: torch.Tensor,  # [batch, kv_heads, cache_len, head_dim]
        past_value: torch.Tensor,
        seqlens_k: torch.Tensor,  # [batch] int32
        total_length: torch.Tensor,  # [] int32
        cos_cache: torch.Tensor | None,  # [max_length, head_dim / 2]
        sin_cache: torch.Tensor | None,
        heads: int,
        kv_heads: int,
        scale: float,
        window: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return torch.zeros_like(query), past_key.clone(), past_value.clone()

    @staticmethod
    def symbolic(
        g,
        query,
        key,
        value,
        past_key,
        past_value,
        seqlens_k,
        total_length,
        cos_cache,
        sin_cache,
        heads,
        kv_heads,
        scale,
        window,
    ):
        inputs = [query, key, value, past_key, past_value, seqlens_k, total_length]
        rotary = cos_cache is not None
        if rotary:
            inputs += [cos_cache, sin_cache]
        out, present_key, present_value = g.op(
            "com.microsoft::GroupQueryAttention",
            *inputs,
            outputs=3,
            num_heads_i=heads,
            kv_num_heads_i=kv_heads,
            scale_f=scale,
            do_rotary_i=int(rotary),
            rotary_interleaved_i=0,
            local_window_size_i=window,
        )
        out.setType(query.type())
        present_key.setType(past_key.type())
        present_value.setType(past_value.type())
        return out, present_key, present_value


# Operators of a newer opset than the TorchScript tracer writes are traced in this placeholder
# domain; graph/trace.py moves them to the default domain and raises the graph's opset.
LATER_OPSET_DOMAIN = "specx.opset24"
LATER_OPSET = 24


class _TensorScatter(torch.autograd.Function):
    """ai.onnx TensorScatter (opset 24): row b of `update` [batch, kv, seq, dim] written into
    `cache` [batch, kv, cache_len, dim] at positions write_indices[b] .. + seq - 1 (axis 2)."""

    @staticmethod
    def forward(
        ctx: Any, cache: torch.Tensor, update: torch.Tensor, write_indices: torch.Tensor
    ) -> torch.Tensor:
        out = cache.clone()
        for b in range(cache.shape[0]):
            start = int(write_indices[b])
            out[b, :, start : start + update.shape[2]] = update[b]
        return out

    @staticmethod
    def symbolic(g, cache, update, write_indices):
        out = g.op(f"{LATER_OPSET_DOMAIN}::TensorScatter", cache, update, write_indices, axis_i=2)
        out.setType(cache.type())
        return out


def tensor_scatter(
    cache: torch.Tensor, update: torch.Tensor, write_indices: torch.Tensor
) -> torch.Tensor:
    """Each row's new keys or values written into its cache at its own length (in place in the
    graph: the batched graphs bind the cache as both input and output)."""
    return _TensorScatter.apply(cache, update, write_indices)


def gqa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    past_k: torch.Tensor,
    past_v: torch.Tensor,
    seqlens_k: torch.Tensor,
    total: torch.Tensor,
    rotary: tuple[torch.Tensor, torch.Tensor] | None,
    heads: int,
    kv_heads: int,
    scale: float,
    window: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """window: keys a query sees (its own included), None for all. GroupQueryAttention's
    local_window_size takes the same number (-1: no window): measured against transformers'
    sliding-window mask by the parity check, window - 1 and window + 1 both disagree."""
    cos, sin = rotary if rotary is not None else (None, None)
    local = -1 if window is None else window
    return _GroupQueryAttention.apply(
        q, k, v, past_k, past_v, seqlens_k, total, cos, sin, heads, kv_heads, scale, local
    )


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary(model: Any, kind: str, x: torch.Tensor, positions: torch.Tensor) -> Any:
    """cos, sin [batch, seq, rotary_dim] of one rotary table, from the model's own module (so
    scaling, partial rotary and per-layer-type bases are those of the loaded model)."""
    if kind == "default":
        return model.model.rotary_emb(x, positions)
    return model.model.rotary_emb(x, positions, kind)


def rotary_caches(
    model: Any, kind: str, max_length: int, dtype: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin for positions 0..max_length-1, [max_length, rotary_dim / 2] (GroupQueryAttention's
    tables: it rotates the first rotary_dim dims of each head)."""
    positions = torch.arange(max_length)[None]  # [1, max_length]
    cos, sin = rotary(model, kind, torch.zeros(1, dtype=dtype), positions)
    half = cos.shape[-1] // 2
    return cos[0, :, :half].contiguous(), sin[0, :, :half].contiguous()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first cos.shape[-1] dims of each head (all of them, or a part: Phi-4-mini)."""
    dims = cos.shape[-1]
    if dims == x.shape[-1]:
        return x * cos + _rotate_half(x) * sin
    head, rest = x[..., :dims], x[..., dims:]
    return torch.cat([head * cos + _rotate_half(head) * sin, rest], dim=-1)
