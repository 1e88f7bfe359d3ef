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

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeGuard

import numpy as np

from litekiln.errors import ModelError, ModelValidationError, ResourceError, UnsupportedOpError
from litekiln.model.ir import Model, Op, Subgraph, Tensor
from litekiln.model.loader import MAX_TENSOR_BYTES, check_activation_bytes, check_tensors

log = logging.getLogger("litekiln")

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


# -- load-time checks -------------------------------------------------------------------------

#: dtype names, for the rules of :class:`Check`.
FLOAT32 = frozenset({"float32"})
INT8S = frozenset({"int8", "uint8"})
QUANTIZED = frozenset({"int8", "uint8", "int16"})


class Check:
    """What an op's :meth:`OpDef.validate` gets: the op, its tensors and a way to refuse.

    The helpers each enforce one rule and raise :class:`ModelValidationError` naming the op
    (index, name) and the rule; ``fail`` builds that error for the rules a family writes
    itself. The messages are formatted only on failure: validation runs at every load.
    """

    __slots__ = ("graph", "op", "tensors")

    def __init__(self, op: Op, graph: Subgraph) -> None:
        self.op = op
        self.graph = graph
        self.tensors = graph.tensors

    def fail(self, rule: str, msg: str) -> ModelValidationError:
        op = self.op
        return ModelValidationError(
            f"{op.describe()}: {msg} [rule: {rule}]",
            rule=rule,
            op_index=op.index,
            op_name=op.name,
        )

    # -- operands ----------------------------------------------------------------------------

    def count(self, what: str, n: int, lo: int, hi: int) -> None:
        if not lo <= n <= hi:
            expected = f"{lo}" if lo == hi else f"{lo}-{hi}"
            raise self.fail(f"{what[:-1]}-count", f"{n} {what}, the kernel takes {expected}")

    def input(self, i: int) -> Tensor:
        """Input ``i``, which must be present (not omitted with -1)."""
        ids = self.op.inputs
        if i >= len(ids) or ids[i] < 0:
            raise self.fail("input-missing", f"input {i} is required but missing")
        return self.tensors[ids[i]]

    def optional(self, i: int) -> Tensor | None:
        """Input ``i``, None when absent or omitted."""
        ids = self.op.inputs
        return self.tensors[ids[i]] if i < len(ids) and ids[i] >= 0 else None

    def output(self, i: int = 0) -> Tensor:
        return self.tensors[self.op.outputs[i]]

    # -- types and shapes -------------------------------------------------------------------

    def dtype(self, t: Tensor, allowed: frozenset[str], role: str) -> None:
        """``t``'s type is one of ``allowed`` (an INT4 constant's type is ``"int4"``)."""
        name = t.type_name
        if name not in allowed:
            raise self.fail(
                "dtype",
                f"{role} {t.name!r} has type {name}, the kernel takes "
                f"{' or '.join(sorted(allowed))}",
            )

    def same_dtype(self, t: Tensor, like: Tensor, role: str, like_role: str = "input") -> None:
        if t.dtype != like.dtype or t.int4 != like.int4:
            raise self.fail(
                "dtype-mismatch",
                f"{role} {t.name!r} has type {t.type_name}, {like_role} {like.name!r} "
                f"{like.type_name}",
            )

    def rank(self, t: Tensor, lo: int, hi: int | None, role: str) -> None:
        """``lo <= rank(t) <= hi`` (``hi`` None: exactly ``lo``)."""
        r = len(t.shape)
        top = lo if hi is None else hi
        if not lo <= r <= top:
            expected = f"{lo}" if top == lo else f"{lo}-{top}"
            raise self.fail(
                "rank", f"{role} {t.name!r} has rank {r} ({list(t.shape)}), expected {expected}"
            )

    def output_shape(self, shape: tuple[int, ...] | list[int], i: int = 0) -> None:
        """Output ``i`` has the shape the op computes, as LiteRT makes it.

        LiteRT's Prepare resizes every output to what the kernel computes from its inputs,
        whatever the file declares; litekiln does the same, so that every later op (and the
        compiler) sees the shapes LiteRT runs with. A converter always declares these
        shapes, so a change is logged. A shape larger than the loader's bound is refused.
        """
        t = self.output(i)
        shape = tuple(shape)
        if t.shape == shape:
            return
        nbytes = math.prod(shape) * t.dtype.itemsize
        if nbytes > MAX_TENSOR_BYTES:
            raise self.fail(
                "tensor-size",
                f"output {t.name!r} of computed shape {list(shape)} needs {nbytes} bytes, more "
                f"than the {MAX_TENSOR_BYTES >> 30} GiB litekiln allows a tensor",
            )
        log.info(
            "%s: output %r is declared %s, the op computes %s (used, as LiteRT does)",
            self.op.describe(),
            t.name,
            list(t.shape),
            list(shape),
        )
        if t.shape_signature == t.shape:
            t.shape_signature = shape
        t.shape = shape

    def output_dtype(self, dtype: np.dtype, i: int = 0) -> None:
        """Output ``i`` has type ``dtype``: the kernels that set their output's type
        (``output->type = input->type`` in their Prepare: ADD, RESIZE_*, GATHER,
        DEQUANTIZE...) make the declared type irrelevant, and litekiln follows them."""
        t = self.output(i)
        if t.dtype == dtype and not t.int4:
            return
        nbytes = math.prod(t.shape) * dtype.itemsize
        if nbytes > MAX_TENSOR_BYTES:
            raise self.fail("tensor-size", f"output {t.name!r} of type {dtype.name} is too large")
        log.info(
            "%s: output %r is declared %s, the kernel makes it %s (used, as LiteRT does)",
            self.op.describe(),
            t.name,
            t.type_name,
            dtype.name,
        )
        t.dtype, t.int4 = dtype, False

    def same_shape(self, t: Tensor, like: Tensor, role: str, like_role: str = "input") -> None:
        if t.shape != like.shape:
            raise self.fail(
                "shape-mismatch",
                f"{role} {t.name!r} has shape {list(t.shape)}, {like_role} {like.name!r} "
                f"{list(like.shape)}",
            )

    # -- quantization -----------------------------------------------------------------------

    def quantized(self, t: Tensor, role: str, *, per_tensor: bool = True) -> None:
        """``t`` carries usable affine parameters: present, finite positive scales, zero
        points within its type's range (one scale and zero point if ``per_tensor``).

        LiteRT's integer kernels read ``params.scale`` and ``params.zero_point`` without
        checking them; a zero, negative or non-finite scale or an out-of-range zero point
        makes their output meaningless (or undefined: a NaN multiplier), so litekiln refuses
        it rather than guess.
        """
        q = t.quantization
        if q is None:
            raise self.fail(
                "quantization-missing", f"{role} {t.name!r} ({t.type_name}) is not quantized"
            )
        if per_tensor and q.scale.size != 1:
            raise self.fail(
                "quantization-per-tensor",
                f"{role} {t.name!r} has {q.scale.size} scales, the kernel takes one",
            )
        if not q.scales_valid:
            raise self.fail(
                "quantization-scale",
                f"{role} {t.name!r} has scale {q.scale.tolist()[:4]}: scales must be positive "
                "and finite",
            )
        if t.dtype.kind in "iu":
            lo, hi = _INT_RANGES.get(t.type_name, (-(2**63), 2**63 - 1))
            zmin, zmax = q.zero_point_range
            if zmin < lo or zmax > hi:
                raise self.fail(
                    "quantization-zero-point",
                    f"{role} {t.name!r} has zero point {q.zero_point.tolist()[:4]} outside "
                    f"{t.type_name}'s range [{lo}, {hi}]",
                )

    def zero_point(self, t: Tensor, value: int, role: str) -> None:
        """Every zero point of ``t`` is ``value`` (symmetric quantization)."""
        q = t.quantization
        if q is not None and q.zero_point_range != (value, value):
            zps = q.zero_point.tolist()
            if len(zps) == 1:
                got = f"zero point {zps[0]}"
            else:
                i = next(i for i, z in enumerate(zps) if z != value)
                got = f"{len(zps)} zero points, {zps[i]} at channel {i}"
            raise self.fail(
                "quantization-zero-point", f"{role} {t.name!r} has {got}, the kernel needs {value}"
            )

    def activation(self) -> int:
        """The fused activation (the loader maps codes outside the enum to NONE)."""
        return int(self.op.options.get("fused_activation_function", 0) or 0)


