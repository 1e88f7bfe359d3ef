"""Convolutions and fully-connected layers: CONV_2D, DEPTHWISE_CONV_2D, TRANSPOSE_CONV,
FULLY_CONNECTED and MediaPipe's ``Convolution2DTransposeBias``.

Layouts are TFLite's: activations NHWC, CONV_2D / TRANSPOSE_CONV weights OHWI, depthwise weights
1HW(C*M), fully-connected weights [units, in]. The references compute in float32 through one
im2col matrix product per conv (or one product and a col2im scatter for the transposed conv),
so a MobileNet-sized layer takes milliseconds.

Output sizes and paddings follow ``tensorflow/lite/kernels/padding.h``: SAME gives
``ceil(in / stride)`` outputs, VALID ``ceil((in - effective_filter + 1) / stride)``; the total
padding ``(out - 1) * stride + effective_filter - in`` is split with the odd element after
(bottom/right), exactly as ``ComputePaddingWithOffset`` does.
"""

from __future__ import annotations

import math
import struct
from typing import ClassVar

import numpy as np

from litekiln.model.ir import Op, Subgraph, Tensor
from litekiln.ops import qmath
from litekiln.ops.base import (
    FLOAT32,
    INT8S,
    QUANTIZED,
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

#: Padding enum of schema.fbs (builtin options).
SAME, VALID = 0, 1


# -- shared geometry ------------------------------------------------------------------------


def out_size(in_size: int, filter_size: int, stride: int, dilation: int, padding: int) -> int:
    """TFLite's ``ComputeOutSize`` for builtin padding codes (0 = SAME, 1 = VALID)."""
    effective = (filter_size - 1) * dilation + 1
    if stride <= 0:
        raise ValueError(f"stride {stride} must be positive")
    if padding == SAME:
        return (in_size + stride - 1) // stride
    if padding == VALID:
        num = in_size + stride - effective
        return num // stride if num >= 0 else -(-num // stride)  # C division truncates
    raise ValueError(f"unknown padding code {padding}")


def pad_amounts(
    in_size: int, filter_size: int, stride: int, dilation: int, out: int
) -> tuple[int, int]:
    """(before, after) padding of ``ComputePaddingWithOffset``; the odd element goes after."""
    effective = (filter_size - 1) * dilation + 1
    total = (out - 1) * stride + effective - in_size
    before = max(total, 0) // 2
    after = max(total - before, 0)
    return before, after


def checked_out_size(
    c: Check, padding: int, in_size: int, filter_size: int, stride: int, dilation: int, axis: str
) -> int:
    """LiteRT's ``ComputeOutSizeChecked`` (padding.h) for the load-time checks: the padding
    must be SAME or VALID, the filter, stride and dilation positive, and the output size
    non-negative (C's division, which truncates: a VALID window one cell too large for the
    input still gives 0 outputs)."""
    if padding not in (SAME, VALID):
        raise c.fail("padding", f"padding code {padding} is neither SAME (0) nor VALID (1)")
    if filter_size <= 0 or stride <= 0 or dilation <= 0:
        raise c.fail(
            "window",
            f"{axis}: filter {filter_size}, stride {stride} and dilation {dilation} must be "
            "positive",
        )
    if padding == SAME:
        return (in_size + stride - 1) // stride
    num = in_size + stride - ((filter_size - 1) * dilation + 1)
    out = num // stride if num >= 0 else -(-num // stride)
    if out < 0:
        raise c.fail(
            "window",
            f"{axis}: a filter of {filter_size} (dilation {dilation}) does not fit an input of "
            f"{in_size} with VALID padding",
        )
    return out


def check_bias(c: Check, bias: Tensor | None, x: Tensor, channels: int, role: str) -> None:
    """The bias rules of LiteRT's conv kernels: int32 with zero point 0 for 8-bit inputs,
    the input's type otherwise; one value per output channel."""
    if bias is None:
        return
    if x.type_name in INT8S:
        c.dtype(bias, frozenset({"int32"}), role)
        c.zero_point(bias, 0, role)
    elif x.type_name == "int16":
        c.dtype(bias, frozenset({"int32", "int64"}), role)
        c.zero_point(bias, 0, role)
    else:
        c.dtype(bias, FLOAT32, role)
    if bias.size != channels:
        raise c.fail(
            "bias-size",
            f"{role} {bias.name!r} has {bias.size} values for {channels} output channels",
        )


def check_conv_quantization(
    c: Check, x: Tensor, w: Tensor, y: Tensor, channels: int, *, hybrid: bool
) -> None:
    """LiteRT's ``PopulateConvolutionQuantizationParams`` and the kernels' checks around it:
    integer kernels need quantized input, filter and output, a filter with one scale or one
    per output channel along its quantized dimension (per-channel: int8/int16 inputs, int8 or
    int4 filters);
    hybrid kernels (float input, int8 filter) a quantized filter."""
    q = w.quantization
    if hybrid:
        c.quantized(w, "filter", per_tensor=False)
        assert q is not None
        if q.scale.size != 1 and q.scale.size != w.shape[q.axis]:
            raise c.fail("quantization-scale-count", f"filter {w.name!r}: scales per channel")
        return
    c.quantized(x, "input")
    c.quantized(w, "filter", per_tensor=False)
    c.quantized(y, "output")
    assert q is not None
    n = q.scale.size
    if n != 1 and n != channels:
        raise c.fail(
            "quantization-scale-count",
            f"filter {w.name!r} has {n} scales for {channels} output channels",
        )
    if n > 1:
        # (int4 filters are unpacked to int8 at load, as LiteRT's per-channel kernels unpack
        # them: conv.cc, depthwise_conv.cc)
        if x.type_name not in ("int8", "int16") or w.type_name not in ("int8", "int4"):
            raise c.fail(
                "quantization-per-channel",
                f"per-channel filter {w.name!r} ({w.type_name}) with a {x.type_name} input: "
                "only int8 and int4 filters with int8/int16 inputs are quantized per channel",
            )
        if w.shape[q.axis] != n:
            raise c.fail(
                "quantization-scale-count",
                f"filter {w.name!r}: {n} scales along dimension {q.axis} of {list(w.shape)}",
            )
    check_activation_range(c, y)


def _check_conv_dtypes(c: Check, x: Tensor, w: Tensor, y: Tensor, what: str) -> bool:
    """Input, filter and output types of a conv kernel; True for a hybrid op (float input,
    int8 filter). LiteRT reads a hybrid filter's bytes as int8 and a float filter's as
    float32 whatever their declared type, and its 8-bit kernels assume a filter of the
    input's type with zero points 0: litekiln refuses the other combinations."""
    c.dtype(x, frozenset({"float32", "uint8", "int8", "int16"}), "input")
    c.same_dtype(y, x, "output")
    xt = x.type_name
    if xt == "float32":
        if w.type_name in ("int8", "int4"):  # (int4: unpacked to int8 at load)
            return True
        c.dtype(w, FLOAT32, "filter")
        return False
    c.dtype(w, frozenset({"int8" if xt == "int16" else xt, "int4"}), "filter")
    if xt in ("int8", "int16"):
        c.quantized(w, "filter", per_tensor=False)
        c.zero_point(w, 0, "filter")
    if xt == "int16":
        c.zero_point(x, 0, "input")
        c.zero_point(y, 0, "output")
    return False


def check_bias_scale(c: Check, x: Tensor, w: Tensor, bias: Tensor | None, y: Tensor) -> None:
    """``GetQuantizedConvolutionMultipler`` with a bias: the bias scale must be close to
    input scale x filter scale (within 2% of the output scale)."""
    if bias is None:
        return
    xs, ws, ys = (float(t.quantization.scale[0]) for t in (x, w, y))  # type: ignore[union-attr]
    bs = float(bias.quantization.scale[0]) if bias.quantization is not None else 0.0
    if not abs(xs * ws - bs) / ys <= 0.02:
        raise c.fail(
            "bias-scale",
            f"bias {bias.name!r} has scale {bs}, input x filter scale is {xs * ws} (output "
            f"scale {ys}): they must agree within 2% of the output scale",
        )


def conv_geometry(
    x_shape: tuple[int, ...],
    kh: int,
    kw: int,
    sh: int,
    sw: int,
    dh: int,
    dw: int,
    padding: int,
) -> tuple[int, int, tuple[int, int], tuple[int, int]]:
    """Output height/width and (before, after) paddings of an NHWC windowed op."""
    h, w = x_shape[1], x_shape[2]
    oh = out_size(h, kh, sh, dh, padding)
    ow = out_size(w, kw, sw, dw, padding)
    if oh < 0 or ow < 0:
        raise ValueError(
            f"a {kh}x{kw} window (dilation {dh}x{dw}) does not fit input {h}x{w} with VALID padding"
        )
    # (0 outputs is LiteRT's answer for a VALID window one stride too large: an empty result.)
    return oh, ow, pad_amounts(h, kh, sh, dh, oh), pad_amounts(w, kw, sw, dw, ow)


def window_taps(
    x: np.ndarray,
    kh: int,
    kw: int,
    sh: int,
    sw: int,
    dh: int,
    dw: int,
    oh: int,
    ow: int,
    pad_h: tuple[int, int],
    pad_w: tuple[int, int],
    fill: float = 0.0,
) -> list[np.ndarray]:
    """The input seen by each filter tap (row-major over the filter): kh*kw arrays [N,OH,OW,C].

    The input is padded with ``fill`` first; each tap is a strided view, no copy.
    """
    if oh == 0 or ow == 0:
        return [np.zeros((x.shape[0], oh, ow, x.shape[3]), x.dtype)] * (kh * kw)
    need_h = (oh - 1) * sh + (kh - 1) * dh + 1
    need_w = (ow - 1) * sw + (kw - 1) * dw + 1
    after_h = max(need_h - x.shape[1] - pad_h[0], 0)
    after_w = max(need_w - x.shape[2] - pad_w[0], 0)
    if pad_h[0] or after_h or pad_w[0] or after_w:
        x = np.pad(
            x, ((0, 0), (pad_h[0], after_h), (pad_w[0], after_w), (0, 0)), constant_values=fill
        )
    taps = []
    for fy in range(kh):
        for fx in range(kw):
            y0, x0 = fy * dh, fx * dw
            taps.append(x[:, y0 : y0 + (oh - 1) * sh + 1 : sh, x0 : x0 + (ow - 1) * sw + 1 : sw, :])
    return taps


def _f32(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)


def _optional(inputs: list[np.ndarray | None], i: int) -> np.ndarray | None:
    return inputs[i] if i < len(inputs) else None


def _finish(ctx: OpContext, y: np.ndarray, bias: np.ndarray | None) -> list[np.ndarray]:
    if bias is not None:
        y = y + _f32(bias).reshape(-1)
    return [apply_activation(y.astype(np.float32, copy=False), fused_activation(ctx.op))]


def conv2d_nhwc(
    x: np.ndarray,
    w: np.ndarray,
    strides: tuple[int, int],
    dilations: tuple[int, int],
    padding: int,
) -> np.ndarray:
    """Plain (optionally grouped) conv of NHWC ``x`` with OHWI ``w``, float32, no bias."""
    x, w = _f32(x), _f32(w)
    n, _, _, c = x.shape
    o, kh, kw, ci = w.shape
    if ci <= 0 or c % ci:
        raise ValueError(f"input has {c} channels, not a multiple of the filter's {ci}")
    groups = c // ci
    if o % groups:
        raise ValueError(f"{o} output channels do not split into {groups} groups")
    sh, sw = strides
    dh, dw = dilations
    oh, ow, pad_h, pad_w = conv_geometry(x.shape, kh, kw, sh, sw, dh, dw, padding)
    taps = window_taps(x, kh, kw, sh, sw, dh, dw, oh, ow, pad_h, pad_w)
    og = o // groups
    out = np.empty((n, oh, ow, o), np.float32)
    for g in range(groups):
        cs = slice(g * ci, (g + 1) * ci)
        if kh * kw == 1:
            cols = taps[0][..., cs].reshape(-1, ci)
        else:
            cols = np.stack([t[..., cs] for t in taps], axis=3).reshape(-1, kh * kw * ci)
        wg = w[g * og : (g + 1) * og].reshape(og, kh * kw * ci)
        out[..., g * og : (g + 1) * og] = (cols @ wg.T).reshape(n, oh, ow, og)
    return out


def transpose_conv_nhwc(
    x: np.ndarray,
    w: np.ndarray,
    out_hw: tuple[int, int],
    strides: tuple[int, int],
    pads: tuple[int, int],
) -> np.ndarray:
    """Transposed conv: scatter each input pixel times the OHWI filter into the output.

    ``out[n, iy*sh - pad_h + fy, ix*sw - pad_w + fx, o] += x[n, iy, ix, c] * w[o, fy, fx, c]``,
    contributions outside ``out_hw`` dropped (TFLite's reference ``TransposeConv``).
    """
    x, w = _f32(x), _f32(w)
    n, h, wd, c = x.shape
    o, kh, kw, ci = w.shape
    if ci != c:
        raise ValueError(f"input has {c} channels, the filter expects {ci}")
    sh, sw = strides
    ph, pw = pads
    oh, ow = out_hw
    # One product gives every tap's contribution: [N*H*W, KH*KW*O].
    cols = x.reshape(-1, c) @ w.transpose(3, 1, 2, 0).reshape(c, kh * kw * o)
    cols = cols.reshape(n, h, wd, kh, kw, o)
    full_h = max((h - 1) * sh + kh, ph + oh)
    full_w = max((wd - 1) * sw + kw, pw + ow)
    buf = np.zeros((n, full_h, full_w, o), np.float32)
    for fy in range(kh):
        for fx in range(kw):
            buf[:, fy : fy + (h - 1) * sh + 1 : sh, fx : fx + (wd - 1) * sw + 1 : sw, :] += cols[
                :, :, :, fy, fx, :
            ]
    return buf[:, ph : ph + oh, pw : pw + ow, :]


# -- GPU constraints shared by the conv family ----------------------------------------------


def _const(graph: Subgraph, t: int) -> bool:
    return t < 0 or graph.tensors[t].is_constant


def _rank(graph: Subgraph, t: int) -> int:
    return len(graph.tensors[t].shape)


class _ConvLike(OpDef):
    """Common GPU checks: float/quantized dtypes and version (base), fused activation,
    rank-4 NHWC data, constant weights and bias."""

    data_input: ClassVar[int] = 0
    weight_input: ClassVar[int] = 1
    bias_input: ClassVar[int] = 2
    #: the data input must be rank-4 NHWC (False for FULLY_CONNECTED).
    nhwc: ClassVar[bool] = True
    #: the GPU form also takes weights computed at run time (FULLY_CONNECTED).
    computed_weights: ClassVar[bool] = False

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        reason = super().gpu_support(op, graph, allow_quantized=allow_quantized)
        if reason:
            return reason
        reason = activation_supported_on_gpu(op)
        if reason:
            return reason
        if cls.nhwc and _rank(graph, op.inputs[cls.data_input]) != 4:
            return f"input of rank {_rank(graph, op.inputs[cls.data_input])}, the GPU path is NHWC"
        if not cls.computed_weights and not _const(graph, op.inputs[cls.weight_input]):
            return "runtime (non-constant) weights"
        if len(op.inputs) > cls.bias_input and not _const(graph, op.inputs[cls.bias_input]):
            return "runtime (non-constant) bias"
        return None


# -- ops ------------------------------------------------------------------------------------


@register
class Conv2D(_ConvLike):
    """CONV_2D: inputs (input NHWC, filter OHWI, bias?), any stride/dilation, grouped when the
    input has ``groups * filter_in`` channels."""

    name = "CONV_2D"
    gpu = True
    gpu_max_version = 1
    # The TFLite GPU delegate accepts CONV_2D up to v6 (int8, hybrid, int16 versions).
    gpu_quant_max_version = 6
    versions = (1, 8)
    # LiteRT's conv.cc takes 2 or 3 inputs, then requires the bias ("the optimized versions
    # require 'bias'"), so in effect exactly 3, all present.
    num_inputs = (3, 3)

    @classmethod
    def validate(cls, c: Check) -> None:
        """conv.cc's Prepare, plus: a float input takes a float32 filter (LiteRT would
        reinterpret other filters' bytes) and an 8-bit input a filter of its own type."""
        super().validate(c)
        x, w, bias, y = c.input(0), c.input(1), c.input(2), c.output()
        c.rank(x, 4, None, "input")
        c.rank(w, 4, None, "filter")
        n, h, wd, ci = x.shape
        co, kh, kw, fi = w.shape
        if min(h, wd, ci) <= 0 or min(co, kh, kw, fi) <= 0:
            raise c.fail(
                "empty-dimension",
                f"input {list(x.shape)} and filter {list(w.shape)} need positive sizes",
            )
        if ci % fi or co % (ci // fi):
            raise c.fail(
                "filter-channels",
                f"input channels {ci} are not a multiple of the filter's {fi}, or its "
                f"{co} output channels do not split into {ci // fi} groups",
            )
        hybrid = _check_conv_dtypes(c, x, w, y, "CONV_2D")
        o = c.op.options
        sh, sw = int(o.get("stride_h", 0)), int(o.get("stride_w", 0))
        dh, dw = int(o.get("dilation_h_factor", 0)), int(o.get("dilation_w_factor", 0))
        if max(sh, sw, dh, dw) > 0x7FFF:
            raise c.fail("window", f"strides {sh}x{sw} and dilations {dh}x{dw} exceed 32767")
        padding = int(o.get("padding", SAME))
        check_bias(c, bias, x, co, "bias")
        oh = checked_out_size(c, padding, h, kh, sh, dh, "height")
        ow = checked_out_size(c, padding, wd, kw, sw, dw, "width")
        if x.type_name != "float32" or hybrid:
            check_conv_quantization(c, x, w, y, co, hybrid=hybrid)
            if x.type_name == "uint8":
                check_bias_scale(c, x, w, bias, y)
        c.output_shape((n, oh, ow, co))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        o = ctx.options
        x, w = required(ctx, inputs, 0), required(ctx, inputs, 1)
        if x.ndim != 4 or w.ndim != 4:
            raise ctx.fail(f"expects rank-4 input and filter, got {x.shape} and {w.shape}")
        y = conv2d_nhwc(
            x,
            w,
            (int(o.get("stride_h", 1)), int(o.get("stride_w", 1))),
            (int(o.get("dilation_h_factor", 1) or 1), int(o.get("dilation_w_factor", 1) or 1)),
            int(o.get("padding", SAME)),
        )
        return _finish(ctx, y, _optional(inputs, 2))

    @classmethod
    def reference_quantized(
        cls, ctx: OpContext, inputs: list[np.ndarray | None]
    ) -> list[np.ndarray] | None:
        """Integer kernel (int8/uint8, per-tensor or per-channel) or hybrid kernel."""
        return _conv2d_quantized(ctx, inputs)

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        reason = super().gpu_support(op, graph, allow_quantized=allow_quantized)
        if reason:
            return reason
        x, w = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]]
        if len(w.shape) != 4:
            return f"filter of rank {len(w.shape)}"
        if w.shape[3] == 0 or x.shape[3] % w.shape[3]:
            return f"input channels {x.shape[3]} are not a multiple of filter channels {w.shape[3]}"
        return None


