"""A norm before a one-row product runs inside the product's kernel (a decoder's decode step).

Language models normalise the residual stream before each of their matrix-vector products
(the attention's query/key/value product, the MLP's gate and up products). The compiler
merges such a norm (`fusion._Fuser._norm_into_product`) into the product's kernel, which
sums the row's statistics itself and normalises each term as it reads it
(`schedules.NormedRowReduction` on GPUs; one work-item per output on CPUs): the norm's
launch is gone. Each case is checked against float64 numpy on OpenCL (PoCL) under both
schedule profiles and both precisions, and its kernels counted: one where the norm's only
readers are one-row products, two where something else reads the norm too (the norm stays
for it), and the norm apart where the product has several rows (a prefill's tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from gpu_helper import Case, G, build_model, launched_kernels, planned, run_uncached
from tflite_builder import TensorRef

from litekiln.check import relative_error

NONE = {"fused_activation_function": "NONE"}
EPS = 1e-6

#: case id -> what its numpy oracle needs (set when the case is built)
_PARAMS: dict[str, dict[str, Any]] = {}


def _rms(g: G, x: TensorRef, shape: list[int]) -> TensorRef:
    """litert-torch's RMS norm: x * rsqrt(mean(x * x) + eps) * w."""
    stat = [*shape[:-1], 1]
    ms = g.op("MEAN", [g.op("MUL", [x, x], shape, NONE), g.ints([-1])], stat, {"keep_dims": True})
    ms = g.op("ADD", [ms, g.w(np.array(EPS, np.float32))], stat, NONE)
    w = g.rng.uniform(0.5, 1.5, shape[-1]).astype(np.float32)
    _PARAMS[g.prefix]["gamma"] = w
    y = g.op("MUL", [x, g.op("RSQRT", [ms], stat)], shape, NONE)
    return g.op("MUL", [y, g.w(w)], shape, NONE)


def _layer_norm(g: G, x: TensorRef, shape: list[int]) -> TensorRef:
    """PyTorch's layer norm as litert-torch writes it: (x - mean) * rstd * gamma + beta."""
    stat = [*shape[:-1], 1]
    axis = g.ints([-1])
    mean = g.op("MEAN", [x, axis], stat, {"keep_dims": True})
    var = g.op("MEAN", [g.op("SQUARED_DIFFERENCE", [x, mean], shape), axis], stat,
               {"keep_dims": True})  # fmt: skip
    rstd = g.op("RSQRT", [g.op("ADD", [var, g.w(np.float32([EPS]))], stat, NONE)], stat)
    gamma = g.rng.uniform(0.5, 1.5, shape[-1]).astype(np.float32)
    beta = g.rng.uniform(-1.0, 1.0, shape[-1]).astype(np.float32)
    _PARAMS[g.prefix].update(gamma=gamma, beta=beta, mean=True)
    y = g.op("MUL", [g.op("SUB", [x, mean], shape, NONE), rstd], shape, NONE)
    return g.op("ADD", [g.op("MUL", [y, g.w(gamma)], shape, NONE), g.w(beta)], shape, NONE)


def _fc(g: G, x: TensorRef, rows: int, n_in: int, n_out: int, name: str) -> TensorRef:
    w = g.rng.uniform(-1.0, 1.0, (n_out, n_in)).astype(np.float32)
    b = g.rng.uniform(-1.0, 1.0, n_out).astype(np.float32)
    _PARAMS[g.prefix][name] = (w, b)
    return g.op("FULLY_CONNECTED", [x, g.w(w), g.w(b)], [rows, n_out], NONE)


def normed_product(
    n_in: int, n_out: int, *, rows: int = 1, layer_norm: bool = False, products: int = 1,
    residual: bool = False,
) -> Callable[[G], list[TensorRef]]:  # fmt: skip
    """x [1, rows, n_in] -> norm -> ``products`` FULLY_CONNECTEDs (n_in -> n_out, bias);
    ``residual``: the norm's output is a graph output too (another reader)."""

    def build(g: G) -> list[TensorRef]:
        _PARAMS[g.prefix] = {"rows": rows}
        shape = [1, rows, n_in]
        x = g.x(shape, low=-3.0, high=3.0)
        y = (_layer_norm if layer_norm else _rms)(g, x, shape)
        outs = [_fc(g, y, rows, n_in, n_out, f"fc{i}") for i in range(products)]
        return [*outs, y] if residual else outs

    return build


