"""Run one compiled GPU partition (`GpuProgram`) with pyopencl.

NO TVM IMPORT here, not even indirectly: this module is what apps that ship precompiled
models load.  Dependencies: pyopencl, numpy, `litekiln.artifact.program`.

Everything is done once at load: program build (or load from a device binary), buffer
allocation, constant upload, ``kernel.set_args``.  `PartitionExecutor.run` then only calls
``cl.enqueue_nd_range_kernel`` per launch: no allocation, no argument packing.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyopencl as cl

# pyopencl imports these on the first program build and kernel creation; importing them with
# the runtime keeps ~35 ms (H100 machine) of imports out of an app's first model load.
import pyopencl.characterize  # noqa: F401
import pyopencl.invoker  # noqa: F401

from litekiln.artifact.program import SCALAR_TYPES, BufferArg, GpuProgram, Launch, TensorSpec
from litekiln.runtime.build import BuildJob, BuiltProgram, build_programs, program_binary
from litekiln.runtime.partition_io import PartitionIO, constant_arrays
from litekiln.runtime.profile import DeviceProfile

# clCreateBuffer rejects size 0; empty tensors still need a valid handle to bind.
_MIN_BUFFER_BYTES = 4


_ENQUEUE: tuple[Any, Any] | None = None


def _cl_enqueue() -> tuple[Any, Any]:
    """(libOpenCL, its clEnqueueNDRangeKernel with argtypes set), or (None, None); loaded once
    per process (ctypes.util.find_library runs ldconfig: only tried when the plain soname
    does not load)."""
    global _ENQUEUE
    if _ENQUEUE is None:
        import ctypes
        import ctypes.util

        _ENQUEUE = (None, None)
        for find in (lambda: "libOpenCL.so.1", lambda: ctypes.util.find_library("OpenCL")):
            name = find()
            if not name:
                continue
            try:
                lib = ctypes.CDLL(name)
                fn = lib.clEnqueueNDRangeKernel
            except (OSError, AttributeError):
                continue
            vp, u32, sz_p = ctypes.c_void_p, ctypes.c_uint32, ctypes.POINTER(ctypes.c_size_t)
            fn.argtypes = [vp, vp, u32, sz_p, sz_p, sz_p, u32, vp, vp]
            fn.restype = ctypes.c_int32
            _ENQUEUE = (lib, fn)
            break
    return _ENQUEUE


def build_job(
    program: GpuProgram, profile: DeviceProfile, binary: bytes | None = None, label: str = ""
) -> BuildJob:
    """The build of ``program`` on the device ``profile`` describes (from ``binary`` if given)."""
    return BuildJob(label, profile.driver_for(program), binary, program.uses_half)


class ExecutorError(RuntimeError):
    """The program cannot be loaded or run on this device (message says why)."""


#: A launch ready to enqueue: kernel object (arguments set), global size, local size.
_Prepared = tuple[cl.Kernel, tuple[int, ...], tuple[int, ...]]


def _device_time(events: Sequence[Any]) -> float | None:
    """The device time of ``events`` (finished), ns; None where the driver has none to give:
    NVIDIA's OpenCL now and then answers PROFILING_INFO_NOT_AVAILABLE for a finished kernel
    of a profiling queue (seen on the H200 in the background tuning of two models), which
    stopped the session's tuning whole."""
    try:
        return float(sum(e.profile.end - e.profile.start for e in events))
    except cl.RuntimeError:
        return None


