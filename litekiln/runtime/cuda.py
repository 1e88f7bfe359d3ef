"""NVIDIA launch path: a partition's driver-built program replayed as one CUDA graph.

NO TVM IMPORT here. Why this exists: on NVIDIA's OpenCL every ``clEnqueueNDRangeKernel`` costs
~5.2 us of host time (measured on the H100, results/h100/probe.json) and the in-order
queue has no command buffers (no ``cl_khr_command_buffer``), so models of 40-100 small
kernels were bound by the host's launch loop, not by the GPU. NVIDIA's OpenCL compiler turns
our OpenCL C into PTX (the device binary that the binary cache already stores); the CUDA
driver loads that same PTX, and a CUDA graph replays a whole partition -- input copies,
every kernel, output copies -- with one ``cuGraphLaunch``.

What is run is exactly what the OpenCL path runs: the same PTX, the same launch plan
(grid = global size / local size, block = local size), the same memory plan (one device
arena, each storage at an aligned offset, tensors at their byte offsets). The checks that
make this safe are explicit and refuse rather than guess (`CudaUnsupported`):

* every kernel's PTX parameter list matches the launch's arguments (pointers are ``.u64``,
  scalars the size of their OpenCL type), so the driver gets exactly what the OpenCL ABI
  passed;
* the PTX reads no driver environment registers (``%envreg``), which NVIDIA's OpenCL uses
  for OpenCL-only state (global work offsets) that a CUDA launch does not set;
* the caller (`litekiln.runtime.session`) compares one inference against the OpenCL path
  before the graph path is used, the first time a program runs on a device.

Only ctypes and numpy: libcuda.so.1 is part of every NVIDIA driver install that has OpenCL.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import logging
import re
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from litekiln.artifact.program import SCALAR_TYPES, BufferArg, GpuProgram, Launch, TensorSpec
from litekiln.runtime.partition_io import PartitionIO, constant_arrays
from litekiln.runtime.profile import DeviceProfile

log = logging.getLogger("litekiln")

_NOT_READY = 600  # CUDA_ERROR_NOT_READY from cuStreamQuery
_EVENT_DISABLE_TIMING = 2  # CU_EVENT_DISABLE_TIMING
#: The load-time replay (one inference) must finish within this, else the path is refused.
_LOAD_CHECK_SECONDS = 10.0
#: Byte alignment of storages in the device arena (cudaMalloc's own is 256).
_ALIGN = 256
_MIN_BYTES = 4


def _slot_bytes(nbytes: int) -> int:
    """Bytes a buffer of ``nbytes`` takes in the arena or the staging block (aligned)."""
    return -(-max(nbytes, _MIN_BYTES) // _ALIGN) * _ALIGN


_CTYPES: dict[str, Any] = {
    "char": ctypes.c_int8,
    "uchar": ctypes.c_uint8,
    "short": ctypes.c_int16,
    "ushort": ctypes.c_uint16,
    "int": ctypes.c_int32,
    "uint": ctypes.c_uint32,
    "long": ctypes.c_int64,
    "ulong": ctypes.c_uint64,
    "half": ctypes.c_uint16,  # the bits of a float16
    "float": ctypes.c_float,
    "double": ctypes.c_double,
}
_PTX_SIZES = {
    "u8": 1,
    "s8": 1,
    "b8": 1,
    "u16": 2,
    "s16": 2,
    "b16": 2,
    "f16": 2,
    "u32": 4,
    "s32": 4,
    "b32": 4,
    "f32": 4,
    "u64": 8,
    "s64": 8,
    "b64": 8,
    "f64": 8,
}


class CudaUnsupported(RuntimeError):
    """The CUDA graph path cannot run this program here (message says why); the caller keeps
    the OpenCL path."""


class NotNvidiaDevice(CudaUnsupported):
    """The OpenCL device is not on NVIDIA's platform: the path does not apply (no news)."""


def _signatures() -> dict[str, tuple[str, list[Any]]]:
    """Entry point -> (symbol in libcuda.so.1, ctypes argument types); all return CUresult."""
    vp, u32, i32, sz, u64 = (
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_size_t,
        ctypes.c_uint64,
    )
    pvp, pi32 = ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int)
    return {
        "cuInit": ("cuInit", [u32]),
        "cuDeviceGetCount": ("cuDeviceGetCount", [pi32]),
        "cuDeviceGet": ("cuDeviceGet", [pi32, i32]),
        "cuDeviceGetAttribute": ("cuDeviceGetAttribute", [pi32, i32, i32]),
        "cuDeviceGetName": ("cuDeviceGetName", [vp, i32, i32]),
        "cuDeviceGetUuid": ("cuDeviceGetUuid", [vp, i32]),
        "cuDriverGetVersion": ("cuDriverGetVersion", [pi32]),
        "cuDevicePrimaryCtxRetain": ("cuDevicePrimaryCtxRetain", [pvp, i32]),
        "cuCtxSetCurrent": ("cuCtxSetCurrent", [vp]),
        "cuStreamCreate": ("cuStreamCreate", [pvp, u32]),
        "cuModuleLoadData": ("cuModuleLoadData", [pvp, ctypes.c_char_p]),
        "cuLinkCreate": ("cuLinkCreate_v2", [u32, vp, vp, pvp]),
        "cuLinkAddData": (
            "cuLinkAddData_v2",
            [vp, i32, ctypes.c_char_p, sz, ctypes.c_char_p, u32, vp, vp],
        ),
        "cuLinkComplete": ("cuLinkComplete", [vp, pvp, ctypes.POINTER(sz)]),
        "cuLinkDestroy": ("cuLinkDestroy", [vp]),
        "cuModuleUnload": ("cuModuleUnload", [vp]),
        "cuModuleGetFunction": ("cuModuleGetFunction", [pvp, vp, ctypes.c_char_p]),
        "cuMemAlloc": ("cuMemAlloc_v2", [ctypes.POINTER(u64), sz]),
        "cuMemFree": ("cuMemFree_v2", [u64]),
        "cuMemHostAlloc": ("cuMemHostAlloc", [pvp, sz, u32]),
        "cuMemFreeHost": ("cuMemFreeHost", [vp]),
        "cuMemcpyHtoD": ("cuMemcpyHtoD_v2", [u64, vp, sz]),
        "cuMemcpyHtoDAsync": ("cuMemcpyHtoDAsync_v2", [u64, vp, sz, vp]),
        "cuMemcpyDtoHAsync": ("cuMemcpyDtoHAsync_v2", [vp, u64, sz, vp]),
        "cuMemcpyDtoDAsync": ("cuMemcpyDtoDAsync_v2", [u64, u64, sz, vp]),
        "cuLaunchKernel": ("cuLaunchKernel", [vp, u32, u32, u32, u32, u32, u32, u32, vp, vp, vp]),
        "cuStreamBeginCapture": ("cuStreamBeginCapture_v2", [vp, i32]),
        "cuStreamEndCapture": ("cuStreamEndCapture", [vp, pvp]),
        "cuGraphInstantiateWithFlags": ("cuGraphInstantiateWithFlags", [pvp, vp, u64]),
        "cuGraphLaunch": ("cuGraphLaunch", [vp, vp]),
        "cuGraphDestroy": ("cuGraphDestroy", [vp]),
        "cuGraphExecDestroy": ("cuGraphExecDestroy", [vp]),
        "cuStreamSynchronize": ("cuStreamSynchronize", [vp]),
        "cuStreamQuery": ("cuStreamQuery", [vp]),
        "cuEventCreate": ("cuEventCreate", [pvp, u32]),
        "cuEventRecord": ("cuEventRecord", [vp, vp]),
        "cuStreamWaitEvent": ("cuStreamWaitEvent", [vp, vp, u32]),
        "cuEventSynchronize": ("cuEventSynchronize", [vp]),
        "cuEventElapsedTime": ("cuEventElapsedTime", [ctypes.POINTER(ctypes.c_float), vp, vp]),
        "cuEventDestroy": ("cuEventDestroy_v2", [vp]),
        "cuGetErrorName": ("cuGetErrorName", [i32, ctypes.POINTER(ctypes.c_char_p)]),
    }


