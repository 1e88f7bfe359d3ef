"""Sibling convolutions of one map compiled as one (litekiln/compiler/sibling_merge.py): each
case against the numpy reference in fp32 and fp16, with the kernels it must save against the
same model lowered without the merge, and the cases that must stay apart kept apart.

The shapes are those of GoogLeNet's inception modules as litert-torch writes them (three
ReLU 1x1 convolutions of the module's input: one to the concatenation, two before 3x3
convolutions; a max pool and its 1x1 projection), and siblings read by other ops or leaving
the model.

On PoCL, fp16 runs as emulated half (float32 kernels rounding to fp16), which never merges:
the fp16 cases check that path; the compile's stats check the native fp16 compile merges.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

pytest.importorskip("tvm")

from gpu_helper import assert_matches_reference  # noqa: E402

from litekiln.artifact.compiled import CompileOptions  # noqa: E402
from litekiln.compiler.driver import compile_model, plan_partitions  # noqa: E402
from litekiln.model import load_model  # noqa: E402
from tests.tflite_builder import ModelBuilder  # noqa: E402

RNG = np.random.default_rng(11)
C = 8


def _w(*shape: int) -> np.ndarray:
    return RNG.uniform(-1, 1, shape).astype(np.float32)


def _conv(b, x, out, *, k=1, cin=C, stride=1, padding="VALID", act="RELU", hw=(6, 5)):
    inputs = [x, b.const("w", _w(out, k, k, cin)), b.const("b", _w(out))]
    options = {"padding": padding, "stride_w": stride, "stride_h": stride}
    options["fused_activation_function"] = act
    shape = [1, -(-hw[0] // stride), -(-hw[1] // stride), out]
    return b.op("CONV_2D", inputs, out_shape=shape, options=options)


def _inception() -> bytes:
    b = ModelBuilder()
    x = b.input("x", [1, 6, 5, C])
    one = _conv(b, x, 4)
    three = _conv(b, _conv(b, x, 6), 8, k=3, cin=6, padding="SAME")
    five = _conv(b, _conv(b, x, 2), 3, k=3, cin=2, padding="SAME")
    pool = b.op(
        "MAX_POOL_2D",
        [x],
        out_shape=[1, 6, 5, C],
        options={"padding": "SAME", "stride_w": 1, "stride_h": 1, "filter_width": 3,
                 "filter_height": 3},
    )  # fmt: skip
    proj = _conv(b, pool, 5)
    out = b.op("CONCATENATION", [one, three, five, proj], out_shape=[1, 6, 5, 20],
               options={"axis": 3})  # fmt: skip
    b.output(out)
    return b.build()


def _read_by_convs() -> bytes:
    # 3x3 siblings (SAME) read by a 1x1 convolution, a depthwise one through a PAD and a
    # concatenation (with a third map): the convolutions read their channels in place.
    b = ModelBuilder()
    x = b.input("x", [1, 7, 6, C])
    y = [_conv(b, x, n, k=3, padding="SAME", act="NONE", hw=(7, 6)) for n in (5, 4, 3)]
    a = _conv(b, y[0], 2, cin=5, hw=(7, 6))
    pads = b.const("pads", np.asarray([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32))
    p = b.op("PAD", [y[1], pads], out_shape=[1, 9, 8, 4])
    options = {"padding": "VALID", "stride_w": 1, "stride_h": 1, "depth_multiplier": 1}
    d = b.op("DEPTHWISE_CONV_2D", [p, b.const("dw", _w(1, 3, 3, 4)), b.const("db", _w(4))],
             out_shape=[1, 7, 6, 4], options=options)  # fmt: skip
    cat = b.op("CONCATENATION", [y[2], a, d], out_shape=[1, 7, 6, 9], options={"axis": 3})
    b.output(cat)
    return b.build()


def _read_elsewhere() -> bytes:
    # Siblings read by an ADD (their epilogue when apart), a MEAN, or leaving the model: a
    # slice of a merged map would be a kernel more, so they stay apart.
    b = ModelBuilder()
    x = b.input("x", [1, 7, 6, C])
    y = [_conv(b, x, n, k=3, padding="SAME", act="NONE", hw=(7, 6)) for n in (5, 5, 3)]
    s = b.op("ADD", [y[0], y[1]], out_shape=[1, 7, 6, 5])
    axes = b.const("axes", np.asarray([1, 2], np.int32))
    m = b.op("MEAN", [y[2], axes], out_shape=[1, 1, 1, 3], options={"keep_dims": True})
    b.output(s, m, y[1])
    return b.build()


def _strided() -> bytes:
    # Stride-2 siblings, concatenated in another order.
    b = ModelBuilder()
    x = b.input("x", [1, 9, 8, C])
    y0 = _conv(b, x, 6, k=3, stride=2, padding="SAME", hw=(9, 8))
    y1 = _conv(b, x, 4, k=3, stride=2, padding="SAME", hw=(9, 8))
    b.output(b.op("CONCATENATION", [y1, y0], out_shape=[1, 5, 4, 10], options={"axis": 3}))
    return b.build()


def _not_siblings() -> bytes:
    # One map, but other windows, strides or activations: nothing merges.
    b = ModelBuilder()
    x = b.input("x", [1, 6, 5, C])
    outs = [
        _conv(b, x, 4),
        _conv(b, x, 4, k=3, padding="SAME"),
        _conv(b, x, 4, act="RELU6"),
    ]
    cat = b.op("CONCATENATION", outs, out_shape=[1, 6, 5, 12], options={"axis": 3})
    b.output(cat, _conv(b, x, 4, stride=2))
    return b.build()


def _fc(b, x, shape, n_in, act="NONE"):
    w, bias = b.const("fw", _w(shape[-1], n_in)), b.const("fb", _w(shape[-1]))
    options = {"fused_activation_function": act, "keep_num_dims": True}
    return b.op("FULLY_CONNECTED", [x, w, bias], out_shape=shape, options=options)


def _heads(b, t, tokens, dim):
    """[1, tokens, dim] -> [1, 1, tokens, dim]: one head, as litert-torch writes the split."""
    r = b.op("RESHAPE", [t, b.const("shape", np.asarray([1, tokens, 1, dim], np.int32))],
             out_shape=[1, tokens, 1, dim])  # fmt: skip
    perm = b.const("perm", np.asarray([0, 2, 1, 3], np.int32))
    return b.op("TRANSPOSE", [r, perm], out_shape=[1, 1, tokens, dim])


def _attention_qkv() -> bytes:
    # A transformer block's queries, keys and values: three FULLY_CONNECTEDs of one input,
    # each reshaped and transposed to its heads (64-term heads: an attention op by op).
    b = ModelBuilder()
    n, d = 6, 64
    x = b.input("x", [1, n, d])
    q, k, v = (_heads(b, _fc(b, x, [1, n, d], d), n, d) for _ in range(3))
    s = b.op("BATCH_MATMUL", [q, k], out_shape=[1, 1, n, n], options={"adj_y": True})
    p = b.op("SOFTMAX", [s], out_shape=[1, 1, n, n], options={"beta": 0.125})
    b.output(b.op("BATCH_MATMUL", [p, v], out_shape=[1, 1, n, d]))
    return b.build()


def _fc_epilogues() -> bytes:
    # Fully connected siblings read by an ADD and a MUL (their epilogues apart): kept apart.
    b = ModelBuilder()
    x = b.input("x", [1, 5, 12])
    r = b.input("r", [1, 5, 7])
    y = [_fc(b, x, [1, 5, 7], 12) for _ in range(3)]
    s = b.op("ADD", [y[0], r], out_shape=[1, 5, 7])
    m = b.op("MUL", [y[1], y[2]], out_shape=[1, 5, 7])
    b.output(s, m)
    return b.build()


def _reshaped_outputs() -> bytes:
    # MediaPipe's landmark heads: 1x1 convolutions of one map, each reshaped into an output.
    # The reshape of a convolution's own output is a view; of a slice, a copy: kept apart.
    b = ModelBuilder()
    x = b.input("x", [1, 1, 1, C])
    outs = []
    for n in (6, 4):
        y = _conv(b, x, n, hw=(1, 1), act="NONE")
        shape = b.const("shape", np.asarray([1, n], np.int32))
        outs.append(b.op("RESHAPE", [y, shape], out_shape=[1, n]))
    b.output(*outs)
    return b.build()


#: name -> (model, kernels the merge saves)
CASES: dict[str, tuple[Callable[[], bytes], int]] = {
    "inception": (_inception, 2),
    "read_by_convs": (_read_by_convs, 2),
    "read_elsewhere": (_read_elsewhere, 0),
    "strided": (_strided, 1),
    "not_siblings": (_not_siblings, 0),
    "attention_qkv": (_attention_qkv, 2),
    "fc_epilogues": (_fc_epilogues, 0),
    "reshaped_outputs": (_reshaped_outputs, 0),
}


def _launches(data: bytes, merge: bool) -> int:
    from litekiln.compiler.codegen import compile_relax_full
    from litekiln.compiler.lower import LowerOptions, lower_partition

    model = load_model(data)
    part = plan_partitions(model, CompileOptions()).partitions[0]
    mod = lower_partition(model.main, part, LowerOptions(merge_siblings=merge))
    return len(compile_relax_full(mod, target="opencl").program.launches)


@pytest.mark.parametrize("name", list(CASES))
def test_sibling_merge_saves_kernels(name: str) -> None:
    make, saved = CASES[name]
    data = make()
    assert _launches(data, False) - _launches(data, True) == saved


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_sibling_merge_matches_reference(name: str, precision: str, tmp_path) -> None:
    make, saved = CASES[name]
    data = make()
    compiled = compile_model(load_model(data), CompileOptions(precision=precision), warn=False)
    assert compiled.stats["sibling_merges"] == (1 if saved else 0)
    assert_matches_reference(data, precision, tmp_path, RNG)


def test_stacked_weights_are_a_recipe_of_the_model() -> None:
    """The stacked weights are no array in the compiled model but a recipe of the siblings'
    weight tensors at their offsets (`MergedTensor`), which rebuilds the compiled constant bit
    for bit; the biases, a few floats, are stored."""
    from litekiln.compiler.sibling_merge import find_sibling_merges

    model = load_model(_inception())
    compiled = compile_model(model, CompileOptions(), warn=False)
    merges = [r.merge for r in compiled.weights.values() if r.merge is not None]
    assert len(merges) == 1
    part = plan_partitions(model, CompileOptions()).partitions[0]
    (m,) = find_sibling_merges(model.main, part)
    assert merges[0] == m.weights
    stacked = m.weights.build(model.main)
    convs = [model.main.ops[i] for i in m.ops]
    want = np.concatenate([model.main.tensors[op.inputs[1]].data for op in convs])
    np.testing.assert_array_equal(stacked, want)
    assert m.offsets == (0, 4, 10) and m.channels == 12


def test_quantized_siblings_stay_apart() -> None:
    """An int8 model's convolutions keep their own output grids: not merged."""
    from litekiln.compiler.sibling_merge import find_sibling_merges

    b = ModelBuilder()
    s = [1, 6, 5, C]
    q = (0.05, 0)
    x = b.input("x", s, dtype="int8", quant=q)
    bias = b.const("b", np.zeros(C, np.int32), quant=(0.0005, 0))
    outs = []
    for i in range(2):
        w = b.const(f"w{i}", RNG.integers(-100, 100, (C, 1, 1, C)).astype(np.int8), quant=(0.01, 0))
        options = {"padding": "VALID", "stride_w": 1, "stride_h": 1}
        outs.append(b.op("CONV_2D", [x, w, bias], out_shape=s, options=options, out_quant=q))
    b.output(*outs)
    model = load_model(b.build())
    part = plan_partitions(model, CompileOptions()).partitions[0]
    assert not find_sibling_merges(model.main, part)


