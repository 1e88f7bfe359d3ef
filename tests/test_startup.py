"""A first start on a device: programs built in threads, the progress line, what is stored when.

`litekiln.runtime.build` builds every program from source in worker threads; these tests check
that threaded builds run exactly what a serial build runs, that the progress line shows on a
terminal (a real pty) or when forced and never otherwise, and that PoCL's binary is stored
after the first inference (holding the kernels compiled for their launch sizes) so that the
next start builds nothing.
"""

from __future__ import annotations

import io
import os
import subprocess
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
from litekiln.runtime.build import BuildProgress, build_programs  # noqa: E402

pytestmark = pytest.mark.opencl

ROOT = Path(__file__).resolve().parents[1]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("mode", "tty", "lines"),
    [("auto", True, 2), ("auto", False, 0), ("on", False, 2), ("off", True, 0)],
)
def test_progress_line_on_a_terminal_or_forced_only(
    monkeypatch: pytest.MonkeyPatch, mode: str, tty: bool, lines: int
) -> None:
    monkeypatch.setenv("LITEKILN_PROGRESS", mode)
    monkeypatch.delenv("TERM", raising=False)
    stream = _Tty() if tty else io.StringIO()
    p = BuildProgress("face", "Some GPU (OpenCL)", stream)
    p(0, 1, 0.2)  # within half a second: nothing yet
    p(0, 1, 0.7)
    p(0, 1, 1.4)
    p(1, 1, 2.1)
    out = stream.getvalue()
    if not lines:
        assert out == ""
        return
    assert "litekiln: building face for Some GPU (OpenCL): partition 0/1, 0.7 s" in out
    assert out.endswith("litekiln: building face for Some GPU (OpenCL): partition 1/1, 2.1 s\n")
    if tty:  # updated in place
        assert out.count("\r\x1b[K") == 3 and out.count("\n") == 1
    else:  # a log: the first line and the last
        assert out.count("\n") == lines and "1.4 s" not in out


@pytest.mark.parametrize(("seconds", "shown"), [(0.8, True), (0.0, False)])
def test_first_inference_line(monkeypatch: pytest.MonkeyPatch, seconds: float, shown: bool) -> None:
    """A first inference that takes long (kernels compiled at their first launch) gets its
    own line, updated while it runs; a quick one prints nothing; the result comes back."""
    monkeypatch.setenv("LITEKILN_PROGRESS", "on")
    monkeypatch.delenv("TERM", raising=False)
    stream = _Tty()
    p = BuildProgress("face", "Some CPU (PoCL)", stream)

    def work() -> str:
        time.sleep(seconds)
        return "outputs"

    assert p.reporting(work, every=0.1) == "outputs"
    out = stream.getvalue()
    if not shown:
        assert out == ""
        return
    lines = out.split("\r\x1b[K")[1:]
    assert len(lines) >= 2  # updated in place while it ran, then the total
    assert all(
        ln.startswith("litekiln: building face for Some CPU (PoCL): first inference, ")
        for ln in lines
    )
    assert out.endswith(" s\n") and out.count("\n") == 1


def test_first_inference_line_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITEKILN_PROGRESS", "off")
    stream = _Tty()
    p = BuildProgress("face", "Some CPU (PoCL)", stream)
    assert p.reporting(lambda: 7) == 7
    assert stream.getvalue() == ""
    assert not [t for t in threading.enumerate() if t.name == "litekiln-progress"]


_CHILD = textwrap.dedent(
    """
    import sys, time
    import litekiln
    from litekiln.runtime import build

    real = build._from_source

    def slow(*args):  # the smoke model builds in well under the line's half second
        time.sleep(1.2)
        return real(*args)

    build._from_source = slow
    if len(sys.argv) > 3:  # a first inference as long as PoCL's (kernels compiled then)
        from litekiln.runtime import session

        run = session.Session._run
        session.Session._run = lambda self, *a: (time.sleep(0.9), run(self, *a))[1]
    it = litekiln.Interpreter(model_path=sys.argv[1], cache_dir=sys.argv[2], tune=False)
    it.run(it.random_inputs(0))
    print("done")
    """
)


