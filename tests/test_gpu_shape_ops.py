"""Data-movement and matrix ops on the GPU path (issue 14, item 5): slices, splits, tiles,
gathers, pads, packs, transposes, concatenations and BATCH_MATMUL.

Each GPU case runs on the GPU path (PoCL and Intel's CPU runtime in CI) and is compared with
the numpy reference and LiteRT, and asserts that its ops really went to the GPU
(``tests/gpu_helper.py``; tolerance ``1e-4 * max(1, max|ref|)`` for float outputs, one
quantization step of the reference and two of LiteRT for quantized ones). Versions are those
LiteRT has kernels for; a version number only names the features a model may use, and the
cases write the newest one each feature needs (and the newest the kernel takes).

The reference itself is checked against LiteRT where its semantics are subtle: BATCH_MATMUL
(shapes, adjoints, broadcast batch dimensions, int8/int16/int32 integer kernels exactly, the
hybrid kernel and its batch bookkeeping), STRIDED_SLICE (ellipsis, new axes, masks, offset, as
LiteRT resolves them), GATHER (batch_dims) and GATHER_ND.

fp16: chains ``x + x -> op -> y + y`` put the op's operands and result in half storage inside
one partition (partition inputs and outputs stay float32); they are compared with the float32
reference within ``4e-3 * max(1, max|ref|)``: each stored value is rounded to fp16 (relative
error 2**-11 ~ 4.9e-4) at most three times on its way (the doubled input, the op's result, the
doubled output), and a matmul's sums of 16 half-rounded products add a few of those.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gpu_helper import Batch, Case, G, build_model
from oplib import Quant, Spec, check_op

from litekiln.model import load_model

opencl = pytest.mark.opencl


# -- BATCH_MATMUL -----------------------------------------------------------------------------


def _out_shape(xs, ws, adj_x, adj_y):
    batch = np.broadcast_shapes(tuple(xs[:-2]), tuple(ws[:-2]))
    return [*batch, xs[-1] if adj_x else xs[-2], ws[-2] if adj_y else ws[-1]]


def _bmm(xs, ws, adj_x=False, adj_y=False, const=False, version=1):
    def build(g: G):
        w = g.w(ws, low=-1.0, high=1.0) if const else g.x(ws)
        return g.op(
            "BATCH_MATMUL",
            [g.x(xs), w],
            _out_shape(xs, ws, adj_x, adj_y),
            {"adj_x": adj_x, "adj_y": adj_y},
            version=version,
        )

    return build


def _bmm_int8(xs, ws, adj_y=False, const=True):
    def build(g: G):
        x = g.x(xs, "int8", quant=Quant(0.02, 3))
        w = (
            g.w(ws, "int8", quant=Quant(0.01, 0))
            if const
            else g.x(ws, "int8", quant=Quant(0.03, -2))
        )
        return g.op(
            "BATCH_MATMUL",
            [x, w],
            _out_shape(xs, ws, False, adj_y),
            {"adj_y": adj_y},
            version=2,
            dtype="int8",
            quant=Quant(0.05, -1),
        )

    return build


def _bmm_int16(xs, ws):
    def build(g: G):
        x = g.x(xs, "int16", quant=Quant(3e-5, 0))
        w = g.w(ws, "int16", quant=Quant(4e-5, 0))
        return g.op(
            "BATCH_MATMUL",
            [x, w],
            _out_shape(xs, ws, False, False),
            version=3,
            dtype="int16",
            quant=Quant(1e-4, 0),
        )

    return build


def _bmm_hybrid(xs, ws, asymmetric=False):
    def build(g: G):
        w = g.w(ws, "int8", quant=Quant(0.008, 0))
        return g.op(
            "BATCH_MATMUL",
            [g.x(xs), w],
            _out_shape(xs, ws, False, False),
            {"asymmetric_quantize_inputs": asymmetric},
            version=4 if asymmetric else 1,
            dtype="float32",
        )

    return build


MATMUL = Batch(
    "matmul",
    [
        Case("bmm_2d", _bmm([2, 3], [3, 4])),
        Case("bmm_adj_x", _bmm([2, 3, 5], [2, 3, 4], adj_x=True)),
        Case("bmm_adj_y", _bmm([2, 5, 3], [2, 4, 3], adj_y=True)),
        Case("bmm_adj_both", _bmm([3, 5, 2], [3, 4, 5], adj_x=True, adj_y=True)),
        Case("bmm_broadcast_rank4_3", _bmm([2, 1, 3, 4], [5, 4, 2])),
        Case("bmm_broadcast_rank5", _bmm([2, 3, 2, 3, 4], [3, 1, 4, 2])),
        Case("bmm_broadcast_adj_x_rank4", _bmm([4, 1, 3, 2], [1, 5, 3, 6], adj_x=True)),
        Case("bmm_attention_197", _bmm([1, 197, 192], [1, 192, 197])),
        Case("bmm_const_rhs_2d", _bmm([2, 7, 16], [16, 12], const=True)),
        Case("bmm_const_rhs_adj_y", _bmm([3, 16], [12, 16], adj_y=True, const=True)),
        Case("bmm_const_rhs_batched", _bmm([2, 3, 4, 8], [3, 8, 5], const=True)),
        Case("bmm_const_rhs_adj_x", _bmm([2, 8, 3], [8, 5], adj_x=True, const=True)),
        Case("bmm_int8_const_v2", _bmm_int8([2, 5, 16], [16, 6])),
        Case("bmm_int8_computed_adj_y", _bmm_int8([2, 5, 16], [2, 6, 16], adj_y=True, const=False)),
        Case("bmm_int16_v3", _bmm_int16([2, 3, 8], [8, 5])),
        # The hybrid kernel quantizes each LHS row to 8 bits on the fly; the GPU path keeps the
        # float LHS and the dequantized weights (the float view), so it differs from both by
        # that rounding: up to ~K * 2**-8 * max|x| * max|w| relative to outputs of ~sqrt(K).
        Case("bmm_hybrid_symmetric", _bmm_hybrid([2, 4, 16], [16, 5]), rtol=2e-2),
        Case("bmm_hybrid_asymmetric_v4", _bmm_hybrid([3, 16], [16, 5], True), rtol=2e-2),
    ],
    op_table="extended",
)


@opencl
@pytest.mark.parametrize("case", MATMUL.ids())
def test_batch_matmul(case: str) -> None:
    MATMUL.check(case)


# -- fp16 (half storage inside a partition) ---------------------------------------------------


def _half_chain(shape, body):
    """``x + x -> body -> y + y``: the op's operands and results stored in half."""

    def build(g: G):
        x = g.x(shape)
        a = g.op("ADD", [x, x], shape, {"fused_activation_function": "NONE"})
        ys = body(g, a)
        ys = ys if isinstance(ys, list) else [ys]
        return [
            g.op("ADD", [y, y], list(y.shape), {"fused_activation_function": "NONE"}) for y in ys
        ]

    return build


