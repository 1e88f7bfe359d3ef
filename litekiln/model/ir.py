"""litekiln's graph IR: a plain-Python view of a TFLite model.

The IR keeps the tensor and operator indices of the file, so that the interpreter can report
tensor details exactly as LiteRT does and an error can name "op #12" or "tensor 57" the way a
user sees them in Netron. Constant DEQUANTIZE and DENSIFY ops are folded by the loader: their
output tensors become constants and the ops are marked ``folded`` (they stay in the list so
indices do not move, and executors skip them).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Quantization:
    """Affine quantization parameters of a tensor (real = scale * (q - zero_point)).

    Attributes:
        scale: float32 array, one value per tensor or per channel along ``axis``.
        zero_point: int64 array of the same length as ``scale``.
        axis: the quantized dimension (meaningful only when there are several scales).
    """

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int = 0

    @property
    def per_channel(self) -> bool:
        return self.scale.size > 1

    @functools.cached_property
    def scales_valid(self) -> bool:
        """Every scale is positive and finite (computed once: the load-time checks ask)."""
        if self.scale.size == 1:
            return 0.0 < float(self.scale[0]) < math.inf
        return bool(np.all((self.scale > 0) & np.isfinite(self.scale)))

    @functools.cached_property
    def zero_point_range(self) -> tuple[int, int]:
        """(smallest, largest) zero point (computed once)."""
        if self.zero_point.size == 1:
            z = int(self.zero_point[0])
            return z, z
        return int(self.zero_point.min()), int(self.zero_point.max())

    def broadcast_shape(self, rank: int) -> tuple[int, ...]:
        """Shape to which ``scale``/``zero_point`` reshape to broadcast against a tensor."""
        if not self.per_channel:
            return (1,) * rank
        shape = [1] * rank
        shape[self.axis] = self.scale.size
        return tuple(shape)


#: numpy dtype -> its name, filled as types are met (see Tensor.type_name).
_DTYPE_NAMES: dict[np.dtype, str] = {}


@dataclass
class Tensor:
    """One tensor of a subgraph.

    Attributes:
        index: index of the tensor in its subgraph (as in the file).
        name: tensor name from the file.
        shape: static shape (``()`` for scalars).
        shape_signature: shape with -1 for dynamic dimensions (equal to ``shape`` if absent).
        dtype: numpy dtype of the stored elements.
        quantization: affine parameters, or None for float / plain integer tensors.
        data: constant contents (already densified and, for folded DEQUANTIZE, float32),
            or None for activations.
        is_variable: a TFLite variable tensor (state kept across invocations).
        was_sparse: the constant was stored sparse in the file and was densified at load.
        int4: stored as INT4 in the file (a constant, unpacked to one int8 per value).
    """

    index: int
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    shape_signature: tuple[int, ...] = ()
    quantization: Quantization | None = None
    data: np.ndarray | None = None
    is_variable: bool = False
    was_sparse: bool = False
    int4: bool = False

    @property
    def is_constant(self) -> bool:
        return self.data is not None

    @property
    def type_name(self) -> str:
        """The element type as the file gives it: numpy's name, or ``"int4"`` (cheap:
        numpy's ``dtype.name`` costs microseconds, and the load-time checks ask often)."""
        if self.int4:
            return "int4"
        name = _DTYPE_NAMES.get(self.dtype)
        if name is None:
            name = _DTYPE_NAMES[self.dtype] = self.dtype.name
        return name

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize


