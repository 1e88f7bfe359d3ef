"""Data-movement ops: reshape, transpose, concat, pad, slicing, gather, space/depth shuffles."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from litekiln.model.ir import Op, Subgraph, Tensor
from litekiln.ops import qmath
from litekiln.ops.base import (
    QUANTIZED,
    Check,
    OpContext,
    OpDef,
    activation_supported_on_gpu,
    apply_activation,
    fused_activation,
    int_input,
    register,
    required,
)
from litekiln.ops.elementwise import bools_as_floats

#: Types LiteRT's data-movement kernels take (their Eval switches, broadly).
_ANY = frozenset(
    {"float32", "float16", "uint8", "int8", "int16", "int32", "int64", "bool", "uint32"}
)
_INDEX_TYPES = frozenset({"int32", "int64"})
#: TensorType codes of the index types (ArgMaxOptions.output_type, ShapeOptions.out_type).
_INDEX_TENSOR_TYPES = {2: "int32", 4: "int64"}


def _ints(c: Check, t: Tensor, role: str, types: frozenset[str] = _INDEX_TYPES) -> list[int] | None:
    """The values of an integer operand (shape, axis, paddings...), None if not a constant."""
    c.dtype(t, types, role)
    if t.data is None:
        return None
    return [int(v) for v in np.asarray(t.data).reshape(-1)]


def _axis(c: Check, axis: int, rank: int, role: str = "axis") -> int:
    """A (possibly negative) axis of a rank-``rank`` tensor, normalised."""
    if not -rank <= axis < rank:
        raise c.fail("axis", f"{role} {axis} is out of range for rank {rank}")
    return axis % rank


def _same_quantization(c: Check, t: Tensor, like: Tensor, role: str) -> None:
    """LiteRT copies the stored integers: ``t`` must be quantized as ``like`` is."""
    a, b = t.quantization, like.quantization
    if (a is None) != (b is None) or (
        a is not None
        and b is not None
        and (float(a.scale[0]) != float(b.scale[0]) or int(a.zero_point[0]) != int(b.zero_point[0]))
    ):
        raise c.fail(
            "quantization-mismatch",
            f"{role} {t.name!r} is quantized differently from {like.name!r}: the kernel copies "
            "the stored integers",
        )


class _Movement(OpDef):
    """Ops that only move data: quantized tensors pass through as their stored integers
    (LiteRT's kernels copy them, whatever the output's parameters)."""

    quant_aware = True
    copies_values = True  # (PAD/PADV2 add zeros or their quantized constant)
    #: Operands the GPU path needs as constants (shapes, axes, positions...): index -> role.
    gpu_constants: ClassVar[dict[int, str]] = {}

    @classmethod
    def rank4_or_less(cls, op: Op, graph: Subgraph) -> str | None:
        for t in [*op.inputs[:1], *op.outputs]:
            if t >= 0 and len(graph.tensors[t].shape) > 4:
                return f"tensor {graph.tensors[t].name!r} has rank > 4"
        return None

    @classmethod
    def integer_operands(cls, op: Op) -> set[int]:
        return {op.inputs[i] for i in cls.gpu_constants if i < len(op.inputs)}

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        """The base's checks (integer operands and data computed at run time among them;
        booleans are float 0/1 on the GPU, moved as any value), then the operands the GPU
        form needs as constants (``gpu_constants``) and outputs with elements to compute."""
        reason = super().gpu_support(
            op, bools_as_floats(op, graph), allow_quantized=allow_quantized
        )
        if reason:
            return reason
        indices = cls.runtime_index_tensors(op, graph)
        for i, role in cls.gpu_constants.items():
            t = op.inputs[i] if i < len(op.inputs) else -1
            if t >= 0 and not graph.tensors[t].is_constant and t not in indices:
                return f"its {role} is computed at run time: the GPU path needs a constant"
        for t in op.outputs:
            if graph.tensors[t].size == 0:
                return f"output {graph.tensors[t].name!r} is empty: nothing to run"
        return None


@register
class Reshape(_Movement):
    name = "RESHAPE"
    int32_data = True
    gpu = True
    num_inputs = (1, 2)

    @classmethod
    def validate(cls, c: Check) -> None:
        """reshape.cc: the new shape comes from the shape input (a rank-1 int32 tensor) or
        else the ``new_shape`` option; at most one -1, no other negative value, as many
        elements as the input. A shape input that is not constant is resolved when the
        model runs (the declared output shape is then trusted)."""
        super().validate(c)
        x, y = c.input(0), c.output()
        c.same_dtype(y, x, "output")
        shape_t = c.optional(1)
        if shape_t is not None and len(shape_t.shape) == 1 and shape_t.type_name == "int32":
            if shape_t.data is None:
                return
            shape = [int(v) for v in shape_t.data.reshape(-1)]
        else:
            shape = [int(v) for v in c.op.options.get("new_shape", [])]
            if len(shape) > 8:
                raise c.fail("option-value", f"new_shape {shape} has more than 8 dimensions")
            if shape == [0]:
                shape = []
        if shape.count(-1) > 1 or any(d < -1 for d in shape):
            raise c.fail("new-shape", f"new shape {shape}: one -1 at most, no other negative")
        size = math.prod(x.shape)
        known = math.prod(d for d in shape if d not in (-1, 0))
        if -1 in shape:
            has_zero = 0 in shape
            fill = 0 if (size == 0 and not has_zero) or has_zero else size // known
            if size == 0 and not has_zero:
                fill = 0
            shape[shape.index(-1)] = fill
        if math.prod(shape) != size:
            raise c.fail(
                "new-shape",
                f"new shape {shape} holds {math.prod(shape)} elements, the input {size}",
            )
        c.output_shape(tuple(shape))

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
    def integer_operands(cls, op: Op) -> set[int]:
        return set(op.inputs[1:2])


@register
class Squeeze(_Movement):
    name = "SQUEEZE"
    int32_data = True
    gpu_extended = True
    versions = (1, 2)
    num_inputs = (1, 1)

    @classmethod
    def validate(cls, c: Check) -> None:
        """squeeze.cc: rank <= 8, each listed dimension in range and of size 1 (none listed:
        every dimension of size 1 goes)."""
        super().validate(c)
        x, y = c.input(0), c.output()
        c.same_dtype(y, x, "output")
        rank = len(x.shape)
        if rank > 8:
            raise c.fail("rank", f"input of rank {rank}, the kernel takes up to 8")
        dims = [int(d) for d in c.op.options.get("squeeze_dims", [])]
        if len(dims) > 8:
            raise c.fail("option-value", f"squeeze_dims {dims} lists more than 8 dimensions")
        if not dims:
            c.output_shape(tuple(d for d in x.shape if d != 1))
            return
        drop = set()
        for d in dims:
            k = _axis(c, d, rank, "squeeze dimension")
            if x.shape[k] != 1:
                raise c.fail("squeeze-dims", f"dimension {d} of {list(x.shape)} is not 1")
            drop.add(k)
        c.output_shape(tuple(n for k, n in enumerate(x.shape) if k not in drop))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        dims = ctx.options.get("squeeze_dims") or None
        return [np.squeeze(x, axis=tuple(dims) if dims else None)]


@register
class ExpandDims(_Movement):
    name = "EXPAND_DIMS"
    int32_data = True
    gpu_extended = True
    gpu_constants = {1: "axis"}
    num_inputs = (2, 2)

    @classmethod
    def validate(cls, c: Check) -> None:
        """expand_dims.cc: one axis in [-rank - 1, rank], input and output quantized alike."""
        super().validate(c)
        x, axis_t, y = c.input(0), c.input(1), c.output()
        c.output_dtype(x.dtype)
        _same_quantization(c, y, x, "output")
        values = _ints(c, axis_t, "axis")
        if values is None:
            return
        if len(values) != 1:
            raise c.fail("axis", f"axis {values} is not one value")
        k = _axis(c, values[0], len(x.shape) + 1)
        c.output_shape((*x.shape[:k], 1, *x.shape[k:]))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        return [np.expand_dims(x, int(int_input(ctx, inputs, 1).reshape(-1)[0]))]


@register
class Transpose(_Movement):
    name = "TRANSPOSE"
    int32_data = True
    gpu_extended = True
    # v2-v9 add types (int8, bool, int16, int4, bfloat16, float16) and ranks 5 and 6 (v4,
    # v6; v8 also names ranks > 6, which the kernel refuses at load): the GPU path permutes
    # every rank the kernel takes.
    gpu_constants = {1: "permutation"}
    versions = (1, 9)
    num_inputs = (2, 2)

    @classmethod
    def validate(cls, c: Check) -> None:
        """transpose.cc: rank <= 6, a rank-1 permutation of the input's dimensions."""
        super().validate(c)
        x, perm_t, y = c.input(0), c.input(1), c.output()
        c.same_dtype(y, x, "output")
        rank = len(x.shape)
        if rank > 6:
            raise c.fail("rank", f"input of rank {rank}, the kernel takes up to 6")
        c.rank(perm_t, 1, None, "perm")
        perm = _ints(c, perm_t, "perm")
        if perm is None:
            return
        norm = [p + rank if p < 0 else p for p in perm]
        if len(perm) != rank or sorted(norm) != list(range(rank)):
            raise c.fail("perm", f"perm {perm} is not a permutation of {rank} dimensions")
        c.output_shape(tuple(x.shape[p] for p in norm))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        return [np.transpose(x, tuple(int_input(ctx, inputs, 1).reshape(-1)))]


