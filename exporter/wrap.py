"""The torch modules that are traced into ONNX: (ids, positions, cache...) -> (logits, k/v).

They reuse the Hugging Face model's own submodules (embeddings, norms, projections, MLPs, rotary
embedding), so weights and per-architecture details (biases, rope scaling, norms) come from the
model as the user loaded it. Only the attention with an external cache is written here, in one
of the contract's two variants (see runtime/contract.py):

- plain: standard ONNX ops only (MatMul, Softmax, ...), parseable by TensorRT; past
  [batch, past_len, kv_heads, head_dim] in, the new positions' keys/values out;
- gqa: ONNX Runtime's GroupQueryAttention op on full-capacity [batch, kv_heads, cache_len,
  head_dim] buffers that it updates in place (rotary embedding inside the op). No copy of the
  cache per step: the decode step stays flat as the context grows, apart from attention itself.
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


def attention_bias(
    position_ids: torch.Tensor, total_len: Any, dtype: Any, groups: int
) -> torch.Tensor:
    """Additive mask [batch, 1, groups * seq, past_len + seq]: key j is visible to a query at
    position p iff j <= p (past keys sit at positions 0..past_len-1, new keys follow). Tiled
    `groups` times along the query axis to match `grouped_attention`'s folded layout."""
    key_positions = torch.arange(total_len, device=position_ids.device)  # [total]
    visible = key_positions[None, None, :] <= position_ids[:, :, None]  # [batch, seq, total]
    blocked = torch.full((), torch.finfo(dtype).min, dtype=dtype)
    zero = torch.zeros((), dtype=dtype)
    bias = torch.where(visible, zero, blocked)[:, None, :, :]  # [batch, 1, seq, total]
    return bias.repeat(1, 1, groups, 1) if groups > 1 else bias


def grouped_attention(
    query: torch.Tensor,  # [batch, heads, seq, head_dim]
    keys: torch.Tensor,  # [batch, total, kv_heads, head_dim]
    values: torch.Tensor,  # [batch, total, kv_heads, head_dim]
    bias: torch.Tensor,  # [batch, 1, groups * seq, total]
    scale: float,
    heads: int,
    kv_heads: int,
    head_dim: int,
) -> torch.Tensor:
    """Attention where `heads / kv_heads` query heads share each key/value head (GQA).

    The query heads of a group are folded into the sequence axis instead of repeating keys and
    values, so no copy of the cache is made. Returns [batch, seq, heads * head_dim].
    """
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
        )
        out.setType(query.type())
        present_key.setType(past_key.type())
        present_value.setType(past_value.type())
        return out, present_key, present_value


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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    cos, sin = rotary if rotary is not None else (None, None)
    return _GroupQueryAttention.apply(
        q, k, v, past_k, past_v, seqlens_k, total, cos, sin, heads, kv_heads, scale
    )


