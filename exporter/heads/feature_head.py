"""Feature drafts (EAGLE-style heads) as one torch module, read from the published layouts.

A head is one decoder layer that reads the target's hidden states and the embedding of the next
token and predicts the token after it (EAGLE: Li et al. 2024; EAGLE-3: 2025). Two kinds:

- ``eagle`` (EAGLE-1/2, HASS): x = fc([embedding, feature]) (feature: the target's final normed
  hidden state, or the head's own output for later draft tokens), a Llama layer on x, logits
  through the target's LM head (or the head's own);
- ``eagle3``: the target's low, middle and high layers concatenated go through fc once; the
  layer's attention reads [norm(embedding), norm(fused)] (2 x hidden wide); logits through the
  head's own norm and LM head over a reduced draft vocabulary (target id = draft id + d2t[id]).

Layouts read (config.json plus model.safetensors or pytorch_model.bin):

- the EAGLE authors' (SafeAILab/EAGLE): ``fc.*`` + ``layers.0.*`` (EAGLE-1/2; the first layer
  has no input norm), or ``fc.weight`` + ``midlayer.*`` + ``norm`` + ``lm_head`` + ``d2t``/``t2d``
  (EAGLE-3);
- vLLM speculators': ``speculators_model_type`` "eagle" (``fusion_fc``, ``transformer.*``,
  optional ``embedding_layernorm``/``pre_lm_head_layernorm``) or "eagle3" (``fc``,
  ``layers.0.*`` with ``hidden_norm``, ``norm``, ``lm_head``, ``d2t``/``t2d``). `specx distill`
  writes this one (`save_speculators`).

The embedding (and for ``eagle`` the LM head) come from the target unless the checkpoint has
its own. The module's forward is the graph contract of runtime/artifact/contract.py (a plain cache).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from specx.exporter.architecture import describe
from specx.exporter.drafts import HEAD_CONFIG as CONFIG
from specx.exporter.graph.ops import apply_rotary, attention_bias, grouped_attention, reshape
from specx.runtime.errors import ExportError

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


@dataclass(frozen=True)
class HeadConfig:
    kind: str  # "eagle" or "eagle3"
    layout: str  # "eagle" (the EAGLE authors') or "speculators"
    hidden_size: int
    num_heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_eps: float
    taps: tuple[
        int, ...
    ]  # the target's hidden states it reads (runtime/artifact/contract.py numbering)
    target_hidden: int
    fc_bias: bool
    input_norm: bool  # eagle: a norm before attention (speculators' layernorms)
    embed_norm: bool  # eagle: a norm on the embedding (speculators' layernorms)
    head_norm: bool  # a norm before the LM head (eagle3 always)
    norm_before_residual: bool  # eagle3: the residual is the normed fused state
    rope: dict[str, Any]  # LlamaConfig fields of its rotary embedding

    @property
    def feature_size(self) -> int:
        return len(self.taps) * self.target_hidden


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


class FeatureHead(nn.Module):
    """(input_ids, position_ids, features, hidden, from_target, past_key, past_value) ->
    (logits over the target vocabulary, hidden_out, new_key, new_value)."""

    def __init__(
        self,
        cfg: HeadConfig,
        embedding: torch.Tensor,  # [target_vocab, hidden]
        lm_head: torch.Tensor,  # [draft_vocab, hidden]
        draft_ids: torch.Tensor | None,  # [draft_vocab] target id of each draft id; None: same
        target_vocab: int,
    ) -> None:
        super().__init__()
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        self.cfg = cfg
        d = cfg.hidden_size
        self.target_vocab = target_vocab
        self.embed_tokens = nn.Embedding(embedding.shape[0], d)
        self.embed_tokens.weight.data.copy_(embedding)
        fc_in = 2 * d if cfg.kind == "eagle" else cfg.feature_size
        self.fc = nn.Linear(fc_in, d, bias=cfg.fc_bias)
        attn_in = 2 * d if cfg.kind == "eagle3" else d
        self.q_proj = nn.Linear(attn_in, cfg.num_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(attn_in, cfg.kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(attn_in, cfg.kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, d, bias=False)
        self.gate_proj = nn.Linear(d, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(d, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, d, bias=False)
        self.input_norm = RMSNorm(d, cfg.rms_eps)
        self.hidden_norm = RMSNorm(d, cfg.rms_eps)
        self.embed_norm = RMSNorm(d, cfg.rms_eps)
        self.post_norm = RMSNorm(d, cfg.rms_eps)
        self.norm = RMSNorm(d, cfg.rms_eps)
        self.lm_head = nn.Linear(d, lm_head.shape[0], bias=False)
        self.lm_head.weight.data.copy_(lm_head)
        self.register_buffer("draft_ids", draft_ids, persistent=False)
        rope_config = LlamaConfig(
            hidden_size=d,
            num_attention_heads=cfg.num_heads,
            head_dim=cfg.head_dim,
            **cfg.rope,
        )
        self.rotary = LlamaRotaryEmbedding(rope_config)

    def _attention(
        self,
        x: torch.Tensor,
        position_ids: torch.Tensor,
        past_key: torch.Tensor,
        past_value: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        heads, kv, dim = self.cfg.num_heads, self.cfg.kv_heads, self.cfg.head_dim
        q = reshape(self.q_proj(x), 0, -1, heads, dim).transpose(1, 2)  # [batch, heads, seq, dim]
        k = reshape(self.k_proj(x), 0, -1, kv, dim)  # [batch, seq, kv_heads, head_dim]
        v = reshape(self.v_proj(x), 0, -1, kv, dim)
        cos, sin = self.rotary(x, position_ids)  # [batch, seq, head_dim]
        q = apply_rotary(q, cos[:, None], sin[:, None])
        k = apply_rotary(k, cos[:, :, None], sin[:, :, None])
        keys = torch.cat([past_key, k], dim=1)  # [batch, total, kv_heads, head_dim]
        values = torch.cat([past_value, v], dim=1)
        bias = attention_bias(position_ids, keys.shape[1], x.dtype, heads // kv)
        out = grouped_attention(q, keys, values, bias, 1.0 / math.sqrt(dim), heads, kv, dim)
        return self.o_proj(out), k, v

    def forward(
        self,
        input_ids: torch.Tensor,  # [batch, seq]
        position_ids: torch.Tensor,  # [batch, seq]
        features: torch.Tensor,  # [batch, seq, F]
        hidden: torch.Tensor,  # [batch, seq, hidden]
        from_target: torch.Tensor,  # [batch, seq, 1] bool
        past_key: torch.Tensor,  # [batch, past, kv_heads, head_dim]
        past_value: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        emb = self.embed_tokens(input_ids)  # [batch, seq, hidden]
        if cfg.kind == "eagle":
            if cfg.embed_norm:
                emb = self.embed_norm(emb)
            x = self.fc(torch.cat([emb, torch.where(from_target, features, hidden)], dim=-1))
            residual = x
            attn_in = self.input_norm(x) if cfg.input_norm else x
        else:
            fused = torch.where(from_target, self.fc(features), hidden)
            normed = self.hidden_norm(fused)
            residual = normed if cfg.norm_before_residual else fused
            attn_in = torch.cat([self.input_norm(emb), normed], dim=-1)
        attn, new_key, new_value = self._attention(attn_in, position_ids, past_key, past_value)
        x = residual + attn
        y = self.post_norm(x)
        x = x + self.down_proj(nn.functional.silu(self.gate_proj(y)) * self.up_proj(y))
        head_in = self.norm(x) if cfg.head_norm else x
        logits = self.lm_head(head_in).float()  # [batch, seq, draft_vocab]
        draft_ids: torch.Tensor | None = self.draft_ids  # type: ignore[assignment]
        if draft_ids is not None:
            full = torch.full_like(logits[..., :1], float("-inf")).expand(-1, -1, self.target_vocab)
            index = draft_ids.expand(logits.shape[0], logits.shape[1], -1)
            logits = full.scatter(-1, index, logits)  # [batch, seq, target_vocab]
        return logits, x.float(), new_key, new_value


# -- reading checkpoints ------------------------------------------------------------------------


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        path = folder / name
        if not path.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return dict(load_file(str(path)))
            return dict(torch.load(str(path), map_location="cpu", weights_only=True))
        except (OSError, RuntimeError, ValueError) as e:
            raise ExportError(f"cannot read {path}: {str(e)[:200]}", "re-download the head") from e
    raise ExportError(
        f"{folder} holds no {' or '.join(WEIGHT_FILES)}", "pass the head's checkpoint folder"
    )


def _int(cfg: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ExportError(
            f"{where}: {key} must be a positive integer, got {value!r}",
            "pass an EAGLE or speculators head checkpoint",
        )
    return value


@dataclass
class HeadCheckpoint:
    cfg: HeadConfig
    weights: dict[str, torch.Tensor]  # renamed to FeatureHead's parameter names
    draft_to_target: torch.Tensor | None  # [draft_vocab] target ids; None: the full vocabulary
    source: str


# FeatureHead parameter <- the name in each layout (layer prefix substituted for {L})
_LAYER = {
    "q_proj.weight": "{L}self_attn.q_proj.weight",
    "k_proj.weight": "{L}self_attn.k_proj.weight",
    "v_proj.weight": "{L}self_attn.v_proj.weight",
    "o_proj.weight": "{L}self_attn.o_proj.weight",
    "gate_proj.weight": "{L}mlp.gate_proj.weight",
    "up_proj.weight": "{L}mlp.up_proj.weight",
    "down_proj.weight": "{L}mlp.down_proj.weight",
    "post_norm.weight": "{L}post_attention_layernorm.weight",
}


def read_head(path: str | Path, target_layers: int) -> HeadCheckpoint:
    """The head in `path`, its parameters named as FeatureHead's (embedding and LM head still
    missing where the checkpoint takes them from the target: see build_head)."""
    folder = Path(path)
    where = str(folder / CONFIG)
    data = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
    raw = _read_weights(folder)
    speculators = data.get("speculators_model_type")
    layer_cfg = data.get("transformer_layer_config", data) if speculators else data
    kind, prefix = _layout(folder, speculators, raw)
    hidden = _int(layer_cfg, "hidden_size", where)
    heads = _int(layer_cfg, "num_attention_heads", where)
    kv = _int(layer_cfg, "num_key_value_heads", where, heads)
    weights = _head_weights(folder, data, raw, kind, prefix)
    draft_to_target = None
    if "d2t" in raw:
        d2t = raw["d2t"].long()
        draft_to_target = torch.arange(d2t.shape[0]) + d2t
    if kind == "eagle3":
        default_taps = [2, target_layers // 2, target_layers - 3]
        taps = data.get("eagle_aux_hidden_state_layer_ids") or default_taps
    else:
        taps = [target_layers]  # the final normed hidden state
    cfg = HeadConfig(
        kind=kind,
        layout="speculators" if speculators else "eagle",
        hidden_size=hidden,
        num_heads=heads,
        kv_heads=kv,
        head_dim=int(layer_cfg.get("head_dim") or hidden // heads),
        intermediate_size=_int(layer_cfg, "intermediate_size", where),
        rms_eps=float(layer_cfg.get("rms_norm_eps", 1e-6)),
        taps=tuple(int(t) for t in taps),
        target_hidden=int(data.get("target_hidden_size") or hidden),
        fc_bias="fc.bias" in weights,
        # EAGLE-1's first (only) layer skips its input norm; speculators keep it with layernorms
        input_norm=kind == "eagle" and "input_norm.weight" in weights and bool(speculators),
        embed_norm="embed_norm.weight" in weights,
        head_norm="norm.weight" in weights,
        norm_before_residual=bool(data.get("norm_before_residual", False)),
        rope={
            k: layer_cfg[k]
            for k in ("rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings")
            if layer_cfg.get(k) is not None
        },
    )
    return HeadCheckpoint(cfg, weights, draft_to_target, str(folder))


def _layout(folder: Path, speculators: str | None, raw: dict[str, Any]) -> tuple[str, str]:
    """(kind, the layer's name prefix) of a checkpoint: EAGLE-3 or EAGLE-1/2, in the authors' or
    speculators' names."""
    if speculators == "eagle3" or any(k.startswith("midlayer.") for k in raw):
        return "eagle3", "layers.0." if speculators else "midlayer."
    if speculators == "eagle" or "fc.weight" in raw:
        return "eagle", "transformer." if speculators else "layers.0."
    raise ExportError(
        f"{folder}: neither an EAGLE nor a speculators head (no fc/fusion_fc weights)",
        "pass a folder written by EAGLE's or speculators' training, or by `specx distill`",
    )


def _head_weights(
    folder: Path, data: dict[str, Any], raw: dict[str, torch.Tensor], kind: str, prefix: str
) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under FeatureHead's parameter names."""
    speculators = data.get("speculators_model_type")
    weights: dict[str, torch.Tensor] = {}
    for ours, theirs in _LAYER.items():
        key = theirs.format(L=prefix)
        if key not in raw:
            raise ExportError(f"{folder}: the head has no {key}", "the checkpoint is incomplete")
        weights[ours] = raw[key]
    fc = "fusion_fc" if speculators == "eagle" else "fc"
    weights["fc.weight"] = raw[f"{fc}.weight"]
    if f"{fc}.bias" in raw:
        weights["fc.bias"] = raw[f"{fc}.bias"]
    norms = {
        "input_norm.weight": f"{prefix}input_layernorm.weight",
        "hidden_norm.weight": f"{prefix}hidden_norm.weight",
        "embed_norm.weight": "embedding_layernorm.weight",
        "norm.weight": "pre_lm_head_layernorm.weight" if kind == "eagle" else "norm.weight",
    }
    for ours, theirs in norms.items():
        if theirs in raw:
            weights[ours] = raw[theirs]
    if speculators == "eagle" and not data.get("layernorms", False):
        weights.pop("input_norm.weight", None)  # speculators replace it with Identity
    for key in ("embed_tokens.weight", "lm_head.weight"):
        if key in raw:
            weights[key] = raw[key]
    return weights


def build_head(ckpt: HeadCheckpoint, target: Any, target_vocab: int) -> FeatureHead:
    """The FeatureHead of a checkpoint for a loaded target (transformers model): its embedding
    and, for an ``eagle`` head without one, its LM head come from the target."""
    cfg = ckpt.cfg
    where = ckpt.source
    target_hidden = describe(target.config).hidden_size
    if cfg.target_hidden != target_hidden:
        raise ExportError(
            f"{where}: the head reads target hidden states of width {cfg.target_hidden}, the "
            f"target's are {target_hidden}",
            "use the head trained for this target (or train one: specx distill)",
        )
    weights = dict(ckpt.weights)
    embedding = weights.pop("embed_tokens.weight", None)
    if embedding is None:
        embedding = target.get_input_embeddings().weight.detach()
    lm_head = weights.pop("lm_head.weight", None)
    if lm_head is None:
        if cfg.kind == "eagle3":
            raise ExportError(f"{where}: an EAGLE-3 head without lm_head.weight")
        lm_head = target.get_output_embeddings().weight.detach()
    draft_ids = ckpt.draft_to_target
    if draft_ids is None and lm_head.shape[0] != target_vocab:
        if lm_head.shape[0] > target_vocab:
            raise ExportError(
                f"{where}: the head scores {lm_head.shape[0]} ids, the target {target_vocab}",
                "use the head trained for this target",
            )
        draft_ids = torch.arange(lm_head.shape[0])  # the first ids of the target vocabulary
    if draft_ids is not None and int(draft_ids.max()) >= target_vocab:
        raise ExportError(
            f"{where}: the head's d2t map points past the target vocabulary ({target_vocab})",
            "use the head trained for this target",
        )
    if embedding.shape[1] != cfg.hidden_size:
        raise ExportError(
            f"{where}: embedding width {embedding.shape[1]} != the head's {cfg.hidden_size}",
            "the checkpoint is inconsistent",
        )
    head = FeatureHead(cfg, embedding.float(), lm_head.float(), draft_ids, target_vocab)
    own = dict(head.named_parameters())
    for name, tensor in weights.items():
        if name not in own or tuple(own[name].shape) != tuple(tensor.shape):
            shape = tuple(own[name].shape) if name in own else None
            raise ExportError(
                f"{where}: weight {name} has shape {tuple(tensor.shape)}, expected {shape}",
                "the checkpoint does not match its config.json",
            )
        own[name].data.copy_(tensor.float())
    return head.eval()


def save_speculators(
    head: FeatureHead, folder: Path, draft_ids: np.ndarray, target_vocab: int, target: Any
) -> None:
    """The head in vLLM speculators' EAGLE-3 layout (the embedding stays the target's)."""
    from safetensors.torch import save_file

    cfg = head.cfg
    prefix = "layers.0."  # the names read_head reads back
    names = {ours: theirs.format(L=prefix) for ours, theirs in _LAYER.items()}
    names |= {
        "input_norm.weight": f"{prefix}input_layernorm.weight",
        "hidden_norm.weight": f"{prefix}hidden_norm.weight",
        **{name: name for name in ("fc.weight", "fc.bias", "norm.weight", "lm_head.weight")},
    }
    params = dict(head.named_parameters())
    tensors = {theirs: params[ours].detach().cpu().contiguous() for ours, theirs in names.items()}
    ids = torch.from_numpy(np.asarray(draft_ids, np.int64))
    tensors["d2t"] = ids - torch.arange(ids.shape[0])
    t2d = torch.zeros(target_vocab, dtype=torch.bool)
    t2d[ids] = True
    tensors["t2d"] = t2d
    layer = {
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "rms_norm_eps": cfg.rms_eps,
        "vocab_size": target_vocab,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        **{k: v for k, v in cfg.rope.items()},
    }
    config = {
        "speculators_model_type": "eagle3",
        "architectures": ["Eagle3Speculator"],
        "transformer_layer_config": layer,
        "draft_vocab_size": int(ids.shape[0]),
        "norm_before_residual": cfg.norm_before_residual,
        "target_hidden_size": cfg.target_hidden,
        "eagle_aux_hidden_state_layer_ids": list(cfg.taps),
        "speculators_config": {
            "algorithm": "eagle3",
            "verifier": {"architectures": list(getattr(target.config, "architectures", []) or [])},
            "trained_by": "specx distill",
        },
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    save_file(tensors, str(folder / "model.safetensors"))
