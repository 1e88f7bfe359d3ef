"""Reductions and normalisations: MEAN/SUM/REDUCE_*, SOFTMAX, LOG_SOFTMAX, ARG_MAX/MIN."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import numpy as np

from litekiln.model.ir import Op, Subgraph
from litekiln.ops import qmath
from litekiln.ops.base import OpContext, OpDef, int_input, register, required


class _Reduce(OpDef):
    # A numpy reduction: an array, or a numpy scalar when every axis goes (hence np.asarray).
    fn: ClassVar[Callable[..., np.ndarray | np.generic]]

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


@register
class Mean(_Reduce):
    name = "MEAN"
    fn = staticmethod(np.mean)
    accumulates = True
    # MEAN is not in the documented GPU op table, but the TFLite GPU delegate runs it (the
    # MediaPipe landmark models end in a global average): available with the extended table.
    gpu_extended = True
    gpu_quant_max_version = 2

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        reason = super().gpu_support(op, graph, allow_quantized=allow_quantized)
        if reason:
            return reason
        if not graph.tensors[op.inputs[1]].is_constant:
            return "axes must be a constant"
        if len(graph.tensors[op.inputs[0]].shape) > 4:
            return "rank > 4 input"
        return None


@register
class Sum(_Reduce):
    name = "SUM"
    fn = staticmethod(np.sum)
    accumulates = True


@register
class ReduceProd(_Reduce):
    name = "REDUCE_PROD"
    fn = staticmethod(np.prod)


@register
class ReduceMax(_Reduce):
    name = "REDUCE_MAX"
    fn = staticmethod(np.max)


@register
class ReduceMin(_Reduce):
    name = "REDUCE_MIN"
    fn = staticmethod(np.min)


@register
class ReduceAny(_Reduce):
    name = "REDUCE_ANY"
    fn = staticmethod(np.any)


def _softmax(x: np.ndarray, beta: float) -> np.ndarray:
    z = (x.astype(np.float64) - x.max(axis=-1, keepdims=True)) * beta
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


@register
class Softmax(OpDef):
    name = "SOFTMAX"
    gpu = True
    gpu_quant_max_version = 2

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

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        reason = super().gpu_support(op, graph, allow_quantized=allow_quantized)
        if reason:
            return reason
        if float(op.options.get("beta", 1.0)) != 1.0:
            return "softmax with beta != 1"
        if len(graph.tensors[op.inputs[0]].shape) > 4:
            return "rank > 4 input"
        return None


@register
class LogSoftmax(OpDef):
    name = "LOG_SOFTMAX"

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0).astype(np.float64)
        z = x - x.max(axis=-1, keepdims=True)
        return [(z - np.log(np.exp(z).sum(axis=-1, keepdims=True))).astype(np.float32)]


class _Arg(OpDef):
    # np.argmax / np.argmin: an array, or a numpy scalar for a 1-D input.
    fn: ClassVar[Callable[..., np.ndarray | np.generic]]

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
class L2Normalization(OpDef):
    name = "L2_NORMALIZATION"

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0).astype(np.float64)
        norm = np.sqrt(np.maximum((x * x).sum(axis=-1, keepdims=True), 1e-6))
        return [(x / norm).astype(np.float32)]
