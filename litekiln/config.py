"""Every knob of litekiln in one place, each readable from the environment.

An explicit argument always wins over the environment, which wins over the default. The table
in docs/configuration.md is generated from :data:`SETTINGS` (``litekiln config --markdown``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One knob: its environment variable, parser, default and documentation."""

    env: str
    parse: Callable[[str], T]
    default: T
    doc: str

    def get(self, explicit: T | None = None) -> T:
        """The explicit value if given, else the environment's, else the default.

        Raises:
            ValueError: the environment variable holds a value that does not parse.
        """
        if explicit is not None:
            return explicit
        raw = os.environ.get(self.env)
        if raw is None or raw == "":
            return self.default
        try:
            return self.parse(raw)
        except ValueError as exc:
            raise ValueError(f"{self.env}={raw!r}: {exc}") from None


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        v = raw.strip().lower()
        if v not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return v

    return parse


def _bool(raw: str) -> bool:
    v = raw.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected 1/0, true/false, yes/no or on/off")


def parse_size(raw: str) -> int:
    """``"512M"``, ``"2GiB"``, ``"1000000"`` -> bytes."""
    s = raw.strip().upper().replace("IB", "").replace("B", "")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    try:
        if s and s[-1] in units:
            return int(float(s[:-1]) * units[s[-1]])
        return int(s)
    except ValueError:
        raise ValueError(f"cannot read {raw!r} as a size (e.g. 500M, 2G)") from None


