"""Drafts derived from the target graph by weight quantization, for users with one model.

``int8``: every MatMul, the LM head included, as ONNX Runtime's dynamic 8-bit quantization
(MatMulInteger; per-channel unsigned 8-bit weights, activations quantized per call). Unsigned
weights because the signed-weight kernel (u8 x s8) on x86 CPUs without VNNI sums pairs of
products into saturating 16-bit lanes, which ruins the draft (docs/bench/measurements.md);
u8 x u8 is exact on every CPU. It is made from the target's float graph, loaded whole.

``int4``: the target exported again at `--precision int4` (nbits.py: MatMulNBits 4-bit blocks
of 32, int8 compute, an 8-bit head; a GGUF's own blocks where they map), streamed from the
source like any graph, so it never holds the float32 graph; judged here like the int8 draft.

A tied LM head (Gemm on the embedding) is untied first: the quantizers only handle MatMul, and
the head is a fifth of a small model's weights. The draft keeps the target's I/O contract, so it
runs through the same runtime; it is checked like any draft (it must load, follow the contract,
and run prefill/decode/verify), but its logits differ from the target's by design: what is
recorded, and bounded from below, is how often its argmax agrees with the target's along a
natural text (a proxy for the greedy acceptance rate).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from specx.exporter.checks.parity import CHECK_PART_BYTES, run_passes
from specx.exporter.checks.parts import Pass
from specx.exporter.graph.trace import graph_operators, weight_stats
from specx.exporter.weights.load import Log
from specx.runtime.artifact import contract
from specx.runtime.artifact.contract import ModelSpec
from specx.runtime.drafters import registry
from specx.runtime.errors import ExportError

QUANTIZED_DRAFTS = tuple(
    k.name for k in registry.KINDS.values() if k.export == registry.EXPORT_QUANTIZED
)
# Below this argmax agreement with the target the quantized draft is broken, not just weak.
MIN_AGREEMENT = 0.2
CALIBRATION_TEXT = (
    "Speculative decoding speeds up text generation. A small draft model proposes a few tokens, "
    "and the large target model checks all of them in a single forward pass. Tokens that the "
    "target agrees with are kept, so the output is exactly what the target alone would write. "
    "The key-value cache stores the attention keys and values of every earlier position, which "
    "makes each new step cheap. def fibonacci(n):\n    if n < 2:\n        return n\n    return "
    "fibonacci(n - 1) + fibonacci(n - 2)\n"
)


@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """The ORT quantizers log every node at INFO on the root logger; silence that."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def untie_head(model: Any, vocab_size: int) -> str | None:
    """Make the LM head a MatMul named "lm_head" on its own [hidden, vocab] weight.

    A tied head (Gemm(h, E, transB=1) on the embedding) gets a transposed copy of E; an untied
    one already is a MatMul and is only named. Returns the head's node name (None if not found).
    """
    from onnx import helper, numpy_helper

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Gemm" and node.input[1] in inits:
            weight = numpy_helper.to_array(inits[node.input[1]])  # [vocab, hidden]
            graph.initializer.append(
                numpy_helper.from_array(np.ascontiguousarray(weight.T), "lm_head.weight.T")
            )
            matmul = helper.make_node(
                "MatMul", [node.input[0], "lm_head.weight.T"], list(node.output), name="lm_head"
            )
            index = list(graph.node).index(node)
            graph.node.remove(node)
            graph.node.insert(index, matmul)
            return "lm_head"
    for node in graph.node:
        head = inits.get(node.input[1]) if node.op_type == "MatMul" else None
        if head is not None and len(head.dims) == 2 and head.dims[1] == vocab_size:
            node.name = "lm_head"
            return "lm_head"
    return None


