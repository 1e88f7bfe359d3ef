"""Elementwise ops: binary arithmetic with broadcasting, unary math, activations, logic."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from litekiln.model.ir import Op, Subgraph
from litekiln.ops import qmath
from litekiln.ops.base import (
    BinaryOp,
    OpContext,
    OpDef,
    UnaryOp,
    fused_activation,
    register,
    required,
)

# -- binary -------------------------------------------------------------------------------


# -- integer semantics of ADD / SUB / MUL (int8, uint8) --------------------------------------


def _binary_operands(ctx: OpContext, inputs: list[np.ndarray | None]):
    """(x, y, x tensor, y tensor, output tensor) when all three are 8-bit quantized, else None."""
    xt, yt, zt = ctx.input_tensor(0), ctx.input_tensor(1), ctx.output_tensor()
    if not all(qmath.is_integer_quantized(t) for t in (xt, yt, zt)):
        return None
    if any(t.quantization.per_channel for t in (xt, yt, zt)):  # type: ignore[union-attr]
        return None
    x, y = required(ctx, inputs, 0), required(ctx, inputs, 1)
    return x.astype(np.int64), y.astype(np.int64), xt, yt, zt


def _add_sub_quantized(
    ctx: OpContext, inputs: list[np.ndarray | None], sign: int
) -> list[np.ndarray] | None:
    """LiteRT's 8-bit ADD / SUB (add.cc, sub.cc): both inputs shifted left by 20 bits and
    rescaled to twice the larger input scale, summed, rescaled to the output."""
    ops = _binary_operands(ctx, inputs)
    if ops is None:
        return None
    x, y, xt, yt, zt = ops
    (xs, xz), (ys, yz), (zs, zz) = (qmath.scale_zp(t) for t in (xt, yt, zt))
    left_shift = 20
    # 2 * max(float, float) is a float; the divisions are in double (as in Prepare).
    twice_max = float(np.float32(2) * max(np.float32(xs), np.float32(ys)))
    m1, s1 = qmath.quantize_multiplier(xs / twice_max)
    m2, s2 = qmath.quantize_multiplier(ys / twice_max)
    mo, so = qmath.quantize_multiplier(twice_max / float(np.float32((1 << left_shift) * zs)))
    a = qmath.multiply_by_quantized_multiplier((x - xz) << left_shift, m1, s1)
    b = qmath.multiply_by_quantized_multiplier((y - yz) << left_shift, m2, s2)
    raw = qmath.multiply_by_quantized_multiplier(a + sign * b, mo, so) + zz
    lo, hi = qmath.activation_range(fused_activation(ctx.op), zt)
    return [np.clip(raw, lo, hi).astype(zt.dtype)]


def _mul_quantized(ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray] | None:
    """LiteRT's 8-bit MUL: (x - x_zp) * (y - y_zp) rescaled by x_scale * y_scale / z_scale
    (a float32 expression in mul.cc's Prepare)."""
    ops = _binary_operands(ctx, inputs)
    if ops is None:
        return None
    x, y, xt, yt, zt = ops
    (xs, xz), (ys, yz), (zs, zz) = (qmath.scale_zp(t) for t in (xt, yt, zt))
    real = float(np.float32(np.float32(xs) * np.float32(ys)) / np.float32(zs))
    m, s = qmath.quantize_multiplier(real)
    raw = qmath.multiply_by_quantized_multiplier((x - xz) * (y - yz), m, s) + zz
    lo, hi = qmath.activation_range(fused_activation(ctx.op), zt)
    return [np.clip(raw, lo, hi).astype(zt.dtype)]


@register
class Add(BinaryOp):
    name = "ADD"
    gpu = True
    gpu_quant_max_version = 2  # ADD v2 is the int8 kernel (docs/architecture.md, "Op tables")
    fn = staticmethod(np.add)

    @classmethod
    def reference_quantized(
        cls, ctx: OpContext, inputs: list[np.ndarray | None]
    ) -> list[np.ndarray] | None:
        return _add_sub_quantized(ctx, inputs, 1)


@register
class Sub(BinaryOp):
    name = "SUB"
    gpu = True
    gpu_quant_max_version = 2
    fn = staticmethod(np.subtract)

    @classmethod
    def reference_quantized(
        cls, ctx: OpContext, inputs: list[np.ndarray | None]
    ) -> list[np.ndarray] | None:
        return _add_sub_quantized(ctx, inputs, -1)


@register
class Mul(BinaryOp):
    name = "MUL"
    gpu = True
    gpu_quant_max_version = 2
    fn = staticmethod(np.multiply)

    @classmethod
    def reference_quantized(
        cls, ctx: OpContext, inputs: list[np.ndarray | None]
    ) -> list[np.ndarray] | None:
        return _mul_quantized(ctx, inputs)


@register
class Div(BinaryOp):
    name = "DIV"
    gpu_extended = True
    fn = staticmethod(np.divide)


@register
class Maximum(BinaryOp):
    name = "MAXIMUM"
    gpu = True
    gpu_quant_max_version = 2
    fn = staticmethod(np.maximum)


@register
class Minimum(BinaryOp):
    name = "MINIMUM"
    gpu = True
    gpu_quant_max_version = 2
    fn = staticmethod(np.minimum)


@register
class Pow(BinaryOp):
    name = "POW"
    fn = staticmethod(np.power)


@register
class SquaredDifference(BinaryOp):
    name = "SQUARED_DIFFERENCE"
    fn = staticmethod(lambda x, y: np.square(x - y))


@register
class FloorDiv(BinaryOp):
    name = "FLOOR_DIV"
    fn = staticmethod(np.floor_divide)


@register
class FloorMod(BinaryOp):
    name = "FLOOR_MOD"
    fn = staticmethod(np.mod)


@register
class LogicalAnd(BinaryOp):
    name = "LOGICAL_AND"
    gpu = True
    fn = staticmethod(np.logical_and)

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        # The GPU delegate runs LOGICAL_AND on bool tensors stored as floats 0/1.
        if op.version > cls.gpu_max_version:
            return f"version {op.version} > {cls.gpu_max_version}"
        return None


@register
class LogicalOr(BinaryOp):
    name = "LOGICAL_OR"
    fn = staticmethod(np.logical_or)


class _Compare(BinaryOp):
    pass


for _name, _fn in [
    ("EQUAL", np.equal),
    ("NOT_EQUAL", np.not_equal),
    ("LESS", np.less),
    ("LESS_EQUAL", np.less_equal),
    ("GREATER", np.greater),
    ("GREATER_EQUAL", np.greater_equal),
]:
    register(
        type(_name.title().replace("_", ""), (_Compare,), {"name": _name, "fn": staticmethod(_fn)})
    )


# -- unary --------------------------------------------------------------------------------


def _logistic(x: np.ndarray) -> np.ndarray:
    # Numerically safe in float32 for large |x| (no overflow warning from exp).
    x = x.astype(np.float32, copy=False)
    out = np.empty_like(x)
    pos = x >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-x[pos]))
    e = np.exp(x[~pos])
    out[~pos] = e / (1.0 + e)
    return out


