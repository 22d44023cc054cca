"""What a deployment tool needs to know about an artifact, as one stable JSON object
(`specx info --json`): its graphs and how they were made, the operators they use and the oldest
ONNX Runtime that runs them, the context and the memory of its caches, its drafters. Read from
the manifest alone; a change of shape is a change of FACTS_VERSION.
"""

from __future__ import annotations

from typing import Any

from specx.runtime.artifact.contract import Manifest, ModelSpec
from specx.runtime.artifact.requirements import min_onnxruntime, operators_of
from specx.runtime.drafters import registry

FACTS_VERSION = 1
BYTES = {"float32": 4, "float16": 2}


def cache_bytes_per_token(spec: ModelSpec) -> int:
    """Keys and values of one position, every layer (an imported concat graph's cache holds
    two sets: runtime/concat_cache.py)."""
    sets = 2 if spec.attention == "concat" else 1
    return sets * 2 * spec.num_layers * spec.kv_heads * spec.head_dim * BYTES[spec.dtype]


def _model(manifest: Manifest, spec: ModelSpec) -> dict[str, Any]:
    (major, minor), why = min_onnxruntime(spec)
    return {
        "role": spec.role,
        "name": spec.name,
        "graph": spec.graph,
        "kind": "target" if spec.role == "target" else registry.kind_of_spec(manifest, spec).name,
        "architecture": spec.architecture,
        "variant": "fp32" if spec.variant == "plain" else spec.variant,
        "dtype": spec.dtype,
        "attention": spec.attention,
        "num_layers": spec.num_layers,
        "vocab_size": spec.vocab_size,
        "max_length": spec.max_length,
        "num_parameters": spec.num_parameters,
        "weight_bytes": spec.weight_bytes,
        "cache_bytes_per_token": cache_bytes_per_token(spec),
        "operators": list(operators_of(spec)),
        "operators_recorded": bool(spec.operators),
        "min_onnxruntime": f"{major}.{minor}",
        "min_onnxruntime_reason": why,
        # a target's features output (the hidden states a feature draft reads), a head's record
        "feature_layers": list(spec.feature_layers),
        "head": spec.head.to_json() if spec.head is not None else None,
        # int4/int8 graphs: where their blocks came from and how they compare with float32
        "quantization": _quantization(spec),
    }


def _quantization(spec: ModelSpec) -> dict[str, Any] | None:
    weights, calibration = spec.parity.get("weights"), spec.parity.get("calibration")
    if not isinstance(weights, dict) or not isinstance(calibration, dict):
        return None
    keys = ("argmax_agreement", "max_abs_logit_diff", "passes_parted", "passes_max_abs_logit_diff")
    return {
        "carried_from_gguf": weights.get("carried", {}),
        "requantized": len(weights.get("requantized", {})),
        "compute": weights.get("compute"),
        "wide_blocks": weights.get("wide_blocks", "carry"),  # artifacts before it: carried
        "calibration_tokens": calibration.get("tokens"),
        **{k: calibration.get(k) for k in keys},
    }


def artifact_facts(manifest: Manifest) -> dict[str, Any]:
    models = [manifest.target, *manifest.drafts]
    per_token = sum(cache_bytes_per_token(s) for s in models)
    needs = max(min_onnxruntime(s)[0] for s in models)
    operators = sorted({op for s in models for op in operators_of(s)})
    return {
        "facts_version": FACTS_VERSION,
        "format_version": manifest.format_version,
        "pair_id": manifest.pair_id,
        "context": manifest.max_length,
        "tokenizer": {"file": manifest.tokenizer, "vocab_size": manifest.tokenizer_vocab_size},
        "eos_token_ids": list(manifest.special_tokens.eos_token_ids),
        "chat_template": manifest.chat_template is not None,
        "models": [_model(manifest, s) for s in models],
        # optional: the target's batched graph (several sequences per pass; its own ORT minimum)
        "batched": _model(manifest, manifest.batched) if manifest.batched is not None else None,
        "drafters": registry.drafter_names(manifest),
        "default_drafter": registry.default_drafter(manifest),
        "onnxruntime": {
            "min_version": f"{needs[0]}.{needs[1]}",
            "operators": operators,
            "contrib_operators": [op for op in operators if op.startswith("com.microsoft:")],
        },
        "kv_cache_bytes": {
            "per_token": per_token,
            "full_context": per_token * manifest.max_length,
        },
        "profile": (manifest.profile or {}).get("name"),
        "engines": [
            {k: e.get(k) for k in ("model", "graph", "file", "tensorrt", "compute_capability")}
            for e in manifest.engines
        ],
    }
