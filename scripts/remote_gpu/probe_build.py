"""How a partition's OpenCL build time scales on a device: all kernels, the default ones, and
the default ones split into chunks built on concurrent threads (issue 16: the first start on
a new device is dominated by the driver's build of the whole program, tuning variants
included).

    # here (compiler): each model's partition sources and default kernel names
    python scripts/remote_gpu/probe_build.py extract --out .devcache/probe MODEL...
    # there (pyopencl only), the drivers' caches off:
    CUDA_CACHE_DISABLE=1 python scripts/remote_gpu/probe_build.py time .devcache/probe \
        --chunks 1 4 8 16 --out probe_build.json
    # there: how much of a build is the PTX JIT (NVIDIA's OpenCL binary, and any
    # MODEL.pN.nvptx.ptx beside the sources, loaded through the CUDA driver)
    CUDA_CACHE_DISABLE=1 python scripts/remote_gpu/probe_build.py ptx .devcache/probe --out ptx.json

Each build runs in a fresh process (a driver may cache programs by source within a process).
Prints one JSON line per model and case: kernels built, seconds wall.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[2]
_MARKER = "\n// Function: "


def split_source(source: str) -> tuple[str, dict[str, str]]:
    """TVM's OpenCL source: (preamble, kernel name -> its text), cut at each function marker."""
    head, *parts = source.split(_MARKER)
    out = {}
    for p in parts:
        name = p.split("\n", 1)[0].strip()
        out[name] = _MARKER + p
    return head, out


def extract(models: list[str], out: str) -> None:
    sys.path.insert(0, str(_ROOT))
    from litekiln.artifact.compiled import CompileOptions
    from litekiln.loading import compile_for
    from litekiln.model import load_model

    Path(out).mkdir(parents=True, exist_ok=True)
    for m in models:
        model = load_model(m)
        compiled = compile_for(model, CompileOptions(schedules="fast", op_table="extended"))
        for p in compiled.partitions:
            prog = p.program
            default = sorted({la.kernel for la in prog.launches})
            rec = {"source": prog.source, "options": prog.build_options, "default": default}
            name = f"{Path(m).stem}.p{p.index}.json.xz"
            Path(out, name).write_bytes(lzma.compress(json.dumps(rec).encode()))
            print(f"{name}: {len(prog.source)} chars, {len(default)} default kernels", flush=True)


_BUILD_CODE = r"""
import json, sys, time, threading
import pyopencl as cl
srcs, opts = json.loads(sys.stdin.read())
gpus = [d for p in cl.get_platforms() for d in p.get_devices() if d.type & cl.device_type.GPU]
ctx = cl.Context(gpus[:1])
t0 = time.perf_counter()
errs = []
def build(s):
    try:
        cl.Program(ctx, s).build(options=opts.split())
    except Exception as e:
        errs.append(str(e)[:200])
ts = [threading.Thread(target=build, args=(s,)) for s in srcs]
[t.start() for t in ts]; [t.join() for t in ts]
print("RESULT " + json.dumps({"s": time.perf_counter() - t0, "errors": errs}))
"""


def _time_build(sources: list[str], options: str) -> dict[str, Any]:
    return _run_code(_BUILD_CODE, json.dumps([sources, options]))


