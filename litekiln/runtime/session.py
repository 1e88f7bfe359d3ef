"""A compiled model on an OpenCL device: the runtime's executor of a :class:`CompiledModel`.

The runtime only runs compiled models: it imports nothing of the cache, the compiler or TVM
(`litekiln.loading` decides between a cache hit and a compile, then hands the compiled model
here). On a cache hit the whole start-up is: build each partition's program from the stored
device binary, allocate buffers once, upload constants once, bind kernel arguments once.
``run`` then only copies inputs in, enqueues the pre-bound launches, runs CPU ops in between
and copies outputs out.
"""

from __future__ import annotations

import atexit
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np

from litekiln import config
from litekiln.artifact.compiled import CompiledModel, PartitionArtifact
from litekiln.artifact.program import GpuProgram
from litekiln.errors import DeviceError, InputError
from litekiln.model.ir import Model
from litekiln.ops.base import check_indices, dequantize, is_quantized, quantize
from litekiln.reference import FLOAT_VIEW_RANGE_SHARE, run_graph, run_ops
from litekiln.runtime.buffers import (
    CudaBuffer,
    DeviceBuffer,
    OpenCLBuffer,
    TensorSlot,
    device_buffer,
    state_buffer,
)
from litekiln.runtime.device import KNOWN_CHOICES, CudaStart, CudaStartMiss, DeviceHandle
from litekiln.runtime.threads import cpu_thread_limit

if TYPE_CHECKING:  # (imported where used: a CUDA start never imports pyopencl)
    from litekiln.runtime.build import BuildJob, BuiltProgram
    from litekiln.runtime.executor import PartitionExecutor

log = logging.getLogger("litekiln")


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


@dataclass
class Binding:
    """An application buffer bound to a graph input or output, and how the session uses it.

    Attributes:
        buffer: the buffer (its ``slot`` names the tensor and the role).
        direct: where a GPU partition reads or writes it with no host copy, in words.
        host: why the host copies it, in words (empty when it never does): an op on the CPU
            reads the input or makes the output, an 8-bit tensor is (de)quantized on the CPU,
            or the partition's launch path cannot use that kind of memory.
    """

    buffer: DeviceBuffer
    direct: list[str] = field(default_factory=list)
    host: list[str] = field(default_factory=list)

    @property
    def zero_copy(self) -> bool:
        """True when no inference copies this tensor through the host."""
        return not self.host


@dataclass
class _BindingPlan:
    """What `Session.run` does with the bound buffers (made by `Session._plan_bindings`)."""

    #: (partition, input) pairs read from their bound buffer: no value to stage.
    direct_in: set[tuple[int, int]] = field(default_factory=set)
    #: (partition, output) pairs written to their bound buffer that nothing reads on the host.
    device_only: set[tuple[int, int]] = field(default_factory=set)
    #: Bound inputs the host needs, read at the start of each run.
    host_reads: list[tuple[int, DeviceBuffer]] = field(default_factory=list)
    #: Bound outputs made on the host, written to their buffers at the end of each run.
    host_writes: list[tuple[int, DeviceBuffer]] = field(default_factory=list)
    #: Buffers whose producer orders its pending work before each run (DLPack streams).
    syncs: list[DeviceBuffer] = field(default_factory=list)
    #: Executors waited for at the end of each run, so the bound outputs hold the results.
    finish: list[Any] = field(default_factory=list)
    #: Carried states (input, output) copied from the output's host value at the end of each
    #: run: made on the CPU, or in memory of another kind than the input's buffer.
    host_carries: list[tuple[int, int]] = field(default_factory=list)


#: A program's key in the `ProgramStore`: the digest of the driver's source
#: (`DriverProgram.digest`), the driver options, the device identity.
_ProgramKey = tuple[str, tuple[str, ...], dict[str, str]]


class ProgramStore(Protocol):
    """Where device binaries are kept between starts (the cache implements it; the runtime
    never imports the cache). Keyed by exactly what the driver is handed and the device."""

    def load_program(
        self, source_digest: str, build_options: Sequence[str], identity: Mapping[str, str]
    ) -> tuple[bytes | None, list[int] | None]: ...

    def save_program(
        self,
        source_digest: str,
        build_options: Sequence[str],
        identity: Mapping[str, str],
        binary: bytes,
        tuning: list[int] | None = None,
        *,
        model_name: str | None = None,
        model_token: str | None = None,
        cuda_uuid: str | None = None,
        cubin: bytes | None = None,
    ) -> bool: ...

    def load_graph(
        self,
        source_digest: str,
        build_options: Sequence[str],
        identity: Mapping[str, str],
        cuda_uuid: str,
    ) -> tuple[bytes, list[int] | None, bytes | None] | None: ...

    def save_gpu(self, choice: str, record: Mapping[str, Any]) -> bool: ...


@dataclass
class _LoadPlan:
    """How each partition loads (`Session._plan_loads`), by slot: a build job (None where
    the shipped PTX loaded), the stored tuning choices, the default-kernel programs and the
    PTX executors; ``t0`` is when the load began."""

    parts: Sequence[PartitionArtifact]
    t0: float
    jobs: list[BuildJob | None] = field(default_factory=list)
    stored: list[Any] = field(default_factory=list)
    firsts: dict[int, GpuProgram] = field(default_factory=dict)
    from_ptx: dict[int, Any] = field(default_factory=dict)


