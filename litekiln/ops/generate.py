"""Ops that make tensors from shapes and scalars: RANGE, FILL, ZEROS_LIKE, RANK,
BROADCAST_ARGS and ONE_HOT.

TensorFlow writes them for shape arithmetic and index generation: ``tf.range`` for the frame
offsets of an STFT (BirdNET's spectrogram) or a transformer's positions, ``tf.fill`` and
``tf.zeros_like`` for initial states, ``tf.one_hot`` for labels and lookups. Their inputs are
almost always known at load (constants, or the shapes of static tensors), and then the load's
constant folding (:mod:`litekiln.ops.fold`) turns them into constants: no kernel runs. With
inputs computed at run time they run on the CPU; RANGE and FILL then size their output from
values known only then, and litekiln, which plans static shapes, keeps the shape the model
declares and refuses a value that does not fit it, naming it.

Each reference follows its LiteRT kernel (tflite/kernels/range.cc, fill.cc, zeros_like.cc,
rank.cc, broadcast_args.cc, one_hot.cc), including its refusals.
"""

from __future__ import annotations

import math

import numpy as np

from litekiln.model.ir import Op, Subgraph, Tensor
from litekiln.ops.base import Check, OpContext, OpDef, as_planned, register, required

_INDEX_TYPES = frozenset({"int32", "int64"})


def _scalar(t: Tensor) -> int | float | None:
    """The value of a one-element constant, None if not a constant."""
    if t.data is None:
        return None
    return np.asarray(t.data).reshape(-1)[0].item()


@register
class Range(OpDef):
    name = "RANGE"
    versions = (1, 2)
    num_inputs = (3, 3)

    @classmethod
    def validate(cls, c: Check) -> None:
        """range.cc: scalar start, limit and delta of one type, int32, int64 or float32; the
        output that type, one-dimensional, of ``ceil(|limit - start| / |delta|)`` values
        (delta not 0, and of the sign that reaches limit from start)."""
        super().validate(c)
        start, limit, delta = c.input(0), c.input(1), c.input(2)
        c.dtype(start, frozenset({"int32", "int64", "float32"}), "start")
        for t, role in ((start, "start"), (limit, "limit"), (delta, "delta")):
            c.rank(t, 0, None, role)
        c.same_dtype(limit, start, "limit", "start")
        c.same_dtype(delta, start, "delta", "start")
        c.output_dtype(start.dtype)
        values = [_scalar(t) for t in (start, limit, delta)]
        if any(v is None for v in values):
            return  # sized at run time: the declared shape is trusted (`as_planned`)
        c.output_shape((_count(c.fail, start.dtype, *values),))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        """LiteRT's loop: ``value = start``, then ``value += delta`` per element, in the
        inputs' type (float32 sums accumulate its rounding, as the kernel's do)."""
        start, limit, delta = (np.asarray(required(ctx, inputs, i)).reshape(()) for i in range(3))
        dtype = start.dtype

        def refuse(rule: str, msg: str) -> Exception:
            return ctx.fail(msg)

        n = _count(refuse, dtype, start.item(), limit.item(), delta.item())
        steps = np.full(n, delta, dtype)
        if n:
            steps[0] = start
        y = np.add.accumulate(steps, dtype=dtype) if n else steps
        return [as_planned(ctx, y)]


def _count(fail, dtype: np.dtype, start, limit, delta) -> int:  # noqa: ANN001
    """range.cc's GetSize."""
    if delta == 0:
        raise fail("delta", "delta is 0")
    if not ((start >= limit and delta < 0) or (start <= limit and delta > 0)):
        raise fail("delta", f"delta {delta} does not lead from start {start} to limit {limit}")
    if np.dtype(dtype).kind == "f":
        s, lim, d = (np.float32(v) for v in (start, limit, delta))
        return int(np.ceil(np.abs((lim - s) / d)))
    return (abs(int(limit) - int(start)) + abs(int(delta)) - 1) // abs(int(delta))


