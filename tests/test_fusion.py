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
def test_activation_producer_joins_a_matrix_product(cl_env: Any, rows: int) -> None:
    """A producer with transcendental math (a recurrent cell's output, sigmoid) joins a
    matrix product: a small matrix-vector product computes it for each element it reads
    (64 x 192 evaluations: cheaper than a launch), a product of many rows stages its
    operand's tiles and takes it as it takes a copy."""
    w = _rand(C, 3 * C)

    def body(bb: Any, x: Any) -> Any:
        g = bb.emit(relax.op.sigmoid(x))
        return bb.emit(relax.op.matmul(g, relax.const(w)))

    x = _rand(rows, C)
    ref = ((1 / (1 + np.exp(-x.astype(np.float64)))) @ w.astype(np.float64)).astype(np.float32)
    res = check(cl_env, build_module([("x", (rows, C))], body), [x], [ref], rule=None)
    funcs = [la.func for la in res.program.launches]
    assert len(funcs) == 1 and "sigmoid" in funcs[0] and "matmul" in funcs[0], funcs


def test_activation_producers_never_nest_in_a_matrix_vector_product(cl_env: Any) -> None:
    """A matrix-vector product takes one producer with math, not that producer's own
    producers with math: an unrolled GRU's recurrent products took the previous steps' gate
    updates, sigmoid and tanh nested three and four steps deep, and every one of their
    columns computed them all again (59 us a product on the H200). Here the sigmoid,
    also an output (a kernel of its own), stays out of the product that takes the tanh."""
    w = _rand(C, 3 * C)

    def body(bb: Any, x: Any) -> Any:
        g = bb.emit(relax.op.sigmoid(x))
        h = bb.emit(relax.op.multiply(relax.op.tanh(g), g))
        p = bb.emit(relax.op.matmul(h, relax.const(w)))
        return bb.emit(relax.Tuple([g, p]))

    x = _rand(1, C)
    g = 1 / (1 + np.exp(-x.astype(np.float64)))
    refs = [g.astype(np.float32), ((np.tanh(g) * g) @ w.astype(np.float64)).astype(np.float32)]
    res = check(cl_env, build_module([("x", (1, C))], body), [x], refs, rule=None)
    funcs = [la.func for la in res.program.launches]
    assert len(funcs) == 2, funcs
    product = next(f for f in funcs if "matmul" in f)
    assert "tanh" in product and "sigmoid" not in product, funcs


def test_costly_activation_producer_stays_out_of_a_matrix_vector_product(cl_env: Any) -> None:
    """Where a matrix-vector product would compute its producer's math more than
    `_MATH_MAX_EVALS` times (each of its 1024 columns every one of the 128 elements it
    sums), the producer stays a kernel of its own."""
    from litekiln.compiler.fusion import _MATH_MAX_EVALS

    k, n = 128, 1024
    assert k * n > _MATH_MAX_EVALS
    w = _rand(k, n)

    def body(bb: Any, x: Any) -> Any:
        g = bb.emit(relax.op.sigmoid(x))
        return bb.emit(relax.op.matmul(g, relax.const(w)))

    x = _rand(1, k)
    ref = ((1 / (1 + np.exp(-x.astype(np.float64)))) @ w.astype(np.float64)).astype(np.float32)
    res = check(cl_env, build_module([("x", (1, k))], body), [x], [ref], rule=None)
    funcs = [la.func for la in res.program.launches]
    assert len(funcs) == 2 and "sigmoid" in funcs[0] and "matmul" not in funcs[0], funcs


def test_an_epilogue_reading_a_row_of_a_larger_tensor_joins_the_product(cl_env: Any) -> None:
    """A product's epilogue may read a row of a larger tensor (an unrolled RNN step adds its
    row of the batched input product to the recurrent one): the slice is read in the
    product's kernel, not copied by a kernel of its own."""
    w = _rand(C, 4 * C)

    def body(bb: Any, x: Any, rows: Any) -> Any:
        p = bb.emit(relax.op.matmul(x, relax.const(w)))
        r = bb.emit(relax.op.strided_slice(rows, [0], [5], [6]))
        return bb.emit(relax.op.add(p, r))

    x, rows = _rand(1, C), _rand(8, 4 * C)
    ref = (x.astype(np.float64) @ w.astype(np.float64) + rows[5:6]).astype(np.float32)
    mod = build_module([("x", (1, C)), ("rows", (8, 4 * C))], body)
    res = check(cl_env, mod, [x, rows], [ref], rule=None)
    funcs = [la.func for la in res.program.launches]
    assert len(funcs) == 1 and "matmul" in funcs[0], funcs


