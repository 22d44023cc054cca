"""What ONNX Runtime's MatMulNBits costs and computes on this CPU, and where a decode step of a
quantized graph spends its time: the measurements behind docs/quantized.md.

    .venv/bin/python scripts/nbits_kernels.py                  kernel table (1536 x 8960 weight)
    .venv/bin/python scripts/nbits_kernels.py --step ARTIFACT  ONNX Runtime's profile of 20
                                                               one-token target steps, by op type
    .venv/bin/python scripts/nbits_kernels.py --floor ARTIFACT what the block kernels alone cost:
                                                               each model's bytes, its step, and
                                                               its MatMulNBits nodes run alone

--floor: for the target and each draft, the bytes its MatMulNBits nodes read per token by kind
(codes, float32 scales, zero points, the separate shift MatMuls of K-quants), the same tensors'
size in the GGUF file it came from (what llama.cpp reads), then, taken in turn 40 times (the VM's
bandwidth drifts), the one-token step (128 tokens of context), a graph holding only its
MatMulNBits and shift nodes (same weights, each fed its own input: what the kernels alone take),
and every fifth round the machine's read bandwidth; medians.

Kernel table: for 4 and 8 bits, uint8 / float / no zero points, accuracy level 0 (fp32) and 4
(int8 activations): the median time of a one-row and a five-row product, and whether a row's
result is bit-identical whatever the number of rows in the call (1 .. 8). Float zero points at
8 bits are refused by ONNX Runtime's CPU kernel (shown as the error). Nothing else may run
meanwhile; 2 threads, as the bench uses on this machine.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
K, N, THREADS = 1536, 8960, 2
ROUNDS = 40


def _session(bits: int, zero: str, accuracy: int, w: np.ndarray):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from specx.exporter.weights.blocks import quantize_float

    b, scales, zp = quantize_float(w, bits, 32).packed()
    inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(scales, "s")]
    inputs = ["A", "B", "s"]
    if zero == "uint8":
        inits.append(numpy_helper.from_array(zp, "z"))
        inputs.append("z")
    elif zero == "float":
        inits.append(numpy_helper.from_array(np.full(scales.shape, 8.0, np.float32), "z"))
        inputs.append("z")
    node = helper.make_node(
        "MatMulNBits",
        inputs,
        ["Y"],
        domain="com.microsoft",
        K=K,
        N=N,
        bits=bits,
        block_size=32,
        accuracy_level=accuracy,
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    model = helper.make_model(graph, opset_imports=opsets).SerializeToString()
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _median_ms(session, x: np.ndarray, repeats: int = 30) -> float:
    session.run(None, {"A": x})
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        session.run(None, {"A": x})
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def kernels() -> None:
    rng = np.random.default_rng(0)
    w = rng.normal(size=(N, K)).astype(np.float32)
    x = rng.normal(size=(8, K)).astype(np.float32)
    print(f"MatMulNBits, weight {K} x {N}, blocks of 32, {THREADS} threads")
    print("bits zero   accuracy  1 row ms  5 rows ms  rows bit-identical across 1..8")
    for bits in (4, 8):
        for zero in ("uint8", "float", "none"):
            for accuracy in (0, 4):
                try:
                    s = _session(bits, zero, accuracy, w)
                except Exception as e:  # ORT raises its own exception types
                    why = str(e).rsplit("was false.", 1)[-1].strip()[:70]
                    print(f"{bits:>4} {zero:<7} {accuracy:>8}  refused: {why}")
                    continue
                one = np.concatenate([s.run(None, {"A": x[i : i + 1]})[0] for i in range(8)])
                same = all(
                    np.array_equal(s.run(None, {"A": x[:m]})[0], one[:m]) for m in range(2, 9)
                )
                t1, t5 = _median_ms(s, x[:1]), _median_ms(s, x[:5])
                print(f"{bits:>4} {zero:<7} {accuracy:>8}  {t1:8.2f}  {t5:9.2f}  {same}")


def step_profile(artifact: Path, steps: int = 20) -> None:
    """ONNX Runtime's profile of `steps` one-token target passes after a 128-token prefill."""
    import onnxruntime as ort

    from specx.runtime.artifact.contract import Manifest
    from specx.runtime.backends import OrtSession

    spec = Manifest.read(artifact).target
    prefix = str(Path(tempfile.mkdtemp()) / "step")
    plain = ort.SessionOptions

    class Profiled(plain):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.enable_profiling = True
            self.profile_file_prefix = prefix

    ort.SessionOptions = Profiled  # the backend makes its own options
    try:
        session = OrtSession(artifact / spec.graph, spec, ["cpu"], max_chunk=128)
    finally:
        ort.SessionOptions = plain
    cache = session.new_cache(128 + steps + 1)
    session.forward(np.arange(100, 228, dtype=np.int64), cache)
    for i in range(steps):
        session.forward(np.array([5 + i], dtype=np.int64), cache)
    session.session.end_profiling()
    events = json.loads(Path(sorted(glob.glob(prefix + "*.json"))[-1]).read_text())
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    start = runs[-steps]["ts"]
    time_by_op: collections.Counter[str] = collections.Counter()
    nodes: collections.Counter[str] = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["ts"] >= start and e["name"].endswith("_kernel_time"):
            time_by_op[e["args"]["op_name"]] += e["dur"]
            nodes[e["args"]["op_name"]] += 1
    total = sum(time_by_op.values())
    run_ms = statistics.median(r["dur"] for r in runs[-steps:]) / 1e3
    print(f"{artifact}: one-token step {run_ms:.1f} ms under the profiler (median of {steps})")
    for op, us in time_by_op.most_common(10):
        print(
            f"  {op:<28} {us / steps / 1e3:6.2f} ms  {nodes[op] // steps:4d} nodes  "
            f"{100 * us / total:5.1f}%"
        )


