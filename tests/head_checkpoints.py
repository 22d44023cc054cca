"""Tiny feature-head checkpoints written in the published layouts, for the tests.

Each writer spells the layout's tensor and config names itself (not through specx), so that a
test reading them through `specx export` checks specx's reading of the layout:

- eagle_authors_v1: SafeAILab/EAGLE's EAGLE-1/2 head (config.json like a LlamaConfig with one
  layer; fc over [embedding, feature] with a bias; layers.0.* whose input_layernorm is unused;
  the target's embedding and LM head);
- eagle_authors_v3: SafeAILab/EAGLE's EAGLE-3 head (fc without bias, midlayer.*, norm, lm_head over
  a reduced vocabulary, d2t offsets and t2d mask);
- speculators_eagle / speculators_eagle3: vLLM speculators' formats (speculators_model_type,
  transformer_layer_config; fusion_fc + transformer.*, or fc + layers.0.* + hidden_norm).

`reference_logits` computes a head's draft logits straight from those tensors, in torch, with
the formulas of the layouts, as the independent check of what specx exports.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch


def _layer_config(target: Any, hidden: int, heads: int, kv: int) -> dict[str, Any]:
    return {
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "intermediate_size": 2 * hidden,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 256,
        "vocab_size": int(target.config.vocab_size),
        "hidden_act": "silu",
        "num_hidden_layers": 1,
    }


def _layer(prefix: str, gen: torch.Generator, attn_in: int, hidden: int, heads: int, kv: int):
    hd = hidden // heads

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) / math.sqrt(shape[-1])

    return {
        f"{prefix}self_attn.q_proj.weight": w(heads * hd, attn_in),
        f"{prefix}self_attn.k_proj.weight": w(kv * hd, attn_in),
        f"{prefix}self_attn.v_proj.weight": w(kv * hd, attn_in),
        f"{prefix}self_attn.o_proj.weight": w(hidden, heads * hd),
        f"{prefix}mlp.gate_proj.weight": w(2 * hidden, hidden),
        f"{prefix}mlp.up_proj.weight": w(2 * hidden, hidden),
        f"{prefix}mlp.down_proj.weight": w(hidden, 2 * hidden),
        f"{prefix}post_attention_layernorm.weight": 1 + 0.1 * torch.randn(hidden, generator=gen),
        f"{prefix}input_layernorm.weight": 1 + 0.1 * torch.randn(hidden, generator=gen),
    }


def _save(folder: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


def _reduced_vocab(target_vocab: int, draft_vocab: int, seed: int) -> tuple[Any, Any]:
    """d2t offsets and the t2d mask of a draft vocabulary: a random subset of the target's."""
    rng = np.random.default_rng(seed)
    ids = np.sort(rng.choice(target_vocab, size=draft_vocab, replace=False))
    d2t = torch.from_numpy(ids - np.arange(draft_vocab)).long()
    t2d = torch.zeros(target_vocab, dtype=torch.bool)
    t2d[torch.from_numpy(ids)] = True
    return d2t, t2d


