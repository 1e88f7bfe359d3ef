#!/usr/bin/env python3
"""How to get an input from a numpy array onto an NVIDIA GPU fastest (issue 15's host time).

A CUDA-graph inference stages each input in pinned host memory (`CudaGraphExecutor.set_input`:
``np.copyto``) and the graph copies it to the device, one step after the other. This times,
through the same driver calls litekiln makes (ctypes over libcuda), per input size:

- ``stage+dma``: what runs now, copy into pinned staging, then one async copy, then a sync;
- ``pageable``: one async copy straight from the array (the driver stages it through its own
  pinned buffers, overlapping its copies with the DMA), then a sync;
- ``chunked/N``: the staging copy in N pieces, each piece's async copy issued once staged;
- ``stage only`` and ``dma only``: the two halves of ``stage+dma`` alone.

Medians of ``--runs`` (a fresh source array of the size, the same one every run), us::

    python scripts/bench_upload.py --runs 300 --json out.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: Input sizes of the issue's models: an int8 224x224x3 image, a float one, a float 256x256x3.
SIZES = {"150 KB (int8 224x224x3)": 150528, "602 KB (f32 224x224x3)": 602112,
         "786 KB (f32 256x256x3)": 786432}  # fmt: skip


def _time_size(cuda: Any, dev: Any, nbytes: int, runs: int) -> dict[str, float]:
    """Each way's median time for ``nbytes``, the ways interleaved run by run (us)."""
    drv, stream = cuda.driver(), dev.stream
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    d = cuda.DeviceAllocation(dev, nbytes)
    host = ctypes.c_void_p()
    drv.check("cuMemHostAlloc", drv.cuMemHostAlloc(ctypes.byref(host), nbytes, 0))
    pinned = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(host.value))

    def sync() -> None:
        drv.check("cuStreamSynchronize", drv.cuStreamSynchronize(stream))

    def h2d(dst: int, ptr: int, n: int) -> None:
        drv.check("cuMemcpyHtoDAsync", drv.cuMemcpyHtoDAsync(dst, ptr, n, stream))

    def stage_dma() -> None:
        np.copyto(pinned, src)
        h2d(d.address, pinned.ctypes.data, nbytes)
        sync()

    def pageable() -> None:
        h2d(d.address, src.ctypes.data, nbytes)
        sync()

    def chunked(n: int) -> Callable[[], None]:
        step = -(-nbytes // n)

        def run() -> None:
            for off in range(0, nbytes, step):
                end = min(nbytes, off + step)
                np.copyto(pinned[off:end], src[off:end])
                h2d(d.address + off, pinned.ctypes.data + off, end - off)
            sync()

        return run

    def stage_only() -> None:
        np.copyto(pinned, src)

    def dma_only() -> None:
        h2d(d.address, pinned.ctypes.data, nbytes)
        sync()

    ways = {"stage+dma": stage_dma, "pageable": pageable, "chunked/2": chunked(2),
            "chunked/4": chunked(4), "chunked/8": chunked(8), "stage only": stage_only,
            "dma only": dma_only}  # fmt: skip
    times: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(20):
        for fn in ways.values():
            fn()
    for _ in range(runs):
        for k, fn in ways.items():
            t = time.perf_counter()
            fn()
            times[k].append((time.perf_counter() - t) * 1e6)
    drv.cuMemFreeHost(host)
    return {k: round(statistics.median(v), 2) for k, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()

    from litekiln.runtime import cuda

    dev = cuda.CudaDevice(0)
    out: dict[str, dict[str, float]] = {}
    for label, nbytes in SIZES.items():
        out[label] = _time_size(cuda, dev, nbytes, a.runs)
        row = "  ".join(f"{k} {v:7.1f}" for k, v in out[label].items())
        print(f"{label:<24} {row}  (us, median of {a.runs})", flush=True)
    if a.json:
        a.json.write_text(json.dumps({"device": dev.name, "runs": a.runs, "us": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
