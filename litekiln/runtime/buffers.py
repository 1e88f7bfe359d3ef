"""An application's device buffers, bound to a model's inputs and outputs (zero-copy I/O).

NO TVM IMPORT here. An app that keeps its data on the GPU (camera frames decoded there, the
output of another network) hands litekiln the buffer instead of a numpy array, and the
session reads the input from it and writes the output into it, with no copy through the host.
Two kinds of buffer are taken:

* OpenCL memory in the session's own context: a ``pyopencl.Buffer`` (only its size can be
  checked: the app promises the layout, C-contiguous elements of the tensor's dtype) or a
  ``pyopencl.array.Array`` (its shape, dtype and layout are checked too);
* on NVIDIA GPUs, CUDA memory given through DLPack (``__dlpack__`` / ``__dlpack_device__``: a
  torch or cupy tensor), which the CUDA graph path (`litekiln.runtime.cuda`) reads and writes.

This module checks what it is given against what the tensor needs, and names what was wrong
and what was expected (`InputError` for a buffer that does not fit the tensor, `DeviceError`
for one on another device or context). It also reads a bound buffer into host memory and
writes host values into it, for the tensors that the CPU must see (an op left on the CPU, an
8-bit tensor (de)quantized on the CPU): the session decides when (`Session.bind`).

DLPack is read with ctypes from the capsule's ``DLTensor`` (dlpack.h, ABI v0.x, the
unversioned ``"dltensor"`` capsule every producer still returns by default); the capsule is
dropped after reading, which returns the producer's bookkeeping, and the object itself is kept
so that its memory outlives the binding.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from litekiln.errors import DeviceError, InputError

# --------------------------------------------------------------------------- DLPack


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


#: DLDeviceType values (dlpack.h) and how error messages name them.
DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_CUDA_MANAGED = 1, 2, 3, 13
_DL_DEVICES = {
    1: "CPU (host memory)",
    2: "CUDA",
    3: "CUDA pinned host memory",
    4: "OpenCL",
    7: "Vulkan",
    8: "Metal",
    9: "VPI",
    10: "ROCm",
    11: "ROCm pinned host memory",
    12: "ext_dev",
    13: "CUDA managed memory",
    14: "oneAPI",
    15: "WebGPU",
    16: "Hexagon",
}
#: DLDataTypeCode -> numpy kind letter (kDLInt, kDLUInt, kDLFloat, kDLBool); other codes
#: (opaque handles, bfloat, complex, fp8 ...) name no numpy dtype litekiln tensors have.
_DL_KINDS = {0: "i", 1: "u", 2: "f", 6: "b"}
#: Alignment of bound CUDA memory: the graph's own arena places every storage at a multiple of
#: 256 bytes (cudaMalloc's), and the kernels may use vector loads that rely on it.
CUDA_ALIGN = 256
_DL_CODE_NAMES = {
    0: "int",
    1: "uint",
    2: "float",
    3: "opaque",
    4: "bfloat",
    5: "complex",
    6: "bool",
}


@dataclass(frozen=True)
class DLPackTensor:
    """What a DLPack capsule says of a tensor.

    Attributes:
        address: the first element's address (``data + byte_offset``).
        device_type: DLDeviceType (`DL_CUDA`, `DL_CPU`, ...).
        device_id: the device's ordinal within its type.
        shape: dimensions.
        strides: strides in elements, or None for a compact row-major tensor.
        dtype: the numpy dtype, or None for a type numpy has no name for.
        type_name: DLPack's name of the element type (``float32``, ``bfloat16``...).
    """

    address: int
    device_type: int
    device_id: int
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None
    dtype: np.dtype | None
    type_name: str

    @property
    def device_name(self) -> str:
        """The device, in words (``"CUDA device 0"``)."""
        kind = _DL_DEVICES.get(self.device_type, f"DLPack device type {self.device_type}")
        return f"{kind} device {self.device_id}"

    @property
    def c_contiguous(self) -> bool:
        """Whether the elements are row-major with no gaps (dimensions of size 1 aside)."""
        if self.strides is None:
            return True
        expect = 1
        for n, s in zip(reversed(self.shape), reversed(self.strides), strict=True):
            if n != 1 and s != expect:
                return False
            expect *= n
        return True


def _capsule_pointer(capsule: Any) -> int:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    valid = ctypes.pythonapi.PyCapsule_IsValid
    valid.restype = ctypes.c_int
    valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
    if not valid(capsule, b"dltensor"):
        raise InputError(
            "__dlpack__() returned no unconsumed 'dltensor' capsule (a versioned or used one); "
            "pass the tensor itself, not a capsule"
        )
    ptr = get(capsule, b"dltensor")
    if not ptr:
        raise InputError("__dlpack__() returned an empty capsule")
    return int(ptr)


def read_dlpack(obj: Any, stream: int | None = None) -> DLPackTensor:
    """Read an object's DLPack description (``obj.__dlpack__``), without taking its memory.

    Args:
        obj: an object with ``__dlpack__`` (torch, cupy, numpy, jax arrays...).
        stream: for device memory, the consumer's stream (a CUDA stream handle): the producer
            orders its pending work on the tensor before that stream (DLPack's contract);
            None for host memory (numpy refuses any other value).

    Returns:
        The tensor's address, device, shape, strides and dtype.

    Raises:
        InputError: no ``__dlpack__``, or it fails or returns something unreadable.
    """
    export = getattr(obj, "__dlpack__", None)
    if export is None:
        raise InputError(f"{type(obj).__name__} has no __dlpack__ method")
    try:
        capsule = export() if stream is None else export(stream=stream)
    except Exception as exc:  # noqa: BLE001 - the producer's own refusal, said as ours
        raise InputError(
            f"{type(obj).__name__}.__dlpack__() failed: {type(exc).__name__}: {exc}"
        ) from None
    t = _DLTensor.from_address(_capsule_pointer(capsule))
    ndim = int(t.ndim)
    shape = tuple(int(t.shape[k]) for k in range(ndim))
    strides = tuple(int(t.strides[k]) for k in range(ndim)) if t.strides else None
    code, bits, lanes = int(t.dtype.code), int(t.dtype.bits), int(t.dtype.lanes)
    name = f"{_DL_CODE_NAMES.get(code, f'code{code}')}{bits}" + (f"x{lanes}" if lanes != 1 else "")
    dtype = None
    if lanes == 1 and code in _DL_KINDS:
        kind = _DL_KINDS[code]
        if kind == "b":
            dtype = np.dtype(bool) if bits == 8 else None
            name = "bool" if bits == 8 else name
        else:
            try:
                dtype = np.dtype(f"{kind}{bits // 8}") if bits % 8 == 0 else None
            except TypeError:
                dtype = None
    address = int(t.data or 0) + int(t.byte_offset)
    info = DLPackTensor(
        address, int(t.device.device_type), int(t.device.device_id), shape, strides, dtype, name
    )
    del capsule  # (its destructor hands the producer its bookkeeping back; obj keeps the data)
    return info


# --------------------------------------------------------------------------- bound buffers


@dataclass(frozen=True)
class TensorSlot:
    """The tensor a buffer is bound to, as error messages name it.

    Attributes:
        role: ``"input"`` or ``"output"``.
        index: the graph tensor index.
        name: the tensor's name.
        shape: its shape.
        dtype: its dtype.
    """

    role: str
    index: int
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{self.role} {self.index} ({self.name!r}, {self.dtype.name}{list(self.shape)})"


class DeviceBuffer:
    """An application's buffer bound to one tensor.

    Attributes:
        kind: ``"opencl"`` or ``"cuda"``: which launch path can use it directly.
        slot: the tensor it is bound to.
        nbytes: the bytes the buffer holds (at least ``slot.nbytes``).
        owner: the object the application gave (kept alive with the binding).
        sync: whether `before_run` orders the producer's pending work (CUDA tensors); False
            when the application vouches for it.
    """

    kind: str
    slot: TensorSlot
    nbytes: int
    owner: Any
    sync: bool = True

    def describe(self) -> str:
        """The buffer, in words."""
        raise NotImplementedError

    def before_run(self) -> None:
        """Order the application's pending work on the buffer before the next inference."""

    def read(self) -> np.ndarray:
        """A host copy of the tensor's bytes (blocking)."""
        raise NotImplementedError

    def write(self, array: np.ndarray) -> None:
        """Copy a host value of the tensor into the buffer (done when this returns)."""
        raise NotImplementedError

    def copy_from(self, source: Any) -> None:
        """Enqueue a device copy of the tensor's bytes from ``source`` into this buffer, after
        the work already queued (`write` and `read` wait for it). ``source``: memory of the
        same kind, as an executor's ``output_buffer`` gives it (a ``pyopencl.Buffer``, or a
        CUDA device address)."""
        raise NotImplementedError


class OpenCLBuffer(DeviceBuffer):
    """A ``pyopencl.Buffer`` (or a ``pyopencl.array.Array``'s memory) in the session's context.

    Attributes:
        buffer: the ``pyopencl.Buffer`` the kernels take (a sub-buffer for an array at an
            offset).
        queue: the session's in-order queue (host copies go there, after its kernels).
    """

    kind = "opencl"

    def __init__(self, slot: TensorSlot, buffer: Any, queue: Any, owner: Any) -> None:
        self.slot = slot
        self.buffer = buffer
        self.queue = queue
        self.owner = owner
        self.nbytes = int(buffer.size)

    def describe(self) -> str:
        return f"pyopencl {type(self.owner).__name__} of {self.nbytes} bytes"

    def read(self) -> np.ndarray:
        import pyopencl as cl

        out = np.empty(self.slot.shape, self.slot.dtype)
        if out.nbytes:
            cl.enqueue_copy(self.queue, out, self.buffer, is_blocking=True)
        return out

    def write(self, array: np.ndarray) -> None:
        import pyopencl as cl

        arr = np.require(array, self.slot.dtype, "C")
        if arr.nbytes:
            cl.enqueue_copy(self.queue, self.buffer, arr, is_blocking=True)

    def copy_from(self, source: Any) -> None:
        import pyopencl as cl

        if self.slot.nbytes:
            cl.enqueue_copy(self.queue, self.buffer, source, byte_count=self.slot.nbytes)


class CudaBuffer(DeviceBuffer):
    """CUDA device memory given through DLPack.

    Attributes:
        address: the first element's device address.
        device: the `litekiln.runtime.cuda.CudaDevice` it lives on (the session's GPU).
    """

    kind = "cuda"

    def __init__(self, slot: TensorSlot, tensor: DLPackTensor, device: Any, owner: Any) -> None:
        self.slot = slot
        self.address = tensor.address
        self.device = device
        self.owner = owner
        self.nbytes = slot.nbytes
        self._export = owner.__dlpack__
        self._stream = int(device.stream.value)

    def describe(self) -> str:
        return f"CUDA memory of {type(self.owner).__name__} (device {self.device.ordinal})"

    def before_run(self) -> None:
        # DLPack's synchronisation: exporting for our stream makes the producer (torch, cupy)
        # order its pending work on the tensor before that stream; the capsule is dropped.
        self._export(stream=self._stream)

    def read(self) -> np.ndarray:
        from litekiln.runtime.cuda import copy_to_host

        out = np.empty(self.slot.shape, self.slot.dtype)
        copy_to_host(self.device, self.address, out)
        return out

    def write(self, array: np.ndarray) -> None:
        from litekiln.runtime.cuda import copy_from_host

        copy_from_host(self.device, self.address, np.require(array, self.slot.dtype, "C"))

    def copy_from(self, source: Any) -> None:
        from litekiln.runtime.cuda import copy_on_device

        copy_on_device(self.device, self.address, int(source), self.slot.nbytes)


class CudaMemory(CudaBuffer):
    """CUDA memory litekiln allocates itself (a carried state's buffer), freed with it."""

    def __init__(self, slot: TensorSlot, device: Any) -> None:
        from litekiln.runtime.cuda import DeviceAllocation

        self.slot = slot
        self.device = device
        self.owner = DeviceAllocation(device, slot.nbytes)
        self.address = self.owner.address
        self.nbytes = slot.nbytes
        self.sync = False  # nobody else writes it: nothing to order

    def describe(self) -> str:
        return f"litekiln's CUDA memory of {self.nbytes} bytes (device {self.device.ordinal})"

    def before_run(self) -> None:
        pass


def state_buffer(
    kind: str, slot: TensorSlot, *, context: Any, queue: Any, cuda_device: Callable[[], Any]
) -> DeviceBuffer:
    """A zeroed buffer of litekiln's own for one tensor, in ``kind`` memory (``"opencl"``: in
    the session's context; ``"cuda"``: on the session's CUDA device)."""
    buf: DeviceBuffer
    if kind == "cuda":
        buf = CudaMemory(slot, cuda_device())
    else:
        import pyopencl as cl

        mem = cl.Buffer(context, cl.mem_flags.READ_WRITE, max(slot.nbytes, 4))
        buf = OpenCLBuffer(slot, mem, queue, mem)
    buf.write(np.zeros(slot.shape, slot.dtype))
    return buf


_ACCEPTED = (
    "a pyopencl.Buffer or pyopencl.array.Array in the interpreter's context "
    "(Interpreter.get_device().context), or on NVIDIA GPUs a CUDA tensor through DLPack "
    "(torch, cupy)"
)


def device_buffer(
    obj: Any,
    slot: TensorSlot,
    *,
    context: Any,
    queue: Any,
    cuda_device: Callable[[], Any],
    sync: bool = True,
) -> DeviceBuffer:
    """Check an application's buffer against the tensor it is to be bound to.

    Args:
        obj: a ``pyopencl.Buffer``, a ``pyopencl.array.Array``, or an object with
            ``__dlpack__`` and ``__dlpack_device__`` in CUDA memory.
        slot: the tensor.
        context: the session's OpenCL context.
        queue: the session's in-order queue.
        cuda_device: returns the session's `CudaDevice` (called for CUDA memory only);
            raises `DeviceError` where there is none.
        sync: for CUDA memory, order the producer's pending work before each run
            (`DeviceBuffer.sync`).

    Returns:
        The bound buffer.

    Raises:
        InputError: the buffer's shape, dtype, size or layout does not fit the tensor, or it
            is not a kind of buffer litekiln binds (host memory included).
        DeviceError: the buffer lives in another OpenCL context or on another device.
    """
    if _is_pyopencl_array(obj):
        return _opencl_array(obj, slot, context, queue)
    if _is_pyopencl_buffer(obj):
        _check_context(obj, slot, context)
        if obj.size < slot.nbytes:
            raise InputError(
                f"{slot}: the pyopencl.Buffer holds {obj.size} bytes, expected at least "
                f"{slot.nbytes} ({slot.dtype.name}{list(slot.shape)})"
            )
        return OpenCLBuffer(slot, obj, queue, obj)
    if hasattr(obj, "__dlpack_device__") and hasattr(obj, "__dlpack__"):
        buf = _cuda_tensor(obj, slot, cuda_device)
        buf.sync = sync
        return buf
    if isinstance(obj, np.ndarray):
        raise InputError(
            f"{slot}: a numpy array is host memory: give it to set_tensor(); binding takes "
            f"device memory: {_ACCEPTED}"
        )
    raise InputError(
        f"{slot}: cannot bind a {type(obj).__module__}.{type(obj).__name__}: expected {_ACCEPTED}"
    )


def _is_pyopencl_buffer(obj: Any) -> bool:
    try:
        import pyopencl as cl
    except ImportError:  # pragma: no cover - pyopencl is a hard dependency
        return False
    return isinstance(obj, cl.Buffer)


def _is_pyopencl_array(obj: Any) -> bool:
    mod = type(obj).__module__ or ""
    return mod.startswith("pyopencl.array") and hasattr(obj, "base_data")


def _check_context(buffer: Any, slot: TensorSlot, context: Any) -> None:
    theirs = buffer.context
    if theirs.int_ptr != context.int_ptr:

        def devices(ctx: Any) -> str:
            return ", ".join(d.name.strip() for d in ctx.devices)

        raise DeviceError(
            f"{slot}: the buffer belongs to another OpenCL context (on {devices(theirs)}); "
            f"the model runs in its own context on {devices(context)}: allocate the buffer "
            "with Interpreter.get_device().context (or .queue)"
        )


def _opencl_array(obj: Any, slot: TensorSlot, context: Any, queue: Any) -> OpenCLBuffer:
    if obj.base_data is None:
        raise InputError(f"{slot}: the pyopencl array has no memory (size 0 or freed)")
    _check_context(obj.base_data, slot, context)
    _check_typed(
        slot, type(obj).__name__, tuple(obj.shape), np.dtype(obj.dtype), obj.flags.c_contiguous
    )
    buffer = obj.base_data
    if obj.offset:
        try:
            buffer = buffer.get_sub_region(obj.offset, slot.nbytes)
        except Exception as exc:  # noqa: BLE001 - the driver's alignment rule, said as ours
            raise InputError(
                f"{slot}: the pyopencl array starts at byte offset {obj.offset} of its buffer, "
                f"which the device cannot make a sub-buffer of ({exc}); bind an array that "
                "starts its buffer"
            ) from None
    return OpenCLBuffer(slot, buffer, queue, obj)


def _check_typed(
    slot: TensorSlot,
    what: str,
    shape: tuple[int, ...],
    dtype: np.dtype | None,
    contiguous: bool,
    type_name: str = "",
) -> None:
    """Refuse a typed buffer whose dtype, shape or layout is not the tensor's."""
    if dtype != slot.dtype:
        got = dtype.name if dtype is not None else type_name
        raise InputError(f"{slot}: the {what} has dtype {got}, expected {slot.dtype.name}")
    if shape != slot.shape:
        raise InputError(
            f"{slot}: the {what} has shape {list(shape)}, expected {list(slot.shape)} "
            "(resize_tensor_input() changes the model's)"
        )
    if not contiguous:
        raise InputError(
            f"{slot}: the {what} is not C-contiguous; bind a contiguous one (.contiguous())"
        )


def _cuda_tensor(obj: Any, slot: TensorSlot, cuda_device: Callable[[], Any]) -> CudaBuffer:
    try:
        device_type, device_id = (int(v) for v in obj.__dlpack_device__())
    except Exception as exc:  # noqa: BLE001 - the producer's own failure, said as ours
        raise InputError(f"{slot}: __dlpack_device__() failed: {exc}") from None
    kind = _DL_DEVICES.get(device_type, f"DLPack device type {device_type}")
    if device_type not in (DL_CUDA, DL_CUDA_MANAGED):
        hint = (
            "host memory goes through set_tensor()"
            if device_type in (DL_CPU, DL_CUDA_HOST, 11)
            else "litekiln binds CUDA memory (NVIDIA GPUs) and OpenCL buffers"
        )
        raise InputError(
            f"{slot}: the {type(obj).__name__} lives in {kind} (DLPack device {device_type}), "
            f"expected CUDA device memory (DLPack device {DL_CUDA}); {hint}"
        )
    device = cuda_device()
    if device_id != device.ordinal:
        raise DeviceError(
            f"{slot}: the {type(obj).__name__} is on CUDA device {device_id}, the model runs "
            f"on CUDA device {device.ordinal} ({device.name}): allocate it there "
            f"(torch: device='cuda:{device.ordinal}')"
        )
    tensor = read_dlpack(obj, stream=int(device.stream.value))
    what = type(obj).__name__
    _check_typed(slot, what, tensor.shape, tensor.dtype, tensor.c_contiguous, tensor.type_name)
    if not tensor.address and slot.nbytes:
        raise InputError(f"{slot}: the {type(obj).__name__} has no memory (null data pointer)")
    if tensor.address % CUDA_ALIGN:
        raise InputError(
            f"{slot}: the {type(obj).__name__} starts at address {tensor.address:#x}, not a "
            f"multiple of {CUDA_ALIGN} bytes as the kernels' memory is (a view into a larger "
            "tensor?): bind a tensor that starts its own allocation (.clone())"
        )
    return CudaBuffer(slot, tensor, device, obj)
