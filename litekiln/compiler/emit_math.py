"""Emitters of the elementwise math and reduction ops (one per TFLite op name; the op's
semantics live in its :mod:`litekiln.ops` definition).

Everything computes in float32 (``ctx.arg``) but int32 values (the arithmetic of positions
and masks, `OpDef.int32_data`), which stay int32. Booleans travel as float 0/1 on the GPU path
(``Lowering.build`` takes bool partition inputs as floats; the session turns bool outputs
back): a comparison gives 0/1, a condition is "not 0", LOGICAL_OR is a maximum.

Binary and ternary ops with broadcasting are written as one TE compute each
(:func:`_broadcast_op`); when an operand computed inside the partition is smaller than the
result (a layer norm's ``x - mean``, an L2 norm's ``x / norm``), the kernel is marked
injective (``BROADCAST_BARRIER``), so that FuseOps keeps it out of the reduction that made
the small operand (fused, the reduction would be recomputed for every output element).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from tvm import relax, te, tirx
from tvm.ir.expr import Constant

from litekiln.compiler.lowering import ACC_DTYPE, BROADCAST_BARRIER, EMITTERS, Ctx, Expr, emitter

#: A TIR expression of the operands' elements (tirx.PrimExpr; TVM's typing is dynamic).
Scalar = Any


def _f32(v: float) -> Scalar:
    return tirx.const(v, "float32")


def _arg(ctx: Ctx, i: int) -> Expr:
    """Operand ``i`` in float32; a bool constant as float 0/1."""
    t = ctx.tensor(i)
    if t.data is not None and t.dtype == np.bool_:
        return ctx.fconst(t.data.astype(np.float32))
    return ctx.arg(i)


def _shape(expr: Expr) -> tuple[int, ...]:
    return tuple(int(d) for d in expr.ty.shape)


# -- unary ------------------------------------------------------------------------------------

_UNARY: dict[str, Callable[[Ctx, Expr], Expr]] = {
    "RELU": lambda c, x: relax.op.nn.relu(x),
    "RELU6": lambda c, x: relax.op.clip(x, 0.0, 6.0),
    "RELU_N1_TO_1": lambda c, x: relax.op.clip(x, -1.0, 1.0),
    "RELU_0_TO_1": lambda c, x: relax.op.clip(x, 0.0, 1.0),
    "LOGISTIC": lambda c, x: relax.op.sigmoid(x),
    "TANH": lambda c, x: relax.op.tanh(x),
    "EXP": lambda c, x: relax.op.exp(x),
    "LOG": lambda c, x: relax.op.log(x),
    "SQRT": lambda c, x: relax.op.sqrt(x),
    "RSQRT": lambda c, x: relax.op.rsqrt(x),
    "SQUARE": lambda c, x: relax.op.multiply(x, x),
    "ABS": lambda c, x: relax.op.abs(x),
    "NEG": lambda c, x: relax.op.negative(x),
    "SIN": lambda c, x: relax.op.sin(x),
    "COS": lambda c, x: relax.op.cos(x),
    "FLOOR": lambda c, x: relax.op.floor(x),
    "CEIL": lambda c, x: relax.op.ceil(x),
    # relax's round is TIR nearbyint (OpenCL rint): halves to even, as LiteRT's ROUND.
    "ROUND": lambda c, x: relax.op.round(x),
    # (0 < x) - (x < 0), as sign.cc: NaN gives 0.
    "SIGN": lambda c, x: relax.op.sign(x),
    "LOGICAL_NOT": lambda c, x: relax.op.subtract(c.fconst(1.0), x),
    "HARD_SWISH": lambda c, x: relax.op.multiply(
        x,
        relax.op.multiply(
            relax.op.clip(relax.op.add(x, c.fconst(3.0)), 0.0, 6.0), c.fconst(1.0 / 6.0)
        ),
    ),
    # x > 0 ? x : expm1(x); exp of min(x, 0) so that a large x cannot overflow the branch
    # not taken. exp(x) - 1 differs from expm1 by ~1e-7 absolute near 0.
    "ELU": lambda c, x: relax.op.where(
        relax.op.greater(x, c.fconst(0.0)),
        x,
        relax.op.subtract(relax.op.exp(relax.op.minimum(x, c.fconst(0.0))), c.fconst(1.0)),
    ),
}

for _name in _UNARY:
    EMITTERS[_name] = (lambda f: lambda ctx: [ctx.emit(f(ctx, _arg(ctx, 0)))])(_UNARY[_name])


@emitter("GELU")
def _gelu(ctx: Ctx) -> list[Expr]:
    """gelu.h: ``0.5 x (1 + erf(x / sqrt 2))`` (LiteRT writes it with erfc; the two differ
    by ~1e-7 absolute where erf nears -1), or the tanh form with ``approximate``."""
    x = _arg(ctx, 0)
    half_x = relax.op.multiply(x, ctx.fconst(0.5))
    if ctx.options.get("approximate"):
        cube = relax.op.multiply(relax.op.multiply(x, x), x)
        inner = relax.op.add(x, relax.op.multiply(cube, ctx.fconst(0.044715)))
        t = relax.op.tanh(relax.op.multiply(inner, ctx.fconst(math.sqrt(2.0 / math.pi))))
    else:
        t = relax.op.erf(relax.op.multiply(x, ctx.fconst(math.sqrt(0.5))))
    return [ctx.emit(relax.op.multiply(half_x, relax.op.add(t, ctx.fconst(1.0))))]


@emitter("LEAKY_RELU")
def _leaky_relu(ctx: Ctx) -> list[Expr]:
    x = _arg(ctx, 0)
    alpha = ctx.fconst(float(ctx.options.get("alpha", 0.0)))
    pos = relax.op.greater(x, ctx.fconst(0.0))
    return [ctx.emit(relax.op.where(pos, x, relax.op.multiply(x, alpha)))]


@emitter("CAST")
def _cast(ctx: Ctx) -> list[Expr]:
    """float32/float16/bool/int32 to float32/float16/bool/int32
    (ops.elementwise.Cast.gpu_support)."""
    src, dst = ctx.tensor(0).dtype, ctx.out().dtype
    x = _arg(ctx, 0)
    if dst == np.bool_:
        if src == np.bool_:
            return [x]
        # A select, not relax's astype of a bool: TVM's OpenCL code converts a vectorized
        # comparison (-1 for true) with convert_float4, which gives -1.0.
        zero = tirx.const(0, "int32") if src == np.int32 else _f32(0.0)
        return [_broadcast_op(ctx, "cast_to_bool", lambda a: _one(a != zero), [x])]
    if dst == np.int32:
        # C's conversion, as cast.cc's static_cast: toward zero (bool's 0/1 exactly).
        return [x if src == np.int32 else ctx.emit(relax.op.astype(x, "int32"))]
    if src == np.int32:
        x = ctx.emit(relax.op.astype(x, ACC_DTYPE))
    if dst == np.float16 and src != np.float16:
        # Rounded with integer ops (ties to even, saturating at +-65504): no half arithmetic
        # in the kernel, which some drivers cannot build.
        return [ctx.lw._round_to_half(x)]
    return [x]  # float16 or bool (0/1) to float32, float32 to float32: the same values


# -- broadcast binary and ternary ops ---------------------------------------------------------


def _element(t: te.Tensor, shape: Sequence[int], idx: Sequence[Scalar]) -> Scalar:
    """The element of ``t`` that numpy's broadcasting puts at ``idx`` of ``shape``."""
    lead = len(shape) - len(t.shape)
    return t(*[0 if int(d) == 1 else idx[lead + k] for k, d in enumerate(t.shape)])


