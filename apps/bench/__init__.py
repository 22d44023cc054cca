"""`specx bench`: where the speedup comes from, on one machine, in one process."""

from specx.apps.bench.report import format_report, plot
from specx.apps.bench.runner import (
    BenchConfig,
    add_predictions,
    load_workloads,
    pass_time,
    pass_times,
    run_bench,
    stderr_progress,
)

__all__ = [
    "BenchConfig",
    "add_predictions",
    "format_report",
    "load_workloads",
    "pass_time",
    "pass_times",
    "plot",
    "run_bench",
    "stderr_progress",
]
