"""The CUDA graph launch path (litekiln.runtime.cuda) against a fake CUDA driver.

No NVIDIA GPU here: a fake driver implements the driver entry points the executor uses over
host memory (allocations are ctypes buffers, copies are memmoves, a graph is the list of
captured calls, replayed by cuGraphLaunch) and runs each kernel through a Python stand-in
registered by the test. What this checks is everything but the GPU: PTX checks, the arena
and pointer arithmetic, parameter packing (read back through the PTX signature), grid and
block sizes, input/output staging, graph capture and replay, the session's comparison with
the OpenCL path and its fallback. The H100 runs the real thing (scripts/remote_gpu/run.sh).
"""

from __future__ import annotations

import ctypes
import struct
import types

import numpy as np
import pytest

from litekiln.artifact.program import (
    BufferArg,
    GpuProgram,
    Launch,
    ScalarArg,
    StorageSpec,
    TensorSpec,
)
from litekiln.cache.models import ModelCache
from litekiln.runtime import cuda
from litekiln.runtime.profile import DeviceProfile, family_of

#: The fake driver's cubins: this, then the PTX they were linked from.
_FAKE_ELF = b"\x7fELF-fake\n"
_FMT = {"u64": "<Q", "u32": "<I", "s32": "<i", "f32": "<f", "u16": "<H"}


class FakeDriver:
    """Enough of libcuda for `CudaGraphExecutor`, over host memory.

    Each entry point is a C function pointer (ctypes.CFUNCTYPE) with the argument types
    `litekiln.runtime.cuda` declares, so every call goes through the same ctypes conversions
    as a call into the real libcuda.so.1 (a wrong argument type fails here too); the
    implementations see C values: addresses as ints, out-parameters as pointers.
    """

    def __init__(self, kernels: dict) -> None:
        self.kernels = kernels  # name -> fn(grid, block, params)
        self.keep: list = []
        self.functions: dict[int, str] = {}
        self.ptx = ""
        self.capturing: list | None = None  # (call, dependencies) nodes while capturing
        self.graphs: dict[int, list] = {}
        self.launched: list[tuple] = []
        self.graph_launches = 0
        self.errors: list[BaseException] = []
        self.freed_host: list[int] = []
        self.streams = 11
        self.n_events = 0
        self.tails: dict[int, set[int]] = {}
        self.events: dict[int, set[int]] = {}
        self.rng = np.random.default_rng(0)
        self.shuffle = True
        self.links = 0
        self.cubins_loaded = 0
        self.linking = b""
        lib = types.SimpleNamespace()
        for attr, (symbol, argtypes) in cuda._signatures().items():
            impl = getattr(self, attr)
            setattr(lib, symbol, ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(self._guard(impl)))
        self.lib = lib

    def _guard(self, impl):
        def call(*args):
            try:
                return impl(*args) or 0
            except BaseException as exc:  # noqa: BLE001 - a callback cannot raise into ctypes
                self.errors.append(exc)
                return 999

        return call

    def _alloc(self, p, size: int) -> None:
        buf = ctypes.create_string_buffer(size)
        self.keep.append(buf)
        p[0] = ctypes.addressof(buf)

    # entry points, at the C level
    def cuInit(self, flags):
        pass

    def cuDeviceGetCount(self, p):
        p[0] = 1

    def cuDeviceGet(self, p, o):
        p[0] = o

    def cuDeviceGetAttribute(self, p, attr, dev):
        p[0] = 0

    def cuDeviceGetName(self, buf, n, dev):
        ctypes.memmove(buf, b"Fake GPU\0", 9)

    def cuDeviceGetUuid(self, buf, dev):
        ctypes.memmove(buf, bytes([0xF0 + dev] * 16), 16)

    def cuDriverGetVersion(self, p):
        p[0] = 13000

    def cuDevicePrimaryCtxRetain(self, p, dev):
        p[0] = 11

    def cuCtxSetCurrent(self, ctx):
        assert ctx == 11

    def cuStreamCreate(self, p, flags):
        self.streams += 1
        p[0] = self.streams  # the device's main stream is 12, side streams 13, 14, ...

    def cuModuleLoadData(self, p, data):
        if data.startswith(_FAKE_ELF):  # a "cubin" of cuLinkComplete's: the PTX it was made of
            self.cubins_loaded += 1
            data = data[len(_FAKE_ELF) :]
        self.ptx = data.decode()
        p[0] = 13

    def cuLinkCreate(self, n, options, values, p):
        assert n == 0
        p[0] = 77

    def cuLinkAddData(self, state, kind, data, size, name, n, options, values):
        assert state == 77 and kind == 1 and n == 0
        self.linking = ctypes.string_at(data, size).rstrip(b"\0")

    def cuLinkComplete(self, state, p_image, p_size):
        image = ctypes.create_string_buffer(_FAKE_ELF + self.linking)
        self.keep.append(image)
        self.links += 1
        p_image[0] = ctypes.addressof(image)
        p_size[0] = len(_FAKE_ELF) + len(self.linking)

    def cuLinkDestroy(self, state):
        assert state == 77

    def cuModuleUnload(self, m):
        pass

    def cuModuleGetFunction(self, p, mod, name):
        assert mod == 13
        fid = 100 + len(self.functions)
        self.functions[fid] = name.decode()
        p[0] = fid

    def cuMemAlloc(self, p, size):
        self._alloc(p, size)

    def cuMemFree(self, ptr):
        pass

    def cuMemHostAlloc(self, p, size, flags):
        self._alloc(p, size)

    def cuMemFreeHost(self, ptr):
        self.freed_host.append(ptr.value if hasattr(ptr, "value") else ptr)

    def cuMemcpyHtoD(self, dst, src, n):
        ctypes.memmove(dst, src, n)

    def _copy(self, dst, src, n, stream):
        assert self.capturing is None or stream == self.origin, "copies go on the origin stream"
        self._op(("copy", dst, src, n), stream)

    def _op(self, call, stream) -> None:
        """Capture ``call`` as a node after the stream's current tail, or run it now."""
        if self.capturing is None:
            self._run(call)
            return
        if stream not in self.tails:
            raise AssertionError(
                f"stream {stream} is not part of the capture (it would run eagerly)"
            )
        self.capturing.append((call, frozenset(self.tails[stream])))
        self.tails[stream] = {len(self.capturing) - 1}

    def cuMemcpyHtoDAsync(self, dst, src, n, stream):
        self._copy(dst, src, n, stream)

    def cuMemcpyDtoHAsync(self, dst, src, n, stream):
        self._copy(dst, src, n, stream)

    def cuMemcpyDtoDAsync(self, dst, src, n, stream):
        self._copy(dst, src, n, stream)

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shm, stream, params, extra):
        assert extra is None and shm == 0
        name = self.functions[fn]
        ptypes = cuda.ptx_entries(self.ptx)[name]
        addrs = (ctypes.c_void_p * len(ptypes)).from_address(params)
        values = [
            struct.unpack(_FMT[t], ctypes.string_at(addrs[i], struct.calcsize(_FMT[t])))[0]
            for i, t in enumerate(ptypes)
        ]
        self._op(("kernel", name, (gx, gy, gz), (bx, by, bz), values), stream)

    def _run(self, call) -> None:
        if call[0] == "copy":
            ctypes.memmove(call[1], call[2], call[3])
            return
        self.launched.append(call)
        if call[1] in self.kernels:
            self.kernels[call[1]](*call[2:])

    def cuStreamBeginCapture(self, stream, mode):
        self.capturing, self.tails, self.events = [], {stream: set()}, {}
        self.origin = stream

    def cuStreamEndCapture(self, stream, p):
        nodes, self.capturing = self.capturing, None
        # CUDA refuses a capture whose forked streams did not join back into the origin.
        seen, todo = set(), list(self.tails[stream])
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo.extend(nodes[n][1])
        if len(seen) != len(nodes):
            return 901  # CUDA_ERROR_STREAM_CAPTURE_UNJOINED
        gid = 500 + len(self.graphs)
        self.graphs[gid] = nodes
        p[0] = gid

    def cuGraphInstantiateWithFlags(self, p, graph, flags):
        p[0] = graph

    def cuGraphLaunch(self, exe, stream):
        """Replay in a random order that respects the captured dependencies (a GPU may run
        independent nodes in any order): a missing dependency shows as a wrong result."""
        self.graph_launches += 1
        nodes = self.graphs[exe]
        done: set[int] = set()
        while len(done) < len(nodes):
            ready = [i for i, (_, deps) in enumerate(nodes) if i not in done and deps <= done]
            i = ready[self.rng.integers(len(ready))] if self.shuffle else ready[0]
            self._run(nodes[i][0])
            done.add(i)

    def cuGraphDestroy(self, g):
        pass

    def cuGraphExecDestroy(self, g):
        pass

    def cuStreamSynchronize(self, s):
        pass

    def cuStreamQuery(self, s):
        pass

    def cuEventCreate(self, p, flags):
        self.n_events += 1
        p[0] = 1000 + self.n_events

    def cuEventRecord(self, ev, s):
        if self.capturing is not None:
            self.events[ev] = set(self.tails[s])

    def cuStreamWaitEvent(self, s, ev, flags):
        assert self.capturing is not None, "waits are only used while capturing"
        self.tails[s] = self.tails.get(s, set()) | self.events[ev]

    def cuEventSynchronize(self, ev):
        pass

    def cuEventElapsedTime(self, p, a, b):
        p[0] = 0.5

    def cuEventDestroy(self, ev):
        pass

    def cuGetErrorName(self, err, p):
        name = ctypes.c_char_p(b"CUDA_ERROR_FAKE")
        self.keep.append(name)
        p[0] = name.value


