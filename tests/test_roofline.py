"""The roofline of `litekiln bench --profile` (litekiln/runtime/roofline.py, litekiln/bench.py):
each launch's bytes and FLOPs against hand counts, the floor's arithmetic on made-up numbers,
and the bench's record on PoCL. Timings are never asserted (PoCL is no speed target: a kernel
may even beat its floor there, its small tensors in the CPU's caches)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tflite_builder import ModelBuilder

from litekiln.artifact.program import (
    BufferArg,
    GpuProgram,
    Launch,
    ProgramFormatError,
    StorageSpec,
    TensorSpec,
)
from litekiln.runtime.roofline import LaunchWork, kernel_floor, model_floor

F32 = 4  # bytes


# ------------------------------------------------------------------------------ arithmetic


def test_a_kernel_floor_is_its_slower_roof() -> None:
    # 1 MB at 100 GB/s: 10 us; 1 MFLOP at 1000 GFLOP/s: 1 us -> memory-bound, 10 us
    assert kernel_floor(10**6, 10**6, 100.0, 1000.0) == pytest.approx(10e-6)
    # 1 GFLOP at 1000 GFLOP/s: 1 ms, above the 10 us of its bytes -> compute-bound
    assert kernel_floor(10**6, 10**9, 100.0, 1000.0) == pytest.approx(1e-3)
    assert kernel_floor(0, 0, 100.0, 1000.0) == 0.0
    with pytest.raises(ValueError, match="positive"):
        kernel_floor(1, 1, 0.0, 1000.0)


def test_a_model_floor_adds_kernels_and_launches() -> None:
    work = [
        LaunchWork(2 * 10**6, 0, 1e-6),  # 20 us of memory
        LaunchWork(10**3, 5 * 10**9, 1e-6),  # 5 ms of compute
        LaunchWork(0, 0, 1e-6),  # an empty launch costs its node
    ]
    f = model_floor(work, 100.0, 1000.0)
    assert f["kernels_s"] == pytest.approx(20e-6 + 5e-3)
    assert f["launches_s"] == pytest.approx(3e-6)
    assert f["floor_s"] == pytest.approx(20e-6 + 5e-3 + 3e-6)
    assert model_floor([], 100.0, 1000.0) == {"kernels_s": 0.0, "launches_s": 0.0, "floor_s": 0.0}


# ------------------------------------------------------------------------------ the plan


def test_launch_bytes_count_each_distinct_tensor_once() -> None:
    prog = GpuProgram(
        source="",
        build_options="",
        kernels=["k"],
        storages=[StorageSpec(0, 400), StorageSpec(1, 64)],
        tensors=[
            TensorSpec(0, 0, 0, (10, 10), "float32"),
            TensorSpec(1, 1, 0, (8, 4), "float16"),
        ],
        constants={},
        inputs=[],
        outputs=[],
        # an in-place update: tensor 0 passed twice, read and written, counted once
        launches=[Launch("k", (BufferArg(0), BufferArg(1), BufferArg(0)), (64,), (64,), flops=7)],
    )
    assert prog.launch_bytes(prog.launches[0]) == 400 + 64
    again = GpuProgram.from_json(prog.to_json())
    assert again.launches[0].flops == 7
    old = json.loads(prog.to_json())
    old["format_version"] = 2  # written before launches had FLOPs: recompiled, not misread
    with pytest.raises(ProgramFormatError, match="format version 2"):
        GpuProgram.from_dict(old)


def _fully_connected() -> bytes:
    b = ModelBuilder()
    x = b.input("x", [1, 64])
    w = b.const("w", np.ones([32, 64], np.float32))
    bias = b.const("bias", np.zeros([32], np.float32))
    y = b.op(
        "FULLY_CONNECTED",
        [x, w, bias],
        out_shape=[1, 32],
        options={"fused_activation_function": "RELU"},
    )
    b.output(y)
    return b.build()


def _conv() -> bytes:
    b = ModelBuilder()
    x = b.input("x", [1, 8, 8, 3])
    w = b.const("w", np.ones([4, 3, 3, 3], np.float32))
    bias = b.const("bias", np.zeros([4], np.float32))
    y = b.op(
        "CONV_2D",
        [x, w, bias],
        out_shape=[1, 8, 8, 4],
        options={"padding": "SAME", "stride_w": 1, "stride_h": 1},
    )
    b.output(y)
    return b.build()


def _program(data: bytes, schedules: str) -> GpuProgram:
    pytest.importorskip("tvm")
    from litekiln.artifact.compiled import CompileOptions
    from litekiln.compiler.driver import compile_model
    from litekiln.model import load_model

    compiled = compile_model(load_model(data), CompileOptions(schedules=schedules), warn=False)
    (part,) = compiled.partitions
    return part.program


def _option_flops(prog: GpuProgram) -> list[int]:
    """The FLOPs of every option of every variant (each computes what its call computes)."""
    return [sum(la.flops for la in o) for v in prog.variants for o in v.options]


@pytest.mark.parametrize("schedules", ["fast", "fast-cpu", "default"])
def test_fully_connected_bytes_and_flops(schedules: str) -> None:
    """x[1, 64] @ w[64, 32] + bias[32], ReLU: one kernel whatever the schedule."""
    prog = _program(_fully_connected(), schedules)
    (launch,) = prog.launches
    # x, the weights (transposed once at compile time), the bias, the output
    assert prog.launch_bytes(launch) == (64 + 64 * 32 + 32 + 32) * F32
    # a multiply-add per weight, then the bias add and the ReLU per output
    assert launch.flops == 2 * 64 * 32 + 32 + 32
    assert all(f == launch.flops for f in _option_flops(prog))


@pytest.mark.parametrize("schedules", ["fast", "fast-cpu", "default"])
def test_conv_flops_whatever_its_launches(schedules: str) -> None:
    """A 3x3 SAME convolution, 3 -> 4 channels over 8x8, plus bias: the same FLOPs in one
    kernel (GPU schedules) or two (PoCL's: the padding kernel does none of them)."""
    prog = _program(_conv(), schedules)
    flops = 2 * (8 * 8 * 4) * (3 * 3 * 3) + 8 * 8 * 4
    assert sum(la.flops for la in prog.launches) == flops
    assert all(f == flops for f in _option_flops(prog))
    x, w, bias, out = 8 * 8 * 3, 4 * 3 * 3 * 3, 4, 8 * 8 * 4
    if len(prog.launches) == 1:
        assert prog.launch_bytes(prog.launches[0]) == (x + w + bias + out) * F32
    else:  # x padded into a 10x10x3 workspace, read by the convolution
        pad, conv = prog.launches
        padded = 10 * 10 * 3
        assert (pad.flops, conv.flops) == (0, flops)
        assert prog.launch_bytes(pad) == (x + padded) * F32
        assert prog.launch_bytes(conv) == (padded + w + bias + out) * F32


# ------------------------------------------------------------------------------ the bench


def _bench(capsys: pytest.CaptureFixture[str], path: Path, *extra: str) -> dict[str, Any]:
    from litekiln.cli import main

    argv = ["bench", "--profile", "--json", "--runs", "5", *extra, str(path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    return json.loads(out[out.index("{") :])["models"][0]


@pytest.mark.opencl
@pytest.mark.slow
def test_bench_profile_places_the_model_under_its_roofline(
    smoke_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("ai_edge_litert.interpreter")
    rec = _bench(capsys, smoke_path)
    roof, prof = rec["roofline"], rec["profile"]
    assert "error" not in roof, roof
    assert roof["peak_source"] == {"gbps": "measured", "gflops": "measured"}
    assert roof["peak_gbps"] > 0 and roof["peak_gflops"] > 0
    assert set(roof["node_us"]) == {"opencl"} and roof["node_us"]["opencl"] > 0
    launches = prof["launches"]
    assert roof["launches"] == len(launches) == rec["launch_overhead"]["launches"]
    assert all(r["bytes"] > 0 and r["flops"] >= 0 and r["floor_ms"] > 0 for r in launches)
    assert sum(r["flops"] for r in launches) == roof["flops"] > 0
    assert sum(r["bytes"] for r in launches) == roof["bytes"]
    assert all(r["gbps"] is None or r["gbps"] > 0 for r in launches)
    assert roof["floor_ms"] > 0 and roof["latency_ms"] == rec["litekiln_ms"]
    assert roof["floor_ms"] == pytest.approx(
        roof["kernel_floor_ms"] + roof["launch_floor_ms"], rel=1e-3
    )
    assert roof["launch_floor_ms"] == pytest.approx(
        roof["launches"] * roof["node_us"]["opencl"] * 1e-3, rel=1e-3
    )
    assert roof["latency_over_floor"] == pytest.approx(
        roof["latency_ms"] / roof["floor_ms"], rel=1e-3
    )

    # Given peaks are used as given, and said to be.
    rec = _bench(capsys, smoke_path, "--peak-gbps", "1000", "--peak-gflops", "2e4")
    roof = rec["roofline"]
    assert roof["peak_source"] == {"gbps": "given", "gflops": "given"}
    assert (roof["peak_gbps"], roof["peak_gflops"]) == (1000.0, 20000.0)
    floors = sum(max(r["bytes"] / 1e12, r["flops"] / 2e13) for r in rec["profile"]["launches"])
    assert roof["kernel_floor_ms"] == pytest.approx(floors * 1e3, rel=1e-3)
