"""The ``litekiln`` command line: a thin layer over the Python API.

litekiln compile MODEL... [--cache-dir D] [--precision fp16]   compile ahead of time
litekiln run MODEL [--inputs in.npz] [--save out.npz]          run once, print outputs
litekiln inspect MODEL                                          what runs where, and why
litekiln cache ls|info|verify|prune|clear|export|import         manage the cache
litekiln bench --startup MODEL...                               cold vs warm start-up
litekiln devices                                                list OpenCL devices
litekiln config                                                 every setting and its value
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from litekiln.errors import LitekilnError

if TYPE_CHECKING:
    _Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]

_JSON_HELP = "machine-readable output"

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


def _add_model_options(p: argparse.ArgumentParser) -> None:
    _add_cache_dir_option(p)
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


def _interpreter_kwargs(a: argparse.Namespace) -> dict[str, Any]:
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


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=_json_default))


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    return str(o)


# -- commands -------------------------------------------------------------------------------


def cmd_compile(a: argparse.Namespace) -> int:
    from litekiln.loading import precompile

    kw = _interpreter_kwargs(a)
    if kw.get("device") == "reference":
        raise LitekilnError(
            "compile produces OpenCL programs; --device reference has nothing to compile"
        )
    kw.pop("use_cache", None)
    if a.half:
        kw["half"] = a.half
    if a.schedules:
        kw["schedules"] = a.schedules
    results = []
    for path in a.models:
        info = precompile(path, force=a.force, **kw)
        results.append(info)
        if not a.json:
            state = (
                "already cached"
                if info["cached"]
                else f"compiled in {info['compile_seconds']:.1f} s"
            )
            print(
                f"{path}: token {info['token']}, {info['partitions']} GPU partition(s), "
                f"{info['kernels']} kernels, {info['gpu_ops']} ops on the GPU / "
                f"{info['cpu_ops']} on the CPU; {state} -> {info['cache_dir']}"
            )
    if a.json:
        _print_json(results)
    return 0


def cmd_run(a: argparse.Namespace) -> int:
    from litekiln.interpreter import Interpreter

    interp = Interpreter(model_path=a.model, **_interpreter_kwargs(a))
    details = interp.get_input_details()
    if a.inputs:
        try:
            npz = np.load(a.inputs)
        except (OSError, ValueError) as exc:
            raise LitekilnError(
                f"{a.inputs}: cannot read inputs ({exc}); expected an .npz file"
            ) from None
        inputs = []
        for i, d in enumerate(details):
            for k in (d["name"], f"input_{i}", f"arr_{i}"):
                if k in npz:
                    inputs.append(npz[k])
                    break
            else:
                raise LitekilnError(
                    f"{a.inputs}: no array for input {i} ({d['name']!r}); name arrays by input "
                    f"name, input_{i} or arr_{i}. Found: {sorted(npz.files)}"
                )
    else:
        inputs = interp.random_inputs(a.seed)
    t0 = time.perf_counter()
    outs = cast("list[np.ndarray]", interp.run(inputs))  # (a list without intermediates)
    dt = time.perf_counter() - t0
    out_details = interp.get_output_details()
    if a.save:
        # Any, not np.ndarray: mypy matches ** against savez's allow_pickle: bool as well
        arrays: dict[str, Any] = {d["name"]: o for d, o in zip(out_details, outs, strict=True)}
        np.savez(a.save, **arrays)
    if a.json:
        _print_json(
            {
                "model": a.model,
                "device": interp.device,
                "seconds": dt,
                "outputs": [
                    {
                        "name": d["name"],
                        "shape": list(o.shape),
                        "dtype": o.dtype.name,
                        "min": float(o.min()) if o.size else None,
                        "max": float(o.max()) if o.size else None,
                        "mean": float(o.astype(np.float64).mean()) if o.size else None,
                    }
                    for d, o in zip(out_details, outs, strict=True)
                ],
            }
        )
        return 0
    print(f"{a.model} on {interp.device}: {dt * 1000:.1f} ms")
    for d, o in zip(out_details, outs, strict=True):
        flat = o.reshape(-1)
        preview = np.array2string(flat[:6], precision=4, separator=", ")
        more = " ..." if flat.size > 6 else ""
        print(f"  {d['name']} {list(o.shape)} {o.dtype.name}: {preview}{more}")
    if a.save:
        print(f"outputs saved to {a.save}")
    return 0


def cmd_inspect(a: argparse.Namespace) -> int:
    from litekiln.model import load_model
    from litekiln.placement import cached_kernels, placement

    model = load_model(a.model, token=a.token)
    kw = _interpreter_kwargs(a)
    info, plan = placement(model, **kw)
    info = {"model": a.model, **info}
    if a.compiled:
        device = a.device if a.device != "reference" else None
        info["kernels"] = cached_kernels(model, info, cache_dir=a.cache_dir, device=device)
    if a.json:
        _print_json(info)
        return 0
    g = model.main
    print(f"{a.model}: token {model.token}, schema v{model.version}, {len(g.tensors)} tensors")
    for kind in ("inputs", "outputs"):
        for t in info[kind]:
            print(f"  {kind[:-1]:6s} {t['index']:4d} {t['name']} {t['shape']} {t['dtype']}")
    print("  ops: " + ", ".join(f"{k} x{v}" for k, v in info["op_histogram"].items()))
    for line in plan.warning_lines():
        print(line)
    for p in plan.partitions:
        print(
            f"  partition {p.index}: {len(p.ops)} ops (#{p.ops[0]}..#{p.ops[-1]}), "
            f"{len(p.inputs)} inputs, {len(p.outputs)} outputs"
        )
    if a.ops:
        for o in info["ops"]:
            extra = f"  <- {o['reason']}" if o["reason"] else ""
            print(f"    #{o['index']:4d} {o['op']:28s} v{o['version']} {o['where']}{extra}")
    if a.compiled:
        kernels = info["kernels"] if info["kernels"] is not None else "not compiled yet"
        print(f"  kernels (cached compilation): {kernels}")
    return 0


def cmd_devices(a: argparse.Namespace) -> int:
    from litekiln.runtime.device import list_devices
    from litekiln.runtime.profile import DeviceProfile

    profiles = [(p, i, DeviceProfile.of(d)) for p, i, d in list_devices()]
    devs = [
        {
            "id": f"{p}:{i}",
            "name": prof.name,
            "platform": prof.platform,
            "type": prof.kind,
            "version": prof.version,
            "driver": prof.driver,
        }
        for p, i, prof in profiles
    ]
    if a.json:
        _print_json(devs)
    elif not devs:
        print("no OpenCL devices; install a driver (e.g. `apt-get install pocl-opencl-icd`)")
    else:
        for d in devs:
            print(
                f"{d['id']}  {d['type']:5s} {d['name']} "
                f"({d['platform']}, {d['version']}, driver {d['driver']})"
            )
    return 0


def cmd_config(a: argparse.Namespace) -> int:
    from litekiln import config

    if a.markdown:
        print(config.markdown_table(), end="")
        return 0
    rows = []
    for s in config.SETTINGS:
        try:
            value: Any = s.get()
        except ValueError as exc:
            value = f"invalid: {exc}"
        rows.append({"env": s.env, "value": value, "default": s.default, "doc": s.doc})
    if a.json:
        _print_json(rows)
    else:
        for r in rows:
            print(f"{r['env']:28s} = {r['value']!s:12s}  {r['doc']}")
    return 0


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _age(seconds: float) -> str:
    s = max(0.0, time.time() - seconds)
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= n:
            return f"{s / n:.0f}{unit} ago"
    return f"{s:.0f}s ago"


def parse_age(text: str) -> float:
    """``"7d"``, ``"12h"``, ``"30m"``, ``"90s"`` -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    t = text.strip().lower()
    try:
        if t and t[-1] in units:
            return float(t[:-1]) * units[t[-1]]
        return float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"cannot read {text!r} as an age (e.g. 7d, 12h, 30m)"
        ) from None


