"""What specx knows about a model family, read from a transformers config.

`describe(config)` is the one place the exporter reads a model's shape from its config: the
dimensions an export and the memory planner need, the parameter count, each layer's rotary table
and sliding window, the scalar factors some families add, which graph module traces it, and
whether ONNX Runtime's GroupQueryAttention can run its attention. FAMILIES says, per
`model_type`, how to read that: a new architecture of the Llama lineage is one entry there plus a
tiny model in tests/tiny_models.py (exporter/DESIGN.md, "Adding an architecture").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specx.profiles.planner import ModelShape
from specx.runtime.errors import ExportError

DECODER = "decoder"  # graph/modules.py: DecoderGraph, the Llama lineage
GPT2 = "gpt2"  # graph/modules.py: GPT2Graph


@dataclass(frozen=True)
class ConfigNames:
    """The config fields that hold a family's dimensions; each must be a positive integer."""

    hidden: str = "hidden_size"
    layers: str = "num_hidden_layers"
    heads: str = "num_attention_heads"
    vocab: str = "vocab_size"
    intermediate: str = "intermediate_size"
    positions: str = "max_position_embeddings"
    intermediate_required: bool = True  # False: unset means 4 x hidden (GPT-2's n_inner)
    grouped: bool = True  # num_key_value_heads and head_dim may be given (GPT-2: neither)

    def required(self) -> tuple[str, ...]:
        inner = (self.intermediate,) if self.intermediate_required else ()
        return (self.hidden, self.layers, self.heads, self.vocab, *inner, self.positions)


GPT2_NAMES = ConfigNames(
    "n_embd", "n_layer", "n_head", "vocab_size", "n_inner", "n_positions", False, False
)


@dataclass(frozen=True)
class Family:
    """How specx reads one `model_type`: its graph module and what its config spells how."""

    graph: str = DECODER
    names: ConfigNames = ConfigNames()
    # config.sliding_window on "sliding_attention" layers only (else on every layer, or none)
    windows_by_layer_type: bool = False
    rope_by_layer_type: bool = False  # a rotary table per layer type (Gemma 3: local, global)
    nope_layers: bool = False  # config.no_rope_layers marks layers without rotary (SmolLM3)
    partial_rotary: bool = False  # its default rotary turns partial_rotary_factor of a head
    qkv_bias: bool = False  # q/k/v carry biases whatever attention_bias says (Qwen2)


# model_type -> how specx reads it; anything else is refused with this list.
FAMILIES: dict[str, Family] = {
    "llama": Family(),
    "mistral": Family(),
    "qwen2": Family(windows_by_layer_type=True, qkv_bias=True),
    "qwen3": Family(windows_by_layer_type=True),
    "gemma3_text": Family(windows_by_layer_type=True, rope_by_layer_type=True),
    "phi3": Family(partial_rotary=True),
    "smollm3": Family(windows_by_layer_type=True, nope_layers=True),
    "granite": Family(),
    "olmo2": Family(),
    "gpt2": Family(graph=GPT2, names=GPT2_NAMES),
}


@dataclass(frozen=True)
class LayerPlan:
    """What differs between the layers of one model."""

    rope: str | None  # which rotary table ("default", or a layer type for Gemma 3); None: NoPE
    window: int | None  # sliding window (keys attended, the query's own included) or None


@dataclass(frozen=True)
class Scalars:
    """Scalar factors some families apply (the neutral value where a family has none)."""

    embedding: float = 1.0  # Granite's embedding_multiplier
    residual: float = 1.0  # Granite's residual_multiplier
    logits_divisor: float = 1.0  # Granite's logits_scaling
    final_softcap: float | None = None  # Gemma 3's final_logit_softcapping
    attention_by_dim: bool = True  # GPT-2's scale_attn_weights: scores / sqrt(head_dim)
    attention_by_layer: bool = False  # GPT-2's scale_attn_by_inverse_layer_idx


