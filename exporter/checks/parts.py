"""A graph checked in layer-range parts: one part's weights in ONNX Runtime at a time.

ONNX Runtime maps a graph's external data lazily but prepacks its MatMulNBits weights into
memory of its own, so a session holds more than the graph's bytes at its peak
(scripts/diagnostics/session_memory.py; the factor: docs/bench/measurements.md). For a large
graph that session is the export's peak. A decoder's layers depend on each other only forwards,
so the same passes can run part by part:

    level of a node   the highest layer whose cache it reads (past_key.i / past_value.i), -1 for
                      what depends on input_ids alone (the embedding), none for what depends on
                      neither (positions, constants: recomputed by every part that needs them)
    part              the nodes of consecutive levels, cut where the weights reach a budget
    frontier          tensors a part computes and a later part reads: the residual stream and
                      whatever else crosses the cut (masks, the next layer's projections)

Every part runs all passes of the check (each stream's prefill, decode and verify steps) before
the next part loads, with the frontier of each pass recorded in between and the caches bound
exactly as the runtime binds them (runtime/backends/ort_session.py). A part's inputs carry the
shapes the whole graph gives those tensors (observed_shape), so ONNX Runtime fuses the same
nodes. The nodes, their kernels and their inputs are the whole graph's, so the logits are the
same bits (tests/exporter/test_check_parts.py compares them for every family).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from specx.exporter.weights.sources import release_heap
from specx.runtime.artifact import contract
from specx.runtime.artifact.contract import ModelSpec
from specx.runtime.backends.ort_session import bind_cache, session_options
from specx.runtime.errors import ExportError
from specx.runtime.kv_cache import KVCache
from specx.runtime.memory import HOST

PART_PREFIX = ".check-part"  # the parts' files, beside the graph's data, removed after the check


@dataclass(frozen=True)
class Pass:
    """One forward pass of the check: `tokens` appended to cache `stream` at `start`."""

    stream: int
    start: int
    tokens: np.ndarray  # [seq] int64


@dataclass(frozen=True)
class Output:
    logits: np.ndarray  # [seq, vocab]
    features: np.ndarray | None  # [seq, F]


def levels(graph: onnx.GraphProto, num_layers: int) -> list[int | None]:
    """Each node's level (see the module's docstring), in the graph's topological order."""
    source: dict[str, int | None] = {contract.INPUT_IDS: -1}
    for layer in range(num_layers):
        source[contract.past_key(layer)] = layer
        source[contract.past_value(layer)] = layer
    result: list[int | None] = []
    for node in graph.node:
        if any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
            for a in node.attribute
        ):
            raise ExportError(
                f"node {node.name or node.op_type} holds a subgraph: the graph cannot be split",
                "export with a --check-part-size above the graph's size",
            )
        found = [lv for n in node.input if (lv := source.get(n)) is not None]
        level = max(found) if found else None
        result.append(level)
        for out in node.output:
            source[out] = level
    return result


def _initializer_bytes(tensor: onnx.TensorProto) -> int:
    for entry in tensor.external_data:
        if entry.key == "length":
            return int(entry.value)
    return len(tensor.raw_data) or onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


def graph_weight_bytes(graph_path: Path) -> int:
    model = onnx.load(str(graph_path), load_external_data=False)
    return sum(_initializer_bytes(t) for t in model.graph.initializer)


@dataclass(frozen=True)
class Part:
    nodes: list[int]  # indices into the graph's nodes, in order
    inputs: list[str]  # graph inputs and frontier tensors of earlier parts
    outputs: list[str]  # graph outputs and frontier tensors for later parts


def plan_parts(graph: onnx.GraphProto, num_layers: int, part_bytes: int) -> list[Part]:
    """Consecutive levels grouped into parts of at most `part_bytes` of weights (a level larger
    than that is a part of its own)."""
    level = levels(graph, num_layers)
    sizes = {t.name: _initializer_bytes(t) for t in graph.initializer}
    part_of_level = _group_levels(graph, level, sizes, part_bytes)
    count = max(part_of_level.values(), default=0) + 1
    owner = [None if lv is None else part_of_level[lv] for lv in level]
    graph_outputs = {o.name for o in graph.output}
    readers: dict[str, set[int]] = {}  # tensor -> the parts whose own nodes read it
    for node, part_index in zip(graph.node, owner, strict=True):
        if part_index is not None:
            for name in node.input:
                readers.setdefault(name, set()).add(part_index)
    parts = [_part(graph, owner, p, sizes, readers) for p in range(count)]
    missing = sorted(graph_outputs - {o for part in parts for o in part.outputs})
    if missing:
        raise ExportError(
            f"the graph's outputs {missing[:3]} depend on no layer's cache: it cannot be checked "
            "in parts",
            "export with a --check-part-size above the graph's size",
        )
    return parts


