"""`litekiln compile`, then an app's start, each in a process of its own (no module imported
before but what the command and the app import themselves): what a user's build step and
app do, import order included."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]

_APP = """
import sys
import litekiln

it = litekiln.Interpreter(model_path=sys.argv[1], cache_dir=sys.argv[2])
it.allocate_tensors()
s = it._backend
print(s.startup["model_cached"], s.compiled.steps, s.compiled.cpu_reasons)
"""


def compile_then_open(model: Path, cache: Path) -> tuple[str, str]:
    """`litekiln compile MODEL --cache-dir CACHE` in one fresh process, then an
    ``Interpreter`` on the same cache in another: the compile's stdout, and the app's line
    ``<cache hit> <steps> <cpu reasons>``."""
    env = {**os.environ, "PYTHONPATH": str(_ROOT)}
    cmd = [sys.executable, "-m", "litekiln.cli", "compile", str(model), "--cache-dir", str(cache)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=True)
    app = [sys.executable, "-c", _APP, str(model), str(cache)]
    opened = subprocess.run(app, env=env, capture_output=True, text=True, timeout=600, check=True)
    return done.stdout, opened.stdout.strip().splitlines()[-1]


def run_on_a_pty(cmd: list[str], env: dict[str, str], timeout: float = 300) -> tuple[int, str, str]:
    """Run ``cmd`` with its stderr on a pseudo-terminal (what a user's terminal shows:
    litekiln's progress lines are for terminals only); (exit status, stdout, stderr)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=follower, text=True)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:  # EIO: the child closed the pty
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    out = proc.stdout.read() if proc.stdout else ""
    return proc.wait(timeout=timeout), out, b"".join(chunks).decode(errors="replace")
