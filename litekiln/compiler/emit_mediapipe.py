"""GPU forms of MediaPipe's geometric custom ops (their semantics: :mod:`litekiln.ops.mediapipe`).

face_landmark_with_attention estimates a 4x4 crop matrix from landmarks
(``Landmarks2TransformMatrix``), samples feature maps through it (``TransformTensorBilinear``)
and maps refined landmarks back (``TransformLandmarks``). On the CPU they split the model into
two GPU partitions with CPU work between. Here each is one TE function in float32, as LiteRT's
GPU delegate computes them; the matrix stays on the device.
"""

from __future__ import annotations

import numpy as np
from tvm import relax, te, tirx

from litekiln.compiler.lowering import Ctx, Expr, emitter
from litekiln.ops.base import OpContext
from litekiln.ops.mediapipe import (
    Landmarks2TransformMatrix,
    TransformLandmarks,
    TransformTensorBilinear,
)

_F32 = "float32"


def _f(value: float) -> tirx.PrimExpr:
    return tirx.const(value, _F32)


def _dot(
    m: te.Tensor, row: int, x: tirx.PrimExpr, y: tirx.PrimExpr, scale: float = 1.0
) -> tirx.PrimExpr:
    """``DotProduct(m[row], (x, y, 0, 1))`` left to right, the translation ``m[row][3]``
    multiplied by ``scale`` first (the kernels' order, so that the rounding is theirs)."""
    m0, m1, m2, m3 = (m[row * 4 + k] for k in range(4))
    t = m3 if scale == 1.0 else m3 * _f(scale)
    return (((m0 * x) + (m1 * y)) + (m2 * _f(0.0))) + (t * _f(1.0))


@emitter("TransformLandmarks")
def _transform_landmarks(ctx: Ctx) -> list[Expr]:
    dims, scale = TransformLandmarks.geometry(OpContext(ctx.op, ctx.lw.graph))
    shape = tuple(ctx.tensor(0).shape)
    points = int(np.prod(shape)) // dims
    lm = ctx.emit(relax.op.reshape(ctx.arg(0), (points, dims)))
    m = ctx.emit(relax.op.reshape(ctx.arg(1), (16,)))

    def fn(lm: te.Tensor, m: te.Tensor) -> te.Tensor:
        def value(p: tirx.PrimExpr, k: tirx.PrimExpr) -> tirx.PrimExpr:
            x, y = lm[p, 0], lm[p, 1]
            nx, ny = _dot(m, 0, x, y, scale), _dot(m, 1, x, y, scale)
            return tirx.Select(k == 0, nx, tirx.Select(k == 1, ny, lm[p, k]))

        return te.compute((points, dims), value, name="transform_landmarks")

    y = ctx.emit(ctx.bb.call_te(fn, lm, m, primfunc_name_hint="transform_landmarks"))
    return [ctx.emit(relax.op.reshape(y, shape))]


@emitter("TransformTensorBilinear")
def _transform_tensor_bilinear(ctx: Ctx) -> list[Expr]:
    oh, ow, centered = TransformTensorBilinear.geometry(OpContext(ctx.op, ctx.lw.graph))
    _, h, w, c = (int(d) for d in ctx.tensor(0).shape)
    m = ctx.emit(relax.op.reshape(ctx.arg(1), (16,)))

    def fn(data: te.Tensor, m: te.Tensor) -> te.Tensor:
        dtype = str(data.dtype)

        def translation(row: int) -> tirx.PrimExpr:
            t = m[row * 4 + 3]
            if centered:  # version 2: the matrix corrected for pixel centers
                t = ((t + m[row * 4] * _f(0.5)) + m[row * 4 + 1] * _f(0.5)) - _f(0.5)
            return t

        def value(
            n: tirx.PrimExpr, i: tirx.PrimExpr, j: tirx.PrimExpr, ch: tirx.PrimExpr
        ) -> tirx.PrimExpr:
            gx, gy = j.astype(_F32), i.astype(_F32)
            tx = (((m[0] * gx) + (m[1] * gy)) + (m[2] * _f(0.0))) + (translation(0) * _f(1.0))
            ty = (((m[4] * gx) + (m[5] * gy)) + (m[6] * _f(0.0))) + (translation(1) * _f(1.0))
            inside = tirx.all(tx >= _f(0.0), tx <= _f(w - 1.0), ty >= _f(0.0), ty <= _f(h - 1.0))
            fx, fy = tirx.floor(tx), tirx.floor(ty)
            # Outside, the corner is 0 (the sample is 0 anyway): every read stays in bounds.
            ix = tirx.Select(inside, fx.astype("int32"), 0)
            iy = tirx.Select(inside, fy.astype("int32"), 0)

            def read(
                yy: tirx.PrimExpr, xx: tirx.PrimExpr, guard: tirx.PrimExpr | None
            ) -> tirx.PrimExpr:
                v = data[0, tirx.min(yy, h - 1), tirx.min(xx, w - 1), ch].astype(_F32)
                return v if guard is None else tirx.if_then_else(guard, v, _f(0.0))

            below, beyond = iy + 1 < h, ix + 1 < w
            q11 = read(iy, ix, None)
            q21 = read(iy, ix + 1, beyond)
            q12 = read(iy + 1, ix, below)
            q22 = read(iy + 1, ix + 1, tirx.all(below, beyond))
            right, lower = tx - fx, ty - fy
            upper_v = (_f(1.0) - right) * q11 + right * q21
            lower_v = (_f(1.0) - right) * q12 + right * q22
            result = lower * lower_v + (_f(1.0) - lower) * upper_v
            return tirx.Select(inside, result, _f(0.0)).astype(dtype)

        return te.compute((1, oh, ow, c), value, name="transform_tensor_bilinear")

    y = ctx.bb.call_te(fn, ctx.arg(0), m, primfunc_name_hint="transform_tensor_bilinear")
    return [ctx.emit(y)]


