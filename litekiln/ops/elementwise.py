"""Elementwise ops: binary arithmetic with broadcasting, unary math, activations, logic."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from litekiln.model.ir import Op, Subgraph, Tensor
from litekiln.ops import qmath
from litekiln.ops.base import (
    FLOAT32,
    QUANTIZED,
    BinaryOp,
    Check,
    OpContext,
    OpDef,
    UnaryOp,
    broadcast_shape,
    fused_activation,
    register,
    required,
)

#: dtype sets of LiteRT's elementwise kernels (their Eval switches).
_F32_Q = frozenset({"float32", "uint8", "int8", "int16"})
_NUMERIC = frozenset({"float32", "int32", "int64", "uint8", "int8", "int16"})
_BOOL = frozenset({"bool"})

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
    versions = (1, 6)
    dtypes = _NUMERIC | {"float16"}

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
    versions = (1, 5)
    dtypes = _NUMERIC

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
    versions = (1, 8)
    dtypes = _NUMERIC | {"float16", "uint32"}
    sets_output_dtype = False

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
    versions = (1, 2)
    dtypes = frozenset({"float32", "int32", "uint8"})


@register
class Maximum(BinaryOp):
    name = "MAXIMUM"
    gpu = True
    gpu_quant_max_version = 2
    fn = staticmethod(np.maximum)
    versions = (1, 4)
    dtypes = _NUMERIC | {"float16"}


@register
class Minimum(BinaryOp):
    name = "MINIMUM"
    gpu = True
    gpu_quant_max_version = 2
    fn = staticmethod(np.minimum)
    versions = (1, 4)
    dtypes = _NUMERIC | {"float16"}


@register
class Pow(BinaryOp):
    name = "POW"
    fn = staticmethod(np.power)
    dtypes = frozenset({"float32", "int32"})


@register
class SquaredDifference(BinaryOp):
    name = "SQUARED_DIFFERENCE"
    fn = staticmethod(lambda x, y: np.square(x - y))
    versions = (1, 2)
    dtypes = frozenset({"float32", "int32", "int8"})


@register
class FloorDiv(BinaryOp):
    name = "FLOOR_DIV"
    fn = staticmethod(np.floor_divide)
    versions = (1, 3)
    dtypes = frozenset({"float32", "int32", "int16", "int8"})


@register
class FloorMod(BinaryOp):
    name = "FLOOR_MOD"
    fn = staticmethod(np.mod)
    versions = (1, 2)
    dtypes = frozenset({"float32", "int32", "int64", "int16", "int8"})


@register
class LogicalAnd(BinaryOp):
    name = "LOGICAL_AND"
    gpu = True
    fn = staticmethod(np.logical_and)
    dtypes = _BOOL

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
    dtypes = _BOOL


class _Compare(BinaryOp):
    """Comparisons: a bool output (quantized inputs compared by their real values)."""

    dtypes = _NUMERIC | {"bool", "float16"}
    output_dtype = "bool"


for _name, _fn, _versions in [
    ("EQUAL", np.equal, (1, 5)),
    ("NOT_EQUAL", np.not_equal, (1, 4)),
    ("LESS", np.less, (1, 3)),
    ("LESS_EQUAL", np.less_equal, (1, 2)),
    ("GREATER", np.greater, (1, 2)),
    ("GREATER_EQUAL", np.greater_equal, (1, 3)),
]:
    register(
        type(
            _name.title().replace("_", ""),
            (_Compare,),
            {"name": _name, "fn": staticmethod(_fn), "versions": _versions},
        )
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


#: name: (fn, in the documented GPU table ("extended": the TFLite GPU delegate runs it too),
#: the versions LiteRT has kernels for, the input types they take).
_UNARY: dict[
    str,
    tuple[Callable[[np.ndarray], np.ndarray], bool | str, tuple[int, int], frozenset[str]],
] = {
    "RELU": (lambda x: np.maximum(x, 0), True, (1, 3), _F32_Q),
    "RELU6": (lambda x: np.clip(x, 0, 6), True, (1, 3), _F32_Q),
    "RELU_N1_TO_1": (
        lambda x: np.clip(x, -1, 1),
        False,
        (1, 1),
        frozenset({"float32", "uint8", "int8"}),
    ),
    "RELU_0_TO_1": (
        lambda x: np.clip(x, 0, 1),
        False,
        (1, 1),
        frozenset({"float32", "uint8", "int8"}),
    ),
    "LOGISTIC": (_logistic, True, (1, 3), _F32_Q),
    "TANH": (np.tanh, "extended", (1, 3), _F32_Q),
    "EXP": (np.exp, True, (1, 2), frozenset({"float32", "int8", "int16"})),
    "LOG": (np.log, False, (1, 2), frozenset({"float32", "int8", "int16"})),
    "SQRT": (np.sqrt, False, (1, 2), frozenset({"float32", "int8", "int16"})),
    "RSQRT": (lambda x: 1.0 / np.sqrt(x), False, (1, 3), frozenset({"float32", "int8", "int16"})),
    "SQUARE": (np.square, False, (1, 1), FLOAT32),
    "ABS": (np.abs, False, (1, 5), frozenset({"float32", "int8", "int16", "int32"})),
    "NEG": (np.negative, False, (1, 1), frozenset({"float32", "int32", "int64"})),
    "SIN": (np.sin, False, (1, 2), FLOAT32),
    "COS": (np.cos, False, (1, 2), FLOAT32),
    "FLOOR": (np.floor, False, (1, 1), FLOAT32),
    "CEIL": (np.ceil, False, (1, 1), FLOAT32),
    # banker's rounding, as TFLite's ROUND (std::nearbyint)
    "ROUND": (np.round, False, (1, 1), FLOAT32),
    "SIGN": (np.sign, False, (1, 2), frozenset({"float32", "int32"})),
    "LOGICAL_NOT": (np.logical_not, False, (1, 1), _BOOL),
    "HARD_SWISH": (
        lambda x: x * np.clip(x + 3, 0, 6) / 6,
        "extended",
        (1, 1),
        frozenset({"float32", "uint8", "int8"}),
    ),
    "ELU": (
        lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))),
        False,
        (1, 1),
        frozenset({"float32", "int8"}),
    ),
    "GELU": (_gelu, False, (1, 3), frozenset({"float32", "uint8", "int8"})),
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

#: Unary kernels that give their output the input's type (the others require it).
_SETS_OUTPUT_DTYPE = {"CEIL", "FLOOR", "EXP", "NEG", "ROUND"}

for _name, (_unary_fn, _gpu, _versions, _dtypes) in _UNARY.items():
    _attrs: dict[str, object] = {
        "name": _name,
        "fn": staticmethod(_unary_fn),
        "gpu": _gpu is True,
        "gpu_extended": _gpu == "extended",
        "gpu_quant_max_version": 2,
        "versions": _versions,
        "dtypes": _dtypes,
        "sets_output_dtype": _name in _SETS_OUTPUT_DTYPE,
    }
    if _name in _UNARY_QUANTIZED:
        _attrs["reference_quantized"] = classmethod(_UNARY_QUANTIZED[_name])
    register(type(_name.title().replace("_", ""), (UnaryOp,), _attrs))


@register
class LeakyRelu(OpDef):
    name = "LEAKY_RELU"
    versions = (1, 2)
    num_inputs = (1, 1)

    @classmethod
    def validate(cls, c: Check) -> None:
        super().validate(c)
        x, y = c.input(0), c.output()
        c.dtype(x, _F32_Q, "input")
        c.same_dtype(y, x, "output")
        if x.type_name in QUANTIZED:
            c.quantized(x, "input")
            c.quantized(y, "output")
            if x.type_name == "int16":
                c.zero_point(x, 0, "input")
                c.zero_point(y, 0, "output")
        c.output_shape(x.shape)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        alpha = np.float32(ctx.options.get("alpha", 0.2))
        return [np.where(x >= 0, x, x * alpha).astype(x.dtype)]


@register
class Prelu(OpDef):
    name = "PRELU"
    gpu = True
    num_inputs = (2, 2)

    @classmethod
    def validate(cls, c: Check) -> None:
        """activations.cc's PreluPrepare: the output is input and alpha broadcast, and must
        keep the input's shape. litekiln also wants alpha of the input's type (LiteRT's
        float kernel reads alpha's bytes as floats)."""
        super().validate(c)
        x, alpha, y = c.input(0), c.input(1), c.output()
        c.dtype(x, _F32_Q, "input")
        c.same_dtype(alpha, x, "alpha")
        c.output_dtype(x.dtype)
        if x.type_name in QUANTIZED:
            for t, role in ((x, "input"), (alpha, "alpha"), (y, "output")):
                c.quantized(t, role)
        shape = broadcast_shape(c, x, alpha)
        if shape != x.shape:
            raise c.fail("broadcast", f"alpha {list(alpha.shape)} widens the input {list(x.shape)}")
        c.output_shape(shape)

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
    """CAST converts the stored values: quantized tensors are cast as their raw integers
    (LiteRT's cast ignores quantization)."""

    name = "CAST"
    versions = (1, 9)
    num_inputs = (1, 1)
    quant_aware = True

    @classmethod
    def validate(cls, c: Check) -> None:
        super().validate(c)
        x = c.input(0)
        c.output_shape(x.shape)

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
    def validate(cls, c: Check) -> None:
        """add_n.cc: two or more inputs of one type (float32 or int32) and one shape."""
        super().validate(c)
        n = len(c.op.inputs)
        if n < 2:
            raise c.fail("input-count", f"{n} inputs, the kernel takes 2 or more")
        x = c.input(0)
        c.dtype(x, frozenset({"float32", "int32"}), "input 0")
        for i in range(1, n):
            t = c.input(i)
            c.same_dtype(t, x, f"input {i}", "input 0")
            c.same_shape(t, x, f"input {i}", "input 0")
        c.output_dtype(x.dtype)
        c.output_shape(x.shape)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        xs = [x for x in inputs if x is not None]
        return [np.sum(np.stack(xs), axis=0).astype(xs[0].dtype)]


@register
class Select(OpDef):
    """SELECT: a condition of the inputs' shape, or a scalar, or a vector choosing rows."""

    name = "SELECT"
    versions = (1, 4)
    num_inputs = (3, 3)

    @classmethod
    def validate(cls, c: Check) -> None:
        super().validate(c)
        cond, x, y = c.input(0), c.input(1), c.input(2)
        c.dtype(cond, _BOOL, "condition")
        c.same_dtype(y, x, "input 2", "input 1")
        c.output_dtype(x.dtype)
        c.output_shape(cls.shape(c, cond, x, y))

    @classmethod
    def shape(cls, c: Check, cond: Tensor, x: Tensor, y: Tensor) -> tuple[int, ...]:
        """select.cc's output shape (kVersionOne)."""
        if cond.shape == x.shape == y.shape or cond.size == x.size == y.size == 1:
            return x.shape if cond.shape == x.shape == y.shape else c.output().shape
        rows = len(cond.shape) == 1 and x.shape[:1] == cond.shape
        if not (len(cond.shape) == 0 or rows) or x.shape != y.shape:
            raise c.fail(
                "broadcast",
                f"condition {list(cond.shape)} and inputs {list(x.shape)}, {list(y.shape)}: "
                "SELECT needs equal shapes, a scalar condition or one per row",
            )
        return x.shape

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        c, x, y = (required(ctx, inputs, i) for i in range(3))
        c = c.astype(bool)
        if c.ndim == 1 and x.ndim > 1 and c.shape[0] == x.shape[0]:
            c = c.reshape(-1, *([1] * (x.ndim - 1)))  # one condition per row (version one)
        return [np.where(c, x, y)]


@register
class SelectV2(Select):
    """SELECT_V2: condition and inputs broadcast together (numpy's rules, rank <= 8)."""

    name = "SELECT_V2"
    versions = (1, 2)

    @classmethod
    def shape(cls, c: Check, cond: Tensor, x: Tensor, y: Tensor) -> tuple[int, ...]:
        if cond.size == x.size == y.size == 1:
            return c.output().shape
        shape = broadcast_shape(c, cond, x)
        shape = broadcast_shape(c, Tensor(-1, "broadcast", shape, x.dtype), y)
        if len(shape) > 8:
            raise c.fail("rank", f"broadcast shape {list(shape)} has more than 8 dimensions")
        return shape

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        c, x, y = (required(ctx, inputs, i) for i in range(3))
        return [np.where(c.astype(bool), x, y)]
