"""Which kernels of the compiler's shipped PTX (`GpuProgram.ptx`) compute otherwise than the
PTX NVIDIA's OpenCL makes of the same program (issue 16 diagnosis; NVIDIA GPU only).

For each model's partitions, on the same seeded inputs: the default program's OpenCL executor,
a CUDA graph of the OpenCL build's PTX (`ocl_ptx`) and one of the shipped PTX (`shipped`), each
with one capture stream and with the default four; where `shipped` differs, every kernel in
turn is taken from the shipped PTX into the OpenCL PTX's graph (`suspects`: the kernels that
alone change the outputs).

    python scripts/remote_gpu/ptx_bisect.py --cache-dir DIR [--out F] MODEL.tflite...

Prints one JSON line per partition.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))


def _max_err(a: Any, b: Any) -> float:
    err = 0.0
    for i in range(a.num_outputs):
        ya, yb = a.get_output(i).astype(np.float64), b.get_output(i).astype(np.float64)
        scale = max(1.0, float(np.abs(ya[np.isfinite(ya)]).max(initial=0.0)))
        both = np.isfinite(ya) & np.isfinite(yb)
        if not np.array_equal(np.isfinite(ya), np.isfinite(yb)):
            return float("inf")
        if both.any():
            err = max(err, float(np.abs(ya[both] - yb[both]).max()) / scale)
    return err


def _run(ex: Any, xs: list[np.ndarray]) -> Any:
    for i, x in enumerate(xs):
        ex.set_input(i, x)
    ex.run(wait=True)
    return ex


def _own_outputs(
    prog: Any,
    consts: Any,
    ocl_ptx: str,
    shipped: str,
    dev: Any,
    xs: Any,
    hybrid: Any,
    kernels: list[str],
) -> dict[str, Any]:
    """For each kernel: the plan cut after its first launch, its output read from the OpenCL
    PTX's graph and from the one with that kernel swapped; how far apart they are."""
    import dataclasses

    from litekiln.artifact.program import BufferArg
    from litekiln.runtime import cuda

    out: dict[str, Any] = {}
    for k in kernels:
        i = next(j for j, la in enumerate(prog.launches) if la.kernel == k)
        arg = prog.launches[i].args[0]
        assert isinstance(arg, BufferArg)
        cut = dataclasses.replace(prog, launches=prog.launches[: i + 1], outputs=[arg.tensor])
        a = _run(cuda.CudaGraphExecutor(cut, consts, ocl_ptx.encode(), dev), xs).get_output(0)
        h = hybrid(cut, consts, ocl_ptx.encode(), dev, other=shipped, swap={k})
        b = _run(h, xs).get_output(0)
        d = np.abs(a.astype(np.float64) - b)
        rel = d / np.maximum(np.abs(a), 1e-30)
        out[k] = {
            "max_abs": float(d.max()),
            "max_abs_value": float(np.abs(a).max()),
            "n_differ": int((d > 0).sum()),
            "n_rel_gt_1e-5": int((rel > 1e-5).sum()),
            "size": int(a.size),
        }
    return out


def main() -> int:
    from litekiln.cache.models import ModelCache
    from litekiln.loading import split_options
    from litekiln.model import load_model
    from litekiln.runtime import cuda
    from litekiln.runtime.build import build_programs, default_program
    from litekiln.runtime.device import select_device
    from litekiln.runtime.executor import PartitionExecutor, build_job
    from litekiln.runtime.session import partition_constants

    class Hybrid(cuda.CudaGraphExecutor):
        """The OpenCL PTX's graph with the kernels in ``swap`` from another PTX."""

        def __init__(self, *args: Any, other: str, swap: set[str], **kw: Any) -> None:
            self._other, self._swap = other, swap
            super().__init__(*args, **kw)

        def _load_module(self, text: str, cubin: bytes | None = None, link: bool = False) -> None:
            super()._load_module(text, None, False)  # the PTX itself, as the bisection needs
            mod = ctypes.c_void_p()
            self._drv.check(
                "cuModuleLoadData",
                self._drv.cuModuleLoadData(ctypes.byref(mod), self._other.encode() + b"\0"),
            )
            self._second = mod

        def _function(self, name: str) -> ctypes.c_void_p:
            if name not in self._swap:
                return super()._function(name)
            fn = ctypes.c_void_p()
            self._drv.check(
                "cuModuleGetFunction",
                self._drv.cuModuleGetFunction(ctypes.byref(fn), self._second, name.encode()),
            )
            return fn

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+")
    p.add_argument("--cache-dir", required=True)
    p.add_argument("--out")
    p.add_argument("--alt", help="folder of MODEL.VARIANT.ptx files to compare too")
    a = p.parse_args()
    handle = select_device("gpu")
    dev = cuda.cuda_device_for(handle.device, handle.profile)
    cache = ModelCache.open(a.cache_dir)
    rows = []
    for path in a.models:
        model = load_model(path)
        copts, _ = split_options({"schedules": "fast", "op_table": "extended"}, "fp32")
        compiled = cache.load_model(model.token, copts, model)
        if compiled is None:
            print(json.dumps({"model": model.name, "error": "not in the cache"}), flush=True)
            continue
        for part in compiled.partitions:
            prog = default_program(part.program) or part.program
            row: dict[str, Any] = {"model": model.name, "partition": part.index}
            try:
                consts = partition_constants(compiled, part)
                built = build_programs(
                    [build_job(prog, handle.profile)], handle.context, handle.device,
                    handle.profile,
                )[0]  # fmt: skip
                ocl = PartitionExecutor(
                    prog, consts, handle.context, handle.queue, None, handle.profile, built=built
                )
                rng = np.random.default_rng(0)
                xs = [
                    rng.uniform(-1, 1, ocl.input_spec(i).shape).astype(ocl.input_spec(i).dtype)
                    for i in range(ocl.num_inputs)
                ]
                _run(ocl, xs)
                ocl_ptx = ocl.binary.rstrip(b"\0").decode("latin-1")
                shipped = part.program.ptx
                for label, text in (("ocl_ptx", ocl_ptx), ("shipped", shipped)):
                    for streams in (1, 4):
                        ex = cuda.CudaGraphExecutor(
                            prog, consts, text.encode(), dev, streams=streams
                        )
                        row[f"{label}_streams{streams}"] = _max_err(ocl, _run(ex, xs))
                for f in sorted(Path(a.alt).glob(f"{model.name}.*.ptx")) if a.alt else []:
                    ex = cuda.CudaGraphExecutor(prog, consts, f.read_bytes(), dev, streams=1)
                    row[f.name] = _max_err(ocl, _run(ex, xs))
                if row["shipped_streams1"] > 1e-5:
                    base = _run(cuda.CudaGraphExecutor(prog, consts, ocl_ptx.encode(), dev), xs)
                    suspects = {}
                    for k in sorted({la.kernel for la in prog.launches}):
                        h = Hybrid(prog, consts, ocl_ptx.encode(), dev, other=shipped, swap={k})
                        e = _max_err(base, _run(h, xs))
                        if e > 1e-6:
                            suspects[k] = e
                    row["suspects"] = suspects
                    row["own_output"] = _own_outputs(
                        prog, consts, ocl_ptx, shipped, dev, xs, Hybrid,
                        sorted(suspects, key=lambda k: -suspects[k])[:4],
                    )  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - report and go on
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            print(json.dumps(row), flush=True)
            rows.append(row)
            if a.out:
                Path(a.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
