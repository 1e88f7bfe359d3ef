"""Carried states: ``Interpreter.carry_state`` feeds a graph output back into a graph input
after every ``invoke``, on the device (issue 19).

The model is a recurrent cell made of plain ops, ``h' = tanh(x W^T + h U^T + b)`` and a readout
``y = h' V^T``, with ``h`` a graph input and ``h'`` a graph output. LiteRT has no such feature:
its app copies ``h'`` out with ``get_tensor`` and back in with ``set_tensor`` at every step, and
that loop, run by LiteRT, is the reference for every step of litekiln's carried one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_zero_copy import fake  # noqa: F401 - the fake CUDA driver fixture
from tflite_builder import ModelBuilder

import litekiln
from litekiln.errors import InputError

DEPTH, UNITS, STEPS = 5, 7, 6
TOL = 1e-4  # float32 on both sides: only the order of the sums and tanh differ (~1e-6)


def rnn_model() -> tuple[bytes, np.ndarray]:
    """The cell (inputs x [1, DEPTH], h [1, UNITS]; outputs h' and y) and STEPS inputs x."""
    rng = np.random.default_rng(19)
    b = ModelBuilder()
    x = b.input("x", [1, DEPTH])
    h = b.input("h", [1, UNITS])
    w = b.const("w", rng.uniform(-1, 1, [UNITS, DEPTH]).astype(np.float32))
    u = b.const("u", rng.uniform(-1, 1, [UNITS, UNITS]).astype(np.float32))
    v = b.const("v", rng.uniform(-1, 1, [3, UNITS]).astype(np.float32))
    bias = rng.uniform(-1, 1, UNITS).astype(np.float32)
    zeros = np.zeros(UNITS, np.float32)
    xw = b.op("FULLY_CONNECTED", [x, w, bias], out_shape=[1, UNITS])
    hu = b.op("FULLY_CONNECTED", [h, u, zeros], out_shape=[1, UNITS])
    pre = b.op("ADD", [xw, hu], out_shape=[1, UNITS])
    h_new = b.op("TANH", [pre], out_shape=[1, UNITS])
    y = b.op("FULLY_CONNECTED", [h_new, v, np.zeros(3, np.float32)], out_shape=[1, 3])
    b.output(h_new, y)
    xs = rng.uniform(-1, 1, [STEPS, 1, DEPTH]).astype(np.float32)
    return b.build(), xs


def litert_loop(model: bytes, xs: np.ndarray, h0: np.ndarray) -> list[list[np.ndarray]]:
    """LiteRT, the app copying h' back into h through the host at each step."""
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_content=model)
    it.allocate_tensors()
    (x_in, h_in), (h_out, y_out) = (
        [d["index"] for d in it.get_input_details()],
        [d["index"] for d in it.get_output_details()],
    )
    h, out = h0, []
    for x in xs:
        it.set_tensor(x_in, x)
        it.set_tensor(h_in, h)
        it.invoke()
        h = it.get_tensor(h_out)
        out.append([h, it.get_tensor(y_out)])
    return out


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    err = float(np.abs(got.astype(np.float64) - want).max()) / max(1.0, float(np.abs(want).max()))
    assert err <= TOL, f"{what}: max|litekiln - LiteRT| / scale = {err:.3g} > {TOL}"


def _carried(device: str) -> tuple[litekiln.Interpreter, int, int, int, int]:
    model, _ = rnn_model()
    it = litekiln.Interpreter(model_content=model, device=device, use_cache=False)
    x_in, h_in = (d["index"] for d in it.get_input_details())
    h_out, y_out = (d["index"] for d in it.get_output_details())
    it.carry_state(h_out, h_in)
    return it, x_in, h_in, h_out, y_out


def _steps(it: litekiln.Interpreter, x_in: int, xs: np.ndarray, outs: tuple[int, int]) -> list:
    got = []
    for x in xs:
        it.set_tensor(x_in, x)
        it.invoke()
        got.append([it.get_tensor(t) for t in outs])
    return got


