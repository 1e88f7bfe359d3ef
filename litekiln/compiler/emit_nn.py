"""Emitters of the convolution, pooling, binary arithmetic, resize and depth/space ops (one per
TFLite op name; the op's semantics live in its :mod:`litekiln.ops` definition). Unary math and
reductions: :mod:`litekiln.compiler.emit_math`; data movement (pad, concat, reshape,
transpose, slices): :mod:`litekiln.compiler.emit_shape`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
from tvm import relax, te, topi

from litekiln.compiler.lowering import (
    ACC_DTYPE,
    BROADCAST_BARRIER,
    EMITTERS,
    SMALL_POOL_TAPS,
    Ctx,
    Emitter,
    Expr,
    activation,
    conv_data,
    conv_folded,
    conv_pads,
    data_and_weights,
    emitter,
    epilogue,
    patch_embedding,
    source_and_weights,
    transpose_perm,
)
from litekiln.ops.base import is_quantized
from litekiln.ops.conv import C_PADDING_SAME, Convolution2DTransposeBias
from litekiln.ops.pool import reduce_window_body, reduce_window_geometry


def _strides_and_dilation(ctx: Ctx) -> tuple[tuple[int, int], tuple[int, int]]:
    """A convolution's (stride_h, stride_w) and (dilation_h, dilation_w) options."""
    o = ctx.options
    strides = (int(o.get("stride_h", 1)), int(o.get("stride_w", 1)))
    return strides, (int(o.get("dilation_h_factor", 1)), int(o.get("dilation_w_factor", 1)))


