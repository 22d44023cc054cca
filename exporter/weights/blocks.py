"""Block-quantized weights for ONNX Runtime's MatMulNBits: from a GGUF's own blocks, or made here.

One representation serves both. A linear weight W [N, K] (out x in, blocks along K) is

    W[n, k] = scale[n, b] * (codes[n, k] - zero[n, b]) + shift[n, b]      b = k // block

with integer codes and zero points of `bits` bits, float32 scales, and an optional float32
`shift` per block. MatMulNBits computes the first term (uint8 zero points: its fast kernels;
float zero points fall back to a dequantizing path that is orders of magnitude slower on a CPU,
docs/quantized.md, and are refused for 8 bits); the shift, where a format has one (GGUF's
K-quants and Q4_1/Q5_1 keep a block minimum that is no integer number of steps), is added as
`blocksum(x) @ shift^T` by the graph, so the weights the graph computes with are exactly the
file's, without a second rounding (nbits.py writes those nodes).

GGUF formats and what they carry (bits of the codes as stored here):
- Q4_0 (4), Q8_0 (8), Q5_0 (8: 5-bit codes in 8-bit lanes), Q6_K (8, blocks of 16): exact,
  integer zero points;
- Q4_1 (4), Q5_1 (8), Q4_K (4), Q5_K (8): exact with the shift term.
Anything else (F16, BF16, F32, Q2_K, Q3_K, the IQ formats) is dequantized and, where the
precision asks for it, quantized here (`quantize_float`), which rounds a second time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

QK_K = 256


@dataclass
class Blocks:
    """A weight [N, K] as MatMulNBits blocks (see the module docstring)."""

    codes: np.ndarray  # [N, K] uint8, values 0 .. 2**bits - 1
    scale: np.ndarray  # [N, K // block] float32
    zero: np.ndarray  # [N, K // block] uint8
    shift: np.ndarray | None  # [N, K // block] float32, or None
    bits: int
    block: int
    origin: str  # the GGUF type carried ("Q4_K", ...) or "requantized"

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.codes.shape[0]), int(self.codes.shape[1]))

    def dequantize(self) -> np.ndarray:
        """W [N, K] float32, as the graph computes with it."""
        n, k = self.shape
        steps = self.codes.reshape(n, -1, self.block).astype(np.float32)
        steps -= self.zero[:, :, None].astype(np.float32)
        w = steps * self.scale[:, :, None]
        if self.shift is not None:
            w += self.shift[:, :, None]
        return w.reshape(n, k)

    def rows(self, start: int, stop: int) -> Blocks:
        """Output rows start..stop (views, no copy)."""
        shift = None if self.shift is None else self.shift[start:stop]
        return Blocks(
            self.codes[start:stop],
            self.scale[start:stop],
            self.zero[start:stop],
            shift,
            self.bits,
            self.block,
            self.origin,
        )

    def take_rows(self, order: np.ndarray) -> Blocks:
        """The same blocks with output rows reordered (a GGUF's q/k head permutation)."""
        shift = None if self.shift is None else self.shift[order]
        return Blocks(
            self.codes[order],
            self.scale[order],
            self.zero[order],
            shift,
            self.bits,
            self.block,
            self.origin,
        )

    def packed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """MatMulNBits' inputs: B [N, K/block, block*bits/8] uint8, scales [N * K/block] float32,
        zero points uint8 (4 bits: two blocks a byte, each row padded to whole bytes)."""
        n, k = self.shape
        kb = k // self.block
        if self.bits == 4:
            pairs = self.codes.reshape(n, kb, self.block // 2, 2)
            b = (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)
            zero = self.zero
            if kb % 2:
                zero = np.concatenate([zero, np.zeros((n, 1), np.uint8)], axis=1)
            zero = zero.reshape(n, -1, 2)
            zp = (zero[..., 0] | (zero[..., 1] << 4)).astype(np.uint8).reshape(-1)
        else:
            b = self.codes.reshape(n, kb, self.block)
            zp = self.zero.reshape(-1)
        return np.ascontiguousarray(b), self.scale.reshape(-1).astype(np.float32), zp


def quantize_float(w: np.ndarray, bits: int, block: int = 32, rows: int = 4096) -> Blocks:
    """Round-to-nearest block quantization of W [N, K]: asymmetric (a zero point per block) for
    4 bits, symmetric (zero point 128) for 8 bits, as ONNX Runtime's own quantizer makes them.
    Done `rows` output rows at a time: the float temporaries stay the size of one slice."""
    n, k = w.shape
    if k % block:
        raise ValueError(f"K = {k} is not a multiple of the block size {block}")
    codes = np.empty((n, k), np.uint8)
    scale = np.empty((n, k // block), np.float32)
    zero = np.empty((n, k // block), np.uint8)
    top = 2**bits - 1
    for start in range(0, n, rows):
        part = slice(start, start + rows)
        x = w[part].reshape(-1, k // block, block).astype(np.float32)
        if bits == 4:
            lo = np.minimum(x.min(axis=-1), 0.0)
            hi = np.maximum(x.max(axis=-1), 0.0)
            s = (hi - lo) / top
            s = np.where(s == 0, 1.0, s).astype(np.float32)
            z = np.clip(np.round(-lo / s), 0, top).astype(np.uint8)
        else:
            s = (np.abs(x).max(axis=-1) / 127.0).astype(np.float32)
            s = np.where(s == 0, 1.0, s).astype(np.float32)
            z = np.full(s.shape, 128, np.uint8)
        q = np.round(x / s[..., None]) + z[..., None]
        codes[part] = np.clip(q, 0, top).astype(np.uint8).reshape(-1, k)
        scale[part], zero[part] = s, z
    return Blocks(codes, scale, zero, None, bits, block, "requantized")


def _f16(raw: np.ndarray) -> np.ndarray:
    return raw.copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, n_blocks: int, width: int) -> np.ndarray:
    """ggml's 4-bit packing: the low nibbles of a row of `width // 2` bytes, then the high ones."""
    lo = qs & np.uint8(0x0F)
    hi = qs >> np.uint8(4)
    return np.concatenate([lo, hi], axis=-1).reshape(n_blocks, width)


Decoded = tuple[np.ndarray, np.ndarray, np.ndarray, Any]  # the shift: an array or None


def _decode(kind: str, raw: np.ndarray) -> Decoded:
    """(codes [blocks, per block], scale, zero, shift [blocks, sub-blocks]) of one GGUF type."""
    nb = raw.shape[0]
    if kind == "Q4_0":  # d (f16), 16 bytes of nibbles: (q - 8) * d
        d, qs = _f16(raw[:, :2]), raw[:, 2:]
        return _nibbles(qs, nb, 32), d, np.full((nb, 1), 8, np.uint8), None
    if kind == "Q4_1":  # d, m, nibbles: q * d + m
        d, m, qs = _f16(raw[:, :2]), _f16(raw[:, 2:4]), raw[:, 4:]
        return _nibbles(qs, nb, 32), d, np.zeros((nb, 1), np.uint8), m
    if kind in ("Q5_0", "Q5_1"):  # d, (m), 4 bytes of high bits, nibbles
        d = _f16(raw[:, :2])
        rest = raw[:, 4:] if kind == "Q5_1" else raw[:, 2:]
        bits5 = rest[:, :4].copy().view(np.uint32).reshape(nb, 1)
        top = ((bits5 >> np.arange(32, dtype=np.uint32)[None]) & 1).astype(np.uint8)
        codes = _nibbles(rest[:, 4:], nb, 32) | (top << 4)
        if kind == "Q5_0":
            return codes, d, np.full((nb, 1), 16, np.uint8), None
        return codes, d, np.zeros((nb, 1), np.uint8), _f16(raw[:, 2:4])
    if kind == "Q8_0":  # d, 32 signed bytes: q * d
        d = _f16(raw[:, :2])
        codes = (raw[:, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return codes, d, np.full((nb, 1), 128, np.uint8), None
    if kind in ("Q4_K", "Q5_K"):  # super-blocks of 8 x 32: d * sc * q - dmin * m
        from gguf.quants import Q4_K

        d, dmin = _f16(raw[:, :2]), _f16(raw[:, 2:4])
        sc, mn = Q4_K.get_scale_min(raw[:, 4:16])  # [nb, 8] each, 6-bit
        scale = d * sc.astype(np.float32)
        shift = -(dmin * mn.astype(np.float32))
        if kind == "Q4_K":
            q4 = raw[:, 16:].reshape(nb, 4, 32)  # 4 chunks of 64 values: low nibbles, then high
            kc = np.stack([q4 & 0x0F, q4 >> 4], axis=2).reshape(nb, QK_K)
        else:
            qh5, qs5 = raw[:, 16:48], raw[:, 48:].reshape(nb, 4, 32)
            low5 = np.stack([qs5 & 0x0F, qs5 >> 4], axis=2).reshape(nb, 8, 32)
            high5 = (qh5[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
            kc = (low5 | (high5 << 4)).reshape(nb, QK_K)
        return kc.astype(np.uint8), scale, np.zeros((nb, 8), np.uint8), shift
    if kind == "Q6_K":  # 16 sub-blocks of 16: d * scales * (q - 32)
        ql, qh6 = raw[:, :128], raw[:, 128:192]
        scales = raw[:, 192:208].view(np.int8).astype(np.float32)
        d = _f16(raw[:, 208:210])
        # per half of 128: values 0..31, 32..63 are the low nibbles of ql bytes 0..31, 32..63;
        # 64..95, 96..127 their high nibbles; qh byte l holds the top 2 bits of all four
        ql2 = ql.reshape(nb, 2, 2, 32)  # [half, byte chunk, 32]
        low6 = np.stack([ql2 & 0x0F, ql2 >> 4], axis=2).reshape(nb, 2, 4, 32)
        shifts = (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]
        high6 = (qh6.reshape(nb, 2, 1, 32) >> shifts) & 3
        six = (low6 | (high6 << 4)).reshape(nb, QK_K).astype(np.int16)
        # a negative sub-block scale flips the codes around the zero point 32 (exact)
        flip = np.repeat(scales < 0, 16, axis=1)
        flipped = np.where(flip, 64 - six, six).astype(np.uint8)
        return flipped, d * np.abs(scales), np.full((nb, 16), 32, np.uint8), None
    raise KeyError(kind)


CARRIED = {  # GGUF type -> (bits stored, block)
    "Q4_0": (4, 32),
    "Q4_1": (4, 32),
    "Q5_0": (8, 32),
    "Q5_1": (8, 32),
    "Q8_0": (8, 32),
    "Q4_K": (4, 32),
    "Q5_K": (8, 32),
    "Q6_K": (8, 16),
}


def from_gguf(kind: str, raw: np.ndarray, rows: int, cols: int, chunk: int = 4096) -> Blocks:
    """A GGUF tensor's blocks (raw: [rows, bytes per row] uint8) as Blocks [rows, cols], decoded
    `chunk` rows at a time (the decoder's temporaries are several times the codes' size)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    bits, block = CARRIED[kind]
    per_row = raw.shape[1]
    size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]][1]  # bytes per block
    if per_row % size or raw.shape[0] != rows:
        raise ValueError(f"{kind}: {rows} x {per_row} bytes is no whole number of blocks")
    sub = cols // block
    codes = np.empty((rows, cols), np.uint8)
    scale = np.empty((rows, sub), np.float32)
    zero = np.empty((rows, sub), np.uint8)
    shift = None
    for start in range(0, rows, chunk):
        part = slice(start, min(rows, start + chunk))
        n = part.stop - start
        flat = np.ascontiguousarray(raw[part]).reshape(-1, size)
        c, sc, z, sh = _decode(kind, flat)
        codes[part] = c.reshape(n, cols)
        scale[part] = sc.reshape(n, sub)
        zero[part] = np.broadcast_to(z, sc.shape).reshape(n, sub)
        if sh is not None:
            if shift is None:
                shift = np.empty((rows, sub), np.float32)
            shift[part] = sh.reshape(n, sub)
    return Blocks(codes, scale, zero, shift, bits, block, kind)
