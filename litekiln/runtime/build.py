"""Building a model's device programs at load: from stored binaries, or from source in threads.

NO TVM IMPORT here (see `litekiln.runtime.executor`).

A start with the device binaries in the cache loads each partition's program from its binary
(PoCL: ~60 ms for a landmark model, NVIDIA: ~2 ms). A first start on a device builds from the
OpenCL C, and that is where a first start's time goes. `build_programs` builds every program
that needs it in a worker thread (independent partitions at once; pyopencl releases the GIL
while the driver builds), so that the caller's thread can report progress (`BuildProgress`).

What was measured on PoCL 3.1 (2 cores, face_landmark, docs/benchmarks.md) and shaped this:
the build from source (clang) takes 3.6 s; the kernels are compiled for their work-group
sizes at their first launch (8.2 s); reading the program's binary compiles every kernel once
more for any work-group size (9.7 s) and holds the kernels compiled so far. A first start used
to read the binary for the cache right after the build, before the first inference: 22 s to
the first outputs. The session now reads it after the first inference, in the background
(`DeviceProfile.binary_read_compiles`), so the stored binary holds the kernels compiled at
their launch sizes too and the next start's first inference compiles nothing. Splitting a
program into parts built on several threads gains nothing on PoCL: its compiler serialises
builds, even in separate contexts, and moving parts between contexts takes a binary, which
costs the 9.7 s above.
"""

from __future__ import annotations

import ctypes
import functools
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any, TextIO, TypeVar

import pyopencl as cl

from litekiln import config
from litekiln.artifact.program import GpuProgram
from litekiln.runtime.profile import DeviceProfile, DriverProgram

T = TypeVar("T")


def default_program(program: GpuProgram) -> GpuProgram | None:
    """``program`` cut to the kernels of its default schedules, without its variants: what a
    first start on a new device builds, so that the model is ready sooner; the whole program
    (the variants, to be timed) is built after the first inference, in the background.

    On the H100, NVIDIA's OpenCL builds a partition's program with its variants in 12.5-15.5 s
    and its default kernels alone in 3.8-5.2 s (face_landmark, face_detection_short_range;
    results/startup/h100/probe_build.json); builds on several threads gain nothing there.

    Returns:
        The cut program, or None when there is nothing to cut (no variants) or the source
        cannot be cut by function (a kernel without TVM's marker comment).
    """
    return program.with_variants([]) if program.variants else None


class BuildError(RuntimeError):
    """A program does not build (from source or from its binary); the message says why."""


# ------------------------------------------------------------------------------- building


@dataclass
class BuildJob:
    """One program to make: what the driver is handed for a partition (its source read only
    for a build from source), and its stored binary."""

    label: str
    driver: DriverProgram
    binary: bytes | None = None
    uses_half: bool = False

    @property
    def source(self) -> str:
        return self.driver.source

    @property
    def options(self) -> tuple[str, ...]:
        return self.driver.options


@dataclass
class BuiltProgram:
    """A job's result: its program in the session's context, or its error.

    Attributes:
        program: the built cl.Program (None on error).
        from_binary: made from the stored binary (nothing new to store).
        rejected: why the stored binary was not used ('' if it was, or there was none).
        seconds: wall time from the start of `build_programs` until this job was ready.
        error: the build failed.
    """

    program: cl.Program | None = None
    from_binary: bool = False
    rejected: str = ""
    seconds: float = 0.0
    error: BuildError | None = None


def build_threads(jobs: int) -> int:
    """Threads for ``jobs`` builds from source: ``LITEKILN_BUILD_THREADS``, else one per
    program, at most 8."""
    n = config.BUILD_THREADS.get()
    if n > 0:
        return n
    return max(1, min(8, jobs))


