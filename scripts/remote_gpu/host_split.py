#!/usr/bin/env python3
"""Where an inference's host time goes beside the CUDA graph, call by call (issue 15).

`litekiln bench`'s host breakdown puts the input's copy into the graph's pinned staging and
the Python of `Interpreter.run` together (``other_ms``: 35-70 us for a 224x224x3 input on the
H200, 10 us for smoke's 32x32x3). This splits it, each median over ``--runs`` calls, on models
of a kit run.sh has unpacked (its cache and models):

* ``run``: `Interpreter.run(inputs)`, as the bench times it;
* ``set_tensor``, ``invoke``, ``get_tensor``: the three calls of LiteRT's API, one after the
  other;
* ``copy_to_stage``: ``np.copyto`` of the input into the graph's pinned staging array alone;
* ``copy_plain``: the same copy into an ordinary numpy array;
* ``copy_threads_N``: the same copy into the staging, split over N threads of a pool
  (whether a parallel copy would pay for its hand-over);
* ``set_invoke``: ``set_tensor`` then ``invoke``, as `run` does (against ``invoke`` alone,
  which copies an input the CPU did not just write);

and, with ``--staging``, the driver alone on a block of the largest input's size: the host
copy into pinned memory, the copy to the device, and both in a row, for ordinary pinned
memory and for write-combined pinned memory (``CU_MEMHOSTALLOC_WRITECOMBINED``: not cached by
the CPU, not snooped by the device's reads); the copy to the device alone after the input's
lines were pushed out of the CPU's caches; and the copy straight from the (pageable) numpy
array, which the driver stages itself.

Usage (GPU machine, after run.sh unpacked the kit, its environment as run.sh sets it)::

    python scripts/remote_gpu/host_split.py --kit /tmp/litekiln-gpukit tv_squeezenet1_1 smoke
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO))


def _median_us(fn: Any, runs: int) -> float:
    """The median of ``runs`` timed calls after 20 untimed ones, in us (the bench's timer)."""
    from litekiln.peers.timing import time_runs

    return round(time_runs(fn, runs, warmup=20)["median_ms"] * 1e3, 2)


def split(kit: Path, name: str, runs: int) -> dict[str, Any]:
    import litekiln

    interp = litekiln.Interpreter(
        model_path=str(kit / "models" / f"{name}.tflite"), cache_dir=str(kit / "cache")
    )
    interp.allocate_tensors()
    inputs = interp.random_inputs(0)
    interp.run(inputs)
    interp._backend.wait_for_graph()  # noqa: SLF001 - the graph path, as the bench times it
    details = interp.get_input_details()
    outs = interp.get_output_details()
    row: dict[str, Any] = {"model": name, "input_bytes": sum(a.nbytes for a in inputs)}
    row["run"] = _median_us(lambda: interp.run(inputs), runs)

    def set_all() -> None:
        for d, a in zip(details, inputs, strict=True):
            interp.set_tensor(d["index"], a)

    row["set_tensor"] = _median_us(set_all, runs)
    row["invoke"] = _median_us(interp.invoke, runs)
    row["get_tensor"] = _median_us(lambda: [interp.get_tensor(o["index"]) for o in outs], runs)

    def set_invoke() -> None:
        set_all()
        interp.invoke()

    row["set_invoke"] = _median_us(set_invoke, runs)
    stages = interp._current_stages()  # noqa: SLF001 - the pinned arrays the graph copies from
    big = max(inputs, key=lambda a: a.nbytes)
    index = details[[a.nbytes for a in inputs].index(big.nbytes)]["index"]
    stage = stages.get(index)
    row["staged"] = stage is not None
    if stage is not None:
        row["copy_to_stage"] = _median_us(lambda: np.copyto(stage, big), runs)
        flat_src, flat_dst = big.reshape(-1), stage.reshape(-1)
        for n in (2, 4):
            pool = ThreadPoolExecutor(n)
            bounds = np.linspace(0, flat_src.size, n + 1).astype(int)

            def part(i: int, b: Any = bounds) -> None:
                np.copyto(flat_dst[b[i] : b[i + 1]], flat_src[b[i] : b[i + 1]])

            def copy_n(p: ThreadPoolExecutor = pool, k: int = n) -> None:
                list(p.map(part, range(k)))

            row[f"copy_threads_{n}"] = _median_us(copy_n, runs)
            pool.shutdown()
    plain = np.empty_like(big)
    row["copy_plain"] = _median_us(lambda: np.copyto(plain, big), runs)
    return row


def staging(nbytes: int, runs: int) -> dict[str, Any]:
    """The host copy, the copy to the device, and both, on ordinary and write-combined
    pinned blocks of ``nbytes`` (the current CUDA context's device, its stream)."""
    import ctypes

    from litekiln.runtime import cuda

    drv = cuda.driver()
    dev = cuda._device(0)  # noqa: SLF001 - the runtime's own context and stream
    dev.make_current()
    src = np.random.default_rng(0).random(nbytes // 4, dtype=np.float32)
    dptr = ctypes.c_uint64()
    drv.check("cuMemAlloc", drv.cuMemAlloc(ctypes.byref(dptr), nbytes))
    out: dict[str, Any] = {"bytes": nbytes}
    for label, flags in (("pinned", 0), ("write_combined", 0x04)):
        host = ctypes.c_void_p()
        drv.check("cuMemHostAlloc", drv.cuMemHostAlloc(ctypes.byref(host), nbytes, flags))
        block = (ctypes.c_uint8 * nbytes).from_address(host.value)
        arr = np.ctypeslib.as_array(block).view(np.float32)

        def to_device(h: Any = host) -> None:
            drv.cuMemcpyHtoDAsync(dptr.value, h, nbytes, dev.stream)
            drv.cuStreamSynchronize(dev.stream)

        def both(a: Any = arr) -> None:
            np.copyto(a, src)
            to_device()

        evict_a = np.ones(16 << 20, np.float32)
        evict_b = np.empty_like(evict_a)
        dma_after_evict: list[float] = []
        for _ in range(max(20, runs // 10)):
            np.copyto(arr, src)
            np.copyto(evict_b, evict_a)  # 64 MB through the caches: the input's lines leave
            t = time.perf_counter()
            to_device()
            dma_after_evict.append(time.perf_counter() - t)
        out[label] = {
            "host_copy": _median_us(lambda a=arr: np.copyto(a, src), runs),
            "to_device": _median_us(to_device, runs),
            "both": _median_us(both, runs),
            "to_device_after_evict": round(statistics.median(dma_after_evict) * 1e6, 2),
        }
        drv.cuMemFreeHost(host)

    def pageable() -> None:  # the driver stages the numpy array itself
        drv.cuMemcpyHtoDAsync(dptr.value, src.ctypes.data, nbytes, dev.stream)
        drv.cuStreamSynchronize(dev.stream)

    out["pageable_to_device"] = _median_us(pageable, runs)
    drv.cuMemFree(dptr.value)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--kit", type=Path, default=Path("/tmp/litekiln-gpukit"))
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--staging", type=int, default=0, help="bytes of the driver-only probe")
    args = ap.parse_args()
    rows = []
    for name in args.models:
        try:
            rows.append(split(args.kit, name, args.runs))
        except Exception as exc:  # noqa: BLE001 - a diagnostic: say why and go on
            rows.append({"model": name, "error": f"{type(exc).__name__}: {exc}"})
        print(json.dumps(rows[-1]), flush=True)
    if args.staging:
        try:
            rows.append({"staging": staging(args.staging, args.runs)})
        except Exception as exc:  # noqa: BLE001
            rows.append({"staging": f"{type(exc).__name__}: {exc}"})
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
