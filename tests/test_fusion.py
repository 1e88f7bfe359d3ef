"""Matrix products fused with the layout copies around them (`litekiln.compiler.fusion`).

A vision transformer's block as litert-torch exports it: the fused q/k/v projection split
by a reshape, a transpose and three slices (q and k scaled), the heads folded back by a
transpose before the output projection, GELU between the MLP's products. Compiled with
both schedule profiles, run on PoCL against a float64 numpy reference (the tolerance of
tests/test_schedules.py); the copies must be in the products' kernels.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

cl = pytest.importorskip("pyopencl")
tvm = pytest.importorskip("tvm")
from tvm import relax  # noqa: E402

from tests.test_schedules import _rand, build_module, check  # noqa: E402

pytestmark = pytest.mark.opencl

T, C, H = 50, 64, 2  # tokens, channels, heads
D = C // H


def _weights() -> dict[str, np.ndarray]:
    return {
        "wqkv": _rand(C, 3 * C) * 0.2,
        "bqkv": _rand(3 * C),
        "wo": _rand(C, C) * 0.2,
        "bo": _rand(C),
        "w1": _rand(C, 2 * C) * 0.2,
        "b1": _rand(2 * C),
        "w2": _rand(2 * C, C) * 0.2,
        "b2": _rand(C),
    }


def _block(w: dict[str, np.ndarray]) -> Any:
    scale = relax.const(np.float32(D**-0.25))

    def body(bb: Any, x: Any) -> Any:
        op = relax.op
        qkv = bb.emit(op.add(op.matmul(x, relax.const(w["wqkv"])), relax.const(w["bqkv"])))
        heads = bb.emit(op.permute_dims(op.reshape(qkv, (T, 3, H, D)), (1, 2, 0, 3)))
        q = bb.emit(op.multiply(op.squeeze(op.strided_slice(heads, [0], [0], [1]), [0]), scale))
        k = bb.emit(op.multiply(op.squeeze(op.strided_slice(heads, [0], [1], [2]), [0]), scale))
        v = bb.emit(op.squeeze(op.strided_slice(heads, [0], [2], [3]), [0]))
        att = bb.emit(op.nn.softmax(op.matmul(q, op.permute_dims(k, (0, 2, 1))), axis=-1))
        ctx = bb.emit(op.reshape(op.permute_dims(op.matmul(att, v), (1, 0, 2)), (T, C)))
        y = bb.emit(op.add(op.add(op.matmul(ctx, relax.const(w["wo"])), relax.const(w["bo"])), x))
        h = bb.emit(op.add(op.matmul(y, relax.const(w["w1"])), relax.const(w["b1"])))
        h = bb.emit(op.nn.gelu(op.reshape(h, (1, T, 2 * C))))
        h = bb.emit(op.reshape(h, (T, 2 * C)))
        return bb.emit(op.add(op.add(op.matmul(h, relax.const(w["w2"])), relax.const(w["b2"])), y))

    return build_module([("x", (T, C))], body)


def _reference(x: np.ndarray, w: dict[str, np.ndarray]) -> np.ndarray:
    from math import erf

    f = {k: v.astype(np.float64) for k, v in w.items()}
    x = x.astype(np.float64)
    heads = (x @ f["wqkv"] + f["bqkv"]).reshape(T, 3, H, D).transpose(1, 2, 0, 3)
    s = D**-0.25
    logits = (heads[0] * s) @ (heads[1] * s).transpose(0, 2, 1)
    att = np.exp(logits - logits.max(-1, keepdims=True))
    att /= att.sum(-1, keepdims=True)
    y = (att @ heads[2]).transpose(1, 0, 2).reshape(T, C) @ f["wo"] + f["bo"] + x
    h = y @ f["w1"] + f["b1"]
    h = 0.5 * h * (1 + np.vectorize(erf)(h / np.sqrt(2)))
    return (h @ f["w2"] + f["b2"] + y).astype(np.float32)


@pytest.mark.parametrize("profile", ["gpu", "cpu"])
def test_transformer_block_copies_join_the_products(cl_env: Any, profile: str) -> None:
    """Seven kernels: q/k/v, scores, softmax, weights @ values, projection, fc1 with GELU,
    fc2; the reshape, transposes and slices are read or written by the products."""
    w = _weights()
    x = _rand(T, C)
    res = check(cl_env, _block(w), [x], [_reference(x, w)], profile=profile, rule=None)
    assert len(res.program.launches) == 7, [la.func for la in res.program.launches]


def test_copies_with_other_readers_stay(cl_env: Any) -> None:
    """A copy whose result another reader also needs (here the model's output) stays a
    kernel: it is copied into the product, not moved."""
    wt = _rand(T, C)

    def body(bb: Any, x: Any) -> Any:
        t = bb.emit(relax.op.permute_dims(x, (1, 0)))  # [C, T]: read by the product and out
        p = bb.emit(relax.op.matmul(t, relax.const(wt)))
        return bb.emit(relax.Tuple([t, p]))

    x = _rand(T, C)
    refs = [x.T.copy(), (x.T.astype(np.float64) @ wt).astype(np.float32)]
    res = check(cl_env, build_module([("x", (T, C))], body), [x], refs, rule=None)
    funcs = [la.func for la in res.program.launches]
    assert len(funcs) == 2 and any("transpose" in f and "matmul" in f for f in funcs), funcs


@pytest.mark.parametrize("rows", [1, T])
def test_activation_producer_joins_only_a_matrix_product(cl_env: Any, rows: int) -> None:
    """A producer with transcendental math (a recurrent cell's gate, sigmoid) stays a kernel
    of its own before a matrix-vector product, whose threads would each compute it again
    for every element they read (an unrolled GRU nested its cells steps deep there); a
    product of many rows stages its operand's tiles and takes it as it takes a copy."""
    w = _rand(C, 3 * C)

    def body(bb: Any, x: Any) -> Any:
        g = bb.emit(relax.op.sigmoid(x))
        return bb.emit(relax.op.matmul(g, relax.const(w)))

    x = _rand(rows, C)
    ref = ((1 / (1 + np.exp(-x.astype(np.float64)))) @ w.astype(np.float64)).astype(np.float32)
    res = check(cl_env, build_module([("x", (rows, C))], body), [x], [ref], rule=None)
    funcs = [la.func for la in res.program.launches]
    if rows == 1:
        assert len(funcs) == 2 and "sigmoid" in funcs[0] and "matmul" not in funcs[0], funcs
    else:
        assert len(funcs) == 1 and "sigmoid" in funcs[0] and "matmul" in funcs[0], funcs
