"""Choosing the OpenCL device (no TVM), and the CUDA start that skips OpenCL on a known GPU.

A *CUDA start* (`CudaStart`): on NVIDIA, once a session has verified its partitions' CUDA
graphs against OpenCL (`litekiln.runtime.session`), it records what it learnt about the GPU
its device choice opened (`known_gpu`: the OpenCL profile, the CUDA device's UUID, the
driver's versions, the OpenCL vendor set-up). A later start with the same choice that finds
that record, and the same GPU and drivers behind it, opens the GPU through the CUDA driver
alone: no pyopencl import, no OpenCL context. Its partitions then load their verified
programs as CUDA graphs; OpenCL opens only if something asks for it (`CudaStart.opencl`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from litekiln.errors import DeviceError
from litekiln.runtime import early
from litekiln.runtime.profile import DeviceProfile

log = logging.getLogger("litekiln")

#: Device choices a CUDA start is recorded for: those that name the first GPU. (Indices and
#: name substrings are left to OpenCL: they depend on its platform order.)
KNOWN_CHOICES = ("", "gpu")

_INSTALL_HINT = (
    "litekiln runs kernels through OpenCL and found no OpenCL device. Install a driver: your "
    "GPU vendor's OpenCL ICD, or for a CPU device PoCL (Debian/Ubuntu: "
    "`sudo apt-get install pocl-opencl-icd`), then check with `clinfo -l`. "
    "device='reference' runs the numpy reference without OpenCL."
)


@dataclass
class DeviceHandle:
    """A chosen device with its context, in-order queue and profile."""

    context: Any
    queue: Any
    device: Any
    #: Every vendor question about the device (read once, when the device is opened).
    profile: DeviceProfile
    #: The device choice that opened it (`select_device`).
    choice: str = ""

    @property
    def description(self) -> str:
        """The device, in words."""
        return self.profile.description


class CudaStartMiss(RuntimeError):
    """A CUDA start cannot go on (message says why): the caller opens OpenCL instead."""


@dataclass
class CudaStart:
    """A GPU opened through CUDA alone, from what an earlier start recorded (module docstring).

    Attributes:
        choice: the device choice.
        profile: the OpenCL device's profile, as recorded.
        cuda: the CUDA device (`litekiln.runtime.cuda.CudaDevice`), its context current.
    """

    choice: str
    profile: DeviceProfile
    cuda: Any

    @property
    def description(self) -> str:
        """The device, in words."""
        return self.profile.description

    def opencl(self) -> DeviceHandle:
        """The same device opened through OpenCL (now, if not yet in this process).

        Raises:
            DeviceError: as `select_device`.
        """
        return select_device(self.choice)


def opencl_setup() -> str:
    """A digest of the OpenCL vendor set-up (the ICD loader's variables and the vendor files
    it reads): a record made under another set-up may name another first GPU."""
    h = hashlib.sha256()
    for var in ("OCL_ICD_VENDORS", "OCL_ICD_FILENAMES"):
        h.update(f"{var}={os.environ.get(var, '')}\n".encode())
    where = os.environ.get("OCL_ICD_VENDORS") or "/etc/OpenCL/vendors"
    try:
        names = sorted(os.listdir(where)) if os.path.isdir(where) else [where]
        for name in names:
            path = os.path.join(where, name) if os.path.isdir(where) else name
            if path.endswith(".icd") and os.path.isfile(path):
                with open(path, "rb") as f:
                    h.update(name.encode() + b"=" + f.read().strip() + b"\n")
    except OSError:
        h.update(b"unreadable")
    return h.hexdigest()[:16]


def nvidia_kernel_driver() -> str:
    """The NVIDIA kernel module's version ("580.159.04"), or "" where it cannot be read."""
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8", errors="replace") as f:
            m = re.search(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)?)\s", f.readline())
    except OSError:
        return ""
    return m.group(1) if m else ""


def known_gpu(handle: DeviceHandle, cuda_device: Any) -> dict[str, Any]:
    """The record of a GPU that ``handle`` opened and that is ``cuda_device`` in CUDA, for a
    later `CudaStart` (asks the half probe, if not asked yet: call it off the hot path)."""
    from litekiln.runtime.cuda import driver_version

    return {
        "choice": handle.choice,
        "profile": handle.profile.as_record(),
        "cuda_uuid": cuda_device.uuid,
        "cuda_driver": driver_version(),
        "kernel_driver": nvidia_kernel_driver(),
        "opencl_setup": opencl_setup(),
    }


