"""int4 / int8 graphs: every MatMul on a weight becomes ONNX Runtime's MatMulNBits (or, with
kernels "specx", specx's own GgufMatMul over the file's blocks: gguf_kernels.py).

Applied to the traced graph (weights as inputs), one weight at a time, each read from the source
as transformers loads it and written out as blocks before the next (graph/weights.py). Each
weight's blocks come, in this order of preference, from

1. the GGUF file the model was loaded from, where its type maps exactly (blocks.py): the graph
   then computes with the file's own numbers, as llama.cpp does, with no second rounding;
2. round-to-nearest block quantization here (`quantize_float`): `bits` for the body, 8 bits for
   the LM head (its rounding moves every logit; llama.cpp's Q4_K_M files keep it in 6 bits).

Formats whose blocks keep a minimum (Q4_1, Q5_1, Q4_K, Q5_K) add `blocksum(x) @ shift^T` to the
product: the block sums of x [.., K] (a Reshape to [.., K/block, block] and a ReduceSum, once
for every weight that reads the same x), times shift^T [K/block, N].

The embedding table (a Gather reads one row a token: memory, not bandwidth) becomes ONNX
Runtime's GatherBlockQuantized on the same kind of blocks (the file's, else 8-bit), plus the
gathered rows' shifts where the blocks keep minimums: a 151,936-token table of 1,536 floats is
933 MB in float32 and about 150 MB as Q4_K blocks.

`wide` decides what becomes of GGUF blocks wider than `bits` (5-, 6- and 8-bit formats in an int4
graph, which MatMulNBits holds in 8-bit lanes with a float32 scale per 16 or 32 weights): "carry"
keeps the file's numbers (a target's exactness against its GGUF); "requantize" rounds the body's
again to `bits` and carries the LM head and the embedding table (the head's rounding moves every
logit); "requantize-all" rounds those too: a draft's weights never change the output, only how
often its tokens are accepted (WIDE_BLOCKS_DEFAULT).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specx.exporter.graph.weights import GraphWeights, consumers, linear_transpose
from specx.exporter.weights.blocks import Blocks, quantize_float
from specx.exporter.weights.gguf import GgufBlocks
from specx.exporter.weights.gguf_kernels import SpecxBlocks
from specx.runtime.kernels.library import DOMAIN

PRECISIONS = ("fp32", "fp16", "int8", "int4")
QUANTIZED = ("int8", "int4")
BLOCK = 32
HEAD_BITS = 8
# How MatMulNBits computes (its accuracy_level): "int8" (4) quantizes activations to int8 per
# block and multiplies in integers, as llama.cpp does: the fast CPU path. Its rounding of an
# activation flips with any difference in the bits before it, so a multi-token pass parts from a
# one-token pass wherever anything before it sums in another order (GroupQueryAttention does;
# measured at export: checks/parity.py quality_figures). "fp32" (0) dequantizes the weights to
# float32 on every call: several times slower for 4 bits and far slower for 8 (docs/quantized.md,
# measured by scripts/nbits_kernels.py), a mode for checking, not serving.
COMPUTE = {"int8": 4, "fp32": 0}
WIDE_BLOCKS = ("carry", "requantize", "requantize-all")
# Per role, when --wide-blocks / --draft-wide-blocks are not given: a draft's weights never change
# the output, so its wide blocks (head and table too) are requantized to read fewer bytes a token;
# a target keeps its GGUF's numbers, since rounding its head costs argmax agreement with its
# source (the figures: docs/bench/measurements.md, docs/quantized.md).
WIDE_BLOCKS_DEFAULT = {"target": "carry", "draft": "requantize-all"}


@dataclass
class QuantReport:
    """What became of each weight: carried from the file (by GGUF type) or requantized (why)."""

    carried: Counter[str] = field(default_factory=Counter)
    requantized: dict[str, str] = field(default_factory=dict)  # parameter -> why
    bits: Counter[str] = field(default_factory=Counter)  # "4-bit" / "8-bit" -> weights
    compute: str = "int8"  # a key of COMPUTE
    wide_blocks: str = "carry"  # one of WIDE_BLOCKS
    kernels: str = "ort"  # "ort": MatMulNBits; "specx": GgufMatMul (gguf_kernels.py)

    def to_json(self) -> dict[str, Any]:
        return {
            "carried": dict(sorted(self.carried.items())),
            "requantized": dict(sorted(self.requantized.items())),
            "tensors_by_bits": dict(sorted(self.bits.items())),
            "compute": self.compute,
            "wide_blocks": self.wide_blocks,
            "kernels": self.kernels,
        }

    def summary(self) -> str:
        carried = ", ".join(f"{n} {k}" for k, n in sorted(self.carried.items())) or "none"
        why = ", ".join(sorted(set(self.requantized.values())))
        return f"carried from the GGUF: {carried}; requantized: {len(self.requantized)}" + (
            f" ({why})" if why else ""
        )


def _contrib(op: str, inputs: list[str], out: str, name: str, **attrs: int) -> Any:
    """A node of ONNX Runtime's contrib domain (com.microsoft)."""
    from onnx import helper

    node = helper.make_node(op, inputs, [out], name=name, domain="com.microsoft")
    node.attribute.extend(helper.make_attribute(key, value) for key, value in attrs.items())
    return node