def _broadcast_op(ctx: Ctx, name: str, fn: Callable[..., Scalar], operands: Sequence[Expr]) -> Expr:
    """``fn`` of the operands' elements, broadcast together: one kernel, with a barrier
    (see the module docstring) when a computed operand is smaller than the result."""
    shapes = [_shape(e) for e in operands]
    out = tuple(int(d) for d in np.broadcast_shapes(*shapes))
    size = math.prod(out)
    barrier = any(
        not isinstance(e, Constant) and math.prod(s) < size
        for e, s in zip(operands, shapes, strict=True)
    )

    def compute(*tensors: te.Tensor) -> te.Tensor:
        return te.compute(
            out, lambda *idx: fn(*(_element(t, out, idx) for t in tensors)), name=name
        )

    hint = f"{BROADCAST_BARRIER}{name}" if barrier else name
    return ctx.emit(ctx.bb.call_te(compute, *operands, primfunc_name_hint=hint))


def _one(cond: Scalar) -> Scalar:
    return tirx.Select(cond, _f32(1.0), _f32(0.0))


def _floor_div(a: Scalar, b: Scalar) -> Scalar:
    """floor_div.h's ``floor(double(a) / double(b))`` in float32: the truncated quotient
    ``(a - fmod(a, b)) / b`` (an integer, rounded to it), one less when the remainder's sign
    is not the divisor's. ``floor(a / b)`` would be wrong where ``a / b`` rounds up to an
    integer (1 / 0.1f is 10 in float32, LiteRT's floor is 9)."""
    r = tirx.fmod(a, b)
    q = tirx.nearbyint((a - r) / b)
    return tirx.Select(_wrong_sign(r, b), q - _f32(1.0), q)