class _Driver:
    """The few CUDA driver API entry points the executor needs, loaded once per process.

    Each attribute is the library's function with the argument types of `_signatures`.
    """

    cuInit: Any
    cuDeviceGetCount: Any
    cuDeviceGet: Any
    cuDeviceGetAttribute: Any
    cuDeviceGetName: Any
    cuDeviceGetUuid: Any
    cuDriverGetVersion: Any
    cuDevicePrimaryCtxRetain: Any
    cuCtxSetCurrent: Any
    cuStreamCreate: Any
    cuModuleLoadData: Any
    cuLinkCreate: Any
    cuLinkAddData: Any
    cuLinkComplete: Any
    cuLinkDestroy: Any
    cuModuleUnload: Any
    cuModuleGetFunction: Any
    cuMemAlloc: Any
    cuMemFree: Any
    cuMemHostAlloc: Any
    cuMemFreeHost: Any
    cuMemcpyHtoD: Any
    cuMemcpyHtoDAsync: Any
    cuMemcpyDtoHAsync: Any
    cuMemcpyDtoDAsync: Any
    cuLaunchKernel: Any
    cuStreamBeginCapture: Any
    cuStreamEndCapture: Any
    cuGraphInstantiateWithFlags: Any
    cuGraphLaunch: Any
    cuGraphDestroy: Any
    cuGraphExecDestroy: Any
    cuStreamSynchronize: Any
    cuStreamQuery: Any
    cuEventCreate: Any
    cuEventRecord: Any
    cuStreamWaitEvent: Any
    cuEventSynchronize: Any
    cuEventElapsedTime: Any
    cuEventDestroy: Any
    cuGetErrorName: Any

    def __init__(self, lib: Any = None) -> None:
        """Args: lib: the loaded library (default: libcuda.so.1; tests pass a stand-in)."""
        if lib is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError as exc:
                raise CudaUnsupported(f"no CUDA driver library (libcuda.so.1: {exc})") from None
        for attr, (symbol, argtypes) in _signatures().items():
            try:
                fn = getattr(lib, symbol)
            except AttributeError:
                raise CudaUnsupported(f"the CUDA driver lacks {symbol} (too old)") from None
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
            setattr(self, attr, fn)
        self.lib = lib
        self.check("cuInit", self.cuInit(0))

    def check(self, what: str, err: int) -> None:
        if err:
            name = ctypes.c_char_p()
            self.cuGetErrorName(err, ctypes.byref(name))
            label = name.value.decode() if name.value else f"error {err}"
            raise CudaUnsupported(f"{what} failed: {label}")


_DRIVER: _Driver | None = None
_DRIVER_ERROR: str | None = None
_LOCK = threading.RLock()  # cuda_device_for holds it while CudaDevice calls driver()


def driver() -> _Driver:
    """The CUDA driver, loaded and initialised once per process.

    Raises:
        CudaUnsupported: libcuda.so.1 is missing, too old, or cuInit fails (no NVIDIA GPU).
    """
    global _DRIVER, _DRIVER_ERROR
    with _LOCK:
        if _DRIVER is None:
            if _DRIVER_ERROR is not None:
                raise CudaUnsupported(_DRIVER_ERROR)
            try:
                _DRIVER = _Driver()
            except CudaUnsupported as exc:
                _DRIVER_ERROR = str(exc)
                raise
        return _DRIVER


def _new_event(drv: _Driver, flags: int = 0) -> ctypes.c_void_p:
    """A CUDA event (flags 0: with timing); the caller destroys it."""
    ev = ctypes.c_void_p()
    drv.check("cuEventCreate", drv.cuEventCreate(ctypes.byref(ev), flags))
    return ev


class CudaDevice:
    """A CUDA device's primary context and one non-blocking stream (one per device and process)."""

    def __init__(self, ordinal: int) -> None:
        drv = driver()
        dev = ctypes.c_int()
        drv.check("cuDeviceGet", drv.cuDeviceGet(ctypes.byref(dev), ordinal))
        self.ordinal = ordinal
        self._set_current = drv.cuCtxSetCurrent
        self.context = ctypes.c_void_p()
        drv.check(
            "cuDevicePrimaryCtxRetain",
            drv.cuDevicePrimaryCtxRetain(ctypes.byref(self.context), dev),
        )
        self.make_current()
        self.stream = ctypes.c_void_p()
        drv.check("cuStreamCreate", drv.cuStreamCreate(ctypes.byref(self.stream), 1))
        name = ctypes.create_string_buffer(256)
        drv.cuDeviceGetName(name, 256, dev)
        self.name = name.value.decode(errors="replace")
        #: The GPU's UUID (hex): what a later start finds it by (`device_by_uuid`).
        self.uuid = _uuid(drv, dev.value)
        self._side: list[ctypes.c_void_p] = []

    def make_current(self) -> None:
        # (called twice per inference: the driver's function, bound once, and no lock)
        err = self._set_current(self.context)
        if err:
            driver().check("cuCtxSetCurrent", err)

    def side_streams(self, n: int) -> list[ctypes.c_void_p]:
        """``n`` more non-blocking streams for capturing branches (made once, kept)."""
        drv = driver()
        while len(self._side) < n:
            st = ctypes.c_void_p()
            drv.check("cuStreamCreate", drv.cuStreamCreate(ctypes.byref(st), 1))
            self._side.append(st)
        return self._side[:n]


_DEVICES: dict[int, CudaDevice] = {}

# CUdevice_attribute values (cuda.h).
_ATTR_PCI_BUS_ID, _ATTR_PCI_DEVICE_ID = 33, 34


