"""Matrix ops: BATCH_MATMUL.

``BATCH_MATMUL`` multiplies the last two dimensions of its operands (each optionally
transposed first: ``adj_x``, ``adj_y``) and broadcasts the leading (batch) dimensions with
numpy's rules; operands of rank 2 to 5. Types, as LiteRT's kernel (batch_matmul.cc) takes
them: float32 x float32, int8 x int8 (int8 or int32 output), int16 x int16 and int16 x int8
(int16 output, zero points 0), and the hybrid float32 x int8 (float output, the LHS quantized
row by row on the fly).
"""

from __future__ import annotations

import numpy as np

from litekiln.model.ir import Op, Subgraph, Tensor
from litekiln.ops import qmath
from litekiln.ops.base import (
    Check,
    OpContext,
    OpDef,
    is_quantized,
    register,
    required,
)

_TYPES = frozenset({"float32", "int8", "int16"})
#: (LHS, RHS) type pairs the kernel runs; anything else is refused in its Prepare.
_PAIRS = {
    ("float32", "float32"),
    ("float32", "int8"),
    ("int8", "int8"),
    ("int16", "int16"),
    ("int16", "int8"),
}


def _matrices(x: np.ndarray, adj: bool) -> np.ndarray:
    """``x`` with its last two dimensions swapped when ``adj``."""
    return np.swapaxes(x, -1, -2) if adj else x


def _batch_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """The broadcast batch dimensions of two operand shapes (as LiteRT's ResizeOutputTensor
    forms them), None if they do not broadcast."""
    n = max(len(a), len(b)) - 2
    ea = (1,) * (n - len(a) + 2) + a[:-2]
    eb = (1,) * (n - len(b) + 2) + b[:-2]
    out = []
    for da, db in zip(ea, eb, strict=True):
        if da != db and da != 1 and db != 1:
            return None
        out.append(db if da == 1 and da != db else da)
    return tuple(out)


