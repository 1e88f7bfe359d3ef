"""Compile work spread over the build machine's cores, in forked processes.

A model's tuning variants are most of its compile (MobileNetV1 with the ``fast`` schedules: 33
of 50 s scheduling, lowering and printing its variants). Each PrimFunc's variants are
independent of the others', so `fork_map` runs them as tasks of a process pool, one per
function, and returns the results in the tasks' order: the program is the same whatever the
number of processes.

The processes are forked: they inherit the compiler's state (TVM modules, the plan) without
serialising it. TVM's objects neither pickle nor survive ``save_json`` in 0.27, so a task
takes a small item (a function's name) beside that state and returns plain data. The
parent's objects are frozen for the collector first (``gc.freeze``), so that no finaliser of
the parent's (a device buffer's, say) runs in a child, and the children end through
``os._exit`` (no ``atexit`` handler of the parent's runs there either). Where forking is not
available (not Linux or macOS), a worker dies, or the pool fails, the tasks left run in this
process, with a warning naming why. An exception a task raises reaches the caller as it would
in this process.
"""

from __future__ import annotations

import concurrent.futures
import gc
import multiprocessing
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

R = TypeVar("R")

__all__ = ["compile_jobs", "fork_map"]

#: The most processes a compile uses by default: beyond it, the tasks (a model's ~30-150
#: PrimFuncs, of uneven cost) stop dividing well, and each process holds a copy-on-write image
#: of the compiler that diverges as it works.
MAX_DEFAULT_JOBS = 16

#: What the forked tasks run: (function, state), set by `fork_map` before the pool forks.
_TASK: tuple[Callable[[Any, Any], Any], Any] | None = None


class ParallelWarning(UserWarning):
    """The compile's processes could not be used; the work ran in this process."""


def compile_jobs(explicit: int | None = None) -> int:
    """Processes a compile may use: ``explicit``, else ``LITEKILN_COMPILE_JOBS``, else (0) the
    cores this process may run on, at most `MAX_DEFAULT_JOBS`. 1: all in this process."""
    from litekiln.config import COMPILE_JOBS

    jobs = COMPILE_JOBS.get(explicit)
    if jobs > 0:
        return jobs
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # (not Linux)
        cores = os.cpu_count() or 1
    return max(1, min(MAX_DEFAULT_JOBS, cores))


def _run(item: Any) -> Any:
    assert _TASK is not None
    fn, state = _TASK
    return fn(state, item)


def fork_map(
    fn: Callable[[Any, Any], R],
    state: Any,
    items: Sequence[Any],
    jobs: int,
    *,
    chunksize: int = 1,
) -> list[R]:
    """``[fn(state, item) for item in items]``, spread over ``jobs`` forked processes.

    ``fn`` must be a module-level function, its items and results picklable; ``state``
    reaches the processes by the fork (never pickled). Results come back in the order of
    ``items``; ``chunksize`` items go to a process at a time (many small tasks).
    """
    global _TASK
    jobs = min(jobs, len(items))
    if jobs <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return [fn(state, item) for item in items]
    results: list[Any] = [_MISSING] * len(items)
    _TASK = (fn, state)
    why = ""
    # What the processes inherit is never collected there: garbage the parent had not yet
    # collected (a device buffer's finalizer, say) must not run in a child.
    gc.freeze()
    try:
        with warnings.catch_warnings():
            # (Python 3.12+ warns of fork() in a process with threads: the tasks run TVM
            # code only, which holds no lock another thread could have held at the fork.)
            warnings.simplefilter("ignore", DeprecationWarning)
            context = multiprocessing.get_context("fork")
            with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
                for i, result in enumerate(pool.map(_run, items, chunksize=chunksize)):
                    results[i] = result
    except (concurrent.futures.process.BrokenProcessPool, OSError) as exc:
        why = f"{type(exc).__name__}: {exc}"
    finally:
        _TASK = None
        gc.unfreeze()
    left = [i for i, r in enumerate(results) if r is _MISSING]
    if left:
        warnings.warn(
            f"compile processes failed ({why or 'no result'}); {len(left)} of {len(items)} "
            "tasks run in this process instead",
            ParallelWarning,
            stacklevel=2,
        )
        for i in left:
            results[i] = fn(state, items[i])
    return results


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()
