"""Conv, pooling, resize, LSTM, detection and MediaPipe ops: the numpy reference vs LiteRT.

Builtin ops (and TFLite_Detection_PostProcess, which LiteRT ships) are checked with
``oplib.check_op`` on single-op models over shapes, strides, paddings, dilations, depth
multipliers and fused activations. Tolerance: ``|ref - litert| <= 1e-4 + 1e-4 * |litert|``
for the ops that accumulate long dot products (convs, FC, LSTM; numpy's BLAS sums in another
order than LiteRT's kernels), oplib's default ``1e-5`` otherwise; pooling max and nearest
resizing are exact in practice.

MediaPipe's custom ops cannot run in LiteRT: each is checked on a small case worked out by
hand (the comments give the arithmetic), Convolution2DTransposeBias also against LiteRT's
TRANSPOSE_CONV plus a bias. The two MediaPipe models that use them run end to end.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from oplib import Spec, check_op
from tflite_builder import single_op_model

from litekiln.compiler.partition import gpu_reason
from litekiln.errors import ModelError
from litekiln.model import load_model
from litekiln.ops import lookup, run_op
from litekiln.reference import run_graph

CONV_TOL = (1e-4, 1e-4)
ACTS = ["NONE", "RELU", "RELU6", "RELU_N1_TO_1", "TANH"]
MP = Path("/tmp/mp/mediapipe/modules")


def _conv_out(size: int, k: int, s: int, d: int, padding: str) -> int:
    eff = (k - 1) * d + 1
    return (size + s - 1) // s if padding == "SAME" else (size + s - eff) // s


# -- CONV_2D --------------------------------------------------------------------------------


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize("stride", [1, 2, 3])
@pytest.mark.parametrize("dilation", [1, 2])
@pytest.mark.parametrize("act", ["NONE", "RELU6"])
def test_conv2d(padding: str, stride: int, dilation: int, act: str) -> None:
    check_op(
        "CONV_2D",
        [Spec([2, 11, 9, 5])],
        {
            "padding": padding,
            "stride_w": stride,
            "stride_h": stride,
            "dilation_w_factor": dilation,
            "dilation_h_factor": dilation,
            "fused_activation_function": act,
        },
        consts={1: Spec([6, 3, 3, 5]), 2: Spec([6])},
        tol=CONV_TOL,
    )


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize(("kh", "kw", "sh", "sw"), [(1, 1, 1, 1), (5, 3, 2, 1), (2, 4, 1, 3)])
def test_conv2d_shapes_and_activations(act: str, kh: int, kw: int, sh: int, sw: int) -> None:
    check_op(
        "CONV_2D",
        [Spec([1, 10, 13, 3])],
        {"padding": "SAME", "stride_w": sw, "stride_h": sh, "fused_activation_function": act},
        consts={1: Spec([4, kh, kw, 3]), 2: Spec([4])},
        tol=CONV_TOL,
    )


def test_conv2d_grouped() -> None:
    # 6 input channels, filters of 2 input channels: 3 groups of 3 output channels each.
    check_op(
        "CONV_2D",
        [Spec([1, 7, 8, 6])],
        {"padding": "SAME", "stride_w": 1, "stride_h": 1},
        consts={1: Spec([9, 3, 3, 2]), 2: Spec([9])},
        version=6,
        tol=CONV_TOL,
    )


# -- DEPTHWISE_CONV_2D ----------------------------------------------------------------------


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize(("stride", "dilation"), [(1, 1), (2, 1), (1, 2), (2, 3)])
@pytest.mark.parametrize("multiplier", [1, 2, 3])
def test_depthwise(padding: str, stride: int, dilation: int, multiplier: int) -> None:
    c = 4
    check_op(
        "DEPTHWISE_CONV_2D",
        [Spec([1, 12, 11, c])],
        {
            "padding": padding,
            "stride_w": stride,
            "stride_h": stride,
            "depth_multiplier": multiplier,
            "dilation_w_factor": dilation,
            "dilation_h_factor": dilation,
            "fused_activation_function": "RELU6",
        },
        consts={1: Spec([1, 3, 3, c * multiplier]), 2: Spec([c * multiplier])},
        version=2,
        tol=CONV_TOL,
    )


@pytest.mark.parametrize("act", ACTS)
def test_depthwise_activations_5x5(act: str) -> None:
    check_op(
        "DEPTHWISE_CONV_2D",
        [Spec([2, 9, 9, 3])],
        {
            "padding": "SAME",
            "stride_w": 2,
            "stride_h": 1,
            "depth_multiplier": 1,
            "fused_activation_function": act,
        },
        consts={1: Spec([1, 5, 5, 3]), 2: Spec([3])},
        tol=CONV_TOL,
    )


# -- TRANSPOSE_CONV -------------------------------------------------------------------------


@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize(("stride", "k"), [(1, 3), (2, 2), (2, 3), (3, 4), (2, 5)])
@pytest.mark.parametrize("bias", [True, False])
def test_transpose_conv(padding: str, stride: int, k: int, bias: bool) -> None:
    h, w = 5, 6
    if padding == "SAME":
        oh, ow = h * stride, w * stride
    else:
        oh, ow = (h - 1) * stride + k, (w - 1) * stride + k
    consts = {0: np.array([1, oh, ow, 4], np.int32), 1: Spec([4, k, k, 3])}
    if bias:
        consts[3] = Spec([4])
    check_op(
        "TRANSPOSE_CONV",
        [Spec([1, h, w, 3])],
        {"padding": padding, "stride_w": stride, "stride_h": stride},
        consts=consts,
        version=3 if bias else 1,
        out_dtype="float32",
        tol=CONV_TOL,
    )


@pytest.mark.parametrize("act", ["RELU", "RELU6"])
def test_transpose_conv_fused_activation(act: str) -> None:
    check_op(
        "TRANSPOSE_CONV",
        [Spec([1, 4, 4, 2])],
        {"padding": "SAME", "stride_w": 2, "stride_h": 2, "fused_activation_function": act},
        consts={0: np.array([1, 8, 8, 3], np.int32), 1: Spec([3, 3, 3, 2]), 3: Spec([3])},
        version=4,
        out_dtype="float32",
        tol=CONV_TOL,
    )


# -- FULLY_CONNECTED ------------------------------------------------------------------------


@pytest.mark.parametrize("act", ["NONE", "RELU", "RELU6", "RELU_N1_TO_1"])
@pytest.mark.parametrize("keep_num_dims", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_fully_connected(act: str, keep_num_dims: bool, bias: bool) -> None:
    consts = {1: Spec([7, 12])}
    if bias:
        consts[2] = Spec([7])
    check_op(
        "FULLY_CONNECTED",
        [Spec([2, 3, 12])],
        {"fused_activation_function": act, "keep_num_dims": keep_num_dims},
        consts=consts,
        version=5 if keep_num_dims else 1,
        tol=CONV_TOL,
    )


def test_fully_connected_refuses_tanh_like_litert() -> None:
    # LiteRT's FULLY_CONNECTED Prepare accepts only NONE/RELU/RELU_N1_TO_1/RELU6: litekiln
    # refuses the model at load, naming the rule.
    model = single_op_model(
        "FULLY_CONNECTED",
        [Spec([2, 4])],
        {"fused_activation_function": "TANH"},
        consts={1: _const([3, 4]), 2: _const([3])},
    )
    with pytest.raises(ModelError, match="fused activation"):
        load_model(model)


def test_conv_fused_tanh_is_a_noop_like_litert() -> None:
    # LiteRT's conv kernels clamp through CalculateActivationRange, which ignores TANH: the
    # output keeps values outside [-1, 1]; test_conv2d_shapes_and_activations checks it too.
    r = check_op(
        "CONV_2D",
        [Spec([1, 4, 4, 2], low=2, high=3)],
        {"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": "TANH"},
        consts={1: np.ones([1, 1, 1, 2], np.float32), 2: np.zeros([1], np.float32)},
    )
    assert r.reference[0].min() >= 4


def test_fully_connected_flattens_input() -> None:
    # [1, 2, 2, 3] flattens to rows of 12.
    check_op(
        "FULLY_CONNECTED",
        [Spec([1, 2, 2, 3])],
        {},
        consts={1: Spec([5, 12]), 2: Spec([5])},
        tol=CONV_TOL,
    )


# -- pooling --------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["AVERAGE_POOL_2D", "MAX_POOL_2D", "L2_POOL_2D"])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize(
    ("fh", "fw", "sh", "sw"),
    [(2, 2, 2, 2), (3, 3, 2, 2), (3, 2, 1, 1), (5, 5, 3, 2), (11, 9, 11, 9)],
)
def test_pool(op: str, padding: str, fh: int, fw: int, sh: int, sw: int) -> None:
    check_op(
        op,
        [Spec([2, 11, 9, 3])],
        {
            "padding": padding,
            "stride_w": sw,
            "stride_h": sh,
            "filter_width": fw,
            "filter_height": fh,
            "fused_activation_function": "NONE",
        },
    )


@pytest.mark.parametrize("op", ["AVERAGE_POOL_2D", "MAX_POOL_2D"])
@pytest.mark.parametrize("act", ["RELU", "RELU6", "RELU_N1_TO_1"])
def test_pool_activation(op: str, act: str) -> None:
    check_op(
        op,
        [Spec([1, 8, 8, 4], low=-3, high=8)],
        {
            "padding": "SAME",
            "stride_w": 2,
            "stride_h": 2,
            "filter_width": 3,
            "filter_height": 3,
            "fused_activation_function": act,
        },
    )


def test_average_pool_same_excludes_padding() -> None:
    # 3x3 SAME average over a 2x2 ones input: every window holds exactly the 4 real cells,
    # so TFLite's average is 1 (a zero-padded average would give 4/9).
    r = check_op(
        "AVERAGE_POOL_2D",
        [np.ones([1, 2, 2, 1], np.float32)],
        {"padding": "SAME", "stride_w": 1, "stride_h": 1, "filter_width": 3, "filter_height": 3},
    )
    np.testing.assert_array_equal(r.reference[0], np.ones([1, 2, 2, 1], np.float32))


# -- resize ---------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR"])
@pytest.mark.parametrize(("align", "half"), [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("size", [(7, 5), (16, 20), (1, 1), (3, 9), (12, 16)])
def test_resize(op: str, align: bool, half: bool, size: tuple[int, int]) -> None:
    check_op(
        op,
        [Spec([1, 6, 8, 3])],
        {"align_corners": align, "half_pixel_centers": half},
        consts={1: np.array(size, np.int32)},
        version=3 if half else 1,
    )


# -- LSTM -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("batch", "depth", "units"), [(1, 4, 3), (2, 5, 8)])
def test_lstm_basic(batch: int, depth: int, units: int) -> None:
    check_op(
        "LSTM",
        [Spec([batch, depth]), Spec([batch, units]), Spec([batch, units])],
        {"fused_activation_function": "TANH", "kernel_type": "BASIC"},
        consts={2: Spec([4 * units, depth + units]), 3: Spec([4 * units])},
        version=2,
        outputs=4,
        tol=CONV_TOL,
    )


# -- TFLite_Detection_PostProcess ----------------------------------------------------------


# The regular path writes only max_detections rows of the max_detections *
# max_classes_per_detection outputs (LiteRT leaves the rest unwritten): compare it with 1 class.
# 1917 anchors (SSD's): the fast path ranks its best candidates by a partial selection
# (`detection._Ranking`) and decodes only the boxes it examines.
@pytest.mark.parametrize(
    ("regular", "classes_per_detection", "n"),
    [
        (False, 1, 60),
        (False, 2, 60),
        (False, 3, 60),
        (True, 1, 60),
        (False, 1, 1917),
        (False, 2, 1917),
    ],
)
def test_detection_postprocess(regular: bool, classes_per_detection: int, n: int) -> None:
    rng = np.random.default_rng(3)
    c = 4
    anchors = np.stack(
        [
            rng.uniform(0, 1, n),
            rng.uniform(0, 1, n),
            rng.uniform(0.1, 0.4, n),
            rng.uniform(0.1, 0.4, n),
        ],
        1,
    ).astype(np.float32)
    opts = {
        "max_detections": 10,
        "max_classes_per_detection": classes_per_detection,
        "detections_per_class": 5,
        "use_regular_nms": regular,
        "nms_score_threshold": 0.3,
        "nms_iou_threshold": 0.5,
        "num_classes": c,
        "y_scale": 10.0,
        "x_scale": 10.0,
        "h_scale": 5.0,
        "w_scale": 5.0,
    }
    d = 10 * classes_per_detection
    r = check_op(
        "CUSTOM:TFLite_Detection_PostProcess",
        [Spec([1, n, 4]), Spec([1, n, c + 1], low=0, high=1)],
        consts={2: anchors},
        custom_options=opts,
        outputs=[Spec([1, d, 4]), Spec([1, d]), Spec([1, d]), Spec([1])],
    )
    # Enough well-spread boxes that every output row is written in both NMS paths.
    assert int(r.reference[3][0]) == 10


def _greedy_nms(
    boxes: np.ndarray, scores: np.ndarray, max_det: int, score_th: float, iou_th: float
) -> list[int]:
    """The kernel's loop, one pair at a time (float32 IoU as ComputeIntersectionOverUnion)."""
    f = np.float32
    cand = [i for i in np.argsort(-scores, kind="stable") if scores[i] >= f(score_th)]
    kept: list[int] = []
    for j in cand:
        if len(kept) == max_det:
            break
        bj = boxes[j]
        ok = True
        for i in kept:
            bi = boxes[i]
            ai, aj = (bi[2] - bi[0]) * (bi[3] - bi[1]), (bj[2] - bj[0]) * (bj[3] - bj[1])
            if ai <= 0 or aj <= 0:
                continue
            ih = max(min(bi[2], bj[2]) - max(bi[0], bj[0]), f(0))
            iw = max(min(bi[3], bj[3]) - max(bi[1], bj[1]), f(0))
            inter = f(ih * iw)
            if f(inter / f(f(ai + aj) - inter)) > f(iou_th):
                ok = False
                break
        if ok:
            kept.append(int(j))
    return kept


