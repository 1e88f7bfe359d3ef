"""Ops that LiteRT runs and litekiln refused at load, against LiteRT: RANGE, FILL,
ZEROS_LIKE, RANK, BROADCAST_ARGS, ONE_HOT (litekiln/ops/generate.py); RFFT2D, COMPLEX_ABS,
REAL, IMAG and CAST from complex64 (litekiln/ops/spectral.py); SPACE_TO_BATCH_ND,
BATCH_TO_SPACE_ND (litekiln/ops/shape.py); LOCAL_RESPONSE_NORMALIZATION
(litekiln/ops/reduce.py). With inputs fed at run time (the CPU reference sizes the output)
and as constants (folded at load), and LiteRT's refusals. BirdNET's V2.4 classifier, which
computes its mel spectrogram with RANGE and RFFT2D, was among the models refused."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from oplib import Quant, Spec, check_op, run_litert, run_reference
from tflite_builder import ModelBuilder

import litekiln
from litekiln.errors import ModelError

I32, I64, F32 = np.int32, np.int64, np.float32


def _scalars(*values: Any, dtype: Any) -> list[np.ndarray]:
    return [np.asarray(v, dtype) for v in values]


@pytest.mark.parametrize(
    ("start", "limit", "delta", "dtype"),
    [
        (0, 10, 1, I32),
        (3, 18, 4, I32),  # (a last step past the limit: 4 values)
        (10, -5, -3, I32),
        (0, 5000000000, 1000000000, I64),
        (0.0, 1.0, 0.1, F32),  # float32 sums accumulate rounding, as the kernel's
        (-2.5, 100.25, 0.37, F32),
        (5.0, -1.0, -0.5, F32),
    ],
)
def test_range_fed_at_run_time(start: Any, limit: Any, delta: Any, dtype: Any) -> None:
    res = check_op("RANGE", _scalars(start, limit, delta, dtype=dtype), tol=0)
    assert res.litert[0].dtype == dtype


def test_range_of_constants_folds_at_load() -> None:
    """The shape arithmetic of an STFT's framing: RANGE of constants is a constant once
    loaded, of the length it computes (the file declares a placeholder), its values
    LiteRT's."""
    b = ModelBuilder()
    x = b.input("x", [4])
    r = b.op(
        "RANGE",
        [np.asarray(0, I32), np.asarray(511, I32), np.asarray(1, I32)],
        out_shape=[1],  # (a converter's placeholder: LiteRT sizes it at Prepare)
        out_dtype="int32",
    )
    y = b.op("MUL", [r, np.asarray(139, I32)], out_dtype="int32", out_shape=[1])
    b.output(y, x)
    model = b.build()
    graph = litekiln.load_model(model).main
    (out, _) = graph.outputs
    assert graph.tensors[out].shape == (511,)
    assert graph.ops[0].folded  # (the MUL writes a graph output: it stays an op)
    feeds = [np.zeros(4, F32)]
    np.testing.assert_array_equal(run_reference(model, feeds)[0], run_litert(model, feeds)[0])


@pytest.mark.parametrize(
    ("start", "limit", "delta"), [(0, 10, 0), (0, 10, -1), (10, 0, 2)], ids=str
)
def test_range_refuses_what_litert_refuses(start: int, limit: int, delta: int) -> None:
    b = ModelBuilder()
    x = b.input("x", [1])
    r = b.op("RANGE", _scalars(start, limit, delta, dtype=I32), out_shape=[1], out_dtype="int32")
    b.output(r, x)
    model = b.build()
    with pytest.raises(Exception):  # noqa: B017 - LiteRT's is a RuntimeError
        run_litert(model, [np.zeros(1, F32)])
    with pytest.raises(ModelError, match="delta"):
        litekiln.load_model(model)


@pytest.mark.parametrize(
    ("value", "dims"),
    [
        (np.asarray(1.5, F32), [2, 3]),
        (np.asarray(-7, I32), [4]),
        (np.asarray(9, I64), [1, 2, 2]),
        (np.asarray(True), [3]),
    ],
    ids=lambda v: str(v),
)
def test_fill(value: np.ndarray, dims: list[int]) -> None:
    check_op("FILL", [np.asarray(dims, I32), value], tol=0)  # dims fed: sized at run time
    check_op("FILL", [value], consts={0: np.asarray(dims, I64)}, tol=0)  # folded at load


