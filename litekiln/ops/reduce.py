"""Reductions and normalisations: MEAN/SUM/REDUCE_*, SOFTMAX, LOG_SOFTMAX, ARG_MAX/MIN, LRN."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

import numpy as np

from litekiln.model.ir import Op, Subgraph
from litekiln.ops import qmath
from litekiln.ops.base import (
    FLOAT32,
    QUANTIZED,
    Check,
    OpContext,
    OpDef,
    int_input,
    register,
    required,
)
from litekiln.ops.elementwise import bools_as_floats

_NUMERIC = frozenset({"float32", "int32", "int64", "uint8", "int8", "int16"})


class _Reduce(OpDef):
    # A numpy reduction: an array, or a numpy scalar when every axis goes (hence np.asarray).
    fn: ClassVar[Callable[..., np.ndarray | np.generic]]
    #: The input types LiteRT's kernel takes.
    dtypes: ClassVar[frozenset[str]] = _NUMERIC
    num_inputs = (2, 2)

    @classmethod
    def validate(cls, c: Check) -> None:
        """reduce.cc: an int32 axis tensor whose values are dimensions of the input (negative
        ones counted from the end, repeats allowed); the output keeps (keep_dims) or drops
        the reduced dimensions; quantized 8- and 16-bit tensors carry usable parameters."""
        super().validate(c)
        x, axis_t, y = c.input(0), c.input(1), c.output()
        c.dtype(x, cls.dtypes, "input")
        c.same_dtype(y, x, "output")
        c.dtype(axis_t, frozenset({"int32"}), "axis")
        if x.type_name in QUANTIZED:
            c.quantized(x, "input")
            c.quantized(y, "output")
            if x.type_name == "int16":
                c.zero_point(x, 0, "input")
                c.zero_point(y, 0, "output")
        if axis_t.data is None:
            return
        rank = len(x.shape)
        axes = set()
        for a in (int(v) for v in axis_t.data.reshape(-1)):
            if not -rank <= a < rank:
                raise c.fail("axis", f"axis {a} is out of range for rank {rank}")
            axes.add(a % rank)
        if c.op.options.get("keep_dims"):
            shape = tuple(1 if k in axes else d for k, d in enumerate(x.shape))
        else:
            shape = tuple(d for k, d in enumerate(x.shape) if k not in axes)
        c.output_shape(shape)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        axes = tuple(
            sorted({int(a) % max(x.ndim, 1) for a in int_input(ctx, inputs, 1).reshape(-1)})
        )
        keep = bool(ctx.options.get("keep_dims", False))
        acc = np.float64 if x.dtype.kind == "f" else None  # float sums: avoid drift vs LiteRT
        y = cls.fn(
            x, axis=axes, keepdims=keep, **({"dtype": acc} if acc and cls.accumulates else {})
        )
        return [np.asarray(y).astype(x.dtype if x.dtype.kind != "b" else bool)]

    accumulates: ClassVar[bool] = False

    @classmethod
    def integer_operands(cls, op: Op) -> set[int]:
        return set(op.inputs[1:2])

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        """The GPU form reduces over constant axes (any of them, negative or repeated, kept
        or dropped) of a float tensor of any rank."""
        reason = super().gpu_support(op, graph, allow_quantized=allow_quantized)
        if reason:
            return reason
        # (Axes computed at run time: refused by the base, as an integer operand.)
        if graph.tensors[op.inputs[1]].size == 0:
            return "no axis to reduce (a copy)"
        return None


@register
class Mean(_Reduce):
    name = "MEAN"
    fn = staticmethod(np.mean)
    versions = (1, 3)
    accumulates = True
    # MEAN is not in the documented GPU op table, but the TFLite GPU delegate runs it (the
    # MediaPipe landmark models end in a global average): available with the extended table.
    # v2: int8, v3: int16 (the GPU path takes them through the float view).
    gpu_extended = True
    gpu_quant_max_version = 3

    @classmethod
    def reference_quantized(
        cls, ctx: OpContext, inputs: list[np.ndarray | None]
    ) -> list[np.ndarray] | None:
        """LiteRT's integer MEAN (reduce.cc ``EvalMean``): an int8 4-D input averaged over its
        height and width with the dimensions kept takes ``optimized_integer_ops::Mean``; every
        other 8- or 16-bit case ``reference_ops::QuantizedMeanOrSum``. A layer norm made of
        MEANs (AI Edge Quantizer's static int8 ViTs) drifts by whole steps on the float view,
        the few 1-step differences growing through its RSQRT. The uint8 4-D case keeps the
        float view."""
        x = required(ctx, inputs, 0)
        xt, yt = ctx.graph.tensors[ctx.op.inputs[0]], ctx.graph.tensors[ctx.op.outputs[0]]
        if x.dtype.kind not in "iu" or xt.quantization is None or yt.quantization is None:
            return None
        (xs, xz), (ys, yz) = qmath.scale_zp(xt), qmath.scale_zp(yt)
        axis_values = [int(a) for a in int_input(ctx, inputs, 1).reshape(-1)]
        rank = max(x.ndim, 1)
        axes = tuple(sorted({a % rank for a in axis_values}))
        keep = bool(ctx.options.get("keep_dims", False))
        info = np.iinfo(yt.dtype)
        acc = x.astype(np.int64).sum(axis=axes, keepdims=keep)
        count = math.prod(x.shape[a] for a in axes)
        if count == 0:
            return None
        hw = keep and x.ndim == 4 and len(axis_values) == 2 and axes == (1, 2)
        if hw and x.dtype == np.uint8:
            return None
        if hw:  # optimized_integer_ops::Mean: float32 bias and scale
            temp = np.float32(np.float32(xz) * np.float32(xs) / np.float32(ys))
            temp = temp + np.float32(0.5) if temp > 0 else temp - np.float32(0.5)
            bias = yz - int(temp)
            real = np.float32(xs) / (np.float32(count) * np.float32(ys))
            m, sh = qmath.quantize_multiplier(float(real))
            # Channels in whole blocks of 16 take the kernel's vector loop (NEON, or SSE
            # through NEON_2_SSE), whose rescaling rounds a half up; the rest the scalar one,
            # which rounds it away from zero. Measured on LiteRT's builtin kernels (one
            # thread): an EfficientNet-B0 int8 squeeze-excite mean at -619.5 + 638 gives 19
            # among its 144 channels, 18 among 10 or 2.
            vector = np.arange(x.shape[3]) < 16 * (x.shape[3] // 16)
            up = qmath.multiply_by_quantized_multiplier(acc, m, sh, ties_up=True)
            away = qmath.multiply_by_quantized_multiplier(acc, m, sh)
            raw = np.where(vector, up, away) + bias
        else:  # reference_ops::QuantizedMeanOrSum, the 1/count folded into the multiplier
            m, sh = qmath.quantize_multiplier(float(np.float32(xs)) / float(np.float32(ys)))
            extra = min(count.bit_length() - 1, 32, 31 + sh)
            m = (m << extra) // count
            raw = qmath.multiply_by_quantized_multiplier(acc - xz * count, m, sh - extra) + yz
        return [np.clip(raw, info.min, info.max).astype(yt.dtype)]


@register
class Sum(_Reduce):
    name = "SUM"
    fn = staticmethod(np.sum)
    gpu_extended = True
    gpu_quant_max_version = 2  # v2: int8 (float view)
    versions = (1, 2)
    accumulates = True


@register
class ReduceProd(_Reduce):
    name = "REDUCE_PROD"
    fn = staticmethod(np.prod)
    gpu_extended = True
    versions = (1, 2)
    dtypes = frozenset({"float32", "int32", "int64"})  # (litekiln refuses v2's int8 at load)


@register
class ReduceMax(_Reduce):
    name = "REDUCE_MAX"
    fn = staticmethod(np.max)
    gpu_extended = True
    gpu_quant_max_version = 3  # v2: int8, v3: int16 (float view)
    versions = (1, 3)
    dtypes = _NUMERIC | {"bool"}


@register
class ReduceMin(_Reduce):
    name = "REDUCE_MIN"
    fn = staticmethod(np.min)
    gpu_extended = True
    gpu_quant_max_version = 3  # v2: int8, v3: int16 (float view)
    versions = (1, 3)
    dtypes = _NUMERIC | {"bool"}


class _BoolReduce(_Reduce):
    """A reduction of booleans; on the GPU over their float 0/1 (the GPU path's booleans):
    a maximum (any) or a minimum (all). litert-torch's language models reduce their
    position masks with REDUCE_ALL."""

    gpu_extended = True
    dtypes = frozenset({"bool"})

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        return super().gpu_support(op, bools_as_floats(op, graph), allow_quantized=allow_quantized)


@register
class ReduceAny(_BoolReduce):
    name = "REDUCE_ANY"
    fn = staticmethod(np.any)


@register
class ReduceAll(_BoolReduce):
    name = "REDUCE_ALL"
    fn = staticmethod(np.all)


def _softmax(x: np.ndarray, beta: float) -> np.ndarray:
    z = (x.astype(np.float64) - x.max(axis=-1, keepdims=True)) * beta
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


@register
class Softmax(OpDef):
    name = "SOFTMAX"
    gpu = True
    gpu_quant_max_version = 2
    versions = (1, 4)
    num_inputs = (1, 1)

    @classmethod
    def validate(cls, c: Check) -> None:
        """activations.cc's SoftmaxPrepare: rank >= 1; an int8 output of scale 1/256 and zero
        point -128 (int16: 1/32768, 0) as the integer kernels assume. litekiln also wants the
        output of the input's type (LiteRT's int8-in uint8-out pairing fails when it runs)."""
        super().validate(c)
        x, y = c.input(0), c.output()
        c.rank(x, 1, 8, "input")
        c.dtype(x, frozenset({"float32", "uint8", "int8", "int16"}), "input")
        c.same_dtype(y, x, "output")
        beta = float(c.op.options.get("beta", 0.0))
        if x.type_name in QUANTIZED and not math.isfinite(beta):
            raise c.fail("option-value", f"beta {beta}: the integer kernel's table is undefined")
        if x.type_name in QUANTIZED:
            c.quantized(x, "input")
            c.quantized(y, "output")
            q = y.quantization
            assert q is not None
            want = {"int8": (1 / 256, -128), "uint8": (1 / 256, 0), "int16": (1 / 32768, 0)}
            scale, zp = want[x.type_name]
            if int(q.zero_point[0]) != zp or abs(float(q.scale[0]) - scale) > 0.001 * scale:
                raise c.fail(
                    "quantization-params",
                    f"output {y.name!r} has scale {float(q.scale[0])} and zero point "
                    f"{int(q.zero_point[0])}, the kernel needs {scale} and {zp}",
                )
        c.output_shape(x.shape)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        return [_softmax(x, float(ctx.options.get("beta", 1.0))).astype(np.float32)]

    @classmethod
    def reference_quantized(
        cls, ctx: OpContext, inputs: list[np.ndarray | None]
    ) -> list[np.ndarray] | None:
        """LiteRT's optimized 8-bit softmax (``PopulateSoftmaxLookupTable`` + ``Softmax``):
        a float table ``exp(-x_scale * beta * d)`` over the distance d to the row maximum, a
        sequential float32 sum, ``round(table * (1 / (sum * y_scale))) + y_zp``."""
        xt, yt = ctx.input_tensor(0), ctx.output_tensor()
        if not (qmath.is_integer_quantized(xt) and qmath.is_integer_quantized(yt)):
            return None
        x = required(ctx, inputs, 0).astype(np.int64)
        xs, _ = qmath.scale_zp(xt)
        ys, yz = qmath.scale_zp(yt)
        beta = np.float32(ctx.options.get("beta", 1.0))
        scale = np.float32(-np.float32(xs) * beta)
        # expf of a float32 argument; float64 exp rounded to float32 is the correctly rounded
        # value glibc's expf returns.
        table = np.exp((scale * np.arange(256, dtype=np.float32)).astype(np.float64))
        table = table.astype(np.float32)
        e = table[x.max(axis=-1, keepdims=True) - x]
        total = np.cumsum(e, axis=-1, dtype=np.float32)[..., -1:]  # the kernel's running sum
        inv = np.float32(1) / (total * np.float32(ys))
        info = np.iinfo(yt.dtype)
        q = qmath.round_half_away(e * inv) + yz
        return [np.clip(q, info.min, info.max).astype(yt.dtype)]


@register
class LogSoftmax(OpDef):
    name = "LOG_SOFTMAX"
    gpu_extended = True
    gpu_quant_max_version = 2  # v2: int8 (uint8 in v1), through the float view
    versions = (1, 2)
    num_inputs = (1, 1)

    @classmethod
    def validate(cls, c: Check) -> None:
        """activations.cc's LogSoftmaxPrepare: an 8-bit output of scale 16/256 and zero
        point 127 (int8) or 255 (uint8), the range of log-probabilities its kernels assume."""
        super().validate(c)
        x, y = c.input(0), c.output()
        c.rank(x, 1, 8, "input")
        c.dtype(x, frozenset({"float32", "uint8", "int8"}), "input")
        c.same_dtype(y, x, "output")
        if x.type_name in QUANTIZED:
            c.quantized(x, "input")
            c.quantized(y, "output")
            q = y.quantization
            assert q is not None
            zp = {"int8": 127, "uint8": 255}[x.type_name]
            if int(q.zero_point[0]) != zp or float(q.scale[0]) != 16 / 256:
                raise c.fail(
                    "quantization-params",
                    f"output {y.name!r} has scale {float(q.scale[0])} and zero point "
                    f"{int(q.zero_point[0])}; LOG_SOFTMAX's {x.type_name} kernel needs "
                    f"scale 0.0625 and zero point {zp}",
                )
        c.output_shape(x.shape)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0).astype(np.float64)
        z = x - x.max(axis=-1, keepdims=True)
        return [(z - np.log(np.exp(z).sum(axis=-1, keepdims=True))).astype(np.float32)]


class _Arg(OpDef):
    """The position of the largest (smallest) value along one axis, the first on ties. The GPU
    form (LiteRT's GPU delegate runs ARG_MAX and ARG_MIN too: the extended table) takes a
    constant axis and gives int32 positions; an int64 output stays on the CPU."""

    # np.argmax / np.argmin: an array, or a numpy scalar for a 1-D input.
    fn: ClassVar[Callable[..., np.ndarray | np.generic]]
    versions = (1, 3)
    num_inputs = (2, 2)
    gpu_extended = True
    gpu_quant_max_version = 3  # (8-bit inputs through the float view: their order is kept)
    int32_data = True  # (the int32 positions; int32 inputs compared as they are)

    @classmethod
    def integer_operands(cls, op: Op) -> set[int]:
        # The axis as stored, as LiteRT reads it: a quantized axis tensor was dequantized
        # into another axis (a fuzzed model: diff-run-but-refused-871b0adbf002).
        return set(op.inputs[1:2])

    @classmethod
    def validate(cls, c: Check) -> None:
        """arg_min_max.cc: one int32/int64 axis value in range; the output is of the
        ``output_type`` option's type (INT32 or INT64) and the input's shape without the
        axis."""
        super().validate(c)
        x, axis_t = c.input(0), c.input(1)
        c.dtype(x, frozenset({"float32", "uint8", "int8", "int32", "bool"}), "input")
        c.dtype(axis_t, frozenset({"int32", "int64"}), "axis")
        out_type = {2: "int32", 4: "int64"}.get(int(c.op.options.get("output_type", 0)))
        if out_type is None:
            raise c.fail("option-value", "output_type is neither INT32 nor INT64")
        c.output_dtype(np.dtype(out_type))
        c.rank(x, 1, 8, "input")
        if axis_t.size != 1:
            raise c.fail("axis", f"axis has {axis_t.size} values, expected one")
        if axis_t.data is None:
            return
        rank = len(x.shape)
        a = int(axis_t.data.reshape(-1)[0])
        if not -rank <= a < rank:
            raise c.fail("axis", f"axis {a} is out of range for rank {rank}")
        a %= rank
        c.output_shape(x.shape[:a] + x.shape[a + 1 :])

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        axis = int(int_input(ctx, inputs, 1).reshape(-1)[0])
        return [cls.fn(x, axis=axis).astype(ctx.output_tensor().dtype)]


@register
class ArgMax(_Arg):
    name = "ARG_MAX"
    fn = staticmethod(np.argmax)


@register
class ArgMin(_Arg):
    name = "ARG_MIN"
    fn = staticmethod(np.argmin)


@register
class TopKV2(OpDef):
    """The ``k`` largest values along the last axis and their indices (CPU only)."""

    name = "TOPK_V2"
    versions = (1, 3)
    num_inputs = (2, 2)
    num_outputs = (2, 2)
    quant_aware = True  # the order of 8-bit values is their integers' order; raw in, raw out

    @classmethod
    def validate(cls, c: Check) -> None:
        """topk_v2.cc: an input of rank >= 1; ``k`` one int32/int16 value, at most the last
        axis' size; values of the input's type (and quantization), int32/int16 indices."""
        super().validate(c)
        x, k_t, values, indices = c.input(0), c.input(1), c.output(0), c.output(1)
        c.rank(x, 1, 8, "input")
        c.dtype(x, frozenset({"float32", "uint8", "int8", "int16", "int32", "int64"}), "input")
        c.dtype(k_t, frozenset({"int32", "int16"}), "k")
        c.same_dtype(values, x, "values")
        c.dtype(indices, frozenset({"int32", "int16"}), "indices")
        if k_t.size != 1:
            raise c.fail("k", f"k has {k_t.size} values, expected one")
        if k_t.data is None:
            return
        k = int(k_t.data.reshape(-1)[0])
        if k > x.shape[-1]:
            raise c.fail("k", f"k {k} is larger than the last axis ({x.shape[-1]})")
        shape = (*x.shape[:-1], max(k, 0))
        c.output_shape(shape, 0)
        c.output_shape(shape, 1)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        """topk_v2.cc's order: larger values first, ties to the earlier index, NaNs last."""
        x = np.asarray(required(ctx, inputs, 0))
        k = max(int(int_input(ctx, inputs, 1).reshape(-1)[0]), 0)
        key = -x.astype(np.float64) if x.dtype.kind == "f" else -x.astype(np.int64)
        order = np.argsort(key, axis=-1, kind="stable")[..., :k]  # NaN keys sort last
        values = np.take_along_axis(x, order, axis=-1)
        return [values, order.astype(ctx.output_tensor(1).dtype)]


#: Most terms along the axis a GPU CUMSUM sums: its kernel adds, for each output, every term of
#: the axis that the output covers (n * n terms for an axis of n; TVM's GPU scan, which would
#: not, gives wrong sums on PoCL: tests/test_codegen.py).
CUMSUM_GPU_TERMS = 8192


@register
class Cumsum(OpDef):
    """Running sums along one axis. The GPU form (float32 or int32 data, a constant axis) sums
    for each output the terms it covers; LiteRT's GPU delegate runs it too (the extended
    table)."""

    name = "CUMSUM"
    versions = (1, 1)
    num_inputs = (2, 2)
    gpu_extended = True
    int32_data = True  # (positions from a mask: int32 sums stay int32)

    @classmethod
    def integer_operands(cls, op: Op) -> set[int]:
        return set(op.inputs[1:2])

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        """The axis must be constant (an axis computed at run time is refused by the base, as
        an integer operand), and at most `CUMSUM_GPU_TERMS` long."""
        reason = super().gpu_support(op, graph, allow_quantized=allow_quantized)
        if reason:
            return reason
        x = graph.tensors[op.inputs[0]]
        axis = int(np.asarray(graph.tensors[op.inputs[1]].data).reshape(-1)[0]) % len(x.shape)
        if x.shape[axis] > CUMSUM_GPU_TERMS:  # (validated: rank 1 and up, the axis within)
            return (
                f"an axis of {x.shape[axis]} terms; the GPU form sums at most "
                f"{CUMSUM_GPU_TERMS} (each output adds every term it covers)"
            )
        return None

    @classmethod
    def validate(cls, c: Check) -> None:
        """cumsum.cc: float32, int32 or int64 data; the axis one int32 value within the
        rank (negative counts from the end); the output the input's type and shape."""
        super().validate(c)
        x, axis_t, y = c.input(0), c.input(1), c.output()
        c.dtype(x, frozenset({"float32", "int32", "int64"}), "input")
        c.dtype(axis_t, frozenset({"int32"}), "axis")
        c.same_dtype(y, x, "output")
        if axis_t.size != 1:
            raise c.fail("axis", f"axis has {axis_t.size} values, expected one")
        if axis_t.data is not None:
            rank = len(x.shape)
            a = int(axis_t.data.reshape(-1)[0])
            if not -rank <= a < rank:
                raise c.fail("axis", f"axis {a} is out of range for rank {rank}")
        c.output_shape(x.shape)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        """In the input's type, one element after another (``exclusive``: each sum leaves its
        own element out; ``reverse``: from the axis' end)."""
        x = np.asarray(required(ctx, inputs, 0))
        axis = int(int_input(ctx, inputs, 1).reshape(-1)[0]) % max(x.ndim, 1)
        reverse = bool(ctx.options.get("reverse", False))
        a = np.flip(x, axis) if reverse else x
        y = np.cumsum(a, axis=axis, dtype=x.dtype)
        if ctx.options.get("exclusive", False):
            y = np.concatenate(
                [np.zeros_like(np.take(y, [0], axis=axis)), np.delete(y, -1, axis=axis)], axis
            )
        return [np.ascontiguousarray(np.flip(y, axis) if reverse else y)]


@register
class L2Normalization(OpDef):
    name = "L2_NORMALIZATION"
    gpu_extended = True  # float32 (v2's int8 is refused at load)
    versions = (1, 2)
    num_inputs = (1, 1)

    @classmethod
    def validate(cls, c: Check) -> None:
        """l2norm.cc: rank >= 1, float32 (litekiln does not run its 8-bit kernels), no fused
        activation."""
        super().validate(c)
        x, y = c.input(0), c.output()
        c.rank(x, 1, 8, "input")
        c.dtype(x, FLOAT32, "input")
        c.same_dtype(y, x, "output")
        if c.activation() != 0:
            raise c.fail("activation", f"fused activation {c.activation()}: the kernel takes none")
        c.output_shape(x.shape)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        # l2normalization.h: the norm (not its square) is floored at 1e-6.
        x = required(ctx, inputs, 0).astype(np.float64)
        norm = np.maximum(np.sqrt((x * x).sum(axis=-1, keepdims=True)), 1e-6)
        return [(x / norm).astype(np.float32)]


@register
class LocalResponseNormalization(OpDef):
    """AlexNet's and the first GoogLeNet's normalisation across channels (older models
    converted from TensorFlow keep it): each value divided by
    ``(bias + alpha * sum of the squares of its channel window) ** beta``."""

    name = "LOCAL_RESPONSE_NORMALIZATION"
    num_inputs = (1, 1)

    @classmethod
    def validate(cls, c: Check) -> None:
        """local_response_norm.cc: a rank-4 float32 input; the output of its shape."""
        super().validate(c)
        x = c.input(0)
        c.rank(x, 4, None, "input")
        c.dtype(x, FLOAT32, "input")
        c.same_dtype(c.output(), x, "output")
        c.output_shape(x.shape)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        """The kernel's window: channels ``c - radius`` to ``c + radius`` (TensorFlow's
        ``depth_radius``), clipped to the map; the power in float32."""
        x = np.asarray(required(ctx, inputs, 0), np.float32)
        o = ctx.options
        r = int(o.get("radius", 0))
        bias, alpha, beta = (np.float32(o.get(k, 0.0)) for k in ("bias", "alpha", "beta"))
        sq = np.pad(np.square(x, dtype=np.float64), [(0, 0)] * 3 + [(r, r)])
        window = np.lib.stride_tricks.sliding_window_view(sq, 2 * r + 1, axis=-1).sum(-1)
        scale = (bias + alpha * window.astype(np.float32)).astype(np.float32)
        return [(x * np.power(scale, -beta)).astype(np.float32)]
