"""Driver facts the runtime's design depends on, measured on the device in fresh processes.

    python scripts/remote_gpu/probe.py [--json OUT]

1. start-up floor: the time a process needs for OpenCL alone (ICD load + clGetPlatformIDs,
   clCreateContext, clCreateCommandQueue), through pyopencl and through bare ctypes calls,
   each in a fresh process (median of 5). No litekiln code: this is what any OpenCL program
   pays before its first kernel.
2. launch cost: host time per clEnqueueNDRangeKernel of a tiny kernel (pyopencl and ctypes),
   and the device's back-to-back time per tiny kernel (wall time of 2000 queued launches).
3. cl_khr_command_buffer: whether the device has it, its version, and (if so) the host and
   wall time of replaying 100 recorded launches.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

_FLOOR_PYOPENCL = r"""
import time, json
t0 = time.perf_counter()
import pyopencl as cl
t1 = time.perf_counter()
plats = cl.get_platforms()
t2 = time.perf_counter()
dev = [d for p in plats for d in p.get_devices()][0]
t3 = time.perf_counter()
ctx = cl.Context([dev])
t4 = time.perf_counter()
q = cl.CommandQueue(ctx, dev)
t5 = time.perf_counter()
print(json.dumps({"import_ms": (t1-t0)*1e3, "platforms_ms": (t2-t1)*1e3, "devices_ms": (t3-t2)*1e3,
                  "context_ms": (t4-t3)*1e3, "queue_ms": (t5-t4)*1e3, "total_ms": (t5-t1)*1e3}))
"""

_FLOOR_CTYPES = r"""
import ctypes, json, sys, time
t0 = time.perf_counter()
lib = ctypes.CDLL(sys.argv[1])
t1 = time.perf_counter()
vp = ctypes.c_void_p
lib.clGetPlatformIDs.argtypes = [ctypes.c_uint32, vp, vp]
lib.clGetDeviceIDs.argtypes = [vp, ctypes.c_uint64, ctypes.c_uint32, vp, vp]
lib.clCreateContext.argtypes = [vp, ctypes.c_uint32, vp, vp, vp, vp]
lib.clCreateCommandQueueWithProperties.argtypes = [vp, vp, vp, vp]
n = ctypes.c_uint32()
plat = (vp * 4)()
assert lib.clGetPlatformIDs(4, plat, ctypes.byref(n)) == 0
t2 = time.perf_counter()
dev = vp()
assert lib.clGetDeviceIDs(plat[0], 0xFFFFFFFF, 1, ctypes.byref(dev), None) == 0
t3 = time.perf_counter()
err = ctypes.c_int32()
lib.clCreateContext.restype = vp
ctx = lib.clCreateContext(None, 1, ctypes.byref(dev), None, None, ctypes.byref(err))
assert err.value == 0, err.value
t4 = time.perf_counter()
lib.clCreateCommandQueueWithProperties.restype = vp
q = lib.clCreateCommandQueueWithProperties(ctx, dev, None, ctypes.byref(err))
assert err.value == 0, err.value
t5 = time.perf_counter()
print(json.dumps({"dlopen_ms": (t1-t0)*1e3, "platforms_ms": (t2-t1)*1e3, "devices_ms": (t3-t2)*1e3,
                  "context_ms": (t4-t3)*1e3, "queue_ms": (t5-t4)*1e3, "total_ms": (t5-t1)*1e3}))
