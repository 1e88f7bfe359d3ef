"""Recurrent steps become one kernel each (compiler/gated_step.py).

A cell written as TFLite ops -- a FULLY_CONNECTED of the previous output by the recurrent
weights, terms added at full width (a bias, a gathered row of a batched input product), the
sum cut into gates (SPLIT, STRIDED_SLICE), LOGISTIC/TANH/MUL/ADD/SUB of the gates and the
previous state -- must be ONE kernel (`Launch.func` ``gated_step``) under the GPU schedules
(``fast``: `schedules.GatedStepLanes`) and the CPU ones (``fast-cpu``:
`schedules.SerialGatedStep`), and equal a float64 numpy cell within ``1e-5 * max(1, max|ref|)``
(fp32; 1e-2 under fp16) on PoCL. A cell whose gate is read elsewhere stays op by op, and
still matches. Keras' LSTM and GRU layers (tests/test_while.py's models, unrolled at load)
take one kernel a step where op by op they took two, and still match LiteRT.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from gpu_helper import Case, G, build_model, launched_kernels, run_uncached
from tflite_builder import TensorRef

NONE = {"fused_activation_function": "NONE"}


# (the small models' variants, past their entries' bound: `keep_variants`)
pytestmark = pytest.mark.usefixtures("keep_variants")


K, M, ROWS = 24, 16, 3  # terms of the recurrent product, units, rows of the batched product


def _sig(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _split(g: G, x: TensorRef, parts: int, m: int) -> list[TensorRef]:
    outs = [g.b.tensor(f"{g.prefix}/gate{p}", [1, m], "float32") for p in range(parts)]
    g.b.op("SPLIT", [g.ints([1]), x], outputs=outs, options={"num_splits": parts})
    return outs


def _slice(g: G, x: TensorRef, p: int, m: int) -> TensorRef:
    return g.op(
        "STRIDED_SLICE",
        [x, g.ints([0, p * m]), g.ints([1, (p + 1) * m]), g.ints([1, 1])],
        [1, m],
        {"begin_mask": 0, "end_mask": 0, "shrink_axis_mask": 0},
    )


class _Weights:
    """A cell's constants, drawn once so that the numpy cell uses the same."""

    def __init__(self, seed: int, parts: int) -> None:
        rng = np.random.default_rng(seed)
        self.w = rng.uniform(-0.5, 0.5, (parts * M, K)).astype(np.float32)
        self.b = rng.uniform(-0.5, 0.5, parts * M).astype(np.float32)


LSTM = _Weights(1, 4)
GRU = _Weights(2, 3)


def _row(g: G, table: TensorRef, r: int, n: int, how: str) -> TensorRef:
    """Row ``r`` of ``table`` [ROWS, n] as [1, n]: a GATHER at a constant index (Keras'
    unrolled loops), or a STRIDED_SLICE and a RESHAPE (litert-torch's)."""
    if how == "gather":
        return g.op("GATHER", [table, g.ints([r])], [1, n], {"axis": 0})
    s = g.op("STRIDED_SLICE", [table, g.ints([r, 0]), g.ints([r + 1, n]), g.ints([1, 1])],
             [1, n], {"begin_mask": 0, "end_mask": 0, "shrink_axis_mask": 0})  # fmt: skip
    return g.op("RESHAPE", [s, g.ints([1, n])], [1, n])


def lstm_cell(*, row: str = "", gate_out: str = "") -> Callable[[G], list[TensorRef]]:
    """An LSTM cell (inputs: h [1, K], c [1, M], and with ``row`` a table [ROWS, 4M] whose
    row 1 is added to the gates, read as `_row` reads it); outputs c', h', and with
    ``gate_out`` the input gate as the product gives it (``"raw"``) or after its LOGISTIC
    (``"activated"``)."""

    def build(g: G) -> list[TensorRef]:
        h, c = g.x([1, K]), g.x([1, M])
        n = 4 * M
        s = g.op("FULLY_CONNECTED", [h, g.w(LSTM.w), g.w(LSTM.b)], [1, n], NONE)
        if row:
            s = g.op("ADD", [_row(g, g.x([ROWS, n]), 1, n, row), s], [1, n], NONE)
        raw, f, cand, o = _split(g, s, 4, M)
        i = g.op("LOGISTIC", [raw], [1, M])
        f = g.op("LOGISTIC", [f], [1, M])
        cand = g.op("TANH", [cand], [1, M])
        o = g.op("LOGISTIC", [o], [1, M])
        c2 = g.op("ADD", [g.op("MUL", [f, c], [1, M], NONE), g.op("MUL", [i, cand], [1, M], NONE)],
                  [1, M], NONE)  # fmt: skip
        h2 = g.op("MUL", [o, g.op("TANH", [c2], [1, M])], [1, M], NONE)
        return [c2, h2, {"raw": raw, "activated": i}[gate_out]] if gate_out else [c2, h2]

    return build