@pytest.mark.parametrize(
    ("n", "max_det", "spread", "levels"),
    [
        (2000, 10, 0.3, 0),
        (700, 100, 1.0, 0),
        (300, 40, 0.05, 0),
        (50, 60, 1.0, 0),
        # Scores on 6 levels: hundreds of ties across the partial selection's edge (the
        # best 256 of the ranking), which must keep the lower indices first.
        (3000, 300, 0.05, 6),
    ],
)
def test_nms_matches_one_pair_at_a_time(n: int, max_det: int, spread: float, levels: int) -> None:
    # Chunked NMS (SSD: 10 kept of 1917) against the kernel's loop: crowded boxes (most
    # suppressed, so the scan crosses many chunks), sparse ones (few suppressed), degenerate
    # boxes of zero area, and more detections asked for than candidates.
    from litekiln.ops.detection import nms_single_class

    rng = np.random.default_rng(n)
    yx = rng.uniform(0, spread, (n, 2)).astype(np.float32)
    hw = rng.uniform(0.0, 0.3, (n, 2)).astype(np.float32)
    hw[::17] = 0
    boxes = np.concatenate([yx, yx + hw], axis=1).astype(np.float32)
    scores = rng.uniform(0, 1, n).astype(np.float32)
    scores[::5] = scores[1::5][: len(scores[::5])]  # ties: the lower index ranks first
    if levels:
        scores = (np.ceil(scores * levels) / levels).astype(np.float32)
    kept = {}
    for iou_th in (0.2, 0.6):
        kept[iou_th] = _greedy_nms(boxes, scores, max_det, 0.1, iou_th)
        assert nms_single_class(boxes, scores, max_det, 0.1, iou_th) == kept[iou_th]
    candidates = int((scores >= np.float32(0.1)).sum())
    assert 0 < len(kept[0.2]) < min(max_det, candidates) or len(kept[0.2]) == max_det < candidates


