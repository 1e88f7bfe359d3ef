"""Elementwise math, comparisons, logic and reductions on the GPU path (emit_math.py) vs the
numpy reference and LiteRT: the ops that models exported from PyTorch (litert-torch) and
Keras use around their convolutions and matmuls (issue 14).

Every case runs through ``tests/gpu_helper.py``'s batches, as in ``tests/test_gpu_ops.py``:
one compile per batch, each case its own test, each asserting that its ops went to the GPU,
and each compared with the reference and LiteRT (``max|err| <= 1e-4 * max(1, max|ref|)``;
bool outputs exactly; quantized outputs within a step of the reference, two of LiteRT).

Inputs are uniform in [-1, 1] unless a case gives a range: LOG, SQRT and RSQRT get positive
inputs, POW a positive base. Exact values (ties for ROUND, quotients that round up to an
integer for FLOOR_DIV, zeros for CAST to bool) are made at run time as ``0 + constant``
(:func:`_exact`): an op whose inputs are all constants would be folded at load.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from gpu_helper import Batch, Case, G
from tflite_builder import Quant, TensorRef

pytestmark = pytest.mark.opencl


def _exact(g: G, values: np.ndarray | Sequence[float]) -> TensorRef:
    """A tensor holding exactly ``values``, computed at run time (zeros plus a constant)."""
    v = np.asarray(values, np.float32)
    zeros = g.x(list(v.shape), low=0.0, high=0.0)
    return g.op("ADD", [zeros, g.w(v)], list(v.shape), {"fused_activation_function": "NONE"})


def _unary(name, shape, low=-1.0, high=1.0, **options):
    return lambda g: g.op(name, [g.x(shape, low=low, high=high)], shape, options or None)


def _binary(name, a, b, *, b_const=False, low=-1.0, high=1.0, low_b=-1.0, high_b=1.0):
    out = list(np.broadcast_shapes(tuple(a), tuple(b)))

    def build(g: G):
        x = g.x(a, low=low, high=high)
        y = g.w(b, low=low_b, high=high_b) if b_const else g.x(b, low=low_b, high=high_b)
        return g.op(name, [x, y], out)

    return build


# -- unary ------------------------------------------------------------------------------------


def _round_ties(g: G):
    ties = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, -3.49, 0.49, 7.0, -0.0, 4.51])
    return g.op("ROUND", [_exact(g, ties.reshape(3, 4))], [3, 4])


def _sign_zeros(g: G):
    return g.op("SIGN", [_exact(g, [[-2.0, 0.0, 3.0], [0.5, -0.25, 0.0]])], [2, 3])


UNARY = Batch(
    "math_unary",
    [
        Case("log", _unary("LOG", [2, 3, 4], 0.01, 5.0)),
        Case("sqrt", _unary("SQRT", [1, 4, 4, 3], 0.0, 4.0)),
        Case("rsqrt", _unary("RSQRT", [2, 7], 0.05, 4.0)),
        Case("square", _unary("SQUARE", [3, 5], -3.0, 3.0)),
        Case("abs", _unary("ABS", [1, 3, 3, 2])),
        Case("neg", _unary("NEG", [6])),
        Case("sin", _unary("SIN", [2, 2, 5], -6.0, 6.0)),
        Case("cos", _unary("COS", [2, 2, 5], -6.0, 6.0)),
        Case("floor", _unary("FLOOR", [4, 6], -4.0, 4.0)),
        Case("ceil", _unary("CEIL", [4, 6], -4.0, 4.0)),
        Case("round", _unary("ROUND", [4, 6], -4.0, 4.0)),
        Case("round_ties_to_even", _round_ties),
        Case("sign", _unary("SIGN", [3, 4])),
        Case("sign_zeros", _sign_zeros),
        Case("relu_0_to_1", _unary("RELU_0_TO_1", [2, 4, 5], -2.0, 2.0)),
        Case("relu_n1_to_1", _unary("RELU_N1_TO_1", [2, 4, 5], -3.0, 3.0)),
        Case("elu", _unary("ELU", [1, 4, 4, 3], -4.0, 4.0)),
        Case("elu_wide", _unary("ELU", [40], -30.0, 90.0)),
        Case("gelu", _unary("GELU", [2, 8, 6], -6.0, 6.0, approximate=False)),
        Case("gelu_approximate", _unary("GELU", [2, 8, 6], -6.0, 6.0, approximate=True)),
        Case("leaky_relu", _unary("LEAKY_RELU", [1, 3, 4, 5], -2.0, 2.0, alpha=0.2)),
        Case("leaky_relu_alpha_gt_1", _unary("LEAKY_RELU", [7, 3], -2.0, 2.0, alpha=1.5)),
        Case("exp_rank1", _unary("EXP", [9], -3.0, 3.0)),
    ],
    op_table="extended",
)


@pytest.mark.parametrize("case", UNARY.ids())
def test_unary(case: str) -> None:
    UNARY.check(case)


# -- binary -----------------------------------------------------------------------------------


def _floor_div_exact(name):
    # Quotients that float32 rounds up to an integer (1 / 0.1f = 10 in float32, 9.99999985 in
    # double: LiteRT's FLOOR_DIV gives 9), negative operands, exact multiples.
    a = [[1.0, 3.0, -1.0, 0.3, 7.0, -7.0], [2.0, -0.7, 6.0, 5.5, -0.9, 1e-3]]
    b = [0.1, 0.1, 0.1, 0.1, 0.7, 0.7]

    def build(g: G):
        return g.op(name, [_exact(g, a), g.w(np.asarray(b, np.float32))], [2, 6])

    return build


def _divisor_sign(name):
    # Both signs of both operands (the divisor never near 0).
    def build(g: G):
        x = g.x([3, 8], low=-5.0, high=5.0)
        y = g.op(
            "MUL",
            [g.x([3, 8], low=0.5, high=2.0), g.w(np.tile([1, -1], 4).astype("f4"))],
            [3, 8],
            {"fused_activation_function": "NONE"},
        )
        return g.op(name, [x, y], [3, 8])

    return build


def _atan2_axes(g: G):
    # Every quadrant and both axes, zeros included: atan2(0, -1) = pi, atan2(0, 0) = 0.
    y = [[1.0, -1.0, 0.0, 0.0, 1.0, -1.0], [0.0, 0.0, 2.0, -2.0, -1e-3, 1e-3]]
    x = [[0.0, 0.0, 1.0, -1.0, -1.0, -1.0], [1.0, -1.0, 0.0, 0.0, 0.0, 0.0]]
    return g.op("ATAN2", [_exact(g, y), g.w(np.asarray(x, np.float32))], [2, 6])


BINARY = Batch(
    "math_binary",
    [
        Case("sqdiff_same", _binary("SQUARED_DIFFERENCE", [1, 4, 4, 3], [1, 4, 4, 3])),
        Case("sqdiff_bcast_rows", _binary("SQUARED_DIFFERENCE", [2, 5, 6], [2, 5, 1])),
        Case("sqdiff_const", _binary("SQUARED_DIFFERENCE", [3, 4], [4], b_const=True)),
        Case("sqdiff_rank_mismatch", _binary("SQUARED_DIFFERENCE", [4, 1], [2, 1, 3])),
        Case(
            "pow", _binary("POW", [2, 3, 4], [2, 3, 4], low=0.1, high=3.0, low_b=-2.0, high_b=3.0)
        ),
        Case(
            "pow_const_exp",
            _binary("POW", [1, 5, 2], [2], b_const=True, low=0.1, high=2.0, low_b=1.0, high_b=3.0),
        ),
        Case("pow_square_neg_base", lambda g: g.op("POW", [g.x([6]), g.w(np.float32([2.0]))], [6])),
        Case(
            "floor_div",
            _binary("FLOOR_DIV", [2, 3, 4], [4], low=-5, high=5, low_b=0.3, high_b=2.0),
        ),
        Case("floor_div_exact", _floor_div_exact("FLOOR_DIV")),
        Case("floor_div_signs", _divisor_sign("FLOOR_DIV")),
        Case(
            "floor_mod",
            _binary("FLOOR_MOD", [2, 3, 4], [3, 1], low=-5, high=5, low_b=0.3, high_b=2.0),
        ),
        Case("floor_mod_exact", _floor_div_exact("FLOOR_MOD")),
        Case("floor_mod_signs", _divisor_sign("FLOOR_MOD")),
        Case(
            "atan2",
            _binary("ATAN2", [2, 3, 4], [2, 3, 4], low=-3.0, high=3.0, low_b=-3.0, high_b=3.0),
        ),
        Case("atan2_axes", _atan2_axes),
    ],
    op_table="extended",
)


@pytest.mark.parametrize("case", BINARY.ids())
def test_binary(case: str) -> None:
    BINARY.check(case)


# -- comparisons, logic, select, cast ---------------------------------------------------------


def _compare(name, a, b, *, b_const=False, ties=False):
    out = list(np.broadcast_shapes(tuple(a), tuple(b)))

    def build(g: G):
        if ties:  # values on a coarse grid, so that equal elements occur
            x = g.op("ROUND", [g.x(a, low=-2.0, high=2.0)], a)
            y = g.op("ROUND", [g.x(b, low=-2.0, high=2.0)], b)
        else:
            x = g.x(a)
            y = g.w(b) if b_const else g.x(b)
        return g.op(name, [x, y], out, dtype="bool")

    return build


def _logical(name, *shapes):
    out = list(np.broadcast_shapes(*map(tuple, shapes)))
    return lambda g: g.op(name, [g.x(s, "bool") for s in shapes], out, dtype="bool")


def _mask_chain(g: G):
    """A comparison's mask used as float and as a condition inside one partition."""
    x, y = g.x([2, 3, 4]), g.x([4])
    less = g.op("LESS", [x, y], [2, 3, 4], dtype="bool")
    more = g.op("GREATER", [x, g.w(np.float32([0.5]))], [2, 3, 4], dtype="bool")
    either = g.op("LOGICAL_OR", [less, more], [2, 3, 4], dtype="bool")
    neither = g.op("LOGICAL_NOT", [either], [2, 3, 4], dtype="bool")
    as_float = g.op("CAST", [neither], [2, 3, 4], dtype="float32")
    picked = g.op(
        "SELECT_V2", [either, x, g.w(np.array(-9.0, np.float32))], [2, 3, 4], dtype="float32"
    )
    return [as_float, picked, neither]