def _gelu(x: np.ndarray) -> np.ndarray:
    from math import sqrt

    erf = np.vectorize(__import__("math").erf, otypes=[np.float64])
    return (0.5 * x * (1.0 + erf(x / sqrt(2.0)))).astype(x.dtype)


_UNARY: dict[str, tuple[Callable[[np.ndarray], np.ndarray], bool | str]] = {
    # name: (fn, in the documented GPU table; "extended": the TFLite GPU delegate runs it too)
    "RELU": (lambda x: np.maximum(x, 0), True),
    "RELU6": (lambda x: np.clip(x, 0, 6), True),
    "RELU_N1_TO_1": (lambda x: np.clip(x, -1, 1), False),
    "RELU_0_TO_1": (lambda x: np.clip(x, 0, 1), False),
    "LOGISTIC": (_logistic, True),
    "TANH": (np.tanh, "extended"),
    "EXP": (np.exp, True),
    "LOG": (np.log, False),
    "SQRT": (np.sqrt, False),
    "RSQRT": (lambda x: 1.0 / np.sqrt(x), False),
    "SQUARE": (np.square, False),
    "ABS": (np.abs, False),
    "NEG": (np.negative, False),
    "SIN": (np.sin, False),
    "COS": (np.cos, False),
    "FLOOR": (np.floor, False),
    "CEIL": (np.ceil, False),
    "ROUND": (np.round, False),  # banker's rounding, as TFLite's ROUND (std::nearbyint)
    "SIGN": (np.sign, False),
    "LOGICAL_NOT": (np.logical_not, False),
    "HARD_SWISH": (lambda x: x * np.clip(x + 3, 0, 6) / 6, "extended"),
    "ELU": (lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))), False),
    "GELU": (_gelu, False),
}


