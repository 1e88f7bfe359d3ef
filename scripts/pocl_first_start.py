#!/usr/bin/env python3
"""First start on PoCL after a plain compile, by schedule unrolling (issue 16).

PoCL generates each kernel's code at its first launch; how long that takes follows the
kernel's text, which the ``fast-cpu`` profile's unrolling sets. Each step runs in a process
of its own, PoCL's kernel cache off (``POCL_KERNEL_CACHE=0``)::

    .venv/bin/python scripts/pocl_first_start.py                      # the profile as it is
    .venv/bin/python scripts/pocl_first_start.py --unroll window      # the window unrolled too
    .venv/bin/python scripts/pocl_first_start.py --unroll none        # nothing unrolled
    .venv/bin/python scripts/pocl_first_start.py --model models/zoo/face_landmark.tflite
    .venv/bin/python scripts/pocl_first_start.py --dispatch both --repeat 3  # dispatchers off/on

``--dispatch off`` compiles each kernel as a kernel of its own (no dispatcher kernels,
`litekiln.compiler.dispatch`); ``both`` compiles the model both ways and alternates first
starts of each, ``--repeat`` times, each from a fresh copy of its compiled cache.

Prints the compile time (``litekiln compile`` into a fresh cache), then the first start's
open + build and first inference, and the median of 10 warm inferences.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _compile(model: str, cache: str, unroll: str, dispatch: str = "on") -> None:
    from litekiln.compiler import dispatch as dispatch_module
    from litekiln.compiler import schedules

    if dispatch == "off":
        dispatch_module.GROUP = 1  # (no group of two: every kernel stays a kernel)

    if unroll == "window":
        schedules.PROFILES["cpu"]["unroll_window"] = True
    elif unroll == "none":
        from tvm import s_tir

        s_tir.Schedule.unroll = lambda self, loop: None  # type: ignore[method-assign]
    from litekiln.cli.main import main

    sys.argv = ["litekiln", "compile", model, "--cache-dir", cache, "--schedules", "fast-cpu"]
    t = time.perf_counter()
    try:
        main()
    except SystemExit as exc:
        if exc.code:
            raise
    print(f"compile {time.perf_counter() - t:.1f} s (in process, after the imports)")


def _first_start(model: str, cache: str) -> None:
    import litekiln

    t0 = time.perf_counter()
    # (cpu_first off: the device's own first start is measured, not the CPU's answer while
    # it builds; `litekiln bench --startup` measures both)
    it = litekiln.Interpreter(
        model_path=model, cache_dir=cache, schedules="fast-cpu", cpu_first=False
    )
    it.allocate_tensors()
    x = it.random_inputs(0)
    t1 = time.perf_counter()
    it.run(x)
    t2 = time.perf_counter()
    warm = []
    for _ in range(10):
        a = time.perf_counter()
        it.run(x)
        warm.append(time.perf_counter() - a)
    print(
        f"open + build {t1 - t0:.2f} s, first inference {t2 - t1:.2f} s, "
        f"first start {t2 - t0:.2f} s, warm inference {statistics.median(warm) * 1e3:.1f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/zoo/hand_landmark_lite.tflite")
    ap.add_argument("--unroll", choices=("profile", "window", "none"), default="profile")
    ap.add_argument("--dispatch", choices=("on", "off", "both"), default="on")
    ap.add_argument("--repeat", type=int, default=1, help="first starts per configuration")
    ap.add_argument("--step", choices=("all", "compile", "start"), default="all")
    ap.add_argument("--cache", help="cache directory (default: a fresh temporary one)")
    args = ap.parse_args()
    if args.step == "compile":
        _compile(args.model, args.cache, args.unroll, args.dispatch)
        return
    if args.step == "start":
        _first_start(args.model, args.cache)
        return
    env = {**os.environ, "POCL_KERNEL_CACHE": "0", "PYTHONPATH": str(REPO)}
    modes = ("off", "on") if args.dispatch == "both" else (args.dispatch,)
    with tempfile.TemporaryDirectory() as tmp:
        compiled = {}
        for mode in modes:
            compiled[mode] = cache = os.path.join(tmp, f"compiled-{mode}")
            base = [sys.executable, __file__, "--model", args.model, "--cache", cache]
            print(f"{args.model} ({args.unroll}, dispatchers {mode}):", flush=True)
            cmd = [*base, "--step", "compile", "--unroll", args.unroll, "--dispatch", mode]
            subprocess.run(cmd, env=env, check=True)
        for r in range(args.repeat):
            for mode in modes:
                # (a fresh copy each time: a first start stores the device binary at exit)
                cache = os.path.join(tmp, f"start-{mode}-{r}")
                shutil.copytree(compiled[mode], cache)
                print(f"dispatchers {mode}, start {r + 1}: ", end="", flush=True)
                base = [sys.executable, __file__, "--model", args.model, "--cache", cache]
                subprocess.run([*base, "--step", "start"], env=env, check=True)


if __name__ == "__main__":
    main()
