"""Which ONNX Runtime a graph needs: the operators of specx graphs and the oldest release that
runs each of them correctly, as measured by scripts/diagnostics/ort_versions.py (the reference
consumer on every graph kind under every release since 1.16; the table is in
docs/artifact-format.md).
"""

from __future__ import annotations

from specx.runtime.artifact.contract import ModelSpec

# operator -> (oldest release that runs specx's use of it correctly, why that release)
MIN_ONNXRUNTIME: dict[str, tuple[tuple[int, int], str]] = {
    "com.microsoft:GroupQueryAttention": (
        (1, 20),
        "multi-token passes over a past (verify, draft catch-up) compute wrong logits before "
        "1.20; the op loads from 1.18",
    ),
    "com.microsoft:MatMulNBits": ((1, 22), "the int4 draft's 8-bit head (bits=8) needs 1.22"),
    "com.microsoft:GatherBlockQuantized": (
        (1, 24),
        "int4/int8 graphs' embedding table (uint8 blocks with zero points): 1.22 and older "
        "refuse the graph (INVALID_GRAPH); 1.23 not measured (scripts/diagnostics/ort_versions.py)",
    ),
    "ai.onnx:TensorScatter": (
        (1, 26),
        "the batched graph's TensorScatter (opset 24): 1.23 and older refuse opset 24, 1.24 has "
        "no kernel for it (1.25 not measured; scripts/diagnostics/ort_batched.py)",
    ),
    "specx:GgufMatMul": (
        (1, 21),
        "the specx kernels library is built against ONNX Runtime's API 21 (libonnxruntime-dev "
        "1.21); older releases refuse to register it",
    ),
    "specx:GgufGather": ((1, 21), "the specx kernels library (as GgufMatMul)"),
    "specx:GroupQueryAttention": ((1, 21), "the specx kernels library (as GgufMatMul)"),
}
OLDEST_MEASURED = (1, 16)  # plain graphs (standard operators only) ran on every release measured


def operators_of(spec: ModelSpec) -> tuple[str, ...]:
    """The graph's recorded operators, or, for manifests written before they were recorded,
    the ones its attention and variant imply."""
    if spec.operators:
        return spec.operators
    implied = ["com.microsoft:GroupQueryAttention"] if spec.attention == "gqa" else []
    if spec.attention == "batched":
        implied.append("ai.onnx:TensorScatter")
    if spec.variant == "int4":
        implied.append("com.microsoft:MatMulNBits")
    if spec.variant == "int8":
        implied += ["ai.onnx:DynamicQuantizeLinear", "ai.onnx:MatMulInteger"]
    return tuple(implied)


def min_onnxruntime(spec: ModelSpec) -> tuple[tuple[int, int], str]:
    """(oldest ONNX Runtime release that runs this graph, the reason) ."""
    needs = [MIN_ONNXRUNTIME[op] for op in operators_of(spec) if op in MIN_ONNXRUNTIME]
    return max(needs, default=(OLDEST_MEASURED, "standard operators only"))


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as 1.32.0 or 1.20.1.dev2."""
    parts = [*version.split("."), "0", "0"][:2]
    return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