def write_head(
    layout: str, folder: Path, target: Any, seed: int = 0, draft_vocab: int | None = None
) -> Path:
    """A random head for `target` (a transformers Llama-lineage model) in one of the layouts:
    eagle_authors_v1, eagle_authors_v3, speculators_eagle, speculators_eagle3."""
    gen = torch.Generator().manual_seed(seed)
    hidden = int(target.config.hidden_size)
    heads, kv = 4, 2
    vocab = int(target.config.vocab_size)
    layers = int(target.config.num_hidden_layers)
    draft_vocab = draft_vocab or vocab // 2
    layer_cfg = _layer_config(target, hidden, heads, kv)
    w = torch.randn
    if layout == "eagle_authors_v1":
        tensors = _layer("layers.0.", gen, hidden, hidden, heads, kv)
        tensors["fc.weight"] = w(hidden, 2 * hidden, generator=gen) / math.sqrt(2 * hidden)
        tensors["fc.bias"] = 0.1 * w(hidden, generator=gen)
        # the authors' EAGLE-1 configs name a plain Llama: the weights tell it is a head
        config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **layer_cfg}
        return _save(folder, config, tensors)
    if layout == "speculators_eagle":
        tensors = _layer("transformer.", gen, hidden, hidden, heads, kv)
        tensors["fusion_fc.weight"] = w(hidden, 2 * hidden, generator=gen) / math.sqrt(2 * hidden)
        tensors["embedding_layernorm.weight"] = 1 + 0.1 * w(hidden, generator=gen)
        tensors["pre_lm_head_layernorm.weight"] = 1 + 0.1 * w(hidden, generator=gen)
        config = {
            "speculators_model_type": "eagle",
            "architectures": ["EagleSpeculator", "LlamaDecoderLayer"],
            "transformer_layer_config": layer_cfg,
            "layernorms": True,
            "fusion_bias": False,
        }
        return _save(folder, config, tensors)
    d2t, t2d = _reduced_vocab(vocab, draft_vocab, seed)
    prefix = "midlayer." if layout == "eagle_authors_v3" else "layers.0."
    tensors = _layer(prefix, gen, 2 * hidden, hidden, heads, kv)
    tensors[f"{prefix}hidden_norm.weight"] = 1 + 0.1 * w(hidden, generator=gen)
    tensors["fc.weight"] = w(hidden, 3 * hidden, generator=gen) / math.sqrt(3 * hidden)
    tensors["norm.weight"] = 1 + 0.1 * w(hidden, generator=gen)
    tensors["lm_head.weight"] = w(draft_vocab, hidden, generator=gen) / math.sqrt(hidden)
    tensors["d2t"], tensors["t2d"] = d2t, t2d
    taps = [1, layers // 2, layers - 1]
    if layout == "eagle_authors_v3":
        config = {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "draft_vocab_size": draft_vocab,  # its layers: EAGLE-3's default 2, L // 2, L - 3
            **layer_cfg,
        }
        return _save(folder, config, tensors)
    tensors["fc.bias"] = 0.1 * w(hidden, generator=gen)
    config = {
        "speculators_model_type": "eagle3",
        "architectures": ["Eagle3Speculator"],
        "transformer_layer_config": layer_cfg,
        "draft_vocab_size": draft_vocab,
        "norm_before_residual": True,
        "target_hidden_size": hidden,
        "eagle_aux_hidden_state_layer_ids": taps,
    }
    return _save(folder, config, tensors)


# -- the layouts' formulas, from the raw tensors --------------------------------------------------


def _rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def _rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Llama's rotary embedding on x [seq, heads, dim] (half-split convention), base 10000."""
    dim = x.shape[-1]
    inv = 1.0 / (10000.0 ** (torch.arange(0, dim, 2).float() / dim))
    angles = positions[:, None].float() * inv[None]  # [seq, dim / 2]
    cos = torch.cat([angles.cos(), angles.cos()], -1)[:, None]
    sin = torch.cat([angles.sin(), angles.sin()], -1)[:, None]
    half = dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def _attention(t: dict[str, torch.Tensor], p: str, x: torch.Tensor, heads: int, kv: int):
    seq = x.shape[0]
    q = (x @ t[f"{p}self_attn.q_proj.weight"].T).view(seq, heads, -1)
    k = (x @ t[f"{p}self_attn.k_proj.weight"].T).view(seq, kv, -1)
    v = (x @ t[f"{p}self_attn.v_proj.weight"].T).view(seq, kv, -1)
    pos = torch.arange(seq)
    q, k = _rope(q, pos), _rope(k, pos)
    k = k.repeat_interleave(heads // kv, dim=1)
    v = v.repeat_interleave(heads // kv, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1), -1e30)
    out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(seq, -1)
    return out @ t[f"{p}self_attn.o_proj.weight"].T


def _mlp(t: dict[str, torch.Tensor], p: str, x: torch.Tensor) -> torch.Tensor:
    gate = torch.nn.functional.silu(x @ t[f"{p}mlp.gate_proj.weight"].T)
    return (gate * (x @ t[f"{p}mlp.up_proj.weight"].T)) @ t[f"{p}mlp.down_proj.weight"].T


def reference_logits(
    layout: str, folder: Path, target: Any, ids: np.ndarray, features: np.ndarray
) -> np.ndarray:
    """The head's logits over the target vocabulary for pairs (features[t], ids[t]) at
    positions 0.. (every position reading target features), [seq, vocab]; -inf outside a
    reduced draft vocabulary."""
    from safetensors.torch import load_file

    t = load_file(str(folder / "model.safetensors"))
    emb = target.get_input_embeddings().weight.detach()[torch.from_numpy(ids)]
    f = torch.from_numpy(features)
    heads, kv = 4, 2
    with torch.no_grad():
        if layout in ("eagle_authors_v1", "speculators_eagle"):
            p = "layers.0." if layout == "eagle_authors_v1" else "transformer."
            fc = "fc" if layout == "eagle_authors_v1" else "fusion_fc"
            if layout == "speculators_eagle":
                emb = _rms(emb, t["embedding_layernorm.weight"])
            x = torch.cat([emb, f], -1) @ t[f"{fc}.weight"].T
            if f"{fc}.bias" in t:
                x = x + t[f"{fc}.bias"]
            h = _rms(x, t[f"{p}input_layernorm.weight"]) if layout == "speculators_eagle" else x
            x = x + _attention(t, p, h, heads, kv)
            x = x + _mlp(t, p, _rms(x, t[f"{p}post_attention_layernorm.weight"]))
            if layout == "speculators_eagle":
                x = _rms(x, t["pre_lm_head_layernorm.weight"])
            return (x @ target.get_output_embeddings().weight.detach().T).numpy()
        p = "midlayer." if layout == "eagle_authors_v3" else "layers.0."
        fused = f @ t["fc.weight"].T + t.get("fc.bias", 0)
        normed = _rms(fused, t[f"{p}hidden_norm.weight"])
        residual = normed if layout == "speculators_eagle3" else fused
        x = torch.cat([_rms(emb, t[f"{p}input_layernorm.weight"]), normed], -1)
        x = residual + _attention(t, p, x, heads, kv)
        x = x + _mlp(t, p, _rms(x, t[f"{p}post_attention_layernorm.weight"]))
        draft = _rms(x, t["norm.weight"]) @ t["lm_head.weight"].T  # [seq, draft_vocab]
        full = torch.full((draft.shape[0], int(target.config.vocab_size)), float("-inf"))
        full[:, torch.arange(draft.shape[1]) + t["d2t"]] = draft
        return full.numpy()
