"""The op registry and the shared bases every op family builds on.

Each TFLite operator litekiln knows is one :class:`OpDef` subclass, registered under its TFLite
name (builtin name such as ``"CONV_2D"``, or the custom code such as
``"Convolution2DTransposeBias"``). The class is the one place where that op's semantics live:

* ``reference``: the numpy implementation. It is both the oracle the GPU path is checked
  against and the CPU fallback the runtime executes, so it must match LiteRT.
* ``gpu_support``: whether the op (at this version, with these options, ranks and dtypes) may
  go to a GPU partition; a string reason when it may not.

Quantized tensors are handled once, in :func:`run_op`. An op that defines
``reference_quantized`` gets the raw integer arrays and computes what LiteRT's integer (or
hybrid) kernels compute (fixed-point helpers in :mod:`litekiln.ops.qmath`). Otherwise inputs
are dequantized to float, ``reference`` computes in float, outputs are requantized (the "float
view" of the TFLite GPU delegate). Ops whose semantics are about quantization itself set
``quant_aware = True`` and see raw integer arrays.

Nothing here imports TVM: the runtime imports this module for its CPU fallback.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeGuard

import numpy as np

from litekiln.errors import ModelError, UnsupportedOpError
from litekiln.model.ir import Op, Subgraph, Tensor

#: name -> OpDef subclass; filled by ``@register`` as the family modules are imported.
REGISTRY: dict[str, type[OpDef]] = {}


def register(cls: type[OpDef]) -> type[OpDef]:
    """Class decorator: add an op definition to the registry under ``cls.name``."""
    names = (cls.name, *cls.aliases)
    for name in names:
        if name in REGISTRY and REGISTRY[name] is not cls:
            raise RuntimeError(f"op {name!r} registered twice")
        REGISTRY[name] = cls
    return cls


def lookup(op: Op) -> type[OpDef]:
    """The definition for an IR op.

    Raises:
        UnsupportedOpError: litekiln has no implementation of the op.
    """
    from litekiln import ops as _families  # noqa: F401  (importing registers every family)

    cls = REGISTRY.get(op.name)
    if cls is None:
        kind = f"custom op {op.custom_code!r}" if op.is_custom else f"builtin op {op.name}"
        raise UnsupportedOpError(
            f"{op.describe()}: {kind} (op code #{op.code}) is not supported by litekiln, "
            f"not even on the CPU"
        )
    return cls


@dataclass
class OpContext:
    """What an op's reference implementation gets besides its input arrays."""

    op: Op
    graph: Subgraph

    @property
    def options(self) -> dict[str, Any]:
        return self.op.options

    def input_tensor(self, i: int) -> Tensor | None:
        t = self.op.inputs[i] if i < len(self.op.inputs) else -1
        return self.graph.tensors[t] if t >= 0 else None

    def output_tensor(self, i: int = 0) -> Tensor:
        return self.graph.tensors[self.op.outputs[i]]

    def fail(self, msg: str) -> ModelError:
        return ModelError(f"{self.op.describe()}: {msg}")


class OpDef:
    """Base of every op definition. Subclasses set the class attributes and ``reference``.

    Attributes:
        name: TFLite builtin name or custom code.
        aliases: other names served by the same definition.
        gpu: the op is in the documented GPU op table (docs/architecture.md, "Op tables").
        gpu_extended: not in the documented table, but the TFLite GPU delegate runs it and
            so can we; used when the extended op table is selected.
        gpu_max_version: newest version the GPU path accepts for float models.
        gpu_quant_max_version: newest version accepted when quantized models are allowed
            (the quantized versions of an op are numbered above its float ones).
        quant_aware: ``reference`` handles quantized integer arrays itself.
    """

    name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    gpu: ClassVar[bool] = False
    gpu_extended: ClassVar[bool] = False
    gpu_max_version: ClassVar[int] = 1
    gpu_quant_max_version: ClassVar[int] = 1
    quant_aware: ClassVar[bool] = False

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        """Compute the op's outputs with numpy (float view for quantized tensors)."""
        raise NotImplementedError

    @classmethod
    def reference_quantized(
        cls, ctx: OpContext, inputs: list[np.ndarray | None]
    ) -> list[np.ndarray] | None:
        """Integer semantics of the op when some of its tensors are quantized.

        Gets the raw arrays (quantized tensors as their stored integers, float tensors as
        floats) and returns the raw outputs, computed as LiteRT's integer or hybrid kernels
        do. None (the default, or for a case without integer semantics) means "use the
        float view": dequantize, ``reference``, requantize.
        """
        return None

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        """None if the GPU path can run ``op``; otherwise the reason it cannot.

        The default checks the table membership, the version limit and that every tensor is
        float (or a quantized tensor with a float view when ``allow_quantized``). Families
        add their own constraints (ranks, options, constant operands).
        """
        if not (cls.gpu or cls.gpu_extended):
            return "not in the GPU op table"
        quantized = any(
            graph.tensors[t].quantization is not None and graph.tensors[t].dtype.kind in "iu"
            for t in [*op.inputs, *op.outputs]
            if t >= 0
        )
        # In a quantized model even the float ops carry the quantized versions (the converter
        # writes CONV_2D v5 for the float first layer of a dynamic-range MobileNet).
        limit = (
            cls.gpu_quant_max_version
            if allow_quantized and (quantized or graph.is_quantized)
            else cls.gpu_max_version
        )
        if op.version > limit:
            return f"version {op.version} > {limit}, the newest the GPU path accepts"
        if quantized and not allow_quantized:
            return "quantized tensors, and quantized models are not allowed"
        for t in [*op.inputs, *op.outputs]:
            if t < 0:
                continue
            tensor = graph.tensors[t]
            if tensor.dtype.kind == "f" or tensor.quantization is not None:
                continue
            if tensor.is_constant and t in cls.integer_operands(op):
                continue
            return f"tensor {tensor.name!r} has dtype {tensor.dtype.name}; the GPU path is float"
        return None

    @classmethod
    def integer_operands(cls, op: Op) -> set[int]:
        """Tensor indices that are legitimately integer constants (shapes, axes, paddings)."""
        return set()