class _Rewriter:
    def __init__(
        self,
        model: Any,
        bits: int,
        vocab: int,
        accuracy: int,
        weights: GraphWeights,
        embedding: str | None,
        wide: str,
        kernels: str = "ort",
    ) -> None:
        self.bits, self.vocab, self.accuracy, self.wide = bits, vocab, accuracy, wide
        self.gguf: GgufBlocks | None = weights.source.gguf
        self.weights, self.writer = weights, weights.writer
        self.embedding = embedding  # the input embedding's parameter name
        self.graph = model.graph
        self.block_sums: dict[tuple[str, int], str] = {}  # (input, block) -> its block sums
        self.report = QuantReport()
        self.count = 0
        self.specx = SpecxBlocks(self) if kernels == "specx" else None

    def add_init(self, array: np.ndarray, name: str) -> str:
        return self.writer.add(array, name)

    def blocks_for(self, wt: np.ndarray, name: str | None, head: bool) -> Blocks:
        why = "no GGUF file" if self.gguf is None else "not a known parameter"
        rounds = self.wide == "requantize-all" or (self.wide == "requantize" and not head)
        if rounds and self.gguf is not None and name is not None:
            stored = self.gguf.stored_bits(name)
            if stored is not None and stored[1] > self.bits:
                self.report.requantized[name] = (
                    f"{stored[0]} wider than {self.bits} bits (wide blocks: {self.wide})"
                )
                return quantize_float(wt, self.bits, BLOCK)
        if self.gguf is not None and name is not None:
            blocks, why = self.gguf.blocks(name, wt)
            if blocks is not None:
                self.report.carried[why] += 1
                return blocks
        if self.gguf is not None:
            self.report.requantized[name or f"matmul {self.count}"] = why
        if wt.shape[1] % BLOCK:
            raise ValueError(f"{name}: {wt.shape[1]} inputs are no multiple of {BLOCK}")
        return quantize_float(wt, HEAD_BITS if head else self.bits, BLOCK)

    def block_sum(self, x: str, block: int, rank: int) -> tuple[str, list[Any]]:
        """x [.., K] (of `rank` dims) -> its block sums [.., K / block] (the name, and the nodes
        if new): a Reshape to [.., K / block, block] and a ReduceSum, reading x alone."""
        from onnx import helper

        key = (x, block)
        if key in self.block_sums:
            return self.block_sums[key], []
        shape = self.add_init(
            np.array([0] * (rank - 1) + [-1, block], np.int64), f"nbits.blocks.{x}.{block}"
        )
        if "nbits.last_axis" not in self.writer.names:
            self.add_init(np.array([-1], np.int64), "nbits.last_axis")
        out = f"nbits.blocksum.{len(self.block_sums)}"
        self.block_sums[key] = out
        return out, [
            helper.make_node("Reshape", [x, shape], [f"{out}.blocks"], name=f"{out}.reshape"),
            helper.make_node(
                "ReduceSum", [f"{out}.blocks", "nbits.last_axis"], [out], keepdims=0, name=out
            ),
        ]

    def replace(self, node: Any, wt: np.ndarray, name: str | None) -> list[Any]:
        """Nodes computing node's output from its input x with wt [N, K] as MatMulNBits (and the
        shift's two MatMuls and Add where the blocks keep minimums)."""
        from onnx import helper

        if self.specx is not None:
            return self.specx.matmul(node, wt, name)
        self.count += 1
        x = node.input[0]
        blocks = self.blocks_for(wt, name, wt.shape[0] == self.vocab)
        n, k = blocks.shape
        self.report.bits[f"{blocks.bits}-bit"] += 1
        tag = f"nbits.{self.count}"
        b, scales, zp = blocks.packed()
        inputs = [
            x,
            self.add_init(b, f"{tag}.B"),
            self.add_init(scales, f"{tag}.scales"),
            self.add_init(zp, f"{tag}.zero_points"),
        ]
        out = node.output[0] if blocks.shift is None else f"{tag}.product"
        attrs = dict(K=k, N=n, bits=blocks.bits, block_size=blocks.block)
        nodes = [
            _contrib(
                "MatMulNBits", inputs, out, node.name or tag, accuracy_level=self.accuracy, **attrs
            )
        ]
        if blocks.shift is not None:
            shift_t = self.add_init(np.ascontiguousarray(blocks.shift.T), f"{tag}.shift")
            # body inputs are [batch, seq, K]; the head runs on a 2-D view (modules.lm_head_logits)
            rank = 2 if node.op_type == "Gemm" or n == self.vocab else 3
            sums, new = self.block_sum(x, blocks.block, rank)
            nodes = new + nodes
            nodes.append(helper.make_node("MatMul", [sums, shift_t], [f"{tag}.shifted"]))
            nodes.append(helper.make_node("Add", [out, f"{tag}.shifted"], [node.output[0]]))
        return nodes

    def replace_gather(self, node: Any, table: np.ndarray) -> list[Any]:
        """Nodes gathering rows of table [V, H] (node's output) as GatherBlockQuantized."""
        from onnx import helper

        if self.specx is not None:
            return self.specx.gather(node, table)
        blocks = self.blocks_for(table, self.embedding, head=True)
        v, h = blocks.shape
        self.report.bits[f"{blocks.bits}-bit embedding"] += 1
        tag = "nbits.embedding"
        b, scales, zp = blocks.packed()
        inputs = [
            self.add_init(b.reshape(v, -1), f"{tag}.data"),
            node.input[1],
            self.add_init(scales.reshape(v, -1), f"{tag}.scales"),
            self.add_init(zp.reshape(v, -1), f"{tag}.zero_points"),
        ]
        out = node.output[0] if blocks.shift is None else f"{tag}.rows"
        attrs = dict(gather_axis=0, quantize_axis=1, block_size=blocks.block, bits=blocks.bits)
        nodes = [_contrib("GatherBlockQuantized", inputs, out, node.name or tag, **attrs)]
        if blocks.shift is not None:  # rows [b, s, H] + their shifts, broadcast over blocks
            shift = self.add_init(blocks.shift, f"{tag}.shift")  # [V, H / block]
            split = self.add_init(np.array([0, 0, -1, blocks.block], np.int64), f"{tag}.split")
            joined = self.add_init(np.array([0, 0, h], np.int64), f"{tag}.joined")
            axes = self.add_init(np.array([-1], np.int64), f"{tag}.axes")
            nodes += [
                helper.make_node(
                    "Gather", [shift, node.input[1]], [f"{tag}.shifts"], name=f"{tag}.g"
                ),
                helper.make_node(
                    "Unsqueeze", [f"{tag}.shifts", axes], [f"{tag}.shifts1"], name=f"{tag}.u"
                ),
                helper.make_node("Reshape", [out, split], [f"{tag}.blocks"], name=f"{tag}.r1"),
                helper.make_node(
                    "Add", [f"{tag}.blocks", f"{tag}.shifts1"], [f"{tag}.sum"], name=f"{tag}.a"
                ),
                helper.make_node(
                    "Reshape", [f"{tag}.sum", joined], [node.output[0]], name=f"{tag}.r2"
                ),
            ]
        return nodes

    def is_embedding(self, node: Any) -> bool:
        """A Gather of the input embedding table whose rows split into blocks."""
        if node.op_type != "Gather" or self.weights.param(node.input[0]) != self.embedding:
            return False
        return self.weights.source.shapes[self.embedding][1] % BLOCK == 0

    def weight_of(self, node: Any, transposed: dict[str, str]) -> tuple[str, bool] | None:
        """(weight input, whether the graph reads it as stored [N, K]) of a node multiplying by a
        2-D weight, else None."""
        w = node.input[1] if len(node.input) > 1 else ""
        if node.op_type == "MatMul" and w in transposed:
            return transposed[w], True  # MatMul(x, Transpose(W)): a Linear
        name = self.weights.param(w)
        if name is None or len(self.weights.source.shapes[name]) != 2:
            return None
        if node.op_type == "MatMul":
            return w, False  # MatMul(x, W): W is [K, N] (GPT-2's Conv1D)
        trans_b = any(a.name == "transB" and a.i == 1 for a in node.attribute)
        if node.op_type == "Gemm" and len(node.input) == 2 and trans_b:
            return w, True  # a head on a 2-D view: Gemm(h, W, transB=1)
        return None

    def run(self) -> QuantReport:
        users = consumers(self.graph)
        transposed = {
            n.output[0]: n.input[0]
            for n in self.graph.node
            if linear_transpose(n, self.weights, users)
        }
        nodes: list[Any] = []
        for node in list(self.graph.node):
            if node.op_type == "Transpose" and node.output[0] in transposed:
                continue
            if self.is_embedding(node):
                nodes.extend(self.replace_gather(node, self.weights.array(node.input[0])))
                continue
            found = self.weight_of(node, transposed)
            if found is None:
                for name in node.input:
                    self.weights.ensure(name, np.float32)
                nodes.append(node)
                continue
            array = self.weights.array(found[0])
            wt = np.ascontiguousarray(array if found[1] else array.T, dtype=np.float32)
            del array
            nodes.extend(self.replace(node, wt, self.weights.param(found[0])))
            del wt
        del self.graph.node[:]
        self.graph.node.extend(nodes)
        self.weights.finish()
        return self.report