@register
class ReverseV2(_Movement):
    """REVERSE_V2: the input with the order of its elements reversed along the given axes
    (Keras' Bidirectional layers run the backward direction on the reversed sequence)."""

    name = "REVERSE_V2"
    int32_data = True
    gpu_extended = True
    # v2 adds int8 and uint8, v3 int16: moved as stored integers, like the float view.
    gpu_constants = {1: "axes"}
    versions = (1, 3)
    num_inputs = (2, 2)

    @classmethod
    def validate(cls, c: Check) -> None:
        """reverse.cc: a rank-1 int32 axis operand of no more elements than the input has
        dimensions, each axis in range; the output of the input's type and shape."""
        super().validate(c)
        x, axes_t, y = c.input(0), c.input(1), c.output()
        c.dtype(x, _REVERSE_TYPES, "input")
        c.same_dtype(y, x, "output")
        c.rank(axes_t, 1, None, "axis")
        if axes_t.size > len(x.shape):
            raise c.fail("axis", f"{axes_t.size} axes for an input of rank {len(x.shape)}")
        axes = sorted(
            _axis(c, a, len(x.shape)) for a in _ints(c, axes_t, "axis", frozenset({"int32"})) or ()
        )
        if axes and axes != list(range(axes[0], axes[0] + len(axes))):
            # (LiteRT's kernel fails when it runs: "Non-contiguous `axes` not supported".)
            raise c.fail("axis", f"axes {axes}: the kernel reverses contiguous axes only")
        c.output_shape(x.shape)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        axes = tuple(int(a) % x.ndim for a in int_input(ctx, inputs, 1).reshape(-1))
        return [np.flip(x, axes) if axes else x]


_REVERSE_TYPES = frozenset({"float32", "uint8", "int8", "int16", "int32", "int64", "bool"})


@register
class Concatenation(_Movement):
    name = "CONCATENATION"
    int32_data = True
    gpu = True
    # Documented table: v1, v2 (int8). v3-v7 add types (int16, uint32, int4, float16, float8):
    # the extended table takes them all (quantized ones through the float view), any rank.
    gpu_quant_max_version = 2
    quant_aware = False  # int8/uint8 inputs are rescaled (reference_quantized)
    versions = (1, 7)

    @classmethod
    def validate(cls, c: Check) -> None:
        """concatenation.cc: inputs of one supported type and rank, equal but along the
        axis, no fused activation; int8 inputs quantized as the output (the kernel copies
        the stored integers), int16 ones symmetrically."""
        super().validate(c)
        n = len(c.op.inputs)
        if n < 1:
            raise c.fail("input-count", "no inputs")
        x, y = c.input(0), c.output()
        rank = len(x.shape)
        axis = int(c.op.options.get("axis", 0))
        if axis < 0:
            axis += rank
        if not (0 <= axis < rank):
            raise c.fail(
                "axis", f"axis {c.op.options.get('axis', 0)} is out of range for rank {rank}"
            )
        if c.activation() != 0:
            raise c.fail("activation", f"fused activation {c.activation()}: the kernel takes none")
        c.dtype(x, _ANY, "input 0")
        total = 0
        for i in range(n):
            t = c.input(i)
            if len(t.shape) != rank or t.dtype != x.dtype:
                raise c.fail(
                    "input-shape",
                    f"input {i} {t.type_name}{list(t.shape)} does not match input 0 "
                    f"{x.type_name}{list(x.shape)}",
                )
            pairs = enumerate(zip(t.shape, x.shape, strict=True))
            if any(a != b for k, (a, b) in pairs if k != axis):
                raise c.fail(
                    "input-shape",
                    f"input {i} {list(t.shape)} and input 0 {list(x.shape)} differ off axis {axis}",
                )
            total += t.shape[axis]
        c.same_dtype(y, x, "output")
        if x.type_name in QUANTIZED:
            c.quantized(y, "output")
            for i in range(n):
                t = c.input(i)
                c.quantized(t, f"input {i}")
                if x.type_name == "int8":
                    _same_quantization(c, t, y, f"input {i}")
                elif x.type_name == "int16":
                    c.zero_point(t, 0, f"input {i}")
            if x.type_name == "int16":
                c.zero_point(y, 0, "output")
        c.output_shape(tuple(total if k == axis else d for k, d in enumerate(x.shape)))

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
        return super().gpu_support(
            op, graph, allow_quantized=allow_quantized
        ) or activation_supported_on_gpu(op)


@register
class Pad(_Movement):
    name = "PAD"
    gpu = True
    # int32 data moves as int32 (BART's decoder ids: the token ids shifted right by a PAD)
    int32_data = True
    # Documented table: v1, v2 (int8). v3-v6 add types (int16, bool, float8) and rank 5 (v4):
    # the GPU path pads every rank the kernel takes, quantized tensors through the float view.
    gpu_quant_max_version = 2
    gpu_constants = {1: "paddings", 2: "constant value"}
    quant_aware = False  # padded with the quantized zero (reference_quantized)
    versions = (1, 6)
    num_inputs = (2, 3)  # PAD and PADV2 share LiteRT's kernel: constant_values is optional

    @classmethod
    def validate(cls, c: Check) -> None:
        """pad.cc: paddings of shape [rank, 2] (int32 or int64), rank <= 5, non-negative;
        PADV2's constant_values one value of the input's type; input and output of one
        type."""
        super().validate(c)
        x, pads_t, y = c.input(0), c.input(1), c.output()
        c.same_dtype(y, x, "output")
        rank = len(x.shape)
        if rank > 5:
            raise c.fail("rank", f"input of rank {rank}, the kernel takes up to 5")
        if pads_t.shape != (rank, 2):
            raise c.fail(
                "paddings", f"paddings of shape {list(pads_t.shape)}, expected [{rank}, 2]"
            )
        value = c.optional(2)
        if value is not None:
            c.same_dtype(value, x, "constant_values")
            if value.size != 1:
                raise c.fail("constant-values", f"constant_values has {value.size} values")
        pads = _ints(c, pads_t, "paddings")
        if pads is None:
            return
        if min(pads, default=0) < 0:
            raise c.fail("paddings", f"paddings {pads} must not be negative")
        c.output_shape(tuple(d + pads[2 * k] + pads[2 * k + 1] for k, d in enumerate(x.shape)))

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
        if xt is None or xt.dtype.name not in QUANTIZED or yt.dtype != xt.dtype:
            return None
        x = required(ctx, inputs, 0)
        pads = int_input(ctx, inputs, 1).reshape(-1, 2)
        value = qmath.scale_zp(yt)[1]  # (0 for an output without parameters, as in LiteRT)
        if len(inputs) > 2 and inputs[2] is not None:
            value = int(np.asarray(inputs[2]).reshape(-1)[0])
        return [np.pad(x, [tuple(p) for p in pads], constant_values=value).astype(yt.dtype)]

    @classmethod
    def integer_operands(cls, op: Op) -> set[int]:
        return set(op.inputs[1:2])  # (PADV2's value has the data's type)


