"""The CUDA driver's early start (litekiln/runtime/early.py): when it starts, and only once."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any

import pytest

from litekiln.runtime import early


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A process where nothing has started yet, an NVIDIA driver 'installed', and the
    driver's start recorded instead of run."""
    calls: list[str] = []
    monkeypatch.setattr(early, "_started", False)
    monkeypatch.setattr(early, "_cuda_init", lambda: calls.append(threading.current_thread().name))
    real_exists = early.os.path.exists
    monkeypatch.setattr(early.os.path, "exists", lambda p: p == "/dev/nvidiactl" or real_exists(p))
    for var in ("LITEKILN_EARLY_CUDA", "LITEKILN_DEVICE", "LITEKILN_CUDA_GRAPH"):
        monkeypatch.delenv(var, raising=False)
    return calls


def _join() -> None:
    for t in threading.enumerate():
        if t.name == "litekiln-cuda-init":
            t.join(5)


def test_starts_once_in_a_thread_of_its_own(fresh: list[str]) -> None:
    assert early.start_cuda() is True
    assert early.start_cuda() is False  # the device opening's call finds it started
    assert early.start_cuda(check=False) is False
    _join()
    assert fresh == ["litekiln-cuda-init"]


@pytest.mark.parametrize(
    "env",
    [
        {"LITEKILN_EARLY_CUDA": "0"},
        {"LITEKILN_DEVICE": "reference"},
        {"LITEKILN_DEVICE": "cpu"},
        {"LITEKILN_DEVICE": "0:1"},
        {"LITEKILN_CUDA_GRAPH": "off"},
        {"LITEKILN_CUDA_GRAPH": "sometimes"},  # malformed: the device opening reports it
    ],
)
def test_not_where_it_cannot_help(
    fresh: list[str], monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert early.wanted() is False
    assert early.start_cuda() is False
    # the device opening, once it knows a CUDA start is asked for, starts it all the same
    assert early.start_cuda(check=False) is True
    _join()
    assert len(fresh) == 1


def test_gpu_choice_wants_it(fresh: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITEKILN_DEVICE", " GPU ")
    assert early.wanted() is True


def test_no_nvidia_driver_no_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(early.os.path, "exists", lambda p: False)
    monkeypatch.delenv("LITEKILN_EARLY_CUDA", raising=False)
    assert early.wanted() is False


def test_interpreter_import_starts_it_before_numpy() -> None:
    # In a fresh process: the interpreter module asks for the start before numpy is imported
    # (this machine has no NVIDIA driver, so what is checked is the order of the calls).
    code = (
        "import sys\n"
        "import litekiln.runtime.early as e\n"
        "seen = []\n"
        "e.start_cuda = lambda **k: seen.append('numpy' in sys.modules)\n"
        "import litekiln.interpreter\n"
        "print(seen)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert out.strip() == "[False]"


def test_cuda_init_without_libcuda_does_nothing(monkeypatch: Any) -> None:
    import ctypes

    def missing(name: str, *a: Any, **k: Any) -> Any:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    early._cuda_init()  # no exception, nothing started