def _logistic_quantized(
    cls: type[OpDef], ctx: OpContext, inputs: list[np.ndarray | None]
) -> list[np.ndarray] | None:
    """LiteRT's 8-bit LOGISTIC: a 256-entry table (``LUTPopulate``) of
    ``round(sigmoid(x_scale * (q - x_zp)) / y_scale) + y_zp``, all in float32."""
    xt, yt = ctx.input_tensor(0), ctx.output_tensor()
    if not (qmath.is_integer_quantized(xt) and qmath.is_integer_quantized(yt)):
        return None
    (xs, xz), (ys, yz) = qmath.scale_zp(xt), qmath.scale_zp(yt)
    info = np.iinfo(xt.dtype)
    q = np.arange(info.min, info.max + 1)
    real = np.float32(xs) * (q - xz).astype(np.float32)
    e = np.exp(-real.astype(np.float64)).astype(np.float32)  # expf, correctly rounded
    sig = np.float32(1) / (np.float32(1) + e)
    out_info = np.iinfo(yt.dtype)
    table = qmath.round_half_away(sig * (np.float32(1) / np.float32(ys))) + yz
    table = np.clip(table, out_info.min, out_info.max).astype(yt.dtype)
    x = required(ctx, inputs, 0).astype(np.int64)
    return [table[x - info.min]]


#: Integer semantics of unary ops that have them.
_UNARY_QUANTIZED = {"LOGISTIC": _logistic_quantized}

for _name, (_unary_fn, _gpu) in _UNARY.items():
    _attrs: dict[str, object] = {
        "name": _name,
        "fn": staticmethod(_unary_fn),
        "gpu": _gpu is True,
        "gpu_extended": _gpu == "extended",
        "gpu_quant_max_version": 2,
    }
    if _name in _UNARY_QUANTIZED:
        _attrs["reference_quantized"] = classmethod(_UNARY_QUANTIZED[_name])
    register(type(_name.title().replace("_", ""), (UnaryOp,), _attrs))


@register
class LeakyRelu(OpDef):
    name = "LEAKY_RELU"

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        alpha = np.float32(ctx.options.get("alpha", 0.2))
        return [np.where(x >= 0, x, x * alpha).astype(x.dtype)]


@register
class Prelu(OpDef):
    name = "PRELU"
    gpu = True

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x, alpha = required(ctx, inputs, 0), required(ctx, inputs, 1)
        return [np.where(x >= 0, x, x * alpha).astype(x.dtype)]

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        reason = super().gpu_support(op, graph, allow_quantized=allow_quantized)
        if reason:
            return reason
        if not graph.tensors[op.inputs[1]].is_constant:
            return "alpha must be a constant"
        return None


@register
class Cast(OpDef):
    name = "CAST"

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        dtype = ctx.output_tensor().dtype
        if dtype.kind in "iu" and x.dtype.kind == "f":
            x = np.trunc(x)  # C++ static_cast truncates toward zero
        return [x.astype(dtype)]


@register
class AddN(OpDef):
    name = "ADD_N"

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        xs = [x for x in inputs if x is not None]
        return [np.sum(np.stack(xs), axis=0).astype(xs[0].dtype)]


@register
class Select(OpDef):
    name = "SELECT"
    aliases = ("SELECT_V2",)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        c, x, y = (required(ctx, inputs, i) for i in range(3))
        return [np.where(c.astype(bool), x, y)]
