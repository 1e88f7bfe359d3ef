"""Indexed writes, segments and diagonals, on the CPU: DYNAMIC_UPDATE_SLICE, SCATTER_ND,
SEGMENT_SUM, UNSORTED_SEGMENT_SUM/PROD/MAX/MIN, BUCKETIZE, MATRIX_DIAG, MATRIX_SET_DIAG and
REVERSE_SEQUENCE.

Converters write them for state updates (a generative model's key-value cache: litert-torch
updates it with DYNAMIC_UPDATE_SLICE), sparse features (SCATTER_ND, the segment sums of an
embedding bag), feature bucketing and sequence models. Their outputs are whole tensors
indexed by values computed at run time, so they run on the CPU (the numpy reference); with
constant inputs they fold at load.

Each reference follows its LiteRT kernel (tflite/kernels/<name>.cc), including what it refuses.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from litekiln.model.ir import Op
from litekiln.ops.base import Check, OpContext, OpDef, as_planned, register, required

_INDEX_TYPES = frozenset({"int32", "int64"})


@register
class DynamicUpdateSlice(OpDef):
    """The operand with ``update`` written at ``start_indices``, clamped so that the update
    fits (``dynamic_update_slice.cc``)."""

    name = "DYNAMIC_UPDATE_SLICE"
    gpu_extended = True
    gpu_limits = "int64 start indices computed at run time on the CPU"
    runtime_indices = {2: "start indices"}  # (clamped, as LiteRT clamps them)
    versions = (1, 6)
    num_inputs = (3, 3)
    quant_aware = True  # the stored values, copied
    copies_values = True

    @classmethod
    def integer_operands(cls, op: Op) -> set[int]:
        return {op.inputs[2]}  # (constant start indices: read at compile time)

    @classmethod
    def validate(cls, c: Check) -> None:
        """An update of the operand's type and rank, no dimension larger than the operand's;
        int32/int64 start indices, one per dimension; the output the operand's shape."""
        super().validate(c)
        x, upd, start = c.input(0), c.input(1), c.input(2)
        c.same_dtype(upd, x, "update", "operand")
        c.same_dtype(c.output(), x, "output", "operand")
        c.dtype(start, _INDEX_TYPES, "start indices")
        if len(upd.shape) != len(x.shape) or any(
            u > d for u, d in zip(upd.shape, x.shape, strict=True)
        ):
            raise c.fail(
                "shape",
                f"update {list(upd.shape)} does not fit in the operand {list(x.shape)}",
            )
        if start.shape != (len(x.shape),):
            raise c.fail(
                "shape",
                f"start indices {list(start.shape)}: one per dimension of the operand needed",
            )
        c.output_shape(x.shape)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = np.array(required(ctx, inputs, 0), copy=True)
        upd = np.asarray(required(ctx, inputs, 1))
        start = np.asarray(required(ctx, inputs, 2)).astype(np.int64).reshape(-1)
        at = [min(max(0, int(s)), d - u) for s, d, u in zip(start, x.shape, upd.shape, strict=True)]
        x[tuple(slice(a, a + u) for a, u in zip(at, upd.shape, strict=True))] = upd
        return [x]


