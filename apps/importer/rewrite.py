"""`specx import --rewrite gqa`: an Optimum ("concat") decoder's attention rewritten as ONNX
Runtime's GroupQueryAttention, the op specx's own CPU graphs use ("gqa" in
runtime/artifact/contract.py), on the user's request only.

Why: an Optimum graph computes each layer's attention from about 200 small operators (shapes,
rotary halves, the causal mask, the key and value heads repeated for every query head) and
returns the whole cache as a new tensor every pass; ONNX Runtime pays a fixed cost per operator,
so a one-token pass of a small model costs about a third more than the same model's "gqa" graph
(docs/bench/measurements.md). The rewrite keeps every weight and every other operator: per
layer, the projections' outputs (q, k, v) go into one GroupQueryAttention node whose output
replaces the attention's at the output projection; rotary embeddings move into the op, their
tables computed by the graph's own rotary subgraph at positions 0 .. max_length - 1. The
rewritten graph is checked against the original (logits over a prompt and a decode step) before
anything is written, and refused where they part.

Held: fp32 and q4 (MatMulNBits) graphs of decoders with rotary embeddings on the whole head
(llama, qwen2, mistral, ...), the q/k/v projections separate. Needs the `onnx` package (the
export install has it; `pip install onnx` otherwise).
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specx.apps.importer.layout import Source
from specx.runtime.artifact import contract
from specx.runtime.artifact.contract import ModelSpec
from specx.runtime.errors import InputError

PROJECTIONS = ("MatMul", "MatMulNBits", "Gemm")  # a weight initializer at input 1
PLAIN_IMPORT = "import it without --rewrite (it runs as exported)"


def onnx_package() -> Any:
    try:
        import onnx
    except ImportError as e:
        raise InputError(
            "--rewrite gqa needs the onnx package, which is not installed",
            "pip install onnx (or import without --rewrite)",
        ) from e
    return onnx


@dataclass(frozen=True)
class _Layer:
    q: str  # projection outputs [batch, seq, heads * head_dim] (bias added)
    k: str
    v: str
    out_node: Any  # the output projection, whose input `out_index` the attention fed
    out_index: int
    scale: float
    cos: str  # the rotary factors the layer multiplies by (from the graph's rotary subgraph)
    sin: str


class _Graph:
    """Producers, consumers and constant values of one GraphProto."""

    def __init__(self, graph: Any, numpy_helper: Any) -> None:
        self.producer = {o: n for n in graph.node for o in n.output}
        self.consumers: dict[str, list[Any]] = defaultdict(list)
        for n in graph.node:
            for i in n.input:
                self.consumers[i].append(n)
        self.initializers = {t.name: t for t in graph.initializer}
        self._numpy = numpy_helper

    def scalar(self, name: str) -> float | None:
        """The value of a one-element constant, else None."""
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant":
            tensor = next((a.t for a in node.attribute if a.name == "value"), None)
        else:
            tensor = self.initializers.get(name)
        if tensor is None or tensor.data_location == 1:  # external: not a scalar
            return None
        value = self._numpy.to_array(tensor)
        return float(value.reshape(-1)[0]) if value.size == 1 else None

    def constant(self, name: str) -> bool:
        """An initializer, a Constant, or an Identity of one (exporters share equal weights so)."""
        node = self.producer.get(name)
        if name in self.initializers or (node is not None and node.op_type == "Constant"):
            return True
        return node is not None and node.op_type == "Identity" and self.constant(node.input[0])

    def op(self, name: str) -> str | None:
        node = self.producer.get(name)
        return node.op_type if node is not None else None

    def back_through(self, name: str, ops: tuple[str, ...]) -> str:
        """Walk producers while they are one of `ops` (their data input is input 0)."""
        while self.op(name) in ops:
            name = self.producer[name].input[0]
        return name


def _refuse(graph: Path, what: str) -> InputError:
    return InputError(f"{graph.name}: cannot rewrite its attention: {what}", PLAIN_IMPORT)


def _projection_input(g: _Graph, out: str, graph: Path) -> str:
    """The activation a projection output came from: MatMul(x, W) or MatMul(x, W) + b."""
    node = g.producer.get(out)
    if node is not None and node.op_type == "Add":
        biased = [i for i in node.input if not g.constant(i)]
        node = g.producer.get(biased[0]) if len(biased) == 1 else None
    if node is None or node.op_type not in PROJECTIONS or not g.constant(node.input[1]):
        raise _refuse(graph, f"{out} is not a projection of the hidden state")
    return str(node.input[0])


def _projection_output(g: _Graph, node: Any) -> str:
    """A projection's output, its bias added where an Add with an initializer follows."""
    out = node.output[0]
    after = g.consumers.get(out, [])
    biased = len(after) == 1 and after[0].op_type == "Add"
    if biased and any(g.constant(i) for i in after[0].input if i != out):
        return str(after[0].output[0])
    return str(out)


