"""The torch modules that are traced into ONNX: (ids, positions, cache...) -> (logits, k/v).

They reuse the Hugging Face model's own submodules (embeddings, norms, projections, MLPs, rotary
embedding), so weights and per-architecture details (biases, rope scaling, norms) come from the
model as the user loaded it. Only the attention with an external cache is written by specx, in
one of the contract's variants (see runtime/artifact/contract.py; its operations are in
graph/ops.py):

- plain: standard ONNX ops only (MatMul, Softmax, ...), parseable by TensorRT; past
  [batch, past_len, kv_heads, head_dim] in, the new positions' keys/values out;
- gqa: ONNX Runtime's GroupQueryAttention op on full-capacity [batch, kv_heads, cache_len,
  head_dim] buffers that it updates in place (rotary embedding inside the op). No copy of the
  cache per step: the decode step stays flat as the context grows, apart from attention itself.
- batched: standard ONNX opset 24 on the gqa layout: TensorScatter writes each row's new keys and
  values at its own length in place, attention reads the whole buffer under a mask built from
  each row's positions; several sequences at different lengths share one pass.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn

from specx.exporter.architecture import DECODER, Architecture, LayerPlan

# (graph/trace.py imports the placeholder opset from here: re-exported)
from specx.exporter.graph.ops import LATER_OPSET as LATER_OPSET
from specx.exporter.graph.ops import LATER_OPSET_DOMAIN as LATER_OPSET_DOMAIN
from specx.exporter.graph.ops import (
    apply_rotary,
    attention_bias,
    gqa_attention,
    grouped_attention,
    last_rows,
    lm_head_logits,
    reshape,
    rotary,
    rotary_caches,
    tensor_scatter,
)


def _conv1d(x: torch.Tensor, conv: Any) -> torch.Tensor:
    """GPT-2's Conv1D (x @ W + b) without its flatten/unflatten views (shape ops in ONNX)."""
    return torch.matmul(x, conv.weight) + conv.bias