@pytest.mark.parametrize("schedules", ["fast", "fast-cpu"])
def test_a_pool_takes_its_elementwise_consumer_not_a_pad(schedules: str) -> None:
    """An average pool's fused RELU6 and a max pool's fused RELU are in the pools' kernels
    (`_Fuser._pool_epilogue`); a channel pad after a pool (BlazeFace's blocks) stays out of
    it (`codegen.isolate_pools`). Values: tests/test_gpu_ops.py's POOL cases."""
    from gpu_helper import Case, G, build_model, launched_kernels

    def build(g: G) -> Any:
        # 3x3 windows: a reduction (a pool of at most 4 taps is elementwise instead, below)
        opts = {"padding": "SAME", "stride_h": 2, "stride_w": 2}
        opts.update(filter_height=3, filter_width=3)
        relu6 = {**opts, "fused_activation_function": "RELU6"}
        relu = {**opts, "fused_activation_function": "RELU"}
        x = g.x([1, 8, 8, 4])
        a = g.op("AVERAGE_POOL_2D", [x], [1, 4, 4, 4], relu6)
        m = g.op("MAX_POOL_2D", [x], [1, 4, 4, 4], relu)
        n = g.op("MAX_POOL_2D", [g.x([1, 8, 8, 4])], [1, 4, 4, 4], opts)
        p = g.op("PAD", [n, g.ints([[0, 0], [0, 0], [0, 0], [0, 4]])], [1, 4, 4, 8])
        return [a, m, p]

    names = launched_kernels(build_model([Case("c", build)]).model, schedules)
    pools = sorted(dict.fromkeys(n for n in names if "pool2d" in n))
    assert len(pools) == 3, names
    assert any("avg_pool2d" in n and "clip" in n for n in pools), names
    assert any("max_pool2d" in n and "relu" in n for n in pools), names
    assert any(n.startswith("max_pool2d") for n in pools), names  # alone: the pad stays out
    assert not any("pad" in n for n in pools), names


def _blaze_block(kind: str) -> Any:
    """BlazeFace's downsampling block: a stride-2 convolution beside a 2x2 pool of the
    block's input, its channels padded, added (ReLU); and a pool that is an output and is
    read by a convolution (a kernel of its own: two readers)."""
    from gpu_helper import G

    def build(g: G) -> Any:
        x = g.x([1, 9, 8, 8])
        conv = {"padding": "SAME", "stride_h": 2, "stride_w": 2}
        c = g.op("CONV_2D", [x, g.w([16, 3, 3, 8]), g.w([16])], [1, 5, 4, 16], conv)
        pool = {"padding": "SAME", "stride_h": 2, "stride_w": 2}
        pool.update(filter_height=2, filter_width=2)
        m = g.op(kind, [x], [1, 5, 4, 8], pool)
        p = g.op("PAD", [m, g.ints([[0, 0], [0, 0], [0, 0], [0, 8]])], [1, 5, 4, 16])
        y = g.op("ADD", [c, p], [1, 5, 4, 16], {"fused_activation_function": "RELU"})
        x2 = g.op("RELU", [g.x([1, 9, 8, 8])], [1, 9, 8, 8])
        one = {"padding": "SAME", "stride_h": 1, "stride_w": 1}
        c2 = g.op("CONV_2D", [x2, g.w([8, 1, 1, 8]), g.w([8])], [1, 9, 8, 8], one)
        m2 = g.op(kind, [c2], [1, 5, 4, 8], pool)
        w = g.op("CONV_2D", [m2, g.w([8, 1, 1, 8]), g.w([8])], [1, 5, 4, 8], one)
        return [y, m2, w]

    return build


@pytest.mark.parametrize("kind", ["MAX_POOL_2D", "AVERAGE_POOL_2D"])
@pytest.mark.parametrize("schedules", ["fast", "fast-cpu"])
def test_a_small_pool_joins_the_convolution_whose_epilogue_reads_it(
    kind: str, schedules: str
) -> None:
    """A 2x2 pool is elementwise reads of its taps (`emit_nn._small_pool`); read by a
    convolution's residual add through a channel pad, it is computed in that convolution's
    kernel (`_Fuser._conv_epilogue_inputs`): no kernel of its own. Read by two ops, it
    stays one. The outputs match LiteRT and the numpy reference on PoCL (every tuning option
    of the GPU profile too), SAME padding of an odd map included."""
    from gpu_helper import Case, build_model, launched_kernels

    built = build_model([Case("c", _blaze_block(kind))])
    names = list(dict.fromkeys(launched_kernels(built.model, schedules)))  # (split-K: twice)
    fused = [n for n in names if "pool_taps" in n and "conv2d" in n]
    alone = [n for n in names if "pool_taps" in n and "conv2d" not in n]
    assert len(fused) == 1 and "pad" in fused[0], names
    assert len(alone) == 1, names  # the second block's pool: two readers
    assert not any("pool2d" in n for n in names), names

    _check_every_option(built, schedules)


