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

from collections.abc import Callable
from typing import Any

import numpy as np

from litekiln.errors import ModelError
from litekiln.ops.base import FLOAT32, Check, OpContext, OpDef, register, required
from litekiln.ops.mediapipe import flex_options


def decode_boxes(enc: np.ndarray, anchors: np.ndarray, scales: tuple[float, ...]) -> np.ndarray:
    """Center-size encodings + anchors -> float32 corners [N, 4] (ymin, xmin, ymax, xmax)."""
    e = enc.astype(np.float64)
    a = anchors.astype(np.float64)
    ys, xs, hs, ws = (float(np.float32(s)) for s in scales)
    # (y and x side by side: the same double operations per element as one at a time)
    center = (e[:, :2] / (ys, xs) * a[:, 2:] + a[:, :2]).astype(np.float32)
    half = (0.5 * np.exp(e[:, 2:] / (hs, ws)) * a[:, 2:]).astype(np.float32)
    return np.concatenate([center - half, center + half], axis=1)


def _iou(a: np.ndarray, area_a: np.ndarray, b: np.ndarray, area_b: np.ndarray) -> np.ndarray:
    """ComputeIntersectionOverUnion for every pair (rows of ``a`` x rows of ``b``), in float32;
    0 where either area is <= 0. Same float32 operations, in the same order, as the kernel.
    (Few, whole-array operations: NMS calls it on small chunks, where each costs its call.)"""
    ih = np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0])
    iw = np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1])
    inter = np.maximum(ih, np.float32(0)) * np.maximum(iw, np.float32(0))
    ai, bj = area_a[:, None], area_b[None, :]
    iou = np.zeros(inter.shape, np.float32)
    # (a NaN area is not <= 0: its IoU is computed, NaN, as the kernel's)
    np.divide(inter, ai + bj - inter, out=iou, where=~((ai <= 0) | (bj <= 0)))
    return iou


#: Candidates `nms_single_class` examines per step (first step; it doubles up to the cap).
_CHUNK, _CHUNK_CAP = 32, 256
#: Candidates ranked first by a partial selection; the rest are sorted only if NMS reaches
#: them (SSD: 10 kept, nearly always within the best few dozen of 1917 candidates).
_FIRST = 256

#: Boxes of some anchors (their indices, in rank order) -> float32 corners [len, 4].
BoxSource = Callable[[np.ndarray], np.ndarray]


class _Ranking:
    """Indices of the scores at or above the threshold in the kernel's order: best first,
    ties by the lower index (its ``std::stable_sort``). The best `_FIRST` come from a partial
    selection (linear time); the rest are sorted the first time a caller reaches them."""

    def __init__(self, scores: np.ndarray, threshold: float) -> None:
        self._keep = np.flatnonzero(scores >= np.float32(threshold))
        self._s = scores[self._keep]
        self.size = len(self._keep)
        if self.size > 2 * _FIRST:
            part = np.argpartition(-self._s, _FIRST - 1)[:_FIRST]
            edge = self._s[part].min()
            above = np.flatnonzero(self._s > edge)
            ties = np.flatnonzero(self._s == edge)[: _FIRST - len(above)]
            first = np.concatenate([above, ties])  # (each ascending; ties rank after above)
        else:
            first = np.arange(self.size)
        self._order = first[np.argsort(-self._s[first], kind="stable")]
        self._whole = len(first) == self.size

    def take(self, start: int, stop: int) -> np.ndarray:
        """Ranks ``start`` to ``stop`` (exclusive) as indices into the scores."""
        if stop > len(self._order) and not self._whole:
            rest = np.ones(self.size, bool)
            rest[self._order] = False
            others = np.flatnonzero(rest)
            others = others[np.argsort(-self._s[others], kind="stable")]
            self._order, self._whole = np.concatenate([self._order, others]), True
        return self._keep[self._order[start:stop]]


def nms_single_class(
    boxes: np.ndarray | BoxSource,
    scores: np.ndarray,
    max_detections: int,
    score_th: float,
    iou_th: float,
) -> list[int]:
    """NonMaxSuppressionSingleClassHelper: anchor indices kept, best score first (see
    `nms_kept`, which gives their boxes too)."""
    return nms_kept(boxes, scores, max_detections, score_th, iou_th)[0]


