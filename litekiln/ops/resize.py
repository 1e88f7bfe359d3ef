"""Image resizing: RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR (NHWC, size input int32[2]).

Both follow TFLite's reference kernels (``reference_ops.h``) in float32 arithmetic:

* scale = ``in / out``, or ``(in - 1) / (out - 1)`` with ``align_corners`` and ``out > 1``;
* bilinear source ``y * scale`` or, with ``half_pixel_centers``, ``(y + 0.5) * scale - 0.5``;
  ``y0 = max(floor(src), 0)``, ``y1 = min(ceil(src), in - 1)``, weights from ``src - y0``;
* nearest source ``min(floor((y + offset) * scale), in - 1)`` (offset 0.5 with half-pixel
  centers, then ``max(0, .)``), rounded half away from zero instead of floored with
  ``align_corners``.
"""

from __future__ import annotations

import numpy as np

from litekiln.model.ir import Op, Subgraph
from litekiln.ops import qmath
from litekiln.ops.base import (
    QUANTIZED,
    Check,
    OpContext,
    OpDef,
    int_input,
    register,
    required,
)


def _scale(in_size: int, out_size: int, align_corners: bool) -> np.float32:
    if align_corners and out_size > 1:
        return np.float32(in_size - 1) / np.float32(out_size - 1)
    return np.float32(in_size) / np.float32(out_size)


def _target(ctx: OpContext, inputs: list[np.ndarray | None], x: np.ndarray) -> tuple[int, int]:
    if x.ndim != 4:
        raise ctx.fail(f"expects an NHWC input, got shape {x.shape}")
    size = int_input(ctx, inputs, 1).reshape(-1)
    if size.size != 2 or size.min() <= 0:
        raise ctx.fail(f"size must be 2 positive ints, got {size.tolist()}")
    return int(size[0]), int(size[1])


