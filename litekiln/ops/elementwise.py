"""Elementwise ops: binary arithmetic with broadcasting, unary math, activations, logic."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

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


class _BoolsAsFloats(OpDef):
    """GPU support for ops with bool tensors: the GPU path carries booleans as float 0/1
    (LOGICAL_AND's emitter, ``Lowering.build``), so they count as float tensors here."""

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        return super().gpu_support(op, bools_as_floats(op, graph), allow_quantized=allow_quantized)


def bools_as_floats(op: Op, graph: Subgraph) -> Subgraph:
    """``graph`` with ``op``'s bool tensors seen as float32 (as the GPU path holds them)."""
    bools = [t for t in {*op.inputs, *op.outputs} if t >= 0 and graph.tensors[t].dtype == np.bool_]
    if not bools:
        return graph
    tensors = list(graph.tensors)
    for t in bools:
        tensors[t] = replace(tensors[t], dtype=np.dtype(np.float32))
    return replace(graph, tensors=tensors)


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


def _to_twice_max(
    x: np.ndarray, y: np.ndarray, xt: Tensor, yt: Tensor, left_shift: int
) -> tuple[np.ndarray, np.ndarray, float]:
    """The Prepare/Eval step LiteRT's 8-bit binary kernels share (add.cc, sub.cc,
    squared_difference.cc): both inputs less their zero points, shifted left by
    ``left_shift`` bits and rescaled to twice the larger input scale; and that scale."""
    (xs, xz), (ys, yz) = qmath.scale_zp(xt), qmath.scale_zp(yt)
    # 2 * max(float, float) is a float; the divisions are in double (as in Prepare).
    twice_max = float(np.float32(2) * max(np.float32(xs), np.float32(ys)))
    m1, s1 = qmath.quantize_multiplier(xs / twice_max)
    m2, s2 = qmath.quantize_multiplier(ys / twice_max)
    a = qmath.multiply_by_quantized_multiplier((x - xz) << left_shift, m1, s1)
    b = qmath.multiply_by_quantized_multiplier((y - yz) << left_shift, m2, s2)
    return a, b, twice_max


def _add_sub_quantized(
    ctx: OpContext, inputs: list[np.ndarray | None], sign: int
) -> list[np.ndarray] | None:
    """LiteRT's 8-bit ADD / SUB (add.cc, sub.cc): both inputs shifted left by 20 bits and
    rescaled to twice the larger input scale, summed, rescaled to the output."""
    ops = _binary_operands(ctx, inputs)
    if ops is None:
        return None
    x, y, xt, yt, zt = ops
    zs, zz = qmath.scale_zp(zt)
    left_shift = 20
    a, b, twice_max = _to_twice_max(x, y, xt, yt, left_shift)
    mo, so = qmath.quantize_multiplier(twice_max / float(np.float32((1 << left_shift) * zs)))
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
    int32_data = True
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
    int32_data = True
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
    int32_data = True
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
    """x / y; 8- and 16-bit quantized (div.cc: uint8, int8, int16) through the float view on
    both paths (the TFLite converter writes an int8 Keras model's softsign as v1 int8 DIVs)."""

    name = "DIV"
    gpu_extended = True
    gpu_quant_max_version = 2
    fn = staticmethod(np.divide)
    versions = (1, 2)
    dtypes = frozenset({"float32", "int32", "uint8", "int8", "int16"})


@register
class Maximum(BinaryOp):
    name = "MAXIMUM"
    gpu = True
    int32_data = True
    gpu_quant_max_version = 2
    fn = staticmethod(np.maximum)
    versions = (1, 4)
    dtypes = _NUMERIC | {"float16"}


@register
class Minimum(BinaryOp):
    name = "MINIMUM"
    gpu = True
    int32_data = True
    gpu_quant_max_version = 2
    fn = staticmethod(np.minimum)
    versions = (1, 4)
    dtypes = _NUMERIC | {"float16"}


@register
class Pow(BinaryOp):
    name = "POW"
    gpu_extended = True
    fn = staticmethod(np.power)
    dtypes = frozenset({"float32", "int32"})


@register
class SquaredDifference(BinaryOp):
    """(x - y)^2; v2: int8 (the GPU path takes it through the float view)."""

    name = "SQUARED_DIFFERENCE"
    gpu_extended = True
    gpu_quant_max_version = 2
    fn = staticmethod(lambda x, y: np.square(x - y))
    versions = (1, 2)
    dtypes = frozenset({"float32", "int32", "int8"})

    @classmethod
    def reference_quantized(
        cls, ctx: OpContext, inputs: list[np.ndarray | None]
    ) -> list[np.ndarray] | None:
        """LiteRT's int8 kernel (squared_difference.cc): both inputs shifted left by 7 bits
        and rescaled to twice the larger input scale, their difference squared in int32,
        rescaled to the output."""
        ops = _binary_operands(ctx, inputs)
        if ops is None or ops[4].type_name != "int8":
            return None
        x, y, xt, yt, zt = ops
        zs, zz = qmath.scale_zp(zt)
        left_shift = 7
        a, b, twice_max = _to_twice_max(x, y, xt, yt, left_shift)
        mo, so = qmath.quantize_multiplier(
            twice_max * twice_max / float(np.float32((1 << 2 * left_shift) * np.float32(zs)))
        )
        raw = qmath.multiply_by_quantized_multiplier((a - b) * (a - b), mo, so) + zz
        return [np.clip(raw, -128, 127).astype(np.int8)]


@register
class Atan2(BinaryOp):
    """``atan2(y, x)`` elementwise (atan2.cc: float32 or float64 inputs of one shape; no
    broadcasting). LiteRT's GPU delegate runs it too (the extended table)."""

    name = "ATAN2"
    gpu_extended = True
    fn = staticmethod(np.arctan2)
    dtypes = frozenset({"float32", "float64"})

    @classmethod
    def validate(cls, c: Check) -> None:
        super().validate(c)
        c.same_shape(c.input(1), c.input(0), "x", "y")


_SHIFTABLE = frozenset({"int8", "uint8", "int16", "uint16", "int32", "uint32"})


def _right_shift(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """right_shift.cc: the shift clamped to 0 .. bits - 1, arithmetic for signed types."""
    bits = x.dtype.itemsize * 8
    return np.right_shift(x, np.clip(y, 0, bits - 1).astype(x.dtype)).astype(x.dtype)


class _BitOp(BinaryOp):
    """Bit operations on the stored integers (right_shift.cc, bitwise_xor.cc): inputs of
    one integer type, broadcast, the output of their type; any quantization is ignored, as
    the kernels ignore it."""

    quant_aware = True
    dtypes = _SHIFTABLE

    @classmethod
    def validate(cls, c: Check) -> None:
        super(BinaryOp, cls).validate(c)  # (OpDef's: no quantization rules)
        x, z = c.input(0), c.input(1)
        c.dtype(x, cls.dtypes, "input")
        c.same_dtype(z, x, "input 1", "input 0")
        c.output_dtype(x.dtype)
        c.output_shape(broadcast_shape(c, x, z))


@register
class RightShift(_BitOp):
    name = "RIGHT_SHIFT"
    fn = staticmethod(_right_shift)


@register
class BitwiseXor(_BitOp):
    name = "BITWISE_XOR"
    fn = staticmethod(np.bitwise_xor)


@register
class FakeQuant(OpDef):
    """Quantization simulated in float (older quantization-aware-trained models keep it):
    each value clamped to the nudged range and rounded to its grid (fake_quant.cc, after
    TensorFlow's FakeQuantWithMinMaxArgs), in float32 as the kernel computes."""

    name = "FAKE_QUANT"
    versions = (1, 2)
    num_inputs = (1, 1)

    @classmethod
    def validate(cls, c: Check) -> None:
        """A float32 input, the output its shape; narrow_range refused (LiteRT's Prepare:
        "only meant to be applied to weights"); num_bits 2-16 and min < max (the kernel's
        checks in debug builds; beyond, its grid is undefined)."""
        super().validate(c)
        x = c.input(0)
        c.dtype(x, FLOAT32, "input")
        o = c.op.options
        if o.get("narrow_range"):
            raise c.fail("option-value", "narrow_range: LiteRT runs FakeQuant without it only")
        bits, lo, hi = int(o.get("num_bits", 0)), float(o.get("min", 0)), float(o.get("max", 0))
        if not 2 <= bits <= 16 or not lo < hi:
            raise c.fail("option-value", f"num_bits {bits}, min {lo}, max {hi}")
        c.output_dtype(x.dtype)
        c.output_shape(x.shape)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        f = np.float32
        x = np.asarray(required(ctx, inputs, 0), f)
        o = ctx.options
        lo, hi = f(o.get("min", 0.0)), f(o.get("max", 0.0))
        qmax = f((1 << int(o.get("num_bits", 8))) - 1)
        scale = f((hi - lo) / qmax)  # NudgeQuantizationRange, quant_min 0
        zp_from_min = f(f(0.0) - f(lo / scale))
        zp = f(np.clip(qmath.round_half_away(zp_from_min), 0, qmax))
        nudged_min, nudged_max = f((f(0.0) - zp) * scale), f((qmax - zp) * scale)
        inv = f(f(1.0) / scale)
        shifted = (np.minimum(nudged_max, np.maximum(nudged_min, x)) - nudged_min).astype(f)
        steps = qmath.round_half_away((shifted * inv).astype(f)).astype(f)
        return [((steps * scale).astype(f) + nudged_min).astype(f)]


def _floor_div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """floor_div.h: ``floor(double(x) / double(y))`` (numpy's float32 floor_divide can differ:
    1 // 0.1f is 9 in both, but floor(1 / 0.1f) in float32 is 10)."""
    if x.dtype.kind != "f":
        return np.floor_divide(x, y)
    return np.floor(x.astype(np.float64) / y.astype(np.float64)).astype(x.dtype)


def _floor_mod(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """floor_mod.h: the truncated remainder (``std::fmod`` for floats), moved into the
    divisor's sign when it has the other one."""
    if x.dtype.kind != "f":
        return np.mod(x, y)
    r = np.fmod(x, y)
    return np.where((r != 0) & ((y < 0) != (r < 0)), r + y, r).astype(x.dtype)


class _RawIntegers(BinaryOp):
    """FLOOR_DIV and FLOOR_MOD on 8/16-bit integers divide the stored integers (LiteRT's
    kernels ignore quantization), which the GPU path's float view cannot do."""

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        if cls.is_quantized_op(op, graph):
            return (
                f"{cls.name} of 8/16-bit integers divides the stored integers (LiteRT ignores "
                "their quantization); the GPU path's float view would divide the real values"
            )
        return super().gpu_support(op, graph, allow_quantized=allow_quantized)


@register
class FloorDiv(_RawIntegers):
    """v1: int32; v2: float32 (the GPU form); v3: int8/int16."""

    name = "FLOOR_DIV"
    gpu_extended = True
    gpu_max_version = gpu_quant_max_version = 2
    fn = staticmethod(_floor_div)
    versions = (1, 3)
    dtypes = frozenset({"float32", "int32", "int16", "int8"})


@register
class FloorMod(_RawIntegers):
    """v1: float32, int32, int64; v2: int8/int16."""

    name = "FLOOR_MOD"
    gpu_extended = True
    fn = staticmethod(_floor_mod)
    versions = (1, 2)
    dtypes = frozenset({"float32", "int32", "int64", "int16", "int8"})


@register
class LogicalAnd(_BoolsAsFloats, BinaryOp):
    name = "LOGICAL_AND"
    gpu = True
    fn = staticmethod(np.logical_and)
    dtypes = _BOOL


@register
class LogicalOr(_BoolsAsFloats, BinaryOp):
    name = "LOGICAL_OR"
    gpu_extended = True
    fn = staticmethod(np.logical_or)
    dtypes = _BOOL


def _compare_scaled(ctx: OpContext, x: np.ndarray, i: int) -> np.ndarray:
    """comparisons.cc's 8-bit operand: ``(q - zero_point) << 8`` times the input scale as a
    fixed-point multiplier, rounded (``ComparisonWithScaling``)."""
    t = ctx.input_tensor(i)
    scale, zp = qmath.scale_zp(t)  # type: ignore[arg-type]
    m, shift = qmath.quantize_multiplier(scale)
    return qmath.multiply_by_quantized_multiplier((x.astype(np.int64) - zp) << 8, m, shift)


class _Compare(_BoolsAsFloats, BinaryOp):
    """Comparisons: a bool output. 8-bit quantized inputs are compared as LiteRT does, in
    steps of 1/256: ``round(256 * real value)`` (the float view's exact comparison differs
    where two values are closer than that)."""

    dtypes = _NUMERIC | {"bool", "float16"}
    output_dtype = "bool"
    gpu_extended = True
    int32_data = True
    gpu_quant_max_version = 2  # v2: int8 (v3/v4: int16, strings)

    @classmethod
    def reference_quantized(
        cls, ctx: OpContext, inputs: list[np.ndarray | None]
    ) -> list[np.ndarray] | None:
        xt, yt = ctx.input_tensor(0), ctx.input_tensor(1)
        if not (qmath.is_integer_quantized(xt) and qmath.is_integer_quantized(yt)):
            return None
        x, y = required(ctx, inputs, 0), required(ctx, inputs, 1)
        return [cls.fn(_compare_scaled(ctx, x, 0), _compare_scaled(ctx, y, 1))]

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        reason = super().gpu_support(op, graph, allow_quantized=allow_quantized)
        if reason or not cls.is_quantized_op(op, graph):
            return reason
        # The float view compares the real values exactly: the same answers as LiteRT's
        # 1/256 steps when both inputs lie on one grid at least that coarse.
        xt, yt = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]]
        if xt.quantization is None or yt.quantization is None:
            return "a quantized input compared with a float one"
        (xs, xz), (ys, yz) = qmath.scale_zp(xt), qmath.scale_zp(yt)
        if (xs, xz) != (ys, yz) or xs * 256 < 1:
            return (
                "8-bit inputs of different scales or zero points (or a scale below 1/256): "
                "LiteRT compares them rescaled to 1/256 steps, the GPU path's float view "
                "would compare the real values"
            )
        return None


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


def _sign(x: np.ndarray) -> np.ndarray:
    # sign.cc: (0 < x) - (x < 0), so NaN gives 0 (numpy's sign gives NaN).
    return ((x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)).astype(x.dtype)


@dataclass(frozen=True)
class _Unary:
    """One unary op of the table: its numpy form, LiteRT's kernels, the GPU form's reach.

    Attributes:
        fn: the elementwise function (float view for quantized tensors).
        versions: the versions LiteRT has kernels for.
        dtypes: the input types those kernels take.
        gpu: "documented" (in the TFLite GPU delegate's documented table), "extended" (a
            GPU form, emit_math.py, outside that table) or "" (CPU only).
        gpu_max: newest float version whose features the GPU form implements.
        gpu_quant_max: newest version counting the quantized ones (int8/int16 through the
            float view, quantization simulated between ops).
    """

    fn: Callable[[np.ndarray], np.ndarray]
    versions: tuple[int, int]
    dtypes: frozenset[str]
    gpu: str = "extended"
    gpu_max: int = 1
    gpu_quant_max: int = 1


_F32_I8 = frozenset({"float32", "uint8", "int8"})
_F32_Q8_16 = frozenset({"float32", "int8", "int16"})

#: The unary ops with no options. Version features (op_version.cc): v2 = int8 (RSQRT, LOG,
#: ABS: also uint8), v3 = int16 (RSQRT; ABS: quantized int16); ABS v4/v5 and SIGN v2 take raw
#: integers, which the GPU path refuses by their type.
_UNARY: dict[str, _Unary] = {
    "RELU": _Unary(lambda x: np.maximum(x, 0), (1, 3), _F32_Q, "documented", 1, 2),
    "RELU6": _Unary(lambda x: np.clip(x, 0, 6), (1, 3), _F32_Q, "documented", 1, 2),
    "RELU_N1_TO_1": _Unary(lambda x: np.clip(x, -1, 1), (1, 1), _F32_I8),
    "RELU_0_TO_1": _Unary(lambda x: np.clip(x, 0, 1), (1, 1), _F32_I8),
    "LOGISTIC": _Unary(_logistic, (1, 3), _F32_Q, "documented", 1, 2),
    "TANH": _Unary(np.tanh, (1, 3), _F32_Q, "extended", 1, 2),
    "EXP": _Unary(np.exp, (1, 2), _F32_Q8_16, "documented", 1, 2),
    "LOG": _Unary(np.log, (1, 2), _F32_Q8_16, gpu_quant_max=2),
    "SQRT": _Unary(np.sqrt, (1, 2), _F32_Q8_16, gpu_quant_max=2),
    "RSQRT": _Unary(lambda x: 1.0 / np.sqrt(x), (1, 3), _F32_Q8_16, gpu_quant_max=3),
    "SQUARE": _Unary(np.square, (1, 1), FLOAT32),
    "ABS": _Unary(
        np.abs, (1, 5), frozenset({"float32", "int8", "int16", "int32"}), gpu_quant_max=3
    ),
    "NEG": _Unary(np.negative, (1, 1), frozenset({"float32", "int32", "int64"})),
    "SIN": _Unary(np.sin, (1, 2), FLOAT32),
    "COS": _Unary(np.cos, (1, 2), FLOAT32),
    "FLOOR": _Unary(np.floor, (1, 1), FLOAT32),
    "CEIL": _Unary(np.ceil, (1, 1), FLOAT32),
    # round.cc's RoundToNearest: halves to even, as numpy's round (and OpenCL's rint).
    "ROUND": _Unary(np.round, (1, 1), FLOAT32),
    "SIGN": _Unary(_sign, (1, 2), frozenset({"float32", "int32"})),
    "LOGICAL_NOT": _Unary(np.logical_not, (1, 1), _BOOL),
    "HARD_SWISH": _Unary(lambda x: x * np.clip(x + 3, 0, 6) / 6, (1, 1), _F32_I8, "extended", 1, 2),
    # activations.cc: x < 0 ? expm1(x) : x (the int8 kernel's table holds the same).
    "ELU": _Unary(
        lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))),
        (1, 1),
        frozenset({"float32", "int8"}),
    ),
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


