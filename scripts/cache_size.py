#!/usr/bin/env python3
"""What a compiled model costs in the cache, against its model file (issue 16).

For each model, compile it (``litekiln compile``, one process per compile, no device binaries)
in fp32 and then fp16 into a cache of its own, and report each compiled entry's bytes --
manifest, parts and the shared constants it needs -- and their share of the model file's size,
and what the fp16 entry adds to the cache. The bounds the issue asks for: fp32 at most 15%,
fp16 adding at most 55%.

``litekiln compile`` ships PTX for NVIDIA GPUs where it finds nvcc (``LITEKILN_PTX=auto``);
``--ptx off`` measures the entries without it. Each row says whether its entries hold PTX, and
the uncompressed characters of the kernels' OpenCL C and PTX in them.

Usage::

    .venv/bin/python scripts/cache_size.py                     # every zoo model, "fast"
    .venv/bin/python scripts/cache_size.py --schedules fast-cpu smoke hand_landmark_lite
    .venv/bin/python scripts/cache_size.py --out results/cache_size/fast.json
    .venv/bin/python scripts/cache_size.py --ptx off smoke    # the entries without PTX

Prints a table; ``--out`` also writes the rows and the command as JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from litekiln.artifact.texts import decompress  # noqa: E402
from litekiln.cache import CacheStore  # noqa: E402
from litekiln.zoo import ZOO, zoo_dir  # noqa: E402

#: The issue's bounds: fp32 entry / model file, and what the fp16 entry adds / model file.
FP32_BOUND = 0.15
FP16_BOUND = 0.55


def entry_sizes(cache: Path) -> dict[str, Any]:
    """Per precision: the compiled entry's bytes (own and shared; of its own, the manifest
    with the kernels and the packed constants), and the cache's total."""
    with CacheStore.open(cache) as store:
        rows = store.ls()
        parts = {r.key: store.info(r.key)["parts"] for r in rows if r.kind == "model"}
        texts = {r.key: _kernel_text(store, r.key) for r in rows if r.kind == "model"}
    out: dict[str, Any] = {"total": sum(r.size for r in rows if r.kind != "program")}
    for r in rows:
        if r.kind == "model":
            size = {p["name"]: p["size"] for p in parts[r.key]}
            out[r.options["precision"]] = {
                "entry": r.size,
                "shared": r.shared_size,
                "manifest": size.get("artifact.json.lzma", 0),
                "opencl_part": size.get("source.json.lzma", 0),
                "ptx_part": size.get("ptx.json.lzma", 0),
                "packed_constants": size.get("constants.bin", 0),
                "model_bytes": r.model_bytes,
                "share": r.model_share,
                **texts[r.key],
            }
    return out


def _kernel_text(store: CacheStore, key: str) -> dict[str, int]:
    """Characters of OpenCL C and of PTX in a compiled model's entry (uncompressed): in its
    parts of their own (source.json.lzma, ptx.json.lzma), or inline in an older manifest."""
    entry = store.get(key, kind="model")
    if entry is None:
        return {}

    def texts(part: str, field: str) -> list[str]:
        if part in entry.part_names:
            return list(json.loads(decompress(entry.part(part))))
        doc = json.loads(decompress(entry.part("artifact.json.lzma")))
        return [p["program"].get(field, "") for p in doc["compiled"]["partitions"]]

    return {
        "opencl_chars": sum(map(len, texts("source.json.lzma", "source"))),
        "ptx_chars": sum(map(len, texts("ptx.json.lzma", "ptx"))),
    }


def measure(model: Path, schedules: str, work: Path, ptx: str = "auto") -> dict[str, Any]:
    """Compile ``model`` in fp32, then fp16, into a cache of its own; its entries' sizes."""
    cache = work / model.stem
    cache.mkdir(mode=0o700)
    row: dict[str, Any] = {"model": model.stem, "model_bytes": model.stat().st_size}
    totals = []
    for precision in ("fp32", "fp16"):
        t0 = time.perf_counter()
        cmd = [
            sys.executable, "-m", "litekiln.cli", "compile", str(model), "--cache-dir", str(cache),
            "--precision", precision, "--schedules", schedules,
        ]  # fmt: skip
        env = {**os.environ, "LITEKILN_PTX": ptx}
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
        if proc.returncode or precision not in entry_sizes(cache):
            row[precision] = {"error": (proc.stderr or proc.stdout).strip().splitlines()[-3:]}
            continue
        sizes = entry_sizes(cache)
        row[precision] = {**sizes[precision], "compile_s": round(time.perf_counter() - t0, 1)}
        totals.append(sizes["total"])
    row["ptx"] = any(row.get(p, {}).get("ptx_chars", 0) for p in ("fp32", "fp16"))
    if len(totals) == 2:
        row["fp16_adds"] = totals[1] - totals[0]
        row["fp16_adds_share"] = row["fp16_adds"] / row["model_bytes"]
    return row


def _pct(x: float | None) -> str:
    return "   -  " if x is None else f"{100 * x:5.1f}%"


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'model':34s} {'model':>10s} {'fp32 entry':>11s} {'share':>6s} "
        f"{'fp16 adds':>10s} {'share':>6s} {'PTX':>4s}"
    ]
    for r in rows:
        fp32 = r.get("fp32", {})
        entry = fp32.get("entry", 0) + fp32.get("shared", 0)
        adds, adds_share = r.get("fp16_adds", 0), r.get("fp16_adds_share")
        lines.append(
            f"{r['model']:34s} {r['model_bytes']:10d} {entry:11d} {_pct(fp32.get('share'))} "
            f"{adds:10d} {_pct(adds_share)} {'yes' if r.get('ptx') else 'no':>4s}"
        )
    return "\n".join(lines)


def within_bounds(row: dict[str, Any]) -> bool:
    """Whether a row keeps the issue's bounds (fp32 share, and what fp16 adds)."""
    share = row.get("fp32", {}).get("share")
    adds = row.get("fp16_adds_share")
    return share is not None and adds is not None and share <= FP32_BOUND and adds <= FP16_BOUND


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="*", help="zoo names or .tflite paths (default: the zoo)")
    p.add_argument("--schedules", default="fast", choices=["fast", "fast-cpu", "default"])
    p.add_argument("--out", type=Path, help="also write the rows as JSON here")
    p.add_argument(
        "--ptx", default="auto", choices=["auto", "on", "off"],
        help="LITEKILN_PTX for the compiles (auto: PTX where nvcc is found)",
    )  # fmt: skip
    a = p.parse_args(argv)
    names = a.models or list(ZOO)
    paths = [Path(n) if n.endswith(".tflite") else zoo_dir() / f"{n}.tflite" for n in names]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in paths:
            if not path.exists():
                print(f"{path}: not made (scripts/make_zoo.py), skipped", file=sys.stderr)
                continue
            rows.append(measure(path, a.schedules, Path(tmp), a.ptx))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(table(rows))
    bad = [r["model"] for r in rows if not within_bounds(r)]
    print(f"outside the bounds (fp32 <= {FP32_BOUND:.0%}, fp16 adds <= {FP16_BOUND:.0%}): {bad}")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "command": " ".join(["scripts/cache_size.py", *(argv or sys.argv[1:])]),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "schedules": a.schedules,
            "ptx": a.ptx,
            "rows": rows,
        }
        a.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