@register
class SparseToDense(OpDef):
    """``default_value`` everywhere but at ``indices``, which take ``values`` (one each, or
    the one scalar), later indices over earlier ones (``sparse_to_dense.cc``; an index
    outside the output is an error)."""

    name = "SPARSE_TO_DENSE"
    versions = (1, 3)
    num_inputs = (4, 4)
    quant_aware = True  # the stored values, placed
    copies_values = True

    @classmethod
    def validate(cls, c: Check) -> None:
        """int32/int64 indices of rank 0-2 (rank 2: [n, output rank]); a rank-1 int32/int64
        output shape of at most 4 dimensions; values of rank 0-1 (one per index unless a
        scalar) and a one-element default of one type (int32, int64, int8, uint8, float32),
        the output that type."""
        super().validate(c)
        idx, shape_t, values, default = (c.input(i) for i in range(4))
        c.dtype(idx, _INDEX_TYPES, "indices")
        c.dtype(shape_t, _INDEX_TYPES, "output shape")
        c.dtype(values, frozenset({"int32", "int64", "int8", "uint8", "float32"}), "values")
        c.same_dtype(default, values, "default value", "values")
        c.rank(idx, 0, 2, "indices")
        c.rank(shape_t, 1, None, "output shape")
        c.rank(values, 0, 1, "values")
        if default.size != 1:
            raise c.fail("shape", f"default value {list(default.shape)}: one value needed")
        n = idx.shape[0] if len(idx.shape) == 2 else idx.size
        dims = 1 if len(idx.shape) < 2 else idx.shape[1]
        if shape_t.shape[0] != dims or shape_t.shape[0] > 4 or (values.shape and values.size != n):
            raise c.fail(
                "shape",
                f"indices {list(idx.shape)}, output shape {list(shape_t.shape)} and values "
                f"{list(values.shape)} do not fit one another (at most 4 output dimensions)",
            )
        c.output_dtype(values.dtype)
        if shape_t.data is None:
            return  # sized at run time
        c.output_shape(tuple(int(v) for v in np.asarray(shape_t.data).reshape(-1)))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        idx = np.asarray(required(ctx, inputs, 0)).astype(np.int64)
        shape = tuple(int(v) for v in np.asarray(required(ctx, inputs, 1)).reshape(-1))
        values = np.asarray(required(ctx, inputs, 2))
        default = np.asarray(required(ctx, inputs, 3)).reshape(-1)[0]
        rows = idx.reshape(-1, 1) if idx.ndim < 2 else idx
        if rows.size and ((rows < 0).any() or (rows >= np.asarray(shape)).any()):
            raise ctx.fail(f"an index is outside the output's {list(shape)}")
        y = np.full(shape, default, values.dtype)
        vals = np.broadcast_to(values.reshape(-1)[:1] if values.ndim == 0 else values,
                               (rows.shape[0],))  # fmt: skip
        for r, v in zip(rows.tolist(), vals.tolist(), strict=True):  # (later ones win)
            y[tuple(r)] = v
        return [as_planned(ctx, y)]


@register
class ScatterNd(OpDef):
    """Zeros of ``shape`` with each update added at its index (``scatter_nd.cc``:
    repeated indices add up; an index outside the shape is an error)."""

    name = "SCATTER_ND"
    num_inputs = (3, 3)
    quant_aware = True  # the stored values, summed as the kernel sums them

    @classmethod
    def validate(cls, c: Check) -> None:
        """int32/int64 indices of rank >= 1 whose last dimension indexes the output's
        leading dimensions; updates of float32, int8/32/64, uint8 or bool, shaped as the
        indices' leading dimensions and the output's remaining ones; a rank-1 shape of the
        indices' type, the output that shape and the updates' type."""
        super().validate(c)
        idx, upd, shape_t = c.input(0), c.input(1), c.input(2)
        c.dtype(idx, _INDEX_TYPES, "indices")
        c.dtype(upd, frozenset({"float32", "uint8", "bool", "int8", "int64", "int32"}), "updates")
        c.same_dtype(shape_t, idx, "shape", "indices")
        c.rank(shape_t, 1, None, "shape")
        c.output_dtype(upd.dtype)
        if shape_t.data is None:
            return  # sized at run time
        shape = [int(v) for v in np.asarray(shape_t.data).reshape(-1)]
        if not idx.shape or any(d < 0 for d in shape):
            raise c.fail("shape", f"indices {list(idx.shape)} or shape {shape} unusable")
        k = idx.shape[-1]
        want = (*idx.shape[:-1], *shape[k:])
        if k > len(shape) or upd.shape != want:
            raise c.fail(
                "shape",
                f"updates {list(upd.shape)} for indices {list(idx.shape)} into {shape}: "
                f"expected {list(want)}",
            )
        c.output_shape(tuple(shape))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        idx = np.asarray(required(ctx, inputs, 0)).astype(np.int64)
        upd = np.asarray(required(ctx, inputs, 1))
        shape = tuple(int(v) for v in np.asarray(required(ctx, inputs, 2)).reshape(-1))
        k = idx.shape[-1]
        flat = idx.reshape(-1, k)
        if flat.size and ((flat < 0).any() or (flat >= np.asarray(shape[:k])).any()):
            raise ctx.fail(f"an index is outside the output's {list(shape[:k])}")
        y = np.zeros(shape, upd.dtype)
        rows = upd.reshape(flat.shape[0], *shape[k:])
        if upd.dtype == np.bool_:  # (the kernel's sum of bools is an OR)
            np.logical_or.at(y, tuple(flat.T), rows)
        else:
            np.add.at(y, tuple(flat.T), rows)
        return [as_planned(ctx, y)]


