"""STABLEHLO_REDUCE_WINDOW: litert-torch writes PyTorch's avg_pool2d (timm's NextViT) as a window
sum of it. The numpy reference against LiteRT (windows, strides, base and window dilations,
paddings and crops, every body LiteRT takes, an init value other than the body's identity),
and the GPU form against LiteRT on PoCL (float32, the arithmetic bodies), whole on the GPU."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tflite_builder import ModelBuilder

import litekiln
from litekiln.artifact.compiled import CompileOptions
from litekiln.compiler.driver import compile_model
from litekiln.errors import ModelValidationError
from litekiln.model import load_model

BODIES = {"add": "ADD", "mul": "MUL", "max": "MAXIMUM", "min": "MINIMUM", "and": "LOGICAL_AND"}


def _model(
    shape: list[int],
    body: str,
    init: float,
    out: list[int],
    dtype: str = "float32",
    chain: bool = False,
    **options: Any,
) -> bytes:
    """x -> STABLEHLO_REDUCE_WINDOW(x, init) with subgraph 1 as its body; ``chain``: x + x
    before it and y + y after it."""
    b = ModelBuilder()
    x = b.input("x", shape, dtype)
    if chain:
        x = b.op("ADD", [x, x])
    y = b.op(
        "STABLEHLO_REDUCE_WINDOW",
        [x, b.const("init", np.array(init, dtype))],
        out_shape=out,
        options={"body_subgraph_index": 1, **options},
    )
    b.output(b.op("ADD", [y, y]) if chain else y)
    sg = b.subgraph("body")
    lhs, rhs = sg.input("lhs", [], dtype), sg.input("rhs", [], dtype)
    sg.output(sg.op(BODIES[body], [lhs, rhs], out_shape=[]))
    return b.build()


def _opts(rank: int, **kw: Any) -> dict[str, Any]:
    ones = [1] * rank
    o = {
        "window_dimensions": ones,
        "window_strides": ones,
        "base_dilations": ones,
        "window_dilations": ones,
        "padding": [0] * (2 * rank),
    }
    o.update(kw)
    return o


#: (input shape, body, init, options, output shape)
CASES = {
    # NextViT's patch embedding: a 2x2 sum of an NHWC map, stride 2.
    "sum_pool_2x2": ([1, 8, 8, 6], "add", 0.0, dict(window_dimensions=[1, 2, 2, 1],
                     window_strides=[1, 2, 2, 1]), [1, 4, 4, 6]),
    "max_3x3_padded": ([1, 7, 9, 3], "max", -np.inf, dict(window_dimensions=[1, 3, 3, 1],
                       window_strides=[1, 2, 2, 1], padding=[0, 0, 1, 1, 1, 2, 0, 0]),
                       [1, 4, 5, 3]),
    "min_dilated_window": ([2, 10, 4], "min", np.inf, dict(window_dimensions=[1, 3, 2],
                           window_dilations=[1, 2, 1]), [2, 6, 3]),
    "sum_base_dilated_cropped": ([1, 5, 5, 2], "add", 0.0, dict(window_dimensions=[1, 2, 2, 1],
                                 base_dilations=[1, 2, 2, 1], padding=[0, 0, -1, 1, 0, 0, 0, 0]),
                                 [1, 9, 8, 2]),
    "mul_init_two": ([3, 8], "mul", 2.0, dict(window_dimensions=[1, 2], window_strides=[1, 2]),
                     [3, 4]),
    "sum_init_and_padding_count": ([6], "add", 0.5, dict(window_dimensions=[4],
                                   padding=[2, 1]), [6]),
}  # fmt: skip


def _case(name: str) -> tuple[bytes, np.ndarray]:
    shape, body, init, opts, out = CASES[name]
    data = _model(shape, body, init, out, **_opts(len(shape), **opts))
    x = np.random.default_rng(len(name)).uniform(0.5, 1.5, shape).astype(np.float32)
    return data, x


def _litert(data: bytes, x: np.ndarray) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_content=data)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return np.array(it.get_tensor(it.get_output_details()[0]["index"]))


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_matches_litert(name: str) -> None:
    data, x = _case(name)
    want = _litert(data, x)
    got = litekiln.Interpreter(model_content=data, device="reference").run([x])[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.opencl
@pytest.mark.parametrize("schedules", ["fast-cpu", "fast"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_matches_litert(name: str, schedules: str, tmp_path: Any) -> None:
    """Both schedule profiles (the GPUs' on PoCL too), fp32 and fp16 storage."""
    data, x = _case(name)
    want = _litert(data, x)
    options = CompileOptions(schedules=schedules, tuning=False)
    compiled = compile_model(load_model(data), options, warn=False)
    assert not compiled.cpu_reasons and len(compiled.partitions) == 1, compiled.cpu_reasons
    it = litekiln.Interpreter(
        model_content=data, cache_dir=tmp_path, schedules=schedules, tune=False
    )
    got = it.run([x])[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * max(1.0, float(np.abs(want).max())))


@pytest.mark.opencl
@pytest.mark.parametrize("name", ["sum_pool_2x2", "max_3x3_padded", "mul_init_two"])
def test_gpu_fp16_storage_matches_litert(name: str, tmp_path: Any) -> None:
    """``x + x -> reduce_window -> y + y``: the op reads and writes half storage inside the
    partition (its window reduced in float32); within fp16's 4e-3 of LiteRT's float32."""
    shape, body, init, opts, out = CASES[name]
    data = _model(shape, body, init, out, chain=True, **_opts(len(shape), **opts))
    x = np.random.default_rng(3).uniform(0.5, 1.5, shape).astype(np.float32)
    want = _litert(data, x)
    half = litekiln.Interpreter(model_content=data, cache_dir=tmp_path, precision="fp16")
    got = half.run([x])[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=4e-3 * max(1.0, float(np.abs(want).max())))


def test_logical_body_on_bools_runs_on_the_cpu() -> None:
    data = _model([2, 6], "and", True, [2, 3], "bool", **_opts(2, window_dimensions=[1, 2],
                  window_strides=[1, 2]))  # fmt: skip
    x = np.array([[1, 1, 0, 1, 1, 0], [0, 0, 1, 1, 1, 1]], bool)
    want = _litert(data, x)
    got = litekiln.Interpreter(model_content=data, device="reference").run([x])[0]
    np.testing.assert_array_equal(got, want)


def test_a_body_litert_does_not_take_is_refused_at_load() -> None:
    data = _model([4], "add", 0.0, [4], **_opts(1))
    model = load_model(data, validate=False)
    model.subgraphs[1].ops[0].name = "SUB"
    from litekiln.ops import validate_model

    with pytest.raises(ModelValidationError, match="body subgraph 1 runs"):
        validate_model(model)
