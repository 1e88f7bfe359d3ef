"""Emitters of the data-movement and matrix ops: slices, splits, tiles, gathers, pads, batch
matmul (one per TFLite op name; the op's semantics live in its :mod:`litekiln.ops` definition).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tvm import relax, te, tirx

from litekiln.compiler.lowering import (
    ACC_DTYPE,
    Ctx,
    Expr,
    activation,
    data_and_weights,
    dtype_of,
    emitter,
)
from litekiln.ops.shape import (
    GatherRows,
    gather_nd_rows,
    gather_rows,
    slice_ranges,
    strided_slice_plan,
)


@emitter("PAD")
def _pad(ctx: Ctx) -> list[Expr]:
    pads = ctx.const(1).astype(np.int64).reshape(-1, 2)
    flat = [int(v) for v in pads.reshape(-1)]
    return [ctx.emit(relax.op.nn.pad(ctx.arg_stored(0), flat, "constant", 0.0))]


@emitter("REVERSE_V2")
def _reverse(ctx: Ctx) -> list[Expr]:
    x = ctx.arg_stored(0)
    rank = len(ctx.out().shape)
    for axis in sorted({int(a) % rank for a in ctx.const(1).reshape(-1)}):
        x = ctx.emit(relax.op.flip(x, axis))
    return [x]


@emitter("CONCATENATION")
def _concat(ctx: Ctx) -> list[Expr]:
    # Moves stored values, unless a fused activation computes on them.
    # (Empty operands add nothing: an unrolled loop's first and last steps write some.)
    present = [i for i in range(len(ctx.op.inputs)) if ctx.has(i) and ctx.tensor(i).size]
    if int(ctx.options.get("fused_activation_function", 0) or 0):
        xs = [ctx.arg(i) for i in present]
    else:
        xs = _stored_all(ctx, present)
    axis = int(ctx.options.get("axis", 0)) % len(ctx.out().shape)
    return [activation(ctx, ctx.emit(relax.op.concat(xs, axis=axis)))]


@emitter("RESHAPE", "SQUEEZE", "EXPAND_DIMS")
def _reshape(ctx: Ctx) -> list[Expr]:
    return [ctx.emit(relax.op.reshape(ctx.arg_stored(0), ctx.out().shape))]


@emitter("QUANTIZE", "DEQUANTIZE")
def _float_view(ctx: Ctx) -> list[Expr]:
    """The float view of a quantized tensor is its dequantized values: both are the input
    unchanged here, and a quantized output (QUANTIZE's) gets its simulator after the op."""
    return [ctx.arg_stored(0)]


@emitter("TRANSPOSE")
def _transpose(ctx: Ctx) -> list[Expr]:
    perm = [int(v) for v in ctx.const(1).reshape(-1)]
    return [ctx.emit(relax.op.permute_dims(ctx.arg_stored(0), perm))]


def _stored_all(ctx: Ctx, indices: list[int]) -> list[Expr]:
    """Operands as stored (half under native fp16), or all in float32 where a constant
    (float32) sits among half ones."""
    xs = [ctx.arg_stored(i) for i in indices]
    if len({dtype_of(x) for x in xs}) > 1:
        xs = [ctx.arg(i) for i in indices]
    return xs


def _slice(ctx: Ctx, x: Expr, shape: tuple[int, ...], ranges: Sequence[range]) -> Expr:
    """The elements of ``x`` (of ``shape``) that ``ranges`` visit, one range per axis, in the
    ranges' order: one strided slice (increasing indices), then a flip of each axis that a
    negative step walks backwards (relax's negative-stride end bounds cannot say "up to and
    including index 0")."""
    axes, begin, end, strides, flips = [], [], [], [], []
    for axis, (r, size) in enumerate(zip(ranges, shape, strict=True)):
        if len(r) == 0:
            raise ctx.fail(f"axis {axis} selects no element")
        lo, hi = min(r[0], r[-1]), max(r[0], r[-1])
        step = abs(r.step) if len(r) > 1 else 1
        if r.step < 0 and len(r) > 1:
            flips.append(axis)
        if (lo, hi, step) == (0, size - 1, 1):
            continue
        axes.append(axis)
        begin.append(lo)
        end.append(hi + 1)
        strides.append(step)
    y = ctx.emit(relax.op.strided_slice(x, axes, begin, end, strides)) if axes else x
    for axis in flips:
        y = ctx.emit(relax.op.flip(y, axis))
    return y


def _ints(ctx: Ctx, i: int) -> list[int]:
    return [int(v) for v in ctx.const(i).astype(np.int64).reshape(-1)]


@emitter("STRIDED_SLICE")
def _strided_slice(ctx: Ctx) -> list[Expr]:
    # LiteRT's geometry (ellipsis, new axes, masks, offset), then one slice of the input
    # viewed with the new axes.
    plan = strided_slice_plan(
        ctx.tensor(0).shape, _ints(ctx, 1), _ints(ctx, 2), _ints(ctx, 3), ctx.options
    )
    x = ctx.arg_stored(0)
    if plan.shape != ctx.tensor(0).shape:
        x = ctx.emit(relax.op.reshape(x, plan.shape))
    y = _slice(ctx, x, plan.shape, plan.ranges)
    return [ctx.emit(relax.op.reshape(y, plan.output))]


@emitter("SLICE")
def _slice_op(ctx: Ctx) -> list[Expr]:
    shape = ctx.tensor(0).shape
    ranges = slice_ranges(shape, _ints(ctx, 1), _ints(ctx, 2))
    return [_slice(ctx, ctx.arg_stored(0), shape, ranges)]


def _split(ctx: Ctx, x: int, axis: int, sizes: list[int]) -> list[Expr]:
    shape = ctx.tensor(x).shape
    axis %= len(shape)
    data, outs, at = ctx.arg_stored(x), [], 0
    for n in sizes:
        ranges = [range(at, at + n) if k == axis else range(d) for k, d in enumerate(shape)]
        outs.append(_slice(ctx, data, shape, ranges))
        at += n
    return outs


@emitter("SPLIT")
def _split_op(ctx: Ctx) -> list[Expr]:
    shape, axis = ctx.tensor(1).shape, _ints(ctx, 0)[0]
    n = len(ctx.op.outputs)
    return _split(ctx, 1, axis, [shape[axis] // n] * n)


@emitter("SPLIT_V")
def _split_v(ctx: Ctx) -> list[Expr]:
    axis = _ints(ctx, 2)[0] % len(ctx.tensor(0).shape)
    return _split(ctx, 0, axis, [ctx.out(i).shape[axis] for i in range(len(ctx.op.outputs))])


@emitter("UNPACK")
def _unpack(ctx: Ctx) -> list[Expr]:
    axis = int(ctx.options.get("axis", 0)) % len(ctx.tensor(0).shape)
    outs = _split(ctx, 0, axis, [1] * len(ctx.op.outputs))
    return [ctx.emit(relax.op.reshape(y, ctx.out(i).shape)) for i, y in enumerate(outs)]


@emitter("PACK")
def _pack(ctx: Ctx) -> list[Expr]:
    xs = _stored_all(ctx, list(range(len(ctx.op.inputs))))
    axis = int(ctx.options.get("axis", 0)) % len(ctx.out().shape)
    xs = [ctx.emit(relax.op.expand_dims(x, axis)) for x in xs]
    return [ctx.emit(relax.op.concat(xs, axis=axis))]


@emitter("TILE")
def _tile(ctx: Ctx) -> list[Expr]:
    return [ctx.emit(relax.op.tile(ctx.arg_stored(0), _ints(ctx, 1)))]


@emitter("BROADCAST_TO")
def _broadcast_to(ctx: Ctx) -> list[Expr]:
    x, shape = ctx.arg_stored(0), ctx.out().shape
    if len(ctx.tensor(0).shape) < len(shape):
        lead = (1,) * (len(shape) - len(ctx.tensor(0).shape))
        x = ctx.emit(relax.op.reshape(x, (*lead, *ctx.tensor(0).shape)))
    return [ctx.emit(relax.op.broadcast_to(x, shape))]


def _take_rows(ctx: Ctx, rows: GatherRows) -> list[Expr]:
    """A gather at constant positions: one take of whole rows of the data, or a slice where
    the rows are consecutive (an unrolled recurrence's step reads x[t]). A slice is a
    static copy, which `compiler/fusion.py` merges into the matrix product that reads it; a
    take reads its positions from memory and stays a kernel of its own (an unrolled LSTM
    had one per step)."""
    x = ctx.emit(relax.op.reshape(ctx.arg_stored(0), (rows.rows, rows.row_size)))
    flat = rows.indices.reshape(-1)
    if flat.size and bool(np.all(np.diff(flat) == 1)):
        first, end = int(flat[0]), int(flat[-1]) + 1
        y = ctx.emit(relax.op.strided_slice(x, axes=[0], begin=[first], end=[end]))
    else:
        idx = relax.const(rows.indices.astype(np.int32), "int32")
        # (in range, checked at load: "clip" only keeps TVM from warning that "fast" would
        # read outside with indices that are not)
        y = ctx.emit(relax.op.take(x, idx, axis=0, mode="clip"))
    return [ctx.emit(relax.op.reshape(y, rows.output))]


@emitter("GATHER")
def _gather(ctx: Ctx) -> list[Expr]:
    if ctx.is_runtime(1):  # positions from the host (int32): clamped into the axis
        axis = int(ctx.options.get("axis", 0) or 0) % len(ctx.tensor(0).shape)
        y = relax.op.take(ctx.arg_stored(0), ctx.index(1), axis=axis, mode="clip")
        return [ctx.emit(y)]
    return _take_rows(ctx, gather_rows(ctx.tensor(0).shape, ctx.const(1), ctx.options))


@emitter("EMBEDDING_LOOKUP")
def _embedding_lookup(ctx: Ctx) -> list[Expr]:
    """The table's rows at the ids (an id outside it is refused on the host before the run:
    `Session`; the kernel clamps, so that it never reads outside)."""
    return [ctx.emit(relax.op.take(ctx.arg_stored(1), ctx.index(0), axis=0, mode="clip"))]


@emitter("ONE_HOT")
def _one_hot(ctx: Ctx) -> list[Expr]:
    """on where the index equals the position along the new axis, off elsewhere (an index
    outside [0, depth) matches none, as in one_hot.cc)."""
    lead = ctx.tensor(0).shape
    depth = int(np.asarray(ctx.const(1)).reshape(-1).astype(np.int32)[0])
    axis = int(ctx.options.get("axis", -1))
    axis = len(lead) if axis == -1 else axis

    def one_hot(idx: te.Tensor, on: te.Tensor, off: te.Tensor) -> te.Tensor:
        def element(*i: tirx.PrimExpr) -> tirx.PrimExpr:
            at = idx[(*i[:axis], *i[axis + 1 :])].astype("int32")
            return tirx.Select(at == i[axis], on[(0,) * len(on.shape)], off[(0,) * len(off.shape)])

        return te.compute((*lead[:axis], depth, *lead[axis:]), element, name="one_hot")

    y = ctx.bb.call_te(
        one_hot, ctx.index(0), ctx.arg_stored(2), ctx.arg_stored(3), primfunc_name_hint="one_hot"
    )
    return [ctx.emit(y)]


@emitter("DYNAMIC_UPDATE_SLICE")
def _dynamic_update_slice(ctx: Ctx) -> list[Expr]:
    """The operand with the update written at the start indices, each clamped so that the
    update fits (dynamic_update_slice.cc): one kernel over the operand's elements, each
    taking the update's element where it falls in the window."""
    dims, sizes = ctx.tensor(0).shape, ctx.tensor(1).shape

    def update(x: te.Tensor, u: te.Tensor, start: te.Tensor) -> te.Tensor:
        at = [
            tirx.max(tirx.min(start[k].astype("int32"), d - n), 0)
            for k, (d, n) in enumerate(zip(dims, sizes, strict=True))
        ]

        def element(*i: tirx.PrimExpr) -> tirx.PrimExpr:
            inside = tirx.all(
                *[tirx.all(a <= j, j < a + n) for j, a, n in zip(i, at, sizes, strict=True)]
            )
            # (the update's index clamped too: both operands of the select are read)
            window = zip(i, at, sizes, strict=True)
            src = [tirx.max(tirx.min(j - a, n - 1), 0) for j, a, n in window]
            return tirx.Select(inside, u[tuple(src)].astype(x.dtype), x[i])

        return te.compute(x.shape, element, name="dynamic_update_slice")

    y = ctx.bb.call_te(
        update, ctx.arg_stored(0), ctx.arg_stored(1), ctx.index(2),
        primfunc_name_hint="dynamic_update_slice",
    )  # fmt: skip
    return [ctx.emit(y)]


@emitter("GATHER_ND")
def _gather_nd(ctx: Ctx) -> list[Expr]:
    if not ctx.is_runtime(1):
        return _take_rows(ctx, gather_nd_rows(ctx.tensor(0).shape, ctx.const(1)))
    dims, lead = ctx.tensor(0).shape, ctx.tensor(1).shape[:-1]
    q = ctx.tensor(1).shape[-1]

    def gather(x: te.Tensor, idx: te.Tensor) -> te.Tensor:
        def element(*i: tirx.PrimExpr) -> tirx.PrimExpr:
            at = [
                tirx.max(tirx.min(idx[(*i[: len(lead)], k)].astype("int32"), dims[k] - 1), 0)
                for k in range(q)
            ]  # (clamped: indices outside are refused on the host before the run)
            return x[(*at, *i[len(lead) :])]

        return te.compute((*lead, *dims[q:]), element, name="gather_nd")

    y = ctx.bb.call_te(gather, ctx.arg_stored(0), ctx.index(1), primfunc_name_hint="gather_nd")
    return [ctx.emit(y)]


@emitter("PADV2")
def _pad_v2(ctx: Ctx) -> list[Expr]:
    flat = _ints(ctx, 1)
    value = float(ctx.const(2).reshape(-1)[0]) if ctx.has(2) else 0.0
    return [ctx.emit(relax.op.nn.pad(ctx.arg_stored(0), flat, "constant", value))]


@emitter("MIRROR_PAD")
def _mirror_pad(ctx: Ctx) -> list[Expr]:
    from tvm import topi

    pads = np.asarray(_ints(ctx, 1)).reshape(-1, 2)
    mode = "REFLECT" if int(ctx.options.get("mode", 0)) == 0 else "SYMMETRIC"
    y = ctx.bb.call_te(
        topi.nn.mirror_pad,
        ctx.arg_stored(0),
        [int(p) for p in pads[:, 0]],
        [int(p) for p in pads[:, 1]],
        mode,
        primfunc_name_hint="mirror_pad",
    )
    return [ctx.emit(y)]


@emitter("BATCH_MATMUL")
def _batch_matmul(ctx: Ctx) -> list[Expr]:
    adj_x, adj_y = bool(ctx.options.get("adj_x")), bool(ctx.options.get("adj_y"))
    if ctx.tensor(1).data is not None:
        # A constant RHS is a weight constant, transposed once here.
        w = ctx.const(1)
        x, wt = data_and_weights(
            ctx, 0, np.ascontiguousarray(np.swapaxes(w, -1, -2) if adj_y else w)
        )
    else:
        x, wt = ctx.arg(0), ctx.arg(1)
        if adj_y:
            wt = ctx.emit(relax.op.permute_dims(wt, _swap_last(len(ctx.tensor(1).shape))))
    if adj_x:
        x = ctx.emit(relax.op.permute_dims(x, _swap_last(len(ctx.tensor(0).shape))))
    return [ctx.emit(relax.op.matmul(x, wt, out_dtype=ACC_DTYPE))]


def _swap_last(rank: int) -> list[int]:
    return [*range(rank - 2), rank - 1, rank - 2]