@dataclass(frozen=True)
class Architecture:
    """One model's shape as specx exports and plans it (see the module's docstring)."""

    model_type: str
    family: Family
    num_layers: int
    num_heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int  # the config's (an export counts the loaded model's output rows)
    # positions a graph can serve: the config's, cut to the original context under LongRoPE
    max_positions: int
    config_positions: int  # the config's max_position_embeddings, as the planner checks it
    tied_head: bool
    qkv_bias: bool  # q/k/v projections with biases (the parameter count)
    layers: tuple[LayerPlan, ...]  # per layer (Llama lineage; empty for GPT-2)
    rotary_dims: dict[str, int]  # per rotary table: the dims of a head it turns
    scalars: Scalars

    @property
    def llama_lineage(self) -> bool:
        return self.family.graph == DECODER

    @property
    def embedding_parameters(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_parameters(self) -> int:
        """The parameter count the planner uses, from the dimensions alone."""
        hidden, inner, vocab = self.hidden_size, self.intermediate_size, self.vocab_size
        if not self.llama_lineage:  # GPT-2: fused Conv1D projections, learned positions
            per_layer = 4 * hidden * hidden + 2 * hidden * inner + 9 * hidden + inner
            positions = self.config_positions * hidden
            return vocab * hidden + positions + self.num_layers * per_layer + 2 * hidden
        heads, kv, dim = self.num_heads, self.kv_heads, self.head_dim
        attention = hidden * heads * dim * 2 + hidden * kv * dim * 2
        if self.qkv_bias:
            attention += heads * dim + 2 * kv * dim
        per_layer = attention + 3 * hidden * inner + 2 * hidden
        head = 0 if self.tied_head else vocab * hidden
        return vocab * hidden + self.num_layers * per_layer + hidden + head

    @property
    def gqa_misfit(self) -> str | None:
        """Why GroupQueryAttention cannot run this attention (None: it can). The op needs
        head_dim a multiple of 16 and each rotary table's half width a multiple of 8."""
        if not self.llama_lineage:
            return None
        if self.head_dim % 16:
            return f"head_dim {self.head_dim} is not a multiple of 16"
        for kind in self.rope_kinds():
            half = (self.rotary_dims[kind] + 1) // 2  # the table's frequencies
            if half % 8:
                return (
                    f"its rotary embedding turns {2 * half} of {self.head_dim} dims, not a "
                    "multiple of 16"
                )
        return None

    def rope_kinds(self) -> list[str]:
        """The rotary tables its layers read, sorted."""
        return sorted({p.rope for p in self.layers if p.rope is not None})

    def takes_position_ids(self, attention: str) -> bool:
        """Whether its graph takes position_ids: always for plain and batched graphs; for gqa
        only where positions are learned embeddings (GPT-2), since the op rotates by the cache
        length itself."""
        return attention != "gqa" or self.family.graph == GPT2

    def model_shape(self, name: str, weights: str = "profile") -> ModelShape:
        """What the memory planner reads of it (profiles/planner.py)."""
        return ModelShape(
            name,
            self.num_parameters,
            self.embedding_parameters,
            self.num_layers,
            self.kv_heads,
            self.head_dim,
            self.vocab_size,
            self.config_positions,
            weights,
        )


def _rope_parameters(config: Any) -> dict[str, Any]:
    return getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}


def _rope_type(parameters: dict[str, Any]) -> str:
    return str(parameters.get("rope_type", parameters.get("type", "default")))


def _supported_list() -> str:
    return ", ".join(sorted(FAMILIES))


def check_config_values(config: Any, names: ConfigNames, where: str) -> None:
    """The dimensions a config gives are positive integers that fit together."""
    values: dict[str, Any] = {name: getattr(config, name, None) for name in names.required()}
    kv = getattr(config, "num_key_value_heads", None) if names.grouped else None
    head_dim = getattr(config, "head_dim", None) if names.grouped else None
    optional = {"num_key_value_heads": kv, "head_dim": head_dim}
    values.update({k: v for k, v in optional.items() if v is not None})
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ExportError(
                f"{where}: config.json gives {name} = {value!r}; a positive integer is needed",
                "fix the model's config.json (or pass another model)",
            )
    heads, width = int(values[names.heads]), int(values[names.hidden])
    if kv is not None and heads % kv:
        raise ExportError(
            f"{where}: num_key_value_heads {kv} does not divide num_attention_heads {heads}",
            "fix the model's config.json",
        )
    if head_dim is None and width % heads:
        raise ExportError(
            f"{where}: hidden size {width} is not a multiple of the {heads} attention heads",
            "fix the model's config.json",
        )