def _select(name, c, a, b, *, out=None, c_const=False, version=1):
    out = out or list(np.broadcast_shapes(tuple(c), tuple(a), tuple(b)))

    def build(g: G):
        if c_const:
            cond = g.w((g.rng.random(c) < 0.5).astype(np.bool_), "bool")
        elif not c:
            # A scalar condition computed in the partition (a rank-0 partition input fails in
            # PartitionExecutor.set_input: np.ascontiguousarray makes it 1-D).
            total = g.op("SUM", [g.x([5]), g.ints([0])], [], {"keep_dims": False})
            cond = g.op("GREATER", [total, g.w(np.zeros([], np.float32))], [], dtype="bool")
        else:
            cond = g.x(c, "bool")
        return g.op(name, [cond, g.x(a), g.x(b)], out, dtype="float32", version=version)

    return build


def _cast(src, dst, shape, values=None):
    def build(g: G):
        x = _exact(g, values) if values is not None else g.x(shape, src)
        if values is not None and src != "float32":
            x = g.op("CAST", [x], shape, dtype=src)
        y = g.op("CAST", [x], shape, dtype=dst)
        # Used inside the partition too (a cast's result as an operand), then as an output.
        z = g.op("CAST", [y], shape, dtype="float32") if dst != "float32" else y
        return [
            y,
            g.op("ADD", [z, g.w(np.float32([1.0]))], shape, {"fused_activation_function": "NONE"}),
        ]

    return build