def _axpb_program() -> GpuProgram:
    """y = a * x + b over 1000 floats (x an input, b a constant, a a scalar), then z = y + 1
    in a second kernel through a workspace at an offset: two launches, one scalar."""
    n = 1000
    return GpuProgram(
        source="(not used by the fake driver)",
        build_options="",
        kernels=["axpb", "plus_one"],
        storages=[
            StorageSpec(0, 4 * n, "input"),
            StorageSpec(1, 4 * n, "constant"),
            StorageSpec(2, 4 * n + 512, "workspace"),
            StorageSpec(3, 4 * n, "workspace"),
        ],
        tensors=[
            TensorSpec(0, 0, 0, (10, 100), "float32", "x"),
            TensorSpec(1, 1, 0, (10, 100), "float32", "b"),
            TensorSpec(2, 2, 512, (10, 100), "float32", "y"),
            TensorSpec(3, 3, 0, (10, 100), "float32", "z"),
        ],
        constants={1: "b"},
        inputs=[0],
        outputs=[3],
        launches=[
            Launch(
                "axpb",
                (
                    BufferArg(0),
                    BufferArg(1),
                    BufferArg(2),
                    ScalarArg(2.5, "float"),
                    ScalarArg(n, "int"),
                ),
                (1024,),
                (256,),
            ),
            Launch("plus_one", (BufferArg(2), BufferArg(3)), (500, 2), (100, 2)),
        ],
    )


_PTX = """
.version 8.0
.target sm_90, texmode_independent
.address_size 64
.entry axpb(
    .param .u64 .ptr .global .align 4 axpb_param_0,
    .param .u64 .ptr .global .align 4 axpb_param_1,
    .param .u64 .ptr .global .align 4 axpb_param_2,
    .param .f32 axpb_param_3,
    .param .u32 axpb_param_4
)
{ ret; }
.entry plus_one(
    .param .u64 .ptr .global .align 4 plus_one_param_0,
    .param .u64 .ptr .global .align 4 plus_one_param_1
)
{ ret; }
"""


def _view(addr: int, n: int) -> np.ndarray:
    return np.frombuffer((ctypes.c_float * n).from_address(addr), dtype=np.float32)


def _kernels(seen: list) -> dict:
    def axpb(grid, block, values):
        x, b, y, a, n = values
        assert grid == (4, 1, 1) and block == (256, 1, 1)
        seen.append(("axpb", x, b, y, a, n))
        _view(y, n)[:] = a * _view(x, n) + _view(b, n)

    def plus_one(grid, block, values):
        y, z = values
        assert grid == (5, 1, 1) and block == (100, 2, 1)
        _view(z, 1000)[:] = _view(y, 1000) + 1

    return {"axpb": axpb, "plus_one": plus_one}