def _rotary(g: _Graph, rotated: str, graph: Path) -> tuple[str, str, str]:
    """(unrotated heads, cos, sin) of x * cos + rotate_half(x) * sin."""
    add = g.producer.get(rotated)
    if add is None or add.op_type != "Add":
        raise _refuse(graph, f"{rotated} is not x * cos + rotate_half(x) * sin")
    muls = [g.producer[i] for i in add.input if g.op(i) == "Mul"]
    if len(muls) != 2:
        raise _refuse(graph, f"{rotated} is not x * cos + rotate_half(x) * sin")
    plain = rot = None
    for m in muls:
        for j in (0, 1):
            if g.op(m.input[j]) == "Transpose":
                plain = (m.input[j], m.input[1 - j])
            elif g.op(m.input[j]) == "Concat":
                rot = (m.input[j], m.input[1 - j])
    if plain is None or rot is None:
        raise _refuse(graph, f"{rotated}: no rotate_half(x) * sin beside x * cos")
    return plain[0], plain[1], rot[1]


def _first_projection_after(g: _Graph, start: str) -> tuple[Any, int]:
    """The first projection (a weight at input 1) downstream of `start`, shape arithmetic
    skipped: the attention's output projection."""
    seen, queue = {start}, deque([start])
    while queue:
        name = queue.popleft()
        for node in g.consumers.get(name, []):
            if node.op_type == "Shape":
                continue
            if node.op_type in PROJECTIONS and g.constant(node.input[1]):
                return node, list(node.input).index(name)
            for out in node.output:
                if out not in seen:
                    seen.add(out)
                    queue.append(out)
    raise KeyError(start)


def _scale(g: _Graph, q_rot: str, graph: Path) -> float:
    """The softmax scale: the constants q and k are multiplied by before their product (and one
    the product is divided or multiplied by after it)."""
    queue, seen = deque([q_rot]), {q_rot}
    while queue:  # the first MatMul of two activations downstream of the rotated queries
        name = queue.popleft()
        for node in g.consumers.get(name, []):
            if node.op_type == "MatMul" and not any(g.constant(i) for i in node.input):
                return _scale_of(g, node)
            if (
                node.op_type in ("Mul", "Transpose", "Reshape", "Cast")
                and node.output[0] not in seen
            ):
                seen.add(node.output[0])
                queue.append(node.output[0])
    raise _refuse(graph, f"no query-key product after {q_rot}")


def _scale_of(g: _Graph, product: Any) -> float:
    scale = 1.0
    for name in product.input:
        while g.op(name) in ("Mul", "Transpose"):
            node = g.producer[name]
            if node.op_type == "Mul":
                factors = [g.scalar(i) for i in node.input]
                known = [f for f in factors if f is not None]
                if len(known) != 1:
                    break
                scale *= known[0]
                name = node.input[factors.index(None)]
            else:
                name = node.input[0]
    after = g.consumers.get(product.output[0], [])
    if len(after) == 1 and after[0].op_type in ("Div", "Mul"):
        factor = g.scalar(after[0].input[1])
        if factor is not None:
            scale = scale / factor if after[0].op_type == "Div" else scale * factor
    return scale


