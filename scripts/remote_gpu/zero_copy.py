"""Host time per inference: numpy input/output against device buffers bound to the model.

For each model, in one process and on one interpreter, alternately (``--repeat`` rounds):

* ``numpy``: ``set_tensor`` each input, ``invoke``, ``get_tensor`` each output (the LiteRT way);
* ``bound_inputs``: the inputs bound to device tensors (``bind_input``), outputs read with
  ``get_tensor``: frames that already live on the GPU;
* ``bound``: inputs and outputs bound (``bind_input``/``bind_output``): ``invoke`` alone;
* ``bound_nosync`` (CUDA tensors only): the same with ``sync=False``: no DLPack export per
  ``invoke`` (``dlpack_export_us`` says what one costs), the application vouching for the
  ordering of its own stream.

Each mode is timed over ``--runs`` inferences after ``--warmup`` (the host's wall time of the
synchronous call: ``invoke`` returns when the results are in the buffers), and the outputs the
bound buffers hold are compared with the numpy path's (the same kernels: equal to the bit).
``transfer_ms`` is what moving the model's input and output bytes between host and device
costs on their own, through the same buffers with the device idle (pyopencl's blocking copies,
or torch's ``copy_`` and ``.cpu()``, synchronised): the copy cost ``saved_ms`` is to be set
against.

On the NVIDIA machine (runtime only: TVM blocked; torch's CUDA build supplies the tensors,
bound through DLPack to the CUDA graph path):

    python scripts/remote_gpu/zero_copy.py --cache-dir DIR [--out zero_copy.json] MODEL...

Here, on PoCL, with pyopencl arrays in the interpreter's context instead of torch tensors:

    .venv/bin/python scripts/remote_gpu/zero_copy.py --opencl-buffers MODEL...

MODEL is a .tflite path or a zoo name. Prints one JSON line per model; ``--out`` writes them all.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:  # run from anywhere: the repository's litekiln
    sys.path.insert(0, str(_ROOT))

MODES = ("numpy", "bound_inputs", "bound", "bound_nosync")


def _model_path(name: str) -> str:
    if os.path.exists(name):
        return name
    from litekiln.zoo import zoo_path

    return str(zoo_path(name))


class _Buffers:
    """Device tensors for a model's inputs (holding the given values) and outputs."""

    def __init__(self, interp: Any, inputs: list[np.ndarray], opencl: bool, cuda_device: int):
        self.opencl = opencl
        outs = interp.get_output_details()
        if opencl:
            import pyopencl.array as cla

            queue = interp.get_device().queue
            self.inputs = [cla.to_device(queue, x) for x in inputs]
            self.outputs = [cla.empty(queue, tuple(d["shape"]), d["dtype"]) for d in outs]
            self.kind = f"pyopencl arrays ({interp.device})"
        else:
            import torch

            dev = torch.device("cuda", cuda_device)
            self.inputs = [torch.from_numpy(np.ascontiguousarray(x)).to(dev) for x in inputs]
            self.outputs = [
                torch.empty(tuple(int(n) for n in d["shape"]),
                            dtype=torch.from_numpy(np.zeros(0, d["dtype"])).dtype, device=dev)
                for d in outs
            ]  # fmt: skip
            torch.cuda.synchronize(dev)
            self.kind = f"torch {torch.__version__} tensors on {torch.cuda.get_device_name(dev)}"

    def host(self, tensor: Any) -> np.ndarray:
        return tensor.get() if self.opencl else tensor.cpu().numpy()

    def transfer(self, inputs: list[np.ndarray]) -> None:
        """Inputs host -> device, outputs device -> host, done when this returns."""
        if self.opencl:
            for b, x in zip(self.inputs, inputs, strict=True):
                b.set(x)
            for b in self.outputs:
                b.get()
            return
        import torch

        for b, x in zip(self.inputs, inputs, strict=True):
            b.copy_(torch.from_numpy(x))
        for b in self.outputs:
            b.cpu()  # (synchronises)


