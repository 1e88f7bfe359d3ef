"""Emitters of the data-movement and matrix ops: slices, splits, tiles, gathers, pads, batch
matmul (one per TFLite op name; the op's semantics live in its :mod:`litekiln.ops` definition).
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from litekiln.compiler.lowering import (
    ACC_DTYPE,
    Ctx,
    Expr,
    activation,
    data_and_weights,
    dtype_of,
    emitter,
)


@emitter("PAD")
def _pad(ctx: Ctx) -> list[Expr]:
    pads = ctx.const(1).astype(np.int64).reshape(-1, 2)
    flat = [int(v) for v in pads.reshape(-1)]
    return [ctx.emit(relax.op.nn.pad(ctx.arg_stored(0), flat, "constant", 0.0))]


@emitter("CONCATENATION")
def _concat(ctx: Ctx) -> list[Expr]:
    # Moves stored values, unless a fused activation computes on them.
    load = ctx.arg if int(ctx.options.get("fused_activation_function", 0) or 0) else ctx.arg_stored
    xs = [load(i) for i in range(len(ctx.op.inputs)) if ctx.has(i)]
    if len({dtype_of(x) for x in xs}) > 1:  # a constant (float32) among half inputs
        xs = [ctx.arg(i) for i in range(len(ctx.op.inputs)) if ctx.has(i)]
    axis = int(ctx.options.get("axis", 0)) % len(ctx.out().shape)
    return [activation(ctx, ctx.emit(relax.op.concat(xs, axis=axis)))]


@emitter("RESHAPE", "SQUEEZE", "EXPAND_DIMS")
def _reshape(ctx: Ctx) -> list[Expr]:
    return [ctx.emit(relax.op.reshape(ctx.arg_stored(0), ctx.out().shape))]


@emitter("TRANSPOSE")
def _transpose(ctx: Ctx) -> list[Expr]:
    perm = [int(v) for v in ctx.const(1).reshape(-1)]
    return [ctx.emit(relax.op.permute_dims(ctx.arg_stored(0), perm))]


@emitter("STRIDED_SLICE")
def _strided_slice(ctx: Ctx) -> list[Expr]:
    shape = ctx.tensor(0).shape
    begin = ctx.const(1).astype(np.int64).reshape(-1)
    end = ctx.const(2).astype(np.int64).reshape(-1)
    strides = ctx.const(3).astype(np.int64).reshape(-1) if ctx.has(3) else np.ones_like(begin)
    o = ctx.options
    bm, em, shrink = (
        int(o.get("begin_mask", 0)),
        int(o.get("end_mask", 0)),
        int(o.get("shrink_axis_mask", 0)),
    )
    offset = bool(o.get("offset", False))
    axes, b_, e_, s_ = [], [], [], []
    flips: list[int] = []
    for i in range(begin.size):
        n = shape[i]
        st = int(strides[i])
        # Resolve to python-slice semantics, then to explicit in-range bounds.
        if shrink & (1 << i):
            first = int(begin[i]) % n
            sl = slice(first, first + 1, 1)
        else:
            b = None if bm & (1 << i) else int(begin[i])
            e = None if em & (1 << i) else int(end[i])
            if offset and b is not None and e is not None:
                e = b + e
            sl = slice(b, e, st)
        start, stop, step = sl.indices(n)
        if step < 0:
            # Slice the same elements in increasing order, then flip the axis: relax's
            # negative-stride end bounds cannot say "up to and including index 0".
            picked = range(start, stop, step)
            if len(picked) == 0:
                raise ctx.fail(f"axis {i} selects no element")
            start, stop, step = picked[-1], picked[0] + 1, -step
            flips.append(i)
        axes.append(i)
        b_.append(start)
        e_.append(max(stop, start))
        s_.append(step)
    y = ctx.emit(relax.op.strided_slice(ctx.arg_stored(0), axes, b_, e_, s_))
    for i in flips:
        y = ctx.emit(relax.op.flip(y, i))
    return [y]


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
