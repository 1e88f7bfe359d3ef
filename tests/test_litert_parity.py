"""LiteRT-style scripts run unchanged against LiteRT and litekiln: what they print is the same.

Each script is written the way LiteRT's own Python examples are (label_image, signature
runners, resizing, intermediates, raw tensor() access); it gets ``Interpreter`` (LiteRT's or
litekiln's, with no litekiln-specific argument), ``MODEL``, ``np`` and ``print``. Numbers are
printed at 3 decimals: litekiln's GPU path agrees with LiteRT within 1e-4 of the output range.
litekiln runs on the default OpenCL device (PoCL in CI), with a fresh cache per test.
"""

from __future__ import annotations

import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from tflite_builder import ModelBuilder

import litekiln

pytestmark = pytest.mark.opencl

LABEL_IMAGE = """
interpreter = Interpreter(model_path=MODEL, num_threads=2)
interpreter.allocate_tensors()
input_details = interpreter.get_input_details()
output_details = interpreter.get_output_details()
floating_model = input_details[0]["dtype"] == np.float32
height = input_details[0]["shape"][1]
width = input_details[0]["shape"][2]
img = np.random.default_rng(7).integers(0, 256, (height, width, 3)).astype(np.uint8)
input_data = np.expand_dims(img, axis=0)
if floating_model:
    input_data = (np.float32(input_data) - 127.5) / 127.5
interpreter.set_tensor(input_details[0]["index"], input_data)
interpreter.invoke()
output_data = interpreter.get_tensor(output_details[0]["index"])
results = np.squeeze(output_data)
top_k = results.argsort()[-5:][::-1]
for i in top_k:
    print("{:08.3f}: class {}".format(float(results[i]), i))
"""

RAW_TENSOR_ACCESS = """
interpreter = Interpreter(model_path=MODEL)
interpreter.allocate_tensors()
inp = interpreter.get_input_details()[0]
out = interpreter.get_output_details()[0]
print("before invoke", interpreter.get_tensor(out["index"]).shape)
img = np.random.default_rng(3).uniform(-1, 1, inp["shape"][1:]).astype(np.float32)
interpreter.tensor(inp["index"])()[0][:] = img
interpreter.invoke()
first = interpreter.tensor(out["index"])().copy()
print("top", int(first.argmax()), round(float(first.max()), 3))
input = interpreter.tensor(inp["index"])
output = interpreter.tensor(out["index"])
for i in range(3):
    input().fill(0.25 * i)
    interpreter.invoke()
    print("inference", i, np.round(output(), 3).tolist())
"""

SIGNATURES = """
interpreter = Interpreter(model_path=MODEL)
print(interpreter.get_signature_list())
runner = interpreter.get_signature_runner()
for name, d in sorted(runner.get_input_details().items()):
    print("in", name, d["shape"].tolist(), d["dtype"].__name__)
for name, d in sorted(runner.get_output_details().items()):
    print("out", name, d["shape"].tolist(), d["dtype"].__name__)
x = np.random.default_rng(1).uniform(-1, 1, (1, 8, 8, 3)).astype(np.float32)
result = runner(x=x)
for name, value in sorted(result.items()):
    print(name, value.shape, np.round(value, 3).tolist())
batch = np.random.default_rng(2).uniform(-1, 1, (3, 8, 8, 3)).astype(np.float32)
result = runner(x=batch)
print("batch of 3:", result["probs"].shape, np.round(result["probs"].sum(axis=1), 3).tolist())
try:
    runner(y=x)
except ValueError:
    print("unknown input name refused")
"""

