"""Each kernel's own device time inside a replayed CUDA graph, traced by CUPTI through
``torch.profiler`` where torch with CUDA imports.

CUDA events around a launch (`litekiln bench --profile`'s per-launch times) count the
launch's own overhead: 6-8 us for a tiny kernel on NVIDIA's OpenCL, more than most kernels of a
mobile network take in the graph. CUPTI records every kernel of the process's primary
context, which litekiln's CUDA graph path shares with torch, graph nodes included, with its
start and end on the device: `trace_graph` replays a graph under the profiler and returns each
launch's median duration there. Never a failure: without torch, without CUDA, or with a trace
that does not line up with the launches, it returns why.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

#: Replays traced by default (after one untraced).
REPLAYS = 30


def kernel_records(trace: dict[str, Any]) -> list[tuple[float, float]]:
    """(start us, duration us) of the kernel records of a Chrome trace (``torch.profiler``'s
    ``export_chrome_trace``), by start."""
    return sorted(
        (float(e["ts"]), float(e["dur"]))
        for e in trace.get("traceEvents", [])
        if e.get("cat") == "kernel" and "dur" in e and "ts" in e
    )


def per_launch(records: Sequence[tuple[float, float]], launches: int) -> list[float] | str:
    """Median duration, in seconds, of each launch position over the traced replays: the
    records, in start order, cut into replays of ``launches`` kernels each (kernels of
    concurrent branches keep their graph's order only where they start in it; the medians
    are then of the launches started k-th). Why not, where the records are not a whole
    number of replays."""
    if launches <= 0:
        return "no launches"
    if not records or len(records) % launches:
        return f"{len(records)} kernel records for replays of {launches} launches"
    replays = len(records) // launches
    return [
        statistics.median(records[r * launches + i][1] for r in range(replays)) * 1e-6
        for i in range(launches)
    ]


def chrome_trace(replay: Callable[[], None], reps: int = REPLAYS) -> dict[str, Any] | str:
    """The CUDA activity of ``reps`` calls of ``replay`` (after one untraced) as
    ``torch.profiler``'s Chrome trace (kernels, copies), or why it cannot be traced here."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return "torch is not installed (the kernels' own times need its profiler, CUPTI)"
    try:
        if not torch.cuda.is_available():
            return "torch sees no CUDA device"
        torch.cuda.synchronize()  # (torch joins the primary context the graph runs in)
        replay()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(max(1, reps)):
                replay()
            torch.cuda.synchronize()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            with open(path) as f:
                trace: dict[str, Any] = json.load(f)
        return trace
    except Exception as exc:  # noqa: BLE001 - a profiler that fails: say why, time nothing
        return f"torch.profiler failed: {type(exc).__name__}: {exc}"[:300]


def trace_graph(
    replay: Callable[[], None], launches: int, reps: int = REPLAYS
) -> list[float] | str:
    """Each launch's median device time inside the graph ``replay`` launches and waits for,
    in seconds (launch order as the device started them), or why it cannot be traced here."""
    trace = chrome_trace(replay, reps)
    if isinstance(trace, str):
        return trace
    return per_launch(kernel_records(trace), launches)
