"""Attentions become one kernel each (compiler/attention.py).

The chain models write (BATCH_MATMUL of queries and keys, SOFTMAX over the keys with RESHAPEs
of unit axes around it, BATCH_MATMUL with the values; litert-torch's DeiT form with 32-term
heads, transposed operands, a beta, odd sizes) is found in the partition and lowered as one
call; each must be ONE kernel (`Launch.func` ``...attention...``) under the GPU schedules
(``fast``: `schedules.FusedAttention`) and the CPU ones (``fast-cpu``:
`schedules.SerialAttention`), and equal a float64 numpy attention within
``1e-4 * max(1, max|ref|)`` (fp32; 1e-2 under fp16) on PoCL; constants applied to the scores
before the SOFTMAX (TinyViT's bias over regrouped windows, LeViT's scale and bias) go into
the kernel. A chain whose scores are read elsewhere, with a computed mask added to them, over
one key, or of more than `attention.MAX_TERMS` terms per score, stays op by op.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from gpu_helper import (
    Case,
    G,
    build_model,
    launched_kernels,
    planned,
    rules_of_first_partition,
    run_uncached,
)
from tflite_builder import TensorRef

from litekiln.check import relative_error

#: case id -> (adj_x, adj_y, adj_v, beta) (set when the case is built)


# (the small models' variants, past their entries' bound: `keep_variants`)
pytestmark = pytest.mark.usefixtures("keep_variants")


FORMS: dict[str, tuple[bool, bool, bool, float]] = {}


#: case id -> the transforms of its scores: (op, constant, view) (set when the case is built)
TRANSFORMS: dict[str, list[tuple[str, np.ndarray, list[int]]]] = {}
NONE = {"fused_activation_function": "NONE"}


def attention(
    batch: Sequence[int], m: int, d: int, n: int, c: int, *, adj_x: bool = False,
    adj_y: bool = False, adj_v: bool = False, beta: float = 1.0, reshape: bool = False,
    view: Sequence[int] | None = None,
    transforms: Sequence[tuple[str, Sequence[int]]] = (),
) -> Callable[[G], TensorRef]:  # fmt: skip
    """softmax(beta * f(q @ k)) @ v.

    ``reshape``: the scores go through a 4-D view around the SOFTMAX, as litert-torch writes
    DeiT's (batch axes then (1, heads, m, n)); ``view``: another view of them (the windows
    and heads of TinyViT's, regrouped); ``transforms``: ``f``, (op, constant shape) applied
    in order on the view (a constant of more axes than the view adds unit axes, as LeViT's
    bias does).
    """

    def build(g: G) -> TensorRef:
        FORMS[g.prefix] = (adj_x, adj_y, adj_v, beta)
        b = list(batch)
        q = g.x([*b, d, m] if adj_x else [*b, m, d])
        k = g.x([*b, n, d] if adj_y else [*b, d, n])
        v = g.x([*b, c, n] if adj_v else [*b, n, c])
        s = g.op("BATCH_MATMUL", [q, k], [*b, m, n], {"adj_x": adj_x, "adj_y": adj_y})
        shape = [1, *b, m, n] if reshape else list(view) if view else [*b, m, n]
        if shape != [*b, m, n]:
            s = g.op("RESHAPE", [s, g.ints(shape)], shape)
        TRANSFORMS[g.prefix] = []
        for name, cshape in transforms:
            data = g.rng.uniform(0.5, 1.5, list(cshape)).astype(np.float32)
            shape = list(np.broadcast_shapes(tuple(shape), tuple(cshape)))
            s = g.op(name, [s, g.w(data)], shape, NONE)
            TRANSFORMS[g.prefix].append((name, data, shape))
        p = g.op("SOFTMAX", [s], shape, {"beta": beta})
        if shape != [*b, m, n]:
            p = g.op("RESHAPE", [p, g.ints([*b, m, n])], [*b, m, n])
        return g.op("BATCH_MATMUL", [p, v], [*b, m, c], {"adj_x": False, "adj_y": adj_v})

    return build


CASES = [
    Case("deit", attention([3], 197, 32, 197, 64, reshape=True)),
    Case("adj_y_beta", attention([2], 10, 16, 10, 8, adj_y=True, beta=0.125)),
    Case("adj_x_adj_v", attention([2], 7, 12, 9, 20, adj_x=True, adj_v=True)),
    Case("one_query", attention([4], 1, 32, 49, 32)),
    Case("keys300", attention([1], 33, 16, 300, 24)),
    Case("windows", attention([8, 4], 49, 32, 49, 32)),
    Case(
        "tiny_vit_bias",
        attention([12], 49, 16, 49, 16, view=[3, 4, 49, 49], transforms=[("ADD", [1, 4, 49, 49])]),
    ),
    Case(
        "levit_scale_bias",
        attention([4], 40, 16, 40, 32, transforms=[("MUL", []), ("ADD", [1, 4, 40, 40])]),
    ),
    Case("sub_div", attention([2], 9, 8, 11, 8, transforms=[("SUB", [11]), ("DIV", [1])])),
]


def _oracle(case: str, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    adj_x, adj_y, adj_v, beta = FORMS[case]
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    if adj_x:
        q = np.swapaxes(q, -1, -2)
    if adj_y:
        k = np.swapaxes(k, -1, -2)
    if adj_v:
        v = np.swapaxes(v, -1, -2)
    s = q @ k
    for name, data, view in TRANSFORMS[case]:
        x = s.reshape(view)
        c = data.astype(np.float64)
        x = {"MUL": x * c, "ADD": x + c, "SUB": x - c, "DIV": x / c}[name]
        s = x.reshape(s.shape)
    s = beta * s
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return p @ v


_BUILT: dict[str, Any] = {}


def _built() -> Any:
    if "model" not in _BUILT:
        _BUILT["model"] = build_model(CASES)
    return _BUILT["model"]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("schedules", ["fast", "fast-cpu"])
def test_one_kernel_per_attention(schedules: str, precision: str) -> None:
    """Every case's attention is one launch, and nothing else is launched."""
    kernels = launched_kernels(_built().model, schedules, precision)
    assert len(kernels) == len(CASES), kernels
    assert all("attention" in k for k in kernels), kernels