def _first_start(
    smoke_path: Path,
    cache: Path,
    *,
    pty_stderr: bool,
    env: dict[str, str],
    slow_first_inference: bool = False,
) -> str:
    """A first start (compiled model cached, no binary) in a fresh process; its stderr."""
    cmd = [sys.executable, "-c", _CHILD, str(smoke_path), str(cache)]
    cmd += ["slow"] if slow_first_inference else []
    full = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm", **env}
    if not pty_stderr:
        p = subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        return p.stderr
    rc, _, err = run_on_a_pty(cmd, full)
    assert rc == 0, err
    return err


@pytest.fixture
def compiled_cache(smoke_path: Path, tmp_path: Path) -> Path:
    """A cache as `litekiln compile` leaves it: the compiled model, no device binary."""
    cache = tmp_path / "cache"
    from litekiln.loading import precompile

    precompile(smoke_path, cache_dir=cache)
    return cache


def test_progress_line_in_a_pty_and_not_in_a_pipe(
    smoke_path: Path, compiled_cache: Path, tmp_path: Path
) -> None:
    import shutil

    fresh = tmp_path / "fresh"
    shutil.copytree(compiled_cache, fresh)
    out = _first_start(smoke_path, compiled_cache, pty_stderr=True, env={})
    assert "\r\x1b[Klitekiln: building smoke for " in out
    assert "partition 1/1" in out
    piped = _first_start(smoke_path, fresh, pty_stderr=False, env={})
    assert "litekiln: building" not in piped
    # The second start loads the binary the first stored: nothing to build, no line.
    again = _first_start(smoke_path, compiled_cache, pty_stderr=True, env={})
    assert "litekiln: building" not in again


def test_first_inference_line_after_a_build_in_a_pty(
    smoke_path: Path, compiled_cache: Path
) -> None:
    out = _first_start(
        smoke_path, compiled_cache, pty_stderr=True, env={}, slow_first_inference=True
    )
    assert "partition 1/1" in out
    assert "litekiln: building smoke for " in out and ": first inference, " in out
    # A warm start (the binary stored by the first): no build, so no first-inference line
    # however long its first inference.
    again = _first_start(
        smoke_path, compiled_cache, pty_stderr=True, env={}, slow_first_inference=True
    )
    assert "litekiln: building" not in again


def test_threaded_builds_run_what_a_serial_build_runs(smoke_path: Path, tmp_path: Path) -> None:
    """The same programs built on 3 threads at once and on 1: bit-identical outputs."""
    from litekiln.runtime.executor import PartitionExecutor, build_job
    from litekiln.runtime.session import partition_constants

    it = litekiln.Interpreter(model_path=smoke_path, cache_dir=tmp_path / "c", tune=False)
    it.allocate_tensors()
    sess = it._backend  # noqa: SLF001
    h = sess.handle
    part = sess.compiled.partitions[0]
    consts = partition_constants(sess.compiled, part)
    rng = np.random.default_rng(0)
    x = [
        rng.uniform(-1, 1, sess.executors[0].input_spec(i).shape).astype(np.float32)
        for i in range(sess.executors[0].num_inputs)
    ]
    outs = {}
    for threads in (1, 3):
        jobs = [build_job(part.program, h.profile, label=f"copy {i}") for i in range(3)]
        built = build_programs(jobs, h.context, h.device, h.profile, threads=threads)
        assert all(b.error is None and not b.from_binary for b in built)
        outs[threads] = [
            PartitionExecutor(part.program, consts, h.context, h.queue, None, h.profile, built=b)(
                *x
            )
            for b in built
        ]
    flat = [y for runs in outs.values() for ys in runs for y in ys]
    n = len(outs[1][0])
    for k, y in enumerate(flat):
        np.testing.assert_array_equal(y, flat[k % n])


