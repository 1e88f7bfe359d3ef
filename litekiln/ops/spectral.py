"""Spectral ops on the CPU: RFFT2D and the complex64 ops that read its output (COMPLEX_ABS,
REAL, IMAG; CAST takes complex64 too, in :mod:`litekiln.ops.elementwise`).

Audio models compute their spectrogram in the graph: TensorFlow's ``tf.signal.stft`` converts
to frames (GATHER), a window (MUL), RFFT2D over the last axis, then a magnitude or the real
part (BirdNET's mel spectrogram: RFFT2D, SQUEEZE, CAST to float32). These ops run on the CPU,
a partition before the network's GPU one; complex64 tensors never reach the GPU path (the
partitioner keeps every op with a non-float tensor on the CPU).

References follow LiteRT's kernels (tflite/kernels/rfft2d.cc, complex.cc): RFFT2D crops or
zero-pads each input matrix to ``fft_length`` and transforms it in double precision
(Ooura's fft2d), then stores complex64; numpy's FFT in float64 gives the same values to
float32 rounding.
"""

from __future__ import annotations

import numpy as np

from litekiln.ops.base import Check, OpContext, OpDef, register, required

_COMPLEX = frozenset({"complex64"})


@register
class Rfft2d(OpDef):
    name = "RFFT2D"
    num_inputs = (2, 2)

    @classmethod
    def validate(cls, c: Check) -> None:
        """rfft2d.cc: a float32 input of rank 2 or more; ``fft_length`` an int32 pair of
        powers of two; the output complex64, the input's shape with its last two dimensions
        ``fft_length[0]`` and ``fft_length[1] / 2 + 1``."""
        super().validate(c)
        x, n = c.input(0), c.input(1)
        c.dtype(x, frozenset({"float32"}), "input")
        c.rank(x, 2, 8, "input")
        c.dtype(n, frozenset({"int32"}), "fft_length")
        if n.shape != (2,):
            raise c.fail("shape", f"fft_length {n.name!r} has shape {list(n.shape)}, not [2]")
        c.output_dtype(np.dtype(np.complex64))
        if n.data is None:
            return  # sized at run time: the declared shape is trusted
        h, w = (int(v) for v in np.asarray(n.data).reshape(-1))
        _powers_of_two(c.fail, h, w)
        c.output_shape((*x.shape[:-2], h, w // 2 + 1))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = np.asarray(required(ctx, inputs, 0), np.float64)
        h, w = (int(v) for v in np.asarray(required(ctx, inputs, 1)).reshape(-1))
        _powers_of_two(lambda _r, m: ctx.fail(m), h, w)
        # (the kernel crops each matrix to fft_length and zero-pads it, as numpy's s= does)
        y = np.fft.rfft2(x, s=(h, w), axes=(-2, -1)).astype(np.complex64)
        out = ctx.output_tensor()
        if y.shape != out.shape:
            raise ctx.fail(
                f"computes an output of shape {list(y.shape)} from an fft_length known only at "
                f"run time; the model declares {list(out.shape)}"
            )
        return [y]


def _powers_of_two(fail, h: int, w: int) -> None:  # noqa: ANN001
    """rfft2d.cc: Ooura's fft2d takes powers of two only."""
    for v in (h, w):
        if v <= 0 or v & (v - 1):
            raise fail("fft-length", f"fft_length [{h}, {w}]: {v} is not a power of two")


class _ComplexToFloat(OpDef):
    """complex.cc: a complex64 input, a float32 output of its shape."""

    num_inputs = (1, 1)

    @classmethod
    def validate(cls, c: Check) -> None:
        super().validate(c)
        x = c.input(0)
        c.dtype(x, _COMPLEX, "input")
        c.output_dtype(np.dtype(np.float32))
        c.output_shape(x.shape)

    @staticmethod
    def part(x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        return [cls.part(np.asarray(required(ctx, inputs, 0))).astype(np.float32)]


@register
class ComplexAbs(_ComplexToFloat):
    name = "COMPLEX_ABS"

    @staticmethod
    def part(x: np.ndarray) -> np.ndarray:
        return np.abs(x)


@register
class Real(_ComplexToFloat):
    name = "REAL"

    @staticmethod
    def part(x: np.ndarray) -> np.ndarray:
        return x.real


@register
class Imag(_ComplexToFloat):
    name = "IMAG"

    @staticmethod
    def part(x: np.ndarray) -> np.ndarray:
        return x.imag