@emitter("CONV_2D")
def _conv2d(ctx: Ctx) -> list[Expr]:
    w = ctx.const(1)  # OHWI
    _, h, wd, cin = ctx.tensor(0).shape
    o, kh, kw, wi = w.shape
    (sh, sw), (dh, dw) = _strides_and_dilation(ctx)
    pads = conv_pads(ctx, h, wd, kh, kw, sh, sw, dh, dw)
    patches = patch_embedding(ctx, w, (sh, sw), pads, (dh, dw), cin // wi)
    if patches is not None:  # [n, patches, filters]: bias and activation, then NHWC
        (y,) = epilogue(ctx, patches, 2)
        return [ctx.emit(relax.op.reshape(y, tuple(ctx.out().shape)))]
    folded = conv_folded(ctx, w, (sh, sw), pads, (dh, dw), cin // wi)
    if folded is not None:  # its input's producer computed as it loads (a scale, a transpose)
        return epilogue(ctx, folded, 2)
    x, wc, pads = conv_data(ctx, w, pads)
    groups = cin // wi
    if _split_groups(groups, wi, o):
        # each group a convolution of its own over its channels, then side by side: a
        # matrix product per group that `schedules.SharedMatmul` tiles
        parts = [
            ctx.emit(
                ctx.bb.call_te(
                    functools.partial(
                        _group_conv_te, group=g, strides=(sh, sw), pads=pads, dilation=(dh, dw)
                    ),
                    x,
                    wc,
                    groups=groups,
                    primfunc_name_hint="conv2d_group",
                )
            )
            for g in range(groups)
        ]
        return epilogue(ctx, ctx.emit(relax.op.concat(parts, axis=3)), 2)
    y = ctx.emit(
        relax.op.nn.conv2d(
            x,
            wc,
            strides=(sh, sw),
            padding=pads,
            dilation=(dh, dw),
            groups=groups,
            data_layout="NHWC",
            kernel_layout="OHWI",
            out_dtype=ACC_DTYPE,
        )
    )
    return epilogue(ctx, y, 2)


#: `_split_groups`: at most this many groups, each with at least these many input and
#: output channels (ResNeSt's radix-2 3x3 convolutions: 2 groups of 32-256 inputs into
#: 64-512 outputs). Narrower or more groups keep relax's grouped convolution: a launch per
#: group would cost more than the tiles gain.
_SPLIT_MAX_GROUPS = 4
_SPLIT_MIN_INPUTS = 16
_SPLIT_MIN_OUTPUTS = 32


def _split_groups(groups: int, group_inputs: int, outputs: int) -> bool:
    """Whether a grouped convolution is emitted as one convolution per group."""
    return (
        2 <= groups <= _SPLIT_MAX_GROUPS
        and group_inputs >= _SPLIT_MIN_INPUTS
        and outputs % groups == 0
        and outputs // groups >= _SPLIT_MIN_OUTPUTS
    )


def _group_conv_te(
    x: te.Tensor,
    w: te.Tensor,
    *,
    groups: int,
    group: int,
    strides: tuple[int, int],
    pads: tuple[int, int, int, int],
    dilation: tuple[int, int],
) -> te.Tensor:
    """Group ``group`` of a grouped NHWC convolution (weights OHWI, ``[outputs, kh, kw,
    inputs per group]``): the sums of its output channels, ``[n, h', w', outputs / groups]``.
    It reads the group's input channels and weight rows at a constant offset from the whole
    tensors, so that the weights stay one constant (rebuilt from the model) and the input is
    never copied; the sums are an ordinary convolution's (``conv2d_nhwc``), which the
    schedules take as a matrix product."""
    n, h, wd, _ = (int(v) for v in x.shape)
    o, kh, kw, ci = (int(v) for v in w.shape)
    og = o // groups
    top, left, bottom, right = pads
    (sh, sw), (dh, dw) = strides, dilation
    oh = (h + top + bottom - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + left + right - dw * (kw - 1) - 1) // sw + 1
    padded = topi.nn.pad(x, [0, top, left, 0], [0, bottom, right, 0], name="pad_temp")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    rc = te.reduce_axis((0, ci), name="rc")
    c0, f0 = group * ci, group * og

    def body(b: Any, yy: Any, xx: Any, f: Any) -> Any:
        pixel = padded[b, yy * sh + ry * dh, xx * sw + rx * dw, c0 + rc]
        weight = w[f0 + f, ry, rx, rc]
        return te.sum(pixel.astype(ACC_DTYPE) * weight.astype(ACC_DTYPE), [ry, rx, rc])

    return te.compute((n, oh, ow, og), body, name="conv2d_nhwc")


@emitter("DEPTHWISE_CONV_2D")
def _dwconv(ctx: Ctx) -> list[Expr]:
    w = ctx.const(1)  # 1, KH, KW, C*M
    _, h, wd, cin = ctx.tensor(0).shape
    _, kh, kw, cm = w.shape
    w = np.ascontiguousarray(w.transpose(3, 1, 2, 0))  # (C*M), KH, KW, 1: grouped OHWI
    (sh, sw), (dh, dw) = _strides_and_dilation(ctx)
    pads = conv_pads(ctx, h, wd, kh, kw, sh, sw, dh, dw)
    folded = conv_folded(ctx, w, (sh, sw), pads, (dh, dw), cin)
    if folded is not None:  # a transpose of its NCHW input, read where it lies
        return epilogue(ctx, folded, 2)
    x, wc, pads = conv_data(ctx, w, pads)
    y = ctx.emit(
        relax.op.nn.conv2d(
            x,
            wc,
            strides=(sh, sw),
            padding=pads,
            dilation=(dh, dw),
            groups=cin,
            data_layout="NHWC",
            kernel_layout="OHWI",
            out_dtype=ACC_DTYPE,
        )
    )
    return epilogue(ctx, y, 2)


def _conv_transpose(
    ctx: Ctx,
    data: int,
    w: np.ndarray,
    strides: tuple[int, int],
    pad_before: tuple[int, int],
    bias: int,
) -> list[Expr]:
    """Transposed conv of operand ``data`` with OHWI weights ``w``: the full scatter
    ``(in - 1) * stride + k`` is cropped by ``pad_before`` at the top/left and to the output
    tensor's size at the bottom/right (negative crops become output padding)."""
    out_shape = ctx.out().shape
    _, h, wd, _ = ctx.tensor(data).shape
    o, kh, kw, i = w.shape
    sh, sw = strides
    oh, ow = out_shape[1], out_shape[2]
    pt, pl = pad_before
    full_h, full_w = (h - 1) * sh + kh, (wd - 1) * sw + kw
    pb, pr = full_h - oh - pt, full_w - ow - pl
    out_pad = (max(-pb, 0), max(-pr, 0))
    wt = np.ascontiguousarray(w.transpose(3, 0, 1, 2))  # I, O, KH, KW  (IOHW)
    x, wc = data_and_weights(ctx, data, wt)
    xn = ctx.emit(relax.op.permute_dims(x, [0, 3, 1, 2]))
    y = ctx.emit(
        relax.op.nn.conv2d_transpose(
            xn,
            wc,
            strides=(sh, sw),
            padding=(pt, pl, max(pb, 0), max(pr, 0)),
            output_padding=out_pad,
            data_layout="NCHW",
            kernel_layout="IOHW",
            out_dtype=ACC_DTYPE,
        )
    )
    y = ctx.emit(relax.op.permute_dims(y, [0, 2, 3, 1]))
    return epilogue(ctx, y, bias)


@emitter("TRANSPOSE_CONV")
def _transpose_conv(ctx: Ctx) -> list[Expr]:
    w = ctx.const(1)  # O, KH, KW, I
    _, h, wd, _ = ctx.tensor(2).shape
    _, kh, kw, _ = w.shape
    sh, sw = int(ctx.options.get("stride_h", 1)), int(ctx.options.get("stride_w", 1))
    oh, ow = ctx.out().shape[1], ctx.out().shape[2]
    if int(ctx.options.get("padding", 0)) == 1:
        pt = pl = 0
    else:
        pt = max(((h - 1) * sh + kh - oh) // 2, 0)
        pl = max(((wd - 1) * sw + kw - ow) // 2, 0)
    return _conv_transpose(ctx, 2, w, (sh, sw), (pt, pl), 3)


@emitter("Convolution2DTransposeBias")
def _transpose_conv_bias(ctx: Ctx) -> list[Expr]:
    # Geometry as in ops.conv.Convolution2DTransposeBias: the output tensor's shape already
    # holds ``stride * (in - 1) + k - pad_total``; the scatter starts ``pad_total // 2`` in.
    padding, stride_w, stride_h = Convolution2DTransposeBias.params(ctx.op)
    w = ctx.const(1)  # O, KH, KW, I
    _, h, wd, _ = ctx.tensor(0).shape
    _, kh, kw, _ = w.shape
    tot_h = tot_w = 0
    if padding == C_PADDING_SAME:
        tot_h = max(0, kh - (h - 1) % stride_h - 1)
        tot_w = max(0, kw - (wd - 1) % stride_w - 1)
    return _conv_transpose(ctx, 0, w, (stride_h, stride_w), (tot_h // 2, tot_w // 2), 2)


@emitter("FULLY_CONNECTED")
def _fully_connected(ctx: Ctx) -> list[Expr]:
    if ctx.tensor(1).data is None:
        return _fully_connected_computed_weights(ctx)
    w = ctx.const(1)  # out, in
    n_in = w.shape[1]
    src = _swapped_source(ctx, n_in)
    if src is not None:
        return _fully_connected_by_columns(ctx, w, src)
    rows = ctx.tensor(0).size // n_in
    if rows < ROW_MAJOR_WEIGHTS_ROWS and n_in > 1:  # (one term: `unit_reductions` takes it)
        x, wn = data_and_weights(ctx, 0, w)
        x2 = ctx.emit(relax.op.reshape(x, (rows, n_in)))
        return epilogue(ctx, ctx.emit(_product_by_rows(ctx, x2, wn)), 2)
    x, wt = data_and_weights(ctx, 0, np.ascontiguousarray(w.T))
    x2 = ctx.emit(relax.op.reshape(x, (rows, n_in)))
    y = ctx.emit(relax.op.matmul(x2, wt, out_dtype=ACC_DTYPE))
    return epilogue(ctx, y, 2)


#: A FULLY_CONNECTED of fewer rows than this (a language model's decode step: one; its
#: prefill: a few tokens) keeps TFLite's ``[out, in]`` weights and sums along their rows
#: (`_product_by_rows`); more rows take them as ``[in, out]`` for the matrix-product tiles.
ROW_MAJOR_WEIGHTS_ROWS = 16


def _product_by_rows(ctx: Ctx, x: Expr, w: Expr) -> Expr:
    """``x @ w.T`` for ``x: [rows, in]`` and ``w: [out, in]`` as stored (half under native
    fp16), summed in float32: each output reads one row of the weights, contiguous, so the
    lanes that share it read consecutive floats (`schedules.RowReduction`, dlight's GEMV).
    Transposed to ``[in, out]`` they read one float per row of the weights, 4-8 KB apart
    (measured on the H200: scripts/remote_gpu/gemv_probe.py, docs/benchmarks.md)."""
    from tvm import te

    def fn(a: te.Tensor, b: te.Tensor) -> te.Tensor:
        k = te.reduce_axis((0, a.shape[1]), name="k")
        return te.compute(
            (a.shape[0], b.shape[0]),
            lambda i, j: te.sum(a[i, k].astype(ACC_DTYPE) * b[j, k].astype(ACC_DTYPE), axis=k),
            name="matmul",
        )

    return ctx.bb.call_te(fn, x, w, primfunc_name_hint="matmul_rows")


def _swapped_source(ctx: Ctx, n_in: int) -> int | None:
    """The source of operand 0 where operand 0 is a TRANSPOSE of the partition swapping the
    last two axes of a 3-D float tensor ``[b, n_in, c]``: an MLP mixer's token mixing
    (ResMLP, MLP-Mixer: ``transpose(x) @ w.T``, its result transposed back). Else None."""
    lw, t = ctx.lw, ctx.op.inputs[0]
    g = lw.graph
    producer = next((g.ops[i] for i in lw.part.ops if t in g.ops[i].outputs), None)
    if producer is None or producer.name != "TRANSPOSE" or transpose_perm(g, producer) != [0, 2, 1]:
        return None
    src = producer.inputs[0]
    x = g.tensors[src]
    if (
        x.data is not None
        or len(x.shape) != 3
        or x.shape[1] != n_in
        or x.dtype != np.float32
        or any(is_quantized(v) for v in (x, ctx.tensor(0), ctx.tensor(1), ctx.out()))
    ):
        return None
    return src


def _fully_connected_by_columns(ctx: Ctx, w: np.ndarray, src: int) -> list[Expr]:
    """FULLY_CONNECTED of ``transpose(x)`` (``x: [b, n_in, c]``, `_swapped_source`) as
    ``w @ x``, ``[b, out, c]``, transposed after its bias and activation: the product reads
    ``x`` where it lies and writes its rows along ``x``'s contiguous axis, and the transposes
    on either side meet in the readers' index arithmetic. Written as TFLite has it, ResMLP's
    token mixing read its operand across the rows of the activations and its readers read
    its result so again (issue 15)."""
    x, wc = source_and_weights(ctx, src, w)
    y = ctx.emit(relax.op.matmul(wc, x, out_dtype=ACC_DTYPE))
    if ctx.has(2):
        y = ctx.emit(relax.op.add(y, ctx.fconst(ctx.const(2).reshape(-1, 1))))
    y = activation(ctx, y)
    y = ctx.emit(relax.op.permute_dims(y, [0, 2, 1]))
    return [ctx.emit(relax.op.reshape(y, ctx.out().shape))]


def _fully_connected_computed_weights(ctx: Ctx) -> list[Expr]:
    """Weights computed at run time (attention written as FULLY_CONNECTED: PyTorch exports of
    PVT, for one): ``x @ w.T`` with both operands in float32."""
    out_units, n_in = ctx.tensor(1).shape
    rows = ctx.tensor(0).size // n_in
    x2 = ctx.emit(relax.op.reshape(ctx.arg(0), (rows, n_in)))
    wt = ctx.emit(relax.op.permute_dims(ctx.arg(1), [1, 0]))
    y = ctx.emit(relax.op.matmul(x2, wt, out_dtype=ACC_DTYPE))
    return epilogue(ctx, y, 2)


def _binary(fn: Callable[[Expr, Expr], Expr], topi_name: str) -> Emitter:
    def emit(ctx: Ctx) -> list[Expr]:
        a, b = ctx.arg(0), ctx.arg(1)
        if _broadcasts_computed(ctx):
            # A computed operand smaller than the result (a squeeze-and-excite gate: a
            # 1x1x1xC conv, sigmoid, times the 32x32xC feature map). As a broadcast op, FuseOps
            # would fuse it into the conv's epilogue, which then recomputes the conv for every
            # output element (and TVM took minutes to simplify the 1.9 MB kernel). Marked
            # injective (BROADCAST_BARRIER), it still fuses with elementwise neighbours but
            # not into a reduction.
            from tvm import topi

            y = ctx.bb.call_te(
                getattr(topi, topi_name), a, b, primfunc_name_hint=f"{BROADCAST_BARRIER}{topi_name}"
            )
            return [activation(ctx, ctx.emit(y))]
        return [activation(ctx, ctx.emit(fn(a, b)))]

    return emit


def _broadcasts_computed(ctx: Ctx) -> bool:
    """Whether an operand that is not a constant has fewer elements than the result."""
    out = ctx.out().size
    return any(ctx.tensor(i).data is None and ctx.tensor(i).size < out for i in range(2))


for _name, _fn, _topi in [
    ("ADD", relax.op.add, "add"),
    ("SUB", relax.op.subtract, "subtract"),
    ("MUL", relax.op.multiply, "multiply"),
    ("DIV", relax.op.divide, "divide"),
    ("MAXIMUM", relax.op.maximum, "maximum"),
    ("MINIMUM", relax.op.minimum, "minimum"),
]:
    EMITTERS[_name] = _binary(_fn, _topi)


@emitter("LOGICAL_AND")
def _logical_and(ctx: Ctx) -> list[Expr]:
    # Booleans travel as float 0/1 on the GPU path: AND is a product.
    return [ctx.emit(relax.op.multiply(ctx.arg(0), ctx.arg(1)))]


@emitter("PRELU")
def _prelu(ctx: Ctx) -> list[Expr]:
    x = ctx.arg(0)
    alpha = ctx.fconst(ctx.const(1))
    pos = ctx.emit(relax.op.nn.relu(x))
    neg = ctx.emit(relax.op.minimum(x, ctx.fconst(0.0)))
    return [ctx.emit(relax.op.add(pos, relax.op.multiply(neg, alpha)))]


#: PrimFunc name of such a pool (its kernels' names show where it went).
SMALL_POOL_NAME = "pool_taps"


def _pool(kind: str) -> Emitter:
    def emit(ctx: Ctx) -> list[Expr]:
        _, h, w, _ = ctx.tensor(0).shape
        kh, kw = int(ctx.options["filter_height"]), int(ctx.options["filter_width"])
        sh, sw = int(ctx.options.get("stride_h", 1)), int(ctx.options.get("stride_w", 1))
        pads = conv_pads(ctx, h, w, kh, kw, sh, sw)
        if 1 < kh * kw <= SMALL_POOL_TAPS:
            return [activation(ctx, _small_pool(ctx, kind, (kh, kw), (sh, sw), pads))]
        if kind == "max":
            fold = ctx.lw.pad_folds.get(ctx.op.inputs[0])
            x = ctx.arg(0) if fold is None else ctx.lw.value(fold[0])
            if fold is not None:  # a PADV2 with minus infinity before it: its padding too
                pads = tuple(a + b for a, b in zip(pads, fold[1], strict=True))  # type: ignore[assignment]
            y = relax.op.nn.max_pool2d(
                x, pool_size=(kh, kw), strides=(sh, sw), padding=pads, layout="NHWC"
            )
            return [activation(ctx, ctx.emit(y))]
        y = relax.op.nn.avg_pool2d(
            ctx.arg(0),
            pool_size=(kh, kw),
            strides=(sh, sw),
            padding=pads,
            layout="NHWC",
            count_include_pad=False,
        )
        return [activation(ctx, ctx.emit(y))]

    return emit


def _small_pool(
    ctx: Ctx,
    kind: str,
    window: tuple[int, int],
    strides: tuple[int, int],
    pads: tuple[int, int, int, int],
) -> Expr:
    """A pool of a few taps (BlazeFace's 2x2 shortcut pools) as one elementwise expression
    of its taps' reads, not a reduction: an injective PrimFunc, which the kernel that reads
    it takes in (`fusion`: the next block's residual add reads it, through a channel pad,
    in a convolution's epilogue), where a reduction stays a kernel of its own
    (`codegen.isolate_pools`). Max: the taps inside the map; average: their mean (padding
    not counted, as TFLite's AVERAGE_POOL_2D), summed in float32."""
    from tvm import te, tirx

    kh, kw = window
    sh, sw = strides
    top, left = pads[0], pads[1]
    _, h, w, _ = ctx.tensor(0).shape
    n_, oh, ow, c_ = ctx.out().shape

    def fn(data: te.Tensor) -> te.Tensor:
        dtype = str(data.dtype)

        def value(n: object, i: object, j: object, c: object) -> object:
            taps = []  # (the tap's read, the condition that it lies inside the map or None)
            for a in range(kh):
                for b in range(kw):
                    y = i * sh + (a - top)  # type: ignore[operator]
                    x = j * sw + (b - left)  # type: ignore[operator]
                    conds = []
                    if top > a or (oh - 1) * sh + a - top >= h:
                        conds += [y >= 0, y < h]
                    if left > b or (ow - 1) * sw + b - left >= w:
                        conds += [x >= 0, x < w]
                    taps.append((data[n, y, x, c], tirx.all(*conds) if conds else None))
            if kind == "max":
                low = tirx.min_value(dtype)
                reads = [v if ok is None else tirx.if_then_else(ok, v, low) for v, ok in taps]
                return functools.reduce(tirx.max, reads)
            zero, one = tirx.const(0.0, "float32"), tirx.const(1.0, "float32")
            total, count = zero, zero
            for v, ok in taps:
                v = v.astype("float32")
                total = total + (v if ok is None else tirx.if_then_else(ok, v, zero))
                count = count + (one if ok is None else tirx.if_then_else(ok, one, zero))
            return (total / count).astype(dtype)

        return te.compute((n_, oh, ow, c_), value, name=SMALL_POOL_NAME)

    return ctx.emit(ctx.bb.call_te(fn, ctx.arg(0), primfunc_name_hint=SMALL_POOL_NAME))


@emitter("STABLEHLO_REDUCE_WINDOW")
def _reduce_window(ctx: Ctx) -> list[Expr]:
    """One reduction over each output's window (`litekiln.ops.pool.StablehloReduceWindow`):
    a tap outside the input, or on a hole of its base dilation, reads the init value, and
    the result is the body's ``init (op) window``."""
    from tvm import tirx

    shape = ctx.tensor(0).shape
    g = reduce_window_geometry(ctx.op, shape)
    kind = reduce_window_body(ctx.lw.graph, ctx.op)
    init_value = float(ctx.const(1).reshape(-1)[0])
    rank = len(shape)

    def fn(data: te.Tensor) -> te.Tensor:
        dtype = str(data.dtype)  # (half storage: the window is reduced in float32)
        init = tirx.const(init_value, "float32")
        axes = {d: te.reduce_axis((0, g["window"][d]), name=f"r{d}") for d in range(rank)}
        axes = {d: r for d, r in axes.items() if g["window"][d] > 1}

        def tap(out: tuple[Any, ...]) -> Any:
            index, conds = [], []
            for d in range(rank):
                r = axes.get(d, 0)
                p = out[d] * g["strides"][d] + r * g["dilations"][d] - g["pad_lo"][d]
                base, last = g["base"][d], (shape[d] - 1) * g["base"][d]
                lo = -g["pad_lo"][d]  # the smallest and largest positions a tap reaches
                hi = (
                    (g["out"][d] - 1) * g["strides"][d]
                    + (g["window"][d] - 1) * g["dilations"][d]
                    - g["pad_lo"][d]
                )
                if lo < 0:
                    conds.append(p >= 0)
                if hi > last:
                    conds.append(p <= last)
                if base > 1:
                    conds.append(tirx.floormod(p, base) == 0)
                    p = tirx.floordiv(p, base)
                index.append(p)
            v = data[tuple(index)].astype("float32")
            return tirx.if_then_else(tirx.all(*conds), v, init) if conds else v

        # The reduction starts from the init value (its "identity"), as LiteRT's does: a
        # window all padding gives init, an init that is no identity counts once.
        ops = {
            "add": lambda a, b: a + b,
            "mul": lambda a, b: a * b,
            "max": lambda a, b: tirx.max(a, b),
            "min": lambda a, b: tirx.min(a, b),
        }
        combine = ops[kind or "add"]
        reducer = te.comm_reducer(combine, lambda t: tirx.const(init_value, t))

        def value(*out: Any) -> Any:
            if not axes:
                return combine(init, tap(out))
            return reducer(tap(out), axis=list(axes.values()))

        y = te.compute(tuple(g["out"]), value, name="reduce_window")
        if dtype == "float32":
            return y
        return te.compute(y.shape, lambda *i: y(*i).astype(dtype), name="reduce_window_cast")

    return [ctx.emit(ctx.bb.call_te(fn, ctx.arg(0), primfunc_name_hint="reduce_window"))]


EMITTERS["MAX_POOL_2D"] = _pool("max")
EMITTERS["AVERAGE_POOL_2D"] = _pool("avg")


@emitter("RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR")
def _resize(ctx: Ctx) -> list[Expr]:
    _, oh, ow, _ = ctx.out().shape
    align = bool(ctx.options.get("align_corners", False))
    half = bool(ctx.options.get("half_pixel_centers", False))
    x = ctx.arg(0)
    ones = [ax for ax, size in ((1, oh), (2, ow)) if size == 1] if align else []
    if ones:
        # TFLite: align_corners with an output size of 1 reads index 0 (scale in/out, source
        # 0); TVM's align_corners divides by (out - 1) = 0. Keep only index 0 of that axis,
        # resize it 1 -> 2 (both copies of the row) and keep one of them.
        x = ctx.emit(relax.op.strided_slice(x, ones, [0] * len(ones), [1] * len(ones)))
        oh, ow = (2 if oh == 1 else oh), (2 if ow == 1 else ow)
    if ctx.op.name == "RESIZE_BILINEAR":
        mode = "align_corners" if align else ("half_pixel" if half else "asymmetric")
        y = relax.op.image.resize2d(
            x, (oh, ow), layout="NHWC", method="linear", coordinate_transformation_mode=mode
        )
    else:
        if align:
            # TFLite rounds half away from zero (TfLiteRound); TVM's "round" rounds half to
            # even, which picks the wrong pixel on every exact tie (e.g. 5 -> 9 pixels).
            # Source coordinates are >= 0 here, so half away from zero = prefer ceil.
            mode, rounding = "align_corners", "round_prefer_ceil"
        elif half:
            mode, rounding = "tf_half_pixel_for_nn", "floor"
        else:
            mode, rounding = "asymmetric", "floor"
        y = relax.op.image.resize2d(
            x,
            (oh, ow),
            layout="NHWC",
            method="nearest_neighbor",
            coordinate_transformation_mode=mode,
            rounding_method=rounding,
        )
    y = ctx.emit(y)
    if ones:
        y = ctx.emit(relax.op.strided_slice(y, ones, [0] * len(ones), [1] * len(ones)))
    return [y]


@emitter("DEPTH_TO_SPACE")
def _depth_to_space(ctx: Ctx) -> list[Expr]:
    n, h, w, c = ctx.tensor(0).shape
    bs = int(ctx.options["block_size"])
    y = ctx.emit(relax.op.reshape(ctx.arg_stored(0), (n, h, w, bs, bs, c // (bs * bs))))
    y = ctx.emit(relax.op.permute_dims(y, [0, 1, 3, 2, 4, 5]))
    return [ctx.emit(relax.op.reshape(y, (n, h * bs, w * bs, c // (bs * bs))))]


@emitter("SPACE_TO_DEPTH")
def _space_to_depth(ctx: Ctx) -> list[Expr]:
    n, h, w, c = ctx.tensor(0).shape
    bs = int(ctx.options["block_size"])
    y = ctx.emit(relax.op.reshape(ctx.arg_stored(0), (n, h // bs, bs, w // bs, bs, c)))
    y = ctx.emit(relax.op.permute_dims(y, [0, 1, 3, 2, 4, 5]))
    return [ctx.emit(relax.op.reshape(y, (n, h // bs, w // bs, c * bs * bs)))]
