"""Compare two `specx bench` runs configuration by configuration (e.g. before and after a change).

    python scripts/compare_bench.py BEFORE/results.json AFTER/results.json

Prints, per workload and configuration, tokens/s, speedup over the target alone (within each
run) and acceptance of both runs, then a summary: the median and geometric mean of after/before
tokens/s over all configurations, their range, and the spread between repeats within the first
run (what noise alone moves). Acceptance of a fixed K is deterministic for greedy decoding: a
difference there is a change of behaviour, not noise.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path


def main() -> int:
    before, after = (json.loads(Path(p).read_text()) for p in sys.argv[1:3])
    print(
        f"{'workload':<10}{'config':<15}{'tok/s':>8}{'->':>3}{'':>6}{'speedup':>9}{'->':>3}{'':>5}"
        f"{'accept':>8}{'->':>3}{'':>5}"
    )
    ratios, spreads, changed = [], [], []
    for workload, rows in before["greedy"].items():
        for config, b in rows.items():
            a = after["greedy"].get(workload, {}).get(config)
            if a is None:
                continue
            ratios.append(a["tokens_per_s"] / b["tokens_per_s"])
            spreads.append((b["tokens_per_s_max"] - b["tokens_per_s_min"]) / b["tokens_per_s"])
            if "K=auto" not in config and abs(a["acceptance_rate"] - b["acceptance_rate"]) > 1e-9:
                changed.append(f"{workload} {config}")
            print(
                f"{workload:<10}{config:<15}{b['tokens_per_s']:>8.1f}{'->':>3}"
                f"{a['tokens_per_s']:>6.1f}{b['speedup']:>9.2f}{'->':>3}{a['speedup']:>5.2f}"
                f"{b['acceptance_rate']:>8.2f}{'->':>3}{a['acceptance_rate']:>5.2f}"
            )
    geomean = math.exp(statistics.fmean(math.log(r) for r in ratios))
    print(
        f"\nafter / before tokens/s over {len(ratios)} configurations: median "
        f"{statistics.median(ratios):.3f}, geometric mean {geomean:.3f}, range "
        f"{min(ratios):.2f}-{max(ratios):.2f}"
    )
    print(
        f"spread between repeats within the first run (max - min) / median: median "
        f"{statistics.median(spreads):.2f}, max {max(spreads):.2f}"
    )
    print(
        "greedy acceptance of every fixed K: "
        + ("identical" if not changed else "CHANGED for " + ", ".join(changed))
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
