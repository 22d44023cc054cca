"""int4 / int8 graphs on specx's own kernels (``--kernels specx``): every MatMul on a weight
becomes GgufMatMul and the embedding gather GgufGather (domain ``specx``: native/kernels), whose
initializers are GGUF blocks as the file stores them, byte for byte.

Each weight's blocks come, in this order of preference, from

1. the GGUF file the model was loaded from, where the kernels hold its type (Q4_0, Q4_1, Q5_0,
   Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) and its values provably are the loaded parameter (gguf.py);
2. the gguf package's own quantizer on the float weight: Q4_1 for a 4-bit body, Q8_0 for 8 bits
   and for the LM head (its rounding moves every logit), as nbits.py rounds for MatMulNBits.

A quantized type the kernels do not hold (Q2_K, Q3_K, the IQ formats) is refused: such a file
exports with ``--kernels ort``. `wide` keeps nbits.py's meaning: blocks stored wider than the
precision's bits are carried ("carry") or rounded again from their values (Q4_1 / Q8_0).

A head tied to the embedding table in the file reads the same initializer as the gather: the
graph holds the table once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from specx.runtime.errors import ExportError
from specx.runtime.kernels.library import DOMAIN

if TYPE_CHECKING:
    from specx.exporter.weights.nbits import _Rewriter

# the kernels' formats and the bits a weight takes in each (what `wide` compares)
HELD_BITS = {"Q4_0": 4, "Q4_1": 4, "Q4_K": 4, "Q5_0": 5, "Q5_1": 5, "Q5_K": 5, "Q6_K": 6, "Q8_0": 8}
FLOAT_TYPES = ("F32", "F16", "BF16", "F64")
REQUANTIZE_TO = {4: "Q4_1", 8: "Q8_0"}
HEAD_TYPE = "Q8_0"
ORT_FIX = "export with --kernels ort (ONNX Runtime's MatMulNBits holds it after requantizing)"


def _node(op: str, inputs: list[str], out: str, name: str, **attrs: int) -> Any:
    from onnx import helper

    node = helper.make_node(op, inputs, [out], name=name, domain=DOMAIN)
    node.attribute.extend(helper.make_attribute(key, value) for key, value in attrs.items())
    return node


def quantize_blocks(w: np.ndarray, kind: str) -> np.ndarray:
    """W [N, K] float32 as `kind` blocks [N, bytes per row], by the gguf package's quantizer."""
    from gguf import GGMLQuantizationType, quants

    if w.shape[1] % 32:
        raise ExportError(
            f"a weight of {w.shape[1]} inputs cannot be held in 32-weight blocks", ORT_FIX
        )
    w = np.ascontiguousarray(w, np.float32)
    return np.asarray(quants.quantize(w, GGMLQuantizationType[kind]))


class SpecxBlocks:
    """The specx-kernel nodes of one graph's rewrite (nbits._Rewriter delegates to it)."""

    def __init__(self, rewriter: _Rewriter) -> None:
        self.r = rewriter
        self.shared: dict[str, str] = {}  # GGUF tensor name -> its initializer (tied head)

    def blocks_for(self, wt: np.ndarray, name: str | None, head: bool) -> tuple[np.ndarray, str]:
        """(blocks [N, bytes per row] uint8, their GGUF type) of the weight `name` [N, K]."""
        r, gguf = self.r, self.r.gguf
        stored = gguf.stored_type(name) if gguf is not None and name is not None else None
        if stored is not None and stored not in HELD_BITS and stored not in FLOAT_TYPES:
            raise ExportError(
                f"{name} is stored as {stored}, a type the specx kernels do not hold "
                f"(they hold {', '.join(HELD_BITS)})",
                ORT_FIX,
            )
        rounds = r.wide == "requantize-all" or (r.wide == "requantize" and not head)
        if stored in HELD_BITS and rounds and HELD_BITS[stored] > r.bits:
            kind = HEAD_TYPE if head and r.bits > 4 else REQUANTIZE_TO[r.bits]
            r.report.requantized[str(name)] = (
                f"{stored} wider than {r.bits} bits (wide blocks: {r.wide})"
            )
            return quantize_blocks(wt, kind), kind
        if stored in HELD_BITS and gguf is not None and name is not None:
            raw, why = gguf.raw_blocks(name, wt)
            if raw is not None:
                r.report.carried[why] += 1
                return raw, stored
            r.report.requantized[name] = why
        elif gguf is not None:
            r.report.requantized[name or f"matmul {r.count}"] = (
                "not in the GGUF file" if stored is None else f"{stored} in the file"
            )
        kind = HEAD_TYPE if head else REQUANTIZE_TO[r.bits]
        return quantize_blocks(wt, kind), kind

    def initializer(self, raw: np.ndarray, kind: str, name: str | None, tag: str) -> str:
        """The blocks' initializer, shared by a tied head and the table they both are."""
        gguf = self.r.gguf
        key = None
        if gguf is not None and name is not None and kind == gguf.stored_type(name):
            key = f"{gguf.gguf_name(name)}:{kind}"
        if key is not None and key in self.shared:
            return self.shared[key]
        init = self.r.add_init(raw, tag)
        if key is not None:
            self.shared[key] = init
        return init

    def matmul(self, node: Any, wt: np.ndarray, name: str | None) -> list[Any]:
        """node's output = its input x times wt [N, K]^T, as GgufMatMul."""
        from gguf import GGMLQuantizationType

        r = self.r
        r.count += 1
        n, k = wt.shape
        head = n == r.vocab
        raw, kind = self.blocks_for(wt, name, head)
        r.report.bits[f"{HELD_BITS[kind]}-bit {kind}"] += 1
        tag = f"gguf.{r.count}"
        blocks = self.initializer(raw, kind, name, f"{tag}.blocks")
        ggml = int(GGMLQuantizationType[kind])
        return [
            _node("GgufMatMul", [node.input[0], blocks], node.output[0], node.name or tag,
                  type=ggml, K=k, N=n)
        ]  # fmt: skip

    def gather(self, node: Any, table: np.ndarray) -> list[Any]:
        """node's output = rows of table [V, H] by its ids, as GgufGather."""
        from gguf import GGMLQuantizationType

        r = self.r
        raw, kind = self.blocks_for(table, r.embedding, head=True)
        r.report.bits[f"{HELD_BITS[kind]}-bit {kind} embedding"] += 1
        blocks = self.initializer(raw, kind, r.embedding, "gguf.embedding.blocks")
        ggml = int(GGMLQuantizationType[kind])
        return [
            _node("GgufGather", [blocks, node.input[1]], node.output[0],
                  node.name or "gguf.embedding", type=ggml, K=table.shape[1])
        ]  # fmt: skip