def lstm_ref(feeds: Sequence[np.ndarray], *, row: str = "", gate_out: str = "") -> list:
    h, c = (np.asarray(x, np.float64) for x in feeds[:2])
    s = h @ LSTM.w.T.astype(np.float64) + LSTM.b
    if row:
        s = s + np.asarray(feeds[2], np.float64)[1]
    i, f, cand, o = (s[:, p * M : (p + 1) * M] for p in range(4))
    c2 = _sig(f) * c + _sig(i) * np.tanh(cand)
    h2 = _sig(o) * np.tanh(c2)
    if gate_out:
        return [c2, h2, {"raw": i, "activated": _sig(i)}[gate_out]]
    return [c2, h2]


def gru_cell(row: str) -> Callable[[G], TensorRef]:
    """A GRU cell as Keras writes it (reset after the product): inputs h [1, K] (the
    product's operand), the previous output [1, M], a table [ROWS, 3M] whose row 2 (read as
    `_row` reads it) holds the input's terms, cut by a SPLIT (``gather``) or STRIDED_SLICEs
    (``slice``, litert-torch's form); output h'."""

    def build(g: G) -> TensorRef:
        h = g.x([1, K])
        state = g.x([1, M])  # (the previous output as the update reads it)
        n = 3 * M
        s = g.op("FULLY_CONNECTED", [h, g.w(GRU.w), g.w(GRU.b)], [1, n], NONE)
        r = _row(g, g.x([ROWS, n]), 2, n, row)
        xs = _split(g, r, 3, M) if row == "gather" else [_slice(g, r, p, M) for p in range(3)]
        return _gru_update(g, xs, [_slice(g, s, p, M) for p in range(3)], state)

    return build


def _gru_update(
    g: G, xs: Sequence[TensorRef], hs: Sequence[TensorRef], state: TensorRef
) -> TensorRef:
    (xz, xr, xh), (hz, hr, hh) = xs, hs
    z = g.op("LOGISTIC", [g.op("ADD", [xz, hz], [1, M], NONE)], [1, M])
    r = g.op("LOGISTIC", [g.op("ADD", [xr, hr], [1, M], NONE)], [1, M])
    cand = g.op("TANH", [g.op("ADD", [xh, g.op("MUL", [r, hh], [1, M], NONE)], [1, M], NONE)],
                [1, M])  # fmt: skip
    keep = g.op("MUL", [z, state], [1, M], NONE)
    one_minus = g.op("SUB", [g.w(np.ones([1], np.float32)), z], [1, M], NONE)
    return g.op("ADD", [keep, g.op("MUL", [one_minus, cand], [1, M], NONE)], [1, M], NONE)


GRU_H = np.random.default_rng(4).uniform(-0.5, 0.5, (M, M)).astype(np.float32)


def gru_reset_before(g: G) -> TensorRef:
    """A GRU cell with the reset gate before the candidate's product (Keras'
    ``reset_after=False``): h [1, M]; a table [ROWS, 3M] whose row 2 (a GATHER, then a SPLIT)
    holds the input's terms; z and r from one product, the candidate from a second product
    of r * h; output h'."""
    h = g.x([1, M])
    n = 3 * M
    s = g.op("FULLY_CONNECTED", [h, g.w(GRU.w[: 2 * M, :M].copy()), -1], [1, 2 * M], NONE)
    xz, xr, xh = _split(g, g.op("GATHER", [g.x([ROWS, n]), g.ints([2])], [1, n], {"axis": 0}), 3, M)
    z = g.op("LOGISTIC", [g.op("ADD", [xz, _slice(g, s, 0, M)], [1, M], NONE)], [1, M])
    r = g.op("LOGISTIC", [g.op("ADD", [xr, _slice(g, s, 1, M)], [1, M], NONE)], [1, M])
    rh = g.op("MUL", [r, h], [1, M], NONE)
    hh = g.op("FULLY_CONNECTED", [rh, g.w(GRU_H), -1], [1, M], NONE)
    cand = g.op("TANH", [g.op("ADD", [xh, hh], [1, M], NONE)], [1, M])
    keep = g.op("MUL", [z, h], [1, M], NONE)
    one_minus = g.op("SUB", [g.w(np.ones([1], np.float32)), z], [1, M], NONE)
    return g.op("ADD", [keep, g.op("MUL", [one_minus, cand], [1, M], NONE)], [1, M], NONE)


