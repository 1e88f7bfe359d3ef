"""Loops (WHILE): Keras' recurrent layers against LiteRT, on the reference and the GPU path.

Keras (3) converts LSTM, GRU, SimpleRNN and Bidirectional layers to a WHILE over the time
steps, its step counter compared with a constant sequence length. The models are built and
converted with tensorflow once per session, in a child process (tensorflow's LLVM breaks
PoCL's kernel builds in the process that loads it), small (5 steps, 3 features, 4 units) so
that each compiles in seconds. Each must

* match LiteRT on the numpy reference, unrolled at load (the default) and as a loop (the
  unrolling capped at 0 ops: the reference runs the cond and body subgraphs);
* run whole on the GPU path (one partition, no CPU op) and match LiteRT there (PoCL).

A tf.while_loop with a constant bound unrolls whatever its body; Keras' per-step writes into
its sequence buffer end as one CONCATENATION of the rows; an IF (tf.cond on the input) runs
the branch it takes on the reference (both branches: seeds 0-3) and matches LiteRT.
A loop whose trip count comes from an input (tf.while_loop) stays a WHILE on the CPU, with a
reason that says so, and matches LiteRT. The loader's rules for WHILE (while.cc) are checked
on a loaded model made wrong.

Tolerance: ``max|litekiln - LiteRT| <= 1e-4`` (fp32 on both sides; only the order of the
sums in the fully-connected gates and OpenCL's vs libm's exp/tanh differ: ~1e-7 measured).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import litekiln
from litekiln.errors import ModelValidationError
from litekiln.model import load_model
from litekiln.ops import control
from litekiln.placement import placement

TOL = 1e-4
STEPS, FEATURES, UNITS = 5, 3, 4


def _layers(tf: Any) -> dict[str, Callable[[], list[Any]]]:
    k = tf.keras.layers
    return {
        "lstm": lambda: [k.LSTM(UNITS), k.Dense(2)],
        "lstm_seq": lambda: [k.LSTM(UNITS, return_sequences=True)],
        "gru": lambda: [k.GRU(UNITS)],
        "gru_seq": lambda: [k.GRU(UNITS, return_sequences=True)],
        "simple_rnn": lambda: [k.SimpleRNN(UNITS)],
        "simple_rnn_seq": lambda: [k.SimpleRNN(UNITS, return_sequences=True)],
        "bidi_lstm": lambda: [k.Bidirectional(k.LSTM(UNITS))],
        "bidi_lstm_seq": lambda: [k.Bidirectional(k.LSTM(UNITS, return_sequences=True))],
        "stacked_lstm": lambda: [k.LSTM(UNITS, return_sequences=True), k.LSTM(UNITS)],
    }


KERAS = [
    "lstm",
    "lstm_seq",
    "gru",
    "gru_seq",
    "simple_rnn",
    "simple_rnn_seq",
    "bidi_lstm",
    "bidi_lstm_seq",
    "stacked_lstm",
]


def _keras_model(tf: Any, name: str) -> bytes:
    """A Keras model with recurrent layers ``name`` (batch 1), converted to TFLite."""
    tf.keras.utils.set_random_seed(KERAS.index(name))
    layers = _layers(tf)[name]()
    model = tf.keras.Sequential([tf.keras.Input((STEPS, FEATURES), batch_size=1), *layers])
    return bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())


def _counted_loop_model(tf: Any) -> bytes:
    """``tf.while_loop`` run as many times as the input ``n`` says: no static trip count."""

    @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32), tf.TensorSpec([], tf.int32)])
    def f(x: Any, n: Any) -> Any:
        def body(i: Any, y: Any) -> tuple[Any, Any]:
            return i + 1, tf.tanh(y * 1.5 + 0.25)

        _, y = tf.while_loop(lambda i, y: i < n, body, [tf.constant(0), x])
        return y

    conv = tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], f)
    return bytes(conv.convert())


def _static_loop_model(tf: Any) -> bytes:
    """``tf.while_loop`` with a constant bound, its body no Keras cell: unrolled at load."""

    @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32)])
    def f(x: Any) -> Any:
        def body(i: Any, y: Any, z: Any) -> tuple[Any, Any, Any]:
            return i + 2, tf.tanh(y * 1.5 + z), z * 0.5

        _, y, z = tf.while_loop(lambda i, y, z: i < 7, body, [tf.constant(1), x, x + 1.0])
        return y, z

    conv = tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], f)
    return bytes(conv.convert())


def _branch_model(tf: Any) -> bytes:
    """``tf.cond`` on a value computed from the input: an IF with two branch subgraphs."""

    @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32)])
    def f(x: Any) -> Any:
        return tf.cond(tf.reduce_sum(x) > 0, lambda: tf.tanh(x * 2.0), lambda: x * x - 1.0)

    conv = tf.lite.TFLiteConverter.from_concrete_functions([f.get_concrete_function()], f)
    return bytes(conv.convert())


def _build(out: Path) -> None:
    """Write every test model to ``out`` (run in a process of its own, see :func:`models`)."""
    import tensorflow as tf

    for name in KERAS:
        (out / f"{name}.tflite").write_bytes(_keras_model(tf, name))
    (out / "counted_loop.tflite").write_bytes(_counted_loop_model(tf))
    (out / "static_loop.tflite").write_bytes(_static_loop_model(tf))
    (out / "branch.tflite").write_bytes(_branch_model(tf))


@functools.cache
def _models() -> dict[str, bytes]:
    """The test models, built once per session in a child process: tensorflow's LLVM,
    loaded into the test process, breaks PoCL's kernel builds ("unknown target CPU")."""
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("tensorflow is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, __file__, tmp], check=True, capture_output=True)
        return {p.stem: p.read_bytes() for p in Path(tmp).glob("*.tflite")}


def keras_model(name: str) -> bytes:
    return _models()[name]


def counted_loop_model() -> bytes:
    return _models()["counted_loop"]


def _feeds(model: bytes, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    g = load_model(model).main
    return [rng.uniform(-1, 1, g.tensors[t].shape).astype(np.float32) for t in g.inputs]


def _run(it: Any, feeds: list[np.ndarray]) -> list[np.ndarray]:
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), feeds, strict=True):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [np.array(it.get_tensor(d["index"])) for d in it.get_output_details()]


