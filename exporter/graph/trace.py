"""Trace a model into one ONNX graph that serves prefill, decode and verify (any S, any past).

Names, dtypes and symbolic dims come from ``specx.runtime.artifact.contract``; the exporter
never spells them itself.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specx.exporter.architecture import Architecture
from specx.exporter.graph.modules import LATER_OPSET, LATER_OPSET_DOMAIN, make_graph_module
from specx.exporter.graph.weights import (
    ExternalData,
    GraphWeights,
    drop_weight_inputs,
    weight_bytes,
    write_float,
)
from specx.exporter.weights.load import Log, SourceModel, model_vocab_size
from specx.exporter.weights.nbits import QUANTIZED, quantize_graph
from specx.exporter.weights.sources import stand_in
from specx.runtime.artifact import contract
from specx.runtime.artifact.contract import ModelSpec
from specx.runtime.errors import ExportError
from specx.runtime.kernels import library as kernels_library

# Graphs larger than this keep their weights in a side file (protobuf's 2 GB limit).
EXTERNAL_DATA_BYTES = 1_800_000_000


def _dynamic_axes(
    inputs: tuple[contract.TensorSpec, ...], outputs: tuple[contract.TensorSpec, ...]
) -> dict[str, dict[int, str]]:
    """Every symbolic dim of the contract becomes a dynamic axis of that name."""
    return {
        t.name: {i: d for i, d in enumerate(t.shape) if isinstance(d, str)}
        for t in (*inputs, *outputs)
        if any(isinstance(d, str) for d in t.shape)
    }


# The batched graph's opset-24 operators are traced at this opset (the newest the TorchScript
# exporter writes; from 18 on, the graph's other operators read the same at 24).
BATCHED_TRACE_OPSET = 20


CUSTOM_OPSETS = {"gqa": {"com.microsoft": 1}, "batched": {LATER_OPSET_DOMAIN: 1}}


def raise_opset(model: Any) -> None:
    """Move operators traced in the placeholder domain to the default one, at opset 24."""
    for node in model.graph.node:
        if node.domain == LATER_OPSET_DOMAIN:
            node.domain = ""
    imports = [o for o in model.opset_import if o.domain != LATER_OPSET_DOMAIN]
    del model.opset_import[:]
    for entry in imports:
        if entry.domain in ("", "ai.onnx"):
            entry.version = LATER_OPSET
        model.opset_import.append(entry)


def stamp_io_shapes(
    model: Any, inputs: tuple[contract.TensorSpec, ...], outputs: tuple[contract.TensorSpec, ...]
) -> None:
    """Write the contract's shapes on the graph's inputs/outputs (the tracer leaves some fixed
    dims, e.g. head_dim of the new keys, as generated symbolic names)."""
    specs = {t.name: t for t in (*inputs, *outputs)}
    for value in (*model.graph.input, *model.graph.output):
        spec = specs[value.name]
        dims = value.type.tensor_type.shape.dim
        del dims[:]
        for d in spec.shape:
            dim = dims.add()
            if isinstance(d, int):
                dim.dim_value = d
            else:
                dim.dim_param = d


def graph_operators(model: Any) -> tuple[str, ...]:
    """Every node kind of a graph as "domain:OpType" (the default domain is "ai.onnx")."""
    return tuple(sorted({f"{n.domain or 'ai.onnx'}:{n.op_type}" for n in model.graph.node}))


def weight_stats(model: Any) -> tuple[int, int]:
    """(number of parameters, bytes) over the graph's initializers."""
    return weight_bytes(model)