def test_stacked_fully_connected_weights_are_a_recipe_of_the_model() -> None:
    """A transformer's query, key and value weights ([out, in]) stacked by a 2-D recipe that
    survives JSON and rebuilds the compiled constant bit for bit."""
    from litekiln.artifact.weights import MergedTensor, WeightRecipe

    model = load_model(_attention_qkv())
    compiled = compile_model(model, CompileOptions(), warn=False)
    ((name, recipe),) = [(n, r) for n, r in compiled.weights.items() if r.merge is not None]
    assert recipe.merge.shape == (192, 64) and len(recipe.merge.tensors) == 3
    again = WeightRecipe.from_json(recipe.to_json())
    assert again == recipe
    rebuilt = again.rebuild(model.main)
    const = compiled.constants[name]
    assert rebuilt.dtype == const.dtype and np.array_equal(
        rebuilt.view(np.uint8), const.view(np.uint8)
    )
    with pytest.raises(ValueError, match="malformed"):  # a diagonal needs a 4-D array
        MergedTensor.from_json({"shape": [4, 4], "parts": [["diagonal", [1.0], 0, 0]]})


def test_compile_says_how_many_groups_it_merged(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`litekiln compile` counts the merged groups: in its summary line and in ``--json``."""
    import json

    from litekiln.cli.main import main

    model = tmp_path / "inception.tflite"
    model.write_bytes(_inception())
    args = ["compile", str(model), "--cache-dir", str(tmp_path / "c"), "--schedules", "fast-cpu"]
    assert main([*args, "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert (
        "1 group of sibling layers (one input, the same window and options) compiled as one layer"
        in out
    ), out
    assert main([*args, "--json", "--force", "--jobs", "1"]) == 0
    (info,) = json.loads(capsys.readouterr().out)
    assert info["sibling_merges"] == 1 and info["merged_convolutions"] == 0
