"""A loaded model on an OpenCL device: the runtime's executor of a :class:`CompiledModel`.

Never imports TVM. On a cache hit the whole start-up is: read the manifest and constants,
build each partition's program from the cached device binary, allocate buffers once, upload
constants once, bind kernel arguments once. ``run`` then only copies inputs in, enqueues the
pre-bound launches, runs CPU ops in between and copies outputs out.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from litekiln.errors import CompileError, DeviceError
from litekiln.model.ir import Model
from litekiln.ops.base import dequantize, is_quantized, quantize
from litekiln.runtime.artifact import CompiledModel, CompileOptions
from litekiln.runtime.device import DeviceHandle, DeviceOpener, select_device, supports_half

log = logging.getLogger("litekiln")

_OPTION_NAMES = set(CompileOptions.__dataclass_fields__) - {"precision"}


@dataclass
class DivergenceReport:
    """Result of validate mode: the first tensor whose GPU value diverges from the reference."""

    ok: bool
    tensor: int | None = None
    name: str = ""
    op: int | None = None
    max_abs_error: float = 0.0
    tolerance: float = 0.0
    checked: int = 0
    details: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        if self.ok:
            return f"validate: all {self.checked} GPU tensors match the reference"
        return (
            f"validate: tensor {self.tensor} ({self.name!r}), output of op #{self.op}, diverges "
            f"from the reference: max |gpu - ref| = {self.max_abs_error:.3g} > {self.tolerance:.3g}"
        )


def split_options(
    options: Mapping[str, Any], precision: str
) -> tuple[CompileOptions, dict[str, Any]]:
    """Separate compile options (part of the cache key) from runtime-only options.

    Raises:
        TypeError: an option name is unknown.
    """
    from litekiln import config

    compile_kw = {k: v for k, v in options.items() if k in _OPTION_NAMES}
    compile_kw.setdefault("op_table", config.OP_TABLE.get())
    compile_kw.setdefault("allow_quantized", config.ALLOW_QUANTIZED.get())
    compile_kw.setdefault("max_partitions", config.MAX_PARTITIONS.get())
    compile_kw.setdefault("min_partition_ops", config.MIN_PARTITION_OPS.get())
    runtime_kw = {k: v for k, v in options.items() if k not in _OPTION_NAMES}
    unknown = set(runtime_kw) - {"validate", "use_cache", "progress", "tune"}
    if unknown:
        raise TypeError(
            f"unknown option(s) {sorted(unknown)}; compile options are "
            f"{sorted(_OPTION_NAMES | {'precision'})}, runtime options are validate, use_cache, tune"
        )
    return CompileOptions(precision=precision, **compile_kw), runtime_kw


def open_session(
    model: Model,
    *,
    model_path: str | None = None,
    model_bytes: bytes | None = None,
    device: str | DeviceOpener | None = None,
    precision: str = "fp32",
    cache_dir: str | None = None,
    **options: Any,
) -> Session:
    """Load (or compile, then cache) a model and bind it to an OpenCL device.

    Args:
        model: the loaded model IR (its token keys the cache).
        model_path: where the model came from (informative).
        model_bytes: unused; reserved for re-loading.
        device: device choice (see :func:`~litekiln.runtime.device.select_device`), or a
            :class:`~litekiln.runtime.device.DeviceOpener` already opening it.
        precision: "fp32" or "fp16".
        cache_dir: cache directory; None for the default; the option ``use_cache=False``
            disables the cache.
        options: compile options (:class:`CompileOptions` fields) and runtime options
            (``validate``, ``use_cache``).

    Returns:
        A ready :class:`Session`.

    Raises:
        DeviceError: no usable OpenCL device.
        CompileError: the model is not cached and cannot be compiled here.
    """
    from litekiln import config

    copts, rt = split_options(options, precision)
    handle = device.result() if isinstance(device, DeviceOpener) else select_device(device)
    if "schedules" not in options:
        copts = dataclasses.replace(copts, schedules=default_schedules(handle))
    if copts.precision == "fp16" and copts.half == "native" and not supports_half(handle):
        log.warning(
            "%s has no half-precision arithmetic: precision='fp16' runs fp32 kernels that round "
            "every value to fp16 (half-storage numerics)",
            handle.description,
        )
        copts = dataclasses.replace(copts, half="emulated")
    use_cache = bool(rt.get("use_cache", True)) and not config.NO_CACHE.get()
    store = None
    if use_cache:
        from litekiln.cache.models import ModelCache

        store = ModelCache.open(cache_dir)
    validate = bool(rt.get("validate", False))
    tune = config.TUNE.get(rt.get("tune"))
    try:
        return Session(
            model,
            _load_or_compile(model, copts, store, rt),
            handle,
            store=store,
            validate=validate,
            tune=tune,
        )
    except DeviceError as exc:
        if not (
            copts.precision == "fp16" and copts.half == "native" and "half-precision" in str(exc)
        ):
            raise
        # The driver rejects the half kernels (NVIDIA's OpenCL compiler does not accept all of
        # TVM's half code): run the fp16-rounding fp32 kernels instead, and say so.
        log.warning("%s; using fp32 kernels that round every value to fp16", exc)
        copts = dataclasses.replace(copts, half="emulated")
        return Session(
            model,
            _load_or_compile(model, copts, store, rt),
            handle,
            store=store,
            validate=validate,
            tune=tune,
        )


def _load_or_compile(
    model: Model, copts: CompileOptions, store: Any, rt: dict[str, Any]
) -> CompiledModel:
    compiled = store.load_model(model.token, copts) if store is not None else None
    if compiled is None:
        compiled = compile_for(model, copts, progress=rt.get("progress"))
        if store is not None:
            store.save_model(compiled)
    return compiled


def default_schedules(handle: DeviceHandle) -> str:
    """``LITEKILN_SCHEDULES`` if set, else the profile measured best for the device type:
    "fast-cpu" on CPU OpenCL devices (PoCL: 50-150x faster than dlight's), "fast" on GPUs."""
    import pyopencl as cl

    from litekiln import config

    if os.environ.get(config.SCHEDULES.env):
        return config.SCHEDULES.get()
    return "fast-cpu" if handle.device.type & cl.device_type.CPU else "fast"  # type: ignore[attr-defined]


def compile_for(model: Model, options: CompileOptions, *, progress: Any = None) -> CompiledModel:
    """Compile with TVM, or explain why that is impossible on this machine.

    Raises:
        CompileError: TVM is not installed (a runtime-only install met an uncached model).
    """
    import importlib.util

    try:
        # Asked of the import system, not imported: the runtime never imports the compiler's
        # dependencies itself (a blocked import, sys.modules["tvm"] = None, raises ValueError).
        if importlib.util.find_spec("tvm") is None:
            raise ImportError("apache-tvm is not installed")
        from litekiln.compiler.driver import compile_model, stderr_progress
    except (ImportError, ValueError) as exc:
        raise CompileError(
            f"{model.name} (token {model.token}) is not in the cache and the compiler is not "
            f"available here ({exc}). Compile at build time with `litekiln compile MODEL "
            "--cache-dir DIR` and ship DIR, or install the compiler: pip install 'litekiln[compiler]'"
        ) from None
    return compile_model(model, options, progress=progress or stderr_progress)


class Session:
    """A compiled model bound to a device.

    Attributes:
        device_name: the device, in words.
        compiled: the compiled model being run.
        load_seconds: time to build programs, allocate and upload.
    """

    def __init__(
        self,
        model: Model,
        compiled: CompiledModel,
        handle: DeviceHandle,
        *,
        store: Any = None,
        validate: bool = False,
        tune: bool = True,
    ) -> None:
        from litekiln.runtime.executor import ExecutorError, PartitionExecutor

        t0 = time.perf_counter()
        self.model = model
        self.graph = model.main
        self.compiled = compiled
        self.handle = handle
        self.device_name = handle.description
        self.validate = validate
        #: When a list, `run` appends ``(kind, step index, seconds)`` as it goes: "cpu" (an op
        #: on numpy), and per GPU partition "gpu_inputs" (staged), "gpu_launch" (enqueued),
        #: "gpu_outputs" (waited for, read back). The bench's host-time breakdown sets it;
        #: None (the default) costs nothing.
        self.step_times: list[tuple[str, int, float]] | None = None
        self.last_report: DivergenceReport | None = None
        identity = handle.identity()
        self.executors: list[Any] = []
        for part in compiled.partitions:
            prog = part.program
            consts = _partition_constants(compiled, part)
            bkey = _binary_key(prog.source, prog.build_options, identity)
            binary, choices = store.load_program(bkey) if store is not None else (None, None)
            try:
                ex = PartitionExecutor(prog, consts, handle.context, handle.queue, binary=binary)
            except ExecutorError as exc:
                if binary is None:
                    raise DeviceError(f"{model.name}: partition {part.index}: {exc}") from None
                # A binary the driver rejects (new driver, corrupted entry): rebuild from source.
                log.warning("cached device binary rejected (%s); rebuilding from source", exc)
                try:
                    ex = PartitionExecutor(prog, consts, handle.context, handle.queue)
                except ExecutorError as exc2:
                    raise DeviceError(f"{model.name}: partition {part.index}: {exc2}") from None
                binary = None
            save = binary is None
            if prog.variants:
                try:
                    if choices is None:
                        raise ValueError("not tuned on this device yet")
                    ex.select(choices)
                except ValueError:
                    # First load on this device (or choices of another program): time the
                    # variants once and store the choice with the binary.
                    if tune:
                        choices = ex.tune()
                        log.info(
                            "%s: partition %d tuned: %d of %d kernels changed",
                            model.name,
                            part.index,
                            sum(1 for c in choices if c),
                            len(choices),
                        )
                        save = True
            if save and store is not None and ex.binary:
                store.save_binary(
                    bkey, ex.binary, identity, tuning=ex.choices if prog.variants and tune else None
                )
            self.executors.append(ex)
        self._outputs = [_output_arrays(ex) for ex in self.executors]
        # `run` holds the lock; the CUDA graph upgrade takes it to check a graph against the
        # OpenCL executor and to swap it in, so an inference never sees a half-made switch.
        self._lock = threading.Lock()
        self._graph_thread: threading.Thread | None = None
        self._start_graph_upgrade()
        self.load_seconds = time.perf_counter() - t0

    def _start_graph_upgrade(self) -> None:
        """Move the partitions onto CUDA graphs (NVIDIA; `_graph_path`).

        Under ``LITEKILN_CUDA_GRAPH=auto`` this happens in a background thread: the session is
        ready on the OpenCL executors at once (starting the CUDA driver and a context costs
        another ~100-200 ms on the H100, after OpenCL's own start), the first inferences run
        there, and each partition switches to its graph between two inferences once the graph
        is built and checked. `wait_for_graph` waits for that. ``on`` does it here, now, and
        fails if any partition cannot take the graph path; ``off`` never touches CUDA.
        """
        from litekiln import config

        mode = config.CUDA_GRAPH.get()
        todo = [(slot, ex) for slot, ex in enumerate(self.executors) if ex.program.launches]
        if mode == "off" or not todo:
            return
        if mode == "on":
            self._upgrade(todo)
            return
        self._graph_thread = threading.Thread(
            target=self._upgrade, args=(todo,), daemon=True, name="litekiln-cuda-graph"
        )
        _UPGRADES.add(self._graph_thread)
        self._graph_thread.start()

    def _upgrade(self, todo: list[tuple[int, Any]]) -> None:
        try:
            for slot, ex in todo:
                cu = self._graph_path(ex, slot)
                if cu is ex:
                    continue
                with self._lock:
                    self.executors[slot] = cu
                    self._outputs[slot] = _output_arrays(cu)
        except Exception as exc:  # noqa: BLE001 - never let the background upgrade break a session
            if threading.current_thread() is not self._graph_thread:
                raise  # (``on``: here, now, errors included)
            log.warning(
                "%s: CUDA graph path abandoned: %s: %s", self.model.name, type(exc).__name__, exc
            )
        finally:
            _UPGRADES.discard(threading.current_thread())

    def wait_for_graph(self, timeout: float | None = None) -> None:
        """Wait until the background CUDA graph upgrade (if any) has finished: from then on
        `executors` holds the launch path every later inference takes."""
        t = self._graph_thread
        if t is not None:
            t.join(timeout)

    def _graph_path(self, ex: Any, slot: int) -> Any:
        """The CUDA graph executor of ``ex``'s program on NVIDIA GPUs, else ``ex`` itself.

        `litekiln.runtime.cuda` says why: NVIDIA's OpenCL spends ~5 us of host time per
        kernel launch, a graph replays the partition in one call. Before it replaces the
        OpenCL executor, one inference on seeded inputs must give the same outputs on both
        (the same PTX runs in both, so they agree to the bit unless something is wrong).
        """
        from litekiln import config
        from litekiln.runtime.cuda import (
            CudaGraphExecutor,
            CudaUnsupported,
            NotNvidiaDevice,
            cuda_device_for,
        )

        part = self.compiled.partitions[slot]
        try:
            device = cuda_device_for(self.handle.device)  # first: refuses non-NVIDIA at once
            binary = ex.binary  # (copied out of the driver when it was built from source)
            if not binary:
                raise CudaUnsupported("the OpenCL driver reports no program binary")
            consts = _partition_constants(self.compiled, part)
            cu = CudaGraphExecutor(
                ex.program,
                consts,
                binary,
                device,
                choices=ex.choices,
                streams=config.CUDA_STREAMS.get(),
            )
            with self._lock:  # (the OpenCL executor is idle meanwhile)
                mismatch = _compare_paths(ex, cu)
            if mismatch:
                raise CudaUnsupported(f"one inference differs from the OpenCL path: {mismatch}")
        except CudaUnsupported as exc:
            if config.CUDA_GRAPH.get() == "on":
                raise DeviceError(
                    f"{self.model.name}: partition {part.index}: CUDA graph path: {exc}"
                ) from None
            if not isinstance(exc, NotNvidiaDevice):
                log.info(
                    "%s: partition %d stays on OpenCL launches: %s",
                    self.model.name,
                    part.index,
                    exc,
                )
            return ex
        log.info(
            "%s: partition %d runs as one CUDA graph (%d kernels, %d concurrent branches at most)",
            self.model.name,
            part.index,
            cu.num_launches,
            cu.branches,
        )
        return cu

    def run(self, inputs: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
        """Run one inference.

        Args:
            inputs: graph input tensor index -> array (exact dtype/shape, checked by caller).

        Returns:
            tensor index -> value for the graph outputs and every tensor crossing a
            partition boundary. GPU outputs live in host arrays that the next `run`
            overwrites: copy what must outlive it.
        """
        with self._lock:
            return self._run(inputs)

    def _run(self, inputs: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
        from litekiln.reference import run_ops

        g = self.graph
        values: dict[int, np.ndarray] = dict(inputs)
        report = DivergenceReport(ok=True) if self.validate else None
        times = self.step_times
        for kind, idx in self.compiled.steps:
            t0 = time.perf_counter() if times is not None else 0.0
            if kind == "cpu":
                run_ops([g.ops[idx]], g, values)
                if times is not None:
                    times.append((kind, idx, time.perf_counter() - t0))
                continue
            part = self.compiled.partitions[idx]
            ex = self.executors[idx]
            for i, t in enumerate(part.inputs):
                x = values[t]
                if is_quantized(g.tensors[t]):
                    x = dequantize(x, g.tensors[t])  # 8-bit inputs: float view, on the CPU
                # np.require keeps 0-d arrays 0-d (ascontiguousarray would make them 1-d).
                ex.set_input(i, np.require(x, ex.input_spec(i).dtype, "C"), blocking=False)
            if times is not None:
                t1 = time.perf_counter()
                times.append(("gpu_inputs", idx, t1 - t0))
                t0 = t1
            ex.run()
            if times is not None:
                t1 = time.perf_counter()
                times.append(("gpu_launch", idx, t1 - t0))
                t0 = t1
            for i, t in enumerate(part.outputs):
                y = ex.get_output(i, out=self._outputs[idx][i])
                tensor = g.tensors[t]
                if is_quantized(tensor):
                    y = quantize(y.astype(np.float32), tensor)
                elif y.dtype != tensor.dtype:
                    y = y.astype(tensor.dtype)
                values[t] = y
            if times is not None:
                times.append(("gpu_outputs", idx, time.perf_counter() - t0))
            if report is not None and report.ok:
                self._validate_partition(part, values, report)
        if report is not None:
            self.last_report = report
            if not report.ok:
                log.warning("%s", report)
        return values

    def _validate_partition(
        self, part: Any, values: dict[int, np.ndarray], report: DivergenceReport
    ) -> None:
        """Re-run the partition's ops on the reference and compare every tensor the GPU kept."""
        from litekiln.reference import run_ops

        g = self.graph
        ref: dict[int, np.ndarray] = {t: values[t] for t in part.inputs}
        run_ops([g.ops[i] for i in part.ops], g, ref)
        tol_rel = 1e-2 if self.compiled.options.precision == "fp16" else 1e-4
        for i in part.ops:
            for t in g.ops[i].outputs:
                if t not in part.outputs:
                    continue
                r = ref[t].astype(np.float64)
                err = float(np.abs(values[t].astype(np.float64) - r).max()) if r.size else 0.0
                tol = tol_rel * max(1.0, float(np.abs(r).max()) if r.size else 1.0)
                if is_quantized(g.tensors[t]):
                    tol = max(tol, 1.0)  # one quantization step
                report.checked += 1
                if err > tol:
                    report.ok = False
                    report.tensor, report.name, report.op = t, g.tensors[t].name, i
                    report.max_abs_error, report.tolerance = err, tol
                    return


def _partition_constants(compiled: CompiledModel, part: Any) -> dict[str, np.ndarray]:
    """The constant arrays one partition's program uploads, by name."""
    return {name: compiled.constants[name] for name in part.program.constants.values()}


def _output_arrays(ex: Any) -> list[np.ndarray]:
    """The host arrays partition outputs are read into on every inference (no per-inference
    allocation; values returned by `Session.run` are valid until the next run). A CUDA graph
    copies its outputs into pinned buffers of its own: those are the arrays (no second host
    copy; 5.5 MB per inference for DeepLab's output)."""
    if hasattr(ex, "output_buffers"):
        return ex.output_buffers()  # type: ignore[no-any-return]
    return [
        np.empty(ex.output_spec(i).shape, ex.output_spec(i).dtype) for i in range(ex.num_outputs)
    ]


#: Background CUDA graph upgrades still running; joined at exit, so that no thread is inside
#: the CUDA driver while the process tears it down.
_UPGRADES: set[threading.Thread] = set()


@atexit.register
def _join_upgrades() -> None:
    for t in list(_UPGRADES):
        t.join(timeout=15)


def _compare_paths(a: Any, b: Any, seed: int = 0) -> str:
    """Run executors ``a`` and ``b`` on the same seeded inputs; '' if their outputs agree.

    Floating inputs are uniform in [-1, 1); integer inputs are zeros (random indices could
    point outside a table). Agreement: the same non-finite values and
    ``max|a - b| <= 1e-6 * max(1, max|a|)`` (the same program, so in practice bitwise).
    """
    rng = np.random.default_rng(seed)
    for i in range(a.num_inputs):
        spec = a.input_spec(i)
        dt = np.dtype(spec.dtype)
        x = (
            rng.uniform(-1, 1, spec.shape).astype(dt)
            if dt.kind == "f"
            else np.zeros(spec.shape, dt)
        )
        a.set_input(i, x)
        b.set_input(i, x)
    a.run(wait=True)
    b.run(wait=True)
    for i in range(a.num_outputs):
        ya = a.get_output(i).astype(np.float64)
        yb = b.get_output(i).astype(np.float64)
        if ya.shape != yb.shape:
            return f"output {i}: shape {yb.shape} vs {ya.shape}"
        fa, fb = np.isfinite(ya), np.isfinite(yb)
        if not np.array_equal(fa, fb) or not np.array_equal(ya[~fa], yb[~fb], equal_nan=True):
            return f"output {i}: non-finite values differ"
        if fa.any():
            err = float(np.abs(ya[fa] - yb[fb]).max())
            tol = 1e-6 * max(1.0, float(np.abs(ya[fa]).max()))
            if err > tol:
                return f"output {i}: max |diff| {err:.3g} > {tol:.3g}"
    return ""


def _binary_key(source: str, build_options: str, identity: dict[str, str]) -> dict[str, Any]:
    return {
        "kind": "binary",
        "source": hashlib.sha256(source.encode()).hexdigest(),
        "build_options": build_options,
        **identity,
    }
