"""Timing helpers for the bench's scripts: medians of repeated calls, after a warm-up."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def median_ms(fn: Callable[[], Any], repeats: int) -> float:
    """The median wall time of `repeats` calls of fn, in ms, after one call to warm up."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)