def time_builds(folder: str, chunks: list[int], out: str | None) -> None:
    rows = []
    for f in sorted(Path(folder).glob("*.json.xz")):
        rec = json.loads(lzma.decompress(f.read_bytes()))
        head, kernels = split_source(rec["source"])
        default = [kernels[k] for k in rec["default"] if k in kernels]
        cases = {"all": [rec["source"]], "default": [head + "".join(default)]}
        for n in chunks:
            if n > 1:
                parts = [default[i::n] for i in range(n)]
                cases[f"default/{n} threads"] = [head + "".join(p) for p in parts if p]
        for case, srcs in cases.items():
            r = _time_build(srcs, rec["options"])
            row = {
                "model": f.name.split(".json")[0],
                "case": case,
                "kernels": len(kernels) if case == "all" else len(default),
                "programs": len(srcs),
                **r,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
            if out:
                Path(out).write_text(json.dumps(rows, indent=1) + "\n")


_PTX_CODE = r"""
import ctypes, json, re, sys, time
ptx, level = sys.stdin.read(), int(sys.argv[1])
ptx = re.sub(r"mov\.b32\s+(%r\d+),\s*%envreg[012];", r"mov.b32 \1, 0;", ptx)
cu = ctypes.CDLL("libcuda.so.1")
t0 = time.perf_counter()
assert cu.cuInit(0) == 0
dev = ctypes.c_int(); cu.cuDeviceGet(ctypes.byref(dev), 0)
ctx = ctypes.c_void_p(); cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
cu.cuCtxSetCurrent(ctx)
t1 = time.perf_counter()
mod = ctypes.c_void_p()
opts = (ctypes.c_int * 1)(7)  # CU_JIT_OPTIMIZATION_LEVEL
vals = (ctypes.c_void_p * 1)(level)
err = cu.cuModuleLoadDataEx(ctypes.byref(mod), ctypes.c_char_p(ptx.encode() + b"\0"), 1, opts, vals)
t2 = time.perf_counter()
print("RESULT " + json.dumps({"init_s": t1 - t0, "jit_s": t2 - t1, "err": err,
                              "entries": ptx.count(".entry")}))
"""

_BINARY_CODE = r"""
import json, sys, time
import pyopencl as cl
src, opts = json.loads(sys.stdin.read())
gpus = [d for p in cl.get_platforms() for d in p.get_devices() if d.type & cl.device_type.GPU]
ctx = cl.Context(gpus[:1])
t0 = time.perf_counter()
prg = cl.Program(ctx, src).build(options=opts.split())
t1 = time.perf_counter()
print("RESULT " + json.dumps({"build_s": t1 - t0, "ptx": prg.binaries[0].decode("latin-1")}))
"""


def _run_code(code: str, stdin: str, *args: str) -> dict[str, Any]:
    p = subprocess.run(
        [sys.executable, "-c", code, *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=dict(os.environ),
        check=False,
    )
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        return {"error": (p.stderr or p.stdout)[-300:]}
    r: dict[str, Any] = json.loads(lines[-1][7:])
    return r


def time_ptx(folder: str, out: str | None) -> None:
    """OpenCL build of the default kernels, then the CUDA driver's JIT of the PTX it made (and
    of any TVM-made ``.nvptx.ptx``), each in a fresh process, at JIT levels 4 and 1."""
    rows = []

    def emit(row: dict[str, Any]) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)
        if out:
            Path(out).write_text(json.dumps(rows, indent=1) + "\n")

    for f in sorted(Path(folder).glob("*.json.xz")):
        rec = json.loads(lzma.decompress(f.read_bytes()))
        head, kernels = split_source(rec["source"])
        name = f.name.split(".json")[0]
        default = head + "".join(kernels[k] for k in rec["default"] if k in kernels)
        for case, src in (("default", default), ("all", rec["source"])):
            b = _run_code(_BINARY_CODE, json.dumps([src, rec["options"]]))
            ptx = b.pop("ptx", "")
            emit({"model": name, "case": f"opencl build {case}", **b})
            for level in (4, 1):
                r = _run_code(_PTX_CODE, ptx, str(level)) if ptx else {}
                emit({"model": name, "case": f"jit of opencl ptx {case} O{level}", **r})
        nv = f.with_name(name + ".nvptx.ptx")
        if nv.exists():
            for level in (4, 1):
                r = _run_code(_PTX_CODE, nv.read_text(), str(level))
                emit({"model": name, "case": f"jit of tvm nvptx O{level}", **r})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("extract")
    e.add_argument("models", nargs="+")
    e.add_argument("--out", required=True)
    t = sub.add_parser("time")
    t.add_argument("folder")
    t.add_argument("--chunks", type=int, nargs="*", default=[1, 4, 8, 16])
    t.add_argument("--out")
    x = sub.add_parser("ptx")
    x.add_argument("folder")
    x.add_argument("--out")
    a = p.parse_args()
    if a.cmd == "ptx":
        time_ptx(a.folder, a.out)
    elif a.cmd == "extract":
        extract(a.models, a.out)
    else:
        time_builds(a.folder, a.chunks, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
