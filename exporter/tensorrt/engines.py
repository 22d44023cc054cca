"""TensorRT engines from a deployment profile, built with TensorRT's own Python API.

One engine per exported graph (target and model drafts): the ONNX parser reads the graph (plain
ONNX ops only, see `tensorrt/parser_ops.py`), the network is strongly typed (the graph's
fp16/fp32 types are kept, so softmax and logits stay fp32), and two optimization profiles come
from the profile:
0 = prefill (prompt chunks), 1 = decode/verify (1..K+1 tokens). A timing cache is reused across
builds. The manifest records the TensorRT version, the GPU's compute capability and the profile,
and the runtime refuses an engine built for another TensorRT or GPU.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from specx.exporter.tensorrt.parser_ops import unsupported_ops
from specx.exporter.weights.load import Log
from specx.profiles import Profile, ShapeProfile
from specx.runtime.artifact import contract
from specx.runtime.artifact.contract import Manifest, ModelSpec
from specx.runtime.backends.cuda import compute_capability
from specx.runtime.backends.trt_session import import_tensorrt
from specx.runtime.drafters.registry import kind_of_spec
from specx.runtime.errors import ExportError


def shapes_for(spec: ModelSpec, dims: ShapeProfile, which: str) -> tuple[list[int], ...]:
    """min/opt/max shape of one input under a profile's dimension ranges."""
    values = {contract.BATCH: dims.batch, contract.SEQ: dims.seq, contract.PAST: dims.past_len}
    out = []
    for tensor in spec.inputs:
        if tensor.name != which:
            continue
        for attr in ("min", "opt", "max"):
            out.append(
                [getattr(values[d], attr) if isinstance(d, str) else d for d in tensor.shape]
            )
    return tuple(out)


def build_engine(
    trt: Any, folder: Path, spec: ModelSpec, profile: Profile, cache_path: Path, log: Log
) -> dict[str, Any]:
    t0 = time.perf_counter()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(folder / spec.graph)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise ExportError(f"TensorRT cannot parse {spec.graph}: {'; '.join(errors)[:400]}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, profile.tensorrt.workspace_mb << 20)
    config.builder_optimization_level = profile.tensorrt.optimization_level
    timing = config.create_timing_cache(cache_path.read_bytes() if cache_path.is_file() else b"")
    config.set_timing_cache(timing, ignore_mismatch=False)
    assert profile.tensorrt.prefill is not None and profile.tensorrt.decode is not None
    for dims in (profile.tensorrt.prefill, profile.tensorrt.decode):  # profile 0, profile 1
        opt_profile = builder.create_optimization_profile()
        for tensor in spec.inputs:
            low, opt, high = shapes_for(spec, dims, tensor.name)
            opt_profile.set_shape(tensor.name, low, opt, high)
        config.add_optimization_profile(opt_profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ExportError(
            f"TensorRT failed to build an engine for {spec.graph}",
            "see TensorRT's messages above; try a smaller max_context",
        )
    engine_file = f"{Path(spec.graph).stem}.{profile.name}.engine"
    (folder / engine_file).write_bytes(bytes(serialized))
    cache_path.write_bytes(bytes(config.get_timing_cache().serialize()))
    log(f"  engine {engine_file}: built in {time.perf_counter() - t0:.0f} s")
    return {
        "model": spec.name,
        "graph": spec.graph,
        "file": engine_file,
        "tensorrt": trt.__version__,
        "compute_capability": compute_capability(),
        "profile": profile.name,
        "precision": profile.precision,
        "prefill_profile": 0,
        "decode_profile": 1,
        "max_seq": {
            "prefill": profile.tensorrt.prefill.seq.max,
            "decode": profile.tensorrt.decode.seq.max,
        },
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def build_engines(folder: Path, manifest: Manifest, profile: Profile, log: Log) -> list[dict]:
    """Engines for the target and every model draft that TensorRT can parse."""
    if not profile.tensorrt.enabled:
        raise ExportError(
            f"profile {profile.name!r} has TensorRT disabled",
            "use a GPU profile such as gpu-datacenter",
        )
    trt = import_tensorrt(builder=True)
    cache = folder / profile.tensorrt.timing_cache
    entries = []
    seen: set[str] = set()
    for spec in (manifest.target, *manifest.drafts):
        if spec.graph in seen:
            continue
        seen.add(spec.graph)
        if spec.attention != "plain":
            log(f"  {spec.name}: {spec.attention} attention is an ONNX Runtime op; no engine")
            continue
        if spec.role == "draft" and not kind_of_spec(manifest, spec).tensorrt:
            log(f"  {spec.name}: a {spec.variant} draft runs on ONNX Runtime only; no engine")
            continue
        bad = unsupported_ops(folder / spec.graph)
        if bad:
            raise ExportError(
                f"{spec.graph} uses operators TensorRT cannot parse: {bad}",
                "please report this: specx graphs are meant to be plain ONNX",
            )
        entries.append(build_engine(trt, folder, spec, profile, cache, log))
    return entries


def rebuild_engines(folder: Path, profile_name: str | None, log: Log) -> Manifest:
    """`specx build`: engines for an existing artifact; the manifest is replaced atomically."""
    import dataclasses
    import os

    from specx.profiles import load_profile, parse_profile

    manifest = Manifest.read(folder)
    if profile_name:
        profile = load_profile(profile_name)
    elif manifest.profile:
        profile = parse_profile(_profile_to_toml_dict(manifest.profile), "manifest")
    else:
        raise ExportError(
            "this artifact was exported without a profile",
            "pass --profile NAME (see specx profiles)",
        )
    if profile.max_context > manifest.max_length:
        raise ExportError(
            f"profile {profile.name!r} needs a context of {profile.max_context}, the artifact "
            f"holds {manifest.max_length}",
            "re-export with this profile: specx export --profile ... --engines",
        )
    engines = build_engines(folder, manifest, profile, log)
    updated = dataclasses.replace(manifest, engines=tuple(engines))
    staged = folder / ".manifest.json.tmp"
    staged.write_text(json.dumps(updated.to_json(), indent=2) + "\n", encoding="utf-8")
    os.replace(staged, folder / contract.MANIFEST_FILE)
    return updated


def _profile_to_toml_dict(data: dict[str, Any]) -> dict[str, Any]:
    """The manifest stores a resolved profile; map it back to the TOML layout."""
    trt = dict(data["tensorrt"])
    out = {
        k: v
        for k, v in data.items()
        if k
        not in ("tensorrt", "k_min", "k_default", "k_max", "budget_mb", "workspace_mb", "source")
    }
    out["providers"] = list(data["providers"])
    out["speculation"] = {k: data[k] for k in ("k_min", "k_default", "k_max")}
    out["memory"] = {"budget_mb": data["budget_mb"], "workspace_mb": data["workspace_mb"]}
    for key in ("prefill", "decode"):
        if trt.get(key):
            trt[key] = {d: [r["min"], r["opt"], r["max"]] for d, r in trt[key].items()}
        else:
            trt.pop(key, None)
    out["tensorrt"] = trt
    return out