def _group_levels(
    graph: onnx.GraphProto, level: list[int | None], sizes: dict[str, int], part_bytes: int
) -> dict[int, int]:
    """Each level's part: consecutive levels while their weights fit in `part_bytes`."""
    per_level: dict[int, int] = {}
    for node, lv in zip(graph.node, level, strict=True):
        if lv is not None:
            per_level[lv] = per_level.get(lv, 0) + sum(sizes.get(n, 0) for n in node.input)
    part_of_level: dict[int, int] = {}
    part, used = 0, 0
    for lv in sorted(per_level):
        if used and used + per_level[lv] > part_bytes:
            part, used = part + 1, 0
        part_of_level[lv] = part
        used += per_level[lv]
    return part_of_level


def _part(
    graph: onnx.GraphProto,
    owner: list[int | None],
    p: int,
    sizes: dict[str, int],
    readers: dict[str, set[int]],
) -> Part:
    """Part `p`: its own nodes and the level-less ones they read (recomputed here), what it
    reads from the graph's inputs and earlier parts, and what the outputs and later parts
    read of it."""
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output}
    graph_inputs = {i.name for i in graph.input}
    graph_outputs = {o.name for o in graph.output}
    own = [i for i in range(len(graph.node)) if owner[i] == p]
    needed = set(own)
    stack = list(own)
    while stack:  # the level-less nodes these read, recomputed here
        for name in graph.node[stack.pop()].input:
            j = producer.get(name)
            if j is not None and owner[j] is None and j not in needed:
                needed.add(j)
                stack.append(j)
    nodes = sorted(needed)
    made = {out for i in nodes for out in graph.node[i].output}
    inputs: list[str] = []
    for i in nodes:
        for name in graph.node[i].input:
            if name and name not in made and name not in sizes and name not in inputs:
                if name not in graph_inputs and owner[producer[name]] is None:
                    raise ExportError(
                        f"{name} is computed by no part of the graph",
                        "export with a --check-part-size above the graph's size; please report it",
                    )
                inputs.append(name)
    outputs = [
        out
        for i in own
        for out in graph.node[i].output
        if out in graph_outputs or any(r > p for r in readers.get(out, ()))
    ]
    return Part(nodes, inputs, outputs)


def observed_shape(values: list[np.ndarray], seqs: list[int]) -> list[int | str]:
    """A frontier tensor's shape as the whole graph knows it, from its values in every pass:
    ONNX Runtime fuses nodes (a residual Add into the next LayerNormalization, ...) only where
    it can tell their inputs' shapes agree, so the part's inputs need shapes, named as the
    graph names its inputs' dims. Axis 0 of a batch of one is "batch", a dim that is each
    pass's token count "seq", a dim that never changes a number, any other a name of its own."""
    first = values[0]
    shape: list[int | str] = []
    for axis, size in enumerate(first.shape):
        sizes = {v.shape[axis] for v in values}
        floating = first.dtype.kind in "fb" and first.ndim >= 2
        if floating and axis == 0 and sizes == {1}:
            shape.append("batch")
        elif (
            floating
            and len(set(seqs)) > 1
            and all(v.shape[axis] == n for v, n in zip(values, seqs, strict=True))
        ):
            shape.append("seq")
        elif len(sizes) == 1:
            shape.append(int(size))
        else:
            shape.append(f"d{axis}")  # one name per axis: unknown, as far as fusions can tell
    return shape


def _part_model(
    model: onnx.ModelProto, part: Part, inputs: dict[str, tuple[int, list[int | str]]]
) -> onnx.ModelProto:
    graph = model.graph
    known = {v.name: v for v in [*graph.input, *graph.output]}
    nodes = [graph.node[i] for i in part.nodes]
    used = {n for node in nodes for n in node.input}
    initializers = [t for t in graph.initializer if t.name in used]

    def info(name: str) -> onnx.ValueInfoProto:
        if name in known:
            return known[name]
        if name in inputs:
            return onnx.helper.make_tensor_value_info(name, *inputs[name])
        return onnx.ValueInfoProto(name=name)  # typed by ONNX Runtime from its producer

    sub = onnx.helper.make_graph(
        nodes, "part", [info(n) for n in part.inputs], [info(n) for n in part.outputs], initializers
    )
    result = onnx.helper.make_model(sub, opset_imports=list(model.opset_import))
    result.ir_version = model.ir_version
    return result


def _step_inputs(spec: ModelSpec, step: Pass) -> dict[str, np.ndarray]:
    seq = len(step.tokens)
    end = step.start + seq
    return {
        contract.INPUT_IDS: np.ascontiguousarray(step.tokens, np.int64).reshape(1, seq),
        contract.POSITION_IDS: np.arange(step.start, end, dtype=np.int64).reshape(1, seq),
        contract.SEQLENS_K: np.array([end - 1], dtype=np.int32),
        contract.TOTAL_SEQUENCE_LENGTH: np.array(end, dtype=np.int32),
        contract.WRITE_INDICES: np.array([step.start], dtype=np.int64),
        contract.KEEP_LOGITS: np.array(seq, dtype=np.int64),  # every new position's logits
    }


