"""Constant folding at load (litekiln/ops/fold.py): ops whose inputs are all known become
constants, shape arithmetic never reaches the partitioner, and the results equal LiteRT's,
also after resize_tensor_input (the folds redone at the new shape)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tflite_builder import ModelBuilder

import litekiln
from litekiln.model import load_model
from litekiln.ops.fold import GROWTH_BYTES
from litekiln.placement import placement


def _invoke(it: Any, feeds: list[np.ndarray]) -> list[np.ndarray]:
    """Resize the inputs that differ, allocate, run: LiteRT's and litekiln's Interpreter alike."""
    for d, x in zip(it.get_input_details(), feeds, strict=True):
        if tuple(d["shape"]) != x.shape:
            it.resize_tensor_input(d["index"], list(x.shape))
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), feeds, strict=True):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def _litert(model: bytes, feeds: list[np.ndarray]) -> list[np.ndarray]:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    it = Interpreter(
        model_content=model,
        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
    )
    return _invoke(it, feeds)


def _reference(model: bytes, feeds: list[np.ndarray], **kw: Any) -> list[np.ndarray]:
    return _invoke(litekiln.Interpreter(model_content=model, device="reference", **kw), feeds)


def keras_reshape_model() -> bytes:
    """What Keras writes for a reshape under a dynamic batch: the target shape computed from
    the input's shape (SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE), then a dense layer."""
    b = ModelBuilder()
    x = b.input("x", [1, 4, 6, 8], shape_signature=[-1, 4, 6, 8])
    shape = b.op("SHAPE", [x], out_shape=[4], out_dtype="int32", options={"out_type": 2})
    batch = b.op(
        "STRIDED_SLICE",
        [shape, np.array([0], np.int32), np.array([1], np.int32), np.array([1], np.int32)],
        out_shape=[],
        out_dtype="int32",
        options={"shrink_axis_mask": 1},
    )
    target = b.op(
        "PACK",
        [batch, b.const("features", np.array(192, np.int32))],
        out_shape=[2],
        out_dtype="int32",
        options={"values_count": 2, "axis": 0},
    )
    flat = b.op("RESHAPE", [x, target], out_shape=[1, 192])
    w = np.random.default_rng(0).uniform(-0.1, 0.1, [10, 192]).astype(np.float32)
    y = b.op("FULLY_CONNECTED", [flat, w, np.zeros(10, np.float32)], out_shape=[1, 10])
    b.output(y)
    return b.build()


def test_keras_shape_arithmetic_folds_and_runs_whole_on_the_gpu() -> None:
    model = load_model(keras_reshape_model())
    g = model.main
    assert [op.name for op in g.ops if op.folded] == ["SHAPE", "STRIDED_SLICE", "PACK"]
    assert all(op.folded_shape for op in g.ops if op.folded)
    reshape = next(op for op in g.ops if op.name == "RESHAPE")
    np.testing.assert_array_equal(g.tensors[reshape.inputs[1]].data, [1, 192])
    info, plan = placement(model)
    assert plan.cpu_reasons == {} and len(plan.partitions) == 1
    assert info["gpu_ops"] == 2  # RESHAPE, FULLY_CONNECTED


@pytest.mark.parametrize("batch", [1, 3])
def test_folded_shape_arithmetic_matches_litert_also_resized(batch: int) -> None:
    model = keras_reshape_model()
    x = np.random.default_rng(batch).uniform(-1, 1, [batch, 4, 6, 8]).astype(np.float32)
    want = _litert(model, [x])
    got = _reference(model, [x])
    assert got[0].shape == (batch, 10)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


def test_a_resize_leaves_the_loaded_model_folded_as_it_was() -> None:
    from litekiln.resize import resized

    model = load_model(keras_reshape_model())
    before = [(op.folded, op.folded_shape) for op in model.main.ops]
    big = resized(model, {model.main.inputs[0]: (5, 4, 6, 8)})
    reshape = next(op for op in big.main.ops if op.name == "RESHAPE")
    np.testing.assert_array_equal(big.main.tensors[reshape.inputs[1]].data, [5, 192])
    assert [(op.folded, op.folded_shape) for op in model.main.ops] == before
    small = next(op for op in model.main.ops if op.name == "RESHAPE")
    np.testing.assert_array_equal(model.main.tensors[small.inputs[1]].data, [1, 192])