_CAST_VALUES = [[0.0, 1.5, -2.0, 0.0], [1e-3, -0.0, 65519.0, 3.14159]]

LOGIC = Batch(
    "math_logic",
    [
        Case("equal_ties", _compare("EQUAL", [2, 3, 4], [2, 3, 4], ties=True)),
        Case("not_equal_bcast_ties", _compare("NOT_EQUAL", [3, 5], [5], ties=True)),
        Case("less", _compare("LESS", [1, 4, 4, 3], [3], b_const=True)),
        Case("less_equal_ties", _compare("LESS_EQUAL", [4, 1, 3], [2, 3], ties=True)),
        Case("greater", _compare("GREATER", [2, 6], [2, 6])),
        Case(
            "greater_equal_ties", _compare("GREATER_EQUAL", [1, 2, 3, 4], [1, 1, 1, 4], ties=True)
        ),
        Case("equal_bools", _logical("EQUAL", [3, 4], [3, 4])),
        Case("logical_or", _logical("LOGICAL_OR", [2, 3, 4], [2, 3, 4])),
        Case("logical_or_bcast", _logical("LOGICAL_OR", [1, 4, 4, 3], [1, 1, 1, 3])),
        Case("logical_not", _logical("LOGICAL_NOT", [5, 2])),
        Case("mask_chain", _mask_chain),
        Case("select_v2_same", _select("SELECT_V2", [2, 3, 4], [2, 3, 4], [2, 3, 4])),
        Case("select_v2_bcast_all", _select("SELECT_V2", [1, 3, 1], [2, 1, 4], [4])),
        Case("select_v2_scalar_cond", _select("SELECT_V2", [], [3, 4], [3, 4])),
        Case("select_v2_const_cond", _select("SELECT_V2", [3, 1], [3, 4], [3, 4], c_const=True)),
        Case("select_v2_rank5", _select("SELECT_V2", [2, 1, 3, 1, 2], [1, 2, 3, 2, 2], [2])),
        Case("select_same", _select("SELECT", [2, 3, 4], [2, 3, 4], [2, 3, 4])),
        Case(
            "select_rank5_v3",
            _select("SELECT", [2, 1, 3, 2, 2], [2, 1, 3, 2, 2], [2, 1, 3, 2, 2], version=3),
        ),
        Case("select_rows", _select("SELECT", [3], [3, 2, 4], [3, 2, 4], out=[3, 2, 4])),
        Case("select_scalar_cond", _select("SELECT", [], [2, 5], [2, 5])),
        Case("cast_bool_to_float", _cast("bool", "float32", [3, 5])),
        Case("cast_float_to_bool", _cast("float32", "bool", [2, 4], _CAST_VALUES)),
        Case("cast_float_to_half", _cast("float32", "float16", [2, 4], _CAST_VALUES)),
        Case("cast_half_to_float", _cast("float16", "float32", [2, 4], _CAST_VALUES)),
        Case("cast_float_to_float", _cast("float32", "float32", [2, 4])),
    ],
    op_table="extended",
)


@pytest.mark.parametrize("case", LOGIC.ids())
def test_logic(case: str) -> None:
    LOGIC.check(case)


# -- reductions and normalisations ------------------------------------------------------------