# -- fused activations ----------------------------------------------------------------------


#: ActivationFunctionType codes -> names; a name (or None) passed instead maps to itself.
_ACTIVATION_NAMES: dict[int | str | None, str] = {
    0: "NONE",
    1: "RELU",
    2: "RELU_N1_TO_1",
    3: "RELU6",
    4: "TANH",
    5: "SIGN_BIT",
}


def apply_activation(x: np.ndarray, code: int | str | None) -> np.ndarray:
    """Apply a TFLite fused activation (ActivationFunctionType code or name) as LiteRT does.

    LiteRT's float kernels turn the fused activation into a clamp range
    (``CalculateActivationRange``): RELU, RELU6 and RELU_N1_TO_1 clamp; TANH and SIGN_BIT give
    an unbounded range, i.e. they are ignored (measured against LiteRT's conv, pool and
    elementwise kernels). The reference follows LiteRT, not the schema's names.
    """
    name = _ACTIVATION_NAMES.get(code, code)
    if name in (None, "NONE", "TANH", "SIGN_BIT"):
        return x
    if name == "RELU":
        return np.maximum(x, 0).astype(x.dtype, copy=False)
    if name == "RELU6":
        return np.clip(x, 0, 6).astype(x.dtype, copy=False)
    if name == "RELU_N1_TO_1":
        return np.clip(x, -1, 1).astype(x.dtype, copy=False)
    raise ValueError(f"unknown fused activation {code!r}")


def fused_activation(op: Op) -> int:
    return int(op.options.get("fused_activation_function", 0) or 0)


def activation_supported_on_gpu(op: Op) -> str | None:
    act = fused_activation(op)
    if act in (0, 1, 2, 3):
        return None
    # TANH / SIGN_BIT: LiteRT's CPU kernels ignore them while the GPU delegate applies them;
    # keeping such ops on the CPU keeps litekiln's result equal to LiteRT's.
    return f"fused activation code {act} is not supported on the GPU"


# -- shared bases ---------------------------------------------------------------------------


class UnaryOp(OpDef):
    """y = fn(x), elementwise."""

    fn: ClassVar[Callable[[np.ndarray], np.ndarray]]

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x = required(ctx, inputs, 0)
        y = np.asarray(cls.fn(x))
        return [y.astype(_compute_dtype(ctx.output_tensor().dtype, y.dtype), copy=False)]


class BinaryOp(OpDef):
    """z = act(fn(x, y)) with numpy broadcasting (TFLite's broadcast rules are numpy's)."""

    # numpy ufuncs (np.add...) and lambdas of two arrays. Typed loosely: numpy's stubs type
    # ufunc calls as returning Any, and mypy binds a fixed-arity Callable class attribute like
    # a method (dropping its first parameter), which a staticmethod'd ufunc would not match.
    fn: ClassVar[Callable[..., np.ndarray]]

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x, y = required(ctx, inputs, 0), required(ctx, inputs, 1)
        z = cls.fn(x, y)
        out_dtype = ctx.output_tensor().dtype
        z = apply_activation(np.asarray(z), fused_activation(ctx.op))
        return [z.astype(_compute_dtype(out_dtype, z.dtype), copy=False)]

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        reason = super().gpu_support(op, graph, allow_quantized=allow_quantized)
        if reason:
            return reason
        reason = activation_supported_on_gpu(op)
        if reason:
            return reason
        shapes = [graph.tensors[t].shape for t in op.inputs[:2]]
        if any(len(s) > 4 for s in shapes):
            return f"rank > 4 operands {shapes}"
        return None


