"""A depthwise convolution folded into the 1x1 convolution that reads it (litekiln/compiler/
lowering.py `_find_depthwise_folds`, `conv_folded`): MobileNet's blocks as one kernel. Each
case against the numpy reference in fp32 and fp16, with the kernels it must save against the
same model lowered without the fold; every schedule option of a folded convolution on PoCL;
and the cases that must stay apart kept apart.

On PoCL, fp16 runs as emulated half, which folds nothing: the fp16 cases check that path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tvm")

from gpu_helper import assert_matches_reference  # noqa: E402

import litekiln  # noqa: E402
from litekiln.artifact.compiled import CompileOptions  # noqa: E402
from litekiln.compiler.driver import plan_partitions  # noqa: E402
from litekiln.model import load_model  # noqa: E402
from tests.tflite_builder import ModelBuilder  # noqa: E402

RNG = np.random.default_rng(23)
C = 8


def _w(*shape: int) -> np.ndarray:
    return RNG.uniform(-1, 1, shape).astype(np.float32)


def _dw(b, x, shape, *, k=3, stride=1, padding="SAME", act="RELU6", dilation=1, mult=1):
    cin = shape[3] // mult
    w, bias = b.const("dw", _w(1, k, k, shape[3])), b.const("db", _w(shape[3]))
    options = {"padding": padding, "stride_w": stride, "stride_h": stride}
    options.update(depth_multiplier=mult, fused_activation_function=act)
    options["dilation_w_factor"] = options["dilation_h_factor"] = dilation
    del cin
    return b.op("DEPTHWISE_CONV_2D", [x, w, bias], out_shape=shape, options=options)


def _pw(b, x, shape, cin=C, *, k=1, act="RELU6", stride=1):
    w, bias = b.const("w", _w(shape[3], k, k, cin)), b.const("b", _w(shape[3]))
    options = {"padding": "SAME", "stride_w": stride, "stride_h": stride}
    options["fused_activation_function"] = act
    return b.op("CONV_2D", [x, w, bias], out_shape=shape, options=options)


def _block() -> bytes:
    # MobileNetV1's block: 3x3 depthwise, ReLU6; 1x1, ReLU6.
    b = ModelBuilder()
    x = b.input("x", [1, 7, 6, C])
    b.output(_pw(b, _dw(b, x, [1, 7, 6, C]), [1, 7, 6, 12]))
    return b.build()


def _strided_pad() -> bytes:
    # TF's stride-2 block: PAD, then a VALID depthwise convolution; a residual after the 1x1.
    b = ModelBuilder()
    x = b.input("x", [1, 9, 8, C])
    pads = b.const("pads", np.asarray([[0, 0], [0, 1], [0, 1], [0, 0]], np.int32))
    p = b.op("PAD", [x, pads], out_shape=[1, 10, 9, C])
    d = _dw(b, p, [1, 4, 4, C], stride=2, padding="VALID", act="RELU")
    y = _pw(b, d, [1, 4, 4, 6], act="NONE")
    r = b.input("r", [1, 4, 4, 6])
    b.output(b.op("ADD", [y, r], out_shape=[1, 4, 4, 6]))
    return b.build()


def _wide_window() -> bytes:
    # A 5x5 depthwise convolution without activation, dilated 3x3 one before it.
    b = ModelBuilder()
    x = b.input("x", [1, 8, 7, C])
    d1 = _dw(b, x, [1, 8, 7, C], dilation=2, act="NONE")
    d2 = _dw(b, _pw(b, d1, [1, 8, 7, C]), [1, 8, 7, C], k=5, act="NONE")
    b.output(_pw(b, d2, [1, 8, 7, 4], act="NONE"))
    return b.build()


def _kept_apart() -> bytes:
    # Read twice (a 1x1 and an ADD), read by a 3x3, leaving the model, 7x7 (49 taps), with a
    # depth multiplier: none folds.
    b = ModelBuilder()
    x = b.input("x", [1, 7, 6, C])
    s = [1, 7, 6, C]
    d0 = _dw(b, x, s)
    a = b.op("ADD", [_pw(b, d0, s), d0], out_shape=s)
    d1 = _dw(b, a, s)
    t = _pw(b, d1, s, k=3)
    d2 = _dw(b, t, s)
    o = _pw(b, d2, s)
    d3 = _dw(b, o, s, k=7)
    d4 = _dw(b, _pw(b, d3, [1, 7, 6, 4]), [1, 7, 6, 8], mult=2)
    b.output(_pw(b, d4, s), d2)
    return b.build()


#: name -> (model, kernels the fold saves)
CASES: dict[str, tuple[Callable[[], bytes], int]] = {
    "block": (_block, 1),
    "strided_pad": (_strided_pad, 1),
    "wide_window": (_wide_window, 2),
    "kept_apart": (_kept_apart, 0),
}


def _launches(data: bytes, fold: bool) -> list[str]:
    from litekiln.compiler.codegen import compile_relax_full
    from litekiln.compiler.lower import LowerOptions, lower_partition

    model = load_model(data)
    part = plan_partitions(model, CompileOptions()).partitions[0]
    mod = lower_partition(model.main, part, LowerOptions(fold_depthwise=fold))
    return [la.func for la in compile_relax_full(mod, target="opencl").program.launches]


@pytest.mark.parametrize("name", list(CASES))
def test_depthwise_fold_saves_kernels(name: str) -> None:
    make, saved = CASES[name]
    data = make()
    folded, apart = _launches(data, True), _launches(data, False)
    assert len(apart) - len(folded) == saved, (folded, apart)
    assert sum("depthwise_in" in f for f in folded) == saved, folded


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_depthwise_fold_matches_reference(name: str, precision: str, tmp_path) -> None:
    assert_matches_reference(CASES[name][0](), precision, tmp_path, RNG)


@pytest.mark.opencl
@pytest.mark.parametrize("make", [_block, _strided_pad, _wide_window])
def test_every_schedule_option_of_a_folded_depthwise_matches(make: Any, tmp_path) -> None:
    """The GPU profile's rule and each tuning variant take the folded convolution, each
    option within float32 rounding of the numpy reference on PoCL; and the CPU profile."""
    data = make()
    model = load_model(data)
    xs = [
        RNG.uniform(-1, 1, t.shape).astype(np.float32)
        for t in (model.main.tensors[i] for i in model.main.inputs)
    ]
    want = litekiln.Interpreter(model_content=data, device="reference").run(xs)
    tol = [1e-5 * max(1.0, float(np.abs(w).max())) for w in want]

    def check(got: list[np.ndarray], what: str) -> None:
        for g, w, t in zip(got, want, tol, strict=True):
            np.testing.assert_allclose(g, w, atol=t, rtol=0, err_msg=what)

    cpu = litekiln.Interpreter(model_content=data, schedules="fast-cpu", cache_dir=tmp_path)
    check(cpu.run(xs), "fast-cpu")
    gpu = litekiln.Interpreter(
        model_content=data, schedules="fast", tune=False, cache_dir=tmp_path / "g"
    )
    gpu.allocate_tensors()
    ex = gpu._backend.executors[0]  # noqa: SLF001 - the test drives the executor's options
    assert any("depthwise_in" in la.func for la in ex.program.launches)
    check(gpu.run(xs), "fast, default options")
    for i, v in enumerate(ex.program.variants):
        if "depthwise_in" not in v.func:
            continue
        for c in range(1, len(v.options) + 1):
            choices = [0] * len(ex.program.variants)
            choices[i] = c
            ex.select(choices)
            check(gpu.run(xs), f"{v.func} option {c}")
