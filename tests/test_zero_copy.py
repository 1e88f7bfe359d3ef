"""Zero-copy input and output: application device buffers bound to a model's tensors.

On PoCL: pyopencl buffers and arrays bound to inputs and outputs give what the numpy path
gives (and LiteRT), across invokes whose inputs change on the device; wrong buffers are
refused with messages that name what was wrong and what was expected; unbinding brings the
numpy path back; a split model (the input read by an op on the CPU, an output made by one)
still runs, through the host where it must. No GPU here: the CUDA side (DLPack tensors, the
CUDA graph reading and writing them) runs against the fake driver of test_cuda_graph.py and a
stand-in tensor whose DLPack capsule points at host memory; the H100 runs the real thing
(scripts/remote_gpu/zero_copy.py).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from test_cuda_graph import _PTX, FakeDriver, _axpb_program, _kernels, _ptx_like_nvidia
from tflite_builder import ModelBuilder

from litekiln.errors import DeviceError, InputError
from litekiln.runtime import buffers, cuda
from litekiln.runtime.buffers import TensorSlot, device_buffer, read_dlpack

SMOKE = Path(__file__).parent / "data" / "smoke.tflite"


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One cache for the module: each model compiles once, later interpreters load it."""
    d = tmp_path_factory.mktemp("zero_copy_cache")
    d.chmod(0o700)
    return str(d)


def _interpreter(model: Path | bytes, cache: str, **options):
    from litekiln.interpreter import Interpreter

    if isinstance(model, bytes):
        it = Interpreter(model_content=model, cache_dir=cache, **options)
    else:
        it = Interpreter(model_path=str(model), cache_dir=cache, **options)
    it.allocate_tensors()
    return it


def _numpy_path(it, inputs: list[np.ndarray]) -> list[np.ndarray]:
    return [np.array(y) for y in it.run(inputs)]


# --------------------------------------------------------------------------- OpenCL buffers


@pytest.mark.opencl
def test_bound_arrays_give_the_numpy_paths_results_as_inputs_change_on_the_device(model_cache):
    import pyopencl.array as cla

    from litekiln.check import litert_outputs, relative_error

    it = _interpreter(SMOKE, model_cache)
    (inp,), (out,) = it.get_input_details(), it.get_output_details()
    x = it.random_inputs(0)[0]
    want = _numpy_path(it, [x])
    assert relative_error(want, litert_outputs(str(SMOKE), [x])) <= 1e-4

    queue = it.get_device().queue
    x_dev = cla.to_device(queue, x)
    y_dev = cla.empty(queue, tuple(out["shape"]), out["dtype"])
    it.bind_input(inp["index"], x_dev)
    it.bind_output(out["index"], y_dev)
    bindings = it.get_bindings()
    assert bindings[inp["index"]]["zero_copy"] and bindings[out["index"]]["zero_copy"]
    assert bindings[inp["index"]]["direct"] == ["read by partition 0"]
    assert bindings[out["index"]]["direct"] == ["written by partition 0 in place"]

    it.invoke()
    np.testing.assert_array_equal(y_dev.get(), want[0])
    np.testing.assert_array_equal(it.get_tensor(out["index"]), want[0])  # read back
    np.testing.assert_array_equal(it.get_tensor(inp["index"]), x)

    # New values written on the device (a kernel on the interpreter's queue), no host copy.
    reference = _interpreter(SMOKE, model_cache)
    for k in range(3):
        x_dev *= -0.5  # (an elementwise kernel: the input changes on the device)
        it.invoke()
        want = _numpy_path(reference, [x_dev.get()])
        np.testing.assert_array_equal(y_dev.get(), want[0], err_msg=f"invoke {k}")
    assert relative_error([y_dev.get()], litert_outputs(str(SMOKE), [x_dev.get()])) <= 1e-4


