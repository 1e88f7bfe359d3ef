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


def test_trace_graph_replays_under_the_profiler(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a CUDA torch (a stand-in here: its profiler writes the kernels the replays ran),
    the graph is replayed once untraced, then ``reps`` times traced, and each launch gets the
    median of its durations."""
    import json
    import sys
    import types

    replays: list[bool] = []
    tracing = [False]

    class Profile:
        def __init__(self, activities: list[object]) -> None:
            pass

        def __enter__(self) -> Profile:
            tracing[0] = True
            return self

        def __exit__(self, *exc: object) -> None:
            tracing[0] = False

        def export_chrome_trace(self, path: str) -> None:
            n = sum(replays)  # traced replays: two kernels each, 3 us and 1 us + replay index
            events = [
                {"cat": "kernel", "ts": 100.0 * r + 10 * k, "dur": [3.0, 1.0 + r][k]}
                for r in range(n)
                for k in range(2)
            ]
            with open(path, "w") as f:
                json.dump({"traceEvents": events}, f)

    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(is_available=lambda: True, synchronize=lambda: None)
    profiler = types.ModuleType("torch.profiler")
    profiler.ProfilerActivity = types.SimpleNamespace(CUDA="cuda")
    profiler.profile = Profile
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.profiler", profiler)

    got = kernel_trace.trace_graph(lambda: replays.append(tracing[0]), 2, reps=5)
    assert replays == [False] + [True] * 5
    assert got == pytest.approx([3e-6, 3e-6])  # median of 1..5 + 1 us is 3 us
    # records that do not make whole replays of the launches (10 kernels, 3 launches a replay)
    assert kernel_trace.trace_graph(lambda: None, 3, reps=5) == (
        "10 kernel records for replays of 3 launches"
    )
