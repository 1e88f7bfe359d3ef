"""Elementwise ops: binary arithmetic with broadcasting, unary math, activations, logic."""

from __future__ import annotations

import numpy as np

from litekiln.model.ir import Op, Subgraph
from litekiln.ops.base import BinaryOp, OpContext, OpDef, UnaryOp, register, required

# -- binary -------------------------------------------------------------------------------


@register
class Add(BinaryOp):
    name = "ADD"
    gpu = True
    gpu_quant_max_version = 2  # ADD v2 is the int8 kernel (DESIGN.md)
    fn = staticmethod(np.add)


@register
class Sub(BinaryOp):
    name = "SUB"
    gpu = True
    gpu_quant_max_version = 2
    fn = staticmethod(np.subtract)


@register
class Mul(BinaryOp):
    name = "MUL"
    gpu = True
    gpu_quant_max_version = 2
    fn = staticmethod(np.multiply)


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
    register(type(_name.title().replace("_", ""), (_Compare,), {"name": _name, "fn": staticmethod(_fn)}))


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


_UNARY: dict[str, tuple[object, bool | str]] = {
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

for _name, (_fn, _gpu) in _UNARY.items():
    register(
        type(
            _name.title().replace("_", ""),
            (UnaryOp,),
            {
                "name": _name,
                "fn": staticmethod(_fn),
                "gpu": _gpu is True,
                "gpu_extended": _gpu == "extended",
                "gpu_quant_max_version": 2,
            },
        )
    )


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
