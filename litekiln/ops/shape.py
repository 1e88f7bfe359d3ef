"""Data-movement ops: reshape, transpose, concat, pad, slicing, gather, space/depth shuffles."""

from __future__ import annotations

from types import EllipsisType
from typing import Literal

import numpy as np

from litekiln.model.ir import Op, Subgraph
from litekiln.ops import qmath
from litekiln.ops.base import (
    OpContext,
    OpDef,
    activation_supported_on_gpu,
    apply_activation,
    fused_activation,
    int_input,
    register,
    required,
)


class _Movement(OpDef):
    """Ops that only move data: quantized tensors pass through with the same parameters."""

    @classmethod
    def rank4_or_less(cls, op: Op, graph: Subgraph) -> str | None:
        for t in [*op.inputs[:1], *op.outputs]:
            if t >= 0 and len(graph.tensors[t].shape) > 4:
                return f"tensor {graph.tensors[t].name!r} has rank > 4"
        return None


@register
class Reshape(_Movement):
    name = "RESHAPE"
    gpu = True

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        out = ctx.output_tensor()
        if out.shape or x.size == 1:
            shape: tuple[int, ...] = out.shape
        elif len(inputs) > 1 and inputs[1] is not None:
            shape = tuple(int(v) for v in int_input(ctx, inputs, 1).reshape(-1))
        else:
            shape = tuple(ctx.options.get("new_shape", []))
        return [x.reshape(shape)]

    @classmethod
    def reference_quantized(
        cls, ctx: OpContext, inputs: list[np.ndarray | None]
    ) -> list[np.ndarray] | None:
        # LiteRT copies the bytes: the integers pass through whatever the output's parameters.
        return cls.reference(ctx, inputs)

    @classmethod
    def integer_operands(cls, op: Op) -> set[int]:
        return set(op.inputs[1:2])


@register
class Squeeze(_Movement):
    name = "SQUEEZE"

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        dims = ctx.options.get("squeeze_dims") or None
        return [np.squeeze(x, axis=tuple(dims) if dims else None)]


@register
class ExpandDims(_Movement):
    name = "EXPAND_DIMS"

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        return [np.expand_dims(x, int(int_input(ctx, inputs, 1).reshape(-1)[0]))]


@register
class Transpose(_Movement):
    name = "TRANSPOSE"
    gpu_extended = True

    @classmethod
    def integer_operands(cls, op: Op) -> set[int]:
        return set(op.inputs[1:2])

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        return [np.transpose(x, tuple(int_input(ctx, inputs, 1).reshape(-1)))]


@register
class Concatenation(_Movement):
    name = "CONCATENATION"
    gpu = True
    gpu_quant_max_version = 2

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        xs = [x for x in inputs if x is not None]
        axis = int(ctx.options.get("axis", 0))
        return [apply_activation(np.concatenate(xs, axis=axis), fused_activation(ctx.op))]

    @classmethod
    def reference_quantized(
        cls, ctx: OpContext, inputs: list[np.ndarray | None]
    ) -> list[np.ndarray] | None:
        """LiteRT's ``ConcatenationWithScaling``: inputs with the output's parameters are
        copied, others requantized in float32 as ``round(q * s + b) + out_zp`` with
        ``s = in_scale * (1 / out_scale)``, ``b = -in_zp * s``. (LiteRT's int8 kernel accepts
        only inputs that share the output's parameters; uint8 rescales.)"""
        yt = ctx.output_tensor()
        present = [(x, ctx.input_tensor(i)) for i, x in enumerate(inputs) if x is not None]
        if not qmath.is_integer_quantized(yt) or not all(
            qmath.is_integer_quantized(t) for _, t in present
        ):
            return None
        ys, yz = qmath.scale_zp(yt)
        inv = np.float32(1) / np.float32(ys)
        info = np.iinfo(yt.dtype)
        parts = []
        for x, t in present:
            xs, xz = qmath.scale_zp(t)  # type: ignore[arg-type]
            if (xs, xz) == (ys, yz):
                parts.append(x.astype(yt.dtype))
                continue
            s = np.float32(xs) * inv
            b = np.float32(-xz) * s
            q = qmath.round_half_away(x.astype(np.float32) * s + b) + yz
            parts.append(np.clip(q, info.min, info.max).astype(yt.dtype))
        return [np.concatenate(parts, axis=int(ctx.options.get("axis", 0)))]

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        return (
            super().gpu_support(op, graph, allow_quantized=allow_quantized)
            or activation_supported_on_gpu(op)
            or cls.rank4_or_less(op, graph)
        )