_INT_RANGES = {
    name: (int(np.iinfo(name).min), int(np.iinfo(name).max))
    for name in ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64")
}
_INT_RANGES["int4"] = (-8, 7)


def check_activation_range(c: Check, y: Tensor) -> None:
    """``CalculateActivationRangeQuantized``: a fused activation's bounds, divided by the
    output scale, must fit int32 (LiteRT refuses the op otherwise)."""
    act = c.activation()
    if act not in (1, 2, 3) or y.quantization is None:
        return
    scale = float(np.float32(y.quantization.scale.reshape(-1)[0]))
    bounds = (0.0, 6.0) if act == 3 else (0.0,) if act == 1 else (-1.0, 1.0)
    if any(abs(f / scale) + 0.5 >= 2**31 for f in bounds):
        raise c.fail(
            "activation-range",
            f"output {y.name!r}: the fused activation's bounds / scale {scale} overflow int32",
        )


def broadcast_shape(c: Check, a: Tensor, b: Tensor) -> tuple[int, ...]:
    """LiteRT's ``CalculateShapeForBroadcast`` (numpy's rules; a 0 with a 1 gives 0)."""
    sa, sb = a.shape, b.shape
    if sa == sb:
        return sa
    n = max(len(sa), len(sb))
    out = []
    for i in range(n):
        da = sa[i - n + len(sa)] if i >= n - len(sa) else 1
        db = sb[i - n + len(sb)] if i >= n - len(sb) else 1
        if da != db and da != 1 and db != 1:
            raise c.fail(
                "broadcast",
                f"inputs {a.name!r} {list(sa)} and {b.name!r} {list(sb)} do not broadcast",
            )
        out.append(0 if da == 0 or db == 0 else max(da, db))
    return tuple(out)