def rotary_caches(model: Any, max_length: int, dtype: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin for positions 0..max_length-1, [max_length, head_dim / 2], from the model's own
    rotary embedding (so rope scaling and attention_scaling are those of the loaded model)."""
    positions = torch.arange(max_length)[None]  # [1, max_length]
    probe = torch.zeros(1, dtype=dtype)
    cos, sin = model.model.rotary_emb(probe, positions)  # [1, max_length, head_dim]
    half = cos.shape[-1] // 2
    return cos[0, :, :half].contiguous(), sin[0, :, :half].contiguous()


def _conv1d(x: torch.Tensor, conv: Any) -> torch.Tensor:
    """GPT-2's Conv1D (x @ W + b) without its flatten/unflatten views (shape ops in ONNX)."""
    return torch.matmul(x, conv.weight) + conv.bias


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaFamilyGraph(nn.Module):
    """Llama, Mistral, Qwen2: RMSNorm, rotary embeddings, (grouped) attention, gated MLP."""

    def __init__(self, model: Any, attention: str = "plain", max_length: int = 0) -> None:
        super().__init__()
        cfg = model.config
        self.model = model.model
        self.lm_head = model.lm_head
        self.attention = attention
        self.num_heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads
        if attention == "gqa":
            dtype = next(model.parameters()).dtype
            cos, sin = rotary_caches(model, max_length, dtype)
            self.register_buffer("cos_cache", cos, persistent=False)
            self.register_buffer("sin_cache", sin, persistent=False)

    def forward(self, input_ids: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.attention == "gqa":
            return self._forward_gqa(input_ids, *rest)
        return self._forward_plain(input_ids, rest[0], *rest[1:])

    def _forward_plain(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, *past: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        seq = input_ids.shape[1]
        hidden = self.model.embed_tokens(input_ids)  # [batch, seq, hidden]
        cos, sin = self.model.rotary_emb(hidden, position_ids)  # [batch, seq, head_dim]
        cos_k, sin_k = cos[:, :, None], sin[:, :, None]  # for [batch, seq, heads, head_dim]
        cos, sin = cos[:, None], sin[:, None]  # for [batch, heads, seq, head_dim]
        total = past[0].shape[1] + seq
        groups = self.num_heads // self.kv_heads
        bias = attention_bias(position_ids, total, hidden.dtype, groups)
        heads, kv, dim = self.num_heads, self.kv_heads, self.head_dim
        new_kv: list[torch.Tensor] = []
        for i, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            q = reshape(attn.q_proj(x), 0, -1, heads, dim).transpose(1, 2)  # [b, heads, s, d]
            k = reshape(attn.k_proj(x), 0, -1, kv, dim)  # [batch, seq, kv_heads, head_dim]
            v = reshape(attn.v_proj(x), 0, -1, kv, dim)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos_k + _rotate_half(k) * sin_k  # rotated in the cache layout
            new_kv += [k, v]
            keys = torch.cat([past[2 * i], k], dim=1)  # [batch, total, kv_heads, head_dim]
            values = torch.cat([past[2 * i + 1], v], dim=1)
            out = grouped_attention(q, keys, values, bias, attn.scaling, heads, kv, dim)
            hidden = hidden + attn.o_proj(out)
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        hidden = self.model.norm(hidden)
        return (lm_head_logits(hidden, self.lm_head), *new_kv)

    def _forward_gqa(
        self,
        input_ids: torch.Tensor,
        seqlens_k: torch.Tensor,
        total: torch.Tensor,
        *past: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        hidden = self.model.embed_tokens(input_ids)  # [batch, seq, hidden]
        rotary: tuple[torch.Tensor, torch.Tensor] = (self.cos_cache, self.sin_cache)  # type: ignore[assignment]
        present: list[torch.Tensor] = []
        for i, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            out, k, v = gqa_attention(
                attn.q_proj(x),
                attn.k_proj(x),
                attn.v_proj(x),
                past[2 * i],
                past[2 * i + 1],
                seqlens_k,
                total,
                rotary,
                self.num_heads,
                self.kv_heads,
                float(attn.scaling),
            )
            present += [k, v]
            hidden = hidden + attn.o_proj(out)
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        hidden = self.model.norm(hidden)
        return (lm_head_logits(hidden, self.lm_head), *present)


class GPT2Graph(nn.Module):
    """GPT-2 style: learned positions, LayerNorm, fused QKV (Conv1D), GELU MLP."""

    def __init__(self, model: Any, attention: str = "plain", max_length: int = 0) -> None:
        super().__init__()
        cfg = model.config
        self.attention = attention
        self.transformer = model.transformer
        self.lm_head = model.lm_head
        self.num_heads = cfg.n_head
        self.head_dim = cfg.n_embd // cfg.n_head
        self.scale_by_dim = bool(getattr(cfg, "scale_attn_weights", True))
        self.scale_by_layer = bool(getattr(cfg, "scale_attn_by_inverse_layer_idx", False))

    def _scale(self, layer: int) -> float:
        scale = 1.0
        if self.scale_by_dim:
            scale /= float(self.head_dim) ** 0.5
        if self.scale_by_layer:
            scale /= float(layer + 1)
        return scale

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, *rest: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        seq = input_ids.shape[1]
        t = self.transformer
        hidden = t.wte(input_ids) + t.wpe(position_ids)  # [batch, seq, hidden]
        heads, dim = self.num_heads, self.head_dim
        if self.attention == "gqa":
            seqlens_k, total_length, past = rest[0], rest[1], rest[2:]
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
        return (lm_head_logits(hidden, self.lm_head), *kv_out)


def make_graph_module(model: Any, attention: str = "plain", max_length: int = 0) -> nn.Module:
    family = SUPPORTED_ARCHITECTURES[model.config.model_type]
    cls = LlamaFamilyGraph if family == "llama" else GPT2Graph
    module: nn.Module = cls(model, attention, max_length)
    return module.eval()


def uses_position_ids(model: Any, attention: str) -> bool:
    """Whether the graph takes position_ids: always for plain graphs; for gqa graphs only where
    positions are learned embeddings (GPT-2), since the op rotates by the cache length itself."""
    return attention == "plain" or SUPPORTED_ARCHITECTURES[model.config.model_type] == "gpt2"
