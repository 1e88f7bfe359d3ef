"""TFLite's fixed-point arithmetic for the integer semantics of quantized ops, vectorised.

The integer kernels (``reference_quantized`` of the op families) compute what LiteRT's int8 /
uint8 kernels compute, bit for bit: int32 accumulators (held in int64 arrays, which also keeps
numpy from wrapping), real multipliers turned into a Q31 multiplier and a shift
(``QuantizeMultiplier``, quantization_util.cc), and the rescale
``MultiplyByQuantizedMultiplier`` of ``kernels/internal/common.h``.

That rescale has two variants. The "double rounding" one (gemmlowp's
``SaturatingRoundingDoublingHighMul`` then ``RoundingDivideByPOT``) is the default build; the
"single rounding" one (``TFLITE_SINGLE_ROUNDING``: one 64-bit product, one rounding shift) is
what some builds select. :data:`SINGLE_ROUNDING` picks ours; it is False because LiteRT 2.3
computes double-rounding results (every intermediate tensor of mobilenet_v1_int8 is equal to
ours; single rounding differs in ~0.1-30% of their elements). LiteRT's GEMM-based kernels
(CONV_2D, FULLY_CONNECTED) rescale in ruy, whose final shift breaks ties upward rather than
away from zero (``ties_up``).

Hybrid (dynamic-range) ops quantize float activations on the fly; the helpers at the end are
``tensor_utils::AsymmetricQuantizeFloats`` and ``SymmetricQuantizeFloats`` of
``kernels/internal/reference/portable_tensor_utils.cc``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeGuard

import numpy as np
import numpy.typing as npt

from litekiln.model.ir import Tensor

#: Which MultiplyByQuantizedMultiplier LiteRT was built with (see the module docstring).
SINGLE_ROUNDING = False

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def round_half_away(x: npt.ArrayLike) -> np.ndarray:
    """``TfLiteRound`` / ``std::round``: halves go away from zero (numpy's round is to even)."""
    x = np.asarray(x)
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def quantize_multiplier(real: float) -> tuple[int, int]:
    """``QuantizeMultiplier``: real ~= multiplier * 2**(shift - 31), multiplier in [2**30, 2**31).

    Returns:
        (Q31 multiplier, shift); (0, 0) for 0 and for multipliers below 2**-31, which TFLite
        flushes to zero.
    """
    if real == 0.0:
        return 0, 0
    frac, shift = math.frexp(real)
    q = int(round_half_away(frac * (1 << 31)))
    if q == 1 << 31:
        q //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    if SINGLE_ROUNDING and shift > 30:
        return (1 << 31) - 1, 30
    return q, shift


def quantize_multipliers(reals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`quantize_multiplier` over an array (per-channel scales) -> int64 arrays."""
    pairs = [quantize_multiplier(float(r)) for r in np.asarray(reals, np.float64).reshape(-1)]
    return (np.array([p[0] for p in pairs], np.int64), np.array([p[1] for p in pairs], np.int64))


def _srdhm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """gemmlowp ``SaturatingRoundingDoublingHighMul`` on int32 values held in int64."""
    ab = a * b
    nudge = np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    num = ab + nudge
    # C++ integer division truncates toward zero.
    q = np.where(num >= 0, num >> 31, -((-num) >> 31))
    return np.where((a == _INT32_MIN) & (b == _INT32_MIN), _INT32_MAX, q)


def rounding_divide_by_pot(x: np.ndarray, exponent: np.ndarray | int) -> np.ndarray:
    """gemmlowp ``RoundingDivideByPOT``: x / 2**exponent, ties away from zero."""
    exponent = np.asarray(exponent, np.int64)
    mask = (np.int64(1) << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + (remainder > threshold)


def _sat32(x: int) -> int:
    return max(-(1 << 31), min((1 << 31) - 1, x))


def _srdhm_int(a: int, b: int) -> int:
    """gemmlowp ``SaturatingRoundingDoublingHighMul`` on Python ints."""
    return int(_srdhm(np.asarray(a, np.int64), np.asarray(b, np.int64)))


def inv_sqrt_quantized_multiplier_exp(value: int, reverse_shift: int) -> tuple[int, int]:
    """``GetInvSqrtQuantizedMultiplierExp`` (kernels/internal/common.h): 1/sqrt(value) as a
    Q31 multiplier and a shift, by five Newton-Raphson steps in gemmlowp fixed point (3
    integer bits); values 0 and 1 give (INT32_MAX, 0)."""
    if value <= 1:
        return (1 << 31) - 1, 0
    shift = 11
    while value >= 1 << 29:
        value //= 4
        shift += 1
    pairs = (32 - value.bit_length() - 1) // 2 - 1  # (CountLeadingZeros(value) - 1) / 2 - 1
    shift -= pairs
    value <<= 2 * pairs

    def mul(a: int, b: int) -> int:  # FixedPoint product: SRDHM of the raws
        return _srdhm_int(a, b)

    def rescale_left(x: int, bits: int) -> int:  # SaturatingRoundingMultiplyByPOT<+bits>
        return _sat32(x << bits)

    x_in = value >> 1  # F3
    half_in = int(rounding_divide_by_pot(np.asarray(x_in, np.int64), 1))  # ...ByPOT<-1>
    half_three = (1 << 28) + (1 << 27)  # 1.5 in F3
    x = 1 << 28  # F3::One()
    for _ in range(5):
        x3 = rescale_left(mul(mul(x, x), x), 6)  # F9 -> F3
        x = rescale_left(mul(half_three, x) - mul(half_in, x3), 3)  # F6 -> F3
    x = mul(x, 1518500250)  # times sqrt(2)/2 (F0): F3
    if shift < 0:
        x <<= -shift
        shift = 0
    return x, shift * reverse_shift


def lut_int16(
    transform: Callable[[np.ndarray], np.ndarray],
    input_scale: float,
    input_zero_point: int,
    output_scale: float,
    output_zero_point: int,
) -> np.ndarray:
    """``LUTPopulateInt16<float>`` (kernels/internal/common.h): LiteRT's 513-entry table of
    an int16 function, in float32 as LiteRT computes it: 512 samples over the input's range,
    each biased by half the error linear interpolation makes at the step's midpoint, and the
    range's end. ``transform`` maps float32 arrays to float32 arrays."""
    f = np.float32
    lo, hi = -32768, 32767
    in_min = f(input_scale) * f(lo - input_zero_point)
    in_max = f(input_scale) * f(hi - input_zero_point)
    out_min = f(output_scale) * f(lo - output_zero_point)
    out_max = f(output_scale) * f(hi - output_zero_point)
    steps = 512
    step = (in_max - in_min) / f(steps)
    half = step / f(2)
    inv = f(65536) / (out_max - out_min)
    i = np.arange(steps, dtype=np.float32)
    at = in_min + i * step
    val = transform(at).astype(np.float32)
    mid = transform(at + half).astype(np.float32)
    nxt = transform(in_min + (i + f(1)) * step).astype(np.float32)
    rnd = lambda v: round_half_away(v).astype(np.float32)  # noqa: E731 - TfLiteRound
    sample = rnd(val * inv)
    interp = rnd((nxt * inv + sample) / f(2))
    err = interp - rnd(mid * inv)
    bias = rnd(err / f(2))
    table = np.empty(steps + 1, np.int64)
    table[:steps] = np.clip(sample - bias, lo, hi).astype(np.int64)
    last = rnd(transform(np.array([in_max], np.float32)).astype(np.float32) * inv)
    table[steps] = int(np.clip(last, lo, hi)[0])
    return table


def lut_lookup_int16(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``LUTLookup(int16_t, lut)``: the table entry of the value's top 9 bits plus the slope
    to the next one times its low 7 bits (rounded), int16 arithmetic as in C++."""
    x = np.asarray(x, np.int64)
    index = 256 + (x >> 7)
    offset = x & 0x7F
    base = table[index]
    slope = ((table[index + 1] - base + 32768) & 0xFFFF) - 32768  # (int16_t)
    delta = (slope * offset + 64) >> 7
    return (((base + delta + 32768) & 0xFFFF) - 32768).astype(np.int16)


def multiply_by_quantized_multiplier(
    x: np.ndarray,
    multiplier: np.ndarray | int,
    shift: np.ndarray | int,
    *,
    ties_up: bool = False,
) -> np.ndarray:
    """``MultiplyByQuantizedMultiplier(x, multiplier, shift)`` elementwise (broadcasting).

    Args:
        x: int32 values (any integer dtype; computed in int64).
        multiplier: Q31 multipliers from :func:`quantize_multiplier`.
        shift: their shifts (positive = left).
        ties_up: ruy's variant (``ruy/apply_multiplier.cc``), used by LiteRT's GEMM-based
            kernels (CONV_2D, FULLY_CONNECTED): the final rounding right shift breaks ties
            upward instead of away from zero; the two differ only on negative ties.

    Returns:
        int64 array of the rescaled values.
    """
    x = np.asarray(x, np.int64)
    m = np.asarray(multiplier, np.int64)
    s = np.asarray(shift, np.int64)
    if SINGLE_ROUNDING:
        total = 31 - s
        return (x * m + (np.int64(1) << (total - 1))) >> total
    left = np.maximum(s, 0)
    right = np.maximum(-s, 0)
    high = _srdhm(x * (np.int64(1) << left), m)
    if ties_up:
        half = np.where(right > 0, np.int64(1) << np.maximum(right - 1, 0), 0)
        return (high + half) >> right
    return rounding_divide_by_pot(high, right)


def requantize(
    acc: np.ndarray,
    multiplier: np.ndarray | int,
    shift: np.ndarray | int,
    zero_point: int,
    qmin: int,
    qmax: int,
    dtype: np.dtype,
    *,
    ties_up: bool = False,
) -> np.ndarray:
    """The output stage of TFLite's integer kernels: rescale, add the zero point, clamp."""
    y = multiply_by_quantized_multiplier(acc, multiplier, shift, ties_up=ties_up) + zero_point
    return np.clip(y, qmin, qmax).astype(dtype)


# -- tensor parameters -----------------------------------------------------------------------


def scale_zp(tensor: Tensor) -> tuple[float, int]:
    """Per-tensor (scale, zero point); the first channel's for per-channel tensors."""
    q = tensor.quantization
    if q is None:
        return 1.0, 0
    return float(q.scale.reshape(-1)[0]), int(q.zero_point.reshape(-1)[0])


def channel_scales(tensor: Tensor, channels: int) -> np.ndarray:
    """Scales per output channel (float64), a per-tensor scale broadcast to ``channels``."""
    q = tensor.quantization
    scales = np.ones(1) if q is None else np.asarray(q.scale, np.float64).reshape(-1)
    return np.broadcast_to(scales, (channels,)) if scales.size == 1 else scales


def channel_zero_points(tensor: Tensor, channels: int) -> np.ndarray:
    q = tensor.quantization
    zps = np.zeros(1, np.int64) if q is None else np.asarray(q.zero_point, np.int64).reshape(-1)
    return np.broadcast_to(zps, (channels,)) if zps.size == 1 else zps


def activation_range(code: int, tensor: Tensor) -> tuple[int, int]:
    """``CalculateActivationRangeQuantized``: the clamp of a fused activation, in integers.

    ``quantize(f) = zero_point + round(f / scale)`` in float32, limits clipped to the type's
    range; TANH and SIGN_BIT clamp nothing (as for float kernels, see ``apply_activation``).
    """
    info = np.iinfo(tensor.dtype)
    qmin, qmax = int(info.min), int(info.max)
    scale, zp = scale_zp(tensor)

    def q(f: float) -> int:
        return zp + int(round_half_away(np.float32(f) / np.float32(scale)))

    if code == 1:  # RELU
        return max(qmin, q(0.0)), qmax
    if code == 3:  # RELU6
        return max(qmin, q(0.0)), min(qmax, q(6.0))
    if code == 2:  # RELU_N1_TO_1
        return max(qmin, q(-1.0)), min(qmax, q(1.0))
    return qmin, qmax


def is_integer_quantized(
    tensor: Tensor | None, kinds: tuple[str, ...] = ("int8", "uint8")
) -> TypeGuard[Tensor]:
    """The tensor holds affine-quantized integers of one of ``kinds``."""
    return tensor is not None and tensor.quantization is not None and tensor.dtype.name in kinds


# -- hybrid (dynamic-range) input quantization ------------------------------------------------


def asymmetric_quantize_floats(values: np.ndarray) -> tuple[np.ndarray, float, int]:
    """``AsymmetricQuantizeFloats``: int8 values, scale and zero point of one row/batch.

    The range always includes 0; scale and zero point are computed in double (the zero point
    from whichever end has the smaller error), values quantized in float32 as
    ``round(x * (1 / scale)) + zp``.
    """
    v = np.asarray(values, np.float32).reshape(-1)
    if v.size == 0:
        return np.zeros(0, np.int8), 1.0, 0
    rmin = float(min(0.0, float(v.min())))
    rmax = float(max(0.0, float(v.max())))
    if rmin == rmax:
        return np.zeros(v.size, np.int8), 1.0, 0
    qmin, qmax = -128.0, 127.0
    scale = (rmax - rmin) / (qmax - qmin)
    zp_from_min = qmin - rmin / scale
    zp_from_max = qmax - rmax / scale
    err_min = abs(qmin) + abs(rmin / scale)
    err_max = abs(qmax) + abs(rmax / scale)
    zp_real = zp_from_min if err_min < err_max else zp_from_max
    if zp_real <= qmin:
        zp = -128
    elif zp_real >= qmax:
        zp = 127
    else:
        zp = int(round_half_away(zp_real))
    scale32 = np.float32(scale)
    inv = np.float32(1.0) / scale32
    # round(x / scale) + zp: LiteRT's optimized kernels round before adding the zero point
    # (the portable one rounds zp + x / scale, which differs on ties; measured on
    # mobilenet_v1_dynamic's quantized-input temporaries).
    q = round_half_away(v * inv) + zp
    return np.clip(q, -128, 127).astype(np.int8), float(scale32), zp


def symmetric_quantize_floats(values: np.ndarray) -> tuple[np.ndarray, float]:
    """``SymmetricQuantizeFloats``: int8 values in [-127, 127] and the scale ``range / 127``."""
    v = np.asarray(values, np.float32).reshape(-1)
    if v.size == 0:
        return np.zeros(0, np.int8), 1.0
    r = np.float32(max(abs(float(v.min())), abs(float(v.max()))))
    if r == 0:
        return np.zeros(v.size, np.int8), 1.0
    scale = r / np.float32(127)
    inv = np.float32(127) / r
    q = round_half_away(v * inv)
    return np.clip(q, -127, 127).astype(np.int8), float(scale)