DEVICE: Setting[str] = Setting(
    "LITEKILN_DEVICE",
    str,
    "",
    "Execution device: `reference` (numpy, CPU), `gpu` (first OpenCL GPU), `opencl` (first "
    "OpenCL device), or `PLATFORM:DEVICE` indices / a substring of the device name. Default: "
    "the first OpenCL GPU, else the first OpenCL device.",
)
PRECISION: Setting[str] = Setting(
    "LITEKILN_PRECISION", _choice("fp32", "fp16"), "fp32", "Kernel precision: fp32 or fp16."
)
CACHE_DIR: Setting[str] = Setting(
    "LITEKILN_CACHE_DIR",
    str,
    "",
    "Cache directory. Default: `$XDG_CACHE_HOME/litekiln`, else `~/.cache/litekiln`.",
)
CACHE_SIZE: Setting[int] = Setting(
    "LITEKILN_CACHE_SIZE", parse_size, 2 << 30, "Cache size bound (LRU eviction), e.g. 500M."
)
NO_CACHE: Setting[bool] = Setting(
    "LITEKILN_NO_CACHE", _bool, False, "Disable the on-disk cache (always compile)."
)
SIGN_KEY: Setting[str] = Setting(
    "LITEKILN_SIGN_KEY",
    str,
    "",
    "Private key file (`litekiln cache keygen KEY`) that `litekiln cache export` signs with "
    "when no `--sign-key` is given (docs/security.md).",
)
TRUSTED_KEYS: Setting[str] = Setting(
    "LITEKILN_TRUSTED_KEYS",
    str,
    "",
    "Public key files (`KEY.pub` from `litekiln cache keygen`), separated by `:` (`;` on "
    "Windows): `litekiln cache import` accepts only exports signed by one of them, unless "
    "`--trust` is given (docs/security.md).",
)
ALLOW_QUANTIZED: Setting[bool] = Setting(
    "LITEKILN_ALLOW_QUANTIZED",
    _bool,
    True,
    "Accept quantized op versions on the GPU (float view); off: such ops run on the CPU.",
)
OP_TABLE: Setting[str] = Setting(
    "LITEKILN_OP_TABLE",
    _choice("documented", "extended"),
    "extended",
    "GPU op table: `extended` (default: every op, at every version, that litekiln's GPU path "
    "implements; docs/ops.md) or `documented` (the TFLite GPU delegate's documented table "
    "and its version limits only).",
)
MAX_PARTITIONS: Setting[int] = Setting(
    "LITEKILN_MAX_PARTITIONS",
    int,
    0,
    "Most GPU partitions to delegate (largest first), the rest run on the CPU; 0 (default): "
    "no cap.",
)
MIN_PARTITION_OPS: Setting[int] = Setting(
    "LITEKILN_MIN_PARTITION_OPS",
    int,
    0,
    "Smallest GPU partition (in ops) worth its CPU/GPU synchronisation; 0 (default): decided "
    "by cost, a partition between CPU ops stays on the GPU when its ops cost the CPU more than "
    "a measured CPU/GPU round trip (docs/architecture.md).",
)
SCHEDULES: Setting[str] = Setting(
    "LITEKILN_SCHEDULES",
    _choice("fast", "fast-cpu", "default"),
    "fast",
    "GPU kernel schedules: `fast` (litekiln's depthwise/pooling rules for large GPUs, dlight's "
    "generic rules for the rest), `fast-cpu` (litekiln's rules tuned for CPU OpenCL such as "
    "PoCL: serial conv reductions with large tiles) or `default` (dlight's generic rules only).",
)
TUNE: Setting[bool] = Setting(
    "LITEKILN_TUNE",
    _bool,
    True,
    "Time the alternative schedules a model was compiled with (`fast` schedules) on the device "
    "at its first load and keep the fastest; the choice is cached per device. Off: the "
    "default schedules, nothing timed (runtime option `tune`).",
)
FAST_LAUNCH: Setting[str] = Setting(
    "LITEKILN_FAST_LAUNCH",
    _choice("auto", "on", "off"),
    "auto",
    "Kernel launch loop: `on` calls clEnqueueNDRangeKernel through ctypes with the launch "
    "arguments converted once at load (H100: 6.0-7.4 us of host time per launch against "
    "pyopencl's 7.2-10.8, and 12-26% lower latency), `off` uses pyopencl's enqueue (faster on "
    "PoCL, whose own enqueue dominates), `auto` (default) is `on` except on PoCL.",
)
CUDA_GRAPH: Setting[str] = Setting(
    "LITEKILN_CUDA_GRAPH",
    _choice("auto", "on", "off"),
    "auto",
    "NVIDIA GPUs: replay each partition's driver-built program (PTX) as one CUDA graph "
    "(input copies, every kernel, output copies in one `cuGraphLaunch`) instead of one "
    "clEnqueueNDRangeKernel per kernel. `auto` (default): on NVIDIA's OpenCL when libcuda "
    "loads, the PTX passes the checks and one inference matches the OpenCL path; the model "
    "is ready at once on OpenCL and moves to the graph in a background thread (the first "
    "inferences of a fresh process may run on OpenCL); `on`: the graph is made while the "
    "model loads and a refusal is an error; `off`: always OpenCL launches.",
)
CUDA_STREAMS: Setting[int] = Setting(
    "LITEKILN_CUDA_STREAMS",
    int,
    4,
    "CUDA graph path: most streams a partition's graph is captured on, so that calls that "
    "neither read what another writes nor overwrite what it uses (branches such as detection "
    "heads) run concurrently; the dependencies come from the memory plan's byte ranges. "
    "1: every kernel after the previous one.",
)
EARLY_CUDA: Setting[bool] = Setting(
    "LITEKILN_EARLY_CUDA",
    _bool,
    True,
    "NVIDIA GPUs: start the CUDA driver (cuInit and the GPU's primary context, ~200 ms) in a "
    "background thread as soon as `litekiln.interpreter` is imported, before numpy and the "
    "rest of the runtime, so that the driver's start overlaps the imports. Only where "
    "/dev/nvidiactl exists, `LITEKILN_DEVICE` is unset or `gpu` and `LITEKILN_CUDA_GRAPH` "
    "is not `off`; the context is made only where one GPU is visible. Off: the driver "
    "starts when the first Interpreter opens its device (for an app that forks worker "
    "processes after importing litekiln: a CUDA driver does not survive a fork).",
)
PTX: Setting[str] = Setting(
    "LITEKILN_PTX",
    _choice("auto", "on", "off"),
    "auto",
    "Compiler: also write each partition's default kernels as NVIDIA PTX (portable across "
    "NVIDIA GPUs; no GPU needed), so that a first start on an NVIDIA GPU loads them through "
    "the CUDA driver instead of building OpenCL C first. Needs the CUDA toolkit's nvcc "
    "($CUDA_PATH/bin, $PATH or /usr/local/cuda/bin). `auto` (default): at build time "
    "(`litekiln compile`), not when a model is compiled as it is opened; `on`: every compile; "
    "`off`: never.",
)
BUILD_THREADS: Setting[int] = Setting(
    "LITEKILN_BUILD_THREADS",
    int,
    0,
    "Threads that build device programs from source at a first start on a device (one "
    "program per partition, built at once); 0 (default): one per program, at most 8.",
)
COMPILE_JOBS: Setting[int] = Setting(
    "LITEKILN_COMPILE_JOBS",
    int,
    0,
    "Processes a compile spreads the tuning variants' scheduling and lowering over (forked, "
    "one task per PrimFunc; the program is the same whatever the number); 0 (default): one "
    "per core this process may run on, at most 16; 1: all in the compiling process.",
)
CPU_FIRST: Setting[bool] = Setting(
    "LITEKILN_CPU_FIRST",
    _bool,
    True,
    "A start that must build device programs from source (no stored binary for this device "
    "and driver, no shipped PTX) is ready at once: its inferences run on the CPU (the numpy "
    "reference, fp32) while the programs build in a background thread; the device takes "
    "over between two inferences once its first inference, on the first inputs the CPU "
    "ran, is done and checked against the CPU's values. A build that fails leaves the model "
    "on the CPU, with a warning. Off: the start waits for the build (and, on PoCL, for the "
    "kernels its first inference compiles).",
)
PROGRESS: Setting[str] = Setting(
    "LITEKILN_PROGRESS",
    _choice("auto", "on", "off"),
    "auto",
    "The line on stderr while a first start builds device programs from source "
    "(`litekiln: building MODEL for DEVICE: partition 0/1, 3.2 s`), and then while its first "
    "inference runs where that takes over half a second (`...: first inference, 5.6 s`: "
    "drivers such as PoCL compile each kernel at its first launch): `auto` (default) only "
    "when stderr is a terminal (updated in place), `on` always, `off` never.",
)
LOG_LEVEL: Setting[str] = Setting(
    "LITEKILN_LOG", _choice("debug", "info", "warning", "error"), "warning", "Log level."
)
ZOO_DIR: Setting[str] = Setting(
    "LITEKILN_ZOO_DIR", str, "", "Model zoo folder. Default: `<repo>/models/zoo`."
)

#: True while a model is compiled ahead of time (`litekiln compile`), where ``LITEKILN_PTX=auto``
#: makes PTX; a compile as a model is opened makes none (it would only delay that start).
AHEAD_OF_TIME: ContextVar[bool] = ContextVar("litekiln_ahead_of_time", default=False)

SETTINGS: tuple[Setting, ...] = (
    DEVICE,
    PRECISION,
    CACHE_DIR,
    CACHE_SIZE,
    NO_CACHE,
    SIGN_KEY,
    TRUSTED_KEYS,
    ALLOW_QUANTIZED,
    OP_TABLE,
    MAX_PARTITIONS,
    MIN_PARTITION_OPS,
    SCHEDULES,
    TUNE,
    FAST_LAUNCH,
    CUDA_GRAPH,
    CUDA_STREAMS,
    EARLY_CUDA,
    PTX,
    BUILD_THREADS,
    COMPILE_JOBS,
    CPU_FIRST,
    PROGRESS,
    LOG_LEVEL,
    ZOO_DIR,
)


def markdown_table() -> str:
    """The configuration table for docs/configuration.md."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for s in SETTINGS:
        rows.append(f"| `{s.env}` | `{s.default}` | {s.doc} |")
    return "\n".join(rows) + "\n"
