"""Where a verify pass parts from one-token passes: every node's rows, compared bit for bit.

    row_parts.py ARTIFACT [--graph target] [--k 4] [--prompt TEXT] [--starts 3]

A speculative step is exact only if row j of a pass over K + 1 tokens equals what a one-token
pass at that position computes. This script runs both on the same tokens and cache (the graph's
own greedy continuation of the prompt) and compares the output of every node of the graph:

    A: K + 1 one-token passes at positions P .. P + K, each reading the cache the last one wrote
    B: one pass over the same K + 1 tokens at positions P .. P + K

A tensor whose row axis is the pass's `seq` is compared row by row; where an axis runs over the
keys (its size follows the cache length) B's row j is cut to the length A saw, and what lies past
it (masked keys) is left out. Integer tensors (shapes, indices) are skipped. An *origin* is a node
whose output parts while every float tensor it reads agrees: the op that makes the difference,
not one that carries it on. The report lists the origins by op type and the logits' agreement.

Every node output becomes a graph output, which keeps ONNX Runtime from fusing across it: the
report says first whether the untouched graph's logits part, so that a fused kernel's behaviour
is not mistaken for the tapped graph's. Nothing is written into the artifact (the tapped graph
is loaded from memory, its weights from the artifact's folder).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

PROMPT = "def quicksort(items):\n    "


def options(
    threads: int, folder: Path | None = None, record: dict[str, Any] | None = None
) -> ort.SessionOptions:
    """Session options; `record`: the graph's manifest entry, whose op libraries (the specx
    kernels) are registered as the runtime registers them."""
    from specx.runtime.kernels import library

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.log_severity_level = 3  # the tapped graph blocks fusions, each with a warning
    if folder is not None:  # a model from bytes finds its external weights here
        so.add_session_config_entry(
            "session.model_external_initializers_file_folder_path", str(folder)
        )
    if record is not None:
        library.register(so, record.get("operators", ()), record["graph"])
    return so


def tapped(model: onnx.ModelProto) -> tuple[bytes, list[str], dict[str, tuple[str, list[str]]]]:
    """The model with every node output as a graph output; the names in graph order and each
    name's producer (op type, inputs)."""
    outputs = {o.name for o in model.graph.output}
    names: list[str] = []
    producer: dict[str, tuple[str, list[str]]] = {}
    for node in model.graph.node:
        for name in node.output:
            if not name:
                continue
            producer[name] = (node.op_type, list(node.input))
            names.append(name)
            if name not in outputs:
                model.graph.output.append(onnx.ValueInfoProto(name=name))
    return model.SerializeToString(), names, producer


class Graph:
    """One graph of the artifact driven from numpy, cache kept as the contract lays it out."""

    def __init__(self, session: ort.InferenceSession, record: dict[str, Any]) -> None:
        self.session = session
        self.layers = record["num_layers"]
        self.attention = record.get("attention", "gqa")
        if self.attention not in ("plain", "gqa"):
            raise SystemExit(f"row_parts: {self.attention!r} graphs are not supported")
        self.kv, self.dim = record["kv_heads"], record["head_dim"]
        self.capacity = record["max_length"]
        self.inputs = {i.name for i in session.get_inputs()}

    def empty(self) -> list[np.ndarray]:
        shape = (
            (1, 0, self.kv, self.dim)
            if self.attention == "plain"
            else (1, self.kv, self.capacity, self.dim)
        )
        return [np.zeros(shape, np.float32) for _ in range(2 * self.layers)]

    def run(
        self, tokens: list[int], start: int, cache: list[np.ndarray], names: list[str] | None = None
    ) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
        """Outputs by name after one pass over `tokens` at positions start..; the grown cache."""
        seq = len(tokens)
        feeds: dict[str, np.ndarray] = {
            "input_ids": np.asarray([tokens], np.int64),
            "position_ids": np.arange(start, start + seq, dtype=np.int64)[None],
        }
        if self.attention == "gqa":
            feeds["seqlens_k"] = np.asarray([start + seq - 1], np.int32)
            feeds["total_sequence_length"] = np.asarray(start + seq, np.int32)
            feeds["logits_to_keep"] = np.asarray(seq, np.int64)  # every row's (new exports)
        for i in range(self.layers):
            feeds[f"past_key.{i}"], feeds[f"past_value.{i}"] = cache[2 * i], cache[2 * i + 1]
        feeds = {k: v for k, v in feeds.items() if k in self.inputs}
        wanted = names or [o.name for o in self.session.get_outputs()]
        values = dict(zip(wanted, self.session.run(wanted, feeds), strict=True))
        grown = []
        for i in range(self.layers):
            for kind, j in (("key", 2 * i), ("value", 2 * i + 1)):
                if self.attention == "plain":
                    grown.append(np.concatenate([cache[j], values[f"new_{kind}.{i}"]], axis=1))
                else:
                    grown.append(values[f"present_{kind}.{i}"])
        return values, grown


def row(a: np.ndarray, b: np.ndarray, j: int, k1: int, a_len: int, b_len: int) -> np.ndarray | None:
    """B's part that corresponds to A's one-token tensor `a` at row j, or None if none does."""
    if a.ndim != b.ndim:
        return None
    index: list[Any] = []
    seq_axis = False
    for sa, sb in zip(a.shape, b.shape, strict=True):
        if sa == sb:
            index.append(slice(None))
        elif sa == 1 and sb == k1 and not seq_axis:
            index.append(slice(j, j + 1))
            seq_axis = True
        elif sa == a_len and sb == b_len:  # over the keys: A saw a shorter cache
            index.append(slice(0, sa))
        else:
            return None
    return b[tuple(index)] if seq_axis else None