def _layer(g: _Graph, i: int, src: Source) -> _Layer:
    names = {kind: contract.concat_present(i, kind) for kind in ("key", "value")}
    for kind, name in names.items():
        cat = g.producer.get(name)
        if cat is None or cat.op_type != "Concat" or cat.input[0] != contract.concat_past(i, kind):
            raise _refuse(src.graph, f"{name} is not Concat(past, new)")
    cats = {kind: g.producer[name] for kind, name in names.items()}
    k_heads, cos, sin = _rotary(g, cats["key"].input[1], src.graph)
    k = g.back_through(k_heads, ("Transpose", "Reshape"))
    v = g.back_through(cats["value"].input[1], ("Transpose", "Reshape"))
    hidden = _projection_input(g, k, src.graph)
    if _projection_input(g, v, src.graph) != hidden:
        raise _refuse(src.graph, f"layer {i}'s key and value read different activations")
    others = [
        _projection_output(g, n)
        for n in g.consumers[hidden]
        if n.op_type in PROJECTIONS and g.constant(n.input[1])
    ]
    q = [o for o in others if o not in (k, v)]
    if len(q) != 1:
        raise _refuse(src.graph, f"layer {i} has {len(q)} query projections beside k and v")
    q_rot = [
        n.output[0]
        for n in g.consumers[cos]
        if n.op_type == "Mul"
        and any(g.back_through(x, ("Transpose", "Reshape")) == q[0] for x in n.input)
    ]
    q_rot_sum = [a.output[0] for m in q_rot for a in g.consumers[m] if a.op_type == "Add"]
    if len(q_rot_sum) != 1:
        raise _refuse(src.graph, f"layer {i}'s queries are not rotated by the keys' tables")
    try:
        out_node, out_index = _first_projection_after(g, names["value"])
    except KeyError:
        raise _refuse(src.graph, f"no output projection after {names['value']}") from None
    scale = _scale(g, q_rot_sum[0], src.graph)
    return _Layer(q[0], k, v, out_node, out_index, scale, cos, sin)