@register
class BatchMatMul(OpDef):
    name = "BATCH_MATMUL"
    gpu_extended = True
    # v2 (int8), v3 (int16) and v4 (hybrid with asymmetric input quantization) only add types:
    # the GPU path takes the quantized ones through the float view (int16 and the hybrid
    # weights included); integer outputs without quantization stay on the CPU (the base).
    versions = (1, 4)
    num_inputs = (2, 2)

    @classmethod
    def validate(cls, c: Check) -> None:
        """batch_matmul.cc: operands of rank 2-5 whose batch dimensions broadcast and whose
        inner dimensions agree (after ``adj_x``/``adj_y``); float32, int8 or int16 operands
        paired as the kernel runs them, the output of the type it writes; quantized
        operands and output with usable per-tensor parameters (int16: zero points 0), the
        hybrid's weights per-tensor or per output column."""
        super().validate(c)
        x, w, y = c.input(0), c.input(1), c.output()
        c.dtype(x, _TYPES, "LHS")
        c.dtype(w, _TYPES, "RHS")
        pair = (x.type_name, w.type_name)
        if pair not in _PAIRS:
            raise c.fail(
                "dtype-mismatch",
                f"LHS {x.name!r} ({pair[0]}) and RHS {w.name!r} ({pair[1]}): the kernel runs "
                "float32 x float32, float32 x int8 (hybrid), int8 x int8, int16 x int16 and "
                "int16 x int8",
            )
        c.rank(x, 2, 5, "LHS")
        c.rank(w, 2, 5, "RHS")
        adj_x, adj_y = bool(c.op.options.get("adj_x")), bool(c.op.options.get("adj_y"))
        if pair[0] == "float32":
            c.dtype(y, frozenset({"float32"}), "output")
        elif pair == ("int8", "int8"):
            c.dtype(y, frozenset({"int8", "int32"}), "output")
        else:
            c.dtype(y, frozenset({"int16"}), "output")
        if pair[1] == "int8" and pair[0] == "float32":
            c.quantized(w, "RHS", per_tensor=False)
            q = w.quantization
            assert q is not None
            column = len(w.shape) - (2 if adj_y else 1)
            if q.scale.size > 1 and q.axis != column:
                raise c.fail(
                    "quantization-axis",
                    f"RHS {w.name!r} is quantized per channel along dimension {q.axis}: the "
                    f"hybrid kernel reads one scale per output column (dimension {column})",
                )
        elif pair[0] != "float32" and y.type_name != "int32":
            for t, role in ((x, "LHS"), (w, "RHS"), (y, "output")):
                c.quantized(t, role)
                if pair[0] == "int16":
                    c.zero_point(t, 0, role)
        batch = _batch_shape(x.shape, w.shape)
        if batch is None:
            raise c.fail(
                "broadcast",
                f"batch dimensions of LHS {list(x.shape)} and RHS {list(w.shape)} do not broadcast",
            )
        depth_x = x.shape[-2] if adj_x else x.shape[-1]
        depth_w = w.shape[-1] if adj_y else w.shape[-2]
        if depth_x != depth_w:
            raise c.fail(
                "matmul-depth",
                f"LHS {list(x.shape)} (adj_x={adj_x}) and RHS {list(w.shape)} (adj_y={adj_y}) "
                f"have inner dimensions {depth_x} and {depth_w}",
            )
        rows = x.shape[-1] if adj_x else x.shape[-2]
        cols = w.shape[-2] if adj_y else w.shape[-1]
        c.output_shape((*batch, rows, cols))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x, w = required(ctx, inputs, 0), required(ctx, inputs, 1)
        a = _matrices(x, bool(ctx.options.get("adj_x")))
        b = _matrices(w, bool(ctx.options.get("adj_y")))
        return [np.matmul(a.astype(np.float32), b.astype(np.float32))]

    @classmethod
    def reference_quantized(
        cls, ctx: OpContext, inputs: list[np.ndarray | None]
    ) -> list[np.ndarray] | None:
        """LiteRT's integer kernels (int8 x int8 -> int8 or int32, int16 x int16 and
        int16 x int8 -> int16: exact sums of the zero-centred operands, then the output
        stage of ``MultiplyByQuantizedMultiplier``) and its hybrid kernel (float32 x int8)."""
        xt, wt, yt = ctx.input_tensor(0), ctx.input_tensor(1), ctx.output_tensor()
        assert xt is not None and wt is not None
        x, w = required(ctx, inputs, 0), required(ctx, inputs, 1)
        adj_x, adj_y = bool(ctx.options.get("adj_x")), bool(ctx.options.get("adj_y"))
        if xt.dtype == np.float32:
            if not is_quantized(wt) or yt.dtype != np.float32:
                return None
            return [_hybrid(ctx, x, w, wt, adj_x, adj_y)]
        a = _matrices(x, adj_x).astype(np.int64)
        b = _matrices(w, adj_y).astype(np.int64)
        if yt.dtype == np.int32:
            # EvalInt8Int32: plain products, zero points ignored (int32 sums, wrapping).
            return [np.matmul(a, b).astype(np.int32)]
        (xs, xz), (ws, wz), (ys, yz) = (qmath.scale_zp(t) for t in (xt, wt, yt))
        acc = np.matmul(a - xz, b - wz)  # exact: int64 sums of at most 2**16 * depth terms
        real = np.float64(xs) * np.float64(ws) / np.float64(ys)
        mult, shift = qmath.quantize_multiplier(float(real))
        info = np.iinfo(yt.dtype)
        if xt.dtype == np.int16:
            # int16 sums are int64 (AccumT): the 64-bit MultiplyByQuantizedMultiplier.
            y = _multiply_by_quantized_multiplier_64(acc, mult, shift) + yz
            return [np.clip(y, info.min, info.max).astype(yt.dtype)]
        return [qmath.requantize(acc, mult, shift, yz, int(info.min), int(info.max), yt.dtype)]

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        reason = super().gpu_support(op, graph, allow_quantized=allow_quantized)
        if reason:
            return reason
        x, w = (graph.tensors[t] for t in op.inputs[:2])
        if x.dtype == np.float32 and is_quantized(w):
            xs, ws = _compressed(x.shape, w.shape, bool(op.options.get("adj_x")))
            for role, shape in (("LHS", xs), ("RHS", ws)):
                if sum(1 for d in _extended(shape)[:3] if d != 1) > 1:
                    return (
                        f"hybrid BATCH_MATMUL with several batch dimensions in its {role} "
                        f"{list(shape)}: LiteRT's hybrid kernel reads other rows' scales there, "
                        "which the CPU reference reproduces and the GPU path does not"
                    )
        return None


def _multiply_by_quantized_multiplier_64(x: np.ndarray, multiplier: int, shift: int) -> np.ndarray:
    """``MultiplyByQuantizedMultiplier(int64_t x, ...)`` (common.cc): the multiplier reduced
    to 16 bits, one rounding shift."""
    reduced = (multiplier + (1 << 15)) >> 16 if multiplier < 0x7FFF0000 else 0x7FFF
    total = 15 - shift
    return (np.asarray(x, np.int64) * reduced + (np.int64(1) << (total - 1))) >> total