@pytest.fixture
def fake(monkeypatch):
    seen: list = []
    fake = FakeDriver(_kernels(seen))
    monkeypatch.setattr(cuda, "_DRIVER", cuda._Driver(lib=fake.lib))
    monkeypatch.setattr(cuda, "_DEVICES", {})
    fake.seen = seen
    yield fake
    assert not fake.errors, fake.errors


def test_graph_executor_runs_the_plan(fake):
    prog = _axpb_program()
    b = np.linspace(-1, 1, 1000, dtype=np.float32).reshape(10, 100)
    ex = cuda.CudaGraphExecutor(prog, {"b": b}, _PTX.encode() + b"\0", cuda.CudaDevice(0))
    x = np.random.default_rng(0).standard_normal((10, 100)).astype(np.float32)
    ex.set_input(0, x)
    ex.run()
    np.testing.assert_allclose(ex.get_output(0), 2.5 * x + b + 1, rtol=1e-6)
    # Pointers: every tensor in the arena at its storage's aligned offset plus its own offset.
    _, px, pb, py, a, n = fake.seen[-1]
    assert (a, n) == (2.5, 1000)
    assert pb - px == 4096 and py - px == 4096 + 4096 + 512  # 4000 bytes round up to 4096
    assert len({px, pb, py}) == 3
    # One graph launch per run (plus the load-time check run): copies and kernels inside it.
    before = fake.graph_launches
    x2 = -x
    ex.set_input(0, x2)
    ex.run()
    out = np.empty((10, 100), np.float32)
    ex.get_output(0, out=out)
    np.testing.assert_allclose(out, -2.5 * x + b + 1, rtol=1e-6)
    assert fake.graph_launches == before + 1
    assert ex.num_launches == 2 and ex.launch_names() == ["axpb", "plus_one"]
    assert ex.profile() == [0.5e-3, 0.5e-3]  # the fake's event clock: 0.5 ms between events
    before = fake.graph_launches
    assert ex.graph_time(reps=3) == 0.5e-3 and fake.graph_launches == before + 3
    with pytest.raises(ValueError, match="shape"):
        ex.set_input(0, np.zeros((100, 10), np.float32))


def test_output_buffers_are_read_in_place_and_outlive_the_executor(fake):
    prog = _axpb_program()
    b = np.ones((10, 100), np.float32)
    ex = cuda.CudaGraphExecutor(prog, {"b": b}, _PTX.encode() + b"\0", cuda.CudaDevice(0))
    (buf,) = ex.output_buffers()
    for k in (1.0, 3.0):
        ex.set_input(0, np.full((10, 100), k, np.float32))
        ex.run()
        assert ex.get_output(0, out=buf) is buf  # no copy: the graph's own pinned output
        np.testing.assert_array_equal(buf, np.full((10, 100), 2.5 * k + 2, np.float32))
    # The pinned block is freed when the last view of it goes, not with the executor.
    import gc

    del ex
    gc.collect()
    assert fake.freed_host == []
    assert float(buf[0, 0]) == 2.5 * 3 + 2
    del buf
    gc.collect()
    assert len(fake.freed_host) == 1


def test_roofline_node_cost_is_a_graph_of_empty_kernels(fake, monkeypatch):
    """`litekiln bench --profile`'s cost of one graph node: the empty kernel's PTX (from the
    OpenCL driver, here given) captured N times in one graph, its replay's device time / N."""
    import types

    from litekiln.runtime import roofline

    ptx = ".version 8.0\n.target sm_90, texmode_independent\n.address_size 64\n"
    ptx += ".entry litekiln_empty()\n{ ret; }\n"
    monkeypatch.setattr(
        roofline, "_executor", lambda handle, program: types.SimpleNamespace(binary=ptx.encode())
    )
    seconds = roofline.graph_node_cost(None, cuda.CudaDevice(0), nodes=40, reps=3)
    assert seconds == pytest.approx(0.5e-3 / 40)  # the fake's event clock: 0.5 ms a replay
    (nodes,) = [g for g in fake.graphs.values() if g]
    assert [n[0][1] for n in nodes] == ["litekiln_empty"] * 40  # kernels only, no copies
    assert fake.graph_launches == 1 + 3  # the load-time check, then the timed replays


def test_ptx_checks_refuse_what_cuda_would_run_differently():
    prog = _axpb_program()
    launches = prog.plan()
    cuda.check_ptx(_PTX, prog, launches)  # matches
    with pytest.raises(cuda.CudaUnsupported, match="not PTX"):
        cuda.check_ptx("\x7fELF...", prog, launches)
    with pytest.raises(cuda.CudaUnsupported, match="envreg"):
        cuda.check_ptx(
            _PTX.replace("{ ret; }", "{ mov.u32 %r1, %envreg3; ret; }", 1), prog, launches
        )
    with pytest.raises(cuda.CudaUnsupported, match="2 PTX parameters for 5"):
        cuda.check_ptx(
            _PTX.replace(".entry axpb(", ".entry gone(").replace(
                ".entry plus_one(", ".entry axpb("
            ),
            prog,
            launches,
        )
    with pytest.raises(cuda.CudaUnsupported, match=r"parameter 4: PTX \.u64 for int"):
        cuda.check_ptx(
            _PTX.replace(".param .u32 axpb_param_4", ".param .u64 axpb_param_4"), prog, launches
        )
    with pytest.raises(cuda.CudaUnsupported, match="plus_one not found"):
        cuda.check_ptx(_PTX.replace(".entry plus_one(", ".entry other("), prog, launches)


def test_no_cuda_driver_is_a_clear_refusal(monkeypatch):
    monkeypatch.setattr(cuda, "_DRIVER", None)
    monkeypatch.setattr(cuda, "_DRIVER_ERROR", "no CUDA driver library (libcuda.so.1: not found)")
    with pytest.raises(cuda.CudaUnsupported, match="libcuda"):
        cuda.driver()