def _rotary_tables(
    model: Any, g: _Graph, layers: list[_Layer], src: Source, length: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each layer's (cos, sin) tables [length, head_dim / 2], computed by the graph's own rotary
    subgraph (its scaling and base included) at positions 0 .. length - 1."""
    import onnxruntime as ort
    from onnx import external_data_helper, helper

    wanted = sorted({name for layer in layers for name in (layer.cos, layer.sin)})
    nodes = _live(list(model.graph.node), wanted)  # the nodes the factors depend on
    used = {i for n in nodes for i in n.input}
    inits = [g.initializers[i] for i in sorted(used & set(g.initializers))]
    for tensor in inits:
        if tensor.data_location == 1:
            external_data_helper.load_external_data_for_tensor(tensor, str(src.graph.parent))
    inputs = [v for v in model.graph.input if v.name in used]
    outputs = [helper.make_tensor_value_info(name, 1, None) for name in wanted]
    sub = helper.make_graph(nodes, "rotary", inputs, outputs, inits)
    sub_model = helper.make_model(sub, opset_imports=model.opset_import)
    sub_model.ir_version = model.ir_version
    session = ort.InferenceSession(
        sub_model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    feeds = _rotary_feeds(session, src, length)
    values = dict(zip(wanted, session.run(wanted, feeds), strict=True))
    half = src.head_dim // 2
    tables = []
    for layer in layers:
        pair = []
        for name in (layer.cos, layer.sin):
            table = np.asarray(values[name], dtype=np.float32)
            if table.size != length * src.head_dim:
                raise _refuse(src.graph, f"rotary table {name} is {list(table.shape)}, not "
                              f"[{length}, {src.head_dim}] (partial rotary)")  # fmt: skip
            table = table.reshape(length, src.head_dim)
            if not np.array_equal(table[:, :half], table[:, half:]):
                raise _refuse(src.graph, f"rotary table {name} does not repeat its halves")
            pair.append(np.ascontiguousarray(table[:, :half]))
        tables.append((pair[0], pair[1]))
    return tables


def _rotary_feeds(session: Any, src: Source, length: int) -> dict[str, np.ndarray]:
    feeds: dict[str, np.ndarray] = {}
    for inp in session.get_inputs():
        if inp.name == contract.POSITION_IDS:
            feeds[inp.name] = np.arange(length, dtype=np.int64)[None]
        elif inp.name == contract.ATTENTION_MASK:
            feeds[inp.name] = np.ones((1, length), dtype=np.int64)
        elif inp.name == contract.INPUT_IDS:
            feeds[inp.name] = np.zeros((1, length), dtype=np.int64)
        else:  # a past (float32: rewrite_to_gqa takes no other): empty
            feeds[inp.name] = np.zeros((1, src.kv_heads, 0, src.head_dim), dtype=np.float32)
    return feeds


def rewrite_to_gqa(src: Source, spec: ModelSpec, into: Path, copy: bool, pair_id: str) -> Path:
    """Write `src`'s graph with GroupQueryAttention layers into `into` with `spec`'s inputs and
    outputs (the "gqa" contract), beside its external-data files (linked or copied), stamped with
    the artifact's pair id and its rotary tables' length (`spec.max_length`) as specx's exports
    are. Returns the new graph's path."""
    length = spec.max_length
    if src.attention != "concat":
        raise InputError(f"{src.folder}: --rewrite gqa rewrites Optimum graphs; a GenAI "
                         "graph already runs GroupQueryAttention", PLAIN_IMPORT)  # fmt: skip
    logits = next(t.dtype for t in src.outputs if t.name == contract.LOGITS)
    if (src.dtype, logits) != ("float32", "float32"):
        raise InputError(
            f"{src.graph.name}: --rewrite gqa takes float32 caches and logits, not {src.dtype} "
            f"and {logits}",
            "import its fp32 or q4 variant, or " + PLAIN_IMPORT,
        )
    narrow = sorted(
        t.name for t in src.inputs if t.name in contract.INDEX_INPUTS and t.dtype != "int64"
    )
    if narrow:
        raise InputError(
            f"{src.graph.name}: --rewrite gqa takes int64 ids and positions; {narrow} are int32",
            PLAIN_IMPORT,
        )
    window = src.config.get("sliding_window")
    windowed = isinstance(window, int) and window < length
    kinds = set(src.config.get("layer_types") or ["full_attention"])
    if kinds != {"full_attention"} or (
        windowed and src.config.get("use_sliding_window", True) is not False
    ):
        raise _refuse(src.graph, f"its attention slides over {window} positions, fewer than the "
                      f"cache's {length} (rewritten only without a window)")  # fmt: skip
    onnx = onnx_package()
    from onnx import numpy_helper

    model = onnx.load(str(src.graph), load_external_data=False)
    g = _Graph(model.graph, numpy_helper)
    layers = [_layer(g, i, src) for i in range(src.num_layers)]
    tables = _rotary_tables(model, g, layers, src, length)
    _assemble(onnx, model, layers, tables, src, spec)
    stamps = {contract.PAIR_ID_KEY: pair_id, contract.MAX_LENGTH_KEY: str(length)}
    props = {p.key: p.value for p in model.metadata_props}
    onnx.helper.set_model_props(model, {**props, **stamps})
    into.mkdir(parents=True)
    for f in src.files[1:]:  # the external data, under its own name beside the new graph
        _place(f, into / f.name, copy)
    out = into / src.graph.name
    onnx.save(model, str(out))
    return out


def _place(source: Path, target: Path, copy: bool) -> None:
    """A hard link (or a copy where asked, or across file systems): ONNX Runtime refuses external
    data that a symbolic link leads out of the graph's own folder."""
    import os
    import shutil

    if not copy:
        try:
            os.link(source.resolve(), target)
            return
        except OSError:
            pass
    shutil.copy2(source, target)


def _assemble(
    onnx: Any,
    model: Any,
    layers: list[_Layer],
    tables: list[tuple[np.ndarray, np.ndarray]],
    src: Source,
    spec: ModelSpec,
) -> None:
    """Replace each layer's attention by a GroupQueryAttention node, the graph's I/O by `spec`'s,
    and drop what nothing reads any more."""
    from onnx import helper, numpy_helper

    graph = model.graph
    heads = spec.num_heads
    if heads <= 0 or heads % src.kv_heads:
        raise _refuse(src.graph, f"num_attention_heads {heads} over {src.kv_heads} kv heads")
    named, initializers = _table_initializers(tables, numpy_helper)
    seqlens, total = contract.SEQLENS_K, contract.TOTAL_SEQUENCE_LENGTH
    before = {layer.out_node.output[0]: (i, layer) for i, layer in enumerate(layers)}
    nodes = []
    for node in graph.node:
        copied = onnx.NodeProto()
        copied.CopyFrom(node)
        if node.output[0] in before:
            i, layer = before[node.output[0]]
            cos, sin = named[i]
            attended = f"/specx/layers.{i}/gqa_output"
            nodes.append(helper.make_node(
                "GroupQueryAttention",
                [layer.q, layer.k, layer.v, contract.past_key(i), contract.past_value(i),
                 seqlens, total, cos, sin],
                [attended, contract.present_key(i), contract.present_value(i)],
                name=f"/specx/layers.{i}/GroupQueryAttention", domain="com.microsoft",
                num_heads=heads, kv_num_heads=src.kv_heads, scale=layer.scale, do_rotary=1,
                rotary_interleaved=0, local_window_size=-1,
            ))  # fmt: skip
            copied.input[layer.out_index] = attended
        nodes.append(copied)
    del graph.node[:]
    graph.node.extend(_live(nodes, [contract.LOGITS] + [
        name for i in range(src.num_layers)
        for name in (contract.present_key(i), contract.present_value(i))
    ]))  # fmt: skip
    _io(graph, spec, helper)
    read = {i for n in graph.node for i in n.input}
    gone = sorted(
        read & {contract.ATTENTION_MASK, contract.POSITION_IDS}
        | {r for r in read if r.startswith("past_key_values.")}
    )
    if gone:
        raise _refuse(src.graph, f"{gone[0]} is read outside attention")
    kept = [t for t in graph.initializer if t.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept + initializers)
    produced = {o for n in graph.node for o in n.output}
    info = [v for v in graph.value_info if v.name in produced]
    del graph.value_info[:]
    graph.value_info.extend(info)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))


