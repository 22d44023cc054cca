"""The specx kernels (native/kernels) through ONNX Runtime and their C ABI: every GGUF block type
against the gguf package's own dequantization, each row bit-identical whatever the pass's row
count, thread count or instruction set, and bad input refused, never a crash."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from kernel_tools import (
    HELD,
    c_matmul,
    dequantize,
    gather_graph,
    isa_supported,
    kernels_path,
    matmul_graph,
    quantize_rows,
    reference_product,
    session,
)

from tests.gguf_models import random_blocks

pytest.importorskip("gguf")
pytest.importorskip("onnx")

K = 512  # two K-quant super-blocks, sixteen 32-weight blocks
N = 24


def blocks_for(kind: str, seed: int) -> np.ndarray:
    """Blocks of `kind`: made by the gguf package's quantizer where it has one, else random."""
    from gguf import GGMLQuantizationType, quants

    rng = np.random.default_rng(seed)
    try:
        w = rng.standard_normal((N, K)).astype(np.float32) * 0.02
        return np.asarray(quants.quantize(w, GGMLQuantizationType[kind]))
    except NotImplementedError:  # the package quantizes no K-quants
        return random_blocks(kind, N, K, rng)


@pytest.mark.parametrize("kind", HELD)
def test_the_gather_dequantizes_each_block_type_as_the_gguf_package_does(kind: str) -> None:
    raw = blocks_for(kind, 1)
    rows = session(gather_graph(kind, raw, K)).run(None, {"ids": np.arange(N, dtype=np.int64)})[0]
    assert np.array_equal(rows.view(np.uint32), dequantize(kind, raw).view(np.uint32))


@pytest.mark.parametrize("kind", HELD)
def test_the_matmul_is_the_product_with_the_gguf_packages_weights(kind: str) -> None:
    raw = blocks_for(kind, 2)
    x = np.random.default_rng(3).standard_normal((5, K)).astype(np.float32)
    y = session(matmul_graph(kind, raw, K)).run(None, {"x": x})[0]
    want, magnitude = reference_product(kind, raw, x)
    assert y.shape == (5, N)
    assert np.max(np.abs(y - want) / (magnitude + 1e-30)) < 1e-5


@pytest.mark.parametrize("kind", HELD)
def test_each_row_is_bit_identical_for_1_to_17_rows_and_1_or_2_threads(kind: str) -> None:
    raw = blocks_for(kind, 4)
    x = np.random.default_rng(5).standard_normal((17, K)).astype(np.float32)
    full = session(matmul_graph(kind, raw, K), threads=1).run(None, {"x": x})[0]
    two = session(matmul_graph(kind, raw, K), threads=2)
    one = session(matmul_graph(kind, raw, K), threads=1)
    for rows in range(1, 18):
        for s in (one, two):
            part = s.run(None, {"x": x[:rows]})[0]
            assert np.array_equal(part.view(np.uint32), full[:rows].view(np.uint32)), rows
    # one row alone, wherever it sat in the pass
    for row in (0, 7, 16):
        alone = one.run(None, {"x": x[row : row + 1]})[0]
        assert np.array_equal(alone.view(np.uint32), full[row : row + 1].view(np.uint32))


@pytest.mark.parametrize("kind", HELD)
def test_every_instruction_set_computes_the_scalar_references_bits(kind: str) -> None:
    raw = blocks_for(kind, 6)
    x = np.random.default_rng(7).standard_normal((9, K)).astype(np.float32) * 3
    scalar = c_matmul("scalar", kind, raw, x)
    ran = [isa for isa in ("avx2", "avx512vnni", "neon") if isa_supported(isa)]
    for isa in ran:
        assert np.array_equal(c_matmul(isa, kind, raw, x).view(np.uint32), scalar.view(np.uint32))
    ort_y = session(matmul_graph(kind, raw, K), threads=2).run(None, {"x": x})[0]
    assert np.array_equal(ort_y.view(np.uint32), scalar.view(np.uint32))


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_K", "Q6_K"])
def test_a_changed_block_byte_changes_the_product(kind: str) -> None:
    raw = blocks_for(kind, 8)
    x = np.random.default_rng(9).standard_normal((3, K)).astype(np.float32)
    base = c_matmul("scalar", kind, raw, x)
    changed = raw.copy()
    changed[5, 40] ^= 0x24  # a code byte of row 5
    other = c_matmul("scalar", kind, changed, x)
    assert not np.array_equal(other[:, 5], base[:, 5])
    assert np.array_equal(np.delete(other, 5, axis=1), np.delete(base, 5, axis=1))


