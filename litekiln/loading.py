"""Loading a model onto a device: a cache hit or a compile-and-store, then a runtime session.

This is the one place that decides where a compiled model comes from. It sits above the
runtime, the cache and the compiler, which never call each other: the runtime runs compiled
models, the cache stores them, the compiler makes them. The interpreter, ``precompile``, the
CLI and the bench all come through here::

    Interpreter.allocate_tensors -> open_session -> (cache hit | compile_for + store) -> Session

The compiler (and TVM) is imported only when a model is not in the cache; an app that ships
its cache never imports it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from litekiln import config
from litekiln.errors import CompileError, DeviceError, InputError
from litekiln.runtime.device import (
    KNOWN_CHOICES,
    CudaStart,
    CudaStartMiss,
    DeviceHandle,
    DeviceOpener,
    list_devices,
    select_device,
)
from litekiln.runtime.profile import DeviceProfile

if TYPE_CHECKING:
    from litekiln.artifact.compiled import CompiledModel, CompileOptions
    from litekiln.cache.models import ModelCache
    from litekiln.model import Model
    from litekiln.runtime.session import Session

# The compiled-model format, the cache and the runtime session are imported where used: an
# Interpreter imports this module first, and the rest once the device is opening (a warm
# start's imports then overlap the driver's start-up; see litekiln.interpreter).

log = logging.getLogger("litekiln")

_RUNTIME_OPTIONS = {"validate", "use_cache", "progress", "tune", "cpu_first"}


#: Ops that the op registry's load-time rewrite changes into others (`litekiln.ops.unroll`: a
#: WHILE with a known trip count unrolled into its body's ops, a Keras 2 LSTM layer expanded
#: into its steps' ops, a CONV_3D made a CONV_2D, an STFT's RFFT2D made DFT products, a basic
#: RNN expanded into its steps): a
#: model holding one is loaded with the registry imported, whatever the process imported
#: before, so that its graph (and the compiled entry it keys) is the same in a `litekiln
#: compile` and an app's start.
_REWRITTEN_AT_LOAD = frozenset(
    {
        "WHILE",
        "UNIDIRECTIONAL_SEQUENCE_LSTM",
        "CONV_3D",
        "RFFT2D",
        "RNN",
        "UNIDIRECTIONAL_SEQUENCE_RNN",
        "SVDF",
        "STABLEHLO_COMPOSITE",
    }
)


def open_model(
    source: str | os.PathLike[str] | bytes | bytearray | memoryview,
    *,
    token: str | None = None,
    checks: bool = False,
) -> Model:
    """`litekiln.model.load_model`, with the op registry's checks and rewrites (the per-op
    rules, WHILE loops unrolled: `litekiln.ops`) run on every model that ``checks`` asks
    for or that holds an op they rewrite.

    The registry costs ~0.1-0.2 s of imports, which a warm start of a model without loops
    does without (its compiled entry was made from the same graph either way); a compile
    (``checks=True``) always has it. Before, a process that loaded a model before it
    imported the registry left its loops as CPU ops: `litekiln compile` and an app put a
    Keras LSTM (WHILE over 32 steps) wholly on the CPU, where `litekiln inspect` unrolled it
    onto the GPU.
    """
    from litekiln.model import load_model
    from litekiln.model.loader import model_checks_registered, run_model_checks

    if checks and not model_checks_registered():
        import litekiln.ops  # noqa: F401  (registers the checks)
    model = load_model(source, token=token)
    if model_checks_registered():
        return model
    if _rewritten_at_load(model):
        import litekiln.ops  # noqa: F401, F811

        run_model_checks(model)  # (what load_model runs once they are registered)
    return model


def entry_model(model: Model, index: int) -> Model:
    """``model`` entered at subgraph ``index`` (of the file): a signature's subgraph run as a
    model of its own (litert-torch's generative models: ``prefill`` in subgraph 0, ``decode``
    in 1), with the checks and rewrites the loader gives subgraph 0 (`open_model`). Its token is the
    model's with ``#<index>``, so that it is compiled and cached beside the primary graph;
    its name is the model's with the subgraph's (``model:decode``). The subgraph is checked
    and rewritten in place: enter each index of a loaded model once.

    Raises:
        ModelError: the subgraph breaks a rule litekiln or LiteRT checks.
        ValueError: no such subgraph.
    """
    found = [g for g in model.subgraphs if g.index == index]
    if not found:
        raise ValueError(f"subgraph {index}: the model has {len(model.subgraphs)} subgraphs")
    graph = found[0]
    if graph is model.main:
        return model
    import litekiln.ops  # noqa: F401  (registers the checks)
    from litekiln.model.loader import check_graph, run_model_checks

    label = graph.name or str(index)
    check_graph(graph, f"{model.name} subgraph {index} ({label!r})")
    rest = [g for g in model.subgraphs if g is not graph]
    entry = dataclasses.replace(
        model,
        subgraphs=[graph, *rest],
        token=f"{model.token}#{index}",
        name=f"{model.name}:{label}",
    )
    run_model_checks(entry)
    return entry


def signature_entry(model: Model, key: str) -> Model:
    """`entry_model` at the subgraph of signature ``key``.

    Raises:
        InputError: the model has no such signature (the message lists those it has).
    """
    keys = {s.key: s.subgraph_index for s in model.signatures}
    if key not in keys:
        have = ", ".join(repr(k) for k in keys) or "none"
        raise InputError(f"{model.name} has no signature {key!r}; its signatures: {have}")
    return entry_model(model, keys[key])


def entry_signatures(model: Model) -> list[str]:
    """The signatures that enter another subgraph than the primary one (the first such
    signature of each subgraph, in the file's order): what a check or a benchmark of a
    model runs besides its primary subgraph (a generative model's ``decode``)."""
    first: dict[int, str] = {}
    for s in model.signatures:
        if s.subgraph_index != model.main.index:
            first.setdefault(s.subgraph_index, s.key)
    return list(first.values())


def entry_indices(model: Model) -> list[int]:
    """The subgraphs a caller may enter: the primary one (0) and every other one a
    signature names, in order."""
    others = {s.subgraph_index for s in model.signatures} - {model.main.index}
    return [model.main.index, *sorted(others)]


def _rewritten_at_load(model: Model) -> bool:
    """Whether the registry's checks would change ``model``'s graph: an op they rewrite
    (`_REWRITTEN_AT_LOAD`), or one they may fold into constants (the same predicate
    `litekiln.ops.fold` asks: `litekiln.model.fold.fold_candidate`). A compiled entry is
    made from the checked graph; a warm start that skipped them read EdgeNeXt's positional
    encoding, which the checks fold, as ops, found the entry's constant for it missing from
    the model, and dropped and recompiled the entry at every start."""
    from litekiln.model.fold import fold_candidate

    return any(
        op.name in _REWRITTEN_AT_LOAD or fold_candidate(op, g) is not None
        for g in model.subgraphs
        for op in g.ops
        if not op.folded
    )


def split_options(
    options: Mapping[str, Any], precision: str
) -> tuple[CompileOptions, dict[str, Any]]:
    """Separate compile options (part of the cache key) from runtime-only options, filling
    unset compile options from the environment (`litekiln.config`).

    Raises:
        TypeError: an option name is unknown.
    """
    from litekiln.artifact.compiled import CompileOptions

    names = set(CompileOptions.__dataclass_fields__) - {"precision"}
    compile_kw = {k: v for k, v in options.items() if k in names}
    compile_kw.setdefault("op_table", config.OP_TABLE.get())
    compile_kw.setdefault("allow_quantized", config.ALLOW_QUANTIZED.get())
    compile_kw.setdefault("max_partitions", config.MAX_PARTITIONS.get())
    compile_kw.setdefault("min_partition_ops", config.MIN_PARTITION_OPS.get())
    runtime_kw = {k: v for k, v in options.items() if k not in names}
    unknown = set(runtime_kw) - _RUNTIME_OPTIONS
    if unknown:
        raise TypeError(
            f"unknown option(s) {sorted(unknown)}; compile options are "
            f"{sorted(names | {'precision'})}, runtime options are "
            f"{', '.join(sorted(_RUNTIME_OPTIONS))}"
        )
    return CompileOptions(precision=precision, **compile_kw), runtime_kw


def open_device(
    choice: str | None,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    use_cache: bool = True,
) -> DeviceOpener:
    """Start opening the device ``choice`` names, in the background (`DeviceOpener`): through
    CUDA alone where the cache holds the record of the GPU this choice opened before
    (`litekiln.runtime.device.CudaStart`), else through OpenCL.

    Args:
        choice: as for :func:`~litekiln.runtime.device.select_device`.
        cache_dir: the cache `open_session` will use (None: the default).
        use_cache: False where the session will run without the cache.
    """
    c = (choice or "").strip()
    if (
        c not in KNOWN_CHOICES
        or not use_cache
        or config.NO_CACHE.get()
        or config.CUDA_GRAPH.get() == "off"
    ):
        return DeviceOpener(choice)

    def record() -> dict[str, Any] | None:  # (on the opener's thread: the cache imports too)
        import_cache()
        from litekiln.cache.gpu import load_gpu
        from litekiln.cache.store import CacheStore

        try:
            return load_gpu(CacheStore.open(cache_dir), c)
        except Exception:  # noqa: BLE001 - a hint only: open_session reports cache problems
            return None

    return DeviceOpener(choice, known=record)


_CACHE_IMPORT = threading.Lock()


def import_cache() -> None:
    """Import `litekiln.cache` and the modules a session reads it with, one thread at a
    time. The device opener's thread reads the GPU record while the calling thread goes on
    to `open_session`: two threads importing submodules of the package while it initialises
    can each hold a module lock the other waits for, and Python then breaks the deadlock by
    handing one of them a partly initialised module ("cannot import name 'CacheStore'": on
    every start after a reference interpreter's run in one script, tests/test_startup.py)."""
    with _CACHE_IMPORT:
        import litekiln.cache.models  # noqa: F401  (the package, its store and GPU records)


def open_session(
    model: Model,
    *,
    device: str | DeviceOpener | None = None,
    precision: str = "fp32",
    cache_dir: str | os.PathLike[str] | None = None,
    **options: Any,
) -> Session:
    """Load (or compile, then cache) a model and bind it to an OpenCL device.

    Args:
        model: the loaded model IR (its token keys the cache).
        device: device choice (see :func:`~litekiln.runtime.device.select_device`), or a
            :class:`~litekiln.runtime.device.DeviceOpener` already opening it.
        precision: "fp32" or "fp16".
        cache_dir: cache directory; None for the default; the option ``use_cache=False``
            disables the cache.
        options: compile options (:class:`CompileOptions` fields) and runtime options
            (``validate``, ``use_cache``, ``progress``, ``tune``, ``cpu_first``).

    Returns:
        A ready :class:`~litekiln.runtime.session.Session`.

    Raises:
        DeviceError: no usable OpenCL device.
        CompileError: the model is not cached and cannot be compiled here.
    """
    copts, rt = split_options(options, precision)
    import_cache()
    from litekiln.cache.models import ModelCache
    from litekiln.runtime.session import Session

    use_cache = bool(rt.get("use_cache", True)) and not config.NO_CACHE.get()
    cache = ModelCache.open(cache_dir) if use_cache else None
    validate = bool(rt.get("validate", False))
    tune = config.TUNE.get(rt.get("tune"))
    cpu_first = config.CPU_FIRST.get(rt.get("cpu_first"))
    t0 = time.perf_counter()
    early = _preload_ptx(model, copts, cache, device, explicit=options)
    # A CUDA start in the making: read the compiled model while the CUDA context is made.
    ahead = None if validate else _read_ahead(model, copts, cache, device, explicit=options)
    t1 = time.perf_counter()
    opened = device.result() if isinstance(device, DeviceOpener) else select_device(device)
    t2 = time.perf_counter()
    if isinstance(opened, CudaStart):
        session = _cuda_start(model, copts, cache, opened, explicit=options, validate=validate,
                              tune=tune, ahead=ahead)  # fmt: skip
        if session is not None:
            session.startup.update(device_s=t2 - t1, model_cached=True)
            session.startup["cache_read_s"] += t1 - t0
            return session
        t1 = time.perf_counter()
        opened = opened.opencl()
        t2 = time.perf_counter()
    handle = opened
    _say_if_cpu_only(handle)
    copts = _for_device(copts, handle.profile, explicit=options)
    if early is not None and early[0] == copts:
        compiled, hit = early[1], True
    else:
        compiled, hit = _load_or_compile(model, copts, cache, progress=rt.get("progress"))
    t3 = time.perf_counter()
    try:
        session = Session(
            model, compiled, handle, programs=cache, validate=validate, tune=tune,
            cpu_first=cpu_first,
        )  # fmt: skip
        # The start-up's steps on the caller's thread (`litekiln bench --startup`): waiting
        # for the device (opened in the background while the model was parsed), reading the
        # compiled model from the cache (or compiling it), then the session's own.
        session.startup.update(
            device_s=t2 - t1, cache_read_s=(t1 - t0) + (t3 - t2), model_cached=hit
        )
        return session
    except DeviceError as exc:
        half_refused = "half-precision" in str(exc)
        if not (copts.precision == "fp16" and copts.half == "native" and half_refused):
            raise
        # The driver rejects the half kernels (not every OpenCL compiler accepts all of TVM's
        # half code): run the fp16-rounding fp32 kernels instead, and say so.
        log.warning("%s; using fp32 kernels that round every value to fp16", exc)
        copts = dataclasses.replace(copts, half="emulated")
        compiled = load_or_compile(model, copts, cache, progress=rt.get("progress"))
        return Session(
            model, compiled, handle, programs=cache, validate=validate, tune=tune,
            cpu_first=cpu_first,
        )  # fmt: skip


def _cuda_start(
    model: Model,
    copts: CompileOptions,
    cache: ModelCache | None,
    start: CudaStart,
    *,
    explicit: Mapping[str, Any],
    validate: bool,
    tune: bool,
    ahead: _Ahead | None = None,
) -> Session | None:
    """The session of a `CudaStart`: the compiled model and its partitions' verified CUDA
    graphs (``ahead``: read already, from the same record, by `_read_ahead`), else from the
    cache; no OpenCL. None where any of it is missing (the caller opens OpenCL and starts the
    usual way); validate mode always takes the usual way."""
    if cache is None or validate:
        return None
    t0 = time.perf_counter()
    compiled = ahead.compiled if ahead is not None else None
    compiled = compiled or cache.load_model(
        model.token, _for_device(copts, start.profile, explicit=explicit), model
    )
    if compiled is None:
        log.info("%s: no CUDA start (not compiled for %s yet)", model.name, start.description)
        return None
    read_s = time.perf_counter() - t0
    try:
        from litekiln.runtime.session import Session

        programs = ahead if ahead is not None and ahead.compiled is compiled else cache
        session = Session(model, compiled, start, programs=programs, tune=tune)
        session.startup["cache_read_s"] = read_s
        return session
    except CudaStartMiss as exc:
        log.info("%s: no CUDA start (%s); opening the device through OpenCL", model.name, exc)
        return None


class _Ahead:
    """What a `CudaStart` needs from the cache, read while the CUDA context is being made
    (`_read_ahead`): the compiled model, and each partition's verified graph, which the
    session then asks for as from the cache itself (the rest goes to the cache)."""

    def __init__(self, cache: ModelCache, compiled: CompiledModel | None) -> None:
        self.cache = cache
        self.compiled = compiled
        self._graphs: dict[str, Any] = {}

    @staticmethod
    def _key(*key: Any) -> str:
        return json.dumps([key[0], list(key[1]), dict(key[2]), key[3]], sort_keys=True)

    def prefetch(self, profile: DeviceProfile, cuda_uuid: str) -> None:
        for part in self.compiled.partitions if self.compiled else []:
            drv = profile.driver_for(part.program)
            key = (drv.digest, drv.options, profile.identity(), cuda_uuid)
            self._graphs[self._key(*key)] = self.cache.load_graph(*key)

    def load_graph(
        self,
        source_digest: str,
        build_options: Sequence[str],
        identity: Mapping[str, str],
        cuda_uuid: str,
    ) -> tuple[bytes, list[int] | None, bytes | None] | None:
        key = (source_digest, build_options, identity, cuda_uuid)
        got = self._graphs.pop(self._key(*key), _NOT_READ)
        return self.cache.load_graph(*key) if got is _NOT_READ else got

    def load_program(
        self, source_digest: str, build_options: Sequence[str], identity: Mapping[str, str]
    ) -> tuple[bytes | None, list[int] | None]:
        return self.cache.load_program(source_digest, build_options, identity)

    def save_program(self, *key: Any, **kwargs: Any) -> bool:
        return self.cache.save_program(*key, **kwargs)

    def save_gpu(self, choice: str, record: Mapping[str, Any]) -> bool:
        return self.cache.save_gpu(choice, record)


_NOT_READ = object()


def _read_ahead(
    model: Model,
    copts: CompileOptions,
    cache: ModelCache | None,
    device: Any,
    *,
    explicit: Mapping[str, Any],
) -> _Ahead | None:
    """What a `CudaStart` from ``device``'s record will run (its options made for the
    recorded profile), read while the opener still makes the CUDA context; None where there is
    no record (or it is unreadable: the opener then opens OpenCL)."""
    if cache is None or not isinstance(device, DeviceOpener) or device.known is None:
        return None
    try:
        profile = DeviceProfile.from_record(device.known["profile"])
        uuid = str(device.known["cuda_uuid"])
    except (KeyError, TypeError, ValueError):
        return None
    c = _for_device(copts, profile, explicit=explicit)
    ahead = _Ahead(cache, cache.load_model(model.token, c, model))
    ahead.prefetch(profile, uuid)
    return ahead


_SAID_CPU_ONLY = threading.Event()


def _preload_ptx(
    model: Model,
    copts: CompileOptions,
    cache: ModelCache | None,
    device: str | DeviceOpener | None,
    *,
    explicit: Mapping[str, Any],
) -> tuple[CompileOptions, CompiledModel] | None:
    """While OpenCL still opens a GPU (NVIDIA: 1.3-2.0 s with its caches cold), read the
    compiled model as a GPU's options would find it and start the CUDA driver's JIT of its
    shipped PTX (`litekiln.runtime.cuda.preload_ptx`): a first start on an NVIDIA GPU then
    waits for the longer of the two, not their sum.

    Returns:
        (the options guessed, the compiled model read) when it was read, else None; the caller
        uses it if the device's own options are the same.
    """
    if (
        cache is None
        or not isinstance(device, DeviceOpener)
        or device.choice not in KNOWN_CHOICES
        or device.known is not None  # (a CUDA start: its own programs, not the shipped PTX)
        or not device.opening()
        or config.CUDA_GRAPH.get() == "off"
    ):
        return None
    guess = copts
    if "schedules" not in explicit:  # (a GPU's profile names the fast family)
        schedules = config.SCHEDULES.get() if os.environ.get(config.SCHEDULES.env) else "fast"
        guess = dataclasses.replace(copts, schedules=schedules)
    try:
        compiled = cache.load_model(model.token, guess, model)
    except Exception:  # noqa: BLE001 - a guess: the regular read reports any problem
        return None
    if compiled is None:
        return None
    texts = [p.program.ptx for p in compiled.partitions if p.program.ptx]
    if texts:
        from litekiln.runtime.cuda import preload_ptx

        preload_ptx(texts, 0)  # (the first GPU: OpenCL's and CUDA's orders agree on it)
    return guess, compiled


def _say_if_cpu_only(handle: DeviceHandle) -> None:
    """Once per process: running on a CPU OpenCL driver because no GPU driver is installed."""
    if handle.profile.kind != "cpu" or _SAID_CPU_ONLY.is_set():
        return
    _SAID_CPU_ONLY.set()
    if any(DeviceProfile.of(d).kind == "gpu" for _, _, d in list_devices()):
        return  # a GPU is there: the CPU device was chosen on purpose
    log.warning(
        "litekiln runs on %s, a CPU OpenCL driver: it is there for testing, and litekiln's "
        "kernels run many times slower on it than LiteRT's CPU path (XNNPACK). For speed, "
        "install your GPU's OpenCL driver; on a machine without a GPU, run the model with "
        "LiteRT's CPU path instead.",
        handle.description,
    )


def _for_device(
    copts: CompileOptions, profile: DeviceProfile, *, explicit: Mapping[str, Any]
) -> CompileOptions:
    """The compile options completed for the device: its schedule family unless the caller
    chose one, and emulated half where the device has no half arithmetic."""
    if "schedules" not in explicit:
        copts = dataclasses.replace(copts, schedules=_schedules_of(profile))
    if copts.precision == "fp16" and copts.half == "native" and not profile.half:
        log.warning(
            "%s has no half-precision arithmetic: precision='fp16' runs fp32 kernels that round "
            "every value to fp16 (half-storage numerics)",
            profile.description,
        )
        copts = dataclasses.replace(copts, half="emulated")
    return copts


def load_or_compile(
    model: Model,
    options: CompileOptions,
    cache: ModelCache | None,
    *,
    progress: Any = None,
    force: bool = False,
) -> CompiledModel:
    """The compiled model from the cache (its weights rebuilt from ``model`` and checked
    against it), else compiled here and stored.

    Raises:
        CompileError: not cached, and the compiler is not available or fails.
    """
    return _load_or_compile(model, options, cache, progress=progress, force=force)[0]


def _load_or_compile(
    model: Model,
    options: CompileOptions,
    cache: ModelCache | None,
    *,
    progress: Any = None,
    force: bool = False,
) -> tuple[CompiledModel, bool]:
    """`load_or_compile`, and whether the compiled model came from the cache."""
    compiled = None if cache is None or force else cache.load_model(model.token, options, model)
    if compiled is not None:
        return compiled, True
    compiled = compile_for(model, options, progress=progress)
    if cache is not None:
        cache.save_model(compiled)
    return compiled, False


def default_schedules(handle: DeviceHandle) -> str:
    """``LITEKILN_SCHEDULES`` if set, else the schedule family the device's profile names."""
    return _schedules_of(handle.profile)


def _schedules_of(profile: DeviceProfile) -> str:
    if os.environ.get(config.SCHEDULES.env):
        return config.SCHEDULES.get()
    return profile.schedules


def schedules_for(device: str | None) -> str:
    """The schedule family for the device an app will run on: ``LITEKILN_SCHEDULES`` if set,
    else that of this machine's default (or named) OpenCL device, else the GPU family."""
    if os.environ.get(config.SCHEDULES.env):
        return config.SCHEDULES.get()
    try:
        return default_schedules(select_device(device))
    except DeviceError:
        return "fast"


def compile_for(model: Model, options: CompileOptions, *, progress: Any = None) -> CompiledModel:
    """Compile with TVM, or explain why that is impossible on this machine.

    Raises:
        CompileError: TVM is not installed (a runtime-only install met an uncached model).
    """
    try:
        # Asked of the import system, not imported: an app without the compiler never imports
        # its dependencies (a blocked import, sys.modules["tvm"] = None, raises ValueError).
        if importlib.util.find_spec("tvm") is None:
            raise ImportError("apache-tvm is not installed")
        from litekiln.compiler.driver import compile_model, stderr_progress
    except (ImportError, ValueError) as exc:
        raise CompileError(
            f"{model.name} (token {model.token}) is not in the cache and the compiler is not "
            f"available here ({exc}). Compile at build time with `litekiln compile MODEL "
            "--cache-dir DIR` and ship DIR, or install the compiler: "
            "pip install 'litekiln[compiler]'"
        ) from None
    return compile_model(model, options, progress=progress or stderr_progress)


def precompile(
    model_path: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    precision: str | None = None,
    model_token: str | None = None,
    force: bool = False,
    **options: Any,
) -> dict[str, Any]:
    """Compile a model into the cache at build time, without opening any device.

    The compiled program is device-independent OpenCL; device binaries are built and cached
    at the first load on each device.

    Args:
        model_path: the .tflite file.
        cache_dir: the cache to fill (default: the default cache directory).
        precision: "fp32" or "fp16"; with fp16, ``half="emulated"`` compiles the variant for
            devices without half arithmetic (the default "native" is for GPUs).
        model_token: the token the app will use (default: Fingerprint64 of the file).
        force: recompile even if the cache already holds the model.
        options: compile options (:class:`~litekiln.artifact.compiled.CompileOptions` fields);
            ``device`` names the OpenCL device whose schedule family to use (default: this
            machine's default device; "fast" for GPUs when there is none) and, when given,
            the device to build the program on: its binary and tuning choices are stored too.

    Returns:
        A summary: token, cached (bool), partitions, kernels, gpu/cpu op counts, seconds;
        ``entries``: the same for each other subgraph a signature enters (`entry_indices`:
        a generative model's ``decode`` beside its ``prefill``), compiled and cached too.

    Raises:
        ModelError, CompileError, CacheError: as their names say.
    """
    from litekiln.cache.models import ModelCache

    t0 = time.perf_counter()

    model = open_model(model_path, token=model_token, checks=True)
    device = options.pop("device", None)
    if "schedules" not in options:
        options["schedules"] = schedules_for(device)
    copts, _ = split_options(options, config.PRECISION.get(precision))
    cache = ModelCache.open(cache_dir)
    summaries = []
    for index in entry_indices(model):
        entry = entry_model(model, index)
        summaries.append(_precompile_entry(entry, copts, cache, device, cache_dir, options, force))
    info = summaries[0]
    return {
        "model": os.fspath(model_path),
        "token": model.token,
        **info,
        "seconds": round(time.perf_counter() - t0, 3),
        # the other subgraphs a signature enters (a generative model's decode), each
        # compiled and cached on its own: their summaries
        "entries": summaries[1:],
    }


def _precompile_entry(
    model: Model,
    copts: CompileOptions,
    cache: ModelCache,
    device: str | None,
    cache_dir: str | os.PathLike[str] | None,
    options: Mapping[str, Any],
    force: bool,
) -> dict[str, Any]:
    """`precompile` of one entry subgraph: its summary."""
    compiled = None if force else cache.load_model(model.token, copts, model)
    hit = compiled is not None
    ahead = config.AHEAD_OF_TIME.set(True)  # (LITEKILN_PTX=auto: PTX for NVIDIA GPUs too)
    try:
        info = compiled or load_or_compile(model, copts, cache, force=True)
    finally:
        config.AHEAD_OF_TIME.reset(ahead)
    built = device not in (None, "") and _build_on_device(model, device, copts, cache_dir, options)
    return {
        "subgraph": model.main.index,
        "name": model.name,
        "token": model.token,
        "cached": hit,
        "options": copts.to_dict(),
        "partitions": len(info.partitions),
        "gpu_ops": info.stats.get("gpu_ops"),
        "cpu_ops": info.stats.get("cpu_ops"),
        "kernels": info.stats.get("kernels"),
        "merged_convolutions": info.stats.get("merged_convolutions", 0),
        "sibling_merges": info.stats.get("sibling_merges", 0),
        "compile_seconds": info.stats.get("timings_s", {}).get("total"),
        "device_binary": bool(built),
        # partitions whose default kernels are also NVIDIA PTX (LITEKILN_PTX)
        "ptx_partitions": sum(1 for p in info.partitions if p.program.ptx),
        "cache_dir": str(cache.store.directory),
    }


def _build_on_device(
    model: Model,
    device: str,
    copts: CompileOptions,
    cache_dir: str | os.PathLike[str] | None,
    options: Mapping[str, Any],
) -> bool:
    """`precompile` with a named device: build the program there, run one inference (on
    zeros) and let the session store what a first start stores (the device binary, the
    tuning choices), so that an app's first start on this device and driver loads them."""
    import numpy as np

    try:
        session = open_session(
            model, device=device, precision=copts.precision, cache_dir=cache_dir,
            **{**options, "cpu_first": False},  # (the device's own first inference is stored)
        )  # fmt: skip
    except DeviceError as exc:  # (the compiled model is stored: only the binary is missing)
        log.warning("%s: no device binary stored for --device %s: %s", model.name, device, exc)
        return False
    g = model.main
    zeros = {t: np.zeros(g.tensors[t].shape, g.tensors[t].dtype) for t in g.inputs}
    session.run({**g.initial_variables(), **zeros})  # (variables: the model's state, reset)
    session.wait_for_graph()
    return session.startup.get("partitions", 0) > 0