def check_architecture(config: Any, where: str) -> Family:
    """The family of a config specx can export; refused (with the supported list) otherwise."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = getattr(config, "model_type", None)
    family = FAMILIES.get(str(model_type))
    if family is not None:
        check_config_values(config, family.names, where)
        rope_type = _rope_type(_rope_parameters(config))
        if rope_type in ("dynamic",):
            raise ExportError(
                f"{where}: rope type {rope_type!r} depends on the sequence length and cannot be "
                "exported as one static graph",
                "use a model with default, linear, llama3 or yarn rope scaling",
            )
        return family
    heads = [a for a in getattr(config, "architectures", None) or []]
    causal_heads = [a for a in heads if a.endswith(("ForCausalLM", "LMHeadModel"))]
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or (heads and not causal_heads):
        what = f"{model_type!r} model" + (f" ({', '.join(heads)})" if heads else "")
        raise ExportError(
            f"{where} is a {what}, not a causal language model",
            f"pass a decoder-only LM; specx exports {_supported_list()}",
        )
    raise ExportError(
        f"{where}: architecture {model_type!r} is not supported",
        f"supported architectures: {_supported_list()}",
    )


def describe(config: Any, where: str = "the model") -> Architecture:
    """The architecture of `config` (checked first: see check_architecture)."""
    family = check_architecture(config, where)
    names = family.names
    hidden, layers = int(getattr(config, names.hidden)), int(getattr(config, names.layers))
    heads = int(getattr(config, names.heads))
    grouped = names.grouped
    kv = int((getattr(config, "num_key_value_heads", None) if grouped else None) or heads)
    head_dim = int((getattr(config, "head_dim", None) if grouped else None) or hidden // heads)
    positions = int(getattr(config, names.positions))
    plans = _layer_plans(config, family, layers) if family.graph == DECODER else ()
    kinds = {p.rope for p in plans if p.rope is not None}
    return Architecture(
        model_type=str(config.model_type),
        family=family,
        num_layers=layers,
        num_heads=heads,
        kv_heads=kv,
        head_dim=head_dim,
        hidden_size=hidden,
        intermediate_size=int(getattr(config, names.intermediate, None) or 4 * hidden),
        vocab_size=int(config.vocab_size),
        max_positions=_served_positions(config, positions),
        config_positions=positions,
        tied_head=family.graph == GPT2 or bool(getattr(config, "tie_word_embeddings", False)),
        qkv_bias=family.qkv_bias or bool(getattr(config, "attention_bias", False)),
        layers=plans,
        rotary_dims={k: _rotary_dims(config, family, head_dim, k) for k in sorted(kinds)},
        scalars=_scalars(config),
    )


def _served_positions(config: Any, positions: int) -> int:
    if _rope_type(_rope_parameters(config)) == "longrope":
        # LongRoPE switches every position's frequencies once a sequence outgrows the original
        # context, which a cache of already-rotated keys cannot follow: exact up to there.
        original = getattr(config, "original_max_position_embeddings", None) or positions
        return min(positions, int(original))
    return positions


def _layer_plans(config: Any, family: Family, layers: int) -> tuple[LayerPlan, ...]:
    """Per layer: its rotary table and its attention window, as transformers' modules of the
    family set them from the config."""
    types = getattr(config, "layer_types", None) or [None] * layers
    every = getattr(config, "sliding_window", None)
    plans = []
    for i in range(layers):
        window = every
        if family.windows_by_layer_type:  # SmolLM3 also asks use_sliding_window
            sliding = types[i] == "sliding_attention"
            window = every if sliding and getattr(config, "use_sliding_window", True) else None
        if family.nope_layers and not config.no_rope_layers[i]:
            rope = None
        elif family.rope_by_layer_type and types[i]:
            rope = str(types[i])
        else:
            rope = "default"
        plans.append(LayerPlan(rope, int(window) if window else None))
    return tuple(plans)


def _rotary_dims(config: Any, family: Family, head_dim: int, kind: str) -> int:
    """The dims of a head one rotary table turns, as transformers computes them: scaled rope
    types, and a family's default rope where it says so, turn partial_rotary_factor of a head."""
    parameters = _rope_parameters(config)
    if family.rope_by_layer_type:
        parameters = parameters.get(kind) or {}
    partial = 1.0
    if family.partial_rotary or _rope_type(parameters) != "default":
        fallback = getattr(config, "partial_rotary_factor", None) or 1.0
        partial = float(parameters.get("partial_rotary_factor", fallback))
    return int(head_dim * partial)


def _scalars(config: Any) -> Scalars:
    def factor(name: str) -> float:
        return float(getattr(config, name, 1.0) or 1.0)

    return Scalars(
        embedding=factor("embedding_multiplier"),
        residual=factor("residual_multiplier"),
        logits_divisor=factor("logits_scaling"),
        final_softcap=getattr(config, "final_logit_softcapping", None),
        attention_by_dim=bool(getattr(config, "scale_attn_weights", True)),
        attention_by_layer=bool(getattr(config, "scale_attn_by_inverse_layer_idx", False)),
    )
