"""Before an export starts: what it will write, hold in memory and take, from the configs alone;
a clean refusal (exit 2, with the numbers and the fix) when the disk or the memory cannot hold it.

The weights stream through the exporter one tensor at a time (graph/weights.py), so memory is
set by the largest graph part the parity check holds in ONNX Runtime (the whole graph, or a
layer range of at most --check-part-size: checks/parts.py), the largest single tensor (read in
float32, with its quantization's temporaries), and the libraries themselves.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specx.exporter.architecture import Architecture, describe
from specx.exporter.drafts import DraftEntry
from specx.exporter.planning.profile import read_config
from specx.runtime.drafters import registry
from specx.runtime.errors import ExportError

GB = 1e9
# Bytes a graph stores per parameter, by precision: int4 bodies are 4-bit codes with a float32
# scale and a zero point per block of 32 (GGUF K-quants carried in 8-bit lanes weigh more);
# LM heads and embedding tables of int4 graphs are 8-bit blocks.
BYTES_PER_PARAM = {"fp32": 4.0, "fp16": 2.0, "int8": 1.16, "int4": 0.75}
TABLE_BYTES = {"fp32": 4.0, "fp16": 2.0, "int8": 1.16, "int4": 1.16}
LIBRARIES = 1.5 * GB  # torch, transformers, onnx, ONNX Runtime, tokenizers and the sources open
# ONNX Runtime holding a graph for the parity check, per byte of the graph: float graphs are
# read into memory once; MatMulNBits keeps a prepacked copy of its blocks beside them.
SESSION_FACTOR = {"fp32": 1.1, "fp16": 1.1, "int8": 1.5, "int4": 1.5}
# One tensor in float32 while it is converted, beside its blocks (GGUF rows are dequantized and
# decoded in slices), per byte of that tensor: from a measured 7B export
# (docs/bench/measurements.md).
TENSOR_FACTOR = 1.75
# A rough rate for the estimate: parameters streamed, converted and checked per second on a
# 2-core CPU (docs/performance.md gives a measured export). A guide, never a limit.
PARAMS_PER_S = 1.5e7


@dataclass(frozen=True)
class Estimate:
    disk_bytes: float
    memory_bytes: float
    seconds: float

    def summary(self) -> str:
        return (
            f"about {self.disk_bytes / GB:.1f} GB on disk, {self.memory_bytes / GB:.1f} GB of "
            f"memory at the peak, {max(1.0, self.seconds / 60):.0f} min"
        )


def _graph(
    arch: Architecture, precision: str, part_bytes: float = float("inf")
) -> tuple[float, float, float]:
    """(bytes the parity check holds of the graph, largest float32 tensor's bytes, parameters)
    of one model at `precision`: the whole graph, or its largest layer-range part when the
    graph is checked in parts of `part_bytes`."""
    tables = arch.embedding_parameters
    heads = tables if arch.tied_head else 2 * tables
    body = max(0, arch.num_parameters - heads)
    size = body * BYTES_PER_PARAM[precision] + heads * TABLE_BYTES[precision]
    largest = 4.0 * max(tables, arch.hidden_size * arch.intermediate_size)
    if size > part_bytes:  # a part: up to part_bytes, or one level (a layer with a table)
        level = body * BYTES_PER_PARAM[precision] / arch.num_layers
        level += tables * TABLE_BYTES[precision]  # the embedding's, or the head's
        size = max(part_bytes, level)
    return size, largest, float(arch.num_parameters)


def estimate(
    target: str,
    drafts: list[DraftEntry],
    precision: str,
    draft_precision: str,
    batched: bool,
    part_bytes: float = float("inf"),
) -> Estimate:
    arch = describe(read_config(target), target)
    size, largest, params = _graph(arch, precision)
    disk = size * (2 if batched else 1)
    checked, _, _ = _graph(arch, precision, part_bytes)
    # the batched graph's own check (two rows at once) holds the whole of it
    session = SESSION_FACTOR[precision] * (size if batched else checked)
    seconds = params * (2 if batched else 1) / PARAMS_PER_S
    for d in drafts:
        recipe = d.kind.export
        if recipe == registry.EXPORT_QUANTIZED:
            own, _, _ = _graph(arch, d.kind.name)
            disk += own
            if d.kind.name == "int4":  # the target streamed again at int4
                own_checked, _, _ = _graph(arch, "int4", part_bytes)
                session = max(session, SESSION_FACTOR["int4"] * own_checked)
            else:  # int8: ONNX Runtime's quantizer holds the target's float32 graph
                fp32, _, _ = _graph(arch, "fp32")
                session = max(session, 2 * fp32)
            seconds += params / PARAMS_PER_S
        elif recipe == registry.EXPORT_MODEL:
            darch = describe(read_config(d.source), d.source)
            dsize, dlargest, dparams = _graph(darch, draft_precision)
            disk += dsize
            dchecked, _, _ = _graph(darch, draft_precision, part_bytes)
            session = max(session, SESSION_FACTOR[draft_precision] * dchecked)
            largest = max(largest, dlargest)
            seconds += dparams / PARAMS_PER_S
    # the weights are streamed, then checked: the session and the largest tensor never meet
    memory = LIBRARIES + max(session, TENSOR_FACTOR * largest)
    return Estimate(disk, memory, seconds)


def available_memory() -> float | None:
    """MemAvailable (Linux), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def free_disk(output: Path) -> float:
    """Free bytes where `output` will be written (its nearest existing folder)."""
    folder = output.absolute().parent
    while not folder.exists():
        folder = folder.parent
    return float(shutil.disk_usage(folder).free)


def preflight(output: Path, est: Estimate, log: Any) -> None:
    """Log the estimate; refuse when the disk or the memory cannot hold the export."""
    log(f"estimate: {est.summary()}")
    if os.environ.get("SPECX_EXPORT_NO_PREFLIGHT"):
        return
    free = free_disk(output)
    if free < est.disk_bytes * 1.05:
        raise ExportError(
            f"the export needs about {est.disk_bytes / GB:.1f} GB on disk; the folder of "
            f"{output} has {free / GB:.1f} GB free",
            "free disk space or write the artifact elsewhere (-o); int4 (--precision int4) "
            "needs about a fifth of fp32's",
        )
    memory = available_memory()
    if memory is not None and memory < est.memory_bytes:
        raise ExportError(
            f"the export needs about {est.memory_bytes / GB:.1f} GB of memory at its peak; "
            f"{memory / GB:.1f} GB are available",
            "close other programs, export at --precision int4, or set "
            "SPECX_EXPORT_NO_PREFLIGHT=1 to try anyway",
        )
