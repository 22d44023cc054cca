#!/usr/bin/env python3
"""When a command's resident memory peaks: runs it, samples its resident set every 0.3 s and
prints each line it writes with the seconds since the start and the resident GB at that moment,
plus a line at every new high of at least 0.1 GB over the last one. Shows which step of an
export (a tensor's conversion, the check) sets its peak.

    .venv/bin/python scripts/diagnostics/rss_timeline.py -- specx export --target M.gguf \\
        --precision int4 -o /tmp/out --force
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path


def resident_gb(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None  # the process has ended
    kb = next(
        (int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0
    )
    return kb / 1e6


def main() -> None:
    command = sys.argv[1:]
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        sys.exit(__doc__)
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = [0.0, 0.0]  # the highest, the last reported

    def sample() -> None:
        while proc.poll() is None:
            gb = resident_gb(proc.pid)
            if gb is not None and gb > peak[0]:
                peak[0] = gb
                if gb >= peak[1] + 0.1:
                    peak[1] = gb
                    print(
                        f"{time.perf_counter() - t0:7.1f} s  {gb:5.2f} GB  (new high)", flush=True
                    )
            time.sleep(0.3)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    assert proc.stdout is not None
    for line in proc.stdout:
        gb = resident_gb(proc.pid) or 0.0
        print(f"{time.perf_counter() - t0:7.1f} s  {gb:5.2f} GB  | {line.rstrip()}", flush=True)
    proc.wait()
    sampler.join()
    print(f"exit {proc.returncode}; highest sampled: {peak[0]:.2f} GB")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