def cuda_start(choice: str, record: Mapping[str, Any]) -> CudaStart:
    """Open the GPU ``record`` (`known_gpu`) describes through CUDA alone.

    Raises:
        CudaStartMiss: the record does not hold here (another GPU or driver, another OpenCL
            set-up, CUDA unavailable), or is not a record.
    """
    from litekiln.runtime.cuda import CudaUnsupported, device_by_uuid, driver_version

    try:
        if record["choice"] != choice:
            raise CudaStartMiss(f"recorded for device choice {record['choice']!r}")
        if record["opencl_setup"] != opencl_setup():
            raise CudaStartMiss("the OpenCL vendor set-up changed")
        kernel = nvidia_kernel_driver()
        if kernel and record["kernel_driver"] and kernel != record["kernel_driver"]:
            raise CudaStartMiss(f"driver {record['kernel_driver']} was recorded, {kernel} runs")
        profile = DeviceProfile.from_record(record["profile"])
        cuda_version = driver_version()
        if cuda_version != record["cuda_driver"]:
            recorded = record["cuda_driver"]
            raise CudaStartMiss(f"CUDA driver {recorded} was recorded, {cuda_version} runs")
        device = device_by_uuid(str(record["cuda_uuid"]))
    except CudaUnsupported as exc:
        raise CudaStartMiss(str(exc)) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise CudaStartMiss(f"unreadable record ({type(exc).__name__}: {exc})") from None
    if device is None:
        raise CudaStartMiss(f"no CUDA device has the recorded GPU's UUID {record['cuda_uuid']}")
    return CudaStart(choice, profile, device)


def list_devices() -> list[tuple[int, int, Any]]:
    """All OpenCL devices as (platform index, device index, device)."""
    try:
        import pyopencl as cl
    except ImportError as exc:  # pragma: no cover - pyopencl is a hard dependency
        raise DeviceError(f"pyopencl is not installed ({exc}); pip install pyopencl") from None
    out: list[tuple[int, int, Any]] = []  # (platform, device, pyopencl device)
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        return []  # "platform not found": no ICD installed
    for pi, p in enumerate(platforms):
        try:
            devices = p.get_devices()
        except cl.Error:
            continue
        for di, d in enumerate(devices):
            out.append((pi, di, d))
    return out


def select_device(choice: str | None = None) -> DeviceHandle:
    """Open the device named by ``choice``.

    Args:
        choice: None/"" (first GPU, else first device), "gpu", "cpu", "opencl" (first device),
            "P:D" platform/device indices, or a case-insensitive substring of the device or
            platform name.

    Returns:
        A handle with context and in-order queue; the same one for the same choice within a
        process.

    Raises:
        DeviceError: no device, or none matches the choice.
    """
    key = (choice or "").strip()
    with _OPEN_LOCK:
        handle = _OPEN.get(key)
        if handle is None:
            handle = _OPEN[key] = _select_device(key)
        return handle


# One context and queue per device choice and process, shared by every Interpreter: a context
# costs ~100 ms on NVIDIA, and kernels of several models can share one in-order queue.
_OPEN: dict[str, DeviceHandle] = {}
_OPEN_LOCK = threading.Lock()


def _select_device(choice: str) -> DeviceHandle:
    import pyopencl as cl

    devices = list_devices()
    if not devices:
        raise DeviceError(_INSTALL_HINT)
    pick = None
    c = (choice or "").strip()
    if c in ("", "gpu", "opencl", "cpu"):
        want = {"": cl.device_type.GPU, "gpu": cl.device_type.GPU, "cpu": cl.device_type.CPU}.get(c)
        typed = [d for _, _, d in devices if want is not None and d.type & want]
        if typed:
            pick = typed[0]
        elif c in ("", "opencl"):
            pick = devices[0][2]
    elif ":" in c and all(x.isdigit() for x in c.split(":", 1)):
        pi, di = (int(x) for x in c.split(":", 1))
        pick = next((d for p_, d_, d in devices if (p_, d_) == (pi, di)), None)
    else:
        low = c.lower()
        pick = next(
            (d for _, _, d in devices if low in d.name.lower() or low in d.platform.name.lower()),
            None,
        )
    if pick is None:
        listing = "; ".join(
            f"{p}:{i} {d.name.strip()} ({d.platform.name.strip()})" for p, i, d in devices
        )
        raise DeviceError(
            f"no OpenCL device matches {choice!r}. Available: {listing}. Choose with "
            "device='P:D', a name substring, 'gpu', 'cpu' or 'opencl' (or LITEKILN_DEVICE)."
        )
    ctx = _create_context(pick)
    queue = cl.CommandQueue(ctx, pick)
    return DeviceHandle(ctx, queue, pick, DeviceProfile.of(pick, ctx), c)