# -- MediaPipe custom ops: hand-computed cases -----------------------------------------------


def _run_custom(
    code: str,
    inputs: list[np.ndarray],
    outputs: list[Spec],
    custom: bytes | dict,
    version: int = 1,
    consts: dict | None = None,
) -> list[np.ndarray]:
    model = single_op_model(
        f"CUSTOM:{code}",
        inputs,
        consts=consts,
        outputs=outputs,
        custom_options=custom,
        version=version,
    )
    graph = load_model(model).main
    op = graph.live_ops()[0]
    values = [graph.tensors[t].data if graph.tensors[t].is_constant else None for t in op.inputs]
    feeds = iter(inputs)
    values = [v if v is not None else next(feeds) for v in values]
    return run_op(op, graph, values)


def _pool_params(padding: int, sw: int, sh: int, fw: int, fh: int, act: int = 0) -> bytes:
    # Raw TfLitePoolParams: TfLitePadding (1 SAME, 2 VALID), strides, filter, activation.
    return struct.pack("<6i", padding, sw, sh, fw, fh, act)


def test_convolution2d_transpose_bias_by_hand() -> None:
    # input 1x2x2x1 = [[1, 2], [3, 4]], filter 1x2x2x1 of ones, bias 0.5, stride 2, SAME:
    # pad = max(0, 2 - (2-1) % 2 - 1) = 0, out = 2*(2-1) + 2 = 4; each input pixel fills its
    # own 2x2 block, plus the bias.
    x = np.array([1, 2, 3, 4], np.float32).reshape(1, 2, 2, 1)
    out = _run_custom(
        "Convolution2DTransposeBias",
        [x],
        [Spec([1, 4, 4, 1])],
        struct.pack("<3i", 1, 2, 2),
        consts={1: np.ones([1, 2, 2, 1], np.float32), 2: np.array([0.5], np.float32)},
    )[0]
    expect = np.kron(np.array([[1, 2], [3, 4]], np.float32), np.ones((2, 2), np.float32)) + 0.5
    np.testing.assert_array_equal(out[0, :, :, 0], expect)


