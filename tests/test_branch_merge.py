"""Parallel convolutions of one map, summed, compiled as one convolution
(litekiln/compiler/branch_merge.py): each case against the numpy reference in fp32 and fp16,
with the number of kernels it must come to, and the cases that must stay apart kept apart.

The shapes are those litert-torch writes for timm's re-parameterisable blocks before
``reparameterize()``: MobileOne's depthwise stage (three 3x3 branches through one PAD, a 1x1
branch of the unpadded map, a batch norm of the map as SUB/MUL/MUL/ADD), its stride-2 form,
RepVGG's 3x3 + 1x1 + batch norm with SAME padding, and a tree with a residual from elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

pytest.importorskip("tvm")

from gpu_helper import assert_matches_reference  # noqa: E402

import litekiln  # noqa: E402
from litekiln.artifact.compiled import CompileOptions  # noqa: E402
from litekiln.compiler.driver import compile_model, plan_partitions  # noqa: E402
from litekiln.model import load_model  # noqa: E402
from tests.tflite_builder import ModelBuilder  # noqa: E402

RNG = np.random.default_rng(5)
C = 8


def _w(*shape: int) -> np.ndarray:
    return RNG.uniform(-1, 1, shape).astype(np.float32)


def _conv(b, x, shape, *, k=1, cin=C, stride=1, padding="VALID", act="NONE"):
    w, bias = b.const("w", _w(shape[3], k, k, cin)), b.const("b", _w(shape[3]))
    options = {"padding": padding, "stride_w": stride, "stride_h": stride}
    options["fused_activation_function"] = act
    return b.op("CONV_2D", [x, w, bias], out_shape=shape, options=options)


def _dw(b, x, shape, *, k=3, stride=1, padding="VALID", act="NONE", dilation=1):
    w, bias = b.const("dw", _w(1, k, k, C)), b.const("db", _w(C))
    options = {"padding": padding, "stride_w": stride, "stride_h": stride, "depth_multiplier": 1}
    options["fused_activation_function"] = act
    options["dilation_w_factor"] = options["dilation_h_factor"] = dilation
    return b.op("DEPTHWISE_CONV_2D", [x, w, bias], out_shape=shape, options=options)


def _pad(b, x, shape, p=1):
    pads = b.const("pads", np.asarray([[0, 0], [p, p], [p, p], [0, 0]], np.int32))
    return b.op("PAD", [x, pads], out_shape=[1, shape[1] + 2 * p, shape[2] + 2 * p, shape[3]])


def _batch_norm(b, x, shape):
    """timm's identity branch as litert-torch writes it: (x - mean) * rstd * gamma + beta."""
    y = x
    for name in ("SUB", "MUL", "MUL", "ADD"):
        c = b.const(name.lower(), RNG.uniform(0.5, 1.5, (1, 1, 1, C)).astype(np.float32))
        y = b.op(name, [y, c], out_shape=shape)
    return y


def _add(b, x, y, shape, act="NONE"):
    return b.op("ADD", [x, y], out_shape=shape, options={"fused_activation_function": act})


def _sum(b, terms, shape, act="NONE"):
    y = terms[0]
    for i, t in enumerate(terms[1:], 1):
        y = _add(b, y, t, shape, act if i == len(terms) - 1 else "NONE")
    return y


def _mobileone_depthwise() -> bytes:
    b = ModelBuilder()
    s = [1, 7, 6, C]
    x = b.input("x", s)
    p = _pad(b, x, s)
    threes = [_dw(b, p, s) for _ in range(3)]
    b.output(_sum(b, [_dw(b, x, s, k=1), *threes, _batch_norm(b, x, s)], s, "RELU"))
    return b.build()


def _mobileone_strided() -> bytes:
    b = ModelBuilder()
    x = b.input("x", [1, 8, 8, C])
    s = [1, 4, 4, C]
    p = _pad(b, x, [1, 8, 8, C])
    b.output(_sum(b, [_dw(b, x, s, k=1, stride=2), _dw(b, p, s, stride=2)], s, "RELU"))
    return b.build()