@pytest.mark.opencl
@pytest.mark.each_device
def test_carried_state_matches_litert_host_loop(cl_device: str) -> None:
    """Every step's h' and y equal LiteRT's host loop from a zero state; the state never
    crosses the host (both ends bound with no host copy, on the GPU path's memory)."""
    model, xs = rnn_model()
    want = litert_loop(model, xs, np.zeros([1, UNITS], np.float32))
    it, x_in, h_in, h_out, y_out = _carried(cl_device)
    got = _steps(it, x_in, xs, (h_out, y_out))
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        _close(g[0], w[0], f"step {k} h'")
        _close(g[1], w[1], f"step {k} y")
    bindings = it.get_bindings()
    assert set(bindings) == {h_in}  # the output is left as it was: read with get_tensor
    assert bindings[h_in]["carried_from"] == h_out
    assert bindings[h_in]["zero_copy"], bindings[h_in]["host_copies"]
    # get_tensor on the input shows the state the next invoke starts from: the last h'.
    np.testing.assert_array_equal(it.get_tensor(h_in), got[-1][0])


@pytest.mark.opencl
@pytest.mark.each_device
def test_carried_output_may_be_bound_by_the_app(cl_device: str) -> None:
    """The app binds the carried output to a buffer of its own: the state is copied from
    there, and the app's buffer holds each step's h'."""
    import pyopencl.array as cla

    model, xs = rnn_model()
    want = litert_loop(model, xs, np.zeros([1, UNITS], np.float32))
    it, x_in, h_in, h_out, y_out = _carried(cl_device)
    mine = cla.zeros(it.get_device().queue, (1, UNITS), np.float32)
    it.bind_output(h_out, mine)
    for k, x in enumerate(xs):
        it.set_tensor(x_in, x)
        it.invoke()
        _close(mine.get(), want[k][0].astype(np.float64), f"step {k} h' in the app's buffer")
        _close(it.get_tensor(y_out), want[k][1].astype(np.float64), f"step {k} y")


@pytest.mark.opencl
@pytest.mark.each_device
def test_set_tensor_sets_the_state_and_reset_zeroes_it(cl_device: str) -> None:
    model, xs = rnn_model()
    h0 = np.linspace(-0.9, 0.9, UNITS, dtype=np.float32).reshape(1, UNITS)
    it, x_in, h_in, h_out, y_out = _carried(cl_device)
    _steps(it, x_in, xs[:2], (h_out, y_out))  # some state, then replaced
    it.set_tensor(h_in, h0)
    np.testing.assert_array_equal(it.get_tensor(h_in), h0)
    got = _steps(it, x_in, xs[:3], (h_out, y_out))
    for k, (g, w) in enumerate(zip(got, litert_loop(model, xs[:3], h0), strict=True)):
        _close(g[0], w[0], f"from h0, step {k} h'")
    it.reset_all_variables()
    np.testing.assert_array_equal(it.get_tensor(h_in), np.zeros([1, UNITS], np.float32))
    got = _steps(it, x_in, xs[:2], (h_out, y_out))
    zero = np.zeros([1, UNITS], np.float32)
    for k, (g, w) in enumerate(zip(got, litert_loop(model, xs[:2], zero), strict=True)):
        _close(g[1], w[1], f"after reset, step {k} y")


def test_carried_on_the_host_with_the_reference() -> None:
    """device="reference" carries the state on the host, with the same results."""
    model, xs = rnn_model()
    it, x_in, _, h_out, y_out = _carried("reference")
    got = _steps(it, x_in, xs, (h_out, y_out))
    for k, (g, w) in enumerate(
        zip(got, litert_loop(model, xs, np.zeros([1, UNITS], np.float32)), strict=True)
    ):
        _close(g[1], w[1], f"reference, step {k} y")


@pytest.mark.opencl
def test_carry_refusals_and_unbind() -> None:
    model, xs = rnn_model()
    it = litekiln.Interpreter(model_content=model, use_cache=False)
    x_in, h_in = (d["index"] for d in it.get_input_details())
    h_out, y_out = (d["index"] for d in it.get_output_details())
    with pytest.raises(InputError, match="takes a graph output and a graph input"):
        it.carry_state(h_in, h_out)  # the wrong way round
    with pytest.raises(InputError, match=r"float32\[1, 3\].*float32\[1, 7\].*must match"):
        it.carry_state(y_out, h_in)
    it.carry_state(h_out, h_in)
    with pytest.raises(InputError, match="already carries output"):
        it.carry_state(h_out, h_in)
    with pytest.raises(InputError, match="carries a state"):
        it.bind_input(h_in, object())
    it.set_tensor(x_in, xs[0])
    it.invoke()
    it.unbind(h_out)  # either end ends the carry: h is an input to set again
    assert it.get_bindings() == {}
    with pytest.raises(InputError, match="inputs not set before invoke"):
        it.invoke()
    it.set_tensor(h_in, np.zeros([1, UNITS], np.float32))
    it.invoke()