class DeviceOpener:
    """Opens a device in a background thread, so that the driver's start-up (NVIDIA: ~100 ms
    to load and initialise, ~100 ms per context) overlaps the caller's own work (parsing the
    model, reading the cache). The two slow calls go through ctypes, which releases the GIL;
    pyopencl holds it for the duration of its calls, which would stall the caller instead.

    Given a record of the GPU the choice opened before (``known``, `known_gpu`), it tries a
    `CudaStart` first, and opens OpenCL only if that does not hold.

    Args:
        choice: as for :func:`select_device`.
        known: the record of an earlier start with this choice, or a function that reads it
            (called on the opener's thread: None where there is none), or None.
    """

    def __init__(
        self,
        choice: str | None = None,
        known: Mapping[str, Any] | Callable[[], Mapping[str, Any] | None] | None = None,
    ) -> None:
        #: The device choice being opened.
        self.choice = (choice or "").strip()
        self._known = known if self.choice in KNOWN_CHOICES else None
        self._known_read = threading.Event()
        self._handle: DeviceHandle | CudaStart | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._open, args=(choice,), daemon=True, name="litekiln-device-open"
        )
        self._thread.start()

    @property
    def known(self) -> Mapping[str, Any] | None:
        """The record a CUDA start is tried from (None: OpenCL only); waits for it to be read."""
        self._known_read.wait()
        return self._known  # type: ignore[return-value]  # (read: never the function now)

    def _open(self, choice: str | None) -> None:
        if callable(self._known):
            # The CUDA driver starts while the record is read (a CUDA start's longest wait).
            early.start_cuda(check=False)
            try:
                self._known = self._known()
            except Exception:  # noqa: BLE001 - a hint only: the usual start goes on
                self._known = None
        self._known_read.set()
        record = self.known
        if record is not None:
            try:
                self._handle = cuda_start(self.choice, record)
                return
            except CudaStartMiss as exc:
                log.info("no CUDA start (%s): opening the device through OpenCL", exc)
        try:
            _driver_init()
            self._handle = select_device(choice)
        except BaseException as exc:  # re-raised in the caller's thread by result()
            self._error = exc

    def opening(self) -> bool:
        """Whether the device is still being opened."""
        return self._thread.is_alive()

    def result(self) -> DeviceHandle | CudaStart:
        """Wait for the device (a `CudaStart` only where ``known`` was given).

        Raises:
            DeviceError: as :func:`select_device`.
        """
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._handle is not None
        return self._handle


def _opencl_loader() -> Any:
    """The OpenCL ICD loader that pyopencl itself loaded (ctypes handle), or None.

    The same library, not just any libOpenCL: the loader initialises its vendors once per
    library instance, so a call through it warms pyopencl's later calls too.
    """
    global _LOADER
    if _LOADER is not False:
        return _LOADER
    _LOADER = None
    try:
        import ctypes

        import pyopencl  # noqa: F401  (loads the library we look for)

        with open("/proc/self/maps") as maps:
            paths = {ln.split()[-1] for ln in maps if "libOpenCL" in ln and "/" in ln}
        if len(paths) == 1:
            lib = ctypes.CDLL(paths.pop())
            vp, u32 = ctypes.c_void_p, ctypes.c_uint32
            lib.clGetPlatformIDs.argtypes = [u32, vp, vp]
            lib.clGetPlatformIDs.restype = ctypes.c_int32
            lib.clCreateContext.argtypes = [vp, u32, vp, vp, vp, vp]
            lib.clCreateContext.restype = vp
            _LOADER = lib
    except (OSError, AttributeError):  # not Linux, or an unusual pyopencl build
        _LOADER = None
    return _LOADER


_LOADER: Any = False  # not looked up yet


def _driver_init() -> None:
    """Load and initialise the OpenCL drivers without holding the GIL (see DeviceOpener)."""
    import ctypes

    lib = _opencl_loader()
    if lib is not None:
        n = ctypes.c_uint32(0)
        lib.clGetPlatformIDs(0, None, ctypes.byref(n))


def _create_context(device: Any) -> Any:
    """A context on ``device``; created through ctypes (GIL released) where possible."""
    import ctypes

    import pyopencl as cl

    lib = _opencl_loader()
    if lib is not None:
        err = ctypes.c_int32(0)
        dev = ctypes.c_void_p(device.int_ptr)
        ptr = lib.clCreateContext(None, 1, ctypes.byref(dev), None, None, ctypes.byref(err))
        if err.value == 0 and ptr:
            return cl.Context.from_int_ptr(ptr, retain=False)
    return cl.Context([device])  # pyopencl raises a proper error if this fails too