def _fp16_body_cases() -> list[Case]:
    bodies: dict[str, tuple[list[int], Any]] = {
        "batch_matmul_const": (
            [2, 3, 16],
            lambda g, a: g.op(
                "BATCH_MATMUL", [a, g.w([16, 5])], [2, 3, 5], {"adj_x": False, "adj_y": False}
            ),
        ),
        "batch_matmul_computed": (
            [2, 4, 4],
            lambda g, a: g.op("BATCH_MATMUL", [a, a], [2, 4, 4], {"adj_x": True, "adj_y": False}),
        ),
    }
    return [Case(name, _half_chain(shape, body)) for name, (shape, body) in bodies.items()]


FP16 = {c.id: c for c in _fp16_body_cases()}
FP16_TOL = 4e-3


@opencl
@pytest.mark.parametrize("case", list(FP16))
def test_fp16(case: str) -> None:
    import litekiln
    from litekiln.artifact.compiled import CompileOptions
    from litekiln.compiler.driver import plan_partitions

    built = build_model([FP16[case]])
    model = load_model(built.model)
    plan = plan_partitions(model, CompileOptions(op_table="extended", precision="fp16"))
    assert not plan.cpu_reasons, f"ops left on the CPU: {plan.cpu_reasons}"
    assert len(plan.partitions) == 1
    it = litekiln.Interpreter(
        model_content=built.model,
        use_cache=False,
        op_table="extended",
        precision="fp16",
        fp16_budget=None,
    )
    got = it.run(built.feeds)
    ref = litekiln.Interpreter(model_content=built.model, device="reference").run(built.feeds)
    for k, (a, b) in enumerate(zip(got, ref, strict=True)):
        assert a.shape == b.shape
        tol = FP16_TOL * max(1.0, float(np.abs(b).max()))
        err = float(np.abs(a.astype(np.float64) - b).max())
        assert err <= tol, f"{case} output {k}: max|fp16 - ref| = {err:.3g} > {tol:.3g}"
        assert err > 0, "fp16 storage left no trace"


