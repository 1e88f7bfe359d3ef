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

import struct
from typing import ClassVar

import numpy as np

from litekiln.model.ir import Op, Subgraph, Tensor
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
        return (in_size + stride - effective) // stride
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
    if oh <= 0 or ow <= 0:
        raise ValueError(
            f"a {kh}x{kw} window (dilation {dh}x{dw}) does not fit input {h}x{w} with VALID padding"
        )
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
        if not _const(graph, op.inputs[cls.weight_input]):
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


@register
class DepthwiseConv2D(_ConvLike):
    """DEPTHWISE_CONV_2D: filter 1HW(C*M); output channel ``c*M + m`` reads input channel c."""

    name = "DEPTHWISE_CONV_2D"
    gpu = True
    gpu_max_version = 2  # v2 adds dilation (documented GPU table: v1-2, docs/architecture.md)
    # The TFLite GPU delegate accepts DEPTHWISE_CONV_2D up to v6 with quantized models.
    gpu_quant_max_version = 6

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
        mult = co // c
        dm = int(o.get("depth_multiplier", 0) or 0)
        if dm and dm * c != co:
            # TFLite checks the option only when it is consistent with the shapes' meaning.
            raise ctx.fail(f"depth_multiplier {dm} x {c} input channels != {co} filter channels")
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
            return "shuffled weights format"
        if len(graph.tensors[op.inputs[0]].shape) > 4:
            return "input of rank > 4"
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