def _litert_interpreter(model: bytes) -> Any:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    return Interpreter(
        model_content=model,
        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
    )


@functools.cache
def _litert(model: bytes, n: int | None = None) -> list[np.ndarray]:
    return _run(_litert_interpreter(model), _loop_feeds(model, n))


def _loop_feeds(model: bytes, n: int | None) -> list[np.ndarray]:
    if n is None:
        return _feeds(model)
    return [_feeds(model)[0], np.array(n, np.int32)]


def _assert_close(got: list[np.ndarray], want: list[np.ndarray], what: str) -> float:
    worst = 0.0
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape and g.dtype == w.dtype, (what, k, g.shape, w.shape)
        err = float(np.abs(g.astype(np.float64) - w).max())
        assert err <= TOL, f"{what} output {k}: max|litekiln - LiteRT| = {err:.3g} > {TOL}"
        worst = max(worst, err)
    return worst


@pytest.mark.parametrize("name", KERAS)
def test_keras_rnn_unrolls_at_load_and_matches_litert_on_the_reference(name: str) -> None:
    model = keras_model(name)
    loaded = load_model(model)
    assert "WHILE" not in loaded.op_histogram()
    assert len(loaded.main.inputs) == 1 and len(loaded.main.outputs) == 1
    got = _run(litekiln.Interpreter(model_content=model, device="reference"), _feeds(model))
    _assert_close(got, _litert(model), f"{name} (unrolled, reference)")


