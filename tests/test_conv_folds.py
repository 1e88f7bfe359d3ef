"""Producers folded into the convolutions that read them (litekiln/compiler/lowering.py
`conv_folded`, `conv_data`), each checked against the numpy reference in fp32 and fp16, with
the kernels it saves gone and the cases it must leave alone kept:

* a zero PAD of height and width (`_find_pad_folds`): TF's stride-2 SAME convolutions;
* a per-channel scale of a computed map (`_find_scale_folds`): a squeeze-and-excite gate,
  ``x * g`` with ``g`` 1x1x1xC;
* the NCHW -> NHWC transpose of a partition input (`_find_transpose_folds`): PyTorch's image;
  a patch embedding over it becomes a matrix product (`patch_embedding`);
* a concatenation along the channels (`_find_concat_folds`): SqueezeNet's fire modules;
* a slice of a run of channels (`_find_slice_folds`): ShuffleNet's channel split."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("tvm")

from gpu_helper import assert_matches_reference  # noqa: E402

import litekiln  # noqa: E402
from litekiln.artifact.compiled import CompileOptions  # noqa: E402
from litekiln.compiler.driver import compile_model  # noqa: E402
from litekiln.model import load_model  # noqa: E402
from tests.tflite_builder import ModelBuilder  # noqa: E402

RNG = np.random.default_rng(11)
C = 8


def _w(*shape: int) -> np.ndarray:
    return RNG.uniform(-1, 1, shape).astype(np.float32)


def _conv(b, x, out_shape, *, k=1, cin=C, cout=6, stride=1, act="NONE"):
    w, bias = b.const("w", _w(cout, k, k, cin)), b.const("b", _w(cout))
    options = {"padding": "SAME", "stride_w": stride, "stride_h": stride}
    options["fused_activation_function"] = act
    return b.op("CONV_2D", [x, w, bias], out_shape=out_shape, options=options)


def _depthwise(b, x, shape):
    w, bias = b.const("dw", _w(1, 3, 3, C)), b.const("db", _w(C))
    options = {"padding": "SAME", "stride_w": 1, "stride_h": 1, "depth_multiplier": 1}
    options["fused_activation_function"] = "RELU6"
    return b.op("DEPTHWISE_CONV_2D", [x, w, bias], out_shape=shape, options=options)


def _gate(b, h):
    """Squeeze and excite: mean over the map, two 1x1 convolutions, a sigmoid."""
    axes = b.const("axes", np.asarray([1, 2], np.int32))
    m = b.op("MEAN", [h, axes], out_shape=[1, 1, 1, C], options={"keep_dims": True})
    r = _conv(b, m, [1, 1, 1, 4], cout=4, act="RELU")
    e = _conv(b, r, [1, 1, 1, C], cin=4, cout=C)
    return b.op("LOGISTIC", [e], out_shape=[1, 1, 1, C])


def _squeeze_excite() -> bytes:
    b = ModelBuilder()
    x = b.input("x", [1, 6, 5, C])
    h = _depthwise(b, x, [1, 6, 5, C])
    s = b.op("MUL", [h, _gate(b, h)], out_shape=[1, 6, 5, C])
    b.output(_conv(b, s, [1, 6, 5, 6]))
    return b.build()


def _gate_first_two_readers() -> bytes:
    # MUL(g, x), read by a 1x1 and by a strided 3x3 convolution (padding and scale together).
    b = ModelBuilder()
    x = b.input("x", [1, 7, 6, C])
    g = b.input("g", [1, 1, 1, C])
    s = b.op("MUL", [g, x], out_shape=[1, 7, 6, C])
    b.output(_conv(b, s, [1, 7, 6, 6]), _conv(b, s, [1, 4, 3, 5], k=3, cout=5, stride=2))
    return b.build()


def _scaled_input(act: str = "NONE") -> tuple[ModelBuilder, object]:
    """A model's map input scaled by its gate input: the builder and the MUL's output."""
    b = ModelBuilder()
    x = b.input("x", [1, 6, 5, C])
    g = b.input("g", [1, 1, 1, C])
    options = {"fused_activation_function": act}
    return b, b.op("MUL", [x, g], out_shape=[1, 6, 5, C], options=options)


def _also_added() -> bytes:
    # The scaled map is read by an ADD too: the MUL must stay.
    b, s = _scaled_input()
    b.output(b.op("ADD", [_conv(b, s, [1, 6, 5, C], cout=C), s], out_shape=[1, 6, 5, C]))
    return b.build()


def _activated() -> bytes:
    # A MUL with a fused activation is not a plain scale.
    b, s = _scaled_input("RELU")
    b.output(_conv(b, s, [1, 6, 5, 6]))
    return b.build()


def _an_output() -> bytes:
    # The scaled map leaves the partition: it must be computed anyway.
    b, s = _scaled_input()
    b.output(_conv(b, s, [1, 6, 5, 6]), s)
    return b.build()


def _transpose(b, x, shape):
    perm = b.const("perm", np.asarray([0, 2, 3, 1], np.int32))
    return b.op("TRANSPOSE", [x, perm], out_shape=shape)


def _nchw_first_conv() -> bytes:
    # PyTorch's NCHW image, transposed for a strided 3x3 SAME convolution.
    b = ModelBuilder()
    x = b.input("x", [1, 3, 9, 8])
    b.output(_conv(b, _transpose(b, x, [1, 9, 8, 3]), [1, 5, 4, 6], k=3, cin=3, stride=2))
    return b.build()


def _nchw_pad_conv() -> bytes:
    # As litert-torch writes a padded first convolution: TRANSPOSE, PAD, VALID conv.
    b = ModelBuilder()
    x = b.input("x", [1, 3, 9, 8])
    t = _transpose(b, x, [1, 9, 8, 3])
    pads = b.const("pads", np.asarray([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32))
    p = b.op("PAD", [t, pads], out_shape=[1, 11, 10, 3])
    w, bias = b.const("w", _w(6, 3, 3, 3)), b.const("b", _w(6))
    options = {"padding": "VALID", "stride_w": 2, "stride_h": 2}
    b.output(b.op("CONV_2D", [p, w, bias], out_shape=[1, 5, 4, 6], options=options))
    return b.build()


def _nchw_depthwise() -> bytes:
    b = ModelBuilder()
    x = b.input("x", [1, C, 6, 5])
    b.output(_depthwise(b, _transpose(b, x, [1, 6, 5, C]), [1, 6, 5, C]))
    return b.build()


def _nchw_patches(h: int = 64, w: int = 66, k: int = 8, cout: int = 96) -> bytes:
    # A patch embedding (window = stride, VALID; the width's last 2 columns in no patch):
    # emitted as a matrix product over patches (`lowering.patch_embedding`), with the bias
    # and a fused RELU on its sums.
    b = ModelBuilder()
    x = b.input("x", [1, 3, h, w])
    t = _transpose(b, x, [1, h, w, 3])
    wt, bias = b.const("w", _w(cout, k, k, 3)), b.const("b", _w(cout))
    options = {"padding": "VALID", "stride_w": k, "stride_h": k}
    options["fused_activation_function"] = "RELU"
    out = [1, h // k, w // k, cout]
    b.output(b.op("CONV_2D", [t, wt, bias], out_shape=out, options=options))
    return b.build()


def _nchw_small_patches() -> bytes:
    # ConvNeXt's stem in small: 4x4 patches, SAME padding that pads nothing.
    b = ModelBuilder()
    x = b.input("x", [1, 3, 16, 12])
    t = _transpose(b, x, [1, 16, 12, 3])
    b.output(_conv(b, t, [1, 4, 3, 6], k=4, cin=3, stride=4))
    return b.build()


def _nchw_also_added() -> bytes:
    # The transposed image is read by an ADD too: the TRANSPOSE must stay.
    b = ModelBuilder()
    x = b.input("x", [1, C, 6, 5])
    t = _transpose(b, x, [1, 6, 5, C])
    b.output(b.op("ADD", [_depthwise(b, t, [1, 6, 5, C]), t], out_shape=[1, 6, 5, C]))
    return b.build()


def _concat(b, xs, shape):
    return b.op("CONCATENATION", xs, out_shape=shape, options={"axis": 3})


def _fire() -> bytes:
    # SqueezeNet's fire module: 1x1 and 3x3 expansions concatenated for the next 1x1.
    b = ModelBuilder()
    x = b.input("x", [1, 7, 6, C])
    e1 = _conv(b, x, [1, 7, 6, 5], cout=5, act="RELU")
    e3 = _conv(b, x, [1, 7, 6, 6], k=3, cout=6, act="RELU")
    cat = _concat(b, [e1, e3], [1, 7, 6, 11])
    b.output(_conv(b, cat, [1, 7, 6, 4], cin=11, cout=4))
    return b.build()


def _concat_input_pad_depthwise() -> bytes:
    # Three parts, one a partition input, through a folded PAD, into a depthwise conv.
    b = ModelBuilder()
    x = b.input("x", [1, 6, 5, 3])
    a = _conv(b, x, [1, 6, 5, 2], cin=3, cout=2)
    c = _conv(b, x, [1, 6, 5, 3], k=3, cin=3, cout=3)
    cat = _concat(b, [a, x, c], [1, 6, 5, C])
    pads = b.const("pads", np.asarray([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32))
    p = b.op("PAD", [cat, pads], out_shape=[1, 8, 7, C])
    w, bias = b.const("dw", _w(1, 3, 3, C)), b.const("db", _w(C))
    options = {"padding": "VALID", "stride_w": 1, "stride_h": 1, "depth_multiplier": 1}
    b.output(b.op("DEPTHWISE_CONV_2D", [p, w, bias], out_shape=[1, 6, 5, C], options=options))
    return b.build()


def _unit_depthwise(b, x, shape, stride=2, padding="VALID"):
    """A 1x1 depthwise convolution: a window and group width of 1."""
    w, bias = b.const("uw", _w(1, 1, 1, C)), b.const("ub", _w(C))
    options = {"padding": padding, "stride_w": stride, "stride_h": stride, "depth_multiplier": 1}
    return b.op("DEPTHWISE_CONV_2D", [x, w, bias], out_shape=shape, options=options)


def _concat_unit_depthwise() -> bytes:
    # timm's GhostNetV3: a concatenation read by a 1x1 stride-2 depthwise convolution and,
    # through a PAD, by a 3x3 one; the two summed. The 1x1 one's reduction loops have extent
    # 1, and (folded, a TE call) it added its bias twice: 8.5e-02 off on ghostnetv3_050.
    b = ModelBuilder()
    x = b.input("x", [1, 8, 8, 4])
    cat = _concat(b, [_conv(b, x, [1, 8, 8, 4], cin=4, cout=4), x], [1, 8, 8, C])
    one = _unit_depthwise(b, cat, [1, 4, 4, C])
    pads = b.const("pads", np.asarray([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32))
    p = b.op("PAD", [cat, pads], out_shape=[1, 10, 10, C])
    w, bias = b.const("dw", _w(1, 3, 3, C)), b.const("db", _w(C))
    options = {"padding": "VALID", "stride_w": 2, "stride_h": 2, "depth_multiplier": 1}
    three = b.op("DEPTHWISE_CONV_2D", [p, w, bias], out_shape=[1, 4, 4, C], options=options)
    b.output(b.op("ADD", [one, three], out_shape=[1, 4, 4, C]))
    return b.build()


def _concat_also_pooled() -> bytes:
    # Read by a max pool too: the CONCATENATION must stay.
    b = ModelBuilder()
    x = b.input("x", [1, 6, 6, C])
    cat = _concat(b, [_conv(b, x, [1, 6, 6, 3], cout=3), x], [1, 6, 6, 11])
    pool = {"padding": "VALID", "stride_w": 2, "stride_h": 2, "filter_width": 2}
    pool["filter_height"] = 2
    b.output(
        _conv(b, cat, [1, 6, 6, 4], cin=11, cout=4),
        b.op("MAX_POOL_2D", [cat], out_shape=[1, 3, 3, 11], options=pool),
    )
    return b.build()


def _slice(b, x, begin, size, shape):
    ints = [
        b.const("begin", np.asarray(begin, np.int32)),
        b.const("size", np.asarray(size, np.int32)),
    ]
    return b.op("SLICE", [x, *ints], out_shape=shape)


def _shuffle_block() -> bytes:
    # ShuffleNet's channel split: a computed map's channels in two runs, each through a 1x1
    # convolution (ShuffleNet passes the first run on; here a convolution reads it too, so
    # that both offsets are folded), then side by side again.
    b = ModelBuilder()
    x = b.input("x", [1, 6, 5, C])
    h = _depthwise(b, x, [1, 6, 5, C])
    first = _slice(b, h, [0, 0, 0, 0], [1, 6, 5, 3], [1, 6, 5, 3])
    second = _slice(b, h, [0, 0, 0, 3], [-1, -1, -1, -1], [1, 6, 5, 5])
    y1 = _conv(b, first, [1, 6, 5, 4], cin=3, cout=4)
    y2 = _conv(b, second, [1, 6, 5, 5], cin=5, cout=5, act="RELU")
    b.output(_concat(b, [y1, y2], [1, 6, 5, 9]))
    return b.build()


def _strided_slice_pad_depthwise() -> bytes:
    # A STRIDED_SLICE of channels 2-6 of an input, through a folded PAD, into a depthwise conv
    # and a strided 3x3 conv.
    b = ModelBuilder()
    x = b.input("x", [1, 7, 6, C])
    spec = (("begin", [0, 0, 0, 2]), ("end", [1, 7, 6, 6]), ("strides", [1, 1, 1, 1]))
    ints = [b.const(n, np.asarray(v, np.int32)) for n, v in spec]
    s = b.op("STRIDED_SLICE", [x, *ints], out_shape=[1, 7, 6, 4])
    pads = b.const("pads", np.asarray([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32))
    p = b.op("PAD", [s, pads], out_shape=[1, 9, 8, 4])
    w, bias = b.const("dw", _w(1, 3, 3, 4)), b.const("db", _w(4))
    options = {"padding": "VALID", "stride_w": 1, "stride_h": 1, "depth_multiplier": 1}
    dw = b.op("DEPTHWISE_CONV_2D", [p, w, bias], out_shape=[1, 7, 6, 4], options=options)
    w2, bias2 = b.const("w2", _w(5, 3, 3, 4)), b.const("b2", _w(5))
    options2 = {"padding": "VALID", "stride_w": 2, "stride_h": 2}
    b.output(dw, b.op("CONV_2D", [p, w2, bias2], out_shape=[1, 4, 3, 5], options=options2))
    return b.build()


def _slice_also_added() -> bytes:
    # The slice is read by an ADD too: it must stay.
    b = ModelBuilder()
    x = b.input("x", [1, 6, 5, C])
    s = _slice(b, x, [0, 0, 0, 4], [1, 6, 5, 4], [1, 6, 5, 4])
    y = _conv(b, s, [1, 6, 5, 4], cin=4, cout=4)
    b.output(b.op("ADD", [y, s], out_shape=[1, 6, 5, 4]))
    return b.build()


def _slice_of_rows() -> bytes:
    # A slice of rows is no run of channels: it must stay.
    b = ModelBuilder()
    x = b.input("x", [1, 6, 5, C])
    s = _slice(b, x, [0, 1, 0, 0], [1, 4, 5, C], [1, 4, 5, C])
    b.output(_conv(b, s, [1, 4, 5, 6]))
    return b.build()


#: name -> (model, the folded convolution's PrimFunc name or None, the kernel it saves)
CASES = {
    "shuffle_block": (_shuffle_block, "conv2d_slice_in", "slice"),
    "strided_slice_pad_depthwise": (_strided_slice_pad_depthwise, "conv2d_slice_in", "slice"),
    "slice_also_added": (_slice_also_added, None, "slice"),
    "slice_of_rows": (_slice_of_rows, None, "slice"),
    "squeeze_excite": (_squeeze_excite, "conv2d_scaled", "multiply"),
    "gate_first_two_readers": (_gate_first_two_readers, "conv2d_scaled", "multiply"),
    "also_added": (_also_added, None, "multiply"),
    "activated": (_activated, None, "multiply"),
    "an_output": (_an_output, None, "multiply"),
    "nchw_first_conv": (_nchw_first_conv, "conv2d_nchw_in", "transpose"),
    "nchw_pad_conv": (_nchw_pad_conv, "conv2d_nchw_in", "transpose"),
    "nchw_depthwise": (_nchw_depthwise, "conv2d_nchw_in", "transpose"),
    "nchw_patches": (_nchw_patches, "conv2d_nchw_in", "transpose"),
    "nchw_small_patches": (_nchw_small_patches, "conv2d_nchw_in", "transpose"),
    "nchw_also_added": (_nchw_also_added, None, "transpose"),
    "fire": (_fire, "conv2d_concat_in", "concatenate"),
    "concat_input_pad_depthwise": (_concat_input_pad_depthwise, "conv2d_concat_in", "concatenate"),
    "concat_also_pooled": (_concat_also_pooled, None, "concatenate"),
    "concat_unit_depthwise": (_concat_unit_depthwise, "conv2d_concat_in", "concatenate"),
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
def test_conv_fold(name: str, precision: str, tmp_path) -> None:
    make, folded, saved = CASES[name]
    data = make()
    model = load_model(data)
    program = (
        compile_model(model, CompileOptions(precision=precision), warn=False).partitions[0].program
    )
    kernels = [launch.func for launch in program.launches]  # (kernels are minified: k0, k1...)
    alone = [k for k in kernels if saved in k and "conv" not in k]
    if folded:
        assert any(folded in k for k in kernels) and not alone, kernels
        assert not any("pad" in k for k in kernels), kernels  # a folded PAD stays folded
    else:
        assert alone, kernels
        assert not any(
            f in k for k in kernels for f in ("scaled", "nchw_in", "concat_in", "slice_in")
        )

    xs = [
        RNG.uniform(0, 1, t.shape).astype(np.float32)
        for t in (model.main.tensors[i] for i in model.main.inputs)
    ]
    want = _run(data, xs, device="reference")
    got = _run(data, xs, precision=precision, cache_dir=tmp_path)
    tol = 1e-5 if precision == "fp32" else 1e-2
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=tol * max(1.0, float(np.abs(w).max())), rtol=0)


@pytest.mark.opencl
@pytest.mark.parametrize(
    ("make", "folded", "count"),
    [
        (_gate_first_two_readers, "conv2d_scaled", 2),
        (_nchw_pad_conv, "conv2d_nchw_in", 1),
        (_nchw_patches, "conv2d_nchw_in", 1),
        (_fire, "conv2d_concat_in", 1),
        (_shuffle_block, "conv2d_slice_in", 2),
        (_strided_slice_pad_depthwise, "conv2d_slice_in", 2),
    ],
)
def test_every_schedule_option_of_a_folded_convolution_matches(
    make: Any, folded: str, count: int, tmp_path
) -> None:
    """The GPU profile's rule and each tuning variant (dlight's Matmul configurations, serial
    reductions...) take the folded convolutions, each option within float32 rounding of the
    numpy reference on PoCL; and the CPU profile's serial reductions."""
    data = make()
    model = load_model(data)
    xs = [
        RNG.uniform(0, 1, t.shape).astype(np.float32)
        for t in (model.main.tensors[i] for i in model.main.inputs)
    ]
    want = _run(data, xs, device="reference")
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
    assert sum(folded in la.func for la in ex.program.launches) == count
    check(gpu.run(xs), "fast, default options")
    for i, v in enumerate(ex.program.variants):
        if folded not in v.func:
            continue
        for c in range(1, len(v.options) + 1):
            choices = [0] * len(ex.program.variants)
            choices[i] = c
            ex.select(choices)
            check(gpu.run(xs), f"{v.func} option {c}")