def cmd_cache(a: argparse.Namespace) -> int:
    from litekiln.cache import CacheError, CacheStore
    from litekiln.config import parse_size

    store = CacheStore.open(a.cache_dir)
    sub = a.cache_cmd
    if sub == "ls":
        rows = [s.as_dict() for s in store.ls()]
        if a.json:
            _print_json({"directory": str(store.directory), "entries": rows})
            return 0
        print(f"{store.directory}: {len(rows)} entries, {_human(sum(r['size'] for r in rows))}")
        for r in rows:
            opts = r.get("options") or {}
            desc = (
                ",".join(f"{k}={v}" for k, v in opts.items() if k in ("precision", "op_table"))
                if isinstance(opts, dict)
                else ""
            )
            ident = r.get("token") or (r.get("fields") or {}).get("name", "")
            name = r.get("model_name") or ""
            print(
                f"  {r['key'][:12]}  {r['kind']:7s} {str(ident)[:24]:24s} {str(name)[:28]:28s} "
                f"{desc:28s} {_human(r['size']):>10s}  {_age(r['last_use'])}"
            )
        return 0
    if sub == "info":
        try:
            info = store.info(a.key)
        except KeyError as exc:  # unknown or ambiguous prefix: an error, not a traceback
            raise CacheError(f"{exc.args[0]} in {store.directory}") from None
        _print_json(info)
        return 0
    if sub == "verify":
        report = store.verify(fix=a.fix)
        d = report.as_dict() if hasattr(report, "as_dict") else vars(report)
        if a.json:
            _print_json(d)
        else:
            print(report)
        return 0 if getattr(report, "clean", True) or a.fix else 1
    if sub == "prune":
        removed = store.prune(
            max_size=parse_size(a.max_size) if a.max_size else None,
            older_than=parse_age(a.older_than) if a.older_than else None,
        )
        if a.json:
            _print_json({"removed": removed})
        else:
            print(f"removed {len(removed) if hasattr(removed, '__len__') else removed} entries")
        return 0
    if sub == "clear":
        n = store.clear()
        print(f"removed {n} entries from {store.directory}")
        return 0
    if sub == "export":
        try:
            keys = store.export(a.file, keys=a.keys or None)
        except KeyError as exc:
            raise CacheError(f"{exc.args[0]} in {store.directory}") from None
        print(f"exported {len(keys)} entries to {a.file}")
        return 0
    if sub == "import":
        keys = store.import_(a.file)
        print(f"imported {len(keys)} verified entries into {store.directory}")
        return 0
    raise AssertionError(sub)