@dataclass
class Op:
    """One operator of a subgraph.

    Attributes:
        index: position of the op in the subgraph's execution order (as in the file).
        name: builtin operator name (``"CONV_2D"``) or, for custom ops, the custom code.
        code: builtin operator code (32 for CUSTOM).
        version: operator version from the operator-code table.
        inputs: tensor indices; -1 marks an omitted optional input.
        outputs: tensor indices.
        options: builtin options as plain Python values (snake_case keys).
        custom_code: the custom code for CUSTOM ops, else None.
        custom_options: the raw custom options bytes for CUSTOM ops, else None.
        folded: the loader folded this op into constants (constant DEQUANTIZE / DENSIFY, and
            every op whose inputs are known: :mod:`litekiln.ops.fold`); executors skip it.
        folded_shape: folded from a tensor's static shape (a SHAPE of an activation, or an op
            reading such a value): a model resized to other input shapes folds it again.
    """

    index: int
    name: str
    code: int
    version: int
    inputs: list[int]
    outputs: list[int]
    options: dict[str, Any] = field(default_factory=dict)
    custom_code: str | None = None
    custom_options: bytes | None = None
    folded: bool = False
    folded_shape: bool = False

    @property
    def is_custom(self) -> bool:
        return self.custom_code is not None

    def describe(self) -> str:
        """Human-readable identification used in messages: ``op #3 CONV_2D (v2)``."""
        kind = f"custom op {self.custom_code!r}" if self.is_custom else self.name
        return f"op #{self.index} {kind} (v{self.version})"


@dataclass
class Subgraph:
    """A TFLite subgraph: tensors, ops in execution order, graph inputs and outputs.

    Attributes:
        model_subgraphs: every subgraph of the model this one belongs to (the loader sets
            it; shared, not copied): what a control-flow op (WHILE, IF) calls by index.
        file_tensors: how many tensors the file declares (0: all of ``tensors``); the
            tensors after them were added at load (the steps of an unrolled loop) and are
            not listed to users.
        variable_updates: variable tensor -> the tensor that holds its value after an
            invocation (the final states of a UNIDIRECTIONAL_SEQUENCE_LSTM, which LiteRT's
            kernel writes back into its variable inputs): the interpreter copies each into
            its variable after every ``invoke``, and the partitioner keeps them as outputs.
    """

    index: int
    name: str
    tensors: list[Tensor]
    ops: list[Op]
    inputs: list[int]
    outputs: list[int]
    model_subgraphs: list[Subgraph] = field(default_factory=list, repr=False, compare=False)
    file_tensors: int = 0
    variable_updates: dict[int, int] = field(default_factory=dict)

    def called(self, index: int) -> Subgraph:
        """Subgraph ``index`` of this subgraph's model (a control-flow op's callee).

        Raises:
            IndexError: the model has no such subgraph.
        """
        if not 0 <= index < len(self.model_subgraphs):
            raise IndexError(
                f"subgraph {index}: the model has {len(self.model_subgraphs)} subgraphs"
            )
        return self.model_subgraphs[index]

    @property
    def kept_outputs(self) -> list[int]:
        """The tensors whose values must outlive an invocation: the graph outputs, then
        the new values of the variable tensors (``variable_updates``)."""
        extra = [t for t in self.variable_updates.values() if t not in self.outputs]
        return [*self.outputs, *extra]

    def initial_variables(self) -> dict[int, np.ndarray]:
        """The variable tensors at their reset value: zero (the zero point when quantized),
        what every run of the graph starts from until an invocation updates them."""
        out = {}
        for t in self.tensors:
            if t.is_variable and t.data is None:
                zero = int(t.quantization.zero_point.reshape(-1)[0]) if t.quantization else 0
                out[t.index] = np.full(t.shape, zero, t.dtype)
        return out

    def replace_op(self, op: Op, ops: list[Op]) -> None:
        """Put ``ops`` in ``op``'s place and renumber every op (a rewrite at load: a loop
        unrolled, a composite inlined, an LSTM expanded); the ops after it move."""
        self.ops = [*self.ops[: op.index], *ops, *self.ops[op.index + 1 :]]
        for i, o in enumerate(self.ops):
            o.index = i
        self.__dict__.pop("is_quantized", None)  # (a cached property: new tensors count)

    def live_ops(self) -> list[Op]:
        """Ops that executors run (everything the loader did not fold)."""
        return [op for op in self.ops if not op.folded]

    @functools.cached_property
    def is_quantized(self) -> bool:
        """Whether any tensor holds 8/16-bit quantized integers (an int8, dynamic-range or
        quantized-IO model): its float ops then carry the quantized ops' version numbers."""
        return any(t.quantization is not None and t.dtype.kind in "iu" for t in self.tensors)

    def producers(self) -> dict[int, int]:
        """Map tensor index -> index of the (live) op that writes it."""
        out: dict[int, int] = {}
        for op in self.live_ops():
            for t in op.outputs:
                if t >= 0:
                    out[t] = op.index
        return out

    def readers(self) -> dict[int, list[Op]]:
        """Map tensor index -> the (live) ops that read it, in op order."""
        out: dict[int, list[Op]] = {}
        for op in self.live_ops():
            for t in dict.fromkeys(op.inputs):
                if t >= 0:
                    out.setdefault(t, []).append(op)
        return out


