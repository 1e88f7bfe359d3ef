#!/usr/bin/env python3
"""The demo's measurements (scripts/demo.sh runs it): one model through litekiln, every figure
measured in this run and printed as one labelled table.

    scripts/demo.py MODEL [--cache-dir DIR] [--runs N] [--repeat N] [--json OUT]

1. what runs where: ops in the file, ops folded at load, ops on the GPU (in partitions) and
   on the CPU (with the reasons), as `litekiln inspect MODEL --ops` shows them;
2. the cold start: a fresh process whose first ``Interpreter(...)`` finds DIR empty and the
   OpenCL driver's own kernel cache off: the compile (seconds, kernels, partitions: what
   `litekiln compile` does ahead of time), the device program built from source, the first
   inference (`litekiln bench --startup`'s clock);
3. accuracy against LiteRT's CPU path on seeded random inputs: max relative error and the
   tolerance (this run loads the model from DIR, as an app would);
4. the warm start: fresh processes that find the model and the device binary in DIR, the
   driver's cache warm (step 3 filled it); the median, and cold / warm;
5. steady latency against LiteRT's CPU (and GPU, where it loads) path: medians of N runs
   and the ratios (`litekiln bench`).

DIR (default ``build/demo-cache``) is emptied first: the demo owns it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
H100_RESULTS = REPO / "docs" / "benchmarks" / "h100.json"


def row(label: str, value: str, note: str = "") -> None:
    print(f"  {label:34s} {value:>10s}   {note}".rstrip(), flush=True)


def section(title: str, command: str = "") -> None:
    print(f"\n{title}" + (f"   ({command})" if command else ""), flush=True)


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


@contextlib.contextmanager
def quietly() -> Iterator[None]:
    """Hold back what a step logs (LiteRT's C++ logging; litekiln's placement summary and
    driver notes, which the table says too); shown if the step fails."""
    from litekiln.bench import peer_logs

    said: list[str] = []
    try:
        with peer_logs() as said:
            yield
    except BaseException:
        print("\n".join(said), file=sys.stderr)
        raise


def where_it_runs(path: str) -> dict[str, Any]:
    from litekiln.model import load_model
    from litekiln.placement import placement

    info, _ = placement(load_model(path))
    ops = info["ops"]
    folded = Counter(o["op"] for o in ops if o["where"] == "folded")
    cpu = [o for o in ops if o["where"] == "cpu"]
    section("1. What runs where", "litekiln inspect MODEL --ops")
    row("ops in the file", f"{len(ops)}")
    row(
        "folded at load",
        f"{sum(folded.values())}",
        ", ".join(f"{k} x{v}" for k, v in folded.items())
        + (": constant inputs computed once, no op at run time" if folded else ""),
    )
    row(
        "on the GPU (OpenCL)",
        f"{info['gpu_ops']}",
        f"in {plural(len(info['partitions']), 'partition')}",
    )
    reasons = Counter(f"{o['op']}: {o['reason']}" for o in cpu)
    row("on the CPU (numpy reference)", f"{len(cpu)}", "; ".join(list(reasons)[:3]))
    return {
        "ops": len(ops),
        "folded": dict(folded),
        "partitions": len(info["partitions"]),
        **{k: info[k] for k in ("gpu_ops", "cpu_ops")},
    }


def cold_start(path: str, cache_dir: str, partitions: int) -> dict[str, Any]:
    from litekiln.bench import startup_process

    section(
        "2. Cold start: the first Interpreter(...), empty cache, in a fresh process",
        "litekiln bench --startup MODEL",
    )
    with quietly():
        r = startup_process(path, cache_dir, driver_cache=False)
    total = r["total_s"]
    compile_s = r.get("compile_s_recorded") or 0.0
    row(
        "compile: TVM to OpenCL C",
        f"{compile_s:.1f} s",
        f"{r['kernels']} kernels in {plural(partitions, 'partition')} (what `litekiln compile` "
        "does ahead of time)",
    )
    if r.get("cpu_first"):  # the CPU ran the first inference while the device built
        row("first inference", f"{r['first_run_s']:.2f} s", "on the CPU (numpy), fp32")
    else:
        row("device program, built from source", f"{r['load_s']:.1f} s", "driver cache off")
        row(
            "first inference", f"{r['first_run_s']:.1f} s",
            "incl. the driver's set-up of each kernel",
        )  # fmt: skip
    rest = total - compile_s - r["load_s"] - r["first_run_s"]
    row(
        "total",
        f"{total:.1f} s",
        f"incl. {rest:.1f} s to parse the model, start TVM and open the device",
    )
    if r.get("device_ready_s") is not None:
        row(
            "the device took over", f"at {r['device_ready_s']:.1f} s",
            "its program built from source (driver cache off) and its first inference run, "
            "in the background",
        )  # fmt: skip
    return r


def accuracy(path: str, cache_dir: str) -> dict[str, Any]:
    from litekiln.check import check_model

    with quietly():
        r = check_model(path, cache_dir=cache_dir)
    section("3. Accuracy against LiteRT (CPU), same seeded random inputs")
    if r.error:
        row("error", "", r.error)
    else:
        row(
            "max relative error", f"{r.rel_err:.1e}", "max|litekiln - LiteRT| / max(1, max|LiteRT|)"
        )
        row("tolerance", f"{r.tolerance:.0e}", "ok" if r.ok else "FAILED")
    return r.as_dict()


def warm_start(path: str, cache_dir: str, repeat: int, cold: dict[str, Any]) -> dict[str, Any]:
    from litekiln.bench import startup_process

    section(
        f"4. Warm start: the same from the cache, in fresh processes (median of {repeat})",
        "litekiln bench --startup MODEL",
    )
    with quietly():
        runs = [startup_process(path, cache_dir, driver_cache=True) for _ in range(repeat)]
    assert not any(r["tvm_imported"] for r in runs), "a warm start imported TVM"
    med = {k: statistics.median(r[k] for r in runs) for k in ("total_s", "load_s", "first_run_s")}
    row(
        "total",
        f"{med['total_s'] * 1e3:.0f} ms",
        f"device program from its cached binary {med['load_s'] * 1e3:.0f} ms, first inference "
        f"{med['first_run_s'] * 1e3:.0f} ms",
    )
    ratio = cold["total_s"] / med["total_s"]
    row("cold / warm", f"{ratio:.1f}x", f"the warm start takes {100 / ratio:.1f}% of the cold")
    return {"median_s": med, "samples": runs, "cold_over_warm": ratio}


def latency(path: str, cache_dir: str, runs: int) -> dict[str, Any]:
    from litekiln.bench import latency_model

    with quietly():
        rec = latency_model(
            path,
            {"cache_dir": cache_dir},
            runs=runs,
            profile=False,
            litert_gpu=True,
            breakdown=False,
        )
    section(
        f"5. Steady latency: inputs in, inference, outputs back; median of {runs} runs",
        "litekiln bench MODEL",
    )
    row("litekiln (OpenCL)", f"{rec['litekiln_ms']:.2f} ms")
    threads = os.cpu_count()
    for peer, key in (("CPU", "cpu"), ("GPU", "gpu")):
        ms, x = rec[f"litert_{key}_ms"], rec[f"speedup_vs_litert_{key}"]
        label = f"LiteRT {peer}" + (f" (XNNPACK, {threads} threads)" if key == "cpu" else "")
        if ms is None:
            why = (rec.get(f"litert_{key}_error") or "").split(": ", 1)[-1]
            row(label, "n/a", f"not available here: {why}"[:90])
        else:
            faster = "litekiln faster" if x > 1 else "LiteRT faster here"
            row(label, f"{ms:.2f} ms", f"litekiln speed-up {x:.2f}x ({faster})")
    return rec


def _elsewhere(model: str, device: str) -> None:
    """The committed GPU figures for this model, labelled as such (not measured here)."""
    if "NVIDIA" in device or not H100_RESULTS.is_file():
        return
    data = json.loads(H100_RESULTS.read_text())
    rec = next((m for m in data.get("models", []) if m.get("model") == model), None)
    if rec is None:
        return
    print(
        f"\n{device.split(' (')[0]} is an OpenCL driver for the CPU: it proves the compiled "
        "kernels right, not fast.\nFor speed, the committed run on a GPU (not this run; "
        f"{H100_RESULTS.relative_to(REPO)}, {data.get('device', 'NVIDIA H100')}):\n"
        f"  litekiln {rec['litekiln_ms']:.2f} ms, LiteRT CPU {rec['litert_cpu_ms']:.2f} ms "
        f"({rec['speedup_vs_litert_cpu']:.2f}x), LiteRT GPU {rec['litert_gpu_ms']:.2f} ms "
        f"({rec['speedup_vs_litert_gpu']:.2f}x)"
    )


def empty_cache_dir(path: Path) -> None:
    """Empty the demo's cache directory, refusing one the demo may not own."""
    from litekiln.cache.location import default_cache_dir

    if path.exists():
        ours = path.resolve().is_relative_to(REPO / "build")
        if path.resolve() == default_cache_dir().resolve() or (not ours and any(path.iterdir())):
            sys.exit(f"demo: {path} is not empty and not under build/: give an empty --cache-dir")
        shutil.rmtree(path)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("model")
    p.add_argument("--cache-dir", default=str(REPO / "build" / "demo-cache"))
    p.add_argument("--runs", type=int, default=100, help="timed runs for latency (default 100)")
    p.add_argument(
        "--repeat", type=int, default=3, help="fresh processes for the warm start (default 3)"
    )
    p.add_argument("--json", metavar="OUT", help="also write every figure to this JSON file")
    a = p.parse_args()
    from litekiln.runtime.device import select_device
    from litekiln.zoo import get_model

    empty_cache_dir(Path(a.cache_dir))
    name = Path(a.model).stem
    try:
        what = get_model(name).description + ", "
    except Exception:  # noqa: BLE001 - not a zoo model: no description
        what = ""
    with quietly():
        device = select_device(os.environ.get("LITEKILN_DEVICE")).description
    print(f"litekiln demo: {name} ({what}{Path(a.model).stat().st_size / 1024:.0f} KiB)")
    print(f"device: {device}")
    t0 = time.perf_counter()
    results: dict[str, Any] = {"model": name, "device": device}
    results["placement"] = where_it_runs(a.model)
    results["cold"] = cold_start(a.model, a.cache_dir, results["placement"]["partitions"])
    results["accuracy"] = accuracy(a.model, a.cache_dir)
    results["warm"] = warm_start(a.model, a.cache_dir, a.repeat, results["cold"])
    results["latency"] = latency(a.model, a.cache_dir, a.runs)
    _elsewhere(name, device)
    print(f"\n(all measured in this run: {time.perf_counter() - t0:.0f} s)")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0 if results["accuracy"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