def _time(fn: Callable[[], Any], runs: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    samples = []
    clock = time.perf_counter
    for _ in range(runs):
        t0 = clock()
        fn()
        samples.append(clock() - t0)
    return samples


def _graph_ms(session: Any) -> float:
    """Device time of one replay of each CUDA graph, summed (median of 50; -1 on OpenCL)."""
    graphs = [e for e in session.executors if hasattr(e, "graph_time")]
    if not graphs:
        return -1.0
    return sum(e.graph_time(50) for e in graphs) * 1e3


def measure(path: str, args: argparse.Namespace) -> dict[str, Any]:
    from litekiln.interpreter import Interpreter

    interp = Interpreter(model_path=path, cache_dir=args.cache_dir, precision=args.precision)
    interp.allocate_tensors()
    session = interp._backend  # noqa: SLF001 - the launch path and the staging times
    session.wait_for_graph()
    ins, outs = interp.get_input_details(), interp.get_output_details()
    xs = interp.random_inputs(0)

    def numpy_io() -> list[np.ndarray]:
        for d, x in zip(ins, xs, strict=True):
            interp.set_tensor(d["index"], x)
        interp.invoke()
        return [interp.get_tensor(d["index"]) for d in outs]

    want = numpy_io()
    bufs = _Buffers(interp, xs, args.opencl_buffers, args.cuda_device)

    def bind(mode: str) -> None:
        interp.unbind()
        if mode == "numpy":
            return
        sync = mode != "bound_nosync"
        for d, b in zip(ins, bufs.inputs, strict=True):
            interp.bind_input(d["index"], b, sync=sync)
        if mode != "bound_inputs":
            for d, b in zip(outs, bufs.outputs, strict=True):
                interp.bind_output(d["index"], b, sync=sync)

    def bound_inputs_io() -> list[np.ndarray]:
        interp.invoke()
        return [interp.get_tensor(d["index"]) for d in outs]

    modes = [m for m in MODES if not (args.opencl_buffers and m == "bound_nosync")]
    calls = {
        "numpy": numpy_io,
        "bound_inputs": bound_inputs_io,
        "bound": interp.invoke,
        "bound_nosync": interp.invoke,
    }
    samples: dict[str, list[float]] = {m: [] for m in modes}
    graph_ms: dict[str, list[float]] = {m: [] for m in modes}
    same: dict[str, float] = {}
    bindings: dict[str, Any] = {}
    for _ in range(args.repeat):
        for mode in modes:
            bind(mode)
            samples[mode] += _time(calls[mode], args.runs, args.warmup)
            graph_ms[mode].append(_graph_ms(session))
            if mode == "bound_inputs":
                got = bound_inputs_io()
            elif mode.startswith("bound"):
                bindings = interp.get_bindings()
                got = [bufs.host(b) for b in bufs.outputs]
            else:
                got = numpy_io()
            diff = max(
                (float(np.abs(g.astype(np.float64) - w).max()) if w.size else 0.0)
                for g, w in zip(got, want, strict=True)
            )
            same[mode] = max(same.get(mode, 0.0), diff)
    bind("numpy")
    transfer = _time(lambda: bufs.transfer(xs), args.runs, args.warmup)
    # What one DLPack export for litekiln's stream costs (the per-run ordering, CUDA only).
    export = None
    if not args.opencl_buffers:
        stream = int(session._cuda_device().stream.value)  # noqa: SLF001
        export = _time(lambda: bufs.inputs[0].__dlpack__(stream=stream), args.runs, args.warmup)
    med = {m: statistics.median(s) * 1e3 for m, s in samples.items()}
    return {
        "model": Path(path).stem,
        "device": interp.device,
        "buffers": bufs.kind,
        "paths": [type(e).__name__ for e in session.executors],
        "runs": args.runs * args.repeat,
        "host_ms": {m: round(v, 4) for m, v in med.items()},
        "p10_p90_ms": {
            m: [round(float(np.percentile(s, q)) * 1e3, 4) for q in (10, 90)]
            for m, s in samples.items()
        },
        "graph_ms": {m: [round(v, 4) for v in g] for m, g in graph_ms.items() if g[0] >= 0},
        "branches": [getattr(e, "branches", None) for e in session.executors],
        "saved_ms": round(med["numpy"] - med["bound"], 4),
        "saved_nosync_ms": round(med["numpy"] - med["bound_nosync"], 4)
        if "bound_nosync" in med
        else None,
        "transfer_ms": round(statistics.median(transfer) * 1e3, 4),
        "dlpack_export_us": round(statistics.median(export) * 1e6, 2) if export else None,
        "input_bytes": int(sum(x.nbytes for x in xs)),
        "output_bytes": int(sum(w.nbytes for w in want)),
        "max_abs_diff": same,
        "outputs_equal": all(v == 0.0 for v in same.values()),
        "zero_copy": {str(t): b["zero_copy"] for t, b in bindings.items()},
        "host_copies": {str(t): b["host_copies"] for t, b in bindings.items() if b["host_copies"]},
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", help=".tflite paths or zoo names")
    p.add_argument("--cache-dir", help="the compiled-model cache (default: litekiln's)")
    p.add_argument("--runs", type=int, default=200, help="timed inferences per mode and round")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--repeat", type=int, default=3, help="rounds of the three modes")
    p.add_argument("--precision", default="fp32")
    p.add_argument(
        "--opencl-buffers",
        action="store_true",
        help="pyopencl arrays in the interpreter's context instead of torch CUDA tensors",
    )
    p.add_argument("--cuda-device", type=int, default=0, help="torch's CUDA device ordinal")
    p.add_argument("--out", help="write the results as a JSON list")
    args = p.parse_args()
    results = []
    status = 0
    for name in args.models:
        try:
            r = measure(_model_path(name), args)
        except Exception as exc:  # noqa: BLE001 - one model's failure is reported, not fatal
            r = {"model": name, "error": f"{type(exc).__name__}: {exc}"}
            status = 1
        print(json.dumps(r), flush=True)
        results.append(r)
        if args.out:
            Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