def _profile(platform: str) -> DeviceProfile:
    return DeviceProfile(
        platform=platform, platform_version="", vendor="", name="", version="", driver="",
        kind="gpu", family=family_of(platform), extensions=frozenset(), max_work_group_size=1024,
        max_work_item_sizes=(1024, 1024, 64), address_align=128,
    )  # fmt: skip


def test_only_nvidia_opencl_devices_are_matched(fake):
    with pytest.raises(cuda.NotNvidiaDevice, match="not an NVIDIA OpenCL device"):
        cuda.cuda_device_for(object(), _profile("Portable Computing Language"))
    nv = type("Dev", (), {"pci_bus_id_nv": 0, "pci_slot_id_nv": 0})()
    profile = _profile("NVIDIA CUDA")
    assert cuda.cuda_device_for(nv, profile).name == "Fake GPU"
    assert cuda.cuda_device_for(nv, profile) is cuda.cuda_device_for(nv, profile)  # one per GPU


def _ptx_like_nvidia(monkeypatch) -> None:
    """PoCL's executors report, as their binary, the program's signature as PTX (what NVIDIA's
    OpenCL would give), so that the session's CUDA graph path runs against the fake driver."""
    from litekiln.runtime import executor as cl_executor

    ptx_for: dict = {}

    def fake_ptx(self):  # the program's signature as PTX, what NVIDIA's compiler would give
        if id(self.program) not in ptx_for:
            lines = [".version 8.0", ".target sm_90", ".address_size 64"]
            for launch in self.program.all_launches():
                params = [
                    ".param .u64 p"
                    if isinstance(a, BufferArg)
                    else f".param .{ {'float': 'f32', 'int': 'u32'}[a.ctype] } p"
                    for a in launch.args
                ]
                lines.append(f".entry {launch.kernel}({', '.join(params)})" + " { ret; }")
            ptx_for[id(self.program)] = "\n".join(dict.fromkeys(lines)).encode()
        return ptx_for[id(self.program)]

    monkeypatch.setattr(cl_executor.PartitionExecutor, "binary", property(fake_ptx))
    # The fake PTX must not reach the binary cache, and PoCL must look like NVIDIA's OpenCL.
    monkeypatch.setattr(ModelCache, "load_program", lambda self, *key: (None, None))
    monkeypatch.setattr(ModelCache, "save_program", lambda self, *key, **kw: False)
    monkeypatch.setattr(DeviceProfile, "cuda_graph_candidate", property(lambda self: True))


@pytest.mark.opencl
def test_session_compares_paths_and_falls_back(fake, monkeypatch, tmp_path):
    """On a device that passes every check but computes something else (here: the fake's
    kernels are not the program's), the session keeps OpenCL under `auto` and fails under
    `on`; with matching kernels it takes the graph."""
    from litekiln.errors import DeviceError
    from litekiln.interpreter import Interpreter
    from litekiln.runtime import executor as cl_executor

    real_binary = cl_executor.PartitionExecutor.binary
    _ptx_like_nvidia(monkeypatch)
    monkeypatch.setattr(cuda, "cuda_device_for", lambda dev, profile: cuda.CudaDevice(0))
    model = "tests/data/smoke.tflite"

    monkeypatch.setenv("LITEKILN_CUDA_GRAPH", "auto")
    interp = Interpreter(model_path=model, cache_dir=str(tmp_path))
    interp.allocate_tensors()
    interp._backend.wait_for_graph()  # noqa: SLF001 - auto: the upgrade runs in the background
    assert [type(e).__name__ for e in interp._backend.executors] == ["PartitionExecutor"]  # noqa: SLF001
    assert fake.launched, "the graph path was tried"

    monkeypatch.setenv("LITEKILN_CUDA_GRAPH", "on")
    with pytest.raises(DeviceError, match="differs from the OpenCL path"):
        Interpreter(model_path=model, cache_dir=str(tmp_path)).allocate_tensors()

    monkeypatch.setenv("LITEKILN_CUDA_GRAPH", "off")
    n = len(fake.launched)
    Interpreter(model_path=model, cache_dir=str(tmp_path)).allocate_tensors()
    assert len(fake.launched) == n, "off never touches CUDA"
    assert real_binary is not None


