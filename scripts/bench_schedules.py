"""Compare kernel schedules (``default`` = dlight's generic rules, ``fast`` = ours) per model.

For each model and schedule set: compile (no cache), check the GPU outputs against the numpy
reference, then time the kernels with OpenCL profiling events (each kernel once per repeat,
summed over all partitions) and the whole inference (``Interpreter.invoke``).

    .venv/bin/python scripts/bench_schedules.py face_detection_short_range mobilenet_v1 \
        [--schedules default fast fast-cpu] [--repeats 5] [--top 8] [--json out.json] \
        [--min-work-items N]

Runs on the first OpenCL device (``LITEKILN_DEVICE`` picks another): PoCL here, the H100 there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from typing import Any

import numpy as np


def bench(
    name: str, schedules: str, repeats: int, top: int, min_work_items: int | None = None
) -> dict[str, Any]:
    os.environ["LITEKILN_SCHEDULES"] = schedules
    import litekiln
    import litekiln.compiler.schedules as sched

    if not hasattr(sched, "_bench_original"):
        sched._bench_original = sched.fast_schedule  # type: ignore[attr-defined]
    original = sched._bench_original  # type: ignore[attr-defined]
    if min_work_items is None:
        sched.fast_schedule = original
    else:

        def patched(profile: str = "gpu", **kw: Any) -> Any:
            return original(profile, min_work_items=min_work_items, **kw)

        sched.fast_schedule = patched
    from litekiln.zoo import zoo_path

    path = zoo_path(name)
    t0 = time.perf_counter()
    interp = litekiln.Interpreter(path, use_cache=False)
    interp.allocate_tensors()
    t_compile = time.perf_counter() - t0
    ref = litekiln.Interpreter(path, device="reference")
    inputs = interp.random_inputs(seed=0)
    got = interp.run(inputs)
    want = ref.run(inputs)
    max_rel = 0.0
    for g, w in zip(got, want, strict=True):
        g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
        scale = max(float(np.abs(w64).max()), 1e-6)
        max_rel = max(max_rel, float(np.abs(g64 - w64).max()) / scale)

    session = interp._backend  # noqa: SLF001 - benchmark reaches into the session on purpose
    per_kernel: dict[str, list[float]] = defaultdict(list)
    kernel_sum = []
    for _ in range(repeats):
        total = 0.0
        for ex in session.executors:
            times = ex.profile()
            for kname, t in zip(ex.launch_names(), times, strict=True):
                per_kernel[kname].append(t)
                total += t
        kernel_sum.append(total)
    invoke = []
    for _ in range(repeats):
        t = time.perf_counter()
        interp.run(inputs)
        invoke.append(time.perf_counter() - t)
    worst = sorted(((min(v), k) for k, v in per_kernel.items()), reverse=True)[:top]
    return {
        "model": name,
        "schedules": schedules,
        "min_work_items": min_work_items,
        "device": interp.device,
        "compile_s": round(t_compile, 2),
        "max_rel_err_vs_reference": max_rel,
        "launches": sum(ex.num_launches for ex in session.executors),
        "kernel_sum_ms": round(1e3 * min(kernel_sum), 3),
        "invoke_ms": round(1e3 * min(invoke), 3),
        "slowest_kernels_ms": [(k, round(1e3 * t, 4)) for t, k in worst],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("models", nargs="+")
    ap.add_argument("--schedules", nargs="+", default=["default", "fast", "fast-cpu"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--json", default="")
    ap.add_argument(
        "--min-work-items",
        type=int,
        default=None,
        help="fast schedules: work-items a conv keeps before its tile grows (0: largest tiles)",
    )
    args = ap.parse_args(argv)
    results = []
    for m in args.models:
        for s in args.schedules:
            r = bench(m, s, args.repeats, args.top, args.min_work_items)
            results.append(r)
            print(
                f"{m:32s} {s:8s} kernels {r['kernel_sum_ms']:9.3f} ms"
                f"  invoke {r['invoke_ms']:9.3f} ms"
                f"  launches {r['launches']:4d}  compile {r['compile_s']:6.2f} s"
                f"  max rel err {r['max_rel_err_vs_reference']:.2e}",
                flush=True,
            )
            for k, t in r["slowest_kernels_ms"]:
                print(f"      {t:9.4f} ms  {k}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
