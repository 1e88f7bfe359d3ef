"""PTX for NVIDIA GPUs, made by the compiler where no GPU is (`litekiln.compiler.ptx`).

This machine has no NVIDIA GPU: what runs here is the compile side (the PTX holds one entry per
default kernel, with the parameters its launches pass, as `check_ptx` demands before the CUDA
driver gets it), the cache round trip, and the session leaving it alone on other devices. The
PTX's kernels run on the H100 (`scripts/remote_gpu/run.sh`, docs/benchmarks.md).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from litekiln.artifact.program import GpuProgram
from litekiln.compiler.ptx import PTX_ARCH, find_nvcc
from litekiln.runtime.build import default_program
from litekiln.runtime.cuda import check_ptx, ptx_entries, ptx_for_cuda

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="no CUDA toolkit (nvcc) here")


def _compiled(path: Path, cache_dir: Path, **options: object) -> list[GpuProgram]:
    from litekiln.cache.models import ModelCache
    from litekiln.loading import precompile, split_options
    from litekiln.model import load_model

    info = precompile(path, cache_dir=cache_dir, **options)
    copts, _ = split_options({"schedules": info["options"]["schedules"]}, "fp32")
    model = load_model(path)
    compiled = ModelCache.open(cache_dir).load_model(model.token, copts, model)
    assert compiled is not None
    return [p.program for p in compiled.partitions]


@needs_nvcc
def test_compile_ships_ptx_of_the_default_kernels(
    smoke_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LITEKILN_PTX", "auto")  # `litekiln compile` is ahead of time
    (program,) = _compiled(smoke_path, tmp_path, schedules="fast")
    assert program.meta["ptx"].startswith(PTX_ARCH), program.meta["ptx"]
    first = default_program(program) or program
    text = ptx_for_cuda(program.ptx)
    check_ptx(text, first, first.launches)  # every launch: its entry, its parameter types
    entries = ptx_entries(text)
    assert set(entries) == {la.kernel for la in first.launches}  # nothing else: no variants
    # Two of them are options that became defaults (`litekiln.compiler.defaults`: smoke's
    # strided convolution, 8 work-groups as scheduled, starts at 16): variants are lowered in
    # worker processes that return OpenCL C only, so these were lowered again for the PTX.
    from litekiln.compiler.defaults import work_groups

    groups = {la.func: work_groups(la) for la in first.launches}
    assert groups["fused_conv2d3_add2_relu1"] == 16
    assert f".target sm_{PTX_ARCH.split('_')[1]}" in text
    # Stored and read back with the program, unchanged.
    assert GpuProgram.from_json(program.to_json()).ptx == program.ptx


@needs_nvcc
def test_no_ptx_for_cpu_schedules_whose_kernels_run_through_dispatchers(
    smoke_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from litekiln.compiler import ptx

    def no_nvcc(*_: object) -> None:
        raise AssertionError("nvcc ran for a program that can have no PTX")

    monkeypatch.setenv("LITEKILN_PTX", "auto")
    monkeypatch.setattr(ptx, "make_ptx", no_nvcc)  # (it took 7.6 s of pose_landmark_full's 19)
    (program,) = _compiled(smoke_path, tmp_path, schedules="fast-cpu")
    assert program.ptx == "" and "dispatchers" in program.meta["ptx"]
    assert any(k.startswith("d") for k in program.kernels)


@needs_nvcc
def test_no_ptx_when_off_or_when_compiled_as_opened(
    smoke_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LITEKILN_PTX", "off")
    (program,) = _compiled(smoke_path, tmp_path / "off", schedules="fast")
    assert program.ptx == "" and program.meta["ptx"].startswith("not made")
    # auto: a compile as the model is opened makes none (it would only delay that start).
    from litekiln.interpreter import Interpreter

    monkeypatch.setenv("LITEKILN_PTX", "auto")
    it = Interpreter(
        model_path=str(smoke_path), cache_dir=str(tmp_path / "opened"), schedules="fast"
    )
    it.allocate_tensors()
    assert all(p.program.ptx == "" for p in it._backend.compiled.partitions)  # noqa: SLF001


@needs_nvcc
def test_shipped_ptx_left_alone_off_nvidia(
    smoke_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an OpenCL device that is not NVIDIA's the first start builds OpenCL as before, and
    its outputs are the numpy reference's."""
    from litekiln.interpreter import Interpreter

    monkeypatch.setenv("LITEKILN_PTX", "auto")
    (program,) = _compiled(smoke_path, tmp_path, schedules="fast")
    assert program.ptx
    it = Interpreter(model_path=str(smoke_path), cache_dir=str(tmp_path), schedules="fast")
    it.allocate_tensors()
    assert it._backend.startup["ptx"] == 0  # noqa: SLF001
    assert it._backend.compiled.partitions[0].program.ptx == program.ptx  # (that entry)  # noqa: SLF001
    ref = Interpreter(model_path=str(smoke_path), device="reference")
    ref.allocate_tensors()
    for interp in (it, ref):
        for d in interp.get_input_details():
            x = np.random.default_rng(0).standard_normal(d["shape"]).astype(d["dtype"])
            interp.set_tensor(d["index"], x)
        interp.invoke()
    for a, b in zip(it.get_output_details(), ref.get_output_details(), strict=True):
        np.testing.assert_allclose(
            it.get_tensor(a["index"]), ref.get_tensor(b["index"]), atol=1e-4, rtol=1e-4
        )