class Session:
    """A compiled model bound to a device.

    Attributes:
        device_name: the device, in words.
        compiled: the compiled model being run.
        load_seconds: time to build programs, allocate and upload.
    """

    #: `input_stages`, found at its first call after a change of executors or bindings.
    _stages: dict[int, np.ndarray] | None = None
    #: True while the inferences run on the CPU (the numpy reference), until `_take_over`
    #: puts the device's executors in place.
    _on_cpu = False

    def __init__(
        self,
        model: Model,
        compiled: CompiledModel,
        handle: DeviceHandle | CudaStart,
        *,
        programs: ProgramStore | None = None,
        validate: bool = False,
        tune: bool = True,
        cpu_first: bool = False,
    ) -> None:
        """Load every partition's program onto the device.

        Args:
            model: the model IR (its CPU ops run on the numpy reference).
            compiled: what the compiler made of it.
            handle: the device, its context, queue and profile; or a `CudaStart`, whose
                partitions must all load as the CUDA graphs verified on that GPU before.
            programs: where device binaries and tuning choices are kept (None: nowhere).
            validate: re-run each GPU partition on the reference and report divergences.
            tune: time the schedule variants of programs not yet tuned on this device.
            cpu_first: where programs must be built from source, run the inferences on the
                CPU meanwhile and build in the background (`_cpu_first`,
                ``LITEKILN_CPU_FIRST``); False: build now.

        Raises:
            DeviceError: a partition's program does not build or load on the device.
            CudaStartMiss: a `CudaStart` whose partitions are not all recorded as verified.
        """
        t0 = time.perf_counter()
        self.model = model
        self.graph = model.main
        self.compiled = compiled
        self._start = handle if isinstance(handle, CudaStart) else None
        self._handle = handle if isinstance(handle, DeviceHandle) else None
        #: The device's profile (vendor facts).
        self.profile = handle.profile
        self.device_name = handle.description
        self.validate = validate
        #: When a list, `run` appends ``(kind, step index, seconds)`` as it goes: "cpu" (an op
        #: on numpy), and per GPU partition "gpu_inputs" (staged), "gpu_launch" (enqueued),
        #: "gpu_outputs" (waited for, read back). The bench's host-time breakdown sets it;
        #: None (the default) costs nothing.
        self.step_times: list[tuple[str, int, float]] | None = None
        self.last_report: DivergenceReport | None = None
        self._programs = programs
        self._tune = tune
        #: Threads the ops left on the CPU may use for their matrix products (None: numpy's
        #: own default); the Interpreter's ``num_threads``.
        self.cpu_threads: int | None = None
        self._cpu_steps = any(kind == "cpu" for kind, _ in compiled.steps)
        # `run` holds the lock; the background work (tuning, the CUDA graph upgrade) takes it
        # to time kernels and to swap a launch plan in, so an inference never sees a half-made
        # switch nor kernels of the tuner writing its buffers.
        self._lock = threading.Lock()
        self._background: threading.Thread | None = None
        #: Seconds of the load's steps ("build_s": programs made, "setup_s": buffers,
        #: constants, kernel arguments) and what the cache held ("binaries": partitions
        #: loaded from a stored binary, "tuning": partitions whose stored choices applied,
        #: "partitions"). `litekiln.loading` adds its own steps; `litekiln bench` reports them.
        self.startup: dict[str, Any] = {}
        #: Partitions (slot, program-store key) whose variants are timed after the load.
        self._to_tune: list[tuple[int, _ProgramKey]] = []
        #: Partitions built from source whose binary is stored after the first inference
        #: (`DeviceProfile.binary_read_compiles`).
        self._to_store: list[tuple[int, _ProgramKey]] = []
        #: Set by the first inference (or `wait_for_graph`): the background work starts then,
        #: so that it never competes with the first inference.
        self._ready = threading.Event()
        #: The first start's progress line, kept for the first inference after a build from
        #: source (`BuildProgress.reporting`); None once that has run, or where none shows.
        self._first_progress: Any = None
        #: Partitions whose variant choices are stored or made here (stored with the binary).
        self._chosen: set[int] = set()
        #: Partitions running their default kernels alone (`default_program`): the whole
        #: program is built after the first inference, then tuned and stored.
        self._to_complete: list[tuple[int, _ProgramKey]] = []
        #: Each partition's program-store key.
        self._keys: list[_ProgramKey] = []
        #: The build from source that runs in the background while the inferences run on the
        #: CPU (`_cpu_first`), or None: the partitions load now.
        self._deferred: _LoadPlan | None = None
        #: A copy of the first inference's inputs while on the CPU: the device's first
        #: inference in `_take_over` runs them.
        self._cpu_inputs: dict[int, np.ndarray] | None = None
        #: The notices of a first start on the CPU (`BuildProgress.background_started`), or
        #: None.
        self._notice: Any = None
        self.executors: list[Any] = []
        if self._start is not None:
            self.executors = self._cuda_start(compiled.partitions)
        else:
            plan = self._plan_loads(compiled.partitions)
            if cpu_first and self._cpu_first(plan):
                self._deferred, self._on_cpu = plan, True
            else:
                self.executors = self._load_partitions(plan)
        self._outputs = [_output_arrays(ex) for ex in self.executors]
        #: Application buffers bound to graph inputs and outputs, by tensor index (`bind`).
        self.bindings: dict[int, Binding] = {}
        #: Carried states (`carry`): graph input -> the graph output copied into it after each run.
        self.carries: dict[int, int] = {}
        #: Tensor -> (partition, output position) of the partition that makes it in the form
        #: the graph declares (no 8-bit or dtype conversion on the host): what `carry` copies
        #: on the device.
        self._made_by = {} if self._on_cpu else self._partition_outputs()
        self._bound: _BindingPlan | None = None
        self._opened = t0
        self._start_background()
        self.load_seconds = time.perf_counter() - t0

    @property
    def on_cpu(self) -> bool:
        """Whether the inferences run on the CPU (the numpy reference): while the device's
        programs build in the background (`_cpu_first`), or for good where that build failed."""
        return self._on_cpu

    @property
    def runs_on(self) -> str:
        """Where the next inference runs, in words."""
        if self._on_cpu:
            return f"the CPU (numpy) while {self.device_name} builds"
        return self.device_name

    @property
    def handle(self) -> DeviceHandle:
        """The OpenCL device, its context and queue (after a `CudaStart`, opened now: only
        what needs OpenCL asks, such as binding a pyopencl buffer)."""
        if self._handle is None:
            assert self._start is not None
            self._handle = self._start.opencl()
        return self._handle

    def _cuda_start(self, parts: Sequence[PartitionArtifact]) -> list[Any]:
        """Every partition as the CUDA graph an earlier start verified on this GPU (its
        program and tuning choices from the store, marked with the GPU's UUID); no OpenCL.

        Raises:
            CudaStartMiss: a partition has no such program, or its graph cannot be made.
        """
        from litekiln.runtime.cuda import CudaGraphExecutor, CudaUnsupported

        assert self._start is not None
        cuda, profile = self._start.cuda, self.profile
        t0 = time.perf_counter()
        found = []
        for part in parts:
            if not part.program.launches:
                raise CudaStartMiss(f"partition {part.index} has no kernels")
            drv = profile.driver_for(part.program)
            key = (drv.digest, drv.options, profile.identity())
            got = self._programs.load_graph(*key, cuda.uuid) if self._programs else None
            if got is None:
                raise CudaStartMiss(f"partition {part.index}: no program verified on this GPU")
            self._keys.append(key)
            found.append(got)
        t1 = time.perf_counter()
        executors = []
        try:
            for part, (binary, choices, cubin) in zip(parts, found, strict=True):
                executors.append(
                    CudaGraphExecutor(
                        part.program,
                        partition_constants(self.compiled, part),
                        binary,
                        cuda,
                        choices=choices,
                        streams=config.CUDA_STREAMS.get(),
                        cubin=cubin,
                    )
                )
        except (CudaUnsupported, ValueError) as exc:
            raise CudaStartMiss(f"a stored CUDA graph does not load: {exc}") from None
        self._chosen.update(range(len(parts)))
        tuned = [bool(p.program.variants and f[1]) for p, f in zip(parts, found, strict=True)]
        self.startup.update(
            build_s=t1 - t0,
            setup_s=time.perf_counter() - t1,
            partitions=len(parts),
            binaries=len(parts),
            ptx=0,
            tuning=sum(tuned),
            variants=sum(1 for p in parts if p.program.variants),
            cuda_start=True,
        )
        return executors

    def _plan_loads(self, parts: Sequence[PartitionArtifact]) -> _LoadPlan:
        """What loading every partition takes: its stored binary and choices (program-store
        key in `_keys`), or its shipped PTX loaded as a CUDA graph, else a build from source
        (of the default kernels alone where variants are timed later, `default_program`)."""
        from litekiln.runtime.build import default_program
        from litekiln.runtime.executor import build_job

        profile = self.handle.profile
        plan = _LoadPlan(parts, time.perf_counter())
        for slot, part in enumerate(parts):
            job = build_job(part.program, profile, label=f"partition {part.index}")
            key = (job.driver.digest, job.options, profile.identity())
            binary, choices = self._programs.load_program(*key) if self._programs else (None, None)
            job.binary = binary
            first = default_program(part.program) if binary is None and self._tune else None
            self._keys.append(key)
            plan.stored.append(choices)
            cu = self._ptx_executor(part, first) if binary is None else None
            if cu is not None:  # no OpenCL build before the first inference
                plan.from_ptx[slot] = cu
                plan.jobs.append(None)
                continue
            if first is not None:  # the variants' kernels are built after the first inference
                plan.firsts[slot] = first
                job = build_job(first, profile, label=f"partition {part.index}")
            plan.jobs.append(job)
        return plan

    def _load_partitions(self, plan: _LoadPlan, *, in_background: bool = False) -> list[Any]:
        """Every partition's executor. Programs come from their stored binaries, or are built
        from source together (`build_programs`: in threads, with a progress line); what is new
        is stored at once. Stored variant choices apply; without them the default schedules
        run and the variants are timed after the load (`_start_background`).

        Args:
            plan: what `_plan_loads` found.
            in_background: the build runs while the CPU serves the inferences
                (`_take_over`): no progress line of its own, none for the first inference.
        """
        from litekiln.runtime.build import BuildProgress, build_programs

        h = self.handle
        profile = h.profile
        parts, jobs, firsts, from_ptx = plan.parts, plan.jobs, plan.firsts, plan.from_ptx
        keys = self._keys
        t0 = plan.t0
        todo = [j for j in jobs if j is not None]
        fresh = any(j.binary is None for j in todo) and not in_background
        progress = BuildProgress(self.model.name, self.device_name) if fresh else None
        made = iter(build_programs(todo, h.context, h.device, profile, progress=progress))
        # Drivers that compile each kernel at its first launch (PoCL) make the first
        # inference after a build from source the longer part of a first start: its line too.
        self._first_progress = progress if progress is not None and progress.enabled else None
        built = [None if j is None else next(made) for j in jobs]
        t1 = time.perf_counter()
        executors: list[Any] = []
        tuned = 0
        for slot, (part, res, key, choices) in enumerate(
            zip(parts, built, keys, plan.stored, strict=True)
        ):
            if res is None:  # loaded from its PTX: OpenCL builds the whole program later
                executors.append(from_ptx[slot])
                self._to_complete.append((slot, key))
                continue
            if res.rejected:
                log.warning("cached device binary rejected (%s); rebuilt from source", res.rejected)
            ex = self._executor(part, res, firsts.get(slot))
            if slot in firsts:
                self._to_complete.append((slot, key))
                executors.append(ex)
                continue
            applied = self._apply_choices(ex, choices)
            tuned += applied
            if part.program.variants and not applied and self._tune:
                self._to_tune.append((slot, key))
            if applied:
                self._chosen.add(slot)
            if not ex.from_binary and self._programs is not None and profile.binary_read_compiles:
                self._to_store.append((slot, key))
            elif not ex.from_binary and self._programs is not None and ex.binary:
                self._programs.save_program(
                    *key, ex.binary, tuning=list(ex.choices) if applied else None,
                    model_name=self.compiled.model_name, model_token=self.compiled.token,
                )  # fmt: skip
            executors.append(ex)
        prefix = "device_" if in_background else ""  # (the first start's steps are the CPU's)
        self.startup.update(
            {f"{prefix}build_s": t1 - t0, f"{prefix}setup_s": time.perf_counter() - t1},
            partitions=len(parts),
            binaries=sum(1 for r in built if r is not None and r.from_binary),
            ptx=len(from_ptx),
            tuning=tuned,
            variants=sum(1 for p in parts if p.program.variants),
        )
        return executors

    def _ptx_executor(self, part: PartitionArtifact, first: GpuProgram | None) -> Any:
        """A first start on an NVIDIA GPU: the partition's default kernels from the PTX the
        compiler shipped (`GpuProgram.ptx`), loaded through the CUDA driver as one CUDA graph,
        with no OpenCL build (NVIDIA's OpenCL C front end is most of a build's time: see
        `litekiln.compiler.ptx`). None where that does not apply (no PTX, not NVIDIA,
        ``LITEKILN_CUDA_GRAPH=off``) or fails (logged): the OpenCL build then goes on."""
        if (
            not part.program.ptx
            or not self.profile.cuda_graph_candidate
            or config.CUDA_GRAPH.get() == "off"
        ):
            return None
        from litekiln.runtime.cuda import CudaUnsupported

        try:
            return self._cuda_graph(part, first or part.program, part.program.ptx.encode())
        except CudaUnsupported as exc:
            log.info(
                "%s: partition %d: the shipped PTX is not used (%s); building OpenCL",
                self.model.name, part.index, exc,
            )  # fmt: skip
            return None

    def _cuda_graph(
        self,
        part: PartitionArtifact,
        program: GpuProgram,
        ptx: bytes,
        choices: list[int] | None = None,
        *,
        link: bool = False,
    ) -> Any:
        """``program`` (partition ``part``'s, or its default kernels) as one CUDA graph of
        ``ptx`` on the CUDA device that is this session's GPU.

        Raises:
            CudaUnsupported: as `CudaGraphExecutor` and `cuda_device_for` say.
        """
        from litekiln.runtime.cuda import CudaGraphExecutor

        return CudaGraphExecutor(
            program,
            partition_constants(self.compiled, part),
            ptx,
            self._cuda_gpu(),
            choices=choices,
            streams=config.CUDA_STREAMS.get(),
            link=link,
        )

    def _executor(
        self, part: PartitionArtifact, built: BuiltProgram, program: GpuProgram | None = None
    ) -> PartitionExecutor:
        """The partition's executor on its built program (``program``: the partition's
        program cut to its default kernels, `default_program`)."""
        from litekiln.runtime.executor import ExecutorError, PartitionExecutor

        h = self.handle
        try:
            if built.error is not None:
                raise ExecutorError(str(built.error))
            consts = partition_constants(self.compiled, part)
            return PartitionExecutor(
                program or part.program, consts, h.context, h.queue, None, h.profile, built=built
            )
        except ExecutorError as exc:
            raise DeviceError(f"{self.model.name}: partition {part.index}: {exc}") from None

    @staticmethod
    def _apply_choices(ex: PartitionExecutor, choices: Any) -> bool:
        """Apply stored variant choices; False when there are none that fit the program."""
        if choices is None or not ex.program.variants:
            return False
        try:
            ex.select(choices)
        except ValueError:
            return False
        return True

    def _cpu_first(self, plan: _LoadPlan) -> bool:
        """Whether this start runs its inferences on the CPU while the device's programs build
        from source in the background (the ``cpu_first`` option): where some partition has
        neither a stored binary nor shipped PTX, the session is not validating and the CUDA
        graph path is not demanded at load (``LITEKILN_CUDA_GRAPH=on``). Records what the
        cache held, as `_load_partitions` would."""
        build = [j for j in plan.jobs if j is not None and j.binary is None]
        if (
            not build
            # (a driver that refuses half kernels is met at load: `litekiln.loading` retries
            # with emulated half then)
            or any(j.uses_half for j in build)
            or self.validate
            or config.CUDA_GRAPH.get() == "on"
        ):
            return False
        parts = plan.parts
        self.startup.update(
            build_s=0.0,
            setup_s=0.0,
            partitions=len(parts),
            binaries=sum(1 for j in plan.jobs if j is not None and j.binary is not None),
            ptx=len(plan.from_ptx),
            tuning=0,
            variants=sum(1 for p in parts if p.program.variants),
            cpu_first=True,
        )
        from litekiln.runtime.build import BuildProgress

        self._notice = BuildProgress(self.model.name, self.device_name)
        self._notice.background_started(len(build))
        return True

    def _take_over(self) -> bool:
        """Build the deferred programs (`_cpu_first`), run the device's first inference on
        the inputs of the first inference the CPU ran (PoCL compiles each kernel then),
        checked against the CPU's values, and put the device's executors in place between two
        inferences. A build that fails leaves the model on the CPU, with a warning saying why.

        Returns:
            Whether the device took over.
        """
        plan, self._deferred = self._deferred, None
        assert plan is not None
        plan.t0 = t0 = time.perf_counter()
        try:
            executors = self._load_partitions(plan, in_background=True)
        except DeviceError as exc:
            log.warning("%s: the model stays on the CPU: %s", self.model.name, exc)
            if self._notice is not None:
                self._notice.background_failed()
            return False
        inputs = self._cpu_inputs
        # (the foreground reads none of these while `_on_cpu`)
        self.executors = executors
        self._outputs = [_output_arrays(ex) for ex in executors]
        if inputs is not None:
            report = DivergenceReport(ok=True)
            try:
                self._limited_run(inputs, report=report)
            except Exception as exc:  # noqa: BLE001 - the CPU keeps serving, and says why
                log.warning(
                    "%s: the model stays on the CPU: the device's first inference failed: %s: %s",
                    self.model.name, type(exc).__name__, exc,
                )  # fmt: skip
                if self._notice is not None:
                    self._notice.background_failed()
                return False
            if not report.ok:
                log.warning("%s: the device's first inference: %s", self.model.name, report)
            # Stored while the CPU still serves: reading a binary back holds the driver's
            # program lock for seconds on PoCL, which would stall the device's next inference.
            self._store_pending()
        with self._lock:
            self._made_by = self._partition_outputs()
            self._stages = None
            self._on_cpu = False
            self._cpu_inputs = None
        now = time.perf_counter()
        self.startup.update(device_ready_at=now, device_ready_s=now - self._opened)
        if inputs is not None:
            self.startup["device_first_run_s"] = now - t0 - self.startup.get("device_build_s", 0.0)
            self._ready.set()  # (the device's first inference is done)
        if self._notice is not None:
            self._notice.background_done(now - t0)
        return True

    def _start_background(self) -> None:
        """Tune, store, then move onto CUDA graphs, without holding up the first inference.

        Tuning (timing the schedule variants of programs without stored choices on this
        device), storing the binaries not stored yet and the CUDA graph upgrade
        (`_graph_todo`) run in one background thread, in that order (the graph replays the
        tuned plan), once the first inference is done (or `wait_for_graph` is called): the
        session is ready at once on the default schedules, and the first inference has the
        device to itself. ``LITEKILN_CUDA_GRAPH=on`` does all of it here, now.
        """
        graph = self._graph_todo()
        if (
            not self._on_cpu
            and not self._to_complete
            and not self._to_tune
            and not self._to_store
            and not graph
        ):
            return
        if config.CUDA_GRAPH.get() == "on":
            self._complete_pending()
            self._tune_pending()
            self._store_pending()
            self._upgrade(self._graph_todo())
            return
        self._background = threading.Thread(
            target=self._in_background, daemon=True, name="litekiln-background"
        )
        _UPGRADES.add(self._background)
        if self._notice is not None:
            _EXIT_NOTICES[self._background] = self._exit_notice
        self._background.start()

    def _in_background(self) -> None:
        try:
            if self._on_cpu and not self._take_over():
                return
            while not self._ready.wait(0.1):
                # (a wait that timed out as the first inference ended and the process began
                # to exit: `_ready` is set by then, and the work still runs)
                if _STOPPING.is_set() and not self._ready.is_set():
                    return  # exiting before any inference: the next start builds again
            self._complete_pending()
            self._tune_pending()
            self._store_pending()
            graph = self._graph_todo()  # (on the executors that stay)
            if graph and not _STOPPING.is_set():
                self._upgrade(graph)
        except Exception as exc:  # noqa: BLE001 - never let the background work break a session
            log.warning(
                "%s: background tuning stopped: %s: %s", self.model.name, type(exc).__name__, exc
            )
        finally:
            _UPGRADES.discard(threading.current_thread())
            _EXIT_NOTICES.pop(threading.current_thread(), None)

    def _exit_notice(self) -> None:
        """At exit, while the deferred build (`_cpu_first`) still runs: say why the exit waits."""
        if self._on_cpu and self._notice is not None:
            self._notice.exiting()

    def _complete_pending(self) -> None:
        """Build the whole program of each partition that started on its default kernels
        (`default_program`), and swap its executor in between two inferences; it is then tuned
        and stored like any program built from source. A build that fails keeps the default
        kernels (a warning says why)."""
        from litekiln.runtime.build import build_programs
        from litekiln.runtime.executor import build_job

        profile = self.handle.profile
        while self._to_complete and not _STOPPING.is_set():
            slot, key = self._to_complete.pop(0)
            part = self.compiled.partitions[slot]
            job = build_job(part.program, profile, label=f"partition {part.index}")
            built = build_programs(
                [job], self.handle.context, self.handle.device, profile, fallback=False
            )[0]
            try:
                ex = self._executor(part, built)
            except DeviceError as exc:
                log.warning("%s: the tuning variants stay unbuilt: %s", self.model.name, exc)
                continue
            self._swap(slot, ex)
            tune = self._tune and bool(ex.program.variants)
            if tune:
                self._to_tune.append((slot, key))
            if self._programs is not None and profile.binary_read_compiles:
                self._to_store.append((slot, key))
            elif not tune:
                self._save(slot, key)  # (a tuned program is stored with its choices)

    def _swap(self, slot: int, ex: Any) -> None:
        """Put ``ex`` in partition ``slot``'s place, between two inferences."""
        with self._lock:
            self.executors[slot] = ex
            self._outputs[slot] = _output_arrays(ex)
            self._stages = None  # (the new executor stages its inputs elsewhere)
            if self.bindings:  # made on the executor that goes: hand them over
                self._plan_bindings()

    def _tune_pending(self) -> None:
        """Time the variants of the partitions without stored choices, and store the choices."""
        while self._to_tune:
            slot, key = self._to_tune[0]
            ex = self.executors[slot]
            picked = ex.tune(lock=self._lock, stop=_STOPPING)
            if picked is None:
                return  # the process is exiting: the next start tunes again
            self._to_tune.pop(0)
            self._chosen.add(slot)
            log.info(
                "%s: partition %d tuned: %d of %d kernels changed",
                self.model.name, slot, sum(1 for c in picked if c), len(picked),
            )  # fmt: skip
            if (slot, key) not in self._to_store:
                self._save(slot, key)

    def _store_pending(self) -> None:
        """Store the binaries of the programs built from source (with their tuning choices,
        if made): read after the first inference, the binary holds the kernels compiled for
        their launch sizes (PoCL), and reading it stalls no inference (ctypes, no lock)."""
        while self._to_store:
            self._save(*self._to_store.pop(0))

    def _save(self, slot: int, key: _ProgramKey) -> None:
        ex = self.executors[slot]
        binary = getattr(ex, "binary", None)
        if self._programs is None or not binary:
            return
        self._programs.save_program(
            *key, binary, tuning=list(ex.choices) if slot in self._chosen else None,
            model_name=self.compiled.model_name, model_token=self.compiled.token,
        )  # fmt: skip

    def _graph_todo(self) -> list[tuple[int, Any]]:
        """The partitions to move onto CUDA graphs (NVIDIA; `_graph_path`), or none.

        Under ``LITEKILN_CUDA_GRAPH=auto`` this happens in the background thread: the session
        is ready on the OpenCL executors at once (starting the CUDA driver and a context costs
        another ~100-200 ms on the H100, after OpenCL's own start), the first inferences run
        there, and each partition switches to its graph between two inferences once the graph
        is built and checked. `wait_for_graph` waits for that. ``on`` does it while the model
        loads, and fails if any partition cannot take the graph path; ``off`` never touches
        CUDA.

        Raises:
            DeviceError: ``on``, and the device is not an NVIDIA OpenCL device.
        """
        mode = config.CUDA_GRAPH.get()
        todo = [
            (slot, ex)
            for slot, ex in enumerate(self.executors)
            if ex.program.launches and getattr(ex, "memory_kind", "") != "cuda"
        ]
        if mode == "off" or not todo:
            return []
        if not self.profile.cuda_graph_candidate:
            if mode == "on":
                raise DeviceError(
                    f"{self.model.name}: LITEKILN_CUDA_GRAPH=on, but {self.device_name} is not "
                    "an NVIDIA OpenCL device"
                )
            return []
        return todo

    def _upgrade(self, todo: list[tuple[int, Any]]) -> None:
        try:
            for slot, ex in todo:
                cu = self._graph_path(ex, slot)
                if cu is not ex:
                    cu.tuning_ms = getattr(ex, "tuning_ms", [])  # (for reports)
                    self._swap(slot, cu)
                    self._mark_verified(slot, cu)
            self._record_gpu()
        except Exception as exc:  # noqa: BLE001 - never let the background upgrade break a session
            if threading.current_thread() is not self._background:
                raise  # (``on``: here, now, errors included)
            log.warning(
                "%s: CUDA graph path abandoned: %s: %s", self.model.name, type(exc).__name__, exc
            )

    def _mark_verified(self, slot: int, cu: Any) -> None:
        """Store partition ``slot``'s program (the PTX its graph replays, with its tuning
        choices) marked as verified on this GPU, for a later `CudaStart`."""
        if self._programs is None or slot >= len(self._keys):
            return
        self._programs.save_program(
            *self._keys[slot], cu.binary,
            tuning=list(cu.choices) if slot in self._chosen else None,
            model_name=self.compiled.model_name, model_token=self.compiled.token,
            cuda_uuid=cu.device.uuid, cubin=cu.cubin,
        )  # fmt: skip

    def _record_gpu(self) -> None:
        """Once every partition with kernels runs as a verified CUDA graph: record the GPU for
        a later `CudaStart` with this device choice (`litekiln.runtime.device.known_gpu`)."""
        h = self._handle
        if (
            self._programs is None
            or h is None
            or h.choice not in KNOWN_CHOICES
            or any(
                ex.program.launches and getattr(ex, "memory_kind", "") != "cuda"
                for ex in self.executors
            )
        ):
            return
        from litekiln.runtime.device import known_gpu

        self._programs.save_gpu(h.choice, known_gpu(h, self._cuda_gpu()))

    def wait_for_graph(self, timeout: float | None = None) -> None:
        """Wait until the background work (tuning, the CUDA graph upgrade; if any) has
        finished: from then on `executors` holds the launch path and the schedules every
        later inference takes, and the tuning choices are stored."""
        self._ready.set()
        t = self._background
        if t is not None:
            t.join(timeout)

    def _graph_path(self, ex: Any, slot: int) -> Any:
        """The CUDA graph executor of ``ex``'s program on NVIDIA GPUs, else ``ex`` itself.

        `litekiln.runtime.cuda` says why: NVIDIA's OpenCL spends ~5 us of host time per
        kernel launch, a graph replays the partition in one call. Before it replaces the
        OpenCL executor, one inference on seeded inputs must give the same outputs on both
        (the same PTX runs in both, so they agree to the bit unless something is wrong).
        """
        from litekiln.runtime.cuda import CudaUnsupported, NotNvidiaDevice

        part = self.compiled.partitions[slot]
        try:
            binary = ex.binary  # (copied out of the driver when it was built from source)
            if not binary:
                raise CudaUnsupported("the OpenCL driver reports no program binary")
            # (linked into a cubin first: the graph compared below is the one a later
            # `CudaStart` loads, with no PTX compiled then)
            cu = self._cuda_graph(part, ex.program, binary, ex.choices, link=True)
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
                An array of `input_stages` given for its own input is not copied again.

        Returns:
            tensor index -> value for the graph outputs and every tensor crossing a
            partition boundary. GPU outputs live in host arrays that the next `run`
            overwrites: copy what must outlive it.
        """
        with self._lock:
            if self._on_cpu:  # the device's programs still build (`_cpu_first`)
                return self._cpu_run(inputs)
            first, self._first_progress = self._first_progress, None
            if first is not None:  # the first inference after a build from source
                values = first.reporting(lambda: self._limited_run(inputs))
            else:
                values = self._limited_run(inputs)
        if not self._ready.is_set():
            self._ready.set()
        return values

    def _cpu_run(self, inputs: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
        """One inference on the numpy reference (every op on the CPU; under the lock)."""
        if self._cpu_inputs is None:  # (for the device's first inference, `_take_over`)
            self._cpu_inputs = {t: np.array(v, copy=True) for t, v in inputs.items()}
        with cpu_thread_limit(self.cpu_threads):
            return run_graph(self.graph, inputs, intermediates=True)

    def _limited_run(
        self, inputs: Mapping[int, np.ndarray], report: DivergenceReport | None = None
    ) -> dict[int, np.ndarray]:
        """`_run` within the CPU ops' thread limit, where there are CPU ops and a limit."""
        if self._cpu_steps and self.cpu_threads is not None:
            with cpu_thread_limit(self.cpu_threads):
                return self._run(inputs, report)
        return self._run(inputs, report)  # (no context manager to enter: ~2 us of host time)

    def input_stages(self) -> dict[int, np.ndarray]:
        """Graph input -> the host array `run` stages it in (a CUDA graph's pinned input
        block), for the inputs staged that way with the graph's dtype and shape. Writing an
        input's value there and passing that very array to `run` saves one host copy per
        inference. Every `run` given another array for the input overwrites it, and a new
        mapping (another dict) replaces this one when the launch path or a binding changes.
        """
        stages = self._stages
        if stages is None:
            with self._lock:  # (not while the background work swaps an executor in)
                stages = self._stages = self._find_stages()
        return stages

    def _find_stages(self) -> dict[int, np.ndarray]:
        if self._on_cpu:
            return {}
        g = self.graph
        stages: dict[int, np.ndarray] = {}
        for kind, idx in self.compiled.steps:
            ex = self.executors[idx] if kind == "gpu" else None
            if ex is None or not hasattr(ex, "input_buffers"):
                continue
            part = self.compiled.partitions[idx]
            for t, stage in zip(part.inputs, ex.input_buffers(), strict=True):
                tensor = g.tensors[t]
                if (
                    t in g.inputs
                    and t not in stages
                    and t not in self.bindings
                    and stage.dtype == tensor.dtype  # (8-bit: a program taking integers)
                    and stage.shape == tuple(tensor.shape)
                ):
                    stages[t] = stage
        return stages

    @functools.cached_property
    def _index_limits(self) -> dict[int, list[tuple[np.ndarray, str]]]:
        """The host tensors that GPU partitions read as run-time indices with bounds (a
        token's ids, a gather's positions: `litekiln.ops.base.index_limits`), checked before
        each upload: the kernels clamp, the CPU path would refuse."""
        g = self.graph
        parts = [self.compiled.partitions[i] for kind, i in self.compiled.steps if kind == "gpu"]
        if not any(g.tensors[t].dtype == np.int32 for p in parts for t in p.inputs):
            return {}  # (none: the op registry stays unimported on a warm start)
        from litekiln.ops.base import index_limits

        return index_limits(g, [i for p in parts for i in p.ops])

    @functools.cached_property
    def _step_plan(self) -> list[tuple[Any, ...]]:
        """`compiled.steps` with what `_run` looks up for each made once: a CPU step's op; a
        GPU step's partition, its (input position, tensor, tensor if 8-bit and dequantized
        here) and its (output position, tensor, graph tensor, whether 8-bit and quantized
        here). A program that takes or returns an 8-bit tensor as its integers (de)quantizes
        it itself (`_integer_io`)."""
        g = self.graph
        plan: list[tuple[Any, ...]] = []
        for kind, idx in self.compiled.steps:
            if kind == "cpu":
                plan.append((kind, idx, [g.ops[idx]]))
                continue
            part = self.compiled.partitions[idx]
            program = part.program
            raw_in = _integer_io(program, program.inputs)
            raw_out = _integer_io(program, program.outputs)
            ins = tuple(
                (i, t, g.tensors[t] if is_quantized(g.tensors[t]) and i not in raw_in else None)
                for i, t in enumerate(part.inputs)
            )
            outs = tuple(
                (i, t, g.tensors[t], is_quantized(g.tensors[t]) and i not in raw_out)
                for i, t in enumerate(part.outputs)
            )
            plan.append((kind, idx, part, ins, outs))
        return plan

    def _run(
        self, inputs: Mapping[int, np.ndarray], report: DivergenceReport | None = None
    ) -> dict[int, np.ndarray]:
        """One inference on the device's executors and the CPU ops between them; each GPU
        partition checked against the reference when validating, or into ``report``."""
        g = self.graph
        values: dict[int, np.ndarray] = dict(inputs)
        if report is None and self.validate:
            report = DivergenceReport(ok=True)
        times = self.step_times
        clock = time.perf_counter
        bound = self._bound
        direct_in: set[tuple[int, int]] = set()
        device_only: set[tuple[int, int]] = set()
        if bound is not None:
            direct_in, device_only = bound.direct_in, bound.device_only
            for buf in bound.syncs:
                buf.before_run()
            for t, buf in bound.host_reads:
                values[t] = buf.read()
        limits = self._index_limits
        for step in self._step_plan:
            t0 = clock() if times is not None else 0.0
            if step[0] == "cpu":
                run_ops(step[2], g, values)
                if times is not None:
                    times.append(("cpu", step[1], clock() - t0))
                continue
            _, idx, part, ins, outs = step
            ex = self.executors[idx]
            for i, t, quantized in ins:
                if direct_in and (idx, i) in direct_in:
                    continue  # read from its bound buffer
                x = values[t]
                if t in limits:
                    check_indices(x, limits[t])
                if quantized is not None:
                    # (a program that takes the float view, made here: an older compiler's,
                    # or an integer wider than the compiler's INTEGER_IO_DTYPES)
                    x = dequantize(x, quantized)
                # (the executor converts to its dtype while it copies: no second copy here)
                ex.set_input(i, x, blocking=False)
            if times is not None:
                t1 = clock()
                times.append(("gpu_inputs", idx, t1 - t0))
                t0 = t1
            ex.run()
            if times is not None:
                t1 = clock()
                times.append(("gpu_launch", idx, t1 - t0))
                t0 = t1
            arrays = self._outputs[idx]
            for i, t, tensor, quantized in outs:
                if device_only and (idx, i) in device_only:
                    continue  # in its bound buffer, and nothing reads it on the host
                y = ex.get_output(i, out=arrays[i])
                if quantized:  # (a program that returns the float view: an older compiler's,
                    # or one compiled without the quantization simulation)
                    y = quantize(y.astype(np.float32), tensor)
                elif y.dtype != tensor.dtype:
                    y = y.astype(tensor.dtype)
                values[t] = y
            if times is not None:
                times.append(("gpu_outputs", idx, clock() - t0))
            if report is not None and report.ok:
                self._validate_partition(part, values, report)
        if report is not None and self.validate:
            self.last_report = report
            if not report.ok:
                log.warning("%s", report)
        if bound is not None:
            for t, buf in bound.host_writes:
                buf.write(values[t])
            for dst, src in bound.host_carries:  # states no partition forwards itself
                self.bindings[dst].buffer.write(values[src])
            for ex in bound.finish:
                ex.finish()
        return values

    # ------------------------------------------------------------------ bound buffers
    def bind(self, tensor: int, buffer: Any, role: str, *, sync: bool = True) -> Binding:
        """Bind an application's device buffer to a graph input or output.

        From the next `run` on, a bound input is read from ``buffer`` (not from the ``inputs``
        argument) and a bound output is written into it; `run` then returns no host value for
        a bound output that no op on the CPU needs. Where a GPU partition reads the input or
        makes the output, its kernels use the buffer itself (an OpenCL buffer on the OpenCL
        path, CUDA memory on the CUDA graph path); where the CPU needs the value, or the
        partition's launch path cannot use that kind of memory, the run copies it through the
        host (`Binding.host` says why; a warning says so once). Waits for the background CUDA
        graph upgrade first, so the binding is made on the launch path that stays.

        Args:
            tensor: the graph input or output tensor index.
            buffer: a ``pyopencl.Buffer`` or ``pyopencl.array.Array`` in the session's
                context, or CUDA memory through DLPack (`litekiln.runtime.buffers`).
            role: ``"input"`` or ``"output"``.
            sync: CUDA tensors: before each run, export the tensor for the session's stream
                (``__dlpack__(stream=...)``), so that its library orders its pending work
                first (DLPack's contract; once per run and library for torch and cupy).
                False: the application makes sure of it.

        Returns:
            The binding (``bindings[tensor]``).

        Raises:
            InputError: not a graph input (output), already bound the other way, or a buffer
                whose shape, dtype, size or layout does not fit.
            DeviceError: a buffer in another context or on another device, or CUDA memory
                where there is no CUDA device.
        """
        g = self.graph
        names = g.inputs if role == "input" else g.outputs
        if tensor not in names:
            listing = [(t, g.tensors[t].name) for t in names]
            raise InputError(
                f"tensor {tensor} is not a graph {role}; the model's {role}s are {listing}"
            )
        other = self.bindings.get(tensor)
        if other is not None and other.buffer.slot.role != role:
            raise InputError(
                f"tensor {tensor} ({g.tensors[tensor].name!r}) is already bound as an "
                f"{other.buffer.slot.role}; unbind it first"
            )
        if tensor in self.carries:
            raise InputError(
                f"tensor {tensor} ({g.tensors[tensor].name!r}) carries a state "
                "(carry_state); unbind it first"
            )
        self.wait_for_graph()
        self._check_device()
        slot = self._slot(tensor, role)
        with self._lock:
            buf = device_buffer(
                buffer,
                slot,
                context=self.handle.context,
                queue=self.handle.queue,
                cuda_device=self._cuda_device,
                sync=sync,
            )
            binding = self._install({tensor: buf})[tensor]
        self._warn_host_copies(binding)
        return binding

    def carry(self, output: int, input: int) -> Binding:
        """Feed a graph output back into a graph input after each run, on the device.

        The session binds a buffer of its own to the input (memory of the launch path that
        reads it: OpenCL, or CUDA on the graph path) and, at the end of each run, enqueues one
        device copy into it from where the partition that makes the output left it. The
        output itself stays as it was: returned by `run`, or bound by the application. The
        input starts at zero (`reset_state`); `write_bound` sets it. A recurrent cell's state
        (the basic LSTM's new activation and cell state into its previous ones) thus never
        leaves the device between inferences.

        A variable tensor that an op's kernel writes back (``Subgraph.variable_updates``)
        is carried the same way, from the tensor holding its new value.

        Returns:
            The input's binding (its ``host`` says where a step on the CPU makes the host
            copy it anyway).

        Raises:
            InputError: not a graph output and a graph input, their shapes or dtypes differ,
                or the input is bound already.
        """
        g = self.graph
        variables = [v for v in g.variable_updates if v not in g.inputs]
        kept, takers = g.kept_outputs, [*g.inputs, *variables]
        for t, role, names in ((output, "output", kept), (input, "input", takers)):
            if t not in names:
                listing = [(i, g.tensors[i].name) for i in names]
                raise InputError(
                    f"tensor {t} is not a graph {role}; the model's {role}s are {listing}"
                )
        if input in self.bindings:
            raise InputError(
                f"tensor {input} ({g.tensors[input].name!r}) is already bound; unbind it first"
            )
        src, dst = self._slot(output, "output"), self._slot(input, "input")
        if (src.shape, src.dtype) != (dst.shape, dst.dtype):
            raise InputError(
                f"cannot carry {src} into {dst}: a state is carried into an input of its "
                "own shape and dtype"
            )
        self.wait_for_graph()
        self._check_device()
        with self._lock:
            buf = state_buffer(
                self._state_memory(input, output), dst, context=self.handle.context,
                queue=self.handle.queue, cuda_device=self._cuda_device,
            )  # fmt: skip
            self.carries[input] = output  # (planned by _install)
            try:
                binding = self._install({input: buf})[input]
            except BaseException:
                del self.carries[input]
                raise
        self._warn_host_copies(binding)
        return binding

    def _check_device(self) -> None:
        """Raise where the model stays on the CPU (its programs did not build, `_take_over`):
        there is no device memory to bind."""
        if self._on_cpu:
            raise DeviceError(
                f"{self.model.name}: the model runs on the CPU (its programs for "
                f"{self.device_name} did not build: see the warning), so no device buffer "
                "can be bound to it"
            )

    def reset_state(self, inputs: Sequence[int] | None = None) -> None:
        """Zero the carried inputs (`carry`) among ``inputs`` (None: every one)."""
        with self._lock:
            for t in self.carries:
                if inputs is not None and t not in inputs:
                    continue
                buf = self.bindings[t].buffer
                buf.write(np.zeros(buf.slot.shape, buf.slot.dtype))

    def write_bound(self, tensor: int, value: np.ndarray) -> None:
        """Copy a host value into a bound input's buffer (a carried state's start value)."""
        with self._lock:
            self.bindings[tensor].buffer.write(value)

    def _partition_outputs(self) -> dict[int, tuple[int, int]]:
        out: dict[int, tuple[int, int]] = {}
        for kind, idx in self.compiled.steps:
            if kind != "gpu":
                continue
            ex = self.executors[idx]
            for i, t in enumerate(self.compiled.partitions[idx].outputs):
                tensor, spec = self.graph.tensors[t], ex.output_spec(i)
                same = np.dtype(spec.dtype) == tensor.dtype and tuple(spec.shape) == tensor.shape
                if same and not is_quantized(tensor):
                    out.setdefault(t, (idx, i))
        return out

    def _slot(self, tensor: int, role: str) -> TensorSlot:
        t = self.graph.tensors[tensor]
        return TensorSlot(role, tensor, t.name, tuple(t.shape), np.dtype(t.dtype))

    def _state_memory(self, input: int, output: int) -> str:
        """Where a carried state lives: the memory of the first GPU partition that reads the
        input or makes the output (OpenCL when no partition does)."""
        for kind, idx in self.compiled.steps:
            part = self.compiled.partitions[idx] if kind == "gpu" else None
            if part is not None and (input in part.inputs or output in part.outputs):
                return str(getattr(self.executors[idx], "memory_kind", "opencl"))
        return "opencl"

    def _install(self, buffers: dict[int, DeviceBuffer]) -> dict[int, Binding]:
        """Bind ``buffers`` (under the lock) and re-plan: all of them, or none on error."""
        previous = {t: self.bindings.get(t) for t in buffers}
        for t, buf in buffers.items():
            self.bindings[t] = Binding(buf)
        try:
            self._plan_bindings()
        except BaseException:
            for t, prev in previous.items():
                if prev is None:
                    self.bindings.pop(t, None)
                else:
                    self.bindings[t] = prev
            self._plan_bindings()
            raise
        return {t: self.bindings[t] for t in buffers}

    def _warn_host_copies(self, binding: Binding) -> None:
        if binding.host:
            buf = binding.buffer
            log.warning(
                "%s: %s: bound to a %s, but copied through the host on each inference: %s",
                self.model.name, buf.slot, buf.describe(), "; ".join(binding.host),
            )  # fmt: skip

    def unbind(self, tensor: int | None = None) -> None:
        """Unbind a tensor (None: every tensor): back to host values for the next `run`.
        Unbinding either end of a carried state (`carry`) ends the carry."""
        with self._lock:
            if tensor is None:
                self.bindings.clear()
                self.carries.clear()
            else:
                self.bindings.pop(tensor, None)
                for dst, src in list(self.carries.items()):  # either end ends a carry
                    if tensor in (dst, src):
                        del self.carries[dst]
                        self.bindings.pop(dst, None)
            self._plan_bindings()

    def read_bound(self, tensor: int) -> np.ndarray:
        """A host copy of what a bound buffer holds now (after `run`: the tensor's value).

        Raises:
            KeyError: the tensor is not bound.
        """
        with self._lock:
            return self.bindings[tensor].buffer.read()

    def _cuda_gpu(self) -> Any:
        """The CUDA device that is this session's GPU.

        Raises:
            CudaUnsupported: as `litekiln.runtime.cuda.cuda_device_for`.
        """
        if self._start is not None:
            return self._start.cuda
        from litekiln.runtime.cuda import cuda_device_for

        return cuda_device_for(self.handle.device, self.profile)

    def _cuda_device(self) -> Any:
        """The CUDA device that is this session's GPU (for CUDA memory given to `bind`)."""
        from litekiln.runtime.cuda import CudaUnsupported

        try:
            return self._cuda_gpu()
        except CudaUnsupported as exc:
            raise DeviceError(
                f"CUDA memory cannot be bound on {self.device_name}: {exc}; bind a "
                "pyopencl.Buffer of the interpreter's context (Interpreter.get_device())"
            ) from None

    def _plan_bindings(self) -> None:
        """Hand each executor the bound buffers it can use directly, and plan the host copies
        of the others (`_BindingPlan`). Called under the lock whenever a binding changes."""
        self._stages = None  # (a bound input is not staged)
        for ex in self.executors:
            for i in range(ex.num_inputs):
                ex.unbind_input(i)
            for i in range(ex.num_outputs):
                ex.unbind_output(i)
            ex.drop_forwards()
        for b in self.bindings.values():
            b.direct.clear()
            b.host.clear()
        if not self.bindings:
            self._bound = None
            return
        plan = _BindingPlan()
        host_use = self._plan_inputs(plan)
        self._plan_outputs(plan, host_use)
        self._plan_carries(plan)
        plan.syncs = _stream_syncs([b.buffer for b in self.bindings.values()])
        self._bound = plan

    def _plan_carries(self, plan: _BindingPlan) -> None:
        """Carried states: the partition that makes the output copies it into the input's
        buffer itself after its kernels (on the CUDA graph path, a node of the graph) where
        its memory is of the buffer's kind; the others are copied by `run` at its end."""
        for dst, src in self.carries.items():
            if dst not in self.bindings:  # (a carry being made failed to bind)
                continue
            buf, made = self.bindings[dst].buffer, self._made_by.get(src)
            if made is not None:
                ex = self.executors[made[0]]
                if getattr(ex, "memory_kind", "") == buf.kind:
                    ex.forward_output(made[1], _native(buf)[0])
                    continue
            plan.host_carries.append((dst, src))

    def _bound_as(self, role: str) -> dict[int, Binding]:
        return {t: b for t, b in self.bindings.items() if b.buffer.slot.role == role}

    def _plan_inputs(self, plan: _BindingPlan) -> set[int]:
        """Bind the inputs the partitions read directly; returns the tensors some step reads
        on the host (the bound inputs among them are read into host memory by each run)."""
        g = self.graph
        inputs = self._bound_as("input")
        host_use: set[int] = set()
        for kind, idx in self.compiled.steps:
            if kind == "cpu":
                op = g.ops[idx]
                host_use.update(op.inputs)
                for t in op.inputs:
                    if t in inputs:
                        inputs[t].host.append(f"op #{idx} ({op.name}) runs on the CPU")
                continue
            ex = self.executors[idx]
            for i, t in enumerate(self.compiled.partitions[idx].inputs):
                b = inputs.get(t)
                why = self._not_direct(b, ex, ex.input_spec(i), idx) if b else "unbound"
                if b is not None and not why:
                    _bind_executor(ex, "input", i, b.buffer)
                    plan.direct_in.add((idx, i))
                    b.direct.append(f"read by partition {idx}")
                    continue
                host_use.add(t)
                if b is not None:
                    b.host.append(why)
        if self.validate:  # the check re-runs each partition on its inputs' host values
            for part in self.compiled.partitions:
                host_use.update(part.inputs)
        for t, b in inputs.items():
            if t in host_use or t in g.outputs:
                plan.host_reads.append((t, b.buffer))
        return host_use

    def _plan_outputs(self, plan: _BindingPlan, host_use: set[int]) -> None:
        """Bind the outputs the partitions write directly; plan host writes for the others."""
        outputs = self._bound_as("output")
        made: set[int] = set()
        for kind, idx in self.compiled.steps:
            if kind != "gpu":
                continue
            ex = self.executors[idx]
            for i, t in enumerate(self.compiled.partitions[idx].outputs):
                b = outputs.get(t)
                if b is None or t in made:
                    continue
                made.add(t)
                why = self._not_direct(b, ex, ex.output_spec(i), idx)
                if why:
                    b.host.append(why)
                    plan.host_writes.append((t, b.buffer))
                    continue
                in_place = _bind_executor(ex, "output", i, b.buffer)
                how = "in place" if in_place else "through a copy on the device"
                b.direct.append(f"written by partition {idx} {how}")
                if t not in host_use and not self.validate:
                    plan.device_only.add((idx, i))
                if ex not in plan.finish:
                    plan.finish.append(ex)
        for t, b in outputs.items():
            if t not in made:
                b.host.append("made by an op on the CPU")
                plan.host_writes.append((t, b.buffer))

    def _not_direct(self, b: Binding, ex: Any, spec: Any, part: int) -> str:
        """Why partition ``part``'s executor cannot use ``b``'s buffer itself ('' if it can)."""
        tensor = self.graph.tensors[b.buffer.slot.index]
        kind = getattr(ex, "memory_kind", "")
        if b.buffer.kind != kind:
            path = "one CUDA graph" if kind == "cuda" else "OpenCL launches"
            return f"partition {part} runs as {path}, which cannot use {b.buffer.kind} memory"
        if is_quantized(tensor) and np.dtype(spec.dtype) != tensor.dtype:
            return "8-bit tensors are (de)quantized on the CPU"
        if np.dtype(spec.dtype) != tensor.dtype or tuple(spec.shape) != tuple(tensor.shape):
            return f"partition {part} takes it as {spec.dtype}{list(spec.shape)}"
        return ""

    def _validate_partition(
        self, part: Any, values: dict[int, np.ndarray], report: DivergenceReport
    ) -> None:
        """Re-run the partition's ops on the reference and compare every tensor the GPU kept."""
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
                if is_quantized(g.tensors[t]) and r.size and ref[t].dtype.kind in "iu":
                    # The float view's rounding drifts along a chain of quantized ops: a share
                    # of the integer range, never less than one step.
                    info = np.iinfo(ref[t].dtype)
                    tol = max(tol, 1.0, FLOAT_VIEW_RANGE_SHARE * (int(info.max) - int(info.min)))
                report.checked += 1
                if err > tol:
                    report.ok = False
                    report.tensor, report.name, report.op = t, g.tensors[t].name, i
                    report.max_abs_error, report.tolerance = err, tol
                    return