@functools.lru_cache(maxsize=256)
def _rsqrt_int8_table(xs: float, xz: int, ys: float, yz: int) -> np.ndarray:
    """RsqrtEvalQuantizedInt8's output for each of the 256 inputs (computed once per
    quantization: the fixed-point steps are slow in Python)."""
    m, sh = qmath.quantize_multiplier(
        1.0 / float(np.float32(np.sqrt(np.float32(xs))) * np.float32(ys))
    )
    k_shift = 20
    one = np.ones((), np.int64)
    table = np.empty(256, np.int64)
    for q in range(-128, 128):
        value = q - xz
        if value == 0:
            table[q + 128] = 127
            continue
        im, ish = qmath.inv_sqrt_quantized_multiplier_exp(max(value, 0), -1)
        data = int(qmath.multiply_by_quantized_multiplier(one, im, ish + k_shift))
        out = int(qmath.multiply_by_quantized_multiplier(one * data, m, sh - k_shift)) + yz
        table[q + 128] = min(max(out, -128), 127)
    table.flags.writeable = False
    return table


def _rsqrt_quantized(
    cls: type[OpDef], ctx: OpContext, inputs: list[np.ndarray | None]
) -> list[np.ndarray] | None:
    """LiteRT's int8 RSQRT (elementwise.cc ``RsqrtEvalQuantizedInt8``): the fixed-point
    inverse square root of ``q - x_zp`` (`qmath.inv_sqrt_quantized_multiplier_exp`) rescaled
    by ``1 / (sqrt(x_scale) * y_scale)``; ``q == x_zp`` gives the largest output. int16:
    LiteRT's interpolated table (`qmath.lut_int16`)."""
    xt, yt = ctx.input_tensor(0), ctx.output_tensor()
    kinds = ("int8", "int16")
    if not (qmath.is_integer_quantized(xt, kinds) and qmath.is_integer_quantized(yt, kinds)):
        return None
    if xt.type_name != yt.type_name:
        return None
    (xs, xz), (ys, yz) = qmath.scale_zp(xt), qmath.scale_zp(yt)
    if xt.type_name == "int16":  # LUTPopulate<int16_t> of 1/sqrt, its max for x <= 0

        def rsqrt(v: np.ndarray) -> np.ndarray:
            with np.errstate(divide="ignore", invalid="ignore"):
                r = np.float32(1) / np.sqrt(v.astype(np.float32))
            return np.where(v <= 0, np.float32(32767) * np.float32(ys), r).astype(np.float32)

        table = qmath.lut_int16(rsqrt, xs, xz, ys, yz)
        return [qmath.lut_lookup_int16(required(ctx, inputs, 0), table)]
    if xt.type_name != "int8":
        return None
    table = _rsqrt_int8_table(xs, xz, ys, yz)
    x = required(ctx, inputs, 0).astype(np.int64)
    return [table[x + 128].astype(np.int8)]


