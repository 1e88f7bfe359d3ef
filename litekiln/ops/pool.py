"""2-D pooling: AVERAGE_POOL_2D, MAX_POOL_2D, L2_POOL_2D and MediaPipe's
``MaxPoolingWithArgmax2D`` / ``MaxUnpooling2D``.

Windows and paddings are the conv family's (``conv.conv_geometry``, dilation 1). As in TFLite,
padded cells never take part: the average and the L2 norm divide by the number of input cells
inside the window, and the max ignores them.
"""

from __future__ import annotations

import struct
from typing import ClassVar

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from litekiln.model.ir import Op, Subgraph
from litekiln.ops import qmath
from litekiln.ops.base import (
    FLOAT32,
    Check,
    OpContext,
    OpDef,
    activation_supported_on_gpu,
    apply_activation,
    check_activation_range,
    fused_activation,
    register,
    required,
)
from litekiln.ops.conv import (
    C_PADDING_SAME,
    C_PADDING_VALID,
    SAME,
    VALID,
    c_struct_ints,
    checked_out_size,
    conv_geometry,
    out_size,
)


def _window(x: np.ndarray, fh: int, fw: int, sh: int, sw: int, padding: int, fill: float):
    """Windows over the padded input as a view [N, OH, OW, C, fh, fw] (window coordinates
    counted from the padded origin), and per output cell the count of real (unpadded) cells
    [1, OH, OW, 1]."""
    if x.ndim != 4:
        raise ValueError(f"pooling expects an NHWC input, got shape {x.shape}")
    if fh <= 0 or fw <= 0 or sh <= 0 or sw <= 0:
        raise ValueError(f"filter {fh}x{fw} and strides {sh}x{sw} must be positive")
    oh, ow, pad_h, pad_w = conv_geometry(x.shape, fh, fw, sh, sw, 1, 1, padding)
    if oh == 0 or ow == 0:  # LiteRT's empty output for a window one stride too large
        empty = np.zeros((x.shape[0], oh, ow, x.shape[3], fh, fw), x.dtype)
        return empty, np.zeros((1, oh, ow, 1), np.float32)

    def windows(a: np.ndarray, value: float) -> np.ndarray:
        need_h, need_w = (oh - 1) * sh + fh, (ow - 1) * sw + fw
        after_h = max(need_h - a.shape[1] - pad_h[0], 0)
        after_w = max(need_w - a.shape[2] - pad_w[0], 0)
        widths = ((0, 0), (pad_h[0], after_h), (pad_w[0], after_w), (0, 0))
        a = np.pad(a, widths, constant_values=value)
        v = sliding_window_view(a, (fh, fw), axis=(1, 2))
        return v[:, : need_h - fh + 1 : sh, : need_w - fw + 1 : sw]

    ones = np.ones((1, x.shape[1], x.shape[2], 1), np.float32)
    count = windows(ones, 0.0).sum(axis=(-2, -1), dtype=np.float32)
    return windows(x, fill), count


