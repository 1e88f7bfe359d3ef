"""``litekiln bench``: start-up time (cold vs warm) and warm latency against LiteRT.

Never imports TVM itself: a warm start-up bench and the latency bench run on a runtime-only
install (the GPU machine), over a cache compiled elsewhere. Only a cold start-up without
``--warm-only`` compiles, and it does so in a child process.

Start-up (``litekiln bench --startup MODEL...``), each figure the median over ``--repeat``
fresh processes (``python -m litekiln.bench _child``). The clock starts before the child
imports ``litekiln.interpreter`` (numpy, pyopencl and litekiln's runtime: the ``imports``
column) and stops when the first ``run`` has returned its outputs to the host. Inside the
clock, in the columns of `STEPS`: the imports, reading and parsing the model file, opening the
OpenCL device (context creation, overlapped with the parse), the cache lookup, compiling
(cold), building the device program, allocating and uploading constants, binding kernels, and
the first inference with its copies. Outside: Python's own start and the generation of the
random inputs. (Before the breakdown, 2026-11-25, the clock started after the imports: older
figures in docs/benchmarks.md are lower by the imports.)

* ``cold``: empty private cache directory, and the driver's compiled-kernel caches off
  (``CUDA_CACHE_DISABLE=1``, ``POCL_KERNEL_CACHE=0``): TVM compile, device build from source.
  With ``--warm-only`` (no TVM here; ``--cache-dir`` holds models compiled on another machine)
  the child starts from a copy of that cache without any device binaries, so the compile is
  the one thing not measured here: ``cold_estimate_ms`` adds the compile time the compiler
  recorded in the cached artifact (measured on the build machine).
* ``shipped``: the litekiln cache holds the model and this device's program binary, the
  driver's cache is still off: what an app sees on its first launch with a shipped cache.
* ``warm``: second and later processes: litekiln cache hit, driver caches allowed (one
  untimed process primes the driver's cache first).

Latency (``litekiln bench MODEL...``): in one process, litekiln's ``Interpreter.run`` (inputs
in, outputs back on the host), LiteRT's CPU interpreter (XNNPACK, ``os.cpu_count()`` threads)
and, where it loads, LiteRT's GPU path (``CompiledModel`` with GPU|CPU accelerators), each the
median of ``--runs`` timed runs after warm-up, on the same seeded inputs. Speed-ups are
``peer_ms / litekiln_ms`` (above 1: litekiln is faster). Also the host cost of enqueueing one
kernel launch and, with ``--profile``, every kernel's device time from OpenCL profiling events
and the model's roofline: each launch's bytes and FLOPs, the rates it reaches, and the floor
its launches allow at the device's peaks (measured in the same run, `litekiln.runtime.roofline`).
LiteRT's own C++ logging (TFLite, absl, Dawn's Vulkan/WebGPU start-up: some 30 lines per
model) is held back while it runs (`peer_logs`) unless ``litekiln -v``; what it said is used to
explain a peer that fails (e.g. no GPU adapter).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from litekiln.errors import LitekilnError
from litekiln.peers.timing import time_runs
from litekiln.runtime.profile import DRIVER_CACHES_OFF

_CHILD = "_child"
_MARK = "LITEKILN_BENCH_RESULT "
#: Environment of a process whose driver may not reuse compiled kernels from earlier runs.
_DRIVER_CACHE_OFF = DRIVER_CACHES_OFF
_CHILD_TIMEOUT_S = 900


# ---------------------------------------------------------------------------------- helpers


def _command_line() -> str:
    """The command as typed, as far as it can be rebuilt (for the JSON record)."""
    prog = Path(sys.argv[0]).name if sys.argv else "litekiln"
    if prog in ("cli.py", "__main__.py"):
        prog = "python -m litekiln.cli"
    return " ".join([prog, shlex.join(sys.argv[1:])]).strip()


def _model_name(path: str) -> str:
    return Path(path).stem


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _ms(s: float | None, digits: int = 3) -> float | None:
    return None if s is None else round(s * 1e3, digits)


def _ratio(a: float, b: float) -> float:
    """a / b to 4 significant digits (speed-ups span 1e-3 on PoCL to 1e1)."""
    return float(f"{a / b:.4g}")


def _fmt(x: float | None, spec: str = "8.2f") -> str:
    if x is None:
        return f"{'n/a':>{int(spec.split('.')[0] or 0)}s}"
    return format(x, spec)


@contextlib.contextmanager
def peer_logs(quiet: bool = True) -> Iterator[list[str]]:
    """Hold back what LiteRT, TFLite, absl and Dawn (Vulkan/WebGPU) log while inside.

    Their C++ logging writes to file descriptor 2 directly, below Python's ``sys.stderr`` and
    regardless of ``TF_CPP_MIN_LOG_LEVEL`` for most of it, so fd 2 points at a temporary file
    for the duration. Objects the block dropped are collected before it ends, so that their
    destructors' lines are held back too.

    Args:
        quiet: False (``litekiln -v``) leaves fd 2 alone.

    Yields:
        A list that holds the lines logged once the block has ended (also when it raised),
        for an error message (`peer_error`); empty when not ``quiet``.
    """
    lines: list[str] = []
    if not quiet:
        yield lines
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield lines
        finally:
            gc.collect()
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            lines.extend(capture.read().decode(errors="replace").splitlines())


#: A C++ log line's prefix: LiteRT's ``ERROR: [file.cc:12] ``, absl's
#: ``E0000 00:00:17.84 28776 file.cc:736] ``, Dawn's ``Warning: ``.
_LOG_PREFIX = re.compile(
    r"^(?:(?:ERROR|WARNING|INFO):\s*(?:\[[^\]]*\]\s*)?|[EWIF]\d{4} [^\]]*\]\s*|Warning:\s*)"
)
_FAILURE = re.compile(r"^(?:ERROR:|E\d{4} )")


def peer_error(exc: tuple[str, str], lines: list[str]) -> str:
    """One line for a peer library's failure: the first error it logged (with its source
    location dropped), else the first line of its exception that says more than a location.

    Args:
        exc: the exception's type name and text (not the exception: its traceback would keep
            the peer's objects alive past `peer_logs`, whose destructors log).
        lines: what the peer logged (`peer_logs`).
    """
    said = [_LOG_PREFIX.sub("", ln).strip() for ln in lines if _FAILURE.match(ln)]
    own = [_LOG_PREFIX.sub("", ln.strip(" └")).strip() for ln in exc[1].splitlines()]
    why = next((x for x in said + own if x), "")
    return f"{exc[0]}: {why}"[:300]


def _write_json(results: dict[str, Any], a: Any) -> None:
    text = json.dumps(results, indent=2)
    if getattr(a, "out", None):
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text + "\n")
    if getattr(a, "json", False):
        print(text)


# ---------------------------------------------------------------------------------- start-up


#: The child's first lines, run with ``python -c``: the import clock starts before any of
#: litekiln (numpy and pyopencl included) is imported.
_CHILD_CODE = (
    "import sys, time; _t0 = time.perf_counter(); "
    "from litekiln.interpreter import Interpreter; _t1 = time.perf_counter(); "
    "import litekiln.bench as b; b._child_main(sys.argv[1], _t1 - _t0)"
)
#: The bare driver start, in a fresh process: import pyopencl, find the device, make a context.
_DRIVER_CODE = (
    "import sys, time; t0 = time.perf_counter(); import pyopencl as cl; t1 = time.perf_counter(); "
    "from litekiln.runtime.device import list_devices, select_device; "
    "h = select_device(sys.argv[1] or None); t2 = time.perf_counter(); "
    "print('" + "LITEKILN_BENCH_RESULT " + '\' + \'{"import_s": %r, "context_s": %r}\' '
    "% (t1 - t0, t2 - t1))"
)
#: The bare CUDA driver start, in a fresh process: import numpy (which any start of litekiln's
#: or LiteRT's imports), then load libcuda, cuInit, and make the first GPU's primary context
#: current, as a `CudaStart` does.
_CUDA_DRIVER_CODE = (
    "import sys, time, json; t0 = time.perf_counter(); import numpy; t1 = time.perf_counter(); "
    "import ctypes; lib = ctypes.CDLL('libcuda.so.1'); assert lib.cuInit(0) == 0; "
    "d = ctypes.c_int(); assert lib.cuDeviceGet(ctypes.byref(d), 0) == 0; "
    "c = ctypes.c_void_p(); assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(c), d) == 0; "
    "assert lib.cuCtxSetCurrent(c) == 0; t2 = time.perf_counter(); "
    "print('" + "LITEKILN_BENCH_RESULT " + "' + json.dumps({'numpy_s': t1 - t0, "
    "'context_s': t2 - t1}))"
)
#: LiteRT's GPU path started in a fresh process (the peer of a first start): import LiteRT,
#: ``CompiledModel`` with the GPU accelerator (its shaders compiled there), one run on zeros
#: with the outputs read back. Kept apart from litekiln: nothing of ours is imported.
_LITERT_GPU_CODE = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
from ai_edge_litert.compiled_model import CompiledModel
from ai_edge_litert.hardware_accelerator import HardwareAccelerator as HA
t1 = time.perf_counter()
cm = CompiledModel.from_file(sys.argv[1], hardware_accel=HA.GPU | HA.CPU)
ins, outs = cm.create_input_buffers(0), cm.create_output_buffers(0)
t2 = time.perf_counter()
for b in ins:
    d = b.get_tensor_details()
    b.write(np.zeros([int(x) for x in d["shape"]], np.dtype(d["dtype"])))
cm.run_by_index(0, ins, outs)
for b in outs:
    d = b.get_tensor_details()
    b.read(int(np.prod([int(x) for x in d["shape"]])), np.dtype(d["dtype"]))
t3 = time.perf_counter()
print("LITEKILN_BENCH_RESULT " + json.dumps({
    "imports_s": t1 - t0, "init_s": t2 - t1, "first_run_s": t3 - t2, "total_s": t3 - t0,
    "fully_accelerated": bool(cm.is_fully_accelerated())}))
"""
#: The start-up steps a child reports (seconds), in order; they add up to ``total_s``.
STEPS = ("imports", "parse", "device", "cache_read", "build", "setup", "first_run")