@pytest.mark.parametrize("name", KERAS)
def test_keras_rnn_as_a_loop_matches_litert_on_the_reference(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(control, "UNROLL_MAX_OPS", 0)
    model = keras_model(name)
    assert "WHILE" in load_model(model).op_histogram()
    got = _run(litekiln.Interpreter(model_content=model, device="reference"), _feeds(model))
    _assert_close(got, _litert(model), f"{name} (loop, reference)")


def test_a_loop_with_a_constant_bound_unrolls_whatever_its_body() -> None:
    model = _models()["static_loop"]
    loaded = load_model(model)
    assert "WHILE" not in loaded.op_histogram()
    assert loaded.op_histogram().get("TANH") == 3  # i = 1, 3, 5
    got = _run(litekiln.Interpreter(model_content=model, device="reference"), _feeds(model))
    _assert_close(got, _litert(model), "static loop (unrolled, reference)")


@pytest.mark.parametrize("name", KERAS)
def test_the_steps_input_products_are_one_product_per_loop(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each step of an unrolled loop multiplies its row of the input by the same weights:
    the loader makes those STEPS products one FULLY_CONNECTED of all the rows, each step
    then reads its row (a GATHER of the product), and the outputs stay LiteRT's."""
    from litekiln.ops import unroll

    loops = 2 if name.startswith(("bidi", "stacked")) else 1
    fc = load_model(keras_model(name)).op_histogram()["FULLY_CONNECTED"]
    monkeypatch.setattr(unroll, "_BATCH_MIN", STEPS + 1)  # (off)
    unbatched = load_model(keras_model(name)).op_histogram()["FULLY_CONNECTED"]
    assert fc == unbatched - loops * (STEPS - 1), (fc, unbatched)
    monkeypatch.undo()
    model = keras_model(name)
    got = _run(litekiln.Interpreter(model_content=model, device="reference"), _feeds(model))
    _assert_close(got, _litert(model), f"{name} (batched, reference)")


def test_a_sequence_buffer_is_written_once_when_unrolled() -> None:
    # Keras writes each step's row as CONCATENATION(SLICE before, row, SLICE after) of the
    # previous buffer; unrolled and simplified, the rows are concatenated once.
    hist = load_model(keras_model("gru_seq")).op_histogram()
    assert hist.get("CONCATENATION") == 1 and "SLICE" not in hist, hist


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_branch_runs_its_subgraphs_on_the_cpu_and_matches_litert(seed: int) -> None:
    model = _models()["branch"]
    loaded = load_model(model)
    assert "IF" in loaded.op_histogram()
    feeds = _feeds(model, seed)
    litert = _run(_litert_interpreter(model), feeds)
    got = _run(litekiln.Interpreter(model_content=model, device="reference"), feeds)
    _assert_close(got, litert, f"branch, seed {seed}")


def test_file_tensors_keep_their_indices_and_inlined_ones_follow() -> None:
    model = keras_model("lstm")
    from litekiln.model.loader import load_model as load_unchecked

    raw = load_unchecked(model, validate=False).main
    g = load_model(model).main
    assert g.inputs == raw.inputs and g.outputs == raw.outputs
    assert [t.name for t in g.tensors[: len(raw.tensors)]] == [t.name for t in raw.tensors]
    assert any(t.name.endswith(f"/step_{STEPS - 1}") for t in g.tensors[len(raw.tensors) :])
    assert [op.index for op in g.ops] == list(range(len(g.ops)))
    it = litekiln.Interpreter(model_content=model, device="reference")
    assert [d["name"] for d in it.get_tensor_details()] == [t.name for t in raw.tensors]


@pytest.mark.opencl
@pytest.mark.parametrize("name", [*KERAS, "static_loop"])
def test_loop_runs_whole_on_the_gpu_and_matches_litert(name: str) -> None:
    model = _models()[name]
    it = litekiln.Interpreter(model_content=model, use_cache=False)
    it.allocate_tensors()
    compiled = it._backend.compiled  # noqa: SLF001 - what the session really runs
    assert compiled.cpu_reasons == {}, f"ops on the CPU: {compiled.cpu_reasons}"
    assert compiled.steps == [("gpu", 0)], f"steps {compiled.steps}"
    got = _run(it, _feeds(model))
    _assert_close(got, _litert(model), f"{name} (GPU path)")


@pytest.mark.opencl
def test_compile_and_app_in_fresh_processes_unroll_the_loop_onto_the_gpu(tmp_path: Path) -> None:
    """`litekiln compile`, then an app's start, each a process that has not imported the op
    registry: the loop unrolled onto the GPU in both, the app's start finding the compiled
    entry (both once left the WHILE on the CPU, where `litekiln inspect` unrolled it)."""
    from fresh_process import compile_then_open

    path = tmp_path / "lstm.tflite"
    path.write_bytes(keras_model(KERAS[0]))
    compiled, opened = compile_then_open(path, tmp_path / "cache")
    assert "1 GPU partition(s)" in compiled and "/ 0 on the CPU" in compiled, compiled
    assert opened == "True [('gpu', 0)] {}", opened


def test_a_loop_too_long_to_unroll_stays_on_the_cpu_and_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(control, "UNROLL_MAX_OPS", 40)
    with caplog.at_level(logging.WARNING, logger="litekiln"):
        loaded = load_model(keras_model("lstm"))
    assert any("stays a loop on the CPU" in r.getMessage() for r in caplog.records)
    _, plan = placement(loaded)
    (reason,) = [r for i, r in plan.cpu_reasons.items() if loaded.main.ops[i].name == "WHILE"]
    assert "could not unroll" in reason and "the 40 ops litekiln unrolls" in reason


@pytest.mark.parametrize("n", [0, 1, 4])
def test_a_loop_counted_by_an_input_runs_on_the_cpu_and_matches_litert(n: int) -> None:
    model = counted_loop_model()
    loaded = load_model(model)
    assert "WHILE" in loaded.op_histogram()
    _, plan = placement(loaded)
    reasons = [r for i, r in plan.cpu_reasons.items() if loaded.main.ops[i].name == "WHILE"]
    assert len(reasons) == 1 and "computed at run time" in reasons[0], plan.cpu_reasons
    feeds = _loop_feeds(model, n)
    got = _run(litekiln.Interpreter(model_content=model, device="reference"), feeds)
    _assert_close(got, _litert(model, n), f"counted loop, n={n}")


@pytest.mark.opencl
def test_a_loop_counted_by_an_input_matches_litert_beside_the_gpu_path() -> None:
    model = counted_loop_model()
    it = litekiln.Interpreter(model_content=model, use_cache=False)
    got = _run(it, _loop_feeds(model, 3))
    _assert_close(got, _litert(model, 3), "counted loop, n=3 (GPU path session)")


def _broken(mutate: Callable[[Any], None]) -> None:
    """Load the LSTM model unchecked, break it with ``mutate(model)``, run the checks."""
    from litekiln.model.loader import load_model as load_unchecked
    from litekiln.ops.unroll import check_and_rewrite

    model = load_unchecked(keras_model("lstm"), validate=False)
    mutate(model)
    check_and_rewrite(model)


def _while_op(model: Any) -> Any:
    return next(op for op in model.main.ops if op.name == "WHILE")


@pytest.mark.parametrize(
    ("mutate", "rule"),
    [
        (lambda m: _while_op(m).options.update(body_subgraph_index=7), "subgraph-index"),
        (lambda m: _while_op(m).options.update(body_subgraph_index=1), "subgraph-index"),
        (lambda m: _while_op(m).outputs.pop(), "output-count"),
        (lambda m: m.subgraphs[2].outputs.pop(), "subgraph-arity"),
        (lambda m: m.subgraphs[1].outputs.append(m.subgraphs[1].inputs[0]), "subgraph-arity"),
        (lambda m: m.subgraphs[1].outputs.__setitem__(0, 0), "cond-output"),
        (lambda m: m.subgraphs[2].outputs.reverse(), "subgraph-dtype"),
    ],
    ids=[
        "no-such-body",
        "cond-is-body",
        "outputs",
        "body-outputs",
        "cond-outputs",
        "cond-int",
        "types",
    ],
)
def test_the_loader_checks_while_as_litert_does(mutate: Callable[[Any], None], rule: str) -> None:
    with pytest.raises(ModelValidationError) as err:
        _broken(mutate)
    assert err.value.rule == rule, err.value


if __name__ == "__main__":
    _build(Path(sys.argv[1]))