def build_programs(
    jobs: Sequence[BuildJob],
    context: cl.Context,
    device: cl.Device,
    profile: DeviceProfile,
    *,
    progress: Callable[[int, int, float], None] | None = None,
    threads: int | None = None,
    fallback: bool = True,
) -> list[BuiltProgram]:
    """Make every job's programs (see the module docstring); never raises for one job's
    failure: its `BuiltProgram.error` says why.

    Args:
        jobs: the programs to make.
        context: the session's context (where the returned programs live).
        device: the device to build for.
        profile: the device's profile (how to build there).
        progress: called from the caller's thread about 4 times a second while programs build
            from source, and once at the end, with (jobs ready, jobs, seconds so far).
        threads: worker threads (default: `build_threads`).
        fallback: build from source when a stored binary is rejected (`BuiltProgram.rejected`
            says why); False: that is the job's error.

    Returns:
        One `BuiltProgram` per job, in order.
    """
    t0 = time.perf_counter()
    results = [BuiltProgram() for _ in jobs]
    pending: list[int] = []
    for i, job in enumerate(jobs):
        if job.binary is None:
            pending.append(i)
            continue
        try:
            results[i].program = _from_binary(context, device, job.binary, job.options)
            results[i].from_binary = True
            results[i].seconds = time.perf_counter() - t0
        except BuildError as exc:
            if not fallback:
                results[i] = BuiltProgram(error=exc)
                continue
            results[i] = BuiltProgram(rejected=str(exc))
            pending.append(i)
    if not pending:
        return results
    workers = threads or build_threads(len(pending))
    futures = _run_daemon(
        {i: functools.partial(_from_source, context, device, jobs[i], profile) for i in pending},
        workers,
    )
    _wait(futures, len(jobs) - len(pending), len(jobs), t0, progress)
    for i in pending:
        try:
            results[i].program = futures[i].result()
        except BuildError as exc:
            results[i].error = exc
        results[i].seconds = time.perf_counter() - t0
    return results


def _run_daemon(work: dict[int, Callable[[], Any]], workers: int) -> dict[int, Future[Any]]:
    """Run each callable of ``work`` on one of ``workers`` daemon threads; a future per key.

    Not a ThreadPoolExecutor: the interpreter joins an executor's threads at exit before it
    runs any ``atexit`` handler (concurrent.futures' ``_python_exit``), so a process that
    left while a build ran waited for the build in silence, and the session's exit handler
    (`session.join_background`) then raced the device's take-over to say why. Daemon threads
    leave the wait, and its notice, to that handler, which waits for the session's
    background thread and through it for the builds."""
    futures: dict[int, Future[Any]] = {i: Future() for i in work}
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in work:
        todo.put(i)

    def worker() -> None:
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            future = futures[i]
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(work[i]())
            except BaseException as exc:  # noqa: BLE001 - handed to whoever reads the future
                future.set_exception(exc)

    for k in range(max(1, min(workers, len(work)))):
        threading.Thread(target=worker, daemon=True, name=f"litekiln-build-{k}").start()
    return futures


def _wait(
    futures: dict[int, Future[Any]],
    ready: int,
    total: int,
    t0: float,
    progress: Callable[[int, int, float], None] | None,
) -> None:
    """Wait for every future, reporting progress from this (the caller's) thread."""
    every = list(futures.values())
    while True:
        done = sum(1 for f in every if f.done())
        if progress is not None:
            progress(ready + done, total, time.perf_counter() - t0)
        if all(f.done() for f in every):
            return
        wait([f for f in every if not f.done()], timeout=0.25, return_when=FIRST_COMPLETED)


def _from_binary(context: cl.Context, device: cl.Device, binary: bytes, options: Any) -> Any:
    try:
        return cl.Program(context, [device], [binary]).build(options=list(options))
    except cl.Error as e:
        raise BuildError(f"building from the cached device binary failed: {e}") from e


def _from_source(
    context: cl.Context, device: cl.Device, job: BuildJob, profile: DeviceProfile
) -> cl.Program:
    """Build in the session's context (pyopencl releases the GIL while the driver builds)."""
    try:
        return cl.Program(context, job.source).build(options=list(job.options), devices=[device])
    except cl.Error as e:
        raise _source_error(e, job, profile) from e


def _source_error(e: Exception, job: BuildJob, profile: DeviceProfile) -> BuildError:
    if job.uses_half:
        # Tried rather than checked against the extension list: NVIDIA builds half kernels
        # without listing cl_khr_fp16, PoCL cannot (docs/vendors.md).
        return BuildError(
            f"{profile.name} cannot build half-precision kernels (cl_khr_fp16); "
            "use precision='fp32', or compile the fp16 variant for devices without half "
            "arithmetic (`litekiln compile --precision fp16 --half emulated`)"
        )
    return BuildError(f"OpenCL build failed on {profile.name}: {e}")


_CL_PROGRAM_BINARY_SIZES = 0x1165
_CL_PROGRAM_BINARIES = 0x1166
_LIB: Any = False  # not looked up yet


def _opencl() -> Any:
    global _LIB
    if _LIB is False:
        _LIB = None
        try:
            lib = ctypes.CDLL("libOpenCL.so.1")
            fn = lib.clGetProgramInfo
            fn.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_size_t]
            fn.argtypes += [ctypes.c_void_p, ctypes.c_void_p]
            fn.restype = ctypes.c_int32
            _LIB = lib
        except (OSError, AttributeError):
            pass
    return _LIB