def cuda_device_for(cl_device: Any, profile: DeviceProfile) -> CudaDevice:
    """The CUDA device that is the same GPU as an OpenCL device of NVIDIA's platform.

    Matched by PCI bus and device id (OpenCL's ``cl_nv_device_attribute_query``); with that
    query unavailable, only a single-GPU machine is matched.

    Args:
        cl_device: the pyopencl device.
        profile: its profile (`DeviceProfile.cuda_graph_candidate` decides first).

    Raises:
        CudaUnsupported: not an NVIDIA OpenCL device, no CUDA driver, or no unambiguous match.
    """
    if not profile.cuda_graph_candidate:
        raise NotNvidiaDevice(f"not an NVIDIA OpenCL device (platform {profile.platform!r})")
    drv = driver()
    count = ctypes.c_int()
    drv.check("cuDeviceGetCount", drv.cuDeviceGetCount(ctypes.byref(count)))
    ordinals = list(range(count.value))
    try:
        want = (int(cl_device.pci_bus_id_nv), int(cl_device.pci_slot_id_nv))
    except Exception:  # noqa: BLE001 - attribute query not supported by this driver/pyopencl
        want = None
    pick = None
    if want is not None:
        for o in ordinals:
            dev = ctypes.c_int()
            drv.check("cuDeviceGet", drv.cuDeviceGet(ctypes.byref(dev), o))
            bus, slot = ctypes.c_int(), ctypes.c_int()
            drv.cuDeviceGetAttribute(ctypes.byref(bus), _ATTR_PCI_BUS_ID, dev)
            drv.cuDeviceGetAttribute(ctypes.byref(slot), _ATTR_PCI_DEVICE_ID, dev)
            if (bus.value, slot.value) == want:
                pick = o
                break
    elif len(ordinals) == 1:
        pick = 0
    if pick is None:
        raise CudaUnsupported(
            f"no CUDA device matches the OpenCL device (PCI {want}, {len(ordinals)} CUDA devices)"
        )
    return _device(pick)


def _uuid(drv: _Driver, dev: int) -> str:
    raw = ctypes.create_string_buffer(16)
    drv.check("cuDeviceGetUuid", drv.cuDeviceGetUuid(raw, dev))
    return raw.raw.hex()


_JIT_INPUT_PTX = 1  # CU_JIT_INPUT_PTX


def link_cubin(device: CudaDevice, text: str) -> bytes:
    """The cubin (device code, no JIT left) the driver's PTX compiler makes of ``text`` for
    ``device``, with its default options (those of ``cuModuleLoadData`` on PTX).

    Raises:
        CudaUnsupported: the driver cannot link it.
    """
    drv = driver()
    device.make_current()
    state = ctypes.c_void_p()
    drv.check("cuLinkCreate", drv.cuLinkCreate(0, None, None, ctypes.byref(state)))
    try:
        data = text.encode("latin-1") + b"\0"
        drv.check(
            "cuLinkAddData (PTX)",
            drv.cuLinkAddData(state, _JIT_INPUT_PTX, data, len(data), b"litekiln", 0, None, None),
        )
        image, size = ctypes.c_void_p(), ctypes.c_size_t()
        drv.check(
            "cuLinkComplete", drv.cuLinkComplete(state, ctypes.byref(image), ctypes.byref(size))
        )
        return ctypes.string_at(image.value or 0, size.value)  # (owned by the link state)
    finally:
        drv.cuLinkDestroy(state)


def driver_version() -> int:
    """The CUDA version of the installed driver (``cuDriverGetVersion``: 13000 for 13.0).

    Raises:
        CudaUnsupported: no CUDA driver.
    """
    drv = driver()
    v = ctypes.c_int()
    drv.check("cuDriverGetVersion", drv.cuDriverGetVersion(ctypes.byref(v)))
    return int(v.value)


def device_by_uuid(uuid: str) -> CudaDevice | None:
    """The process's `CudaDevice` of the GPU whose UUID is ``uuid`` (`CudaDevice.uuid`), its
    primary context made current; None if no CUDA device has it (another machine, a GPU
    hidden by ``CUDA_VISIBLE_DEVICES``).

    Raises:
        CudaUnsupported: no CUDA driver, or a driver call fails.
    """
    drv = driver()
    count = ctypes.c_int()
    drv.check("cuDeviceGetCount", drv.cuDeviceGetCount(ctypes.byref(count)))
    for o in range(count.value):
        dev = ctypes.c_int()
        drv.check("cuDeviceGet", drv.cuDeviceGet(ctypes.byref(dev), o))
        if _uuid(drv, dev.value) == uuid:
            return _device(o)
    return None


def _device(ordinal: int) -> CudaDevice:
    """The process's `CudaDevice` for ``ordinal`` (made once)."""
    with _LOCK:
        if ordinal not in _DEVICES:
            _DEVICES[ordinal] = CudaDevice(ordinal)
        return _DEVICES[ordinal]


# ----------------------------------------------------------------------------- PTX preload
# A first start that loads the compiler's PTX (`GpuProgram.ptx`) spends 1-2 s in the driver's
# JIT, and NVIDIA's OpenCL takes 1.3-2.0 s to open the device with its caches cold. Neither
# needs the other: `preload_ptx` starts the JIT on a thread while OpenCL opens, and the
# executor that later loads the same text on the same device takes the module made
# (`_take_preloaded`), or waits for the one in flight.
_PRELOADED: dict[tuple[int, str], ctypes.c_void_p | None] = {}
_PRELOADING: dict[tuple[int, str], threading.Event] = {}


def _ptx_key(ordinal: int, text: str) -> tuple[int, str]:
    return ordinal, hashlib.sha1(text.encode("latin-1"), usedforsecurity=False).hexdigest()


def preload_ptx(texts: list[str], ordinal: int = 0) -> threading.Thread:
    """Start loading each PTX text (as `ptx_for_cuda` makes it) on CUDA device ``ordinal``,
    in a daemon thread. Failures are only logged: the executor then loads (and reports) it
    itself."""
    # Each text's event is held here: the executor that takes a module drops its key from
    # `_PRELOADING` (`_take_preloaded`), possibly before this thread is done with the others.
    keys: list[tuple[tuple[int, str], str, threading.Event]] = []
    with _LOCK:
        for t in texts:
            key = _ptx_key(ordinal, ptx_for_cuda(t))
            if key not in _PRELOADING:
                _PRELOADING[key] = event = threading.Event()
                keys.append((key, t, event))

    def work() -> None:
        try:
            device = _device(ordinal)
            drv = driver()
            device.make_current()
            for key, t, event in keys:
                module = ctypes.c_void_p()
                text = ptx_for_cuda(t).encode("latin-1") + b"\0"
                err = drv.cuModuleLoadData(ctypes.byref(module), text)
                with _LOCK:
                    _PRELOADED[key] = module if err == 0 else None
                event.set()
        except Exception as exc:  # noqa: BLE001 - a preload is an optimisation only
            log.debug("PTX preload stopped: %s: %s", type(exc).__name__, exc)
        finally:
            for _, _, event in keys:
                event.set()

    thread = threading.Thread(target=work, daemon=True, name="litekiln-ptx-preload")
    thread.start()
    return thread


