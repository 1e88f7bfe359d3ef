"""A first start that builds from source runs its first inferences on the CPU (``cpu_first``).

`litekiln.runtime.session.Session._cpu_first`: where no binary is stored for the device (and no
PTX shipped), the session is ready at once on the numpy reference while the programs build in
a background thread; the device takes over between two inferences after its own first
inference, on the first inputs the CPU ran. These tests check the outputs on both sides of the
switch against the reference, that the device really takes over (and stores its binary, so
that the next start has no CPU phase), what a failed build leaves, the notices on a terminal,
and an exit in the middle of the build.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tvm")

from fresh_process import run_on_a_pty  # noqa: E402

import litekiln  # noqa: E402
from litekiln.errors import DeviceError  # noqa: E402

pytestmark = pytest.mark.opencl

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def compiled_cache(smoke_path: Path, tmp_path: Path) -> Path:
    """A cache as `litekiln compile` leaves it: the compiled model, no device binary."""
    cache = tmp_path / "cache"
    from litekiln.loading import precompile

    precompile(smoke_path, cache_dir=cache)
    return cache


def _reference(path: Path, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    ref = litekiln.Interpreter(model_path=path, device="reference")
    x = ref.random_inputs(seed)
    return x, ref.run(x)


def _slow_builds(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Builds from source that take ``seconds`` longer (the smoke model builds in ~0.1 s):
    inferences certainly run while they do."""
    from litekiln.runtime import build

    real = build._from_source  # noqa: SLF001

    def slow(*args: object) -> object:
        time.sleep(seconds)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(build, "_from_source", slow)


def test_the_cpu_serves_until_the_device_takes_over(
    smoke_path: Path, compiled_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inferences in a loop across the switch: each one's outputs match the reference (to
    1e-6 on the CPU, within fp32 tolerance on the device); the device's executors are in
    place after it, its binary is stored, and the next start loads it with no CPU phase."""
    _slow_builds(monkeypatch, 1.0)
    x, want = _reference(smoke_path, 0)
    it = litekiln.Interpreter(
        model_path=smoke_path, cache_dir=compiled_cache, tune=False, cpu_first=True
    )
    it.allocate_tensors()
    sess = it._backend  # noqa: SLF001
    assert sess.on_cpu and sess.executors == []
    assert it.device.startswith("the CPU (numpy) while ")
    on = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        cpu = sess.on_cpu
        got = it.run(x)
        on.append(cpu)
        for g, w in zip(got, want, strict=True):
            if cpu:  # (the reference's own numerics: BLAS threads may sum in another order)
                np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)
            else:
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
        if not cpu and on.count(False) >= 3:
            break
    assert on[0] and not on[-1], "the device never took over"
    assert on == sorted(on, reverse=True)  # the CPU, then the device, never back
    assert sess.executors and type(sess.executors[0]).__name__ == "PartitionExecutor"
    assert it.wait_for_device(60)
    st = sess.startup
    assert st["cpu_first"] and st["binaries"] == 0
    assert st["device_build_s"] >= 1.0 and st["device_ready_s"] >= st["device_build_s"]
    assert "device_first_run_s" in st  # the device's own first inference, before the switch
    # The binary the background stored: the next start builds nothing and has no CPU phase.
    again = litekiln.Interpreter(
        model_path=smoke_path, cache_dir=compiled_cache, tune=False, cpu_first=True
    )
    again.allocate_tensors()
    assert not again._backend.on_cpu  # noqa: SLF001
    assert (again._backend.startup["binaries"], again._backend.startup["partitions"]) == (1, 1)  # noqa: SLF001
    np.testing.assert_allclose(again.run(x)[0], want[0], rtol=1e-4, atol=1e-4)


def test_the_device_runs_the_first_inputs_before_taking_over(
    smoke_path: Path, compiled_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The device's first inference runs the inputs of the CPU's first (a copy: the caller
    may reuse its arrays), and is checked against the CPU's values (a divergence is
    logged)."""
    from litekiln.runtime import session as session_module

    _slow_builds(monkeypatch, 0.5)
    seen: list[dict[int, np.ndarray]] = []
    real = session_module.Session._run  # noqa: SLF001

    def spy(self: object, inputs: dict[int, np.ndarray], report: object = None) -> object:
        seen.append({t: np.array(v, copy=True) for t, v in inputs.items()})
        return real(self, inputs, report)  # type: ignore[arg-type]

    monkeypatch.setattr(session_module.Session, "_run", spy)
    x, _ = _reference(smoke_path, 1)
    it = litekiln.Interpreter(
        model_path=smoke_path, cache_dir=compiled_cache, tune=False, cpu_first=True
    )
    first = [a.copy() for a in x]
    it.run(x)
    for a in x:  # the caller reuses its arrays before the device ran them
        a[...] = 0
    assert it.wait_for_device(60)
    assert len(seen) == 1  # the device's first inference, in the background
    g = it._backend.graph  # noqa: SLF001
    for t, a in zip(g.inputs, first, strict=True):
        np.testing.assert_array_equal(seen[0][t], a)