#: (case, kernels it launches under either profile)
CASES: list[tuple[Case, int]] = [
    (Case("rms_128x96", normed_product(128, 96)), 1),
    (Case("rms_640x256", normed_product(640, 256)), 1),  # Gemma 3 270M's width
    (Case("rms_2048x64", normed_product(2048, 64)), 1),
    (Case("ln_128x96", normed_product(128, 96, layer_norm=True)), 1),
    (Case("rms_gate_and_up", normed_product(256, 128, products=2)), 2),
    (Case("rms_read_elsewhere", normed_product(256, 128, residual=True)), 2),
    (Case("rms_rows4", normed_product(128, 96, rows=4)), 2),
]


def _oracle(case: str, x: np.ndarray) -> list[np.ndarray]:
    """The case's outputs in float64."""
    p = _PARAMS[case]
    x = x.astype(np.float64).reshape(p["rows"], -1)
    eps = np.float64(np.float32(EPS))
    if p.get("mean"):
        c = x - x.mean(axis=-1, keepdims=True)
        y = c / np.sqrt((c * c).mean(axis=-1, keepdims=True) + eps) * p["gamma"] + p["beta"]
    else:
        y = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * p["gamma"]
    outs = [y @ p[f"fc{i}"][0].T.astype(np.float64) + p[f"fc{i}"][1]
            for i in range(sum(1 for name in p if name.startswith("fc")))]  # fmt: skip
    return [*outs, y[None]] if case == "rms_read_elsewhere" else outs


_BUILT: dict[str, Any] = {}


def _built() -> Any:
    if "model" not in _BUILT:
        _BUILT["model"] = build_model([c for c, _ in CASES])
    return _BUILT["model"]


@pytest.mark.parametrize("schedules", ["fast", "fast-cpu"])
def test_the_norm_runs_in_the_product(schedules: str) -> None:
    """Each case's kernels, one model of them all: the norm merged where its readers are
    one-row products only."""
    kernels = launched_kernels(_built().model, schedules)
    assert len(kernels) == sum(n for _, n in CASES), kernels
    fused = [k for k in kernels if "layer_norm" in k and "matmul" in k]
    # one-row products with their norm: 128x96, 640x256, 2048x64, the layer norm, gate and
    # up, and the product whose norm another reader keeps
    assert len(fused) == 7, kernels
    alone = [k for k in kernels if "layer_norm" in k and "matmul" not in k]
    assert len(alone) == 2, kernels  # the residual's norm, the four-row product's


@pytest.mark.parametrize("schedules", ["fast", "fast-cpu"])
def test_rule(schedules: str) -> None:
    """`NormedRowReduction` schedules the merged function under both profiles."""
    from test_schedules import rules_used

    from litekiln.compiler.lower import lower_partition

    model, plan = planned(normed_product(640, 256))
    mod = lower_partition(model.main, plan.partitions[0])
    rules = rules_used(mod, "gpu" if schedules == "fast" else "cpu", neighbours=True)
    assert list(rules.values()) == ["NormedRowReduction"], rules


@pytest.mark.opencl
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("schedules", ["fast", "fast-cpu"])
def test_normed_products_match_numpy(schedules: str, precision: str) -> None:
    built = _built()
    outs = run_uncached(built.model, built.feeds, schedules, precision)
    tol = 1e-4 if precision == "fp32" else 1e-2
    bad = []
    for k, (case, _) in enumerate(CASES):
        positions, _, _ = built.where[case.id]
        got = [outs[p] for p in positions]
        want = _oracle(case.id, built.feeds[k])
        err = relative_error(got, [w.reshape(g.shape) for g, w in zip(got, want, strict=True)])
        if not err <= tol:
            bad.append(f"{case.id}: {err:.2e}")
    assert not bad, bad


@pytest.mark.opencl
def test_every_tuning_option_matches_numpy() -> None:
    """The GPU profile's variants of a merged norm and product (64 and 128 lanes an output,
    beside the default 32) compute the same outputs."""
    import litekiln

    cases = [Case("t640", normed_product(640, 64)), Case("t2048", normed_product(2048, 32,
             layer_norm=True))]  # fmt: skip
    built = build_model(cases)
    it = litekiln.Interpreter(
        model_content=built.model, use_cache=False, schedules="fast", tune=False
    )
    it.allocate_tensors()
    ex = it._backend.executors[0]  # noqa: SLF001 - the test drives the executor's options
    variants = [v for v in ex.program.variants if "layer_norm" in v.func]
    assert len(variants) == 2 and all(len(v.options) >= 2 for v in variants), variants
    for i, v in enumerate(ex.program.variants):
        for c in range(len(v.options) + 1):
            choices = [0] * len(ex.program.variants)
            choices[i] = c
            ex.select(choices)
            outs = it.run(built.feeds)
            for k, case in enumerate(cases):
                err = relative_error([outs[k]], _oracle(case.id, built.feeds[k]))
                assert err <= 1e-4, f"{v.func} option {c}: {case.id} {err:.2e}"