def test_activation_rows_quantize_as_documented() -> None:
    """The numpy model of the activations' rounding (kernel_tools.quantize_rows) is what the
    kernel does: a product with the identity (Q8_0 blocks of scale 1) reads the codes back."""
    x = np.random.default_rng(10).standard_normal((2, 64)).astype(np.float32)
    codes, scales = quantize_rows(x)
    eye = np.zeros((64, 2, 34), np.uint8)  # [rows, blocks, bytes]
    eye[:, :, :2] = np.array([1.0], np.float16).view(np.uint8)
    for row in range(64):
        eye[row, row // 32, 2 + row % 32] = 1
    y = c_matmul("scalar", "Q8_0", eye.reshape(64, -1), x)
    assert np.array_equal(y, (codes.reshape(2, -1, 32) * scales[..., None]).reshape(2, 64))


REAL_FILES = {
    "SPECX_QWEN_TARGET": ("Q4_K", "Q6_K"),
    "SPECX_QWEN_DRAFT": ("Q5_0", "Q8_0", "Q4_K", "Q6_K"),
    "SPECX_SMOLLM2_GGUF": ("Q4_1", "Q8_0"),
    "SPECX_GEMMA3_GGUF": ("Q5_0", "Q4_K", "Q8_0", "Q6_K"),
}


@pytest.mark.parametrize("env", sorted(REAL_FILES))
def test_blocks_of_the_real_files_multiply_as_the_gguf_package_dequantizes_them(env: str) -> None:
    from gguf import GGUFReader

    if not os.environ.get(env):
        pytest.skip(f"{env} is not set (scripts/test.sh fetches the real models)")
    reader = GGUFReader(Path(os.environ[env]))
    x = np.random.default_rng(11).standard_normal((3, 1)).astype(np.float32)
    for kind in REAL_FILES[env]:
        tensor = next(t for t in reader.tensors if t.tensor_type.name == kind and len(t.shape) == 2)
        raw = np.asarray(tensor.data)[:64]  # 64 output rows of the file's own blocks
        k = int(tensor.shape[0])
        xk = np.repeat(x, k, axis=1) * np.linspace(-1, 1, k, dtype=np.float32)
        rows = session(gather_graph(kind, raw, k)).run(None, {"ids": np.arange(64)})[0]
        assert np.array_equal(rows.view(np.uint32), dequantize(kind, raw).view(np.uint32))
        y = session(matmul_graph(kind, raw, k), threads=2).run(None, {"x": xk})[0]
        want, magnitude = reference_product(kind, raw, xk)
        assert np.max(np.abs(y - want) / (magnitude + 1e-30)) < 1e-5, (env, kind)
        assert np.array_equal(y.view(np.uint32), c_matmul("scalar", kind, raw, xk).view(np.uint32))


def test_a_type_the_kernels_do_not_hold_is_refused_naming_it() -> None:
    from onnx import load_from_string
    from onnxruntime.capi.onnxruntime_pybind11_state import (
        Fail,
        InvalidArgument,
        RuntimeException,
    )

    raw = random_blocks("Q4_0", 4, 64, np.random.default_rng(0))
    proto = load_from_string(matmul_graph("Q4_0", raw, 64))
    for attr in proto.graph.node[0].attribute:
        if attr.name == "type":
            attr.i = 10  # Q2_K
    with pytest.raises((Fail, InvalidArgument, RuntimeException)) as failure:
        session(proto.SerializeToString())
    assert "GGML type 10" in str(failure.value) and "--kernels ort" in str(failure.value)


def test_ids_outside_the_table_are_an_error_not_a_crash() -> None:
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument

    raw = random_blocks("Q8_0", 4, 64, np.random.default_rng(0))
    s = session(gather_graph("Q8_0", raw, 64))
    with pytest.raises((Fail, InvalidArgument)) as failure:
        s.run(None, {"ids": np.array([1, 4], np.int64)})
    assert "outside the table's 4 rows" in str(failure.value)
    assert s.run(None, {"ids": np.array([-1], np.int64)})[0].shape == (1, 64)


def test_a_wrong_input_width_is_an_error_not_a_crash() -> None:
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument

    raw = random_blocks("Q4_0", 4, 64, np.random.default_rng(0))
    s = session(matmul_graph("Q4_0", raw, 64, declared="k"))  # ONNX Runtime checks no width
    with pytest.raises((Fail, InvalidArgument)) as failure:
        s.run(None, {"x": np.zeros((2, 32), np.float32)})
    assert "K = 64" in str(failure.value)


def test_the_library_says_what_it_holds_and_where_it_dispatches() -> None:
    from specx.runtime.kernels import library

    info = library.describe(Path(kernels_path()))
    assert info is not None
    assert info.isa in ("scalar", "avx2", "avx512vnni", "neon")
    assert info.formats.split(", ") == list(HELD)
    assert isa_supported(info.isa) and isa_supported("scalar") and not isa_supported("mmx")