@pytest.mark.parametrize("schedules", ["fast", "fast-cpu"])
def test_rule_for_the_attention(schedules: str) -> None:
    """`FusedAttention` schedules the fused function on GPUs, `SerialAttention` on PoCL."""
    rules = rules_of_first_partition(attention([3], 50, 16, 50, 16), schedules)
    expected = "FusedAttention" if schedules == "fast" else "SerialAttention"
    assert rules == [expected], rules


@pytest.mark.opencl
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("schedules", ["fast", "fast-cpu"])
def test_attentions_match_numpy(schedules: str, precision: str) -> None:
    """Each case's output against a float64 attention of its inputs, on OpenCL."""
    built = _built()
    outs = run_uncached(built.model, built.feeds, schedules, precision)
    tol = 1e-4 if precision == "fp32" else 1e-2
    bad = []
    for k, case in enumerate(CASES):
        (pos,), _, _ = built.where[case.id]
        q, kk, v = built.feeds[3 * k : 3 * k + 3]
        err = relative_error([outs[pos]], [_oracle(case.id, q, kk, v)])
        if not err <= tol:
            bad.append(f"{case.id}: {err:.2e}")
    assert not bad, bad


# -- what stays op by op ----------------------------------------------------------------------


def _found(build: Callable[[G], Any]) -> int:
    from litekiln.compiler.attention import find_attentions

    model, plan = planned(build)
    return sum(len(find_attentions(model.main, p)) for p in plan.partitions)


def _scores_elsewhere(g: G) -> list[TensorRef]:
    """The scores are also a graph output: they must be stored, so op by op."""
    q, k, v = g.x([2, 6, 8]), g.x([2, 8, 6]), g.x([2, 6, 8])
    s = g.op("BATCH_MATMUL", [q, k], [2, 6, 6], {"adj_x": False, "adj_y": False})
    p = g.op("SOFTMAX", [s], [2, 6, 6], {"beta": 1.0})
    return [g.op("BATCH_MATMUL", [p, v], [2, 6, 8], {"adj_x": False, "adj_y": False}), s]


def _masked(g: G) -> TensorRef:
    """A computed mask added to the scores (an input, not a constant): op by op."""
    q, k, v = g.x([2, 6, 8]), g.x([2, 8, 6]), g.x([2, 6, 8])
    s = g.op("BATCH_MATMUL", [q, k], [2, 6, 6], {"adj_x": False, "adj_y": False})
    s = g.op("ADD", [s, g.x([2, 6, 6])], [2, 6, 6], NONE)
    p = g.op("SOFTMAX", [s], [2, 6, 6], {"beta": 1.0})
    return g.op("BATCH_MATMUL", [p, v], [2, 6, 8], {"adj_x": False, "adj_y": False})


def test_what_stays_op_by_op() -> None:
    assert _found(attention([2], 6, 8, 6, 8)) == 1
    assert _found(_scores_elsewhere) == 0
    assert _found(_masked) == 0
    assert _found(attention([1], 5, 8, 1, 8)) == 0  # one key: its softmax is 1
    assert _found(attention([3], 197, 64, 197, 64)) == 0  # DeiT's 64-term heads


@pytest.mark.opencl
def test_every_tuning_option_of_an_attention_matches_numpy() -> None:
    """The GPU profile's variants of the fused function (1, 2 and 8 query rows per group, 8
    rows of 16 lanes; 4, 2 and 8 rows with the loops unrolled whole; the keys, the values or
    both staged in local memory) give the same attention as the default (4 rows of 32
    lanes)."""
    import litekiln

    cases = [CASES[0], CASES[-2]]  # DeiT's, and LeViT's scale and bias
    built = build_model(cases)
    it = litekiln.Interpreter(
        model_content=built.model, use_cache=False, schedules="fast", tune=False
    )
    it.allocate_tensors()
    ex = it._backend.executors[0]  # noqa: SLF001 - the test drives the executor's options
    variants = ex.program.variants
    # (DeiT's case: its values, 197 x 64, are too many to stage, alone or with its keys)
    assert [len(v.options) for v in variants] == [8, 11], variants
    for i, v in enumerate(variants):
        for c in range(len(v.options) + 1):
            choices = [0] * len(variants)
            choices[i] = c
            ex.select(choices)
            outs = it.run(built.feeds)
            for k, case in enumerate(cases):
                q, kk, val = built.feeds[3 * k : 3 * k + 3]
                err = relative_error([outs[k]], [_oracle(case.id, q, kk, val)])
                assert err <= 1e-4, f"{v.func} option {c}: {case.id} {err:.2e}"