@pytest.mark.opencl
def test_raw_buffers_then_unbinding_brings_the_numpy_path_back(model_cache):
    import pyopencl as cl

    it = _interpreter(SMOKE, model_cache)
    (inp,), (out,) = it.get_input_details(), it.get_output_details()
    x, x2 = it.random_inputs(0)[0], it.random_inputs(1)[0]
    want, want2 = _numpy_path(it, [x])[0], _numpy_path(it, [x2])[0]
    h = it.get_device()
    mf = cl.mem_flags
    x_buf = cl.Buffer(h.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
    y_buf = cl.Buffer(h.context, mf.READ_WRITE, size=want.nbytes + 64)  # larger is fine
    it.bind_input(inp["index"], x_buf)
    it.bind_output(out["index"], y_buf)
    with pytest.raises(InputError, match=r"bound to a device buffer \(bind_input\)"):
        it.set_tensor(inp["index"], x2)
    it.invoke()
    got = np.empty_like(want)
    cl.enqueue_copy(h.queue, got, y_buf)
    np.testing.assert_array_equal(got, want)

    it.unbind(out["index"])  # the output back on the host; the input stays bound
    assert list(it.get_bindings()) == [inp["index"]]
    it.invoke()
    np.testing.assert_array_equal(it.get_tensor(out["index"]), want)
    it.unbind()
    assert it.get_bindings() == {}
    with pytest.raises(InputError, match="inputs not set before invoke"):
        it.invoke()  # an unbound input must be set again
    it.set_tensor(inp["index"], x2)
    it.invoke()
    np.testing.assert_array_equal(it.get_tensor(out["index"]), want2)
    cl.enqueue_copy(h.queue, got, y_buf)
    np.testing.assert_array_equal(got, want)  # the unbound buffer is left alone


@pytest.mark.opencl
def test_buffers_that_do_not_fit_are_refused_with_what_was_expected(model_cache):
    import pyopencl as cl
    import pyopencl.array as cla

    it = _interpreter(SMOKE, model_cache)
    (inp,), (out,) = it.get_input_details(), it.get_output_details()
    i, o = inp["index"], out["index"]
    q = it.get_device().queue
    shape = tuple(inp["shape"])  # (1, 32, 32, 3)
    with pytest.raises(InputError, match=r"has shape \[1, 32, 3, 32\], expected \[1, 32, 32, 3\]"):
        it.bind_input(i, cla.empty(q, (1, 32, 3, 32), np.float32))
    with pytest.raises(InputError, match="has dtype float16, expected float32"):
        it.bind_input(i, cla.empty(q, shape, np.float16))
    with pytest.raises(InputError, match="not C-contiguous"):
        it.bind_input(i, cla.empty(q, (1, 3, 32, 32), np.float32).transpose((0, 2, 3, 1)))
    with pytest.raises(InputError, match=r"holds 100 bytes, expected at least 12288 \(float32"):
        it.bind_input(i, cl.Buffer(q.context, cl.mem_flags.READ_WRITE, 100))
    with pytest.raises(InputError, match=r"holds 39 bytes, expected at least 40"):
        it.bind_output(o, cl.Buffer(q.context, cl.mem_flags.READ_WRITE, 39))
    other = cl.Context([q.device])
    with pytest.raises(
        DeviceError, match=r"another OpenCL context .*Interpreter.get_device\(\).context"
    ):
        it.bind_input(i, cl.Buffer(other, cl.mem_flags.READ_WRITE, 12288))
    with pytest.raises(DeviceError, match="another OpenCL context"):
        it.bind_output(o, cla.empty(cl.CommandQueue(other), (1, 10), np.float32))
    with pytest.raises(InputError, match=r"lives in CPU \(host memory\).*set_tensor"):
        it.bind_input(i, np.zeros(shape, np.float32))
    with pytest.raises(InputError, match=r"cannot bind a builtins.list"):
        it.bind_input(i, [0.0])
    with pytest.raises(InputError, match=r"tensor 24 is not a graph input; .*\[\(0, "):
        it.bind_input(o, cla.empty(q, (1, 10), np.float32))
    with pytest.raises(InputError, match="is not a graph output"):
        it.bind_output(i, cla.empty(q, shape, np.float32))
    assert it.get_bindings() == {}  # nothing half-bound
    x = it.random_inputs(0)[0]
    np.testing.assert_array_equal(it.run([x])[0], _numpy_path(it, [x])[0])

    from litekiln.interpreter import Interpreter

    ref = Interpreter(model_path=str(SMOKE), device="reference")
    with pytest.raises(DeviceError, match="reference"):
        ref.bind_input(i, cla.empty(q, shape, np.float32))


_NONE = {"fused_activation_function": "NONE"}


def _split_model() -> bytes:
    """x -> FLOOR (op #0, CPU under the documented table) -> ADD with x (GPU: reads x itself)
    -> LOGISTIC (GPU) = output y; y -> ABS (CPU) -> MUL by 3 (GPU) = output z. The input is
    read by an op on the CPU first and by a partition; y is a partition's output that an op on
    the CPU reads too; z is the last partition's."""
    b = ModelBuilder()
    x = b.input("x", [1, 4, 4, 3])
    s = b.op("ADD", [b.op("FLOOR", [x]), x], options=_NONE)
    y = b.op("LOGISTIC", [s])
    z = b.op("MUL", [b.op("ABS", [y]), np.full([3], 3.0, np.float32)], options=_NONE)
    b.output(y, z)
    return b.build()


@pytest.mark.opencl
def test_a_split_model_reads_and_writes_bound_buffers_through_the_host_where_it_must(
    model_cache, tmp_path
):
    import pyopencl.array as cla

    from litekiln.check import litert_outputs, relative_error

    model = _split_model()
    it = _interpreter(model, model_cache, op_table="documented", min_partition_ops=1)
    steps = [k for k, _ in it._backend.compiled.steps]  # noqa: SLF001
    assert steps == ["cpu", "gpu", "cpu", "gpu"], steps
    (inp,) = it.get_input_details()
    outs = it.get_output_details()
    x = np.random.default_rng(3).uniform(-1, 1, [1, 4, 4, 3]).astype(np.float32)
    want = _numpy_path(it, [x])
    path = tmp_path / "split.tflite"
    path.write_bytes(model)
    assert relative_error(want, litert_outputs(str(path), [x])) <= 1e-4

    q = it.get_device().queue
    x_dev = cla.to_device(q, x)
    y_devs = [cla.empty(q, tuple(d["shape"]), d["dtype"]) for d in outs]
    it.bind_input(inp["index"], x_dev)
    for d, y_dev in zip(outs, y_devs, strict=True):
        it.bind_output(d["index"], y_dev)
    it.invoke()
    for got, w in zip(y_devs, want, strict=True):
        np.testing.assert_array_equal(got.get(), w)
    b = it.get_bindings()
    x_binding = b[inp["index"]]
    assert x_binding["direct"] == ["read by partition 0"]  # and through the host for op #0
    assert x_binding["host_copies"] == ["op #0 (FLOOR) runs on the CPU"]
    assert not x_binding["zero_copy"]
    # Each output is written on the device by its partition (y also read back for ABS).
    assert all(b[d["index"]]["zero_copy"] for d in outs), b
    x_dev *= 2
    it.invoke()
    want = _numpy_path(_interpreter(model, model_cache, op_table="documented",
                                    min_partition_ops=1), [x_dev.get()])  # fmt: skip
    for got, w in zip(y_devs, want, strict=True):
        np.testing.assert_array_equal(got.get(), w)


@pytest.mark.opencl
def test_an_output_made_on_the_cpu_is_written_to_its_buffer(model_cache):
    """z made by an op on the CPU (FLOOR last): bound, it is written from the host."""
    import pyopencl.array as cla

    b = ModelBuilder()
    x = b.input("x", [1, 4, 4, 3])
    z = b.op("FLOOR", [b.op("MUL", [x, np.full([3], 4.0, np.float32)], options=_NONE)])
    b.output(z)
    model = b.build()
    it = _interpreter(model, model_cache, op_table="documented", min_partition_ops=1)
    (inp,), (out,) = it.get_input_details(), it.get_output_details()
    x = np.random.default_rng(4).uniform(-1, 1, [1, 4, 4, 3]).astype(np.float32)
    (want,) = _numpy_path(it, [x])
    q = it.get_device().queue
    z_dev = cla.empty(q, want.shape, want.dtype)
    it.bind_output(out["index"], z_dev)
    it.set_tensor(inp["index"], x)
    it.invoke()
    np.testing.assert_array_equal(z_dev.get(), want)
    assert it.get_bindings()[out["index"]]["host_copies"] == ["made by an op on the CPU"]


@pytest.mark.opencl
@pytest.mark.parametrize("integers", [True, False], ids=["program_integers", "older_floats"])
def test_8bit_tensors_bound(model_cache, tmp_path, monkeypatch, integers):
    """Quantized inputs and outputs: a program that takes and returns them as integers
    uses the bound buffers itself; one that takes floats (an older compiler's, made here
    with the integer I/O off) is bound through the host, where the CPU (de)quantizes."""
    import pyopencl.array as cla

    from litekiln.compiler import lowering

    cache = model_cache
    if not integers:
        monkeypatch.setattr(lowering, "INTEGER_IO_DTYPES", frozenset())
        (cache := tmp_path / "floats").mkdir(mode=0o700)
    it = _interpreter(SMOKE.with_name("smoke_int8.tflite"), str(cache))
    (inp,), outs = it.get_input_details(), it.get_output_details()
    x = it.random_inputs(0)[0]
    want = _numpy_path(it, [x])
    q = it.get_device().queue
    ys = [cla.empty(q, tuple(d["shape"]), d["dtype"]) for d in outs]
    it.bind_input(inp["index"], cla.to_device(q, x))
    for d, y in zip(outs, ys, strict=True):
        it.bind_output(d["index"], y)
    it.invoke()
    for y, w in zip(ys, want, strict=True):
        np.testing.assert_array_equal(y.get(), w)
    copies = [] if integers else ["8-bit tensors are (de)quantized on the CPU"]
    for b in it.get_bindings().values():
        assert b["host_copies"] == copies


# --------------------------------------------------------------------------- DLPack


def test_one_export_per_run_for_each_library_that_syncs_whole_streams():
    """torch and cupy order their current stream before ours whichever tensor is exported:
    one export per run each; another producer's tensors are each exported; sync=False none."""
    from types import SimpleNamespace

    from litekiln.runtime.session import _stream_syncs

    def owned_by(module: str):
        return type("Tensor", (), {"__module__": module})()

    def buf(owner, kind="cuda", sync=True):
        return SimpleNamespace(kind=kind, owner=owner, sync=sync)

    torch_a, torch_b = buf(owned_by("torch")), buf(owned_by("torch"))
    cupy_a = buf(owned_by("cupy._core.core"))
    other_a, other_b = buf(owned_by("jaxlib.xla")), buf(owned_by("jaxlib.xla"))
    quiet = buf(owned_by("torch"), sync=False)
    opencl = buf(owned_by("pyopencl.array"), kind="opencl")
    picked = _stream_syncs([quiet, torch_a, torch_b, cupy_a, other_a, other_b, opencl])
    assert picked == [torch_a, cupy_a, other_a, other_b]


def test_dlpack_is_read_from_the_capsule():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = read_dlpack(a)
    assert (t.device_type, t.device_id, t.device_name) == (1, 0, "CPU (host memory) device 0")
    assert t.address == a.ctypes.data and t.shape == (2, 3, 4) and t.dtype == np.float32
    assert t.c_contiguous and t.type_name == "float32"
    s = read_dlpack(a[:, ::2, 1:])
    assert s.address == a.ctypes.data + 4 and s.strides == (12, 8, 1) and not s.c_contiguous
    assert read_dlpack(np.zeros((3, 1), bool)).dtype == np.dtype(bool)
    assert read_dlpack(np.zeros(2, np.int8)).type_name == "int8"
    assert read_dlpack(np.zeros((1, 5), np.float32)[:, ::1]).c_contiguous


_SLOT = TensorSlot("input", 7, "image", (1, 4, 4, 3), np.dtype(np.float32))


def _bind(obj, cuda_device=lambda: None):
    return device_buffer(obj, _SLOT, context=None, queue=None, cuda_device=cuda_device)


def test_host_memory_through_dlpack_is_refused_clearly():
    a = np.zeros((1, 4, 4, 3), np.float32)
    with pytest.raises(InputError) as err:
        _bind(a)
    msg = str(err.value)
    assert "input 7 ('image', float32[1, 4, 4, 3])" in msg
    assert "lives in CPU (host memory) (DLPack device 1)" in msg
    assert "expected CUDA device memory (DLPack device 2)" in msg and "set_tensor" in msg

    class Vulkanish:
        def __dlpack_device__(self):
            return (7, 0)

        def __dlpack__(self, stream=None):
            raise AssertionError("not exported: refused on its device")

    with pytest.raises(InputError, match=r"lives in Vulkan \(DLPack device 7\)"):
        _bind(Vulkanish())


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", buffers._DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


def _aligned(shape, dtype=np.float32, offset: int = 0) -> np.ndarray:
    """A zeroed array at a multiple of 256 bytes (plus ``offset``), as CUDA allocations are."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.zeros(n + 512 + offset, np.uint8)
    start = -raw.ctypes.data % 256 + offset
    return raw[start : start + n].view(dtype).reshape(shape)


class FakeCudaTensor:
    """Host memory that calls itself CUDA memory through DLPack: the fake driver's device
    addresses are host addresses, so kernels and copies of the fake reach it."""

    def __init__(self, array: np.ndarray, device_id: int = 0, code: int | None = None):
        self.array = array
        self.device_id = device_id
        self.code = code
        self.streams: list = []
        self._keep: list = []

    def __dlpack_device__(self):
        return (2, self.device_id)

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        a = self.array
        m = _DLManagedTensor()
        t = m.dl_tensor
        t.data = a.ctypes.data
        t.device.device_type, t.device.device_id = 2, self.device_id
        t.ndim = a.ndim
        kind = {"f": 2, "i": 0, "u": 1, "b": 6}[a.dtype.kind]
        t.dtype.code = self.code if self.code is not None else kind
        t.dtype.bits, t.dtype.lanes = a.dtype.itemsize * 8, 1
        shape = (ctypes.c_int64 * a.ndim)(*a.shape)
        strides = (ctypes.c_int64 * a.ndim)(*[s // a.itemsize for s in a.strides])
        t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        t.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
        self._keep.append((m, shape, strides))
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(m), b"dltensor", None)


@pytest.fixture
def fake(monkeypatch):
    fake = FakeDriver(_kernels([]))
    monkeypatch.setattr(cuda, "_DRIVER", cuda._Driver(lib=fake.lib))
    monkeypatch.setattr(cuda, "_DEVICES", {})
    yield fake
    assert not fake.errors, fake.errors


def test_cuda_tensors_are_checked_against_the_tensor_and_the_device(fake):
    device = cuda.CudaDevice(0)
    ok = FakeCudaTensor(_aligned((1, 4, 4, 3), np.float32))
    buf = _bind(ok, lambda: device)
    assert buf.kind == "cuda" and buf.address == ok.array.ctypes.data and buf.nbytes == 192
    assert ok.streams == [device.stream.value]  # exported for litekiln's stream
    buf.before_run()
    assert ok.streams[-1] == device.stream.value
    with pytest.raises(InputError, match=r"has shape \[1, 3, 4, 4\], expected \[1, 4, 4, 3\]"):
        _bind(FakeCudaTensor(_aligned((1, 3, 4, 4), np.float32)), lambda: device)
    with pytest.raises(InputError, match="has dtype int32, expected float32"):
        _bind(FakeCudaTensor(_aligned((1, 4, 4, 3), np.int32)), lambda: device)
    with pytest.raises(InputError, match="has dtype bfloat32, expected float32"):
        _bind(FakeCudaTensor(_aligned((1, 4, 4, 3), np.float32), code=4), lambda: device)
    strided = _aligned((1, 4, 4, 6))[..., ::2]
    with pytest.raises(InputError, match="not C-contiguous"):
        _bind(FakeCudaTensor(strided), lambda: device)
    with pytest.raises(InputError, match=r"starts at address 0x[0-9a-f]+, not a multiple of 256"):
        _bind(FakeCudaTensor(_aligned((1, 4, 4, 3), offset=16)), lambda: device)
    with pytest.raises(DeviceError, match=r"on CUDA device 1, the model runs on CUDA device 0"):
        _bind(FakeCudaTensor(_aligned((1, 4, 4, 3), np.float32), device_id=1), lambda: device)
    # Host copies of a bound CUDA tensor (for ops on the CPU) go through the driver.
    ok.array[...] = 2.5
    np.testing.assert_array_equal(buf.read(), ok.array)
    buf.write(np.full((1, 4, 4, 3), -1, np.float32))
    assert (ok.array == -1).all()


def test_cuda_graph_reads_and_writes_bound_memory_without_copies(fake):
    prog = _axpb_program()  # x (input) -> y (workspace at offset 512) -> z (output)
    b = np.linspace(-1, 1, 1000, dtype=np.float32).reshape(10, 100)
    ex = cuda.CudaGraphExecutor(prog, {"b": b}, _PTX.encode() + b"\0", cuda.CudaDevice(0))
    x = np.random.default_rng(0).standard_normal((10, 100)).astype(np.float32)
    z = np.zeros((10, 100), np.float32)
    ex.bind_input(0, x.ctypes.data, x.nbytes)
    assert ex.bind_output(0, z.ctypes.data, z.nbytes)  # z has a storage of its own: in place
    with pytest.raises(ValueError, match="bound to device memory"):
        ex.set_input(0, x)
    ex.run()
    np.testing.assert_allclose(z, 2.5 * x + b + 1, rtol=1e-6)
    copies = [c for c, _ in fake.graphs[max(fake.graphs)] if c[0] == "copy"]
    assert copies == [], "no input or output copy in the graph"
    kernels = [c for c in fake.launched if c[0] == "kernel"]
    assert kernels[-2][4][0] == x.ctypes.data and kernels[-1][4][1] == z.ctypes.data
    x *= -1  # new values where the application keeps them
    ex.run()
    np.testing.assert_allclose(z, 2.5 * x + b + 1, rtol=1e-6)
    np.testing.assert_array_equal(ex.get_output(0), z)  # read back through the driver

    with pytest.raises(ValueError, match="need 4000"):
        ex.bind_input(0, x.ctypes.data, 3999)
    ex.unbind_input(0)
    ex.unbind_output(0)
    ex.set_input(0, np.ones((10, 100), np.float32))
    ex.run()
    np.testing.assert_allclose(ex.get_output(0), 2.5 + b + 1, rtol=1e-6)
    assert (z == 2.5 * x + b + 1).all(), "an unbound output's memory is left alone"


def test_an_output_sharing_its_storage_is_copied_on_the_device(fake):
    from dataclasses import replace

    prog = replace(_axpb_program(), outputs=[2, 3])  # y sits at offset 512 of its storage
    b = np.zeros((10, 100), np.float32)
    ex = cuda.CudaGraphExecutor(prog, {"b": b}, _PTX.encode() + b"\0", cuda.CudaDevice(0))
    y = np.zeros((10, 100), np.float32)
    assert not ex.output_in_place(0, y.nbytes)
    assert not ex.bind_output(0, y.ctypes.data, y.nbytes)  # a copy on the device
    x = np.full((10, 100), 2.0, np.float32)
    ex.set_input(0, x)
    ex.run()
    np.testing.assert_array_equal(y, 5.0)
    copies = [c for c, _ in fake.graphs[max(fake.graphs)] if c[0] == "copy"]
    assert (y.ctypes.data, 4000) in [(c[1], c[3]) for c in copies]
    np.testing.assert_array_equal(ex.get_output(1), 6.0)  # the other output as before


@pytest.mark.opencl
def test_session_binds_cuda_tensors_on_the_graph_path(fake, monkeypatch, model_cache):
    """On the CUDA graph path a DLPack tensor is bound into the graph (kernel arguments point
    at it, no input copy) and an OpenCL buffer goes through the host, saying why."""
    import pyopencl.array as cla

    from litekiln.runtime import session as session_mod

    _ptx_like_nvidia(monkeypatch)
    monkeypatch.setattr(cuda, "cuda_device_for", lambda dev, profile: cuda.CudaDevice(0))
    monkeypatch.setattr(session_mod, "_compare_paths", lambda a, b: "")  # the fake computes nothing
    monkeypatch.setenv("LITEKILN_CUDA_GRAPH", "on")
    it = _interpreter(SMOKE, model_cache)
    (ex,) = it._backend.executors  # noqa: SLF001
    assert isinstance(ex, cuda.CudaGraphExecutor)
    (inp,), (out,) = it.get_input_details(), it.get_output_details()
    x = FakeCudaTensor(_aligned(tuple(inp["shape"]), np.float32))
    y = FakeCudaTensor(_aligned(tuple(out["shape"]), np.float32))
    it.bind_input(inp["index"], x)
    it.bind_output(out["index"], y)
    assert it.get_bindings()[inp["index"]]["zero_copy"]
    assert it.get_bindings()[out["index"]]["direct"] == ["written by partition 0 in place"]
    before = len(x.streams)
    it.invoke()
    assert len(x.streams) == before + 1 and len(y.streams) == 2  # ordered before each run
    graph = fake.graphs[max(fake.graphs)]
    assert not [c for c, _ in graph if c[0] == "copy"], "no copies in the graph"
    pointers = {v for c, _ in graph if c[0] == "kernel" for v in c[4]}
    assert {x.array.ctypes.data, y.array.ctypes.data} <= pointers
    it.bind_output(out["index"], y, sync=False)  # the app orders its own stream
    n = len(y.streams)
    it.invoke()
    assert len(y.streams) == n and len(x.streams) == before + 2

    it.unbind()
    q = it.get_device().queue
    it.bind_input(inp["index"], cla.zeros(q, tuple(inp["shape"]), np.float32))
    (why,) = it.get_bindings()[inp["index"]]["host_copies"]
    assert why == "partition 0 runs as one CUDA graph, which cannot use opencl memory"
    it.invoke()