RESIZE = """
interpreter = Interpreter(model_path=MODEL)
index = interpreter.get_input_details()[0]["index"]
print("signature", interpreter.get_input_details()[0]["shape_signature"].tolist())
interpreter.resize_tensor_input(index, [4, 8, 8, 3])
interpreter.allocate_tensors()
print("input", interpreter.get_input_details()[0]["shape"].tolist())
print("output", interpreter.get_output_details()[0]["shape"].tolist())
images = np.random.default_rng(5).uniform(-1, 1, (4, 8, 8, 3)).astype(np.float32)
interpreter.set_tensor(index, images)
interpreter.invoke()
probs = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
print("argmax", probs.argmax(axis=1).tolist(), "sums", np.round(probs.sum(axis=1), 3).tolist())
interpreter.reset_all_variables()
interpreter.resize_tensor_input(index, [1, 8, 8, 3], strict=True)
interpreter.allocate_tensors()
interpreter.set_tensor(index, images[:1])
interpreter.invoke()
again = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
print("first image again", bool(np.allclose(again[0], probs[0], atol=1e-4)))
try:
    interpreter.resize_tensor_input(index, [1, 9, 8, 3], strict=True)
except (ValueError, RuntimeError):
    print("strict resize of a fixed dimension refused")
"""

INTERMEDIATES = """
interpreter = Interpreter(model_path=MODEL, experimental_preserve_all_tensors=True)
interpreter.allocate_tensors()
index = interpreter.get_input_details()[0]["index"]
x = np.random.default_rng(9).uniform(-1, 1, (1, 8, 8, 3)).astype(np.float32)
interpreter.set_tensor(index, x)
interpreter.invoke()
for d in interpreter.get_tensor_details():
    value = interpreter.get_tensor(d["index"])
    print(d["index"], d["name"], value.shape, round(float(np.abs(value).sum()), 3))
"""


def _cnn() -> bytes:
    """A small classifier with a dynamic batch and one signature (x -> probs)."""
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    x = b.input("x", [None, 8, 8, 3])
    w1 = b.const("w1", rng.uniform(-0.5, 0.5, [4, 3, 3, 3]).astype(np.float32))
    b1 = b.const("b1", rng.uniform(-0.1, 0.1, [4]).astype(np.float32))
    conv = b.op(
        "CONV_2D", [x, w1, b1], out_shape=[None, 8, 8, 4],
        options={"padding": "SAME", "stride_w": 1, "stride_h": 1,
                 "fused_activation_function": "RELU"},
    )  # fmt: skip
    pool = b.op(
        "AVERAGE_POOL_2D", [conv], out_shape=[None, 4, 4, 4],
        options={"padding": "VALID", "stride_w": 2, "stride_h": 2, "filter_width": 2,
                 "filter_height": 2},
    )  # fmt: skip
    shape = b.const("shape", np.array([-1, 64], np.int32))
    flat = b.op("RESHAPE", [pool, shape], out_shape=[None, 64])
    w2 = b.const("w2", rng.uniform(-0.2, 0.2, [5, 64]).astype(np.float32))
    b2 = b.const("b2", rng.uniform(-0.1, 0.1, [5]).astype(np.float32))
    logits = b.op("FULLY_CONNECTED", [flat, w2, b2], out_shape=[None, 5])
    probs = b.op("SOFTMAX", [logits], out_shape=[None, 5], options={"beta": 1.0})
    b.output(probs)
    b.signature("serving_default", {"x": x}, {"probs": probs})
    return b.build()


def _run(script: str, interpreter: Callable[..., object], model: Path) -> list[str]:
    lines: list[str] = []

    def capture(*args: object) -> None:
        lines.append(" ".join(str(a) for a in args))

    exec(  # noqa: S102 - the scripts are this file's own
        textwrap.dedent(script),
        {"Interpreter": interpreter, "np": np, "MODEL": str(model), "print": capture},
    )
    return lines


def _litert() -> Callable[..., object]:
    ai_edge = pytest.importorskip("ai_edge_litert.interpreter")
    return ai_edge.Interpreter  # type: ignore[no-any-return]


@pytest.fixture
def cnn(tmp_path: Path) -> Path:
    path = tmp_path / "cnn.tflite"
    path.write_bytes(_cnn())
    return path


@pytest.fixture(autouse=True)
def _fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITEKILN_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize(
    "script", [LABEL_IMAGE, RAW_TENSOR_ACCESS], ids=["label_image", "raw_tensor_access"]
)
def test_smoke_model_scripts_print_the_same(script: str, smoke_path: Path) -> None:
    want = _run(script, _litert(), smoke_path)
    got = _run(script, litekiln.Interpreter, smoke_path)
    assert got == want


