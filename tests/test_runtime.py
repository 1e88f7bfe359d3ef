"""The runtime never imports TVM, and a cached model runs with TVM blocked (OpenCL, PoCL in CI);
nor does it import the tflite package or flatbuffers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import litekiln
from litekiln.runtime.profile import HALF_OVERLOADS, DeviceProfile, family_of

pytestmark = pytest.mark.opencl


def _run_blocked(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    prelude = "import sys\nsys.modules['tvm'] = None  # any TVM import now raises ImportError\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def test_cached_model_runs_with_tvm_blocked(smoke_path: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    # Compile here (TVM available) into a fresh cache...
    interp = litekiln.Interpreter(model_path=smoke_path, cache_dir=cache)
    inputs = interp.random_inputs(3)
    expected = interp.run(inputs)[0]
    ref = litekiln.Interpreter(model_path=smoke_path, device="reference").run(inputs)[0]
    np.testing.assert_allclose(expected, ref, rtol=0, atol=1e-4)  # GPU path vs reference
    np.save(tmp_path / "x.npy", inputs[0])
    np.save(tmp_path / "y.npy", expected)
    # ...then load and run it in a process where importing TVM is impossible.
    proc = _run_blocked(
        f"""
        import numpy as np, litekiln
        interp = litekiln.Interpreter(model_path={str(smoke_path)!r}, cache_dir={str(cache)!r})
        y = interp.run([np.load({str(tmp_path / "x.npy")!r})])[0]
        assert np.array_equal(y, np.load({str(tmp_path / "y.npy")!r})), "different result"
        loaded = [m for m in sys.modules if sys.modules[m] is not None]
        assert not any(m == 'tvm' or m.startswith('tvm.') for m in loaded)
        # (the loader reads the file itself: tests/test_flat.py)
        assert not [m for m in loaded if m.split('.')[0] in ('tflite', 'flatbuffers')], loaded
        print("OK", interp.device)
        """,
        dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr
    assert "OK" in proc.stdout


def test_uncached_model_without_tvm_is_a_clear_error(smoke_path: Path, tmp_path: Path) -> None:
    proc = _run_blocked(
        f"""
        import litekiln
        try:
            interp = litekiln.Interpreter(
                model_path={str(smoke_path)!r}, cache_dir={str(tmp_path)!r}
            )
            interp.allocate_tensors()
        except litekiln.CompileError as e:
            print("CompileError:", e)
        """,
        dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr
    assert "not in the cache" in proc.stdout and "litekiln compile" in proc.stdout


def test_runtime_modules_do_not_import_tvm() -> None:
    proc = _run_blocked(
        """
        import litekiln, litekiln.runtime.session, litekiln.runtime.executor
        import litekiln.runtime.device, litekiln.cache, litekiln.cache.models, litekiln.loading
        import litekiln.interpreter, litekiln.ops, litekiln.bench
        print("OK")
        """,
        dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr


def test_warm_start_uses_cache_and_skips_compile(
    smoke_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "c"
    litekiln.Interpreter(model_path=smoke_path, cache_dir=cache).allocate_tensors()
    import litekiln.loading as loading

    def boom(*a: object, **k: object) -> None:
        raise AssertionError("compiled again despite a cache hit")

    monkeypatch.setattr(loading, "compile_for", boom)
    interp = litekiln.Interpreter(model_path=smoke_path, cache_dir=cache)
    out = interp.run(interp.random_inputs(0))[0]
    assert out.shape == (1, 10) and np.isfinite(out).all()


def test_a_warm_start_never_reads_the_opencl_source(smoke_path: Path, tmp_path: Path) -> None:
    """A start with the device binary stored keys and loads it by the source's digest: the
    OpenCL C (MBs for a model with tuning variants) stays compressed in the cache, and reads
    back as the very text compiled when something needs it."""
    cache = tmp_path / "c"
    first = litekiln.Interpreter(model_path=smoke_path, cache_dir=cache)
    x = first.random_inputs(0)
    expected = first.run(x)
    first._backend.wait_for_graph()  # noqa: SLF001 - the binary is stored in the background
    warm = litekiln.Interpreter(model_path=smoke_path, cache_dir=cache)
    out = warm.run(x)
    warm._backend.wait_for_graph()  # noqa: SLF001
    assert warm._backend.startup["binaries"] == 1  # noqa: SLF001
    program = warm._backend.compiled.partitions[0].program  # noqa: SLF001
    assert program.__dict__["_source_loader"] is not None, "the warm start read the source"
    for a, b in zip(out, expected, strict=True):
        np.testing.assert_array_equal(a, b)
    made = first._backend.compiled.partitions[0].program  # noqa: SLF001
    assert program.source == made.source and program.source_sha256 == made.source_sha256


def test_split_model_runs_cpu_ops_between_partitions(smoke_path: Path) -> None:
    # max_partitions=1 forces part of the graph to the CPU: results must not change.
    a = litekiln.Interpreter(
        model_path=smoke_path, use_cache=False, max_partitions=1, min_partition_ops=4
    )
    ref = litekiln.Interpreter(model_path=smoke_path, device="reference")
    x = a.random_inputs(1)
    np.testing.assert_allclose(a.run(x)[0], ref.run(x)[0], rtol=0, atol=1e-4)


def test_outputs_are_read_into_the_same_host_arrays(smoke_path: Path, tmp_path: Path) -> None:
    """No per-inference allocation for partition outputs: the session reads each into one host
    array; results handed to the user (get_tensor, run, run(intermediates=True)) are copies
    that the next inference does not overwrite."""
    interp = litekiln.Interpreter(model_path=smoke_path, cache_dir=tmp_path / "cache")
    ref = litekiln.Interpreter(model_path=smoke_path, device="reference")
    interp.allocate_tensors()
    sess = interp._backend  # noqa: SLF001 - the test looks at the session's buffers
    x1, x2 = interp.random_inputs(1), interp.random_inputs(2)
    y1 = interp.run(x1)[0]
    inter1 = interp.run(x1, intermediates=True)
    out_id = interp.get_output_details()[0]["index"]
    held = sess.run(dict(zip(interp.model.main.inputs, x1, strict=True)))[out_id]
    y2 = interp.run(x2)[0]
    again = sess.run(dict(zip(interp.model.main.inputs, x2, strict=True)))[out_id]
    assert again is held, "the session allocated a new output array"
    np.testing.assert_allclose(y1, ref.run(x1)[0], rtol=0, atol=1e-4)
    np.testing.assert_allclose(y2, ref.run(x2)[0], rtol=0, atol=1e-4)
    np.testing.assert_array_equal(inter1[out_id], y1)  # not overwritten by the later runs
    assert not np.array_equal(y1, y2)


def test_binary_key_follows_the_exact_bytes_handed_to_the_driver(
    smoke_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device binary is keyed by the digest of exactly the source and options the driver
    was handed: a change to the device patch (here: one more line) is a miss and a rebuild
    from source, never the old binary."""
    import hashlib

    import pyopencl as cl
    from cache_fault_helpers import keys_by_kind, manifest

    from litekiln.runtime import executor as executor_mod
    from litekiln.runtime.profile import DeviceProfile, DriverProgram

    built: list[str] = []  # every source handed to the driver
    real_program = cl.Program

    def recording_program(ctx, *args):  # cl.Program(ctx, source) or (ctx, devices, binaries)
        if len(args) == 1:
            built.append(args[0])
        return real_program(ctx, *args)

    monkeypatch.setattr(executor_mod.cl, "Program", recording_program)
    cache = tmp_path / "cache"

    def load() -> tuple[list[bool], list[np.ndarray]]:
        interp = litekiln.Interpreter(model_path=smoke_path, cache_dir=cache, tune=False)
        out = interp.run(interp.random_inputs(0))
        interp._backend.wait_for_graph()  # noqa: SLF001 - a first start stores in the background
        return [ex.from_binary for ex in interp._backend.executors], out  # noqa: SLF001

    def stored_sources() -> dict[str, list[str]]:
        fields = [manifest(cache, k)["fields"] for k in keys_by_kind(cache)["program"]]
        return {f["source"]: f["build_options"] for f in fields}

    def digest(prefix: str, body: str) -> str:  # DriverProgram.digest, computed here
        h = [hashlib.sha256(t.encode()).hexdigest() for t in (prefix, body)]
        return hashlib.sha256((h[0] + h[1]).encode()).hexdigest()

    assert load()[0] == [False]  # first start: built from source, stored
    (first,) = built
    assert stored_sources() == {digest("", first): []}
    assert load()[0] == [True]  # second start: the stored binary (its source never read)
    assert len(built) == 1

    real_driver_for = DeviceProfile.driver_for

    def patched(self, program):  # a changed source patch of the executor
        d = real_driver_for(self, program)
        return DriverProgram(d.source, (*d.options, "-DLITEKILN_PATCHED=1"), prefix="// patched\n")

    monkeypatch.setattr(DeviceProfile, "driver_for", patched)
    from_binary, out = load()
    assert from_binary == [False], "the old binary was loaded for a different driver program"
    assert len(built) == 2 and built[1] == "// patched\n" + first
    assert stored_sources() == {
        digest("", first): [],
        digest("// patched\n", first): ["-DLITEKILN_PATCHED=1"],
    }
    assert load()[0] == [True]  # and the patched program's own binary is a hit from now on


