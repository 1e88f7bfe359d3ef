"""Layer norms written as basic ops become one kernel each (compiler/layer_norm.py).

The forms models write (litert-torch's ``(x - mean) * rstd * gamma + beta``, with the
variance as SQUARED_DIFFERENCE or SUB then MUL; mobilevit's MEAN over ``[0, 2]`` without
``keep_dims`` and RESHAPEs of the statistics; Keras' ``x * (gamma * rstd) + (beta - mean *
gamma * rstd)``; the language models' RMS norm, ``x * rsqrt(mean(x * x) + eps) * w``) are
found in the partition and lowered as one call; each must be ONE
kernel (`Launch.func` ``layer_norm*``) under the GPU schedules (``fast``:
`schedules.RowNormalization`) and the CPU ones (``fast-cpu``: `schedules.SerialRows`), and
equal a float64 numpy layer norm within ``1e-4 * max(1, max|ref|)`` (fp32; 1e-2 under fp16)
on PoCL. What is not a layer norm, or one whose statistics are read elsewhere, stays op by
op; a fused layer norm that fails to lower or build falls back to the op-by-op form, with a
warning.
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

from litekiln.artifact.compiled import CompileOptions
from litekiln.check import relative_error
from litekiln.model import load_model

NONE = {"fused_activation_function": "NONE"}


# (the small models' variants, past their entries' bound: `keep_variants`)
pytestmark = pytest.mark.usefixtures("keep_variants")


EPS = 1e-5
#: case id -> (gamma, beta) of the cases with affine terms (set when the case is built)
AFFINE: dict[str, tuple[np.ndarray, np.ndarray]] = {}


def _affine(g: G, n: int) -> tuple[TensorRef, TensorRef]:
    gamma = g.rng.uniform(0.5, 1.5, n).astype(np.float32)
    beta = g.rng.uniform(-1.0, 1.0, n).astype(np.float32)
    AFFINE[g.prefix] = (gamma, beta)
    return g.w(gamma), g.w(beta)


def _stats(g: G, x: TensorRef, shape: list[int], sqdiff: bool) -> tuple[TensorRef, TensorRef]:
    """mean and rstd = rsqrt(mean((x - mean)^2) + eps), keep_dims."""
    stat = [*shape[:-1], 1]
    axis = g.ints([-1])
    mean = g.op("MEAN", [x, axis], stat, {"keep_dims": True})
    if sqdiff:
        sq = g.op("SQUARED_DIFFERENCE", [x, mean], shape)
    else:
        d = g.op("SUB", [x, mean], shape, NONE)
        sq = g.op("MUL", [d, d], shape, NONE)
    var = g.op("MEAN", [sq, axis], stat, {"keep_dims": True})
    rstd = g.op("RSQRT", [g.op("ADD", [var, g.w(np.float32([EPS]))], stat, NONE)], stat)
    return mean, rstd


def torch_ln(
    shape: Sequence[int], affine: bool = True, sqdiff: bool = True, low: float = -3.0,
    high: float = 5.0,
) -> Callable[[G], TensorRef]:  # fmt: skip
    """litert-torch's form: (x - mean) * rstd (* gamma + beta)."""

    def build(g: G) -> TensorRef:
        s = list(shape)
        x = g.x(s, low=low, high=high)
        mean, rstd = _stats(g, x, s, sqdiff)
        y = g.op("MUL", [g.op("SUB", [x, mean], s, NONE), rstd], s, NONE)
        if affine:
            gamma, beta = _affine(g, s[-1])
            y = g.op("ADD", [g.op("MUL", [y, gamma], s, NONE), beta], s, NONE)
        return y

    return build


def keras_ln(shape: Sequence[int]) -> Callable[[G], TensorRef]:
    """Keras' form: x * (gamma * rstd) + (beta - mean * (gamma * rstd))."""

    def build(g: G) -> TensorRef:
        s = list(shape)
        x = g.x(s, low=-2.0, high=2.0)
        mean, rstd = _stats(g, x, s, True)
        gamma, beta = _affine(g, s[-1])
        scale = g.op("MUL", [rstd, gamma], s, NONE)
        shift = g.op("SUB", [beta, g.op("MUL", [mean, scale], s, NONE)], s, NONE)
        return g.op("ADD", [g.op("MUL", [x, scale], s, NONE), shift], s, NONE)

    return build