class PartitionExecutor(PartitionIO):
    """Loads a `GpuProgram` onto an OpenCL device and runs it.

    Attributes:
        program: The program being run.
        binary: The device binary of the built cl.Program (for the binary cache), or None if
            the driver does not report one.
        device: The OpenCL device of ``queue``.
        device_profile: The device's profile (vendor facts).
        driver: Exactly the source and options the driver was (or would be) handed.
    """

    def __init__(
        self,
        program: GpuProgram,
        constants: Mapping[str, np.ndarray],
        context: cl.Context,
        queue: cl.CommandQueue,
        binary: bytes | None = None,
        profile: DeviceProfile | None = None,
        built: BuiltProgram | None = None,
    ) -> None:
        """Build, allocate, upload and bind everything.

        Args:
            program: The program (validated here).
            constants: Constant name -> array, for every name in ``program.constants``.
            context: OpenCL context.
            queue: In-order command queue on the device to run on.
            binary: A device binary from a previous load (`binary`) of the same driver program
                and device; if given, the program is built from it (fast path).
            profile: The device's profile (default: read from ``queue``'s device).
            built: The program already made by `litekiln.runtime.build.build_programs` (the
                session builds its partitions together); ``binary`` is then ignored.

        Raises:
            ExecutorError: A constant is missing or mismatched, the binary or source fails to
                build, a launch exceeds the device's work-group limits, or a tensor's offset
                is not aligned for a sub-buffer.
        """
        program.validate()
        self.program = program
        self.context = context
        self.queue = queue
        self.device: cl.Device = queue.device
        self.device_profile = profile or DeviceProfile.of(self.device, context)
        self.driver = self.device_profile.driver_for(program)
        self._tensor_specs: dict[int, TensorSpec] = {t.id: t for t in program.tensors}
        if built is None:
            job = self.build_job(binary)
            built = build_programs(
                [job], context, self.device, self.device_profile, fallback=False
            )[0]
        if built.error is not None:
            raise ExecutorError(str(built.error))
        assert built.program is not None
        self._cl_program: cl.Program = built.program
        self._given_binary = binary if built.from_binary else None
        #: Built from a stored binary (else from source: a binary worth storing).
        self.from_binary = built.from_binary
        self._allocate()
        self._upload_constants(constants)
        names = set(str(self._cl_program.get_info(cl.program_info.KERNEL_NAMES)).split(";"))
        missing = [k for k in self.program.kernels if k not in names]
        if missing:
            raise ExecutorError(f"kernels {missing} not found in the built OpenCL program")
        self._arg_slots: dict[int, list[tuple[cl.Kernel, int]]] = {}  # tensor id -> uses
        self._wg_limit: dict[str, int] = {}  # the same for every object of a kernel: asked once
        # Option 0 of every variant is the default launches. The other options' kernel objects
        # are made when first needed (`_option`: a stored choice, or tuning): a warm start
        # with its choices stored makes the kernels it runs only, not every variant's (the
        # variants are 40-60% of a program's launches, and each kernel object costs pyopencl
        # 0.2-0.5 ms).
        self._default = self._bind_launches(program.launches, 0)
        self._options: list[list[list[_Prepared] | None]] = [
            [None] * len(v.options) for v in program.variants
        ]
        self.choices: list[int] = [0] * len(program.variants)
        #: Per variant, each option's median device time in ms (default first), from the
        #: last `tune` in this process; empty where the choices came from the cache.
        self.tuning_ms: list[list[float]] = []
        self._launches = self._plan(self.choices)
        self._fast = self._make_fast_launcher()

    def _allocate(self) -> None:
        """One buffer per storage, allocated once; a (sub-)buffer view per tensor."""
        self._storage_buffers: dict[int, cl.Buffer] = {
            s.id: cl.Buffer(
                self.context, cl.mem_flags.READ_WRITE, size=max(s.nbytes, _MIN_BUFFER_BYTES)
            )
            for s in self.program.storages
        }
        self._tensor_buffers: dict[int, cl.Buffer] = {
            t.id: self._view(t) for t in self.program.tensors
        }
        #: The executor's own buffer of each storage (where an unbound storage goes back to).
        self._own_buffers = dict(self._storage_buffers)
        # Application buffers bound to inputs and outputs (`bind_input`, `bind_output`).
        self._bound_in: set[int] = set()
        self._bound_out: set[int] = set()  # written in place
        self._copy_out: dict[int, cl.Buffer] = {}  # output -> buffer it is copied to by `run`
        self._forward: dict[int, cl.Buffer] = {}  # output -> buffer it is also copied to

    def _bind_launches(self, launches: Sequence[Launch], first: int) -> list[_Prepared]:
        """One kernel object per launch, its arguments set once, its work-group checked.

        A kernel object holds its argument values, and the same kernel may be launched
        several times with different buffers, hence one object per launch. Kernel names come
        from the program's info string (checked at load): all_kernels() would create (and
        pyopencl set up) a kernel object per kernel only to read its name. ``first`` numbers
        the launches in messages (their index in `GpuProgram.all_launches`).
        """
        prepared: list[_Prepared] = []
        for i, launch in enumerate(launches, first):
            kernel = cl.Kernel(self._cl_program, launch.kernel)
            self._set_args(kernel, launch)
            if launch.kernel not in self._wg_limit:
                self._wg_limit[launch.kernel] = kernel.get_work_group_info(
                    cl.kernel_work_group_info.WORK_GROUP_SIZE, self.device
                )
            if not self.device_profile.fits(launch.local_size, self._wg_limit[launch.kernel]):
                p = self.device_profile
                raise ExecutorError(
                    f"launch {i} ({launch.kernel}): work-group {launch.local_size} exceeds device "
                    f"limit {p.max_work_group_size} / kernel limit {self._wg_limit[launch.kernel]} "
                    f"/ per-axis {list(p.max_work_item_sizes)} on {p.name}; compile with a "
                    "smaller max_num_threads"
                )
            prepared.append((kernel, launch.global_size, launch.local_size))
        return prepared

    def _option(self, variant: int, option: int) -> list[_Prepared]:
        """The prepared launches of option ``option`` (1..n) of variant ``variant``, made on
        first use."""
        made = self._options[variant][option - 1]
        if made is None:
            first = len(self.program.launches) + sum(
                len(o) for v in self.program.variants[:variant] for o in v.options
            )
            opts = self.program.variants[variant].options
            first += sum(len(o) for o in opts[: option - 1])
            made = self._bind_launches(opts[option - 1], first)
            self._options[variant][option - 1] = made
        return made

    def _set_args(self, kernel: cl.Kernel, launch: Launch) -> None:
        # set_arg per argument, not set_args: set_args generates and compiles a Python
        # argument-setter per kernel on first use (~1 ms each, 100+ kernels per model).
        for j, arg in enumerate(launch.args):
            if isinstance(arg, BufferArg):
                kernel.set_arg(j, self._tensor_buffers[arg.tensor])
                self._arg_slots.setdefault(arg.tensor, []).append((kernel, j))
            else:
                kernel.set_arg(j, np.array(arg.value, dtype=SCALAR_TYPES[arg.ctype]))

    # ------------------------------------------------------------------ tuning
    def _plan(self, choices: list[int]) -> list[_Prepared]:
        out = []
        pos = 0
        for i, (v, c) in enumerate(zip(self.program.variants, choices, strict=True)):
            out.extend(self._default[pos : v.start])
            out.extend(self._default[v.start : v.stop] if c == 0 else self._option(i, c))
            pos = v.stop
        out.extend(self._default[pos:])
        return out

    def select(self, choices: list[int]) -> None:
        """Run option ``choices[i]`` of variant ``i`` from now on (0: the default schedule).

        Raises:
            ValueError: ``choices`` does not fit the program's variants.
        """
        self.program.plan(choices)  # validates
        self.choices = list(choices)
        self._launches = self._plan(self.choices)
        self._fast = self._make_fast_launcher()

    def tune(
        self, reps: int = 5, *, lock: Any = None, stop: threading.Event | None = None
    ) -> list[int] | None:
        """Time every option of every variant on this device and select the fastest.

        Each option runs ``reps`` times (after one warm-up) on a profiling queue, in the
        program's order so that its inputs are the previous kernels' outputs (or whatever
        the buffers hold: the schedules do not depend on values); the option with the
        smallest median device time (OpenCL profiling events) wins. Costs a few milliseconds
        per variant, once per device: the session stores the choices next to the binary.

        Args:
            reps: timed runs per option.
            lock: held while each variant is timed and while the choices are applied (the
                session's: tuning in the background never runs kernels during an inference,
                whose buffers the tuned kernels write).
            stop: when set, tuning stops before the next variant (the process is exiting).

        Returns:
            The chosen option per variant (also applied, see `select`), or None if stopped.
            Each variant's median times, default first, stay in `tuning_ms` (for reports).
        """
        if not self.program.variants:
            return []
        guard = lock if lock is not None else contextlib.nullcontext()
        pq = self._profiling()
        choices: list[int] = []
        measured: list[list[float]] = []
        for i, v in enumerate(self.program.variants):
            if stop is not None and stop.is_set():
                return None
            timings = []
            with guard:
                self.queue.finish()
                opts = [self._option(i, o) for o in range(1, len(v.options) + 1)]
                for launches in [self._default[v.start : v.stop], *opts]:
                    samples = []
                    for r in range(reps + 1):
                        events = [
                            cl.enqueue_nd_range_kernel(pq, k, g, loc) for k, g, loc in launches
                        ]
                        pq.finish()
                        t = _device_time(events) if r else None  # (the first: a warm-up)
                        if t is not None:
                            samples.append(t)
                    timings.append(float(np.median(samples)) if samples else float("inf"))
            # (an option never timed is never chosen; nor is any where the default was not)
            choices.append(int(np.argmin(timings)) if np.isfinite(timings[0]) else 0)
            measured.append([t * 1e-6 for t in timings])
        with guard:
            self.select(choices)
        self.tuning_ms = measured
        return choices

    def _profiling(self) -> cl.CommandQueue:
        """A second, profiling-enabled in-order queue on the same context (made once)."""
        pq = getattr(self, "_profiling_queue", None)
        if pq is None:
            pq = cl.CommandQueue(
                self.context, self.device, properties=cl.command_queue_properties.PROFILING_ENABLE
            )
            self._profiling_queue = pq
        return pq

    @property
    def binary(self) -> bytes | None:
        """The device binary of the built program (for the binary cache), or None.

        Queried on demand: reading CL_PROGRAM_BINARIES copies the whole binary out of the
        driver, which a load from the cached binary never needs.
        """
        if self._given_binary is None:
            self._given_binary = program_binary(self._cl_program)
        return self._given_binary

    # ------------------------------------------------------------------ load helpers
    def build_job(self, binary: bytes | None = None) -> BuildJob:
        """What `build_programs` needs to make this executor's program."""
        return build_job(self.program, self.device_profile, binary)

    def _view(self, t: TensorSpec) -> cl.Buffer:
        base = self._storage_buffers[t.storage]
        if t.offset == 0:
            return base
        # Kernels take plain pointers: a tensor at an offset needs a sub-buffer, whose origin
        # must be a multiple of CL_DEVICE_MEM_BASE_ADDR_ALIGN (given in bits).
        align = self.device_profile.address_align
        if t.offset % align:
            raise ExecutorError(
                f"tensor {t.name or t.id} at byte offset {t.offset}: sub-buffer origins must be "
                f"multiples of {align} bytes on {self.device_profile.name}"
            )
        return base.get_sub_region(t.offset, max(t.nbytes, _MIN_BUFFER_BYTES))

    def _upload_constants(self, constants: Mapping[str, np.ndarray]) -> None:
        for tid, arr in constant_arrays(self.program, constants, self._tensor_specs, ExecutorError):
            if arr.nbytes:
                cl.enqueue_copy(self.queue, self._tensor_buffers[tid], arr, is_blocking=False)
        self.queue.finish()

    # ------------------------------------------------------------------ I/O
    def set_input(self, i: int, array: np.ndarray, *, blocking: bool = True) -> None:
        """Copy ``array`` into input ``i``'s device buffer.

        Args:
            i: Input index.
            array: Host data; must have the input's shape; converted to its dtype.
            blocking: If False the copy is only enqueued (pyopencl keeps ``array`` alive until
                it completes; do not modify it before the next `run` finishes).

        Raises:
            ValueError: Shape mismatch.
        """
        spec = self.input_spec(i)
        if i in self._bound_in:
            raise ValueError(f"input {i} ({spec.name}) is bound to a device buffer (bind_input)")
        arr = np.require(array, dtype=spec.dtype, requirements="C")  # (0-d stays 0-d)
        if arr.shape != spec.shape:
            raise ValueError(f"input {i} ({spec.name}): shape {arr.shape}, expected {spec.shape}")
        if arr.nbytes:
            cl.enqueue_copy(self.queue, self._tensor_buffers[spec.id], arr, is_blocking=blocking)

    def run(self, *, wait: bool = False) -> None:
        """Enqueue every kernel launch in order.

        Args:
            wait: Block until the device is done (otherwise `get_output`'s blocking read, or
                the next user of the queue, orders after the launches).
        """
        if self._fast is not None:
            self._fast()
        else:
            enqueue = cl.enqueue_nd_range_kernel
            queue = self.queue
            for kernel, gsize, lsize in self._launches:
                enqueue(queue, kernel, gsize, lsize)
        for copies in (self._copy_out, self._forward):  # bound outputs not written in place,
            for i, dest in copies.items():  # outputs fed back (carried states)
                spec = self.output_spec(i)
                if spec.nbytes:
                    cl.enqueue_copy(
                        self.queue, dest, self._tensor_buffers[spec.id], byte_count=spec.nbytes
                    )
        if wait:
            self.queue.finish()

    def finish(self) -> None:
        """Wait until everything enqueued (the last `run`) is done."""
        self.queue.finish()

    def _make_fast_launcher(self) -> Any:
        """A launch loop that calls clEnqueueNDRangeKernel through ctypes.

        pyopencl's enqueue_nd_range_kernel converts its arguments and makes an event object on
        every call; with the sizes converted once at load and the C function called directly,
        the host work per launch drops to the driver's own cost plus ~1 us (H100: 6.0-7.4 us
        per launch against pyopencl's 7.2-10.8; the driver's bare enqueue is 5.2 us). On PoCL
        it is slower (5.0 us vs 3.9 us, PoCL's own enqueue dominating). ``LITEKILN_FAST_LAUNCH``
        (config.FAST_LAUNCH): ``auto`` (default) uses it where the profile says
        (`DeviceProfile.direct_enqueue`), ``on``/``off`` force.
        Returns None (the pyopencl loop) when not used or libOpenCL cannot be loaded.
        """
        from litekiln import config

        mode = config.FAST_LAUNCH.get()
        if mode == "off":
            return None
        if mode == "auto" and not self.device_profile.direct_enqueue:
            return None
        import ctypes

        lib, fn = _cl_enqueue()
        if fn is None:
            return None
        vp, u32 = ctypes.c_void_p, ctypes.c_uint32
        queue = vp(self.queue.int_ptr)
        calls = []
        for kernel, gsize, lsize in self._launches:
            dims = len(gsize)
            g = (ctypes.c_size_t * dims)(*gsize)
            loc = (ctypes.c_size_t * dims)(*lsize) if lsize else None
            calls.append((vp(kernel.int_ptr), u32(dims), g, loc))
        keep = (lib, calls)  # the arrays must outlive the closure's calls

        def launch_all() -> None:
            for k, dims, g, loc in calls:
                err = fn(queue, k, dims, None, g, loc, 0, None, None)
                if err:
                    raise ExecutorError(f"clEnqueueNDRangeKernel failed with OpenCL error {err}")

        launch_all.keep = keep  # type: ignore[attr-defined]
        return launch_all

    @property
    def num_launches(self) -> int:
        """Number of kernel launches one `run` enqueues."""
        return len(self._launches)

    def launch_names(self) -> list[str]:
        """Name of each launch, in launch order (for profiles): its PrimFunc's (the stored
        kernels are minified: k0, k1...), else its kernel's."""
        return [la.func or la.kernel for la in self.program.plan(self.choices)]

    def profile(self) -> list[float]:
        """Run every launch once on a profiling queue and return each one's device time.

        The normal path is untouched: a second in-order queue with PROFILING_ENABLE is made on
        first use (same context and device, so the pre-bound kernels and buffers serve it) and
        the launches are enqueued there with events. The normal queue is drained first, so the
        launches see the inputs that the last `set_input` or `run` left in the buffers.

        Returns:
            Seconds between each launch's CL_PROFILING_COMMAND_START and _END, in launch order.
        """
        pq = self._profiling()
        self.queue.finish()
        events = [cl.enqueue_nd_range_kernel(pq, k, g, loc) for k, g, loc in self._launches]
        pq.finish()
        return [(e.profile.end - e.profile.start) * 1e-9 for e in events]

    def get_output(self, i: int, out: np.ndarray | None = None) -> np.ndarray:
        """Read output ``i`` back to the host (blocking).

        Args:
            i: Output index.
            out: Optional C-contiguous array of the output's shape and dtype to read into
                (avoids an allocation per call).

        Returns:
            ``out`` or a new array.

        Raises:
            ValueError: ``out`` has the wrong shape, dtype or layout.
        """
        spec = self.output_spec(i)
        if out is None:
            out = np.empty(spec.shape, dtype=spec.dtype)
        elif (
            out.shape != spec.shape
            or out.dtype != np.dtype(spec.dtype)
            or not out.flags.c_contiguous
        ):
            raise ValueError(
                f"output {i} ({spec.name}): out must be C-contiguous {spec.dtype}{list(spec.shape)}"
            )
        if out.nbytes:
            cl.enqueue_copy(self.queue, out, self._tensor_buffers[spec.id], is_blocking=True)
        return out

    def forward_output(self, i: int, buffer: cl.Buffer) -> None:
        """Also copy output ``i`` into ``buffer`` on the device after the kernels of each
        `run` (a carried state's next value)."""
        self._forward[i] = buffer

    def drop_forwards(self) -> None:
        """Forget every `forward_output`."""
        self._forward.clear()

    def output_buffer(self, i: int) -> cl.Buffer:
        """The device buffer of output ``i`` (valid after `run`; overwritten by the next run).

        The buffer may be shared with an input or a constant when the partition returns one
        unchanged (or a reshaped view of it).
        """
        return self._tensor_buffers[self.program.outputs[i]]

    #: What `bind_input` and `bind_output` take: OpenCL buffers of this context.
    memory_kind = "opencl"

    def bind_input(self, i: int, buffer: cl.Buffer) -> None:
        """Make input ``i`` read ``buffer`` directly (an application's buffer, or zero-copy
        chaining of partitions).

        Every tensor on input ``i``'s storage (the input and its reshaped views) is rebound
        and the affected kernel arguments are set again, once; later runs use ``buffer``, and
        `set_input` refuses the input until `unbind_input`. Note that outputs aliasing this
        input then alias ``buffer`` too.

        Args:
            i: Input index.
            buffer: A buffer in the same context of at least the input's size.

        Raises:
            ValueError: ``buffer`` is too small or in another context.
        """
        spec = self.input_spec(i)
        self._check_buffer(buffer, spec, f"input {i}")
        self._rebind_storage(spec.storage, buffer)
        self._bound_in.add(i)

    def bind_output(self, i: int, buffer: cl.Buffer) -> bool:
        """Make output ``i`` end up in ``buffer``, with no host copy.

        Written in place when the memory plan gives the output a storage of its own
        (`PartitionIO.output_in_place`): its kernel arguments are set to ``buffer``.
        Otherwise each `run` copies it into ``buffer`` on the device after the kernels.

        Returns:
            True when written in place, False when copied on the device.

        Raises:
            ValueError: ``buffer`` is too small or in another context.
        """
        spec = self.output_spec(i)
        self._check_buffer(buffer, spec, f"output {i}")
        self.unbind_output(i)
        if self.output_in_place(i, buffer.size):
            self._rebind_storage(spec.storage, buffer)
            self._bound_out.add(i)
            return True
        self._copy_out[i] = buffer
        return False

    def unbind_input(self, i: int) -> None:
        """Input ``i`` back to the executor's own buffer (set by `set_input`)."""
        if i in self._bound_in:
            storage = self.input_spec(i).storage
            self._rebind_storage(storage, self._own_buffers[storage])
            self._bound_in.discard(i)

    def unbind_output(self, i: int) -> None:
        """Output ``i`` back to the executor's own buffer (read by `get_output`)."""
        if i in self._bound_out:
            storage = self.output_spec(i).storage
            self._rebind_storage(storage, self._own_buffers[storage])
            self._bound_out.discard(i)
        self._copy_out.pop(i, None)

    def _check_buffer(self, buffer: cl.Buffer, spec: TensorSpec, what: str) -> None:
        if buffer.size < spec.nbytes:
            raise ValueError(
                f"{what} ({spec.name}): buffer of {buffer.size} bytes, need {spec.nbytes}"
            )
        if buffer.context.int_ptr != self.context.int_ptr:
            raise ValueError(f"{what} ({spec.name}): the buffer belongs to another context")

    def _rebind_storage(self, storage: int, buffer: cl.Buffer) -> None:
        """Every tensor of ``storage`` (re)viewed in ``buffer``, its kernel arguments set."""
        self._storage_buffers[storage] = buffer
        for t in self.program.tensors:
            if t.storage == storage:
                self._tensor_buffers[t.id] = self._view(t)
                for kernel, j in self._arg_slots.get(t.id, []):
                    kernel.set_arg(j, self._tensor_buffers[t.id])

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Convenience: set all inputs, run, return all outputs (allocates; not the fast path)."""
        if len(inputs) != self.num_inputs:
            raise ValueError(f"expected {self.num_inputs} inputs, got {len(inputs)}")
        for i, a in enumerate(inputs):
            self.set_input(i, a)
        self.run()
        return [self.get_output(i) for i in range(self.num_outputs)]