def _quantize_int8(model: Any, folder: Path) -> Any:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src, dst = folder / ".int8-src.onnx", folder / ".int8-dst.onnx"
    onnx.save_model(model, str(src))
    try:
        quantize_dynamic(
            str(src),
            str(dst),
            weight_type=QuantType.QUInt8,  # exact on CPUs without VNNI too
            per_channel=True,
            op_types_to_quantize=["MatMul"],
        )
        return onnx.load(str(dst))
    finally:
        src.unlink(missing_ok=True)
        dst.unlink(missing_ok=True)


def argmax_agreement(
    folder: Path, target: ModelSpec, draft: ModelSpec, tokens: np.ndarray, part_bytes: int
) -> dict[str, float]:
    """Teacher-forced: how often the draft's next-token argmax equals the target's. One graph
    in memory at a time, a large one in parts (checks/parity.py: run_passes)."""
    rows = {}
    for spec in (target, draft):
        outputs, _ = run_passes(folder, spec, [Pass(0, 0, tokens)], part_bytes)
        rows[spec.name] = outputs[0].logits  # [len, vocab]
    t, d = rows[target.name], rows[draft.name]
    vocab = min(t.shape[1], d.shape[1])
    agree = float(np.mean(np.argmax(t[:, :vocab], -1) == np.argmax(d[:, :vocab], -1)))
    return {"argmax_agreement": agree, "max_abs_logit_diff": float(np.max(np.abs(t - d)))}


def derive_quantized_draft(
    folder: Path, target: ModelSpec, kind: str, tokens: np.ndarray, name: str, log: Log
) -> ModelSpec:
    import onnx

    if kind not in QUANTIZED_DRAFTS:
        raise ExportError(f"unknown quantized draft {kind!r}", f"use one of {QUANTIZED_DRAFTS}")
    t0 = time.perf_counter()
    model = onnx.load(str(folder / target.graph))
    untie_head(model, target.vocab_size)  # the dynamic quantizer quantizes MatMuls only
    with _quiet_quantizer():
        model = _quantize_int8(model, folder)
    for prop in model.metadata_props:
        if prop.key == "specx.role":
            prop.value = "draft"
    if not any(p.key == contract.PAIR_ID_KEY for p in model.metadata_props):
        raise ExportError("the quantizer dropped the graph's metadata; please report this")
    graph_name = f"{name}.onnx"
    onnx.save_model(model, str(folder / graph_name))
    params, nbytes = weight_stats(model)
    spec = dataclasses.replace(
        target,
        role="draft",
        name=name,
        graph=graph_name,
        variant=kind,
        operators=graph_operators(model),
        num_parameters=params,
        weight_bytes=nbytes,
        parity={},
    )
    return judge_quantized_draft(folder, target, spec, tokens, log, time.perf_counter() - t0)


def judge_quantized_draft(
    folder: Path,
    target: ModelSpec,
    spec: ModelSpec,
    tokens: np.ndarray,
    log: Log,
    took: float,
    part_bytes: int = CHECK_PART_BYTES,
) -> ModelSpec:
    """A quantized copy of the target as a draft: how often its argmax agrees with the target's
    graph along a natural text (a proxy for greedy acceptance), recorded and bounded below."""
    calibration = tokens[: min(256, target.max_length)]
    quality: dict[str, Any] = dict(argmax_agreement(folder, target, spec, calibration, part_bytes))
    quality.update(kind="quantized", tokens=len(calibration), source=spec.parity or None)
    kind, name = spec.variant, spec.name
    log(
        f"  {name}: {kind} weights, {spec.weight_bytes / 1e6:.0f} MB, made in {took:.1f} s; "
        f"argmax agrees with the target on {100 * quality['argmax_agreement']:.0f}% of a "
        "calibration text"
    )
    if quality["argmax_agreement"] < MIN_AGREEMENT:
        raise ExportError(
            f"the {kind} draft agrees with the target on only "
            f"{100 * quality['argmax_agreement']:.0f}% of tokens: the quantization broke it",
            "use another draft (e.g. --draft int8, or a smaller model of the same family)",
        )
    return dataclasses.replace(spec, parity=quality)