def _reduce(name, shape, axes, keep, low=-1.0, high=1.0):
    norm = tuple(sorted({a % len(shape) for a in axes}))
    out = list(np.zeros(shape).sum(axis=norm, keepdims=keep).shape)
    return lambda g: g.op(
        name, [g.x(shape, low=low, high=high), g.ints(axes)], out, {"keep_dims": keep}
    )


def _split_attention(g, radix=2, channels=8, hw=5):
    """ResNeSt's split attention as litert-torch writes it: a softmax over the radix
    (REDUCE_MAX, SUB, EXP, SUM, DIV), the branches weighted by it and summed (MUL, SUM).
    The reductions over the radix are written term by term (`emit_math._few_terms`):
    injective, they fuse with the arithmetic between them."""
    none = {"fused_activation_function": "NONE"}
    logits = [1, radix, 1, channels]
    stat = [1, 1, channels]
    x = g.x(logits, low=-3.0, high=3.0)
    axis = g.ints([1])
    m = g.op("REDUCE_MAX", [x, axis], stat, {"keep_dims": False})
    e = g.op("EXP", [g.op("SUB", [x, m], logits, none)], logits)
    p = g.op("DIV", [e, g.op("SUM", [e, axis], stat, {"keep_dims": False})], logits, none)
    weights = [1, radix, channels, 1, 1]
    p = g.op("RESHAPE", [p, g.ints(weights)], weights)
    branches = [1, radix, channels, hw, hw]
    y = g.op("MUL", [g.x(branches), p], branches, none)
    return g.op("SUM", [y, axis], [1, channels, hw, hw], {"keep_dims": False})


def _softmax(name, shape, beta=1.0, low=-1.0, high=1.0):
    opts = {"beta": beta} if name == "SOFTMAX" else None
    return lambda g: g.op(name, [g.x(shape, low=low, high=high)], shape, opts)


_REDUCTIONS = [
    # (id, axes, keep_dims) over a [2, 3, 4, 5] input
    ("last", [-1], False),
    ("first_keep", [0], True),
    ("middle", [1], False),
    ("hw_keep", [1, 2], True),
    ("batch_channel", [0, 3], False),
    ("neg_dup", [2, -2, -3], True),
    ("all_keep", [0, 1, 2, 3], True),
    ("all", [3, 1, 0, 2], False),
]


def _arg_int8(g: G):
    # int8 data through the float view (v2): the order, ties too, is the integers' order
    x = g.x([3, 10], "int8", quant=Quant(0.05, -4), low=-6, high=6)
    return g.op("ARG_MAX", [x, g.ints([1])], [3], {"output_type": 2}, version=2, dtype="int32")


def _arg(name, shape, axis, ties=False, dtype="float32"):
    """ARG_MAX/ARG_MIN to int32 positions; ``ties``: values rounded to a few levels, so that
    rows hold their extreme more than once (the first position wins); int32 data drawn from
    [-3, 3) has them too."""

    def build(g):
        if dtype == "int32":
            x = g.x(shape, "int32", low=-3, high=3)
        else:
            x = g.x(shape, low=-2.0, high=2.0)
        if ties and dtype != "int32":
            x = g.op("ROUND", [x], shape)
        out = [d for i, d in enumerate(shape) if i != axis % len(shape)]
        return g.op(name, [x, g.ints([axis])], out, {"output_type": 2}, dtype="int32")

    return build