def _child_main(spec_json: str, imports_s: float) -> None:
    print(_MARK + json.dumps(_child(json.loads(spec_json), imports_s)), flush=True)


def _child(spec: dict[str, Any], imports_s: float = 0.0) -> dict[str, Any]:
    """One start-up measurement, in a fresh process (see the module docstring)."""
    from litekiln.interpreter import Interpreter

    t0 = time.perf_counter()
    interp = Interpreter(model_path=spec["model"], cache_dir=spec["cache_dir"], **spec["kwargs"])
    t1 = time.perf_counter()
    inputs = interp.random_inputs(0)  # not timed
    t2 = time.perf_counter()
    interp.allocate_tensors()
    t3 = time.perf_counter()
    outs = interp.run(inputs)
    t4 = time.perf_counter()
    sess = interp._backend
    stats = getattr(getattr(sess, "compiled", None), "stats", {}) or {}
    load_s = float(getattr(sess, "load_seconds", 0.0))
    st = dict(getattr(sess, "startup", {}) or {})
    steps = {
        "imports_s": imports_s,
        "parse_s": t1 - t0,  # read + parse the model file (the device opens meanwhile)
        "device_s": st.get("device_s", 0.0),  # waiting for the driver and context
        "cache_read_s": st.get("cache_read_s", 0.0),  # compiled model (or compiling it)
        "build_s": st.get("build_s", 0.0),  # programs from binaries or built from source
        "first_run_s": t4 - t3,
    }
    # buffers, constants, kernel arguments and whatever else allocate_tensors did
    steps["setup_s"] = max(
        0.0, (t3 - t2) - steps["device_s"] - steps["cache_read_s"] - steps["build_s"]
    )
    sess.wait_for_graph()  # (not timed) what a first start stores after its first inference
    # A first start that ran on the CPU while the device built (`Session._cpu_first`): when
    # the device took over, on the same clock as ``total_s``.
    ready_at = (getattr(sess, "startup", {}) or {}).get("device_ready_at")
    return {
        "cpu_first": bool(st.get("cpu_first")),
        "device_ready_s": imports_s + (t1 - t0) + (ready_at - t2) if ready_at else None,
        **steps,
        "total_s": imports_s + (t1 - t0) + (t4 - t2),
        "construct_s": t1 - t0,
        "open_s": (t3 - t2) - load_s,  # device wait, cache lookup, compile
        "load_s": load_s,  # device program build (binary or source), buffers, constants
        "compile_s_recorded": (stats.get("timings_s") or {}).get("total"),
        "kernels": stats.get("kernels"),
        "tvm_imported": sys.modules.get("tvm") is not None,
        "device": str(getattr(sess, "device_name", "")),
        "checksum": float(sum(np.abs(o.astype(np.float64)).sum() for o in outs)),
        "cache": {
            "model": bool(st.get("model_cached")),
            "binaries": f"{st.get('binaries', 0)}/{st.get('partitions', 0)}",
            # partitions whose first start ran the shipped PTX (NVIDIA: no OpenCL build)
            "ptx": f"{st.get('ptx', 0)}/{st.get('partitions', 0)}",
            "tuning": f"{st.get('tuning', 0)}/{st.get('variants', 0)}",
            # opened through CUDA alone, every partition a verified graph (no OpenCL)
            "cuda_start": bool(st.get("cuda_start")),
        },
    }


def _spawn(
    model: str, cache_dir: str, kwargs: dict[str, Any], *, driver_cache: bool
) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("LITEKILN_NO_CACHE", None)
    for k in _DRIVER_CACHE_OFF:
        env.pop(k, None)
    if not driver_cache:
        env.update(_DRIVER_CACHE_OFF)
    spec = {"model": model, "cache_dir": cache_dir, "kwargs": kwargs}
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-c", _CHILD_CODE, json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=_CHILD_TIMEOUT_S,
        check=False,
    )
    wall = time.perf_counter() - t0
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(_MARK)]
    if p.returncode != 0 or not lines:
        tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-15:])
        raise LitekilnError(f"start-up child for {model} failed (exit {p.returncode}):\n{tail}")
    r: dict[str, Any] = json.loads(lines[-1][len(_MARK) :])
    r["process_s"] = wall
    return r


def startup_process(
    path: str, cache_dir: str, kwargs: dict[str, Any] | None = None, *, driver_cache: bool
) -> dict[str, Any]:
    """One start-up measurement in a fresh process (the clock of the module docstring).

    Args:
        path: the .tflite file.
        cache_dir: the litekiln cache the process uses (empty: a cold start).
        kwargs: Interpreter keyword arguments (device, precision, ...; no cache_dir).
        driver_cache: let the OpenCL driver reuse (and keep) its compiled kernels.

    Returns:
        Seconds: ``total_s`` and its parts (``construct_s``, ``open_s``, ``load_s``,
        ``first_run_s``), ``process_s``; ``compile_s_recorded`` and ``kernels`` of the
        compiled model; the device; whether TVM was imported; an output checksum.

    Raises:
        LitekilnError: the process failed (its stderr is in the message).
    """
    return _spawn(path, cache_dir, kwargs or {}, driver_cache=driver_cache)


def _checksums_agree(sums: list[float], rel: float = 1e-5) -> bool:
    """Whether output checksums (sums of |output|) agree to ``rel`` of the largest."""
    return max(sums) - min(sums) <= rel * max(1.0, max(abs(x) for x in sums))


def _strip_binaries(cache_dir: str) -> int:
    """Drop every device-program binary and device record (tuning choices) from a cache copy:
    what a plain `litekiln compile` leaves, the compiled models and the constants they share
    (dropping those made every model whose entry shares one a miss)."""
    from litekiln.cache.store import CacheStore

    store = CacheStore.open(cache_dir)
    n = 0
    for s in store.ls():
        if s.kind in ("program", "device") and store.delete(s.key):
            n += 1
    store.close()
    return n


def _summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    keys: tuple[str, ...] = ("total_s", "construct_s", "open_s", "load_s", "process_s")
    keys += tuple(f"{k}_s" for k in STEPS)
    out: dict[str, Any] = {
        k[: -len("_s")] + "_ms": _ms(_median([s[k] for s in samples])) for k in keys
    }
    if samples:
        out["cache"] = samples[-1]["cache"]  # what the cache held (the same in every sample)
        # first outputs from the CPU while the device built (`Session._cpu_first`), and when
        # the device took over
        out["cpu_first"] = sum(1 for s in samples if s.get("cpu_first"))
        ready = [s["device_ready_s"] for s in samples if s.get("device_ready_s") is not None]
        out["device_ready_ms"] = _ms(_median(ready)) if ready else None
    return out


def _children(
    code: str, arg: str, repeat: int, env: dict[str, str] | None = None
) -> list[dict[str, Any]] | str:
    """Run ``python -c code arg`` ``repeat`` times, each a fresh process; the JSON each printed
    after `_MARK`, or why one failed (its exit status and last words, logging left out)."""
    runs = []
    for _ in range(max(1, repeat)):
        p = subprocess.run(
            [sys.executable, "-c", code, arg],
            env=env,
            capture_output=True,
            text=True,
            timeout=_CHILD_TIMEOUT_S,
            check=False,
        )
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith(_MARK)]
        if p.returncode != 0 or not lines:
            said = [ln for ln in (p.stderr or p.stdout).splitlines() if ln.strip()]
            tail = [ln for ln in said if not ln.startswith(("INFO:", "W0000", "I0000"))][-2:]
            return f"exit {p.returncode}: " + " / ".join(tail or said[-2:])
        runs.append(json.loads(lines[-1][len(_MARK) :]))
    return runs


