"""The model commands: compile, run, inspect, bench; and devices and config."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from litekiln.errors import LitekilnError

if TYPE_CHECKING:
    _Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]
from litekiln.cli.common import (
    add_json_option,
    add_model_options,
    examples,
    existing_file,
    int_at_least,
    interpreter_kwargs,
    output_file,
    positive_float,
    print_json,
)


def writes_nothing(a: argparse.Namespace) -> bool:
    """Whether the command stores nothing: inspect, devices and config; run with --no-cache
    (or ``LITEKILN_NO_CACHE``) or on the numpy reference. `litekiln.cli.main` runs these in
    a read-only environment (`litekiln.cli.common.read_only_environment`)."""
    from litekiln import config

    if a.cmd in ("inspect", "devices", "config"):
        return True
    if a.cmd == "run":
        return bool(
            a.no_cache or config.NO_CACHE.get() or config.DEVICE.get(a.device) == "reference"
        )
    return False


def cmd_compile(a: argparse.Namespace) -> int:
    from litekiln.loading import precompile

    kw = interpreter_kwargs(a)
    if kw.get("device") == "reference":
        raise LitekilnError(
            "compile produces OpenCL programs; --device reference has nothing to compile"
        )
    kw.pop("use_cache", None)
    if a.half:
        kw["half"] = a.half
    if a.schedules:
        kw["schedules"] = a.schedules
    if a.jobs is not None:
        os.environ["LITEKILN_COMPILE_JOBS"] = str(a.jobs)  # (read where the variants lower)
    results = []
    for path in a.models:
        info = precompile(path, force=a.force, **kw)
        results.append(info)
        if not a.json:
            print(f"{path}: token {info['token']}, {_compiled_line(info)}")
            for entry in info["entries"]:
                print(f"{path} [{entry['name']}]: token {entry['token']}, {_compiled_line(entry)}")
    if a.json:
        print_json(results)
    return 0


def _compiled_line(info: dict[str, Any]) -> str:
    """What `precompile` made of one entry subgraph, for `litekiln compile`'s line."""
    state = "already cached" if info["cached"] else f"compiled in {info['compile_seconds']:.1f} s"
    if info.get("device_binary"):
        state += "; device binary stored"
    if info.get("ptx_partitions"):
        state += f"; PTX for NVIDIA GPUs in {info['ptx_partitions']} partition(s)"
    if info.get("merged_convolutions"):
        state += (
            f"; {info['merged_convolutions']} sums of parallel convolutions compiled "
            "as one convolution each"
        )
    if info.get("sibling_merges"):
        n = info["sibling_merges"]
        groups = "1 group" if n == 1 else f"{n} groups"
        state += (
            f"; {groups} of sibling layers (one input, the same window and options) "
            f"compiled as one layer{'' if n == 1 else ' each'}"
        )
    return (
        f"{info['partitions']} GPU partition(s), {info['kernels']} kernels, {info['gpu_ops']} "
        f"ops on the GPU / {info['cpu_ops']} on the CPU; {state} -> {info['cache_dir']}"
    )


