"""Tables and a summary JSON from the remote-GPU kit's raw results (scripts/remote_gpu/run.sh).

    python scripts/remote_gpu/summarize.py DIR... [--json docs/benchmarks/h100.json] [--command T]

Each DIR holds one call's files (latency.json, latency_fp16.json, startup.json,
accuracy.json, accuracy_fp16.json; any may be missing). Every model's figures come from the
one run that measured it. Prints Markdown tables (latency fp32 and fp16, start-up,
accuracy) and writes the issue's JSON schema: {"device", "command", "models": [{"model",
"litekiln_ms", "litert_cpu_ms", "litert_gpu_ms", "speedup_vs_litert_cpu",
"speedup_vs_litert_gpu"}]} plus the geometric means.
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
from pathlib import Path
from typing import Any


def _header(*names: str) -> None:
    _row(*names)
    _row(*["---"] * len(names))


def _row(*cells: str) -> None:
    print("| " + " | ".join(cells) + " |")


def _verdict(r: dict) -> str:
    return "ok" if r.get("ok") else "FAIL" if r else ""


def _load(d: Path, name: str) -> Any:
    """``d/name``, or ``d/name.xz`` (the large raw files of older calls are kept in xz, so
    that the carried tree fits the device call's 64 MiB)."""
    p = d / name
    if p.exists():
        return json.loads(p.read_text())
    xz = d / f"{name}.xz"
    return json.loads(lzma.decompress(xz.read_bytes())) if xz.exists() else None


def _geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _f(x: Any, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--json", type=Path, help="write the issue's JSON here")
    ap.add_argument(
        "--command", default="bash scripts/remote_gpu/run.sh", help="recorded as 'command'"
    )
    a = ap.parse_args()

    lat: dict[str, dict[str, Any]] = {}
    lat16: dict[str, dict[str, Any]] = {}
    start: dict[str, dict[str, Any]] = {}
    acc: dict[str, dict[str, Any]] = {}
    acc16: dict[str, dict[str, Any]] = {}
    device = ""
    for d in a.dirs:
        for name, into in (
            ("latency.json", lat),
            ("latency_fp16.json", lat16),
            ("startup.json", start),
        ):
            data = _load(d, name)
            if data:
                device = device or data.get("device", "")
                for m in data["models"]:
                    into[m["model"]] = m
        for name, into in (("accuracy.json", acc), ("accuracy_fp16.json", acc16)):
            for r in _load(d, name) or []:
                into[r["model"]] = r

    print("### Latency, fp32 (ms, median)\n")
    print(
        "| model | litekiln | LiteRT CPU | LiteRT GPU | x CPU | x GPU | launches | launch path | "
        "host us/launch | kernel time | graph device time | rel err |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    paths = {"PartitionExecutor": "OpenCL", "CudaGraphExecutor": "CUDA graph"}
    for m in lat.values():
        lo, pr = m.get("launch_overhead") or {}, m.get("profile") or {}
        path = " + ".join(paths.get(p, p) for p in lo.get("launch_path", ["PartitionExecutor"]))
        print(
            f"| {m['model']} | {_f(m['litekiln_ms'])} | {_f(m['litert_cpu_ms'])} | "
            f"{_f(m.get('litert_gpu_ms'))} | {_f(m['speedup_vs_litert_cpu'], '.2f')} | "
            f"{_f(m.get('speedup_vs_litert_gpu'), '.2f')} | {lo.get('launches', '')} | {path} | "
            f"{_f(lo.get('enqueue_us_per_launch'), '.2f')} | {_f(pr.get('kernel_sum_ms'))} | "
            f"{_f(m.get('graph_device_ms'))} | {_f(m.get('max_rel_err_vs_litert_cpu'), '.1e')} |"
        )
    g_cpu = _geomean([m["speedup_vs_litert_cpu"] for m in lat.values()])
    g_gpu = _geomean([m.get("speedup_vs_litert_gpu") or 0 for m in lat.values()])
    wins = sum(1 for m in lat.values() if (m.get("speedup_vs_litert_gpu") or 0) >= 1)
    print(
        f"\nGeometric mean over {len(lat)} models: {_f(g_cpu, '.2f')}x LiteRT CPU, "
        f"{_f(g_gpu, '.2f')}x LiteRT GPU; at least as fast as LiteRT GPU on {wins} of {len(lat)}."
    )

    if any(m.get("host_breakdown") for m in lat.values()):
        print(
            "\n### Where one inference's time goes, fp32 "
            "(ms, medians; litekiln bench's host_breakdown)\n"
        )
        _header(
            "model", "litekiln", "inputs staged", "launch", "wait + outputs", "CPU ops",
            "rest of run()", "graph device time",
        )  # fmt: skip
        for m in lat.values():
            b = m.get("host_breakdown") or {}
            _row(
                m["model"], _f(m["litekiln_ms"]), _f(b.get("inputs_ms")), _f(b.get("launch_ms")),
                _f(b.get("wait_outputs_ms")), _f(b.get("cpu_ops_ms")), _f(b.get("other_ms")),
                _f(m.get("graph_device_ms")),
            )  # fmt: skip

    if lat16:
        print("\n### Latency, fp16 against fp32 (ms, median)\n")
        print("| model | litekiln fp16 | litekiln fp32 | fp16/fp32 | LiteRT CPU | x CPU |")
        print("| --- | --- | --- | --- | --- | --- |")
        for m in lat16.values():
            f32 = lat.get(m["model"], {}).get("litekiln_ms")
            ratio = m["litekiln_ms"] / f32 if f32 else None
            print(
                f"| {m['model']} | {_f(m['litekiln_ms'])} | {_f(f32)} | {_f(ratio, '.2f')} | "
                f"{_f(m['litert_cpu_ms'])} | {_f(m['speedup_vs_litert_cpu'], '.2f')} |"
            )

    if start:
        print("\n### Start-up (ms, median of fresh processes, runtime only)\n")
        _header(
            "model", "cold (device)", "cold + compile", "shipped", "warm", "warm/cold",
            "warm/(cold+compile)", "parse / open / load / run1",
        )  # fmt: skip
        for m in start.values():
            b = m.get("warm_breakdown") or {}
            phases = " / ".join(
                _f(b.get(k), spec)
                for k, spec in (
                    ("construct_ms", ".0f"), ("open_ms", ".0f"), ("load_ms", ".0f"),
                    ("first_run_ms", ".1f"),
                )
            )  # fmt: skip
            _row(
                m["model"], _f(m["cold_ms"], ".0f"), _f(m.get("cold_estimate_ms"), ".0f"),
                _f(m["shipped_ms"], ".0f"), _f(m["warm_ms"], ".0f"),
                f"{_f(m.get('warm_vs_cold_pct'), '.2f')}%",
                f"{_f(m.get('warm_vs_cold_estimate_pct'), '.2f')}%", phases,
            )  # fmt: skip

    if acc or acc16:
        print("\n### Accuracy against LiteRT CPU fp32 (max|ours - LiteRT| / max(1, max|LiteRT|))\n")
        print("| model | fp32 | tol | fp16 | tol |")
        print("| --- | --- | --- | --- | --- |")
        for name in list(dict.fromkeys([*acc, *acc16])):
            r, r16 = acc.get(name, {}), acc16.get(name, {})
            _row(
                name, f"{_f(r.get('rel_err'), '.2e')} {_verdict(r)}", _f(r.get("tolerance"), ".0e"),
                f"{_f(r16.get('rel_err'), '.2e')} {_verdict(r16)}", _f(r16.get("tolerance"), ".0e"),
            )  # fmt: skip

    if a.json:
        models = [
            {
                k: m.get(k)
                for k in (
                    "model",
                    "litekiln_ms",
                    "litert_cpu_ms",
                    "litert_gpu_ms",
                    "speedup_vs_litert_cpu",
                    "speedup_vs_litert_gpu",
                    "max_rel_err_vs_litert_cpu",
                )
            }
            for m in lat.values()
        ]
        out = {
            "device": device,
            "command": a.command,
            "note": "Each model's figures come from one run: litekiln (fp32), LiteRT CPU "
            "(XNNPACK, all 16 cores) and LiteRT GPU (WebGPU over Vulkan, fp16) in the "
            "same process on the same inputs; median of the run count in the raw files.",
            "geomean_speedup_vs_litert_cpu": round(g_cpu, 3) if g_cpu else None,
            "geomean_speedup_vs_litert_gpu": round(g_gpu, 3) if g_gpu else None,
            "models": models,
        }
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
