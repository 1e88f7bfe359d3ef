"""Measure what the partitioner's cost model needs (litekiln/compiler/partition.py, "Fragment
costs"): the cost of one CPU/GPU round trip (a GPU partition between CPU ops: its inputs
written, its kernels launched, its outputs read back), the cost of one more kernel in it, and
what the numpy reference (the CPU fallback) takes per op.

Usage::

    .venv/bin/python scripts/bench_round_trip.py [--device P:D] [--out results/round_trip/X.json]

Each figure is the median of many runs, measured in this process on the chosen OpenCL device
(default: litekiln's pick). Printed as a table and written as JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tflite_builder import ModelBuilder  # noqa: E402  (the tests' model builder)

import litekiln  # noqa: E402
from litekiln.model import load_model  # noqa: E402
from litekiln.peers.timing import time_runs  # noqa: E402
from litekiln.reference import run_graph  # noqa: E402


def _chain(shape: list[int], n: int) -> bytes:
    """``n`` ADDs of a constant in a row: one GPU partition (TVM fuses the chain into one
    kernel, so the difference between n = 8 and n = 1 is the per-op cost inside a kernel,
    and the 1-op figure is the round trip itself)."""
    b = ModelBuilder()
    x = b.input("x", shape)
    y = x
    for i in range(n):
        y = b.op("ADD", [y, np.full(shape, 0.001 * (i + 1), np.float32)], out_shape=shape)
    b.output(y)
    return b.build()


def _conv(shape: list[int], cout: int) -> bytes:
    b = ModelBuilder()
    x = b.input("x", shape)
    w = np.random.default_rng(0).uniform(-0.1, 0.1, [cout, 3, 3, shape[3]]).astype(np.float32)
    y = b.op(
        "CONV_2D",
        [x, w, np.zeros(cout, np.float32)],
        out_shape=[shape[0], shape[1], shape[2], cout],
        options={"padding": "SAME", "stride_h": 1, "stride_w": 1},
    )
    b.output(y)
    return b.build()


def _median_s(fn: Any, runs: int) -> float:
    return time_runs(fn, runs, max(3, runs // 10))["median_ms"] / 1e3


def _gpu_latency(model: bytes, x: np.ndarray, device: str | None, runs: int) -> float:
    with tempfile.TemporaryDirectory() as cache:
        # (cpu_first off: every timed inference is the device's)
        it = litekiln.Interpreter(
            model_content=model, device=device, cache_dir=cache, cpu_first=False
        )
        it.allocate_tensors()
        index = it.get_input_details()[0]["index"]

        def once() -> None:
            it.set_tensor(index, x)
            it.invoke()
            it.get_tensor(it.get_output_details()[0]["index"])

        return _median_s(once, runs)


def _cpu_latency(model: bytes, x: np.ndarray, runs: int) -> float:
    g = load_model(model).main
    return _median_s(lambda: run_graph(g, {g.inputs[0]: x}), runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None, help="OpenCL device, P:D (default: litekiln's)")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    a = ap.parse_args()

    rows: dict[str, float] = {}
    small, mid = [1, 8, 8, 8], [1, 56, 56, 24]
    for name, shape in (("small", small), ("mid", mid)):
        x = np.random.default_rng(1).uniform(-1, 1, shape).astype(np.float32)
        one = _gpu_latency(_chain(shape, 1), x, a.device, a.runs)
        eight = _gpu_latency(_chain(shape, 8), x, a.device, a.runs)
        rows[f"gpu_1op_{name}_s"] = one
        rows[f"gpu_per_extra_op_{name}_s"] = (eight - one) / 7
        rows[f"gpu_round_trip_{name}_s"] = one - (eight - one) / 7
        rows[f"cpu_add_{name}_s"] = _cpu_latency(_chain(shape, 1), x, a.runs)
        rows[f"bytes_{name}"] = float(np.prod(shape) * 4 * 3)
    xc = np.random.default_rng(2).uniform(-1, 1, [1, 28, 28, 32]).astype(np.float32)
    conv_s = _cpu_latency(_conv([1, 28, 28, 32], 32), xc, max(20, a.runs // 10))
    rows["cpu_conv_s"] = conv_s
    rows["cpu_conv_flop_rate"] = 2 * 28 * 28 * 32 * 32 * 9 / conv_s
    # numpy's elementwise throughput and per-op overhead, from the two ADD sizes
    slope = (rows["cpu_add_mid_s"] - rows["cpu_add_small_s"]) / (
        rows["bytes_mid"] - rows["bytes_small"]
    )
    rows["cpu_byte_rate"] = 1 / slope if slope > 0 else float("inf")
    rows["cpu_op_overhead_s"] = rows["cpu_add_small_s"] - rows["bytes_small"] * max(slope, 0)

    from litekiln.runtime.device import select_device

    handle = select_device(a.device)
    device = f"{handle.device.name.strip()} ({handle.device.platform.name.strip()})"
    print(f"device: {device}; host: {platform.node()}, {platform.processor() or 'cpu'}")
    for k, v in rows.items():
        unit = "us" if k.endswith("_s") else ""
        shown = v * 1e6 if unit else v
        print(f"  {k:28s} {shown:14.1f} {unit}")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(
            json.dumps(
                {
                    "command": " ".join(sys.argv),
                    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "device": device,
                    "runs": a.runs,
                    "figures": rows,
                },
                indent=1,
            )
            + "\n"
        )
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