def _table_initializers(
    tables: list[tuple[np.ndarray, np.ndarray]], numpy_helper: Any
) -> tuple[list[tuple[str, str]], list[Any]]:
    """Each layer's (cos, sin) initializer names, and the initializers: one per distinct table
    (layers with other rotary bases get their own)."""
    names: dict[bytes, str] = {}
    initializers = []
    per_layer = []
    for pair in tables:
        layer = []
        for kind, table in zip(("cos", "sin"), pair, strict=True):
            key = kind.encode() + table.tobytes()
            if key not in names:
                names[key] = f"specx.rotary.{kind}.{len(names)}"
                initializers.append(numpy_helper.from_array(table, names[key]))
            layer.append(names[key])
        per_layer.append((layer[0], layer[1]))
    return per_layer, initializers


def _live(nodes: list[Any], outputs: list[str]) -> list[Any]:
    """The nodes the outputs depend on, in their order."""
    producer = {o: n for n in nodes for o in n.output}
    needed, queue = set(), deque(outputs)
    while queue:
        node = producer.get(queue.popleft())
        if node is None or node.output[0] in needed:
            continue
        needed.add(node.output[0])
        queue.extend(node.input)
    return [n for n in nodes if n.output[0] in needed]


def _io(graph: Any, spec: ModelSpec, helper: Any) -> None:
    """The graph's inputs and outputs as `spec` lists them (names, dtypes, symbolic dims)."""
    types = {"float32": 1, "float16": 10, "int64": 7, "int32": 6}
    del graph.input[:]
    graph.input.extend(helper.make_tensor_value_info(t.name, types[t.dtype], list(t.shape))
                       for t in spec.inputs)  # fmt: skip
    del graph.output[:]
    graph.output.extend(helper.make_tensor_value_info(t.name, types[t.dtype], list(t.shape))
                        for t in spec.outputs)  # fmt: skip