@pytest.mark.parametrize(("padding", "stride", "k"), [(1, 2, 3), (2, 2, 3), (1, 1, 3), (2, 3, 2)])
def test_convolution2d_transpose_bias_matches_transpose_conv(
    padding: int, stride: int, k: int
) -> None:
    # The MediaPipe op is TRANSPOSE_CONV with the output size it derives itself, plus a bias.
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, [1, 5, 6, 3]).astype(np.float32)
    w = rng.uniform(-1, 1, [4, k, k, 3]).astype(np.float32)
    b = rng.uniform(-1, 1, [4]).astype(np.float32)
    tot = [max(0, k - (n - 1) % stride - 1) if padding == 1 else 0 for n in (5, 6)]
    oh, ow = (stride * (n - 1) + k - t for n, t in zip((5, 6), tot, strict=True))
    out = _run_custom(
        "Convolution2DTransposeBias",
        [x],
        [Spec([1, oh, ow, 4])],
        struct.pack("<3i", padding, stride, stride),
        consts={1: w, 2: b},
    )[0]
    r = check_op(
        "TRANSPOSE_CONV",
        [x],
        {"padding": "SAME" if padding == 1 else "VALID", "stride_w": stride, "stride_h": stride},
        consts={0: np.array([1, oh, ow, 4], np.int32), 1: w, 3: b},
        version=3,
        out_dtype="float32",
        tol=CONV_TOL,
    )
    np.testing.assert_allclose(out, r.litert[0], atol=1e-4, rtol=1e-4)


