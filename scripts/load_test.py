"""Load on `specx serve`, localhost only, bounded in count and time.

    .venv/bin/python scripts/load_test.py ARTIFACT [--concurrency 1,4,16] [--requests 24]
        [--max-tokens 32] [--soak 500] [--max-concurrency 2] [--max-queue 64] [-k auto]
        [--batch 4]

Starts `specx serve` on a free port of 127.0.0.1, then for each client concurrency sends
`--requests` streamed chat completions (the bench's chat prompts, greedy) from that many client
threads and prints: p50/p95 latency, p50/p95 time to the first token, aggregate tokens/s, errors
(and 429s). Then it sends `--soak` short requests and prints the server's resident memory before
and after them. Every request has a timeout; the server is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from specx.apps.bench import load_workloads


def rss_mb(pid: int) -> float:
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0.0


def one(base: str, prompt: str, max_tokens: int, k: str) -> dict[str, float | int | str]:
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "k": k if k == "auto" else int(k),
    }
    started = time.perf_counter()
    first = None
    tokens = 0
    try:
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=300) as r:
            if r.status_code != 200:
                r.read()
                return {"error": r.status_code}
            for line in r.iter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                event = json.loads(line[5:])
                if first is None and event.get("choices"):
                    first = time.perf_counter() - started
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
    except httpx.HTTPError as e:
        return {"error": type(e).__name__}
    return {"latency": time.perf_counter() - started, "ttft": first or 0.0, "tokens": tokens}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--soak", type=int, default=500)
    parser.add_argument("--soak-tokens", type=int, default=8)
    parser.add_argument("--max-concurrency", type=int, default=2)
    parser.add_argument("--max-queue", type=int, default=64)
    parser.add_argument("-k", default="auto")
    parser.add_argument("--batch", type=int, default=0, help="serve --batch (0: unbatched)")
    args = parser.parse_args()
    prompts = load_workloads()["chat"]["prompts"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specx.apps.cli.main",
            "serve",
            str(args.artifact),
            "--port",
            str(port),
            "--max-concurrency",
            str(args.max_concurrency),
            "--max-queue",
            str(args.max_queue),
            *(["--batch", str(args.batch)] if args.batch else []),
        ],
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        else:
            raise SystemExit("the server did not start")
        one(base, prompts[0], 4, args.k)  # warm-up
        print(
            f"specx serve {args.artifact} (max-concurrency {args.max_concurrency}, max-queue "
            f"{args.max_queue}, batch {args.batch or 'off'}, -k {args.k}), {args.requests} "
            "streamed chat requests of "
            f"{args.max_tokens} tokens per row, {os.cpu_count()} cores, "
            f"{time.strftime('%Y-%m-%d')}"
        )
        print(
            f"{'clients':>8}{'p50 s':>8}{'p95 s':>8}{'ttft p50':>10}{'ttft p95':>10}"
            f"{'tok/s':>8}{'errors':>8}"
        )
        for clients in (int(c) for c in args.concurrency.split(",")):
            started = time.perf_counter()
            with ThreadPoolExecutor(clients) as pool:
                results = list(
                    pool.map(
                        lambda i: one(base, prompts[i % len(prompts)], args.max_tokens, args.k),
                        range(args.requests),
                    )
                )
            wall = time.perf_counter() - started
            ok = [r for r in results if "error" not in r]
            errors = [str(r["error"]) for r in results if "error" in r]
            latency = [float(r["latency"]) for r in ok]
            ttft = [float(r["ttft"]) for r in ok]
            tokens = sum(int(r["tokens"]) for r in ok)
            print(
                f"{clients:>8}{percentile(latency, 0.5):>8.2f}{percentile(latency, 0.95):>8.2f}"
                f"{percentile(ttft, 0.5):>10.2f}{percentile(ttft, 0.95):>10.2f}"
                f"{tokens / wall:>8.1f}{len(errors):>8}"
                + (f"  ({', '.join(sorted(set(errors)))})" if errors else "")
            )
        before = rss_mb(server.pid)
        started = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:
            soak = list(
                pool.map(
                    lambda i: one(base, prompts[i % len(prompts)], args.soak_tokens, args.k),
                    range(args.soak),
                )
            )
        after = rss_mb(server.pid)
        failed = sum(1 for r in soak if "error" in r)
        print(
            f"resident memory of the server: {before:.0f} MB before {args.soak} requests, "
            f"{after:.0f} MB after ({after - before:+.0f} MB; {failed} errors; "
            f"{time.perf_counter() - started:.0f} s)"
        )
        durations = [float(r["latency"]) for r in soak if "error" not in r]
        print(f"soak latency p50 {statistics.median(durations):.2f} s" if durations else "")
    finally:
        server.terminate()
        server.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
