"""The CUDA driver started early, in a background thread (no numpy, no pyopencl, no TVM).

An NVIDIA start spends ~200 ms in the driver (cuInit, the GPU's primary context) and about as
long importing numpy and the runtime. `start_cuda` runs the first in a daemon thread through
ctypes (which releases the GIL), so the two overlap: `litekiln.interpreter` calls it before
its own imports (`LITEKILN_EARLY_CUDA`), and the device opening calls it again (a no-op the
second time). What it starts is process-wide: the CUDA start or the CUDA graph upgrade that
follows finds cuInit done and the primary context made, and waits on the driver's own lock
if they are still under way.
"""

from __future__ import annotations

import os
import threading

from litekiln import config

_started = False
_lock = threading.Lock()


def wanted() -> bool:
    """Whether an early start can help: an NVIDIA driver is installed, the device choice is
    the first GPU (or left open) and the CUDA graph path is not switched off."""
    try:
        if not config.EARLY_CUDA.get():
            return False
        device = config.DEVICE.get().strip().lower()
        graph = config.CUDA_GRAPH.get()
    except ValueError:  # a malformed setting: the device opening reports it, not an import
        return False
    return device in ("", "gpu") and graph != "off" and os.path.exists("/dev/nvidiactl")


def start_cuda(*, check: bool = True) -> bool:
    """Start `_cuda_init` in a daemon thread, once per process.

    Args:
        check: Start only where `wanted` says so (False: wherever libcuda may be; the
            device opening's call, made once it knows a CUDA start is asked for).

    Returns:
        Whether a thread was started by this call.
    """
    global _started
    if check and not wanted():
        return False
    with _lock:
        if _started:
            return False
        _started = True
    threading.Thread(target=_cuda_init, daemon=True, name="litekiln-cuda-init").start()
    return True


def _cuda_init() -> None:
    """Load and initialise the CUDA driver, and on a one-GPU machine retain that GPU's
    primary context (which GPU a record means on a machine of several is for `cuda_start`
    to say). Where there is no libcuda this does nothing."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
        if lib.cuInit(0) != 0:
            return
        n, dev, ctx = ctypes.c_int(), ctypes.c_int(), ctypes.c_void_p()
        if lib.cuDeviceGetCount(ctypes.byref(n)) != 0 or n.value != 1:
            return
        if lib.cuDeviceGet(ctypes.byref(dev), 0) == 0:
            lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    except (OSError, AttributeError):
        return