REDUCE = Batch(
    "math_reduce",
    [
        Case("argmax_last", _arg("ARG_MAX", [2, 5, 7], -1)),
        Case("argmax_middle_ties", _arg("ARG_MAX", [3, 9, 4], 1, ties=True)),
        Case("argmin_first_ties", _arg("ARG_MIN", [6, 5], 0, ties=True)),
        Case("argmax_classes", _arg("ARG_MAX", [1, 8, 8, 21], 3)),
        Case("argmin_int32", _arg("ARG_MIN", [4, 6], 1, dtype="int32")),
        Case("argmax_int8", _arg_int8),
        *(
            Case(f"{name.lower()}_{rid}", _reduce(name, [2, 3, 4, 5], axes, keep))
            for name in ("SUM", "REDUCE_MAX", "REDUCE_MIN")
            for rid, axes, keep in _REDUCTIONS
        ),
        *(
            Case(f"mean_{rid}", _reduce("MEAN", [2, 3, 4, 5], axes, keep))
            for rid, axes, keep in _REDUCTIONS[2:5]
        ),
        Case("mean_rank2_rows", _reduce("MEAN", [6, 33], [1], True)),
        Case("prod_last", _reduce("REDUCE_PROD", [2, 3, 6], [-1], False, 0.5, 1.5)),
        Case("prod_first_keep", _reduce("REDUCE_PROD", [4, 3, 2], [0], True, 0.5, 1.5)),
        Case("prod_all", _reduce("REDUCE_PROD", [3, 4], [0, 1], False, 0.8, 1.2)),
        Case("sum_rank1_all", _reduce("SUM", [37], [0], False)),
        Case("mean_rank5_group_norm", _reduce("MEAN", [2, 4, 3, 5, 6], [2, 3, 4], True)),
        Case("max_rank6", _reduce("REDUCE_MAX", [2, 1, 3, 2, 4, 3], [0, -1, 3], False)),
        # few terms (at most `emit_math._FEW_TERMS`): written term by term
        Case("sum_few_two_axes_keep", _reduce("SUM", [2, 2, 3, 2], [1, 3], True)),
        Case("min_few_two_axes", _reduce("REDUCE_MIN", [3, 2, 5, 2], [-1, 1], False)),
        Case("mean_few_first", _reduce("MEAN", [3, 4, 5], [0], False)),
        Case("prod_few_middle_keep", _reduce("REDUCE_PROD", [2, 4, 3], [1], True, 0.5, 1.5)),
        Case("split_attention_radix2", _split_attention),
        Case("split_attention_radix4", lambda g: _split_attention(g, 4, 16, 3)),
        Case("softmax_rank5", _softmax("SOFTMAX", [2, 1, 3, 2, 5], 1.0)),
        Case("log_softmax_rank5", _softmax("LOG_SOFTMAX", [2, 1, 3, 2, 5])),
        Case(
            "l2_norm_rank5",
            lambda g: g.op("L2_NORMALIZATION", [g.x([2, 1, 3, 2, 5])], [2, 1, 3, 2, 5]),
        ),
        Case("max_rank3_middle", _reduce("REDUCE_MAX", [4, 17, 3], [1], False)),
        Case("softmax_beta", _softmax("SOFTMAX", [2, 10], 0.5, -5.0, 5.0)),
        Case("softmax_beta_large", _softmax("SOFTMAX", [3, 4, 7], 3.0, -3.0, 3.0)),
        Case("log_softmax", _softmax("LOG_SOFTMAX", [2, 10], low=-5.0, high=5.0)),
        Case("log_softmax_4d", _softmax("LOG_SOFTMAX", [1, 3, 4, 6])),
        Case("log_softmax_wide", _softmax("LOG_SOFTMAX", [2, 1000], low=-10.0, high=10.0)),
        Case("l2_norm", lambda g: g.op("L2_NORMALIZATION", [g.x([1, 4, 4, 8])], [1, 4, 4, 8])),
        Case("l2_norm_rank2", lambda g: g.op("L2_NORMALIZATION", [g.x([3, 50])], [3, 50])),
        Case(
            "l2_norm_tiny",  # a squared norm under 1e-6, the norm above it
            lambda g: g.op("L2_NORMALIZATION", [g.x([2, 3], low=-1e-4, high=1e-4)], [2, 3]),
        ),
        Case(
            "l2_norm_floor",  # a norm under LiteRT's 1e-6 floor
            lambda g: g.op("L2_NORMALIZATION", [g.x([2, 3], low=-1e-7, high=1e-7)], [2, 3]),
        ),
    ],
    op_table="extended",
)


@pytest.mark.parametrize("case", REDUCE.ids())
def test_reduce(case: str) -> None:
    REDUCE.check(case)


# -- a layer norm (litert-torch's form) -------------------------------------------------------


def _layer_norm(g: G, shape=(2, 16, 64), eps=1e-5) -> TensorRef:
    """MEAN, SQUARED_DIFFERENCE, MEAN, ADD eps, RSQRT, SUB, MUL, MUL gamma, ADD beta."""
    shape = list(shape)
    stat = [*shape[:-1], 1]
    none = {"fused_activation_function": "NONE"}
    x = g.x(shape, low=-3.0, high=5.0)
    axis = g.ints([-1])
    mean = g.op("MEAN", [x, axis], stat, {"keep_dims": True})
    var = g.op(
        "MEAN", [g.op("SQUARED_DIFFERENCE", [x, mean], shape), axis], stat, {"keep_dims": True}
    )
    rstd = g.op("RSQRT", [g.op("ADD", [var, g.w(np.float32([eps]))], stat, none)], stat)
    y = g.op("MUL", [g.op("SUB", [x, mean], shape, none), rstd], shape, none)
    y = g.op("MUL", [y, g.w([shape[-1]], low=0.5, high=1.5)], shape, none)
    return g.op("ADD", [y, g.w([shape[-1]])], shape, none)


# -- quantized models through the float view --------------------------------------------------


def _q_unary(name, q_in, q_out, shape=(2, 3, 4), version=2, shift=None, **options):
    """An 8-bit unary op; ``shift`` (a float) adds a constant first (8-bit ADD), to keep the
    input positive."""

    def build(g: G):
        x = g.x(list(shape), "int8", quant=q_in)
        if shift is not None:
            c = g.w(
                np.array([Quant.of(q_in).quantize(np.float32([shift]), "int8")[0]], np.int8),
                "int8",
                quant=q_in,
            )
            x = g.op(
                "ADD",
                [x, c],
                list(shape),
                {"fused_activation_function": "NONE"},
                version=2,
                quant=q_in,
            )
        return g.op(name, [x], list(shape), options or None, version=version, quant=q_out)

    return build