def _depth_multiplier() -> bytes:
    # FastViT's stem: a 1x1 and a 3x3 depthwise convolution with two outputs per channel.
    b = ModelBuilder()
    x = b.input("x", [1, 6, 5, C])
    s = [1, 6, 5, 2 * C]
    terms = []
    for k, padding in ((1, "VALID"), (3, "SAME")):
        w, bias = b.const("dw", _w(1, k, k, 2 * C)), b.const("db", _w(2 * C))
        options = {"padding": padding, "stride_w": 1, "stride_h": 1, "depth_multiplier": 2}
        terms.append(b.op("DEPTHWISE_CONV_2D", [x, w, bias], out_shape=s, options=options))
    b.output(_add(b, *terms, s))
    return b.build()


def _repvgg() -> bytes:
    b = ModelBuilder()
    s = [1, 6, 5, C]
    x = b.input("x", s)
    three = _conv(b, x, s, k=3, padding="SAME")
    one = _conv(b, x, s, padding="SAME")
    b.output(_sum(b, [three, one, _batch_norm(b, x, s)], s, "RELU6"))
    return b.build()


def _repvgg_strided_odd() -> bytes:
    # SAME padding of a stride-2 3x3 on an odd map (the odd cell after) and a 1x1 beside it.
    b = ModelBuilder()
    x = b.input("x", [1, 7, 9, C])
    s = [1, 4, 5, 6]
    b.output(_sum(b, [_conv(b, x, s, k=3, stride=2, padding="SAME"), _conv(b, x, s, stride=2)], s))
    return b.build()


def _with_residual() -> bytes:
    # ((conv3(x) + conv1(x)) + r): r is no branch of x; it is added to the merged result.
    b = ModelBuilder()
    s = [1, 6, 5, C]
    x = b.input("x", s)
    r = b.input("r", s)
    tree = _add(b, _add(b, _conv(b, x, s, k=3, padding="SAME"), r, s), _conv(b, x, s), s)
    b.output(tree)
    return b.build()


def _activated_branch() -> bytes:
    # A branch with its own activation is not linear: nothing merges.
    b = ModelBuilder()
    s = [1, 6, 5, C]
    x = b.input("x", s)
    b.output(_add(b, _conv(b, x, s, k=3, padding="SAME", act="RELU"), _conv(b, x, s), s))
    return b.build()


def _branch_also_read() -> bytes:
    # A branch read by something else too (here: it leaves the model) must be computed.
    b = ModelBuilder()
    s = [1, 6, 5, C]
    x = b.input("x", s)
    three = _conv(b, x, s, k=3, padding="SAME")
    b.output(_add(b, three, _conv(b, x, s), s), three)
    return b.build()


def _dilated() -> bytes:
    # A dilated branch does not line up with a plain one: nothing merges.
    b = ModelBuilder()
    s = [1, 7, 7, C]
    x = b.input("x", s)
    b.output(_add(b, _dw(b, x, s, padding="SAME", dilation=2), _dw(b, x, s, padding="SAME"), s))
    return b.build()


def _residual_only() -> bytes:
    # x + conv(x): the map itself and one branch; the epilogue reads x already, kept as is.
    b = ModelBuilder()
    s = [1, 6, 5, C]
    x = b.input("x", s)
    b.output(_add(b, _conv(b, x, s, k=3, padding="SAME"), x, s, "RELU"))
    return b.build()


#: name -> (model, kernels it must compile to (None: unchanged), how many convolutions it has)
CASES: dict[str, tuple[Callable[[], bytes], int]] = {
    "mobileone_depthwise": (_mobileone_depthwise, 1),
    "mobileone_strided": (_mobileone_strided, 1),
    "depth_multiplier": (_depth_multiplier, 1),
    "repvgg": (_repvgg, 1),
    "repvgg_strided_odd": (_repvgg_strided_odd, 1),
    "with_residual": (_with_residual, 1),
    "activated_branch": (_activated_branch, 2),
    "branch_also_read": (_branch_also_read, 2),
    "dilated": (_dilated, 2),
    "residual_only": (_residual_only, 1),
}