@register
class Fill(OpDef):
    name = "FILL"
    versions = (1, 5)
    num_inputs = (2, 2)
    quant_aware = True  # the value's stored integer, copied
    copies_values = True

    @classmethod
    def validate(cls, c: Check) -> None:
        """fill.cc: rank-1 int32/int64 dims, a scalar value (float32, int8/16/32/64, bool;
        the output its type, quantized as it is, an int16 value's zero point 0), the output
        of shape ``dims``."""
        super().validate(c)
        dims, value = c.input(0), c.input(1)
        c.rank(dims, 1, None, "dims")
        c.dtype(dims, _INDEX_TYPES, "dims")
        c.rank(value, 0, None, "value")
        c.dtype(value, frozenset({"float32", "int8", "int16", "int32", "int64", "bool"}), "value")
        c.output_dtype(value.dtype)
        y = c.output()
        vq, yq = value.quantization, y.quantization
        v_params = (0.0, 0) if vq is None else (float(vq.scale[0]), int(vq.zero_point[0]))
        y_params = (0.0, 0) if yq is None else (float(yq.scale[0]), int(yq.zero_point[0]))
        if v_params != y_params:
            raise c.fail(
                "quantization-mismatch",
                f"output {y.name!r} is quantized {y_params}, the value {v_params}: the kernel "
                "copies the value's stored integer",
            )
        if value.type_name == "int16" and v_params[1] != 0:
            raise c.fail("zero-point", f"int16 value {value.name!r} has zero point {v_params[1]}")
        if dims.data is None:
            return  # sized at run time
        shape = [int(d) for d in np.asarray(dims.data).reshape(-1)]
        if any(d < 0 for d in shape):
            raise c.fail("dims", f"dims {shape} has a negative dimension")
        c.output_shape(tuple(shape))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        dims = [int(d) for d in np.asarray(required(ctx, inputs, 0)).reshape(-1)]
        if any(d < 0 for d in dims):
            raise ctx.fail(f"dims {dims} has a negative dimension")
        value = np.asarray(required(ctx, inputs, 1))
        return [as_planned(ctx, np.full(dims, value.reshape(()), value.dtype))]


@register
class ZerosLike(OpDef):
    name = "ZEROS_LIKE"
    num_inputs = (1, 1)

    @classmethod
    def validate(cls, c: Check) -> None:
        """zeros_like.cc: an int32, int64 or float32 input; zeros of its shape and type."""
        super().validate(c)
        x = c.input(0)
        c.dtype(x, frozenset({"int32", "int64", "float32"}), "input")
        c.output_dtype(x.dtype)
        c.output_shape(x.shape)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = np.asarray(required(ctx, inputs, 0))
        return [np.zeros(x.shape, x.dtype)]


@register
class Rank(OpDef):
    name = "RANK"
    num_inputs = (1, 1)
    quant_aware = True  # the rank, never the values

    @classmethod
    def validate(cls, c: Check) -> None:
        """rank.cc: an int32 scalar, the input's number of dimensions."""
        super().validate(c)
        c.output_dtype(np.dtype(np.int32))
        c.output_shape(())

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = ctx.input_tensor(0)
        rank = len(x.shape) if x is not None else np.asarray(required(ctx, inputs, 0)).ndim
        return [np.asarray(rank, np.int32)]


@register
class BroadcastArgs(OpDef):
    name = "BROADCAST_ARGS"
    num_inputs = (2, 2)

    @classmethod
    def validate(cls, c: Check) -> None:
        """broadcast_args.cc: two rank-1 shapes of one type (int32 or int64), the output that
        type, as long as the longer; the shapes must broadcast."""
        super().validate(c)
        a, b = c.input(0), c.input(1)
        c.dtype(a, _INDEX_TYPES, "shape 1")
        c.same_dtype(b, a, "shape 2", "shape 1")
        c.same_dtype(c.output(), a, "output", "shape 1")
        c.rank(a, 1, None, "shape 1")
        c.rank(b, 1, None, "shape 2")
        if a.data is not None and b.data is not None:
            _broadcast(c.fail, np.asarray(a.data), np.asarray(b.data))
        c.output_shape((max(a.shape[0], b.shape[0]),))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        a, b = (np.asarray(required(ctx, inputs, i)) for i in range(2))
        return [_broadcast(lambda _r, m: ctx.fail(m), a, b)]


