"""RNN and UNIDIRECTIONAL_SEQUENCE_RNN (litekiln/ops/rnn.py) against LiteRT over several
invocations: the hidden state, a variable tensor, carries from one to the next as LiteRT's
kernels write it back. Expanded at load into per-step ops, the cell runs on the GPU path;
both were refused at load before."""

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
    feeds = _feeds(model, 3)
    want = _litert(model, feeds)
    it = litekiln.Interpreter(model_content=model, device=device, use_cache=False)
    it.allocate_tensors()
    for k, (f, w) in enumerate(zip(feeds, want, strict=True)):
        (got,) = it.run([f])
        np.testing.assert_allclose(got, w, atol=2e-5, err_msg=f"invocation {k}")
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
