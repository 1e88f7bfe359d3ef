"""A per-channel scale of a computed map read only by convolutions (a squeeze-and-excite gate,
``x * g`` with ``g`` 1x1x1xC) is multiplied in by each convolution as it loads its input
(litekiln/compiler/lowering.py `_find_scale_folds`, `conv_scaled`): no multiply kernel, the
same numbers as the numpy reference; any other MUL stays a kernel of its own."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("tvm")

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


def _also_added() -> bytes:
    # The scaled map is read by an ADD too: the MUL must stay.
    b = ModelBuilder()
    x = b.input("x", [1, 6, 5, C])
    g = b.input("g", [1, 1, 1, C])
    s = b.op("MUL", [x, g], out_shape=[1, 6, 5, C])
    b.output(b.op("ADD", [_conv(b, s, [1, 6, 5, C], cout=C), s], out_shape=[1, 6, 5, C]))
    return b.build()


def _activated() -> bytes:
    # A MUL with a fused activation is not a plain scale.
    b = ModelBuilder()
    x = b.input("x", [1, 6, 5, C])
    g = b.input("g", [1, 1, 1, C])
    s = b.op("MUL", [x, g], out_shape=[1, 6, 5, C], options={"fused_activation_function": "RELU"})
    b.output(_conv(b, s, [1, 6, 5, 6]))
    return b.build()


def _an_output() -> bytes:
    # The scaled map leaves the partition: it must be computed anyway.
    b = ModelBuilder()
    x = b.input("x", [1, 6, 5, C])
    g = b.input("g", [1, 1, 1, C])
    s = b.op("MUL", [x, g], out_shape=[1, 6, 5, C])
    b.output(_conv(b, s, [1, 6, 5, 6]), s)
    return b.build()


CASES = {
    "squeeze_excite": (_squeeze_excite, True),
    "gate_first_two_readers": (_gate_first_two_readers, True),
    "also_added": (_also_added, False),
    "activated": (_activated, False),
    "an_output": (_an_output, False),
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
def test_scale_fold(name: str, precision: str, tmp_path) -> None:
    make, folded = CASES[name]
    data = make()
    model = load_model(data)
    program = (
        compile_model(model, CompileOptions(precision=precision), warn=False).partitions[0].program
    )
    kernels = [launch.func for launch in program.launches]  # (kernels are minified: k0, k1...)
    scaled = [k for k in kernels if "conv2d_scaled" in k]
    alone = [k for k in kernels if "multiply" in k and "conv" not in k]
    assert bool(scaled) == folded and (not alone) == folded, kernels

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
def test_every_schedule_option_of_a_scaled_convolution_matches(tmp_path) -> None:
    """The GPU profile's rule and each tuning variant (dlight's Matmul configurations, serial
    reductions...) take the scaled convolutions, each option within float32 rounding of the
    numpy reference on PoCL; and the CPU profile's serial reductions."""
    data = _gate_first_two_readers()
    xs = [RNG.uniform(0, 1, s).astype(np.float32) for s in ([1, 7, 6, C], [1, 1, 1, C])]
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
    scaled = [i for i, v in enumerate(ex.program.variants) if "conv2d_scaled" in v.func]
    assert len(scaled) == 2, [v.func for v in ex.program.variants]
    for i in scaled:
        for c in range(len(ex.program.variants[i].options) + 1):
            choices = [0] * len(ex.program.variants)
            choices[i] = c
            ex.select(choices)
            check(gpu.run(xs), f"{ex.program.variants[i].func} option {c}")


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

    real = emit_nn.conv_scaled

    def fail(ctx: Any, *args: Any) -> Any:
        if ctx.op.inputs[0] in ctx.lw.scale_folds:
            raise RuntimeError("no such luck")
        return real(ctx, *args)

    monkeypatch.setattr(emit_nn, "conv_scaled", fail)
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