def validate_model(model: Model, after_op: Callable[[Op, Subgraph], object] | None = None) -> None:
    """Check every op of the subgraph litekiln runs against its kernel's rules.

    Ops litekiln does not know are left alone (running them raises UnsupportedOpError).
    Folded ops (constant DEQUANTIZE, DENSIFY) are checked too: LiteRT prepares them. Output
    shapes become the ones the ops compute (:meth:`Check.output_shape`). The subgraphs that
    control-flow ops call are checked by those ops (:mod:`litekiln.ops.control`).

    Args:
        model: the loaded model.
        after_op: called with each op once it is checked, before the next op is (constant
            folding, :mod:`litekiln.ops.fold`: an op then sees its folded inputs as the
            constants they are, as LiteRT's kernels see them at their Prepare). It may
            replace the op in the graph by others (a loop unrolled), which are checked next.

    Raises:
        ModelValidationError: an op breaks a rule; the error names op and rule.
    """
    validate_graph(model.main, model.name, after_op)


def validate_graph(
    graph: Subgraph,
    model_name: str,
    after_op: Callable[[Op, Subgraph], object] | None = None,
    skip: Callable[[Op], bool] | None = None,
) -> None:
    """:func:`validate_model` for one subgraph (``model_name`` names it in messages); ops
    for which ``skip(op)`` is true are not checked (nor passed to ``after_op``)."""
    from litekiln import ops as _families  # noqa: F401  (importing registers every family)

    i = 0
    while i < len(graph.ops):
        op = graph.ops[i]
        cls = REGISTRY.get(op.name)
        if cls is None or (skip is not None and skip(op)):
            i += 1
            continue
        c = Check(op, graph)
        try:
            cls.validate(c)
        except ModelError:
            raise
        except (ArithmeticError, LookupError, TypeError, ValueError) as exc:
            # A shape or option so far off that a rule could not even be evaluated.
            raise c.fail("malformed", f"cannot be checked ({type(exc).__name__}: {exc})") from None
        if after_op is not None:
            after_op(op, graph)
            if i < len(graph.ops) and graph.ops[i] is not op:
                continue  # replaced (a loop unrolled): check the ops that took its place
        i += 1
    # Outputs now have the types and shapes the kernels give them: bound them (the loader
    # bounded only the tensors no op writes), and the model's activations together.
    written = {t for op in graph.ops for t in op.outputs}
    check_tensors(model_name, [t for t in graph.tensors if t.index in written])
    check_activation_bytes(graph, model_name)