#: DLPack producers whose ``__dlpack__(stream=s)`` makes ``s`` wait for their current stream
#: whichever tensor is exported (torch, cupy): one export per run orders all their tensors.
_STREAM_WIDE = ("torch", "cupy")


def _integer_io(program: GpuProgram, ids: Sequence[int]) -> frozenset[int]:
    """Positions in ``ids`` (the program's inputs or outputs) of integer tensors: quantized
    tensors the program takes as their integers and dequantizes, or quantizes and returns as
    integers, on the device (the compiler's `INTEGER_IO_DTYPES`)."""
    specs = {spec.id: spec for spec in program.tensors}
    return frozenset(i for i, t in enumerate(ids) if np.dtype(specs[t].dtype).kind in "iu")


def _stream_syncs(buffers: list[DeviceBuffer]) -> list[DeviceBuffer]:
    """The bound CUDA buffers to export before each run, so that their producers' pending
    work comes first: one per library that synchronises streams as a whole (~20 us each on
    the H100 with torch), every buffer of any other producer."""
    out: list[DeviceBuffer] = []
    seen: set[str] = set()
    for buf in buffers:
        if buf.kind != "cuda" or not buf.sync:
            continue
        library = type(buf.owner).__module__.split(".")[0]
        if library in _STREAM_WIDE:
            if library in seen:
                continue
            seen.add(library)
        out.append(buf)
    return out