@pytest.mark.parametrize(
    "script", [SIGNATURES, RESIZE, INTERMEDIATES], ids=["signatures", "resize", "intermediates"]
)
def test_cnn_scripts_print_the_same(script: str, cnn: Path) -> None:
    want = _run(script, _litert(), cnn)
    got = _run(script, litekiln.Interpreter, cnn)
    assert got == want


def test_threads_never_see_each_others_results(smoke_path: Path) -> None:
    """Two threads share one Interpreter through set_tensor/invoke/get_tensor and run():
    every result is the one of the thread's own input."""
    interp = litekiln.Interpreter(model_path=smoke_path)
    idx = interp.get_input_details()[0]["index"]
    out = interp.get_output_details()[0]["index"]
    ref = litekiln.Interpreter(model_path=smoke_path, device="reference")
    inputs = [ref.random_inputs(seed)[0] for seed in range(2)]
    want = [ref.run([x])[0] for x in inputs]
    wrong: list[str] = []

    def worker(k: int) -> None:
        for n in range(30):
            if n % 2:
                got = interp.run([inputs[k]])[0]
            else:
                interp.set_tensor(idx, inputs[k])
                interp.invoke()
                got = interp.get_tensor(out)
            if not np.allclose(got, want[k], atol=1e-4):
                wrong.append(f"thread {k}, call {n}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong


def test_tensor_view_writes_reach_the_next_invoke(smoke_path: Path) -> None:
    interp = litekiln.Interpreter(model_path=smoke_path)
    interp.allocate_tensors()
    idx = interp.get_input_details()[0]["index"]
    out = interp.get_output_details()[0]["index"]
    x = interp.random_inputs(4)[0]
    view = interp.tensor(idx)()
    assert view.shape == (1, 32, 32, 3) and not view.any()  # zeros, not an error
    view[0][:] = x[0]
    interp.invoke()
    want = litekiln.Interpreter(model_path=smoke_path, device="reference").run([x])[0]
    np.testing.assert_allclose(interp.get_tensor(out), want, atol=1e-4)
    interp.tensor(idx)().fill(0.5)  # a second write through a fresh view
    interp.invoke()
    assert not np.allclose(interp.get_tensor(out), want, atol=1e-4)


def test_constructor_arguments_are_checked_at_construction(smoke_path: Path) -> None:
    with pytest.raises(TypeError, match="foo"):
        litekiln.Interpreter(model_path=smoke_path, foo=1)
    with pytest.raises(ValueError, match="num_threads"):
        litekiln.Interpreter(model_path=smoke_path, num_threads="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_threads"):
        litekiln.Interpreter(model_path=smoke_path, num_threads=0)
    with pytest.raises(ValueError, match="experimental_preserve_all_tensors"):
        litekiln.Interpreter(model_path=smoke_path, experimental_preserve_all_tensors="yes")
    with pytest.raises(ValueError, match="subgraph_index"):
        litekiln.Interpreter(model_path=smoke_path, device="reference").get_tensor_details(3)
    interp = litekiln.Interpreter(
        model_path=smoke_path, num_threads=1, experimental_disable_delegate_clustering=True
    )
    assert interp.get_tensor_details(0)[0]["name"] == "serving_default_input:0"


def test_num_threads_limits_the_cpu_ops_blas(smoke_path: Path) -> None:
    """num_threads reaches the ops left on the CPU: BLAS runs with that many threads."""
    from threadpoolctl import threadpool_info

    from litekiln.ops import base

    seen: list[int] = []
    real = base.run_op

    def spying(*args: object, **kwargs: object) -> object:
        seen.append(min(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    import litekiln.reference as reference

    reference.run_op = spying  # type: ignore[assignment]
    try:
        interp = litekiln.Interpreter(model_path=smoke_path, device="reference", num_threads=1)
        interp.run(interp.random_inputs(0))
    finally:
        reference.run_op = real
    assert seen and set(seen) == {1}
