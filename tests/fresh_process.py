"""`litekiln compile`, then an app's start, each in a process of its own (no module imported
before but what the command and the app import themselves): what a user's build step and
app do, import order included."""

from __future__ import annotations

import os
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
