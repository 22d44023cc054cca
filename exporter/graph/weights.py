"""A traced graph's weights, streamed from the source into its side file one tensor at a time.

The graph is traced on a stand-in (sources.stand_in) with its parameters as graph inputs and no
constant folding, so every weight arrives under its own name and in its own layout. This module
turns those inputs into initializers: each is read from the source when the first node that
needs it comes, converted (transposed for a MatMul, cast to float16, or made MatMulNBits blocks
by weights/nbits.py), appended to `<graph>.data`, and dropped. Resident memory is bounded by
the largest single tensor, never the model.

Float graphs: `MatMul(x, Transpose(W))` (a Linear) becomes `MatMul(x, W^T)` with W^T stored;
a tied head (the embedding read by a Gather too) becomes `Gemm(h, E, transB=1)` on the one table.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specx.exporter.weights.sources import WeightSource, layer_of, release_heap

INLINE_BYTES = 1024  # smaller tensors stay in the graph proto (onnx's own threshold)
ALIGN = 4096  # large tensors start on a page: ONNX Runtime can map them


class ExternalData:
    """Initializers appended to a side file as they come; the graph keeps references."""

    def __init__(self, graph: Any, path: Path) -> None:
        self.graph, self.path = graph, path
        self.file = open(path, "wb")  # noqa: SIM115  closed by close()
        self.offset = self.nbytes = self.params = 0
        self.names: set[str] = set()

    def add(self, array: np.ndarray, name: str) -> str:
        from onnx import TensorProto, numpy_helper
        from onnx.helper import np_dtype_to_tensor_dtype

        array = np.ascontiguousarray(array)
        if array.nbytes < INLINE_BYTES:
            tensor = numpy_helper.from_array(array, name)
        else:
            pad = -self.offset % ALIGN
            self.file.write(b"\0" * pad)
            self.offset += pad
            tensor = TensorProto(name=name, data_type=np_dtype_to_tensor_dtype(array.dtype))
            tensor.dims.extend(array.shape)
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (
                ("location", self.path.name),
                ("offset", str(self.offset)),
                ("length", str(array.nbytes)),
            ):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            self.file.write(array.data)  # C-contiguous: its bytes, without a copy
            self.offset += array.nbytes
        self.graph.initializer.append(tensor)
        self.names.add(name)
        self.nbytes += array.nbytes
        self.params += array.size
        return name

    def close(self) -> None:
        self.file.close()


@dataclass
class GraphWeights:
    """The graph's weight inputs: a parameter of the source (its name) or a buffer (its value)."""

    states: dict[str, str | np.ndarray]  # graph input -> parameter name, or buffer value
    source: WeightSource
    writer: ExternalData
    log: Callable[[str], None]
    layers: int
    role: str
    _layer: int = -1
    _t0: float = field(default_factory=time.perf_counter)

    def param(self, name: str) -> str | None:
        value = self.states.get(name)
        return value if isinstance(value, str) else None

    def array(self, name: str) -> np.ndarray:
        """The values of graph input `name` (a parameter: float32, as transformers loads it)."""
        value = self.states[name]
        if not isinstance(value, str):
            return value
        self.progress(layer_of(value))
        return self.source.tensor(value)

    def progress(self, layer: int | None) -> None:
        if layer is None or layer <= self._layer:
            return
        release_heap()
        if self._layer >= 0:
            took = time.perf_counter() - self._t0
            self.log(
                f"  {self.role}: layer {self._layer + 1}/{self.layers} written, "
                f"{self.writer.nbytes / 1e6:,.0f} MB in {took:.0f} s"
            )
        self._layer = layer

    def ensure(self, name: str, dtype: Any) -> None:
        """Graph input `name`, if a weight not written yet, as an initializer of `dtype`."""
        if name in self.states and name not in self.writer.names:
            self.writer.add(self.array(name).astype(dtype, copy=False), name)

    def finish(self) -> None:
        self.progress(self.layers)


def consumers(graph: Any) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            out.setdefault(name, []).append(node)
    return out


def linear_transpose(node: Any, weights: GraphWeights, users: dict[str, list[Any]]) -> bool:
    """Whether `node` transposes a 2-D weight input for MatMuls alone (a Linear's W^T)."""
    if node.op_type != "Transpose" or weights.param(node.input[0]) is None:
        return False
    perm = [list(a.ints) for a in node.attribute if a.name == "perm"]
    if perm and perm[0] != [1, 0]:
        return False
    readers = users.get(node.output[0], [])
    return bool(readers) and all(
        r.op_type == "MatMul" and r.input[1] == node.output[0] for r in readers
    )


def write_float(model: Any, weights: GraphWeights, dtype: Any) -> None:
    """Every weight input of a float graph as an initializer of `dtype` (module docstring)."""
    from onnx import helper

    graph = model.graph
    users = consumers(graph)
    nodes: list[Any] = []
    for node in list(graph.node):
        if linear_transpose(node, weights, users):
            w = node.input[0]
            if len(users[w]) > 1:  # a tied head: Gemm on the one table (2-D: lm_head_logits)
                weights.ensure(w, dtype)
                for r in users[node.output[0]]:
                    gemm = helper.make_node(
                        "Gemm", [r.input[0], w], list(r.output), transB=1, name=r.name
                    )
                    r.CopyFrom(gemm)
            else:
                weights.writer.add(weights.array(w).T.astype(dtype), node.output[0])
            continue
        for name in node.input:
            weights.ensure(name, dtype)
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    weights.finish()


def drop_weight_inputs(model: Any, weights: GraphWeights) -> None:
    """Remove the graph inputs that became initializers."""
    kept = [i for i in model.graph.input if i.name not in weights.states]
    del model.graph.input[:]
    model.graph.input.extend(kept)


def weight_bytes(model: Any) -> tuple[int, int]:
    """(number of values, bytes) over the graph's initializers, read from their dims alone."""
    from onnx.helper import tensor_dtype_to_np_dtype

    params = nbytes = 0
    for init in model.graph.initializer:
        count = int(np.prod(init.dims)) if len(init.dims) else 1
        params += count
        nbytes += count * np.dtype(tensor_dtype_to_np_dtype(init.data_type)).itemsize
    return params, nbytes