def _compressed(
    xs: tuple[int, ...], ws: tuple[int, ...], adj_x: bool
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The operand shapes LiteRT's Eval multiplies: an RHS ``[..., 1, K, N]`` drops its 1 and
    the LHS ``[..., Q, M, K]`` becomes ``[..., Q * M, K]`` (not with ``adj_x``). The product
    is the same; the batch bookkeeping of the hybrid kernel is not."""
    if adj_x or len(xs) <= 2 or len(ws) <= 2 or ws[-3] != 1:
        return xs, ws
    return (*xs[:-3], xs[-3] * xs[-2], xs[-1]), (*ws[:-3], *ws[-2:])


def _broadcast_dim(a: int, b: int) -> int:
    return b if a == 1 else a


def _extended(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (1,) * (5 - len(shape)) + tuple(shape)


def _extent(shape: tuple[int, ...], axis: int) -> int:
    """``batch_matmul::extent``: the stride of a batch dimension, 0 where it broadcasts."""
    return 0 if shape[axis] == 1 else int(np.prod(shape[axis + 1 :], dtype=np.int64))


def _hybrid(
    ctx: OpContext,
    x: np.ndarray,
    w: np.ndarray,
    wt: Tensor,
    adj_x: bool,
    adj_y: bool,
) -> np.ndarray:
    """The hybrid kernel (``EvalHybrid`` and the hybrid ``reference_ops::BatchMatMul``).

    Each row of the LHS (after ``adj_x``) is quantized on its own (symmetric, or asymmetric
    with ``asymmetric_quantize_inputs``); the output is ``scale * (sum(q * w) - row_sum(w) *
    offset)`` in float32, with ``scale`` the row's scale times the weights' (per-tensor, or
    per output column). LiteRT advances the per-row scales and offsets, and the weights' row
    sums, by one matrix per batch index of *each* batch dimension, whatever the dimensions
    after it: with more than one batch dimension larger than 1 it reads other matrices'
    scales. That is what it computes, so that is what is computed here.
    """
    xs, ws = _compressed(x.shape, w.shape, adj_x)
    x, w = x.reshape(xs), w.reshape(ws)
    a = np.ascontiguousarray(_matrices(x, adj_x), np.float32)  # [..., M, K]
    # The kernel's "lhs" is the weights as [..., N, K], its "rhs" the quantized input.
    f = np.ascontiguousarray(np.swapaxes(_matrices(w, adj_y), -1, -2)).astype(np.int64)
    m, k = a.shape[-2], a.shape[-1]
    n = f.shape[-2]
    symmetric = not ctx.options.get("asymmetric_quantize_inputs", False)
    rows = a.reshape(-1, k)
    xq = np.empty(rows.shape, np.int64)
    scales = np.empty(rows.shape[0], np.float32)
    offsets = np.zeros(rows.shape[0], np.int64)
    for r, row in enumerate(rows):
        if symmetric:
            values, scale = qmath.symmetric_quantize_floats(row)
        else:
            values, scale, offsets[r] = qmath.asymmetric_quantize_floats(row)
        xq[r], scales[r] = values, scale
    wq = wt.quantization
    assert wq is not None
    per_channel = wq.scale.size > 1
    if not per_channel:
        scales = (scales * np.float32(wq.scale.reshape(-1)[0])).astype(np.float32)
    col_scales = np.asarray(wq.scale, np.float32).reshape(-1)
    # Row sums of every weight matrix of batch dimensions 1.. (as LiteRT sums them).
    fshape, ishape = _extended(f.shape), _extended((*a.shape[:-2], k, m))
    wmats = int(np.prod(fshape[1:3]))
    flat_f = f.reshape(-1, k)
    # (Only those of batch dimensions 1 and 2: the rest of LiteRT's buffer is never written.)
    row_sums = np.zeros(flat_f.shape[0], np.int64)
    row_sums[: wmats * n] = flat_f[: wmats * n].sum(axis=1)
    flat_x = xq.reshape(-1)
    dims = [_broadcast_dim(fshape[i], ishape[i]) for i in range(3)]
    f_ext = [_extent(fshape, i) for i in range(3)]
    x_ext = [_extent(ishape, i) for i in range(3)]
    ioff = [0 if e == 0 else m for e in x_ext]
    woff = [0 if e == 0 else n for e in f_ext]
    out = np.zeros((*dims, m, n), np.float32)
    for b0 in range(dims[0]):
        for b1 in range(dims[1]):
            for b2 in range(dims[2]):
                bs = (b0, b1, b2)
                fo = sum(b * e for b, e in zip(bs, f_ext, strict=True))
                xo = sum(b * e for b, e in zip(bs, x_ext, strict=True))
                io = sum(b * e for b, e in zip(bs, ioff, strict=True))
                wo = sum(b * e for b, e in zip(bs, woff, strict=True))
                fm = flat_f.reshape(-1)[fo : fo + n * k].reshape(n, k)
                xm = flat_x[xo : xo + m * k].reshape(m, k)
                total = (xm @ fm.T).astype(np.float32)  # [m, n], exact in int32
                corr = (
                    row_sums[wo : wo + n].astype(np.float32)[None, :]
                    * offsets[io : io + m].astype(np.float32)[:, None]
                )
                total = np.trunc(total - corr).astype(np.float32)
                factor = scales[io : io + m, None]
                if per_channel:
                    factor = (factor * col_scales[None, :n]).astype(np.float32)
                out[b0, b1, b2] = factor * total
    return out.reshape(ctx.output_tensor().shape)