def cmd_bench(a: argparse.Namespace) -> int:
    from litekiln import bench

    if a.startup:
        return bench.startup_main(a, _interpreter_kwargs(a))
    return bench.latency_main(a, _interpreter_kwargs(a))


# -- parser ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The ``litekiln`` parser: one subcommand per ``cmd_*`` function (its ``func`` default)."""
    from litekiln import __version__

    p = argparse.ArgumentParser(
        prog="litekiln",
        description="Ahead-of-time GPU compiler and loader for TensorFlow Lite models: compiles a "
        ".tflite model's GPU-capable ops to OpenCL kernels once, caches them, and runs them "
        "with a lightweight runtime; other ops run on the CPU.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"litekiln {__version__}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    _add_compile_parser(sub)
    _add_run_parser(sub)
    _add_inspect_parser(sub)
    _add_cache_parser(sub)
    _add_bench_parser(sub)
    _add_devices_parser(sub)
    _add_config_parser(sub)
    return p


def _add_cache_dir_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cache-dir", help="cache directory (default: $LITEKILN_CACHE_DIR or the XDG cache dir)"
    )


def _add_json_option(p: argparse.ArgumentParser, help_text: str | None = _JSON_HELP) -> None:
    p.add_argument("--json", action="store_true", help=help_text)


def _add_compile_parser(sub: _Subcommands) -> None:
    p = sub.add_parser(
        "compile",
        help="compile models ahead of time into the cache",
        description="Compile each model's GPU partitions to OpenCL and store them in "
        "the cache, so that the app's first Interpreter start is a cache hit. No "
        "device is needed: the program is device-independent OpenCL, and each "
        "device builds and caches its binary at first load. Ship the cache "
        "directory (or `litekiln cache export`) with the app.",
    )
    p.add_argument("models", nargs="+", metavar="MODEL")
    _add_model_options(p)
    p.add_argument(
        "--half",
        choices=["native", "emulated"],
        help="with --precision fp16: half kernels (GPUs, default) or fp32 kernels "
        "rounding to fp16 (devices without half arithmetic, e.g. PoCL)",
    )
    p.add_argument("--force", action="store_true", help="recompile even if cached")
    p.add_argument(
        "--schedules",
        choices=["fast", "fast-cpu", "default"],
        help="kernel schedules: fast (GPUs), fast-cpu (CPU OpenCL such as PoCL) or "
        "default (TVM's generic rules); default: the profile of --device, or of this "
        "machine's default OpenCL device, else fast",
    )
    _add_json_option(p)
    p.set_defaults(func=cmd_compile)