def conv3d_ndhwc(
    x: np.ndarray,
    w: np.ndarray,
    strides: tuple[int, int, int],
    dilations: tuple[int, int, int],
    padding: int,
) -> np.ndarray:
    """Conv of NDHWC ``x`` with a ``[KD, KH, KW, I, O]`` filter (CONV_3D's layout), float32,
    no bias; the paddings per axis as LiteRT's ``ComputePadding3DValues`` (the odd one after).
    """
    x, w = _f32(x), _f32(w)
    kd, kh, kw, ci, co = w.shape
    n = x.shape[0]
    sizes = [
        out_size(x.shape[1 + a], (kd, kh, kw)[a], strides[a], dilations[a], padding)
        for a in range(3)
    ]
    if min(sizes) < 0:
        raise ValueError(f"a {kd}x{kh}x{kw} window does not fit input {list(x.shape[1:4])}")
    out = np.zeros((n, *sizes, co), np.float32)
    if min(sizes) == 0:
        return out
    pads, need = [], []
    for a, k in enumerate((kd, kh, kw)):
        before, _ = pad_amounts(x.shape[1 + a], k, strides[a], dilations[a], sizes[a])
        span = (sizes[a] - 1) * strides[a] + (k - 1) * dilations[a] + 1
        pads.append((before, max(span - x.shape[1 + a] - before, 0)))
        need.append(span)
    xp = np.pad(x, ((0, 0), *pads, (0, 0)))
    acc = np.zeros((n * sizes[0] * sizes[1] * sizes[2], co), np.float64)
    for fz in range(kd):
        for fy in range(kh):
            for fx in range(kw):
                z0, y0, x0 = fz * dilations[0], fy * dilations[1], fx * dilations[2]
                tap = xp[
                    :,
                    z0 : z0 + (sizes[0] - 1) * strides[0] + 1 : strides[0],
                    y0 : y0 + (sizes[1] - 1) * strides[1] + 1 : strides[1],
                    x0 : x0 + (sizes[2] - 1) * strides[2] + 1 : strides[2],
                    :,
                ]
                acc += tap.reshape(-1, ci).astype(np.float64) @ w[fz, fy, fx].astype(np.float64)
    return acc.astype(np.float32).reshape(out.shape)