def test_cuda_state_buffers_are_litekilns_memory_copied_on_the_device(fake):  # noqa: F811
    """On the CUDA graph path a carried state lives in memory litekiln allocates (cuMemAlloc,
    with no DLPack export before each run), and the copy from the output's
    buffer into the input's is one device-to-device copy on the session's stream."""
    from litekiln.runtime import cuda
    from litekiln.runtime.buffers import TensorSlot, state_buffer

    device = cuda.CudaDevice(0)

    def make(role: str, index: int) -> Any:
        slot = TensorSlot(role, index, "h", (1, UNITS), np.dtype(np.float32))
        return state_buffer("cuda", slot, context=None, queue=None, cuda_device=lambda: device)

    dst, src = make("input", 1), make("output", 5)  # src: as a partition's output memory
    assert dst.kind == "cuda" and not dst.sync and dst.describe().startswith("litekiln's CUDA")
    np.testing.assert_array_equal(dst.read(), np.zeros([1, UNITS], np.float32))
    value = np.arange(UNITS, dtype=np.float32).reshape(1, UNITS)
    src.write(value)
    dst.copy_from(src.address)  # through the (fake) driver's cuMemcpyDtoDAsync
    np.testing.assert_array_equal(dst.read(), value)


def test_cuda_graph_forwards_an_output_in_the_graph(fake):  # noqa: F811
    """On the CUDA graph path the carried state's copy is a node of the graph (no driver call
    of its own per run), after the kernels, from where the output is written."""
    from test_cuda_graph import _PTX, _axpb_program

    from litekiln.runtime import cuda

    prog = _axpb_program()  # x (input) -> z = 2.5 x + b + 1 (output)
    b = np.linspace(-1, 1, 1000, dtype=np.float32).reshape(10, 100)
    ex = cuda.CudaGraphExecutor(prog, {"b": b}, _PTX.encode() + b"\0", cuda.CudaDevice(0))
    x = np.random.default_rng(0).standard_normal((10, 100)).astype(np.float32)
    state = np.zeros((10, 100), np.float32)
    ex.forward_output(0, state.ctypes.data)
    ex.set_input(0, x)
    ex.run()
    np.testing.assert_allclose(ex.get_output(0), 2.5 * x + b + 1, rtol=1e-6)
    np.testing.assert_array_equal(state, ex.get_output(0))
    nodes = [c for c, _ in fake.graphs[max(fake.graphs)] if c[0] == "copy"]
    assert (state.ctypes.data, ex.output_buffer(0), 4000) in [n[1:] for n in nodes]
    ex.drop_forwards()
    state[...] = 0
    ex.run()
    ex.get_output(0)
    assert not state.any(), "a dropped forward copies nothing"


def lstm_model(depth: int = 6, units: int = 5) -> bytes:
    """One basic LSTM cell (batch 1), PyTorch's initialisation (a stable recurrence); inputs x,
    act, state; outputs the new activation and state."""
    rng = np.random.default_rng(7)
    k = 1.0 / np.sqrt(units)
    b = ModelBuilder()
    x, h, c = b.input("x", [1, depth]), b.input("act", [1, units]), b.input("state", [1, units])
    w = b.const("w", rng.uniform(-k, k, [4 * units, depth + units]).astype(np.float32))
    bias = b.const("b", rng.uniform(-k, k, [4 * units]).astype(np.float32))
    outs = [b.tensor(n, s) for n, s in (("new_act", [1, units]), ("new_state", [1, units]))]
    outs += [b.tensor("concat", [1, depth + units]), b.tensor("activ", [1, 4 * units])]
    options = {"fused_activation_function": "TANH", "kernel_type": "BASIC"}
    b.op("LSTM", [x, h, w, bias, c], outputs=outs, options=options, version=2)
    b.output(outs[0], outs[1])
    return b.build()