def mobilevit_ln(rows: int, n: int) -> Callable[[G], TensorRef]:
    """timm_mobilevit_xxs's form: MEAN over axes [0, 2] of [1, rows, n] without keep_dims,
    the row statistics reshaped to [1, rows, 1]; y = x * rstd + (0 - mean * rstd)."""

    def build(g: G) -> TensorRef:
        s, flat, col = [1, rows, n], [rows], [1, rows, 1]
        x = g.x(s, low=-3.0, high=3.0)
        axes = g.ints([0, 2])
        mean = g.op("MEAN", [x, axes], flat, {"keep_dims": False})
        sq = g.op("SQUARED_DIFFERENCE", [x, g.op("RESHAPE", [mean, g.ints(col)], col)], s)
        var = g.op("MEAN", [sq, axes], flat, {"keep_dims": False})
        rstd = g.op("RSQRT", [g.op("ADD", [var, g.w(np.array(EPS, np.float32))], flat, NONE)], flat)
        m_r = g.op("MUL", [rstd, mean], flat, NONE)
        shift = g.op("SUB", [g.w(np.array(0.0, np.float32)), m_r], flat, NONE)
        y = g.op("MUL", [x, g.op("RESHAPE", [rstd, g.ints(col)], col)], s, NONE)
        return g.op("ADD", [y, g.op("RESHAPE", [shift, g.ints(col)], col)], s, NONE)

    return build


#: case id -> the weight of the RMS norm cases (set when the case is built)
RMS: dict[str, np.ndarray] = {}


#: case id -> the slice of its input the case normalises (set when the case is built)
SLICED: dict[str, tuple[int, int]] = {}