@register
class Pad(_Movement):
    name = "PAD"
    aliases = ("PADV2",)
    gpu = True
    gpu_quant_max_version = 2

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        pads = int_input(ctx, inputs, 1).reshape(-1, 2)
        value = 0
        if len(inputs) > 2 and inputs[2] is not None:
            value = np.asarray(inputs[2]).reshape(-1)[0]
        return [np.pad(x, [tuple(p) for p in pads], constant_values=value)]

    @classmethod
    def reference_quantized(
        cls, ctx: OpContext, inputs: list[np.ndarray | None]
    ) -> list[np.ndarray] | None:
        """Raw integers padded with the output's zero point (PAD) or the stored integer of
        PADV2's constant_values (pad.cc), i.e. the quantized 0 or the quantized value."""
        xt, yt = ctx.input_tensor(0), ctx.output_tensor()
        if not (qmath.is_integer_quantized(xt) and qmath.is_integer_quantized(yt)):
            return None
        x = required(ctx, inputs, 0)
        pads = int_input(ctx, inputs, 1).reshape(-1, 2)
        value = qmath.scale_zp(yt)[1]
        if len(inputs) > 2 and inputs[2] is not None:
            value = int(np.asarray(inputs[2]).reshape(-1)[0])
        return [np.pad(x, [tuple(p) for p in pads], constant_values=value).astype(yt.dtype)]

    @classmethod
    def integer_operands(cls, op: Op) -> set[int]:
        return set(op.inputs[1:2])

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        if op.name != "PAD":
            return "PADV2 is not in the GPU op table"
        reason = super().gpu_support(op, graph, allow_quantized=allow_quantized)
        if reason:
            return reason
        if not graph.tensors[op.inputs[1]].is_constant:
            return "paddings must be a constant"
        return cls.rank4_or_less(op, graph)


@register
class MirrorPad(_Movement):
    name = "MIRROR_PAD"

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        pads = [tuple(p) for p in int_input(ctx, inputs, 1).reshape(-1, 2)]
        mode: Literal["reflect", "symmetric"] = (
            "reflect" if int(ctx.options.get("mode", 0)) == 0 else "symmetric"
        )
        return [np.pad(x, pads, mode=mode)]


@register
class Split(_Movement):
    name = "SPLIT"

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        axis = int(int_input(ctx, inputs, 0).reshape(-1)[0])
        x = required(ctx, inputs, 1)
        n = int(ctx.options.get("num_splits", len(ctx.op.outputs)))
        return list(np.split(x, n, axis=axis))


@register
class SplitV(_Movement):
    name = "SPLIT_V"

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        sizes = [int(s) for s in int_input(ctx, inputs, 1).reshape(-1)]
        axis = int(int_input(ctx, inputs, 2).reshape(-1)[0]) % x.ndim
        if -1 in sizes:
            i = sizes.index(-1)
            sizes[i] = x.shape[axis] - (sum(sizes) + 1)
        return list(np.split(x, np.cumsum(sizes)[:-1], axis=axis))


@register
class Slice(_Movement):
    name = "SLICE"

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        begin = int_input(ctx, inputs, 1).reshape(-1)
        size = int_input(ctx, inputs, 2).reshape(-1)
        idx = tuple(
            slice(int(b), None if s == -1 else int(b + s)) for b, s in zip(begin, size, strict=True)
        )
        return [x[idx]]


