"""Two or more builds of the specx kernels library on the same products, in one process, taken
in turn (the VM's speed drifts between runs; this compares within one).

    compare_kernels.py NAME=LIB[,NAME=LIB...] TYPE:N:K[,TYPE:N:K...] ROWS[,ROWS...] [--repeats R]
                       [--isa ISA]

Each library's `specx_kernels_matmul` (one thread) on the same random blocks and rows; medians of
R products, and each library's speed over the first's. Build a library aside from another commit
(e.g. a git worktree's scripts/build_kernels.sh) to compare it with this one.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import numpy as np


def random_blocks(kind_name: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    elements, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind_name]]
    blocks = rng.integers(0, 256, (n * k // elements, size), dtype=np.uint8)
    halves = {"Q4_1": (0, 2), "Q5_1": (0, 2), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
    for offset in halves.get(kind_name, (0,)):  # finite fp16 scales
        scale = np.full(len(blocks), 0.01, np.float16).view(np.uint8).reshape(-1, 2)
        blocks[:, offset : offset + 2] = scale
    return np.ascontiguousarray(blocks.reshape(n, -1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("libraries")
    parser.add_argument("shapes")
    parser.add_argument("rows")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--isa", default=None)
    args = parser.parse_args()
    from gguf import GGMLQuantizationType

    libs = {
        name: ctypes.CDLL(path) for name, path in (a.split("=") for a in args.libraries.split(","))
    }
    isa = args.isa.encode() if args.isa else None
    message = ctypes.create_string_buffer(256)
    rng = np.random.default_rng(0)
    for shape in args.shapes.split(","):
        kind_name, n_text, k_text = shape.split(":")
        n, k = int(n_text), int(k_text)
        kind = int(GGMLQuantizationType[kind_name])
        weights = random_blocks(kind_name, n, k, rng)
        for rows in (int(r) for r in args.rows.split(",")):
            x = rng.standard_normal((rows, k)).astype(np.float32)
            y = np.empty((rows, n), np.float32)
            times: dict[str, list[float]] = {name: [] for name in libs}
            for repeat in range(args.repeats + 1):  # the first round warms up
                for name, lib in libs.items():
                    t0 = time.perf_counter()
                    status = lib.specx_kernels_matmul(
                        isa, kind, weights.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(n),
                        ctypes.c_int64(k), x.ctypes.data_as(ctypes.c_void_p),
                        ctypes.c_int64(rows), y.ctypes.data_as(ctypes.c_void_p), message,
                        ctypes.c_size_t(256),
                    )  # fmt: skip
                    if status:
                        raise SystemExit(f"compare_kernels: {name}: {message.value.decode()}")
                    if repeat:
                        times[name].append(time.perf_counter() - t0)
            medians = {name: 1e3 * statistics.median(t) for name, t in times.items()}
            first = next(iter(medians.values()))
            cells = "  ".join(
                f"{name} {ms:.3f} ms ({first / ms:.2f}x)" for name, ms in medians.items()
            )
            print(f"{kind_name} [{n}, {k}] x {rows} rows: {cells}", flush=True)


if __name__ == "__main__":
    main()