def rms_norm(
    shape: Sequence[int], square: bool = False, keep: bool = False, of_slice: int = 0
) -> Callable[[G], TensorRef]:
    """litert-torch's ``odml.rms_norm`` decomposition (the LLMs' RMSNorm): x * x (or SQUARE),
    MEAN over the last axis (without keep_dims, then a RESHAPE of the row statistic), + eps,
    RSQRT, x * it, * the weight. ``of_slice``: of a slice of a wider input (its last axis
    that much longer, the slice from offset ``of_slice // 2``): a query norm reading its
    slice of a merged query/key/value product."""

    def build(g: G) -> TensorRef:
        s = list(shape)
        if not of_slice:
            x = g.x(s, low=-3.0, high=3.0)
        else:
            wide = g.x([*s[:-1], s[-1] + of_slice], low=-3.0, high=3.0)
            begin = [0] * (len(s) - 1) + [of_slice // 2]
            x = g.op("SLICE", [wide, g.ints(begin), g.ints(s)], s)
            SLICED[g.prefix] = (of_slice // 2, of_slice // 2 + s[-1])
        sq = g.op("SQUARE", [x], s) if square else g.op("MUL", [x, x], s, NONE)
        stat = [*s[:-1], 1]
        ms = g.op("MEAN", [sq, g.ints([-1])], stat if keep else s[:-1], {"keep_dims": keep})
        ms = g.op("ADD", [ms, g.w(np.array(EPS, np.float32))], stat if keep else s[:-1], NONE)
        if not keep:
            ms = g.op("RESHAPE", [ms, g.ints(stat)], stat)
        w = g.rng.uniform(0.5, 1.5, s[-1]).astype(np.float32)
        RMS[g.prefix] = w
        y = g.op("MUL", [x, g.op("RSQRT", [ms], stat)], s, NONE)
        return g.op("MUL", [y, g.w(w)], s, NONE)

    return build


CASES = [
    Case("n1", torch_ln([4, 1])),
    Case("n2", torch_ln([3, 2], affine=False)),
    Case("n16", torch_ln([1, 16])),
    Case("n80_sub_mul", torch_ln([1, 256, 80], sqdiff=False)),
    Case("n144", torch_ln([2, 64, 144], affine=False)),
    Case("n192_rows197", torch_ln([197, 192])),
    Case("n240", torch_ln([1, 16, 240])),
    Case("n256_rows4096", torch_ln([4096, 256], affine=False)),
    Case("n1000", torch_ln([2, 1000])),
    Case("n1024_rows3x7", torch_ln([3, 7, 1024])),
    Case("one_row", torch_ln([64])),
    Case("offset", torch_ln([1, 50, 96], low=100.0, high=101.0)),
    Case("keras", keras_ln([3, 7, 80])),
    Case("mobilevit", mobilevit_ln(1024, 64)),
    Case("mobilevit_144", mobilevit_ln(256, 144)),
    Case("rms_n64", rms_norm([1, 8, 64])),
    Case("rms_n640_one_row", rms_norm([1, 1, 640])),
    Case("rms_square_keep", rms_norm([3, 5, 256], square=True, keep=True)),
    Case("rms_of_a_slice", rms_norm([1, 4, 64], of_slice=32)),
]


def _oracle(case: str, x: np.ndarray) -> np.ndarray:
    """The layer norm in float64 (eps as float32 holds it)."""
    x = x.astype(np.float64)
    if case in SLICED:
        x = x[..., SLICED[case][0] : SLICED[case][1]]
    if case in RMS:
        ms = (x * x).mean(axis=-1, keepdims=True)
        return x / np.sqrt(ms + np.float64(np.float32(EPS))) * RMS[case].astype(np.float64)
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    y = (x - mean) / np.sqrt(var + np.float64(np.float32(EPS)))
    if case in AFFINE:
        gamma, beta = AFFINE[case]
        y = y * gamma.astype(np.float64) + beta.astype(np.float64)
    return y


_BUILT: dict[str, Any] = {}


def _built() -> Any:
    if "model" not in _BUILT:
        _BUILT["model"] = build_model(CASES)
    return _BUILT["model"]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("schedules", ["fast", "fast-cpu"])
def test_one_kernel_per_layer_norm(schedules: str, precision: str) -> None:
    """Every case's layer norm is one launch, and nothing else is launched."""
    kernels = launched_kernels(_built().model, schedules, precision)
    assert len(kernels) == len(CASES), kernels
    assert all("layer_norm" in k for k in kernels), kernels


@pytest.mark.parametrize("schedules", ["fast", "fast-cpu"])
def test_rule_for_the_layer_norm(schedules: str) -> None:
    """`RowNormalization` schedules the fused function on GPUs, `SerialRows` on PoCL, an
    RMS norm's (one sum) as a layer norm's (two)."""
    expected = "RowNormalization" if schedules == "fast" else "SerialRows"
    # (one row of a layer norm too: its two sums are not a norm and a product,
    # `NormedRowReduction`'s)
    for build in (torch_ln([1, 256, 80]), rms_norm([1, 8, 640]), torch_ln([1, 1, 256])):
        rules = rules_of_first_partition(build, schedules)
        assert rules == [expected], rules


@pytest.mark.opencl
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("schedules", ["fast", "fast-cpu"])
def test_layer_norms_match_numpy(schedules: str, precision: str) -> None:
    """Each case's output against a float64 layer norm of its input, on OpenCL."""
    built = _built()
    outs = run_uncached(built.model, built.feeds, schedules, precision)
    tol = 1e-4 if precision == "fp32" else 1e-2
    bad = []
    for k, case in enumerate(CASES):
        (pos,), _, _ = built.where[case.id]
        err = relative_error([outs[pos]], [_oracle(case.id, built.feeds[k])])
        if not err <= tol:
            bad.append(f"{case.id}: {err:.2e}")
    assert not bad, bad


@pytest.mark.opencl
def test_every_tuning_option_of_a_layer_norm_matches_numpy() -> None:
    """The GPU profile's variants of the fused function (one work-item per row, 128 lanes
    per row) give the same layer norm as the default (32 lanes)."""
    import litekiln

    cases = [Case("v80", torch_ln([64, 80])), Case("v512", torch_ln([16, 512], affine=False))]
    built = build_model(cases)
    it = litekiln.Interpreter(
        model_content=built.model, use_cache=False, schedules="fast", tune=False
    )
    it.allocate_tensors()
    ex = it._backend.executors[0]  # noqa: SLF001 - the test drives the executor's options
    variants = ex.program.variants
    assert [len(v.options) for v in variants] == [1, 2], variants
    for i, v in enumerate(variants):
        for c in range(len(v.options) + 1):
            choices = [0] * len(variants)
            choices[i] = c
            ex.select(choices)
            outs = it.run(built.feeds)
            for k, case in enumerate(cases):
                err = relative_error([outs[k]], [_oracle(case.id, built.feeds[k])])
                assert err <= 1e-4, f"{v.func} option {c}: {case.id} {err:.2e}"


# -- what stays op by op ----------------------------------------------------------------------


def _found(build: Callable[[G], Any]) -> int:
    from litekiln.compiler.layer_norm import find_layer_norms

    model, plan = planned(build)
    return sum(len(find_layer_norms(model.main, p)) for p in plan.partitions)


def _mean_elsewhere(g: G) -> list[TensorRef]:
    """A layer norm whose mean is also a graph output: its statistics leave the group."""
    s = [4, 32]
    x = g.x(s)
    mean, rstd = _stats(g, x, s, True)
    y = g.op("MUL", [g.op("SUB", [x, mean], s, NONE), rstd], s, NONE)
    return [y, mean]


def _other_axis(g: G) -> TensorRef:
    """Means over the first axis: not a layer norm over the last."""
    s, stat = [8, 16], [1, 16]
    x = g.x(s)
    axis = g.ints([0])
    mean = g.op("MEAN", [x, axis], stat, {"keep_dims": True})
    sq = g.op("SQUARED_DIFFERENCE", [x, mean], s)
    var = g.op("MEAN", [sq, axis], stat, {"keep_dims": True})
    rstd = g.op("RSQRT", [g.op("ADD", [var, g.w(np.float32([EPS]))], stat, NONE)], stat)
    return g.op("MUL", [g.op("SUB", [x, mean], s, NONE), rstd], s, NONE)


def _other_input(g: G) -> TensorRef:
    """The variance of another tensor about x's mean."""
    s, stat = [4, 32], [4, 1]
    x, z = g.x(s), g.x(s)
    axis = g.ints([-1])
    mean = g.op("MEAN", [x, axis], stat, {"keep_dims": True})
    var = g.op("MEAN", [g.op("SQUARED_DIFFERENCE", [z, mean], s), axis], stat, {"keep_dims": True})
    rstd = g.op("RSQRT", [g.op("ADD", [var, g.w(np.float32([EPS]))], stat, NONE)], stat)
    return g.op("MUL", [g.op("SUB", [x, mean], s, NONE), rstd], s, NONE)


@pytest.mark.parametrize(
    "build, found",
    [
        (torch_ln([2, 16, 64]), 1),
        (keras_ln([5, 32]), 1),
        (mobilevit_ln(16, 64), 1),
        (_mean_elsewhere, 0),
        (_other_axis, 0),
        (_other_input, 0),
    ],
    ids=["torch", "keras", "mobilevit", "mean_elsewhere", "other_axis", "other_input"],
)
def test_what_is_a_layer_norm(build: Callable[[G], Any], found: int) -> None:
    assert _found(build) == found


def test_residual_after_the_norm_stays_out() -> None:
    """The norm's output feeds the next op and a residual ADD of x: the ADD is elementwise
    but would make two outputs leave the group, so the group stops at the norm."""

    def build(g: G) -> list[TensorRef]:
        s = [4, 32]
        x = g.x(s)
        mean, rstd = _stats(g, x, s, True)
        y = g.op("MUL", [g.op("SUB", [x, mean], s, NONE), rstd], s, NONE)
        return [y, g.op("ADD", [y, x], s, NONE)]

    from litekiln.compiler.layer_norm import find_layer_norms

    model, plan = planned(build)
    (ln,) = find_layer_norms(model.main, plan.partitions[0])
    assert model.main.ops[ln.last].name == "MUL"


# -- the fallback -----------------------------------------------------------------------------


def _fallback_kernels(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> tuple[list[str], str]:
    from litekiln.compiler.driver import compile_model

    model = load_model(build_model([Case("ln", torch_ln([2, 16, 64]))]).model)
    compiled = compile_model(model, CompileOptions(schedules="fast", tuning=False), warn=True)
    assert not compiled.cpu_reasons, compiled.cpu_reasons
    kernels = [la.func for p in compiled.partitions for la in p.program.launches]
    return kernels, capsys.readouterr().err


def test_layer_norm_that_fails_to_lower_goes_op_by_op(
    monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    from litekiln.compiler import layer_norm

    def fail(*_: Any, **__: Any) -> Any:
        raise RuntimeError("no such luck")

    monkeypatch.setattr(layer_norm.LayerNorm, "emit", fail)
    kernels, err = _fallback_kernels(monkeypatch, capsys)
    assert len(kernels) == 4 and not any("layer_norm" in k for k in kernels), kernels
    assert "lowering with fused patterns failed (RuntimeError: no such luck)" in err, err


def test_layer_norm_that_fails_to_build_goes_op_by_op(
    monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    from litekiln.compiler import codegen

    real = codegen.compile_relax_full

    def picky(mod: Any, **kw: Any) -> Any:
        if any("layer_norm" in gv.name_hint for gv in mod.get_global_vars()):
            raise RuntimeError("schedule refused")
        return real(mod, **kw)

    monkeypatch.setattr(codegen, "compile_relax_full", picky)
    kernels, err = _fallback_kernels(monkeypatch, capsys)
    assert len(kernels) == 4 and not any("layer_norm" in k for k in kernels), kernels
    assert "code generation with fused patterns failed (RuntimeError: schedule refused)" in err