def test_first_start_stores_binary_after_first_inference(
    smoke_path: Path, compiled_cache: Path
) -> None:
    it = litekiln.Interpreter(model_path=smoke_path, cache_dir=compiled_cache, tune=False)
    it.allocate_tensors()
    sess = it._backend  # noqa: SLF001
    assert sess.startup["binaries"] == 0 and sess.startup["model_cached"]
    it.run(it.random_inputs(0))
    sess.wait_for_graph()
    again = litekiln.Interpreter(model_path=smoke_path, cache_dir=compiled_cache, tune=False)
    again.allocate_tensors()
    st = again._backend.startup  # noqa: SLF001
    assert (st["binaries"], st["partitions"]) == (1, 1)
    np.testing.assert_array_equal(
        again.run(again.random_inputs(0))[0],
        it.run(it.random_inputs(0))[0],
    )


class _LateEvent(threading.Event):
    """Set, but its first wait reports a timeout: a wait that timed out just as the first
    inference set it."""

    def __init__(self) -> None:
        super().__init__()
        self.set()
        self._late = True

    def wait(self, timeout: float | None = None) -> bool:
        if self._late:
            self._late = False
            return False
        return super().wait(timeout)


def test_background_work_runs_when_the_first_inference_ends_as_the_process_exits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The exit flag set after the first inference, seen by a wait that timed out: the
    binaries are still stored (CI once saw the next start build again)."""
    from litekiln.runtime import session

    done: list[str] = []
    s = session.Session.__new__(session.Session)
    s._ready = _LateEvent()  # noqa: SLF001
    s.model = type("M", (), {"name": "m"})()
    s._complete_pending = lambda: done.append("complete")  # type: ignore[method-assign]  # noqa: SLF001
    s._tune_pending = lambda: done.append("tune")  # type: ignore[method-assign]  # noqa: SLF001
    s._store_pending = lambda: done.append("store")  # type: ignore[method-assign]  # noqa: SLF001
    s._graph_todo = lambda: []  # type: ignore[method-assign]  # noqa: SLF001
    monkeypatch.setattr(session, "_STOPPING", threading.Event())
    session._STOPPING.set()  # noqa: SLF001
    s._in_background()  # noqa: SLF001
    assert done == ["complete", "tune", "store"]
    # Exiting before any inference: nothing is done (the next start builds).
    s2 = session.Session.__new__(session.Session)
    s2._ready = threading.Event()  # noqa: SLF001
    s2.model = s.model
    s2._complete_pending = lambda: done.append("too early")  # type: ignore[method-assign]  # noqa: SLF001
    s2._in_background()  # noqa: SLF001
    assert "too early" not in done


_START = """
import sys, tempfile
import numpy as np
sys.path.insert(0, sys.argv[1])
from tflite_builder import ModelBuilder
import litekiln

b = ModelBuilder()
x = b.input("x", [1, 4])
b.output(b.op("ADD", [x, x]))
data = b.build()
# A reference interpreter run first, then a device one.
litekiln.Interpreter(model_content=data, device="reference").run([np.ones((1, 4), np.float32)])
litekiln.Interpreter(model_content=data, cache_dir=sys.argv[2]).allocate_tensors()
print("started")
"""


def test_fresh_starts_never_see_a_half_imported_cache(tmp_path: Path) -> None:
    """The device opener's thread reads the GPU record (importing `litekiln.cache`) while the
    starting thread imports it for `open_session`. Without `loading.import_cache` the two
    could each hold a module lock the other waited for, and Python handed one a partly
    initialised module: "cannot import name 'CacheStore' from partially initialized module",
    on 10 of 10 starts of this script (a model built in the process, a reference interpreter
    first: as the probe's scripts had it; the timing it needs is delicate, 1 in 4 with a model
    read from a file)."""
    # The default device (the suite names one: then no GPU record is read early).
    env = {k: v for k, v in os.environ.items() if k != "LITEKILN_DEVICE"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _START, str(Path(__file__).parent), str(tmp_path / f"c{i}")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and "started" in out, err[-2000:]
