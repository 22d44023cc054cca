"""Helpers for the specx kernels' tests: one-op ONNX graphs over GGUF blocks (made at random by
tests/gguf_models.py or by the gguf package), and the library (skipped where it is not built,
unless the test command requires it: SPECX_REQUIRE_KERNELS=1, as scripts/test.sh sets)."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specx.runtime.kernels import library

HELD = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")


def kernels_path() -> str:
    path = library.library_path()
    if path is None or not path.is_file():
        if os.environ.get("SPECX_REQUIRE_KERNELS"):
            pytest.fail("the specx kernels library is not built (scripts/build_kernels.sh)")
        pytest.skip("the specx kernels library is not built here (scripts/build_kernels.sh)")
    return str(path)


def gguf_type(kind: str) -> int:
    from gguf import GGMLQuantizationType

    return int(GGMLQuantizationType[kind])


def block_shape(kind: str) -> tuple[int, int]:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    elements, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    return int(elements), int(size)


def dequantize(kind: str, raw: np.ndarray) -> np.ndarray:
    """The gguf package's own dequantization: the independent reference."""
    from gguf import GGMLQuantizationType, quants

    return np.asarray(quants.dequantize(raw, GGMLQuantizationType[kind]), np.float32)


def activation_block(kind: str) -> int:
    """The block the kernels quantize activations in for weights of `kind`: the format's own."""
    return block_shape(kind)[0]


def quantize_rows(x: np.ndarray, block: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """x [m, k] as the kernels quantize it (native/kernels/src/matmul.h): codes, a scale per
    `block` values."""
    blocks = x.reshape(x.shape[0], -1, block)
    amax = np.abs(blocks).max(axis=-1)
    inverse = np.divide(
        np.float32(127), amax, out=np.zeros_like(amax), where=amax > 0, dtype=np.float32
    )
    codes = np.rint(blocks * inverse[..., None]).astype(np.int8)
    return codes.reshape(x.shape), (amax / np.float32(127)).astype(np.float32)


def reference_product(kind: str, raw: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x's int8 rows times the gguf-dequantized weights in float64, the sum of |terms|)."""
    w = dequantize(kind, raw).astype(np.float64)
    block = activation_block(kind)
    codes, scales = quantize_rows(x, block)
    xq = (codes.reshape(x.shape[0], -1, block) * scales[..., None].astype(np.float64)).reshape(
        x.shape
    )
    return xq @ w.T, np.abs(xq) @ np.abs(w.T)


def matmul_graph(kind: str, raw: np.ndarray, k: int, declared: int | str | None = None) -> bytes:
    """A graph Y [.., N] = GgufMatMul(X [.., K], the blocks); `declared`: X's declared width
    (K unless given)."""
    from onnx import TensorProto, helper, numpy_helper

    n = raw.shape[0]
    node = helper.make_node(
        "GgufMatMul", ["x", "blocks"], ["y"], domain="specx", type=gguf_type(kind), K=k, N=n
    )
    graph = helper.make_graph(
        [node],
        "gguf_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", declared or k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
        [numpy_helper.from_array(raw, "blocks")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("specx", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8).SerializeToString()


def gather_graph(kind: str, raw: np.ndarray, k: int) -> bytes:
    """A graph Y [.., K] = GgufGather(the blocks, ids [..])."""
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node(
        "GgufGather", ["table", "ids"], ["y"], domain="specx", type=gguf_type(kind), K=k
    )
    graph = helper.make_graph(
        [node],
        "gguf_gather",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["s"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["s", k])],
        [numpy_helper.from_array(raw, "table")],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("specx", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8).SerializeToString()


def session(model: bytes, threads: int = 1) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.register_custom_ops_library(kernels_path())
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def c_matmul(isa: str, kind: str, raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The C ABI's matmul on one thread with instruction set `isa`."""
    lib = ctypes.CDLL(kernels_path())
    raw = np.ascontiguousarray(raw)
    x = np.ascontiguousarray(x, np.float32)
    y = np.empty((x.shape[0], raw.shape[0]), np.float32)
    message = ctypes.create_string_buffer(256)
    status = lib.specx_kernels_matmul(
        isa.encode(),
        gguf_type(kind),
        raw.ctypes.data_as(ctypes.c_void_p),
        ctypes.c_int64(raw.shape[0]),
        ctypes.c_int64(x.shape[1]),
        x.ctypes.data_as(ctypes.c_void_p),
        ctypes.c_int64(x.shape[0]),
        y.ctypes.data_as(ctypes.c_void_p),
        message,
        ctypes.c_size_t(256),
    )
    assert status == 0, message.value.decode()
    return y


def isa_supported(isa: str) -> bool:
    return bool(ctypes.CDLL(kernels_path()).specx_kernels_isa_supported(isa.encode()))


def export_qwen2_int4(folder: Path, seed: int, draft: bool, batched: bool, max_length: int) -> Path:
    """A tiny random qwen2 GGUF target (and a draft differing in one tensor) exported at int4 on
    the specx kernels (GGUF blocks as stored) into folder / "artifact", with the ngram drafter."""
    pytest.importorskip("gguf")
    from specx.exporter import ExportOptions, export_pair
    from tests.gguf_models import write_gguf

    kernels_path()  # skipped (or failed where the test command requires it) without them
    target = write_gguf(folder / "target.gguf", "qwen2", seed=seed)
    drafts = ["ngram"]
    if draft:
        redraw = ("blk.1.ffn_down.weight",)
        drafts.insert(0, f"draft={write_gguf(folder / 'draft.gguf', 'qwen2', seed, redraw=redraw)}")
    out = folder / "artifact"
    options = ExportOptions(
        max_length=max_length, precision="int4", kernels="specx", batched=batched
    )
    export_pair(str(target), drafts, out, options, lambda _m: None)
    return out