#: Integer semantics of unary ops that have them.
_UNARY_QUANTIZED = {"LOGISTIC": _logistic_quantized, "RSQRT": _rsqrt_quantized}

#: Unary kernels that give their output the input's type (the others require it).
_SETS_OUTPUT_DTYPE = {"CEIL", "FLOOR", "EXP", "NEG", "ROUND"}

for _name, _u in _UNARY.items():
    _attrs: dict[str, object] = {
        "name": _name,
        "fn": staticmethod(_u.fn),
        "gpu": _u.gpu == "documented",
        "gpu_extended": _u.gpu == "extended",
        "gpu_max_version": _u.gpu_max,
        "gpu_quant_max_version": _u.gpu_quant_max,
        "versions": _u.versions,
        "dtypes": _u.dtypes,
        "sets_output_dtype": _name in _SETS_OUTPUT_DTYPE,
    }
    if _name in _UNARY_QUANTIZED:
        _attrs["reference_quantized"] = classmethod(_UNARY_QUANTIZED[_name])
    bases = (_BoolsAsFloats, UnaryOp) if _u.dtypes == _BOOL else (UnaryOp,)
    register(type(_name.title().replace("_", ""), bases, _attrs))


def _gelu(x: np.ndarray, approximate: bool) -> np.ndarray:
    """gelu.h: ``0.5 x erfc(-x / sqrt 2)``, or with ``approximate`` the tanh form
    ``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`` (float64 here, rounded once)."""
    v = x.astype(np.float64)
    if approximate:
        y = 0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))
    else:
        y = 0.5 * v * np.vectorize(math.erfc, otypes=[np.float64])(-v / math.sqrt(2.0))
    return y.astype(x.dtype)