def _check_3d_filter(
    c: Check, x: Tensor, w: Tensor, bias: Tensor | None, *, in_axis: int, out_axis: int
) -> None:
    """CONV_3D's and CONV_3D_TRANSPOSE's filter rules: its ``in_axis`` holds the input's
    channels; the bias (`check_bias`) one value per output channel (its ``out_axis``)."""
    if x.shape[4] != w.shape[in_axis]:
        raise c.fail(
            "filter-channels",
            f"input has {x.shape[4]} channels, the filter {list(w.shape)} takes {w.shape[in_axis]}",
        )
    check_bias(c, bias, x, w.shape[out_axis], "bias")


@register
class Conv3D(OpDef):
    """CONV_3D (conv3d.cc): float32 NDHWC input, ``[KD, KH, KW, I, O]`` filter, optional bias,
    strides and dilations per axis, SAME or VALID padding, a fused activation. Timm's lambda
    layers (``nn.Conv3d`` of their relative positions) convert to it.

    The loader makes each with a constant filter a CONV_2D, which the GPU path runs
    (:mod:`litekiln.ops.conv3d_as_2d`; LiteRT's GPU delegate has no form of it): over the
    two other axes where its window is one cell along an axis (stride one there), else over
    its depth taps stacked as channels (torchvision's video ResNets). One whose filter or
    bias is computed at run time stays on the CPU.
    """

    name = "CONV_3D"
    rewritten_at_load = (
        "a CONV_2D at load: over the two other axes where its window is one cell along an "
        "axis, else over its depth taps stacked as channels"
    )
    gpu_limits = "a filter or bias computed at run time on the CPU"
    versions = (1, 1)
    num_inputs = (2, 3)

    @classmethod
    def validate(cls, c: Check) -> None:
        """Prepare's rules: rank-5 input and filter, the filter's input channels those of the
        input, float32 throughout, a bias of one value per output channel, a window that fits
        (padding, strides and dilations positive)."""
        super().validate(c)
        x, w = c.input(0), c.input(1)
        bias = c.optional(2)
        c.rank(x, 5, 5, "input")
        c.rank(w, 5, 5, "filter")
        for t, role in ((x, "input"), (w, "filter")):
            c.dtype(t, FLOAT32, role)
        c.output_dtype(np.dtype(np.float32))
        _check_3d_filter(c, x, w, bias, in_axis=3, out_axis=4)
        o = c.op.options
        padding = int(o.get("padding", SAME))
        sizes = []
        for a, axis in enumerate(("depth", "height", "width")):
            key = axis[0]
            sizes.append(
                checked_out_size(
                    c,
                    padding,
                    x.shape[1 + a],
                    w.shape[a],
                    int(o.get(f"stride_{key}", 0)),
                    int(o.get(f"dilation_{key}_factor", 1)),
                    axis,
                )
            )
        c.output_shape((x.shape[0], *sizes, w.shape[4]))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        o = ctx.options
        x, w = required(ctx, inputs, 0), required(ctx, inputs, 1)
        y = conv3d_ndhwc(
            x,
            w,
            tuple(int(o.get(f"stride_{k}", 1)) for k in "dhw"),  # type: ignore[arg-type]
            tuple(int(o.get(f"dilation_{k}_factor", 1) or 1) for k in "dhw"),  # type: ignore[arg-type]
            int(o.get("padding", SAME)),
        )
        return _finish(ctx, y, _optional(inputs, 2))