def _kernels_only(graph: Path, folder: Path) -> tuple[Path, dict[str, int]]:
    """A graph of `graph`'s MatMulNBits nodes and shift MatMuls alone (each reading a new input),
    in folder; and the bytes their weights take, by kind."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(graph))
    inits = {i.name: i for i in model.graph.initializer}
    shifts = {
        n.input[1] for n in model.graph.node if n.input[1:2] and n.input[1].endswith(".shift")
    }
    nodes, inputs, outputs, used = [], [], [], []
    sizes: collections.Counter[str] = collections.Counter()
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            k = next(a.i for a in node.attribute if a.name == "K")
            for kind, name in zip(
                ("codes", "scales", "zero points"), node.input[1:4], strict=False
            ):
                sizes[kind] += _size(inits[name])
        elif node.op_type == "MatMul" and node.input[1] in shifts:
            k = inits[node.input[1]].dims[0]
            sizes["shifts"] += _size(inits[node.input[1]])
        else:
            continue
        x, y = f"x{len(nodes)}", f"y{len(nodes)}"
        inputs.append(helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 1, k]))
        outputs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT, None))
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        nodes.append(
            helper.make_node(node.op_type, [x, *node.input[1:]], [y], domain=node.domain, **attrs)
        )
        used.extend(i for i in node.input[1:] if i in inits)
    kept = [inits[name] for name in dict.fromkeys(used)]
    alone = helper.make_model(
        helper.make_graph(nodes, "kernels", inputs, outputs, kept), opset_imports=model.opset_import
    )
    alone.ir_version = model.ir_version
    out = folder / f"{graph.stem}.kernels.onnx"
    onnx.save(alone, str(out), save_as_external_data=True, location=f"{out.name}.data")
    return out, dict(sizes)


def _size(init: Any) -> int:
    from onnx.helper import tensor_dtype_to_np_dtype

    return int(np.prod(init.dims)) * np.dtype(tensor_dtype_to_np_dtype(init.data_type)).itemsize


def _file_bytes(spec: Any, graph: Path) -> int | None:
    """Bytes of the GGUF tensors behind `graph`'s MatMulNBits weights, as stored in the file."""
    import onnx
    from gguf import GGUFReader

    source = Path(spec.source)
    if source.suffix != ".gguf" or not source.is_file():
        return None
    model = onnx.load(str(graph), load_external_data=False)
    products = sum(
        1 for n in model.graph.node if n.op_type == "MatMulNBits"
    )  # every matrix of the file but the embedding table is multiplied once per token
    tensors = [t for t in GGUFReader(str(source)).tensors if len(t.shape) == 2]
    matrices = [t for t in tensors if t.name != "token_embd.weight"]
    if len(matrices) != products:  # a head tied to the table reads the table's bytes
        matrices += [t for t in tensors if t.name == "token_embd.weight"]
    return sum(int(t.n_bytes) for t in matrices)


def floor(artifact: Path) -> None:
    import onnxruntime as ort

    from specx.apps.bench.floor import read_bandwidth
    from specx.runtime.artifact.contract import Manifest
    from specx.runtime.backends import OrtSession
    from specx.runtime.backends.ort_session import session_options

    manifest = Manifest.read(artifact)
    folder = Path(tempfile.mkdtemp())
    for spec in (manifest.target, *manifest.drafts):
        graph = artifact / spec.graph
        if spec.variant not in ("int4", "int8") or not graph.is_file():
            continue
        alone, sizes = _kernels_only(graph, folder)
        session = OrtSession(graph, spec, ["cpu"], max_chunk=128)
        cache = session.new_cache(128 + 2 * ROUNDS)
        session.forward(np.arange(100, 228, dtype=np.int64), cache)
        kernels = ort.InferenceSession(
            str(alone), session_options(None, False), providers=["CPUExecutionProvider"]
        )
        feed = {i.name: np.random.randn(*i.shape).astype(np.float32) for i in kernels.get_inputs()}
        kernels.run(None, feed)
        step, only, read = [], [], []
        for i in range(ROUNDS):  # in turn, so that the VM's bandwidth drifts alike for all three
            t0 = time.perf_counter()
            session.forward(np.array([5 + i], dtype=np.int64), cache)
            t1 = time.perf_counter()
            kernels.run(None, feed)
            step.append(t1 - t0)
            only.append(time.perf_counter() - t1)
            if i % 5 == 0:
                read.append(read_bandwidth(256, 1))
        del session, kernels
        total = sum(sizes.values())
        parts = ", ".join(f"{k} {v / 1e6:.0f}" for k, v in sizes.items())
        file_bytes = _file_bytes(spec, graph)
        in_file = f"; in its GGUF file {file_bytes / 1e6:.0f} MB" if file_bytes else ""
        print(f"{spec.name} ({spec.variant}): block weights read per token {total / 1e6:.0f} MB")
        print(f"  ({parts}){in_file}")
        only_s, bandwidth = statistics.median(only), statistics.median(read)
        print(
            f"  one-token step {statistics.median(step) * 1e3:.1f} ms; its MatMulNBits and shift "
            f"nodes alone {only_s * 1e3:.1f} ms ({total / only_s / 1e9:.1f} GB/s; the machine "
            f"reads {bandwidth / 1e9:.1f} GB/s: {total / bandwidth * 1e3:.1f} ms for these bytes)"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", type=Path, help="an artifact: profile its target's steps")
    parser.add_argument("--floor", type=Path, help="an artifact: its block kernels alone")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.step:
        step_profile(args.step)
    elif args.floor:
        floor(args.floor)
    else:
        kernels()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