def _gelu_f32(x: np.ndarray, approximate: bool) -> np.ndarray:
    """reference_ops::GeluTransform(Approximate) in float32, as LiteRT's tables sample it:
    ``0.5f * x * erfc(x * -sqrt(1/2))``, or the tanh form."""
    f = np.float32
    x = x.astype(np.float32)
    if approximate:
        k = f(2 / math.sqrt(math.pi) * math.sqrt(0.5))
        inner = k * (x + f(0.044715) * x * x * x)
        return (f(0.5) * x * (f(1) + np.tanh(inner.astype(np.float64)).astype(np.float32))).astype(
            np.float32
        )
    arg = x * f(-math.sqrt(0.5))
    erfc = np.array([math.erfc(float(a)) for a in arg.reshape(-1)], np.float64)
    return (f(0.5) * x * erfc.astype(np.float32).reshape(x.shape)).astype(np.float32)


@register
class Gelu(UnaryOp):
    """GELU; the ``approximate`` option picks the tanh form. v2: int8/uint8 (the kernel's
    table of the same function; the GPU path takes them through the float view)."""

    name = "GELU"
    gpu_extended = True
    gpu_quant_max_version = 2
    versions = (1, 3)
    dtypes = _F32_Q

    @classmethod
    def reference_quantized(
        cls, ctx: OpContext, inputs: list[np.ndarray | None]
    ) -> list[np.ndarray] | None:
        """int16: LiteRT's interpolated table of GELU (activations.cc ``GeluPrepare``,
        `qmath.lut_int16`); 8-bit: the float view (the 256-entry table holds the same)."""
        xt, yt = ctx.input_tensor(0), ctx.output_tensor()
        if not (
            qmath.is_integer_quantized(xt, ("int16",))
            and qmath.is_integer_quantized(yt, ("int16",))
        ):
            return None
        (xs, xz), (ys, yz) = qmath.scale_zp(xt), qmath.scale_zp(yt)
        approximate = bool(ctx.options.get("approximate", False))
        table = qmath.lut_int16(lambda v: _gelu_f32(v, approximate), xs, xz, ys, yz)
        return [qmath.lut_lookup_int16(required(ctx, inputs, 0), table)]

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        return [_gelu(x, bool(ctx.options.get("approximate", False)))]