def _compute_dtype(tensor_dtype: np.dtype, value_dtype: np.dtype) -> np.dtype:
    """The dtype an op's float-view result keeps: integers stay exact, floats stay float."""
    if tensor_dtype.kind in "iub" and value_dtype.kind != "f":
        return tensor_dtype
    if value_dtype.kind == "f":
        return value_dtype
    return tensor_dtype


def required(ctx: OpContext, inputs: Sequence[np.ndarray | None], i: int) -> np.ndarray:
    """Input `i` of the op, which must be present (not an omitted optional input)."""
    x = inputs[i] if i < len(inputs) else None
    if x is None:
        raise ctx.fail(f"input {i} is required but missing")
    return x


def int_input(ctx: OpContext, inputs: Sequence[np.ndarray | None], i: int) -> np.ndarray:
    """An input that must be present (shape, axis, paddings...) as an int64 array."""
    return np.asarray(required(ctx, inputs, i)).astype(np.int64)


# -- executing one op -----------------------------------------------------------------------


def quantize(x: np.ndarray, tensor: Tensor) -> np.ndarray:
    """Float -> the tensor's integer type with its affine parameters (round half away)."""
    q = tensor.quantization
    info = np.iinfo(tensor.dtype)
    if q is None:
        return np.clip(np.round(x), info.min, info.max).astype(tensor.dtype)
    shape = q.broadcast_shape(x.ndim)
    scaled = x.astype(np.float64) / q.scale.reshape(shape).astype(np.float64)
    # TfLiteRound / std::round: half away from zero.
    rounded = np.sign(scaled) * np.floor(np.abs(scaled) + 0.5) + q.zero_point.reshape(shape)
    return np.clip(rounded, info.min, info.max).astype(tensor.dtype)


def dequantize(x: np.ndarray, tensor: Tensor) -> np.ndarray:
    """The tensor's integer values -> float32 with its affine parameters."""
    q = tensor.quantization
    if q is None:
        return x.astype(np.float32)
    shape = q.broadcast_shape(x.ndim)
    return ((x.astype(np.int64) - q.zero_point.reshape(shape)) * q.scale.reshape(shape)).astype(
        np.float32
    )


def is_quantized(tensor: Tensor | None) -> TypeGuard[Tensor]:
    return tensor is not None and tensor.quantization is not None and tensor.dtype.kind in "iu"


def run_op(op: Op, graph: Subgraph, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    """Run one op on the numpy reference, handling quantized tensors through a float view.

    Args:
        op: the IR op.
        graph: its subgraph (for tensor metadata).
        inputs: one array (or None for an omitted optional input) per ``op.inputs``.

    Returns:
        One array per ``op.outputs``, of the output tensors' dtypes and shapes.

    Raises:
        UnsupportedOpError: the op is unknown.
        ModelError: the op's operands are inconsistent.
    """
    cls = lookup(op)
    ctx = OpContext(op, graph)
    try:
        results = None
        if not cls.quant_aware and any(
            is_quantized(graph.tensors[t]) for t in [*op.inputs, *op.outputs] if t >= 0
        ):
            # Integer (or hybrid) semantics where the op defines them; else the float view.
            results = cls.reference_quantized(ctx, inputs)
        raw = cls.quant_aware or results is not None
        if results is None:
            values = (
                inputs
                if cls.quant_aware
                else [
                    dequantize(x, graph.tensors[t])
                    if x is not None and is_quantized(graph.tensors[t])
                    else x
                    for x, t in zip(inputs, op.inputs, strict=True)
                ]
            )
            results = cls.reference(ctx, values)
    except (ModelError, UnsupportedOpError):
        raise
    except (ValueError, IndexError) as exc:
        raise ModelError(f"{op.describe()}: cannot execute: {exc}") from None
    outs: list[np.ndarray] = []
    for r, t in zip(results, op.outputs, strict=True):
        tensor = graph.tensors[t]
        r = np.asarray(r)
        if tensor.shape and r.shape != tensor.shape:
            if r.size == tensor.size:
                r = r.reshape(tensor.shape)
            else:
                raise ModelError(
                    f"{op.describe()}: computed output {tensor.name!r} of shape {r.shape}, "
                    f"the model declares {tensor.shape}"
                )
        if not raw and is_quantized(tensor) and r.dtype.kind == "f":
            r = quantize(r, tensor)
        elif r.dtype != tensor.dtype and tensor.dtype.kind != "O":
            r = r.astype(tensor.dtype)
        outs.append(r)
    return outs
