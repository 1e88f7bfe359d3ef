"""A zero PAD of height/width that only feeds convolutions is folded into their padding
(litekiln/compiler/lower.py `_find_pad_folds`): no pad kernel, the same numbers as the numpy
reference; any other PAD stays a kernel of its own."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tvm")

import litekiln  # noqa: E402
from litekiln.artifact.compiled import CompileOptions  # noqa: E402
from litekiln.compiler.driver import compile_model  # noqa: E402
from litekiln.model import load_model  # noqa: E402
from tests.tflite_builder import ModelBuilder  # noqa: E402

RNG = np.random.default_rng(7)


def _w(*shape: int) -> np.ndarray:
    return RNG.uniform(-1, 1, shape).astype(np.float32)


def _conv(b, x, out_shape, *, depthwise=False, stride=2, padding="VALID", cin=4, cout=6):
    if depthwise:
        w, bias = b.const("w", _w(1, 3, 3, cin)), b.const("b", _w(cin))
        return b.op(
            "DEPTHWISE_CONV_2D",
            [x, w, bias],
            out_shape=out_shape,
            options={
                "padding": padding,
                "stride_w": stride,
                "stride_h": stride,
                "depth_multiplier": 1,
                "fused_activation_function": "RELU6",
            },
        )
    w, bias = b.const("w", _w(cout, 3, 3, cin)), b.const("b", _w(cout))
    return b.op(
        "CONV_2D",
        [x, w, bias],
        out_shape=out_shape,
        options={
            "padding": padding,
            "stride_w": stride,
            "stride_h": stride,
            "fused_activation_function": "RELU",
        },
    )


def _pad(b, x, pads, out_shape):
    return b.op("PAD", [x, b.const("pads", np.asarray(pads, np.int32))], out_shape=out_shape)


def _stride2_valid() -> bytes:
    # TF's SAME stride-2 conv as TFLite exports it: PAD (0, 1) then a VALID conv.
    b = ModelBuilder()
    x = b.input("x", [1, 9, 10, 4])
    p = _pad(b, x, [[0, 0], [0, 1], [1, 1], [0, 0]], [1, 10, 12, 4])
    b.output(_conv(b, p, [1, 4, 5, 6]))
    return b.build()


def _depthwise_same() -> bytes:
    # The PAD's widths add to SAME padding computed on the padded size.
    b = ModelBuilder()
    x = b.input("x", [1, 8, 8, 4])
    p = _pad(b, x, [[0, 0], [2, 0], [1, 3], [0, 0]], [1, 10, 12, 4])
    b.output(_conv(b, p, [1, 10, 12, 4], depthwise=True, stride=1, padding="SAME"))
    return b.build()


def _internal_source() -> bytes:
    # The PAD's source is computed inside the partition (half storage under fp16).
    b = ModelBuilder()
    x = b.input("x", [1, 9, 10, 4])
    h = _conv(b, x, [1, 9, 10, 4], depthwise=True, stride=1, padding="SAME")
    p = _pad(b, h, [[0, 0], [0, 1], [1, 1], [0, 0]], [1, 10, 12, 4])
    b.output(_conv(b, p, [1, 4, 5, 6]))
    return b.build()


def _two_convs() -> bytes:
    b = ModelBuilder()
    x = b.input("x", [1, 9, 9, 4])
    p = _pad(b, x, [[0, 0], [1, 1], [1, 1], [0, 0]], [1, 11, 11, 4])
    y1 = _conv(b, p, [1, 5, 5, 6])
    y2 = _conv(b, p, [1, 9, 9, 4], depthwise=True, stride=1)
    b.output(y1, y2)
    return b.build()


def _pad_also_added() -> bytes:
    # The padded tensor is read by an ADD too: the PAD must stay.
    b = ModelBuilder()
    x = b.input("x", [1, 8, 8, 4])
    p = _pad(b, x, [[0, 0], [1, 1], [1, 1], [0, 0]], [1, 10, 10, 4])
    y = _conv(b, p, [1, 10, 10, 4], depthwise=True, stride=1, padding="SAME")
    b.output(b.op("ADD", [y, p], out_shape=[1, 10, 10, 4]))
    return b.build()


def _channel_pad() -> bytes:
    # Channel padding is not a convolution's padding: the PAD must stay.
    b = ModelBuilder()
    x = b.input("x", [1, 8, 8, 2])
    p = _pad(b, x, [[0, 0], [0, 0], [0, 0], [1, 1]], [1, 8, 8, 4])
    b.output(_conv(b, p, [1, 3, 3, 6]))
    return b.build()


CASES = {
    "stride2_valid": (_stride2_valid, True),
    "depthwise_same": (_depthwise_same, True),
    "internal_source": (_internal_source, True),
    "two_convs": (_two_convs, True),
    "pad_also_added": (_pad_also_added, False),
    "channel_pad": (_channel_pad, False),
}


def _run(data: bytes, xs: list[np.ndarray], **kw) -> list[np.ndarray]:
    it = litekiln.Interpreter(model_content=data, **kw)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), xs, strict=True):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_pad_fold(name: str, precision: str, tmp_path) -> None:
    make, folded = CASES[name]
    data = make()
    model = load_model(data)
    program = (
        compile_model(model, CompileOptions(precision=precision), warn=False).partitions[0].program
    )
    kernels = [launch.func for launch in program.launches]  # (kernels are minified: k0, k1...)
    pad_kernels = [k for k in kernels if "pad" in k and "conv" not in k]
    assert (not pad_kernels) == folded, kernels
    if folded:  # nothing but the convolutions (a float32 partition input is read as is)
        assert all("conv" in k for k in kernels), kernels

    xs = [
        RNG.uniform(-1, 1, t.shape).astype(np.float32)
        for t in (model.main.tensors[i] for i in model.main.inputs)
    ]
    want = _run(data, xs, device="reference")
    got = _run(data, xs, precision=precision, cache_dir=tmp_path)
    tol = 1e-5 if precision == "fp32" else 1e-2
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=tol * max(1.0, float(np.abs(w).max())), rtol=0)