@pytest.mark.opencl
def test_session_starts_on_opencl_and_moves_to_the_graph_in_the_background(
    fake, monkeypatch, tmp_path
):
    """`auto`: the session is ready at once on OpenCL; the CUDA graph (driver start, capture,
    check) is made in a background thread and swapped in between two inferences."""
    import threading

    from litekiln.interpreter import Interpreter
    from litekiln.runtime import session as session_mod

    _ptx_like_nvidia(monkeypatch)
    monkeypatch.setattr(cuda, "cuda_device_for", lambda dev, profile: cuda.CudaDevice(0))
    monkeypatch.setattr(session_mod, "_compare_paths", lambda a, b: "")  # the fake computes nothing
    gate = threading.Event()

    class Gated(cuda.CudaGraphExecutor):
        def __init__(self, *args, **kwargs):
            assert gate.wait(60)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(cuda, "CudaGraphExecutor", Gated)
    monkeypatch.setenv("LITEKILN_CUDA_GRAPH", "auto")
    interp = Interpreter(model_path="tests/data/smoke.tflite", cache_dir=str(tmp_path))
    interp.allocate_tensors()
    sess = interp._backend  # noqa: SLF001
    x = interp.random_inputs(0)
    ref = Interpreter(model_path="tests/data/smoke.tflite", device="reference").run(x)
    for _ in range(2):  # while the graph is being made: OpenCL, right outputs
        for got, want in zip(interp.run(x), ref, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert [type(e) for e in sess.executors] != [Gated] and fake.graph_launches == 0
    gate.set()
    sess.wait_for_graph(60)
    assert [type(e) for e in sess.executors] == [Gated]
    before = fake.graph_launches
    interp.run(x)
    assert fake.graph_launches == before + 1  # later inferences replay the graph


def test_group_offset_registers_become_zero():
    """NVIDIA's OpenCL PTX reads get_group_id(d) as %envreg<d> + %ctaid.<d> (seen in every
    H100 program); the offsets are 0 for litekiln's launches, other registers are refused."""
    body = (
        "mov.b32 \t%r7, %envreg0;\n\tmov.u32 \t%r8, %ctaid.x;\n\tadd.s32 \t%r9, %r7, %r8;\n"
        "\tmov.b32 \t%r34, %envreg1;\n\tmov.b32 %r40, %envreg2;"
    )
    out = cuda.ptx_for_cuda(body)
    assert "%envreg" not in out
    assert "mov.b32 %r7, 0;" in out and "mov.b32 %r34, 0;" in out and "mov.b32 %r40, 0;" in out
    assert "%ctaid.x" in out
    prog = _axpb_program()
    other = cuda.ptx_for_cuda(_PTX.replace("{ ret; }", "{ mov.b32 %r1, %envreg3; ret; }", 1))
    with pytest.raises(cuda.CudaUnsupported, match="envreg"):
        cuda.check_ptx(other, prog, prog.plan())


def _branchy_program() -> GpuProgram:
    """a = 2x; b = a + 1 and c = 3a (independent); e = c - 1 written where `a` lived (the
    memory plan's reuse: e must wait for b's read of a); out = b + e = 8x."""
    n = 256
    nb = 4 * n
    storages = [StorageSpec(0, nb, "input")] + [StorageSpec(i, nb) for i in (1, 2, 3, 4)]
    tensors = [
        TensorSpec(0, 0, 0, (n,), "float32", "x"),
        TensorSpec(1, 1, 0, (n,), "float32", "a"),
        TensorSpec(2, 2, 0, (n,), "float32", "b"),
        TensorSpec(3, 3, 0, (n,), "float32", "c"),
        TensorSpec(4, 1, 0, (n,), "float32", "e"),
        TensorSpec(5, 4, 0, (n,), "float32", "out"),
    ]

    def launch(kernel, *tids):
        return Launch(kernel, tuple(BufferArg(t) for t in tids), (n,), (64,), func=kernel)

    return GpuProgram(
        source="",
        build_options="",
        kernels=["scale2", "plus1", "times3", "minus1", "add"],
        storages=storages,
        tensors=tensors,
        constants={},
        inputs=[0],
        outputs=[5],
        launches=[
            launch("scale2", 0, 1),
            launch("plus1", 1, 2),
            launch("times3", 1, 3),
            launch("minus1", 3, 4),
            launch("add", 2, 4, 5),
        ],
    )


_BRANCHY_PTX = "\n".join(
    [".version 8.0", ".target sm_90", ".address_size 64"]
    + [
        f".entry {k}(" + ", ".join([".param .u64 p"] * n) + ") { ret; }"
        for k, n in (("scale2", 2), ("plus1", 2), ("times3", 2), ("minus1", 2), ("add", 3))
    ]
)


def _branchy_kernels() -> dict:
    n = 256

    def unary(f):
        return lambda grid, block, v: _view(v[1], n).__setitem__(slice(None), f(_view(v[0], n)))

    return {
        "scale2": unary(lambda a: 2 * a),
        "plus1": unary(lambda a: a + 1),
        "times3": unary(lambda a: 3 * a),
        "minus1": unary(lambda a: a - 1),
        "add": lambda grid, block, v: _view(v[2], n).__setitem__(
            slice(None), _view(v[0], n) + _view(v[1], n)
        ),
    }


def test_branch_plan_orders_by_the_memory_plan():
    prog = _branchy_program()
    plan = cuda.branch_plan(prog, prog.plan(), streams=4)
    # scale2 | plus1 after it on stream 0 | times3 on a second stream, after scale2 |
    # minus1 after times3, and after plus1 (it overwrites the `a` plus1 reads) | add last.
    # Waits implied by stream order or by another wait are left out.
    assert [(b.start, b.stream, b.waits) for b in plan] == [
        (0, 0, ()),
        (1, 0, ()),
        (2, 1, (0,)),
        (3, 1, (1,)),
        (4, 1, ()),
    ]
    assert {b.stream for b in cuda.branch_plan(prog, prog.plan(), streams=1)} == {0}


def test_concurrent_branches_give_the_same_result_in_any_order(fake):
    fake.kernels = _branchy_kernels()
    prog = _branchy_program()
    ex = cuda.CudaGraphExecutor(prog, {}, _BRANCHY_PTX.encode(), cuda.CudaDevice(0), streams=4)
    assert ex.branches == 2
    x = np.random.default_rng(1).standard_normal(256).astype(np.float32)
    for _ in range(30):  # each replay in another random order the dependencies allow
        ex.set_input(0, x)
        ex.run()
        np.testing.assert_allclose(ex.get_output(0), 8 * x, rtol=1e-6, atol=1e-5)


def test_a_missing_dependency_is_caught_by_the_shuffled_replay(fake, monkeypatch):
    """The check above can fail: drop minus1's wait for plus1 (the write-after-read on the
    reused storage) and some order overwrites `a` before plus1 reads it."""
    real = cuda.branch_plan

    def without_war(program, launches, streams):
        plan = real(program, launches, streams)
        return [
            cuda.Branch(b.start, b.stop, b.stream, tuple(h for h in b.waits if h != 1))
            if b.start == 3
            else b
            for b in plan
        ]

    monkeypatch.setattr(cuda, "branch_plan", without_war)
    fake.kernels = _branchy_kernels()
    prog = _branchy_program()
    ex = cuda.CudaGraphExecutor(prog, {}, _BRANCHY_PTX.encode(), cuda.CudaDevice(0), streams=4)
    x = np.random.default_rng(1).standard_normal(256).astype(np.float32)
    wrong = 0
    for _ in range(30):
        ex.set_input(0, x)
        ex.run()
        wrong += not np.allclose(ex.get_output(0), 8 * x, rtol=1e-6, atol=1e-5)
    assert wrong > 0


@pytest.mark.opencl
@pytest.mark.zoo
@pytest.mark.parametrize(
    ("model", "branches"),
    [("smoke", False), ("face_detection_short_range", True), ("palm_detection_lite", True)],
)
def test_branch_plan_of_real_programs_holds_in_any_order(model, branches, tmp_path):
    """The dependencies `branch_plan` derives from TVM's memory plans are enough: the real
    kernels (PoCL), run call by call in random orders that respect only the plan's stream
    order and waits, give exactly the outputs of the launch order. A missing dependency
    (a reused storage overwritten early, a read before its write) changes them."""
    from conftest import zoo_model

    from litekiln.interpreter import Interpreter

    interp = Interpreter(model_path=zoo_model(model), cache_dir=str(tmp_path), op_table="extended")
    interp.allocate_tensors()
    rng = np.random.default_rng(0)
    for ex in interp._backend.executors:  # noqa: SLF001 - drives each partition's kernels
        plan = cuda.branch_plan(ex.program, ex.program.plan(ex.choices), streams=4)
        assert (len({b.stream for b in plan}) > 1) == branches  # smoke is one chain
        for i in range(ex.num_inputs):
            spec = ex.input_spec(i)
            ex.set_input(i, rng.uniform(-1, 1, spec.shape).astype(spec.dtype))
        ex.run(wait=True)
        want = [ex.get_output(i) for i in range(ex.num_outputs)]
        after: list[set[int]] = []  # per call: the calls it must follow
        last: dict[int, int] = {}
        for g, b in enumerate(plan):
            after.append(set(b.waits) | ({last[b.stream]} if b.stream in last else set()))
            last[b.stream] = g
        for _ in range(8):
            done: list[int] = []
            while len(done) < len(plan):
                ready = [g for g in range(len(plan)) if g not in done and after[g] <= set(done)]
                g = ready[rng.integers(len(ready))]
                for kernel, gsize, lsize in ex._launches[plan[g].start : plan[g].stop]:  # noqa: SLF001
                    cl_enqueue(ex.queue, kernel, gsize, lsize)
                done.append(g)
            ex.finish()
            for i, w in enumerate(want):
                np.testing.assert_array_equal(ex.get_output(i), w)


def cl_enqueue(queue, kernel, gsize, lsize):
    import pyopencl as cl

    cl.enqueue_nd_range_kernel(queue, kernel, gsize, lsize)


def test_preloaded_ptx_is_handed_to_the_executor_once(fake, monkeypatch):
    """`preload_ptx` loads the module on its thread (a first start: while OpenCL opens); the
    executor that loads the same text on that device takes it instead of loading again, and
    one with other PTX loads its own."""
    monkeypatch.setattr(cuda, "_PRELOADED", {})
    monkeypatch.setattr(cuda, "_PRELOADING", {})
    loads: list[str] = []
    real = fake.lib.cuModuleLoadData

    def counting(p, data):
        loads.append(ctypes.cast(data, ctypes.c_char_p).value.decode())
        return real(p, data)

    fake.lib.cuModuleLoadData = counting
    monkeypatch.setattr(cuda, "_DRIVER", cuda._Driver(lib=fake.lib))
    prog = _axpb_program()
    b = np.ones((10, 100), np.float32)
    cuda.preload_ptx([_PTX]).join()
    assert len(loads) == 1
    ex = cuda.CudaGraphExecutor(prog, {"b": b}, _PTX.encode() + b"\0", cuda.CudaDevice(0))
    assert len(loads) == 1  # taken over, not loaded again
    x = np.full((10, 100), 2.0, np.float32)
    ex.set_input(0, x)
    ex.run()
    np.testing.assert_allclose(ex.get_output(0), 2.5 * x + b + 1, rtol=1e-6)
    # Handed over once: a second executor of the same text loads its own module.
    cuda.CudaGraphExecutor(prog, {"b": b}, _PTX.encode() + b"\0", cuda.CudaDevice(0))
    assert len(loads) == 2


def test_preload_survives_a_module_taken_while_it_loads_the_next(fake, monkeypatch):
    """Two programs' PTX (a model of two partitions): the first executor takes its module
    while the preload thread still loads the second. The thread then ends cleanly; it used to
    look the taken text up again and die with a KeyError printed on the app's stderr (seen on
    the H200, results/h200/session22b/log.txt)."""
    import threading

    monkeypatch.setattr(cuda, "_PRELOADED", {})
    monkeypatch.setattr(cuda, "_PRELOADING", {})
    real = fake.lib.cuModuleLoadData
    gate, calls = threading.Event(), []

    def second_waits(p, data):
        calls.append(1)
        if len(calls) == 2:
            assert gate.wait(10)
        return real(p, data)

    fake.lib.cuModuleLoadData = second_waits
    monkeypatch.setattr(cuda, "_DRIVER", cuda._Driver(lib=fake.lib))
    died: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda a: died.append(a.exc_value))
    other = _PTX + "\n// the second partition\n"
    thread = cuda.preload_ptx([_PTX, other])
    assert cuda._take_preloaded(0, _PTX) is not None  # noqa: SLF001  (waits for the first)
    gate.set()
    thread.join(10)
    assert not thread.is_alive() and died == []
    assert cuda._take_preloaded(0, other) is not None  # noqa: SLF001