def driver_floor(device: str | None, repeat: int) -> dict[str, Any]:
    """The bare driver start in fresh processes (median): importing pyopencl, and opening the
    device (platforms, device, context, queue) as litekiln does; the floor of any start."""
    runs = _children(_DRIVER_CODE, device or "", repeat)
    if isinstance(runs, str):
        raise LitekilnError(f"driver start-up child failed: {runs}")
    out: dict[str, Any] = {
        f"{k[: -len('_s')]}_ms": _ms(_median([r[k] for r in runs]))
        for k in ("import_s", "context_s")
    }
    out["total_ms"] = _ms(_median([r["import_s"] + r["context_s"] for r in runs]))
    cuda = _children(_CUDA_DRIVER_CODE, "", repeat) if _has_cuda() else "no libcuda.so.1"
    out["cuda"] = (
        {"error": cuda}
        if isinstance(cuda, str)
        else {
            "numpy_ms": _ms(_median([r["numpy_s"] for r in cuda])),
            "context_ms": _ms(_median([r["context_s"] for r in cuda])),
            "total_ms": _ms(_median([r["numpy_s"] + r["context_s"] for r in cuda])),
        }
    )
    return out


def _has_cuda() -> bool:
    import ctypes.util

    return ctypes.util.find_library("cuda") is not None or os.path.exists("/usr/lib/libcuda.so.1")


def litert_gpu_start(path: str, repeat: int) -> dict[str, Any]:
    """LiteRT's GPU path started in fresh processes with the drivers' caches off (median):
    import, ``CompiledModel`` creation (shader compilation included) and the first run.

    Returns:
        ``total_ms``, ``imports_ms``, ``init_ms``, ``first_run_ms``, ``fully_accelerated``;
        or ``error`` where LiteRT's GPU path does not start here.
    """
    runs = _children(_LITERT_GPU_CODE, path, repeat, {**os.environ, **_DRIVER_CACHE_OFF})
    if isinstance(runs, str):
        return {"error": runs}
    out: dict[str, Any] = {
        f"{k}_ms": _ms(_median([r[f"{k}_s"] for r in runs]))
        for k in ("total", "imports", "init", "first_run")
    }
    out["fully_accelerated"] = all(r["fully_accelerated"] for r in runs)
    out["samples_ms"] = [_ms(r["total_s"]) for r in runs]
    return out


def startup_model(
    path: str,
    kwargs: dict[str, Any],
    *,
    repeat: int,
    warm_only: bool,
    cache_dir: str | None,
    progress: bool = True,
    cold_repeat: int | None = None,
    shipped: bool = True,
    litert_gpu: bool = False,
) -> dict[str, Any]:
    """Cold, shipped and warm start-up of one model (see the module docstring).

    Args:
        path: the .tflite file.
        kwargs: Interpreter keyword arguments (device, precision, ...; no cache_dir).
        repeat: fresh processes per measurement.
        cold_repeat: fresh processes for the cold and shipped measurements, which can take
            seconds each (default: ``repeat``).
        shipped: also measure the shipped start (False: ``shipped_ms`` is None).
        litert_gpu: also start LiteRT's GPU path on the model, with the drivers' caches off
            (`litert_gpu_start`): the peer of the ``compiled`` case.
        warm_only: start cold runs from a binary-free copy of ``cache_dir`` instead of an
            empty cache (no compiler here).
        cache_dir: the prebuilt cache (``warm_only``); otherwise unused.

    Returns:
        A JSON-ready record; times in milliseconds.

    Raises:
        LitekilnError: a child failed (its stderr is in the message), or ``warm_only``
            without ``cache_dir``.
    """
    if warm_only and not cache_dir:
        raise LitekilnError(
            "--warm-only needs --cache-dir: the cache compiled on the build machine"
        )
    name = _model_name(path)
    root = tempfile.mkdtemp(prefix=f"litekiln-bench-{name}-")
    try:
        cold: list[dict[str, Any]] = []
        stripped = 0
        work = ""
        slow_repeat = max(1, repeat if cold_repeat is None else cold_repeat)
        for r in range(slow_repeat):
            work = os.path.join(root, f"cold{r}")
            if warm_only:
                shutil.copytree(cache_dir, work)  # type: ignore[arg-type]
                os.chmod(work, 0o700)
                stripped = _strip_binaries(work)
            cold.append(_spawn(path, work, kwargs, driver_cache=False))
            if progress:
                print(f"  {name}: cold {cold[-1]['total_s'] * 1e3:.0f} ms", file=sys.stderr)
        # `work` now holds the model and this device's binary (written by the last cold run).
        # `compiled`: what `litekiln compile` leaves (the model, no device binary), driver
        # cache off: an app's first start on a new device (in warm-only mode: the cold runs).
        compiled: list[dict[str, Any]] = []
        for r in range(0 if warm_only else slow_repeat):
            plain = os.path.join(root, f"compiled{r}")
            shutil.copytree(work, plain)
            os.chmod(plain, 0o700)
            _strip_binaries(plain)
            compiled.append(_spawn(path, plain, kwargs, driver_cache=False))
            if progress:
                print(f"  {name}: compiled {compiled[-1]['total_s'] * 1e3:.0f} ms", file=sys.stderr)
        shipped_runs = [
            _spawn(path, work, kwargs, driver_cache=False)
            for _ in range(slow_repeat if shipped else 0)
        ]
        prime = _spawn(path, work, kwargs, driver_cache=True)
        warm = [_spawn(path, work, kwargs, driver_cache=True) for _ in range(max(1, repeat))]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    cs, ss, ws = _summary(cold), _summary(shipped_runs), _summary(warm)
    ps = _summary(compiled if compiled else cold)
    cold_ms, warm_ms = cs["total_ms"], ws["total_ms"]
    compile_s = cold[-1].get("compile_s_recorded")
    rec: dict[str, Any] = {
        "model": name,
        "path": path,
        "device": warm[-1]["device"],
        "kernels": warm[-1].get("kernels"),
        "cold_ms": cold_ms,
        "shipped_ms": ss["total_ms"],
        "warm_ms": warm_ms,
        "warm_vs_cold_pct": round(100.0 * warm_ms / cold_ms, 2) if cold_ms else None,
        "compiled_ms": ps["total_ms"],
        "cold_breakdown": cs,
        "compiled_breakdown": ps,
        "shipped_breakdown": ss,
        "warm_breakdown": ws,
        "compile_s_recorded": compile_s,
        "cold_compiled_here": any(c["tvm_imported"] for c in cold),
        "warm_imported_tvm": any(w["tvm_imported"] for w in warm + shipped_runs + [prime]),
        # Every start's outputs, summed: the same up to rounding (a first start on NVIDIA runs
        # the shipped PTX's kernels, the next ones NVIDIA's OpenCL build of the same TIR).
        "outputs_agree": _checksums_agree([s["checksum"] for s in cold + shipped_runs + warm]),
        "samples_ms": {
            "cold": [_ms(s["total_s"]) for s in cold],
            "compiled": [_ms(s["total_s"]) for s in compiled or cold],
            "shipped": [_ms(s["total_s"]) for s in shipped_runs],
            "prime": _ms(prime["total_s"]),
            "warm": [_ms(s["total_s"]) for s in warm],
        },
    }
    if litert_gpu:
        peer = litert_gpu_start(path, slow_repeat)
        rec["litert_gpu"] = peer
        first = rec["compiled_ms"]
        if peer.get("total_ms") and first:
            rec["first_start_vs_litert_gpu"] = round(first / peer["total_ms"], 3)
        if progress:
            print(f"  {name}: LiteRT GPU start {peer.get('total_ms', peer.get('error'))} ms",
                  file=sys.stderr)  # fmt: skip
    if warm_only:
        rec["binaries_dropped_for_cold"] = stripped
        est = cold_ms + compile_s * 1e3 if (cold_ms is not None and compile_s is not None) else None
        rec["cold_estimate_ms"] = round(est, 3) if est is not None else None
        rec["warm_vs_cold_estimate_pct"] = round(100.0 * warm_ms / est, 2) if est else None
    return rec


def startup_main(a: Any, kwargs: dict[str, Any]) -> int:
    """``litekiln bench --startup``: cold vs warm start-up in fresh processes.

    Args:
        a: the command's options (models, repeat, warm_only, cache_dir, json, out).
        kwargs: the Interpreter's keyword arguments the options stand for.
    """
    if getattr(a, "no_cache", False):
        raise LitekilnError("--startup measures the cache: drop --no-cache")
    warm_only = bool(getattr(a, "warm_only", False))
    kwargs = dict(kwargs)
    kwargs.pop("cache_dir", None)
    if kwargs.get("device") == "reference":
        raise LitekilnError(
            "--startup measures the OpenCL path; --device reference has no start-up to speak of"
        )
    results: dict[str, Any] = {
        "device": None,
        "command": _command_line(),
        "mode": "warm-only" if warm_only else "full",
        "repeat": a.repeat,
        "cold_repeat": getattr(a, "cold_repeat", None) or a.repeat,
        "host": platform.node(),
        "python": platform.python_version(),
        "clock": "Interpreter(model_path=...) to the first run's outputs on the host; litekiln "
        "and numpy imported before; median over fresh processes",
        "models": [],
        "steps": "imports (litekiln, numpy, pyopencl), parse (model file; the device opens "
        "meanwhile), device (waiting for the driver and context), cache_read (compiled model; "
        "cold: compiling it), build (device programs: from binaries or from source), setup "
        "(buffers, constants, kernel arguments), first_run (first inference, outputs on the "
        "host); total = their sum",
    }
    results["driver_floor"] = driver_floor(kwargs.get("device"), a.repeat)
    for path in a.models:
        rec = startup_model(
            path,
            kwargs,
            repeat=a.repeat,
            warm_only=warm_only,
            cache_dir=getattr(a, "cache_dir", None),
            progress=not a.json,
            litert_gpu=bool(getattr(a, "litert_gpu", False)),
            cold_repeat=getattr(a, "cold_repeat", None),
        )
        results["device"] = results["device"] or rec["device"]
        floor, cuda = results["driver_floor"], results["driver_floor"]["cuda"]
        if rec.get("warm_ms") is not None:  # the issue's measure: warm start over the floor
            if floor.get("total_ms") is not None:
                rec["warm_over_opencl_floor_ms"] = round(rec["warm_ms"] - floor["total_ms"], 3)
            if cuda.get("total_ms") is not None:
                rec["warm_over_cuda_floor_ms"] = round(rec["warm_ms"] - cuda["total_ms"], 3)
        results["models"].append(rec)
        if getattr(a, "out", None):
            _write_json(results, argparse_like(out=a.out))  # partial results survive a crash
    if not a.json:
        _print_startup(results)
    _write_json(results, a)
    return 0


