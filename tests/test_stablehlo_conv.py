"""STABLEHLO_CONVOLUTION on the CPU (litekiln/ops/conv.py): litert-torch writes PyTorch's
ConvTranspose3d with it (the input dilated by the stride, padded by the kernel less one, the
flipped kernel), and LiteRT has no kernel for it: it refuses such a model
("Didn't find op for builtin opcode 'STABLEHLO_CONVOLUTION'"). PyTorch is the reference here
(its CPU build, the torch-peer extra the test command installs)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tflite_builder import ModelBuilder

import litekiln

torch = pytest.importorskip("torch")
F = torch.nn.functional
F32 = np.float32


def _run(x: np.ndarray, w: np.ndarray, out_shape: list[int], **options: Any) -> np.ndarray:
    b = ModelBuilder()
    xin = b.input("x", list(x.shape))
    y = b.op("STABLEHLO_CONVOLUTION", [xin, b.const("w", w)], out_shape=out_shape,
             options=options)  # fmt: skip
    b.output(y)
    it = litekiln.Interpreter(model_content=b.build(), device="reference")
    (got,) = it.run([x])
    return got


def _nchw(n: int, **extra: Any) -> dict[str, Any]:
    """Dimension numbers of PyTorch's layouts: input NC..., kernel IO... (transposed
    convolutions, as litert-torch writes them) or OI..., output NC...."""
    spatial = list(range(2, 2 + n))
    return {
        "input_batch_dimension": 0, "input_feature_dimension": 1,
        "input_spatial_dimensions": spatial, "kernel_input_feature_dimension": 0,
        "kernel_output_feature_dimension": 1, "kernel_spatial_dimensions": spatial,
        "output_batch_dimension": 0, "output_feature_dimension": 1,
        "output_spatial_dimensions": spatial, "feature_group_count": 1, "batch_group_count": 1,
        **extra,
    }  # fmt: skip


@pytest.mark.parametrize(("kernel", "stride"), [(2, 2), (3, 2), (3, 1)])
def test_conv_transpose3d_as_litert_torch_writes_it(kernel: int, stride: int) -> None:
    """ConvTranspose3d(8 -> 4): lhs dilation = the stride, padding = kernel - 1 each side, the
    kernel flipped spatially, its in/out features as PyTorch stores them."""
    rng = np.random.default_rng(kernel * 10 + stride)
    x = rng.uniform(-1, 1, [1, 8, 3, 4, 4]).astype(F32)
    wt = rng.uniform(-1, 1, [8, 4, kernel, kernel, kernel]).astype(F32)  # torch: [in, out, k...]
    want = F.conv_transpose3d(torch.from_numpy(x), torch.from_numpy(wt), stride=stride).numpy()
    flipped = np.ascontiguousarray(wt[:, :, ::-1, ::-1, ::-1])
    opts = _nchw(3, window_strides=[1, 1, 1], padding=[kernel - 1] * 6,
                 lhs_dilation=[stride] * 3, rhs_dilation=[1, 1, 1],
                 window_reversal=[False] * 3)  # fmt: skip
    got = _run(x, flipped, list(want.shape), **opts)
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize(
    ("stride", "dilation", "groups", "padding"),
    [(2, 1, 1, [1, 1, 0, 2]), (1, 2, 2, [0, 0, 0, 0]), (1, 1, 4, [2, 2, 2, 2])],
)
def test_conv2d_with_groups_strides_and_dilation(
    stride: int, dilation: int, groups: int, padding: list[int]
) -> None:
    rng = np.random.default_rng(groups)
    x = rng.uniform(-1, 1, [2, 8, 9, 10]).astype(F32)
    w = rng.uniform(-1, 1, [12, 8 // groups, 3, 3]).astype(F32)  # OI.. (kernel out first)
    xp = np.pad(x, [(0, 0), (0, 0), (padding[0], padding[1]), (padding[2], padding[3])])
    want = F.conv2d(torch.from_numpy(xp), torch.from_numpy(w), stride=stride, dilation=dilation,
                    groups=groups).numpy()  # fmt: skip
    opts = _nchw(2, kernel_input_feature_dimension=1, kernel_output_feature_dimension=0,
                 window_strides=[stride] * 2, padding=padding, lhs_dilation=[1, 1],
                 rhs_dilation=[dilation] * 2, window_reversal=[False, False],
                 feature_group_count=groups)  # fmt: skip
    got = _run(x, w, list(want.shape), **opts)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_nhwc_layouts_negative_padding_and_window_reversal() -> None:
    """Dimension numbers other than PyTorch's (NHWC input and output, HWIO kernel), a
    negative padding (a crop) and a reversed window."""
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, [1, 7, 8, 3]).astype(F32)  # NHWC
    w = rng.uniform(-1, 1, [3, 2, 3, 5]).astype(F32)  # HWIO
    xc = x[:, 1:, :-1]  # padding [-1, 0, 0, -1]
    want = F.conv2d(
        torch.from_numpy(xc.transpose(0, 3, 1, 2).copy()),
        torch.from_numpy(w[::-1, :, :, :].transpose(3, 2, 0, 1).copy()),
    ).numpy()
    want = want.transpose(0, 2, 3, 1)  # fmt: skip
    opts = {
        "input_batch_dimension": 0, "input_feature_dimension": 3,
        "input_spatial_dimensions": [1, 2], "kernel_input_feature_dimension": 2,
        "kernel_output_feature_dimension": 3, "kernel_spatial_dimensions": [0, 1],
        "output_batch_dimension": 0, "output_feature_dimension": 3,
        "output_spatial_dimensions": [1, 2], "window_strides": [1, 1],
        "padding": [-1, 0, 0, -1], "lhs_dilation": [1, 1], "rhs_dilation": [1, 1],
        "window_reversal": [True, False], "feature_group_count": 1, "batch_group_count": 1,
    }  # fmt: skip
    got = _run(x, w, list(want.shape), **opts)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_batch_groups_are_refused_naming_them() -> None:
    x = np.zeros([2, 4, 5, 5], F32)
    with pytest.raises(litekiln.ModelError, match="batch_group_count"):
        _run(x, np.zeros([4, 4, 3, 3], F32), [1, 4, 3, 3], **_nchw(2, batch_group_count=2,
             window_strides=[1, 1], padding=[0] * 4, lhs_dilation=[1, 1],
             rhs_dilation=[1, 1], window_reversal=[False, False]))  # fmt: skip