def quantize_graph(
    model: Any,
    bits: int,
    vocab: int,
    weights: GraphWeights,
    embedding: str | None,
    compute: str = "int8",
    wide: str = "carry",
    kernels: str = "ort",
) -> QuantReport:
    """Rewrite `model` (onnx ModelProto traced with its weights as inputs) in place: MatMuls on
    weights become MatMulNBits of `bits` bits (see the module docstring), written as they come;
    embedding: the input embedding's parameter name. Weights come from the source's GGUF blocks
    where it has them (weights.source.gguf); `wide`: what becomes of those wider than `bits`
    (WIDE_BLOCKS); `kernels`: "specx" for specx's own ops over the file's blocks
    (gguf_kernels.py), "ort" for MatMulNBits."""
    accuracy = COMPUTE[compute]
    report = _Rewriter(model, bits, vocab, accuracy, weights, embedding, wide, kernels).run()
    # the tracer's intermediate shapes (some stale, e.g. rank 0) would contradict the new
    # Reshapes; ONNX Runtime infers them again
    del model.graph.value_info[:]
    report.compute, report.wide_blocks, report.kernels = compute, wide, kernels
    for domain in ("com.microsoft", DOMAIN) if kernels == "specx" else ("com.microsoft",):
        if domain not in {o.domain for o in model.opset_import}:
            entry = model.opset_import.add()
            entry.domain, entry.version = domain, 1
    return report