def _first_start_on_nvidia(fake, monkeypatch, tmp_path):
    """A first start on "NVIDIA" (PoCL dressed up by `_ptx_like_nvidia`, the fake CUDA
    driver), with the cache working: its graph path verified (the fake computes nothing, so
    the comparison is taken as passed) and recorded. Returns the interpreter."""
    from litekiln.interpreter import Interpreter
    from litekiln.runtime import session as session_mod

    load, save = ModelCache.load_program, ModelCache.save_program
    _ptx_like_nvidia(monkeypatch)
    monkeypatch.setattr(ModelCache, "load_program", load)  # (this cache is the test's own)
    monkeypatch.setattr(ModelCache, "save_program", save)
    monkeypatch.setattr(cuda, "cuda_device_for", lambda dev, profile: cuda._device(0))
    monkeypatch.setattr(session_mod, "_compare_paths", lambda a, b: "")
    monkeypatch.setenv("LITEKILN_CUDA_GRAPH", "on")  # (the upgrade now, not in the background)
    monkeypatch.delenv("LITEKILN_DEVICE", raising=False)
    interp = Interpreter(model_path="tests/data/smoke.tflite", cache_dir=str(tmp_path))
    interp.allocate_tensors()
    assert [type(e).__name__ for e in interp._backend.executors] == ["CudaGraphExecutor"]  # noqa: SLF001
    return interp


