"""What the commands share: model options, JSON output, sizes and ages in words."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    _Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]


JSON_HELP = "machine-readable output"


EPILOG = """\
examples:
  litekiln compile face_detection.tflite --cache-dir build/litekiln-cache
  litekiln run face_detection.tflite --save out.npz
  litekiln run model.tflite --device reference          # numpy reference, no OpenCL
  litekiln inspect model.tflite --json
  litekiln cache ls
  litekiln bench --startup models/zoo/*.tflite

environment: LITEKILN_DEVICE, LITEKILN_CACHE_DIR, LITEKILN_PRECISION ... (`litekiln config`)
"""


def add_model_options(p: argparse.ArgumentParser) -> None:
    add_cache_dir_option(p)
    p.add_argument("--precision", choices=["fp32", "fp16"], help="kernel precision (default fp32)")
    p.add_argument(
        "--device", help="OpenCL device: gpu, cpu, opencl, P:D, a name substring, or 'reference'"
    )
    p.add_argument("--token", help="model token (default: farmhash Fingerprint64 of the file)")
    p.add_argument(
        "--op-table",
        choices=["documented", "extended"],
        help="GPU op table: the documented TFLite GPU table (default) or extended",
    )
    p.add_argument("--max-partitions", type=int, help="most GPU partitions to delegate")
    p.add_argument(
        "--no-quantized", action="store_true", help="run quantized op versions on the CPU"
    )
    p.add_argument("--no-cache", action="store_true", help="do not read or write the cache")
    p.add_argument(
        "--fp16-budget",
        type=_budget,
        metavar="ERR|off",
        help="with --precision fp16: the largest simulated error (relative to max(1, "
        "max|output|)) the compiler accepts before it keeps the most sensitive tensors in "
        "float32 (default 2.5e-3; 'off': every tensor in half, unchecked; see docs/precision.md). "
        "Part of the cache key: give the app the same value",
    )


def _budget(text: str) -> float | str:
    if text.lower() in ("off", "none"):
        return "off"
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number in (0, 1) or 'off', got {text!r}"
        ) from None
    if not 0.0 < v < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1) or 'off', got {text!r}")
    return v


def interpreter_kwargs(a: argparse.Namespace) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    for name in ("cache_dir", "precision", "device"):
        if getattr(a, name, None):
            kw[name] = getattr(a, name)
    if getattr(a, "token", None):
        kw["model_token"] = a.token
    if getattr(a, "op_table", None):
        kw["op_table"] = a.op_table
    if getattr(a, "max_partitions", None) is not None:
        kw["max_partitions"] = a.max_partitions
    if getattr(a, "no_quantized", False):
        kw["allow_quantized"] = False
    if getattr(a, "no_cache", False):
        kw["use_cache"] = False
    budget = getattr(a, "fp16_budget", None)
    if budget is not None:
        kw["fp16_budget"] = None if budget == "off" else budget
    return kw


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=json_default))


def json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    return str(o)


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def age_in_words(seconds: float) -> str:
    s = max(0.0, time.time() - seconds)
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= n:
            return f"{s / n:.0f}{unit} ago"
    return f"{s:.0f}s ago"


def add_cache_dir_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cache-dir", help="cache directory (default: $LITEKILN_CACHE_DIR or the XDG cache dir)"
    )


def add_json_option(p: argparse.ArgumentParser, help_text: str | None = JSON_HELP) -> None:
    p.add_argument("--json", action="store_true", help=help_text)
