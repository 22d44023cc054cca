"""The memory floor of a decode step: the machine's bandwidth, and the weight bytes each model's
one-token pass reads (a step cannot be faster than reading them once)."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np


def memory_bandwidth(megabytes: int = 256, repeats: int = 7) -> float:
    """Bytes moved per second (read + write) by a large numpy copy; median of repeats."""
    src = np.ones(megabytes * 2**20 // 8, dtype=np.float64)
    dst = np.empty_like(src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return 2 * src.nbytes / statistics.median(times)


def read_bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes read per second by summing a large array on every core at once (what a decode
    step's weight reads need); median of repeats."""
    from concurrent.futures import ThreadPoolExecutor

    workers = os.cpu_count() or 1
    parts = [np.ones(megabytes * 2**20 // 8 // workers) for _ in range(workers)]
    times = []
    with ThreadPoolExecutor(workers) as pool:
        for _ in range(repeats):
            t0 = time.perf_counter()
            list(pool.map(np.sum, parts))  # numpy reductions release the GIL
            times.append(time.perf_counter() - t0)
    return sum(p.nbytes for p in parts) / statistics.median(times)


def bytes_per_token(artifact: Path, spec: Any) -> int:
    """Weight bytes a one-token pass reads: every initializer but the tables it only gathers
    rows from (embeddings; a gather reads one row a token)."""
    import onnx

    model = onnx.load(str(artifact / spec.graph), load_external_data=False)
    gathers = ("Gather", "GatherBlockQuantized", "GgufGather")
    gathered = {n.input[0] for n in model.graph.node if n.op_type in gathers}
    for n in model.graph.node:  # a table the head multiplies by is read in full
        if n.op_type not in gathers:
            gathered -= set(n.input)
    skipped = 0
    for t in model.graph.initializer:
        if t.name in gathered:
            skipped += (
                int(np.prod(t.dims)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
            )
    return int(spec.weight_bytes - skipped)