class _Segments(OpDef):
    """UNSORTED_SEGMENT_*: the data's rows (over the leading dimensions that the segment ids
    cover) combined per id into ``num_segments`` outputs, starting from ``initial``;
    negative ids are skipped (``unsorted_segment.cc``)."""

    num_inputs = (3, 3)
    ufunc: ClassVar[np.ufunc]

    @classmethod
    def validate(cls, c: Check) -> None:
        """int32 or float32 data; int32 segment ids whose shape leads the data's; an int32
        num_segments of one element, not negative, above every id; the output
        [num_segments, the data's dimensions after the ids']."""
        super().validate(c)
        x, ids, n_t = c.input(0), c.input(1), c.input(2)
        c.dtype(x, frozenset({"int32", "float32"}), "data")
        c.dtype(ids, frozenset({"int32"}), "segment ids")
        c.dtype(n_t, frozenset({"int32"}), "num_segments")
        c.same_dtype(c.output(), x, "output", "data")
        if len(ids.shape) > len(x.shape) or x.shape[: len(ids.shape)] != ids.shape:
            raise c.fail(
                "shape", f"segment ids {list(ids.shape)} do not lead the data {list(x.shape)}"
            )
        if n_t.size != 1 or len(n_t.shape) > 1:
            raise c.fail("shape", f"num_segments {list(n_t.shape)} is not one value")
        if n_t.data is None:
            return  # sized at run time
        n = int(np.asarray(n_t.data).reshape(-1)[0])
        if n < 0:
            raise c.fail("num-segments", f"num_segments {n} is negative")
        if ids.data is not None and ids.size and int(np.max(ids.data)) >= n:
            raise c.fail("segment-ids", f"a segment id is {int(np.max(ids.data))}, of {n}")
        c.output_shape((n, *x.shape[len(ids.shape) :]))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = np.asarray(required(ctx, inputs, 0))
        ids = np.asarray(required(ctx, inputs, 1)).astype(np.int64).reshape(-1)
        n = int(np.asarray(required(ctx, inputs, 2)).reshape(-1)[0])
        if ids.size and int(ids.max()) >= n:
            raise ctx.fail(f"a segment id is {int(ids.max())}, of {n} segments")
        rest = x.shape[len(ctx.input_tensor(1).shape) :]  # type: ignore[union-attr]
        rows = x.reshape(ids.size, *rest)
        y = np.full((n, *rest), _initial(cls.ufunc, x.dtype), x.dtype)
        keep = ids >= 0
        cls.ufunc.at(y, ids[keep], rows[keep])
        return [as_planned(ctx, y)]


def _initial(ufunc: np.ufunc, dtype: np.dtype) -> float | int:
    """Each segment's start (``Op<T>::kInitialValue``): the sum's 0 and the product's 1 (the
    ufuncs' identities), the lowest value for the maximum, the highest for the minimum."""
    if ufunc.identity is not None:
        return int(ufunc.identity)
    if dtype.kind == "f":
        fi = np.finfo(dtype)
        return float(fi.min if ufunc is np.maximum else fi.max)
    ii = np.iinfo(dtype)
    return int(ii.min if ufunc is np.maximum else ii.max)


@register
class UnsortedSegmentSum(_Segments):
    name = "UNSORTED_SEGMENT_SUM"
    ufunc = np.add