def _q_reduce(name, axes, keep, q_in, q_out, shape=(1, 4, 5, 3), dtype="int8", version=2):
    norm = tuple(sorted({a % len(shape) for a in axes}))
    out = list(np.zeros(shape).sum(axis=norm, keepdims=keep).shape)
    return lambda g: g.op(
        name,
        [g.x(list(shape), dtype, quant=q_in), g.ints(axes)],
        out,
        {"keep_dims": keep},
        version=version,
        quant=q_out,
    )


#: int16 activations: symmetric (LiteRT's 16-bit kernels want zero points 0).
Q16 = Quant(1 / 8192, 0)


def _q16_abs_rsqrt(g: G):
    """ABS v3 then RSQRT v3 on int16 (RSQRT's input then >= 0; at 0 both LiteRT's table and
    the float view give the output's largest value)."""
    x = g.x([2, 3, 4], "int16", quant=Q16)
    a = g.op("ABS", [x], [2, 3, 4], version=3, quant=Q16)
    return g.op("RSQRT", [a], [2, 3, 4], version=3, quant=Quant(0.01, 0))


def _q_compare(name, q):
    def build(g: G):
        a = g.x([2, 3, 4], "int8", quant=q)
        b = g.x([4], "int8", quant=q)
        return g.op(name, [a, b], [2, 3, 4], version=2, dtype="bool")

    return build


def _q_select(g: G):
    q = Quant(0.03, 4)
    cond = g.x([2, 3, 4], "bool")
    return g.op(
        "SELECT_V2",
        [cond, g.x([2, 3, 4], "int8", quant=q), g.x([4], "int8", quant=q)],
        [2, 3, 4],
        dtype="int8",
        quant=q,
    )


def _q_sqdiff(g: G):
    a = g.x([1, 4, 4, 3], "int8", quant=Quant(0.02, 0))
    b = g.x([1, 1, 1, 3], "int8", quant=Quant(0.02, 0))
    return g.op(
        "SQUARED_DIFFERENCE", [a, b], [1, 4, 4, 3], version=2, dtype="int8", quant=Quant(0.04, -128)
    )


def _q_div(g: G):
    """int8 DIV as the TFLite converter writes an int8 Keras softsign (v1): by a constant of
    both signs (LiteRT refuses a zero divisor)."""
    a = g.x([2, 3, 4], "int8", quant=Quant(0.05, 3))
    b = g.w(np.array([20, -35, 60, 100], np.int8), "int8", quant=Quant(0.02, 0))
    return g.op("DIV", [a, b], [2, 3, 4], version=1, dtype="int8", quant=Quant(0.1, -5))


MISC = Batch(
    "math_misc",
    [
        Case("layer_norm", _layer_norm),
        Case("layer_norm_rows", lambda g: _layer_norm(g, (5, 32))),
        Case("int8_sqdiff_v2", _q_sqdiff),
        Case("int8_div", _q_div),
        Case(
            "int8_log_softmax_v2",
            _q_unary("LOG_SOFTMAX", Quant(0.05, -10), Quant(16 / 256, 127), shape=(3, 10)),
        ),
        Case("int8_rsqrt_v2", _q_unary("RSQRT", Quant(0.02, -128), Quant(0.02, -128), shift=0.1)),
        Case("int8_log_v2", _q_unary("LOG", Quant(0.02, -128), Quant(4 / 255, 17), shift=0.1)),
        Case("int8_abs_v2", _q_unary("ABS", Quant(0.02, 3), Quant(0.01, -128))),
        Case("int8_gelu_v2", _q_unary("GELU", Quant(0.03, 0), Quant(0.016, -117))),
        Case(
            "int8_gelu_approximate_v2",
            _q_unary("GELU", Quant(0.03, 0), Quant(0.016, -117), approximate=True),
        ),
        Case("int8_elu", _q_unary("ELU", Quant(0.02, 10), Quant(0.015, 0), version=1)),
        Case(
            "int8_leaky_relu",
            _q_unary("LEAKY_RELU", Quant(0.02, 0), Quant(0.02, 0), version=1, alpha=0.2),
        ),
        Case("int8_mean_hw_v2", _q_reduce("MEAN", [1, 2], True, Quant(0.02, 5), Quant(0.01, -3))),
        Case("int8_sum_last_v2", _q_reduce("SUM", [-1], False, Quant(0.02, 0), Quant(0.05, 0))),
        Case("int8_max_v2", _q_reduce("REDUCE_MAX", [0, 2], False, Quant(0.02, 7), Quant(0.02, 7))),
        Case("int16_abs_rsqrt_v3", _q16_abs_rsqrt),
        Case("int16_mean_v3", _q_reduce("MEAN", [-1], False, Q16, Q16, dtype="int16", version=3)),
        Case(
            "int16_max_v3",
            _q_reduce("REDUCE_MAX", [1, 2], True, Q16, Q16, dtype="int16", version=3),
        ),
        Case("int8_less_v2", _q_compare("LESS", Quant(0.05, 3))),
        Case("int8_equal_v2", _q_compare("EQUAL", Quant(0.5, 0))),
        Case("int8_select_v2", _q_select),
    ],
    op_table="extended",
)


@pytest.mark.parametrize("case", MISC.ids())
def test_misc(case: str) -> None:
    MISC.check(case)