@register
class Conv3DTranspose(OpDef):
    """CONV_3D_TRANSPOSE (conv3d_transpose.cc): the gradient of a CONV_3D, as PyTorch's
    ``ConvTranspose3d`` and 3-D U-Nets' decoders convert. Inputs: the output shape (int32
    [5]), the filter ``[KD, KH, KW, O, I]``, the NDHWC input, an optional bias; float32; on
    the CPU. Each input value scatters its product with the filter's taps to the output,
    offset by the padding of the CONV_3D that would map the output back to the input."""

    name = "CONV_3D_TRANSPOSE"
    versions = (1, 1)
    num_inputs = (3, 4)

    @classmethod
    def validate(cls, c: Check) -> None:
        """Prepare's rules: a rank-1 int32 output shape of 5 values (not negative, its batch
        the input's, its channels the filter's); rank-5 float32 input and filter, the input's
        channels the filter's last dimension; a bias of one value per output channel; the
        CONV_3D from that output shape to the input's dimensions (its padding, strides and
        dilations) fits."""
        super().validate(c)
        shape_t, w, x = c.input(0), c.input(1), c.input(2)
        bias = c.optional(3)
        c.dtype(shape_t, frozenset({"int32"}), "output shape")
        if shape_t.shape != (5,):
            raise c.fail("shape", f"output shape {list(shape_t.shape)}: 5 values needed")
        c.rank(x, 5, 5, "input")
        c.rank(w, 5, 5, "filter")
        for t, role in ((x, "input"), (w, "filter"), (c.output(), "output")):
            c.dtype(t, FLOAT32, role)
        _check_3d_filter(c, x, w, bias, in_axis=4, out_axis=3)
        if shape_t.data is None:
            return  # sized at run time
        out = [int(v) for v in np.asarray(shape_t.data).reshape(-1)]
        if min(out) < 0 or out[0] != x.shape[0] or out[4] != w.shape[3]:
            raise c.fail("output-shape", f"output shape {out} for input {list(x.shape)}")
        o = c.op.options
        padding = int(o.get("padding", SAME))
        for a, axis in enumerate(("depth", "height", "width")):
            key = axis[0]
            back = checked_out_size(
                c, padding, out[1 + a], w.shape[a], int(o.get(f"stride_{key}", 0)),
                int(o.get(f"dilation_{key}_factor", 1)), axis,
            )  # fmt: skip
            if back != x.shape[1 + a]:
                raise c.fail(
                    "output-shape",
                    f"output shape {out}: its {axis} {out[1 + a]} convolves back to {back}, "
                    f"not the input's {x.shape[1 + a]}",
                )
        c.output_shape(tuple(out))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        o = ctx.options
        out = [int(v) for v in np.asarray(required(ctx, inputs, 0)).reshape(-1)]
        w = np.asarray(required(ctx, inputs, 1), np.float32)
        x = np.asarray(required(ctx, inputs, 2), np.float32)
        strides = [int(o.get(f"stride_{k}", 1)) for k in "dhw"]
        dilations = [int(o.get(f"dilation_{k}_factor", 1) or 1) for k in "dhw"]
        pads = [
            pad_amounts(out[1 + a], w.shape[a], strides[a], dilations[a], x.shape[1 + a])[0]
            for a in range(3)
        ]
        full = [
            (x.shape[1 + a] - 1) * strides[a] + (w.shape[a] - 1) * dilations[a] + 1
            for a in range(3)
        ]
        big = np.zeros((x.shape[0], *full, w.shape[3]), np.float32)
        for kd in range(w.shape[0]):
            for kh in range(w.shape[1]):
                for kw in range(w.shape[2]):
                    at = [k * dilations[a] for a, k in enumerate((kd, kh, kw))]
                    region = tuple(
                        slice(at[a], at[a] + (x.shape[1 + a] - 1) * strides[a] + 1, strides[a])
                        for a in range(3)
                    )
                    big[(slice(None), *region)] += x @ w[kd, kh, kw].T
        y = np.zeros((x.shape[0], *out[1:4], w.shape[3]), np.float32)
        src = tuple(slice(p, min(p + n, f)) for p, n, f in zip(pads, out[1:4], full, strict=True))
        dst = tuple(slice(0, r.stop - r.start) for r in src)
        y[(slice(None), *dst)] = big[(slice(None), *src)]
        return _finish(ctx, y, _optional(inputs, 3))


def _hlo_conv_geometry(o: dict, rank: int) -> dict[str, list[int]]:
    """STABLEHLO_CONVOLUTION's options, with StableHLO's defaults for absent ones."""
    n = rank - 2
    return {
        "strides": list(o.get("window_strides") or [1] * n),
        "padding": list(o.get("padding") or [0] * (2 * n)),
        "lhs_dilation": list(o.get("lhs_dilation") or [1] * n),
        "rhs_dilation": list(o.get("rhs_dilation") or [1] * n),
        "reversal": [bool(v) for v in (o.get("window_reversal") or [False] * n)],
        "in_spatial": list(o.get("input_spatial_dimensions") or []),
        "k_spatial": list(o.get("kernel_spatial_dimensions") or []),
        "out_spatial": list(o.get("output_spatial_dimensions") or []),
    }


