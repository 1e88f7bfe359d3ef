"""NON_MAX_SUPPRESSION_V4 and V5 on the CPU: TensorFlow's ``tf.image.non_max_suppression``
(padded, V4) and its soft variant with scores (V5), as detection models exported without
the ``TFLite_Detection_PostProcess`` custom op write them.

The reference is LiteRT's (tflite/kernels/internal/reference/non_max_suppression.h) step by
step: the candidates over the score threshold in a ``std::priority_queue``, whose order among
equal scores is libstdc++'s heap's (`_Heap`, so that ties select what LiteRT selects), each
popped candidate compared with the boxes selected since it was last compared (hard
suppression at ``iou >= iou_threshold``; with ``soft_nms_sigma > 0`` its score decays by
``exp(-0.5 iou^2 / sigma)`` and it goes back to the queue), float32 arithmetic throughout.
The outputs are padded to ``max_output_size`` with zeros (``ResetUnusedElementsToZeroes``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from litekiln.ops.base import Check, OpContext, OpDef, as_planned, register, required

_F = np.float32


class _Heap:
    """``std::priority_queue`` over a deque of (score, index, suppress_begin) with
    ``a.score < b.score`` as its comparison: libstdc++'s ``push_heap`` and ``pop_heap``."""

    def __init__(self) -> None:
        self.c: list[list] = []

    @staticmethod
    def _less(a: list, b: list) -> bool:
        return bool(a[0] < b[0])

    def _sift_up(self, hole: int, top: int, value: list) -> None:
        c = self.c
        parent = (hole - 1) // 2
        while hole > top and self._less(c[parent], value):
            c[hole] = c[parent]
            hole = parent
            parent = (hole - 1) // 2
        c[hole] = value

    def push(self, value: list) -> None:
        self.c.append(value)
        self._sift_up(len(self.c) - 1, 0, value)

    def pop(self) -> list:
        c = self.c
        top = c[0]
        n = len(c) - 1
        if n > 0:
            value = c[n]
            c[n] = c[0]
            hole, child = 0, 0  # (__adjust_heap over the first n elements)
            while child < (n - 1) // 2:
                child = 2 * (child + 1)
                if self._less(c[child], c[child - 1]):
                    child -= 1
                c[hole] = c[child]
                hole = child
            if n % 2 == 0 and child == (n - 2) // 2:
                child = 2 * (child + 1)
                c[hole] = c[child - 1]
                hole = child - 1
            self._sift_up(hole, 0, value)
        c.pop()
        return top

    def __len__(self) -> int:
        return len(self.c)


def _iou(boxes: np.ndarray, i: int, j: int) -> np.float32:
    """ComputeIntersectionOverUnion, in float32."""
    a, b = boxes[i], boxes[j]
    ay0, ay1 = min(a[0], a[2]), max(a[0], a[2])
    ax0, ax1 = min(a[1], a[3]), max(a[1], a[3])
    by0, by1 = min(b[0], b[2]), max(b[0], b[2])
    bx0, bx1 = min(b[1], b[3]), max(b[1], b[3])
    area_a = (ay1 - ay0) * (ax1 - ax0)
    area_b = (by1 - by0) * (bx1 - bx0)
    if area_a <= 0 or area_b <= 0:
        return _F(0.0)
    inter = max(min(ay1, by1) - max(ay0, by0), _F(0.0)) * max(
        min(ax1, bx1) - max(ax0, bx0), _F(0.0)
    )
    return _F(inter / (area_a + area_b - inter))