@emitter("Landmarks2TransformMatrix")
def _landmarks_to_transform_matrix(ctx: Ctx) -> list[Expr]:
    crop = Landmarks2TransformMatrix.crop(OpContext(ctx.op, ctx.lw.graph))
    size = int(np.prod(ctx.tensor(0).shape))
    lm = ctx.emit(relax.op.reshape(ctx.arg(0), (size // 3, 3)))
    # The two rotation landmarks, then the subset, as rows of one constant gather.
    rows = np.array([crop.left, crop.right, *crop.subset], np.int32)
    # (mode "clip": the indices are checked in range, and "fast" makes TVM warn at build time)
    picked = ctx.emit(relax.op.take(lm, relax.const(rows, "int32"), axis=0, mode="clip"))
    count = len(crop.subset)

    def fn(pts: te.Tensor) -> te.Tensor:
        def rotation() -> tirx.PrimExpr:
            # r = target - atan2(right - left), in float32 as the delegate's kernel. OpenCL's
            # atan2 by name: TVM's OpenCL code generator prints tirx.atan2 as C's atan2f.
            dy, dx = pts[1, 1] - pts[0, 1], pts[1, 0] - pts[0, 0]
            angle = tirx.call_pure_extern(_F32, "atan2", dy, dx)
            return _f(crop.target) - angle

        k = te.reduce_axis((0, count), name="k")

        def rotated(axis: int, idx: tirx.PrimExpr) -> tirx.PrimExpr:
            r = rotation()
            x, y = pts[idx + 2, 0], pts[idx + 2, 1]
            if axis == 0:
                return tirx.cos(r) * x - tirx.sin(r) * y
            return tirx.sin(r) * x + tirx.cos(r) * y

        # The subset rotated by r: [min x, min y] and [max x, max y].
        low = te.compute(
            (2,),
            lambda a: te.min(tirx.Select(a == 0, rotated(0, k), rotated(1, k)), axis=k),
            name="crop_low",
        )
        k2 = te.reduce_axis((0, count), name="k2")
        high = te.compute(
            (2,),
            lambda a: te.max(tirx.Select(a == 0, rotated(0, k2), rotated(1, k2)), axis=k2),
            name="crop_high",
        )

        def value(n: tirx.PrimExpr, i: tirx.PrimExpr, j: tirx.PrimExpr) -> tirx.PrimExpr:
            r = rotation()
            cos_r, sin_r = tirx.cos(r), tirx.sin(r)
            # The crop's size and center in the rotated frame, the center rotated back by -r.
            a = _f(crop.scale_x / crop.out_w) * (high[0] - low[0])
            b = _f(crop.scale_y / crop.out_h) * (high[1] - low[1])
            mx, my = (low[0] + high[0]) * _f(0.5), (low[1] + high[1]) * _f(0.5)
            cx, cy = cos_r * mx + sin_r * my, cos_r * my - sin_r * mx
            # M = T(center) @ R(-r) @ S(a, b) @ T(-out_w / 2, -out_h / 2).
            m00, m01 = cos_r * a, sin_r * b
            m10, m11 = -sin_r * a, cos_r * b
            hw, hh = _f(-crop.out_w / 2.0), _f(-crop.out_h / 2.0)
            tx = cx + (m00 * hw + m01 * hh)
            ty = cy + (m10 * hw + m11 * hh)
            one, zero = _f(1.0), _f(0.0)
            row0 = tirx.Select(j == 0, m00, tirx.Select(j == 1, m01, tirx.Select(j == 3, tx, zero)))
            row1 = tirx.Select(j == 0, m10, tirx.Select(j == 1, m11, tirx.Select(j == 3, ty, zero)))
            diag = tirx.Select(i == j, one, zero)
            return tirx.Select(i == 0, row0, tirx.Select(i == 1, row1, diag))

        return te.compute((1, 4, 4), value, name="landmarks_to_transform_matrix")

    y = ctx.bb.call_te(fn, picked, primfunc_name_hint="landmarks_to_transform_matrix")
    return [ctx.emit(y)]