@register
class StablehloConvolution(OpDef):
    """StableHLO's general convolution, as litert-torch writes PyTorch's ConvTranspose3d
    (an input dilated by the stride, padded, convolved with the flipped kernel) and LiteRT
    has no kernel for: a CPU reference here (float32), so that such a model runs where
    LiteRT refuses it. Any dimension numbers; window strides, padding (negative crops),
    input (lhs) and kernel (rhs) dilations, window reversal and feature groups; one batch
    group."""

    name = "STABLEHLO_CONVOLUTION"
    versions = (1, 1)
    num_inputs = (2, 2)

    @classmethod
    def validate(cls, c: Check) -> None:
        """float32 operands of one rank (3 or more) whose dimension numbers name every
        dimension once; the options' lengths the spatial dimensions'; positive strides and
        dilations; feature groups dividing both feature counts, one batch group; the output
        the convolution's shape in the output's dimension order."""
        super().validate(c)
        x, w = c.input(0), c.input(1)
        for t, role in ((x, "lhs"), (w, "rhs"), (c.output(), "output")):
            c.dtype(t, FLOAT32, role)
        rank = len(x.shape)
        if rank < 3 or len(w.shape) != rank:
            raise c.fail("rank", f"lhs {list(x.shape)} and rhs {list(w.shape)}: one rank >= 3")
        o = c.op.options
        g = _hlo_conv_geometry(o, rank)
        n = rank - 2
        names = {
            "input": [int(o.get("input_batch_dimension", 0)),
                      int(o.get("input_feature_dimension", 0)), *g["in_spatial"]],
            "kernel": [int(o.get("kernel_output_feature_dimension", 0)),
                       int(o.get("kernel_input_feature_dimension", 0)), *g["k_spatial"]],
            "output": [int(o.get("output_batch_dimension", 0)),
                       int(o.get("output_feature_dimension", 0)), *g["out_spatial"]],
        }  # fmt: skip
        lengths = [len(g[k]) for k in ("strides", "lhs_dilation", "rhs_dilation", "reversal")]
        if (
            any(sorted(v) != list(range(rank)) for v in names.values())
            or lengths != [n] * 4
            or len(g["padding"]) != 2 * n
            or min(g["strides"] + g["lhs_dilation"] + g["rhs_dilation"]) <= 0
        ):
            raise c.fail("option-value", f"dimension numbers or window options {o}")
        groups = int(o.get("feature_group_count", 1) or 1)
        if int(o.get("batch_group_count", 1) or 1) != 1:
            raise c.fail("option-value", "batch_group_count above 1 is not implemented")
        xs = [x.shape[d] for d in names["input"]]
        ks = [w.shape[d] for d in names["kernel"]]
        if groups < 1 or xs[1] != ks[1] * groups or ks[0] % groups:
            raise c.fail(
                "feature-groups",
                f"lhs features {xs[1]}, rhs {ks[1]} in and {ks[0]} out, {groups} groups",
            )
        spatial = []
        for i in range(n):
            size = (xs[2 + i] - 1) * g["lhs_dilation"][i] + 1
            size += g["padding"][2 * i] + g["padding"][2 * i + 1]
            window = (ks[2 + i] - 1) * g["rhs_dilation"][i] + 1
            if size < window:
                raise c.fail("window", f"spatial dimension {i}: window {window} over {size}")
            spatial.append((size - window) // g["strides"][i] + 1)
        canonical = [xs[0], ks[0], *spatial]
        out = [0] * rank
        for d, v in zip(names["output"], canonical, strict=True):
            out[d] = v
        c.output_shape(tuple(out))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        o = ctx.options
        x = np.asarray(required(ctx, inputs, 0), np.float32)
        w = np.asarray(required(ctx, inputs, 1), np.float32)
        rank, n = x.ndim, x.ndim - 2
        g = _hlo_conv_geometry(o, rank)
        lhs = x.transpose(
            [
                int(o.get("input_batch_dimension", 0)),
                int(o.get("input_feature_dimension", 0)),
                *g["in_spatial"],
            ]
        )
        out_f = int(o.get("kernel_output_feature_dimension", 0))
        in_f = int(o.get("kernel_input_feature_dimension", 0))
        rhs = w.transpose([out_f, in_f, *g["k_spatial"]])
        flip = tuple(2 + i for i in range(n) if g["reversal"][i])
        if flip:
            rhs = np.flip(rhs, flip)
        if max(g["lhs_dilation"]) > 1:  # zeros between the input's elements
            dil = g["lhs_dilation"]
            sizes = [(sz - 1) * d + 1 for sz, d in zip(lhs.shape[2:], dil, strict=True)]
            grown = np.zeros((*lhs.shape[:2], *sizes), np.float32)
            grown[(slice(None), slice(None), *(slice(None, None, d) for d in dil))] = lhs
            lhs = grown
        pad = [(0, 0), (0, 0)]
        crop = [slice(None), slice(None)]
        for i in range(n):
            lo, hi = g["padding"][2 * i], g["padding"][2 * i + 1]
            pad.append((max(lo, 0), max(hi, 0)))
            size = lhs.shape[2 + i] + max(lo, 0) + max(hi, 0)
            crop.append(slice(max(-lo, 0), size - max(-hi, 0)))
        lhs = np.pad(lhs, pad)[tuple(crop)]
        groups = int(o.get("feature_group_count", 1) or 1)
        n_out, c_in = rhs.shape[0], rhs.shape[1]
        strides, rd = g["strides"], g["rhs_dilation"]
        spatial = [
            (lhs.shape[2 + i] - ((rhs.shape[2 + i] - 1) * rd[i] + 1)) // strides[i] + 1
            for i in range(n)
        ]
        y = np.zeros((lhs.shape[0], n_out, *spatial), np.float32)
        per = n_out // groups
        for taps in np.ndindex(*rhs.shape[2:]):
            window = tuple(
                slice(t * rd[i], t * rd[i] + (spatial[i] - 1) * strides[i] + 1, strides[i])
                for i, t in enumerate(taps)
            )
            for k in range(groups):
                part = lhs[(slice(None), slice(k * c_in, (k + 1) * c_in), *window)]
                kern = rhs[(slice(k * per, (k + 1) * per), slice(None), *taps)]
                y[:, k * per : (k + 1) * per] += np.einsum("nc...,oc->no...", part, kern)
        order = [0] * rank
        for canonical, d in enumerate([int(o.get("output_batch_dimension", 0)),
                                       int(o.get("output_feature_dimension", 0)),
                                       *g["out_spatial"]]):  # fmt: skip
            order[d] = canonical
        return [np.ascontiguousarray(y.transpose(order))]


@register
class DepthwiseConv2D(_ConvLike):
    """DEPTHWISE_CONV_2D: filter 1HW(C*M); output channel ``c*M + m`` reads input channel c."""

    name = "DEPTHWISE_CONV_2D"
    gpu = True
    gpu_max_version = 2  # v2 adds dilation (documented GPU table: v1-2, docs/architecture.md)
    # The TFLite GPU delegate accepts DEPTHWISE_CONV_2D up to v6 with quantized models.
    gpu_quant_max_version = 6
    versions = (1, 7)
    num_inputs = (2, 3)

    @classmethod
    def validate(cls, c: Check) -> None:
        """depthwise_conv.cc's Prepare, plus the filter rules of CONV_2D's, and a depth
        multiplier consistent with the shapes for a hybrid op (LiteRT's hybrid kernel reads
        the option; the others compute it from the shapes)."""
        super().validate(c)
        x, w, y = c.input(0), c.input(1), c.output()
        bias = c.input(2) if len(c.op.inputs) == 3 else None
        c.rank(x, 4, None, "input")
        c.rank(w, 4, None, "filter")
        o = c.op.options
        sh, sw = int(o.get("stride_h", 0)), int(o.get("stride_w", 0))
        dh, dw = int(o.get("dilation_h_factor", 0)), int(o.get("dilation_w_factor", 0))
        if max(sh, sw, dh, dw) > 0x7FFF:
            raise c.fail("window", f"strides {sh}x{sw} and dilations {dh}x{dw} exceed 32767")
        n, h, wd, ci = x.shape
        _, kh, kw, co = w.shape
        if min(h, wd, ci) <= 0 or min(kh, kw, co) <= 0:
            raise c.fail(
                "empty-dimension",
                f"input {list(x.shape)} and filter {list(w.shape)} need positive sizes",
            )
        hybrid = _check_conv_dtypes(c, x, w, y, "DEPTHWISE_CONV_2D")
        if w.shape[0] != 1:
            raise c.fail("filter-shape", f"filter {list(w.shape)} is not [1, H, W, C]")
        if co % ci:
            raise c.fail(
                "filter-channels",
                f"filter channels {co} are not a multiple of the input's {ci}",
            )
        if bias is not None:
            c.rank(bias, 1, None, "bias")
        check_bias(c, bias, x, co, "bias")
        padding = int(o.get("padding", SAME))
        oh = checked_out_size(c, padding, h, kh, sh, dh, "height")
        ow = checked_out_size(c, padding, wd, kw, sw, dw, "width")
        if x.type_name != "float32":
            check_conv_quantization(c, x, w, y, co, hybrid=False)
        elif hybrid:
            c.quantized(w, "filter", per_tensor=False)
            q = w.quantization
            assert q is not None
            if q.scale.size != w.shape[q.axis]:
                raise c.fail(
                    "quantization-scale-count",
                    f"filter {w.name!r}: {q.scale.size} scales, its dimension {q.axis} is "
                    f"{w.shape[q.axis]}",
                )
            dm = int(o.get("depth_multiplier", 0))
            if dm * ci != co:
                raise c.fail(
                    "depth-multiplier",
                    f"depth_multiplier {dm} x {ci} input channels != {co} filter channels",
                )
        c.output_shape((n, oh, ow, co))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        o = ctx.options
        x, w = _f32(required(ctx, inputs, 0)), _f32(required(ctx, inputs, 1))
        if x.ndim != 4 or w.ndim != 4 or w.shape[0] != 1:
            raise ctx.fail(f"expects NHWC input and 1HWC filter, got {x.shape} and {w.shape}")
        c = x.shape[3]
        _, kh, kw, co = w.shape
        if co % c:
            raise ctx.fail(f"filter has {co} channels, not a multiple of the input's {c}")
        # LiteRT's float and 8-bit kernels take the multiplier from the shapes, not the option.
        mult = co // c
        sh, sw = int(o.get("stride_h", 1)), int(o.get("stride_w", 1))
        dh = int(o.get("dilation_h_factor", 1) or 1)
        dw = int(o.get("dilation_w_factor", 1) or 1)
        padding = int(o.get("padding", SAME))
        oh, ow, pad_h, pad_w = conv_geometry(x.shape, kh, kw, sh, sw, dh, dw, padding)
        if mult > 1:
            x = np.repeat(x, mult, axis=3)
        taps = window_taps(x, kh, kw, sh, sw, dh, dw, oh, ow, pad_h, pad_w)
        wt = w.reshape(kh * kw, co)
        y = np.zeros((x.shape[0], oh, ow, co), np.float32)
        tmp = np.empty_like(y)
        for i, tap in enumerate(taps):
            np.multiply(tap, wt[i], out=tmp)
            y += tmp
        return _finish(ctx, y, _optional(inputs, 2))

    @classmethod
    def reference_quantized(
        cls, ctx: OpContext, inputs: list[np.ndarray | None]
    ) -> list[np.ndarray] | None:
        """Integer kernel (int8/uint8, per-tensor or per-channel) or hybrid kernel."""
        return _depthwise_quantized(ctx, inputs)


@register
class TransposeConv(_ConvLike):
    """TRANSPOSE_CONV: inputs (output_shape int32[4], filter OHWI, input NHWC, bias? (v3+)).

    Padding is computed as for a conv from the output back to the input
    (``ComputePaddingHeightWidth`` on the output size), offset ignored as in TFLite.
    """

    name = "TRANSPOSE_CONV"
    gpu = True
    gpu_max_version = 1
    # The GPU delegate accepts TRANSPOSE_CONV up to v3 (bias input); v4 adds fused activation.
    gpu_quant_max_version = 3
    data_input = 2
    weight_input = 1
    bias_input = 3
    versions = (1, 5)
    num_inputs = (3, 4)

    @classmethod
    def validate(cls, c: Check) -> None:
        """transpose_conv.cc's Prepare and the checks its Eval makes before computing (the
        output shape's batch and channels, the input size the conv of the output gives back).
        litekiln also needs a constant output_shape of 4 positive values, and does not run
        the hybrid kernel (float input, int8 weights)."""
        super().validate(c)
        shape_t, w, x, y = c.input(0), c.input(1), c.input(2), c.output()
        bias = c.optional(3)
        c.rank(shape_t, 1, None, "output_shape")
        c.rank(x, 4, None, "input")
        c.rank(w, 4, None, "weights")
        o = c.op.options
        sh, sw = int(o.get("stride_h", 0)), int(o.get("stride_w", 0))
        if not (0 < sh <= 0x7FFF and 0 < sw <= 0x7FFF):
            raise c.fail("window", f"strides {sh}x{sw} must be in 1-32767")
        if min(x.shape[1:]) <= 0 or min(w.shape[:3]) <= 0:
            raise c.fail(
                "empty-dimension",
                f"input {list(x.shape)} and weights {list(w.shape)} need positive sizes",
            )
        c.dtype(x, frozenset({"float32", "uint8", "int8", "int16"}), "input")
        xt = x.type_name
        c.dtype(w, frozenset({"int8" if xt == "int16" else xt}), "weights")
        check_bias(c, bias, x, w.shape[0], "bias")
        if xt == "int16":
            c.zero_point(x, 0, "input")
            c.zero_point(y, 0, "output")
        c.same_dtype(y, x, "output")
        if x.shape[3] != w.shape[3]:
            raise c.fail(
                "filter-channels",
                f"input has {x.shape[3]} channels, the weights {w.shape[3]}",
            )
        if xt != "float32":
            check_conv_quantization(c, x, w, y, w.shape[0], hybrid=False)
        if shape_t.data is None:
            raise c.fail("output-shape-constant", "output_shape is not a constant")
        c.dtype(shape_t, frozenset({"int32"}), "output_shape")
        out = tuple(int(v) for v in shape_t.data.reshape(-1))
        if len(out) != 4 or out[0] != x.shape[0] or min(out[1:3]) <= 0 or out[3] != w.shape[0]:
            raise c.fail(
                "output-shape-value",
                f"output_shape {list(out)} for input {list(x.shape)} and weights "
                f"{list(w.shape)}: expected [batch, height > 0, width > 0, output channels]",
            )
        padding = int(o.get("padding", SAME))
        ih = checked_out_size(c, padding, out[1], w.shape[1], sh, 1, "height")
        iw = checked_out_size(c, padding, out[2], w.shape[2], sw, 1, "width")
        if (ih, iw) != x.shape[1:3]:
            raise c.fail(
                "output-shape-value",
                f"output_shape {list(out)} maps back to {ih}x{iw}, the input is "
                f"{x.shape[1]}x{x.shape[2]}",
            )
        c.output_shape(out)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        o = ctx.options
        shape = np.asarray(required(ctx, inputs, 0)).astype(np.int64).reshape(-1)
        w, x = required(ctx, inputs, 1), required(ctx, inputs, 2)
        if shape.size != 4 or x.ndim != 4 or w.ndim != 4:
            raise ctx.fail(f"expects output_shape of 4 and rank-4 tensors, got {shape.tolist()}")
        sh, sw = int(o.get("stride_h", 1)), int(o.get("stride_w", 1))
        padding = int(o.get("padding", SAME))
        oh, ow = int(shape[1]), int(shape[2])
        kh, kw = w.shape[1], w.shape[2]
        # ComputePaddingHeightWidth(stride, 1, out_h, out_w, kh, kw, padding): the padding of
        # the forward conv that maps the output back to the input.
        pad_h = pad_amounts(oh, kh, sh, 1, out_size(oh, kh, sh, 1, padding))[0]
        pad_w = pad_amounts(ow, kw, sw, 1, out_size(ow, kw, sw, 1, padding))[0]
        if int(shape[0]) != x.shape[0] or int(shape[3]) != w.shape[0]:
            raise ctx.fail(
                f"output_shape {shape.tolist()} disagrees with input batch {x.shape[0]} / "
                f"filter outputs {w.shape[0]}"
            )
        y = transpose_conv_nhwc(x, w, (oh, ow), (sh, sw), (pad_h, pad_w))
        return _finish(ctx, y, _optional(inputs, 3))

    @classmethod
    def integer_operands(cls, op: Op) -> set[int]:
        return {op.inputs[0]}

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        reason = super().gpu_support(op, graph, allow_quantized=allow_quantized)
        if reason:
            return reason
        if not _const(graph, op.inputs[0]):
            return "runtime output_shape; the GPU path needs it constant"
        return None


@register
class FullyConnected(_ConvLike):
    """FULLY_CONNECTED: ``y = x.reshape(-1, in) @ W.T + b``, W [units, in].

    ``keep_num_dims`` keeps the input's leading dims (``[..., units]``), otherwise the output
    is ``[N, units]``. Only the DEFAULT weights format exists in float models.
    """

    name = "FULLY_CONNECTED"
    gpu = True
    gpu_max_version = 1
    # The GPU delegate accepts FULLY_CONNECTED up to v9 with quantized models.
    gpu_quant_max_version = 9
    nhwc = False
    computed_weights = True
    versions = (1, 14)
    num_inputs = (2, 3)

    @classmethod
    def validate(cls, c: Check) -> None:
        """fully_connected.cc's Prepare (CheckTypes, activations, shapes, quantization).
        litekiln also refuses the shuffled weights format (not implemented), an input whose
        size is not a whole number of rows (LiteRT drops the rest), a hybrid op with uint8
        weights and an 8-bit op whose weights are not of the input's type (LiteRT would read
        their bytes as int8)."""
        super().validate(c)
        o = c.op.options
        fmt = int(o.get("weights_format", 0))
        if fmt not in (0, 1):
            raise c.fail("weights-format", f"weights format {fmt} is unknown")
        if fmt == 1:
            raise c.fail("weights-format", "the shuffled weights format is not supported")
        c.count("outputs", len(c.op.outputs), 1, 1)
        x, w, y = c.input(0), c.input(1), c.output()
        bias = c.optional(2)
        xt, wt = x.type_name, w.type_name
        hybrid = xt == "float32" and wt in INT8S | {"int4"}  # (int4: unpacked at load)
        if wt in QUANTIZED or wt == "int4":
            if hybrid:
                c.dtype(w, frozenset({"int8", "int4"}), "weights")
                c.dtype(y, FLOAT32, "output")
                if bias is not None:
                    c.dtype(bias, FLOAT32, "bias")
            else:
                c.dtype(x, QUANTIZED, "input")
                c.dtype(y, QUANTIZED, "output")
                c.dtype(
                    w,
                    frozenset({"int8", "int16", "int4"} if xt == "int16" else {xt, "int4"}),
                    "weights",
                )
                if bias is not None:
                    c.dtype(bias, frozenset({"int32", "int64"}), "bias")
        else:
            c.dtype(x, FLOAT32, "input")
            c.dtype(y, FLOAT32, "output")
            c.dtype(w, FLOAT32, "weights")
            if bias is not None:
                c.dtype(bias, FLOAT32, "bias")
        act = c.activation()
        if not hybrid and act not in (0, 1, 2, 3):
            raise c.fail("activation", f"fused activation {act}: the kernel clamps only")
        c.rank(w, 2, None, "weights")
        units, depth = w.shape
        size = math.prod(x.shape)
        keep = bool(o.get("keep_num_dims"))
        if depth == 0:
            out: tuple[int, ...] = (
                (*x.shape[:-1], units) if keep else (math.prod(x.shape[:-1]), units)
            )
            c.output_shape(out)
            return
        if bias is not None and bias.size != units:
            raise c.fail("bias-size", f"bias {bias.name!r} has {bias.size} values for {units}")
        if xt in QUANTIZED:
            c.quantized(x, "input")
            c.quantized(w, "weights", per_tensor=False)
            c.quantized(y, "output")
            q = w.quantization
            assert q is not None
            if q.scale.size > 1:
                if xt not in ("int8", "int16") or q.axis != 0 or q.scale.size != units:
                    raise c.fail(
                        "quantization-per-channel",
                        f"weights {w.name!r}: per-channel scales need an int8/int16 input and "
                        f"{units} scales along dimension 0",
                    )
                # FullyConnectedPerChannel takes the weights as symmetric: it never reads
                # their zero points (fully_connected.cc), so only 0 means what it computes.
                c.zero_point(w, 0, "weights")
            else:
                check_bias_scale(c, x, w, bias, y)
            check_activation_range(c, y)
        if xt == "int16" and y.type_name == "int16":
            c.zero_point(x, 0, "input")
            c.zero_point(y, 0, "output")
        if keep and x.shape[-1:] != (depth,):
            raise c.fail(
                "input-shape",
                f"keep_num_dims: the input's last dimension {x.shape[-1:]} is not {depth}",
            )
        if size % depth:
            raise c.fail(
                "input-shape",
                f"input of {size} elements is not a whole number of rows of {depth}",
            )
        c.output_shape((*x.shape[:-1], units) if keep else (size // depth, units))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        o = ctx.options
        if int(o.get("weights_format", 0) or 0) != 0:
            raise ctx.fail("only the DEFAULT weights format is supported (not SHUFFLED4x16INT8)")
        if fused_activation(ctx.op) not in (0, 1, 2, 3):
            # LiteRT's Prepare refuses these (fully_connected.cc), so the reference does too.
            raise ctx.fail(f"fused activation code {fused_activation(ctx.op)} is not supported")
        x, w = _f32(required(ctx, inputs, 0)), _f32(required(ctx, inputs, 1))
        if w.ndim != 2:
            raise ctx.fail(f"weights of shape {w.shape}, expected [units, in]")
        units, depth = w.shape
        if x.size % depth:
            raise ctx.fail(f"input of {x.size} elements does not split into rows of {depth}")
        y = x.reshape(-1, depth) @ w.T
        if o.get("keep_num_dims"):
            y = y.reshape(*x.shape[:-1], units)
        return _finish(ctx, y, _optional(inputs, 2))

    @classmethod
    def reference_quantized(
        cls, ctx: OpContext, inputs: list[np.ndarray | None]
    ) -> list[np.ndarray] | None:
        """Integer kernel (int8/uint8, per-tensor or per-channel) or hybrid kernel."""
        return _fully_connected_quantized(ctx, inputs)

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        reason = super().gpu_support(op, graph, allow_quantized=allow_quantized)
        if reason:
            return reason
        if int(op.options.get("weights_format", 0) or 0) != 0:
            # Any rank and keep_num_dims are fine: the GPU form multiplies the input's rows
            # (every dimension but the last) and reshapes to the declared output.
            return (
                "weights_format SHUFFLED4x16INT8 (an int8 layout pre-shuffled for one CPU "
                "kernel): the GPU form reads the default layout"
            )
        return None


#: TfLitePadding of the C API (raw custom-option structs): 0 unknown, 1 SAME, 2 VALID.
C_PADDING_SAME, C_PADDING_VALID = 1, 2


def c_struct_ints(ctx: OpContext, count: int) -> tuple[int, ...]:
    """The first ``count`` int32 fields of a raw C params struct in ``custom_options``."""
    raw = ctx.op.custom_options or b""
    if len(raw) < 4 * count:
        raise ctx.fail(f"custom options of {len(raw)} bytes, expected at least {4 * count}")
    return struct.unpack_from(f"<{count}i", raw, 0)


@register
class Convolution2DTransposeBias(_ConvLike):
    """MediaPipe's transposed conv with bias (mediapipe/util/tflite/operations/
    transpose_conv_bias.cc): inputs (input NHWC, filter OHWI, bias [O]); custom options are a
    raw ``TfLiteTransposeConvParams``: int32 padding (1 SAME, 2 VALID), stride_width,
    stride_height. Output ``stride * (in - 1) + filter - pad_total`` with
    ``pad_total = max(0, filter - (in - 1) % stride - 1)`` for SAME (0 for VALID), and the
    scatter offset ``pad_total // 2``.

    Not in the documented GPU table (a custom op); the TFLite GPU delegate runs it
    (MediaPipe registers its GPU kernel), so the extended table does too.
    """

    name = "Convolution2DTransposeBias"
    gpu_extended = True
    versions = None
    num_inputs = (3, 3)

    @classmethod
    def validate(cls, c: Check) -> None:
        """MediaPipe's Prepare (transpose_conv_bias.cc): three float inputs, rank-4 input and
        filter of the same depth, one bias per output channel, valid raw options."""
        super().validate(c)
        try:
            padding, stride_w, stride_h = cls.params(c.op)
        except ValueError as e:
            raise c.fail("custom-options", str(e)) from None
        x, w, b, y = c.input(0), c.input(1), c.input(2), c.output()
        for t, role in ((x, "input"), (w, "filter"), (b, "bias"), (y, "output")):
            c.dtype(t, FLOAT32, role)
        c.rank(x, 4, None, "input")
        c.rank(w, 4, None, "filter")
        c.rank(b, 1, None, "bias")
        if x.shape[3] != w.shape[3] or b.shape[0] != w.shape[0] or min(w.shape[1:3]) <= 0:
            raise c.fail(
                "filter-channels",
                f"input {list(x.shape)}, filter {list(w.shape)} and bias {list(b.shape)} "
                "do not agree",
            )
        h, wd = x.shape[1], x.shape[2]
        kh, kw = w.shape[1], w.shape[2]
        tot_h = tot_w = 0
        if padding == C_PADDING_SAME:
            tot_h = max(0, kh - (h - 1) % stride_h - 1)
            tot_w = max(0, kw - (wd - 1) % stride_w - 1)
        oh = stride_h * (h - 1) + kh - tot_h
        ow = stride_w * (wd - 1) + kw - tot_w
        c.output_shape((x.shape[0], oh, ow, w.shape[0]))

    @staticmethod
    def params(op: Op) -> tuple[int, int, int]:
        """(padding code, stride_w, stride_h) from the raw custom options.

        Raises:
            ValueError: Options too short, a non-positive stride or an unknown padding code.
        """
        raw = op.custom_options or b""
        if len(raw) < 12:
            raise ValueError(f"custom options of {len(raw)} bytes, expected at least 12")
        padding, stride_w, stride_h = struct.unpack_from("<3i", raw, 0)
        if stride_w <= 0 or stride_h <= 0:
            raise ValueError(f"strides {stride_h}x{stride_w} must be positive")
        if padding not in (C_PADDING_SAME, C_PADDING_VALID):
            raise ValueError(f"padding code {padding} is neither SAME (1) nor VALID (2)")
        return padding, stride_w, stride_h

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        try:
            padding, stride_w, stride_h = cls.params(ctx.op)
        except ValueError as e:
            raise ctx.fail(str(e)) from None
        x, w, b = (required(ctx, inputs, i) for i in range(3))
        if x.ndim != 4 or w.ndim != 4 or b.ndim != 1:
            raise ctx.fail(
                f"expects NHWC input, OHWI filter and 1-D bias, got {x.shape}, {w.shape}, {b.shape}"
            )
        h, wd = x.shape[1], x.shape[2]
        kh, kw = w.shape[1], w.shape[2]
        tot_h = tot_w = 0
        if padding == C_PADDING_SAME:
            tot_h = max(0, kh - (h - 1) % stride_h - 1)
            tot_w = max(0, kw - (wd - 1) % stride_w - 1)
        oh = stride_h * (h - 1) + kh - tot_h
        ow = stride_w * (wd - 1) + kw - tot_w
        y = transpose_conv_nhwc(x, w, (oh, ow), (stride_h, stride_w), (tot_h // 2, tot_w // 2))
        return [y + _f32(b)]

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        reason = super().gpu_support(op, graph, allow_quantized=allow_quantized)
        if reason:
            return reason
        try:
            cls.params(op)
        except ValueError as e:
            return str(e)
        if len(op.inputs) != 3 or op.inputs[2] < 0:
            return "expects input, filter and bias"
        return None


# -- integer and hybrid semantics -------------------------------------------------------------
#
# LiteRT's quantized conv / depthwise / fully-connected kernels (reference_integer_ops and the
# optimized kernels agree bit for bit): acc = sum (w - w_zp) * (x - x_zp) in int32, padded cells
# skipped, + int32 bias, rescaled by QuantizeMultiplier(x_scale * w_scale[c] / out_scale)
# (computed in double), + out_zp, clamped to the fused activation's integer range.
#
# Hybrid (dynamic-range) kernels have float activations and int8 constant weights: each batch
# (conv, depthwise) or row (fully-connected) of the input is quantized to int8 on the fly, the
# products accumulate in int32, and acc * x_scale * w_scale[c] + bias is the float output.
# Which on-the-fly quantization LiteRT's builtin kernels use:
#   CONV_2D with per-channel weights and DEPTHWISE_CONV_2D: asymmetric, per batch;
#   CONV_2D with per-tensor weights: symmetric, per batch;
#   FULLY_CONNECTED: per row, asymmetric iff ``asymmetric_quantize_inputs``.
# (The XNNPACK delegate of LiteRT's default resolver quantizes asymmetrically in every case.)
# Exact integer sums are computed as float64 products: |terms| <= 255 * 255, far from 2**53.


def _centered(x: np.ndarray, zero_point: np.ndarray | int) -> np.ndarray:
    return x.astype(np.float64) - np.asarray(zero_point, np.float64)


def _exact_int(acc: np.ndarray) -> np.ndarray:
    return np.rint(acc).astype(np.int64)


def _conv_sums(
    xc: np.ndarray,
    wc: np.ndarray,
    strides: tuple[int, int],
    dilations: tuple[int, int],
    padding: int,
) -> np.ndarray:
    """Exact (float64) NHWC x OHWI conv sums of zero-centred operands; grouped as conv2d_nhwc."""
    n, _, _, c = xc.shape
    o, kh, kw, ci = wc.shape
    if ci <= 0 or c % ci or o % (c // ci):
        raise ValueError(f"input of {c} channels does not match a filter of {ci} x {o}")
    groups = c // ci
    oh, ow, pad_h, pad_w = conv_geometry(xc.shape, kh, kw, *strides, *dilations, padding)
    taps = window_taps(xc, kh, kw, *strides, *dilations, oh, ow, pad_h, pad_w)
    og = o // groups
    out = np.empty((n, oh, ow, o), np.float64)
    for g in range(groups):
        cs = slice(g * ci, (g + 1) * ci)
        cols = np.stack([t[..., cs] for t in taps], axis=3).reshape(-1, kh * kw * ci)
        wg = wc[g * og : (g + 1) * og].reshape(og, kh * kw * ci)
        out[..., g * og : (g + 1) * og] = (cols @ wg.T).reshape(n, oh, ow, og)
    return out


def _depthwise_sums(
    xc: np.ndarray,
    wc: np.ndarray,
    strides: tuple[int, int],
    dilations: tuple[int, int],
    padding: int,
) -> np.ndarray:
    """Exact depthwise sums; output channel ``c*M + m`` reads input channel c."""
    c = xc.shape[3]
    _, kh, kw, co = wc.shape
    if co % c:
        raise ValueError(f"filter has {co} channels, not a multiple of the input's {c}")
    if co != c:
        xc = np.repeat(xc, co // c, axis=3)
    oh, ow, pad_h, pad_w = conv_geometry(xc.shape, kh, kw, *strides, *dilations, padding)
    taps = window_taps(xc, kh, kw, *strides, *dilations, oh, ow, pad_h, pad_w)
    wt = wc.reshape(kh * kw, co)
    out = np.zeros((xc.shape[0], oh, ow, co), np.float64)
    for i, tap in enumerate(taps):
        out += tap * wt[i]
    return out


def _window_options(ctx: OpContext) -> tuple[tuple[int, int], tuple[int, int], int]:
    o = ctx.options
    return (
        (int(o.get("stride_h", 1)), int(o.get("stride_w", 1))),
        (int(o.get("dilation_h_factor", 1) or 1), int(o.get("dilation_w_factor", 1) or 1)),
        int(o.get("padding", SAME)),
    )


def _integer_output(
    ctx: OpContext,
    acc: np.ndarray,
    bias: np.ndarray | None,
    w_tensor_index: int,
    channels: int,
    *,
    gemm: bool = False,
) -> list[np.ndarray]:
    """Bias, per-channel rescale, output zero point and activation clamp of an integer kernel;
    ``gemm``: LiteRT rescales in ruy (conv and FC go through its GEMM), ties upward."""
    xt, wt, yt = ctx.input_tensor(0), ctx.input_tensor(w_tensor_index), ctx.output_tensor()
    assert xt is not None and wt is not None
    if bias is not None:
        acc = acc + bias.astype(np.int64).reshape(-1)
    x_scale, _ = qmath.scale_zp(xt)
    y_scale, y_zp = qmath.scale_zp(yt)
    real = np.float64(x_scale) * qmath.channel_scales(wt, channels) / np.float64(y_scale)
    mult, shift = qmath.quantize_multipliers(real)
    lo, hi = qmath.activation_range(fused_activation(ctx.op), yt)
    return [qmath.requantize(acc, mult, shift, y_zp, lo, hi, yt.dtype, ties_up=gemm)]


def _hybrid_output(
    ctx: OpContext,
    acc: np.ndarray,
    row_scales: np.ndarray,
    bias: np.ndarray | None,
    channels: int,
    *,
    depthwise: bool = False,
) -> list[np.ndarray]:
    """The float output of a hybrid kernel, in float32 and in LiteRT's order (bit-exact
    against its outputs given the same sums): conv and FC ``acc * (x_scale * w_scale) + b``,
    depthwise ``acc * w_scale * x_scale + b``; input scales per batch/row, broadcast by the
    caller."""
    wt = ctx.input_tensor(1)
    assert wt is not None
    x_scale = row_scales.astype(np.float32)
    w_scale = qmath.channel_scales(wt, channels).astype(np.float32)
    if depthwise:
        y = acc.astype(np.float32) * w_scale * x_scale
    else:
        y = acc.astype(np.float32) * (x_scale * w_scale)
    if bias is not None:
        y = y + np.asarray(bias, np.float32).reshape(-1)
    return [apply_activation(y, fused_activation(ctx.op))]


def _quantize_batches(x: np.ndarray, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """Each leading-index slice of ``x`` quantized on the fly: (centred int values as float64,
    per-slice scales shaped to broadcast against ``x``)."""
    flat = np.asarray(x, np.float32).reshape(x.shape[0], -1)
    values = np.empty(flat.shape, np.float64)
    scales = np.empty(x.shape[0], np.float64)
    for i, row in enumerate(flat):
        if symmetric:
            q, scales[i] = qmath.symmetric_quantize_floats(row)
            values[i] = q
        else:
            q, scales[i], zp = qmath.asymmetric_quantize_floats(row)
            values[i] = q.astype(np.float64) - zp
    return values.reshape(x.shape), scales.reshape((-1,) + (1,) * (x.ndim - 1))


def _is_hybrid(ctx: OpContext, w_index: int = 1) -> bool:
    xt, wt = ctx.input_tensor(0), ctx.input_tensor(w_index)
    return (
        xt is not None
        and xt.dtype == np.float32
        and ctx.output_tensor().dtype == np.float32
        and qmath.is_integer_quantized(wt, ("int8",))
    )


def _is_integer(ctx: OpContext) -> bool:
    xt, wt = ctx.input_tensor(0), ctx.input_tensor(1)
    return all(qmath.is_integer_quantized(t) for t in (xt, wt, ctx.output_tensor()))


def _varying_scales(wt: Tensor | None) -> bool:
    """Per-channel weights whose scales are not all equal (LiteRT's ``is_hybrid_per_channel``)."""
    q = None if wt is None else wt.quantization
    return q is not None and q.scale.size > 1 and bool(np.any(q.scale != q.scale.reshape(-1)[0]))


def _conv2d_quantized(ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray] | None:
    x, w, bias = required(ctx, inputs, 0), required(ctx, inputs, 1), _optional(inputs, 2)
    if x.ndim != 4 or w.ndim != 4:
        raise ctx.fail(f"expects rank-4 input and filter, got {x.shape} and {w.shape}")
    wt = ctx.input_tensor(1)
    o = w.shape[0]
    if _is_integer(ctx):
        wc = _centered(w, qmath.channel_zero_points(wt, o).reshape(-1, 1, 1, 1))  # type: ignore[arg-type]
        xc = _centered(x, qmath.scale_zp(ctx.input_tensor(0))[1])  # type: ignore[arg-type]
        acc = _exact_int(_conv_sums(xc, wc, *_window_options(ctx)))
        # Grouped convs run on LiteRT's reference kernel (TFLite rounding), others on its GEMM.
        return _integer_output(ctx, acc, bias, 1, o, gemm=x.shape[3] == w.shape[3])
    if _is_hybrid(ctx):
        xq, scales = _quantize_batches(x, symmetric=not _varying_scales(wt))
        acc = _conv_sums(xq, w.astype(np.float64), *_window_options(ctx))
        return _hybrid_output(ctx, acc, scales, bias, o)
    return None


def _depthwise_quantized(
    ctx: OpContext, inputs: list[np.ndarray | None]
) -> list[np.ndarray] | None:
    x, w, bias = required(ctx, inputs, 0), required(ctx, inputs, 1), _optional(inputs, 2)
    if x.ndim != 4 or w.ndim != 4 or w.shape[0] != 1:
        raise ctx.fail(f"expects NHWC input and 1HWC filter, got {x.shape} and {w.shape}")
    wt = ctx.input_tensor(1)
    co = w.shape[3]
    if _is_integer(ctx):
        wc = _centered(w, qmath.channel_zero_points(wt, co))  # type: ignore[arg-type]
        xc = _centered(x, qmath.scale_zp(ctx.input_tensor(0))[1])  # type: ignore[arg-type]
        acc = _exact_int(_depthwise_sums(xc, wc, *_window_options(ctx)))
        # With a depth multiplier LiteRT's kernel rounds as ruy does (ties upward; measured).
        return _integer_output(ctx, acc, bias, 1, co, gemm=co != x.shape[3])
    if _is_hybrid(ctx):
        xq, scales = _quantize_batches(x, symmetric=False)
        acc = _depthwise_sums(xq, w.astype(np.float64), *_window_options(ctx))
        return _hybrid_output(ctx, acc, scales, bias, co, depthwise=True)
    return None


def _fully_connected_quantized(
    ctx: OpContext, inputs: list[np.ndarray | None]
) -> list[np.ndarray] | None:
    x, w, bias = required(ctx, inputs, 0), required(ctx, inputs, 1), _optional(inputs, 2)
    if w.ndim != 2:
        raise ctx.fail(f"weights of shape {w.shape}, expected [units, in]")
    units, depth = w.shape
    if x.size % depth:
        raise ctx.fail(f"input of {x.size} elements does not split into rows of {depth}")
    wt = ctx.input_tensor(1)
    rows = x.reshape(-1, depth)
    shape = (*x.shape[:-1], units) if ctx.options.get("keep_num_dims") else (rows.shape[0], units)
    if _is_integer(ctx):
        wc = _centered(w, qmath.channel_zero_points(wt, units).reshape(-1, 1))  # type: ignore[arg-type]
        xc = _centered(rows, qmath.scale_zp(ctx.input_tensor(0))[1])  # type: ignore[arg-type]
        acc = _exact_int(xc @ wc.T)
        return [y.reshape(shape) for y in _integer_output(ctx, acc, bias, 1, units, gemm=True)]
    if _is_hybrid(ctx):
        symmetric = not ctx.options.get("asymmetric_quantize_inputs", False)
        xq, scales = _quantize_batches(rows, symmetric=symmetric)
        acc = xq @ w.astype(np.float64).T
        return [y.reshape(shape) for y in _hybrid_output(ctx, acc, scales, bias, units)]
    return None
