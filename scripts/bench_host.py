"""Host time of a warm inference, with the device taken out: what Python and numpy cost per
``Interpreter.run`` / ``set_tensor`` + ``invoke`` + ``get_tensor``.

Usage::

    .venv/bin/python scripts/bench_host.py [--reps 2000] [--profile] [MODEL ...]

(default models: tests/data/smoke.tflite, models/zoo/face_detection_short_range.tflite,
models/zoo/mobilenet_v1.tflite, models/corpus/tv_mobilenet_v3_small.tflite where present).

Two paths per model, compiled here on PoCL (the CPU OpenCL):

* ``cuda``: the CUDA graph path (`litekiln.runtime.cuda.CudaGraphExecutor`) driven through
  the fake CUDA driver of tests/test_cuda_graph.py (libcuda's entry points over host memory,
  called through the same ctypes conversions), whose ``cuGraphLaunch`` replays nothing: the
  kernels do nothing and take no time, so everything measured is host work (the input copy
  into the pinned staging block, the launch call, the output arrays handed back).
* ``opencl``: PoCL's OpenCL path. Its kernels run on this CPU; the script waits for them
  right after each partition's launches (``queue.finish``) and leaves that wait out, so what
  remains is the host's: staging, enqueueing, the output read (a memcpy on PoCL), the rest.

Each figure is the median over ``--reps`` warm inferences, in microseconds, split as
`litekiln.bench._host_breakdown` splits it (`Session.step_times`): ``inputs`` (the GPU
partitions' inputs staged), ``launch``, ``outputs`` (waited for, read back), ``cpu`` (ops on
numpy) and ``other`` (everything outside the session's steps: the Interpreter's checks, the
arrays handed back); ``host`` is their sum. A benchmark: never run by pytest.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_cuda_graph import FakeDriver, _ptx_like_nvidia  # noqa: E402  (the tests' fake libcuda)

from litekiln.interpreter import Interpreter  # noqa: E402
from litekiln.runtime import cuda  # noqa: E402
from litekiln.runtime import session as session_mod  # noqa: E402

MODELS = [
    ROOT / "tests/data/smoke.tflite",
    ROOT / "models/zoo/face_detection_short_range.tflite",
    ROOT / "models/zoo/mobilenet_v1.tflite",
    ROOT / "models/corpus/tv_mobilenet_v3_small.tflite",
]
_KINDS = {"gpu_inputs": "inputs", "gpu_launch": "launch", "gpu_outputs": "outputs", "cpu": "cpu"}


class NullGraphDriver(FakeDriver):
    """The tests' fake libcuda with a graph replay that does nothing (no kernels, no copies):
    on the GPU the replay is the device's work, which this script leaves out."""

    def cuGraphLaunch(self, exe: int, stream: int) -> None:  # noqa: N802 - libcuda's name
        self.graph_launches += 1


def _fake_cuda(mp: pytest.MonkeyPatch) -> NullGraphDriver:
    """Route the CUDA graph path to the null driver, with PoCL dressed up as NVIDIA's OpenCL
    (as test_cuda_graph's first-start tests do)."""
    drv = NullGraphDriver({})
    mp.setattr(cuda, "_DRIVER", cuda._Driver(lib=drv.lib))
    mp.setattr(cuda, "_DEVICES", {})
    _ptx_like_nvidia(mp)
    mp.setattr(cuda, "cuda_device_for", lambda dev, profile: cuda._device(0))
    mp.setattr(session_mod, "_compare_paths", lambda a, b: "")  # (nothing is computed)
    return drv


def _exclude_kernels(interp: Interpreter) -> list[float]:
    """Make each OpenCL partition wait for its kernels inside ``run`` and record that wait,
    to be taken out of the launch step. Returns the list the waits are appended to."""
    waits: list[float] = []
    for ex in interp._backend.executors:  # noqa: SLF001
        launch = ex.run

        def run(*, wait: bool = False, _launch: Any = launch, _ex: Any = ex) -> None:
            _launch(wait=False)
            t0 = time.perf_counter()
            _ex.finish()
            waits.append(time.perf_counter() - t0)

        ex.run = run
    return waits