def test_max_pooling_with_argmax_by_hand() -> None:
    # 1x4x4x1, 2x2 window, stride 2, VALID. Window (0,0) = [[1, 5], [3, 2]]: max 5 at filter
    # (y=0, x=1) -> index 0*2 + 1 = 1 (+0.1); window (0,1) = [[0, 0], [7, 7]]: first max wins,
    # (1, 0) -> 2; window (1,0) = [[4, 4], [4, 4]] -> 0; window (1,1) = [[-1, -2], [-3, -4]] -> 0.
    x = np.array([[1, 5, 0, 0], [3, 2, 7, 7], [4, 4, -1, -2], [4, 4, -3, -4]], np.float32).reshape(
        1, 4, 4, 1
    )
    values, idx = _run_custom(
        "MaxPoolingWithArgmax2D",
        [x],
        [Spec([1, 2, 2, 1]), Spec([1, 2, 2, 1])],
        _pool_params(2, 2, 2, 2, 2),
    )
    np.testing.assert_array_equal(values[0, :, :, 0], [[5, 7], [4, -1]])
    np.testing.assert_allclose(idx[0, :, :, 0], [[1.1, 2.1], [0.1, 0.1]], rtol=0, atol=1e-6)


def test_max_pooling_with_argmax_same_padding_and_relu() -> None:
    # 1x3x3x1, 2x2 window, stride 2, SAME: out 2x2, total pad (2-1)*2+2-3 = 1 -> 0 before.
    # The last row/column windows see one real row/column: window (1,1) is just x[2,2] = -6,
    # at filter (0, 0) -> index 0. RELU clamps the value to 0 but not the index.
    x = np.array([[1, 2, 3], [4, 9, 5], [0, 8, -6]], np.float32).reshape(1, 3, 3, 1)
    values, idx = _run_custom(
        "MaxPoolingWithArgmax2D",
        [x],
        [Spec([1, 2, 2, 1]), Spec([1, 2, 2, 1])],
        _pool_params(1, 2, 2, 2, 2, act=1),
    )
    np.testing.assert_array_equal(values[0, :, :, 0], [[9, 5], [8, 0]])
    # (0,0): 9 at (1,1) -> 3; (0,1): [3],[5] -> 5 at (1,0) -> 2; (1,0): [0, 8] -> (0,1) -> 1.
    np.testing.assert_allclose(idx[0, :, :, 0], [[3.1, 2.1], [1.1, 0.1]], atol=1e-6)


def test_max_unpooling_by_hand() -> None:
    # Values [[5, 7], [4, -1]] with indices [[1, 2], [0, 3]] (2x2 filter, stride 2): output
    # 4x4, pad ((2-1)*2+2-4)//2 = 0. 5 -> (0, 1); 7 -> (2 + 1, 2 + 0) = row 1 col 2;
    # 4 -> (2, 0); -1 -> (3, 3).
    values = np.array([5, 7, 4, -1], np.float32).reshape(1, 2, 2, 1)
    idx = np.array([1.1, 2.1, 0.1, 3.1], np.float32).reshape(1, 2, 2, 1)
    out = _run_custom(
        "MaxUnpooling2D", [values, idx], [Spec([1, 4, 4, 1])], _pool_params(1, 2, 2, 2, 2)
    )[0]
    expect = np.zeros((4, 4), np.float32)
    expect[0, 1], expect[1, 2], expect[2, 0], expect[3, 3] = 5, 7, 4, -1
    np.testing.assert_array_equal(out[0, :, :, 0], expect)