def _no_opencl(monkeypatch):
    """Any OpenCL device opened from here on fails the test."""
    from litekiln.runtime import device as device_mod

    def refuse(choice=None):
        raise AssertionError(f"OpenCL was opened ({choice!r})")

    monkeypatch.setattr(device_mod, "select_device", refuse)


@pytest.mark.opencl
def test_a_known_gpu_starts_through_cuda_alone(fake, monkeypatch, tmp_path):
    """After a start that verified its graphs, the next one finds the GPU's record and the
    verified programs in the cache: it opens the GPU through CUDA alone (no OpenCL device is
    ever opened) and replays the graph with the stored tuning choices."""
    from litekiln.interpreter import Interpreter

    first = _first_start_on_nvidia(fake, monkeypatch, tmp_path)
    cache = ModelCache.open(tmp_path)
    record = cache.load_gpu("")
    assert record is not None and record["cuda_uuid"] == "f0" * 16
    assert record["cuda_driver"] == 13000 and record["profile"]["name"]
    kinds = sorted(e.kind for e in cache.store.ls())
    assert kinds.count("device") == 1 and "program" in kinds

    _no_opencl(monkeypatch)
    launches = fake.graph_launches
    second = Interpreter(model_path="tests/data/smoke.tflite", cache_dir=str(tmp_path))
    second.allocate_tensors()
    sess = second._backend  # noqa: SLF001
    assert sess.startup["cuda_start"] and sess._handle is None  # noqa: SLF001
    assert [type(e).__name__ for e in sess.executors] == ["CudaGraphExecutor"]
    assert sess.device_name == first.device
    assert sess._background is None, "nothing left to tune, store or upgrade"  # noqa: SLF001
    # (the compiled model and the graphs were read while the CUDA context was being made)
    assert type(sess._programs).__name__ == "_Ahead" and not sess._programs._graphs  # noqa: SLF001
    second.run(second.random_inputs(0))
    assert fake.graph_launches > launches + 1  # (the load check, then the inference)
    # The verified graph ran the PTX linked into a cubin; the CUDA start loads that cubin
    # (no PTX compiled at a warm start) and nothing is linked again.
    assert fake.links == 1 and fake.cubins_loaded == 2


