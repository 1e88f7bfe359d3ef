"""Where a CUDA graph's time goes, kernel by kernel: device timestamps of every kernel node.

    python scripts/remote_gpu/graph_trace.py MODEL.tflite... --cache-dir C [--runs 30] [--out F]

For each model: opens it on the GPU (the CUDA graph path), warms it up, then replays
``--runs`` inferences under ``torch.profiler`` (CUPTI traces every kernel of the process's
primary context, which litekiln's runtime shares with torch, graph nodes included). Per
inference it takes the kernels in start order and reports, per launch position, the median
duration on the device and the median gap since the previous kernel ended (negative where
branches overlap); per model, the graph's kernel span (first start to last end), the sum of
kernel durations and the sum of gaps, the copies' device time per run, and without the
profiler the median ``invoke`` + ``get_tensor`` (``invoke_us``; inputs set once) and the graph's
device time on CUDA events (``graph_device_us``, as ``litekiln bench`` reports it). The event
timers of ``bench --profile`` count each launch's own overhead (6-8 us a tiny kernel on
NVIDIA's OpenCL); these are the kernels' own times inside the replayed graph.

Needs torch with CUDA (the H200 image has it); prints one JSON line per model and writes all
of them to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any


def trace_model(path: str, cache_dir: str, runs: int) -> dict[str, Any]:
    import torch

    from litekiln.interpreter import Interpreter
    from litekiln.peers.kernel_trace import chrome_trace, kernel_records
    from litekiln.peers.timing import time_runs

    name = os.path.basename(path).rsplit(".", 1)[0]
    torch.zeros(1, device="cuda")  # the primary context, shared with litekiln's runtime
    interp = Interpreter(model_path=path, cache_dir=cache_dir, cpu_first=False)
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), interp.random_inputs(0), strict=True):
        interp.set_tensor(d["index"], x)
    sess = interp._backend  # noqa: SLF001 - a probe
    executors = [type(ex).__name__ for ex in sess.executors]
    names: list[str] = []
    for ex in sess.executors:
        names += ex.launch_names() if hasattr(ex, "launch_names") else []
    for _ in range(50):
        interp.invoke()
    trace = chrome_trace(interp.invoke, runs)
    if isinstance(trace, str):
        return {"model": name, "error": trace}
    kernels = kernel_records(trace)
    row: dict[str, Any] = {"model": name, "executors": executors, "launches": len(names)}
    # End-to-end without the profiler: invoke (inputs staged, graph, outputs read) and the
    # graph alone on CUDA events, as `litekiln bench` times them.
    out = interp.get_output_details()[0]["index"]

    def one() -> None:
        interp.invoke()
        interp.get_tensor(out)

    timed = time_runs(one, 300, 20)
    row["invoke_us"] = round(timed["median_ms"] * 1e3, 2)
    graph = [ex.graph_time() for ex in sess.executors if hasattr(ex, "graph_time")]
    row["graph_device_us"] = round(sum(graph) * 1e6, 2)
    copies = [float(e["dur"]) for e in trace.get("traceEvents", []) if e.get("cat") == "gpu_memcpy"]
    row["copies_us_per_run"] = round(sum(copies) / max(1, runs), 2)
    n = len(names)
    if not n or len(kernels) < n:
        row["error"] = f"{len(kernels)} kernel records for {n} launches a run"
        return row
    usable = len(kernels) // n
    row["runs_traced"] = usable
    if len(kernels) != usable * n:
        row["extra_records"] = len(kernels) - usable * n
    durs: list[list[float]] = [[] for _ in range(n)]
    gaps: list[list[float]] = [[] for _ in range(n)]
    spans, sums, gap_sums = [], [], []
    for r in range(usable):
        chunk = kernels[r * n : (r + 1) * n]
        end = chunk[0][0]
        gsum = 0.0
        for i, (ts, dur) in enumerate(chunk):
            durs[i].append(dur)
            if i:
                gaps[i].append(ts - end)
                gsum += ts - end
            end = max(end, ts + dur)
        spans.append(max(ts + d for ts, d in chunk) - chunk[0][0])
        sums.append(sum(d for _, d in chunk))
        gap_sums.append(gsum)
    med = statistics.median
    row["span_us"] = round(med(spans), 2)
    row["kernel_sum_us"] = round(med(sums), 2)
    row["gap_sum_us"] = round(med(gap_sums), 2)
    row["per_launch"] = [
        {
            "launch": i,
            "name": names[i],
            "dur_us": round(med(durs[i]), 2),
            "gap_us": round(med(gaps[i]), 2) if gaps[i] else None,
        }
        for i in range(n)
    ]
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--cache-dir", required=True)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    os.environ.setdefault("LITEKILN_CUDA_GRAPH", "on")
    rows = []
    for path in a.models:
        t0 = time.perf_counter()
        try:
            row = trace_model(path, a.cache_dir, a.runs)
        except Exception as exc:  # noqa: BLE001 - report and go on
            row = {"model": path, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        row["seconds"] = round(time.perf_counter() - t0, 2)
        print(json.dumps(row), flush=True)
        rows.append(row)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(rows, f, indent=1)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