def test_argmax_then_unpool_roundtrip() -> None:
    rng = np.random.default_rng(2)
    x = rng.permutation(64).astype(np.float32).reshape(1, 8, 8, 1)
    values, idx = _run_custom(
        "MaxPoolingWithArgmax2D",
        [x],
        [Spec([1, 4, 4, 1]), Spec([1, 4, 4, 1])],
        _pool_params(1, 2, 2, 2, 2),
    )
    out = _run_custom(
        "MaxUnpooling2D", [values, idx], [Spec([1, 8, 8, 1])], _pool_params(1, 2, 2, 2, 2)
    )[0]
    # Each 2x2 block keeps only its maximum, in place.
    blocks = x.reshape(4, 2, 4, 2)
    keep = blocks == blocks.max(axis=(1, 3), keepdims=True)
    np.testing.assert_array_equal(out.reshape(4, 2, 4, 2), np.where(keep, blocks, 0))


def _matrix(rows: list[list[float]]) -> np.ndarray:
    return np.array(rows, np.float32).reshape(1, 4, 4)


def test_transform_landmarks_by_hand() -> None:
    # x' = 2x + 0y + 1, y' = 0x + 3y - 1 (rows 0 and 1 of the matrix; column 2 meets z = 0).
    m = _matrix([[2, 0, 9, 1], [0, 3, 9, -1], [0, 0, 1, 0], [0, 0, 0, 1]])
    lm = np.array([[[1, 2], [0.5, -1]]], np.float32)
    out = _run_custom("TransformLandmarks", [lm, m], [Spec([1, 2, 2])], b"", version=2)[0]
    np.testing.assert_allclose(out, [[[3, 5], [2, -4]]])
    # 3-D landmarks: z passes through unchanged.
    lm3 = np.array([[[1, 2, 7]]], np.float32)
    out3 = _run_custom("TransformLandmarks", [lm3, m], [Spec([1, 1, 3])], b"", version=2)[0]
    np.testing.assert_allclose(out3, [[[3, 5, 7]]])


def test_transform_tensor_bilinear_by_hand() -> None:
    # 1x2x3x1 input [[0, 1, 2], [3, 4, 5]]. v2 with matrix x' = 0.5x + 0.25, y' = y:
    # the half-pixel correction adds t0*0.5 + t1*0.5 - 0.5 = -0.25 to x (and 0.5 - 0.5 = 0
    # to y), so output pixel (y, x) samples (y, 0.5x). Output 2x4: x = 0, 0.5, 1, 1.5 ->
    # row 0: 0, 0.5, 1, 1.5; row 1: 3, 3.5, 4, 4.5.
    img = np.array([[0, 1, 2], [3, 4, 5]], np.float32).reshape(1, 2, 3, 1)
    m = _matrix([[0.5, 0, 0, 0.25], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])
    out = _run_custom(
        "TransformTensorBilinear",
        [img, m],
        [Spec([1, 2, 4, 1])],
        {"output_height": 2, "output_width": 4},
        version=2,
    )[0]
    np.testing.assert_allclose(out[0, :, :, 0], [[0, 0.5, 1, 1.5], [3, 3.5, 4, 4.5]], atol=1e-6)
    # Sampling outside [0, W-1] x [0, H-1] gives 0: shift x by +1.5 -> x' = 0.5x + 1.5,
    # columns 2 and 3 land at 2.5 and 3 > 2.
    m2 = _matrix([[0.5, 0, 0, 1.75], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])
    out2 = _run_custom(
        "TransformTensorBilinear",
        [img, m2],
        [Spec([1, 2, 4, 1])],
        {"output_height": 2, "output_width": 4},
        version=2,
    )[0]
    np.testing.assert_allclose(out2[0, :, :, 0], [[1.5, 2, 0, 0], [4.5, 5, 0, 0]], atol=1e-6)


def test_landmarks_to_transform_matrix_by_hand() -> None:
    # Landmarks (x, y, z): 0 = (2, 4), 1 = (6, 4), 2 = (4, 1), 3 = (4, 7). Rotation from 0 to 1
    # is atan2(0, 4) = 0, target 0 -> r = 0. Subset {0..3}: bbox x 2..6, y 1..7 -> width 4,
    # height 6, center (4, 4). Output 8x8, scale 1.5:
    # M = T(4, 4) @ S(1.5*4/8, 1.5*6/8) @ T(-4, -4) = [[0.75, 0, 0, 4 - 3], [0, 1.125, 0, 4 - 4.5]].
    lm = np.array([[2, 4, 0], [6, 4, 0], [4, 1, 0], [4, 7, 0]], np.float32).reshape(1, 4, 3)
    opts = {
        "left_rotation_idx": 0,
        "right_rotation_idx": 1,
        "subset_idxs": [0, 1, 2, 3],
        "target_rotation_radians": 0.0,
        "output_height": 8,
        "output_width": 8,
        "scale_x": 1.5,
        "scale_y": 1.5,
    }
    out = _run_custom("Landmarks2TransformMatrix", [lm], [Spec([1, 4, 4])], opts, version=2)[0]
    expect = _matrix([[0.75, 0, 0, 1], [0, 1.125, 0, -0.5], [0, 0, 1, 0], [0, 0, 0, 1]])
    np.testing.assert_allclose(out, expect, atol=1e-6)