def gru_reset_before_ref(feeds: Sequence[np.ndarray]) -> list:
    h, table = (np.asarray(x, np.float64) for x in feeds[:2])
    s = h @ GRU.w[: 2 * M, :M].T.astype(np.float64)
    xz, xr, xh = (table[2:3, p * M : (p + 1) * M] for p in range(3))
    z, r = _sig(xz + s[:, :M]), _sig(xr + s[:, M:])
    cand = np.tanh(xh + (r * h) @ GRU_H.T.astype(np.float64))
    return [z * h + (1 - z) * cand]


def gru_ref(feeds: Sequence[np.ndarray]) -> list:
    h, state, table = (np.asarray(x, np.float64) for x in feeds[:3])
    s = h @ GRU.w.T.astype(np.float64) + GRU.b
    xz, xr, xh = (table[2:3, p * M : (p + 1) * M] for p in range(3))
    hz, hr, hh = (s[:, p * M : (p + 1) * M] for p in range(3))
    z, r = _sig(xz + hz), _sig(xr + hr)
    cand = np.tanh(xh + r * hh)
    return [z * state + (1 - z) * cand]


CELLS: dict[str, tuple[Callable[[G], Any], Callable[[Sequence[np.ndarray]], list]]] = {
    "lstm": (lstm_cell(), lstm_ref),
    "lstm_row": (lstm_cell(row="gather"), lambda f: lstm_ref(f, row="gather")),
    "lstm_row_slice": (lstm_cell(row="slice"), lambda f: lstm_ref(f, row="slice")),
    "gru": (gru_cell("gather"), gru_ref),
    "gru_slice": (gru_cell("slice"), gru_ref),
}
#: Cells of two products.
TWO_STEPS = {"gru_reset_before": (gru_reset_before, gru_reset_before_ref)}


def _assert_close(got: Sequence[np.ndarray], want: Sequence[np.ndarray], tol: float) -> None:
    assert len(got) == len(want)
    for n, (a, b) in enumerate(zip(got, want, strict=True)):
        b = np.asarray(b, np.float64).reshape(np.shape(a))
        err = float(np.max(np.abs(np.asarray(a, np.float64) - b)))
        assert err <= tol * max(1.0, float(np.max(np.abs(b)))), f"output {n}: error {err}"


@pytest.mark.opencl
@pytest.mark.parametrize("schedules", ["fast", "fast-cpu"])
@pytest.mark.parametrize("name", list(CELLS))
def test_a_cell_is_one_kernel_and_matches_numpy(name: str, schedules: str) -> None:
    build, ref = CELLS[name]
    built = build_model([Case(name, build)])
    assert launched_kernels(built.model, schedules) == ["gated_step"]
    got = run_uncached(built.model, built.feeds, schedules)
    _assert_close(got, ref(built.feeds), 1e-5)


@pytest.mark.opencl
@pytest.mark.parametrize("schedules", ["fast", "fast-cpu"])
def test_a_row_shared_by_two_steps_is_read_by_each(schedules: str) -> None:
    """A GRU with the reset gate before the candidate's product: the first product's gates
    are a step (z and r * h out), the candidate's product an ordinary one with the update
    as its epilogue, which reads the gathered row's third part: two kernels, the GATHER and
    the SPLIT none of their own (the step once refused the row it shares)."""
    build, ref = TWO_STEPS["gru_reset_before"]
    built = build_model([Case("gru_rb", build)])
    kernels = launched_kernels(built.model, schedules)
    assert len(kernels) == 2 and kernels[0] == "gated_step", kernels
    got = run_uncached(built.model, built.feeds, schedules)
    _assert_close(got, ref(built.feeds), 1e-5)


@pytest.mark.opencl
def test_a_cell_under_fp16_is_one_kernel_within_fp16_error() -> None:
    built = build_model([Case("lstm", lstm_cell())])
    assert launched_kernels(built.model, "fast", "fp16") == ["gated_step"]
    got = run_uncached(built.model, built.feeds, "fast", "fp16")
    _assert_close(got, lstm_ref(built.feeds), 1e-2)


HEAD = np.random.default_rng(3).uniform(-0.5, 0.5, (2, M)).astype(np.float32)


def _cell_then_heads(g: G) -> list[TensorRef]:
    """The LSTM cell, each output then read by a FULLY_CONNECTED: c' and h' are stored
    inside the partition."""
    c2, h2 = lstm_cell()(g)
    return [g.op("FULLY_CONNECTED", [x, g.w(HEAD), -1], [1, 2], NONE) for x in (c2, h2)]