def _is_cache(name: str) -> bool:
    return name.startswith(("past_", "new_", "present_"))


def run_in_parts(
    graph_path: Path, spec: ModelSpec, passes: list[Pass], part_bytes: int
) -> tuple[list[Output], int]:
    """The passes' logits (and features) from the graph run part by part; and the part count."""
    model = onnx.load(str(graph_path), load_external_data=False)
    parts = plan_parts(model.graph, spec.num_layers, part_bytes)
    capacity: dict[int, int] = {}
    for step in passes:
        capacity[step.stream] = max(capacity.get(step.stream, 0), step.start + len(step.tokens))
    caches = {}  # each stream's cache, as the runtime's; the passes say which positions to bind
    for stream, positions in capacity.items():
        cache = KVCache(
            spec.num_layers,
            spec.kv_heads,
            spec.head_dim,
            positions,
            spec.dtype,
            HOST,
            layout=spec.attention,
        )
        cache.advance(positions)  # all valid, so keys()/values() read any pass's new slots
        caches[stream] = cache
    frontier: list[dict[str, np.ndarray]] = [{} for _ in passes]
    finals: list[dict[str, np.ndarray]] = [{} for _ in passes]
    seqs = [len(step.tokens) for step in passes]
    for index, part in enumerate(parts):
        wanted = {name for later in parts[index:] for name in later.inputs}
        for recorded in frontier:  # what no part left reads
            for name in [n for n in recorded if n not in wanted]:
                del recorded[name]
        typed = {
            name: (
                int(onnx.helper.np_dtype_to_tensor_dtype(frontier[0][name].dtype)),
                observed_shape([f[name] for f in frontier], seqs),
            )
            for name in part.inputs
            if name in frontier[0]
        }
        path = graph_path.parent / f"{PART_PREFIX}-{index}.onnx"
        onnx.save(_part_model(model, part, typed), str(path))
        try:
            kinds = sorted({f"{n.domain or 'ai.onnx'}:{n.op_type}" for n in model.graph.node})
            options = session_options(None, False, kinds)
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        finally:
            path.unlink()
        read_later = {name for later in parts[index + 1 :] for name in later.inputs}
        for i, step in enumerate(passes):
            cache = caches[step.stream]
            _run_part(session, part, spec, cache, step, frontier[i], finals[i], read_later)
        del session
        gc.collect()
        release_heap()
    features = contract.FEATURES if spec.feature_size else None
    outputs = [Output(f[contract.LOGITS][0], f[features][0] if features else None) for f in finals]
    return outputs, len(parts)


def _run_part(
    session: ort.InferenceSession,
    part: Part,
    spec: ModelSpec,
    cache: KVCache,
    step: Pass,
    frontier: dict[str, np.ndarray],
    finals: dict[str, np.ndarray],
    read_later: set[str],
) -> None:
    io = session.io_binding()
    given = _step_inputs(spec, step)
    for name in part.inputs:
        if _is_cache(name) and name not in frontier:
            continue  # bound below
        value = frontier[name] if name in frontier else given[name]
        # (np.ascontiguousarray would make a 0-d input, the logits count, 1-d)
        io.bind_cpu_input(name, value if value.flags.c_contiguous else np.ascontiguousarray(value))
    free = [n for n in part.outputs if not _is_cache(n)]
    for name in free:  # first: get_outputs lists outputs in the order they were bound
        io.bind_output(name, "cpu")
    bind_cache(io, cache, step.start, len(step.tokens), set(part.inputs), set(part.outputs))
    session.run_with_iobinding(io)
    produced = io.get_outputs()  # not the caches' own: they are in the cache already
    for i, name in enumerate(free):
        value = produced[i].numpy()
        (finals if name in (contract.LOGITS, contract.FEATURES) else frontier)[name] = value
    for name in part.outputs:  # a cache output a later part reads as a frontier tensor
        if _is_cache(name) and name in read_later:
            frontier[name] = _new_slots(cache, step, name)


def _new_slots(cache: KVCache, step: Pass, name: str) -> np.ndarray:
    """What a plain graph's new_key.i / new_value.i output wrote into the cache: [1, seq, ..]
    (a full-buffer graph's present outputs are read by no other node)."""
    kind, layer = name.removeprefix("new_").split(".")
    valid = cache.keys(int(layer)) if kind == "key" else cache.values(int(layer))
    return valid[None, step.start : step.start + len(step.tokens)].copy()