"""


def _fresh(code: str, *args: str, repeat: int = 5) -> dict[str, float]:
    rows = []
    for _ in range(repeat):
        out = subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60
        )
        if out.returncode:
            return {"error": out.stderr.strip()[-500:]}  # type: ignore[dict-item]
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {k: round(statistics.median(r[k] for r in rows), 2) for k in rows[0]}


def _opencl_lib() -> str:
    import pyopencl

    # The wheel bundles its ICD loader (auditwheel): pyopencl/.libs or pyopencl.libs.
    here = os.path.dirname(pyopencl.__file__)
    for libs in (os.path.join(here, ".libs"), os.path.join(here, os.pardir, "pyopencl.libs")):
        for name in sorted(os.listdir(libs)) if os.path.isdir(libs) else []:
            if name.startswith("libOpenCL"):
                return os.path.abspath(os.path.join(libs, name))
    import ctypes.util

    return ctypes.util.find_library("OpenCL") or "libOpenCL.so.1"


def launch_costs() -> dict[str, object]:
    import ctypes

    import numpy as np
    import pyopencl as cl

    dev = [d for p in cl.get_platforms() for d in p.get_devices()][0]
    ctx = cl.Context([dev])
    q = cl.CommandQueue(ctx, dev)
    prg = cl.Program(
        ctx, "__kernel void k(__global float* x) { x[get_global_id(0)] += 1.0f; }"
    ).build()
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * 1024)
    k = cl.Kernel(prg, "k")
    k.set_arg(0, buf)
    res: dict[str, object] = {
        "device": dev.name,
        "driver": dev.driver_version,
        "version": dev.version,
    }
    exts = dev.extensions.split()
    res["extensions"] = exts
    g, l_ = (1024,), (128,)
    for _ in range(50):
        cl.enqueue_nd_range_kernel(q, k, g, l_)
    q.finish()
    n = 2000
    t = time.perf_counter()
    for _ in range(n):
        cl.enqueue_nd_range_kernel(q, k, g, l_)
    t_host = time.perf_counter() - t
    q.finish()
    t_wall = time.perf_counter() - t
    res["pyopencl_enqueue_us"] = t_host / n * 1e6
    res["pyopencl_wall_us_per_launch"] = t_wall / n * 1e6

    lib = ctypes.CDLL(_opencl_lib())
    fn = lib.clEnqueueNDRangeKernel
    vp = ctypes.c_void_p
    fn.argtypes = [vp, vp, ctypes.c_uint32, vp, vp, vp, ctypes.c_uint32, vp, vp]
    gs = (ctypes.c_size_t * 1)(1024)
    ls = (ctypes.c_size_t * 1)(128)
    qp, kp = vp(q.int_ptr), vp(k.int_ptr)
    q.finish()
    t = time.perf_counter()
    for _ in range(n):
        fn(qp, kp, 1, None, gs, ls, 0, None, None)
    t_host = time.perf_counter() - t
    q.finish()
    t_wall = time.perf_counter() - t
    res["ctypes_enqueue_us"] = t_host / n * 1e6
    res["ctypes_wall_us_per_launch"] = t_wall / n * 1e6

    # cl_khr_command_buffer
    if "cl_khr_command_buffer" in exts:
        try:
            res["command_buffer"] = _command_buffer(lib, dev, ctx, q, k)
        except Exception as exc:  # noqa: BLE001 - a probe reports what failed
            res["command_buffer"] = {"error": repr(exc)}
    out = np.empty(1024, np.float32)
    cl.enqueue_copy(q, out, buf)
    res["sanity_value"] = float(out[0])
    return res


def _command_buffer(
    lib: object, dev: object, ctx: object, q: object, k: object
) -> dict[str, object]:
    import ctypes

    vp = ctypes.c_void_p
    plat = vp(dev.platform.int_ptr)  # type: ignore[attr-defined]
    get = lib.clGetExtensionFunctionAddressForPlatform  # type: ignore[attr-defined]
    get.restype = vp
    get.argtypes = [vp, ctypes.c_char_p]

    def fn(name: str, restype: object, *argtypes: object) -> object:
        addr = get(plat, name.encode())
        if not addr:
            raise RuntimeError(f"{name} not found")
        return ctypes.CFUNCTYPE(restype, *argtypes)(addr)

    i32, u32 = ctypes.c_int32, ctypes.c_uint32
    create = fn("clCreateCommandBufferKHR", vp, u32, ctypes.POINTER(vp), vp, ctypes.POINTER(i32))
    record = fn("clCommandNDRangeKernelKHR", i32, vp, vp, vp, vp, u32, vp, vp, vp, u32, vp, vp, vp)
    finalize = fn("clFinalizeCommandBufferKHR", i32, vp)
    enqueue = fn("clEnqueueCommandBufferKHR", i32, u32, ctypes.POINTER(vp), vp, u32, vp, vp)
    err = i32()
    qs = (vp * 1)(q.int_ptr)  # type: ignore[attr-defined]
    # CL_COMMAND_BUFFER_FLAGS_KHR = CL_COMMAND_BUFFER_SIMULTANEOUS_USE_KHR, if allowed.
    props = (ctypes.c_uint64 * 3)(0x1293, 1, 0)
    cb = create(1, qs, props, ctypes.byref(err))
    simultaneous = err.value == 0
    if not simultaneous:
        cb = create(1, qs, None, ctypes.byref(err))
    if err.value:
        return {"error": f"clCreateCommandBufferKHR {err.value}"}
    gs = (ctypes.c_size_t * 1)(1024)
    ls = (ctypes.c_size_t * 1)(128)
    for _ in range(100):
        e = record(vp(cb), None, None, vp(k.int_ptr), 1, None, gs, ls, 0, None, None, None)  # type: ignore[attr-defined]
        if e:
            return {"error": f"clCommandNDRangeKernelKHR {e}"}
    e = finalize(vp(cb))
    if e:
        return {"error": f"clFinalizeCommandBufferKHR {e}"}
    for _ in range(5):
        enqueue(0, None, vp(cb), 0, None, None)
        q.finish()  # type: ignore[attr-defined]
    n = 50
    t_host = 0.0
    t = time.perf_counter()
    for _ in range(n):
        t1 = time.perf_counter()
        e = enqueue(0, None, vp(cb), 0, None, None)
        t_host += time.perf_counter() - t1
        if e:
            return {"error": f"clEnqueueCommandBufferKHR {e}"}
        if not simultaneous:
            q.finish()  # type: ignore[attr-defined]
    q.finish()  # type: ignore[attr-defined]
    t_wall = time.perf_counter() - t
    return {
        "launches_per_buffer": 100,
        "simultaneous_use": simultaneous,
        "enqueue_us_per_buffer": t_host / n * 1e6,
        "wall_us_per_launch": t_wall / n / 100 * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    res: dict[str, object] = {"icd_vendors": os.environ.get("OCL_ICD_VENDORS", "")}
    res["floor_pyopencl"] = _fresh(_FLOOR_PYOPENCL)
    res["floor_ctypes"] = _fresh(_FLOOR_CTYPES, _opencl_lib())
    res["launch"] = launch_costs()
    text = json.dumps(res, indent=1)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