def test_landmarks_to_transform_matrix_rotated() -> None:
    # Same points rotated by 90 degrees about the origin ((x, y) -> (-y, x)): landmark 1 is now
    # straight below 0, atan2(4, 0) = pi/2 -> r = -pi/2. Rotating the subset by r undoes the
    # rotation, so the bbox is again 4 x 6 around (4, 4), rotated back to center (-4, 4).
    # M = T(-4, 4) @ R(pi/2) @ S(0.75, 1.125) @ T(-4, -4):
    # R(pi/2) @ S = [[0, -1.125], [0.75, 0]]; times (-4, -4) gives (4.5, -3) -> translation
    # (-4 + 4.5, 4 - 3) = (0.5, 1).
    pts = np.array([[2, 4], [6, 4], [4, 1], [4, 7]], np.float32)
    lm = np.concatenate([np.stack([-pts[:, 1], pts[:, 0]], 1), np.zeros((4, 1), np.float32)], 1)
    opts = {
        "left_rotation_idx": 0,
        "right_rotation_idx": 1,
        "subset_idxs": [0, 1, 2, 3],
        "target_rotation_radians": 0.0,
        "output_height": 8,
        "output_width": 8,
        "scale_x": 1.5,
        "scale_y": 1.5,
    }
    out = _run_custom(
        "Landmarks2TransformMatrix", [lm.reshape(1, 4, 3)], [Spec([1, 4, 4])], opts, version=2
    )[0]
    expect = _matrix([[0, -1.125, 0, 0.5], [0.75, 0, 0, 1], [0, 0, 1, 0], [0, 0, 0, 1]])
    np.testing.assert_allclose(out, expect, atol=1e-5)


# -- GPU support ----------------------------------------------------------------------------


def _const(shape: list[int]) -> np.ndarray:
    return np.full(shape, 0.5, np.float32)


def _graph(model: bytes):
    graph = load_model(model).main
    return graph, graph.live_ops()[0]


def test_gpu_support_reasons() -> None:
    conv = single_op_model(
        "CONV_2D",
        [Spec([1, 4, 4, 2])],
        {"padding": "SAME", "stride_w": 1, "stride_h": 1},
        consts={1: _const([3, 3, 3, 2]), 2: _const([3])},
    )
    g, op = _graph(conv)
    assert lookup(op).gpu_support(op, g) is None
    runtime_w = single_op_model(
        "CONV_2D",
        [Spec([1, 4, 4, 2]), Spec([3, 3, 3, 2])],
        {"padding": "SAME", "stride_w": 1, "stride_h": 1},
        consts={2: _const([3])},
    )
    g, op = _graph(runtime_w)
    assert "weights" in lookup(op).gpu_support(op, g)
    sign = single_op_model(
        "CONV_2D",
        [Spec([1, 4, 4, 2])],
        {"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": "SIGN_BIT"},
        consts={1: _const([3, 3, 3, 2]), 2: _const([3])},
    )
    g, op = _graph(sign)
    assert "activation" in lookup(op).gpu_support(op, g)
    dw3 = single_op_model(
        "DEPTHWISE_CONV_2D",
        [Spec([1, 4, 4, 2])],
        {"padding": "SAME", "stride_w": 1, "stride_h": 1},
        consts={1: _const([1, 3, 3, 2]), 2: _const([2])},
        version=3,
    )
    g, op = _graph(dw3)
    # Versions are features now: the GPU form takes v3; the documented table stops at v2.
    assert lookup(op).gpu_support(op, g, allow_quantized=False) is None

    assert "version 3 > 2" in (gpu_reason(op, g, allow_quantized=False, extended_table=False) or "")
    lstm_full = single_op_model(
        "LSTM",
        [Spec([1, 4]), Spec([1, 3]), Spec([1, 3])],
        {"kernel_type": "FULL"},
        consts={2: _const([12, 7]), 3: _const([12])},
        outputs=[Spec([1, 3])],
    )
    g, op = _graph(lstm_full)
    assert "basic" in lookup(op).gpu_support(op, g)
    tconv = single_op_model(
        "TRANSPOSE_CONV",
        [Spec([1, 2, 2, 2])],
        {"padding": "SAME", "stride_w": 2, "stride_h": 2},
        consts={0: np.array([1, 4, 4, 3], np.int32), 1: _const([3, 2, 2, 2])},
        out_dtype="float32",
    )
    g, op = _graph(tconv)
    assert lookup(op).gpu_support(op, g) is None  # int32 output_shape is an integer operand
    custom = single_op_model(
        "CUSTOM:Convolution2DTransposeBias",
        [Spec([1, 2, 2, 1])],
        consts={1: _const([1, 2, 2, 1]), 2: _const([1])},
        custom_options=struct.pack("<3i", 1, 2, 2),
        out_shape=[1, 4, 4, 1],
    )
    g, op = _graph(custom)
    # In the extended table only: supported by the op, refused by the documented table.
    assert lookup(op).gpu_support(op, g) is None
    assert gpu_reason(op, g, extended_table=False) == (
        "not in the documented GPU op table (op_table='documented')"
    )
    assert gpu_reason(op, g) is None  # the default table
    bad = single_op_model(
        "CUSTOM:Convolution2DTransposeBias",
        [Spec([1, 2, 2, 1])],
        consts={1: _const([1, 2, 2, 1]), 2: _const([1])},
        custom_options=struct.pack("<3i", 3, 2, 2),
        out_shape=[1, 4, 4, 1],
    )
    with pytest.raises(ModelError, match=r"padding code 3 is neither SAME \(1\) nor VALID \(2\)"):
        _graph(bad)  # refused at load now, naming the rule