@register
class UnsortedSegmentProd(_Segments):
    name = "UNSORTED_SEGMENT_PROD"
    ufunc = np.multiply


@register
class UnsortedSegmentMax(_Segments):
    name = "UNSORTED_SEGMENT_MAX"
    ufunc = np.maximum


@register
class UnsortedSegmentMin(_Segments):
    name = "UNSORTED_SEGMENT_MIN"
    ufunc = np.minimum


@register
class SegmentSum(OpDef):
    """The data's rows summed per sorted segment id (``segment_sum.cc``: ids starting at 0,
    each the previous or one more; the output has the largest id + 1 rows)."""

    name = "SEGMENT_SUM"
    num_inputs = (2, 2)

    @classmethod
    def validate(cls, c: Check) -> None:
        super().validate(c)
        x, ids = c.input(0), c.input(1)
        c.dtype(x, frozenset({"int32", "float32"}), "data")
        c.dtype(ids, frozenset({"int32"}), "segment ids")
        c.same_dtype(c.output(), x, "output", "data")
        c.rank(x, 1, 8, "data")
        c.rank(ids, 1, None, "segment ids")
        if ids.shape[0] != x.shape[0]:
            raise c.fail("shape", f"{ids.shape[0]} segment ids for {x.shape[0]} rows")
        if ids.data is None:
            return  # sized at run time
        last = _sorted_ids(c.fail, np.asarray(ids.data).reshape(-1))
        c.output_shape((last + 1, *x.shape[1:]))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = np.asarray(required(ctx, inputs, 0))
        ids = np.asarray(required(ctx, inputs, 1)).reshape(-1)
        last = _sorted_ids(lambda _r, m: ctx.fail(m), ids)
        y = np.zeros((last + 1, *x.shape[1:]), x.dtype)
        np.add.at(y, ids.astype(np.int64), x)
        return [as_planned(ctx, y)]


def _sorted_ids(fail, ids: np.ndarray) -> int:  # noqa: ANN001
    """segment_sum.cc's ValidateSegmentIds: the largest id (-1 for none)."""
    if not ids.size:
        return -1
    steps = np.diff(ids.astype(np.int64))
    if int(ids[0]) != 0 or ((steps != 0) & (steps != 1)).any():
        raise fail("segment-ids", "segment ids must start at 0 and grow by 0 or 1")
    return int(ids[-1])


@register
class Bucketize(OpDef):
    """The index of each value's bucket among sorted ``boundaries``: how many boundaries are
    at or below it (``bucketize.cc``: upper_bound)."""

    name = "BUCKETIZE"
    num_inputs = (1, 1)

    @classmethod
    def validate(cls, c: Check) -> None:
        """float32, float64, int32 or int64 input; sorted boundaries; an int32 output."""
        super().validate(c)
        x = c.input(0)
        c.dtype(x, frozenset({"float32", "float64", "int32", "int64"}), "input")
        b = np.asarray(c.op.options.get("boundaries") or [], np.float32)
        if (np.diff(b) < 0).any():
            raise c.fail("option-value", "boundaries are not sorted")
        c.output_dtype(np.dtype(np.int32))
        c.output_shape(x.shape)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = np.asarray(required(ctx, inputs, 0))
        b = np.asarray(ctx.options.get("boundaries") or [], np.float32)
        # (the kernel compares each value, as its type, with the float boundaries)
        return [np.searchsorted(b, x, side="right").astype(np.int32)]


_DIAG_TYPES = frozenset({"float32", "int64", "int32", "int16", "int8", "uint8"})


@register
class MatrixDiag(OpDef):
    """Square matrices with the input's last dimension on their diagonals (``matrix_diag.cc``)."""

    name = "MATRIX_DIAG"
    num_inputs = (1, 1)
    quant_aware = True
    copies_values = True

    @classmethod
    def validate(cls, c: Check) -> None:
        super().validate(c)
        x = c.input(0)
        c.dtype(x, _DIAG_TYPES, "input")
        c.rank(x, 1, 7, "input")
        c.same_dtype(c.output(), x, "output")
        c.output_shape((*x.shape, x.shape[-1]))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = np.asarray(required(ctx, inputs, 0))
        n = x.shape[-1]
        y = np.zeros((*x.shape, n), x.dtype)
        i = np.arange(n)
        y[..., i, i] = x
        return [y]