def program_binary(prg: cl.Program) -> bytes | None:
    """The binary of a program built for one device, or None if the driver reports none.

    Read through ctypes where libOpenCL loads: the call can take seconds (PoCL compiles the
    kernels for it) and ctypes releases the GIL, so a background thread reading it does not
    stall the application's; pyopencl's get_info holds the GIL.
    """
    lib = _opencl()
    if lib is None:
        got: list[bytes] = prg.get_info(cl.program_info.BINARIES)  # type: ignore[assignment]  # pyopencl types get_info as object
        return bytes(got[0]) if got and got[0] else None
    handle = ctypes.c_void_p(prg.int_ptr)
    size = ctypes.c_size_t(0)
    err = lib.clGetProgramInfo(
        handle, _CL_PROGRAM_BINARY_SIZES, ctypes.sizeof(size), ctypes.byref(size), None
    )
    if err or not size.value:
        return None
    buf = ctypes.create_string_buffer(size.value)
    ptr = ctypes.c_void_p(ctypes.addressof(buf))
    err = lib.clGetProgramInfo(
        handle, _CL_PROGRAM_BINARIES, ctypes.sizeof(ptr), ctypes.byref(ptr), None
    )
    return None if err else buf.raw


# ------------------------------------------------------------------------------- progress


class BuildProgress:
    """The line a first start prints on stderr while its programs build from source::

        litekiln: building face_landmark for <device>: partition 0/1, 3.2 s

    and then, where the first inference takes long too (drivers that compile each kernel at
    its first launch, as PoCL does), a second one while it runs (`first_inference`)::

        litekiln: building face_landmark for <device>: first inference, 4.1 s

    Updated in place on a terminal, ended with the total when done. ``LITEKILN_PROGRESS``:
    ``auto`` (default) prints only when stderr is a terminal, ``on`` always (one line at the
    end when not a terminal), ``off`` never. Nothing is printed for a step done within half a
    second (loads from stored binaries, a first inference that compiles nothing).
    """

    def __init__(self, model: str, device: str, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        mode = config.PROGRESS.get()
        tty = _isatty(self.stream)
        self.enabled = mode == "on" or (mode == "auto" and tty)
        self.in_place = tty
        self.head = f"litekiln: building {model} for {device}"
        self._shown: set[str] = set()  # the steps with a line out
        self._lock = threading.Lock()

    def __call__(self, ready: int, total: int, seconds: float) -> None:
        self._line("build", f"partition {ready}/{total}", seconds, ready == total)

    def first_inference(self, seconds: float, done: bool) -> None:
        """Report the first inference after the build, ``seconds`` into it."""
        self._line("run", "first inference", seconds, done)

    def _line(self, step: str, what: str, seconds: float, done: bool) -> None:
        if not self.enabled or (seconds < 0.5 and step not in self._shown):
            return
        line = f"{self.head}: {what}, {seconds:.1f} s"
        with self._lock:
            if self.in_place:
                self.stream.write("\r\x1b[K" + line + ("\n" if done else ""))
            elif done or step not in self._shown:
                self.stream.write(line + "\n")
            self.stream.flush()
            self._shown.add(step)

    def background_started(self, programs: int) -> None:
        """A first start that runs on the CPU while ``programs`` build (`Session._cpu_first`)."""
        self._note(
            f"{self.head} in the background ({programs} program(s)); "
            "inferences run on the CPU until it is done"
        )

    def background_done(self, seconds: float) -> None:
        self._note(f"{self.head}: done in {seconds:.1f} s; inferences run there from now on")

    def background_failed(self) -> None:
        self._note(f"{self.head}: failed (see the warning); inferences stay on the CPU")

    def exiting(self) -> None:
        """The process exits while the background build runs: it is finished first, so that
        the next start finds it stored."""
        self._note(f"{self.head}: finishing before the exit, for the next start")

    def _note(self, line: str) -> None:
        """One whole line (no in-place update: the application's own output goes on)."""
        if not self.enabled:
            return
        with self._lock:
            self.stream.write(line + "\n")
            self.stream.flush()

    def reporting(self, work: Callable[[], T], every: float = 0.25) -> T:
        """Run ``work`` (the first inference) in this thread while a helper thread reports
        it with `first_inference` every ``every`` seconds; its result."""
        if not self.enabled:
            return work()
        t0 = time.perf_counter()
        stop = threading.Event()

        def tick() -> None:
            while not stop.wait(every):
                self.first_inference(time.perf_counter() - t0, False)

        ticker = threading.Thread(target=tick, daemon=True, name="litekiln-progress")
        ticker.start()
        try:
            return work()
        finally:
            stop.set()
            ticker.join()
            self.first_inference(time.perf_counter() - t0, True)


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty()) and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False