def _lstm_steps(it: Any, xs: np.ndarray) -> list[list[np.ndarray]]:
    """Set only x at each step; read the new activation and both state inputs."""
    x_in, act_in, state_in = (d["index"] for d in it.get_input_details())
    act_out = it.get_output_details()[0]["index"]
    got = []
    for x in xs:
        it.set_tensor(x_in, x[:, :6])
        it.invoke()
        got.append([it.get_tensor(t) for t in (act_out, act_in, state_in)])
    return got


@pytest.mark.opencl
@pytest.mark.each_device
@pytest.mark.parametrize("device", ["gpu", "reference"])
def test_basic_lstm_carries_its_state_as_litert_does(cl_device: str, device: str) -> None:
    """LiteRT's basic LSTM kernel copies its new activation and state into its own inputs
    after each invoke (lstm.cc basic::Eval): an app sets the state once and steps x. litekiln
    does the same, on the device; reset_all_variables leaves that state alone, as LiteRT's
    does; set_tensor restarts it."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    model = lstm_model()
    xs = np.random.default_rng(3).uniform(-1, 1, [STEPS, 1, 6]).astype(np.float32)
    zero = np.zeros([1, 5], np.float32)
    ours = litekiln.Interpreter(
        model_content=model, use_cache=False, device=cl_device if device == "gpu" else "reference"
    )
    lite = LiteRT(model_content=model)
    lite.allocate_tensors()
    for it in (ours, lite):
        it.set_tensor(1, zero)
        it.set_tensor(2, zero)
    want, got = _lstm_steps(lite, xs[:3]), _lstm_steps(ours, xs[:3])
    for it in (ours, lite):
        it.reset_all_variables()  # not a variable tensor: the state stays
    want += _lstm_steps(lite, xs[3:])
    got += _lstm_steps(ours, xs[3:])
    for it in (ours, lite):
        it.set_tensor(1, zero)  # restart
        it.set_tensor(2, zero)
    want += _lstm_steps(lite, xs[:2])
    got += _lstm_steps(ours, xs[:2])
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        for a, b, what in zip(g, w, ("new activation", "act input", "state input"), strict=True):
            _close(a, b.astype(np.float64), f"step {k} {what}")
    if device == "gpu":
        bindings = ours.get_bindings()
        assert {t: b["carried_from"] for t, b in bindings.items() if b["carried_from"]} == {
            1: 5,
            2: 6,
        }
        assert all(b["zero_copy"] for b in bindings.values())


@pytest.mark.opencl
@pytest.mark.each_device
def test_basic_lstm_state_set_before_the_device_opens(cl_device: str) -> None:
    """A state set on a fresh interpreter, before allocate_tensors (``run`` does it that way),
    is the one the first invoke uses: the device buffer that carries the state is made when
    the device opens, and takes that value (it used to start at zero)."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    model = lstm_model()
    rng = np.random.default_rng(11)
    x, act, state = (rng.uniform(-1, 1, s).astype(np.float32) for s in ([1, 6], [1, 5], [1, 5]))
    lite = LiteRT(model_content=model)
    lite.allocate_tensors()
    for i, v in enumerate((x, act, state)):
        lite.set_tensor(i, v)
    lite.invoke()
    want = [lite.get_tensor(d["index"]) for d in lite.get_output_details()]
    assert np.abs(want[0]).max() > 0.05  # (the state matters: zeros give other outputs)
    ours = litekiln.Interpreter(model_content=model, use_cache=False, device=cl_device)
    got = ours.run([x, act, state])
    for g, w in zip(got, want, strict=True):
        _close(g, w.astype(np.float64), "first invoke after run()")
    fresh = litekiln.Interpreter(model_content=model, use_cache=False, device=cl_device)
    for i, v in enumerate((x, act, state)):
        fresh.set_tensor(i, v)
    fresh.invoke()  # (allocates here)
    for d, w in zip(fresh.get_output_details(), want, strict=True):
        _close(fresh.get_tensor(d["index"]), w.astype(np.float64), "set_tensor then invoke")
