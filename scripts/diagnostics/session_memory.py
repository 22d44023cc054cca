#!/usr/bin/env python3
"""Where a graph's session memory goes: resident memory right after ONNX Runtime opens it
(anonymous: allocated copies such as MatMulNBits' prepacked blocks; file: mapped external data),
and the load's peak, with prepacking on (how specx runs graphs) and off. Each case in a fresh
process, so its peak is its own.

    .venv/bin/python scripts/diagnostics/session_memory.py build/qwen-int4/target.onnx
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path


def resident() -> dict[str, float]:
    """GB resident now, by kind (/proc/self/status)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return {k: int(fields[k].split()[0]) / 1e6 for k in ("RssAnon", "RssFile")}


def measure(graph: str, prepack: bool) -> None:
    """One case, in this process: print its figures as JSON."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if not prepack:
        options.add_session_config_entry("session.disable_prepacking", "1")
    before = resident()
    session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
    after = resident()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB -> GB
    del session
    print(json.dumps({"prepack": prepack, "before": before, "after": after, "peak_gb": peak}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("graph", type=Path)
    parser.add_argument("--case", choices=["on", "off"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        measure(str(args.graph), args.case == "on")
        return
    weights = sum(
        f.stat().st_size for f in args.graph.parent.glob(args.graph.name + "*") if f.is_file()
    )
    print(f"{args.graph}: {weights / 1e9:.2f} GB on disk (graph and its external data)")
    print(
        "| prepacking | anonymous after load | mapped file after load | load peak | peak / size |"
    )
    print("|---|---|---|---|---|")
    for case in ("on", "off"):
        out = subprocess.run(
            [sys.executable, __file__, str(args.graph), "--case", case],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(
            f"| {case} | {r['after']['RssAnon']:.2f} GB | {r['after']['RssFile']:.2f} GB | "
            f"{r['peak_gb']:.2f} GB | {r['peak_gb'] / (weights / 1e9):.2f}x |"
        )


if __name__ == "__main__":
    main()