def nms_kept(
    boxes: np.ndarray | BoxSource,
    scores: np.ndarray,
    max_detections: int,
    score_th: float,
    iou_th: float,
) -> tuple[list[int], np.ndarray]:
    """NonMaxSuppressionSingleClassHelper: anchor indices kept, best score first, and their
    boxes [len, 4].

    The kernel's greedy loop: in rank order, a candidate is kept unless its IoU with a box
    kept before it exceeds the threshold. Done in chunks of the ranking, so that a few
    detections out of thousands of candidates (SSD: 10 of 1917) cost a few small matrices
    instead of one pass over all candidates per kept box: per chunk, one IoU matrix against
    the boxes kept so far and one within the chunk, then a scan that jumps from one
    unsuppressed candidate to the next. ``boxes`` is every anchor's box [N, 4], or a function
    that gives the boxes of some anchors (so that only the candidates examined are decoded).
    """
    ranking = _Ranking(scores, score_th)
    output_size = min(ranking.size, max_detections)
    kept = np.empty((0, 4), np.float32)
    if output_size <= 0:
        return [], kept
    box_of: BoxSource = boxes if callable(boxes) else boxes.__getitem__
    iou_th32 = np.float32(iou_th)
    selected: list[int] = []  # anchor indices
    kept_areas = np.empty(0, np.float32)
    start, chunk = 0, _CHUNK
    while start < ranking.size and len(selected) < output_size:
        rows = ranking.take(start, start + chunk)
        c = np.ascontiguousarray(box_of(rows), dtype=np.float32)
        ca = (c[:, 2] - c[:, 0]) * (c[:, 3] - c[:, 1])  # float32, as the kernel
        if selected:
            suppressed = np.asarray((_iou(kept, kept_areas, c, ca) > iou_th32).any(axis=0))
        else:
            suppressed = np.zeros(len(rows), bool)
        within = _iou(c, ca, c, ca) > iou_th32
        new: list[int] = []
        k = 0
        while len(selected) + len(new) < output_size and k < len(rows):
            k += int(suppressed[k:].argmin())  # the next candidate not suppressed, if any
            if suppressed[k]:
                break
            new.append(k)
            suppressed |= within[k]  # (rows before k are decided already)
            k += 1
        selected.extend(int(rows[k]) for k in new)
        kept, kept_areas = np.concatenate([kept, c[new]]), np.concatenate([kept_areas, ca[new]])
        start, chunk = start + len(rows), min(2 * chunk, _CHUNK_CAP)
    return selected, kept


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
        enc4 = enc[0, :, :4]
        boxes: np.ndarray | None = None
        if not anchors[:, 2:].min(initial=0.0) >= 0:
            # Only an anchor of negative (or NaN) size can decode to ymin > ymax: a size of
            # 0.5 * exp(.) * a >= 0 keeps each corner on its side of the center after
            # rounding. The kernel checks every box; so does this where it can fail.
            boxes = decode_boxes(enc4, anchors, o["scales"])
            if np.any(boxes[:, 0] > boxes[:, 2]) or np.any(boxes[:, 1] > boxes[:, 3]):
                raise ctx.fail("decoded boxes with ymin > ymax or xmin > xmax")

        def box_of(rows: np.ndarray) -> np.ndarray:
            """The decoded boxes of some anchors (decoding is per anchor)."""
            if boxes is not None:
                return boxes[rows]
            return decode_boxes(enc4[rows], anchors[rows], o["scales"])

        scores = cls_pred[0, :, offset:]
        max_det, per_det = o["max_detections"], o["max_classes_per_detection"]
        if per_det <= 0:
            raise ctx.fail("max_classes_per_detection must be positive")
        d = max_det * per_det
        out_boxes = np.zeros((1, d, 4), np.float32)
        out_classes = np.zeros((1, d), np.float32)
        out_scores = np.zeros((1, d), np.float32)
        if o["use_regular_nms"]:
            every = boxes if boxes is not None else box_of(np.arange(n))
            count = cls._regular(o, every, scores, out_boxes, out_classes, out_scores)
        else:
            k = min(per_det, num_classes)
            top = _top_classes(scores, k)
            best = scores[np.arange(n), top[:, 0]]
            sel, kept = nms_kept(box_of, best, max_det, o["score_th"], o["iou_th"])
            if sel:  # row r's k classes fill slots per_det * r + 0..k-1
                anchors_kept = np.array(sel, np.intp)
                cols = top[anchors_kept]
                slots = per_det * np.arange(len(sel))[:, None] + np.arange(k)
                out_boxes[0, slots] = kept[:, None, :]
                out_classes[0, slots] = cols
                out_scores[0, slots] = scores[anchors_kept[:, None], cols]
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
