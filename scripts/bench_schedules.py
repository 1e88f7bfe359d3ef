"""Compare kernel schedules (``default`` = dlight's generic rules, ``fast`` = ours) per model.

For each model and schedule set: compile (no cache), check the GPU outputs against the numpy
reference, then time the kernels with OpenCL profiling events (each kernel once per repeat,
summed over all partitions) and the whole inference (``Interpreter.invoke``).

    .venv/bin/python scripts/bench_schedules.py face_detection_short_range mobilenet_v1 \
        [--schedules default fast fast-cpu] [--repeats 5] [--top 8] [--json out.json] \
        [--min-work-items N]

The PoCL report of docs/benchmarks.md ("PoCL (CPU OpenCL)"), from ``litekiln bench --profile``
runs kept under ``results/pocl/<variant>/<model>.<round>.json``:

    .venv/bin/python scripts/bench_schedules.py --unet /tmp/unet_softmax.tflite
    .venv/bin/python scripts/bench_schedules.py --kernel-info results/pocl/after/kernels.json \
        models/zoo/*.tflite /tmp/unet_softmax.tflite
    .venv/bin/python scripts/bench_schedules.py --pocl-table results/pocl

``--unet PATH`` writes the small U-Net with a softmax over the channels of its 128x128 output
(the zoo has none), ``--kernel-info OUT MODEL...`` records, per model, the PrimFunc behind
each kernel of its ``fast-cpu`` program, the rule that scheduled it and its FLOPs (TVM's
estimate); run it with ``PYTHONPATH`` at the checkout whose compiler a variant used.
``--pocl-table DIR`` prints the Markdown table (medians over the rounds) and writes
``DIR/summary.json``.

Runs on the first OpenCL device (``LITEKILN_DEVICE`` picks another): PoCL here, the H100 there.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
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
    # (cpu_first off: the device's outputs and times, not the CPU's while it builds)
    interp = litekiln.Interpreter(path, use_cache=False, cpu_first=False)
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


def unet_softmax(size: int = 128, classes: int = 8, seed: int = 0) -> bytes:
    """A small U-Net (3 strided 3x3 encoders, 3 bilinear-upsampling decoders with skip
    concatenations) ending in a 1x1 conv to ``classes`` and a softmax over the channels of the
    ``size`` x ``size`` map: a segmentation head like the one of the issue-18 user trial.

    Returns:
        The ``.tflite`` bytes (float32, random weights of a fixed seed).
    """
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from tflite_builder import ModelBuilder

    rng = np.random.default_rng(seed)
    b = ModelBuilder("litekiln U-Net with a channel softmax (scripts/bench_schedules.py)")

    def conv(x: Any, cin: int, cout: int, hw: int, k: int = 3, stride: int = 1) -> Any:
        w = (rng.standard_normal((cout, k, k, cin)) / np.sqrt(k * k * cin)).astype(np.float32)
        bias = (0.1 * rng.standard_normal(cout)).astype(np.float32)
        return b.op(
            "CONV_2D",
            [x, b.const("w", w), b.const("b", bias)],
            out_shape=[1, hw, hw, cout],
            options={
                "padding": "SAME",
                "stride_w": stride,
                "stride_h": stride,
                "fused_activation_function": "RELU" if k > 1 else "NONE",
            },
        )

    def up(x: Any, skip: Any, cin: int, cskip: int, cout: int, hw: int) -> Any:
        size = b.const("size", np.array([hw, hw], np.int32), "int32")
        r = b.op("RESIZE_BILINEAR", [x, size], out_shape=[1, hw, hw, cin])
        c = b.op(
            "CONCATENATION", [r, skip], out_shape=[1, hw, hw, cin + cskip], options={"axis": 3}
        )
        return conv(c, cin + cskip, cout, hw)

    x = b.input("image", [1, size, size, 3])
    e1 = conv(x, 3, 16, size)
    e2 = conv(e1, 16, 32, size // 2, stride=2)
    e3 = conv(e2, 32, 64, size // 4, stride=2)
    mid = conv(e3, 64, 64, size // 8, stride=2)
    d3 = up(mid, e3, 64, 64, 32, size // 4)
    d2 = up(d3, e2, 32, 32, 16, size // 2)
    d1 = up(d2, e1, 16, 16, 16, size)
    logits = conv(d1, 16, classes, size, k=1)
    probs = b.op("SOFTMAX", [logits], options={"beta": 1.0})
    b.output(probs)
    return b.build()


def kernel_info(models: list[str]) -> dict[str, Any]:
    """Per model (file stem): ``kernels`` (kernel -> PrimFunc of each of its launches) and
    ``funcs`` (PrimFunc -> the ``fast-cpu`` rule that scheduled it and its FLOPs)."""
    import tvm
    from tvm.s_tir.analysis import estimate_tir_flops
    from tvm.target import Target

    import litekiln.compiler.schedules as sched
    from litekiln.artifact.compiled import CompileOptions
    from litekiln.compiler.driver import compile_model
    from litekiln.model import load_model

    funcs: dict[str, dict[str, Any]] = {}
    original = sched.fast_schedule

    def recording(profile: str = "gpu", **overrides: Any) -> Any:
        inner = original(profile, **overrides)

        @tvm.transform.module_pass(opt_level=0)
        def record(mod: Any, _ctx: Any) -> Any:
            target = Target.current(allow_none=True) or Target("opencl", host="llvm")
            rules = sched.describe_rules(mod, target, profile, **overrides)
            for gv, func in mod.functions_items():
                if isinstance(func, tvm.tirx.PrimFunc):
                    try:
                        flops: float | None = float(
                            estimate_tir_flops(tvm.IRModule({"main": func}))
                        )
                    except Exception:  # noqa: BLE001 - TVM cannot count it: unknown
                        flops = None
                    funcs[gv.name_hint] = {"rule": rules[gv.name_hint], "flops": flops}
            return inner(mod)

        return record

    out: dict[str, Any] = {}
    sched.fast_schedule = recording  # type: ignore[assignment]
    try:
        for path in models:
            funcs.clear()
            options = CompileOptions(schedules="fast-cpu", tuning=False)
            compiled = compile_model(load_model(path), options, warn=False)
            kernels: dict[str, list[str]] = defaultdict(list)
            for part in compiled.partitions:
                for launch in part.program.launches:
                    kernels[launch.kernel].append(launch.func)
            name = os.path.basename(path).rsplit(".", 1)[0]
            out[name] = {"kernels": dict(kernels), "funcs": dict(funcs)}
            print(f"{name}: {len(kernels)} kernels", flush=True)
    finally:
        sched.fast_schedule = original
    return out


def _run_summary(run: dict[str, Any], kernels: dict[str, Any] | None) -> dict[str, Any]:
    """One ``litekiln bench --profile`` record: latencies, the largest kernel, its shares."""
    prof = run["profile"]
    total = prof["kernel_sum_ms"]
    top = prof["top"][0]
    rec: dict[str, Any] = {
        "litekiln_ms": run["litekiln_ms"],
        "litert_cpu_ms": run.get("litert_cpu_ms"),
        "kernel_sum_ms": total,
        "top_kernel": top["kernel"],
        "top_share": top["ms"] / total,
        "top_flop_share": None,
        "top_rule": None,
    }
    if rec["litert_cpu_ms"]:
        rec["ratio"] = run["litekiln_ms"] / rec["litert_cpu_ms"]
    if kernels is not None:
        funcs = kernels["funcs"]

        def flops(func: str) -> float:
            return float(funcs.get(func, {}).get("flops") or 0.0)

        # A PrimFunc call may launch several kernels (a padding copy, then the convolution):
        # count each call once in the whole, and credit a kernel with its calls' FLOPs.
        calls: dict[str, int] = defaultdict(int)
        for launched in kernels["kernels"].values():
            for func in set(launched):
                calls[func] = max(calls[func], launched.count(func))
        whole = sum(flops(f) * n for f, n in calls.items())
        if whole:
            rec["top_flop_share"] = sum(flops(f) for f in kernels["kernels"][top["kernel"]]) / whole
        rules = {funcs.get(f, {}).get("rule") for f in kernels["kernels"][top["kernel"]]}
        rec["top_rule"] = "/".join(sorted(str(r) for r in rules))
    return rec


def pocl_table(root: str) -> dict[str, Any]:
    """Medians over the rounds of ``root/<variant>/<model>.<round>.json`` per variant/model."""
    summary: dict[str, Any] = {}
    for variant in ("before", "after"):
        kpath = os.path.join(root, variant, "kernels.json")
        kinfo = _load_json(kpath) if os.path.exists(kpath) else {}
        runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for path in sorted(glob.glob(os.path.join(root, variant, "*.*.json"))):
            name = os.path.basename(path).split(".")[0]
            for run in _load_json(path)["models"]:
                runs[name].append(_run_summary(run, kinfo.get(name)))
        for name, recs in runs.items():
            tops = [r["top_kernel"] for r in recs]
            top = max(set(tops), key=tops.count)
            at_top = [r for r in recs if r["top_kernel"] == top]
            summary.setdefault(name, {})[variant] = {
                "rounds": len(recs),
                "litekiln_ms": statistics.median(r["litekiln_ms"] for r in recs),
                "litert_cpu_ms": statistics.median(r["litert_cpu_ms"] for r in recs),
                "ratio": statistics.median(r["ratio"] for r in recs),
                "kernel_sum_ms": statistics.median(r["kernel_sum_ms"] for r in recs),
                "top_kernel": top,
                "top_share": statistics.median(r["top_share"] for r in recs),
                "top_share_max": max(r["top_share"] for r in recs),
                "top_flop_share": at_top[0]["top_flop_share"],
                "top_rule": at_top[0]["top_rule"],
            }
    return summary


def _print_pocl_table(summary: dict[str, Any]) -> None:
    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.0f}%"

    print(
        "| model | litekiln ms before | after | LiteRT CPU ms | x LiteRT before | after "
        "| largest kernel before | after | its FLOPs | largest kernel after |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    if not any("before" in v for v in summary.values()):  # one tree measured: its figures only
        _print_after_table(summary)
        return
    for name in sorted(summary):
        b, a = summary[name].get("before"), summary[name].get("after")
        if b is None or a is None:
            continue
        cpu = statistics.median([b["litert_cpu_ms"], a["litert_cpu_ms"]])
        print(
            f"| {name} | {b['litekiln_ms']:.1f} | {a['litekiln_ms']:.1f} | {cpu:.1f} "
            f"| {b['ratio']:.1f} | {a['ratio']:.1f} | {pct(b['top_share'])} "
            f"| {pct(a['top_share'])} | {pct(a['top_flop_share'])} "
            f"| `{a['top_kernel']}` ({a['top_rule']}) |"
        )


def _print_after_table(summary: dict[str, Any]) -> None:
    """The table of one measured tree (``after`` only): latency, LiteRT CPU, the ratio, the
    largest kernel's share of the device time and of the FLOPs."""
    print(
        "\n| model | litekiln ms | LiteRT CPU ms | litekiln / LiteRT | largest kernel's time "
        "| its FLOPs | largest kernel (rule) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in sorted(summary):
        a = summary[name].get("after")
        if a is None:
            continue
        flops = "-" if a["top_flop_share"] is None else f"{100 * a['top_flop_share']:.0f}%"
        print(
            f"| {name} | {a['litekiln_ms']:.1f} | {a['litert_cpu_ms']:.1f} | {a['ratio']:.2f} "
            f"| {100 * a['top_share']:.0f}% | {flops} | `{a['top_kernel']}` ({a['top_rule']}) |"
        )


def _load_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("models", nargs="*")
    ap.add_argument("--unet", default="", help="write the U-Net of `unet_softmax` here, exit")
    ap.add_argument("--kernel-info", default="", help="write the models' kernel info here, exit")
    ap.add_argument("--pocl-table", default="", help="summarise the PoCL runs under DIR, exit")
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
    if args.unet:
        with open(args.unet, "wb") as f:
            f.write(unet_softmax())
        return 0
    if args.kernel_info:
        with open(args.kernel_info, "w") as f:
            json.dump(kernel_info(args.models), f, indent=1)
        return 0
    if args.pocl_table:
        summary = pocl_table(args.pocl_table)
        with open(os.path.join(args.pocl_table, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        _print_pocl_table(summary)
        return 0
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