def transpose_conv_model() -> bytes:
    """A TRANSPOSE_CONV whose output shape is computed: SHAPE(x) * [1, 2, 2, 1]."""
    b = ModelBuilder()
    x = b.input("x", [1, 5, 5, 8])
    shape = b.op("SHAPE", [x], out_shape=[4], out_dtype="int32", options={"out_type": 2})
    out_shape = b.op(
        "MUL", [shape, np.array([1, 2, 2, 1], np.int32)], out_shape=[4], out_dtype="int32"
    )
    w = np.random.default_rng(1).uniform(-0.5, 0.5, [8, 3, 3, 8]).astype(np.float32)
    y = b.op(
        "TRANSPOSE_CONV",
        [out_shape, w, x],
        out_shape=[1, 10, 10, 8],
        out_dtype="float32",
        options={"padding": "SAME", "stride_h": 2, "stride_w": 2},
    )
    b.output(y)
    return b.build()


def test_a_computed_transpose_conv_output_shape_becomes_a_constant() -> None:
    data = transpose_conv_model()
    model = load_model(data)
    g = model.main
    tconv = next(op for op in g.ops if op.name == "TRANSPOSE_CONV")
    np.testing.assert_array_equal(g.tensors[tconv.inputs[0]].data, [1, 10, 10, 8])
    _, plan = placement(model)
    assert plan.cpu_reasons == {}
    x = np.random.default_rng(2).uniform(-1, 1, [1, 5, 5, 8]).astype(np.float32)
    np.testing.assert_allclose(_reference(data, [x])[0], _litert(data, [x])[0], atol=1e-5)


def test_constant_chains_fold_graph_outputs_and_large_growth_do_not() -> None:
    b = ModelBuilder()
    x = b.input("x", [2, 3])
    c = b.op(
        "ADD",
        [np.ones([2, 3], np.float32), np.full([2, 3], 2.0, np.float32)],
        out_shape=[2, 3],
    )
    c2 = b.op("MUL", [c, np.full([2, 3], 0.5, np.float32)], out_shape=[2, 3])
    y = b.op("ADD", [x, c2], out_shape=[2, 3])
    also = b.op("NEG", [np.ones([2, 3], np.float32)], out_shape=[2, 3])  # a graph output
    side = 1 + int(np.sqrt(GROWTH_BYTES / 4))  # TILE of 4 bytes to more than GROWTH_BYTES
    big = b.op(
        "TILE",
        [np.ones([1, 1], np.float32), np.array([side, side], np.int32)],
        out_shape=[side, side],
    )
    s = b.op("SUM", [big, np.array([0, 1], np.int32)], out_shape=[])
    z = b.op("ADD", [y, s], out_shape=[2, 3])
    b.output(z, also)
    data = b.build()
    g = load_model(data).main
    assert [op.name for op in g.ops if op.folded] == ["ADD", "MUL"]
    assert not any(op.folded_shape for op in g.ops)
    np.testing.assert_allclose(g.tensors[c2.index].data, np.full([2, 3], 1.5))
    xv = np.arange(6, dtype=np.float32).reshape(2, 3)
    got, want = _reference(data, [xv]), _litert(data, [xv])
    for a, e in zip(got, want, strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-6)