def test_a_failed_build_leaves_the_model_on_the_cpu(
    smoke_path: Path, compiled_cache: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    from litekiln.runtime import build

    def broken(context: object, device: object, job: object, profile: object) -> object:
        raise build.BuildError("OpenCL build failed on Some CPU: (test) error: bad kernel")

    monkeypatch.setattr(build, "_from_source", broken)
    x, want = _reference(smoke_path, 2)
    it = litekiln.Interpreter(
        model_path=smoke_path, cache_dir=compiled_cache, tune=False, cpu_first=True
    )
    with caplog.at_level("WARNING", logger="litekiln"):
        np.testing.assert_allclose(it.run(x)[0], want[0], rtol=1e-6, atol=1e-7)
        assert not it.wait_for_device(60)
    assert "the model stays on the CPU" in caplog.text and "bad kernel" in caplog.text
    np.testing.assert_allclose(it.run(x)[0], want[0], rtol=1e-6, atol=1e-7)
    assert it.device.startswith("the CPU (numpy)")
    with pytest.raises(DeviceError, match="runs on the CPU .* did not build"):
        it.bind_input(it.get_input_details()[0]["index"], object())


def test_cpu_first_only_where_a_build_from_source_is_due(
    smoke_path: Path, compiled_cache: Path, tmp_path: Path
) -> None:
    """Off by option, in validate mode, and where the binary is stored: the device's
    executors are there at once."""
    spare = tmp_path / "spare"
    shutil.copytree(compiled_cache, spare)
    off = litekiln.Interpreter(model_path=smoke_path, cache_dir=spare, tune=False, cpu_first=False)
    off.allocate_tensors()
    assert not off._backend.on_cpu and off._backend.executors  # noqa: SLF001
    checked = litekiln.Interpreter(
        model_path=smoke_path, cache_dir=compiled_cache, tune=False, cpu_first=True,
        validate=True,
    )  # fmt: skip
    checked.allocate_tensors()
    assert not checked._backend.on_cpu  # noqa: SLF001
    checked.run(checked.random_inputs(0))
    checked.wait_for_device()
    stored = litekiln.Interpreter(
        model_path=smoke_path, cache_dir=compiled_cache, tune=False, cpu_first=True
    )
    stored.allocate_tensors()
    assert not stored._backend.on_cpu  # noqa: SLF001
    assert stored.wait_for_device(60)


_CHILD = textwrap.dedent(
    """
    import atexit, sys, time
    import litekiln
    from litekiln.runtime import build

    real = build._from_source

    def slow(*args):  # a build that outlasts the run below
        time.sleep(float(sys.argv[3]))
        return real(*args)

    build._from_source = slow
    it = litekiln.Interpreter(model_path=sys.argv[1], cache_dir=sys.argv[2], tune=False)
    if sys.argv[4] == "run":
        it.run(it.random_inputs(0))
    device = it.device  # (opens the session: the CPU-first start and its build begin here)
    left = time.monotonic()
    # (registered after litekiln's own handler: runs before it)
    atexit.register(lambda: print(f"atexit after {time.monotonic() - left:.2f} s", flush=True))
    print("done", device, flush=True)
    """
)


def _start(smoke_path: Path, cache: Path, build_s: float, what: str) -> tuple[str, str, float]:
    """A first start in a fresh process, its stderr on a pty (the notices show on a
    terminal): (stdout, stderr, seconds)."""
    cmd = [sys.executable, "-c", _CHILD, str(smoke_path), str(cache), str(build_s), what]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm", "LITEKILN_CPU_FIRST": "on"}
    t0 = time.monotonic()
    rc, out, err = run_on_a_pty(cmd, env)
    assert rc == 0, err
    return out, err, time.monotonic() - t0


def test_an_exit_during_the_build_finishes_it_for_the_next_start(
    smoke_path: Path, compiled_cache: Path
) -> None:
    """One inference on the CPU, then the exit: the notices say so, the exit waits for the
    build and the device's first inference, and stores the binary; the next start has no CPU
    phase and prints nothing."""
    out, err, _ = _start(smoke_path, compiled_cache, 3.0, "run")
    assert out.startswith("done the CPU (numpy) while ")
    assert "in the background (1 program(s)); inferences run on the CPU until it is done" in err
    assert ": finishing before the exit, for the next start" in err
    assert ": done in " in err
    out2, err2, _ = _start(smoke_path, compiled_cache, 3.0, "run")
    assert out2.startswith("done ") and "the CPU" not in out2
    assert "litekiln: building" not in err2


def test_an_exit_before_any_inference_stores_nothing(
    smoke_path: Path, compiled_cache: Path
) -> None:
    """Opened and closed with no inference: the exit waits for the build in flight (a driver
    is never torn down under it) and exits cleanly; with no device inference to store after,
    the next start builds again. (The build sleeps 6 s: what the start does after the build
    began must end before it, on a loaded machine too; with 2 s, a full suite on 2 cores once
    saw the build done before the exit.) The exit reaches the exit handlers at once: the
    builds ran on a ThreadPoolExecutor, whose threads the interpreter joins before any atexit
    handler, so the exit waited for the build in silence and the session's handler then
    raced the take-over to say so (a full suite on 2 cores lost that race twice)."""
    out, err, _ = _start(smoke_path, compiled_cache, 6.0, "none")
    waited = float(out.split("atexit after ")[1].split()[0])
    assert waited < 2.0, out  # not the build's 6 s
    assert ": finishing before the exit" in err
    out2, _, _ = _start(smoke_path, compiled_cache, 0.0, "run")
    assert out2.startswith("done the CPU (numpy) while ")


def test_inferences_from_threads_across_the_switch(
    smoke_path: Path, compiled_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two threads infer on one Interpreter while the device takes over: every result
    matches the reference."""
    _slow_builds(monkeypatch, 0.5)
    x, want = _reference(smoke_path, 3)
    it = litekiln.Interpreter(
        model_path=smoke_path, cache_dir=compiled_cache, tune=False, cpu_first=True
    )
    errors: list[BaseException] = []
    stop = time.monotonic() + 120

    def work() -> None:
        try:
            while time.monotonic() < stop and it._backend.on_cpu:  # noqa: SLF001
                np.testing.assert_allclose(it.run(x)[0], want[0], rtol=1e-4, atol=1e-4)
            for _ in range(5):
                np.testing.assert_allclose(it.run(x)[0], want[0], rtol=1e-4, atol=1e-4)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    it.allocate_tensors()
    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert not it._backend.on_cpu  # noqa: SLF001


def test_a_failing_first_device_inference_leaves_the_model_on_the_cpu(
    smoke_path: Path, compiled_cache: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """The programs build but the device's first inference raises: the CPU keeps serving
    (never half switched), and the warning says why."""
    from litekiln.runtime.executor import PartitionExecutor

    def broken(self: object, *args: object, **kwargs: object) -> None:
        raise RuntimeError("(test) the kernel faulted")

    monkeypatch.setattr(PartitionExecutor, "run", broken)
    x, want = _reference(smoke_path, 4)
    it = litekiln.Interpreter(
        model_path=smoke_path, cache_dir=compiled_cache, tune=False, cpu_first=True
    )
    with caplog.at_level("WARNING", logger="litekiln"):
        it.run(x)
        assert not it.wait_for_device(60)
    assert "the device's first inference failed" in caplog.text
    assert "the kernel faulted" in caplog.text
    np.testing.assert_allclose(it.run(x)[0], want[0], rtol=1e-6, atol=1e-7)
