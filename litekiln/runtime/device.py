"""Choosing the OpenCL device (no TVM)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

from litekiln.errors import DeviceError

_INSTALL_HINT = (
    "litekiln runs kernels through OpenCL and found no OpenCL device. Install a driver: your "
    "GPU vendor's OpenCL ICD, or for a CPU device PoCL (Debian/Ubuntu: "
    "`sudo apt-get install pocl-opencl-icd`), then check with `clinfo -l`. "
    "device='reference' runs the numpy reference without OpenCL."
)


@dataclass
class DeviceHandle:
    """A chosen device with its context and in-order queue."""

    context: object
    queue: object
    device: object

    @property
    def description(self) -> str:
        d = self.device
        return f"{d.name.strip()} ({d.platform.name.strip()}, OpenCL)"  # type: ignore[attr-defined]

    def identity(self) -> dict[str, str]:
        """What a device-binary cache key needs: vendor, name, version and driver."""
        d = self.device
        return {
            "platform": d.platform.name.strip(),  # type: ignore[attr-defined]
            "platform_version": d.platform.version.strip(),  # type: ignore[attr-defined]
            "vendor": d.vendor.strip(),  # type: ignore[attr-defined]
            "name": d.name.strip(),  # type: ignore[attr-defined]
            "version": d.version.strip(),  # type: ignore[attr-defined]
            "driver": d.driver_version.strip(),  # type: ignore[attr-defined]
        }


def list_devices() -> list[tuple[int, int, object]]:
    """All OpenCL devices as (platform index, device index, device)."""
    try:
        import pyopencl as cl
    except ImportError as exc:  # pragma: no cover - pyopencl is a hard dependency
        raise DeviceError(f"pyopencl is not installed ({exc}); pip install pyopencl") from None
    out = []
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
        A handle with context and in-order queue.

    Raises:
        DeviceError: no device, or none matches the choice.
    """
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
        listing = "; ".join(f"{p}:{i} {d.name.strip()} ({d.platform.name.strip()})" for p, i, d in devices)
        raise DeviceError(
            f"no OpenCL device matches {choice!r}. Available: {listing}. Choose with "
            "device='P:D', a name substring, 'gpu', 'cpu' or 'opencl' (or LITEKILN_DEVICE)."
        )
    ctx = cl.Context([pick])
    queue = cl.CommandQueue(ctx, pick)
    return DeviceHandle(ctx, queue, pick)


_HALF_PROBE = """#pragma OPENCL EXTENSION cl_khr_fp16 : enable
__kernel void litekiln_half_probe(__global half* x) { x[0] = x[0] * (half)2.0f; }"""


def supports_half(handle: DeviceHandle) -> bool:
    """Whether the device builds half-precision kernels.

    Checked by building a one-line half kernel, not by the extension list: NVIDIA's OpenCL
    builds half arithmetic without listing cl_khr_fp16, PoCL lists nothing and fails.
    """
    import pyopencl as cl

    if "cl_khr_fp16" in handle.device.extensions:  # type: ignore[attr-defined]
        return True
    with _quiet_stderr():  # a failing probe is expected; PoCL's compiler prints to fd 2
        try:
            cl.Program(handle.context, _HALF_PROBE).build()
        except cl.Error:
            return False
    return True


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (drivers' compilers write there directly, not via Python)."""
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 (embedded interpreters): nothing to silence
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