def _floor_mod(a: Scalar, b: Scalar) -> Scalar:
    """floor_mod.h: ``fmod(a, b)``, plus ``b`` when its sign is not ``b``'s."""
    r = tirx.fmod(a, b)
    return tirx.Select(_wrong_sign(r, b), r + b, r)


def _wrong_sign(r: Scalar, b: Scalar) -> Scalar:
    zero = _f32(0.0)
    return tirx.Or(tirx.And(r < zero, b > zero), tirx.And(r > zero, b < zero))


_BINARY: dict[str, Callable[[Scalar, Scalar], Scalar]] = {
    "SQUARED_DIFFERENCE": lambda a, b: (a - b) * (a - b),
    "POW": lambda a, b: tirx.pow(a, b),
    # OpenCL's own atan2 (the quadrant from both signs): TVM writes tir.atan2 as C's atan2f,
    # which OpenCL C does not have
    "ATAN2": lambda y, x: tirx.call_pure_extern("float32", "atan2", y, x),
    "FLOOR_DIV": _floor_div,
    "FLOOR_MOD": _floor_mod,
    "LOGICAL_OR": lambda a, b: tirx.max(a, b),
    "EQUAL": lambda a, b: _one(a == b),
    "NOT_EQUAL": lambda a, b: _one(a != b),
    "LESS": lambda a, b: _one(a < b),
    "LESS_EQUAL": lambda a, b: _one(a <= b),
    "GREATER": lambda a, b: _one(a > b),
    "GREATER_EQUAL": lambda a, b: _one(a >= b),
}

for _name in _BINARY:
    EMITTERS[_name] = (
        lambda n, f: lambda ctx: [_broadcast_op(ctx, n.lower(), f, [_arg(ctx, 0), _arg(ctx, 1)])]
    )(_name, _BINARY[_name])


@emitter("SELECT", "SELECT_V2")
def _select(ctx: Ctx) -> list[Expr]:
    cond, x, y = (_arg(ctx, i) for i in range(3))
    c_shape, x_shape = ctx.tensor(0).shape, ctx.tensor(1).shape
    if ctx.op.name == "SELECT" and len(c_shape) == 1 and len(x_shape) > 1 and c_shape != x_shape:
        # SELECT (v1 rules): a vector condition picks whole rows.
        cond = ctx.emit(relax.op.reshape(cond, (c_shape[0],) + (1,) * (len(x_shape) - 1)))
    elif ctx.op.name == "SELECT" and ctx.tensor(0).size == 1 and c_shape != x_shape:
        cond = ctx.emit(relax.op.reshape(cond, ()))
    pick = lambda c, a, b: tirx.Select(c != _f32(0.0), a, b)  # noqa: E731
    return [_broadcast_op(ctx, "select", pick, [cond, x, y])]


