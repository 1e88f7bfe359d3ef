"""Reductions over one element on the GPU path (litekiln/compiler/unit_reductions.py).

TVM mishandles a reduction whose reduced axes all have one element: litekiln's serial rule
found no loop to split, and dlight's rules applied the fused epilogue twice, so a 1x1
depthwise convolution with a bias (MediaPipe's hand_recrop) came out with its bias doubled.
Each case here is such a reduction followed by an ADD (the fused epilogue that went wrong),
against the numpy reference and LiteRT.
"""

from __future__ import annotations

import pytest
from gpu_helper import Batch, Case, G

pytestmark = pytest.mark.opencl

VALID = {"padding": "VALID", "stride_h": 1, "stride_w": 1}


def _then_add(build, shape):  # type: ignore[no-untyped-def]
    def case(g: G):  # type: ignore[no-untyped-def]
        y = build(g)
        return g.op("ADD", [y, g.w([shape[-1]])], shape, {"fused_activation_function": "NONE"})

    return case


UNIT = Batch(
    "unit_reductions",
    [
        Case(
            "depthwise_1x1_bias",
            lambda g: g.op(
                "DEPTHWISE_CONV_2D",
                [g.x([1, 6, 6, 4]), g.w([1, 1, 1, 4]), g.w([4])],
                [1, 6, 6, 4],
                {**VALID, "depth_multiplier": 1},
            ),
        ),
        Case(
            "depthwise_1x1_m2_stride2_add",
            _then_add(
                lambda g: g.op(
                    "DEPTHWISE_CONV_2D",
                    [g.x([1, 7, 7, 3]), g.w([1, 1, 1, 6]), g.w([6])],
                    [1, 4, 4, 6],
                    {"padding": "SAME", "stride_h": 2, "stride_w": 2, "depth_multiplier": 2},
                ),
                [1, 4, 4, 6],
            ),
        ),
        Case(
            "conv_1x1_one_channel",
            lambda g: g.op(
                "CONV_2D", [g.x([1, 5, 5, 1]), g.w([4, 1, 1, 1]), g.w([4])], [1, 5, 5, 4], VALID
            ),
        ),
        Case(
            "fc_one_feature",
            lambda g: g.op("FULLY_CONNECTED", [g.x([4, 1]), g.w([5, 1]), g.w([5])], [4, 5]),
        ),
        Case(
            "batch_matmul_k1_add",
            _then_add(
                lambda g: g.op("BATCH_MATMUL", [g.x([2, 4, 1]), g.w([2, 1, 6])], [2, 4, 6]),
                [2, 4, 6],
            ),
        ),
        Case(
            "mean_over_1x1_add",
            _then_add(
                lambda g: g.op(
                    "MEAN", [g.x([1, 1, 1, 8]), g.ints([1, 2])], [1, 1, 1, 8], {"keep_dims": True}
                ),
                [1, 1, 1, 8],
            ),
        ),
        Case(
            "max_pool_1x1_stride2_add",
            _then_add(
                lambda g: g.op(
                    "MAX_POOL_2D",
                    [g.x([1, 5, 5, 2])],
                    [1, 3, 3, 2],
                    {
                        "padding": "VALID",
                        "stride_h": 2,
                        "stride_w": 2,
                        "filter_height": 1,
                        "filter_width": 1,
                    },
                ),
                [1, 3, 3, 2],
            ),
        ),
        Case(
            "softmax_one_class_add",
            _then_add(lambda g: g.op("SOFTMAX", [g.x([3, 1])], [3, 1], {"beta": 1.0}), [3, 1]),
        ),
    ],
)


@pytest.mark.parametrize("case", UNIT.ids())
def test_unit_reduction(case: str) -> None:
    UNIT.check(case)


def test_the_rewrite_leaves_real_reductions_alone() -> None:
    pytest.importorskip("tvm")
    from tvm import relax

    from litekiln.compiler.unit_reductions import unit_reductions

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 4, 3), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            unit = bb.emit(relax.op.mean(x, axis=[0], keepdims=False))  # one element: a reshape
            real = bb.emit(relax.op.mean(unit, axis=[0, 1], keepdims=False))  # 16: stays
            out = bb.emit_output(real)
        bb.emit_func_output(out)
    text = str(unit_reductions()(bb.get()))
    assert text.count("R.mean(") == 1 and "R.reshape(" in text
