"""The torch modules that are traced into ONNX: (ids, positions, past...) -> (logits, new k/v).

They reuse the Hugging Face model's own submodules (embeddings, norms, projections, MLPs, rotary
embedding), so weights and per-architecture details (biases, rope scaling, norms) come from the
model as the user loaded it. Only the attention with an external cache is written here, in the
contract's layout: past [batch, past_len, kv_heads, head_dim], new keys/values returned for the
new positions only. Plain ONNX ops only (MatMul, Softmax, ...): the graph stays parseable by
TensorRT.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

# model_type -> wrapper family; anything else is refused with this list.
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "gpt2": "gpt2",
}


def attention_bias(position_ids: torch.Tensor, total_len: Any, dtype: Any) -> Any:
    """Additive mask [batch, 1, seq, past_len + seq]: key j is visible to a query at position p
    iff j <= p (past keys sit at positions 0..past_len-1, new keys follow)."""
    key_positions = torch.arange(total_len, device=position_ids.device)  # [total]
    visible = key_positions[None, None, :] <= position_ids[:, :, None]  # [batch, seq, total]
    blocked = torch.full((), torch.finfo(dtype).min, dtype=dtype)
    zero = torch.zeros((), dtype=dtype)
    return torch.where(visible, zero, blocked)[:, None, :, :]


def grouped_attention(
    query: torch.Tensor,  # [batch, heads, seq, head_dim]
    keys: torch.Tensor,  # [batch, total, kv_heads, head_dim]
    values: torch.Tensor,  # [batch, total, kv_heads, head_dim]
    bias: torch.Tensor,  # [batch, 1, seq, total]
    scale: float,
) -> torch.Tensor:
    """Attention where `heads / kv_heads` query heads share each key/value head (GQA).

    The query heads of a group are folded into the sequence axis instead of repeating keys and
    values, so no copy of the cache is made. Returns [batch, seq, heads * head_dim].
    """
    batch, heads, seq, head_dim = query.shape
    kv_heads = keys.shape[2]
    groups = heads // kv_heads
    k = keys.permute(0, 2, 3, 1)  # [batch, kv_heads, head_dim, total]
    v = values.transpose(1, 2)  # [batch, kv_heads, total, head_dim]
    q = query.reshape(batch, kv_heads, groups * seq, head_dim)
    scores = torch.matmul(q, k).float() * scale  # [batch, kv_heads, groups * seq, total]
    scores = scores.reshape(batch, kv_heads, groups, seq, -1) + bias[:, :, None].float()
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    probs = probs.reshape(batch, kv_heads, groups * seq, -1)
    out = torch.matmul(probs, v)  # [batch, kv_heads, groups * seq, head_dim]
    out = out.reshape(batch, heads, seq, head_dim).transpose(1, 2)
    return out.reshape(batch, seq, heads * head_dim)


def lm_head_logits(hidden: torch.Tensor, head: nn.Module) -> torch.Tensor:
    """Logits in float32. The head runs on a 2-D view so it exports as Gemm(transB=1) on the
    weight as stored; a tied embedding is then kept once instead of adding a transposed copy."""
    batch, seq, width = hidden.shape
    weight: torch.Tensor = head.weight  # type: ignore[assignment]  # [vocab, hidden]
    bias = getattr(head, "bias", None)
    logits = F.linear(hidden.reshape(batch * seq, width), weight, bias)
    return logits.reshape(batch, seq, int(weight.shape[0])).float()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaFamilyGraph(nn.Module):
    """Llama, Mistral, Qwen2: RMSNorm, rotary embeddings, (grouped) attention, gated MLP."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        cfg = model.config
        self.model = model.model
        self.lm_head = model.lm_head
        self.num_heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, *past: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        batch, seq = input_ids.shape
        hidden = self.model.embed_tokens(input_ids)  # [batch, seq, hidden]
        cos, sin = self.model.rotary_emb(hidden, position_ids)  # [batch, seq, head_dim]
        cos, sin = cos[:, None], sin[:, None]  # broadcast over heads
        total = past[0].shape[1] + seq
        bias = attention_bias(position_ids, total, hidden.dtype)
        new_kv: list[torch.Tensor] = []
        for i, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            q = attn.q_proj(x).view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(batch, seq, self.kv_heads, self.head_dim)
            q = q * cos + _rotate_half(q) * sin  # [batch, heads, seq, head_dim]
            k = (k * cos + _rotate_half(k) * sin).transpose(1, 2)  # [batch, seq, kv, head_dim]
            new_kv += [k, v]
            keys = torch.cat([past[2 * i], k], dim=1)  # [batch, total, kv_heads, head_dim]
            values = torch.cat([past[2 * i + 1], v], dim=1)
            out = grouped_attention(q, keys, values, bias, attn.scaling)
            hidden = hidden + attn.o_proj(out)
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        hidden = self.model.norm(hidden)
        return (lm_head_logits(hidden, self.lm_head), *new_kv)


class GPT2Graph(nn.Module):
    """GPT-2 style: learned positions, LayerNorm, fused QKV (Conv1D), GELU MLP."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        cfg = model.config
        self.transformer = model.transformer
        self.lm_head = model.lm_head
        self.num_heads = cfg.n_head
        self.head_dim = cfg.n_embd // cfg.n_head
        self.scale_by_dim = bool(getattr(cfg, "scale_attn_weights", True))
        self.scale_by_layer = bool(getattr(cfg, "scale_attn_by_inverse_layer_idx", False))

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, *past: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        batch, seq = input_ids.shape
        t = self.transformer
        hidden = t.wte(input_ids) + t.wpe(position_ids)  # [batch, seq, hidden]
        total = past[0].shape[1] + seq
        bias = attention_bias(position_ids, total, hidden.dtype)
        width = self.num_heads * self.head_dim
        new_kv: list[torch.Tensor] = []
        for i, block in enumerate(t.h):
            x = block.ln_1(hidden)
            qkv = block.attn.c_attn(x)  # [batch, seq, 3 * width]
            q, k, v = qkv.split(width, dim=2)
            q = q.view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
            k = k.view(batch, seq, self.num_heads, self.head_dim)
            v = v.view(batch, seq, self.num_heads, self.head_dim)
            new_kv += [k, v]
            keys = torch.cat([past[2 * i], k], dim=1)
            values = torch.cat([past[2 * i + 1], v], dim=1)
            scale = 1.0
            if self.scale_by_dim:
                scale /= float(self.head_dim) ** 0.5
            if self.scale_by_layer:
                scale /= float(i + 1)
            out = grouped_attention(q, keys, values, bias, scale)
            hidden = hidden + block.attn.c_proj(out)
            hidden = hidden + block.mlp(block.ln_2(hidden))
        hidden = t.ln_f(hidden)
        return (lm_head_logits(hidden, self.lm_head), *new_kv)


def make_graph_module(model: Any) -> nn.Module:
    family = SUPPORTED_ARCHITECTURES[model.config.model_type]
    module: nn.Module = LlamaFamilyGraph(model) if family == "llama" else GPT2Graph(model)
    return module.eval()