def test_layer_norm_kernels() -> None:
    """A layer norm as litert-torch writes it (9 ops) compiles to ONE kernel: the row's
    mean, the mean of its squared differences, eps, rsqrt and the normalisation with gamma
    and beta, each row's statistics computed once (compiler/layer_norm.py; the op-by-op
    form was 4 kernels: tests/test_layer_norm_fusion.py covers the forms and shapes)."""
    from gpu_helper import build_model

    from litekiln.artifact.compiled import CompileOptions
    from litekiln.compiler.driver import compile_model
    from litekiln.model import load_model

    built = build_model([Case("ln", lambda g: _layer_norm(g, (1, 50, 96)))])
    compiled = compile_model(
        load_model(built.model), CompileOptions(op_table="extended"), warn=False
    )
    assert not compiled.cpu_reasons, compiled.cpu_reasons
    kernels = [la.func for p in compiled.partitions for la in p.program.launches]  # (k0, k1...)
    assert len(kernels) == 1 and "layer_norm" in kernels[0], kernels


# -- what stays on the CPU, and why -----------------------------------------------------------


def _reason(build) -> str:
    """Why the (only) op of interest that ``build`` makes stays on the CPU ('' if it does not)."""
    from gpu_helper import build_model

    from litekiln.artifact.compiled import CompileOptions
    from litekiln.compiler.driver import plan_partitions
    from litekiln.model import load_model

    model = load_model(build_model([Case("c", build)]).model)
    plan = plan_partitions(model, CompileOptions(op_table="extended"))
    return " | ".join(plan.cpu_reasons.values())


@pytest.mark.parametrize(
    "build, expected",
    [
        (
            lambda g: g.op("CAST", [g.x([2, 3])], [2, 3], dtype="int64"),
            "it casts to int64 ('c/cast', computed at run time)",
        ),
        (
            lambda g: g.op("CAST", [g.x([2, 3], "uint8")], [2, 3], dtype="float32"),
            "it casts from uint8",
        ),
        (
            lambda g: g.op(
                "FLOOR_DIV",
                [g.x([4], "int8", quant=Quant(0.1, 0)), g.x([4], "int8", quant=Quant(0.1, 0))],
                [4],
                version=3,
                quant=Quant(0.1, 0),
            ),
            "divides the stored integers",
        ),
        (
            lambda g: g.op(
                "LESS",
                [g.x([4], "int8", quant=Quant(0.1, 0)), g.x([4], "int8", quant=Quant(0.2, 0))],
                [4],
                version=2,
                dtype="bool",
            ),
            "different scales or zero points",
        ),
        (
            lambda g: g.op(
                "SELECT_V2",
                [
                    g.x([4], "bool"),
                    g.x([4], "int8", quant=Quant(0.1, 0)),
                    g.x([4], "int8", quant=Quant(0.1, 0)),
                ],
                [4],
                quant=Quant(0.2, 0),
            ),
            "quantized unlike the output",
        ),
    ],
    ids=[
        "cast_to_int64",
        "cast_from_uint8",
        "int8_floor_div",
        "int8_less_scales",
        "int8_select_requant",
    ],
)
def test_cpu_reason(build, expected: str) -> None:
    assert expected in _reason(build)


# -- reference fixes, checked against LiteRT ----------------------------------------------------


@pytest.mark.parametrize(
    "name, scales",
    [("EQUAL", (0.02, 0.03)), ("LESS", (0.001, 0.0011)), ("GREATER_EQUAL", (0.003, 0.002))],
)
def test_int8_comparison_reference(name: str, scales: tuple[float, float]) -> None:
    """LiteRT compares 8-bit inputs of different scales rescaled to 1/256 steps, not their
    real values (comparisons.cc); the reference does the same. Small scales make values that
    differ by less than a step common."""
    from oplib import Spec, check_op

    rng = np.random.default_rng(3)
    a = rng.integers(-128, 128, [6, 40]).astype(np.int8)
    # b near a's real values, so that the two sides fall in one 1/256 step often.
    b = np.clip(np.round(a * scales[0] / scales[1]) + rng.integers(-1, 2, a.shape), -128, 127)
    check_op(
        name,
        [
            Spec(data=a, dtype="int8", quant=Quant(scales[0], 0)),
            Spec(data=b.astype(np.int8), dtype="int8", quant=Quant(scales[1], 0)),
        ],
        version=2,
        out_dtype="bool",
    )


# -- fp16 (half storage inside a partition) ---------------------------------------------------

#: fp16 chains ``x + x -> op -> y + y`` (as in test_gpu_shape_ops) put the op's operands and
#: result in half storage; compared with the float32 reference within
#: ``4e-3 * max(1, max|ref|)``: each stored value is rounded to fp16 (2**-11 relative) a few
#: times on its way, and the ops here amplify that by at most a few (rsqrt halves it, the
#: log of values >= 0.2 and GELU's slope <= 1.13 keep it). Ops with steps (FLOOR, ROUND,
#: comparisons) are left out: a half-rounded input may cross a step the float32 reference
#: does not.
FP16_TOL = 4e-3