# -- reductions and normalisations ------------------------------------------------------------


#: `_reduce`: a reduction over at most this many terms per output is written out term by
#: term (`_few_terms`), an injective kernel that fuses with its neighbours: ResNeSt's split
#: attention sums and softmaxes over its radix of 2 (litert-torch writes the softmax as
#: REDUCE_MAX, SUB, EXP, SUM and DIV), six launches a stage that did a few hundred bytes
#: of work each.
_FEW_TERMS = 4


def _reduce(
    fn: Callable[..., Expr], combine: Callable[[Scalar, Scalar], Scalar], mean: bool = False
) -> Callable[[Ctx], list[Expr]]:
    def emit(ctx: Ctx) -> list[Expr]:
        shape = [int(d) for d in ctx.tensor(0).shape]
        rank = len(shape)
        axes = sorted({int(a) % rank for a in ctx.const(1).reshape(-1)})
        keep = bool(ctx.options.get("keep_dims", False))
        if len(axes) == rank:
            # A rank-0 reduction fails TVM's scheduling (block_realize check): reduce keeping
            # the dims; the lowering reshapes to the declared scalar shape.
            keep = True
        terms = math.prod(shape[a] for a in axes)
        if axes and 1 < terms <= _FEW_TERMS and len(axes) < rank:
            name = ctx.op.name.lower()
            return [
                ctx.emit(
                    ctx.bb.call_te(
                        lambda x: _few_terms(x, axes, keep, combine, mean, name),
                        _arg(ctx, 0),
                        primfunc_name_hint=name,
                    )
                )
            ]
        return [ctx.emit(fn(_arg(ctx, 0), axis=axes, keepdims=keep))]

    return emit


def _few_terms(
    x: te.Tensor,
    axes: Sequence[int],
    keep: bool,
    combine: Callable[[Scalar, Scalar], Scalar],
    mean: bool,
    name: str,
) -> te.Tensor:
    """The reduction of ``x`` over ``axes`` with every term read by index, combined in order
    (as a serial reduction would), the mean divided by the count: no reduction axis."""
    shape = [int(d) for d in x.shape]
    kept = [i for i in range(len(shape)) if i not in axes]
    out = (
        [1 if i in axes else shape[i] for i in range(len(shape))]
        if keep
        else [shape[i] for i in kept]
    )
    count = math.prod(shape[a] for a in axes)

    def element(*idx: Scalar) -> Scalar:
        at = (
            dict(zip(range(len(shape)), idx, strict=True))
            if keep
            else dict(zip(kept, idx, strict=True))
        )
        acc = None
        for term in np.ndindex(*(shape[a] for a in axes)):
            full = {**at, **dict(zip(axes, term, strict=True))}
            v = x[tuple(full[i] for i in range(len(shape)))]
            acc = v if acc is None else combine(acc, v)
        return acc / _f32(float(count)) if mean else acc

    return te.compute(out, element, name=name)


for _name, _fn, _combine in [
    ("MEAN", relax.op.mean, lambda a, b: a + b),
    ("SUM", relax.op.sum, lambda a, b: a + b),
    ("REDUCE_PROD", relax.op.prod, lambda a, b: a * b),
    ("REDUCE_MAX", relax.op.max, tirx.max),
    ("REDUCE_MIN", relax.op.min, tirx.min),
    ("REDUCE_ANY", relax.op.max, tirx.max),  # (booleans as float 0/1)
    ("REDUCE_ALL", relax.op.min, tirx.min),
]:
    EMITTERS[_name] = _reduce(_fn, _combine, mean=_name == "MEAN")


def _const_axis(ctx: Ctx, rank: int) -> int:
    """Operand 1, one constant axis, within ``rank`` (validated at load; negative from the
    end)."""
    return int(ctx.const(1).reshape(-1)[0]) % rank


