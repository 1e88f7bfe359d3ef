"""8-bit inputs and outputs (de)quantized on the device; no quantization simulated after copies.

A quantized partition input is a program input of its integer dtype: the session hands the
program the integers (a quarter of the bytes of their float view, no pass on the CPU) and the
program dequantizes them, inside the convolution that reads them where it can
(`lowering.conv_folded`). A reshape, pad, slice, concatenation or max pool whose quantized
output has its inputs' parameters gets no simulator: its values are on that grid already.

The references: the numpy formula of the simulator (the identity claimed), the same model
compiled the old way (the CPU dequantizes: bit-identical outputs), and LiteRT (the op cases
in tests/test_gpu_ops.py, `MISC`).
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_helper import Case, build_model, launched_kernels
from test_gpu_ops import _uint8_conv_reshape_softmax

import litekiln
from litekiln.compiler import lowering


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16"])
def test_simulator_after_a_copy_gives_each_value_back(dtype: str) -> None:
    """round(((q - z) * s) / s) = q - z in float32 for every integer of the dtype and scales
    over ten decades: the simulator `_keeps_grid` leaves out would change nothing."""
    info = np.iinfo(dtype)
    q = np.arange(info.min, info.max + 1, dtype=np.int64)
    rng = np.random.default_rng(0)
    for s in np.concatenate([10.0 ** rng.uniform(-7, 3, 200), [1 / 256, 1 / 255, 0.1]]):
        s32 = np.float32(s)
        for z in (0, int(info.min) // 2, int(info.max) // 3):
            x = np.subtract(q, z).astype(np.float32) * s32  # dequantized, as the program does
            e = np.clip(np.rint(x / s32) + np.float32(z), info.min, info.max)
            y = (e - np.float32(z)).astype(np.float32) * s32
            assert np.array_equal(y, x), (s, z)


def _model() -> bytes:
    return build_model([Case("c", _uint8_conv_reshape_softmax)]).model


def test_the_kernels_take_and_return_integers_and_the_reshape_is_no_kernel() -> None:
    for schedules in ("fast-cpu", "fast"):
        names = launched_kernels(_model(), schedules)
        # (fast-cpu launches the convolution as two regions: the border and the inside)
        funcs = list(dict.fromkeys(names))
        assert len(funcs) == 2, names  # the convolution, the softmax
        assert lowering.DEQUANT_CONV_NAME in funcs[0], names
        assert "softmax" in funcs[1], names
        assert not any(n.startswith(("cast", "fused_cast")) or "reshape" in n for n in names)
        assert funcs[1].endswith("_cast"), names  # the output quantized in the softmax's kernel


@pytest.mark.opencl
def test_an_output_is_rounded_once() -> None:
    """The softmax's output is returned as its integers and read by no op: its kernel
    quantizes the softmax's value once (no simulator before the output's quantization: the
    same integers, `Lowering._quantized_by_output`; tests/test_gpu_ops.py checks them against
    LiteRT)."""
    it = litekiln.Interpreter(model_content=_model(), use_cache=False)
    it.allocate_tensors()
    program = it._backend.compiled.partitions[0].program  # type: ignore[union-attr]
    last = program.launches[-1].kernel
    (body,) = [k for k in program.source.split("// Function: ") if k.startswith(last + "\n")]
    assert body.count("rint(") == 1, body


@pytest.mark.opencl
def test_device_dequantization_is_the_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """The program that takes and returns integers gives bit-identical outputs to the
    program of an older compiler, which takes and returns floats that the session
    (de)quantizes on the CPU."""
    model = _model()
    rng = np.random.default_rng(1)
    feeds = [rng.integers(0, 256, [1, 9, 9, 3]).astype(np.uint8) for _ in range(3)]

    def run() -> tuple[str, list[np.ndarray]]:
        it = litekiln.Interpreter(model_content=model, use_cache=False)
        it.allocate_tensors()
        program = it._backend.compiled.partitions[0].program  # type: ignore[union-attr]
        dtypes = {s.id: s.dtype for s in program.tensors}
        io = (dtypes[program.inputs[0]], dtypes[program.outputs[0]])
        return io, [it.run([x])[0] for x in feeds]

    io, on_device = run()
    monkeypatch.setattr(lowering, "INTEGER_IO_DTYPES", frozenset())
    old_io, on_cpu = run()
    assert (io, old_io) == (("uint8", "uint8"), ("float32", "float32"))
    for a, b in zip(on_device, on_cpu, strict=True):
        assert a.dtype == np.uint8
        np.testing.assert_array_equal(a, b)
    assert len({a.tobytes() for a in on_device}) == 3  # (the inputs matter)


def test_copies_of_quantized_values_simulate_nothing() -> None:
    """A max pool, a concatenation and a pad with their inputs' parameters: no simulator
    (a rounding, then back to floats: subtract the zero point, multiply by the scale) in any
    kernel; the output is quantized once, to the integers returned. The values against
    LiteRT's integers, exactly: tests/test_gpu_ops.py, case int8_pool_concat_pad."""
    import re

    from test_gpu_ops import _int8_pool_concat

    names = launched_kernels(build_model([Case("c", _int8_pool_concat)]).model, "fast-cpu")
    assert names and not any(re.search(r"round.*subtract", n) for n in names), names
    assert sum("round" in n for n in names) == 1, names