def _native(buf: DeviceBuffer) -> tuple[Any, ...]:
    """A bound buffer in the form its launch path's executor takes."""
    if isinstance(buf, OpenCLBuffer):
        return (buf.buffer,)
    return (cast(CudaBuffer, buf).address, buf.nbytes)


def _bind_executor(ex: Any, role: str, i: int, buf: DeviceBuffer) -> bool:
    """Hand an executor a bound buffer in the form its launch path takes; True when it is
    written in place (outputs; inputs are always read in place)."""
    native = _native(buf)
    if role == "input":
        ex.bind_input(i, *native)
        return True
    return bool(ex.bind_output(i, *native))


def partition_constants(compiled: CompiledModel, part: PartitionArtifact) -> dict[str, np.ndarray]:
    """The constant arrays one partition's program uploads, by name.

    Raises:
        ValueError: the compiled model's weights were not rebuilt (`CompiledModel.bind_weights`).
    """
    try:
        return {name: compiled.constants[name] for name in part.program.constants.values()}
    except KeyError as exc:
        raise ValueError(
            f"{compiled.model_name}: constant {exc.args[0]} is missing: load the compiled model "
            "with its model (ModelCache.load_model(token, options, model)) to rebuild its weights"
        ) from None


def _output_arrays(ex: Any) -> list[np.ndarray]:
    """The host arrays partition outputs are read into on every inference (no per-inference
    allocation; values returned by `Session.run` are valid until the next run). A CUDA graph
    copies its outputs into pinned buffers of its own: those are the arrays (no second host
    copy; 5.5 MB per inference for DeepLab's output)."""
    if hasattr(ex, "output_buffers"):
        return list(ex.output_buffers())
    return [
        np.empty(ex.output_spec(i).shape, ex.output_spec(i).dtype) for i in range(ex.num_outputs)
    ]


#: Background work (tuning, storing binaries, CUDA graph upgrades) still running; joined at
#: exit, so that no thread is inside the CUDA driver while the process tears it down and a
#: first start's binary is stored for the next (PoCL: seconds). Tuning stops at the next
#: variant instead (its choices are then not stored: the next start tunes), and no graph is
#: made.
_UPGRADES: set[threading.Thread] = set()
_STOPPING = threading.Event()


#: Background threads -> what to say if the exit waits for them (`Session._exit_notice`).
_EXIT_NOTICES: dict[threading.Thread, Callable[[], None]] = {}


def join_background(*, exiting: bool = False) -> None:
    """End the background work of every session: tuning stops at its next variant, builds
    and stores are waited for (at most 60 s each). At exit, or before a read-only command
    removes the scratch folder its driver writes into; sessions started after it (not at
    exit) tune and upgrade again."""
    _STOPPING.set()
    for t in list(_UPGRADES):
        notice = _EXIT_NOTICES.get(t)
        if notice is not None and t.is_alive():
            notice()
        t.join(timeout=60)
    if not exiting:
        _STOPPING.clear()


atexit.register(join_background, exiting=True)


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