@register
class PadV2(Pad):
    """PADV2: PAD with a third input, the value to pad with."""

    name = "PADV2"
    gpu = False
    gpu_extended = True


@register
class Densify(_Movement):
    """DENSIFY: the loader densifies sparse constants and folds the op, whose reference is
    then the identity."""

    name = "DENSIFY"
    num_inputs = (1, 1)

    @classmethod
    def validate(cls, c: Check) -> None:
        """densify.cc: a constant, sparse, non-string input."""
        super().validate(c)
        x = c.input(0)
        if x.data is None or not x.was_sparse:
            raise c.fail("input-sparse", f"input {x.name!r} is not a sparse constant")
        c.output_dtype(x.dtype)
        c.output_shape(x.shape)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        return [required(ctx, inputs, 0)]


@register
class MirrorPad(_Movement):
    name = "MIRROR_PAD"
    gpu_extended = True
    gpu_constants = {1: "paddings"}
    versions = (1, 3)
    num_inputs = (2, 2)

    @classmethod
    def validate(cls, c: Check) -> None:
        """mirror_pad.cc: paddings [rank, 2], each at most the dimension (REFLECT: below it)."""
        super().validate(c)
        x, pads_t, y = c.input(0), c.input(1), c.output()
        c.same_dtype(y, x, "output")
        rank = len(x.shape)
        if pads_t.shape != (rank, 2):
            raise c.fail(
                "paddings", f"paddings of shape {list(pads_t.shape)}, expected [{rank}, 2]"
            )
        pads = _ints(c, pads_t, "paddings")
        if pads is None:
            return
        reflect = int(c.op.options.get("mode", 0)) == 0
        for k, d in enumerate(x.shape):
            for p in pads[2 * k : 2 * k + 2]:
                if p < 0 or p > d - reflect:
                    raise c.fail("paddings", f"padding {p} of dimension {k} ({d}) is invalid")
        c.output_shape(tuple(d + pads[2 * k] + pads[2 * k + 1] for k, d in enumerate(x.shape)))

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
    int32_data = True
    gpu_extended = True
    gpu_constants = {0: "axis"}
    versions = (1, 5)
    num_inputs = (2, 2)
    num_outputs = None

    @classmethod
    def validate(cls, c: Check) -> None:
        """split.cc: as many outputs as ``num_splits``, a constant axis, a dimension that
        divides evenly."""
        super().validate(c)
        axis_t, x = c.input(0), c.input(1)
        n = int(c.op.options.get("num_splits", 0))
        c.count("outputs", len(c.op.outputs), n, n)
        if n == 0:
            raise c.fail("option-value", "num_splits is 0")
        values = _ints(c, axis_t, "axis", frozenset({"int32"}))
        for i in range(n):
            c.same_dtype(c.output(i), x, f"output {i}")
        if values is None:
            return
        if len(values) != 1:
            raise c.fail("axis", f"axis {values} is not one value")
        k = _axis(c, values[0], len(x.shape))
        if x.shape[k] % n:
            raise c.fail("split", f"dimension {k} ({x.shape[k]}) does not split in {n}")
        shape = tuple(d // n if j == k else d for j, d in enumerate(x.shape))
        for i in range(n):
            c.output_shape(shape, i)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        axis = int(int_input(ctx, inputs, 0).reshape(-1)[0])
        x = required(ctx, inputs, 1)
        n = int(ctx.options.get("num_splits", len(ctx.op.outputs)))
        return list(np.split(x, n, axis=axis))


@register
class SplitV(_Movement):
    name = "SPLIT_V"
    int32_data = True
    gpu_extended = True
    gpu_constants = {1: "size_splits", 2: "axis"}
    versions = (1, 3)
    num_inputs = (3, 3)
    num_outputs = None

    @classmethod
    def validate(cls, c: Check) -> None:
        """split_v.cc: a rank-1 size_splits with one size per output (one -1 at most), a
        constant axis, sizes adding up to the dimension."""
        super().validate(c)
        x, sizes_t, axis_t = c.input(0), c.input(1), c.input(2)
        c.rank(sizes_t, 1, None, "size_splits")
        n = len(c.op.outputs)
        if sizes_t.size != n:
            raise c.fail("output-count", f"{n} outputs for {sizes_t.size} sizes")
        for i in range(n):
            c.same_dtype(c.output(i), x, f"output {i}")
        sizes = _ints(c, sizes_t, "size_splits")
        values = _ints(c, axis_t, "axis", frozenset({"int32"}))
        if sizes is None or values is None:
            return
        k = _axis(c, values[0], len(x.shape))
        if sizes.count(-1) > 1 or any(s < -1 for s in sizes):
            raise c.fail("split", f"sizes {sizes}: one -1 at most, no other negative")
        if -1 in sizes:
            sizes[sizes.index(-1)] = x.shape[k] - (sum(sizes) + 1)
        if sum(sizes) != x.shape[k] or min(sizes) < 0:
            raise c.fail("split", f"sizes {sizes} do not add up to dimension {k} ({x.shape[k]})")
        for i, s in enumerate(sizes):
            c.output_shape(tuple(s if j == k else d for j, d in enumerate(x.shape)), i)

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
    int32_data = True
    gpu_extended = True
    # v2-v8 add types (int8, string, int16, uint32, int4, float16) and rank 5 (v5).
    gpu_constants = {1: "begin", 2: "size"}
    versions = (1, 8)
    num_inputs = (3, 3)

    @classmethod
    def validate(cls, c: Check) -> None:
        """slice.cc: begin and size of the input's rank (int32 or int64), in range."""
        super().validate(c)
        x, begin_t, size_t, y = c.input(0), c.input(1), c.input(2), c.output()
        c.same_dtype(y, x, "output")
        rank = len(x.shape)
        begin, size = _ints(c, begin_t, "begin"), _ints(c, size_t, "size")
        if rank > 5:
            raise c.fail("rank", f"input of rank {rank}, the kernel takes up to 5")
        if begin is None or size is None:
            return
        if len(begin) != rank or len(size) != rank:
            raise c.fail("slice", f"begin {begin} and size {size} for rank {rank}")
        out = []
        for b, s, d in zip(begin, size, x.shape, strict=True):
            s = d - b if s == -1 else s
            if b < 0 or s < 0 or b + s > d:
                raise c.fail("slice", f"begin {begin} and size {size} exceed {list(x.shape)}")
            out.append(s)
        c.output_shape(tuple(out))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        begin = int_input(ctx, inputs, 1).reshape(-1)
        size = int_input(ctx, inputs, 2).reshape(-1)
        idx = tuple(
            slice(int(b), None if s == -1 else int(b + s)) for b, s in zip(begin, size, strict=True)
        )
        return [x[idx]]


@dataclass(frozen=True)
class SlicePlan:
    """A STRIDED_SLICE as LiteRT's kernel runs it (strided_slice.cc
    ``BuildStridedSliceParams``, ``StartForAxis``/``EndForAxis`` and ``ResizeOutputTensor``).

    Attributes:
        shape: the input's shape with the new axes inserted (the ellipsis expanded).
        ranges: per axis of ``shape``, the indices the kernel's loop visits (a ``range``:
            ``start < stop`` for positive steps, ``start > stop`` for negative ones, as C
            loops compare, never Python's wrap-around of negative indices).
        shrink: the axes of ``shape`` the output drops.
        output: the output shape LiteRT gives the tensor.
    """

    shape: tuple[int, ...]
    ranges: tuple[range, ...]
    shrink: frozenset[int]
    output: tuple[int, ...]

    @property
    def written(self) -> tuple[int, ...]:
        """The shape of what the kernel writes (its loop counts, shrunk axes dropped)."""
        return tuple(len(r) for k, r in enumerate(self.ranges) if k not in self.shrink)

    def index(self) -> tuple[slice, ...]:
        """numpy basic indexing of an array of shape ``shape`` that visits ``ranges``."""
        out = []
        for r in self.ranges:
            if len(r) == 0:
                out.append(slice(0, 0))
            else:
                out.append(slice(r.start, r.stop if r.stop >= 0 else None, r.step))
        return tuple(out)


def slice_ranges(shape: Sequence[int], begin: Sequence[int], size: Sequence[int]) -> list[range]:
    """SLICE's geometry: per axis, the indices it keeps (a size of -1: to the end)."""
    return [range(b, d if n == -1 else b + n) for b, n, d in zip(begin, size, shape, strict=True)]


def strided_slice_plan(
    shape: tuple[int, ...],
    begin: list[int],
    end: list[int],
    strides: list[int],
    options: dict[str, object],
) -> SlicePlan:
    """LiteRT's STRIDED_SLICE geometry for an input of ``shape``.

    Raises:
        ValueError: the spec reads past the input's dimensions or past ``end`` (LiteRT reads
            out of bounds there) or has a zero stride.
    """

    def opt(key: str) -> int:
        return int(options.get(key, 0) or 0)  # type: ignore[call-overload]

    bm, em, ell, new, shrink = (
        opt(k)
        for k in ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")
    )
    offset = bool(options.get("offset", False))
    rank, count = len(shape), len(begin)
    num_add = sum(1 for i in range(count) if not (ell >> i) & 1 and (new >> i) & 1)
    dims = rank + num_add
    # The effective ellipsis and new-axis masks (an ellipsis spans the dimensions the spec
    # does not name).
    eff_ell = eff_new = 0
    ell_start, expanded = dims, 0
    i = 0
    while i < dims:
        if (ell >> i) & 1:
            ell_start = i
            ell_end = max(i + 1, min(i + 1 + num_add + rank - count, dims))
            expanded = ell_end - ell_start - 1
            while i < ell_end:
                eff_ell |= 1 << i
                i += 1
            continue
        if (new >> (i - expanded)) & 1:
            eff_new |= 1 << i
        i += 1
    starts, stops, steps = [0] * dims, [0] * dims, [1] * dims
    p_bm = p_em = p_shrink = 0
    eff_shape: list[int] = []
    added_ell = added_axes = 0
    for i in range(dims):
        bit = 1 << i
        if eff_ell & bit or eff_new & bit or i >= count + expanded:
            if eff_ell & bit:
                added_ell = max(0, i - ell_start)
            if eff_new & bit:
                stops[i] = 1
                eff_shape.append(1)
                added_axes += 1
                continue
            p_bm |= bit
            p_em |= bit
        else:
            orig = i - added_ell
            starts[i], stops[i], steps[i] = begin[orig], end[orig], strides[orig]
            p_bm |= bit if (bm >> orig) & 1 else 0
            p_em |= bit if (em >> orig) & 1 else 0
            p_shrink |= bit if (shrink >> orig) & 1 else 0
        if not 0 <= i - added_axes < rank:
            raise ValueError(f"the slice spec names dimension {i - added_axes} of rank {rank}")
        eff_shape.append(shape[i - added_axes])
    if 0 in steps:
        raise ValueError(f"strides {strides}: zero is not a stride")

    def clamp(v: int, size: int, step: int) -> int:
        return min(max(v, 0), size) if step > 0 else min(max(v, -1), size - 1)

    ranges, output = [], []
    for i, size in enumerate(eff_shape):
        step = steps[i]
        b = starts[i] + size if starts[i] < 0 else starts[i]
        b = clamp(b, size, step)
        if (p_bm >> i) & 1:
            b = 0 if step > 0 else size - 1
        if (p_shrink >> i) & 1:
            e = b if b >= size else b + 1
        else:
            e = stops[i] + b if offset else stops[i]
            e = clamp(e + size if e < 0 else e, size, step)
            if (p_em >> i) & 1:
                e = size if step > 0 else -1
        ranges.append(range(b, e, step))
        if (p_shrink >> i) & 1:
            continue
        if offset:
            if i >= len(end):
                raise ValueError("offset: LiteRT reads the size of an axis past end")
            n = end[i]
        else:
            n = e - b
        if (n < 0) != (step < 0):
            n = 0
        elif step < 0:
            n = (n + 1) // step + 1
        else:
            n = 0 if n == 0 else (n - 1) // step + 1
        output.append(n)
    return SlicePlan(
        tuple(eff_shape),
        tuple(ranges),
        frozenset(i for i in range(dims) if (p_shrink >> i) & 1),
        tuple(output),
    )


@register
class StridedSlice(_Movement):
    name = "STRIDED_SLICE"
    int32_data = True
    gpu = True
    # Documented table: v1, v2 (int8). v3-v8 add types (bool, string, uint32), rank 5 (v4),
    # ellipsis and new-axis masks (v6) and offset (v8): the GPU path slices what the plan
    # says, any rank.
    gpu_quant_max_version = 2
    gpu_constants = {1: "begin", 2: "end", 3: "strides"}
    versions = (1, 8)
    num_inputs = (4, 4)

    @classmethod
    def validate(cls, c: Check) -> None:
        """strided_slice.cc: rank-1 int32 begin, end and strides of one length (at most 31),
        non-zero strides; the output shape is the one LiteRT computes (:func:`strided_slice_plan`).
        Refused besides (LiteRT would read out of bounds or leave part of its output
        unwritten): a spec naming dimensions the input lacks, and a shrunk axis or an
        ``offset`` size that selects fewer elements than the output holds."""
        super().validate(c)
        x, y = c.input(0), c.output()
        c.same_dtype(y, x, "output")
        parts = []
        for i, role in ((1, "begin"), (2, "end"), (3, "strides")):
            t = c.input(i)
            c.rank(t, 1, None, role)
            parts.append(_ints(c, t, role, frozenset({"int32"})))
        begin, end, strides = parts
        if not (c.input(1).size == c.input(2).size == c.input(3).size <= 31):
            raise c.fail("slice", "begin, end and strides need one length, at most 31")
        if begin is None or end is None or strides is None:
            return
        if 0 in strides or -(2**31) in strides:
            raise c.fail("slice", f"strides {strides}: zero (or INT32_MIN) is not a stride")
        try:
            plan = strided_slice_plan(x.shape, begin, end, strides, c.op.options)
        except ValueError as exc:
            raise c.fail("slice", str(exc)) from None
        if plan.written != plan.output:
            raise c.fail(
                "slice",
                f"begin {begin}, end {end}, strides {strides} select {list(plan.written)} "
                f"elements for an output of shape {list(plan.output)}",
            )
        c.output_shape(plan.output)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        begin, end, strides = (
            [int(v) for v in int_input(ctx, inputs, i).reshape(-1)] for i in (1, 2, 3)
        )
        plan = strided_slice_plan(x.shape, begin, end, strides, ctx.options)
        return [x.reshape(plan.shape)[plan.index()].reshape(plan.output)]


@register
class Gather(_Movement):
    name = "GATHER"
    int32_data = True
    gpu_extended = True
    # v2-v8: int8, bool, int16, batch_dims (v5), int16 positions, int4, float8.
    gpu_constants = {1: "positions"}
    runtime_indices = {1: "positions"}  # (int32, without batch_dims: take() on the device)
    versions = (1, 8)
    num_inputs = (2, 2)

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        reason = super().gpu_support(op, graph, allow_quantized=allow_quantized)
        batch_dims = int(op.options.get("batch_dims", 0) or 0)
        if reason is None and batch_dims and cls.runtime_index_tensors(op, graph):
            return "positions computed at run time with batch_dims: the GPU form has none"
        return reason

    @classmethod
    def index_limit(cls, op: Op, graph: Subgraph, i: int) -> tuple[int, ...] | None:
        shape = graph.tensors[op.inputs[0]].shape
        axis = int(op.options.get("axis", 0) or 0)
        return (shape[axis % len(shape)],)

    @classmethod
    def validate(cls, c: Check) -> None:
        """gather.cc: int16/int32/int64 positions, 0 <= batch_dims <= axis < rank; the output
        is params' shape with the axis replaced by the positions' (after the batch dims)."""
        super().validate(c)
        params, pos = c.input(0), c.input(1)
        c.dtype(pos, _INDEX_TYPES | {"int16"}, "positions")
        c.output_dtype(params.dtype)
        rank = len(params.shape)
        axis = int(c.op.options.get("axis", 0))
        batch_dims = int(c.op.options.get("batch_dims", 0))
        if axis < 0:
            axis += rank
        if batch_dims < 0:
            batch_dims += len(pos.shape)
        if not (0 <= axis < rank) or not (0 <= batch_dims <= axis):
            raise c.fail("axis", f"axis {axis} and batch_dims {batch_dims} for rank {rank}")
        if params.shape[:batch_dims] != pos.shape[:batch_dims]:
            raise c.fail("batch-dims", f"batch dimensions of {params.shape} and {pos.shape}")
        if pos.data is not None and params.shape[axis] > 0:
            data = np.asarray(pos.data)
            if data.size and (data.min() < 0 or data.max() >= params.shape[axis]):
                raise c.fail("positions", f"positions outside [0, {params.shape[axis]})")
        c.output_shape((*params.shape[:axis], *pos.shape[batch_dims:], *params.shape[axis + 1 :]))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        params = required(ctx, inputs, 0)
        pos = int_input(ctx, inputs, 1)
        rows = gather_rows(params.shape, pos, ctx.options)
        n = params.shape[rows.axis]
        if pos.size and (pos.min() < 0 or pos.max() >= n):
            raise ctx.fail(f"positions outside [0, {n})")
        return [rows.take(params)]


@register
class EmbeddingLookup(OpDef):
    """EMBEDDING_LOOKUP (embedding_lookup.cc): rows of a table at run-time ids -- the word or
    token embedding of text models (PyTorch's ``nn.Embedding`` through litert-torch).

    Inputs: the ids (int32, rank 1) and the table (rank >= 2, rows along axis 0); the output is
    ``[len(ids), *table.shape[1:]]``. A float32 table, or an 8-bit one with an output of its
    own type, is copied row by row. An 8-bit (or int4) table with a float32 output is LiteRT's
    hybrid kernel: each stored integer, read as *signed* 8-bit (uint8 bytes too, as LiteRT
    reads them), times the table's scale -- its row's where the scales are per row -- and the
    zero point is not used. An id outside the table is an error at run time, as in LiteRT.

    On the GPU (LiteRT's GPU delegate has no form of it): a float32 table, or an int8 one
    read as float32 (the hybrid kernel of litert-torch's dynamic-int8 language models: the
    table dequantized once, as every constant of the float view, to the values the hybrid
    kernel computes); the ids an int32 tensor of the partition (a graph input, or computed
    there or on the CPU), read by the kernel; an id entering the partition outside the table
    is refused on the host before the run, as on the CPU.
    """

    name = "EMBEDDING_LOOKUP"
    gpu_extended = True
    gpu_limits = "uint8 and int4 tables, and 8-bit tables looked up as 8-bit rows, on the CPU"
    runtime_indices = {0: "ids"}
    quant_aware = True  # the stored integers, scaled as LiteRT's hybrid kernel does
    versions = (1, 4)  # v2 int8 (hybrid), v3 per-channel scales, v4 int4
    num_inputs = (2, 2)

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        table = graph.tensors[op.inputs[1]]
        float_table = table.dtype == np.float32 and table.quantization is None
        # int8 x its (row's) scale with zero point 0 (validate): `dequantize`'s values, the
        # float64 product rounded once; uint8 bytes LiteRT reads as signed, which it does not.
        hybrid = table.type_name == "int8" and graph.tensors[op.outputs[0]].dtype == np.float32
        if not (float_table or hybrid):
            return (
                f"its table {table.name!r} is {table.type_name}: the GPU form takes float32, "
                "or int8 looked up as float32"
            )
        return super().gpu_support(op, graph, allow_quantized=allow_quantized)

    @classmethod
    def index_limit(cls, op: Op, graph: Subgraph, i: int) -> tuple[int, ...] | None:
        return (graph.tensors[op.inputs[1]].shape[0],)

    @classmethod
    def validate(cls, c: Check) -> None:
        """Prepare's rules (int32 ids of rank 1, a table of rank 2 or more, the output's
        shape), and Eval's types, checked here so that a file LiteRT cannot run is refused at
        load: float32 tables, and 8-bit or int4 tables with a float32 output or one of their
        own type."""
        super().validate(c)
        ids, table, y = c.input(0), c.input(1), c.output()
        c.rank(ids, 1, 1, "ids")
        c.dtype(ids, frozenset({"int32"}), "ids")
        c.rank(table, 2, 8, "table")
        q = table.quantization
        if table.type_name not in ("float32", "int8", "uint8", "int4"):
            raise c.fail(
                "table-type",
                f"table {table.name!r} is {table.type_name}; LiteRT looks up float32, int8, "
                "uint8 and int4 tables",
            )
        hybrid = table.type_name != "float32" and y.type_name == "float32"
        if not hybrid and y.type_name != table.type_name:
            # LiteRT's Prepare leaves the declared type; its Eval would copy the bytes.
            raise c.fail(
                "output-type",
                f"output {y.name!r} is {y.type_name}; a {table.type_name} table gives "
                + (
                    "float32 rows"
                    if table.type_name == "float32"
                    else f"float32 (dequantized) or {table.type_name} rows"
                ),
            )
        if hybrid and (q is None or int(q.zero_point.reshape(-1)[0]) != 0):
            raise c.fail(
                "table-zero-point",
                f"a {table.type_name} table read as float32 must be symmetric (zero point 0), "
                f"got {None if q is None else int(q.zero_point.reshape(-1)[0])}",
            )
        if (
            q is not None
            and q.scale.size > 1
            and (not hybrid or q.axis != 0 or q.scale.size != table.shape[0])
        ):
            raise c.fail(
                "table-scale",
                f"{q.scale.size} scales along axis {q.axis}: per-axis scales are one a row "
                f"({table.shape[0]}, axis 0), for a table read as float32",
            )
        if ids.data is not None:
            data = np.asarray(ids.data)
            if data.size and (data.min() < 0 or data.max() >= table.shape[0]):
                raise c.fail("ids", f"ids outside [0, {table.shape[0]})")
        c.output_shape((ids.shape[0], *table.shape[1:]))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        ids = int_input(ctx, inputs, 0).reshape(-1)
        table = required(ctx, inputs, 1)
        n = table.shape[0]
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            bad = int(ids[(ids < 0) | (ids >= n)][0])
            raise ctx.fail(f"id {bad} is outside the table's rows [0, {n - 1}]")
        rows = table[ids]
        out = ctx.output_tensor()
        if out.type_name != "float32" or table.dtype == np.float32:
            return [rows]
        # LiteRT's hybrid kernel: the bytes as int8, times the (row's) scale, in float.
        tensor = ctx.input_tensor(1)
        q = tensor.quantization if tensor is not None else None
        if q is None:
            raise ctx.fail("an 8-bit table read as float32 has no scale")
        scale = q.scale.reshape(-1).astype(np.float64)
        row_scale = scale[ids] if scale.size > 1 else np.full(ids.size, scale[0])
        signed = rows.view(np.int8) if rows.dtype == np.uint8 else rows.astype(np.int8)
        shape = (ids.size,) + (1,) * (rows.ndim - 1)
        return [(signed.astype(np.float64) * row_scale.reshape(shape)).astype(np.float32)]


@dataclass(frozen=True)
class GatherRows:
    """A gather at known positions as one take of whole rows: the data viewed as
    ``[rows, row_size]``, ``indices`` the rows to take, in output order."""

    rows: int
    row_size: int
    indices: np.ndarray
    output: tuple[int, ...]
    axis: int = 0  # GATHER: the axis gathered along

    def take(self, x: np.ndarray) -> np.ndarray:
        return x.reshape(self.rows, self.row_size)[self.indices.reshape(-1)].reshape(self.output)


def gather_rows(
    shape: tuple[int, ...], positions: np.ndarray, options: dict[str, object]
) -> GatherRows:
    """GATHER (``axis``, ``batch_dims``) as rows of the data: the data
    ``[batch..., outer..., n, inner...]`` is ``[B * O * n, I]`` rows; output element
    ``(b, o, p)`` is row ``(b * O + o) * n + positions[b, p]``."""
    pos = np.asarray(positions, np.int64)
    rank = len(shape)
    axis = int(options.get("axis", 0) or 0)  # type: ignore[call-overload]
    bd = int(options.get("batch_dims", 0) or 0)  # type: ignore[call-overload]
    axis += rank if axis < 0 else 0
    bd += pos.ndim if bd < 0 else 0
    b = math.prod(shape[:bd])
    o = math.prod(shape[bd:axis])
    n = shape[axis]
    p = math.prod(pos.shape[bd:])
    base = (np.arange(b).reshape(b, 1, 1) * o + np.arange(o).reshape(1, o, 1)) * n
    rows = base + pos.reshape(b, 1, p)
    output = (*shape[:axis], *pos.shape[bd:], *shape[axis + 1 :])
    return GatherRows(b * o * n, math.prod(shape[axis + 1 :]), rows.reshape(-1), output, axis)


def gather_nd_rows(shape: tuple[int, ...], indices: np.ndarray) -> GatherRows:
    """GATHER_ND as rows of the data: ``[d_0 * ... * d_(q-1), rest]`` for indices whose last
    dimension is ``q``."""
    idx = np.asarray(indices, np.int64)
    q = idx.shape[-1]
    lead = shape[:q]
    flat = np.zeros(idx.shape[:-1], np.int64)
    for j, d in enumerate(lead):
        flat = flat * d + idx[..., j]
    output = (*idx.shape[:-1], *shape[q:])
    return GatherRows(math.prod(lead), math.prod(shape[q:]), flat.reshape(-1), output)


@register
class GatherNd(_Movement):
    name = "GATHER_ND"
    int32_data = True
    gpu_extended = True
    # v2-v6: string, int16 params, int16 indices, bool, float8.
    gpu_constants = {1: "indices"}
    runtime_indices = {1: "indices"}  # (int32: a language model's rows at its positions)
    versions = (1, 6)
    num_inputs = (2, 2)

    @classmethod
    def index_limit(cls, op: Op, graph: Subgraph, i: int) -> tuple[int, ...] | None:
        q = graph.tensors[op.inputs[1]].shape[-1]
        return tuple(graph.tensors[op.inputs[0]].shape[:q])

    @classmethod
    def validate(cls, c: Check) -> None:
        """gather_nd.cc: int16/int32/int64 indices of rank >= 1 whose last dimension is at
        most the data's rank (>= 1); the output is ``indices.shape[:-1] + data.shape[q:]``,
        of the data's type. Constant indices must lie inside the data (the kernel fails at
        run time otherwise)."""
        super().validate(c)
        params, idx = c.input(0), c.input(1)
        c.dtype(idx, _INDEX_TYPES | {"int16"}, "indices")
        c.output_dtype(params.dtype)
        c.rank(params, 1, 8, "params")
        c.rank(idx, 1, 8, "indices")
        q = idx.shape[-1]
        if q > len(params.shape):
            raise c.fail(
                "indices",
                f"indices {list(idx.shape)} index {q} dimensions of a rank-{len(params.shape)} "
                "tensor",
            )
        if idx.data is not None and idx.size:
            data = np.asarray(idx.data, np.int64).reshape(-1, q)
            if (data < 0).any() or (data >= np.asarray(params.shape[:q])).any():
                raise c.fail("indices", f"indices outside {list(params.shape[:q])}")
        c.output_shape((*idx.shape[:-1], *params.shape[q:]))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        params = required(ctx, inputs, 0)
        idx = int_input(ctx, inputs, 1)
        q = idx.shape[-1]
        if idx.size and ((idx < 0).any() or (idx >= np.asarray(params.shape[:q])).any()):
            raise ctx.fail(f"indices outside {list(params.shape[:q])}")
        return [gather_nd_rows(params.shape, idx).take(params)]


@register
class DepthToSpace(_Movement):
    name = "DEPTH_TO_SPACE"
    gpu_extended = True
    versions = (1, 2)
    num_inputs = (1, 1)

    @classmethod
    def validate(cls, c: Check) -> None:
        """depth_to_space.cc: a rank-4 input whose channels divide by block_size**2."""
        super().validate(c)
        x, y = c.input(0), c.output()
        c.rank(x, 4, None, "input")
        c.same_dtype(y, x, "output")
        bs = int(c.op.options.get("block_size", 0))
        if bs <= 0:
            raise c.fail("option-value", f"block_size {bs} must be positive")
        n, h, w, ch = x.shape
        if ch % (bs * bs):
            raise c.fail("block-size", f"{ch} channels do not divide by {bs}x{bs}")
        c.output_shape((n, h * bs, w * bs, ch // (bs * bs)))

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
    versions = (1, 2)
    num_inputs = (1, 1)

    @classmethod
    def validate(cls, c: Check) -> None:
        """space_to_depth.cc: a rank-4 input whose height and width divide by block_size."""
        super().validate(c)
        x, y = c.input(0), c.output()
        c.rank(x, 4, None, "input")
        c.same_dtype(y, x, "output")
        bs = int(c.op.options.get("block_size", 0))
        if bs <= 0:
            raise c.fail("option-value", f"block_size {bs} must be positive")
        n, h, w, ch = x.shape
        if h % bs or w % bs:
            raise c.fail("block-size", f"{h}x{w} does not divide by {bs}")
        c.output_shape((n, h // bs, w // bs, ch * bs * bs))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        bs = int(ctx.options["block_size"])
        n, h, w, c = x.shape
        y = x.reshape(n, h // bs, bs, w // bs, bs, c).transpose(0, 1, 3, 2, 4, 5)
        return [y.reshape(n, h // bs, w // bs, c * bs * bs)]


def _block_operands(c: Check, what: str) -> tuple[list[int], list[int]] | None:
    """SPACE_TO_BATCH_ND's and BATCH_TO_SPACE_ND's common rules (space_to_batch_nd.cc,
    batch_to_space_nd.cc): an input of rank 3 or 4 and the output of its type, quantized as
    it (an int16 one with zero point 0); an int32 block shape of one value per spatial
    dimension (rank - 2) and int32 paddings or crops of shape [rank - 2, 2]. Returns (block
    shape, paddings or crops flattened), None where they are not constants."""
    x, block_t, pads_t, y = c.input(0), c.input(1), c.input(2), c.output()
    c.rank(x, 3, 4, "input")
    c.same_dtype(y, x, "output")
    if x.type_name in QUANTIZED:
        _same_quantization(c, y, x, "output")
        q = x.quantization
        if x.type_name == "int16" and q is not None and int(q.zero_point[0]) != 0:
            raise c.fail("zero-point", f"int16 input {x.name!r} has zero point {q.zero_point[0]}")
    m = len(x.shape) - 2
    if block_t.shape != (m,):
        raise c.fail("block-shape", f"block shape {list(block_t.shape)}: expected [{m}]")
    if pads_t.shape != (m, 2):
        raise c.fail("shape", f"{what} {list(pads_t.shape)}: expected [{m}, 2]")
    block = _ints(c, block_t, "block shape", frozenset({"int32"}))
    pads = _ints(c, pads_t, what, frozenset({"int32"}))
    if block is None or pads is None:
        return None
    if 0 in block:
        raise c.fail("block-shape", f"block shape {block} has a 0")
    if min(pads) < 0:
        raise c.fail(what, f"{what} {pads} has a negative value")
    return block, pads


def _as_4d(
    x: np.ndarray, block: list[int], pairs: list[list[int]]
) -> tuple[np.ndarray, list[int], list[list[int]]]:
    """A rank-3 input as LiteRT's kernels take it: [batch, space, 1, depth], with a block of
    1 and no padding or crop along the added dimension."""
    if x.ndim == 3:
        return x[:, :, None, :], [*block, 1], [*pairs, [0, 0]]
    return x, block, pairs


@register
class SpaceToBatchNd(_Movement):
    """TensorFlow's ``space_to_batch_nd``: the spatial dimensions padded, then each cut into
    blocks whose positions go to the batch (older TensorFlow exports write it around the
    atrous convolutions of DeepLab-style models)."""

    name = "SPACE_TO_BATCH_ND"
    versions = (1, 4)
    num_inputs = (3, 3)

    @classmethod
    def validate(cls, c: Check) -> None:
        """space_to_batch_nd.cc: `_block_operands` (paddings not negative); each padded
        spatial dimension divides by its block; the output's batch is the input's times the
        blocks."""
        super().validate(c)
        got = _block_operands(c, "paddings")
        if got is None:
            return  # sized at run time
        block, pads = got
        x = c.input(0)
        shape = [x.shape[0] * math.prod(block)]
        for i, b in enumerate(block):
            size = x.shape[i + 1] + pads[2 * i] + pads[2 * i + 1]
            if size % b:
                raise c.fail(
                    "block-shape", f"padded dimension {i + 1} ({size}) does not divide by {b}"
                )
            shape.append(size // b)
        c.output_shape((*shape, x.shape[-1]))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        """Pad (with the zero point of a quantized input: its stored zero), split each
        spatial dimension into (size / block, block), move the blocks before the batch."""
        x = required(ctx, inputs, 0)
        block = [int(v) for v in int_input(ctx, inputs, 1).reshape(-1)]
        pads = int_input(ctx, inputs, 2).reshape(-1, 2).tolist()
        q = ctx.input_tensor(0).quantization  # type: ignore[union-attr]
        fill = int(q.zero_point[0]) if q is not None and x.dtype.kind in "iu" else 0
        x4, (bh, bw), pads = _as_4d(x, block, pads)
        p = np.pad(x4, [(0, 0), *map(tuple, pads), (0, 0)], constant_values=fill)
        n, h, w, d = p.shape
        y = p.reshape(n, h // bh, bh, w // bw, bw, d).transpose(2, 4, 0, 1, 3, 5)
        return [y.reshape(ctx.output_tensor().shape)]


@register
class BatchToSpaceNd(_Movement):
    """TensorFlow's ``batch_to_space_nd``, SPACE_TO_BATCH_ND's inverse: the batch's blocks
    back into the spatial dimensions, then cropped."""

    name = "BATCH_TO_SPACE_ND"
    versions = (1, 4)
    num_inputs = (3, 3)

    @classmethod
    def validate(cls, c: Check) -> None:
        """batch_to_space_nd.cc: `_block_operands` (crops not negative); the batch divides by
        the blocks; each spatial dimension times its block less its crops."""
        super().validate(c)
        got = _block_operands(c, "crops")
        if got is None:
            return  # sized at run time
        block, crops = got
        x = c.input(0)
        batch = x.shape[0]
        shape = []
        for i, b in enumerate(block):
            if batch % b:
                raise c.fail("block-shape", f"batch {x.shape[0]} does not divide by {block}")
            batch //= b
            size = x.shape[i + 1] * b - crops[2 * i] - crops[2 * i + 1]
            if size < 0:
                raise c.fail("crops", f"crops {crops} remove more than dimension {i + 1} holds")
            shape.append(size)
        c.output_shape((batch, *shape, x.shape[-1]))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        block = [int(v) for v in int_input(ctx, inputs, 1).reshape(-1)]
        crops = int_input(ctx, inputs, 2).reshape(-1, 2).tolist()
        x4, (bh, bw), ((top, bottom), (left, right)) = _as_4d(x, block, crops)
        b, h, w, d = x4.shape
        n = b // (bh * bw)
        y = x4.reshape(bh, bw, n, h, w, d).transpose(2, 3, 0, 4, 1, 5)
        y = y.reshape(n, h * bh, w * bw, d)[:, top : h * bh - bottom, left : w * bw - right]
        return [np.ascontiguousarray(y).reshape(ctx.output_tensor().shape)]


@register
class Bitcast(_Movement):
    """The bytes of the input read as the output's type (``tf.bitcast``; bitcast.cc): to a
    narrower type a last dimension of the ratio is added, to a wider one the last dimension
    (of the ratio) goes."""

    name = "BITCAST"
    num_inputs = (1, 1)
    copies_values = False

    @classmethod
    def validate(cls, c: Check) -> None:
        super().validate(c)
        x, y = c.input(0), c.output()
        if x.dtype.kind in "OV" or y.dtype.kind in "OV" or x.int4 or y.int4:
            raise c.fail("dtype", f"bitcast of {x.type_name} to {y.type_name}")
        a, b = x.dtype.itemsize, y.dtype.itemsize
        if a > b:
            c.output_shape((*x.shape, a // b))
        elif a < b:
            if not x.shape or x.shape[-1] != b // a:
                raise c.fail(
                    "shape",
                    f"input {list(x.shape)}: {x.type_name} to {y.type_name} needs a last "
                    f"dimension of {b // a}",
                )
            c.output_shape(x.shape[:-1])
        else:
            c.output_shape(x.shape)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = np.ascontiguousarray(required(ctx, inputs, 0))
        out = ctx.output_tensor()
        return [x.view(out.dtype).reshape(out.shape)]


@register
class Pack(_Movement):
    name = "PACK"
    int32_data = True
    gpu_extended = True
    versions = (1, 5)

    @classmethod
    def validate(cls, c: Check) -> None:
        """pack.cc: ``values_count`` inputs of one type and shape, 0 <= axis <= rank (a
        negative axis counts from the output's rank), quantized as the output."""
        super().validate(c)
        n = len(c.op.inputs)
        count = int(c.op.options.get("values_count", 0))
        c.count("inputs", n, count, count)
        x, y = c.input(0), c.output()
        rank = len(x.shape)
        axis = int(c.op.options.get("axis", 0))
        if axis < 0:
            axis += rank + 1
        if not 0 <= axis <= rank:
            raise c.fail("axis", f"axis {axis} is out of range for rank {rank} + 1")
        c.same_dtype(y, x, "output")
        for i in range(n):
            t = c.input(i)
            c.same_dtype(t, x, f"input {i}", "input 0")
            c.same_shape(t, x, f"input {i}", "input 0")
            if x.type_name in QUANTIZED:
                _same_quantization(c, t, y, f"input {i}")
        c.output_shape((*x.shape[:axis], n, *x.shape[axis:]))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        xs = [x for x in inputs if x is not None]
        return [np.stack(xs, axis=int(ctx.options.get("axis", 0)))]


@register
class Unpack(_Movement):
    name = "UNPACK"
    int32_data = True
    gpu_extended = True
    versions = (1, 6)
    num_inputs = (1, 1)
    num_outputs = None

    @classmethod
    def validate(cls, c: Check) -> None:
        """unpack.cc: ``num`` outputs, the size of the axis, of the input's type."""
        super().validate(c)
        x = c.input(0)
        rank = len(x.shape)
        axis = int(c.op.options.get("axis", 0))
        if axis < 0:
            axis += rank
        if x.size == 0 or not 0 <= axis < rank:
            raise c.fail("axis", f"axis {axis} of an input {list(x.shape)}")
        num = int(c.op.options.get("num", 0))
        c.count("outputs", len(c.op.outputs), num, num)
        if num != x.shape[axis]:
            raise c.fail("option-value", f"num {num} is not dimension {axis} ({x.shape[axis]})")
        shape = x.shape[:axis] + x.shape[axis + 1 :]
        for i in range(num):
            c.same_dtype(c.output(i), x, f"output {i}")
            if x.type_name in QUANTIZED:
                _same_quantization(c, c.output(i), x, f"output {i}")
            c.output_shape(shape, i)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        axis = int(ctx.options.get("axis", 0))
        if x.shape[axis] != len(ctx.op.outputs):  # (unpack.cc: NumOutputs == the axis' size)
            raise ctx.fail(
                f"input of shape {list(x.shape)} has {x.shape[axis]} slices along axis "
                f"{axis}, the op {len(ctx.op.outputs)} outputs"
            )
        return [np.take(x, i, axis=axis) for i in range(x.shape[axis])]


@register
class Tile(_Movement):
    name = "TILE"
    int32_data = True
    gpu_extended = True
    gpu_constants = {1: "multiples"}
    versions = (1, 3)
    num_inputs = (2, 2)

    @classmethod
    def validate(cls, c: Check) -> None:
        """tile.cc: one multiple (int32 or int64) per input dimension."""
        super().validate(c)
        x, m_t, y = c.input(0), c.input(1), c.output()
        c.same_dtype(y, x, "output")
        if m_t.size != len(x.shape):
            raise c.fail("multiples", f"{m_t.size} multiples for rank {len(x.shape)}")
        mult = _ints(c, m_t, "multiples")
        if mult is None:
            return
        if min(mult, default=0) < 0:
            raise c.fail("multiples", f"multiples {mult} must not be negative")
        c.output_shape(tuple(d * m for d, m in zip(x.shape, mult, strict=True)))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        return [np.tile(required(ctx, inputs, 0), tuple(int_input(ctx, inputs, 1).reshape(-1)))]


@register
class BroadcastTo(_Movement):
    name = "BROADCAST_TO"
    int32_data = True
    gpu_extended = True
    gpu_constants = {1: "shape"}
    versions = (2, 4)
    num_inputs = (2, 2)

    @classmethod
    def validate(cls, c: Check) -> None:
        """broadcast_to.cc: a rank-1 int32/int64 shape of at least the input's rank (up to
        8) to which the input broadcasts."""
        super().validate(c)
        x, shape_t, y = c.input(0), c.input(1), c.output()
        c.same_dtype(y, x, "output")
        c.rank(shape_t, 1, None, "shape")
        shape = _ints(c, shape_t, "shape")
        if shape is None:
            return
        if not len(x.shape) <= len(shape) <= 8:
            raise c.fail("shape", f"shape {shape} for an input of rank {len(x.shape)}")
        tail = shape[len(shape) - len(x.shape) :]
        if any(d != 1 and d != s for d, s in zip(x.shape, tail, strict=True)):
            raise c.fail("broadcast", f"input {list(x.shape)} does not broadcast to {shape}")
        c.output_shape(tuple(shape))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        shape = tuple(int(s) for s in int_input(ctx, inputs, 1).reshape(-1))
        return [np.broadcast_to(required(ctx, inputs, 0), shape).copy()]


@register
class Shape(_Movement):
    name = "SHAPE"
    quant_aware = True  # returns dimensions, never values
    copies_values = False
    num_inputs = (1, 1)

    @classmethod
    def validate(cls, c: Check) -> None:
        """shape.cc: an int32 or int64 output of the input's rank."""
        super().validate(c)
        x = c.input(0)
        out_type = int(c.op.options.get("out_type", 0))
        if out_type not in _INDEX_TENSOR_TYPES:
            raise c.fail("option-value", f"out_type {out_type} is neither INT32 nor INT64")
        c.output_dtype(np.dtype(_INDEX_TENSOR_TYPES[out_type]))
        c.output_shape((len(x.shape),))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        return [np.asarray(x.shape, dtype=ctx.output_tensor().dtype)]


# -- StableHLO's scatter ---------------------------------------------------------------------


@register
class StablehloScatter(OpDef):
    """StableHLO's scatter (CPU only): a copy of the operand, into which each element of
    ``updates`` is combined at the position its index vector and window position name.
    litert-torch writes PyTorch's F.fold and index_put / scatter_add with it (timm's VOLO)."""

    name = "STABLEHLO_SCATTER"
    versions = (1, 1)
    num_inputs = (3, 3)
    quant_aware = True  # LiteRT combines the stored values, as they are

    @classmethod
    def validate(cls, c: Check) -> None:
        """stablehlo_scatter.cc: updates of the operand's type, int32/int64 indices, an
        update region LiteRT takes (none: replace; one ADD, MUL, MAXIMUM or MINIMUM, builtin
        or StableHLO: litert-torch writes a builtin ADD, which LiteRT's kernel refuses, and
        litekiln runs as the add it is); the window and scatter dimensions consistent with
        the ranks."""
        from litekiln.ops.pool import region_reduction

        super().validate(c)
        x, idx, upd, y = c.input(0), c.input(1), c.input(2), c.output()
        c.dtype(x, _ANY - {"bool"}, "operand")
        c.dtype(idx, _INDEX_TYPES, "scatter indices")
        c.same_dtype(upd, x, "updates", "operand")
        c.same_dtype(y, x, "output", "operand")
        o = c.op.options
        index = int(o.get("update_computation_subgraph_index", 0))
        kind = region_reduction(c.graph, index)
        if kind not in ("update", "add", "mul", "max", "min"):
            raise c.fail(
                "body",
                f"update region {index} is not one ADD, MUL, MAXIMUM or MINIMUM (nor empty)",
            )
        window = [int(d) for d in o.get("update_window_dims") or ()]
        inserted = [int(d) for d in o.get("inserted_window_dims") or ()]
        to_operand = [int(d) for d in o.get("scatter_dims_to_operand_dims") or ()]
        ivd = int(o.get("index_vector_dim", 0))
        rank, urank, irank = len(x.shape), len(upd.shape), len(idx.shape)
        vector = idx.shape[ivd] if ivd < irank else 1
        if (
            len(window) + len(inserted) != rank
            or any(not 0 <= d < urank for d in window)
            or any(not 0 <= d < rank for d in [*inserted, *to_operand])
            or not 0 <= ivd <= irank
            or len(to_operand) != vector
            or urank - len(window) != irank - (1 if ivd < irank else 0)
        ):
            raise c.fail(
                "dimensions",
                f"update_window_dims {window}, inserted_window_dims {inserted}, "
                f"scatter_dims_to_operand_dims {to_operand} and index_vector_dim {ivd} do "
                f"not fit an operand of rank {rank}, indices {list(idx.shape)} and updates "
                f"{list(upd.shape)}",
            )
        c.output_shape(x.shape)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        """stablehlo_scatter.cc's loop, over all updates at once: each update element's
        position is its index vector (scattered to the operand's dimensions) plus its window
        position (with the inserted dimensions at 0); positions outside the operand are
        skipped; the region combines in the updates' order."""
        from litekiln.ops.pool import region_reduction

        x = np.array(required(ctx, inputs, 0), copy=True)
        idx = np.asarray(required(ctx, inputs, 1)).astype(np.int64)
        upd = np.asarray(required(ctx, inputs, 2))
        o = ctx.op.options
        window = [int(d) for d in o.get("update_window_dims") or ()]
        inserted = [int(d) for d in o.get("inserted_window_dims") or ()]
        to_operand = [int(d) for d in o.get("scatter_dims_to_operand_dims") or ()]
        ivd = int(o.get("index_vector_dim", 0))
        if upd.size == 0 or x.size == 0:
            return [x]
        grid = np.indices(upd.shape).reshape(upd.ndim, -1)
        scatter_dims = [d for d in range(upd.ndim) if d not in window]
        vectors = np.moveaxis(idx, ivd, -1) if ivd < idx.ndim else idx[..., None]
        start = vectors[tuple(grid[scatter_dims])]  # [updates, index vector]
        where = np.zeros((x.ndim, grid.shape[1]), np.int64)
        for i, d in enumerate(to_operand):
            where[d] += start[:, i]
        kept = [d for d in range(x.ndim) if d not in inserted]  # (window dims, in order)
        for d, w in zip(kept, window, strict=True):
            where[d] += grid[w]
        inside = np.all((where >= 0) & (where < np.asarray(x.shape)[:, None]), axis=0)
        at = tuple(where[:, inside])
        values = upd.reshape(-1)[inside]
        kind = region_reduction(ctx.graph, int(o.get("update_computation_subgraph_index", 0)))
        if kind == "update":
            x[at] = values  # (numpy assigns in order: the last update of a position wins)
        else:
            ufunc = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}
            ufunc[kind or "add"].at(x, at, values)
        return [x]