def test_fill_quantized_copies_the_stored_value() -> None:
    q = Quant(scale=0.5, zero_point=3)
    value = Spec([], "int8", q, np.asarray(-20, np.int8))
    check_op("FILL", [value], consts={0: np.asarray([2, 2], I32)}, out_quant=q, qtol=0)


@pytest.mark.parametrize("dtype", [F32, I32, I64])
def test_zeros_like(dtype: Any) -> None:
    x = (np.arange(12).reshape(3, 4) - 5).astype(dtype)
    check_op("ZEROS_LIKE", [x], tol=0)


@pytest.mark.parametrize("shape", [[], [5], [2, 3, 4, 1]], ids=str)
def test_rank(shape: list[int]) -> None:
    check_op("RANK", [np.zeros(shape, F32)], out_dtype="int32", out_shape=[])


@pytest.mark.parametrize(
    ("a", "b"), [([2, 1, 3], [4, 1]), ([1], [5, 6]), ([7, 1], [1, 9]), ([3], [3])], ids=str
)
@pytest.mark.parametrize("dtype", [I32, I64])
def test_broadcast_args(a: list[int], b: list[int], dtype: Any) -> None:
    check_op("BROADCAST_ARGS", [np.asarray(a, dtype), np.asarray(b, dtype)], tol=0)


def test_broadcast_args_refuses_shapes_that_do_not_broadcast() -> None:
    b = ModelBuilder()
    x = b.input("x", [1])
    y = b.op(
        "BROADCAST_ARGS",
        [np.asarray([2, 3], I32), np.asarray([4], I32)],
        out_shape=[2],
        out_dtype="int32",
    )
    b.output(y, x)
    with pytest.raises(ModelError, match="do not broadcast"):
        litekiln.load_model(b.build())


@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize(
    ("on", "off"),
    [(np.asarray(1.0, F32), np.asarray(0.0, F32)), (np.asarray(5, I32), np.asarray(-1, I32))],
    ids=["float", "int32"],
)
@pytest.mark.parametrize("idx_dtype", [I32, I64])
def test_one_hot(axis: int, on: np.ndarray, off: np.ndarray, idx_dtype: Any) -> None:
    idx = np.asarray([[0, 3, 1], [4, -1, 2]], idx_dtype)  # 4 and -1: outside depth 4, all off
    check_op("ONE_HOT", [idx], {"axis": axis}, consts={1: np.asarray(4, I32), 2: on, 3: off}, tol=0)


def test_one_hot_depth_fed_at_run_time() -> None:
    idx = np.asarray([2, 0, 1], I32)
    check_op(
        "ONE_HOT",
        [idx, np.asarray(3, I32)],
        {"axis": -1},
        consts={2: np.asarray(1.0, F32), 3: np.asarray(0.0, F32)},
        tol=0,
    )


