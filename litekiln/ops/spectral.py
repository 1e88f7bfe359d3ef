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

import logging

import numpy as np

from litekiln.model.ir import Op, Subgraph
from litekiln.model.loader import check_graph
from litekiln.model.schema import builtin_code
from litekiln.ops.base import Check, OpContext, OpDef, as_planned, register, required

log = logging.getLogger("litekiln")

_COMPLEX = frozenset({"complex64"})


@register
class Rfft2d(OpDef):
    name = "RFFT2D"
    rewritten_at_load = "DFT products at load where each transform is over single rows"
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
        return [as_planned(ctx, np.fft.rfft2(x, s=(h, w), axes=(-2, -1)).astype(np.complex64))]


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


#: The complex64 ops that only move an RFFT2D's values (its chain to a real part).
_MOVES = ("SQUEEZE", "RESHAPE", "EXPAND_DIMS")
#: The ops that end the chain, with the real-valued products they need: the real part
#: (``x @ cos``), the imaginary part (``x @ -sin``), or both for the magnitude.
_ENDS = {"REAL": ("re",), "IMAG": ("im",), "COMPLEX_ABS": ("re", "im"), "CAST": ("re",)}


def _chain(op: Op, graph: Subgraph) -> list[Op] | None:
    """The ops from an RFFT2D's output to the one that makes it real: moves of the complex
    values (one reader each), then REAL, IMAG, COMPLEX_ABS or a CAST to float32; None where
    the output goes anywhere else (a graph output, two readers, another op)."""
    readers = graph.readers()
    kept = set(graph.kept_outputs)
    chain: list[Op] = []
    t = op.outputs[0]
    while True:
        users = readers.get(t, [])
        if t in kept or len(users) != 1:
            return None
        user = users[0]
        chain.append(user)
        if user.name in _MOVES:
            t = user.outputs[0]
            continue
        if user.name in _ENDS and graph.tensors[user.outputs[0]].dtype == np.float32:
            return chain
        return None


def rfft_as_products(op: Op, graph: Subgraph) -> bool:
    """Replace an RFFT2D over single rows, and the ops that take its real part, imaginary
    part or magnitude, by FULLY_CONNECTEDs with the DFT's constant cosine and sine matrices,
    ops the GPU path runs; whether it did.

    An STFT's transform (BirdNET's spectrogram: ``fft_length`` [1, 2048] over 511 frames of
    one row) is a product of its frames with ``K = fft_length[1] / 2 + 1`` cosines (the real
    part) and sines (the imaginary part, negated). Frames shorter than the transform are
    zero-padded by it and longer ones cropped: the matrices leave out the columns past the
    frame and zero those past the transform. The values are the DFT's sums in float32
    (LiteRT's FFT sums in double: they differ by float32 rounding).

        x [..., 1, W] --RESHAPE--> [M, W] --FULLY_CONNECTED (cos [K, W])--> re [M, K]
                                           --FULLY_CONNECTED (-sin [K, W])--> im [M, K]
        re (REAL, CAST), im (IMAG) or SQRT(re*re + im*im) (COMPLEX_ABS)
          --RESHAPE--> the RFFT2D's output, now float32 [..., 1, K]

    The moves of the chain (`_chain`) then move float32 values (their tensors change type),
    and its last op becomes a CAST from float32 to float32 (the same values, its output
    tensor unchanged), so that every shape is still the one each op computes.
    """
    from litekiln.ops.unroll_lstm import OpBuilder

    if op.name != "RFFT2D" or len(op.inputs) != 2:
        return False
    x_t, n_t = op.inputs
    x, n = graph.tensors[x_t], graph.tensors[n_t]
    if x.dtype != np.float32 or len(x.shape) < 2 or x.shape[-2] != 1 or n.data is None:
        return False
    fh, fw = (int(v) for v in np.asarray(n.data).reshape(-1))
    if fh != 1 or fw <= 0 or fw & (fw - 1):
        return False
    chain = _chain(op, graph)
    if chain is None:
        return False
    end = chain[-1]
    spec_t = op.outputs[0]
    w, k = x.shape[-1], fw // 2 + 1
    m = int(np.prod(x.shape[:-2], dtype=np.int64))
    # The DFT's matrices, angles reduced exactly (k * n mod fw) before the cosines.
    cols = np.arange(min(w, fw))
    angle = 2 * np.pi * ((np.arange(k)[:, None] * cols[None, :]) % fw) / fw
    mats = {"re": np.cos(angle), "im": -np.sin(angle)}
    b = OpBuilder(graph, graph.tensors[spec_t].name)
    rows = b.tensor("frames", (m, w))
    b.op("RESHAPE", [x_t, b.const("frames_shape", [m, w], np.int32)], [rows])
    parts = {}
    for part in _ENDS[end.name]:
        mat = np.zeros((k, w), np.float32)
        mat[:, : len(cols)] = mats[part]
        parts[part] = b.fully_connected(rows, b.const(f"dft_{part}", mat), -1, part, (m, k))
    if end.name == "COMPLEX_ABS":
        power = b.binary(
            "ADD",
            b.binary("MUL", parts["re"], parts["re"], "re_squared"),
            b.binary("MUL", parts["im"], parts["im"], "im_squared"),
            "power",
        )
        real = b.unary("SQRT", power, "magnitude")
    else:
        real = parts["re"] if end.name in ("REAL", "CAST") else parts["im"]
    spec = graph.tensors[spec_t]
    spec.dtype = np.dtype(np.float32)
    b.op("RESHAPE", [real, b.const("spectrum_shape", list(spec.shape), np.int32)], [spec_t])
    for move in chain[:-1]:
        graph.tensors[move.outputs[0]].dtype = np.dtype(np.float32)
    end.name, end.code, end.version = "CAST", builtin_code("CAST"), 1
    end.options = {}
    graph.replace_op(op, b.ops)
    check_graph(graph, graph.name)
    log.info("%s and the %d ops after it: DFT products of %d frames (%d ops)",
             op.describe(), len(chain), m, len(b.ops))  # fmt: skip
    return True
