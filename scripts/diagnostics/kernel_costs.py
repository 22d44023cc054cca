"""What the specx kernels cost: one product on one thread, and an artifact's passes.

    kernel_costs.py matmul [--type Q4_K] [--n 2048] [--k 1536] [--rows 1,5] [--isa avx512vnni]
    kernel_costs.py passes ARTIFACT [ARTIFACT ...] [--rounds 20] [--prompt 512]

matmul: the library's C ABI (`specx_kernels_matmul`, one thread) on random blocks of the type,
[n, k] weights against `rows` activation rows; the median time of `--repeats` products, the
weight bytes read per second and the multiply-adds per second as a fraction of the instruction
set's peak measured first in the same run (`specx_kernels_peak`: its integer products from
registers on one thread; vpdpbusd on AVX-512 VNNI). A matrix larger than the caches
(`--n 151936`: an LM head) shows how the kernel streams from memory; a small one what it
computes.

passes: per artifact, the one-token target pass, passes over K + 1 = 4, 6, 9 tokens (r: each
over the one-token pass) and the first draft's one-token pass (c), all after a 128-token prompt
and taken in turn round after round (the VM's speed drifts), medians; then the process's peak
resident memory, the loaded pair's; with --prompt N, the target's and the first draft's prompt
rate on an N-token prompt (tokens/s, median of 3 prefills into an empty cache). Each artifact
runs in its own process, one after another.
Nothing else may run meanwhile; 2 threads, one pool, as `specx run` uses them.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
if TYPE_CHECKING:
    from specx.runtime import Pipeline
WIDTHS = (1, 4, 6, 9)  # tokens a pass: one, then K + 1 for K = 3, 5, 8


def matmul(args: argparse.Namespace) -> None:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    from specx.runtime.kernels import library

    path = library.library_path()
    if path is None:
        raise SystemExit("kernel_costs: the specx kernels library is not built (build_kernels.sh)")
    lib = ctypes.CDLL(str(path))
    kind = GGMLQuantizationType[args.type]
    elements, size = GGML_QUANT_SIZES[kind]
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (args.n * args.k // elements, size), dtype=np.uint8)
    halves = {"Q4_1": (0, 2), "Q5_1": (0, 2), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
    for offset in halves.get(args.type, (0,)):  # finite fp16 scales
        blocks[:, offset : offset + 2] = (
            np.full(len(blocks), 0.01, np.float16).view(np.uint8)[:, None].reshape(-1, 2)
        )
    weights = np.ascontiguousarray(blocks.reshape(args.n, -1))
    message = ctypes.create_string_buffer(256)
    isa = args.isa.encode() if args.isa else None
    peak = ctypes.c_double()
    if lib.specx_kernels_peak(isa, ctypes.c_double(1.0), ctypes.byref(peak), message, 256):
        raise SystemExit(f"kernel_costs: {message.value.decode()}")
    lib.specx_kernels_isa.restype = ctypes.c_char_p
    named = args.isa or lib.specx_kernels_isa().decode()
    rate = peak.value / 1e9
    print(f"peak of {named}'s integer products, one thread: {rate:.1f} G multiply-adds/s")
    for rows in (int(r) for r in args.rows.split(",")):
        x = rng.standard_normal((rows, args.k)).astype(np.float32)
        y = np.empty((rows, args.n), np.float32)
        times = []
        for _ in range(args.repeats + 2):
            t0 = time.perf_counter()
            status = lib.specx_kernels_matmul(
                isa, int(kind),
                weights.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(args.n),
                ctypes.c_int64(args.k), x.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(rows),
                y.ctypes.data_as(ctypes.c_void_p), message, ctypes.c_size_t(256),
            )  # fmt: skip
            times.append(time.perf_counter() - t0)
            if status:
                raise SystemExit(f"kernel_costs: {message.value.decode()}")
        median = statistics.median(times[2:])
        rate = rows * args.n * args.k / median
        print(
            f"{args.type} [{args.n}, {args.k}] x {rows} rows, {named}: {1e3 * median:.3f} ms, "
            f"{weights.nbytes / median / 1e9:.1f} GB/s of weights, {rate / 1e9:.1f} G "
            f"multiply-adds/s = {rate / peak.value:.0%} of the peak"
        )


def prompt_rates(pipe: Pipeline, n: int, repeats: int = 3) -> dict[str, float]:
    """Prompt tokens/s of the target and the first draft: an n-token prompt read into an empty
    cache (the runtime's own prefill, its chunks), median of `repeats`."""
    vocab = pipe.manifest.target.vocab_size
    ids = (np.arange(n, dtype=np.int64) * 7919) % min(20000, vocab - 3) + 3  # [n], in the vocab
    models = [("target", pipe.target)]
    if pipe.manifest.drafts:
        models.append(("draft", pipe.draft_session(pipe.manifest.drafts[0])))
    rates = {}
    for name, session in models:
        cache = session.new_cache(n + 16)
        times = []
        for _ in range(repeats):
            cache.truncate(0)
            t0 = time.perf_counter()
            session.prefill(ids, cache)
            times.append(time.perf_counter() - t0)
        rates[f"{name}_prompt_tps"] = n / statistics.median(times)
    return rates


def passes_of(artifact: Path, rounds: int, prompt: int = 0) -> dict[str, float]:
    """One artifact's pass times (ms), r per K, c and peak RSS (MB); run in this process."""
    import resource

    from specx.runtime import Pipeline
    from specx.runtime.backends.ort_session import use_global_thread_pool

    use_global_thread_pool(2)
    pipe = Pipeline.load(artifact)
    target = pipe.target.fork()
    draft = pipe.draft_session(pipe.manifest.drafts[0]).fork() if pipe.manifest.drafts else None
    ids = np.arange(100, 228, dtype=np.int64)
    runs = [("target", target, w) for w in WIDTHS]
    runs += [("draft", draft, 1)] if draft is not None else []
    caches = {}
    for name, session, _ in runs:
        if name not in caches:
            caches[name] = session.new_cache(min(512, pipe.manifest.max_length))
            session.forward(ids, caches[name])
    times: dict[tuple[str, int], list[float]] = {(n, w): [] for n, _, w in runs}
    for _ in range(rounds):
        for name, session, width in runs:
            cache = caches[name]
            base = cache.length
            t0 = time.perf_counter()
            session.forward(ids[:width], cache)
            times[(name, width)].append(time.perf_counter() - t0)
            cache.truncate(base)
    ms = {key: 1e3 * statistics.median(v) for key, v in times.items()}
    one = ms[("target", 1)]
    result = {"target_ms": one}
    result |= {f"r_k{w - 1}": ms[("target", w)] / one for w in WIDTHS[1:]}
    if draft is not None:
        result["draft_ms"] = ms[("draft", 1)]
        result["c"] = ms[("draft", 1)] / one
    if prompt:
        result |= prompt_rates(pipe, prompt)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def passes(args: argparse.Namespace) -> None:
    if len(args.artifacts) > 1:  # each in a process of its own: its memory, its thread pool
        for artifact in args.artifacts:
            command = [sys.executable, __file__, "passes", str(artifact), "--rounds"]
            command += [str(args.rounds), "--prompt", str(args.prompt)]
            subprocess.run(command, check=True)
        return
    result = passes_of(args.artifacts[0], args.rounds, args.prompt)
    figures = ", ".join(
        f"{k} {v:.1f}" if k.endswith(("_ms", "_mb", "_tps")) else f"{k} {v:.2f}"
        for k, v in result.items()
    )
    print(f"{args.artifacts[0]}: {figures}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    one = sub.add_parser("matmul")
    one.add_argument("--type", default="Q4_K")
    one.add_argument("--n", type=int, default=2048)
    one.add_argument("--k", type=int, default=1536)
    one.add_argument("--rows", default="1,5")
    one.add_argument("--isa", default=None)
    one.add_argument("--repeats", type=int, default=50)
    many = sub.add_parser("passes")
    many.add_argument("artifacts", nargs="+", type=Path)
    many.add_argument("--rounds", type=int, default=20)
    many.add_argument("--prompt", type=int, default=0, help="also the prompt rate on N tokens")
    args = parser.parse_args()
    matmul(args) if args.mode == "matmul" else passes(args)


if __name__ == "__main__":
    main()