class _Pool2D(OpDef):
    """Shared base: options (padding, strides, filter size, fused activation) and GPU checks."""

    gpu_max_version = 1
    # The TFLite GPU delegate accepts pooling up to v2 (the int8 version).
    gpu_quant_max_version = 2
    versions = (1, 3)
    num_inputs = (1, 1)
    #: The input types LiteRT's kernel takes.
    dtypes: ClassVar[frozenset[str]] = frozenset({"float32", "uint8", "int8", "int16"})

    @classmethod
    def validate(cls, c: Check) -> None:
        """pooling.cc's GenericPrepare and its Eval's types: a rank-4 input, an output of
        the same type, positive strides. LiteRT turns a window it cannot place (a filter
        of 0, an unknown padding, a VALID filter larger than the input) into an empty
        output; litekiln refuses it. Integer pooling works on the stored integers, whatever
        the parameters; a clamping fused activation needs the output's scale."""
        super().validate(c)
        x, y = c.input(0), c.output()
        c.rank(x, 4, None, "input")
        c.dtype(x, cls.dtypes, "input")
        c.same_dtype(y, x, "output")
        o = c.op.options
        sh, sw = int(o.get("stride_h", 0)), int(o.get("stride_w", 0))
        if sh <= 0 or sw <= 0:
            raise c.fail("window", f"strides {sh}x{sw} must be positive")
        padding = int(o.get("padding", SAME))
        fh, fw = int(o.get("filter_height", 0)), int(o.get("filter_width", 0))
        n, h, w, ch = x.shape
        oh = checked_out_size(c, padding, h, fh, sh, 1, "height")
        ow = checked_out_size(c, padding, w, fw, sw, 1, "width")
        if x.type_name != "float32" and c.activation() in (1, 2, 3):
            c.quantized(y, "output")
            check_activation_range(c, y)
        c.output_shape((n, oh, ow, ch))

    @classmethod
    def pool(cls, win: np.ndarray, count: np.ndarray) -> np.ndarray:
        """Reduce windows [N, OH, OW, C, fh, fw] given the real-cell counts [1, OH, OW, 1]."""
        raise NotImplementedError

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        integers = cls.reference_quantized(ctx, inputs)  # integer tensors, quantized or not
        if integers is not None:
            return integers
        o = ctx.options
        x = np.asarray(required(ctx, inputs, 0), np.float32)
        fill = -np.inf if cls.name == "MAX_POOL_2D" else 0.0
        win, count = _window(
            x,
            int(o.get("filter_height", 1)),
            int(o.get("filter_width", 1)),
            int(o.get("stride_h", 1)),
            int(o.get("stride_w", 1)),
            int(o.get("padding", SAME)),
            fill,
        )
        y = cls.pool(win, count).astype(np.float32, copy=False)
        return [apply_activation(y, fused_activation(ctx.op))]

    @classmethod
    def pool_quantized(cls, win: np.ndarray, count: np.ndarray) -> np.ndarray:
        """Integer pooling of int64 windows (None-returning families use the float view)."""
        raise NotImplementedError

    @classmethod
    def reference_quantized(
        cls, ctx: OpContext, inputs: list[np.ndarray | None]
    ) -> list[np.ndarray] | None:
        """LiteRT's integer pooling works on the stored integers whatever the input's and
        output's parameters (it assumes they are the same), then clamps to the fused
        activation's integer range."""
        xt, yt = ctx.input_tensor(0), ctx.output_tensor()
        if (
            cls.pool_quantized is _Pool2D.pool_quantized
            or xt is None
            or xt.dtype.name not in ("int8", "uint8", "int16")
            or yt.dtype != xt.dtype
        ):
            return None
        o = ctx.options
        x = required(ctx, inputs, 0).astype(np.int64)
        win, count = _window(
            x,
            int(o.get("filter_height", 1)),
            int(o.get("filter_width", 1)),
            int(o.get("stride_h", 1)),
            int(o.get("stride_w", 1)),
            int(o.get("padding", SAME)),
            np.iinfo(np.int64).min if cls.name == "MAX_POOL_2D" else 0,
        )
        y = cls.pool_quantized(win, count.astype(np.int64))
        lo, hi = qmath.activation_range(fused_activation(ctx.op), yt)
        return [np.clip(y, lo, hi).astype(yt.dtype)]

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        reason = super().gpu_support(op, graph, allow_quantized=allow_quantized)
        if reason:
            return reason
        reason = activation_supported_on_gpu(op)
        if reason:
            return reason
        rank = len(graph.tensors[op.inputs[0]].shape)
        if rank != 4:
            return f"input of rank {rank}, the GPU path is NHWC"
        return None