def _add_run_parser(sub: _Subcommands) -> None:
    p = sub.add_parser(
        "run",
        help="run a model once and print its outputs",
        description="Run a model (compiling it first if it is not cached) on seeded "
        "random inputs or on inputs from an .npz file.",
    )
    p.add_argument("model", metavar="MODEL")
    p.add_argument(
        "--inputs", help=".npz with one array per input (by input name, input_N or arr_N)"
    )
    p.add_argument("--save", help="write the outputs to this .npz (keyed by output name)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    _add_json_option(p)
    _add_model_options(p)
    p.set_defaults(func=cmd_run)


def _add_inspect_parser(sub: _Subcommands) -> None:
    p = sub.add_parser(
        "inspect",
        help="show ops, which run where and why, and partitions",
        description="Load and partition a model without compiling it: inputs, "
        "outputs, op histogram, GPU partitions and the reason for each CPU op.",
    )
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--ops", action="store_true", help="list every op with its placement")
    p.add_argument(
        "--compiled", action="store_true", help="also report the cached compilation's kernel count"
    )
    _add_json_option(p)
    _add_model_options(p)
    p.set_defaults(func=cmd_inspect)


def _add_cache_parser(sub: _Subcommands) -> None:
    p = sub.add_parser(
        "cache",
        help="manage the compiled-model cache",
        description="List, check, shrink, empty, export and import the cache.",
    )
    _add_cache_dir_option(p)
    actions = p.add_subparsers(dest="cache_cmd", metavar="ACTION", required=True)
    _add_cache_actions(actions)
    for action in actions.choices.values():
        action.set_defaults(func=cmd_cache)
    p.set_defaults(func=cmd_cache)


def _add_cache_actions(actions: _Subcommands) -> None:
    p = actions.add_parser("ls", help="list entries: token, model, options, size, last use")
    _add_json_option(p, help_text=None)
    p = actions.add_parser("info", help="show one entry (a key prefix is enough)")
    p.add_argument("key")
    p = actions.add_parser("verify", help="check every stored part's checksum")
    p.add_argument("--fix", action="store_true", help="drop damaged entries")
    _add_json_option(p, help_text=None)
    p = actions.add_parser("prune", help="evict least-recently-used entries")
    p.add_argument("--max-size", help="shrink to this size (e.g. 500M, 2G)")
    p.add_argument("--older-than", help="drop entries unused for this long (e.g. 30d, 12h)")
    _add_json_option(p, help_text=None)
    actions.add_parser("clear", help="remove every entry")
    p = actions.add_parser("export", help="write entries to one file (to ship with an app)")
    p.add_argument("file")
    p.add_argument("keys", nargs="*", help="keys or prefixes (default: all)")
    p = actions.add_parser("import", help="add the entries of an export file (each part verified)")
    p.add_argument("file")


def _add_bench_parser(sub: _Subcommands) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark latency or start-up time",
        description="Warm latency against LiteRT (CPU and, where it loads, GPU), or "
        "with --startup the time from constructing the Interpreter to the first "
        "result, cold (empty cache) versus warm (cache hit), in fresh processes.",
    )
    p.add_argument("models", nargs="+", metavar="MODEL")
    p.add_argument("--startup", action="store_true", help="measure cold vs warm start-up")
    p.add_argument(
        "--warm-only",
        action="store_true",
        help="start-up without a compiler: --cache-dir holds the models compiled "
        "elsewhere; cold runs start from a copy without device binaries and the "
        "recorded compile time is added as an estimate",
    )
    p.add_argument(
        "--repeat", type=int, default=3, help="fresh processes per measurement (start-up)"
    )
    p.add_argument("--runs", type=int, default=100, help="timed runs per model (latency)")
    p.add_argument("--profile", action="store_true", help="per-kernel GPU profile (latency)")
    p.add_argument("--plot", help="write a PNG of speed-ups (latency)")
    _add_json_option(p)
    p.add_argument("--out", help="also write the JSON results to this file")
    _add_model_options(p)
    p.set_defaults(func=cmd_bench)


def _add_devices_parser(sub: _Subcommands) -> None:
    p = sub.add_parser("devices", help="list OpenCL devices")
    _add_json_option(p, help_text=None)
    p.set_defaults(func=cmd_devices)


def _add_config_parser(sub: _Subcommands) -> None:
    p = sub.add_parser("config", help="show every setting, its environment variable and value")
    _add_json_option(p, help_text=None)
    p.add_argument("--markdown", action="store_true", help="print the docs table")
    p.set_defaults(func=cmd_config)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    if not getattr(a, "func", None):
        parser.print_help()
        return 2
    try:
        return int(a.func(a) or 0)
    except LitekilnError as exc:
        print(f"litekiln: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