def argparse_like(**kw: Any) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(**kw)


def _print_startup(results: dict[str, Any]) -> None:
    warm_only = results["mode"] == "warm-only"
    print(
        f"start-up on {results['device']} ({results['mode']}, "
        f"median of {results['repeat']} processes)"
    )
    head = f"{'model':28s} {'case':9s} {'total ms':>9s} |"
    head += "".join(f" {k.replace('_', ' ')[:9]:>9s}" for k in STEPS)
    head += " | cache held (model, binaries, tuning, PTX used, CUDA start)"
    head += " | CPU first: device ready ms"
    print(head)
    cases = ("cold", "compiled", "shipped", "warm")
    for m in results["models"]:
        for case in cases:
            b = m.get(f"{case}_breakdown") or {}
            if b.get("total_ms") is None or (case == "compiled" and warm_only):
                continue
            c = b.get("cache", {})
            line = f"{m['model']:28s} {case:9s} {_fmt(b['total_ms'], '9.1f')} |"
            line += "".join(f" {_fmt(b.get(f'{k}_ms'), '9.1f')}" for k in STEPS)
            line += (
                f" | {'yes' if c.get('model') else 'no'}, {c.get('binaries')}, {c.get('tuning')}, "
                f"{c.get('ptx')}, {'yes' if c.get('cuda_start') else 'no'}"
            )
            if b.get("cpu_first"):
                line += f" | {_fmt(b.get('device_ready_ms'), '.1f')}"
            print(line)
        if m["warm_imported_tvm"]:
            print(f"  WARNING: a warm start of {m['model']} imported TVM")
        if not m["outputs_agree"]:
            print(f"  WARNING: {m['model']}: outputs differ between processes")
        peer = m.get("litert_gpu")
        if peer:
            first = (m.get("compiled_breakdown") or {}).get("total_ms")
            print(
                f"{m['model']:28s} {'LiteRT GPU':9s} "
                + (
                    f"{_fmt(peer['total_ms'], '9.1f')} | imports {_fmt(peer['imports_ms'], '.1f')}"
                    f", init {_fmt(peer['init_ms'], '.1f')}, first run "
                    f"{_fmt(peer['first_run_ms'], '.1f')}; litekiln's first start "
                    f"{_fmt(first, '.1f')} ms = {_fmt(m.get('first_start_vs_litert_gpu'), '.2f')}x"
                    if "total_ms" in peer
                    else f"did not start: {peer['error']}"
                )
            )
    f = results.get("driver_floor") or {}
    print(
        f"driver floor (fresh process): import pyopencl {_fmt(f.get('import_ms'), '.1f')} ms, "
        f"device and context {_fmt(f.get('context_ms'), '.1f')} ms"
    )
    cu = f.get("cuda") or {}
    if "total_ms" in cu:
        print(
            f"CUDA floor (fresh process): import numpy {_fmt(cu['numpy_ms'], '.1f')} ms, cuInit "
            f"and context {_fmt(cu['context_ms'], '.1f')} ms"
        )
    for m in results["models"]:
        w = m.get("warm_ms")
        if w is None:
            continue
        over = [f"{w - f['total_ms']:+.1f} ms over the OpenCL floor"] if f.get("total_ms") else []
        if "total_ms" in cu:
            over.append(f"{w - cu['total_ms']:+.1f} ms over the CUDA floor")
        print(f"{m['model']:28s} warm {w:.1f} ms: " + ", ".join(over))
    print(
        "cold: empty cache, driver cache off; compiled: what `litekiln compile` stores (no "
        "device binary), driver cache off: a first start on a new device; shipped: cache with "
        "this device's binary, driver cache off; warm: both caches hot. CPU first: a start "
        "that builds from source gives its first outputs from the CPU (numpy) while the "
        "device's programs build; the device takes over when ready (LITEKILN_CPU_FIRST=off: "
        "it waits)."
    )
    if warm_only:
        print(
            "warm-only: cold = device part only (no compiler here); the compile time recorded "
            "on the build machine is cold_estimate_ms in the JSON."
        )


# ---------------------------------------------------------------------------------- latency


def _launch_overhead(sess: Any, reps: int = 50) -> dict[str, Any] | None:
    """Host time of the enqueue loop alone (no waiting), per launch."""
    executors = getattr(sess, "executors", None)
    if not executors:
        return None
    launches = sum(ex.num_launches for ex in executors)
    if not launches:
        return {"launches": 0}
    total = 0.0
    for _ in range(reps):
        for ex in executors:
            ex.finish()
        t0 = time.perf_counter()
        for ex in executors:
            ex.run()
        total += time.perf_counter() - t0
        for ex in executors:
            ex.finish()
    per_inference = total / reps
    return {
        "launches": launches,
        "enqueue_ms_per_inference": round(per_inference * 1e3, 4),
        "enqueue_us_per_launch": round(per_inference / launches * 1e6, 3),
        "launch_path": sorted({type(ex).__name__ for ex in executors}),
    }


def _host_breakdown(
    interp: Any, inputs: dict[int, np.ndarray], reps: int = 50
) -> dict[str, Any] | None:
    """Where one warm inference's time goes (medians over ``reps`` runs, ms): the GPU
    partitions' inputs staged, launches, wait and outputs read back; the ops on the CPU; the
    rest of `Interpreter.run` (input checks, the copies `get_tensor` returns)."""
    sess = getattr(interp, "_backend", None)
    if sess is None or not hasattr(sess, "step_times"):
        return None
    kinds = ("gpu_inputs", "gpu_launch", "gpu_outputs", "cpu")
    per: dict[str, list[float]] = {k: [] for k in (*kinds, "other")}
    try:
        for _ in range(reps):
            sess.step_times = []
            t0 = time.perf_counter()
            interp.run(inputs)
            total = time.perf_counter() - t0
            sums = dict.fromkeys(kinds, 0.0)
            for kind, _, t in sess.step_times:
                sums[kind] += t
            for k in kinds:
                per[k].append(sums[k])
            per["other"].append(total - sum(sums.values()))
    finally:
        sess.step_times = None
    names = {
        "gpu_inputs": "inputs_ms",
        "gpu_launch": "launch_ms",
        "gpu_outputs": "wait_outputs_ms",
        "cpu": "cpu_ops_ms",
        "other": "other_ms",
    }
    return {names[k]: round(statistics.median(v) * 1e3, 4) for k, v in per.items()}


