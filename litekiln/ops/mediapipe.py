"""MediaPipe's geometric custom ops (mediapipe/util/tflite/operations/):
``Landmarks2TransformMatrix``, ``TransformTensorBilinear`` and ``TransformLandmarks``.

Used by face_landmark_with_attention: a 4x4 matrix is estimated from landmarks, then used to
crop feature maps (bilinear sampling) and to map refined landmarks back. The custom options
are flexbuffer maps, parsed as the GPU delegate's ``Parse*Attributes`` do. Versions 1 and 2
of each op differ (input ranks, a half-pixel correction); both are implemented.

The C++ kernels compute in float32 (with a few double intermediates where C++ promotes);
the references do the same arithmetic in float64 and round to float32 at the points where
the C++ stores floats. None of these ops is in the GPU op table.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from litekiln.ops.base import OpContext, OpDef, register, required

_F = np.float32


_FLEX_CACHE: dict[bytes, dict[str, Any]] = {}


def flex_options(ctx: OpContext) -> dict[str, Any]:
    """The op's custom options decoded as a flexbuffer map (empty if absent).

    Decoded once per distinct options blob (the pure-Python flexbuffer decoder took 0.3 ms
    per call for TFLite_Detection_PostProcess, a third of the op's time): a copy is returned.
    """
    raw = ctx.op.custom_options
    if not raw:
        return {}
    key = bytes(raw)
    value = _FLEX_CACHE.get(key)
    if value is None:
        from flatbuffers import flexbuffers

        try:
            value = flexbuffers.Loads(key)
        except Exception as exc:  # the flexbuffer decoder raises assorted errors on bad bytes
            raise ctx.fail(f"custom options are not a valid flexbuffer: {exc}") from None
        if not isinstance(value, dict):
            raise ctx.fail(f"custom options decode to {type(value).__name__}, expected a map")
        if len(_FLEX_CACHE) < 1024:
            _FLEX_CACHE[key] = value
    return dict(value)


def _matrix(ctx: OpContext, m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, _F).reshape(-1)
    if m.size < 8:
        raise ctx.fail(f"transform matrix has {m.size} elements, expected 16 (4x4)")
    return m


@register
class TransformLandmarks(OpDef):
    """Apply the top two rows of a 4x4 matrix to 2-D/3-D landmarks (z passes through).

    v2: landmarks ``[1, N, D]`` (D = 2 or 3 from the shape), matrix ``[1, 4, 4]``, no options.
    v1: landmarks rank 4 ``[1, H, W, K*D]``; options ``dimensions`` and ``scale`` (the
    translation column is multiplied by ``scale``).
    """

    name = "TransformLandmarks"
    versions = None
    num_inputs = (2, 2)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        lm = np.asarray(required(ctx, inputs, 0), _F)
        m = _matrix(ctx, required(ctx, inputs, 1))
        scale = _F(1.0)
        if ctx.op.version >= 2:
            if lm.ndim != 3:
                raise ctx.fail(f"v2 expects landmarks [1, N, D], got {lm.shape}")
            dims = lm.shape[2]
        else:
            if lm.ndim != 4:
                raise ctx.fail(f"v1 expects rank-4 landmarks, got {lm.shape}")
            opts = flex_options(ctx)
            dims = int(opts.get("dimensions", 0))
            scale = _F(opts.get("scale", 0.0))
            if scale == 0:
                raise ctx.fail("scale must not be 0")
        if dims not in (2, 3) or lm.shape[-1] % dims:
            raise ctx.fail(f"landmarks of {dims} dimensions (2 or 3 supported), shape {lm.shape}")
        pts = lm.reshape(-1, dims)
        xr = np.array([m[0], m[1], m[2], m[3] * scale], _F)
        yr = np.array([m[4], m[5], m[6], m[7] * scale], _F)
        x, y = pts[:, 0], pts[:, 1]
        zero, one = _F(0.0), _F(1.0)
        out = pts.copy()
        # DotProduct(float4, float4) left to right, in float32.
        out[:, 0] = (((xr[0] * x) + (xr[1] * y)) + (xr[2] * zero)) + (xr[3] * one)
        out[:, 1] = (((yr[0] * x) + (yr[1] * y)) + (yr[2] * zero)) + (yr[3] * one)
        return [out.reshape(lm.shape)]


@register
class TransformTensorBilinear(OpDef):
    """Sample ``input[1, H, W, C]`` at ``M @ (x, y, 0, 1)`` for every output pixel, bilinearly.

    Output size comes from the output tensor (options ``output_height``/``output_width``
    agree). Points outside ``[0, W-1] x [0, H-1]`` give 0; neighbours beyond the edge read 0.
    v2 first corrects the matrix for pixel centers: ``t[3] += t[0]*0.5 + t[1]*0.5 - 0.5``.
    Only batch 0 is read, as in MediaPipe.
    """

    name = "TransformTensorBilinear"
    versions = None
    num_inputs = (2, 2)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = np.asarray(required(ctx, inputs, 0), _F)
        m = _matrix(ctx, required(ctx, inputs, 1))
        if x.ndim != 4:
            raise ctx.fail(f"expects an NHWC input, got {x.shape}")
        out_t = ctx.output_tensor()
        if len(out_t.shape) == 4:
            oh, ow, oc = out_t.shape[1], out_t.shape[2], out_t.shape[3]
        else:
            opts = flex_options(ctx)
            oh, ow, oc = int(opts["output_height"]), int(opts["output_width"]), x.shape[3]
        _, h, w, c = x.shape
        if oc != c:
            raise ctx.fail(f"output has {oc} channels, input {c}")
        xt = m[0:4].astype(_F).copy()
        yt = m[4:8].astype(_F).copy()
        if ctx.op.version >= 2:
            # float += double expression: evaluated in double, stored as float.
            xt[3] = _F(float(xt[3]) + float(xt[0]) * 0.5 + float(xt[1]) * 0.5 - 0.5)
            yt[3] = _F(float(yt[3]) + float(yt[0]) * 0.5 + float(yt[1]) * 0.5 - 0.5)
        gy, gx = np.meshgrid(np.arange(oh, dtype=_F), np.arange(ow, dtype=_F), indexing="ij")
        zero, one = _F(0.0), _F(1.0)
        tx = (((xt[0] * gx) + (xt[1] * gy)) + (xt[2] * zero)) + (xt[3] * one)
        ty = (((yt[0] * gx) + (yt[1] * gy)) + (yt[2] * zero)) + (yt[3] * one)
        inside = (tx >= 0) & (tx <= w - 1) & (ty >= 0) & (ty <= h - 1)
        fx, fy = np.floor(tx), np.floor(ty)
        ix = np.where(inside, fx, 0).astype(np.int64)
        iy = np.where(inside, fy, 0).astype(np.int64)
        src = x[0]

        def read(yy: np.ndarray, xx: np.ndarray) -> np.ndarray:
            ok = (yy >= 0) & (xx >= 0) & (yy < h) & (xx < w)
            v = src[np.clip(yy, 0, h - 1), np.clip(xx, 0, w - 1)].astype(np.float64)
            return np.where(ok[..., None], v, 0.0)

        q11, q21 = read(iy, ix), read(iy, ix + 1)
        q12, q22 = read(iy + 1, ix), read(iy + 1, ix + 1)
        right = (tx - fx).astype(_F).astype(np.float64)[..., None]
        lower = (ty - fy).astype(_F).astype(np.float64)[..., None]
        upper_v = ((1.0 - right) * q11 + right * q21).astype(_F).astype(np.float64)
        lower_v = ((1.0 - right) * q12 + right * q22).astype(_F).astype(np.float64)
        result = (lower * lower_v + (1.0 - lower) * upper_v).astype(_F)
        out = np.where(inside[..., None], result, _F(0.0)).astype(_F)
        return [out[None]]


def _mat3(*v: float) -> np.ndarray:
    return np.array(v, np.float64).reshape(3, 3)


@register
class Landmarks2TransformMatrix(OpDef):
    """Estimate the crop matrix of a landmark subset (MediaPipe landmarks_to_transform_matrix.cc).

    v2: landmarks ``[1, N, 3]``; options ``subset_idxs``, ``left_rotation_idx``,
    ``right_rotation_idx``, ``target_rotation_radians``, ``output_height``/``output_width``,
    ``scale_x``/``scale_y``. rotation ``r = target - atan2(ry - ly, rx - lx)``; the subset is
    rotated by r, its bounding box (w, h, center rotated back by -r) gives
    ``M = T(center) @ R(-r) @ S(scale_x * w / out_w, scale_y * h / out_h) @ T(-out_w/2, -out_h/2)``.
    v1 (rank-4 ``[1, 1, 1, N*3]`` input, options ``input_hw``, ``output_hw``, ``dimensions``,
    ``landmarks_range``, ``bbox_size_multiplier``, ``subset``...) builds the inverse transform
    of the older graphs; output ``[1, 4, 4]``.
    """

    name = "Landmarks2TransformMatrix"
    versions = None
    num_inputs = (1, 1)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        lm = np.asarray(required(ctx, inputs, 0), _F).reshape(-1)
        opts = flex_options(ctx)
        if lm.size % 3:
            raise ctx.fail(f"landmarks of {lm.size} values are not (x, y, z) triples")
        pts = lm.reshape(-1, 3).astype(np.float64)
        out = cls._v2(ctx, pts, opts) if ctx.op.version >= 2 else cls._v1(ctx, pts, opts)
        return [out.astype(_F).reshape(1, 4, 4)]

    @staticmethod
    def _index(ctx: OpContext, pts: np.ndarray, i: int) -> np.ndarray:
        if not 0 <= i < len(pts):
            raise ctx.fail(f"landmark index {i} out of range for {len(pts)} landmarks")
        return pts[i]

    @classmethod
    def _v2(cls, ctx: OpContext, pts: np.ndarray, opts: dict[str, Any]) -> np.ndarray:
        try:
            left = cls._index(ctx, pts, int(opts["left_rotation_idx"]))
            right = cls._index(ctx, pts, int(opts["right_rotation_idx"]))
            subset = [int(i) for i in opts["subset_idxs"]]
            target = float(opts.get("target_rotation_radians", 0.0))
            out_h, out_w = int(opts["output_height"]), int(opts["output_width"])
            scale_x, scale_y = float(opts["scale_x"]), float(opts["scale_y"])
        except KeyError as exc:
            raise ctx.fail(f"custom options lack {exc}") from None
        if out_h <= 0 or out_w <= 0 or scale_x <= 0 or scale_y <= 0 or not subset:
            raise ctx.fail("output size and scales must be positive, subset non-empty")
        angle = np.float32(np.arctan2(right[1] - left[1], right[0] - left[0]))
        r = float(np.float32(target - angle))
        sub = np.stack([cls._index(ctx, pts, i) for i in subset])
        xy1 = np.concatenate([sub[:, :2], np.ones((len(sub), 1))], axis=1)
        rot = _mat3(np.cos(r), -np.sin(r), 0, np.sin(r), np.cos(r), 0, 0, 0, 1)
        rot_inv = _mat3(np.cos(-r), -np.sin(-r), 0, np.sin(-r), np.cos(-r), 0, 0, 0, 1)
        rotated = (rot @ xy1.T).T.astype(_F).astype(np.float64)
        lo, hi = rotated.min(axis=0), rotated.max(axis=0)
        crop_w, crop_h = hi[0] - lo[0], hi[1] - lo[1]
        center = np.array([(lo[0] + hi[0]) / 2, (lo[1] + hi[1]) / 2, 1.0])
        cx, cy, _ = rot_inv @ center
        t = np.eye(4)
        shift = np.eye(4)
        shift[0, 3], shift[1, 3] = cx, cy
        rr = -r
        rotation = np.eye(4)
        rotation[:2, :2] = [[np.cos(rr), -np.sin(rr)], [np.sin(rr), np.cos(rr)]]
        scale = np.diag([scale_x * crop_w / out_w, scale_y * crop_h / out_h, 1.0, 1.0])
        shift2 = np.eye(4)
        shift2[0, 3], shift2[1, 3] = -out_w / 2.0, -out_h / 2.0
        return t @ shift @ rotation @ scale @ shift2

    @classmethod
    def _v1(cls, ctx: OpContext, pts: np.ndarray, opts: dict[str, Any]) -> np.ndarray:
        try:
            in_h, in_w = (int(v) for v in opts["input_hw"])
            out_h, out_w = (int(v) for v in opts["output_hw"])
            rng = float(opts["landmarks_range"])
            mult = float(opts["bbox_size_multiplier"])
            left = cls._index(ctx, pts, int(opts["left_rotation_idx"]))
            right = cls._index(ctx, pts, int(opts["right_rotation_idx"]))
            subset = [int(i) for i in opts["subset"]]
        except KeyError as exc:
            raise ctx.fail(f"custom options lack {exc}") from None
        if int(opts.get("dimensions", 3)) != 3 or mult == 0 or rng <= 0 or not subset:
            raise ctx.fail("dimensions must be 3, bbox_size_multiplier non-zero, range positive")
        alpha = -np.arctan((right[1] - left[1]) / (right[0] - left[0]))
        sub = np.stack([cls._index(ctx, pts, i)[:2] for i in subset])
        ca, sa = np.cos(alpha), np.sin(alpha)
        rx = sub[:, 0] * ca - sub[:, 1] * sa
        ry = sub[:, 0] * sa + sub[:, 1] * ca
        max_x, max_y = max(rx.max(), -100000.0), max(ry.max(), -100000.0)
        min_x, min_y = min(rx.min(), 100000.0), min(ry.min(), 100000.0)
        bw, bh = (max_x - min_x) * mult, (max_y - min_y) * mult
        scale = _mat3(bw / rng, 0, 0, 0, bh / rng, 0, 0, 0, 1)
        mx, my = (max_x + min_x) / 2.0, (max_y + min_y) / 2.0
        cn, sn = np.cos(-alpha), np.sin(-alpha)
        rmx, rmy = mx * cn - my * sn, mx * sn + my * cn
        rotation = _mat3(cn, -sn, (rmx / rng) * 2.0 - 1.0, sn, cn, (rmy / rng) * 2.0 - 1.0, 0, 0, 1)
        to_rel = _mat3(2.0 / (out_w - 1.0), 0, -1, 0, 2.0 / (out_h - 1.0), -1, 0, 0, 1)
        hw, hh = (in_w - 1.0) / 2.0, (in_h - 1.0) / 2.0
        to_abs = _mat3(hw, 0, hw, 0, hh, hh, 0, 0, 1)
        itm = to_abs @ rotation @ scale @ to_rel
        out = np.zeros((4, 4))
        out[0] = [itm[0, 0], itm[0, 1], 0, itm[0, 2]]
        out[1] = [itm[1, 0], itm[1, 1], 0, itm[1, 2]]
        out[2] = [itm[2, 0], itm[2, 1], itm[2, 2], 0]
        out[3] = [0, 0, 0, 1]
        return out