def non_max_suppression(
    boxes: np.ndarray,
    scores: np.ndarray,
    max_output_size: int,
    iou_threshold: float,
    score_threshold: float,
    soft_nms_sigma: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Selected indices and scores (padded with zeros to ``max_output_size``) and how many
    were selected, as LiteRT's reference NonMaxSuppression computes them."""
    boxes = np.asarray(boxes, _F)
    scores = np.asarray(scores, _F)
    iou_t, score_t, sigma = _F(iou_threshold), _F(score_threshold), _F(soft_nms_sigma)
    heap = _Heap()
    for i, s in enumerate(scores):
        if s > score_t:
            heap.push([s, i, 0])
    selected = np.zeros(max_output_size, np.int32)
    selected_scores = np.zeros(max_output_size, _F)
    n = 0
    goal = min(len(heap), max_output_size)
    scale = _F(-0.5) / sigma if sigma > 0 else _F(0.0)
    while n < goal and len(heap):
        cand = heap.pop()
        original = cand[0]
        suppress = False
        for j in range(n - 1, cand[2] - 1, -1):
            iou = _iou(boxes, cand[1], int(selected[j]))
            if iou >= iou_t:
                suppress = True
                break
            if sigma > 0:
                cand[0] = _F(cand[0] * np.exp(_F(scale * iou * iou), dtype=_F))
            if cand[0] <= score_t:
                break
        cand[2] = n
        if not suppress:
            if cand[0] == original:
                selected[n], selected_scores[n] = cand[1], cand[0]
                n += 1
            if cand[0] > score_t:
                heap.push(cand)
    return selected, selected_scores, n


class _NonMaxSuppression(OpDef):
    @classmethod
    def validate(cls, c: Check) -> None:
        """non_max_suppression.cc: float32 boxes [N, 4] and scores [N]; an int32 scalar
        max_output_size (not negative); float32 scalar thresholds (and sigma); int32 selected
        indices [max_output_size] (float32 scores too, V5) and an int32 scalar count."""
        super().validate(c)
        boxes, scores, size_t = c.input(0), c.input(1), c.input(2)
        c.dtype(boxes, frozenset({"float32"}), "boxes")
        c.rank(boxes, 2, None, "boxes")
        if boxes.shape[1] != 4:
            raise c.fail("shape", f"boxes {list(boxes.shape)}: 4 coordinates a box needed")
        c.dtype(scores, frozenset({"float32"}), "scores")
        c.rank(scores, 1, None, "scores")
        if scores.shape[0] != boxes.shape[0]:
            raise c.fail("shape", f"{scores.shape[0]} scores for {boxes.shape[0]} boxes")
        c.dtype(size_t, frozenset({"int32"}), "max_output_size")
        c.rank(size_t, 0, None, "max_output_size")
        roles = ["iou_threshold", "score_threshold", "soft_nms_sigma"][: len(c.op.inputs) - 3]
        for i, role in enumerate(roles, start=3):
            c.dtype(c.input(i), frozenset({"float32"}), role)
            c.rank(c.input(i), 0, None, role)
        outs = len(c.op.outputs)
        c.output_dtype(np.dtype(np.int32), 0)
        if outs == 3:
            c.output_dtype(np.dtype(np.float32), 1)
        c.output_dtype(np.dtype(np.int32), outs - 1)
        c.output_shape((), outs - 1)
        if size_t.data is None:
            return  # sized at run time: the declared shapes are trusted
        size = int(np.asarray(size_t.data).reshape(-1)[0])
        if size < 0:
            raise c.fail("max-output-size", f"max_output_size {size} is negative")
        for i in range(outs - 1):
            c.output_shape((size,), i)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        v = [np.asarray(required(ctx, inputs, i)) for i in range(len(ctx.op.inputs))]
        size = int(v[2].reshape(-1)[0])
        fail: Callable[[str], Exception] = ctx.fail
        if size < 0:
            raise fail(f"max_output_size {size} is negative")
        sigma = float(v[5].reshape(-1)[0]) if len(v) == 6 else 0.0
        if sigma < 0:
            raise fail(f"soft_nms_sigma {sigma} is negative")
        idx, sc, n = non_max_suppression(
            v[0], v[1], size, float(v[3].reshape(-1)[0]), float(v[4].reshape(-1)[0]), sigma
        )
        count = np.asarray(n, np.int32)
        as_planned(ctx, idx)  # (max_output_size fed at run time: the declared size must hold)
        return [idx, sc, count] if len(v) == 6 else [idx, count]


@register
class NonMaxSuppressionV4(_NonMaxSuppression):
    name = "NON_MAX_SUPPRESSION_V4"
    num_inputs = (5, 5)
    num_outputs = (2, 2)


@register
class NonMaxSuppressionV5(_NonMaxSuppression):
    name = "NON_MAX_SUPPRESSION_V5"
    num_inputs = (6, 6)
    num_outputs = (3, 3)
