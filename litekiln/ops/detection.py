"""``TFLite_Detection_PostProcess``: SSD box decoding plus non-max suppression
(tensorflow/lite/kernels/detection_postprocess.cc).

Inputs: box encodings ``[1, N, >=4]`` (y, x, h, w), class predictions
``[1, N, num_classes (+1 background)]``, anchors ``[N, 4]`` (y, x, h, w).
Outputs: boxes ``[1, D, 4]`` (ymin, xmin, ymax, xmax), classes ``[1, D]``, scores ``[1, D]``,
num_detections ``[1]``, all float32, ``D = max_detections * max_classes_per_detection``.
Rows past the detections are zero here (LiteRT leaves the fast path's rows unwritten).

Decoding is done in double and stored as float, as the kernel does. The fast NMS (default)
ranks each anchor by its best class, runs one single-class NMS, then emits the top
``min(max_classes_per_detection, num_classes)`` classes of each kept anchor. The regular NMS
(``use_regular_nms``) runs NMS per class (``detections_per_class`` each) and keeps the best
``max_detections`` over all classes. Sorting is stable (ties keep the lower index), as the
kernel's ``std::stable_sort``; where the kernel uses an unstable ``std::partial_sort`` (ties
between equal scores) the order may differ.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from litekiln.errors import ModelError
from litekiln.ops.base import FLOAT32, Check, OpContext, OpDef, register, required
from litekiln.ops.mediapipe import flex_options


def decode_boxes(enc: np.ndarray, anchors: np.ndarray, scales: tuple[float, ...]) -> np.ndarray:
    """Center-size encodings + anchors -> float32 corners [N, 4] (ymin, xmin, ymax, xmax)."""
    e = enc.astype(np.float32).astype(np.float64)
    a = anchors.astype(np.float32).astype(np.float64)
    ys, xs, hs, ws = (float(np.float32(s)) for s in scales)
    yc = (e[:, 0] / ys * a[:, 2] + a[:, 0]).astype(np.float32)
    xc = (e[:, 1] / xs * a[:, 3] + a[:, 1]).astype(np.float32)
    hh = (0.5 * np.exp(e[:, 2] / hs) * a[:, 2]).astype(np.float32)
    hw = (0.5 * np.exp(e[:, 3] / ws) * a[:, 3]).astype(np.float32)
    return np.stack([yc - hh, xc - hw, yc + hh, xc + hw], axis=1).astype(np.float32)


def _iou(a: np.ndarray, area_a: np.ndarray, b: np.ndarray, area_b: np.ndarray) -> np.ndarray:
    """ComputeIntersectionOverUnion for every pair (rows of ``a`` x rows of ``b``), in float32;
    0 where either area is <= 0. Same float32 operations, in the same order, as the kernel."""
    a, b = a[:, None, :], b[None, :, :]
    ih = np.maximum(
        np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0]), np.float32(0)
    )
    iw = np.maximum(
        np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1]), np.float32(0)
    )
    inter = ih * iw
    ai, bj = area_a[:, None], area_b[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = inter / (ai + bj - inter)
    return np.where((ai <= 0) | (bj <= 0), np.float32(0), iou).astype(np.float32)


#: Candidates `nms_single_class` examines per step (first step; it doubles up to the cap).
_CHUNK, _CHUNK_CAP = 32, 256


def nms_single_class(
    boxes: np.ndarray, scores: np.ndarray, max_detections: int, score_th: float, iou_th: float
) -> list[int]:
    """NonMaxSuppressionSingleClassHelper: anchor indices kept, best score first.

    The kernel's greedy loop: in rank order, a candidate is kept unless its IoU with a box
    kept before it exceeds the threshold. Done in chunks of the ranking, so that a few
    detections out of thousands of candidates (SSD: 10 of 1917) cost a few small matrices
    instead of one pass over all candidates per kept box: per chunk, one IoU matrix against
    the boxes kept so far and one within the chunk, then a scan that jumps from one
    unsuppressed candidate to the next.
    """
    keep = np.nonzero(scores >= np.float32(score_th))[0]
    order = keep[np.argsort(-scores[keep], kind="stable")]
    output_size = min(len(order), max_detections)
    if output_size <= 0:
        return []
    cand = np.ascontiguousarray(boxes[order], dtype=np.float32)
    areas = (cand[:, 2] - cand[:, 0]) * (cand[:, 3] - cand[:, 1])  # float32, as the kernel
    iou_th32 = np.float32(iou_th)
    selected: list[int] = []  # rows of `cand`
    start, chunk = 0, _CHUNK
    while start < len(order) and len(selected) < output_size:
        stop = min(start + chunk, len(order))
        c, ca = cand[start:stop], areas[start:stop]
        if selected:
            iou = _iou(cand[selected], areas[selected], c, ca)
            suppressed = np.asarray((iou > iou_th32).any(axis=0))
        else:
            suppressed = np.zeros(stop - start, bool)
        within = _iou(c, ca, c, ca) > iou_th32
        k = 0
        while len(selected) < output_size:
            free = np.flatnonzero(~suppressed[k:])
            if not free.size:
                break
            k += int(free[0])
            selected.append(start + k)
            suppressed |= within[k]  # (rows before k are decided already)
            k += 1
        start, chunk = stop, min(2 * chunk, _CHUNK_CAP)
    return [int(order[r]) for r in selected]


def _top_classes(scores: np.ndarray, k: int) -> np.ndarray:
    """DecreasingPartialArgSort per row: indices of the k best classes (first max wins)."""
    if k == 1:
        return scores.argmax(axis=1)[:, None]
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


@register
class DetectionPostProcess(OpDef):
    name = "TFLite_Detection_PostProcess"
    gpu = False  # custom op, not in the GPU op table
    versions = None
    num_inputs = (3, 3)
    num_outputs = (4, 4)

    @classmethod
    def validate(cls, c: Check) -> None:
        """detection_postprocess.cc's Prepare: box encodings and class predictions rank 3,
        anchors rank 2; four outputs sized [1, D, 4], [1, D], [1, D], [1] with D =
        max_detections * max_classes_per_detection. litekiln also checks the options the
        reference needs and the shapes it reads ([1, N, >= 4], [1, N, C], [N, 4])."""
        super().validate(c)
        enc, scores, anchors = c.input(0), c.input(1), c.input(2)
        c.rank(enc, 3, None, "box encodings")
        c.rank(scores, 3, None, "class predictions")
        c.rank(anchors, 2, None, "anchors")
        for t, role in (
            (enc, "box encodings"),
            (scores, "class predictions"),
            (anchors, "anchors"),
        ):
            if t.type_name != "float32" and t.quantization is None:
                c.dtype(t, FLOAT32, role)
        try:
            o = cls._options(OpContext(c.op, c.graph))
        except ModelError as exc:
            raise c.fail("custom-options", str(exc).split(": ", 1)[-1]) from None
        n = enc.shape[1]
        if (
            enc.shape[0] != 1
            or enc.shape[2] < 4
            or scores.shape[:2] != (1, n)
            or anchors.shape != (n, 4)
        ):
            raise c.fail(
                "input-shape",
                f"box encodings {list(enc.shape)}, class predictions {list(scores.shape)}, "
                f"anchors {list(anchors.shape)}: expected [1, N, >=4], [1, N, C], [N, 4]",
            )
        if scores.shape[2] - o["num_classes"] not in (0, 1):
            raise c.fail("option-value", f"{scores.shape[2]} scores for {o['num_classes']} classes")
        if o["max_detections"] < 0 or o["max_classes_per_detection"] <= 0:
            raise c.fail("option-value", "max_detections >= 0, max_classes_per_detection > 0")
        d = o["max_detections"] * o["max_classes_per_detection"]
        for i, shape in enumerate(((1, d, 4), (1, d), (1, d), (1,))):
            c.dtype(c.output(i), FLOAT32, f"output {i}")
            c.output_shape(shape, i)

    @staticmethod
    def _options(ctx: OpContext) -> dict[str, Any]:
        o = flex_options(ctx)
        try:
            return {
                "max_detections": int(o["max_detections"]),
                "max_classes_per_detection": int(o["max_classes_per_detection"]),
                "detections_per_class": int(o.get("detections_per_class", 100)),
                "use_regular_nms": bool(o.get("use_regular_nms", False)),
                "score_th": float(o["nms_score_threshold"]),
                "iou_th": float(o["nms_iou_threshold"]),
                "num_classes": int(o["num_classes"]),
                "scales": tuple(float(o[k]) for k in ("y_scale", "x_scale", "h_scale", "w_scale")),
            }
        except KeyError as exc:
            raise ctx.fail(f"custom options lack {exc}") from None

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        o = cls._options(ctx)
        enc = np.asarray(required(ctx, inputs, 0), np.float32)
        cls_pred = np.asarray(required(ctx, inputs, 1), np.float32)
        anchors = np.asarray(required(ctx, inputs, 2), np.float32)
        if enc.ndim != 3 or enc.shape[0] != 1 or enc.shape[2] < 4:
            raise ctx.fail(f"box encodings must be [1, N, >=4], got {enc.shape}")
        n = enc.shape[1]
        if cls_pred.ndim != 3 or cls_pred.shape[:2] != (1, n):
            raise ctx.fail(f"class predictions must be [1, {n}, C], got {cls_pred.shape}")
        if anchors.shape != (n, 4):
            raise ctx.fail(f"anchors must be [{n}, 4], got {anchors.shape}")
        num_classes = o["num_classes"]
        with_bg = cls_pred.shape[2]
        offset = with_bg - num_classes
        if offset not in (0, 1):
            raise ctx.fail(f"{with_bg} class scores for {num_classes} classes")
        if not 0 < o["iou_th"] <= 1 or o["max_detections"] < 0:
            raise ctx.fail("nms_iou_threshold must be in (0, 1], max_detections >= 0")
        boxes = decode_boxes(enc[0, :, :4], anchors, o["scales"])
        if np.any(boxes[:, 0] > boxes[:, 2]) or np.any(boxes[:, 1] > boxes[:, 3]):
            raise ctx.fail("decoded boxes with ymin > ymax or xmin > xmax")
        scores = cls_pred[0, :, offset:]
        max_det, per_det = o["max_detections"], o["max_classes_per_detection"]
        if per_det <= 0:
            raise ctx.fail("max_classes_per_detection must be positive")
        d = max_det * per_det
        out_boxes = np.zeros((1, d, 4), np.float32)
        out_classes = np.zeros((1, d), np.float32)
        out_scores = np.zeros((1, d), np.float32)
        if o["use_regular_nms"]:
            count = cls._regular(o, boxes, scores, out_boxes, out_classes, out_scores)
        else:
            k = min(per_det, num_classes)
            top = _top_classes(scores, k)
            best = scores[np.arange(n), top[:, 0]]
            sel = nms_single_class(boxes, best, max_det, o["score_th"], o["iou_th"])
            for row, a in enumerate(sel):
                for col in range(k):
                    slot = per_det * row + col
                    out_boxes[0, slot] = boxes[a]
                    out_classes[0, slot] = top[a, col]
                    out_scores[0, slot] = scores[a, top[a, col]]
            count = len(sel)
        return [out_boxes, out_classes, out_scores, np.array([count], np.float32)]

    @staticmethod
    def _regular(o, boxes, scores, out_boxes, out_classes, out_scores) -> int:
        """NonMaxSuppressionMultiClassRegularHelper: merge per-class NMS results."""
        max_det = o["max_detections"]
        if o["detections_per_class"] <= 0:
            raise ValueError("detections_per_class must be positive")
        kept: list[tuple[int, int, float]] = []  # (anchor, class, score), best first
        for c in range(scores.shape[1]):
            col = scores[:, c]
            per_class = o["detections_per_class"]
            sel = nms_single_class(boxes, col, per_class, o["score_th"], o["iou_th"])
            cand = kept + [(a, c, float(col[a])) for a in sel]
            order = np.argsort(-np.array([s for _, _, s in cand], np.float32), kind="stable")
            kept = [cand[i] for i in order[: min(len(cand), max_det)]]
        for row, (a, c, s) in enumerate(kept):
            out_boxes[0, row] = boxes[a]
            out_classes[0, row] = c
            out_scores[0, row] = s
        return len(kept)