def _profile(platform: str, kind: str = "gpu", extensions: str = "") -> DeviceProfile:
    return DeviceProfile(
        platform=platform, platform_version="OpenCL 3.0", vendor="v", name="dev", version="1",
        driver="1", kind=kind, family=family_of(platform), extensions=frozenset(extensions.split()),
        max_work_group_size=1024, max_work_item_sizes=(1024, 1024, 64), address_align=128,
    )  # fmt: skip


def test_device_profile_answers_the_vendor_questions() -> None:
    half_source = "#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n__kernel void k() {}"
    nvidia = _profile("NVIDIA CUDA")
    pocl = _profile("Portable Computing Language", kind="cpu")
    amd = _profile("AMD Accelerated Parallel Processing", extensions="cl_khr_fp16")
    assert [p.family for p in (nvidia, pocl, amd)] == ["nvidia", "pocl", "generic"]
    # Schedules by device type; the CUDA-graph path only on NVIDIA's OpenCL; the direct
    # enqueue loop everywhere but on PoCL.
    assert [p.schedules for p in (nvidia, pocl, amd)] == ["fast", "fast-cpu", "fast"]
    assert [p.cuda_graph_candidate for p in (nvidia, pocl, amd)] == [True, False, False]
    assert [p.direct_enqueue for p in (nvidia, pocl, amd)] == [True, False, True]
    # Half code: patched (macro and built-in overloads) where the driver does not list the
    # extension, handed over as it is where it does; float code is never patched.
    patched = nvidia.driver_program(half_source, "-cl-fast-relaxed-math")
    assert patched.source == HALF_OVERLOADS + half_source
    assert patched.options == ("-cl-fast-relaxed-math", "-Dcl_khr_fp16=1")
    assert amd.driver_program(half_source, "").source == half_source
    assert nvidia.driver_program("__kernel void k() {}", "").options == ()
    assert amd.half and not pocl.half  # listed; not listed and no context to probe on
    # Work-group limits.
    assert nvidia.fits((256,), 1024) and not nvidia.fits((2048,), 1024)
    assert not nvidia.fits((8, 8, 128), 1024)  # the third axis allows 64
    assert not nvidia.fits((512,), 256)  # the kernel's own limit


