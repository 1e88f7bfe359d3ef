"""RNN, UNIDIRECTIONAL_SEQUENCE_RNN and SVDF (litekiln/ops/rnn.py) against LiteRT over
several invocations: the hidden state (SVDF: its memory), a variable tensor, carries from one
to the next as LiteRT's kernels write it back. Expanded at load into ops the GPU path runs
(with weights fed at run time, an SVDF stays one op on the CPU); all three were refused at
load before."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tflite_builder import ModelBuilder

import litekiln

F32 = np.float32
UNITS, DEPTH, BATCH, TIME = 6, 5, 2, 4


def _model(op: str, act: str, time_major: bool = False) -> bytes:
    rng = np.random.default_rng(5)
    b = ModelBuilder()
    if op == "RNN":
        x = b.input("x", [BATCH, DEPTH])
        out_shape = [BATCH, UNITS]
        options: dict[str, Any] = {"fused_activation_function": act}
    else:
        shape = [TIME, BATCH, DEPTH] if time_major else [BATCH, TIME, DEPTH]
        x = b.input("x", shape)
        out_shape = [*shape[:2], UNITS]
        options = {"fused_activation_function": act, "time_major": time_major}
    w = b.const("w", rng.uniform(-0.6, 0.6, [UNITS, DEPTH]).astype(F32))
    r = b.const("r", rng.uniform(-0.6, 0.6, [UNITS, UNITS]).astype(F32))
    bias = b.const("bias", rng.uniform(-0.5, 0.5, [UNITS]).astype(F32))
    h = b.tensor("h", [BATCH, UNITS], "float32", is_variable=True)
    y = b.op(op, [x, w, r, bias, h], out_shape=out_shape, options=options)
    b.output(y)
    return b.build()


def _feeds(model: bytes, n: int) -> list[np.ndarray]:
    shape = litekiln.load_model(model).main.tensors[0].shape
    rng = np.random.default_rng(9)
    return [rng.uniform(-1, 1, shape).astype(F32) for _ in range(n)]


def _litert(model: bytes, feeds: list[np.ndarray]) -> list[np.ndarray]:
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_content=model)
    it.allocate_tensors()
    x, y = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]
    out = []
    for f in feeds:
        it.set_tensor(x, f)
        it.invoke()
        out.append(it.get_tensor(y))
    return out


def _invocations_match_litert(
    model: bytes, n: int, device: str
) -> tuple[litekiln.Interpreter, list[np.ndarray], list[np.ndarray]]:
    """``n`` invocations of litekiln on ``device`` against LiteRT's, each output within
    2e-5; the interpreter, the inputs and LiteRT's outputs."""
    feeds = _feeds(model, n)
    want = _litert(model, feeds)
    it = litekiln.Interpreter(model_content=model, device=device, use_cache=False)
    it.allocate_tensors()
    for k, (f, w) in enumerate(zip(feeds, want, strict=True)):
        (got,) = it.run([f])
        np.testing.assert_allclose(got, w, atol=2e-5, err_msg=f"invocation {k}")
    return it, feeds, want


@pytest.mark.parametrize(
    ("op", "act", "time_major"),
    [
        ("RNN", "TANH", False),
        ("RNN", "RELU", False),
        ("RNN", "NONE", False),
        ("UNIDIRECTIONAL_SEQUENCE_RNN", "TANH", False),
        ("UNIDIRECTIONAL_SEQUENCE_RNN", "RELU6", True),
    ],
)
@pytest.mark.parametrize("device", ["reference", "opencl"])
def test_rnn_carries_its_state_as_litert(op: str, act: str, time_major: bool, device: str) -> None:
    model = _model(op, act, time_major)
    graph = litekiln.load_model(model).main
    assert not any(o.name == op for o in graph.live_ops())  # expanded into its steps
    from litekiln.artifact.compiled import CompileOptions
    from litekiln.compiler.driver import plan_partitions

    assert not plan_partitions(litekiln.load_model(model), CompileOptions()).cpu_reasons
    it, feeds, want = _invocations_match_litert(model, 3, device)
    it.reset_all_variables()  # (back to a zero state: the first invocation again)
    (again,) = it.run([feeds[0]])
    np.testing.assert_allclose(again, want[0], atol=2e-5)


