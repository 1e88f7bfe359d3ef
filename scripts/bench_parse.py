#!/usr/bin/env python3
"""Time model parsing (``load_model``) in fresh processes, as an app's start pays it.

For each model, ``--runs`` fresh interpreters each time (wall clock, and CPU time: steadier
on a shared machine) the first ``load_model`` with the imports it needs (``litekiln.model``
and whatever the loader imports on first use) and a second ``load_model`` of the same file
(parse only: imports done, file in the page cache); medians are printed. Bytecode is
compiled and used as after a pip install (PYTHONDONTWRITEBYTECODE is dropped, the bytecode
goes under ``--pycache``); one unmeasured run per model writes it.
``--tree`` times another checkout (e.g. a ``git worktree`` of an older commit) to compare.
No per-op checks run (``litekiln.ops`` is not imported): this is the loader alone.

    python scripts/bench_parse.py models/zoo/face_detection_short_range.tflite ...
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_CODE = r"""
import sys, time
w0, c0 = time.perf_counter(), time.process_time()
from litekiln.model import load_model
load_model(sys.argv[1], validate=False)
w1, c1 = time.perf_counter(), time.process_time()
load_model(sys.argv[1], validate=False)
w2, c2 = time.perf_counter(), time.process_time()
print((w1 - w0) * 1e3, (w2 - w1) * 1e3, (c1 - c0) * 1e3, (c2 - c1) * 1e3)
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("models", nargs="+", type=Path)
    p.add_argument("--runs", type=int, default=9, help="fresh processes per model (default 9)")
    p.add_argument("--tree", type=Path, default=REPO, help="the checkout to time (default: this)")
    p.add_argument(
        "--pycache", default="/tmp/litekiln-bench-pyc", help="PYTHONPYCACHEPREFIX for the runs"
    )
    a = p.parse_args()
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = a.pycache
    env["PYTHONPATH"] = str(a.tree.resolve())
    print(f"{'ms, median (wall / CPU)':32s} {'first load, imports incl.':>26s} {'parse only':>15s}")
    for model in a.models:
        runs = []
        for i in range(a.runs + 1):
            out = subprocess.run(
                [sys.executable, "-c", _CODE, str(model.resolve())],
                env=env,
                cwd=a.tree,  # (``-c`` puts the working directory first on sys.path)
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            if i:  # the first run compiles bytecode
                runs.append([float(v) for v in out])
        wall1, wall2, cpu1, cpu2 = (statistics.median(col) for col in zip(*runs, strict=True))
        first, parse = f"{wall1:.1f} / {cpu1:.1f}", f"{wall2:.1f} / {cpu2:.1f}"
        print(f"{model.stem:32s} {first:>26s} {parse:>15s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