@register
class StridedSlice(_Movement):
    name = "STRIDED_SLICE"
    gpu = True
    gpu_quant_max_version = 2

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        begin, end = int_input(ctx, inputs, 1).reshape(-1), int_input(ctx, inputs, 2).reshape(-1)
        strides = (
            int_input(ctx, inputs, 3).reshape(-1)
            if len(inputs) > 3 and inputs[3] is not None
            else np.ones_like(begin)
        )
        o = ctx.options
        bm, em = int(o.get("begin_mask", 0)), int(o.get("end_mask", 0))
        ell, new = int(o.get("ellipsis_mask", 0)), int(o.get("new_axis_mask", 0))
        shrink, offset = int(o.get("shrink_axis_mask", 0)), bool(o.get("offset", False))
        idx: list[EllipsisType | None | int | slice] = []
        for i in range(begin.size):
            bit = 1 << i
            if ell & bit:
                idx.append(Ellipsis)
            elif new & bit:
                idx.append(np.newaxis)
            elif shrink & bit:
                idx.append(int(begin[i]))
            else:
                b = None if bm & bit else int(begin[i])
                e = None if em & bit else int(end[i])
                if offset and b is not None and e is not None:
                    e = b + e
                idx.append(slice(b, e, int(strides[i])))
        return [x[tuple(idx)]]

    @classmethod
    def integer_operands(cls, op: Op) -> set[int]:
        return set(op.inputs[1:4])

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        reason = super().gpu_support(op, graph, allow_quantized=allow_quantized)
        if reason:
            return reason
        if any(not graph.tensors[t].is_constant for t in op.inputs[1:4] if t >= 0):
            return "begin/end/strides must be constants"
        o = op.options
        if o.get("ellipsis_mask", 0) or o.get("new_axis_mask", 0):
            return "ellipsis and new-axis masks are not supported on the GPU"
        return cls.rank4_or_less(op, graph)


@register
class Gather(_Movement):
    name = "GATHER"

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        params = required(ctx, inputs, 0)
        indices = int_input(ctx, inputs, 1)
        axis = int(ctx.options.get("axis", 0))
        batch_dims = int(ctx.options.get("batch_dims", 0))
        if batch_dims == 0:
            return [np.take(params, indices, axis=axis)]
        axis %= params.ndim
        batch_dims %= indices.ndim if indices.ndim else 1
        out = []
        lead = params.shape[:batch_dims]
        for b in np.ndindex(*lead):
            out.append(np.take(params[b], indices[b], axis=axis - batch_dims))
        return [np.stack(out).reshape(ctx.output_tensor().shape)]


@register
class DepthToSpace(_Movement):
    name = "DEPTH_TO_SPACE"
    gpu_extended = True

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        bs = int(ctx.options["block_size"])
        n, h, w, c = x.shape
        y = x.reshape(n, h, w, bs, bs, c // (bs * bs)).transpose(0, 1, 3, 2, 4, 5)
        return [y.reshape(n, h * bs, w * bs, c // (bs * bs))]


@register
class SpaceToDepth(_Movement):
    name = "SPACE_TO_DEPTH"
    gpu_extended = True

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        bs = int(ctx.options["block_size"])
        n, h, w, c = x.shape
        y = x.reshape(n, h // bs, bs, w // bs, bs, c).transpose(0, 1, 3, 2, 4, 5)
        return [y.reshape(n, h // bs, w // bs, c * bs * bs)]


@register
class Pack(_Movement):
    name = "PACK"

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        xs = [x for x in inputs if x is not None]
        return [np.stack(xs, axis=int(ctx.options.get("axis", 0)))]


@register
class Unpack(_Movement):
    name = "UNPACK"

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        axis = int(ctx.options.get("axis", 0))
        return [np.take(x, i, axis=axis) for i in range(x.shape[axis])]


@register
class Tile(_Movement):
    name = "TILE"

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        return [np.tile(required(ctx, inputs, 0), tuple(int_input(ctx, inputs, 1).reshape(-1)))]


@register
class BroadcastTo(_Movement):
    name = "BROADCAST_TO"

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        shape = tuple(int(s) for s in int_input(ctx, inputs, 1).reshape(-1))
        return [np.broadcast_to(required(ctx, inputs, 0), shape).copy()]


@register
class Shape(_Movement):
    name = "SHAPE"
    quant_aware = True  # returns dimensions, never values

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        return [np.asarray(x.shape, dtype=ctx.output_tensor().dtype)]