def _take_preloaded(ordinal: int, text: str) -> ctypes.c_void_p | None:
    """The module `preload_ptx` made of ``text`` on ``ordinal`` (waiting for it if it is
    being made), handed over once; None if there is none."""
    key = _ptx_key(ordinal, text)
    event = _PRELOADING.get(key)
    if event is None:
        return None
    event.wait()
    with _LOCK:
        _PRELOADING.pop(key, None)
        return _PRELOADED.pop(key, None)


# NVIDIA's OpenCL computes get_group_id(d) as %envreg<d> + %ctaid.<d>: the environment
# registers 0-2 hold the work-group offset of the launch (the global work offset divided by the
# local size), which is zero for every launch litekiln makes (it passes no global offset).
# CUDA leaves those registers undefined, so the offsets are written as the constant 0; any
# other environment register is OpenCL-only state and makes check_ptx refuse the program.
_GROUP_OFFSET = re.compile(r"mov\.b32\s+(%r\d+),\s*%envreg[012];")


def ptx_for_cuda(ptx: str) -> str:
    """``ptx`` with NVIDIA OpenCL's work-group offset registers replaced by 0 (see above)."""
    return _GROUP_OFFSET.sub(r"mov.b32 \1, 0;", ptx)


_ENTRY = re.compile(r"\.entry\s+([A-Za-z_$][\w$]*)\s*\(([^)]*)\)", re.S)
_PARAM = re.compile(r"\.param\s+\.(\w+)")


def ptx_entries(ptx: str) -> dict[str, list[str]]:
    """Kernel name -> the PTX type of each parameter (``u64``, ``u32``, ...)."""
    return {m.group(1): _PARAM.findall(m.group(2)) for m in _ENTRY.finditer(ptx)}


def check_ptx(ptx: str, program: GpuProgram, launches: list[Launch]) -> None:
    """Refuse PTX that a CUDA launch would not run as the OpenCL launch does.

    Raises:
        CudaUnsupported: not PTX, a kernel is missing, reads OpenCL-only driver state, or its
            parameters do not match the launch's arguments.
    """
    if ".entry" not in ptx or ".target" not in ptx:
        raise CudaUnsupported("the device binary is not PTX")
    if "%envreg" in ptx:
        raise CudaUnsupported(
            "the PTX reads OpenCL driver environment registers (%envreg) "
            "other than the work-group offsets"
        )
    entries = ptx_entries(ptx)
    specs = {t.id: t for t in program.tensors}
    for launch in launches:
        params = entries.get(launch.kernel)
        if params is None:
            raise CudaUnsupported(f"kernel {launch.kernel} not found in the PTX")
        if len(params) != len(launch.args):
            raise CudaUnsupported(
                f"kernel {launch.kernel}: {len(params)} PTX parameters "
                f"for {len(launch.args)} arguments"
            )
        for j, (ptype, arg) in enumerate(zip(params, launch.args, strict=True)):
            want = 8 if isinstance(arg, BufferArg) else ctypes.sizeof(_CTYPES[arg.ctype])
            if _PTX_SIZES.get(ptype) != want:
                what = (
                    f"buffer {specs[arg.tensor].name or arg.tensor}"
                    if isinstance(arg, BufferArg)
                    else arg.ctype
                )
                raise CudaUnsupported(
                    f"kernel {launch.kernel} parameter {j}: PTX .{ptype} for {what}"
                )
        if len(launch.local_size) > 3 or len(launch.global_size) != len(launch.local_size):
            raise CudaUnsupported(f"kernel {launch.kernel}: {len(launch.global_size)}-d launch")
        if any(g % max(1, n) for g, n in zip(launch.global_size, launch.local_size, strict=True)):
            raise CudaUnsupported(
                f"kernel {launch.kernel}: global size not a multiple of the local size"
            )


@dataclass(frozen=True)
class Branch:
    """Consecutive launches of one PrimFunc call, placed on a capture stream.

    Attributes:
        start: First launch (index into the plan).
        stop: One past the last launch.
        stream: Capture stream index (0: the stream the graph is captured on).
        waits: Earlier branches on other streams that must finish first.
    """

    start: int
    stop: int
    stream: int
    waits: tuple[int, ...]


def branch_plan(program: GpuProgram, launches: list[Launch], streams: int) -> list[Branch]:
    """Which launches may run concurrently in the graph, and on which stream to capture them.

    A *call* is a run of consecutive launches of one PrimFunc (``Launch.func``); its launches
    stay in order. What a call writes: the tensors it is the first to touch, other than the
    partition's inputs and constants (every PrimFunc call writes fresh tensors; a view first
    touched by its reader counts as written, which only adds ordering). What it reads: the
    other tensors it touches. Call B follows call A when their byte ranges in a storage
    overlap and one of them writes: read-after-write, and also write-after-read and
    write-after-write, because the memory plan reuses storage. Calls go on the stream of the
    latest call they follow when that call is still its tail, else on a free stream (or the
    least recently used one); every other call they follow becomes a wait. With
    ``streams == 1`` this is the launch order on one stream.
    """
    specs = {t.id: t for t in program.tensors}
    fixed = set(program.inputs) | set(program.constants)
    calls: list[tuple[int, int]] = []
    for i, launch in enumerate(launches):
        if calls and launches[calls[-1][0]].func == launch.func and launch.func:
            calls[-1] = (calls[-1][0], i + 1)
        else:
            calls.append((i, i + 1))
    touched: set[int] = set()
    ranges: list[tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]] = []
    for start, stop in calls:
        writes, reads = [], []
        for launch in launches[start:stop]:
            for arg in launch.args:
                if not isinstance(arg, BufferArg):
                    continue
                t = specs[arg.tensor]
                span = (t.storage, t.offset, t.offset + max(t.nbytes, 1))
                if arg.tensor in fixed or arg.tensor in touched:
                    reads.append(span)
                else:
                    writes.append(span)
            touched.update(a.tensor for a in launch.args if isinstance(a, BufferArg))
        # A tensor this call both first touches and reads again stays a write.
        ranges.append((writes, [r for r in reads if r not in writes]))

    plan: list[Branch] = []
    tail: list[int] = []  # per stream: its last call
    before: list[set[int]] = []  # per call: every call that has finished when it starts
    # storage -> (call, lo, hi, whether the call writes that range)
    by_storage: dict[int, list[tuple[int, int, int, bool]]] = {}
    for g, ((start, stop), (w, r)) in enumerate(zip(calls, ranges, strict=True)):
        found: set[int] = set()
        for spans, is_write in ((w, True), (r, False)):
            for storage, lo, hi in spans:
                for h, lo2, hi2, other_writes in by_storage.get(storage, ()):
                    if (is_write or other_writes) and lo < hi2 and lo2 < hi:
                        found.add(h)
        for spans, is_write in ((w, True), (r, False)):
            for storage, lo, hi in spans:
                by_storage.setdefault(storage, []).append((g, lo, hi, is_write))
        deps = sorted(found)
        on = [k for k, last in enumerate(tail) if last in deps]
        if on:
            k = max(on, key=lambda k: tail[k])
        elif len(tail) < streams:
            k = len(tail)
            tail.append(-1)
        else:
            k = min(range(len(tail)), key=lambda k: tail[k])
        prev = tail[k]
        tail[k] = g
        # Wait only for what stream order and the other waits do not already imply.
        covered = {prev, *before[prev]} if prev >= 0 else set()
        waits = []
        for h in reversed(deps):
            if h not in covered:
                waits.append(h)
                covered |= {h, *before[h]}
        before.append(covered)
        plan.append(Branch(start, stop, k, tuple(sorted(waits))))
    return plan


