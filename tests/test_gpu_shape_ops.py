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

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from gpu_helper import Batch, Case, G, build_model
from oplib import Quant, Spec, check_op
from tflite_builder import TensorRef

from litekiln.errors import ModelValidationError
from litekiln.model import load_model
from litekiln.ops.shape import strided_slice_plan

opencl = pytest.mark.opencl


def _i32(values: Any) -> np.ndarray:
    return np.asarray(values, np.int32)


def _multi(
    g: G,
    name: str,
    inputs: Sequence[Any],
    shapes: Sequence[Sequence[int]],
    options: dict[str, Any] | None = None,
    version: int = 1,
) -> list[TensorRef]:
    """An op with several outputs (SPLIT, SPLIT_V, UNPACK)."""
    dtype = next(t.dtype for t in inputs if isinstance(t, TensorRef) and t.dtype != "int32")
    outs = [
        g.b.tensor(f"{g.prefix}/{name.lower()}{k}", list(s), dtype) for k, s in enumerate(shapes)
    ]
    g.b.op(name, list(inputs), outputs=outs, options=options, version=version)
    return outs


# -- slices and splits --------------------------------------------------------------------------


def _slice(shape, begin, size, version=1, dtype="int32"):
    out = [d - b if n == -1 else n for d, b, n in zip(shape, begin, size, strict=True)]
    return lambda g: g.op(
        "SLICE", [g.x(shape), g.ints(begin, dtype), g.ints(size, dtype)], out, version=version
    )


def _ss(shape, begin, end, strides, version=1, **options):
    plan = strided_slice_plan(tuple(shape), begin, end, strides, options)
    return lambda g: g.op(
        "STRIDED_SLICE",
        [g.x(shape), g.ints(begin), g.ints(end), g.ints(strides)],
        list(plan.output),
        options,
        version=version,
    )