def test_hybrid_rnn_is_refused_naming_it() -> None:
    b = ModelBuilder()
    x = b.input("x", [1, DEPTH])
    w = b.const("w", np.ones([UNITS, DEPTH], np.int8), "int8", quant=(0.1, 0))
    r = b.const("r", np.ones([UNITS, UNITS], np.int8), "int8", quant=(0.1, 0))
    h = b.tensor("h", [1, UNITS], "float32", is_variable=True)
    y = b.op("RNN", [x, w, r, np.zeros(UNITS, F32), h], out_shape=[1, UNITS],
             options={"fused_activation_function": "TANH"})  # fmt: skip
    b.output(y)
    with pytest.raises(litekiln.ModelError, match="hybrid"):
        litekiln.load_model(b.build())


def _svdf_model(rank: int, memory: int, bias: bool, act: str) -> bytes:
    rng = np.random.default_rng(rank * 10 + memory)
    units, filters = 4, 4 * rank
    b = ModelBuilder()
    x = b.input("x", [BATCH, DEPTH])
    wf = b.const("wf", rng.uniform(-0.7, 0.7, [filters, DEPTH]).astype(F32))
    wt = b.const("wt", rng.uniform(-0.7, 0.7, [filters, memory]).astype(F32))
    bv = b.const("bias", rng.uniform(-0.5, 0.5, [units]).astype(F32)) if bias else None
    s = b.tensor("state", [BATCH, filters * memory], "float32", is_variable=True)
    y = b.op("SVDF", [x, wf, wt, bv, s], out_shape=[BATCH, units],
             options={"rank": rank, "fused_activation_function": act})  # fmt: skip
    b.output(y)
    return b.build()


@pytest.mark.parametrize(
    ("rank", "memory", "bias", "act"),
    [(1, 3, True, "RELU"), (2, 5, True, "NONE"), (1, 1, False, "TANH"), (3, 4, False, "NONE")],
)
@pytest.mark.parametrize("device", ["reference", "opencl"])
def test_svdf_carries_its_memory_as_litert(
    rank: int, memory: int, bias: bool, act: str, device: str
) -> None:
    """SVDF (Google's keyword spotters) over five invocations: its memory shifts one column
    a call, as LiteRT's kernel keeps it; expanded into GPU ops at load."""
    model = _svdf_model(rank, memory, bias, act)
    graph = litekiln.load_model(model).main
    assert not any(o.name == "SVDF" for o in graph.live_ops())
    _invocations_match_litert(model, 5, device)


def test_svdf_with_weights_fed_at_run_time_runs_whole_on_the_cpu() -> None:
    """Weights fed as inputs: the SVDF stays one op (the numpy reference), its new memory an
    output of its own that the state variable takes after each invocation."""
    rng = np.random.default_rng(3)
    b = ModelBuilder()
    x = b.input("x", [1, DEPTH])
    wf = b.input("wf", [2, DEPTH])
    wt = b.const("wt", rng.uniform(-0.7, 0.7, [2, 3]).astype(F32))
    s = b.tensor("state", [1, 6], "float32", is_variable=True)
    y = b.op("SVDF", [x, wf, wt, -1, s], out_shape=[1, 2],
             options={"rank": 1, "fused_activation_function": "NONE"})  # fmt: skip
    b.output(y)
    model = b.build()
    assert [o.name for o in litekiln.load_model(model).main.live_ops()] == ["SVDF"]
    from ai_edge_litert.interpreter import Interpreter

    lit = Interpreter(model_content=model)
    lit.allocate_tensors()
    ours = litekiln.Interpreter(model_content=model, device="reference")
    w = rng.uniform(-1, 1, [2, DEPTH]).astype(F32)
    for k in range(4):
        xv = rng.uniform(-1, 1, [1, DEPTH]).astype(F32)
        for d, v in zip(lit.get_input_details(), (xv, w), strict=True):
            lit.set_tensor(d["index"], v)
        lit.invoke()
        want = lit.get_tensor(lit.get_output_details()[0]["index"])
        (got,) = ours.run([xv, w])
        np.testing.assert_allclose(got, want, atol=2e-5, err_msg=f"invocation {k}")