def _run(data: bytes, xs: list[np.ndarray], **kw) -> list[np.ndarray]:
    it = litekiln.Interpreter(model_content=data, **kw)
    return it.run(xs)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_branch_merge(name: str, precision: str, tmp_path) -> None:
    make, kernels = CASES[name]
    data = make()
    model = load_model(data)
    compiled = compile_model(model, CompileOptions(precision=precision), warn=False)
    program = compiled.partitions[0].program
    launches = [launch.func for launch in program.launches]
    assert len(launches) == kernels, launches
    assert_matches_reference(data, precision, tmp_path, RNG)


def test_without_the_merge_each_branch_is_a_kernel() -> None:
    """The option's fallback (`LowerOptions.unfused`) lowers the branches one by one: the
    kernel counts above are the merge's doing."""
    from litekiln.compiler.codegen import compile_relax_full
    from litekiln.compiler.lower import LowerOptions, lower_partition

    model = load_model(_mobileone_depthwise())
    part = plan_partitions(model, CompileOptions()).partitions[0]
    merged = lower_partition(model.main, part, LowerOptions())
    apart = lower_partition(model.main, part, LowerOptions(merge_branches=False))
    n_merged = len(compile_relax_full(merged, target="opencl").program.launches)
    n_apart = len(compile_relax_full(apart, target="opencl").program.launches)
    assert n_merged == 1 and n_apart >= 3, (n_merged, n_apart)


def test_quantized_branches_keep_their_grids() -> None:
    """An int8 model's branches are not merged: each op's output is fake-quantized on its own
    grid, which a sum of weights would skip."""
    from litekiln.compiler.branch_merge import find_branch_merges
    from litekiln.compiler.lowering import Lowering, LowerOptions

    b = ModelBuilder()
    s = [1, 6, 5, C]
    q = (0.05, 0)
    x = b.input("x", s, dtype="int8", quant=q)
    w = [b.const(f"w{i}", RNG.integers(-100, 100, (C, k, k, C)).astype(np.int8), quant=(0.01, 0))
         for i, k in enumerate((3, 1))]  # fmt: skip
    bias = b.const("b", np.zeros(C, np.int32), quant=(0.0005, 0))
    convs = [
        b.op(
            "CONV_2D",
            [x, wi, bias],
            out_shape=s,
            options={"padding": "SAME", "stride_w": 1, "stride_h": 1},
            out_quant=q,
        )
        for wi in w
    ]
    b.output(b.op("ADD", convs, out_shape=s, out_quant=q))
    model = load_model(b.build())
    part = plan_partitions(model, CompileOptions()).partitions[0]
    lw = Lowering(model.main, part, LowerOptions())
    assert not lw.branch_merges
    assert not find_branch_merges(model.main, part, lw.readers, lw.pad_folds)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_merged_weights_are_rebuilt_from_the_model(
    precision: str, tmp_path, compiles: list[str]
) -> None:
    """The merged weights are no array in the cache but a recipe (`MergedTensor`): the
    model's branch weights summed again at load, bit for bit the compiled constant, through
    JSON; a warm start from the cache runs on them without compiling."""
    from litekiln.artifact.weights import WeightRecipe

    data = _mobileone_depthwise()
    model = load_model(data)
    compiled = compile_model(model, CompileOptions(precision=precision), warn=False)
    merged = {n: r for n, r in compiled.weights.items() if r.merge is not None}
    assert len(merged) == 1, compiled.weights
    assert compiled.stats["merged_convolutions"] == 1
    ((name, recipe),) = merged.items()
    assert len(recipe.merge.tensors) == 4  # the 1x1 and the three 3x3 depthwise weights
    again = WeightRecipe.from_json(recipe.to_json())
    assert again == recipe
    rebuilt = again.rebuild(model.main)
    const = compiled.constants[name]
    assert rebuilt.dtype == const.dtype and np.array_equal(
        rebuilt.view(np.uint8), const.view(np.uint8)
    )

    xs = [RNG.uniform(-1, 1, (1, 7, 6, C)).astype(np.float32)]
    want = _run(data, xs, device="reference")
    first = litekiln.Interpreter(model_content=data, precision=precision, cache_dir=tmp_path)
    got = first.run(xs)
    warm = litekiln.Interpreter(model_content=data, precision=precision, cache_dir=tmp_path)
    warm_got = warm.run(xs)
    assert len(compiles) == 1  # the first start only
    tol = 1e-5 if precision == "fp32" else 1e-2
    for out in (got, warm_got):
        np.testing.assert_allclose(out[0], want[0], atol=tol * float(np.abs(want[0]).max()), rtol=0)


