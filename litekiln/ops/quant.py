"""QUANTIZE and DEQUANTIZE: the boundary between float and quantized tensors.

Both see raw integer arrays (``quant_aware``): their whole meaning is the affine mapping.
"""

from __future__ import annotations

import numpy as np

from litekiln.model.ir import Op, Subgraph
from litekiln.ops.base import (
    Check,
    OpContext,
    OpDef,
    dequantize,
    is_quantized,
    quantize,
    register,
    required,
)

_DEQUANTIZE_INPUTS = frozenset({"uint8", "int8", "int16", "float16", "int4"})
_FLOAT32 = np.dtype("float32")


# The GPU path runs both in its float view (`gpu_extended`: LiteRT's GPU delegate runs them
# too, compiler/emit_shape.py): DEQUANTIZE of an activation is its float view unchanged, and
# QUANTIZE (or a requantize) is the quantization simulator the compiler puts after every op
# with a quantized output (`Lowering._fake_quant`). The TFLite converter leaves such pairs
# inside int8 models around ops it has no integer kernel for (Keras ConvNeXt's layer-norm
# NEG: 23 pairs, which split the model into 24 GPU partitions).


@register
class Quantize(OpDef):
    name = "QUANTIZE"
    quant_aware = True
    gpu_extended = True
    versions = (1, 6)
    num_inputs = (1, 1)

    @classmethod
    def validate(cls, c: Check) -> None:
        """quantize.cc: a quantized output; float32 in, uint8/int8/int16 out, or a requantize
        (int16 -> int8/int16/int32, int32 -> int8/int16, int8/uint8 -> uint8/int8/int16) of a
        quantized input; int16 to int16 symmetric. The output keeps the input's shape."""
        super().validate(c)
        x, y = c.input(0), c.output()
        allowed = {
            "float32": {"uint8", "int8", "int16"},
            "int16": {"int8", "int16", "int32"},
            "int32": {"int8", "int16"},
            "int8": {"uint8", "int8", "int16"},
            "uint8": {"uint8", "int8", "int16"},
        }
        if x.type_name not in allowed:
            raise c.fail("dtype", f"input {x.name!r} has type {x.type_name}")
        c.dtype(y, frozenset(allowed[x.type_name]), "output")
        c.quantized(y, "output", per_tensor=False)
        if x.type_name != "float32":
            c.quantized(x, "input", per_tensor=False)
        if x.type_name == "int16" and y.type_name == "int16":
            c.zero_point(x, 0, "input")
            c.zero_point(y, 0, "output")
        c.output_shape(x.shape)

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
    gpu_extended = True
    versions = (1, 9)
    num_inputs = (1, 1)

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        """A quantized input, or a constant one (folded at load where it can be): a float16
        tensor computed at run time has no float view on the GPU path."""
        reason = super().gpu_support(op, graph, allow_quantized=allow_quantized)
        x = graph.tensors[op.inputs[0]]
        if reason is None and not is_quantized(x) and x.data is None:
            return f"a {x.dtype.name} input computed at run time"
        return reason

    @classmethod
    def validate(cls, c: Check) -> None:
        """dequantize.cc: a uint8, int8, int16 (symmetric) or float16 input; the kernel
        makes the output float32 of the input's shape. litekiln wants integer inputs
        quantized (LiteRT would scale them by 0)."""
        super().validate(c)
        x = c.input(0)
        name = x.type_name
        if name not in _DEQUANTIZE_INPUTS:
            c.dtype(x, _DEQUANTIZE_INPUTS, "input")
        c.output_dtype(_FLOAT32)
        if name != "float16":
            c.quantized(x, "input", per_tensor=False)
        if name == "int16":
            c.zero_point(x, 0, "input")
        c.output_shape(x.shape)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        src = ctx.input_tensor(0)
        if x.dtype == np.float16 or not is_quantized(src):
            return [x.astype(np.float32)]
        return [dequantize(x, src)]
