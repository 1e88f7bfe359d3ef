"""What a tiny model's inference cannot go below on this GPU: the round trip of a bare CUDA
graph from Python, against litekiln, PyTorch's CUDA graph of the same network and LiteRT CPU.

    python scripts/remote_gpu/floor_probe.py --cache-dir C SMOKE.tflite [SMOKE_INT8.tflite]
        [--runs 2000] [--out F]

In one process, medians of ``--runs`` warm round trips (wall clock, ``time.perf_counter``):

* ``bare``: CUDA graphs replayed through the same driver entry points litekiln's runtime
  calls (ctypes over libcuda, ``cuGraphLaunch`` then ``cuStreamSynchronize``), made of the
  empty kernel NVIDIA's OpenCL builds: 1 kernel; 1 kernel with the input copied in from pinned
  memory and the output copied back (smoke's 12288 and 40 bytes); 8 kernels with the copies
  (smoke's launches). ``launch_call_us`` is the ``cuGraphLaunch`` call alone.
* ``torch``: the network of ``scripts/make_zoo.py``'s ``build_smoke`` in PyTorch (random
  weights: only time is compared), eager kernels captured as one CUDA graph, the input copied
  in from pinned memory and the probabilities copied back, then synchronised; and the
  replay alone.
* ``litekiln``: each model's ``set_tensor`` + ``invoke`` + ``get_tensor`` (the CUDA graph
  path), with the default capture streams, with one, and with the input and output copies
  issued on the stream around the graph (``LITEKILN_CUDA_COPIES=stream``) instead of in it.
* ``litert_cpu``: LiteRT's CPU path (XNNPACK, 16 threads), the same three calls.

A benchmark for docs/benchmarks.md; needs torch with CUDA (the H200 image has it).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def _median_us(fn: Callable[[], object], runs: int, warmup: int = 200) -> float:
    """Median wall time of ``fn`` in us (`litekiln bench`'s timer)."""
    from litekiln.peers.timing import time_runs

    return round(time_runs(fn, runs, warmup)["median_ms"] * 1e3, 2)


def bare_graphs(runs: int) -> dict[str, Any]:
    """Round trips of CUDA graphs of empty kernels, with and without smoke's copies."""
    from litekiln.runtime import cuda, roofline
    from litekiln.runtime.device import select_device

    handle = select_device("gpu")
    ptx = roofline._executor(handle, roofline._empty_program(1)).binary  # noqa: SLF001
    drv = cuda.driver()
    dev = cuda.cuda_device_for(handle.device, handle.profile)
    dev.make_current()
    text = cuda.ptx_for_cuda(ptx.rstrip(b"\0").decode("latin-1")).encode()
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    drv.check("cuModuleLoadData", drv.cuModuleLoadData(ctypes.byref(mod), text))
    drv.check(
        "cuModuleGetFunction", drv.cuModuleGetFunction(ctypes.byref(fn), mod, b"litekiln_empty")
    )
    host, dptr = ctypes.c_void_p(), ctypes.c_uint64()
    drv.check("cuMemHostAlloc", drv.cuMemHostAlloc(ctypes.byref(host), 16384, 0))
    drv.check("cuMemAlloc", drv.cuMemAlloc(ctypes.byref(dptr), 16384))
    stream = dev.stream
    params = (ctypes.c_void_p * 1)()

    def capture(kernels: int, copies: bool) -> ctypes.c_void_p:
        drv.check("cuStreamBeginCapture", drv.cuStreamBeginCapture(stream, 1))
        if copies:
            drv.cuMemcpyHtoDAsync(dptr.value, host, 12288, stream)
        for _ in range(kernels):
            drv.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, params, None)
        if copies:
            drv.cuMemcpyDtoHAsync(host, dptr.value, 40, stream)
        graph, exe = ctypes.c_void_p(), ctypes.c_void_p()
        drv.check("cuStreamEndCapture", drv.cuStreamEndCapture(stream, ctypes.byref(graph)))
        drv.check(
            "cuGraphInstantiate",
            drv.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, 0),
        )
        return exe

    launch, sync = drv.cuGraphLaunch, drv.cuStreamSynchronize
    out: dict[str, Any] = {}
    for name, kernels, copies in (
        ("1 kernel", 1, False),
        ("1 kernel + copies", 1, True),
        ("8 kernels + copies", 8, True),
    ):
        exe = capture(kernels, copies)

        def trip(exe: ctypes.c_void_p = exe) -> None:
            launch(exe, stream)
            sync(stream)

        def call_only(exe: ctypes.c_void_p = exe) -> float:
            t = time.perf_counter()
            launch(exe, stream)
            dt = time.perf_counter() - t
            sync(stream)
            return dt

        rt = _median_us(trip, runs)
        calls = [call_only() for _ in range(runs)]
        out[name] = {
            "round_trip_us": rt,
            "launch_call_us": round(statistics.median(calls) * 1e6, 2),
        }
    exe = capture(1, False)
    h2d, d2h = drv.cuMemcpyHtoDAsync, drv.cuMemcpyDtoHAsync

    def stream_copies() -> None:
        h2d(dptr.value, host, 12288, stream)
        launch(exe, stream)
        d2h(host, dptr.value, 40, stream)
        sync(stream)

    out["1 kernel, copies on the stream"] = {"round_trip_us": _median_us(stream_copies, runs)}
    return out