class CudaGraphExecutor(PartitionIO):
    """Runs a `GpuProgram`'s PTX through one CUDA graph per inference.

    The same interface as `litekiln.runtime.executor.PartitionExecutor` for what a session
    needs (set_input, run, get_output, finish, profile, launch_names, num_launches). Inputs
    are staged in pinned host memory; the graph copies them in, runs every kernel and copies
    the outputs to pinned host memory, so one inference is one ``cuGraphLaunch`` and one
    ``cuStreamSynchronize``. Device memory of the application's can replace an input or an
    output (`bind_input`, `bind_output`): the kernels then read or write it and the graph
    has no copy for it.

    Attributes:
        program: The program being run.
        choices: The tuning choice per variant (from the OpenCL path's tuning).
        binary: The PTX.
    """

    def __init__(
        self,
        program: GpuProgram,
        constants: Mapping[str, np.ndarray],
        ptx: bytes,
        device: CudaDevice,
        choices: list[int] | None = None,
        streams: int = 1,
        *,
        cubin: bytes | None = None,
        link: bool = False,
    ) -> None:
        """Load the PTX, allocate the arena, upload constants and capture the graph.

        Args:
            program: The program.
            constants: Constant name -> array.
            ptx: The PTX NVIDIA's OpenCL built from the program's source.
            device: The CUDA device (`cuda_device_for`).
            choices: Tuning choice per variant (default: the default schedules).
            streams: Most capture streams, so that independent calls run concurrently
                (`branch_plan`); 1 captures the launch order on one stream.
            cubin: the device code `link_cubin` made of this PTX on this GPU before: loaded
                instead of the PTX, so the driver compiles nothing (the PTX is still checked).
            link: without ``cubin``, link the PTX into one (`link_cubin`) and load that, so
                that what runs is what `cubin` then holds; a link that fails loads the PTX.

        Raises:
            CudaUnsupported: the PTX or the launches cannot be run through CUDA (see
                `check_ptx`), or a CUDA call fails.
        """
        program.validate()
        self.program = program
        self.binary = ptx
        #: The cubin loaded (None: the PTX was, the driver compiling it).
        self.cubin: bytes | None = None
        self.device = device
        self.choices = list(choices) if choices else [0] * len(program.variants)
        #: The OpenCL path's tuning times that made ``choices``, where known (reports).
        self.tuning_ms: list[list[float]] = []
        self._launches = program.plan(self.choices)
        self._tensor_specs: dict[int, TensorSpec] = {t.id: t for t in program.tensors}
        self._streams = max(1, int(streams))
        self.branches = 1
        text = self._checked_ptx(ptx)
        self._drv = driver()
        # (the two calls of every inference, looked up once)
        self._graph_launch = self._drv.cuGraphLaunch
        self._synchronize = self._drv.cuStreamSynchronize
        device.make_current()
        self._res = self._track_resources()
        self._load_module(text, cubin, link)
        self._ptr = self._allocate_arena()
        self._upload_constants(constants)
        self._in_stage, self._out_stage = self._stage_io()
        self._functions: dict[str, ctypes.c_void_p] = {}
        # Application memory bound to inputs and outputs (`bind_input`, `bind_output`).
        self._bound_in: set[int] = set()
        self._bound_out: set[int] = set()  # written in place
        self._copy_out: dict[int, int] = {}  # output -> address it is copied to on the device
        self._forward: dict[int, int] = {}  # output -> address it is also copied to (carries)
        self._stale = False  # bindings changed: capture again before the next replay
        self._calls = [self._prepare(launch) for launch in self._launches]
        self._capture()
        self._pending = False
        # Surface launch failures (resources, illegal addresses) now, not at the first run,
        # and never wait forever on a kernel that would not finish here.
        self.run()
        self._wait_at_most(_LOAD_CHECK_SECONDS)

    # ------------------------------------------------------------------ set-up helpers
    def _checked_ptx(self, ptx: bytes) -> str:
        """The PTX text CUDA is to load (`ptx_for_cuda`), refused unless `check_ptx` passes."""
        text = ptx_for_cuda(ptx.rstrip(b"\0").decode("latin-1"))
        check_ptx(text, self.program, self._launches)
        return text

    def _track_resources(self) -> dict[str, Any]:
        """The driver objects this executor will own, empty for now; its finalizer frees
        whatever they hold, so a set-up that fails half-way leaks nothing."""
        res: dict[str, Any] = {
            "module": None,
            "arena": None,
            "host": None,
            "graph": None,
            "exec": None,
            "events": [],
        }
        weakref.finalize(self, _release, self._drv, self.device, res)
        return res

    def _load_module(self, text: str, cubin: bytes | None, link: bool) -> None:
        if cubin is not None:  # (stored: a failure is the caller's to handle)
            self._load_cubin(cubin)
            return
        if link:
            try:
                self._load_cubin(link_cubin(self.device, text))
                return
            except CudaUnsupported as exc:
                log.info("PTX loaded as it is (no cubin: %s)", exc)
        module = _take_preloaded(self.device.ordinal, text)
        if module is None:
            module = ctypes.c_void_p()
            self._drv.check(
                "cuModuleLoadData (PTX)",
                self._drv.cuModuleLoadData(ctypes.byref(module), text.encode("latin-1") + b"\0"),
            )
        self._res["module"] = module

    def _load_cubin(self, cubin: bytes) -> None:
        image = ctypes.c_void_p()
        self._drv.check(
            "cuModuleLoadData (cubin)", self._drv.cuModuleLoadData(ctypes.byref(image), cubin)
        )
        self._res["module"] = image
        self.cubin = cubin

    def _allocate_arena(self) -> dict[int, int]:
        """One device allocation for every storage; returns tensor id -> device address."""
        offsets: dict[int, int] = {}
        total = 0
        for s in self.program.storages:
            offsets[s.id] = total
            total += _slot_bytes(s.nbytes)
        arena = ctypes.c_uint64()
        self._drv.check("cuMemAlloc", self._drv.cuMemAlloc(ctypes.byref(arena), max(total, _ALIGN)))
        self._res["arena"] = arena
        #: storage id -> its address in the arena (where an unbound storage goes back to)
        self._own_address = {sid: arena.value + off for sid, off in offsets.items()}
        return {t.id: arena.value + offsets[t.storage] + t.offset for t in self.program.tensors}

    def _upload_constants(self, constants: Mapping[str, np.ndarray]) -> None:
        drv = self._drv
        for tid, arr in constant_arrays(
            self.program, constants, self._tensor_specs, CudaUnsupported
        ):
            if arr.nbytes:
                drv.check(
                    "cuMemcpyHtoD", drv.cuMemcpyHtoD(self._ptr[tid], arr.ctypes.data, arr.nbytes)
                )

    def _stage_io(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Pinned host staging for the graph's copies: (input arrays, output arrays), each
        array aligned in one pinned block."""
        drv, program = self._drv, self.program
        io = [self._tensor_specs[t] for t in (*program.inputs, *program.outputs)]
        host_off, pos = [], 0
        for spec in io:
            host_off.append(pos)
            pos += _slot_bytes(spec.nbytes)
        host = ctypes.c_void_p()
        drv.check("cuMemHostAlloc", drv.cuMemHostAlloc(ctypes.byref(host), max(pos, _ALIGN), 0))
        if not host.value:
            raise CudaUnsupported("cuMemHostAlloc returned no memory")
        # The pinned block lives as long as the last array viewing it (`output_buffers` hands
        # them out), not just as long as the executor: its own finalizer frees it.
        block = (ctypes.c_uint8 * max(pos, _ALIGN)).from_address(host.value)
        weakref.finalize(block, _free_host, drv, self.device, host)
        whole = np.ctypeslib.as_array(block)
        staging = [
            whole[off : off + spec.nbytes].view(spec.dtype).reshape(spec.shape)
            for spec, off in zip(io, host_off, strict=True)
        ]
        n_in = len(program.inputs)
        return staging[:n_in], staging[n_in:]

    def _function(self, name: str) -> ctypes.c_void_p:
        fn = self._functions.get(name)
        if fn is None:
            fn = ctypes.c_void_p()
            self._drv.check(
                f"cuModuleGetFunction({name})",
                self._drv.cuModuleGetFunction(ctypes.byref(fn), self._res["module"], name.encode()),
            )
            self._functions[name] = fn
        return fn

    def _prepare(self, launch: Launch) -> tuple[Any, ...]:
        values: list[Any] = []
        for arg in launch.args:
            if isinstance(arg, BufferArg):
                values.append(ctypes.c_uint64(self._ptr[arg.tensor]))
            elif arg.ctype == "half":
                values.append(ctypes.c_uint16(int(np.float16(arg.value).view(np.uint16))))
            else:
                values.append(
                    _CTYPES[arg.ctype](np.array(arg.value, dtype=SCALAR_TYPES[arg.ctype]).item())
                )
        params = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
        block = [*launch.local_size, 1, 1, 1][:3]
        grid = [g // max(1, n) for g, n in zip(launch.global_size, launch.local_size, strict=True)]
        grid = [*grid, 1, 1, 1][:3]
        return (self._function(launch.kernel), grid, block, params, values)

    def _branches(self) -> tuple[list[Branch], list[ctypes.c_void_p], list[ctypes.c_void_p]]:
        """The branch plan, its side streams and the events it needs, all made before the
        capture starts (nothing but stream work happens while capturing)."""
        drv = self._drv
        plan = branch_plan(self.program, self._launches, self._streams)
        used = 1 + max((b.stream for b in plan), default=0)
        side = self.device.side_streams(used - 1)
        events: list[ctypes.c_void_p] = self._res["events"]
        need = 0 if used == 1 else 1 + len(plan) + len(side)  # fork, one per call, joins
        while len(events) < need:
            events.append(_new_event(drv, _EVENT_DISABLE_TIMING))
        self.branches = used
        return plan, side, events[:need]

    def _enqueue_kernels(
        self,
        stream0: ctypes.c_void_p,
        plan: list[Branch],
        side: list[ctypes.c_void_p],
        events: list[ctypes.c_void_p],
    ) -> None:
        """Capture every launch: on one stream, or branches on several (`branch_plan`)."""
        drv = self._drv
        streams = [stream0, *side]
        if side:  # fork: the side streams join the capture after the input copies
            fork, events = events[0], events[1:]
            drv.check("cuEventRecord", drv.cuEventRecord(fork, stream0))
            for st in side:
                drv.check("cuStreamWaitEvent", drv.cuStreamWaitEvent(st, fork, 0))
        for g, b in enumerate(plan):
            st = streams[b.stream]
            for h in b.waits:
                drv.check("cuStreamWaitEvent", drv.cuStreamWaitEvent(st, events[h], 0))
            for fn, grid, block, params, _ in self._calls[b.start : b.stop]:
                drv.check(
                    "cuLaunchKernel", drv.cuLaunchKernel(fn, *grid, *block, 0, st, params, None)
                )
            if side:
                drv.check("cuEventRecord", drv.cuEventRecord(events[g], st))
        # join: the output copies follow all
        for st, ev in zip(side, events[len(plan) :], strict=True):
            drv.check("cuEventRecord", drv.cuEventRecord(ev, st))
            drv.check("cuStreamWaitEvent", drv.cuStreamWaitEvent(stream0, ev, 0))

    def _capture(self) -> None:
        drv, stream = self._drv, self.device.stream
        plan, side, events = self._branches()
        drv.check("cuStreamBeginCapture", drv.cuStreamBeginCapture(stream, 1))
        try:
            # A bound input is read where the application keeps it: no copy.
            for i, (tid, stage) in enumerate(zip(self.program.inputs, self._in_stage, strict=True)):
                if stage.nbytes and i not in self._bound_in:
                    drv.check(
                        "cuMemcpyHtoDAsync",
                        drv.cuMemcpyHtoDAsync(
                            self._ptr[tid], stage.ctypes.data, stage.nbytes, stream
                        ),
                    )
            self._enqueue_kernels(stream, plan, side, events)
            # A bound output is written in place by its kernel, or copied on the device.
            for i, (tid, stage) in enumerate(
                zip(self.program.outputs, self._out_stage, strict=True)
            ):
                if not stage.nbytes or i in self._bound_out:
                    continue
                if i in self._copy_out:
                    drv.check(
                        "cuMemcpyDtoDAsync",
                        drv.cuMemcpyDtoDAsync(
                            self._copy_out[i], self._ptr[tid], stage.nbytes, stream
                        ),
                    )
                else:
                    drv.check(
                        "cuMemcpyDtoHAsync",
                        drv.cuMemcpyDtoHAsync(
                            stage.ctypes.data, self._ptr[tid], stage.nbytes, stream
                        ),
                    )
            for i, dest in self._forward.items():  # outputs fed back (a carried state)
                spec = self.output_spec(i)
                if spec.nbytes:
                    drv.check(
                        "cuMemcpyDtoDAsync",
                        drv.cuMemcpyDtoDAsync(
                            dest, self._ptr[self.program.outputs[i]], spec.nbytes, stream
                        ),
                    )
        finally:
            graph = ctypes.c_void_p()
            err = drv.cuStreamEndCapture(stream, ctypes.byref(graph))
        drv.check("cuStreamEndCapture", err)
        self._res["graph"] = graph
        exe = ctypes.c_void_p()
        drv.check(
            "cuGraphInstantiateWithFlags",
            drv.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, 0),
        )
        self._res["exec"] = exe
        self._exec = exe

    # ------------------------------------------------------------------ interface
    @property
    def num_launches(self) -> int:
        """Kernel launches per `run` (all inside one graph)."""
        return len(self._launches)

    def launch_names(self) -> list[str]:
        """Name of each launch, in launch order: its PrimFunc's, else its kernel's."""
        return [la.func or la.kernel for la in self._launches]

    def set_input(self, i: int, array: np.ndarray, *, blocking: bool = True) -> None:
        """Stage ``array`` as input ``i`` (copied to the device by the next `run`), converted
        to the input's dtype; the staging array itself (`input_buffers`) is not copied.

        Raises:
            ValueError: Shape mismatch.
        """
        stage = self._in_stage[i]
        if i in self._bound_in:
            spec = self.input_spec(i)
            raise ValueError(f"input {i} ({spec.name}) is bound to device memory (bind_input)")
        if array is stage:  # written in place by the caller
            return
        arr = np.asarray(array)
        if arr.shape != stage.shape:
            spec = self.input_spec(i)
            raise ValueError(f"input {i} ({spec.name}): shape {arr.shape}, expected {spec.shape}")
        if self._pending:
            self.finish()  # the staging buffer may still be read by the previous run
        np.copyto(stage, arr, casting="unsafe")

    def input_buffers(self) -> list[np.ndarray]:
        """The pinned host arrays the graph copies the inputs from, one per input.

        `set_input(i, input_buffers()[i])` copies nothing: a caller that writes an input's
        value there (between runs: the graph reads it while one runs) saves a host copy.
        """
        return list(self._in_stage)

    def run(self, *, wait: bool = False) -> None:
        """Launch the graph (input copies, kernels, output copies)."""
        if self._stale:
            self._recapture()
        self.device.make_current()
        err = self._graph_launch(self._exec, self.device.stream)
        if err:
            self._drv.check("cuGraphLaunch", err)
        self._pending = True
        if wait:
            self.finish()

    def _wait_at_most(self, seconds: float) -> None:
        import time

        deadline = time.monotonic() + seconds
        while True:
            err = self._drv.cuStreamQuery(self.device.stream)
            if err != _NOT_READY:
                self._drv.check("graph replay", err)
                self._pending = False
                return
            if time.monotonic() > deadline:
                raise CudaUnsupported(f"the graph did not finish within {seconds:g} s")
            time.sleep(0.0005)

    def finish(self) -> None:
        """Wait until the last `run` is done."""
        self.device.make_current()
        err = self._synchronize(self.device.stream)
        if err:
            self._drv.check("cuStreamSynchronize", err)
        self._pending = False

    def get_output(self, i: int, out: np.ndarray | None = None) -> np.ndarray:
        """Output ``i`` of the last `run` (waits for it).

        Raises:
            ValueError: ``out`` has the wrong shape, dtype or layout.
        """
        if self._pending:
            self.finish()
        stage = self._out_stage[i]
        if i in self._bound_out or i in self._copy_out:  # the graph left it on the device
            copy_to_host(self.device, self._ptr[self.program.outputs[i]], stage)
        if out is None:
            return stage.copy()
        if out is stage:  # the caller reads the staging buffer itself (`output_buffers`)
            return out
        spec = self.output_spec(i)
        if (
            out.shape != spec.shape
            or out.dtype != np.dtype(spec.dtype)
            or not out.flags.c_contiguous
        ):
            raise ValueError(
                f"output {i} ({spec.name}): out must be C-contiguous {spec.dtype}{list(spec.shape)}"
            )
        np.copyto(out, stage)
        return out

    def output_buffers(self) -> list[np.ndarray]:
        """The pinned host arrays the graph copies the outputs into, one per output.

        Every `run` overwrites them; `get_output(i, out=output_buffers()[i])` only waits for
        the run to finish. For a caller that would copy each output into an array of its own
        on every inference anyway (the session): one host copy fewer.
        """
        return list(self._out_stage)

    def forward_output(self, i: int, address: int) -> None:
        """Also copy output ``i`` to device memory at ``address`` after the kernels, in the
        graph (a node, no call of its own per run): a carried state's next value. Captured
        again before the next run."""
        self._forward[i] = address
        self._stale = True

    def drop_forwards(self) -> None:
        """Forget every `forward_output`."""
        if self._forward:
            self._forward.clear()
            self._stale = True

    def output_buffer(self, i: int) -> int:
        """The device address output ``i`` is written to (valid after `run`; overwritten by
        the next run): its bound memory, or its place in the graph's arena."""
        return self._ptr[self.program.outputs[i]]

    # ------------------------------------------------------------------ bound device memory
    #: What `bind_input` and `bind_output` take: CUDA device addresses.
    memory_kind = "cuda"

    def bind_input(self, i: int, address: int, nbytes: int) -> None:
        """Make input ``i`` read device memory at ``address`` directly.

        The kernel arguments of every tensor on the input's storage (the input and its
        reshaped views) point there, and the graph loses that input's host-to-device copy. The
        graph is captured again before the next run (milliseconds: bind once, then write new
        values into the same memory for each inference).

        Args:
            i: Input index.
            address: Device address in this executor's context (the primary context).
            nbytes: Bytes there (at least the input's size).

        Raises:
            ValueError: ``nbytes`` is smaller than the input.
        """
        spec = self.input_spec(i)
        if nbytes < spec.nbytes:
            raise ValueError(f"input {i} ({spec.name}): {nbytes} bytes, need {spec.nbytes}")
        self._place_storage(spec.storage, address)
        self._bound_in.add(i)
        self._stale = True

    def bind_output(self, i: int, address: int, nbytes: int) -> bool:
        """Make output ``i`` end up in device memory at ``address``, with no host copy.

        Written in place when the memory plan gives the output a storage of its own
        (`PartitionIO.output_in_place`): its kernel arguments point at ``address``. Otherwise
        the graph copies it there on the device after the kernels. Captured again before the
        next run.

        Returns:
            True when written in place, False when copied on the device.

        Raises:
            ValueError: ``nbytes`` is smaller than the output.
        """
        spec = self.output_spec(i)
        if nbytes < spec.nbytes:
            raise ValueError(f"output {i} ({spec.name}): {nbytes} bytes, need {spec.nbytes}")
        self.unbind_output(i)
        in_place = self.output_in_place(i, nbytes)
        if in_place:
            self._place_storage(spec.storage, address)
            self._bound_out.add(i)
        else:
            self._copy_out[i] = address
        self._stale = True
        return in_place

    def unbind_input(self, i: int) -> None:
        """Input ``i`` back to the executor's own memory, copied from the host by each run."""
        if i in self._bound_in:
            self._place_storage(self.input_spec(i).storage, None)
            self._bound_in.discard(i)
            self._stale = True

    def unbind_output(self, i: int) -> None:
        """Output ``i`` back to the executor's own memory, copied to the host by each run."""
        if i in self._bound_out:
            self._place_storage(self.output_spec(i).storage, None)
            self._bound_out.discard(i)
            self._stale = True
        if self._copy_out.pop(i, None) is not None:
            self._stale = True

    def _place_storage(self, storage: int, address: int | None) -> None:
        """Every tensor of ``storage`` at ``address`` (None: back in the arena)."""
        base = self._own_address[storage] if address is None else address
        for t in self.program.tensors:
            if t.storage == storage:
                self._ptr[t.id] = base + t.offset

    def _recapture(self) -> None:
        """Capture the graph again with the current pointers (after a binding changed)."""
        drv = self._drv
        self.finish()
        if self._res.get("exec") is not None:
            drv.cuGraphExecDestroy(self._res["exec"])
            self._res["exec"] = None
        if self._res.get("graph") is not None:
            drv.cuGraphDestroy(self._res["graph"])
            self._res["graph"] = None
        self._calls = [self._prepare(launch) for launch in self._launches]
        self._capture()
        self._stale = False

    def profile(self) -> list[float]:
        """Each launch's device time (CUDA events around each kernel, launched one by one).

        Returns:
            Seconds per launch, in launch order.
        """
        if self._stale:
            self._recapture()
        drv, stream = self._drv, self.device.stream
        self.finish()  # (makes the context current)
        events = [_new_event(drv) for _ in range(len(self._calls) + 1)]
        try:
            drv.cuEventRecord(events[0], stream)
            for k, (fn, grid, block, params, _) in enumerate(self._calls):
                drv.check(
                    "cuLaunchKernel", drv.cuLaunchKernel(fn, *grid, *block, 0, stream, params, None)
                )
                drv.cuEventRecord(events[k + 1], stream)
            drv.check("cuEventSynchronize", drv.cuEventSynchronize(events[-1]))
            out = []
            ms = ctypes.c_float()
            for a, b in itertools.pairwise(events):
                drv.cuEventElapsedTime(ctypes.byref(ms), a, b)
                out.append(ms.value * 1e-3)
            return out
        finally:
            for ev in events:
                drv.cuEventDestroy(ev)

    def graph_time(self, reps: int = 20) -> float:
        """Median device time of one whole graph replay (CUDA events), in seconds."""
        if self._stale:
            self._recapture()
        drv, stream = self._drv, self.device.stream
        self.finish()  # (makes the context current)
        a, b = _new_event(drv), _new_event(drv)
        try:
            times = []
            ms = ctypes.c_float()
            for _ in range(reps):
                drv.cuEventRecord(a, stream)
                drv.cuGraphLaunch(self._exec, stream)
                drv.cuEventRecord(b, stream)
                drv.check("cuEventSynchronize", drv.cuEventSynchronize(b))
                drv.cuEventElapsedTime(ctypes.byref(ms), a, b)
                times.append(ms.value * 1e-3)
            return float(np.median(times))
        finally:
            drv.cuEventDestroy(a)
            drv.cuEventDestroy(b)


def copy_to_host(device: CudaDevice, address: int, out: np.ndarray) -> None:
    """Copy ``out.nbytes`` bytes at device ``address`` into ``out`` (C-contiguous), on the
    device's stream, and wait for it."""
    if not out.nbytes:
        return
    drv = driver()
    device.make_current()
    drv.check(
        "cuMemcpyDtoHAsync",
        drv.cuMemcpyDtoHAsync(out.ctypes.data, address, out.nbytes, device.stream),
    )
    drv.check("cuStreamSynchronize", drv.cuStreamSynchronize(device.stream))


def copy_from_host(device: CudaDevice, address: int, array: np.ndarray) -> None:
    """Copy ``array`` (C-contiguous) to device ``address``, on the device's stream, and wait."""
    if not array.nbytes:
        return
    drv = driver()
    device.make_current()
    drv.check(
        "cuMemcpyHtoDAsync",
        drv.cuMemcpyHtoDAsync(address, array.ctypes.data, array.nbytes, device.stream),
    )
    drv.check("cuStreamSynchronize", drv.cuStreamSynchronize(device.stream))


def copy_on_device(device: CudaDevice, dst: int, src: int, nbytes: int) -> None:
    """Enqueue a copy of ``nbytes`` bytes from device ``src`` to ``dst`` on the device's
    stream (after the graphs launched there; not waited for)."""
    if not nbytes:
        return
    drv = driver()
    device.make_current()
    drv.check("cuMemcpyDtoDAsync", drv.cuMemcpyDtoDAsync(dst, src, nbytes, device.stream))


class DeviceAllocation:
    """``nbytes`` of device memory (cuMemAlloc: 256-byte aligned, like the graphs' arenas),
    freed when the object goes."""

    def __init__(self, device: CudaDevice, nbytes: int) -> None:
        drv = driver()
        device.make_current()
        ptr = ctypes.c_uint64()
        drv.check("cuMemAlloc", drv.cuMemAlloc(ctypes.byref(ptr), max(nbytes, _ALIGN)))
        self.address = int(ptr.value)
        self.nbytes = nbytes
        weakref.finalize(self, _free_device, drv, device, self.address)


def _free_device(drv: _Driver, device: CudaDevice, address: int) -> None:
    """Free a `DeviceAllocation` (its finalizer), after the work queued on the stream."""
    try:
        device.make_current()
        drv.cuStreamSynchronize(device.stream)
        drv.cuMemFree(address)
    except Exception:  # noqa: BLE001 - at interpreter exit the driver may already be gone
        pass


def _free_host(drv: _Driver, device: CudaDevice, host: ctypes.c_void_p) -> None:
    """Free a pinned staging block (the finalizer of the ctypes array over it)."""
    try:
        device.make_current()
        drv.cuStreamSynchronize(device.stream)  # (a graph may still be copying into it)
        drv.cuMemFreeHost(host)
    except Exception:  # noqa: BLE001 - at interpreter exit the driver may already be gone
        pass


def _release(drv: _Driver, device: CudaDevice, res: dict[str, Any]) -> None:
    """Free what an executor holds (its finalizer; tolerant of a half-built executor)."""
    try:
        device.make_current()
        drv.cuStreamSynchronize(device.stream)
        if res.get("exec") is not None:
            drv.cuGraphExecDestroy(res["exec"])
        if res.get("graph") is not None:
            drv.cuGraphDestroy(res["graph"])
        if res.get("arena") is not None:
            drv.cuMemFree(res["arena"])
        if res.get("module") is not None:
            drv.cuModuleUnload(res["module"])
        for ev in res.get("events", []):
            drv.cuEventDestroy(ev)
    except Exception:  # noqa: BLE001 - at interpreter exit the driver may already be gone
        pass
