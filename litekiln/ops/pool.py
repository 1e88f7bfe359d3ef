"""2-D pooling: AVERAGE_POOL_2D, MAX_POOL_2D, L2_POOL_2D and MediaPipe's
``MaxPoolingWithArgmax2D`` / ``MaxUnpooling2D``.

Windows and paddings are the conv family's (``conv.conv_geometry``, dilation 1). As in TFLite,
padded cells never take part: the average and the L2 norm divide by the number of input cells
inside the window, and the max ignores them.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from litekiln.model.ir import Op, Subgraph
from litekiln.ops import qmath
from litekiln.ops.base import (
    OpContext,
    OpDef,
    activation_supported_on_gpu,
    apply_activation,
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
    conv_geometry,
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

    @classmethod
    def pool(cls, win: np.ndarray, count: np.ndarray) -> np.ndarray:
        """Reduce windows [N, OH, OW, C, fh, fw] given the real-cell counts [1, OH, OW, 1]."""
        raise NotImplementedError

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
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
        """LiteRT's 8-bit pooling works on the raw integers (input and output share their
        quantization), then clamps to the fused activation's integer range."""
        xt, yt = ctx.input_tensor(0), ctx.output_tensor()
        if cls.pool_quantized is _Pool2D.pool_quantized or not (
            qmath.is_integer_quantized(xt) and qmath.is_integer_quantized(yt)
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

    @classmethod
    def pool(cls, win: np.ndarray, count: np.ndarray) -> np.ndarray:
        return np.sqrt(np.square(win).sum(axis=(-2, -1), dtype=np.float32) / count)


# -- MediaPipe custom pooling ops -----------------------------------------------------------


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