def _measure(
    interp: Interpreter, step: Callable[[], Any], reps: int, waits: list[float] | None
) -> dict[str, float]:
    """Median microseconds per part of ``step`` over ``reps`` runs (after a warm-up)."""
    sess = interp._backend  # noqa: SLF001
    for _ in range(max(20, reps // 10)):
        step()
    per: dict[str, list[float]] = {k: [] for k in (*_KINDS.values(), "other", "host")}
    for _ in range(reps):
        sess.step_times = []
        if waits is not None:
            waits.clear()
        t0 = time.perf_counter()
        step()
        total = time.perf_counter() - t0
        sums = dict.fromkeys(_KINDS.values(), 0.0)
        for kind, _, t in sess.step_times:
            sums[_KINDS[kind]] += t
        if waits is not None:
            sums["launch"] -= sum(waits)
            total -= sum(waits)
        for k, v in sums.items():
            per[k].append(v)
        per["other"].append(total - sum(sums.values()))
        per["host"].append(total)
    sess.step_times = None
    return {k: statistics.median(v) * 1e6 for k, v in per.items()}


def _steps(interp: Interpreter, x: list[np.ndarray]) -> dict[str, Callable[[], Any]]:
    ins = [d["index"] for d in interp.get_input_details()]
    outs = [d["index"] for d in interp.get_output_details()]

    def invoke() -> list[np.ndarray]:
        for t, v in zip(ins, x, strict=True):
            interp.set_tensor(t, v)
        interp.invoke()
        return [interp.get_tensor(t) for t in outs]

    return {"run": lambda: interp.run(x), "invoke": invoke}


def _bench(model: Path, path: str, reps: int, profile: bool) -> list[tuple[str, dict[str, float]]]:
    os.environ["LITEKILN_CUDA_GRAPH"] = "on" if path == "cuda" else "off"
    interp = Interpreter(model_path=str(model))
    interp.allocate_tensors()
    sess = interp._backend  # noqa: SLF001
    sess.wait_for_graph()
    kinds = sorted({type(ex).__name__ for ex in sess.executors})
    want = "CudaGraphExecutor" if path == "cuda" else "PartitionExecutor"
    if kinds != [want]:
        raise SystemExit(f"{model.name}: {path} path runs {kinds}, not {want}")
    waits = _exclude_kernels(interp) if path == "opencl" else None
    x = interp.random_inputs(0)
    rows = []
    for name, step in _steps(interp, x).items():
        rows.append((name, _measure(interp, step, reps, waits)))
        if profile:
            prof = cProfile.Profile()
            prof.runcall(lambda s=step: [s() for _ in range(reps)])
            print(f"--- {model.name} {path} {name}: cProfile over {reps} inferences")
            pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="*", type=Path, help="tflite files (default: a few zoo models)")
    p.add_argument("--reps", type=int, default=2000, help="timed inferences per figure")
    p.add_argument("--paths", default="cuda,opencl", help="comma-separated: cuda, opencl")
    p.add_argument("--profile", action="store_true", help="also print a cProfile of each")
    a = p.parse_args()
    models = a.models or [m for m in MODELS if m.exists()]
    mp = pytest.MonkeyPatch()
    _fake_cuda(mp)
    cols = ["inputs", "launch", "outputs", "cpu", "other", "host"]
    print(f"{'model':34} {'path':6} {'call':6} " + " ".join(f"{c:>8}" for c in cols) + "  (us)")
    try:
        for model in models:
            for path in a.paths.split(","):
                for call, r in _bench(model, path, a.reps, a.profile):
                    figures = " ".join(f"{r[c]:8.1f}" for c in cols)
                    print(f"{model.stem[:34]:34} {path:6} {call:6} {figures}", flush=True)
    finally:
        mp.undo()
    return 0


if __name__ == "__main__":
    sys.exit(main())