@register
class MatrixSetDiag(OpDef):
    """The input's matrices with their main diagonals replaced (``matrix_set_diag.cc``)."""

    name = "MATRIX_SET_DIAG"
    num_inputs = (2, 2)
    quant_aware = True
    copies_values = True

    @classmethod
    def validate(cls, c: Check) -> None:
        """A matrix input of rank >= 2 and a diagonal of its type, shaped as its leading
        dimensions and the shorter side; the output the input's shape."""
        super().validate(c)
        x, d = c.input(0), c.input(1)
        c.dtype(x, _DIAG_TYPES, "input")
        c.rank(x, 2, 8, "input")
        c.same_dtype(d, x, "diagonal")
        c.same_dtype(c.output(), x, "output")
        want = (*x.shape[:-2], min(x.shape[-2:]))
        if d.shape != want:
            raise c.fail("shape", f"diagonal {list(d.shape)}: expected {list(want)}")
        c.output_shape(x.shape)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        y = np.array(required(ctx, inputs, 0), copy=True)
        d = np.asarray(required(ctx, inputs, 1))
        i = np.arange(d.shape[-1])
        y[..., i, i] = d
        return [y]


@register
class ReverseSequence(OpDef):
    """Each batch entry's first ``seq_lengths[b]`` elements along ``seq_dim`` reversed
    (``reverse_sequence.cc``); the rest kept."""

    name = "REVERSE_SEQUENCE"
    num_inputs = (2, 2)
    quant_aware = True
    copies_values = True

    @classmethod
    def validate(cls, c: Check) -> None:
        """int32, float32, uint8, int16 or int64 input; int32/int64 lengths, one per batch
        entry; distinct non-negative seq_dim and batch_dim within the input's rank."""
        super().validate(c)
        x, lengths = c.input(0), c.input(1)
        c.dtype(x, frozenset({"int32", "float32", "uint8", "int16", "int64"}), "input")
        c.dtype(lengths, _INDEX_TYPES, "seq_lengths")
        c.rank(lengths, 1, None, "seq_lengths")
        c.same_dtype(c.output(), x, "output")
        seq, batch = (int(c.op.options.get(k, 0)) for k in ("seq_dim", "batch_dim"))
        rank = len(x.shape)
        if not (0 <= seq < rank and 0 <= batch < rank and seq != batch):
            raise c.fail("option-value", f"seq_dim {seq} and batch_dim {batch} for rank {rank}")
        if lengths.shape[0] != x.shape[batch]:
            raise c.fail(
                "shape", f"{lengths.shape[0]} lengths for a batch dimension of {x.shape[batch]}"
            )
        if lengths.data is not None:
            _lengths(c.fail, np.asarray(lengths.data), x.shape[seq])
        c.output_shape(x.shape)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = np.asarray(required(ctx, inputs, 0))
        seq, batch = (int(ctx.options.get(k, 0)) for k in ("seq_dim", "batch_dim"))
        lengths = np.asarray(required(ctx, inputs, 1)).reshape(-1)
        _lengths(lambda _r, m: ctx.fail(m), lengths, x.shape[seq])
        y = np.array(x, copy=True)
        for b, n in enumerate(lengths.tolist()):
            at: list[slice | int] = [slice(None)] * x.ndim
            at[batch] = b
            at[seq] = slice(0, int(n))
            y[tuple(at)] = np.flip(x[tuple(at)], axis=seq - (1 if batch < seq else 0))
        return [y]


def _lengths(fail, lengths: np.ndarray, size: int) -> None:  # noqa: ANN001
    """reverse_sequence.cc: each length within 0 .. the sequence dimension."""
    if lengths.size and (int(lengths.min()) < 0 or int(lengths.max()) > size):
        raise fail("seq-lengths", f"seq_lengths {lengths.tolist()} outside 0..{size}")