def trace_graph(
    module: Any,
    args: tuple[Any, ...],
    raw: Path,
    inputs: tuple[contract.TensorSpec, ...],
    outputs: tuple[contract.TensorSpec, ...],
    opset: int,
    custom_opsets: dict[str, int] | None,
    failure: str,
    fix: str,
    weights_as_inputs: bool = False,
) -> Any:
    """Trace `module` on `args` with the contract's names and dynamic axes (TorchScript exporter,
    in the scratch folder `raw`, removed afterwards); the loaded ONNX model.

    weights_as_inputs: the module's parameters and buffers become graph inputs under their own
    names, unfolded and not deduplicated (graph/weights.py streams them in afterwards); else
    the traced values are the graph's initializers (small modules: feature heads)."""
    import onnx
    import torch

    raw.mkdir(parents=True, exist_ok=True)
    raw_path = raw / "model.onnx"
    infer = torch._C._jit_pass_onnx_graph_shape_type_inference
    if weights_as_inputs:  # shapes from the inputs' types: computing on the stand-in's (never
        # written) weights would take their memory and minutes
        torch._C._jit_pass_onnx_graph_shape_type_inference = (
            lambda graph, params_dict, opset_version: infer(graph, {}, opset_version)
        )
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                args,
                str(raw_path),
                input_names=[t.name for t in inputs],
                output_names=[t.name for t in outputs],
                dynamic_axes=_dynamic_axes(inputs, outputs),
                opset_version=opset,
                custom_opsets=custom_opsets,
                do_constant_folding=not weights_as_inputs,
                export_params=not weights_as_inputs,
                keep_initializers_as_inputs=weights_as_inputs,
                dynamo=False,
            )
        model = onnx.load(str(raw_path))  # external data too: the scratch folder can go
    except (RuntimeError, TypeError, ValueError) as e:
        raise ExportError(f"{failure}: {str(e).splitlines()[0][:300]}", fix) from e
    finally:
        torch._C._jit_pass_onnx_graph_shape_type_inference = infer
        for f in raw.iterdir():
            f.unlink()
        raw.rmdir()
    return model


def save_graph(
    model: Any,
    folder: Path,
    graph_name: str,
    role: str,
    source: str,
    pair_id: str,
    max_length: int,
    nbytes: int,
) -> None:
    """Stamp the contract's metadata into a graph and write it (weights beside it when large)."""
    import onnx

    model.doc_string = f"specx {role} graph of {source}"
    for key, value in (
        (contract.PAIR_ID_KEY, pair_id),
        (contract.MAX_LENGTH_KEY, str(max_length)),
        ("specx.role", role),
        ("specx.format_version", str(contract.FORMAT_VERSION)),
    ):
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    out = folder / graph_name
    if (folder / f"{graph_name}.data").exists():  # streamed: the weights lie beside it already
        onnx.save_model(model, str(out))
    elif nbytes > EXTERNAL_DATA_BYTES:
        onnx.save_model(model, str(out), save_as_external_data=True, location=f"{graph_name}.data")
    else:
        onnx.save_model(model, str(out))


@dataclass(frozen=True)
class GraphRecipe:
    """What one traced graph of a model is to be (export_graph).

    precision "fp16": weights, activations and caches in float16 (a half copy of the model is
    traced; the source model stays float32 for the parity reference); logits stay float32.
    "int8" / "int4": float32 activations and caches, weights as MatMulNBits blocks
    (weights/nbits.py), carried from the GGUF file the model came from where their format maps
    exactly; `compute` says how MatMulNBits multiplies (nbits.COMPUTE), `wide` what becomes of
    GGUF blocks wider than the precision (nbits.WIDE_BLOCKS).
    attention "plain" (standard ONNX, for TensorRT), "gqa" (ONNX Runtime's in-place attention) or
    "batched" (several sequences at their own lengths per pass). taps: hidden states the graph
    also returns as `features`, for a feature draft (runtime/artifact/contract.py).
    """

    role: str  # "target" or "draft"
    graph: str  # its file name in the artifact folder
    max_length: int  # cache positions (cut to the model's own)
    pair_id: str
    opset: int
    precision: str = "fp32"
    attention: str = "plain"
    taps: tuple[int, ...] = ()
    compute: str = "int8"
    wide: str = "carry"
    kernels: str = "ort"  # "specx": GgufMatMul over GGUF blocks (weights/gguf_kernels.py)


def export_graph(src: SourceModel, folder: Path, recipe: GraphRecipe, log: Log) -> ModelSpec:
    """Trace `src` into folder/recipe.graph and describe it; parity is checked separately."""
    import torch

    arch = src.architecture
    dtype = "float16" if recipe.precision == "fp16" else "float32"  # caches and activations
    max_length = _served_length(arch, recipe, log)
    _check_taps(arch, recipe.taps)
    spec = _graph_spec(src, recipe, dtype, max_length)
    traced = stand_in(src.config, getattr(torch, dtype))
    module = make_graph_module(traced, arch, recipe.attention, max_length, recipe.taps)
    t0 = time.perf_counter()
    model = _trace(src, folder, recipe, spec, module, getattr(torch, dtype), log)
    trace_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    weights, quantization = _stream_weights(model, src, folder, recipe, module, traced, log)
    stamp_io_shapes(model, spec.inputs, spec.outputs)
    params, nbytes = weight_stats(model)
    if recipe.precision in QUANTIZED:  # the initializers count packed codes and scales, not
        # weights: the source's parameters, a head tied to the table counted twice as the graph
        # holds both
        params = sum(int(np.prod(shape)) for shape in weights.source.shapes.values())
    role = recipe.role
    save_graph(model, folder, recipe.graph, role, src.source, recipe.pair_id, max_length, nbytes)
    log(
        f"  {role}: traced in {trace_s:.1f} s, weights streamed in "
        f"{time.perf_counter() - t0:.1f} s: {params / 1e6:.1f}M parameters, {nbytes / 1e6:.0f} MB"
    )
    return dataclasses.replace(
        spec,
        num_parameters=params,
        weight_bytes=nbytes,
        operators=graph_operators(model),
        parity={"weights": quantization} if quantization else {},
        op_libraries=_op_libraries(recipe),
    )