# -- the reference against LiteRT --------------------------------------------------------------

BMM_SHAPES = [
    ([2, 3], [3, 4]),
    ([1, 4], [4, 1]),
    ([5, 3, 2], [2, 3]),
    ([2, 1, 3, 4], [5, 4, 2]),
    ([4, 1, 3, 2], [1, 5, 2, 6]),
    ([2, 3, 2, 3, 4], [3, 1, 4, 2]),
    ([3, 2, 4], [2, 3, 4, 5]),
    ([1, 1, 2, 2, 3], [3, 2]),
]


def _adjusted(xs, ws, adj_x, adj_y):
    xs = [*xs[:-2], xs[-1], xs[-2]] if adj_x else xs
    ws = [*ws[:-2], ws[-1], ws[-2]] if adj_y else ws
    return xs, ws


@pytest.mark.parametrize("adj", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("shapes", BMM_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_batch_matmul_reference_float(shapes, adj) -> None:
    xs, ws = _adjusted(*shapes, *adj)
    check_op(
        "BATCH_MATMUL",
        [Spec(xs), Spec(ws)],
        {"adj_x": adj[0], "adj_y": adj[1]},
        out_shape=_out_shape(xs, ws, *adj),
    )


@pytest.mark.parametrize("adj", [(False, False), (True, True)])
@pytest.mark.parametrize("shapes", BMM_SHAPES[2:6], ids=lambda s: "x".join(map(str, s)))
def test_batch_matmul_reference_int8(shapes, adj) -> None:
    """LiteRT's int8 kernel exactly (zero points on both operands, double rounding)."""
    xs, ws = _adjusted(*shapes, *adj)
    check_op(
        "BATCH_MATMUL",
        [Spec(xs, "int8", Quant(0.05, 3)), Spec(ws, "int8", Quant(0.03, -2))],
        {"adj_x": adj[0], "adj_y": adj[1]},
        version=2,
        out_shape=_out_shape(xs, ws, *adj),
        out_quant=Quant(0.07, 1),
        qtol=0,
    )


def test_batch_matmul_reference_int8_to_int32() -> None:
    """int8 operands, int32 output: plain products, the zero points ignored (as LiteRT)."""
    check_op(
        "BATCH_MATMUL",
        [Spec([2, 3, 8], "int8", Quant(0.05, 3)), Spec([8, 5], "int8", Quant(0.03, -2))],
        version=2,
        out_shape=[2, 3, 5],
        out_dtype="int32",
    )


@pytest.mark.parametrize("rhs", ["int16", "int8"])
def test_batch_matmul_reference_int16(rhs: str) -> None:
    """int16 x int16 and int16 x int8: int64 sums, the 64-bit rescale, exactly."""
    check_op(
        "BATCH_MATMUL",
        [Spec([2, 3, 8], "int16", Quant(0.001, 0))],
        version=3,
        consts={1: Spec([8, 5], rhs, Quant(0.02 if rhs == "int8" else 0.002, 0))},
        out_shape=[2, 3, 5],
        out_quant=Quant(0.004, 0),
        qtol=0,
    )


HYBRID = [
    ([2, 3, 8], [8, 5], False, False, None),
    ([2, 8, 3], [5, 8], True, True, None),
    ([2, 3, 8], [5, 8], False, True, 0),
    ([2, 3, 8], [8, 5], False, False, 1),
    # Several batch dimensions: LiteRT's hybrid kernel advances its per-row scales by one
    # matrix per index of each batch dimension (not by the dimensions after it) and so reads
    # other rows' scales; the reference computes the same (the product as written would be
    # off by up to ~1).
    ([2, 3, 4, 8], [2, 3, 8, 5], False, False, None),
    ([2, 3, 4, 8], [3, 8, 5], False, False, None),
    ([2, 1, 4, 8], [2, 3, 8, 5], False, False, None),
    ([2, 3, 4, 8], [1, 8, 5], False, False, None),
]


@pytest.mark.parametrize("asymmetric", [False, True])
@pytest.mark.parametrize("case", HYBRID, ids=lambda c: f"{c[0]}x{c[1]}-{c[2]}{c[3]}-{c[4]}")
def test_batch_matmul_reference_hybrid(case, asymmetric: bool) -> None:
    """float32 x int8 weights (per-tensor or per output column): the LHS rows quantized on
    the fly as LiteRT does, output in LiteRT's float32 order (default tolerance 1e-5)."""
    xs, ws, adj_x, adj_y, axis = case
    quant = (
        Quant(0.02, 0)
        if axis is None
        else Quant(list(np.linspace(0.01, 0.03, ws[axis])), [0] * ws[axis], axis)
    )
    check_op(
        "BATCH_MATMUL",
        [Spec(xs)],
        {"adj_x": adj_x, "adj_y": adj_y, "asymmetric_quantize_inputs": asymmetric},
        version=4 if asymmetric else 1,
        consts={1: Spec(ws, "int8", quant, low=-127)},
        out_shape=_out_shape(xs, ws, adj_x, adj_y),
        out_dtype="float32",
    )


def test_batch_matmul_gpu_refusals() -> None:
    """Integer outputs and the hybrid kernel's mixed-up batches stay on the CPU, saying why."""
    from tflite_builder import build_single_op

    from litekiln.compiler.partition import gpu_reason

    def reason(inputs, **kw) -> str | None:
        b, _ = build_single_op("BATCH_MATMUL", inputs, **kw)
        g = load_model(b.build()).main
        return gpu_reason(g.ops[0], g, extended_table=True)

    int32 = reason(
        [Spec([2, 3, 8], "int8", Quant(0.05, 3)), Spec([8, 5], "int8", Quant(0.03, -2))],
        version=2,
        out_shape=[2, 3, 5],
        out_dtype="int32",
    )
    assert int32 and "computes int32" in int32
    hybrid = reason(
        [Spec([2, 3, 4, 8])],
        consts={1: Spec([2, 3, 8, 5], "int8", Quant(0.02, 0), np.ones([2, 3, 8, 5], np.int8))},
        out_shape=[2, 3, 4, 5],
        out_dtype="float32",
    )
    assert hybrid and "several batch dimensions" in hybrid
    ok = reason(
        [Spec([2, 4, 8])],
        consts={1: Spec([8, 5], "int8", Quant(0.02, 0), np.ones([8, 5], np.int8))},
        out_shape=[2, 4, 5],
        out_dtype="float32",
    )
    assert ok is None