def torch_smoke(runs: int) -> dict[str, Any]:
    """build_smoke's network in PyTorch as one CUDA graph: round trips with the copies."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False

    class Smoke(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
            self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
            self.pw = nn.Conv2d(8, 8, 1)
            self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
            self.fc = nn.Linear(512, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = F.relu(self.conv1(x))
            y = self.pw(torch.clamp(self.dw(x), 0, 6))
            x = F.relu(self.conv2(x + y))
            u = F.interpolate(F.max_pool2d(x, 2), size=(16, 16), mode="bilinear")
            x = F.avg_pool2d(torch.cat([x, u], 1), 4)
            return torch.softmax(self.fc(torch.flatten(x, 1)), -1)

    model = Smoke().cuda().eval()
    host_in = torch.randn(1, 3, 32, 32).pin_memory()
    host_out = torch.empty(1, 10).pin_memory()
    static_in = host_in.cuda()
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                model(static_in)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = model(static_in)
    stream = torch.cuda.current_stream()

    def trip() -> None:
        static_in.copy_(host_in, non_blocking=True)
        graph.replay()
        host_out.copy_(static_out, non_blocking=True)
        stream.synchronize()

    def replay() -> None:
        graph.replay()
        stream.synchronize()

    return {"round_trip_us": _median_us(trip, runs), "replay_only_us": _median_us(replay, runs)}


def litekiln_invoke(path: str, cache_dir: str, runs: int, **env: str) -> float:
    from litekiln.interpreter import Interpreter

    for key in ("LITEKILN_CUDA_STREAMS", "LITEKILN_CUDA_COPIES"):
        os.environ.pop(key, None)
    os.environ.update(env)
    interp = Interpreter(model_path=path, cache_dir=cache_dir, cpu_first=False)
    interp.allocate_tensors()
    getattr(interp._backend, "wait_for_graph", lambda: None)()  # noqa: SLF001
    return _three_calls(interp, runs)


def _three_calls(interp: Any, runs: int) -> float:
    d_in, d_out = interp.get_input_details()[0], interp.get_output_details()[0]
    rng = np.random.default_rng(0)
    dtype = np.dtype(d_in["dtype"])
    if dtype.kind == "f":
        x = rng.uniform(-1, 1, d_in["shape"]).astype(dtype)
    else:
        x = rng.integers(-100, 100, d_in["shape"]).astype(dtype)

    def call() -> None:
        interp.set_tensor(d_in["index"], x)
        interp.invoke()
        interp.get_tensor(d_out["index"])

    return _median_us(call, runs)


def litert_cpu(path: str, runs: int) -> float:
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=path, num_threads=16)
    interp.allocate_tensors()
    return _three_calls(interp, runs)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--cache-dir", required=True)
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    os.environ.setdefault("LITEKILN_CUDA_GRAPH", "on")
    rec: dict[str, Any] = {"runs": a.runs}
    for key, fn in (("bare", lambda: bare_graphs(a.runs)), ("torch", lambda: torch_smoke(a.runs))):
        try:
            rec[key] = fn()
        except Exception as exc:  # noqa: BLE001 - report and go on
            rec[key] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        print(key, json.dumps(rec[key]), flush=True)
    rec["models"] = {}
    for path in a.models:
        name = os.path.basename(path).rsplit(".", 1)[0]
        row: dict[str, Any] = {}
        for key, fn in (
            ("litert_cpu_us", lambda p=path: litert_cpu(p, a.runs)),
            ("litekiln_us", lambda p=path: litekiln_invoke(p, a.cache_dir, a.runs)),
            (
                "litekiln_1stream_us",
                lambda p=path: litekiln_invoke(p, a.cache_dir, a.runs, LITEKILN_CUDA_STREAMS="1"),
            ),
            (
                "litekiln_stream_copies_us",
                lambda p=path: litekiln_invoke(
                    p, a.cache_dir, a.runs, LITEKILN_CUDA_COPIES="stream"
                ),
            ),
            ("litekiln_again_us", lambda p=path: litekiln_invoke(p, a.cache_dir, a.runs)),
            (
                "litekiln_stream_copies_again_us",
                lambda p=path: litekiln_invoke(
                    p, a.cache_dir, a.runs, LITEKILN_CUDA_COPIES="stream"
                ),
            ),
        ):
            try:
                row[key] = fn()
            except Exception as exc:  # noqa: BLE001
                row[key + "_error"] = f"{type(exc).__name__}: {exc}"[:500]
        rec["models"][name] = row
        print(name, json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rec, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