def cmd_run(a: argparse.Namespace) -> int:
    from litekiln import config
    from litekiln.interpreter import Interpreter

    kw = interpreter_kwargs(a)
    if writes_nothing(a) and not os.environ.get(config.CPU_FIRST.env):  # (unset or empty)
        # Nothing is stored, so a build in the background would serve no next start: the
        # command would print the CPU's outputs, then wait at its exit for a build whose
        # program goes nowhere. It waits for the build and runs on the device instead.
        kw["cpu_first"] = False
    interp = Interpreter(model_path=a.model, **kw)
    if a.signature:
        try:
            interp = interp.for_signature(a.signature)
        except ValueError as exc:
            raise LitekilnError(f"{a.model}: {exc}") from None
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
    interp.allocate_tensors()  # the cache lookup (or compile), device program, constants
    t1 = time.perf_counter()
    outs = cast("list[np.ndarray]", interp.run(inputs))  # (a list without intermediates)
    t2 = time.perf_counter()
    load_s, dt = t1 - t0, t2 - t1
    out_details = interp.get_output_details()
    if a.save:
        # Any, not np.ndarray: mypy matches ** against savez's allow_pickle: bool as well
        arrays: dict[str, Any] = {d["name"]: o for d, o in zip(out_details, outs, strict=True)}
        np.savez(a.save, **arrays)
    if a.json:
        print_json(
            {
                "model": a.model,
                "device": interp.device,
                "load_seconds": load_s,
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
    print(
        f"{a.model} on {interp.device}: loaded in {load_s * 1000:.1f} ms (cache lookup or "
        f"compile, device program, constants), inference {dt * 1000:.1f} ms"
    )
    for d, o in zip(out_details, outs, strict=True):
        flat = o.reshape(-1)
        preview = np.array2string(flat[:6], precision=4, separator=", ", max_line_width=1000)
        more = " ..." if flat.size > 6 else ""
        print(f"  {d['name']} {list(o.shape)} {o.dtype.name}: {preview}{more}")
    if a.save:
        print(f"outputs saved to {a.save}")
    return 0


def _write_views(a: argparse.Namespace, model: Any, info: dict[str, Any]) -> None:
    """``inspect --view`` / ``--explorer``: the placement as a page and as node data."""
    if a.profile and not a.view:
        raise LitekilnError("--profile adds kernel times to the page of --view OUT.html")
    from litekiln.view import write_model_explorer_data, write_view

    if a.view:
        path = write_view(model, info, a.view, profile=a.profile)
        print(f"view written to {path}", file=sys.stderr)
    if a.explorer:
        path = write_model_explorer_data(model, info, a.explorer)
        print(f"Model Explorer node data written to {path}", file=sys.stderr)


def cmd_inspect(a: argparse.Namespace) -> int:
    from litekiln.model import load_model
    from litekiln.placement import cached_kernels, placement

    model = load_model(a.model, token=a.token)
    if a.signature:
        from litekiln.loading import signature_entry

        model = signature_entry(model, a.signature)
    kw = interpreter_kwargs(a)
    info, plan = placement(model, **kw)
    info = {"model": a.model, **info}
    _write_views(a, model, info)
    if a.compiled:
        device = a.device if a.device != "reference" else None
        info["kernels"] = (
            cached_kernels(model, info, cache_dir=a.cache_dir, device=device)
            if _cache_exists(a.cache_dir)
            else None
        )
    if a.json:
        print_json(info)
        return 0
    g = model.main
    print(f"{a.model}: token {model.token}, schema v{model.version}, {len(g.tensors)} tensors")
    for kind in ("inputs", "outputs"):
        for t in info[kind]:
            print(f"  {kind[:-1]:6s} {t['index']:4d} {t['name']} {t['shape']} {t['dtype']}")
    print("  ops: " + ", ".join(f"{k} x{v}" for k, v in info["op_histogram"].items()))
    folded: dict[str, int] = {}
    for o in info["ops"]:
        if o["where"] == "folded":
            folded[o["op"]] = folded.get(o["op"], 0) + 1
    if folded:
        print(
            "  folded at load (constant results computed once, no op at run time): "
            + ", ".join(f"{k} x{v}" for k, v in folded.items())
        )
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


def _cache_exists(cache_dir: str | None) -> bool:
    """Whether the cache directory holds a cache (so that reading it creates nothing)."""
    from litekiln.cache.backend import DBNAME
    from litekiln.cache.location import default_cache_dir
    from litekiln.cache.manifest import SCHEMA_VERSION

    root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    return (root / f"v{SCHEMA_VERSION}" / DBNAME).is_file()


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
        print_json(devs)
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
        print_json(rows)
    else:
        for r in rows:
            print(f"{r['env']:28s} = {r['value']!s:12s}  {r['doc']}")
    return 0


def cmd_bench(a: argparse.Namespace) -> int:
    from litekiln import bench

    if a.startup:
        if a.peers:
            raise LitekilnError("--peer times warm latency: drop --startup")
        return bench.startup_main(a, interpreter_kwargs(a))
    return bench.latency_main(a, interpreter_kwargs(a), quiet_peers=not a.verbose)


def add_compile_parser(sub: _Subcommands) -> None:
    p = sub.add_parser(
        "compile",
        help="compile models ahead of time into the cache",
        description="Compile each model's GPU partitions to OpenCL and store them in "
        "the cache, so that the app's first Interpreter start is a cache hit. No "
        "device is needed: the program is device-independent OpenCL, and each "
        "device builds and caches its binary at first load. With --device, the program "
        "is also built on that device and its binary and tuning choices stored, so "
        "that a first start on the same device and driver loads them. Ship the cache "
        "directory (or `litekiln cache export`) with the app.",
        epilog=examples(
            "  litekiln compile face_detection.tflite --cache-dir build/litekiln-cache\n"
            "  litekiln compile models/zoo/*.tflite --precision fp16 -j 8   # 8 processes\n"
            "  litekiln compile model.tflite --schedules fast-cpu --force   # for PoCL, again\n"
            "  litekiln compile model.tflite --device cpu   # and PoCL's binary\n"
        ),
    )
    p.add_argument("models", nargs="+", metavar="MODEL", type=existing_file)
    add_model_options(p)
    p.add_argument(
        "--half",
        choices=["native", "emulated"],
        help="with --precision fp16: half kernels (GPUs, default) or fp32 kernels "
        "rounding to fp16 (devices without half arithmetic, e.g. PoCL)",
    )
    p.add_argument("--force", action="store_true", help="recompile even if cached")
    p.add_argument(
        "--jobs",
        "-j",
        type=int_at_least(0),
        metavar="N",
        help="processes to compile in (the tuning variants of the fast schedules, one task "
        "per kernel function; the result is the same for any N): 0 = one per core, 1 = this "
        "process only; default: LITEKILN_COMPILE_JOBS, else one per core",
    )
    p.add_argument(
        "--schedules",
        choices=["fast", "fast-cpu", "default"],
        help="kernel schedules: fast (GPUs), fast-cpu (CPU OpenCL such as PoCL) or "
        "default (TVM's generic rules); default: the profile of --device, or of this "
        "machine's default OpenCL device, else fast",
    )
    add_json_option(p)
    p.set_defaults(func=cmd_compile)


def add_run_parser(sub: _Subcommands) -> None:
    p = sub.add_parser(
        "run",
        help="run a model once and print its outputs",
        description="Run a model (compiling it first if it is not cached) on seeded "
        "random inputs or on inputs from an .npz file; prints the load time, the "
        "inference time and a preview of each output. On a device with nothing built "
        "for it yet, the inference runs on the CPU while the device's programs build, and "
        "the command waits for that build at exit so that the next start finds it "
        "(LITEKILN_CPU_FIRST=off, and with --no-cache: the inference waits for the build "
        "and runs on the device).",
        epilog=examples(
            "  litekiln run face_detection.tflite                     # seeded random inputs\n"
            "  litekiln run model.tflite --inputs in.npz --save out.npz\n"
            "  litekiln run model.tflite --device reference --json    # numpy, no OpenCL\n"
            "  litekiln run llm.tflite --signature decode             # another subgraph\n"
        ),
    )
    p.add_argument("model", metavar="MODEL", type=existing_file)
    p.add_argument(
        "--inputs",
        type=existing_file,
        help=".npz with one array per input (by input name, input_N or arr_N)",
    )
    p.add_argument(
        "--save", type=output_file, help="write the outputs to this .npz (keyed by output name)"
    )
    p.add_argument(
        "--seed",
        type=int_at_least(0),
        default=0,
        metavar="N",
        help="seed of the random inputs (default 0)",
    )
    p.add_argument(
        "--signature",
        metavar="KEY",
        help="the signature whose subgraph to run (default: the primary subgraph, 0); "
        "a generative model's 'decode' beside its 'prefill'",
    )
    add_json_option(p)
    add_model_options(p)
    p.set_defaults(func=cmd_run)


def add_inspect_parser(sub: _Subcommands) -> None:
    p = sub.add_parser(
        "inspect",
        help="show ops, which run where and why, and partitions",
        description="Load and partition a model without compiling it: inputs, "
        "outputs, op histogram, ops folded at load, GPU partitions and the reason for each "
        "CPU op. Stores nothing.",
        epilog=examples(
            "  litekiln inspect face_detection.tflite\n"
            "  litekiln inspect model.tflite --ops | grep cpu        # the CPU ops, and why\n"
            "  litekiln inspect model.tflite --op-table documented --json\n"
            "  litekiln inspect model.tflite --view model.html --profile prof.json  # (bench)\n"
        ),
    )
    p.add_argument("model", metavar="MODEL", type=existing_file)
    p.add_argument("--ops", action="store_true", help="list every op with its placement")
    p.add_argument(
        "--compiled", action="store_true", help="also report the cached compilation's kernel count"
    )
    p.add_argument(
        "--view", metavar="OUT.html", type=output_file,
        help="write the op graph as one self-contained HTML page: ops coloured by GPU "
        "partition or CPU, with the reason for each CPU op and the ops folded at load",
    )  # fmt: skip
    p.add_argument(
        "--explorer",
        metavar="OUT.json",
        type=output_file,
        help="write the placement as node data for Google's AI Edge Model Explorer",
    )
    p.add_argument(
        "--profile",
        metavar="BENCH.json",
        type=existing_file,
        help="with --view: kernel times from `litekiln bench --profile --out BENCH.json`",
    )
    p.add_argument(
        "--signature",
        metavar="KEY",
        help="the signature whose subgraph to inspect (default: the primary subgraph, 0); "
        "a generative model's 'decode' beside its 'prefill'",
    )
    add_json_option(p)
    add_model_options(p)
    p.set_defaults(func=cmd_inspect)


def torch_modes(text: str) -> tuple[str, ...]:
    """``--torch-modes eager,compile``: names from `litekiln.peers.torch_peer.MODES`."""
    from litekiln.peers.torch_peer import MODES

    modes = tuple(m.strip().replace("-", "_") for m in text.split(",") if m.strip())
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise argparse.ArgumentTypeError(f"{text!r}: give some of {', '.join(MODES)}")
    return modes


def add_bench_parser(sub: _Subcommands) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark latency or start-up time",
        description="Warm latency against LiteRT (CPU and, where it loads, GPU), or "
        "with --startup the time from constructing the Interpreter to the first "
        "result, cold (empty cache) versus warm (cache hit), in fresh processes.",
        epilog=examples(
            "  litekiln bench face_detection.tflite                   # vs LiteRT CPU and GPU\n"
            "  litekiln bench models/zoo/*.tflite --runs 200 --out lat.json --plot lat.png\n"
            "  litekiln bench models/corpus/tv_squeezenet1_1.tflite --peer torch   # and PyTorch\n"
            "  litekiln bench --startup --warm-only --litert-gpu --cache-dir kit/cache m.tflite\n"
        ),
    )
    p.add_argument("models", nargs="+", metavar="MODEL", type=existing_file)
    p.add_argument("--startup", action="store_true", help="measure cold vs warm start-up")
    p.add_argument(
        "--warm-only",
        action="store_true",
        help="start-up without a compiler: --cache-dir holds the models compiled "
        "elsewhere; cold runs start from a copy without device binaries and the "
        "recorded compile time is added as an estimate",
    )
    p.add_argument(
        "--litert-gpu",
        action="store_true",
        help="start-up: also start LiteRT's GPU path on each model in fresh processes, "
        "drivers' caches off, the peer of litekiln's first start on a new device",
    )
    p.add_argument(
        "--skip-litert-gpu",
        action="store_true",
        help="latency: leave LiteRT's GPU path out (a run of a large model takes it tens of "
        "ms, hundreds of runs minutes): for runs that time another peer (--peer torch)",
    )
    p.add_argument(
        "--peer",
        dest="peers",
        action="append",
        choices=["torch"],
        help="latency: also time the model's PyTorch twin (a model converted from PyTorch, "
        "with a recipe: the corpus manifest or --torch-recipe) in eager mode, with a CUDA "
        "graph and through torch.compile, on the same inputs, fp32; needs torch",
    )
    p.add_argument(
        "--torch-recipe",
        metavar="FILE.json",
        type=existing_file,
        help='with --peer torch: {"library", "constructor", "kwargs", "seed", "input_shape"} '
        "of the module the models were converted from, or a corpus manifest (default: "
        "corpus.json beside the model, else models/corpus/corpus.json)",
    )
    p.add_argument(
        "--torch-modes",
        metavar="MODE,...",
        type=torch_modes,
        help="with --peer torch: which of eager, cuda_graph, compile (default: all)",
    )
    p.add_argument(
        "--repeat",
        type=int_at_least(1),
        default=3,
        metavar="N",
        help="fresh processes per measurement (start-up; default 3)",
    )
    p.add_argument(
        "--cold-repeat",
        type=int_at_least(1),
        default=None,
        metavar="N",
        help="fresh processes for the cold, first and shipped starts, which take seconds "
        "each and wait for the first start's background work (default: --repeat)",
    )
    p.add_argument(
        "--runs",
        type=int_at_least(1),
        default=100,
        metavar="N",
        help="timed runs per model (latency; default 100)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="per-kernel GPU profile and the model's roofline: each launch's bytes, FLOPs, "
        "GB/s and GFLOP/s, and the floor its launches allow at the device's peaks (latency); "
        "on a CUDA graph, with torch installed, also each kernel's own time inside the graph",
    )
    p.add_argument(
        "--peak-gbps",
        type=positive_float,
        metavar="GBPS",
        help="roofline: the device's memory bandwidth, GB/s (default: measured, a streaming copy)",
    )
    p.add_argument(
        "--peak-gflops",
        type=positive_float,
        metavar="GFLOPS",
        help="roofline: the device's fp32 rate, GFLOP/s (default: measured, multiply-add chains)",
    )
    p.add_argument("--plot", type=output_file, help="write a PNG of speed-ups (latency)")
    add_json_option(p)
    p.add_argument("--out", help="also write the JSON results to this file")
    add_model_options(p)
    p.set_defaults(func=cmd_bench)


def add_devices_parser(sub: _Subcommands) -> None:
    p = sub.add_parser(
        "devices",
        help="list OpenCL devices",
        description="List the OpenCL devices litekiln can run on: the PLATFORM:DEVICE id "
        "that --device and LITEKILN_DEVICE take, type, name, platform, OpenCL version and "
        "driver.",
        epilog=examples(
            "  litekiln devices\n"
            "  litekiln devices --json\n"
            "  litekiln run model.tflite --device 0:0                 # one of them by id\n"
        ),
    )
    add_json_option(p)
    p.set_defaults(func=cmd_devices)


def add_config_parser(sub: _Subcommands) -> None:
    p = sub.add_parser(
        "config",
        help="show every setting, its environment variable and value",
        description="Show every setting: its environment variable, its value here (or why "
        "the value cannot be read) and what it does. An explicit option wins over the "
        "environment, which wins over the default.",
        epilog=examples(
            "  litekiln config\n"
            "  litekiln config --json\n"
            "  LITEKILN_PRECISION=fp16 litekiln config                # what a variable changes\n"
            "  litekiln config --markdown                             # the docs' table\n"
        ),
    )
    add_json_option(p)
    p.add_argument("--markdown", action="store_true", help="print the docs table")
    p.set_defaults(func=cmd_config)
