"""MediaPipe's geometric custom ops (mediapipe/util/tflite/operations/):
``Landmarks2TransformMatrix``, ``TransformTensorBilinear`` and ``TransformLandmarks``.

Used by face_landmark_with_attention: a 4x4 matrix is estimated from landmarks, then used to
crop feature maps (bilinear sampling) and to map refined landmarks back. The custom options
are flexbuffer maps, parsed as the GPU delegate's ``Parse*Attributes`` do. Versions 1 and 2
of each op differ (input ranks, a half-pixel correction); both are implemented.

The C++ kernels compute in float32 (with a few double intermediates where C++ promotes);
the references do the same arithmetic in float64 and round to float32 at the points where
the C++ stores floats. None of these ops is in the documented GPU op table; LiteRT's GPU
delegate runs all three (MediaPipe registers their GPU kernels), and so does the extended
table (`litekiln.compiler.emit_mediapipe`, in float32 throughout as the delegate's kernels):
``Landmarks2TransformMatrix`` version 2 only (version 1, of older graphs, stays on the CPU).
The options are read here, once, for both (`TransformLandmarks.geometry`,
`TransformTensorBilinear.geometry`, `Landmarks2TransformMatrix.crop`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from litekiln.errors import ModelError
from litekiln.model.ir import Op, Subgraph
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


class _Geometric(OpDef):
    """What the three ops share: a GPU form (extended table) that reads their options and
    shapes at compile time, which must parse (`read_options`) for the op to go to the GPU."""

    gpu_extended = True
    versions = None

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        reason = super().gpu_support(op, graph, allow_quantized=allow_quantized)
        if reason is None:
            try:
                cls.read_options(OpContext(op, graph))
            except (ModelError, KeyError, TypeError, ValueError) as exc:
                return f"its options or shapes do not fit: {exc}"
        return reason

    @classmethod
    def read_options(cls, ctx: OpContext) -> object:
        """The options and shapes the GPU form reads, checked (raises as `gpu_support` says)."""
        raise NotImplementedError


@register
class TransformLandmarks(_Geometric):
    """Apply the top two rows of a 4x4 matrix to 2-D/3-D landmarks (z passes through).

    v2: landmarks ``[1, N, D]`` (D = 2 or 3 from the shape), matrix ``[1, 4, 4]``, no options.
    v1: landmarks rank 4 ``[1, H, W, K*D]``; options ``dimensions`` and ``scale`` (the
    translation column is multiplied by ``scale``).
    """

    name = "TransformLandmarks"
    num_inputs = (2, 2)

    @classmethod
    def read_options(cls, ctx: OpContext) -> object:
        return cls.geometry(ctx)

    @staticmethod
    def geometry(ctx: OpContext) -> tuple[int, float]:
        """(dimensions of a landmark, scale of the translation column), checked.

        Raises:
            ModelError: landmarks of another rank than the version takes, a dimension other
                than 2 or 3, or a zero scale.
        """
        lm = ctx.input_tensor(0)
        shape = tuple(lm.shape) if lm is not None else ()
        scale = 1.0
        if ctx.op.version >= 2:
            if len(shape) != 3:
                raise ctx.fail(f"v2 expects landmarks [1, N, D], got {shape}")
            dims = shape[2]
        else:
            if len(shape) != 4:
                raise ctx.fail(f"v1 expects rank-4 landmarks, got {shape}")
            opts = flex_options(ctx)
            dims = int(opts.get("dimensions", 0))
            scale = float(_F(opts.get("scale", 0.0)))
            if scale == 0:
                raise ctx.fail("scale must not be 0")
        if dims not in (2, 3) or shape[-1] % dims:
            raise ctx.fail(f"landmarks of {dims} dimensions (2 or 3 supported), shape {shape}")
        return dims, scale

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        lm = np.asarray(required(ctx, inputs, 0), _F)
        m = _matrix(ctx, required(ctx, inputs, 1))
        dims, scale = cls.geometry(ctx)
        pts = lm.reshape(-1, dims)
        xr = np.array([m[0], m[1], m[2], m[3] * _F(scale)], _F)
        yr = np.array([m[4], m[5], m[6], m[7] * _F(scale)], _F)
        x, y = pts[:, 0], pts[:, 1]
        zero, one = _F(0.0), _F(1.0)
        out = pts.copy()
        # DotProduct(float4, float4) left to right, in float32.
        out[:, 0] = (((xr[0] * x) + (xr[1] * y)) + (xr[2] * zero)) + (xr[3] * one)
        out[:, 1] = (((yr[0] * x) + (yr[1] * y)) + (yr[2] * zero)) + (yr[3] * one)
        return [out.reshape(lm.shape)]


@register
class TransformTensorBilinear(_Geometric):
    """Sample ``input[1, H, W, C]`` at ``M @ (x, y, 0, 1)`` for every output pixel, bilinearly.

    Output size comes from the output tensor (options ``output_height``/``output_width``
    agree). Points outside ``[0, W-1] x [0, H-1]`` give 0; neighbours beyond the edge read 0.
    v2 first corrects the matrix for pixel centers: ``t[3] += t[0]*0.5 + t[1]*0.5 - 0.5``.
    Only batch 0 is read, as in MediaPipe.
    """

    name = "TransformTensorBilinear"
    num_inputs = (2, 2)

    @classmethod
    def read_options(cls, ctx: OpContext) -> object:
        return cls.geometry(ctx)

    @staticmethod
    def geometry(ctx: OpContext) -> tuple[int, int, bool]:
        """(output height, output width, whether the matrix is corrected for pixel centers
        (version 2)), checked against the input.

        Raises:
            ModelError: an input of another rank than 4, or other output channels.
        """
        x = ctx.input_tensor(0)
        shape = tuple(x.shape) if x is not None else ()
        if len(shape) != 4:
            raise ctx.fail(f"expects an NHWC input, got {shape}")
        out_shape = tuple(ctx.output_tensor().shape)
        if len(out_shape) == 4:
            oh, ow, oc = out_shape[1], out_shape[2], out_shape[3]
        else:
            opts = flex_options(ctx)
            oh, ow, oc = int(opts["output_height"]), int(opts["output_width"]), shape[3]
        if oc != shape[3]:
            raise ctx.fail(f"output has {oc} channels, input {shape[3]}")
        return oh, ow, ctx.op.version >= 2

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = np.asarray(required(ctx, inputs, 0), _F)
        m = _matrix(ctx, required(ctx, inputs, 1))
        oh, ow, centered = cls.geometry(ctx)
        _, h, w, c = x.shape
        xt = m[0:4].astype(_F).copy()
        yt = m[4:8].astype(_F).copy()
        if centered:
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


@dataclass(frozen=True)
class Crop:
    """The options of a version-2 ``Landmarks2TransformMatrix``, checked against its
    landmarks: the two landmarks whose direction sets the rotation, the subset whose rotated
    bounding box sets the crop, the target rotation, the output size and the scales."""

    left: int
    right: int
    subset: tuple[int, ...]
    target: float
    out_h: int
    out_w: int
    scale_x: float
    scale_y: float


def _mat3(*v: float) -> np.ndarray:
    return np.array(v, np.float64).reshape(3, 3)


@register
class Landmarks2TransformMatrix(_Geometric):
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
    gpu_limits = "version 1 on the CPU"
    num_inputs = (1, 1)

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        if op.version < 2:
            return "version 1 (the older graphs' inverse transform) has no GPU form"
        return super().gpu_support(op, graph, allow_quantized=allow_quantized)

    @classmethod
    def read_options(cls, ctx: OpContext) -> object:
        return cls.crop(ctx)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        lm = np.asarray(required(ctx, inputs, 0), _F).reshape(-1)
        opts = flex_options(ctx)
        if lm.size % 3:
            raise ctx.fail(f"landmarks of {lm.size} values are not (x, y, z) triples")
        pts = lm.reshape(-1, 3).astype(np.float64)
        out = cls._v2(ctx, pts) if ctx.op.version >= 2 else cls._v1(ctx, pts, opts)
        return [out.astype(_F).reshape(1, 4, 4)]

    @staticmethod
    def _index(ctx: OpContext, pts: np.ndarray, i: int) -> np.ndarray:
        if not 0 <= i < len(pts):
            raise ctx.fail(f"landmark index {i} out of range for {len(pts)} landmarks")
        return pts[i]

    @staticmethod
    def crop(ctx: OpContext) -> Crop:
        """The version-2 options, checked against the number of landmarks.

        Raises:
            ModelError: an option missing, an index out of range, a size or scale not
                positive, an empty subset, landmarks that are not (x, y, z) triples.
        """
        lm = ctx.input_tensor(0)
        size = int(np.prod(lm.shape)) if lm is not None else 0
        if size % 3:
            raise ctx.fail(f"landmarks of {size} values are not (x, y, z) triples")
        opts = flex_options(ctx)
        try:
            crop = Crop(
                left=int(opts["left_rotation_idx"]),
                right=int(opts["right_rotation_idx"]),
                subset=tuple(int(i) for i in opts["subset_idxs"]),
                target=float(opts.get("target_rotation_radians", 0.0)),
                out_h=int(opts["output_height"]),
                out_w=int(opts["output_width"]),
                scale_x=float(opts["scale_x"]),
                scale_y=float(opts["scale_y"]),
            )
        except KeyError as exc:
            raise ctx.fail(f"custom options lack {exc}") from None
        if crop.out_h <= 0 or crop.out_w <= 0 or crop.scale_x <= 0 or crop.scale_y <= 0:
            raise ctx.fail("output size and scales must be positive, subset non-empty")
        if not crop.subset:
            raise ctx.fail("output size and scales must be positive, subset non-empty")
        for i in (crop.left, crop.right, *crop.subset):
            if not 0 <= i < size // 3:
                raise ctx.fail(f"landmark index {i} out of range for {size // 3} landmarks")
        return crop

    @classmethod
    def _v2(cls, ctx: OpContext, pts: np.ndarray) -> np.ndarray:
        crop = cls.crop(ctx)
        left, right = pts[crop.left], pts[crop.right]
        out_h, out_w, scale_x, scale_y = crop.out_h, crop.out_w, crop.scale_x, crop.scale_y
        angle = np.float32(np.arctan2(right[1] - left[1], right[0] - left[0]))
        r = float(np.float32(crop.target - angle))
        sub = pts[list(crop.subset)]
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