@register
class AveragePool2D(_Pool2D):
    name = "AVERAGE_POOL_2D"
    gpu = True

    @classmethod
    def pool(cls, win: np.ndarray, count: np.ndarray) -> np.ndarray:
        return win.sum(axis=(-2, -1), dtype=np.float32) / count

    @classmethod
    def pool_quantized(cls, win: np.ndarray, count: np.ndarray) -> np.ndarray:
        # Integer sum over the real cells, divided rounding half away from zero (C division).
        acc = win.sum(axis=(-2, -1))
        half = count // 2
        return np.where(acc > 0, (acc + half) // count, -((-acc + half) // count))


@register
class MaxPool2D(_Pool2D):
    name = "MAX_POOL_2D"
    gpu = True
    copies_values = True  # (each output is its window's largest input)

    @classmethod
    def pool(cls, win: np.ndarray, count: np.ndarray) -> np.ndarray:
        out = win.max(axis=(-2, -1))
        # TFLite starts the max at lowest(), so an all -inf window reads lowest(), not -inf.
        return np.maximum(out, np.finfo(np.float32).min)

    @classmethod
    def pool_quantized(cls, win: np.ndarray, count: np.ndarray) -> np.ndarray:
        return win.max(axis=(-2, -1))


@register
class L2Pool2D(_Pool2D):
    name = "L2_POOL_2D"
    gpu = False  # not in the GPU op table
    versions = (1, 1)
    dtypes = FLOAT32

    @classmethod
    def pool(cls, win: np.ndarray, count: np.ndarray) -> np.ndarray:
        return np.sqrt(np.square(win).sum(axis=(-2, -1), dtype=np.float32) / count)


# -- MediaPipe custom pooling ops -----------------------------------------------------------


def _checked_pool_params(c: Check) -> tuple[int, int, int, int, int, int]:
    """The raw ``TfLitePoolParams`` of a MediaPipe pooling op, checked at load."""
    raw = c.op.custom_options or b""
    if len(raw) < 24:
        raise c.fail("custom-options", f"custom options of {len(raw)} bytes, expected 24")
    padding, sw, sh, fw, fh, act = struct.unpack_from("<6i", raw, 0)
    if padding not in (C_PADDING_SAME, C_PADDING_VALID):
        raise c.fail("padding", f"padding code {padding} is neither SAME (1) nor VALID (2)")
    if min(sw, sh, fw, fh) <= 0:
        raise c.fail("window", f"strides {sh}x{sw} and filter {fh}x{fw} must be positive")
    return padding, sw, sh, fw, fh, act


def _pool_params(ctx: OpContext) -> tuple[int, int, int, int, int, int]:
    """Raw ``TfLitePoolParams``: padding (1 SAME, 2 VALID), stride_w, stride_h, filter_w,
    filter_h, activation (TfLiteFusedActivation, same codes as the schema's for 0-5)."""
    padding, sw, sh, fw, fh, act = c_struct_ints(ctx, 6)
    if padding not in (C_PADDING_SAME, C_PADDING_VALID):
        raise ctx.fail(f"padding code {padding} is neither SAME (1) nor VALID (2)")
    if min(sw, sh, fw, fh) <= 0:
        raise ctx.fail(f"strides {sh}x{sw} and filter {fh}x{fw} must be positive")
    return padding, sw, sh, fw, fh, act


@register
class MaxPoolingWithArgmax2D(OpDef):
    """MediaPipe's max pool that also outputs where each max came from
    (mediapipe/util/tflite/operations/max_pool_argmax.cc).

    Outputs (values, indices), both float32 NHWC. The index is the position inside the
    window, ``filter_y * filter_width + filter_x`` (window coordinates, counted from the
    window's padded origin), stored as float plus 0.1 so a later float->int truncation is safe.
    The first strictly greatest element wins; the activation clamps the values only.
    """

    name = "MaxPoolingWithArgmax2D"
    versions = None
    num_inputs = (1, 1)
    num_outputs = (2, 2)

    @classmethod
    def validate(cls, c: Check) -> None:
        super().validate(c)
        x = c.input(0)
        c.rank(x, 4, None, "input")
        c.dtype(x, FLOAT32, "input")
        padding, sw, sh, fw, fh, _ = _checked_pool_params(c)
        builtin = SAME if padding == C_PADDING_SAME else VALID
        n, h, w, ch = x.shape
        oh = checked_out_size(c, builtin, h, fh, sh, 1, "height")
        ow = checked_out_size(c, builtin, w, fw, sw, 1, "width")
        c.output_shape((n, oh, ow, ch), 0)
        c.output_shape((n, oh, ow, ch), 1)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        padding, sw, sh, fw, fh, act = _pool_params(ctx)
        x = np.asarray(required(ctx, inputs, 0), np.float32)
        builtin_padding = SAME if padding == C_PADDING_SAME else VALID
        win, _ = _window(x, fh, fw, sh, sw, builtin_padding, -np.inf)
        flat = win.reshape(*win.shape[:4], fh * fw)
        # argmax returns the first maximum, like the kernel's strict ``cur > max`` scan.
        index = flat.argmax(axis=-1)
        best = np.take_along_axis(flat, index[..., None], -1)[..., 0]
        best = np.maximum(best, np.finfo(np.float32).min)
        values = apply_activation(best, act)
        return [values, index.astype(np.float32) + np.float32(0.1)]


@register
class MaxUnpooling2D(OpDef):
    """MediaPipe's inverse of ``MaxPoolingWithArgmax2D`` (max_unpooling.cc).

    Inputs (values, indices); output ``[N, H * filter_h, W * filter_w, C]``, zero except that
    each input value is written to ``(iy*sh - pad_h + idx // fw, ix*sw - pad_w + idx % fw)``;
    the padding is ``ComputePadding(stride, 1, out, filter, in)``. Later writes win, writes
    outside the output are dropped.
    """

    name = "MaxUnpooling2D"
    versions = None
    num_inputs = (2, 2)

    @classmethod
    def validate(cls, c: Check) -> None:
        super().validate(c)
        x, idx = c.input(0), c.input(1)
        c.rank(x, 4, None, "input")
        c.same_shape(idx, x, "indices")
        _, _, _, fw, fh, _ = _checked_pool_params(c)
        n, h, w, ch = x.shape
        c.output_shape((n, h * fh, w * fw, ch))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        _, sw, sh, fw, fh, _ = _pool_params(ctx)
        x = np.asarray(required(ctx, inputs, 0), np.float32)
        idx = np.asarray(required(ctx, inputs, 1)).astype(np.float32)
        if x.ndim != 4 or idx.shape != x.shape:
            raise ctx.fail(f"values {x.shape} and indices {idx.shape} must be equal NHWC shapes")
        n, h, w, c = x.shape
        oh, ow = h * fh, w * fw
        pad_h = max(((h - 1) * sh + fh - oh) // 2, 0)
        pad_w = max(((w - 1) * sw + fw - ow) // 2, 0)
        k = idx.astype(np.int64)  # C++ float -> int truncation
        oy = np.arange(h).reshape(1, h, 1, 1) * sh - pad_h + k // fw
        ox = np.arange(w).reshape(1, 1, w, 1) * sw - pad_w + k % fw
        out = np.zeros((n, oh, ow, c), np.float32)
        nn = np.broadcast_to(np.arange(n).reshape(n, 1, 1, 1), x.shape)
        cc = np.broadcast_to(np.arange(c).reshape(1, 1, 1, c), x.shape)
        oy, ox = np.broadcast_to(oy, x.shape), np.broadcast_to(ox, x.shape)
        ok = (oy >= 0) & (oy < oh) & (ox >= 0) & (ox < ow)
        # C order of the input loop == numpy's fancy-assignment order: later writes win.
        out[nn[ok], oy[ok], ox[ok], cc[ok]] = x[ok]
        return [out]


# -- StableHLO's reduce_window ---------------------------------------------------------------

#: The body ops LiteRT's STABLEHLO_REDUCE_WINDOW takes (one op, builtin or StableHLO), as the
#: reduction each names.
REDUCE_WINDOW_BODIES = {
    "ADD": "add",
    "STABLEHLO_ADD": "add",
    "MUL": "mul",
    "STABLEHLO_MULTIPLY": "mul",
    "MAXIMUM": "max",
    "STABLEHLO_MAXIMUM": "max",
    "MINIMUM": "min",
    "STABLEHLO_MINIMUM": "min",
    "LOGICAL_AND": "and",
    "STABLEHLO_AND": "and",
    "LOGICAL_OR": "or",
    "STABLEHLO_OR": "or",
}

_REDUCE_UFUNCS = {
    "add": np.add,
    "mul": np.multiply,
    "max": np.maximum,
    "min": np.minimum,
    "and": np.logical_and,
    "or": np.logical_or,
}


def region_reduction(graph: Subgraph, index: int) -> str | None:
    """The reduction a StableHLO op's region (subgraph ``index``) computes: ``"add"``,
    ``"max"``... for its one op, ``"update"`` for none (the new value replaces the old:
    STABLEHLO_SCATTER's), None where it is not a region LiteRT's kernels take."""
    if not 0 < index < len(graph.model_subgraphs):
        return None
    ops = graph.called(index).ops
    if not ops:
        return "update"
    return REDUCE_WINDOW_BODIES.get(ops[0].name) if len(ops) == 1 else None


def reduce_window_body(graph: Subgraph, op: Op) -> str | None:
    """The reduction a STABLEHLO_REDUCE_WINDOW's body subgraph computes (``"add"``,
    ``"max"``...), or None where it is not one op LiteRT knows."""
    kind = region_reduction(graph, int(op.options.get("body_subgraph_index", 0)))
    return None if kind == "update" else kind


def reduce_window_geometry(op: Op, shape: tuple[int, ...]) -> dict[str, list[int]]:
    """The options of a STABLEHLO_REDUCE_WINDOW over an input of ``shape`` as per-axis
    lists (``window``, ``strides``, ``base``, ``dilations``, ``pad_lo``, ``pad_hi``) and the
    ``out`` shape: the input dilated by ``base`` (holes between its elements), padded
    (negative: cropped), then windows of ``window`` taps ``dilations`` apart, ``strides``
    apart."""
    rank = len(shape)
    o = op.options

    def per_axis(key: str, default: int) -> list[int]:
        v = o.get(key)
        return [default] * rank if v is None else [int(x) for x in v]

    pads = [int(x) for x in o.get("padding") or ()] or [0] * (2 * rank)  # (lo, hi) an axis
    g = {
        "window": per_axis("window_dimensions", 1),
        "strides": per_axis("window_strides", 1),
        "base": per_axis("base_dilations", 1),
        "dilations": per_axis("window_dilations", 1),
        "pad_lo": pads[0::2],
        "pad_hi": pads[1::2],
    }
    out = []
    for d in range(rank):
        dilated = (shape[d] - 1) * g["base"][d] + 1 if shape[d] else 0
        padded = dilated + g["pad_lo"][d] + g["pad_hi"][d]
        size = out_size(padded, g["window"][d], g["strides"][d], g["dilations"][d], VALID)
        out.append(max(size, 0))  # (the windows over the padded map: TFLite's VALID rule)
    g["out"] = out
    return g


@register
class StablehloReduceWindow(OpDef):
    """StableHLO's reduce_window (litert-torch writes PyTorch's avg_pool2d as a window sum
    of it, then a division): each output the body's reduction of ``init`` and one window of
    the input, dilated and padded with ``init``."""

    name = "STABLEHLO_REDUCE_WINDOW"
    gpu_extended = True
    versions = (1, 1)
    num_inputs = (2, 2)
    quant_aware = True  # LiteRT reduces an 8-bit operand's stored integers, as they are
    dtypes: ClassVar[frozenset[str]] = frozenset(
        {"float32", "int8", "int16", "int32", "int64", "uint8", "bool"}
    )

    @classmethod
    def validate(cls, c: Check) -> None:
        """stablehlo_reduce_window.cc: one operand of rank 1-6 and a scalar init of its
        type; every window size, stride and dilation positive; a body of one op LiteRT
        reduces with (ADD, MUL, MAXIMUM, MINIMUM, LOGICAL_AND, LOGICAL_OR)."""
        super().validate(c)
        x, init, y = c.input(0), c.input(1), c.output()
        c.rank(x, 1, 6, "input")
        c.dtype(x, cls.dtypes, "input")
        c.same_dtype(init, x, "init value")
        c.same_dtype(y, x, "output")
        if init.size != 1:
            raise c.fail("init", f"init value has {init.size} elements, expected one")
        index = int(c.op.options.get("body_subgraph_index", 0))
        if not 0 < index < len(c.graph.model_subgraphs):
            raise c.fail(
                "subgraph-index",
                f"body {index}: the model has {len(c.graph.model_subgraphs)} subgraphs",
            )
        if reduce_window_body(c.graph, c.op) is None:
            ops = [o.name for o in c.graph.called(index).ops]
            raise c.fail(
                "body",
                f"body subgraph {index} runs {ops}; LiteRT's kernel takes one of "
                f"{sorted(set(REDUCE_WINDOW_BODIES))}",
            )
        rank = len(x.shape)
        for key in ("window_dimensions", "window_strides", "base_dilations", "window_dilations"):
            v = c.op.options.get(key)
            if v is not None and (len(v) != rank or min(int(e) for e in v) <= 0):
                raise c.fail(
                    "window", f"{key} {list(v)}: expected {rank} positive values, one an axis"
                )
        pads = c.op.options.get("padding")
        if pads is not None and len(pads) not in (0, 2 * rank):
            raise c.fail("padding", f"padding has {len(pads)} values, expected {2 * rank}")
        c.output_shape(reduce_window_geometry(c.op, x.shape)["out"])

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        """Float operands, a constant init value, an arithmetic body (the logical ones
        reduce bools: CPU)."""
        x, init = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]]
        if x.dtype != np.float32 or x.quantization is not None:
            return f"a {x.type_name} operand: the GPU path reduces float32 windows"
        if init.data is None:
            return "its init value is computed at run time; the GPU path needs a constant"
        if reduce_window_body(graph, op) not in ("add", "mul", "max", "min"):
            return "a logical body: the GPU path reduces float32 windows"
        return super().gpu_support(op, graph, allow_quantized=allow_quantized)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = np.asarray(required(ctx, inputs, 0))
        init = np.asarray(required(ctx, inputs, 1)).reshape(())
        g = reduce_window_geometry(ctx.op, x.shape)
        ufunc = _REDUCE_UFUNCS[reduce_window_body(ctx.graph, ctx.op) or "add"]
        # Dilate (holes of init), then pad and crop (pads of init).
        base = zip(x.shape, g["base"], strict=True)
        dilated_shape = [(n - 1) * b + 1 if n else 0 for n, b in base]
        a = np.full(dilated_shape, init, x.dtype)
        a[tuple(slice(None, None, b) for b in g["base"])] = x
        widths = [(max(lo, 0), max(hi, 0)) for lo, hi in zip(g["pad_lo"], g["pad_hi"], strict=True)]
        a = np.pad(a, widths, constant_values=init)
        crop = tuple(
            slice(max(-lo, 0), a.shape[d] - max(-hi, 0))
            for d, (lo, hi) in enumerate(zip(g["pad_lo"], g["pad_hi"], strict=True))
        )
        a = a[crop]
        out = np.full(g["out"], init, x.dtype)
        if out.size == 0:
            return [out]
        for tap in np.ndindex(*g["window"]):
            sl = tuple(
                slice(t * dl, t * dl + (n - 1) * s + 1, s)
                for t, dl, n, s in zip(tap, g["dilations"], g["out"], g["strides"], strict=True)
            )
            out = ufunc(out, a[sl]).astype(x.dtype, copy=False)
        return [out]
