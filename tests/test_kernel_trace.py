"""`litekiln.peers.kernel_trace`: a replayed graph's kernel records (torch.profiler's Chrome
trace of CUPTI's activity) cut into replays, each launch's median duration."""

from __future__ import annotations

import pytest

from litekiln.peers import kernel_trace


def _trace(durations_per_replay: list[list[float]]) -> dict:
    events, t = [], 100.0
    for replay in durations_per_replay:
        events.append({"cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": t, "dur": 2.0})
        t += 2.5
        for d in replay:
            events.append({"cat": "kernel", "name": "k", "ts": t, "dur": d})
            t += d + 0.1
        events.append({"cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "ts": t, "dur": 5})
        t += 10.0
    # out of order in the file, as a trace may list them
    return {"traceEvents": events[::-1]}


def test_kernel_records_are_the_kernels_by_start() -> None:
    recs = kernel_trace.kernel_records(_trace([[1.0, 2.0], [3.0, 4.0]]))
    assert [d for _, d in recs] == [1.0, 2.0, 3.0, 4.0]
    assert [s for s, _ in recs] == sorted(s for s, _ in recs)


def test_per_launch_medians_over_replays() -> None:
    recs = kernel_trace.kernel_records(_trace([[1.0, 5.0, 2.0], [3.0, 6.0, 2.0], [2.0, 9.0, 2.0]]))
    got = kernel_trace.per_launch(recs, 3)
    assert got == pytest.approx([2e-6, 6e-6, 2e-6])


def test_per_launch_says_why_records_do_not_line_up() -> None:
    recs = kernel_trace.kernel_records(_trace([[1.0, 5.0, 2.0], [3.0, 6.0]]))
    assert kernel_trace.per_launch(recs, 3) == "5 kernel records for replays of 3 launches"
    assert kernel_trace.per_launch([], 3) == "0 kernel records for replays of 3 launches"
    assert kernel_trace.per_launch(recs, 0) == "no launches"


def test_trace_graph_without_a_cuda_torch_says_why() -> None:
    """On a machine without torch or without CUDA (CI), nothing is replayed or timed."""
    calls = []
    got = kernel_trace.trace_graph(lambda: calls.append(1), 2)
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("torch has CUDA here: trace_graph traces for real")
    except ImportError:
        pass
    assert isinstance(got, str) and ("torch" in got)
    assert calls == []