def _fallback_kernels(capsys: Any) -> tuple[list[str], str]:
    model = load_model(_squeeze_excite())
    compiled = compile_model(model, CompileOptions(schedules="fast", tuning=False), warn=True)
    assert not compiled.cpu_reasons, compiled.cpu_reasons
    kernels = [la.func for p in compiled.partitions for la in p.program.launches]
    return kernels, capsys.readouterr().err


def test_a_scale_that_fails_to_lower_goes_op_by_op(
    monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    from litekiln.compiler import emit_nn

    real = emit_nn.conv_folded

    def fail(ctx: Any, *args: Any) -> Any:
        if ctx.op.inputs[0] in ctx.lw.scale_folds:
            raise RuntimeError("no such luck")
        return real(ctx, *args)

    monkeypatch.setattr(emit_nn, "conv_folded", fail)
    kernels, err = _fallback_kernels(capsys)
    assert not any("scaled" in k for k in kernels), kernels
    assert any("multiply" in k and "conv" not in k for k in kernels), kernels
    assert "lowering with fused patterns failed (RuntimeError: no such luck)" in err, err


def test_a_scaled_convolution_that_fails_to_build_goes_op_by_op(
    monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    from litekiln.compiler import codegen

    real = codegen.compile_relax_full

    def picky(mod: Any, **kw: Any) -> Any:
        if any("conv2d_scaled" in gv.name_hint for gv in mod.get_global_vars()):
            raise RuntimeError("schedule refused")
        return real(mod, **kw)

    monkeypatch.setattr(codegen, "compile_relax_full", picky)
    kernels, err = _fallback_kernels(capsys)
    assert not any("scaled" in k for k in kernels), kernels
    assert any("multiply" in k and "conv" not in k for k in kernels), kernels
    assert "code generation with fused patterns failed (RuntimeError: schedule refused)" in err


# --------------------------------------------------------------------------- zero PADs
# A zero PAD of height/width that only feeds convolutions is folded into their padding: no
# pad kernel; any other PAD stays a kernel of its own.


def _pconv(b, x, out_shape, *, depthwise=False, stride=2, padding="VALID", cin=4, cout=6):
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
    b.output(_pconv(b, p, [1, 4, 5, 6]))
    return b.build()


def _depthwise_same() -> bytes:
    # The PAD's widths add to SAME padding computed on the padded size.
    b = ModelBuilder()
    x = b.input("x", [1, 8, 8, 4])
    p = _pad(b, x, [[0, 0], [2, 0], [1, 3], [0, 0]], [1, 10, 12, 4])
    b.output(_pconv(b, p, [1, 10, 12, 4], depthwise=True, stride=1, padding="SAME"))
    return b.build()


def _internal_source() -> bytes:
    # The PAD's source is computed inside the partition (half storage under fp16).
    b = ModelBuilder()
    x = b.input("x", [1, 9, 10, 4])
    h = _pconv(b, x, [1, 9, 10, 4], depthwise=True, stride=1, padding="SAME")
    p = _pad(b, h, [[0, 0], [0, 1], [1, 1], [0, 0]], [1, 10, 12, 4])
    b.output(_pconv(b, p, [1, 4, 5, 6]))
    return b.build()


def _two_convs() -> bytes:
    b = ModelBuilder()
    x = b.input("x", [1, 9, 9, 4])
    p = _pad(b, x, [[0, 0], [1, 1], [1, 1], [0, 0]], [1, 11, 11, 4])
    y1 = _pconv(b, p, [1, 5, 5, 6])
    y2 = _pconv(b, p, [1, 9, 9, 4], depthwise=True, stride=1)
    b.output(y1, y2)
    return b.build()


def _pad_also_added() -> bytes:
    # The padded tensor is read by an ADD too: the PAD must stay.
    b = ModelBuilder()
    x = b.input("x", [1, 8, 8, 4])
    p = _pad(b, x, [[0, 0], [1, 1], [1, 1], [0, 0]], [1, 10, 10, 4])
    y = _pconv(b, p, [1, 10, 10, 4], depthwise=True, stride=1, padding="SAME")
    b.output(b.op("ADD", [y, p], out_shape=[1, 10, 10, 4]))
    return b.build()


def _channel_pad() -> bytes:
    # Channel padding is not a convolution's padding: the PAD must stay.
    b = ModelBuilder()
    x = b.input("x", [1, 8, 8, 2])
    p = _pad(b, x, [[0, 0], [0, 0], [0, 0], [1, 1]], [1, 8, 8, 4])
    b.output(_pconv(b, p, [1, 3, 3, 6]))
    return b.build()


def _padv2(b, x, pads, out_shape, value=-np.inf):
    return b.op(
        "PADV2",
        [x, b.const("pads", np.asarray(pads, np.int32)), b.const("value", np.float32([value]))],
        out_shape=out_shape,
    )


def _max_pool(b, x, out_shape, k=3, stride=2, padding="VALID"):
    options = {"padding": padding, "stride_h": stride, "stride_w": stride,
               "filter_height": k, "filter_width": k}  # fmt: skip
    return b.op("MAX_POOL_2D", [x], out_shape=out_shape, options=options)


def _resnet_stem_pool() -> bytes:
    # PyTorch's MaxPool2d(3, 2, padding=1) as litert-torch writes it: PADV2 (-inf), VALID pool
    b = ModelBuilder()
    x = b.input("x", [1, 9, 10, 4])
    p = _padv2(b, x, [[0, 0], [1, 1], [1, 1], [0, 0]], [1, 11, 12, 4])
    b.output(_max_pool(b, p, [1, 5, 5, 4]))
    return b.build()


def _pool_of_finite_pad() -> bytes:
    # padded with 0.25, which wins where the window's cells are lower: the PADV2 must stay
    b = ModelBuilder()
    x = b.input("x", [1, 9, 10, 4])
    p = _padv2(b, x, [[0, 0], [1, 1], [1, 1], [0, 0]], [1, 11, 12, 4], value=0.25)
    b.output(_max_pool(b, p, [1, 5, 5, 4]))
    return b.build()


def _pool_wider_pad() -> bytes:
    # a 3x3 window over 3 rows of padding would see no cell of the map: the PADV2 must stay
    b = ModelBuilder()
    x = b.input("x", [1, 6, 6, 2])
    p = _padv2(b, x, [[0, 0], [3, 0], [0, 0], [0, 0]], [1, 9, 6, 2])
    b.output(_max_pool(b, p, [1, 4, 2, 2]))
    return b.build()


PAD_CASES = {
    "resnet_stem_pool": (_resnet_stem_pool, True),
    "pool_of_finite_pad": (_pool_of_finite_pad, False),
    "pool_wider_pad": (_pool_wider_pad, False),
    "stride2_valid": (_stride2_valid, True),
    "depthwise_same": (_depthwise_same, True),
    "internal_source": (_internal_source, True),
    "two_convs": (_two_convs, True),
    "pad_also_added": (_pad_also_added, False),
    "channel_pad": (_channel_pad, False),
}


@pytest.mark.parametrize("name", list(PAD_CASES))
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_pad_fold(name: str, precision: str, tmp_path) -> None:
    make, folded = PAD_CASES[name]
    data = make()
    model = load_model(data)
    program = (
        compile_model(model, CompileOptions(precision=precision), warn=False).partitions[0].program
    )
    kernels = [launch.func for launch in program.launches]  # (kernels are minified: k0, k1...)
    pad_kernels = [k for k in kernels if "pad" in k and "conv" not in k]
    assert (not pad_kernels) == folded, kernels
    if folded:  # nothing but the convolutions or pools (a float32 input is read as is)
        assert all("conv" in k or "pool" in k for k in kernels), kernels
    assert_matches_reference(data, precision, tmp_path, RNG)


@pytest.mark.parametrize("make", [_nchw_patches, _nchw_small_patches])
def test_a_patch_embedding_is_one_matrix_product_kernel(make: Any) -> None:
    """The transpose, the convolution, its bias and activation and the reshape back to NHWC
    are one kernel, whose reduction the GPU profile tiles as a matrix product where it has
    the rows for it (the small case's 12 patches are fewer than a tile's 16)."""
    from litekiln.compiler.driver import plan_partitions
    from litekiln.compiler.lower import lower_partition
    from tests.test_schedules import rules_used

    model = load_model(make())
    program = compile_model(model, CompileOptions(tuning=False), warn=False).partitions[0].program
    (kernel,) = [la.func for la in program.launches]
    assert kernel.startswith("fused_conv2d_nchw_in_add"), kernel
    mod = lower_partition(model.main, plan_partitions(model, CompileOptions()).partitions[0])
    rules = rules_used(mod, "gpu")
    want = "SharedMatmul" if make is _nchw_patches else "Matmul"
    assert rules[kernel] == want, rules