def _broadcast(fail, a: np.ndarray, b: np.ndarray) -> np.ndarray:  # noqa: ANN001
    """reference_ops::BroadcastArgs: numpy's rule, dimension by dimension from the end (a 1
    takes the other's; two others must agree)."""
    n = max(a.size, b.size)
    out = np.empty(n, a.dtype)
    for i in range(1, n + 1):
        x = int(a[-i]) if i <= a.size else 1
        y = int(b[-i]) if i <= b.size else 1
        if x != y and x != 1 and y != 1:
            raise fail("broadcast", f"shapes {a.tolist()} and {b.tolist()} do not broadcast")
        out[-i] = y if x == 1 else x
    return out


@register
class OneHot(OpDef):
    """On the GPU (float32 on/off values, a constant depth): the indices an int32 input of
    the partition, compared in the kernel with each position (an index outside matches
    none, as in LiteRT)."""

    name = "ONE_HOT"
    gpu_extended = True
    gpu_limits = "integer or bool values, or a depth computed at run time, on the CPU"
    runtime_indices = {0: "indices"}
    num_inputs = (4, 4)
    quant_aware = True  # on and off values are copied as stored

    @classmethod
    def integer_operands(cls, op: Op) -> set[int]:
        return {op.inputs[1]}  # (the depth: read at compile time)

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        depth, on = graph.tensors[op.inputs[1]], graph.tensors[op.inputs[2]]
        if on.dtype != np.float32 or on.quantization is not None:
            return f"its values are {on.type_name}: the GPU form writes float32"
        if depth.data is None:
            return "its depth is computed at run time: the GPU path needs a constant"
        return super().gpu_support(op, graph, allow_quantized=allow_quantized)

    @classmethod
    def validate(cls, c: Check) -> None:
        """one_hot.cc: int32/int64 indices; one-element depth (read as int32, not negative),
        on and off values of the output's type (float32, int8/16/32/64, uint8, bool); the
        axis (-1: last) within the output's rank, the output the indices' shape with depth
        inserted at the axis."""
        super().validate(c)
        idx, depth, on, off = (c.input(i) for i in range(4))
        c.dtype(idx, _INDEX_TYPES, "indices")
        c.dtype(
            on,
            frozenset({"float32", "int8", "uint8", "int16", "int32", "int64", "bool"}),
            "on value",
        )
        c.same_dtype(off, on, "off value", "on value")
        for t, role in ((depth, "depth"), (on, "on value"), (off, "off value")):
            if math.prod(t.shape) != 1:
                raise c.fail("shape", f"{role} {t.name!r} has {math.prod(t.shape)} elements, not 1")
        c.output_dtype(on.dtype)
        rank = len(idx.shape) + 1
        axis = int(c.op.options.get("axis", -1))
        axis = rank - 1 if axis == -1 else axis
        if not 0 <= axis < rank:
            raise c.fail("axis", f"axis {axis} is out of range for an output of rank {rank}")
        d = _scalar(depth)
        if d is None:
            return  # sized at run time
        d = int(np.asarray(depth.data).reshape(-1).astype(np.int32)[0])
        if d < 0:
            raise c.fail("depth", f"depth {d} is negative")
        c.output_shape((*idx.shape[:axis], d, *idx.shape[axis:]))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        idx = np.asarray(required(ctx, inputs, 0)).astype(np.int64)
        depth = int(np.asarray(required(ctx, inputs, 1)).reshape(-1).astype(np.int32)[0])
        if depth < 0:
            raise ctx.fail(f"depth {depth} is negative")
        on = np.asarray(required(ctx, inputs, 2)).reshape(())
        off = np.asarray(required(ctx, inputs, 3)).reshape(())
        axis = int(ctx.options.get("axis", -1))
        axis = idx.ndim if axis == -1 else axis
        # (the kernel compares each index, cast to int, with 0..depth-1: others match none)
        hot = np.expand_dims(idx.astype(np.int32), axis) == np.arange(depth).reshape(
            (depth,) + (1,) * (idx.ndim - axis)
        )
        y = np.where(hot, on, off).astype(on.dtype)
        return [as_planned(ctx, y)]