def test_mediapipe_geometry_gpu_support() -> None:
    """The three geometric ops have GPU forms (extended table); Landmarks2TransformMatrix
    version 1 stays on the CPU, and options the GPU form cannot read say why."""
    opts = {
        "left_rotation_idx": 0,
        "right_rotation_idx": 1,
        "subset_idxs": [0, 1, 2],
        "output_height": 8,
        "output_width": 8,
        "scale_x": 1.5,
        "scale_y": 1.5,
    }

    def matrix_op(version: int, options: dict):  # type: ignore[no-untyped-def]
        model = single_op_model(
            "CUSTOM:Landmarks2TransformMatrix",
            [Spec([1, 4, 3])],
            outputs=[Spec([1, 4, 4])],
            custom_options=options,
            version=version,
        )
        return _graph(model)

    g, op = matrix_op(2, opts)
    assert lookup(op).gpu_support(op, g) is None
    assert gpu_reason(op, g) is None
    assert "not in the documented GPU op table" in (gpu_reason(op, g, extended_table=False) or "")
    g, op = matrix_op(1, opts)
    assert "version 1" in (lookup(op).gpu_support(op, g) or "")
    g, op = matrix_op(2, {**opts, "subset_idxs": [0, 9]})
    assert "landmark index 9 out of range for 4 landmarks" in (lookup(op).gpu_support(op, g) or "")
    crop = single_op_model(
        "CUSTOM:TransformTensorBilinear",
        [Spec([1, 6, 6, 2]), Spec([1, 4, 4])],
        outputs=[Spec([1, 3, 3, 2])],
        custom_options={"output_height": 3, "output_width": 3},
        version=2,
    )
    g, op = _graph(crop)
    assert gpu_reason(op, g) is None
    move = single_op_model(
        "CUSTOM:TransformLandmarks",
        [Spec([1, 5, 2]), Spec([1, 4, 4])],
        outputs=[Spec([1, 5, 2])],
        custom_options=b"",
        version=2,
    )
    g, op = _graph(move)
    assert gpu_reason(op, g) is None


# -- whole MediaPipe models -------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "face_landmark/face_landmark_with_attention.tflite",
        "selfie_segmentation/selfie_segmentation.tflite",
        "selfie_segmentation/selfie_segmentation_landscape.tflite",
    ],
)
def test_mediapipe_model_end_to_end(path: str) -> None:
    file = MP / path
    if not file.exists():
        pytest.skip(f"{file} not unpacked")
    graph = load_model(file).main
    rng = np.random.default_rng(0)
    feeds = {t: rng.uniform(0, 1, graph.tensors[t].shape).astype(np.float32) for t in graph.inputs}
    outs = run_graph(graph, feeds)
    for t in graph.outputs:
        tensor = graph.tensors[t]
        assert outs[t].shape == tensor.shape, tensor.name
        assert outs[t].dtype == tensor.dtype, tensor.name
        assert np.isfinite(outs[t]).all(), tensor.name