def _op_libraries(recipe: GraphRecipe) -> tuple[dict[str, Any], ...]:
    """The manifest's record of the custom-op libraries the graph needs."""
    if recipe.kernels != "specx" or recipe.precision not in QUANTIZED:
        return ()
    info = kernels_library.describe()
    assert info is not None  # resolve_kernels chose specx only where the library is built
    return (kernels_library.record(info),)


def _graph_spec(src: SourceModel, recipe: GraphRecipe, dtype: str, max_length: int) -> ModelSpec:
    """The graph's description before it is traced: its contract I/O (caches in `dtype`) and the
    model's dimensions; weights, operators and parity come once it is written."""
    arch = src.architecture
    layers, kv, hd, attention = arch.num_layers, arch.kv_heads, arch.head_dim, recipe.attention
    vocab = model_vocab_size(src)
    positions = arch.takes_position_ids(attention)
    keep = attention == "gqa"  # the logits count (contract.KEEP_LOGITS): prompts skip the head
    inputs = contract.graph_inputs(layers, kv, hd, dtype, attention, positions, None, keep)
    features = len(recipe.taps) * arch.hidden_size
    outputs = contract.graph_outputs(layers, kv, hd, vocab, dtype, attention, features)
    return ModelSpec(
        role=recipe.role,
        name=Path(recipe.graph).stem,
        graph=recipe.graph,
        architecture=src.model_type,
        source=src.source,
        num_layers=layers,
        num_heads=arch.num_heads,
        kv_heads=kv,
        head_dim=hd,
        hidden_size=arch.hidden_size,
        vocab_size=vocab,
        max_length=max_length,
        dtype=dtype,
        num_parameters=0,
        weight_bytes=0,
        inputs=inputs,
        outputs=outputs,
        variant=recipe.precision,
        attention=attention,
        feature_layers=recipe.taps,
    )


def _trace(
    src: SourceModel,
    folder: Path,
    recipe: GraphRecipe,
    spec: ModelSpec,
    module: Any,
    torch_dtype: Any,
    log: Log,
) -> Any:
    """The traced graph of `module`, its weights still inputs (_stream_weights makes them
    initializers)."""
    attention = recipe.attention
    args, opset = _dummy_args(src.architecture, recipe, torch_dtype)
    log(
        f"  {recipe.role}: tracing {src.model_type} ({spec.num_layers} layers, {attention} "
        f"attention, {recipe.precision}) to ONNX opset "
        f"{LATER_OPSET if attention == 'batched' else opset}"
    )
    model = trace_graph(
        module,
        args,
        folder / f".{recipe.graph}.raw",
        spec.inputs,
        spec.outputs,
        opset,
        CUSTOM_OPSETS.get(attention),
        f"tracing {src.source} failed",
        "report this with the model's config.json",
        weights_as_inputs=True,
    )
    if attention == "batched":
        raise_opset(model)
    if attention == "gqa" and recipe.kernels == "specx":
        own_attention(model)
    return model


def own_attention(model: Any) -> None:
    """Move com.microsoft GroupQueryAttention nodes to the specx kernels' op of that name: the
    same inputs, outputs and attributes, each query row computed alone (a verify pass's rows
    equal one-token passes bit for bit; ONNX Runtime's sums a K-token pass in another order)."""
    import onnx

    domain = kernels_library.DOMAIN
    moved = False
    for node in model.graph.node:
        if node.domain == "com.microsoft" and node.op_type == "GroupQueryAttention":
            node.domain = domain
            moved = True
    if moved and not any(o.domain == domain for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(domain, 1))