@register
class LeakyRelu(OpDef):
    """x > 0 ? x : alpha x; v1: float32, int8; v2: int16."""

    name = "LEAKY_RELU"
    gpu_extended = True
    gpu_quant_max_version = 2
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
    gpu_extended = True
    # The GPU form: float32, float16 (v5), bool (float 0/1) and int32 on either side.
    gpu_max_version = gpu_quant_max_version = 5
    versions = (1, 9)
    num_inputs = (1, 1)
    quant_aware = True
    int32_data = True

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        for t, side in ((op.inputs[0], "from"), (op.outputs[0], "to")):
            tensor = graph.tensors[t]
            if tensor.dtype.kind in "iu" and not (
                tensor.dtype == np.int32 and tensor.quantization is None
            ):
                where = "a constant" if tensor.is_constant else "computed at run time"
                return (
                    f"it casts {side} {tensor.type_name} ({tensor.name!r}, {where}); the GPU "
                    "path holds only float, bool and int32 tensors"
                )
            if tensor.dtype == np.float64:
                return (
                    f"it casts {side} float64 ({tensor.name!r}); the GPU path computes in float32"
                )
        return super().gpu_support(op, bools_as_floats(op, graph), allow_quantized=allow_quantized)

    @classmethod
    def validate(cls, c: Check) -> None:
        super().validate(c)
        x = c.input(0)
        c.output_shape(x.shape)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        dtype = ctx.output_tensor().dtype
        if x.dtype.kind == "c" and dtype.kind != "c":
            x = x.real  # cast.cc: a complex value casts as its real part
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
    gpu_extended = True
    int32_data = True
    # v2: int8 data (float view), v3: rank 5; v4 (uint32) is refused by its type.
    gpu_max_version = gpu_quant_max_version = 3
    versions = (1, 4)
    num_inputs = (3, 3)

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        reason = super().gpu_support(
            op, bools_as_floats(op, graph), allow_quantized=allow_quantized
        )
        if reason or not cls.is_quantized_op(op, graph):
            return reason
        qs = {
            None if q is None else (tuple(q.scale.tolist()), tuple(q.zero_point.tolist()))
            for q in (graph.tensors[t].quantization for t in (*op.inputs[1:3], op.outputs[0]))
        }
        if len(qs) != 1:
            return (
                "8-bit inputs quantized unlike the output: LiteRT copies the stored integers, "
                "the GPU path's float view would requantize them"
            )
        return None

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
    gpu_max_version = gpu_quant_max_version = 1  # v2: uint32
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
