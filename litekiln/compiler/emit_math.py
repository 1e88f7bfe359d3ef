"""Emitters of the elementwise math and reduction ops (one per TFLite op name; the op's
semantics live in its :mod:`litekiln.ops` definition)."""

from __future__ import annotations

from collections.abc import Callable

from tvm import relax

from litekiln.compiler.lowering import EMITTERS, Ctx, Expr, emitter

_UNARY: dict[str, Callable[[Ctx, Expr], Expr]] = {
    "RELU": lambda c, x: relax.op.nn.relu(x),
    "RELU6": lambda c, x: relax.op.clip(x, 0.0, 6.0),
    "RELU_N1_TO_1": lambda c, x: relax.op.clip(x, -1.0, 1.0),
    "LOGISTIC": lambda c, x: relax.op.sigmoid(x),
    "TANH": lambda c, x: relax.op.tanh(x),
    "EXP": lambda c, x: relax.op.exp(x),
    "HARD_SWISH": lambda c, x: relax.op.multiply(
        x,
        relax.op.multiply(
            relax.op.clip(relax.op.add(x, c.fconst(3.0)), 0.0, 6.0), c.fconst(1.0 / 6.0)
        ),
    ),
}

for _name in _UNARY:
    EMITTERS[_name] = (lambda f: lambda ctx: [ctx.emit(f(ctx, ctx.arg(0)))])(_UNARY[_name])


@emitter("SOFTMAX")
def _softmax(ctx: Ctx) -> list[Expr]:
    return [ctx.emit(relax.op.nn.softmax(ctx.arg(0), axis=-1))]


@emitter("MEAN")
def _mean(ctx: Ctx) -> list[Expr]:
    rank = len(ctx.tensor(0).shape)
    axes = sorted({int(a) % rank for a in ctx.const(1).reshape(-1)})
    keep = bool(ctx.options.get("keep_dims", False))
    if len(axes) == rank:
        # A rank-0 reduction fails TVM's scheduling (block_realize check): reduce keeping the
        # dims; the lowering reshapes to the declared scalar shape.
        keep = True
    return [ctx.emit(relax.op.mean(ctx.arg(0), axis=axes, keepdims=keep))]