def test_a_merged_recipe_refuses_other_weights() -> None:
    """A model whose branch weight has another shape than the recipe recorded is refused
    (`WeightMismatch`): the cache then compiles again rather than sum the wrong tensors."""
    from litekiln.artifact.weights import WeightMismatch

    model = load_model(_mobileone_depthwise())
    compiled = compile_model(model, CompileOptions(), warn=False)
    recipe = next(r for r in compiled.weights.values() if r.merge is not None)
    t = recipe.merge.tensors[0]
    tensor = model.main.tensors[t]
    model.main.tensors[t] = type(tensor)(
        t, tensor.name, (1, 2, 2, C), tensor.dtype, data=np.zeros((1, 2, 2, C), np.float32)
    )
    with pytest.raises(WeightMismatch, match=f"tensor {t}"):
        recipe.rebuild(model.main)


@pytest.mark.opencl
def test_a_cache_stripped_of_binaries_keeps_the_shared_constants(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A merged convolution's summed bias (no recipe: a sum of biases and affine shifts) of
    4 KB or more is a constant the cache shares (`SHARED_MIN_BYTES`). Stripping a cache of its
    device binaries (the remote kit, `bench --startup`'s shipped case) must keep it: it
    dropped every shared constant, and each entry that shared one became a miss."""
    import shutil

    from litekiln import loading
    from litekiln.bench import _strip_binaries
    from litekiln.cache.store import CacheStore

    n = 1024
    b = ModelBuilder()
    s = [1, 2, 2, n]
    x = b.input("x", s)
    convs = []
    for k in (1, 3):
        w, bias = b.const("dw", _w(1, k, k, n)), b.const("db", _w(n))
        options = {"padding": "SAME", "stride_w": 1, "stride_h": 1, "depth_multiplier": 1}
        convs.append(b.op("DEPTHWISE_CONV_2D", [x, w, bias], out_shape=s, options=options))
    b.output(_add(b, *convs, s))
    data = b.build()
    xs = [RNG.uniform(-1, 1, s).astype(np.float32)]
    first = _run(data, xs, cache_dir=tmp_path / "c")
    shutil.copytree(tmp_path / "c", tmp_path / "kit")
    _strip_binaries(str(tmp_path / "kit"))
    with CacheStore.open(tmp_path / "kit") as store:
        assert sorted(r.kind for r in store.ls()) == ["model", "weights"]

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled again: the stripped cache missed")

    monkeypatch.setattr(loading, "compile_for", no_compile)
    again = _run(data, xs, cache_dir=tmp_path / "kit")
    np.testing.assert_array_equal(again[0], first[0])


def test_other_branch_weights_under_a_users_token_are_detected(
    tmp_path, monkeypatch: pytest.MonkeyPatch, compiles: list[str]
) -> None:
    """A token the user gives says nothing about the bytes: the weights digest then covers
    every tensor a merged recipe sums, so a model whose branch weights changed under the same
    token is compiled again, never run with the entry's sums."""
    import sys

    from litekiln.cache import CacheWarning

    models = []
    for seed in (1, 2):  # the same graph, other weights
        monkeypatch.setattr(sys.modules[__name__], "RNG", np.random.default_rng(seed))
        models.append(_mobileone_depthwise())
    assert models[0] != models[1]
    xs = [np.random.default_rng(3).uniform(-1, 1, (1, 7, 6, C)).astype(np.float32)]
    for k, data in enumerate(models):
        it = litekiln.Interpreter(model_content=data, model_token="mine", cache_dir=tmp_path)
        if k:
            with pytest.warns(CacheWarning, match="weights"):
                got = it.run(xs)[0]
        else:
            got = it.run(xs)[0]
        want = _run(data, xs, device="reference")[0]
        np.testing.assert_allclose(got, want, atol=1e-5 * float(np.abs(want).max()), rtol=0)
    assert len(compiles) == 2