def compare(
    a_passes: list[dict[str, np.ndarray]], b: dict[str, np.ndarray], names: list[str], start: int
) -> dict[str, float | None]:
    """Per tensor: the largest |difference| over the rows (0.0: bit-identical), None if skipped."""
    k1 = len(a_passes)
    result: dict[str, float | None] = {}
    for name in names:
        if not np.issubdtype(b[name].dtype, np.floating):
            result[name] = None
            continue
        worst: float | None = 0.0
        for j, a in enumerate(a_passes):
            part = row(a[name], b[name], j, k1, start + j + 1, start + k1)
            if part is None:
                worst = None
                break
            if not np.array_equal(part, a[name]):  # a difference below float32's least is 2**-149
                worst = max(worst or 0.0, float(np.max(np.abs(part - a[name]))) or 2.0**-149)
        result[name] = worst
    return result


def origins(
    diffs: dict[str, float | None], producer: dict[str, tuple[str, list[str]]]
) -> list[str]:
    found = []
    for name, worst in diffs.items():
        if not worst:
            continue
        _, inputs = producer[name]
        if all(not diffs.get(i) for i in inputs):
            found.append(name)
    return found


def load(
    artifact: Path, name: str, threads: int
) -> tuple[Graph, Graph, list[str], Any, Callable[[str], Any]]:
    """The graph as exported and tapped, the tapped names and producers, a tokenizer's encode."""
    from tokenizers import Tokenizer

    manifest = json.loads((artifact / "manifest.json").read_text())
    records = [manifest["target"], *manifest.get("drafts", [])]
    record = next((r for r in records if r["name"] == name), None)
    if record is None:
        raise SystemExit(f"row_parts: no graph {name!r} (have {[r['name'] for r in records]})")
    path = artifact / record["graph"]
    untouched = Graph(ort.InferenceSession(str(path), options(threads, None, record)), record)
    model, names, producer = tapped(onnx.load(str(path), load_external_data=False))
    taps = Graph(ort.InferenceSession(model, options(threads, path.parent, record)), record)
    tokenizer = Tokenizer.from_file(str(artifact / manifest["tokenizer"]))
    return untouched, taps, names, producer, tokenizer.encode


def one_pass(
    untouched: Graph,
    taps: Graph,
    names: list[str],
    producer: Any,
    caches: list[Any],
    tokens: list[int],
    start: int,
    k: int,
) -> dict[str, Any]:
    """Fills `tokens` with the graph's greedy continuation, compares A and B at `start`; leaves in
    `caches` what the verify passes wrote (the step's tokens enter them as in speculation)."""
    one_logits, c = [], caches[0]
    for j in range(k + 1):
        values, c = untouched.run([tokens[j]], start + j, c)
        one_logits.append(values["logits"][0, 0])
        tokens.append(int(values["logits"][0, 0].argmax()))
    verify, caches[0] = untouched.run(tokens[: k + 1], start, caches[0])
    a_passes, c = [], caches[1]
    for j in range(k + 1):
        out, c = taps.run([tokens[j]], start + j, c, names)
        a_passes.append(out)
    b, caches[1] = taps.run(tokens[: k + 1], start, caches[1], names)
    diffs = compare(a_passes, b, names, start)
    found = origins(diffs, producer)
    return {
        "position": start,
        "logits_max_abs_diff": float(np.max(np.abs(verify["logits"][0] - np.stack(one_logits)))),
        "tapped_logits_max_abs_diff": diffs.get("logits"),
        "tensors": len(diffs),
        "parted": sum(1 for d in diffs.values() if d),
        "skipped": sum(1 for d in diffs.values() if d is None),
        "origins": [{"tensor": n, "op": producer[n][0], "max_abs_diff": diffs[n]} for n in found],
    }


def measure(
    artifact: Path,
    name: str = "target",
    k: int = 4,
    prompt: str = PROMPT,
    starts: int = 3,
    threads: int = 2,
) -> dict[str, Any]:
    """`starts` verify passes one after another along the graph's own greedy text."""
    untouched, taps, names, producer, encode = load(artifact, name, threads)
    ids = encode(prompt).ids
    report: dict[str, Any] = {"graph": name, "k": k, "passes": []}
    by_op: Counter[str] = Counter()
    values, cache = untouched.run(ids, 0, untouched.empty())
    caches = [cache, taps.run(ids, 0, taps.empty())[1]]
    start, token = len(ids), int(values["logits"][0, -1].argmax())
    for _ in range(starts):
        tokens = [token]
        result = one_pass(untouched, taps, names, producer, caches, tokens, start, k)
        report["passes"].append(result)
        by_op.update(o["op"] for o in result["origins"])
        shown = ", ".join(f"{o['op']} {o['tensor']}" for o in result["origins"][:6])
        print(
            f"position {start}: logits |diff| {result['logits_max_abs_diff']:.3g} (tapped "
            f"{result['tapped_logits_max_abs_diff'] or 0:.3g}); {result['parted']} of "
            f"{result['tensors']} tensors part; origins: {shown or 'none'}"
            f"{' ...' if len(result['origins']) > 6 else ''}"
        )
        start, token = start + k + 1, tokens[k + 1]
    report["origins_by_op"] = dict(by_op.most_common())
    print("origins by op:", ", ".join(f"{op} {n}" for op, n in by_op.most_common()) or "none")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--graph", default="target", help="target, or a draft's name")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--starts", type=int, default=3, help="verify passes, one after another")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the report here too")
    args = parser.parse_args()
    report = measure(args.artifact, args.graph, args.k, args.prompt, args.starts, args.threads)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
