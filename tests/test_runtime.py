"""The runtime never imports TVM, and a cached model runs with TVM blocked (OpenCL, PoCL in CI)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import litekiln

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
        assert not any(m == 'tvm' or m.startswith('tvm.') for m in sys.modules if sys.modules[m] is not None)
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
            litekiln.Interpreter(model_path={str(smoke_path)!r}, cache_dir={str(tmp_path)!r}).allocate_tensors()
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
        import litekiln, litekiln.runtime.session, litekiln.runtime.executor, litekiln.runtime.device
        import litekiln.cache, litekiln.cache.models, litekiln.interpreter, litekiln.ops, litekiln.bench
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
    import litekiln.runtime.session as session

    def boom(*a: object, **k: object) -> None:
        raise AssertionError("compiled again despite a cache hit")

    monkeypatch.setattr(session, "compile_for", boom)
    interp = litekiln.Interpreter(model_path=smoke_path, cache_dir=cache)
    out = interp.run(interp.random_inputs(0))[0]
    assert out.shape == (1, 10) and np.isfinite(out).all()


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
    held = sess.run(dict(zip(interp.model.main.inputs, x1)))[out_id]
    y2 = interp.run(x2)[0]
    again = sess.run(dict(zip(interp.model.main.inputs, x2)))[out_id]
    assert again is held, "the session allocated a new output array"
    np.testing.assert_allclose(y1, ref.run(x1)[0], rtol=0, atol=1e-4)
    np.testing.assert_allclose(y2, ref.run(x2)[0], rtol=0, atol=1e-4)
    np.testing.assert_array_equal(inter1[out_id], y1)  # not overwritten by the later runs
    assert not np.array_equal(y1, y2)