def _kernel_profile(sess: Any, reps: int = 10) -> dict[str, Any] | None:
    """Median device time of each launch, from OpenCL profiling events (CUDA events on the
    graph path), with the bytes of its buffer arguments and its FLOPs (the compiler's
    count), and the rates they make (GB/s, GFLOP/s). On the CUDA graph path, where torch
    with CUDA imports, also each launch's own time inside the replayed graph (``graph_ms``,
    CUPTI: `litekiln.peers.kernel_trace`; the events count each launch's overhead too) and
    the rates and floors by it."""
    executors = getattr(sess, "executors", None)
    if not executors:
        return None
    per: list[list[float]] = []
    names: list[tuple[int, int, Any, int]] = []
    options: list[str] = []
    timed: list[list[float] | None] = []
    in_graph: list[float | None] = []
    why_not: set[str] = set()
    for pi, ex in enumerate(executors):
        ex.profile()  # warm the profiling queue
        runs = [ex.profile() for _ in range(reps)]
        for li, launch in enumerate(ex.program.plan(ex.choices)):
            names.append((pi, li, launch, ex.program.launch_bytes(launch)))
            per.append([r[li] for r in runs])
        options += _chosen_options(ex.program, list(ex.choices))
        timed += _timed_options(ex.program, list(ex.choices), getattr(ex, "tuning_ms", []))
        traced: list[float] | str = "not a CUDA graph"
        if hasattr(ex, "graph_time"):
            from litekiln.peers.kernel_trace import trace_graph

            traced = trace_graph(functools.partial(ex.run, wait=True), ex.num_launches)
            if isinstance(traced, str):
                why_not.add(traced)
        in_graph += traced if isinstance(traced, list) else [None] * ex.num_launches
    rows: list[dict[str, Any]] = [
        {
            "partition": pi,
            "launch": li,
            # the PrimFunc's name: the stored kernels are minified (k0, k1...)
            "kernel": launch.func or launch.kernel,
            "symbol": launch.kernel,
            "ms": round(statistics.median(ts) * 1e3, 5),
            "bytes": nbytes,
            "flops": launch.flops,
            **_rates(nbytes, launch.flops, statistics.median(ts)),
            # which schedule the tuning chose ("default", or "option k of n"), and its shape
            "schedule": option,
            "global_size": list(launch.global_size),
            "local_size": list(launch.local_size),
            # the tuning's median per option (default first), where it ran in this process
            **({"tuning_ms": [round(t, 5) for t in tuned]} if tuned else {}),
            **(_graph_rates(nbytes, launch.flops, g) if g is not None else {}),
        }
        for (pi, li, launch, nbytes), ts, option, tuned, g in zip(
            names, per, options, timed, in_graph, strict=True
        )
    ]
    graphed = bool(in_graph) and all(g is not None for g in in_graph)
    by_kernel: dict[str, dict[str, float]] = {}
    for r in rows:
        k = by_kernel.setdefault(r["kernel"], {"ms": 0.0, "bytes": 0, "flops": 0, "graph_ms": 0.0})
        for f in ("ms", "bytes", "flops", "graph_ms"):
            k[f] += r.get(f, 0.0)
    out: dict[str, Any] = {
        "kernel_sum_ms": round(sum(r["ms"] for r in rows), 4),
        "launches": rows,
        "top": [
            {
                "kernel": name,
                "ms": round(k["ms"], 5),
                "bytes": int(k["bytes"]),
                "flops": int(k["flops"]),
                **_rates(int(k["bytes"]), int(k["flops"]), k["ms"] * 1e-3),
                **(
                    _graph_rates(int(k["bytes"]), int(k["flops"]), k["graph_ms"] * 1e-3)
                    if graphed
                    else {}
                ),
            }
            for name, k in sorted(
                by_kernel.items(), key=lambda kv: -kv[1]["graph_ms" if graphed else "ms"]
            )[:15]
        ],
    }
    if graphed:
        out["graph_kernel_sum_ms"] = round(sum(r["graph_ms"] for r in rows), 4)
    elif why_not - {"not a CUDA graph"}:
        out["graph_ms_error"] = "; ".join(sorted(why_not))
    return out


def _graph_rates(nbytes: int, flops: int, seconds: float) -> dict[str, float | None]:
    """A launch's (or kernel's) time inside the graph and the rates it makes."""
    rates = _rates(nbytes, flops, seconds)
    return {
        "graph_ms": round(seconds * 1e3, 5),
        "graph_gbps": rates["gbps"],
        "graph_gflops": rates["gflops"],
    }


def _launch_variants(program: Any, choices: list[int]) -> list[int | None]:
    """Per launch of ``program.plan(choices)``: the index of the variant (tuned call) it
    belongs to, or None outside every variant."""
    out: list[int | None] = []
    pos = 0
    for i, (v, c) in enumerate(zip(program.variants, choices, strict=True)):
        out += [None] * (v.start - pos)
        out += [i] * ((v.stop - v.start) if c == 0 else len(v.options[c - 1]))
        pos = v.stop
    return out + [None] * (len(program.launches) - pos)


def _chosen_options(program: Any, choices: list[int]) -> list[str]:
    """Per launch of ``program.plan(choices)``: ``"default"``, or ``"option k of n"`` where the
    tuning chose a variant's option k (of n alternatives) for the call it belongs to."""
    return [
        "default"
        if i is None or choices[i] == 0
        else f"option {choices[i]} of {len(program.variants[i].options)}"
        for i in _launch_variants(program, choices)
    ]


def _timed_options(
    program: Any, choices: list[int], tuning_ms: list[list[float]]
) -> list[list[float] | None]:
    """Per launch of ``program.plan(choices)``: the tuning's times of the options of the
    variant it belongs to (default first), or None (no variant, or no tuning in this
    process)."""
    if len(tuning_ms) != len(program.variants):
        return [None] * len(_launch_variants(program, choices))
    return [
        None if i is None else list(tuning_ms[i]) or None
        for i in _launch_variants(program, choices)
    ]


def _rates(nbytes: int, flops: int, seconds: float) -> dict[str, float | None]:
    """Achieved GB/s and GFLOP/s (None for a launch too short to time)."""
    if seconds <= 0:
        return {"gbps": None, "gflops": None}
    return {"gbps": _sig(nbytes / seconds / 1e9), "gflops": _sig(flops / seconds / 1e9)}


def _sig(x: float) -> float:
    """``x`` to 4 significant digits."""
    return float(f"{x:.4g}")


#: Peaks and node costs measured in this process, by (device, what): a bench of several
#: models measures them once.
_MEASURED: dict[tuple[str, str], float] = {}


def _measured(handle: Any, what: str, measure: Any) -> float:
    key = (str(handle.description), what)
    if key not in _MEASURED:
        _MEASURED[key] = float(measure())
    return _MEASURED[key]


def _roofline(
    sess: Any,
    prof: dict[str, Any],
    latency_ms: float,
    *,
    peak_gbps: float | None = None,
    peak_gflops: float | None = None,
) -> dict[str, Any]:
    """The model's floor at the device's peaks (`litekiln.runtime.roofline.model_floor`)
    and how far the latency is from it; each profiled launch (and kernel of ``top``) gets
    its own floor, ``floor_ms``.

    Peaks not given are measured on the session's device (a streaming copy, multiply-add
    chains); the cost of one launch is measured on each launch path the partitions take (a
    CUDA graph of empty kernels, or empty OpenCL launches). Where a measurement fails the
    record holds ``error`` and no floor.
    """
    from litekiln.runtime import roofline as rl

    paths = ["cuda_graph" if hasattr(ex, "graph_time") else "opencl" for ex in sess.executors]
    try:
        roof = _roof(sess, paths, peak_gbps, peak_gflops)
    except Exception as exc:  # noqa: BLE001 - a device where a probe kernel fails: say why
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    gbps, gflops = roof["peak_gbps"], roof["peak_gflops"]
    work = []
    by_kernel: dict[str, float] = {}
    for r in prof["launches"]:
        work.append(
            rl.LaunchWork(r["bytes"], r["flops"], roof["node_us"][paths[r["partition"]]] * 1e-6)
        )
        floor_s = rl.kernel_floor(r["bytes"], r["flops"], gbps, gflops)
        r["floor_ms"] = _sig(floor_s * 1e3)
        by_kernel[r["kernel"]] = by_kernel.get(r["kernel"], 0.0) + floor_s
    for t in prof["top"]:  # the sum of its launches' floors
        t["floor_ms"] = _sig(by_kernel[t["kernel"]] * 1e3)
    floor = rl.model_floor(work, gbps, gflops)
    floor_ms, kernels_ms = floor["floor_s"] * 1e3, floor["kernels_s"] * 1e3
    return {
        "floor_ms": _sig(floor_ms),
        "latency_ms": latency_ms,
        "latency_over_floor": _ratio(latency_ms, floor_ms) if floor_ms > 0 else None,
        "kernel_floor_ms": _sig(kernels_ms),
        "kernels_over_floor": _ratio(prof["kernel_sum_ms"], kernels_ms) if kernels_ms else None,
        # (by the kernels' own times inside the graph, where traced)
        **(
            {"graph_kernels_over_floor": _ratio(prof["graph_kernel_sum_ms"], kernels_ms)}
            if kernels_ms and "graph_kernel_sum_ms" in prof
            else {}
        ),
        "launch_floor_ms": _sig(floor["launches_s"] * 1e3),
        "launches": len(work),
        "bytes": sum(w.nbytes for w in work),
        "flops": sum(w.flops for w in work),
        **roof,
    }


def _roof(sess: Any, paths: list[str], gbps: float | None, gflops: float | None) -> dict[str, Any]:
    """The peaks (given, or measured once per device and process) and the cost of one
    launch on each of ``paths``, in microseconds."""
    from litekiln.runtime import roofline as rl

    h = sess.handle
    out: dict[str, Any] = {
        "peak_gbps": _sig(gbps or _measured(h, "gbps", lambda: rl.measure_bandwidth(h))),
        "peak_gflops": _sig(gflops or _measured(h, "gflops", lambda: rl.measure_compute(h))),
        "peak_source": {
            "gbps": "given" if gbps else "measured",
            "gflops": "given" if gflops else "measured",
        },
        "node_us": {},
    }
    for path in sorted(set(paths)):
        ex = sess.executors[paths.index(path)]
        cost = _node_cost(h, path, ex)
        out["node_us"][path] = _sig(_measured(h, f"node:{path}", cost) * 1e6)
    return out