def _bilinear_axis(
    out_size: int, in_size: int, scale: np.float32, half_pixel: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lower index, upper index, fraction) per output coordinate, as ComputeInterpolationValues."""
    v = np.arange(out_size, dtype=np.float32)
    src = (v + np.float32(0.5)) * scale - np.float32(0.5) if half_pixel else v * scale
    src = src.astype(np.float32)
    lo = np.maximum(np.floor(src), 0).astype(np.int64)
    hi = np.minimum(np.ceil(src).astype(np.int64), in_size - 1)
    frac = (src - lo.astype(np.float32)).astype(np.float32)
    return lo, hi, frac


def _nearest_axis(
    out_size: int, in_size: int, scale: np.float32, align_corners: bool, half_pixel: bool
) -> np.ndarray:
    v = np.arange(out_size, dtype=np.float32)
    offset = np.float32(0.5) if half_pixel else np.float32(0.0)
    src = ((v + offset) * scale).astype(np.float32)
    if align_corners:
        idx = (np.sign(src) * np.floor(np.abs(src) + np.float32(0.5))).astype(np.int64)
    else:
        idx = np.floor(src).astype(np.int64)
    idx = np.minimum(idx, in_size - 1)
    if half_pixel:
        idx = np.maximum(idx, 0)
    return idx


def _c_div(a: np.ndarray, b: int) -> np.ndarray:
    """C++ integer division (truncates toward zero)."""
    return np.where(a >= 0, a // b, -((-a) // b))


class _Resize(OpDef):
    versions = (1, 4)
    num_inputs = (2, 2)

    @classmethod
    def validate(cls, c: Check) -> None:
        """resize_bilinear.cc / resize_nearest_neighbor.cc: a rank-4 input, a size of two
        int32 values (positive), the output of the input's type; bilinear refuses
        align_corners with half_pixel_centers. Integer resizes work on the stored integers,
        so litekiln wants input and output quantized alike."""
        super().validate(c)
        x, size_t, y = c.input(0), c.input(1), c.output()
        c.rank(x, 4, None, "input")
        c.rank(size_t, 1, None, "size")
        c.dtype(size_t, frozenset({"int32"}), "size")
        if size_t.shape != (2,):
            raise c.fail("size", f"size has {size_t.size} values, expected 2")
        c.dtype(x, frozenset({"float32", "uint8", "int8", "int16"}), "input")
        c.output_dtype(x.dtype)
        o = c.op.options
        if cls.name == "RESIZE_BILINEAR" and o.get("align_corners") and o.get("half_pixel_centers"):
            raise c.fail("option-value", "align_corners together with half_pixel_centers")
        if x.type_name in QUANTIZED:
            c.quantized(x, "input")
            c.quantized(y, "output")
            xq, yq = x.quantization, y.quantization
            assert xq is not None and yq is not None
            if float(xq.scale[0]) != float(yq.scale[0]) or int(xq.zero_point[0]) != int(
                yq.zero_point[0]
            ):
                raise c.fail(
                    "quantization-mismatch",
                    "input and output are quantized differently: the kernel resizes the "
                    "stored integers",
                )
        if size_t.data is None:
            return
        h, w = (int(v) for v in size_t.data.reshape(-1))
        if h <= 0 or w <= 0:
            raise c.fail("size", f"size {h}x{w} must be positive")
        c.output_shape((x.shape[0], h, w, x.shape[3]))

    @classmethod
    def integer_operands(cls, op: Op) -> set[int]:
        return {op.inputs[1]}

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        reason = super().gpu_support(op, graph, allow_quantized=allow_quantized)
        if reason:
            return reason
        if len(graph.tensors[op.inputs[0]].shape) != 4:
            return "input is not rank-4 NHWC"
        if not graph.tensors[op.inputs[1]].is_constant:
            return "runtime output size; the GPU path needs it constant"
        if op.options.get("align_corners") and op.options.get("half_pixel_centers"):
            return "align_corners together with half_pixel_centers"
        return None


@register
class ResizeBilinear(_Resize):
    """RESIZE_BILINEAR: v1 float, v2 quantized, v3 half_pixel_centers (GPU table: v1-3)."""

    name = "RESIZE_BILINEAR"
    gpu = True
    gpu_max_version = 3
    # The GPU delegate accepts RESIZE_BILINEAR up to v3; v4 is int16.
    gpu_quant_max_version = 3

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = np.asarray(required(ctx, inputs, 0), np.float32)
        oh, ow = _target(ctx, inputs, x)
        ac = bool(ctx.options.get("align_corners"))
        hp = bool(ctx.options.get("half_pixel_centers"))
        _, h, w, _ = x.shape
        y0, y1, fy = _bilinear_axis(oh, h, _scale(h, oh, ac), hp)
        x0, x1, fx = _bilinear_axis(ow, w, _scale(w, ow, ac), hp)
        fy = fy.reshape(1, oh, 1, 1)
        fx = fx.reshape(1, 1, ow, 1)
        one = np.float32(1.0)
        rows0, rows1 = x[:, y0], x[:, y1]
        out = (
            rows0[:, :, x0] * ((one - fy) * (one - fx))
            + rows1[:, :, x0] * (fy * (one - fx))
            + rows0[:, :, x1] * ((one - fy) * fx)
            + rows1[:, :, x1] * (fy * fx)
        )
        return [out.astype(np.float32, copy=False)]

    @classmethod
    def reference_quantized(
        cls, ctx: OpContext, inputs: list[np.ndarray | None]
    ) -> list[np.ndarray] | None:
        """LiteRT's ``ResizeBilinearInteger`` (int8): positions in 10-bit fixed point,
        ``scale_10 = round(1024 * in / out)``, the four products summed in 20 bits and
        divided by 2**20 rounding half away from zero. Input and output share parameters."""
        xt, yt = ctx.input_tensor(0), ctx.output_tensor()
        if not (qmath.is_integer_quantized(xt, ("int8",)) and qmath.is_integer_quantized(yt)):
            return None
        x = np.asarray(required(ctx, inputs, 0))
        oh, ow = _target(ctx, inputs, x)
        ac = bool(ctx.options.get("align_corners"))
        hp = bool(ctx.options.get("half_pixel_centers"))
        _, h, w, _ = x.shape

        def axis(out: int, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            scale = ((1 << 10) * size + out // 2) // out
            if ac and out > 1:
                scale = ((1 << 10) * (size - 1) + (out - 1) // 2) // (out - 1)
            v = np.arange(out, dtype=np.int64)
            pos = v * scale + (scale // 2 - (1 << 9) if hp else 0)
            lo = np.maximum(_c_div(pos, 1 << 10), 0)
            hi = np.minimum(_c_div(pos + (1 << 10) - 1, 1 << 10), size - 1)
            return lo, hi, pos - (lo << 10)

        y0, y1, fy = axis(oh, h)
        x0, x1, fx = axis(ow, w)
        fy, fx = fy.reshape(1, oh, 1, 1), fx.reshape(1, 1, ow, 1)
        one = 1 << 10
        xi = x.astype(np.int64)
        r0, r1 = xi[:, y0], xi[:, y1]
        acc = (
            r0[:, :, x0] * (one - fy) * (one - fx)
            + r1[:, :, x0] * fy * (one - fx)
            + r0[:, :, x1] * (one - fy) * fx
            + r1[:, :, x1] * fy * fx
        )
        out = _c_div(acc + np.where(acc > 0, 1 << 19, -(1 << 19)), 1 << 20)
        info = np.iinfo(yt.dtype)
        return [np.clip(out, info.min, info.max).astype(yt.dtype)]


@register
class ResizeNearestNeighbor(_Resize):
    """RESIZE_NEAREST_NEIGHBOR: not in the documented GPU table; litekiln's GPU form copies
    the nearest pixel (TFLite's rounding: tests/test_gpu_ops.py)."""

    name = "RESIZE_NEAREST_NEIGHBOR"
    gpu = False
    gpu_extended = True
    quant_aware = True  # pure data movement: integer values are copied, never requantized
    copies_values = True

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = np.asarray(required(ctx, inputs, 0))
        oh, ow = _target(ctx, inputs, x)
        ac = bool(ctx.options.get("align_corners"))
        hp = bool(ctx.options.get("half_pixel_centers"))
        _, h, w, _ = x.shape
        ys = _nearest_axis(oh, h, _scale(h, oh, ac), ac, hp)
        xs = _nearest_axis(ow, w, _scale(w, ow, ac), ac, hp)
        return [x[:, ys][:, :, xs]]