def _split(shape, axis, n, version=1):
    k = axis % len(shape)
    out = [shape[k] // n if j == k else d for j, d in enumerate(shape)]
    return lambda g: _multi(
        g, "SPLIT", [g.ints([axis]), g.x(shape)], [out] * n, {"num_splits": n}, version
    )


def _split_v(shape, sizes, axis, version=1):
    k = axis % len(shape)
    known = [s for s in sizes if s != -1]
    full = [shape[k] - sum(known) if s == -1 else s for s in sizes]
    outs = [[n if j == k else d for j, d in enumerate(shape)] for n in full]
    return lambda g: _multi(
        g,
        "SPLIT_V",
        [g.x(shape), g.ints(sizes), g.ints([axis])],
        outs,
        {"num_splits": len(sizes)},
        version,
    )


def _unpack(shape, axis, version=1):
    k = axis % len(shape)
    out = [d for j, d in enumerate(shape) if j != k]
    return lambda g: _multi(
        g, "UNPACK", [g.x(shape)], [out] * shape[k], {"num": shape[k], "axis": axis}, version
    )


SLICES = Batch(
    "slices",
    [
        Case("slice_rank3", _slice([3, 4, 5], [1, 0, 2], [2, 4, 3])),
        Case("slice_size_minus1", _slice([4, 6], [1, 2], [-1, 3], version=2)),
        Case("slice_rank5_v5", _slice([2, 3, 2, 3, 4], [1, 0, 1, 0, 2], [1, -1, 1, 2, 2], 5)),
        Case("slice_int64_v8", _slice([1, 6, 5, 4], [0, 1, 0, 1], [1, 4, 5, 2], 8, "int64")),
        Case(
            "ss_rank5_v4",
            _ss([2, 3, 2, 3, 4], [0, 1, 0, 0, 1], [2, 3, 2, 3, 4], [1, 1, 1, 2, 2], 4),
        ),
        Case("ss_ellipsis_v6", _ss([2, 3, 4, 5], [0, 1], [0, 3], [1, 1], 6, ellipsis_mask=1)),
        Case(
            "ss_ellipsis_mid",
            _ss([2, 3, 4, 5], [1, 0, 1], [2, 0, 4], [1, 1, 2], 6, ellipsis_mask=2),
        ),
        Case("ss_new_axis", _ss([3, 4], [0, 0, 1], [0, 3, 3], [1, 1, 1], 6, new_axis_mask=1)),
        Case(
            "ss_new_axis_neg_stride",
            _ss([3, 4], [1, 0, 0], [3, 0, 4], [1, 1, -1], 6, new_axis_mask=2, end_mask=4),
        ),
        Case(
            "ss_ellipsis_new_axis",
            _ss([2, 3, 4], [0, 0, 1], [0, 0, 3], [1, 1, 1], 6, ellipsis_mask=1, new_axis_mask=2),
        ),
        # LiteRT applies begin_mask to a shrunk axis too (index 0, not 2).
        Case(
            "ss_shrink_begin_mask",
            _ss([3, 4], [2, 1], [3, 3], [1, 1], shrink_axis_mask=1, begin_mask=1),
        ),
        Case(
            "ss_shrink_negative",
            _ss([3, 4, 5], [0, -2, 0], [3, -1, 5], [1, 1, 2], 1, shrink_axis_mask=2),
        ),
        Case("ss_offset_v8", _ss([6, 4, 3], [1, 0, 1], [3, 4, 2], [2, 1, 1], 8, offset=True)),
        Case("ss_short_spec", _ss([2, 3, 4], [1], [2], [1])),
        Case("ss_reverse", _ss([5, 3], [-1, 0], [-6, 3], [-1, 1])),
        Case("ss_reverse_end_mask", _ss([5, 3], [3, 0], [0, 3], [-2, 1], end_mask=1)),
        Case("split_last_3", _split([4, 6], -1, 3)),
        Case("split_axis0_v5", _split([4, 2, 3], 0, 2, 5)),
        Case("split_one", _split([2, 5], 1, 1, 3)),
        Case("split_v_minus1", _split_v([4, 6], [1, -1, 2], 1)),
        Case("split_v_neg_axis_v3", _split_v([2, 7, 3], [3, 4], -2, 3)),
        Case("unpack_axis0", _unpack([3, 2, 4], 0)),
        Case("unpack_neg_axis_v6", _unpack([1, 2, 3, 4], -2, 6)),
    ],
    op_table="extended",
)


@opencl
@pytest.mark.parametrize("case", SLICES.ids())
def test_slices(case: str) -> None:
    SLICES.check(case)


# -- tiles, broadcasts, gathers, pads, packs, transposes ------------------------------------------


def _tile(shape, mult, version=1):
    out = [d * m for d, m in zip(shape, mult, strict=True)]
    return lambda g: g.op("TILE", [g.x(shape), g.ints(mult)], out, version=version)


def _broadcast(shape, to, version=2):
    return lambda g: g.op("BROADCAST_TO", [g.x(shape), g.ints(to)], to, version=version)


def _gather(shape, pos, axis=0, batch_dims=0, version=1, dtype="int32"):
    p = np.asarray(pos)
    a = axis % len(shape)
    bd = batch_dims % p.ndim if batch_dims < 0 else batch_dims
    out = [*shape[:a], *p.shape[bd:], *shape[a + 1 :]]
    return lambda g: g.op(
        "GATHER",
        [g.x(shape), g.ints(pos, dtype)],
        out,
        {"axis": axis, "batch_dims": batch_dims},
        version=version,
    )


def _gather_nd(shape, idx, version=1, dtype="int32"):
    i = np.asarray(idx)
    out = [*i.shape[:-1], *shape[i.shape[-1] :]]
    return lambda g: g.op("GATHER_ND", [g.x(shape), g.ints(idx, dtype)], out, version=version)


def _pad(name, shape, pads, value=None, version=1, **options):
    out = [d + a + b for d, (a, b) in zip(shape, pads, strict=True)]

    def build(g: G):
        ins = [g.x(shape), g.ints(pads)]
        if value is not None:
            ins.append(g.w(np.asarray([value], np.float32)))
        return g.op(name, ins, out, options or None, version=version)

    return build


def _pack(shapes, axis, version=1):
    n = len(shapes)
    rank = len(shapes[0]) + 1
    a = axis % rank
    out = [*shapes[0][:a], n, *shapes[0][a:]]
    return lambda g: g.op(
        "PACK", [g.x(s) for s in shapes], out, {"values_count": n, "axis": axis}, version=version
    )


def _transpose(shape, perm, version=1):
    return lambda g: g.op(
        "TRANSPOSE", [g.x(shape), g.ints(perm)], [shape[p] for p in perm], version=version
    )


def _reverse(shape, axes, version=1):
    return lambda g: g.op("REVERSE_V2", [g.x(shape), g.ints(axes)], list(shape), version=version)


def _concat(shapes, axis, version=1):
    a = axis % len(shapes[0])
    out = list(shapes[0])
    out[a] = sum(s[a] for s in shapes)
    return lambda g: g.op(
        "CONCATENATION", [g.x(s) for s in shapes], out, {"axis": axis}, version=version
    )


MOVEMENT = Batch(
    "movement",
    [
        Case("tile_rank2", _tile([2, 3], [2, 3])),
        Case("tile_rank4_v3", _tile([1, 2, 1, 3], [2, 1, 3, 1], 3)),
        Case("broadcast_rank_up", _broadcast([3, 1], [2, 3, 4])),
        Case("broadcast_same_rank_v4", _broadcast([1, 4, 1], [2, 4, 3], 4)),
        Case("broadcast_rank1_v3", _broadcast([1], [2, 3], 3)),
        Case("gather_axis0_embedding", _gather([20, 8], [[3, 19, 0, 3, 7]])),
        Case("gather_axis1_matrix", _gather([3, 5, 4], [[0, 4], [2, 2]], axis=1)),
        Case("gather_axis_neg1", _gather([3, 5, 4], [3, 0, 1], axis=-1)),
        Case("gather_scalar_position", _gather([3, 5], 2)),
        Case("gather_batch_dims1_v5", _gather([2, 5, 4], [[0, 4, 1], [2, 2, 3]], 1, 1, 5)),
        Case("gather_batch_dims1_axis2", _gather([2, 3, 5, 4], [[0, 4], [2, 3]], 2, 1, 5)),
        Case("gather_batch_dims_all_positions", _gather([2, 5, 4], [3, 1], 1, 1, 5)),
        Case("gather_batch_dims_neg", _gather([2, 5, 4], [[0, 4, 1], [2, 2, 3]], 1, -1, 5)),
        Case("gather_int64_positions", _gather([3, 5], [1, 4], 1, dtype="int64")),
        Case("gather_int16_positions_v6", _gather([3, 5], [1, 4], 1, version=6, dtype="int16")),
        Case("gather_v8", _gather([4, 3], [[1], [3]], version=8)),
        # Consecutive rows are lowered as a slice (an unrolled recurrence's x[t]).
        Case("gather_one_row_as_slice", _gather([32, 16], [5])),
        Case("gather_consecutive_rows_as_slice", _gather([1, 6, 4], [[2, 3, 4]], axis=1)),
        Case("gather_runs_of_rows_take", _gather([3, 5, 4], [1, 2], axis=1)),
        Case("gather_nd_pairs", _gather_nd([3, 4, 5], [[0, 1], [2, 3]])),
        Case("gather_nd_full", _gather_nd([3, 4], [[[0, 1]], [[2, 3]]])),
        Case("gather_nd_rows", _gather_nd([3, 4, 2], [[2], [0]])),
        Case("gather_nd_int64_v6", _gather_nd([3, 4, 2], [[2, 1], [0, 3]], 6, "int64")),
        Case("padv2_value", _pad("PADV2", [2, 3], [[1, 0], [2, 1]], 0.5)),
        Case("padv2_hw", _pad("PADV2", [1, 4, 4, 3], [[0, 0], [1, 2], [2, 1], [0, 0]], -3.0)),
        Case(
            "padv2_rank5_v4",
            _pad("PADV2", [1, 2, 2, 3, 2], [[0, 0], [1, 0], [0, 1], [2, 1], [0, 1]], -0.5, 4),
        ),
        Case(
            "pad_rank5_v4",
            _pad("PAD", [1, 2, 2, 3, 2], [[0, 1], [1, 0], [0, 1], [2, 1], [0, 0]], version=4),
        ),
        Case("mirror_reflect", _pad("MIRROR_PAD", [3, 4], [[2, 1], [0, 3]], mode="REFLECT")),
        Case("mirror_symmetric", _pad("MIRROR_PAD", [3, 4], [[3, 1], [4, 0]], mode="SYMMETRIC")),
        Case(
            "mirror_reflect_hw_v3",
            _pad(
                "MIRROR_PAD",
                [1, 5, 4, 2],
                [[0, 0], [2, 2], [1, 3], [0, 0]],
                None,
                3,
                mode="REFLECT",
            ),
        ),
        Case(
            "mirror_symmetric_rank3_v2",
            _pad("MIRROR_PAD", [2, 3, 4], [[1, 2], [3, 0], [0, 4]], None, 2, mode="SYMMETRIC"),
        ),
        Case("pack_axis0", _pack([[3, 4], [3, 4]], 0)),
        Case("pack_axis_neg1_three", _pack([[2, 3], [2, 3], [2, 3]], -1)),
        Case("pack_rank3_axis1_v5", _pack([[2, 3, 4], [2, 3, 4]], 1, 5)),
        Case(
            "squeeze_dims_v2",
            lambda g: g.op(
                "SQUEEZE", [g.x([1, 4, 1, 3])], [1, 4, 3], {"squeeze_dims": [-2]}, version=2
            ),
        ),
        Case("squeeze_all", lambda g: g.op("SQUEEZE", [g.x([1, 4, 1, 3])], [4, 3])),
        Case("expand_dims_0", lambda g: g.op("EXPAND_DIMS", [g.x([4, 3]), g.ints([0])], [1, 4, 3])),
        Case(
            "expand_dims_neg", lambda g: g.op("EXPAND_DIMS", [g.x([4, 3]), g.ints([-1])], [4, 3, 1])
        ),
        Case("transpose_rank5_v4", _transpose([2, 3, 1, 4, 2], [4, 1, 0, 3, 2], 4)),
        Case("transpose_rank6_v6", _transpose([2, 1, 3, 2, 2, 3], [5, 0, 3, 1, 4, 2], 6)),
        Case("transpose_nchw_v9", _transpose([1, 3, 4, 5], [0, 2, 3, 1], 9)),
        Case("reverse_axis0", _reverse([5, 1, 4], [0])),
        Case("reverse_axis_neg1_rank4", _reverse([1, 3, 4, 5], [-1])),
        Case("reverse_two_axes_v3", _reverse([2, 3, 4], [2, 1], 3)),
        Case("concat_rank5", _concat([[1, 2, 2, 3, 2], [1, 2, 2, 1, 2]], 3)),
        Case(
            "concat_rank5_neg_axis_three",
            _concat([[2, 1, 2, 2, 3], [2, 1, 2, 2, 1], [2, 1, 2, 2, 2]], -1),
        ),
        # int8 data through the float view: moved values stay on the input's grid.
        Case(
            "gather_int8_v2",
            lambda g: g.op(
                "GATHER",
                [g.x([4, 6], "int8", quant=Quant(0.05, 2)), g.ints([[3, 0], [1, 1]])],
                [2, 2, 6],
                {"axis": 0},
                version=2,
                quant=Quant(0.05, 2),
            ),
        ),
        Case(
            "transpose_int8_rank5_v4",
            lambda g: g.op(
                "TRANSPOSE",
                [g.x([2, 3, 1, 2, 4], "int8", quant=Quant(0.1, -3)), g.ints([4, 0, 2, 1, 3])],
                [4, 2, 1, 3, 2],
                version=4,
                quant=Quant(0.1, -3),
            ),
        ),
        Case("concat_rank6_v6", _concat([[1, 2, 1, 2, 2, 2], [1, 2, 1, 2, 1, 2]], -2, 6)),
    ],
    op_table="extended",
)


@opencl
@pytest.mark.parametrize("case", MOVEMENT.ids())
def test_movement(case: str) -> None:
    MOVEMENT.check(case)


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
        "strided_slice_neg": (
            [2, 6, 5],
            lambda g, a: g.op(
                "STRIDED_SLICE",
                [a, g.ints([0, 5, 1]), g.ints([2, 0, 5]), g.ints([1, -2, 2])],
                [2, 3, 2],
            ),
        ),
        "slice": ([4, 6], lambda g, a: g.op("SLICE", [a, g.ints([1, 2]), g.ints([2, -1])], [2, 4])),
        "split_v": (
            [3, 7],
            lambda g, a: _multi(
                g, "SPLIT_V", [a, g.ints([3, 4]), g.ints([1])], [[3, 3], [3, 4]], {"num_splits": 2}
            ),
        ),
        "unpack": (
            [2, 3, 4],
            lambda g, a: _multi(g, "UNPACK", [a], [[2, 4]] * 3, {"num": 3, "axis": 1}),
        ),
        "tile": ([2, 3], lambda g, a: g.op("TILE", [a, g.ints([2, 2])], [4, 6])),
        "broadcast_to": (
            [3, 1],
            lambda g, a: g.op("BROADCAST_TO", [a, g.ints([2, 3, 4])], [2, 3, 4], version=2),
        ),
        "gather": (
            [6, 4],
            lambda g, a: g.op("GATHER", [a, g.ints([5, 0, 2])], [3, 4], {"axis": 0}),
        ),
        "gather_nd": (
            [3, 4, 2],
            lambda g, a: g.op("GATHER_ND", [a, g.ints([[2, 1], [0, 3]])], [2, 2]),
        ),
        "padv2": (
            [2, 3],
            lambda g, a: g.op(
                "PADV2", [a, g.ints([[1, 0], [0, 2]]), g.w(np.asarray([0.25], np.float32))], [3, 5]
            ),
        ),
        "mirror_pad": (
            [3, 4],
            lambda g, a: g.op(
                "MIRROR_PAD", [a, g.ints([[1, 1], [2, 0]])], [5, 6], {"mode": "REFLECT"}
            ),
        ),
        "pack_with_constant": (
            [2, 3],
            lambda g, a: g.op("PACK", [a, g.w([2, 3])], [2, 2, 3], {"values_count": 2, "axis": 1}),
        ),
        "transpose_rank6": (
            [2, 3, 4, 2],
            lambda g, a: g.op(
                "RESHAPE",
                [
                    g.op(
                        "TRANSPOSE",
                        [
                            g.op("RESHAPE", [a, g.ints([2, 1, 3, 2, 2, 2])], [2, 1, 3, 2, 2, 2]),
                            g.ints([5, 0, 3, 1, 4, 2]),
                        ],
                        [2, 2, 2, 1, 2, 3],
                    ),
                    g.ints([4, 2, 3, 2]),
                ],
                [4, 2, 3, 2],
            ),
        ),
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
        assert err > 0 or case.startswith(("gather", "tile")), "fp16 storage left no trace"


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


@pytest.mark.parametrize(
    ("shape", "begin", "end", "strides", "options"),
    [
        ([2, 3, 4, 5], [0, 1], [0, 3], [1, 1], {"ellipsis_mask": 1}),
        ([2, 3, 4, 5], [1, 0, 1], [2, 0, 4], [1, 1, 2], {"ellipsis_mask": 2}),
        ([3, 4], [0, 0, 1], [0, 3, 3], [1, 1, 1], {"new_axis_mask": 1}),
        ([3, 4], [1, 0, 0], [3, 0, 4], [1, 1, -1], {"new_axis_mask": 2, "end_mask": 4}),
        ([2, 3, 4], [0, 0, 1], [0, 0, 3], [1, 1, 1], {"ellipsis_mask": 1, "new_axis_mask": 2}),
        ([3, 4], [2, 1], [3, 3], [1, 1], {"shrink_axis_mask": 1, "begin_mask": 1}),
        ([6, 4, 3], [1, 0, 1], [3, 4, 2], [2, 1, 1], {"offset": True}),
        ([6, 4], [-3, 0], [2, 4], [1, 1], {"offset": True}),
        ([5, 3], [-1, 0], [-6, 3], [-1, 1], {}),
        ([5, 3], [3, 0], [0, 3], [-2, 1], {"end_mask": 1}),
        ([5, 3], [7, -9], [-9, 9], [-3, 1], {}),
        ([2, 3, 2, 3, 4], [0, 1, 0, 0, 1], [2, 3, 2, 3, 4], [1, 1, 1, 2, 2], {}),
    ],
)
def test_strided_slice_reference(shape, begin, end, strides, options) -> None:
    """LiteRT's resolution of the spec (strided_slice.cc), not numpy's indexing."""
    version = 8 if options.get("offset") else 6
    plan = strided_slice_plan(tuple(shape), begin, end, strides, options)
    check_op(
        "STRIDED_SLICE",
        [Spec(shape)],
        options,
        version=version,
        consts={1: _i32(begin), 2: _i32(end), 3: _i32(strides)},
        out_shape=list(plan.output),
    )


def test_strided_slice_refuses_unwritten_output() -> None:
    """An offset size past the dimension: LiteRT would leave part of the output unwritten."""
    from tflite_builder import build_single_op

    b, _ = build_single_op(
        "STRIDED_SLICE",
        [Spec([6, 4])],
        {"offset": True},
        consts={1: _i32([-3, 0]), 2: _i32([4, 4]), 3: _i32([1, 1])},
        out_shape=[4, 4],
        version=8,
    )
    with pytest.raises(ModelValidationError, match="select"):
        load_model(b.build())


@pytest.mark.parametrize(
    ("shape", "pos", "axis", "batch_dims"),
    [
        ([2, 5, 4], [[0, 4, 1], [2, 2, 3]], 1, 1),
        ([2, 3, 5, 4], [[0, 4], [2, 3]], 2, 1),
        ([2, 5, 4], [3, 1], 1, 1),
        ([2, 5, 4], [[0, 4, 1], [2, 2, 3]], -2, -1),
        ([2, 3, 4], [[[1, 0], [2, 2], [0, 1]], [[0, 0], [1, 2], [2, 1]]], 2, 2),
    ],
)
def test_gather_reference_batch_dims(shape, pos, axis, batch_dims) -> None:
    check_op(
        "GATHER",
        [Spec(shape)],
        {"axis": axis, "batch_dims": batch_dims},
        version=5,
        consts={1: _i32(pos)},
    )


@pytest.mark.parametrize(
    ("shape", "idx", "dtype"),
    [
        ([3, 4, 5], [[0, 1], [2, 3]], "int32"),
        ([3, 4], [[[0, 1]], [[2, 3]]], "int32"),
        ([3, 4, 2], [[2], [0]], "int64"),
        ([3, 4, 2], [[2], [0]], "int16"),
    ],
)
def test_gather_nd_reference(shape, idx, dtype) -> None:
    i = np.asarray(idx)
    check_op(
        "GATHER_ND",
        [Spec(shape)],
        version=4 if dtype == "int16" else 1,
        consts={1: np.asarray(idx, dtype)},
        out_shape=[*i.shape[:-1], *shape[i.shape[-1] :]],
    )


_TIES = np.array([[3.0, 1.0, 3.0, np.nan, -2.0, 3.0, 0.5], [1.0, 1.0, 1.0, 1.0, 2.0, -1.0, 1.0]])


@pytest.mark.parametrize(
    ("x", "k", "quant"),
    [
        (_TIES.astype(np.float32), 4, None),  # ties to the earlier index, NaN after every number
        (np.random.default_rng(1).normal(size=(2, 3, 50)).astype(np.float32), 10, None),
        (np.array([[5, -128, 127, 5, 0, -7]], np.int8), 3, Quant(0.1, -3)),
        (np.array([[7, 7, 2, 9], [0, -1, -1, 4]], np.int32), 4, None),
        (_TIES[1:].astype(np.float32), 0, None),
    ],
)
def test_topk_v2_reference(x, k, quant) -> None:
    """TOPK_V2 (CPU; detection post-processing as litert-torch writes `torch.topk`): the
    reference returns LiteRT's values and indices, in its order."""
    shape = [*x.shape[:-1], k]
    check_op(
        "TOPK_V2",
        [Spec(x.shape, x.dtype, quant, x)],
        consts={1: np.array(k, np.int32)},
        outputs=[Spec(shape, x.dtype, quant), Spec(shape, "int32")],
    )


def _cumsum(shape, axis, dtype="float32", **options):
    def build(g):
        low, high = (-50, 50) if dtype == "int32" else (None, None)
        return g.op(
            "CUMSUM", [g.x(shape, dtype, low=low, high=high), g.ints([axis])], shape, options
        )

    return build


#: CUMSUM on the GPU path (the extended table): each output sums the terms it covers.
CUMSUMS = Batch(
    "cumsum",
    [
        Case("cumsum_axis1", _cumsum([1, 20, 16], 1)),  # litert-torch's torch.cumsum (pc_sequence)
        Case("cumsum_last", _cumsum([3, 4, 37], -1)),
        Case("cumsum_exclusive", _cumsum([2, 9, 5], 1, exclusive=True)),
        Case("cumsum_reverse", _cumsum([2, 9, 5], 1, reverse=True)),
        Case("cumsum_reverse_exclusive", _cumsum([6, 7], 0, exclusive=True, reverse=True)),
        Case("cumsum_one_term", _cumsum([4, 1, 3], 1)),
        Case("cumsum_long", _cumsum([2, 300], 1)),
        Case("cumsum_int32", _cumsum([1, 64], 1, "int32")),
        Case(
            "cumsum_int32_reverse_exclusive",
            _cumsum([5, 6], 0, "int32", reverse=True, exclusive=True),
        ),
    ],
    op_table="extended",
)


@opencl
@pytest.mark.parametrize("case", CUMSUMS.ids())
def test_cumsum_gpu(case: str) -> None:
    CUMSUMS.check(case)


def test_cumsum_gpu_support() -> None:
    """The GPU form takes a constant axis of at most `CUMSUM_GPU_TERMS` float32 or int32 terms;
    an axis computed at run time, a longer one or int64 data stay on the CPU, saying why."""
    from tflite_builder import ModelBuilder

    from litekiln.ops.base import lookup
    from litekiln.ops.reduce import CUMSUM_GPU_TERMS

    def support(shape, dtype="float32", axis_const=True):
        b = ModelBuilder()
        x = b.input("x", shape, dtype)
        axis = (
            b.const("axis", np.array([1], np.int32), "int32")
            if axis_const
            else b.input("axis", [1], "int32")
        )
        y = b.tensor("y", shape, dtype)
        b.op("CUMSUM", [x, axis], outputs=[y])
        b.output(y)
        g = load_model(b.build()).main
        return lookup(g.ops[0]).gpu_support(g.ops[0], g)

    assert support([1, 20, 16]) is None
    assert support([1, 20], "int32") is None
    assert "run time" in support([1, 20], axis_const=False)
    assert "int64" in support([1, 20], "int64")
    long = support([1, CUMSUM_GPU_TERMS + 1])
    assert f"{CUMSUM_GPU_TERMS + 1} terms" in long and f"at most {CUMSUM_GPU_TERMS}" in long


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize(("dtype", "axis"), [("float32", 1), ("float32", -1), ("int32", 0)])
def test_cumsum_reference(exclusive: bool, reverse: bool, dtype: str, axis: int) -> None:
    """CUMSUM (litert-torch's torch.cumsum): the reference gives LiteRT's sums."""
    x = np.random.default_rng(2).uniform(-3, 3, (3, 4, 5)).astype(dtype)
    check_op(
        "CUMSUM",
        [Spec(x.shape, dtype, None, x)],
        {"exclusive": exclusive, "reverse": reverse},
        consts={1: np.array(axis, np.int32)},
        out_shape=list(x.shape),
    )