def test_a_cpu_only_opencl_driver_is_named_once(
    smoke_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """On a machine whose only OpenCL device is a CPU driver (PoCL here), the first session
    says so, with the fix; later ones do not repeat it."""
    import logging

    from litekiln import loading
    from litekiln.runtime.device import list_devices
    from litekiln.runtime.profile import DeviceProfile

    if any(DeviceProfile.of(d).kind == "gpu" for _, _, d in list_devices()):
        pytest.skip("this machine has an OpenCL GPU")
    loading._SAID_CPU_ONLY.clear()  # noqa: SLF001 - earlier tests of this process said it
    with caplog.at_level(logging.WARNING, logger="litekiln"):
        for _ in range(2):
            litekiln.Interpreter(model_path=smoke_path, cache_dir=tmp_path).allocate_tensors()
    said = [r.getMessage() for r in caplog.records if "CPU OpenCL driver" in r.getMessage()]
    assert len(said) == 1
    assert "GPU's OpenCL driver" in said[0] and "LiteRT's CPU path" in said[0]


def test_build_options_the_compiler_never_writes_are_refused(smoke_path: Path) -> None:
    """A stored program carrying other clBuildProgram options than the compiler's own is
    refused before anything reaches the driver (a tampered but checksummed entry)."""
    from litekiln.artifact.program import GpuProgram, ProgramFormatError

    interp = litekiln.Interpreter(model_path=smoke_path)
    interp.allocate_tensors()
    program = interp._backend.compiled.partitions[0].program  # noqa: SLF001
    program.validate()
    with pytest.raises(ProgramFormatError, match=r"build options \['-I/tmp', '-DX=1'\]"):
        GpuProgram.from_dict({**program.to_dict(), "build_options": "-I/tmp -DX=1"})