#: Ops that pass an integer tensor's values on unchanged (a reshape of token ids).
_VALUE_PRESERVING = frozenset({"RESHAPE", "SQUEEZE", "EXPAND_DIMS", "CAST", "IDENTITY"})


def index_bounds(graph: Subgraph) -> dict[int, int]:
    """Integer graph inputs that index a table, and its number of rows: the ids of an
    EMBEDDING_LOOKUP or the positions of a GATHER (along its axis) or a GATHER_ND (the
    smallest of the dimensions its index vectors address), reached directly or through
    reshapes, casts and the branches of a SELECT (litert-torch's generative models wrap a
    negative position: ``select(pos < 0, pos + rows, pos)``). A random input must stay in
    ``[0, rows)`` there, or the lookup fails (in LiteRT too): a text model's token ids, a
    language model's positions."""
    readers = graph.readers()
    bounds: dict[int, int] = {}
    for start in graph.inputs:
        if graph.tensors[start].dtype.kind not in "iu":
            continue
        todo, seen, rows = [start], {start}, []
        while todo:
            t = todo.pop()
            for op in readers.get(t, []):
                passes = (
                    op.inputs[0] == t
                    if op.name in _VALUE_PRESERVING
                    else (op.name in ("SELECT", "SELECT_V2") and t in op.inputs[1:3])
                )
                if passes:
                    for o in op.outputs:
                        if o not in seen:
                            seen.add(o)
                            todo.append(o)
                elif op.name == "EMBEDDING_LOOKUP" and op.inputs[0] == t and len(op.inputs) > 1:
                    rows.append(graph.tensors[op.inputs[1]].shape[0])
                elif op.name == "GATHER_ND" and len(op.inputs) > 1 and op.inputs[1] == t:
                    params = graph.tensors[op.inputs[0]].shape
                    depth = (graph.tensors[t].shape or (1,))[-1]
                    if 0 < depth <= len(params):
                        rows.append(min(params[:depth]))
                elif op.name == "GATHER" and len(op.inputs) > 1 and op.inputs[1] == t:
                    params = graph.tensors[op.inputs[0]].shape
                    axis = int(op.options.get("axis", 0) or 0)
                    if params:
                        rows.append(params[axis % len(params)])
        if rows and min(rows) > 0:
            bounds[start] = min(rows)
    return bounds


@dataclass
class SignatureDef:
    """A named entry point: maps user-facing names to tensor indices of one subgraph."""

    key: str
    subgraph_index: int
    inputs: dict[str, int]
    outputs: dict[str, int]


@dataclass
class Model:
    """A loaded TFLite model.

    Attributes:
        subgraphs: all subgraphs; ``subgraphs[0]`` is the primary one that runs.
        token: the model token (hex farmhash Fingerprint64 of the model bytes, or user-given).
        version: the schema version from the file.
        description: the file's description string.
        signatures: signature defs, if any.
        metadata_names: names of the metadata entries in the file.
        name: a display name (the file stem when loaded from a path).
        nbytes: size of the model file in bytes.
        fingerprinted: the token is the Fingerprint64 of these bytes (not given by the user):
            equal tokens then mean equal weights.
    """

    subgraphs: list[Subgraph]
    token: str
    version: int
    description: str = ""
    signatures: list[SignatureDef] = field(default_factory=list)
    metadata_names: list[str] = field(default_factory=list)
    name: str = "model"
    nbytes: int = 0
    fingerprinted: bool = False

    @property
    def main(self) -> Subgraph:
        return self.subgraphs[0]

    def op_histogram(self) -> dict[str, int]:
        """Count of live ops per op name in the primary subgraph."""
        hist: dict[str, int] = {}
        for op in self.main.live_ops():
            hist[op.name] = hist.get(op.name, 0) + 1
        return hist