def _check_every_option(built: Any, schedules: str) -> None:
    """``built``'s outputs on PoCL with ``schedules`` (tuning off; on the GPU profile every
    option of every variant) against LiteRT's, and the numpy reference's against LiteRT's."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    import litekiln

    lit = LiteRT(model_content=built.model)
    lit.allocate_tensors()
    for d, f in zip(lit.get_input_details(), built.feeds, strict=True):
        lit.set_tensor(d["index"], f)
    lit.invoke()
    want = [lit.get_tensor(d["index"]) for d in lit.get_output_details()]
    ref = litekiln.Interpreter(model_content=built.model, device="reference").run(built.feeds)
    for r, w in zip(ref, want, strict=True):
        np.testing.assert_allclose(r, w, rtol=0, atol=1e-5)
    it = litekiln.Interpreter(
        model_content=built.model, use_cache=False, schedules=schedules, tune=False
    )
    it.allocate_tensors()
    ex = it._backend.executors[0]  # noqa: SLF001 - the test drives the executor's options
    variants = ex.program.variants
    plans = [[0] * len(variants)] + [
        [c if j == i else 0 for j in range(len(variants))]
        for i, v in enumerate(variants)
        for c in range(1, len(v.options) + 1)
    ]
    for plan in plans:
        ex.select(plan)
        for got, w in zip(it.run(built.feeds), want, strict=True):
            np.testing.assert_allclose(got, w, rtol=0, atol=1e-5, err_msg=f"options {plan}")


def _activation_before_conv(g: Any) -> Any:
    """A PRELU between a residual add, whose sum a 2x2 pool also reads, and a stride-2
    convolution (mp_hand_recrop's blocks); and a RELU read by a convolution and kept as an
    output (two readers)."""
    x = g.x([1, 9, 8, 8])
    s = g.op("ADD", [x, g.x([1, 9, 8, 8])], [1, 9, 8, 8])
    p = g.op("PRELU", [s, g.w([1, 1, 8])], [1, 9, 8, 8])
    conv = {"padding": "SAME", "stride_h": 2, "stride_w": 2}
    c = g.op("CONV_2D", [p, g.w([16, 3, 3, 8]), g.w([16])], [1, 5, 4, 16], conv)
    pool = {"padding": "SAME", "stride_h": 2, "stride_w": 2, "filter_height": 2, "filter_width": 2}
    m = g.op("MAX_POOL_2D", [s], [1, 5, 4, 8], pool)
    pad = g.op("PAD", [m, g.ints([[0, 0], [0, 0], [0, 0], [0, 8]])], [1, 5, 4, 16])
    y = g.op("ADD", [c, pad], [1, 5, 4, 16])
    r = g.op("RELU", [g.op("ADD", [x, x], [1, 9, 8, 8])], [1, 9, 8, 8])
    one = {"padding": "SAME", "stride_h": 1, "stride_w": 1}
    z = g.op("CONV_2D", [r, g.w([4, 1, 1, 8]), g.w([4])], [1, 9, 8, 4], one)
    return [y, r, z]


@pytest.mark.parametrize("schedules", ["fast", "fast-cpu"])
def test_an_activation_before_a_convolution_stays_a_kernel(schedules: str) -> None:
    """mp_hand_recrop's block: the residual sum's 2x2 pool joins the next convolution's
    epilogue, but the PRELU standing before the stride-2 convolution, its only reader, stays
    a kernel of its own: merged into the convolution's loads it lost as often as it won on
    the H200 (`_Fuser._conv_epilogue_inputs`). Outputs against LiteRT on PoCL, every tuning
    option of the GPU profile."""
    from gpu_helper import Case, build_model, launched_kernels

    built = build_model([Case("c", _activation_before_conv)])
    names = list(dict.fromkeys(launched_kernels(built.model, schedules)))
    prelu = [n for n in names if "minimum" in n]  # PRELU: relu(x) + min(x, 0) * alpha
    assert len(prelu) == 1 and "conv2d" not in prelu[0], names
    assert any("pool_taps" in n and "conv2d" in n for n in names), names
    _check_every_option(built, schedules)
