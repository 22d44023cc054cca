"""A GGUF's quantized blocks carried as MatMulNBits blocks dequantize to exactly what the gguf
package (the reference llama.cpp ships) reads from the same bytes."""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from specx.exporter.weights.blocks import CARRIED, Blocks, from_gguf, quantize_float  # noqa: E402
from tests import gguf_models  # noqa: E402


def random_blocks(kind: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    return gguf_models.random_blocks(kind, rows, cols, np.random.default_rng(seed))


@pytest.mark.parametrize("kind", sorted(CARRIED))
def test_carried_blocks_dequantize_to_what_gguf_reads(kind: str) -> None:
    rows, cols = 6, 512
    raw = random_blocks(kind, rows, cols)
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).reshape(rows, cols)
    blocks = from_gguf(kind, raw, rows, cols)
    got = blocks.dequantize()
    assert blocks.origin == kind
    assert blocks.codes.max() < 2**blocks.bits
    # the same numbers up to float32 rounding of a product written two ways
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


def test_a_wrong_layout_reading_is_caught_by_the_comparison() -> None:
    """Negative control: reading Q4_K bytes with the Q5_K layout's neighbour (Q4_1 nibble order
    swapped) does not pass the same comparison."""
    rows, cols = 2, 256
    raw = random_blocks("Q4_K", rows, cols)
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_K).reshape(rows, cols)
    blocks = from_gguf("Q4_K", raw, rows, cols)
    swapped = blocks.codes.reshape(rows, -1, 2, 32)[:, :, ::-1].reshape(rows, cols)
    wrong = Blocks(swapped, blocks.scale, blocks.zero, blocks.shift, 4, 32, "Q4_K").dequantize()
    assert np.max(np.abs(wrong - want)) > 1e-3


def test_take_rows_reorders_whole_rows() -> None:
    raw = random_blocks("Q4_0", 4, 64)
    blocks = from_gguf("Q4_0", raw, 4, 64)
    order = np.array([2, 0, 3, 1])
    np.testing.assert_array_equal(blocks.take_rows(order).dequantize(), blocks.dequantize()[order])


@pytest.mark.parametrize("bits", [4, 8])
def test_quantize_float_rounds_each_weight_to_within_half_a_step(bits: int) -> None:
    w = np.random.default_rng(1).normal(size=(8, 128)).astype(np.float32)
    blocks = quantize_float(w, bits, 32)
    step = np.repeat(blocks.scale, 32, axis=1)
    assert np.all(np.abs(blocks.dequantize() - w) <= 0.5001 * step)
    assert blocks.origin == "requantized" and blocks.shift is None


def test_packed_4_bit_codes_hold_two_values_a_byte_low_nibble_first() -> None:
    w = np.random.default_rng(2).normal(size=(3, 96)).astype(np.float32)
    blocks = quantize_float(w, 4, 32)
    b, scales, zp = blocks.packed()
    assert b.shape == (3, 3, 16) and scales.shape == (9,) and zp.shape == (6,)  # 3 blocks -> 2 B
    np.testing.assert_array_equal(b[..., 0] & 0x0F, blocks.codes[:, 0::32])
    np.testing.assert_array_equal(b[..., 0] >> 4, blocks.codes[:, 1::32])
    np.testing.assert_array_equal(zp.reshape(3, 2)[:, 1] & 0x0F, blocks.zero[:, 2])