class OpDef:
    """Base of every op definition. Subclasses set the class attributes and ``reference``.

    Attributes:
        name: TFLite builtin name or custom code.
        aliases: other names served by the same definition.
        gpu: the op is in the documented GPU op table (docs/architecture.md, "Op tables and
            partitioning").
        gpu_extended: not in the documented table, but the TFLite GPU delegate runs it and
            so can we; used when the extended op table is selected.
        gpu_max_version: newest version the documented GPU table lists for float models (the
            limit under ``op_table="documented"``; the default table takes every version and
            checks features, :meth:`gpu_support`).
        gpu_quant_max_version: the same when quantized models are allowed (the quantized
            versions of an op are numbered above its float ones).
        quant_aware: ``reference`` handles quantized integer arrays itself.
        versions: the op versions LiteRT's builtin resolver has a kernel for (min, max);
            None for custom ops (looked up by name). Other versions are refused at load.
        num_inputs: the input counts the kernel accepts (min, max; omitted optional
            inputs count, as in LiteRT's ``NumInputs``); None: not checked by the base.
        num_outputs: the same for outputs.
    """

    name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    gpu: ClassVar[bool] = False
    gpu_extended: ClassVar[bool] = False
    gpu_max_version: ClassVar[int] = 1
    gpu_quant_max_version: ClassVar[int] = 1
    quant_aware: ClassVar[bool] = False
    #: Whether every output value is one of the inputs' values, or zero: a quantized output
    #: with its quantized inputs' parameters then stays on their grid (the compiler's float
    #: view simulates no quantization after it: `Lowering._keeps_grid`).
    copies_values: ClassVar[bool] = False
    #: Whether constant folding (:mod:`litekiln.ops.fold`) may evaluate the op at load when
    #: its inputs are known; False for an op with state or randomness.
    foldable: ClassVar[bool] = True
    versions: ClassVar[tuple[int, int] | None] = (1, 1)
    #: How the loader replaces the op by ops the GPU path runs, when it can ("unrolled at
    #: load" for WHILE); shown in the op table (docs/ops.md).
    rewritten_at_load: ClassVar[str] = ""
    #: What of the op the GPU form leaves to the CPU, where that is a whole version or mode
    #: ("version 1 on the CPU"); shown in the op table (docs/ops.md).
    gpu_limits: ClassVar[str] = ""
    #: Operands the GPU form reads at run time as int32 indices (operand index -> role): a
    #: token's ids, a gather's positions, a cache write's start. Computed on the CPU (the GPU
    #: path computes float tensors) or given as graph inputs, they enter the partition as
    #: int32 inputs; the kernel clamps them into its table, and the session checks on the
    #: host those that LiteRT refuses outside it (`index_limit`).
    runtime_indices: ClassVar[dict[int, str]] = {}
    #: Whether the GPU form computes int32 data (not quantized) as int32: integer
    #: arithmetic, comparisons, selects, casts and moves of a language model's positions
    #: and masks (`Lowering` keeps such tensors int32). Other ops read int32 tensors only
    #: as constant shapes and axes, or as run-time indices (``runtime_indices``).
    int32_data: ClassVar[bool] = False
    num_inputs: ClassVar[tuple[int, int] | None] = None
    num_outputs: ClassVar[tuple[int, int] | None] = (1, 1)

    @classmethod
    def validate(cls, c: Check) -> None:
        """Refuse (``raise c.fail(rule, why)``) what LiteRT refuses when it prepares the op.

        Runs at load, once per op, so the compiler and the reference only ever see models
        LiteRT would run (and litekiln can): the kernel's ``Prepare`` rules (input and
        output counts, dtypes, ranks, quantization, option values, shapes consistent with
        one another and with the declared output shapes). The base checks the version (as
        LiteRT's op resolver does) and the counts of ``inputs``/``outputs``; families add
        their kernel's rules, calling this first. Keep it cheap: it runs at every start.
        """
        op = c.op
        if cls.versions is not None:
            lo, hi = cls.versions
            if not lo <= op.version <= hi:
                raise c.fail(
                    "op-version",
                    f"version {op.version}: LiteRT has kernels for versions {lo}-{hi}",
                )
        counts = cls.num_inputs
        if counts is not None and not counts[0] <= len(op.inputs) <= counts[1]:
            c.count("inputs", len(op.inputs), *counts)
        counts = cls.num_outputs
        if counts is not None and not counts[0] <= len(op.outputs) <= counts[1]:
            c.count("outputs", len(op.outputs), *counts)

    @classmethod
    def state_carries(cls, op: Op) -> tuple[tuple[int, int], ...]:
        """(output position, input position) pairs whose value LiteRT's kernel copies into
        that input tensor after it runs, so that the next invocation starts from it: state
        the op keeps across invocations in its own inputs (the basic LSTM's activation and
        cell state). Empty for almost every op."""
        return ()

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

        Versions are not limited here: every version LiteRT has kernels for is accepted
        (``versions``, checked at load), and a family refuses, naming it, a feature of a
        version its GPU form lacks (a rank, an option, a weights format). The documented
        table's version limits apply only under ``op_table="documented"``
        (:meth:`documented_version_limit`, in the partitioner). The default checks the table
        membership and that every tensor is float (or a quantized tensor with a float view
        when ``allow_quantized``). Families add their own constraints (ranks, options,
        constant operands).
        """
        if not (cls.gpu or cls.gpu_extended):
            return "not in the GPU op table"
        quantized = cls.is_quantized_op(op, graph)
        if quantized and not allow_quantized:
            return "quantized tensors, and quantized models are not allowed"
        integers = cls.integer_operands(op)
        indices = cls.runtime_index_tensors(op, graph)
        for t in [*op.inputs, *op.outputs]:
            if t < 0 or t in indices:
                continue
            tensor = graph.tensors[t]
            if tensor.dtype.kind == "f" or tensor.quantization is not None:
                continue
            if cls.int32_data and tensor.dtype == np.int32 and t not in integers:
                if t in op.outputs and fused_activation(op):
                    return "a fused activation on int32 values: the GPU form clamps floats only"
                continue
            return _integer_reason(tensor, t in integers, t in op.outputs)
        return None

    @classmethod
    def runtime_index_tensors(cls, op: Op, graph: Subgraph) -> set[int]:
        """The tensors of ``op`` the GPU form takes as run-time int32 indices
        (`runtime_indices`): int32, not constant, not also read as data by the op."""
        out = set()
        for i in cls.runtime_indices:
            t = op.inputs[i] if i < len(op.inputs) else -1
            if t < 0 or graph.tensors[t].dtype != np.int32 or graph.tensors[t].is_constant:
                continue
            if any(u == t for k, u in enumerate(op.inputs) if k not in cls.runtime_indices):
                continue
            out.add(t)
        return out

    @classmethod
    def index_limit(cls, op: Op, graph: Subgraph, i: int) -> tuple[int, ...] | None:
        """The exclusive upper bounds of run-time index operand ``i`` where an index outside
        them is an error (LiteRT's kernel fails; the numpy reference raises): one bound for
        every element, or one per position along the operand's last axis (GATHER_ND's index
        vectors); None where the op clamps it."""
        return None

    @classmethod
    def cpu_reason(cls, op: Op, graph: Subgraph) -> str:
        """Why ``op``, of an op with no GPU form (neither ``gpu`` nor ``gpu_extended``),
        stays on the CPU (the partitioner's reason)."""
        return "no GPU form in litekiln"

    @classmethod
    def is_quantized_op(cls, op: Op, graph: Subgraph) -> bool:
        """Whether any tensor of ``op`` holds quantized integers."""
        return any(
            graph.tensors[t].quantization is not None and graph.tensors[t].dtype.kind in "iu"
            for t in [*op.inputs, *op.outputs]
            if t >= 0
        )

    @classmethod
    def documented_version_limit(cls, op: Op, graph: Subgraph, allow_quantized: bool) -> int:
        """The newest version of the op the documented GPU table lists for this model (the
        limit of ``op_table="documented"``): ``gpu_quant_max_version`` when quantized
        versions are allowed and the op or the model is quantized (a quantized model's float
        ops carry the quantized versions too: the converter writes CONV_2D v5 for the float
        first layer of a dynamic-range MobileNet), else ``gpu_max_version``."""
        quantized = cls.is_quantized_op(op, graph) or graph.is_quantized
        return cls.gpu_quant_max_version if allow_quantized and quantized else cls.gpu_max_version

    @classmethod
    def integer_operands(cls, op: Op) -> set[int]:
        """Tensor indices that are legitimately integer constants (shapes, axes, paddings)."""
        return set()


def index_limits(graph: Subgraph, ops: Iterable[int]) -> dict[int, list[tuple[np.ndarray, str]]]:
    """The run-time index tensors that ``ops`` (GPU ops of ``graph``) read with bounds
    (`OpDef.index_limit`): tensor -> [(bounds, what reads it)]. The session checks them on
    the host before a GPU partition reads them (`check_indices`), as the CPU path would."""
    out: dict[int, list[tuple[np.ndarray, str]]] = {}
    made_by: dict[int, Op] = {}
    for i in ops:
        op = graph.ops[i]
        made_by.update((t, op) for t in op.outputs)
        cls = lookup(op)
        tensors = cls.runtime_index_tensors(op, graph)
        for k, role in cls.runtime_indices.items():
            t = op.inputs[k] if k < len(op.inputs) else -1
            limit = cls.index_limit(op, graph, k) if t in tensors else None
            if limit:
                out.setdefault(t, []).append(
                    (np.asarray(limit, np.int64), f"{op.describe()}: {role}")
                )
    # Indices reshaped on the GPU (a token's ids: RESHAPE of the fed ids, now int32 data of
    # the partition) are checked where they enter: the values are the same. Indices
    # computed there (a position plus one) are only clamped by the kernel.
    todo = list(out)
    while todo:
        t = todo.pop()
        op = made_by.get(t)  # type: ignore[assignment]
        if op is None or op.name not in _SAME_VALUES or not op.inputs:
            continue
        src = op.inputs[0]
        last = graph.tensors[src].shape[-1:] == graph.tensors[t].shape[-1:]
        kept = [(b, what) for b, what in out[t] if b.size == 1 or last]
        if kept and graph.tensors[src].dtype == np.int32:
            out.setdefault(src, []).extend(kept)
            todo.append(src)
    return out


#: Ops whose output holds its input's values (reshaped): run-time index bounds pass through.
_SAME_VALUES = frozenset({"RESHAPE", "SQUEEZE", "EXPAND_DIMS"})


def check_indices(x: np.ndarray, limits: list[tuple[np.ndarray, str]]) -> None:
    """Refuse run-time indices outside their bounds (`index_limits`), naming the op, as
    the op's CPU form refuses them.

    Raises:
        ModelError: an index is outside.
    """
    for bounds, what in limits:
        v = np.asarray(x).reshape(-1, bounds.size)
        bad = (v < 0) | (v >= bounds)
        if v.size and bool(bad.any()):
            row = v[int(np.flatnonzero(bad.any(axis=1))[0])]
            if bounds.size == 1:
                raise ModelError(f"{what} {int(row[0])} outside [0, {int(bounds[0])})")
            raise ModelError(f"{what} {row.tolist()} outside {bounds.tolist()}")


def _integer_reason(tensor: Tensor, operand: bool, output: bool) -> str | None:
    """Why an op with a non-float tensor stays on the CPU (None: a constant shape, axis or
    index operand, which the GPU forms read at compile time). The reason names the real
    cause: a value computed at run time, not the dtype alone."""
    kind = tensor.type_name
    if operand:
        if tensor.is_constant:
            return None
        return (
            f"its shape/axis/index operand {tensor.name!r} ({kind}) is computed at run time "
            "(so the output's shape or layout is known only then); the GPU path needs it "
            "constant"
        )
    if output:
        return f"it computes {kind} values ({tensor.name!r}); the GPU path computes float tensors"
    where = "a constant" if tensor.is_constant else "computed at run time"
    return f"it reads {kind} data ({tensor.name!r}, {where}); the GPU path computes float tensors"


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
    """y = fn(x), elementwise.

    Attributes:
        dtypes: the input types LiteRT's kernel takes (the output's is the same).
    """

    fn: ClassVar[Callable[[np.ndarray], np.ndarray]]
    dtypes: ClassVar[frozenset[str]] = FLOAT32
    #: The kernel gives the output the input's type (else it requires it).
    sets_output_dtype: ClassVar[bool] = False
    num_inputs = (1, 1)

    @classmethod
    def validate(cls, c: Check) -> None:
        """One input of a type the kernel takes, an output of the same type and shape; 8- and
        16-bit integers (LiteRT's quantized kernels) must carry usable quantization."""
        super().validate(c)
        x, y = c.input(0), c.output()
        c.dtype(x, cls.dtypes, "input")
        if cls.sets_output_dtype:
            c.output_dtype(x.dtype)
        else:
            c.same_dtype(y, x, "output")
        if x.type_name in QUANTIZED:
            c.quantized(x, "input")
            c.quantized(y, "output")
        c.output_shape(x.shape)

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
    #: The input types LiteRT's kernel takes (both inputs have the same).
    dtypes: ClassVar[frozenset[str]] = FLOAT32
    #: The output's type when it is not the inputs' (comparisons: bool).
    output_dtype: ClassVar[str | None] = None
    #: The kernel sets its output's type (``output->type = input2->type``); MUL instead
    #: computes in its output's type, which must then be the inputs'.
    sets_output_dtype: ClassVar[bool] = True
    num_inputs = (2, 2)

    @classmethod
    def validate(cls, c: Check) -> None:
        """Two inputs of one type the kernel takes, broadcastable (numpy's rules), the
        output of the broadcast shape and of the inputs' type (LiteRT's kernels pick their
        arithmetic from the output's type; most set it to the inputs', MUL requires it);
        quantized 8- and 16-bit operands carry usable per-tensor quantization, and a fused
        activation's clamp fits int32."""
        super().validate(c)
        x, z, y = c.input(0), c.input(1), c.output()
        c.dtype(x, cls.dtypes, "input")
        c.same_dtype(z, x, "input 1", "input 0")
        out = np.dtype(cls.output_dtype) if cls.output_dtype else x.dtype
        if cls.sets_output_dtype:
            c.output_dtype(out)
        elif y.dtype != out:
            c.dtype(y, frozenset({out.name}), "output")
        if x.type_name in QUANTIZED:
            for t, role in ((x, "input 0"), (z, "input 1")):
                c.quantized(t, role)
            if cls.output_dtype is None:
                c.quantized(y, "output")
                check_activation_range(c, y)
        c.output_shape(broadcast_shape(c, x, z))

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
        return activation_supported_on_gpu(op)  # (any rank: the GPU form broadcasts as numpy)


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


def as_planned(ctx: OpContext, y: np.ndarray, i: int = 0) -> np.ndarray:
    """Output ``i``'s value ``y`` where its shape is the one planned at load; else the refusal,
    naming both. An op whose output size depends on values computed at run time (a RANGE of
    a fed limit, a FILL of fed dims) keeps the shape the model declares: litekiln plans
    static shapes."""
    out = ctx.output_tensor(i)
    if y.shape != out.shape:
        raise ctx.fail(
            f"computes an output of shape {list(y.shape)} from values known only at run time; "
            f"the model declares {list(out.shape)}, and litekiln plans static shapes"
        )
    return y


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
    if (
        x.dtype.kind in "iu"
        and x.dtype.itemsize <= 2
        and not q.per_channel
        and q.scale.dtype == np.float32
        and abs(int(q.zero_point[0])) < 1 << 16
    ):
        # An 8-bit model's input, at every inference, in float32 throughout: q - zero_point
        # is exact there (|q - zero_point| < 2**24), and the float32 product of two float32
        # values is the float64 one rounded once, so the values are those of the general
        # formula below, in two passes over float32 instead of four over 8 bytes.
        y = np.subtract(x, np.float32(q.zero_point[0]), dtype=np.float32)
        y *= q.scale[0].astype(np.float32)
        return y
    shape = q.broadcast_shape(x.ndim)
    return ((x.astype(np.int64) - q.zero_point.reshape(shape)) * q.scale.reshape(shape)).astype(
        np.float32
    )


def is_quantized(tensor: Tensor | None) -> TypeGuard[Tensor]:
    return tensor is not None and tensor.quantization is not None and tensor.dtype.kind in "iu"


def is_dynamic(tensor: Tensor) -> bool:
    """Whether the file leaves a dimension of ``tensor`` open (-1 in its signature) while
    the tensor has no static shape of its own: an activation of a called subgraph whose
    shape depends on data (a SLICE at a loop counter), which LiteRT resizes when it runs.
    The main graph's open dimensions (Keras' batch) get static sizes at load."""
    return tensor.data is None and -1 in tensor.shape_signature


def fits_signature(shape: tuple[int, ...], signature: tuple[int, ...]) -> bool:
    """``shape`` agrees with ``signature`` wherever the signature fixes a dimension."""
    return len(shape) == len(signature) and all(
        s in (-1, d) for d, s in zip(shape, signature, strict=True)
    )


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
        ResourceError: the host ran out of memory.
    """
    cls = lookup(op)
    ctx = OpContext(op, graph)
    try:
        results = None
        if not cls.quant_aware and any(
            is_quantized(graph.tensors[t]) for t in [*op.inputs, *op.outputs] if t >= 0
        ):
            # Integer (or hybrid) semantics where the op defines them; else the float view.
            with np.errstate(all="ignore"):  # (IEEE results: below)
                results = cls.reference_quantized(ctx, inputs)
        raw = cls.quant_aware or results is not None
        # Shapes, axes, sizes: integers whatever quantization a file gives them.
        integers = cls.integer_operands(op)
        if results is None:
            values = (
                inputs
                if cls.quant_aware
                else [
                    dequantize(x, graph.tensors[t])
                    if x is not None and is_quantized(graph.tensors[t]) and t not in integers
                    else x
                    for x, t in zip(inputs, op.inputs, strict=True)
                ]
            )
            # An infinity or a NaN is what LiteRT's kernels give too: numpy's warnings about
            # them are noise to a user (MPNet's relative position buckets take the log of a
            # zero distance, then select the other branch).
            with np.errstate(all="ignore"):
                results = cls.reference(ctx, values)
    except (ModelError, UnsupportedOpError):
        raise
    except MemoryError:
        raise ResourceError(f"{op.describe()}: not enough memory to run it") from None
    except (ArithmeticError, LookupError, TypeError, ValueError) as exc:
        # The load-time checks keep these out; a model loaded with validate=False may not.
        raise ModelError(f"{op.describe()}: cannot execute: {type(exc).__name__}: {exc}") from None
    outs: list[np.ndarray] = []
    for r, t in zip(results, op.outputs, strict=True):
        tensor = graph.tensors[t]
        r = np.asarray(r)
        if tensor.shape and r.shape != tensor.shape:
            if is_dynamic(tensor) and fits_signature(r.shape, tensor.shape_signature):
                pass  # a called subgraph's dynamic tensor: its shape is known only now
            elif r.size == tensor.size:
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
