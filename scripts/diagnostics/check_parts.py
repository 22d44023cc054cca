#!/usr/bin/env python3
"""The export's parity check whole and in layer-range parts on an artifact's graph: whether
every pass gives the same logits to the bit, and each way's peak resident memory and time (each
in a fresh process, so its peak is its own). The passes are the check's (a prefill, a decode
and a verify step of K + 1, a text one token and K + 1 tokens a pass) over random tokens.

    .venv/bin/python scripts/diagnostics/check_parts.py build/qwen-int4 [--part-mb 1024]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def passes(vocab: int, text: int, k: int) -> list:
    from specx.exporter.checks.parity import parity_passes, text_passes

    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab, size=12 + k + 2).astype(np.int64)
    return parity_passes(ids, k) + text_passes(rng.integers(0, vocab, size=text), k)


def measure(artifact: Path, graph: str, part_bytes: int, text: int, k: int, out: Path) -> None:
    """One way, in this process: logits to `out` (.npy), figures as JSON on stdout."""
    from specx.exporter.checks.parity import run_passes
    from specx.runtime.artifact.contract import Manifest

    manifest = Manifest.from_json(json.loads((artifact / "manifest.json").read_text()))
    spec = next(s for s in (manifest.target, *manifest.drafts) if s.graph == graph)
    t0 = time.perf_counter()
    outputs, parts = run_passes(artifact, spec, passes(spec.vocab_size, text, k), part_bytes)
    seconds = time.perf_counter() - t0
    np.save(out, np.concatenate([o.logits for o in outputs]))
    with open("/proc/self/status") as f:  # this process's own high-water mark (ru_maxrss
        # would start from the parent's size at the fork)
        peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    print(json.dumps({"parts": parts, "seconds": seconds, "peak_gb": peak / 1e9}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--graph", default="target.onnx")
    parser.add_argument("--part-mb", type=float, default=1024.0)
    parser.add_argument("--text", type=int, default=64, help="tokens of the text passes")
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # internal: PART_BYTES OUT
    args = parser.parse_args()
    if args.one:
        measure(args.artifact, args.graph, int(args.one[0]), args.text, args.k, Path(args.one[1]))
        return
    graph_mb = (args.artifact / (args.graph + ".data")).stat().st_size / 2**20
    results = {}
    logits = {}
    for way, part_bytes in (("whole", 1 << 50), ("parts", int(args.part_mb * 2**20))):
        out = Path(f"/tmp/check_parts_{way}.npy")
        command = [sys.executable, __file__, str(args.artifact), "--graph", args.graph]
        command += ["--text", str(args.text), "-k", str(args.k), "--one", str(part_bytes), str(out)]
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        if done.returncode:
            sys.exit(done.stderr[-2000:])
        results[way] = json.loads(done.stdout.strip().splitlines()[-1])
        logits[way] = np.load(out)
        out.unlink()
    same = bool(np.array_equal(logits["whole"], logits["parts"]))
    diff = float(np.max(np.abs(logits["whole"] - logits["parts"])))
    rows = len(logits["whole"])
    print(f"{args.artifact / args.graph}: {graph_mb:.0f} MB of weights, {rows} rows")
    print("| check | parts | peak RSS | time |")
    print("|---|---|---|---|")
    for way, r in results.items():
        print(f"| {way} | {r['parts']} | {r['peak_gb']:.2f} GB | {r['seconds']:.0f} s |")
    print(f"logits identical: {'yes' if same else 'no'} (max |difference| {diff:.3g})")


if __name__ == "__main__":
    main()