def test_a_warm_start_finds_the_entry_of_a_model_with_a_folded_constant(tmp_path) -> None:
    """`litekiln compile`, then an app's start, each a fresh process that has not imported the
    op registry (whose checks fold): a constant computed from constants (EdgeNeXt's
    positional encoding) and read by a GPU op is a constant in both graphs, so the app
    finds the compiled entry. The app's start once skipped the folding, found the entry's
    constant missing from its graph, and dropped and recompiled the entry at every start."""
    from fresh_process import compile_then_open

    b = ModelBuilder()
    x = b.input("x", [1, 8, 8, 4])
    grid = b.const("grid", np.linspace(-1, 1, 256, dtype=np.float32).reshape(1, 8, 8, 4))
    scale = b.const("scale", np.full((1, 8, 8, 4), 0.5, np.float32))
    encoding = b.op("MUL", [grid, scale], out_shape=[1, 8, 8, 4])
    b.output(b.op("ADD", [x, encoding], out_shape=[1, 8, 8, 4]))
    path = tmp_path / "encoded.tflite"
    path.write_bytes(b.build())
    assert load_model(path.read_bytes()).main.ops[0].folded  # (this process has the registry)
    compiled, opened = compile_then_open(path, tmp_path / "cache")
    assert "1 GPU partition(s)" in compiled and "/ 0 on the CPU" in compiled, compiled
    assert opened == "True [('gpu', 0)] {}", opened


def _empty_slice_model() -> bytes:
    """A SLICE of no element (an unrolled loop's first step), concatenated to the input."""
    b = ModelBuilder()
    x = b.input("x", [1, 4, 3])
    none = b.op(
        "SLICE",
        [x, np.array([0, 0, 0], np.int32), np.array([1, 0, 3], np.int32)],
        out_shape=[1, 0, 3],
    )
    b.output(b.op("CONCATENATION", [none, x], out_shape=[1, 4, 3], options={"axis": 1}))
    return b.build()


def _constant_model() -> bytes:
    b = ModelBuilder()
    x = b.input("x", [2, 3])
    c = b.op("ADD", [np.ones([2, 3], np.float32), np.ones([2, 3], np.float32)], out_shape=[2, 3])
    b.output(b.op("MUL", [x, c], out_shape=[2, 3]))
    return b.build()


def _plain_model() -> bytes:
    b = ModelBuilder()
    x = b.input("x", [2, 3])
    b.output(b.op("MUL", [x, np.full([2, 3], 2.0, np.float32)], out_shape=[2, 3]))
    return b.build()


@pytest.mark.parametrize(
    ("make", "folds"),
    [
        (keras_reshape_model, ["SHAPE", "STRIDED_SLICE", "PACK"]),
        (_constant_model, ["ADD"]),
        (_empty_slice_model, ["SLICE"]),
        (_plain_model, []),
    ],
    ids=["shape", "constant", "empty", "none"],
)
def test_a_warm_start_runs_the_checks_exactly_when_they_would_fold(
    make: Any, folds: list[str]
) -> None:
    """A warm start skips the op registry (its imports cost ~0.1-0.2 s) unless its checks
    would change the graph: it must ask for them on every model they fold an op of, by each
    of the three ways an op folds (a SHAPE of a static shape, constant inputs, an empty
    output), and on no other, or a shipped entry would miss (`litekiln.loading`)."""
    from litekiln.loading import _rewritten_at_load

    data = make()
    checked = load_model(data).main
    assert [op.name for op in checked.ops if op.folded] == folds
    assert _rewritten_at_load(load_model(data, validate=False)) == bool(folds)


def test_every_op_the_checks_rewrite_makes_a_warm_start_run_them() -> None:
    """The ops whose check replaces them at load (an op definition's ``rewritten_at_load``)
    are the ones `litekiln.loading` lists for a warm start to run the checks on (it does
    not import the registry to ask: a list of its own). SVDF's and STABLEHLO_COMPOSITE's
    were missing from it once: a warm start's graph then kept the op, and missed the
    entry a compile had made from the rewritten graph."""
    from litekiln.loading import _REWRITTEN_AT_LOAD
    from litekiln.ops.base import REGISTRY

    rewritten = {name for name, cls in REGISTRY.items() if cls.rewritten_at_load}
    assert rewritten == set(_REWRITTEN_AT_LOAD)
