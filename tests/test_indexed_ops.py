"""Ops that LiteRT runs and litekiln refused at load, against LiteRT: DYNAMIC_UPDATE_SLICE,
SCATTER_ND, SPARSE_TO_DENSE, SEGMENT_SUM, UNSORTED_SEGMENT_*, BUCKETIZE, MATRIX_DIAG,
MATRIX_SET_DIAG, REVERSE_SEQUENCE (litekiln/ops/indexed.py); NON_MAX_SUPPRESSION_V4/V5
(litekiln/ops/nms.py); BITCAST (litekiln/ops/shape.py); CONV_3D_TRANSPOSE
(litekiln/ops/conv.py); ATAN2, RIGHT_SHIFT, BITWISE_XOR,
FAKE_QUANT (litekiln/ops/elementwise.py); REDUCE_ALL (litekiln/ops/reduce.py). Inputs fed
at run time and, where the output's size depends on them, as constants too."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from oplib import Quant, Spec, check_op

I32, I64, F32 = np.int32, np.int64, np.float32
RNG = np.random.default_rng(7)


@pytest.mark.parametrize(
    ("start", "dtype"),
    [([1, 2], F32), ([-3, 9], F32), ([0, 0], I32), ([2, 5], I64)],  # (clamped to fit)
    ids=str,
)
def test_dynamic_update_slice(start: list[int], dtype: Any) -> None:
    x = RNG.uniform(-5, 5, [4, 7]).astype(dtype)
    upd = RNG.uniform(-5, 5, [2, 3]).astype(dtype)
    check_op("DYNAMIC_UPDATE_SLICE", [x, upd, np.asarray(start, I32)], tol=0)


def test_dynamic_update_slice_of_a_quantized_cache() -> None:
    """An int8 key-value cache updated in place: the stored integers are copied."""
    q = Quant(0.05, 2)
    check_op(
        "DYNAMIC_UPDATE_SLICE",
        [Spec([1, 8, 4], "int8", q), Spec([1, 1, 4], "int8", q), np.asarray([0, 3, 0], I64)],
        out_quant=q,
        qtol=0,
    )


@pytest.mark.parametrize("dtype", [F32, I32])
def test_scatter_nd(dtype: Any) -> None:
    idx = np.asarray([[0, 1], [2, 3], [0, 1]], I32)  # (0, 1) twice: the updates add up
    upd = RNG.uniform(-3, 3, [3, 5]).astype(dtype)
    check_op("SCATTER_ND", [idx, upd], consts={2: np.asarray([3, 4, 5], I32)}, tol=1e-6)


def test_scatter_nd_rows_fed_at_run_time() -> None:
    check_op(
        "SCATTER_ND",
        [np.asarray([[3], [1]], I32), RNG.uniform(-1, 1, [2, 4]).astype(F32),
         np.asarray([5, 4], I32)],
        tol=0,
    )  # fmt: skip


@pytest.mark.parametrize(
    "op", ["UNSORTED_SEGMENT_SUM", "UNSORTED_SEGMENT_PROD", "UNSORTED_SEGMENT_MAX",
           "UNSORTED_SEGMENT_MIN"],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [F32, I32])
def test_unsorted_segments(op: str, dtype: Any) -> None:
    data = RNG.uniform(-4, 4, [6, 3]).astype(dtype)
    ids = np.asarray([2, 0, -1, 2, 4, 0], I32)  # -1 skipped; segments 1 and 3 stay initial
    check_op(op, [data, ids], consts={2: np.asarray(5, I32)}, tol=1e-6)


def test_segment_sum() -> None:
    data = RNG.uniform(-4, 4, [5, 2, 3]).astype(F32)
    check_op("SEGMENT_SUM", [data], consts={1: np.asarray([0, 0, 1, 2, 2], I32)}, tol=1e-6)


@pytest.mark.parametrize("dtype", [F32, I32, I64])
def test_bucketize(dtype: Any) -> None:
    x = np.asarray([[-10, 0, 1, 2.5], [3, 4, 99, 1]]).astype(dtype)  # (values on boundaries)
    check_op("BUCKETIZE", [x], {"boundaries": [0.0, 1.0, 3.0, 10.0]}, out_dtype="int32", tol=0)


@pytest.mark.parametrize("dtype", [F32, I32])
def test_matrix_diag(dtype: Any) -> None:
    check_op("MATRIX_DIAG", [RNG.uniform(-2, 2, [2, 3, 4]).astype(dtype)], tol=0)


@pytest.mark.parametrize("shape", [[3, 3], [2, 3, 5], [4, 2]], ids=str)
def test_matrix_set_diag(shape: list[int]) -> None:
    x = RNG.uniform(-2, 2, shape).astype(F32)
    d = RNG.uniform(-2, 2, [*shape[:-2], min(shape[-2:])]).astype(F32)
    check_op("MATRIX_SET_DIAG", [x, d], tol=0)


@pytest.mark.parametrize(("seq_dim", "batch_dim"), [(1, 0), (0, 1), (2, 0)])
def test_reverse_sequence(seq_dim: int, batch_dim: int) -> None:
    x = RNG.uniform(-2, 2, [3, 4, 5]).astype(F32)
    lengths = np.asarray([4, 0, 1, 3, 2][: x.shape[batch_dim]], I32)
    lengths = np.minimum(lengths, x.shape[seq_dim])
    check_op("REVERSE_SEQUENCE", [x, lengths], {"seq_dim": seq_dim, "batch_dim": batch_dim}, tol=0)


def test_atan2() -> None:
    y = RNG.uniform(-3, 3, [4, 5]).astype(F32)
    x = RNG.uniform(-3, 3, [4, 5]).astype(F32)
    x[0, :2] = 0.0
    check_op("ATAN2", [y, x], tol=(1e-6, 1e-6))


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "int32", "uint32"])
def test_bit_ops(dtype: str) -> None:
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max, [3, 4], endpoint=True).astype(dtype)
    shifts = np.asarray([-1 if info.min < 0 else 0, 0, 3, info.bits + 4]).astype(dtype)
    check_op("RIGHT_SHIFT", [x, shifts], tol=0)  # (shifts broadcast per column, clamped)
    y = RNG.integers(info.min, info.max, [3, 4], endpoint=True).astype(dtype)
    check_op("BITWISE_XOR", [x, y], tol=0)


@pytest.mark.parametrize("keep_dims", [False, True])
def test_reduce_all(keep_dims: bool) -> None:
    x = RNG.uniform(0, 1, [3, 4, 2]) > 0.2
    check_op("REDUCE_ALL", [x], {"keep_dims": keep_dims}, consts={1: np.asarray([1], I32)})


def _boxes(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    corner = rng.uniform(0, 1, [n, 2])
    size = rng.uniform(0.05, 0.4, [n, 2])
    boxes = np.concatenate([corner, corner + size], axis=1).astype(F32)
    boxes[::5] = boxes[::5][:, [2, 3, 0, 1]]  # (some given as (max, min): the kernel sorts them)
    scores = rng.uniform(0, 1, n).astype(F32)
    scores[3] = scores[7] = scores[11] = 0.9  # ties: the heap's order picks among them
    return boxes, scores


@pytest.mark.parametrize("iou", [0.3, 0.5, 1.0])
@pytest.mark.parametrize("max_out", [5, 20])
def test_non_max_suppression_v4(iou: float, max_out: int) -> None:
    boxes, scores = _boxes(40, int(iou * 10) + max_out)
    check_op(
        "NON_MAX_SUPPRESSION_V4",
        [boxes, scores],
        consts={2: np.asarray(max_out, I32), 3: np.asarray(iou, F32), 4: np.asarray(0.2, F32)},
        outputs=[Spec([max_out], "int32"), Spec([], "int32")],
        tol=0,
    )


@pytest.mark.parametrize("sigma", [0.0, 0.5])
def test_non_max_suppression_v5_soft(sigma: float) -> None:
    boxes, scores = _boxes(30, 3)
    check_op(
        "NON_MAX_SUPPRESSION_V5",
        [boxes, scores],
        consts={2: np.asarray(12, I32), 3: np.asarray(0.6, F32), 4: np.asarray(0.1, F32),
                5: np.asarray(sigma, F32)},
        outputs=[Spec([12], "int32"), Spec([12], "float32"), Spec([], "int32")],
        tol=(1e-6, 1e-6),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("lo", "hi", "bits"), [(-1.0, 1.0, 8), (-0.3, 5.7, 8), (-6.0, 0.0, 4), (0.0, 2.5, 16)]
)
def test_fake_quant(lo: float, hi: float, bits: int) -> None:
    x = Spec([4, 33], low=lo - 1, high=hi + 1)
    check_op("FAKE_QUANT", [x], {"min": lo, "max": hi, "num_bits": bits}, tol=(1e-6, 1e-6))


@pytest.mark.parametrize(
    ("shape", "src", "dst"),
    [([3, 4], "float32", "int32"), ([2, 3], "int32", "int8"), ([2, 4], "int16", "int64"),
     ([5], "float32", "uint8")],
    ids=str,
)  # fmt: skip
def test_bitcast(shape: list[int], src: str, dst: str) -> None:
    x = RNG.integers(-100, 100, shape).astype(src)
    check_op("BITCAST", [x], out_dtype=dst, tol=0)


@pytest.mark.parametrize(
    ("idx", "shape", "values"),
    [
        (np.asarray([[0, 1], [2, 3], [0, 1]], I32), [3, 4], np.asarray([1.5, -2.0, 7.0], F32)),
        (np.asarray([4, 0, 2], I32), [6], np.asarray(3, I32)),  # a scalar value for all
        (np.asarray([[1, 0, 2]], I64), [2, 2, 3], np.asarray([9], I64)),
    ],
    ids=["2d", "scalar", "int64"],
)
def test_sparse_to_dense(idx: np.ndarray, shape: list[int], values: np.ndarray) -> None:
    default = np.asarray(-1, values.dtype)
    check_op("SPARSE_TO_DENSE", [idx], consts={1: np.asarray(shape, idx.dtype), 2: values,
             3: default}, tol=0)  # fmt: skip


@pytest.mark.parametrize(
    ("x_shape", "kernel", "out_shape", "options"),
    [
        ([1, 2, 3, 3, 4], [2, 2, 2], [1, 4, 6, 6, 5], {"padding": "SAME", "stride_d": 2,
                                                       "stride_h": 2, "stride_w": 2}),
        ([1, 3, 4, 4, 2], [3, 3, 3], [1, 3, 4, 4, 3], {"padding": "SAME", "stride_d": 1,
                                                       "stride_h": 1, "stride_w": 1}),
        ([2, 2, 2, 3, 3], [3, 2, 3], [2, 5, 4, 7, 2], {"padding": "VALID", "stride_d": 2,
                                                       "stride_h": 2, "stride_w": 2}),
        ([1, 3, 3, 3, 2], [2, 3, 2], [1, 5, 9, 5, 4], {"padding": "VALID", "stride_d": 1,
                                                       "stride_h": 1, "stride_w": 1,
                                                       "dilation_d_factor": 2,
                                                       "dilation_h_factor": 3,
                                                       "dilation_w_factor": 2}),
    ],
    ids=["same_s2", "same_s1", "valid_s2", "valid_dilated"],
)  # fmt: skip
@pytest.mark.parametrize("bias", [False, True])
def test_conv3d_transpose(
    x_shape: list[int],
    kernel: list[int],
    out_shape: list[int],
    options: dict[str, Any],
    bias: bool,
) -> None:
    """CONV_3D_TRANSPOSE (PyTorch's ConvTranspose3d), on the CPU (litekiln/ops/conv.py)."""
    rng = np.random.default_rng(sum(x_shape))
    w = rng.uniform(-1, 1, [*kernel, out_shape[4], x_shape[4]]).astype(F32)
    consts: dict[int, Any] = {0: np.asarray(out_shape, I32), 1: w}
    if bias:
        consts[3] = rng.uniform(-1, 1, out_shape[4]).astype(F32)
    act = "RELU" if bias else "NONE"
    check_op("CONV_3D_TRANSPOSE", [Spec(x_shape)], {**options, "fused_activation_function": act},
             consts=consts, out_dtype="float32", tol=1e-5)  # fmt: skip