def _half(shape, body, low=-1.0, high=1.0):
    def build(g: G):
        x = g.x(shape, low=low, high=high)
        a = g.op("ADD", [x, x], shape, {"fused_activation_function": "NONE"})
        y = body(g, a)
        return g.op("ADD", [y, y], list(y.shape), {"fused_activation_function": "NONE"})

    return build


def _fp16_cases() -> list[Case]:
    def red(name, axes, keep, out):
        return lambda g, a: g.op(name, [a, g.ints(axes)], out, {"keep_dims": keep})

    return [
        Case("gelu", _half([2, 3, 8], lambda g, a: g.op("GELU", [a], [2, 3, 8]))),
        Case(
            "gelu_approximate",
            _half([2, 3, 8], lambda g, a: g.op("GELU", [a], [2, 3, 8], {"approximate": True})),
        ),
        Case("elu", _half([4, 6], lambda g, a: g.op("ELU", [a], [4, 6]))),
        Case("rsqrt", _half([4, 6], lambda g, a: g.op("RSQRT", [a], [4, 6]), 0.1, 2.0)),
        Case("log", _half([4, 6], lambda g, a: g.op("LOG", [a], [4, 6]), 0.1, 2.0)),
        Case(
            "sqdiff_bcast",
            _half([3, 8], lambda g, a: g.op("SQUARED_DIFFERENCE", [a, g.w([8])], [3, 8])),
        ),
        Case(
            "pow",
            _half(
                [3, 8], lambda g, a: g.op("POW", [a, g.w([8], low=0.5, high=2.0)], [3, 8]), 0.1, 1.0
            ),
        ),
        Case("mean_hw", _half([1, 4, 5, 6], red("MEAN", [1, 2], True, [1, 1, 1, 6]))),
        Case("sum_last", _half([3, 4, 7], red("SUM", [-1], False, [3, 4]))),
        Case("max_first", _half([3, 4, 7], red("REDUCE_MAX", [0], False, [4, 7]))),
        Case(
            "softmax_beta",
            _half([2, 12], lambda g, a: g.op("SOFTMAX", [a], [2, 12], {"beta": 0.7})),
        ),
        Case("log_softmax", _half([2, 12], lambda g, a: g.op("LOG_SOFTMAX", [a], [2, 12]))),
        Case("l2_norm", _half([3, 16], lambda g, a: g.op("L2_NORMALIZATION", [a], [3, 16]))),
        Case(
            "select_v2",
            _half(
                [3, 5], lambda g, a: g.op("SELECT_V2", [g.x([3, 1], "bool"), a, g.w([5])], [3, 5])
            ),
        ),
        Case(
            "cast_to_half_and_back",
            _half(
                [4, 5],
                lambda g, a: g.op(
                    "CAST", [g.op("CAST", [a], [4, 5], dtype="float16")], [4, 5], dtype="float32"
                ),
            ),
        ),
        Case("layer_norm", lambda g: _layer_norm(g, (3, 32))),
    ]


FP16 = {c.id: c for c in _fp16_cases()}
_FP16_RESULTS: dict[str, tuple[Any, dict[str, list[np.ndarray]], dict[str, list[np.ndarray]]]] = {}


def _fp16_results() -> tuple[Any, dict[str, list[np.ndarray]], dict[str, list[np.ndarray]]]:
    """All fp16 cases in one model, compiled once per device: (CPU reasons, GPU and reference
    outputs by case)."""
    import os

    from gpu_helper import build_model

    import litekiln

    device = os.environ.get("LITEKILN_DEVICE", "")
    if device not in _FP16_RESULTS:
        built = build_model(list(FP16.values()))
        it = litekiln.Interpreter(
            model_content=built.model,
            use_cache=False,
            op_table="extended",
            precision="fp16",
            fp16_budget=None,
        )
        it.allocate_tensors()
        got = it.run(built.feeds)
        ref = litekiln.Interpreter(model_content=built.model, device="reference").run(built.feeds)
        by_case = {c: built.where[c][0] for c in FP16}
        _FP16_RESULTS[device] = (
            it._backend.compiled.cpu_reasons,  # type: ignore[union-attr]
            {c: [got[k] for k in ks] for c, ks in by_case.items()},
            {c: [ref[k] for k in ks] for c, ks in by_case.items()},
        )
    return _FP16_RESULTS[device]


@pytest.mark.parametrize("case", list(FP16))
def test_fp16(case: str) -> None:
    cpu, got, ref = _fp16_results()
    assert not cpu, f"ops left on the CPU: {cpu}"
    for k, (a, b) in enumerate(zip(got[case], ref[case], strict=True)):
        assert a.shape == b.shape and a.dtype == b.dtype
        tol = FP16_TOL * max(1.0, float(np.abs(b).max()))
        err = float(np.abs(a.astype(np.float64) - b).max())
        assert err <= tol, f"{case} output {k}: max|fp16 - ref| = {err:.3g} > {tol:.3g}"
        # (A cast to float16 rounds where the reference rounds too.)
        assert err > 0 or case.startswith("cast"), "fp16 storage left no trace"
