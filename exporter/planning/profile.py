"""Before any export work: read the configs, apply the profile's limits, plan the memory."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from specx.exporter.drafts import DraftEntry
from specx.exporter.weights.load import CONFIG_ERRORS, Log, check_architecture
from specx.profiles import Profile
from specx.profiles.planner import ModelShape, Plan, advice, plan
from specx.runtime.drafters import registry
from specx.runtime.errors import ExportError


def read_config(source: str) -> Any:
    """The model's config only (no weights): seconds even for a .gguf file."""
    from transformers import AutoConfig

    path = Path(source).expanduser()
    try:
        if path.suffix.lower() == ".gguf":
            return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        return AutoConfig.from_pretrained(str(path) if path.exists() else source)
    except CONFIG_ERRORS as e:
        raise ExportError(
            f"cannot read the model config of {source}: {str(e).splitlines()[0][:300]}",
            "check the path and its config.json (a hub id needs network access)",
        ) from e


def shape_from_config(config: Any, name: str, weights: str = "profile") -> ModelShape:
    """Parameter count and cache dimensions from a config (llama family or GPT-2)."""
    if config.model_type == "gpt2":
        hidden, layers, heads = config.n_embd, config.n_layer, config.n_head
        vocab, inner = config.vocab_size, config.n_inner or 4 * config.n_embd
        per_layer = 4 * hidden * hidden + 2 * hidden * inner + 9 * hidden + inner
        params = vocab * hidden + config.n_positions * hidden + layers * per_layer + 2 * hidden
        return ModelShape(
            name,
            params,
            vocab * hidden,
            layers,
            heads,
            hidden // heads,
            vocab,
            config.n_positions,
            weights,
        )
    hidden, layers = config.hidden_size, config.num_hidden_layers
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    dim = getattr(config, "head_dim", None) or hidden // heads
    vocab, inner = config.vocab_size, config.intermediate_size
    attention = hidden * heads * dim * 2 + hidden * kv * dim * 2
    if getattr(config, "attention_bias", False) or config.model_type == "qwen2":
        attention += heads * dim + 2 * kv * dim
    per_layer = attention + 3 * hidden * inner + 2 * hidden
    head = 0 if getattr(config, "tie_word_embeddings", False) else vocab * hidden
    params = vocab * hidden + layers * per_layer + hidden + head
    return ModelShape(
        name,
        params,
        vocab * hidden,
        layers,
        kv,
        dim,
        vocab,
        int(config.max_position_embeddings),
        weights,
    )


def plan_pair(
    profile: Profile,
    target: str,
    drafts: list[DraftEntry],
    engines: bool,
    log: Log,
) -> Plan:
    """Check the profile against the models and the memory budget; refuse early if it fails."""
    config = read_config(target)
    check_architecture(config, target)
    shapes = [shape_from_config(config, "target")]
    for d in drafts:
        recipe = d.kind.export
        if recipe == registry.EXPORT_NOTHING:
            continue
        if recipe == registry.EXPORT_QUANTIZED:
            shapes.append(shape_from_config(config, d.name, weights=d.kind.name))
        elif recipe == registry.EXPORT_TARGET:
            shared = shape_from_config(config, d.name)
            shapes.append(replace(shared, num_parameters=0, embedding_parameters=0))
        else:
            dconfig = read_config(d.source)
            check_architecture(dconfig, d.source)
            shapes.append(shape_from_config(dconfig, d.name))
    for s in shapes:
        if profile.max_context > s.max_positions:
            raise ExportError(
                f"profile {profile.name!r}: max_context {profile.max_context} is above the "
                f"{s.max_positions} positions that {s.name} supports",
                f"use a profile (or a copy of it) with max_context <= {s.max_positions}",
            )
    result = plan(profile, shapes, engines)
    log(result.table())
    if not result.fits:
        raise ExportError(
            f"the pair needs {result.total_mb:.0f} MB but profile {profile.name!r} allows "
            f"{result.budget_mb:.0f} MB",
            advice(result, profile),
        )
    return result