@emitter("CUMSUM")
def _cumsum(ctx: Ctx) -> list[Expr]:
    """cumsum.cc: running sums along a constant axis (``exclusive``: each leaves its own term
    out; ``reverse``: from the axis' end). Each output sums every term of the axis it covers,
    the others read as 0: a reduction the schedules split like any other (an axis of n costs
    n * n additions; `litekiln.ops.reduce.CUMSUM_GPU_TERMS` bounds n)."""
    x = _arg(ctx, 0)
    shape = _shape(x)
    axis = _const_axis(ctx, len(shape))
    exclusive = bool(ctx.options.get("exclusive", False))
    reverse = bool(ctx.options.get("reverse", False))

    def fn(a: te.Tensor) -> te.Tensor:
        k = te.reduce_axis((0, shape[axis]), name="k")
        zero = tirx.const(0, a.dtype)

        def element(*idx: Scalar) -> Scalar:
            j = idx[axis]
            if reverse:
                covered = k > j if exclusive else k >= j
            else:
                covered = k < j if exclusive else k <= j
            term = a[tuple(k if d == axis else i for d, i in enumerate(idx))]
            return te.sum(tirx.if_then_else(covered, term, zero), axis=k)

        return te.compute(shape, element, name="cumsum")

    return [ctx.emit(ctx.bb.call_te(fn, x, primfunc_name_hint="cumsum"))]


@emitter("ARG_MAX", "ARG_MIN")
def _arg_extreme(ctx: Ctx) -> list[Expr]:
    """arg_min_max.cc: the first position of the largest (smallest) value along a constant
    axis, as int32. Two plain reductions: the extreme, then the least position holding it
    (the others read as the axis' length), where a reduction over (value, position) pairs
    gave a kernel PoCL's compiler rejects."""
    x = _arg(ctx, 0)
    shape = _shape(x)
    axis = _const_axis(ctx, len(shape))
    n = shape[axis]
    extreme = relax.op.max if ctx.op.name == "ARG_MAX" else relax.op.min
    best = ctx.emit(extreme(x, axis=[axis], keepdims=True))

    def fn(a: te.Tensor, b: te.Tensor) -> te.Tensor:
        k = te.reduce_axis((0, n), name="k")

        def element(*idx: Scalar) -> Scalar:
            at = (*idx[:axis], k, *idx[axis:])
            first = (*idx[:axis], 0, *idx[axis:])
            hit = tirx.if_then_else(a[at] == b[first], k.astype("int32"), tirx.const(n, "int32"))
            return te.min(hit, axis=k)

        return te.compute(shape[:axis] + shape[axis + 1 :], element, name="arg_extreme")

    name = ctx.op.name.lower()
    return [ctx.emit(ctx.bb.call_te(fn, x, best, primfunc_name_hint=name))]


@emitter("SOFTMAX")
def _softmax(ctx: Ctx) -> list[Expr]:
    # LiteRT: exp(beta (x - max x)) / sum, the same as softmax(beta x).
    x = ctx.arg(0)
    beta = float(ctx.options.get("beta", 1.0))
    if beta != 1.0:
        x = ctx.emit(relax.op.multiply(x, ctx.fconst(beta)))
    return [ctx.emit(relax.op.nn.softmax(x, axis=-1))]


@emitter("LOG_SOFTMAX")
def _log_softmax(ctx: Ctx) -> list[Expr]:
    return [ctx.emit(relax.op.nn.log_softmax(ctx.arg(0), axis=-1))]


@emitter("L2_NORMALIZATION")
def _l2_normalization(ctx: Ctx) -> list[Expr]:
    """l2normalization.h: ``x / max(sqrt(sum(x^2) over the last axis), 1e-6)``."""
    x = ctx.arg(0)
    sq = ctx.emit(relax.op.sum(relax.op.multiply(x, x), axis=[-1], keepdims=True))
    norm = ctx.emit(relax.op.maximum(relax.op.sqrt(sq), ctx.fconst(1e-6)))
    return [_broadcast_op(ctx, "l2_normalize", lambda a, n: a / n, [x, norm])]
