"""QUANTIZE and DEQUANTIZE: the boundary between float and quantized tensors.

Both see raw integer arrays (``quant_aware``): their whole meaning is the affine mapping.
"""

from __future__ import annotations

import numpy as np

from litekiln.ops.base import (
    OpContext,
    OpDef,
    dequantize,
    is_quantized,
    quantize,
    register,
    required,
)


@register
class Quantize(OpDef):
    name = "QUANTIZE"
    quant_aware = True

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        src, dst = ctx.input_tensor(0), ctx.output_tensor()
        if is_quantized(src):  # requantize: int -> float -> int with the output's parameters
            x = dequantize(x, src)
        return [quantize(x.astype(np.float32), dst)]


@register
class Dequantize(OpDef):
    name = "DEQUANTIZE"
    quant_aware = True

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        src = ctx.input_tensor(0)
        if x.dtype == np.float16 or not is_quantized(src):
            return [x.astype(np.float32)]
        return [dequantize(x, src)]
