"""Every op with a GPU emitter, on the GPU path (PoCL in CI) vs the numpy reference and LiteRT.

Each case is a single op (or a tiny chain) with its own graph inputs; the cases of one family
are compiled together into one model (see ``tests/gpu_helper.py``) because every compile costs
seconds on PoCL, but each case is its own test and fails on its own. Every case also asserts
that all of its ops really went to the GPU, so that a partitioner change cannot turn a test
into a reference-vs-reference comparison.

Tolerance: ``max|gpu - ref| <= 1e-4 * max(1, max|ref|)`` (and the same against LiteRT): both
sides are float32; only summation order and the OpenCL vs libm transcendental functions
differ (~1e-6 relative), while any indexing, padding or layout mistake is of the order of
the data. Quantized cases go through the float view: within one quantization step of the
reference (two of LiteRT's fixed-point kernels). See ``gpu_helper`` for the details.

Ops outside the documented GPU table run on the GPU under the default (extended) table.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from gpu_helper import Batch, Case, G
from tflite_builder import Quant

pytestmark = pytest.mark.opencl


def _out(size: int, k: int, s: int, d: int, padding: str) -> int:
    eff = (k - 1) * d + 1
    return (size + s - 1) // s if padding == "SAME" else (size + s - eff) // s


# -- convolutions -----------------------------------------------------------------------------


def _conv(shape, cout, k, s=(1, 1), d=(1, 1), padding="SAME", act="NONE", bias=True, cin=None):
    n, h, w, c = shape
    kh, kw = k
    cin = cin or c

    def build(g: G):
        x = g.x(shape)
        ins = [x, g.w([cout, kh, kw, cin])] + ([g.w([cout])] if bias else [None])
        oh, ow = _out(h, kh, s[0], d[0], padding), _out(w, kw, s[1], d[1], padding)
        return g.op(
            "CONV_2D",
            ins,
            [n, oh, ow, cout],
            {
                "padding": padding,
                "stride_h": s[0],
                "stride_w": s[1],
                "dilation_h_factor": d[0],
                "dilation_w_factor": d[1],
                "fused_activation_function": act,
            },
        )

    return build


def _dw(shape, mult, k, s=(1, 1), d=(1, 1), padding="SAME", act="NONE", bias=True):
    n, h, w, c = shape
    kh, kw = k

    def build(g: G):
        ins = [g.x(shape), g.w([1, kh, kw, c * mult])] + ([g.w([c * mult])] if bias else [None])
        oh, ow = _out(h, kh, s[0], d[0], padding), _out(w, kw, s[1], d[1], padding)
        return g.op(
            "DEPTHWISE_CONV_2D",
            ins,
            [n, oh, ow, c * mult],
            {
                "padding": padding,
                "stride_h": s[0],
                "stride_w": s[1],
                "dilation_h_factor": d[0],
                "dilation_w_factor": d[1],
                "depth_multiplier": mult,
                "fused_activation_function": act,
            },
            version=2 if d != (1, 1) else 1,
        )

    return build


def _tconv(shape, cout, k, s, padding, out_hw=None, bias=False, act="NONE"):
    n, h, w, c = shape
    kh, kw = k
    if out_hw is None:
        out_hw = (
            (h * s[0], w * s[1])
            if padding == "SAME"
            else ((h - 1) * s[0] + kh, (w - 1) * s[1] + kw)
        )

    def build(g: G):
        out_shape = [n, *out_hw, cout]
        ins = [g.ints(out_shape), g.w([cout, kh, kw, c]), g.x(shape)]
        opts = {"padding": padding, "stride_h": s[0], "stride_w": s[1]}
        if bias:
            ins.append(g.w([cout]))
        if act != "NONE":
            opts["fused_activation_function"] = act
        # Written as v1 even with a bias (v3) or an activation (v4): the float GPU table stops
        # at v1, and the emitter's bias/activation paths (reached by quantized v3 models
        # through the float view) are what is tested; LiteRT's kernel ignores the version.
        return g.op("TRANSPOSE_CONV", ins, out_shape, opts, version=1, dtype="float32")

    return build


def _fc(shape, units, keep=False, bias=True, act="NONE", computed_weights=False):
    def build(g: G):
        depth = shape[-1]
        # Computed weights: a graph input (attention written as FULLY_CONNECTED).
        w = g.x([units, depth]) if computed_weights else g.w([units, depth])
        ins = [g.x(shape), w, g.w([units]) if bias else None]
        rows = int(np.prod(shape[:-1]))
        out = [*shape[:-1], units] if keep else [rows, units]
        return g.op(
            "FULLY_CONNECTED", ins, out, {"keep_num_dims": keep, "fused_activation_function": act}
        )

    return build


def _fc_transposed(tokens, channels, units, keep=False, act="NONE", computed=True, back=True):
    """An MLP mixer's token mixing as litert-torch writes it (ResMLP): ``[1, tokens, channels]``
    transposed to ``[1, channels, tokens]``, a FULLY_CONNECTED over the tokens, a per-channel
    scale and the transpose back (``back``) added to the residual. Emitted as ``w @ x``
    (`emit_nn._fully_connected_by_columns`)."""

    def build(g: G):
        x = g.x([1, tokens, channels])
        if computed:  # the mixer's affine map before it: the transpose's source is computed
            x = g.op("ADD", [x, g.w([1, 1, channels])], [1, tokens, channels])
        t = g.op("TRANSPOSE", [x, g.ints([0, 2, 1])], [1, channels, tokens])
        out = [1, channels, units] if keep else [channels, units]
        ins = [t, g.w([units, tokens]), g.w([units])]
        y = g.op(
            "FULLY_CONNECTED", ins, out, {"keep_num_dims": keep, "fused_activation_function": act}
        )
        if not back:
            return y
        y = g.op("MUL", [y, g.w([1, channels, 1])], [1, channels, units])
        y = g.op("TRANSPOSE", [y, g.ints([0, 2, 1])], [1, units, channels])
        return g.op("ADD", [x, y], [1, tokens, channels]) if units == tokens else y

    return build


CONV = Batch(
    "conv",
    [
        Case("conv_k3_s1_same", _conv([1, 9, 9, 3], 4, (3, 3))),
        Case("conv_k3_s2_same_relu", _conv([1, 9, 9, 3], 4, (3, 3), (2, 2), act="RELU")),
        Case(
            "conv_k3_s2_valid_relu6_batch2",
            _conv([2, 11, 9, 5], 6, (3, 3), (2, 2), padding="VALID", act="RELU6"),
        ),
        Case(
            "conv_k3_d2_same_n1to1", _conv([1, 10, 10, 4], 5, (3, 3), d=(2, 2), act="RELU_N1_TO_1")
        ),
        Case("conv_k3_s3_d2_valid", _conv([1, 13, 12, 3], 2, (3, 3), (3, 3), (2, 2), "VALID")),
        # (No bias: LiteRT's float CONV_2D and DEPTHWISE_CONV_2D refuse a missing bias, and so
        # does litekiln's load: tests/test_validate.py.)
        Case("conv_k5x3_s2x1_same", _conv([1, 8, 7, 3], 4, (5, 3), (2, 1))),
        Case("conv_k2x4_s1x3_same_even", _conv([1, 8, 10, 2], 3, (2, 4), (1, 3))),
        Case("conv_1x1_pointwise", _conv([1, 6, 6, 8], 16, (1, 1), padding="VALID")),
        Case("conv_grouped_2", _conv([1, 8, 8, 6], 4, (3, 3), cin=3)),
        # 2-4 wide groups: a convolution per group, side by side (emit_nn `_split_groups`):
        # ResNeSt's radix-2 3x3, a strided 4-group one, a dilated 1x1-wide one
        Case("conv_split_groups_2", _conv([1, 10, 10, 32], 64, (3, 3), cin=16, act="RELU")),
        Case(
            "conv_split_groups_4_s2_valid",
            _conv([1, 11, 11, 64], 128, (3, 3), (2, 2), padding="VALID", cin=16, act="RELU6"),
        ),
        Case("conv_split_groups_3_d2", _conv([1, 9, 9, 48], 96, (3, 3), d=(2, 2), cin=16)),
        Case("conv_k2_s3_stride_gt_kernel", _conv([1, 10, 10, 2], 3, (2, 2), (3, 3))),
        Case("conv_k3_same_on_2x2", _conv([1, 2, 2, 3], 2, (3, 3), (2, 2))),
        Case("dw_k3_s1_same", _dw([1, 9, 9, 4], 1, (3, 3))),
        Case("dw_k3_s2_same_m2_relu6", _dw([1, 9, 9, 3], 2, (3, 3), (2, 2), act="RELU6")),
        Case("dw_k3x5_s1x2_valid_m3", _dw([1, 10, 8, 2], 3, (3, 5), (1, 2), padding="VALID")),
        Case("dw_k3_d2_same_relu", _dw([1, 10, 11, 4], 1, (3, 3), d=(2, 2), act="RELU")),
        Case("dw_k2_s2_valid", _dw([2, 8, 8, 3], 1, (2, 2), (2, 2), padding="VALID")),
        Case("dw_k5_s2_same_odd", _dw([1, 7, 9, 5], 1, (5, 5), (2, 2), act="RELU_N1_TO_1")),
        Case("dw_k3_d2_m2_s2", _dw([1, 11, 10, 2], 2, (3, 3), (2, 2), (2, 2))),
        Case("tconv_k3_s2_same", _tconv([1, 4, 4, 3], 5, (3, 3), (2, 2), "SAME")),
        Case("tconv_k3_s2_valid", _tconv([1, 4, 5, 3], 2, (3, 3), (2, 2), "VALID")),
        Case("tconv_k3_s1_same", _tconv([1, 5, 5, 4], 3, (3, 3), (1, 1), "SAME")),
        Case("tconv_k2_s2_valid", _tconv([1, 4, 4, 2], 3, (2, 2), (2, 2), "VALID")),
        Case("tconv_k4_s2_same_bias", _tconv([1, 3, 4, 2], 4, (4, 4), (2, 2), "SAME", bias=True)),
        Case("tconv_k3x2_s2x3_same", _tconv([2, 3, 3, 2], 3, (3, 2), (2, 3), "SAME")),
        Case(
            "tconv_k3_s2_valid_extra_out",
            _tconv([1, 3, 3, 2], 2, (3, 3), (2, 2), "VALID", out_hw=(8, 8)),
        ),
        Case(
            "tconv_k3_s2_same_relu",
            _tconv([1, 3, 3, 2], 2, (3, 3), (2, 2), "SAME", bias=True, act="RELU"),
        ),
        Case("fc_2d_relu", _fc([2, 8], 5, act="RELU")),
        Case("fc_4d_keep_dims", _fc([1, 2, 3, 8], 5, keep=True)),
        Case("fc_4d_flatten", _fc([1, 2, 3, 8], 5, keep=False)),
        Case("fc_3d_keep_nobias_relu6", _fc([2, 3, 16], 4, keep=True, bias=False, act="RELU6")),
        Case("fc_rows_flattened", _fc([1, 4, 4, 2], 3)),
        Case("fc_5d_keep_dims", _fc([1, 2, 2, 3, 8], 5, keep=True)),
        Case("fc_computed_weights_keep", _fc([1, 7, 16], 7, keep=True, computed_weights=True)),
        Case("fc_token_mixing", _fc_transposed(49, 12, 49)),
        Case("fc_token_mixing_keep_relu", _fc_transposed(20, 12, 7, keep=True, act="RELU")),
        Case("fc_transposed_input", _fc_transposed(6, 10, 5, computed=False, back=False)),
    ],
)


@pytest.mark.parametrize("case", CONV.ids())
def test_conv(case: str) -> None:
    CONV.check(case)


# -- pooling ----------------------------------------------------------------------------------


def _pool(kind, shape, k, s, padding, act="NONE"):
    n, h, w, c = shape

    def build(g: G):
        oh, ow = _out(h, k[0], s[0], 1, padding), _out(w, k[1], s[1], 1, padding)
        return g.op(
            kind,
            [g.x(shape)],
            [n, oh, ow, c],
            {
                "padding": padding,
                "stride_h": s[0],
                "stride_w": s[1],
                "filter_height": k[0],
                "filter_width": k[1],
                "fused_activation_function": act,
            },
        )

    return build


def _padded_max_pool(shape, pads, k, s, value=-np.inf, padding="VALID", readers=1):
    """PyTorch's padded ``MaxPool2d`` as litert-torch writes it: PADV2 (minus infinity), then
    a VALID max pool; folded into the pool (`Lowering._find_pad_folds`) when the value is
    minus infinity and every reader a max pool whose window is wider than the padding."""
    n, h, w, c = shape
    (top, bottom), (left, right) = pads

    def build(g: G):
        hp, wp = h + top + bottom, w + left + right
        padded = g.op(
            "PADV2",
            [g.x(shape), g.ints([[0, 0], [top, bottom], [left, right], [0, 0]]),
             g.w(np.float32([value]))],
            [n, hp, wp, c],
        )  # fmt: skip

        def pool(k, s, padding):
            oh, ow = _out(hp, k[0], s[0], 1, padding), _out(wp, k[1], s[1], 1, padding)
            opts = {"padding": padding, "stride_h": s[0], "stride_w": s[1],
                    "filter_height": k[0], "filter_width": k[1]}  # fmt: skip
            return g.op("MAX_POOL_2D", [padded], [n, oh, ow, c], opts)

        outs = [pool(k, s, padding)]
        if readers == 2:  # a second max pool, 3x3 stride 1, of the same padded map
            outs.append(pool((3, 3), (1, 1), "VALID"))
        elif readers == "relu":  # a reader that is no max pool: the PADV2 stays a kernel
            outs.append(g.op("RELU", [padded], [n, hp, wp, c]))
        return outs

    return build


POOL = Batch(
    "pool",
    [
        # PADV2 (minus infinity) + max pool: the pool takes the padding (ResNet stems)
        Case("padv2_max_k3_s2", _padded_max_pool([1, 9, 10, 4], ((1, 1), (1, 1)), (3, 3), (2, 2))),
        Case(
            "padv2_max_uneven_same",
            _padded_max_pool([1, 8, 7, 3], ((0, 2), (1, 0)), (3, 3), (2, 2), padding="SAME"),
        ),
        Case(
            "padv2_max_two_readers",
            _padded_max_pool([1, 7, 7, 2], ((1, 1), (1, 1)), (3, 3), (2, 2), readers=2),
        ),
        Case(
            "padv2_lowest_max_relu_reader",
            _padded_max_pool(
                [1, 7, 6, 2],
                ((1, 1), (2, 1)),
                (3, 3),
                (2, 2),
                value=np.finfo(np.float32).min,
                readers="relu",
            ),
        ),  # fmt: skip
        Case(
            "padv2_finite_max",  # padded with 0.5, which often wins: not folded
            _padded_max_pool([1, 6, 6, 2], ((1, 1), (1, 1)), (3, 3), (2, 2), value=0.5),
        ),
        Case("avg_k3_s2_same_odd", _pool("AVERAGE_POOL_2D", [1, 9, 9, 3], (3, 3), (2, 2), "SAME")),
        Case("avg_k2_s2_same_even", _pool("AVERAGE_POOL_2D", [1, 8, 8, 2], (2, 2), (2, 2), "SAME")),
        Case(
            "avg_k3_s1_same_relu6",
            _pool("AVERAGE_POOL_2D", [2, 6, 7, 3], (3, 3), (1, 1), "SAME", "RELU6"),
        ),
        Case("avg_k5x4_s3x2_same", _pool("AVERAGE_POOL_2D", [1, 7, 10, 2], (5, 4), (3, 2), "SAME")),
        Case("avg_k3_s1_valid", _pool("AVERAGE_POOL_2D", [1, 6, 6, 4], (3, 3), (1, 1), "VALID")),
        Case("avg_global_valid", _pool("AVERAGE_POOL_2D", [1, 5, 6, 8], (5, 6), (1, 1), "VALID")),
        Case("max_k3_s2_same", _pool("MAX_POOL_2D", [1, 9, 9, 3], (3, 3), (2, 2), "SAME")),
        Case("max_k2_s2_valid", _pool("MAX_POOL_2D", [1, 8, 7, 2], (2, 2), (2, 2), "VALID")),
        Case(
            "max_k3x2_s1x2_same_relu",
            _pool("MAX_POOL_2D", [2, 5, 6, 3], (3, 2), (1, 2), "SAME", "RELU"),
        ),
        Case(
            "max_k4_s3_same_n1to1",
            _pool("MAX_POOL_2D", [1, 10, 8, 2], (4, 4), (3, 3), "SAME", "RELU_N1_TO_1"),
        ),
        Case("avg_k5_on_3x3_same", _pool("AVERAGE_POOL_2D", [1, 3, 3, 2], (5, 5), (1, 1), "SAME")),
        Case("max_k5_on_3x3_same", _pool("MAX_POOL_2D", [1, 3, 3, 2], (5, 5), (2, 2), "SAME")),
        # Pools of at most 4 taps are elementwise reads of their taps (emit_nn._small_pool):
        # SAME padding on odd maps (the last row and column outside: a max takes the taps
        # inside, an average counts them only), windows of one row or column, overlapping
        # windows (stride 1), and a fused activation.
        Case("max_k2_s2_same_odd", _pool("MAX_POOL_2D", [1, 7, 9, 3], (2, 2), (2, 2), "SAME")),
        Case("avg_k2_s2_same_odd", _pool("AVERAGE_POOL_2D", [1, 7, 9, 3], (2, 2), (2, 2), "SAME")),
        Case("max_k1x2_s1x2_same", _pool("MAX_POOL_2D", [1, 4, 7, 2], (1, 2), (1, 2), "SAME")),
        Case(
            "avg_k2x1_s1_same_relu",
            _pool("AVERAGE_POOL_2D", [2, 5, 4, 3], (2, 1), (1, 1), "SAME", "RELU"),
        ),
        Case(
            "max_k2_s1_same_relu6",
            _pool("MAX_POOL_2D", [1, 6, 5, 4], (2, 2), (1, 1), "SAME", "RELU6"),
        ),
        Case("avg_k2_s1_valid", _pool("AVERAGE_POOL_2D", [1, 5, 6, 2], (2, 2), (1, 1), "VALID")),
    ],
)


@pytest.mark.parametrize("case", POOL.ids())
def test_pool(case: str) -> None:
    POOL.check(case)


# -- elementwise ------------------------------------------------------------------------------


def _binary(name, a, b, out, act="NONE", b_const=False, low_b=-1.0, high_b=1.0):
    def build(g: G):
        y = g.w(b, low=low_b, high=high_b) if b_const else g.x(b, low=low_b, high=high_b)
        # MAXIMUM and MINIMUM have no options (no fused activation).
        opts = None if name in ("MAXIMUM", "MINIMUM") else {"fused_activation_function": act}
        return g.op(name, [g.x(a), y], out, opts)

    return build


def _unary(name, shape, low=-1.0, high=1.0):
    return lambda g: g.op(name, [g.x(shape, low=low, high=high)], shape)


def _prelu(shape, alpha_shape):
    return lambda g: g.op("PRELU", [g.x(shape), g.w(alpha_shape, low=0.0, high=0.5)], shape)


ELEMENTWISE = Batch(
    "elementwise",
    [
        Case("add_same_relu", _binary("ADD", [1, 4, 4, 3], [1, 4, 4, 3], [1, 4, 4, 3], "RELU")),
        Case(
            "add_bcast_channel_const", _binary("ADD", [1, 4, 4, 3], [3], [1, 4, 4, 3], b_const=True)
        ),
        Case("add_bcast_both", _binary("ADD", [1, 4, 1, 3], [1, 1, 5, 3], [1, 4, 5, 3], "RELU6")),
        Case("add_scalar_const", _binary("ADD", [2, 5], [], [2, 5], b_const=True)),
        Case("add_scalar_input", _binary("ADD", [2, 5], [], [2, 5])),  # a 0-d partition input
        Case("mul_rank5_bcast", _binary("MUL", [1, 2, 3, 1, 4], [2, 1, 5, 4], [1, 2, 3, 5, 4])),
        Case(
            "sub_bcast_n1to1",
            _binary("SUB", [2, 3, 4, 5], [1, 1, 1, 5], [2, 3, 4, 5], "RELU_N1_TO_1"),
        ),
        Case("sub_rank_mismatch", _binary("SUB", [3, 4], [2, 1, 4], [2, 3, 4])),
        Case(
            "mul_bcast_spatial_relu6",
            _binary("MUL", [1, 4, 4, 3], [1, 4, 4, 1], [1, 4, 4, 3], "RELU6"),
        ),
        Case("mul_const_rank1", _binary("MUL", [1, 3, 3, 4], [4], [1, 3, 3, 4], b_const=True)),
        Case("max_bcast", _binary("MAXIMUM", [1, 4, 4, 3], [1, 1, 1, 3], [1, 4, 4, 3])),
        Case("max_const_scalar", _binary("MAXIMUM", [3, 7], [], [3, 7], b_const=True)),
        Case("min_bcast", _binary("MINIMUM", [2, 1, 3], [4, 1], [2, 4, 3])),
        Case("min_same", _binary("MINIMUM", [1, 5, 5, 2], [1, 5, 5, 2], [1, 5, 5, 2])),
        Case("relu", _unary("RELU", [1, 4, 4, 3])),
        Case("relu6_wide", _unary("RELU6", [2, 5, 3], -10.0, 10.0)),
        Case("logistic_wide", _unary("LOGISTIC", [1, 4, 4, 3], -8.0, 8.0)),
        Case("exp", _unary("EXP", [3, 9], -3.0, 3.0)),
        Case("prelu_per_channel", _prelu([1, 4, 4, 3], [3])),
        Case("prelu_hwc", _prelu([1, 4, 5, 3], [4, 5, 3])),
        Case("prelu_11c", _prelu([2, 3, 3, 4], [1, 1, 4])),
        Case("prelu_shared", _prelu([1, 3, 3, 2], [1, 1, 1])),
    ],
)


@pytest.mark.parametrize("case", ELEMENTWISE.ids())
def test_elementwise(case: str) -> None:
    ELEMENTWISE.check(case)


def _logical_and(a, b, out):
    return lambda g: g.op("LOGICAL_AND", [g.x(a, "bool"), g.x(b, "bool")], out, dtype="bool")


LOGICAL = Batch(
    "logical",
    [
        Case("and_same", _logical_and([2, 3, 4], [2, 3, 4], [2, 3, 4])),
        Case("and_bcast", _logical_and([1, 4, 4, 3], [1, 1, 1, 3], [1, 4, 4, 3])),
    ],
)


@pytest.mark.parametrize("case", LOGICAL.ids())
def test_logical_and(case: str) -> None:
    LOGICAL.check(case)


# -- data movement, softmax, resize -----------------------------------------------------------


def _concat(shapes, axis, out, act="NONE"):
    return lambda g: g.op(
        "CONCATENATION",
        [g.x(s) for s in shapes],
        out,
        {"axis": axis, "fused_activation_function": act},
    )


def _pad(shape, pads):
    out = [d + a + b for d, (a, b) in zip(shape, pads, strict=True)]
    return lambda g: g.op("PAD", [g.x(shape), g.ints(pads)], out)


def _reshape(shape, new, with_tensor=True):
    def build(g: G):
        ins = [g.x(shape)] + ([g.ints(new)] if with_tensor else [])
        return g.op("RESHAPE", ins, new, None if with_tensor else {"new_shape": new})

    return build


def _slice(shape, begin, end, strides, **masks):
    x = np.zeros(shape)
    idx = []
    for i in range(len(begin)):
        bit = 1 << i
        if masks.get("shrink_axis_mask", 0) & bit:
            idx.append(begin[i])
            continue
        b = None if masks.get("begin_mask", 0) & bit else begin[i]
        e = None if masks.get("end_mask", 0) & bit else end[i]
        if masks.get("offset") and b is not None and e is not None:
            e = b + e
        idx.append(slice(b, e, strides[i]))
    out = list(x[tuple(idx)].shape)
    return lambda g: g.op(
        "STRIDED_SLICE",
        [g.x(shape), g.ints(begin), g.ints(end), g.ints(strides)],
        out,
        masks,
        version=1,
    )


def _softmax(shape, low=-1.0, high=1.0):
    return lambda g: g.op("SOFTMAX", [g.x(shape, low=low, high=high)], shape, {"beta": 1.0})


def _resize(name, shape, size, align=False, half=False):
    n, _, _, c = shape
    return lambda g: g.op(
        name,
        [g.x(shape), g.ints(size)],
        [n, *size, c],
        {"align_corners": align, "half_pixel_centers": half},
        version=3 if half else 1,
    )


SHAPE = Batch(
    "shape",
    [
        Case("concat_axis3", _concat([[1, 4, 4, 3], [1, 4, 4, 2], [1, 4, 4, 1]], 3, [1, 4, 4, 6])),
        # (A fused activation: LiteRT's CONCATENATION refuses it, and so does litekiln's load.)
        Case("concat_axis_neg1", _concat([[2, 3, 2], [2, 3, 5]], -1, [2, 3, 7])),
        Case("concat_axis0_rank2", _concat([[2, 4], [3, 4]], 0, [5, 4])),
        Case("concat_axis_neg3_rank4", _concat([[1, 2, 3, 2], [1, 1, 3, 2]], -3, [1, 3, 3, 2])),
        Case("pad_hw", _pad([1, 5, 5, 3], [[0, 0], [1, 2], [2, 1], [0, 0]])),
        Case("pad_channels", _pad([1, 3, 3, 2], [[0, 0], [0, 0], [0, 0], [1, 2]])),
        Case("pad_rank2", _pad([4, 5], [[1, 0], [0, 2]])),
        Case("reshape_flatten", _reshape([1, 4, 4, 3], [1, 48])),
        Case("reshape_2d", _reshape([2, 6], [3, 4])),
        Case("reshape_option", _reshape([1, 2, 3, 4], [1, 6, 4], with_tensor=False)),
        Case("slice_plain", _slice([1, 6, 6, 4], [0, 1, 2, 0], [1, 5, 6, 3], [1, 1, 1, 1])),
        Case("slice_stride2", _slice([1, 7, 8, 3], [0, 0, 1, 0], [1, 7, 8, 3], [1, 2, 3, 1])),
        Case(
            "slice_masks",
            _slice(
                [1, 6, 6, 4],
                [0, 2, 1, 1],
                [0, 9, 4, 0],
                [1, 1, 1, 1],
                begin_mask=0b1001,
                end_mask=0b1001,
            ),
        ),
        Case(
            "slice_masks_stride",
            _slice(
                [2, 7, 6, 4],
                [1, 5, 1, 3],
                [0, 1, 5, 0],
                [1, 1, 2, -1],
                begin_mask=0b0011,
                end_mask=0b1001,
            ),
        ),
        Case("slice_negative_idx", _slice([2, 6, 5], [-1, -4, 0], [2, -1, -1], [1, 1, 2])),
        Case(
            "slice_shrink",
            _slice(
                [1, 4, 5, 6],
                [0, 2, 0, 0],
                [1, 3, 5, 6],
                [1, 1, 1, 1],
                shrink_axis_mask=0b0011,
                end_mask=0b1100,
            ),
        ),
        Case(
            "slice_shrink_last",
            _slice([3, 4, 5], [0, 0, -1], [3, 4, 0], [1, 1, 1], shrink_axis_mask=0b100),
        ),
        Case(
            "slice_neg_stride",
            _slice([1, 6, 5, 3], [0, 5, 4, 0], [1, 0, 0, 3], [1, -2, -1, 1], end_mask=0b0100),
        ),
        Case(
            "slice_offset",
            _slice([1, 6, 6, 4], [0, 1, 2, 1], [1, 3, 4, 2], [1, 1, 1, 1], offset=True),
        ),
        Case("softmax_2d", _softmax([2, 10], -5.0, 5.0)),
        Case("softmax_4d", _softmax([1, 4, 4, 6])),
        Case("softmax_wide", _softmax([3, 1001], -10.0, 10.0)),
        Case("bilinear_up2", _resize("RESIZE_BILINEAR", [1, 4, 5, 3], [8, 10])),
        Case("bilinear_align", _resize("RESIZE_BILINEAR", [1, 4, 5, 2], [7, 9], align=True)),
        Case("bilinear_half_pixel", _resize("RESIZE_BILINEAR", [1, 4, 5, 2], [8, 10], half=True)),
        Case("bilinear_down_half", _resize("RESIZE_BILINEAR", [1, 8, 8, 2], [3, 5], half=True)),
        Case("bilinear_odd_up", _resize("RESIZE_BILINEAR", [2, 3, 3, 2], [7, 5])),
        Case(
            "bilinear_half_pixel_frac", _resize("RESIZE_BILINEAR", [1, 3, 5, 2], [7, 8], half=True)
        ),
        Case("bilinear_align_to_1", _resize("RESIZE_BILINEAR", [1, 4, 5, 2], [1, 1], align=True)),
        Case("bilinear_align_to_1xn", _resize("RESIZE_BILINEAR", [1, 4, 5, 2], [1, 7], align=True)),
        Case("softmax_3d", _softmax([2, 3, 5])),
        Case("pad_rank3", _pad([2, 3, 4], [[1, 1], [0, 2], [3, 0]])),
    ],
)


@pytest.mark.parametrize("case", SHAPE.ids())
def test_shape(case: str) -> None:
    SHAPE.check(case)


# -- the extended op table --------------------------------------------------------------------


def _mean(shape, axes, keep):
    norm = tuple(sorted({a % len(shape) for a in axes}))
    out = list(np.zeros(shape).mean(axis=norm, keepdims=keep).shape)
    return lambda g: g.op("MEAN", [g.x(shape), g.ints(axes)], out, {"keep_dims": keep})


def _transpose(shape, perm):
    out = [shape[p] for p in perm]
    return lambda g: g.op("TRANSPOSE", [g.x(shape), g.ints(perm)], out)


def _tconv_bias(shape, cout, k, stride, padding):
    # MediaPipe's custom op: raw TfLiteTransposeConvParams (padding 1 SAME / 2 VALID, stride_w,
    # stride_h); its output size as ops.conv.Convolution2DTransposeBias derives it. LiteRT has
    # no kernel for it: the reference (checked against LiteRT's TRANSPOSE_CONV in
    # test_ops_conv_pool) is the oracle.
    n, h, w, c = shape
    tot = [max(0, k - (d - 1) % stride - 1) if padding == 1 else 0 for d in (h, w)]
    out = [n, *(stride * (d - 1) + k - t for d, t in zip((h, w), tot, strict=True)), cout]

    def build(g: G):
        return g.b.custom_op(
            "Convolution2DTransposeBias",
            [g.x(shape), g.w([cout, k, k, c]), g.w([cout])],
            out_shape=out,
            custom_options=struct.pack("<3i", padding, stride, stride),
        )

    return build


def _landmarks_matrix(n, subset, left, right, out_hw=(16, 16), scale=1.5, target=0.0):
    # MediaPipe's Landmarks2TransformMatrix (v2): landmarks [1, n, 3] in a 48-pixel frame.
    def build(g: G):
        opts = {
            "left_rotation_idx": left,
            "right_rotation_idx": right,
            "subset_idxs": list(subset),
            "target_rotation_radians": target,
            "output_height": out_hw[0],
            "output_width": out_hw[1],
            "scale_x": scale,
            "scale_y": scale,
        }
        lm = g.x([1, n, 3], low=4.0, high=44.0)
        return g.b.custom_op(
            "Landmarks2TransformMatrix", [lm], out_shape=[1, 4, 4], custom_options=opts, version=2
        )

    return build


def _crop(shape, out_hw, version=2, computed=False):
    # MediaPipe's TransformTensorBilinear: the map sampled through a matrix given as an input
    # (scale ~0.2-1.2, shifts up to the map's size: inside, across the edges, outside) or, with
    # ``computed``, estimated on the device from landmarks (the attention model's chain).
    n, h, w, c = shape

    def build(g: G):
        if computed:
            m = _landmarks_matrix(20, range(2, 20), 0, 1, out_hw)(g)
        else:
            m = g.x([1, 4, 4], low=-0.4, high=1.2)
        opts = {"output_height": out_hw[0], "output_width": out_hw[1]}
        x = g.x(shape)
        return g.b.custom_op(
            "TransformTensorBilinear",
            [x, m],
            out_shape=[1, *out_hw, c],
            custom_options=opts,
            version=version,
        )

    return build


def _move_landmarks(shape, version=2, dims=2, scale=1.0, computed=False):
    # MediaPipe's TransformLandmarks: v2 landmarks [1, N, D]; v1 rank 4 with options.
    def build(g: G):
        m = _landmarks_matrix(20, range(2, 20), 0, 1)(g) if computed else g.x([1, 4, 4])
        opts = {} if version >= 2 else {"dimensions": dims, "scale": scale}
        return g.b.custom_op(
            "TransformLandmarks",
            [g.x(shape, low=-2.0, high=2.0), m],
            out_shape=list(shape),
            custom_options=opts,
            version=version,
        )

    return build


EXTENDED = Batch(
    "extended",
    [
        Case("tconv_bias_k2_s2_same", _tconv_bias([1, 5, 6, 3], 4, 2, 2, 1), litert=False),
        Case("tconv_bias_k3_s2_same", _tconv_bias([1, 5, 6, 3], 4, 3, 2, 1), litert=False),
        Case("tconv_bias_k3_s2_valid", _tconv_bias([2, 4, 3, 2], 3, 3, 2, 2), litert=False),
        Case("tconv_bias_k4_s3_same", _tconv_bias([1, 4, 5, 2], 2, 4, 3, 1), litert=False),
        Case("tconv_bias_k3_s1_same", _tconv_bias([1, 6, 6, 4], 5, 3, 1, 1), litert=False),
        Case("landmarks_matrix", _landmarks_matrix(30, [3, 7, 11, 2, 29], 5, 17), litert=False),
        Case(
            "landmarks_matrix_rotated",
            _landmarks_matrix(12, range(12), 0, 6, (8, 12), 1.25, 0.3),
            litert=False,
        ),
        Case("crop_v2", _crop([1, 12, 10, 3], (6, 7)), litert=False),
        Case("crop_v1", _crop([1, 9, 11, 2], (5, 4), version=1), litert=False),
        Case("crop_of_landmarks", _crop([1, 48, 48, 4], (16, 16), computed=True), litert=False),
        Case("move_landmarks_2d", _move_landmarks([1, 7, 2]), litert=False),
        Case("move_landmarks_3d", _move_landmarks([1, 5, 3]), litert=False),
        Case("move_landmarks_v1", _move_landmarks([1, 1, 1, 12], 1, 3, 0.5), litert=False),
        Case("move_landmarks_computed", _move_landmarks([1, 9, 2], computed=True), litert=False),
        Case("mean_hw_keep", _mean([1, 5, 6, 4], [1, 2], True)),
        Case("mean_hw_nokeep", _mean([2, 5, 6, 4], [1, 2], False)),
        Case("mean_last", _mean([2, 3, 7], [-1], False)),
        Case("mean_batch_channel_keep", _mean([2, 3, 4, 5], [0, 3], True)),
        Case("mean_dup_neg_axes", _mean([1, 4, 4, 3], [2, -2], True)),
        Case("mean_all_nokeep", _mean([2, 3, 4], [0, 1, 2], False)),
        Case("hard_swish", _unary("HARD_SWISH", [1, 6, 6, 4], -5.0, 5.0)),
        Case("tanh", _unary("TANH", [2, 8, 3], -4.0, 4.0)),
        Case(
            "div_same",
            _binary("DIV", [1, 4, 4, 3], [1, 4, 4, 3], [1, 4, 4, 3], low_b=0.5, high_b=2.0),
        ),
        Case(
            "div_bcast_relu",
            _binary("DIV", [2, 3, 4], [4], [2, 3, 4], "RELU", b_const=True, low_b=0.5, high_b=2.0),
        ),
        Case(
            "depth_to_space_2",
            lambda g: g.op("DEPTH_TO_SPACE", [g.x([1, 3, 4, 8])], [1, 6, 8, 2], {"block_size": 2}),
        ),
        Case(
            "depth_to_space_3",
            lambda g: g.op("DEPTH_TO_SPACE", [g.x([2, 2, 2, 9])], [2, 6, 6, 1], {"block_size": 3}),
        ),
        Case(
            "space_to_depth_2",
            lambda g: g.op("SPACE_TO_DEPTH", [g.x([1, 4, 6, 3])], [1, 2, 3, 12], {"block_size": 2}),
        ),
        Case("transpose_nchw", _transpose([1, 3, 4, 5], [0, 3, 1, 2])),
        Case("transpose_hw", _transpose([2, 3, 4, 5], [0, 2, 1, 3])),
        Case("transpose_rank3", _transpose([2, 3, 4], [2, 0, 1])),
        Case("transpose_rank2", _transpose([3, 5], [1, 0])),
    ],
    op_table="extended",
)


@pytest.mark.parametrize("case", EXTENDED.ids())
def test_extended(case: str) -> None:
    EXTENDED.check(case)


# -- emitters of ops outside both tables (delegated by force) ---------------------------------


FORCED = Batch(
    "forced",
    [
        Case("nearest_up2", _resize("RESIZE_NEAREST_NEIGHBOR", [1, 4, 5, 3], [8, 10])),
        Case("nearest_odd_up", _resize("RESIZE_NEAREST_NEIGHBOR", [1, 3, 4, 2], [7, 9])),
        Case("nearest_down", _resize("RESIZE_NEAREST_NEIGHBOR", [1, 9, 8, 2], [4, 3])),
        Case("nearest_align", _resize("RESIZE_NEAREST_NEIGHBOR", [1, 4, 5, 2], [7, 9], align=True)),
        Case(
            "nearest_align_down",
            _resize("RESIZE_NEAREST_NEIGHBOR", [1, 9, 7, 2], [5, 4], align=True),
        ),
        Case(
            "nearest_half_pixel",
            _resize("RESIZE_NEAREST_NEIGHBOR", [1, 4, 5, 2], [7, 9], half=True),
        ),
        Case(
            "nearest_half_pixel_down",
            _resize("RESIZE_NEAREST_NEIGHBOR", [1, 9, 8, 2], [4, 3], half=True),
        ),
        Case(
            "nearest_align_to_1",
            _resize("RESIZE_NEAREST_NEIGHBOR", [1, 4, 5, 2], [1, 1], align=True),
        ),
        Case(
            "nearest_align_to_nx1",
            _resize("RESIZE_NEAREST_NEIGHBOR", [1, 4, 5, 2], [6, 1], align=True),
        ),
        Case("nearest_up3", _resize("RESIZE_NEAREST_NEIGHBOR", [1, 2, 3, 2], [6, 9])),
        Case(
            "squeeze_dims",
            lambda g: g.op("SQUEEZE", [g.x([1, 4, 1, 3])], [1, 4, 3], {"squeeze_dims": [2]}),
        ),
        Case("squeeze_all", lambda g: g.op("SQUEEZE", [g.x([1, 4, 1, 3])], [4, 3])),
        Case("expand_dims", lambda g: g.op("EXPAND_DIMS", [g.x([4, 3]), g.ints([1])], [4, 1, 3])),
        Case(
            "expand_dims_neg", lambda g: g.op("EXPAND_DIMS", [g.x([4, 3]), g.ints([-1])], [4, 3, 1])
        ),
        Case("relu_n1_to_1", _unary("RELU_N1_TO_1", [2, 4, 5], -3.0, 3.0)),
    ],
    forced=["RESIZE_NEAREST_NEIGHBOR", "SQUEEZE", "EXPAND_DIMS", "RELU_N1_TO_1"],
)


@pytest.mark.parametrize("case", FORCED.ids())
def test_forced(case: str) -> None:
    FORCED.check(case)


# -- a tiny multi-op chain (intermediate tensors stay on the GPU) ------------------------------


def _chain(g: G):
    x = g.x([1, 8, 8, 3])
    y = g.op(
        "CONV_2D",
        [x, g.w([8, 3, 3, 3]), g.w([8])],
        [1, 4, 4, 8],
        {"padding": "SAME", "stride_h": 2, "stride_w": 2, "fused_activation_function": "RELU"},
    )
    y = g.op(
        "DEPTHWISE_CONV_2D",
        [y, g.w([1, 3, 3, 8]), g.w([8])],
        [1, 4, 4, 8],
        {"padding": "SAME", "stride_h": 1, "stride_w": 1, "depth_multiplier": 1},
    )
    z = g.op("ADD", [y, g.w([8])], [1, 4, 4, 8], {"fused_activation_function": "RELU6"})
    p = g.op(
        "AVERAGE_POOL_2D",
        [z],
        [1, 2, 2, 8],
        {"padding": "SAME", "stride_h": 2, "stride_w": 2, "filter_height": 2, "filter_width": 2},
    )
    r = g.op("RESHAPE", [p, g.ints([1, 32])], [1, 32])
    f = g.op("FULLY_CONNECTED", [r, g.w([10, 32]), g.w([10])], [1, 10])
    return [z, g.op("SOFTMAX", [f], [1, 10], {"beta": 1.0})]


# -- quantized models through the float view --------------------------------------------------


def _qadd(g: G):
    a = g.x([1, 4, 4, 3], "int8", quant=Quant(0.02, 3))
    b = g.x([1, 4, 4, 3], "int8", quant=Quant(0.03, -2))
    return g.op(
        "ADD",
        [a, b],
        [1, 4, 4, 3],
        {"fused_activation_function": "NONE"},
        version=2,
        dtype="int8",
        quant=Quant(0.04, 1),
    )


def _qconv(g: G):
    in_scale = 0.02
    w_scales = [0.004, 0.01, 0.007, 0.02]
    x = g.x([1, 7, 7, 3], "int8", quant=Quant(in_scale, -5))
    w = g.w([4, 3, 3, 3], "int8", quant=Quant(w_scales, 0, 0))
    bias_q = Quant([in_scale * s for s in w_scales], 0, 0)
    bias = g.w(
        bias_q.quantize(g.rng.uniform(-0.2, 0.2, [4]).astype(np.float32), "int32"),
        "int32",
        quant=bias_q,
    )
    return g.op(
        "CONV_2D",
        [x, w, bias],
        [1, 4, 4, 4],
        {"padding": "SAME", "stride_h": 2, "stride_w": 2, "fused_activation_function": "RELU6"},
        version=3,
        dtype="int8",
        quant=Quant(0.03, -10),
    )


def _uint8_conv_reshape_softmax(g: G):
    x = g.x([1, 9, 9, 3], "uint8", quant=Quant(0.02, 128))
    w = g.w([4, 3, 3, 3], "uint8", quant=Quant(0.01, 120))
    bias_q = Quant(0.02 * 0.01, 0)
    bias = g.w(
        bias_q.quantize(g.rng.uniform(-0.2, 0.2, [4]).astype(np.float32), "int32"),
        "int32",
        quant=bias_q,
    )
    c = g.op(
        "CONV_2D",
        [x, w, bias],
        [1, 5, 5, 4],
        {"padding": "SAME", "stride_h": 2, "stride_w": 2, "fused_activation_function": "RELU"},
        dtype="uint8",
        quant=Quant(0.05, 100),
    )
    r = g.op("RESHAPE", [c, g.ints([1, 100])], [1, 100], dtype="uint8", quant=Quant(0.05, 100))
    return g.op("SOFTMAX", [r], [1, 100], {"beta": 1.0}, dtype="uint8", quant=Quant(1 / 256, 0))


def _int8_pool_concat(g: G):
    """Copies of quantized values (a max pool, a concatenation, a pad) with their inputs'
    parameters: no simulator after them (`Lowering._keeps_grid`), LiteRT's integers exactly."""
    q = Quant(0.03, -7)
    x = g.x([1, 6, 6, 4], "int8", quant=q)
    y = g.x([1, 3, 3, 2], "int8", quant=q)
    p = g.op(
        "MAX_POOL_2D",
        [x],
        [1, 3, 3, 4],
        {"padding": "SAME", "stride_h": 2, "stride_w": 2, "filter_height": 3, "filter_width": 3},
        dtype="int8",
        quant=q,
    )
    c = g.op("CONCATENATION", [p, y], [1, 3, 3, 6], {"axis": 3}, dtype="int8", quant=q)
    pads = g.ints([[0, 0], [1, 1], [0, 2], [0, 0]])
    return g.op("PAD", [c, pads], [1, 5, 5, 6], dtype="int8", quant=q)


MISC = Batch(
    "misc",
    [
        Case("chain_conv_dw_add_pool_fc_softmax", _chain),
        Case("int8_add_v2", _qadd),
        Case("int8_conv_per_channel", _qconv),
        Case("uint8_conv_reshape_softmax", _uint8_conv_reshape_softmax),
        Case("int8_pool_concat_pad", _int8_pool_concat, qtol=0),
    ],
)


@pytest.mark.parametrize("case", MISC.ids())
def test_misc(case: str) -> None:
    MISC.check(case)