def _served_length(arch: Architecture, recipe: GraphRecipe, log: Log) -> int:
    """The recipe's cache positions, cut to what the model supports."""
    if recipe.max_length <= arch.max_positions:
        return recipe.max_length
    log(
        f"  {recipe.role}: --max-length {recipe.max_length} exceeds the model's "
        f"{arch.max_positions} positions; using {arch.max_positions}"
    )
    return arch.max_positions


def _check_taps(arch: Architecture, taps: tuple[int, ...]) -> None:
    """Refuse target layers a feature draft reads that the model lacks."""
    if taps and not arch.llama_lineage:
        raise ExportError(
            "feature drafts (EAGLE heads) need a target of the Llama lineage, not gpt2",
            "use a model draft, int8/int4 or ngram with this target",
        )
    layers = arch.num_layers
    if any(not 0 <= t <= layers for t in taps):
        raise ExportError(
            f"a feature draft reads target layers {list(taps)}, but the target has {layers} "
            f"(taps 0..{layers})",
            "the head was trained for another target; use the head made for this one",
        )


def _dummy_args(
    arch: Architecture, recipe: GraphRecipe, torch_dtype: Any
) -> tuple[tuple[Any, ...], int]:
    """The tracer's inputs: 3 new tokens on top of 2 past positions (every axis is dynamic),
    and the opset to trace at."""
    import torch

    kv, hd, attention, opset = arch.kv_heads, arch.head_dim, recipe.attention, recipe.opset
    args: list[torch.Tensor] = [torch.tensor([[1, 2, 3]], dtype=torch.long)]
    if arch.takes_position_ids(attention):
        args.append(torch.tensor([[2, 3, 4]], dtype=torch.long))
    if attention == "gqa":
        args += [torch.tensor([4], dtype=torch.int32), torch.tensor(5, dtype=torch.int32)]
        cache_shape = (1, kv, 8, hd)  # full buffers of 8 positions, 5 of them valid
    elif attention == "batched":  # two rows at lengths 2 and 4
        args = [torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.long)]
        args.append(torch.tensor([[2, 3, 4], [4, 5, 6]], dtype=torch.long))
        args.append(torch.tensor([2, 4], dtype=torch.long))
        cache_shape = (2, kv, 8, hd)
        opset = max(opset, BATCHED_TRACE_OPSET)
    else:
        cache_shape = (1, 2, kv, hd)
    args += [torch.zeros(*cache_shape, dtype=torch_dtype) for _ in range(2 * arch.num_layers)]
    if attention == "gqa":
        args.append(torch.tensor(2, dtype=torch.long))  # contract.KEEP_LOGITS: the last 2 of 3
    return tuple(args), opset


def _stream_weights(
    model: Any,
    src: SourceModel,
    folder: Path,
    recipe: GraphRecipe,
    module: Any,
    traced: Any,
    log: Log,
) -> tuple[GraphWeights, dict[str, Any] | None]:
    """The traced graph's weight inputs made initializers, written to <graph>.data as they
    come (float, or MatMulNBits blocks); the weights and the quantization's report."""
    role, precision = recipe.role, recipe.precision
    writer = ExternalData(model.graph, folder / f"{recipe.graph}.data")
    layers = src.architecture.num_layers
    weights = GraphWeights(graph_states(module, traced), src.weights, writer, log, layers, role)
    quantization = None
    try:
        if precision in QUANTIZED:
            embedding = _param_name(traced, traced.get_input_embeddings().weight)
            bits = int(precision[3:])
            vocab = model_vocab_size(src)
            report = quantize_graph(
                model, bits, vocab, weights, embedding, recipe.compute, recipe.wide, recipe.kernels
            )
            quantization = report.to_json()
            log(f"  {role}: {precision} weights: {report.summary()}")
        else:
            write_float(model, weights, np.float16 if precision == "fp16" else np.float32)
    finally:
        writer.close()
    drop_weight_inputs(model, weights)
    return weights, quantization


def _param_name(model: Any, param: Any) -> str:
    return next(n for n, p in model.named_parameters(remove_duplicate=False) if p is param)


def graph_states(module: Any, model: Any) -> dict[str, str | np.ndarray]:
    """The traced graph's weight inputs (the module's state, as the tracer names it): each
    parameter of `model` by its name there, each buffer by its value."""
    import torch

    names: dict[int, str] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), n)  # a tied parameter by the name stored first
    states: dict[str, str | np.ndarray] = {}
    for key, value in torch.jit._unique_state_dict(module, keep_vars=True).items():
        if id(value) in names:
            states[key] = names[id(value)]
        else:
            states[key] = value.detach().cpu().numpy()
    return states