class DecoderGraph(nn.Module):
    """The Llama lineage: Llama, Mistral, Qwen2/3, Gemma 3, Phi-3/4, SmolLM3, Granite, OLMo2.

    One module reads what differs from the loaded model: separate or fused (qkv_proj) projections,
    RMS norms on queries and keys (per head, or over the whole projection), where the layer norms
    sit (before each block, after it, or both), per-layer rotary tables and sliding windows,
    layers without rotary embeddings, and the scalar multipliers and soft-caps some families add.
    """

    def __init__(
        self,
        model: Any,
        arch: Architecture,
        attention: str = "plain",
        max_length: int = 0,
        taps: tuple[int, ...] = (),
    ) -> None:
        super().__init__()
        self.taps = taps  # hidden states returned as `features` (runtime/artifact/contract.py)
        self._tapped: dict[int, torch.Tensor] = {}
        self.source = model
        self.model = model.model
        self.lm_head = model.lm_head
        self.attention = attention
        self.num_heads, self.kv_heads, self.head_dim = arch.num_heads, arch.kv_heads, arch.head_dim
        self.plans = arch.layers
        self.rope_kinds = arch.rope_kinds()
        self.scalars = arch.scalars
        layer = self.model.layers[0]
        self.fused_qkv = hasattr(layer.self_attn, "qkv_proj")
        self.sandwich = hasattr(layer, "pre_feedforward_layernorm")  # Gemma: norm before and after
        self.post_norm = not hasattr(layer, "input_layernorm")  # OLMo2: norm after each block
        if attention == "gqa":
            dtype = next(model.parameters()).dtype
            for kind in self.rope_kinds:
                cos, sin = rotary_caches(model, kind, max_length, dtype)
                self.register_buffer(f"cos_{kind}", cos, persistent=False)
                self.register_buffer(f"sin_{kind}", sin, persistent=False)

    def forward(self, input_ids: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden = self.model.embed_tokens(input_ids)  # [batch, seq, hidden]
        if self.scalars.embedding != 1.0:
            hidden = hidden * self.scalars.embedding
        keep = rest[-1] if self.attention == "gqa" else None  # contract.KEEP_LOGITS, last
        if self.attention == "gqa":
            hidden, kv = self._layers_gqa(hidden, rest[0], rest[1], rest[2:-1])
        elif self.attention == "batched":
            hidden, kv = self._layers_batched(hidden, rest[0], rest[1], rest[2:])
        else:
            hidden, kv = self._layers_plain(hidden, rest[0], rest[1:])
        normed = self.model.norm(hidden)
        kept = normed if keep is None else last_rows(normed, keep)  # [batch, keep, hidden]
        logits = lm_head_logits(kept, self.lm_head)  # [batch, keep, vocab]
        if self.scalars.logits_divisor != 1.0:
            logits = logits / self.scalars.logits_divisor
        softcap = self.scalars.final_softcap
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        if not self.taps:
            return (logits, *kv)
        self._tap(len(self.model.layers), normed)
        features = torch.cat([self._tapped[t] for t in self.taps], dim=-1).float()
        return (logits, features, *kv)  # features: [batch, seq, taps * hidden]

    def _tap(self, index: int, hidden: torch.Tensor) -> None:
        """Keep `hidden` (the input of layer `index`, or the final normed state) if a feature
        draft reads it."""
        if index in self.taps:
            self._tapped[index] = hidden

    def _qkv(self, attn: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys, values [batch, seq, heads * head_dim] (normed where the model norms)."""
        heads, kv, dim = self.num_heads, self.kv_heads, self.head_dim
        if self.fused_qkv:
            q, k, v = attn.qkv_proj(x).split([heads * dim, kv * dim, kv * dim], dim=-1)
        else:
            q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        if q_norm is not None and k_norm is not None:
            if q_norm.weight.shape[0] == dim:  # per head (Qwen3, Gemma 3)
                q = reshape(q_norm(reshape(q, 0, -1, heads, dim)), 0, -1, heads * dim)
                k = reshape(k_norm(reshape(k, 0, -1, kv, dim)), 0, -1, kv * dim)
            else:  # over the whole projection (OLMo2)
                q, k = q_norm(q), k_norm(k)
        return q, k, v

    def _block(self, layer: Any, hidden: torch.Tensor, attend: Any) -> torch.Tensor:
        """One layer around its attention (`attend(x) -> [batch, seq, hidden]` after o_proj)."""
        scale = self.scalars.residual
        x = hidden if self.post_norm else layer.input_layernorm(hidden)
        out = attend(x)
        if self.post_norm or self.sandwich:
            out = layer.post_attention_layernorm(out)
        hidden = hidden + out * scale if scale != 1.0 else hidden + out
        if self.sandwich:
            y = layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(hidden)))
        elif self.post_norm:
            y = layer.post_feedforward_layernorm(layer.mlp(hidden))
        else:
            y = layer.mlp(layer.post_attention_layernorm(hidden))
        return hidden + y * scale if scale != 1.0 else hidden + y

    def _positions(
        self, hidden: torch.Tensor, position_ids: torch.Tensor, keys: Any
    ) -> tuple[dict[str, Any], dict[int | None, torch.Tensor]]:
        """Rotary tables per kind ([batch, seq, rotary_dim] cos and sin) and attention biases
        per window ([batch, 1, groups * seq, keys]) for key slots 0 .. keys - 1 at positions
        0 .. keys - 1."""
        tables = {
            kind: rotary(self.source, kind, hidden, position_ids)
            for kind in self.rope_kinds  # sorted: a set's order would vary the node names
        }
        groups = self.num_heads // self.kv_heads
        biases = {
            w: attention_bias(position_ids, keys, hidden.dtype, groups, w)
            for w in sorted({p.window for p in self.plans}, key=lambda w: w or 0)  # as rope_kinds
        }
        return tables, biases

    def _layers(
        self, hidden: torch.Tensor, attend: Callable[[int, Any, LayerPlan, torch.Tensor], Any]
    ) -> torch.Tensor:
        """Every layer in turn; `attend(i, attn, plan, x)` is layer i's attention (after o_proj)
        in the graph's variant."""
        for i, (layer, plan) in enumerate(zip(self.model.layers, self.plans, strict=True)):
            self._tap(i, hidden)
            hidden = self._block(layer, hidden, partial(attend, i, layer.self_attn, plan))
        return hidden

    def _layers_plain(
        self, hidden: torch.Tensor, position_ids: torch.Tensor, past: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        heads, kv, dim = self.num_heads, self.kv_heads, self.head_dim
        tables, biases = self._positions(hidden, position_ids, past[0].shape[1] + hidden.shape[1])
        new_kv: list[torch.Tensor] = []

        def attend(i: int, attn: Any, plan: LayerPlan, x: torch.Tensor) -> Any:
            q, k, v = self._qkv(attn, x)
            q = reshape(q, 0, -1, heads, dim).transpose(1, 2)  # [batch, heads, seq, dim]
            k = reshape(k, 0, -1, kv, dim)  # [batch, seq, kv_heads, head_dim]
            v = reshape(v, 0, -1, kv, dim)
            if plan.rope is not None:
                cos, sin = tables[plan.rope]
                q = apply_rotary(q, cos[:, None], sin[:, None])
                k = apply_rotary(k, cos[:, :, None], sin[:, :, None])  # the cache layout
            new_kv.extend([k, v])
            keys = torch.cat([past[2 * i], k], dim=1)  # [batch, total, kv_heads, head_dim]
            values = torch.cat([past[2 * i + 1], v], dim=1)
            out = grouped_attention(
                q, keys, values, biases[plan.window], attn.scaling, heads, kv, dim
            )
            return attn.o_proj(out)

        return self._layers(hidden, attend), new_kv

    def _layers_batched(
        self,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,  # [batch, seq]
        write_indices: torch.Tensor,  # [batch]
        past: tuple[torch.Tensor, ...],  # [batch, kv_heads, cache_len, head_dim] each
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        heads, kv, dim = self.num_heads, self.kv_heads, self.head_dim
        # Key slot j holds position j in every row: the mask compares slots with positions.
        tables, biases = self._positions(hidden, position_ids, past[0].shape[2])
        present: list[torch.Tensor] = []

        def attend(i: int, attn: Any, plan: LayerPlan, x: torch.Tensor) -> Any:
            q, k, v = self._qkv(attn, x)
            q = reshape(q, 0, -1, heads, dim).transpose(1, 2)  # [batch, heads, seq, dim]
            k = reshape(k, 0, -1, kv, dim).transpose(1, 2)  # [batch, kv_heads, seq, dim]
            v = reshape(v, 0, -1, kv, dim).transpose(1, 2)
            if plan.rope is not None:
                cos, sin = tables[plan.rope]
                q = apply_rotary(q, cos[:, None], sin[:, None])
                k = apply_rotary(k, cos[:, None], sin[:, None])
            keys = tensor_scatter(past[2 * i], k, write_indices)  # in place
            values = tensor_scatter(past[2 * i + 1], v, write_indices)
            present.extend([keys, values])
            out = grouped_attention(
                q, keys, values, biases[plan.window], attn.scaling, heads, kv, dim, True
            )
            return attn.o_proj(out)

        return self._layers(hidden, attend), present

    def _layers_gqa(
        self,
        hidden: torch.Tensor,
        seqlens_k: torch.Tensor,
        total: torch.Tensor,
        past: tuple[torch.Tensor, ...],
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        present: list[torch.Tensor] = []

        def attend(i: int, attn: Any, plan: LayerPlan, x: torch.Tensor) -> Any:
            tables = None
            if plan.rope is not None:
                tables = (getattr(self, f"cos_{plan.rope}"), getattr(self, f"sin_{plan.rope}"))
            q, k, v = self._qkv(attn, x)
            out, new_k, new_v = gqa_attention(
                q,
                k,
                v,
                past[2 * i],
                past[2 * i + 1],
                seqlens_k,
                total,
                tables,
                self.num_heads,
                self.kv_heads,
                float(attn.scaling),
                plan.window,
            )
            present.extend([new_k, new_v])
            return attn.o_proj(out)

        return self._layers(hidden, attend), present


class GPT2Graph(nn.Module):
    """GPT-2 style: learned positions, LayerNorm, fused QKV (Conv1D), GELU MLP."""

    def __init__(self, model: Any, arch: Architecture, attention: str = "plain") -> None:
        super().__init__()
        self.attention = attention
        self.transformer = model.transformer
        self.lm_head = model.lm_head
        self.num_heads, self.head_dim = arch.num_heads, arch.head_dim
        self.scalars = arch.scalars

    def _scale(self, layer: int) -> float:
        scale = 1.0
        if self.scalars.attention_by_dim:
            scale /= float(self.head_dim) ** 0.5
        if self.scalars.attention_by_layer:
            scale /= float(layer + 1)
        return scale

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, *rest: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        seq = input_ids.shape[1]
        t = self.transformer
        hidden = t.wte(input_ids) + t.wpe(position_ids)  # [batch, seq, hidden]
        heads, dim = self.num_heads, self.head_dim
        keep = rest[-1] if self.attention == "gqa" else None  # contract.KEEP_LOGITS, last
        if self.attention == "gqa":
            seqlens_k, total_length, past = rest[0], rest[1], rest[2:-1]
        elif self.attention == "batched":
            write_indices, past = rest[0], rest[1:]
            bias = attention_bias(position_ids, past[0].shape[2], hidden.dtype, 1)
        else:
            past = rest
            bias = attention_bias(position_ids, past[0].shape[1] + seq, hidden.dtype, 1)
        kv_out: list[torch.Tensor] = []
        for i, block in enumerate(t.h):
            x = block.ln_1(hidden)
            qkv = _conv1d(x, block.attn.c_attn)  # [batch, seq, 3 * width]
            q, k, v = qkv.split(heads * dim, dim=2)
            if self.attention == "gqa":
                out, k, v = gqa_attention(
                    q,
                    k,
                    v,
                    past[2 * i],
                    past[2 * i + 1],
                    seqlens_k,
                    total_length,
                    None,
                    heads,
                    heads,
                    self._scale(i),
                )
            elif self.attention == "batched":
                q = reshape(q, 0, -1, heads, dim).transpose(1, 2)  # [batch, heads, seq, dim]
                k = tensor_scatter(
                    past[2 * i], reshape(k, 0, -1, heads, dim).transpose(1, 2), write_indices
                )  # the whole buffer, written in place
                v = tensor_scatter(
                    past[2 * i + 1], reshape(v, 0, -1, heads, dim).transpose(1, 2), write_indices
                )
                out = grouped_attention(q, k, v, bias, self._scale(i), heads, heads, dim, True)
            else:
                q = reshape(q, 0, -1, heads, dim).transpose(1, 2)  # [batch, heads, seq, dim]
                k = reshape(k, 0, -1, heads, dim)  # [batch, seq, heads, head_dim]
                v = reshape(v, 0, -1, heads, dim)
                keys = torch.cat([past[2 * i], k], dim=1)
                values = torch.cat([past[2 * i + 1], v], dim=1)
                out = grouped_attention(q, keys, values, bias, self._scale(i), heads, heads, dim)
            kv_out += [k, v]
            hidden = hidden + _conv1d(out, block.attn.c_proj)
            mlp = block.mlp
            hidden = hidden + _conv1d(mlp.act(_conv1d(block.ln_2(hidden), mlp.c_fc)), mlp.c_proj)
        hidden = t.ln_f(hidden)
        kept = hidden if keep is None else last_rows(hidden, keep)  # [batch, keep, hidden]
        return (lm_head_logits(kept, self.lm_head), *kv_out)


def make_graph_module(
    model: Any,
    arch: Architecture,
    attention: str = "plain",
    max_length: int = 0,
    taps: tuple[int, ...] = (),
) -> nn.Module:
    """The traced module of `model` (described by `arch`); taps: the hidden states the graph
    also returns as `features` (Llama lineage only)."""
    module: nn.Module
    if arch.family.graph == DECODER:
        module = DecoderGraph(model, arch, attention, max_length, taps)
    else:
        module = GPT2Graph(model, arch, attention)
    return module.eval()
