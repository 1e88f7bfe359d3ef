"""Compile work over several processes (`litekiln.compiler.parallel`): the same program
whatever the number of processes, and a compile that survives its processes failing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("tvm")

from litekiln.compiler import parallel  # noqa: E402

# (the small models' variants, past their entries' bound: `keep_variants`)
pytestmark = pytest.mark.usefixtures("keep_variants")


from litekiln.compiler.parallel import ParallelWarning, compile_jobs, fork_map  # noqa: E402


def _square_plus(state: int, item: int) -> tuple[int, int]:
    return item * item + state, os.getpid()


def _die_on_three(state: int, item: int) -> int:
    if item == 3 and os.getpid() != state:  # in a forked process only
        os._exit(7)
    return item + 1


def _raise_on_two(state: None, item: int) -> int:
    if item == 2:
        raise ValueError(f"task {item} refuses")
    return item


def test_fork_map_returns_the_results_in_order_from_other_processes() -> None:
    items = list(range(40))
    out = fork_map(_square_plus, 5, items, 3)
    assert [r for r, _ in out] == [i * i + 5 for i in items]
    pids = {pid for _, pid in out}
    assert os.getpid() not in pids and 1 <= len(pids) <= 3


def test_fork_map_with_one_job_runs_in_this_process() -> None:
    out = fork_map(_square_plus, 1, [1, 2, 3], 1)
    assert out == [(2, os.getpid()), (5, os.getpid()), (10, os.getpid())]
    assert fork_map(_square_plus, 0, [], 4) == []


def test_a_worker_that_dies_leaves_its_tasks_to_this_process() -> None:
    with pytest.warns(ParallelWarning, match="tasks run in this process instead"):
        out = fork_map(_die_on_three, os.getpid(), list(range(8)), 2)
    assert out == [i + 1 for i in range(8)]
    assert parallel._TASK is None


def test_a_task_exception_reaches_the_caller_as_it_would_in_process() -> None:
    for jobs in (1, 2):
        with pytest.raises(ValueError, match="task 2 refuses"):
            fork_map(_raise_on_two, None, [0, 1, 2, 3], jobs)


def test_compile_jobs_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITEKILN_COMPILE_JOBS", "3")
    assert compile_jobs() == 3 and compile_jobs(1) == 1
    monkeypatch.setenv("LITEKILN_COMPILE_JOBS", "0")
    assert compile_jobs() == max(1, min(parallel.MAX_DEFAULT_JOBS, len(os.sched_getaffinity(0))))
    monkeypatch.setenv("LITEKILN_COMPILE_JOBS", "many")
    with pytest.raises(ValueError, match="LITEKILN_COMPILE_JOBS='many'"):
        compile_jobs()


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_the_program_does_not_depend_on_the_number_of_processes(
    smoke_path: Path, precision: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """smoke with the GPU schedules and their tuning variants, compiled in this process and
    over 3 processes: the same program, field by field (kernels, launches, variants with their
    FLOPs, plan)."""
    from litekiln.artifact.compiled import CompileOptions
    from litekiln.compiler.driver import compile_model
    from litekiln.model import load_model

    model = load_model(smoke_path.read_bytes())
    options = CompileOptions(schedules="fast", precision=precision)
    docs = []
    for jobs in ("1", "3"):
        monkeypatch.setenv("LITEKILN_COMPILE_JOBS", jobs)
        compiled = compile_model(model, options, warn=False)
        docs.append([p.program.to_dict() for p in compiled.partitions])
    serial, forked = docs
    assert serial[0]["variants"], "smoke's convolutions have tuning variants"
    assert any(la.get("flops") for la in serial[0]["launches"])
    assert forked == serial


def test_minified_text_does_not_depend_on_the_number_of_processes() -> None:
    from litekiln.compiler.minify import minify_opencl

    kernels = "".join(
        f"// Function: k{i}\n__kernel void k{i}(__global float* restrict input_ptr) {{\n"
        f"  int cse_v1 = ((convert_int(get_group_id(0))) * {i + 2});\n"
        f"  input_ptr[(convert_int(get_local_id(0)))] = {i}.000000e+00f;\n}}\n\n"
        for i in range(30)
    )
    serial = minify_opencl(kernels, 1)
    assert minify_opencl(kernels, 3) == serial
    assert "cse_v1" not in serial and serial.count("__kernel") == 30