@pytest.mark.opencl
def test_under_emulated_half_the_step_rounds_what_it_stores(tmp_path: Any) -> None:
    """Emulated half (devices without half arithmetic): the step rounds each output it
    stores in half to an fp16 value in its own kernel (no rounding kernel after it), and the
    model equals numpy's cell with c' and h' so rounded."""
    import litekiln
    from litekiln.artifact.compiled import CompileOptions
    from litekiln.compiler.driver import compile_model
    from litekiln.model import load_model

    built = build_model([Case("lstm", _cell_then_heads)])
    options = CompileOptions(schedules="fast", precision="fp16", half="emulated", tuning=False)
    compiled = compile_model(load_model(built.model), options, warn=False)
    (program,) = [p.program for p in compiled.partitions]
    funcs = [la.func for la in program.launches]
    assert funcs[0] == "gated_step" and not any("round" in f for f in funcs), funcs
    assert "-8192" in program.source  # (the mantissa's rounding mask, in the step's kernel)
    it = litekiln.Interpreter(
        model_content=built.model, precision="fp16", half="emulated", cache_dir=tmp_path,
        fp16_budget=None,
    )  # fmt: skip
    got = it.run(list(built.feeds))
    head = HEAD.astype(np.float16).astype(np.float64)
    want = [
        np.asarray(v, np.float32).astype(np.float16).astype(np.float64) @ head.T
        for v in lstm_ref(built.feeds)
    ]
    _assert_close(got, want, 2e-3)


@pytest.mark.opencl
def test_a_gate_read_elsewhere_keeps_the_cell_op_by_op() -> None:
    built = build_model([Case("lstm", lstm_cell(gate_out="raw"))])
    kernels = launched_kernels(built.model, "fast")
    assert "gated_step" not in kernels and len(kernels) >= 2, kernels
    got = run_uncached(built.model, built.feeds, "fast")
    _assert_close(got, lstm_ref(built.feeds, gate_out="raw"), 1e-5)


@pytest.mark.opencl
def test_an_update_value_read_elsewhere_is_one_more_output_of_the_kernel() -> None:
    built = build_model([Case("lstm", lstm_cell(gate_out="activated"))])
    assert launched_kernels(built.model, "fast") == ["gated_step"]
    got = run_uncached(built.model, built.feeds, "fast")
    _assert_close(got, lstm_ref(built.feeds, gate_out="activated"), 1e-5)


def _keras(name: str) -> bytes:
    from test_while import keras_model

    return keras_model(name)


#: Keras models of tests/test_while.py -> (recurrent layers or directions, steps of each
#: that are one kernel): an LSTM's first step (its product of the zero initial state folded
#: into a constant term) is one too, a GRU's (the folded product's slices: constants) stays
#: op by op.
KERAS_LAYERS = {
    "lstm": (1, 5),
    "lstm_seq": (1, 5),
    "gru": (1, 4),
    "gru_seq": (1, 4),
    "bidi_lstm": (2, 5),
    "stacked_lstm": (2, 5),
}


@pytest.mark.opencl
@pytest.mark.parametrize("name", list(KERAS_LAYERS))
def test_keras_steps_take_one_kernel_each_and_match_litert(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_while import STEPS, _feeds, _litert, _run
    from test_while import _assert_close as close_to_litert

    import litekiln
    from litekiln.compiler import lowering

    model = _keras(name)
    fused = launched_kernels(model, "fast")
    layers, per_layer = KERAS_LAYERS[name]
    assert per_layer in (STEPS, STEPS - 1)
    # (a first step without a product and the last, which hands on other outputs, are
    # functions of their own: gated_step<n>)
    steps = sum(f.startswith("gated_step") for f in fused)
    assert steps == layers * per_layer, fused
    with monkeypatch.context() as m:
        m.setattr(lowering, "find_gated_steps", lambda *a, **k: [])
        op_by_op = launched_kernels(model, "fast")
    # Op by op, every step but the first took two kernels or more.
    assert len(fused) <= len(op_by_op) - (steps - layers), (fused, op_by_op)
    it = litekiln.Interpreter(model_content=model, use_cache=False, schedules="fast")
    close_to_litert(_run(it, _feeds(model)), _litert(model), f"{name} (gated steps)")


@pytest.mark.opencl
@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_every_option_of_a_step_matches_numpy(name: str, tmp_path: Any) -> None:
    """The tuning's options of a step (`schedules.GatedStepLanes`, `GatedStepShared` with
    other shapes), each computing the cell: timed on any device however small the step
    (its function runs once per time step)."""
    import litekiln

    build, ref = CELLS[name]
    built = build_model([Case(name, build)])
    path = tmp_path / "cell.tflite"
    path.write_bytes(built.model)
    it = litekiln.Interpreter(model_path=path, cache_dir=tmp_path, schedules="fast", tune=False)
    it.allocate_tensors()
    ex = it._backend.executors[0]  # noqa: SLF001 - the test drives the executor's options
    (variant,) = ex.program.variants
    assert variant.func.startswith("gated_step") and len(variant.options) >= 3
    for c in range(len(variant.options) + 1):
        ex.select([c])
        _assert_close(it.run(list(built.feeds)), ref(built.feeds), 1e-5)
