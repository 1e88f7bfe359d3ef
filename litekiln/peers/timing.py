"""The one wall-clock timer of `litekiln bench` and its peers (standard library only)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def time_runs(fn: Callable[[], object], runs: int, warmup: int) -> dict[str, float]:
    """``fn`` called ``warmup`` times untimed, then ``runs`` times, each timed on its own.

    Returns:
        ``median_ms``, ``min_ms`` and ``p90_ms`` of the timed calls (host wall time).
    """
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return {
        "median_ms": statistics.median(ts) * 1e3,
        "min_ms": ts[0] * 1e3,
        "p90_ms": ts[min(len(ts) - 1, int(0.9 * len(ts)))] * 1e3,
    }
