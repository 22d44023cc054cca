"""Issue 16's three figures from `specx bench --concurrency` results (concurrency.json).

    python scripts/diagnostics/concurrency_goals.py RUN/concurrency.json [MORE.json ...]

Per file: -k auto's aggregate tokens/s at 4 requests over -k auto alone (goal >= 2.5), its median
latency at 4 over alone (goal <= 1.6), and at every concurrency (alone included) -k auto's
tokens/s over the better of speculation off and the best fixed K at that concurrency (goal >= 0.95
at every one: here alone too), from the cells' tokens/s, and, where the bench wrote them, the
same ratios paired within each repeat (medians over repeats) and the figures from each cell's
median run (the bench's tokens/s before it summarized whole workloads: apps/bench/concurrency.py
`_workload_rate`; when: docs/bench/measurements.md). `--every-mode`: that last
ratio for every mode against the fastest of the others (where modes run level, how far below 1
noise alone puts one). Reads the numbers the bench wrote; measures nothing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

AGGREGATE_AT_4 = 2.5
LATENCY_AT_4 = 1.6
AUTO_SHARE = 0.95


def goals(results: dict[str, Any], rate: str = "tokens_per_s") -> dict[str, Any]:
    """The three figures of one run, and whether each goal holds; `rate`: the cells' tokens/s
    to read (tokens_per_s_median_run: as the bench reckoned them before it summarized whole
    workloads, docs/bench/measurements.md)."""
    cells: dict[tuple[str, str], dict[str, Any]] = {
        (r["mode"], str(r["concurrency"])): r for r in results["rows"]
    }
    auto = next(mode for mode, _ in cells if mode.endswith("K=auto"))
    levels = sorted({c for _, c in cells}, key=lambda c: -1 if c == "alone" else int(c))
    modes = list(dict.fromkeys(mode for mode, _ in cells))
    # every mode against the fastest of the others: the bar goal 3 sets -k auto, given to each
    # mode alike, shows how far below 1 a mode level with the best falls by noise alone (the
    # best of several noisy cells is biased upward)
    every = {
        mode: {
            c: cells[(mode, c)][rate]
            / max(cells[(other, c)][rate] for other in modes if other != mode)
            for c in levels
        }
        for mode in modes
    }
    shares = every[auto]
    at_4 = cells[(auto, "4")]
    aggregate = at_4[rate] / cells[(auto, "alone")][rate]
    latency = at_4["latency_x_alone"]
    paired = {
        c: cells[(auto, c)]["x_better_paired"]
        for c in levels
        if "x_better_paired" in cells[(auto, c)]
    }
    return {
        "paired": paired,
        "date": results.get("machine", {}).get("date", "?"),
        "aggregate_at_4": aggregate,
        "latency_at_4": latency,
        "auto_share": shares,
        "every_mode_share": every,
        "met": (
            aggregate >= AGGREGATE_AT_4,
            latency <= LATENCY_AT_4,
            all(s >= AUTO_SHARE for s in shares.values()),
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument(
        "--every-mode",
        action="store_true",
        help="also every mode's tokens/s over the fastest other mode's (goal 3's bar for each)",
    )
    args = parser.parse_args()
    for path in args.runs:
        results = json.loads(path.read_text())
        g = goals(results)
        shares = " / ".join(f"{s:.3f}" for s in g["auto_share"].values())
        met = ", ".join("met" if m else "MISSED" for m in g["met"])
        print(
            f"{path}: {g['date']}: -k auto at 4 {g['aggregate_at_4']:.2f}x alone, latency at 4 "
            f"{g['latency_at_4']:.2f}x, -k auto / better ({' / '.join(g['auto_share'])}) "
            f"{shares}; goals: {met}"
            + (
                "; paired within repeats: " + " / ".join(f"{x:.3f}" for x in g["paired"].values())
                if g["paired"]
                else ""
            )
        )
        if "tokens_per_s_median_run" in results["rows"][0]:
            old = goals(results, "tokens_per_s_median_run")
            print(
                f"   from each cell's median run instead (before 2026-12-02 16:38): -k auto at 4 "
                f"{old['aggregate_at_4']:.2f}x alone, -k auto / better "
                + " / ".join(f"{s:.3f}" for s in old["auto_share"].values())
                + "; goals: "
                + ", ".join("met" if m else "MISSED" for m in old["met"])
            )
        if args.every_mode:
            for mode, by_c in g["every_mode_share"].items():
                print(
                    f"   {mode:20s} x the fastest other: "
                    + " / ".join(f"{x:.2f}" for x in by_c.values())
                )


if __name__ == "__main__":
    main()
