"""UNIDIRECTIONAL_SEQUENCE_LSTM against LiteRT: the reference, the GPU path and the state.

Models:

* tf_keras (Keras 2, ``TF_USE_LEGACY_KERAS=1``) LSTM layers, which the TFLite converter fuses
  into UNIDIRECTIONAL_SEQUENCE_LSTM: one layer (last step, then a Dense), one returning the
  sequence, two stacked, and one ``time_major``. Converted once per session in a child
  process (tensorflow's LLVM, loaded into the test process, breaks PoCL's kernel builds);
  small (5 steps, 3 features, 4 units). Skipped where tf_keras is not installed.
* built with ``tests/tflite_builder.py``: the kernel's features the converter does not
  write from Keras (CIFG, peepholes, projection with its clip, layer norm, a cell clip, a
  RELU activation, batch 2, time major, diagonal recurrent weights).

Every model is run three times on the same input and once after ``reset_all_variables``,
each invocation compared with LiteRT's (LiteRT writes the final states into the op's
variable inputs, so the three outputs differ): on the reference, with the op expanded at
load into per-step ops (the default) and kept whole (its own numpy reference), and on the
GPU path, where the model must run whole (one partition, no CPU op).

Tolerance ``max|litekiln - LiteRT| <= 1e-4`` (float32 on both sides; only the summation
order of the gate products and OpenCL's vs libm's exp/tanh differ: at most 2.4e-7 measured,
on every model, path and invocation).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tflite_builder import ModelBuilder

import litekiln
from litekiln.errors import ModelValidationError
from litekiln.model import load_model
from litekiln.ops import control

TOL = 1e-4
STEPS, FEATURES, UNITS = 5, 3, 4
INVOCATIONS = 3  # then reset_all_variables and one more
OP = "UNIDIRECTIONAL_SEQUENCE_LSTM"

KERAS = ["lstm", "lstm_seq", "stacked", "time_major"]


def _keras_model(tf: Any, name: str) -> bytes:
    k = tf.keras.layers
    tf.keras.utils.set_random_seed(KERAS.index(name))
    if name == "time_major":  # [T, B, I]: 5 steps of a batch of 2
        inp = tf.keras.Input((2, FEATURES), batch_size=STEPS)
        layers = [k.LSTM(UNITS, time_major=True, return_sequences=True)]
    else:
        inp = tf.keras.Input((STEPS, FEATURES), batch_size=1)
        layers = {
            "lstm": [k.LSTM(UNITS), k.Dense(2)],
            "lstm_seq": [k.LSTM(UNITS, return_sequences=True)],
            "stacked": [k.LSTM(UNITS, return_sequences=True), k.LSTM(UNITS)],
        }[name]
    model = tf.keras.Sequential([inp, *layers])
    return bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())


def _build_keras(out: Path) -> None:
    """Write the tf_keras models to ``out`` (run in a child process, see :func:`_keras`)."""
    os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf.keras is then tf_keras: Keras 2
    import tensorflow as tf

    for name in KERAS:
        (out / f"{name}.tflite").write_bytes(_keras_model(tf, name))


@functools.cache
def _keras() -> dict[str, bytes]:
    for module in ("tensorflow", "tf_keras"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -e .[zoo])")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, __file__, tmp], check=True, capture_output=True)
        return {p.stem: p.read_bytes() for p in Path(tmp).glob("*.tflite")}


# -- models built op by op ------------------------------------------------------------------


def built_model(
    *,
    batch: int = 1,
    steps: int = STEPS,
    n_input: int = FEATURES,
    cells: int = UNITS,
    cifg: bool = False,
    peephole: bool = False,
    projection: int = 0,
    layer_norm: bool = False,
    cell_clip: float = 0.0,
    proj_clip: float = 0.0,
    activation: str = "TANH",
    time_major: bool = False,
    diagonal: bool = False,
    hybrid: bool = False,
    state_variable: bool = True,
    seed: int = 0,
) -> bytes:
    """One UNIDIRECTIONAL_SEQUENCE_LSTM with the given features, random float weights."""
    rng = np.random.default_rng(seed)
    n_out = projection or cells
    b = ModelBuilder()
    shape = [steps, batch, n_input] if time_major else [batch, steps, n_input]
    x = b.input("x", shape)

    def w(name: str, *dims: int, scale: float = 0.5) -> Any:
        data = rng.uniform(-scale, scale, dims).astype(np.float32)
        if hybrid and len(dims) == 2:
            return b.const(name, np.round(data * 127).astype(np.int8), "int8", quant=(1 / 127, 0))
        return b.const(name, data)

    gates = ["forget", "cell", "output"] if cifg else ["input", "forget", "cell", "output"]
    ins: list[Any] = [x]
    ins += [w(f"w_{g}", cells, n_input) if g in gates else -1 for g in ("input", *gates[-3:])]
    for g in ("input", "forget", "cell", "output"):
        if g not in gates:
            ins.append(-1)
        elif diagonal:
            ins.append(w(f"r_{g}", cells))
        else:
            ins.append(w(f"r_{g}", cells, n_out))
    for g in ("input", "forget", "output"):
        ins.append(w(f"p_{g}", cells) if peephole and g in gates else -1)
    ins += [w(f"b_{g}", cells) if g in gates else -1 for g in ("input", "forget", "cell", "output")]
    ins += [w("proj", n_out, cells), w("proj_b", n_out, scale=0.1)] if projection else [-1, -1]
    ins.append(b.tensor("h", [batch, n_out], is_variable=state_variable))
    ins.append(b.tensor("c", [batch, cells], is_variable=state_variable))
    for g in ("input", "forget", "cell", "output"):
        ins.append(w(f"ln_{g}", cells, scale=1.0) if layer_norm and g in gates else -1)
    out_shape = [steps, batch, n_out] if time_major else [batch, steps, n_out]
    y = b.tensor("y", out_shape)
    options = {
        "fused_activation_function": activation,
        "cell_clip": cell_clip,
        "proj_clip": proj_clip,
        "time_major": time_major,
    }
    b.op(OP, ins, outputs=[y], options=options)
    b.output(y)
    return b.build()


BUILT: dict[str, dict[str, Any]] = {
    "basic": {},
    "batch2": {"batch": 2},
    "built_time_major": {"time_major": True, "batch": 2},
    "cifg": {"cifg": True},
    "peephole": {"peephole": True},
    "cifg_peephole": {"cifg": True, "peephole": True},
    "projection": {"projection": 3, "proj_clip": 0.15},
    "layer_norm": {"layer_norm": True, "peephole": True},
    "layer_norm_cifg": {"layer_norm": True, "cifg": True},
    "cell_clip": {"cell_clip": 0.1},
    "relu": {"activation": "RELU"},
}


@functools.cache
def _model(name: str) -> bytes:
    if name in BUILT:
        return built_model(**BUILT[name])
    return _keras()[name]


# -- running --------------------------------------------------------------------------------


def _feeds(model: bytes) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    g = load_model(model).main
    return [rng.uniform(-1, 1, g.tensors[t].shape).astype(np.float32) for t in g.inputs]


def _litert(model: bytes) -> Any:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    return Interpreter(
        model_content=model,
        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
    )


def _invocations(it: Any, feeds: list[np.ndarray]) -> list[list[np.ndarray]]:
    """The outputs of INVOCATIONS invokes on ``feeds``, then of one after a reset."""
    it.allocate_tensors()
    runs = []
    for k in range(INVOCATIONS + 1):
        if k == INVOCATIONS:
            it.reset_all_variables()
        for d, x in zip(it.get_input_details(), feeds, strict=True):
            it.set_tensor(d["index"], x)
        it.invoke()
        runs.append([np.array(it.get_tensor(d["index"])) for d in it.get_output_details()])
    return runs


@functools.cache
def _litert_runs(name: str) -> list[list[np.ndarray]]:
    model = _model(name)
    runs = _invocations(_litert(model), _feeds(model))
    # The state carries: LiteRT's second invocation differs from its first, the reset one
    # equals it.
    assert not np.allclose(runs[0][0], runs[1][0], atol=1e-6), f"{name}: no state carried"
    np.testing.assert_array_equal(runs[0][0], runs[INVOCATIONS][0])
    return runs


def _compare(name: str, got: list[list[np.ndarray]], what: str) -> float:
    want = _litert_runs(name)
    worst = 0.0
    for k, (g_run, w_run) in enumerate(zip(got, want, strict=True)):
        for g, w in zip(g_run, w_run, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype, (name, what, k, g.shape, w.shape)
            err = float(np.abs(g.astype(np.float64) - w).max())
            assert err <= TOL, (
                f"{name} ({what}), invocation {k}: max|litekiln - LiteRT| = {err:.3g} > {TOL}"
            )
            worst = max(worst, err)
    return worst


ALL = [*KERAS, *BUILT]


# -- tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", KERAS)
def test_tf_keras_lstm_converts_to_the_fused_op(name: str) -> None:
    from litekiln.model.loader import load_model as load_unchecked

    raw = load_unchecked(_model(name), validate=False)
    assert OP in raw.op_histogram(), raw.op_histogram()
    assert "WHILE" not in raw.op_histogram()


@pytest.mark.parametrize("name", ALL)
def test_expanded_at_load_and_matches_litert_on_the_reference(name: str) -> None:
    model = _model(name)
    loaded = load_model(model)
    assert OP not in loaded.op_histogram(), loaded.op_histogram()
    assert len(loaded.main.variable_updates) == 2 * len(
        [op for op in load_model(model, validate=False).main.ops if op.name == OP]
    )
    it = litekiln.Interpreter(model_content=model, device="reference")
    _compare(name, _invocations(it, _feeds(model)), "expanded, reference")


@pytest.mark.parametrize("name", ALL)
def test_kept_whole_matches_litert_on_the_reference(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(control, "UNROLL_MAX_OPS", 0)
    model = _model(name)
    loaded = load_model(model)
    assert OP in loaded.op_histogram()
    it = litekiln.Interpreter(model_content=model, device="reference")
    _compare(name, _invocations(it, _feeds(model)), "whole op, reference")


def test_a_variable_reads_its_new_value_after_invoke() -> None:
    model = _model("basic")
    it = litekiln.Interpreter(model_content=model, device="reference")
    g = it.model.main
    (h_var, c_var) = g.variable_updates
    _invocations(it, _feeds(model))  # (ends with the invoke after the reset)
    lit = _litert(model)
    _invocations(lit, _feeds(model))
    for var in (h_var, c_var):
        np.testing.assert_allclose(it.get_tensor(var), lit.get_tensor(var), atol=TOL)
    it.reset_all_variables()
    assert not it.get_tensor(h_var).any() and not it.get_tensor(c_var).any()


def test_diagonal_recurrent_weights_stay_whole_on_the_cpu_and_match_litert() -> None:
    from litekiln.placement import placement

    model = built_model(diagonal=True)
    loaded = load_model(model)
    assert OP in loaded.op_histogram()
    _, plan = placement(loaded)
    (reason,) = plan.cpu_reasons.values()
    assert "diagonal recurrent weights" in reason, reason
    feeds = _feeds(model)
    got = _invocations(litekiln.Interpreter(model_content=model, device="reference"), feeds)
    lit = _invocations(_litert(model), feeds)
    for g, w in zip(got, lit, strict=True):
        assert float(np.abs(g[0].astype(np.float64) - w[0]).max()) <= TOL


@pytest.mark.parametrize(
    ("make", "rule"),
    [
        (lambda: built_model(hybrid=True), "seq-lstm-hybrid"),
        (lambda: built_model(activation="NONE"), "seq-lstm-activation"),
        (lambda: built_model(state_variable=False), "input-not-computed"),  # (the loader)
        (lambda: built_model(cell_clip=-1.0), "lstm-clip"),
    ],
    ids=["hybrid", "activation-none", "state-not-variable", "negative-clip"],
)
def test_the_loader_refuses_what_litekiln_or_litert_does_not_run(
    make: Callable[[], bytes], rule: str
) -> None:
    with pytest.raises(ModelValidationError) as err:
        load_model(make())
    assert err.value.rule == rule, err.value


def _broken(mutate: Callable[[Any], None]) -> None:
    from litekiln.model.loader import load_model as load_unchecked
    from litekiln.ops.unroll import check_and_rewrite

    model = load_unchecked(built_model(peephole=True), validate=False)
    mutate(next(op for op in model.main.ops if op.name == OP))
    check_and_rewrite(model)


@pytest.mark.parametrize(
    ("mutate", "rule"),
    [
        (lambda op: op.inputs.__setitem__(10, -1), "lstm-peephole"),
        (lambda op: op.inputs.__setitem__(5, -1), "lstm-cifg"),
        (lambda op: op.inputs.__setitem__(2, op.inputs[5]), "lstm-shapes"),
        (lambda op: op.inputs.pop(), "input-count"),
        (lambda op: op.outputs.append(op.inputs[0]), "output-count"),
    ],
    ids=["peephole-partial", "cifg-partial", "weights-shape", "inputs", "outputs"],
)
def test_the_loader_checks_the_op_as_litert_does(mutate: Callable[[Any], None], rule: str) -> None:
    with pytest.raises(ModelValidationError) as err:
        _broken(mutate)
    assert err.value.rule == rule, err.value


@pytest.mark.opencl
@pytest.mark.each_device
@pytest.mark.parametrize("name", ALL)
def test_whole_on_the_gpu_with_its_state_and_matches_litert(name: str) -> None:
    model = _model(name)
    it = litekiln.Interpreter(model_content=model, use_cache=False)
    it.allocate_tensors()
    compiled = it._backend.compiled  # noqa: SLF001 - what the session really runs
    assert compiled.cpu_reasons == {}, f"ops on the CPU: {compiled.cpu_reasons}"
    assert compiled.steps == [("gpu", 0)], f"steps {compiled.steps}"
    _compare(name, _invocations(it, _feeds(model)), "GPU path")
    # The states stay on the device between invocations: each variable is carried from the
    # tensor holding its new value, and no invocation copies it through the host.
    updates = it.model.main.variable_updates
    bindings = it.get_bindings()
    assert updates and {v: bindings[v]["carried_from"] for v in updates} == updates
    assert all(bindings[v]["zero_copy"] for v in updates), bindings


@pytest.mark.opencl
def test_compile_and_app_in_fresh_processes_expand_the_layer_onto_the_gpu(tmp_path: Path) -> None:
    """`litekiln compile`, then an app's start, each a process that has not imported the op
    registry: the layer expanded onto the GPU in both, the app finding the compiled entry."""
    from fresh_process import compile_then_open

    path = tmp_path / "lstm.tflite"
    path.write_bytes(_model("lstm"))
    compiled, opened = compile_then_open(path, tmp_path / "cache")
    assert "1 GPU partition(s)" in compiled and "/ 0 on the CPU" in compiled, compiled
    assert opened == "True [('gpu', 0)] {}", opened


@pytest.mark.opencl
@pytest.mark.each_device
@pytest.mark.parametrize("name", ["lstm_seq", "stacked", "layer_norm", "projection"])
def test_fp16_whole_on_the_gpu_with_its_state_and_matches_litert(name: str) -> None:
    # fp16 1e-2, as tests/test_lstm_gpu.py (half storage between the steps' ops, ~5e-4
    # relative each; the states cross the partition in float32): 4.5e-4 measured on PoCL.
    model = _model(name)
    it = litekiln.Interpreter(model_content=model, use_cache=False, precision="fp16")
    it.allocate_tensors()
    assert it._backend.compiled.steps == [("gpu", 0)]  # noqa: SLF001
    got = _invocations(it, _feeds(model))
    for k, (g_run, w_run) in enumerate(zip(got, _litert_runs(name), strict=True)):
        pairs = zip(g_run, w_run, strict=True)
        err = max(float(np.abs(g.astype(np.float64) - w).max()) for g, w in pairs)
        assert err <= 1e-2, f"{name} fp16, invocation {k}: {err:.3g}"


def test_a_resize_of_the_time_axis_is_refused_with_the_reason() -> None:
    # The op is expanded for the sequence length the file gives; LiteRT resizes it.
    model = _model("basic")
    it = litekiln.Interpreter(model_content=model, device="reference")
    it.resize_tensor_input(it.get_input_details()[0]["index"], [1, STEPS + 2, FEATURES])
    with pytest.raises(litekiln.InputError, match="UNPACK"):
        it.allocate_tensors()


if __name__ == "__main__":
    _build_keras(Path(sys.argv[1]))


@pytest.mark.opencl
def test_compile_for_a_device_runs_the_model_with_its_state(tmp_path: Path) -> None:
    """`litekiln compile --device` runs one inference to store the device binary: on a model
    with variable tensors it feeds them their reset value (it raised KeyError before), and the
    app's first start then loads the binary and matches LiteRT invocation by invocation."""
    import litekiln
    from litekiln.cli import main

    name = next(iter(BUILT))
    path = tmp_path / f"{name}.tflite"
    path.write_bytes(_model(name))
    cache = tmp_path / "cache"
    assert main(["compile", str(path), "--cache-dir", str(cache), "--device", "cpu"]) == 0
    it = litekiln.Interpreter(model_path=path, cache_dir=cache, device="cpu")
    got = _invocations(it, _feeds(_model(name)))
    assert it._backend.startup["binaries"] == 1  # noqa: SLF001 - stored by compile --device
    _compare(name, got, "after compile --device")