def _spectral_model(x_shape: list[int], fft: tuple[int, int], then: str) -> bytes:
    """x -> RFFT2D(fft_length) -> ``then`` (REAL, IMAG, COMPLEX_ABS, or CAST to float32)."""
    b = ModelBuilder()
    x = b.input("x", x_shape)
    spec = b.op(
        "RFFT2D",
        [x, np.asarray(fft, I32)],
        out_shape=[*x_shape[:-2], fft[0], fft[1] // 2 + 1],
        out_dtype="complex64",
    )
    options = {"in_data_type": "COMPLEX64", "out_data_type": "FLOAT32"} if then == "CAST" else None
    y = b.op(then, [spec], out_dtype="float32", options=options)
    b.output(y)
    return b.build()


@pytest.mark.parametrize("then", ["REAL", "IMAG", "COMPLEX_ABS", "CAST"])
@pytest.mark.parametrize(
    ("x_shape", "fft"),
    [
        ([1, 1, 8, 64], (8, 64)),
        ([2, 3, 16], (4, 32)),  # cropped to 4 rows, zero-padded to 32 columns
        ([1, 5, 1, 2048], (1, 2048)),  # BirdNET's frames: 2048-point transforms
    ],
    ids=str,
)
def test_rfft2d_against_litert(then: str, x_shape: list[int], fft: tuple[int, int]) -> None:
    model = _spectral_model(x_shape, fft, then)
    x = np.random.default_rng(len(x_shape)).uniform(-1, 1, x_shape).astype(F32)
    (lit,) = run_litert(model, [x])
    (ref,) = run_reference(model, [x])
    assert ref.shape == lit.shape and ref.dtype == lit.dtype == F32
    # (LiteRT's Ooura FFT and numpy's, both in double, stored as float32)
    np.testing.assert_allclose(ref, lit, atol=1e-5 * max(1.0, float(np.abs(lit).max())))


def _stft_model(then: str, frame: int, fft: tuple[int, int]) -> bytes:
    """Frames [1, 6, 1, frame] -> RFFT2D(fft) -> SQUEEZE -> ``then`` -> a FULLY_CONNECTED and
    LOGISTIC: an audio model's spectrogram before its network."""
    b = ModelBuilder()
    x = b.input("x", [1, 6, 1, frame])
    k = fft[1] // 2 + 1
    spec = b.op("RFFT2D", [x, np.asarray(fft, I32)], out_shape=[1, 6, fft[0], k],
                out_dtype="complex64")  # fmt: skip
    if fft[0] == 1:
        spec = b.op("SQUEEZE", [spec], out_shape=[1, 6, k], out_dtype="complex64",
                    options={"squeeze_dims": [2]})  # fmt: skip
    opts = {"in_data_type": "COMPLEX64", "out_data_type": "FLOAT32"} if then == "CAST" else None
    real = b.op(then, [spec], out_dtype="float32", options=opts)
    w = np.random.default_rng(0).uniform(-0.1, 0.1, [8, k]).astype(F32)
    flat = b.op("RESHAPE", [real, np.asarray([6 * fft[0], k], I32)], out_shape=[6 * fft[0], k])
    y = b.op("FULLY_CONNECTED", [flat, w, None], out_shape=[6 * fft[0], 8])
    b.output(b.op("LOGISTIC", [y]))
    return b.build()


@pytest.mark.parametrize("then", ["REAL", "IMAG", "COMPLEX_ABS", "CAST"])
@pytest.mark.parametrize("frame", [64, 48, 80])  # (the transform zero-pads 48, crops 80)
def test_an_stft_runs_on_the_gpu_as_dft_products(then: str, frame: int) -> None:
    """An RFFT2D over single rows, read only through moves to its real part, imaginary part
    or magnitude, becomes FULLY_CONNECTEDs with the DFT's matrices at load (BirdNET's
    spectrogram): no complex tensor left, the whole model on the GPU, LiteRT's values."""
    from litekiln.artifact.compiled import CompileOptions
    from litekiln.compiler.driver import plan_partitions

    model = _stft_model(then, frame, (1, 64))
    graph = litekiln.load_model(model).main
    assert not any(op.name == "RFFT2D" for op in graph.live_ops())
    assert not any(t.dtype.kind == "c" for t in graph.tensors)
    plan = plan_partitions(litekiln.load_model(model), CompileOptions())
    assert not plan.cpu_reasons, plan.cpu_reasons
    xv = np.random.default_rng(1).uniform(-1, 1, [1, 6, 1, frame]).astype(F32)
    interp = litekiln.Interpreter(model_content=model, use_cache=False)
    interp.allocate_tensors()
    (ours,) = interp.run([xv])
    (lit,) = run_litert(model, [xv])
    np.testing.assert_allclose(ours, lit, atol=1e-5)


def test_a_2d_transform_stays_on_the_cpu() -> None:
    """An RFFT2D over several rows is no single product: it and its complex64 ops run on
    the CPU (the reference), the network after it as the placement decides; LiteRT's
    values."""
    from litekiln.artifact.compiled import CompileOptions
    from litekiln.compiler.driver import plan_partitions

    model = _stft_model("COMPLEX_ABS", 64, (4, 64))
    plan = plan_partitions(litekiln.load_model(model), CompileOptions())
    for i in (0, 1):  # RFFT2D, COMPLEX_ABS
        assert plan.cpu_reasons[i] == "no GPU form in litekiln", plan.cpu_reasons
    xv = np.random.default_rng(1).uniform(-1, 1, [1, 6, 1, 64]).astype(F32)
    interp = litekiln.Interpreter(model_content=model, use_cache=False)
    interp.allocate_tensors()
    (ours,) = interp.run([xv])
    (lit,) = run_litert(model, [xv])
    np.testing.assert_allclose(ours, lit, atol=1e-5)


def test_an_empty_constant_shape_reshapes_to_a_scalar() -> None:
    """TensorFlow's converter writes ``tf.reshape(x, [])``'s shape as an int32 [0] on the
    empty buffer, which no op writes (BirdNET): an empty constant, as LiteRT reads it."""
    b = ModelBuilder()
    x = b.input("x", [1])
    empty = b.tensor("shape", [0], "int32")  # (no data, no producer)
    y = b.op("RESHAPE", [x, empty], out_shape=[])
    b.output(y)
    model = b.build()
    feeds = [np.asarray([2.5], F32)]
    (ref,) = run_reference(model, feeds)
    (lit,) = run_litert(model, feeds)
    assert ref.shape == lit.shape == ()
    assert ref == lit


@pytest.mark.parametrize(
    ("shape", "block", "pads"),
    [
        ([1, 4, 4, 3], [2, 2], [[0, 0], [0, 0]]),
        ([2, 5, 7, 2], [2, 3], [[1, 0], [0, 2]]),  # padded to 6x9
        ([1, 6, 4], [3], [[0, 3]]),  # rank 3: [batch, space, depth]
    ],
    ids=str,
)
def test_space_to_batch_and_back(shape: list[int], block: list[int], pads: list[list[int]]) -> None:
    x = np.random.default_rng(3).uniform(-1, 1, shape).astype(F32)
    blocks = {1: np.asarray(block, I32), 2: np.asarray(pads, I32)}
    s2b = check_op("SPACE_TO_BATCH_ND", [x], consts=blocks, tol=0)
    check_op("BATCH_TO_SPACE_ND", [s2b.litert[0]], consts=blocks, tol=0)  # (the pads as crops)


def test_space_to_batch_quantized_pads_with_the_zero_point() -> None:
    q = Quant(scale=0.1, zero_point=-5)
    x = Spec([1, 3, 3, 2], "int8", q)
    consts = {1: np.asarray([2, 2], I32), 2: np.asarray([[1, 0], [0, 1]], I32)}
    check_op("SPACE_TO_BATCH_ND", [x], consts=consts, out_quant=q, qtol=0)


def test_batch_to_space_refuses_a_batch_the_blocks_do_not_divide() -> None:
    b = ModelBuilder()
    x = b.input("x", [3, 2, 2, 1])
    y = b.op(
        "BATCH_TO_SPACE_ND",
        [x, np.asarray([2, 2], I32), np.zeros([2, 2], I32)],
        out_shape=[1, 4, 4, 1],
    )
    b.output(y)
    with pytest.raises(ModelError, match="does not divide"):
        litekiln.load_model(b.build())


@pytest.mark.parametrize(
    ("radius", "bias", "alpha", "beta"),
    [(2, 1.0, 1e-4, 0.75), (5, 2.0, 0.5, 0.5), (0, 1.0, 1.0, 1.0)],
)
def test_local_response_normalization(radius: int, bias: float, alpha: float, beta: float) -> None:
    x = Spec([1, 3, 4, 16], low=-3, high=3)
    options = {"radius": radius, "bias": bias, "alpha": alpha, "beta": beta}
    check_op("LOCAL_RESPONSE_NORMALIZATION", [x], options, tol=(1e-6, 2e-6))


def test_a_warm_start_rewrites_the_stft_as_a_compile_does() -> None:
    """A warm start that skipped the op registry would read the RFFT2D the compile made DFT
    products, and miss its entry: a model holding one loads with the registry's rewrites."""
    from litekiln.loading import _rewritten_at_load
    from litekiln.model import load_model

    assert _rewritten_at_load(load_model(_stft_model("REAL", 64, (1, 64)), validate=False))