@pytest.mark.opencl
@pytest.mark.parametrize("damage", ["uuid", "garbage", "unverified", "cubin", "off"])
def test_a_cuda_start_that_does_not_hold_opens_opencl(fake, monkeypatch, tmp_path, damage):
    """A record of another GPU, an unreadable record, a program never verified as a graph,
    or LITEKILN_CUDA_GRAPH=off: the start goes through OpenCL, as if there were no record,
    and the session works."""
    from litekiln.interpreter import Interpreter
    from litekiln.runtime import device as device_mod

    _first_start_on_nvidia(fake, monkeypatch, tmp_path)
    cache = ModelCache.open(tmp_path)
    record = cache.load_gpu("")
    if damage == "uuid":
        cache.save_gpu("", {**record, "cuda_uuid": "ab" * 16})
    elif damage == "garbage":
        cache.save_gpu("", {"choice": "", "profile": "?"})
    elif damage == "unverified":
        monkeypatch.setattr(ModelCache, "load_graph", lambda self, *key: None)
    elif damage == "cubin":  # the driver refuses the stored device code (a driver update)
        load = fake.cuModuleLoadData

        def refuse_cubins(p, data):
            return 218 if data.startswith(_FAKE_ELF) else load(p, data)

        monkeypatch.setattr(fake, "cuModuleLoadData", refuse_cubins)
        fake.lib.cuModuleLoadData = ctypes.CFUNCTYPE(
            ctypes.c_int, *cuda._signatures()["cuModuleLoadData"][1]
        )(fake._guard(fake.cuModuleLoadData))
        monkeypatch.setattr(cuda, "_DRIVER", cuda._Driver(lib=fake.lib))
    else:
        monkeypatch.setenv("LITEKILN_CUDA_GRAPH", "off")
    opened = []
    real = device_mod.select_device
    monkeypatch.setattr(device_mod, "select_device", lambda c=None: opened.append(c) or real(c))
    interp = Interpreter(model_path="tests/data/smoke.tflite", cache_dir=str(tmp_path))
    interp.allocate_tensors()
    sess = interp._backend  # noqa: SLF001
    assert opened and not sess.startup.get("cuda_start")
    x = interp.random_inputs(0)
    ref = Interpreter(model_path="tests/data/smoke.tflite", device="reference").run(x)
    if damage == "off":  # (the other cases replay the fake's graph, which computes nothing)
        for got, want in zip(interp.run(x), ref, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.opencl
def test_inputs_go_straight_into_the_graphs_staging_and_each_thread_keeps_its_own(
    fake, monkeypatch, tmp_path
):
    """`set_tensor` (and `run`) write an input where the CUDA graph stages it: the session is
    handed that very array and copies it no further. What the API promises holds as before:
    each thread's inputs are its own (a thread whose value was there keeps it when another
    thread's inference overwrites the staging), an array from `tensor()` stays the thread's
    input, and a wrong dtype or shape is refused with the same error after the fast path."""
    import threading

    from litekiln.errors import InputError

    interp = _first_start_on_nvidia(fake, monkeypatch, tmp_path)
    sess = interp._backend  # noqa: SLF001
    (inp,) = [d["index"] for d in interp.get_input_details()]
    (stage,) = sess.executors[0].input_buffers()
    assert sess.input_stages() == {inp: stage}
    given: list[tuple[bool, np.ndarray]] = []
    run = sess.run

    def record(inputs):
        given.append((inputs[inp] is stage, np.array(inputs[inp], copy=True)))
        return run(inputs)

    monkeypatch.setattr(sess, "run", record)
    x0, x1 = interp.random_inputs(0)[0], interp.random_inputs(1)[0]

    interp.run([x0])
    assert given[-1][0], "staged in place: no second copy"
    np.testing.assert_array_equal(given[-1][1], x0)
    np.testing.assert_array_equal(interp.get_tensor(inp), x0)
    with pytest.raises(InputError, match="expects dtype float32, got float64"):
        interp.set_tensor(inp, x0.astype(np.float64))
    with pytest.raises(InputError, match=r"expects shape \[1, 32, 32, 3\]"):
        interp.set_tensor(inp, x0.reshape(-1))
    with pytest.raises(InputError, match="expects dtype float32, got float64"):
        interp.run([x0.astype(np.float64)])

    def other_thread():
        interp.set_tensor(inp, x1)
        interp.invoke()

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert given[-1][0]  # the other thread took the staging
    np.testing.assert_array_equal(given[-1][1], x1)
    np.testing.assert_array_equal(interp.get_tensor(inp), x0)  # this thread's input: its own
    interp.invoke()
    np.testing.assert_array_equal(given[-1][1], x0)

    view = interp.tensor(inp)()
    assert view is not stage, "an array the app writes is the thread's own"
    view[...] = x1
    interp.invoke()
    np.testing.assert_array_equal(given[-1][1], x1)
    interp.run([x0])
    np.testing.assert_array_equal(given[-1][1], x0)
    view[...] = x1  # still this thread's input buffer
    interp.invoke()
    np.testing.assert_array_equal(given[-1][1], x1)


def test_a_gpu_record_holds_only_for_the_same_gpu_drivers_and_opencl_setup(
    fake, monkeypatch, tmp_path
):
    """`cuda_start` refuses, naming why, a record of another choice, driver, CUDA version or
    OpenCL vendor set-up; with everything the same it opens the recorded GPU."""
    from litekiln.runtime import device as device_mod

    vendors = tmp_path / "vendors"
    vendors.mkdir()
    (vendors / "nvidia.icd").write_text("/usr/lib/libnvidia-opencl.so.1\n")
    monkeypatch.setenv("OCL_ICD_VENDORS", str(vendors))
    monkeypatch.setattr(device_mod, "nvidia_kernel_driver", lambda: "580.159.04")
    record = {
        "choice": "gpu",
        "profile": _profile("NVIDIA CUDA").as_record(),
        "cuda_uuid": "f0" * 16,
        "cuda_driver": 13000,
        "kernel_driver": "580.159.04",
        "opencl_setup": device_mod.opencl_setup(),
    }
    start = device_mod.cuda_start("gpu", record)
    assert start.cuda.uuid == "f0" * 16 and start.profile == _profile("NVIDIA CUDA")
    assert not start.profile.half  # (the recorded probe answer, no device asked)
    cases = {
        "recorded for device choice 'gpu'": ("", {}),
        "driver 580.159.04 was recorded, 590.1 runs": ("gpu", {"kernel": "590.1"}),
        "CUDA driver 12080 was recorded, 13000 runs": ("gpu", {"cuda_driver": 12080}),
        "OpenCL vendor set-up changed": ("gpu", {"icd": "intel.icd"}),
        "no CUDA device has the recorded GPU's UUID": ("gpu", {"cuda_uuid": "ab" * 16}),
    }
    for message, (choice, change) in cases.items():
        with monkeypatch.context() as m:
            rec = dict(record)
            if "kernel" in change:
                m.setattr(device_mod, "nvidia_kernel_driver", lambda v=change["kernel"]: v)
            if "icd" in change:
                (vendors / change["icd"]).write_text("/opt/intel/libintelocl.so\n")
            rec.update({k: v for k, v in change.items() if k in rec})
            with pytest.raises(device_mod.CudaStartMiss, match=message):
                device_mod.cuda_start(choice, rec)
            (vendors / "intel.icd").unlink(missing_ok=True)


def test_bench_profile_takes_each_kernels_own_time_in_the_graph(fake, monkeypatch, capsys):
    """`bench --profile` on the CUDA graph path: each launch's time inside the replayed graph
    (`litekiln.peers.kernel_trace.trace_graph`, CUPTI on the GPU machine; given here) beside
    the events' time, with the rates and the kernels' sum it makes; where the trace cannot be
    made, the profile says why and keeps the events' figures alone."""
    import types

    from litekiln import bench
    from litekiln.peers import kernel_trace

    prog = _axpb_program()
    b = np.zeros((10, 100), np.float32)
    ex = cuda.CudaGraphExecutor(prog, {"b": b}, _PTX.encode() + b"\0", cuda.CudaDevice(0))
    sess = types.SimpleNamespace(executors=[ex])
    replays = []

    def traced(replay, launches):
        before = fake.graph_launches
        replay()
        replays.append((fake.graph_launches - before, launches))
        return [2e-6, 1e-6]  # seconds, per launch

    monkeypatch.setattr(kernel_trace, "trace_graph", traced)
    prof = bench._kernel_profile(sess, reps=2)
    assert replays == [(1, 2)]  # the graph itself was replayed, with its two launches
    axpb, plus_one = prof["launches"]
    assert (axpb["graph_ms"], plus_one["graph_ms"]) == (0.002, 0.001)
    assert axpb["graph_gbps"] == pytest.approx(axpb["bytes"] / 2e-6 / 1e9, rel=1e-3)
    assert plus_one["graph_gbps"] == pytest.approx(plus_one["bytes"] / 1e-6 / 1e9, rel=1e-3)
    assert prof["graph_kernel_sum_ms"] == 0.003
    assert [t["kernel"] for t in prof["top"]] == ["axpb", "plus_one"]  # by time in the graph
    assert prof["top"][0]["graph_ms"] == 0.002
    bench._print_profile({"profile": prof, "litekiln_ms": 0.01})
    out = capsys.readouterr().out
    assert "inside the CUDA graph (CUPTI): 0.003 ms" in out and "graph ms" in out

    monkeypatch.setattr(
        kernel_trace, "trace_graph", lambda replay, launches: "torch sees no CUDA device"
    )
    prof = bench._kernel_profile(sess, reps=2)
    assert prof["graph_ms_error"] == "torch sees no CUDA device"
    assert "graph_kernel_sum_ms" not in prof
    assert all("graph_ms" not in r for r in prof["launches"])
    bench._print_profile({"profile": prof, "litekiln_ms": 0.01})
    assert "n/a (torch sees no CUDA device)" in capsys.readouterr().out