def _node_cost(handle: Any, path: str, ex: Any) -> Any:
    """How to measure one launch's cost on ``path`` (seconds)."""
    from litekiln.runtime import roofline as rl

    if path == "cuda_graph":
        return lambda: rl.graph_node_cost(handle, ex.device)
    return lambda: rl.launch_cost(handle)


def _litert_cpu(
    path: str,
    inputs: dict[int, np.ndarray],
    runs: int,
    warmup: int,
    signature: tuple[str, Any] | None = None,
) -> tuple[dict[str, Any], list[np.ndarray]]:
    """LiteRT's CPU path (XNNPACK, every core); with ``signature`` (key, its subgraph), that
    signature's runner. Outputs in graph output order."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    li = LiteRT(model_path=path, num_threads=os.cpu_count())
    if signature is not None:
        key, graph = signature
        runner = li.get_signature_runner(key)
        feeds = {n: inputs[d["index"]] for n, d in runner.get_input_details().items()}
        names = {d["index"]: n for n, d in runner.get_output_details().items()}
        order = [names[t] for t in graph.outputs]

        def run_signature() -> list[np.ndarray]:
            got = runner(**feeds)
            return [got[n] for n in order]

        ref = run_signature()
        return time_runs(run_signature, runs, warmup), ref
    li.allocate_tensors()
    ins = [(d["index"], inputs[d["index"]]) for d in li.get_input_details()]
    step = _step(li, ins, [d["index"] for d in li.get_output_details()])
    ref = step()
    return time_runs(step, runs, warmup), ref


def _step(interp: Any, feed: list[tuple[int, np.ndarray]], outs: list[int]) -> Any:
    """One inference as an app drives an interpreter (LiteRT's or litekiln's): ``feed`` set,
    ``invoke``, ``outs`` read."""

    def step() -> list[np.ndarray]:
        for i, x in feed:
            interp.set_tensor(i, x)
        interp.invoke()
        return [interp.get_tensor(o) for o in outs]

    return step


def _litert_gpu(
    path: str,
    model: Any,
    inputs: dict[int, np.ndarray],
    runs: int,
    warmup: int,
    signature: str | None = None,
) -> tuple[dict[str, Any], list[np.ndarray]]:
    """LiteRT's GPU path (the first signature, or ``signature``); outputs in the graph output
    order of ``model`` (entered at that signature's subgraph)."""
    from ai_edge_litert.compiled_model import CompiledModel
    from ai_edge_litert.hardware_accelerator import HardwareAccelerator as HA

    cm = CompiledModel.from_file(path, hardware_accel=HA.GPU | HA.CPU)
    keys = list(cm.get_signature_list())
    at = keys.index(signature) if signature is not None else 0
    key = keys[at]
    sig = cm.get_signature_by_index(at)
    g = model.main
    sigs = {s.key: s for s in model.signatures}
    if key in sigs:
        in_ix, out_ix = dict(sigs[key].inputs), dict(sigs[key].outputs)
    else:  # no signature in the model: LiteRT names them after the tensors
        in_ix = {g.tensors[t].name: t for t in g.inputs}
        out_ix = {g.tensors[t].name: t for t in g.outputs}
    in_bufs = cm.create_input_buffers(at)
    out_bufs = cm.create_output_buffers(at)
    feeds = [(b, inputs[in_ix[n]]) for b, n in zip(in_bufs, sig["inputs"], strict=True)]
    reads = []
    for b in out_bufs:
        d = b.get_tensor_details()
        shape = tuple(int(x) for x in d["shape"])
        reads.append((b, int(np.prod(shape)), np.dtype(d["dtype"]), shape))

    def step() -> list[np.ndarray]:
        for b, x in feeds:
            b.write(x)
        cm.run_by_index(at, in_bufs, out_bufs)
        return [b.read(n, dt).reshape(shape) for b, n, dt, shape in reads]

    got = dict(zip((out_ix[n] for n in sig["outputs"]), step(), strict=True))
    timing = time_runs(step, runs, warmup)
    timing["fully_accelerated"] = bool(cm.is_fully_accelerated())
    return timing, [got[t] for t in g.outputs]


def latency_model(
    path: str,
    kwargs: dict[str, Any],
    *,
    runs: int,
    profile: bool,
    litert_gpu: bool = True,
    breakdown: bool = True,
    quiet_peers: bool = True,
    peak_gbps: float | None = None,
    peak_gflops: float | None = None,
    peers: tuple[Any, ...] = (),
    signature: str | None = None,
) -> dict[str, Any]:
    """Warm latency of litekiln and LiteRT CPU/GPU on one model, same process, same inputs.

    Args:
        path: the .tflite file.
        kwargs: Interpreter keyword arguments (device, cache_dir, precision, ...).
        runs: timed runs of each (after ``min(20, max(3, runs // 10))`` untimed ones).
        profile: also time every kernel with OpenCL profiling events, and place the model
            under its roofline (``roofline``: `_roofline`).
        litert_gpu: also time LiteRT's GPU path (where it loads).
        breakdown: also measure the host cost of a launch and where an inference's host
            time goes (100 more inferences).
        quiet_peers: hold back LiteRT's own logging (`peer_logs`).
        peak_gbps: the roofline's bandwidth, GB/s (None: measured on the device).
        peak_gflops: the roofline's fp32 rate, GFLOP/s (None: measured on the device).
        peers: more peers (`litekiln.peers`, e.g. `TorchPeer`): each one's ``measure`` gets
            the same inputs and litekiln's outputs and median; its record goes under its name.
        signature: time this signature's subgraph (``Interpreter.for_signature``; LiteRT's
            runner of it), named ``model[key]``; the peers time the primary subgraph only.

    Returns:
        A JSON-ready record; a peer that cannot load or run the model leaves its figures None
        and says why in ``litert_cpu_error`` / ``litert_gpu_error``.
    """
    from litekiln.check import relative_error
    from litekiln.interpreter import Interpreter

    name = _model_name(path) + (f"[{signature}]" if signature else "")
    warmup = min(20, max(3, runs // 10))
    parent = interp = Interpreter(model_path=path, **kwargs)
    if signature is not None:
        interp = interp.for_signature(signature)
        peers = ()
    interp.allocate_tensors()
    # Time the launch path every later inference takes: on NVIDIA the session starts on
    # OpenCL and moves to CUDA graphs in the background (Session.wait_for_graph).
    getattr(interp._backend, "wait_for_graph", lambda: None)()  # noqa: SLF001
    g = interp.model.main
    inputs = dict(zip(g.inputs, interp.random_inputs(0), strict=True))
    ours = interp.run(inputs)
    lk = time_runs(lambda: interp.run(inputs), runs, warmup)
    sess = interp._backend
    rec: dict[str, Any] = {
        "model": name,
        "litekiln_ms": round(lk["median_ms"], 4),
        "litert_cpu_ms": None,
        "litert_gpu_ms": None,
        "speedup_vs_litert_cpu": None,
        "speedup_vs_litert_gpu": None,
        "max_rel_err_vs_litert_cpu": None,
        "litekiln_min_ms": round(lk["min_ms"], 4),
        "litekiln_p90_ms": round(lk["p90_ms"], 4),
        "device": interp.device,
        "gpu_ops": (getattr(sess, "compiled", None) and sess.compiled.stats.get("gpu_ops")),
        "cpu_ops": (getattr(sess, "compiled", None) and sess.compiled.stats.get("cpu_ops")),
        "partitions": len(getattr(sess, "executors", []) or []),
        "launch_overhead": _launch_overhead(sess) if breakdown else None,
        "host_breakdown": _host_breakdown(interp, inputs) if breakdown else None,
    }
    graph_times = [
        ex.graph_time() for ex in getattr(sess, "executors", []) or [] if hasattr(ex, "graph_time")
    ]
    if graph_times:
        # Device time of the CUDA graphs alone (copies and kernels, CUDA events): the rest of
        # litekiln_ms is host work, CPU ops and synchronisation.
        rec["graph_device_ms"] = round(sum(graph_times) * 1e3, 4)
    if profile:
        rec["profile"] = _kernel_profile(sess)
        if rec["profile"] is not None:
            rec["roofline"] = _roofline(
                sess,
                rec["profile"],
                rec["litekiln_ms"],
                peak_gbps=peak_gbps,
                peak_gflops=peak_gflops,
            )
    ref = None
    failure: tuple[str, str] | None = None
    with peer_logs(quiet_peers) as said:
        try:
            keyed = None if signature is None else (signature, g)
            cpu, ref = _litert_cpu(path, inputs, runs, warmup, keyed)
        except Exception as exc:  # noqa: BLE001 - LiteRT cannot load or run it: report, go on
            failure = (type(exc).__name__, str(exc))
    if ref is not None:
        rec["litert_cpu_ms"] = round(cpu["median_ms"], 4)
        rec["speedup_vs_litert_cpu"] = _ratio(cpu["median_ms"], lk["median_ms"])
        rec["max_rel_err_vs_litert_cpu"] = relative_error(ours, ref)
    elif failure is not None:
        rec["litert_cpu_error"] = peer_error(failure, said)
    if litert_gpu:
        gout = None
        failure = None
        with peer_logs(quiet_peers) as said:
            try:
                gpu, gout = _litert_gpu(path, interp.model, inputs, runs, warmup, signature)
            except Exception as exc:  # noqa: BLE001 - no GPU path here (no Vulkan adapter...)
                failure = (type(exc).__name__, str(exc))
        if gout is not None:
            rec["litert_gpu_ms"] = round(gpu["median_ms"], 4)
            rec["speedup_vs_litert_gpu"] = _ratio(gpu["median_ms"], lk["median_ms"])
            rec["litert_gpu_fully_accelerated"] = gpu["fully_accelerated"]
            if ref is not None:
                rec["litert_gpu_max_rel_err_vs_litert_cpu"] = relative_error(gout, ref)
        elif failure is not None:
            rec["litert_gpu_error"] = peer_error(failure, said)
    for peer in peers:
        args = ([inputs[t] for t in g.inputs], ours, lk["median_ms"])
        rec[peer.name] = peer.measure(path, *args, runs=runs, warmup=warmup)
    key = signature if signature is not None else _primary_signature(parent)
    if key is not None:
        rec["carried"] = _carried_step(parent, key, inputs, ours, runs, warmup)
        if rec["carried"] is not None and rec["litert_cpu_ms"] is not None:
            rec["carried"]["speedup_vs_litert_cpu"] = _ratio(
                rec["litert_cpu_ms"], rec["carried"]["litekiln_ms"]
            )
    return rec


def _primary_signature(interp: Any) -> str | None:
    """The key of the one signature of the model's primary subgraph (a generative model's
    ``prefill``), if it has exactly one."""
    model = interp._original  # noqa: SLF001
    keys = [s.key for s in model.signatures if s.subgraph_index == model.main.index]
    return keys[0] if len(keys) == 1 else None


def _carried_step(
    parent: Any,
    signature: str,
    inputs: dict[int, np.ndarray],
    ours: list[np.ndarray],
    runs: int,
    warmup: int,
) -> dict[str, Any] | None:
    """The signature's step as a language model's loop runs it: the outputs that are inputs
    of the same name (its KV caches) carried on the device (`carry_signature_state`), the
    other inputs set and the other outputs read (``set_tensor``, ``invoke``, ``get_tensor``).
    None where nothing is carried. The first step, from the same inputs, must give the
    uncarried run's outputs (``max_rel_err_vs_uncarried``). Run last: the carries stay."""
    from litekiln.check import relative_error

    names = parent.carry_signature_state(signature)
    if not names:
        return None
    sig = parent._signature(signature)  # noqa: SLF001
    interp = parent.for_signature(signature)
    carried_in = {sig.inputs[n] for n in names}
    carried_out = {sig.outputs[n] for n in names}
    for t, x in inputs.items():  # (the states too: the same start as the uncarried run)
        interp.set_tensor(t, x)
    feed = [(t, x) for t, x in inputs.items() if t not in carried_in]
    outs = [k for k, t in enumerate(interp.model.main.outputs) if t not in carried_out]
    step = _step(interp, feed, [interp.model.main.outputs[k] for k in outs])
    first = step()
    timed = time_runs(step, runs, warmup)
    return {
        "states": names,
        "litekiln_ms": round(timed["median_ms"], 4),
        "max_rel_err_vs_uncarried": relative_error(first, [ours[k] for k in outs]),
    }


def latency_main(a: Any, kwargs: dict[str, Any], *, quiet_peers: bool = True) -> int:
    """``litekiln bench``: warm latency against LiteRT CPU and GPU.

    Args:
        a: the command's options (models, runs, profile, peak_gbps, peak_gflops, json, out,
            plot).
        kwargs: the Interpreter's keyword arguments the options stand for.
        quiet_peers: hold back LiteRT's own logging (False with ``litekiln -v``).
    """
    runs = max(1, int(a.runs))
    peers = _peers(a)
    results: dict[str, Any] = {
        "device": None,
        "command": _command_line(),
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "runs": runs,
        "litert_version": _litert_version(),
        "timing": "median of --runs runs after warm-up; each run = inputs in, inference, outputs "
        "back on the host; speedup = peer_ms / litekiln_ms",
        "models": [],
    }
    entries = [(path, sig) for path in a.models for sig in [None, *_entry_signatures(path)]]
    for path, signature in entries:
        rec = latency_model(
            path,
            kwargs,
            runs=runs,
            profile=bool(a.profile),
            litert_gpu=not getattr(a, "skip_litert_gpu", False),
            quiet_peers=quiet_peers,
            peak_gbps=getattr(a, "peak_gbps", None),
            peak_gflops=getattr(a, "peak_gflops", None),
            peers=peers,
            signature=signature,
        )
        results["device"] = results["device"] or rec["device"]
        results["models"].append(rec)
        if not a.json:
            _print_latency_row(rec, header=len(results["models"]) == 1, device=results["device"])
            for peer in peers:
                peer.print_rows(rec[peer.name])
            if a.profile and rec.get("profile"):
                _print_profile(rec)
        if getattr(a, "out", None):
            _write_json(results, argparse_like(out=a.out))
    if not a.json:
        _print_latency_notes(results)
        for peer in peers:
            peer.print_notes()
    _write_json(results, a)
    if getattr(a, "plot", None):
        plot_latency(results, a.plot)
    return 0


def _entry_signatures(path: str) -> list[str]:
    """The model's signatures of other subgraphs (a generative model's ``decode``), timed
    after its primary subgraph, each a row of its own."""
    from litekiln.loading import entry_signatures
    from litekiln.model import load_model

    return entry_signatures(load_model(path, validate=False))


def _peers(a: Any) -> tuple[Any, ...]:
    """The peers named by ``--peer`` besides LiteRT (``torch``: `litekiln.peers.torch_peer`)."""
    if "torch" not in (getattr(a, "peers", None) or ()):
        if getattr(a, "torch_recipe", None) or getattr(a, "torch_modes", None):
            raise LitekilnError("--torch-recipe and --torch-modes go with --peer torch")
        return ()
    from litekiln.peers.torch_peer import MODES, TorchPeer

    modes = tuple(getattr(a, "torch_modes", None) or MODES)
    return (TorchPeer(recipe_file=getattr(a, "torch_recipe", None), modes=modes),)


def _litert_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("ai-edge-litert")
    except Exception:  # noqa: BLE001 - not installed
        return None


def _print_latency_row(rec: dict[str, Any], *, header: bool, device: str) -> None:
    if header:
        print(f"warm latency on {device} (median ms)")
        print(
            f"{'model':32s} {'litekiln':>9s} {'LiteRT CPU':>10s} {'LiteRT GPU':>10s} "
            f"{'x CPU':>7s} "
            f"{'x GPU':>7s} {'rel err':>9s} {'launches':>8s} {'us/launch':>9s}"
        )
    lo = rec.get("launch_overhead") or {}
    err = rec["max_rel_err_vs_litert_cpu"]
    print(
        f"{rec['model']:32s} {_fmt(rec['litekiln_ms'], '9.3f')} "
        f"{_fmt(rec['litert_cpu_ms'], '10.3f')} "
        f"{_fmt(rec['litert_gpu_ms'], '10.3f')} {_fmt(rec['speedup_vs_litert_cpu'], '7.3g')} "
        f"{_fmt(rec['speedup_vs_litert_gpu'], '7.3g')} "
        f"{(format(err, '9.1e') if err is not None else 'n/a'.rjust(9))} "
        f"{lo.get('launches', 0):8d} {_fmt(lo.get('enqueue_us_per_launch'), '9.2f')}"
    )
    for k in ("litert_cpu_error", "litert_gpu_error"):
        if rec.get(k):
            print(f"  {k.replace('_error', '').replace('_', ' ')}: n/a ({rec[k][:160]})")
    carried = rec.get("carried")
    if carried:
        print(
            f"  with {len(carried['states'])} states carried on the device "
            f"(carry_signature_state): {_fmt(carried['litekiln_ms'], '.3f')} ms, "
            f"{_fmt(carried.get('speedup_vs_litert_cpu'), '.3g')}x LiteRT CPU"
        )


def _print_profile(rec: dict[str, Any]) -> None:
    p = rec["profile"]
    print(
        f"  kernels: {len(p['launches'])} launches, {p['kernel_sum_ms']:.3f} ms device time "
        "in all "
        f"(litekiln end-to-end {rec['litekiln_ms']:.3f} ms)"
    )
    graphed = "graph_kernel_sum_ms" in p
    if graphed:
        # the rates and the distance from the floor by each kernel's own time in the graph
        print(
            f"  inside the CUDA graph (CUPTI): {p['graph_kernel_sum_ms']:.3f} ms of kernels; "
            "the events' times count each launch's overhead too"
        )
        print(
            f"    {'events ms':>9s} {'graph ms':>9s} {'GB/s':>8s} {'GFLOP/s':>8s} "
            f"{'x floor':>8s}  kernel"
        )
    else:
        if p.get("graph_ms_error"):
            print(f"  kernels' own times in the graph: n/a ({p['graph_ms_error'][:160]})")
        print(f"    {'ms':>9s} {'GB/s':>8s} {'GFLOP/s':>8s} {'x floor':>8s}  kernel")
    for t in p["top"][:10]:
        floor = t.get("floor_ms")
        ms = t["graph_ms"] if graphed else t["ms"]
        over = _ratio(ms, floor) if floor else None
        g = "graph_" if graphed else ""
        print(
            f"    {t['ms']:9.4f} "
            + (f"{t['graph_ms']:9.4f} " if graphed else "")
            + f"{_fmt(t.get(g + 'gbps'), '8.3g')} {_fmt(t.get(g + 'gflops'), '8.3g')} "
            f"{_fmt(over, '8.3g')}  {t['kernel']}"
        )
    _print_roofline(rec)


def _print_roofline(rec: dict[str, Any]) -> None:
    r = rec.get("roofline")
    if not r:
        return
    if "error" in r:
        print(f"  roofline: n/a ({r['error']})")
        return
    src = r["peak_source"]
    nodes = ", ".join(
        f"{'CUDA graph node' if path == 'cuda_graph' else 'OpenCL launch'} {us:.3g} us"
        for path, us in r["node_us"].items()
    )
    print(
        f"  roofline: {r['bytes'] / 1e6:.3g} MB moved, {r['flops'] / 1e9:.3g} GFLOP; "
        f"peaks {r['peak_gbps']:.4g} GB/s ({src['gbps']}), {r['peak_gflops']:.4g} GFLOP/s "
        f"({src['gflops']}); {nodes}"
    )
    print(
        f"  floor {r['floor_ms']:.4g} ms = kernels {r['kernel_floor_ms']:.4g} + "
        f"{r['launches']} launches {r['launch_floor_ms']:.4g}; litekiln "
        f"{r['latency_ms']:.4g} ms = {_fmt(r['latency_over_floor'], '.3g')}x the floor "
        f"(kernels {_fmt(r['kernels_over_floor'], '.3g')}x theirs"
        + (
            f"; inside the graph {_fmt(r['graph_kernels_over_floor'], '.3g')}x"
            if "graph_kernels_over_floor" in r
            else ""
        )
        + ")"
    )


def _print_latency_notes(results: dict[str, Any]) -> None:
    print(
        "x CPU / x GPU: LiteRT's time over litekiln's (above 1: litekiln faster). rel err: "
        "max|litekiln - LiteRT CPU| / max(1, max|LiteRT CPU|). us/launch: host time of the "
        "enqueue loop per kernel launch."
    )


#: The torch peer's modes as the plot names them (`litekiln.peers.torch_peer`).
_TORCH_LABELS = {
    "eager": "torch eager",
    "cuda_graph": "torch eager + CUDA graph",
    "compile": "torch.compile",
}


def plot_series(
    models: list[dict[str, Any]],
) -> tuple[list[tuple[str, list[float | None]]], list[tuple[str, list[float | None]]]]:
    """What `plot_latency` draws, per model: the latencies (litekiln, LiteRT CPU and GPU, and
    each torch mode that `--peer torch` timed) and litekiln's speed-ups over each peer (peer
    ms / litekiln ms). A series no model has is left out; None where one model lacks it."""

    def torch_mode(m: dict[str, Any], mode: str, key: str) -> float | None:
        entry = (m.get("torch") or {}).get("modes", {}).get(mode)
        value = entry.get(key) if isinstance(entry, dict) else None
        return float(value) if isinstance(value, (int, float)) and value > 0 else None

    def value(m: dict[str, Any], key: str) -> float | None:
        v = m.get(key)
        return float(v) if isinstance(v, (int, float)) and v > 0 else None

    latency: list[tuple[str, list[float | None]]] = [
        ("litekiln", [value(m, "litekiln_ms") for m in models]),
        ("LiteRT CPU", [value(m, "litert_cpu_ms") for m in models]),
        ("LiteRT GPU", [value(m, "litert_gpu_ms") for m in models]),
    ]
    speedup: list[tuple[str, list[float | None]]] = [
        ("vs LiteRT CPU", [value(m, "speedup_vs_litert_cpu") for m in models]),
        ("vs LiteRT GPU", [value(m, "speedup_vs_litert_gpu") for m in models]),
    ]
    for mode, label in _TORCH_LABELS.items():
        latency.append((label, [torch_mode(m, mode, "ms") for m in models]))
        speedup.append((f"vs {label}", [torch_mode(m, mode, "speedup") for m in models]))
    return [(k, v) for k, v in latency if any(v)], [(k, v) for k, v in speedup if any(v)]


def plot_latency(results: dict[str, Any], png: str) -> bool:
    """Latencies per model (log scale) beside litekiln's speed-ups over each peer (LiteRT CPU
    and GPU, and torch's modes where `--peer torch` timed them), with their geometric means.
    Returns False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker  # noqa: F401 - (matplotlib.ticker below)
    except ImportError:
        print(
            f"--plot {png}: matplotlib is not installed here; the JSON (--out) holds every "
            "figure: plot it elsewhere with `python -m litekiln.bench plot RESULTS.json "
            "OUT.png` (pip install matplotlib)",
            file=sys.stderr,
        )
        return False
    import math

    models = results["models"]
    names = [m["model"] for m in models]
    latency, speedups = plot_series(models)
    # Side by side for a few models; for more, the speed-ups below the latencies.
    wide = len(names) > 8
    n_bars = len(names) * len(latency)
    fig, (ax, ax2) = plt.subplots(
        2 if wide else 1,
        1 if wide else 2,
        figsize=(max(10, 0.12 * n_bars + 3), 5 + 0.06 * len(names) * len(speedups))
        if wide
        else (max(10, 1.0 * len(names) + 6), 5.5),
        gridspec_kw={"height_ratios": [5, 0.06 * len(names) * len(speedups)]}
        if wide
        else {"width_ratios": [3, 2]},
    )
    width = 0.8 / len(latency)
    for i, (label, ys) in enumerate(latency):
        xs = [j + (i - (len(latency) - 1) / 2) * width for j in range(len(names))]
        heights = [y or 0 for y in ys]
        bars = ax.bar(xs, heights, width, label=label)
        if len(names) * len(latency) <= 40:  # (labels on every bar only where they fit)
            for b, y in zip(bars, heights, strict=True):
                ax.annotate(
                    "n/a" if not y else f"{y:.2f}",
                    (b.get_x() + b.get_width() / 2, max(y, 1e-3)),
                    ha="center",
                    va="bottom",
                    fontsize=6,
                )
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_yscale("log")
    fmt = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(fmt)
    ax.yaxis.set_minor_formatter(fmt if not wide else matplotlib.ticker.NullFormatter())
    ax.set_ylabel("warm latency, ms (median, lower is better)")
    ax.set_title(f"{results.get('device')}", fontsize=9)
    ax.legend(fontsize=8)

    # Speed-ups (peer time / litekiln time), with their geometric means.
    ys_pos = list(range(len(names)))[::-1]
    height = 0.8 / len(speedups)
    for k, (label, vals) in enumerate(speedups):
        ok = [v for v in vals if v]
        gm = math.exp(sum(math.log(v) for v in ok) / len(ok)) if ok else 0
        offset = ((len(speedups) - 1) / 2 - k) * height
        ax2.barh(
            [y + offset for y in ys_pos],
            [v or 0 for v in vals],
            height,
            label=f"{label} (geomean {gm:.2f}x over {len(ok)})",
            color=f"C{k + 1}",
        )
        if len(names) * len(speedups) <= 40:
            for y, v in zip(ys_pos, vals, strict=True):
                if v:
                    ax2.annotate(f"{v:.2f}x", (v, y + offset), va="center", fontsize=6)
    ax2.axvline(1, color="k", lw=0.8)
    ax2.axvline(3, color="grey", lw=0.8, ls="--")
    ax2.set_xscale("log")
    ax2.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    ax2.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax2.set_yticks(ys_pos)
    ax2.set_yticklabels(names, fontsize=8)
    ax2.set_xlabel("litekiln speed-up (peer ms / litekiln ms; right of 1 = faster)")
    ax2.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    print(f"plot written to {png}", file=sys.stderr)
    return True


def merged_results(paths: list[str]) -> dict[str, Any]:
    """Several runs' results (`litekiln bench --out` JSON) as one: their models in order, the
    first run's device."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    return {**runs[0], "models": [m for r in runs for m in r["models"]], "merged_from": paths}


# ---------------------------------------------------------------------------------- entry


def main(argv: list[str] | None = None) -> int:
    """``python -m litekiln.bench _child SPEC`` (one start-up measurement, in the fresh process
    `startup_model` spawns) or ``... plot JSON [JSON...] PNG``; measurements start with
    `litekiln bench`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [_CHILD] and len(argv) == 2:
        print(_MARK + json.dumps(_child(json.loads(argv[1]))), flush=True)
        return 0
    if argv[:1] == ["plot"] and len(argv) >= 3:
        return 0 if plot_latency(merged_results(argv[1:-1]), argv[-1]) else 1
    usage = (
        "python -m litekiln.bench plot RESULTS.json [MORE.json...] OUT.png "
        "(measure with `litekiln bench`)"
    )
    print(f"usage: {usage}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
