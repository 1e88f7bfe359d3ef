"""A small TFLite flatbuffer writer for tests (no TensorFlow needed).

Tests describe a model the way one draws it: graph inputs, constants, ops, graph outputs.
The writer turns that into the bytes of a ``.tflite`` file through the generated builder
functions of the ``tflite`` package::

    b = ModelBuilder()
    x = b.input("x", [1, 8, 8, 3])
    w = b.const("w", np.ones([4, 3, 3, 3], np.float32))
    bias = b.const("bias", np.zeros([4], np.float32))
    y = b.op("CONV_2D", [x, w, bias], out_shape=[1, 8, 8, 4],
             options={"padding": "SAME", "stride_w": 1, "stride_h": 1})
    b.output(y)
    data: bytes = b.build()

Builtin options are given as a dict of snake_case field -> value (the keys
:func:`litekiln.model.schema.decode_options` produces) and are written by introspecting the
generated ``tflite.<X>Options`` module, so every builtin op works without per-op code. Enum
fields take either the integer or the enum member's name (``"SAME"``, ``"RELU6"``,
``"int64"``); TensorType fields also take numpy dtypes.

The writer checks what it can cheaply (names of ops and option fields, data vs. shape), and
otherwise writes what it is told. Deliberately broken files for loader tests are written with
the raw escape hatches: integer tensor indices are not checked, ``tensor(buffer_index=...)``
and ``op(opcode_index=...)`` override the indices the writer would choose, and
``build(version=...)`` sets any schema version.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import flatbuffers
import numpy as np
import tflite
from flatbuffers import flexbuffers
from tflite.utils import BUILTIN_OPCODE2NAME

# -- element types --------------------------------------------------------------------------

#: dtype name -> TensorType code of schema.fbs.
TENSOR_TYPES: dict[str, int] = {
    "float32": 0,
    "float16": 1,
    "int32": 2,
    "uint8": 3,
    "int64": 4,
    "string": 5,
    "bool": 6,
    "int16": 7,
    "complex64": 8,
    "int8": 9,
    "float64": 10,
    "complex128": 11,
    "uint64": 12,
    "uint32": 15,
    "uint16": 16,
    "int4": 17,
}
_TYPE_NAMES = {code: name for name, code in TENSOR_TYPES.items()}

DType = str | np.dtype | type


def dtype_name(dtype: DType) -> str:
    """Normalise ``np.int8`` / ``np.dtype('int8')`` / ``"int8"`` to the name used here."""
    if isinstance(dtype, str) and dtype in TENSOR_TYPES:
        return dtype
    name = np.dtype(dtype).name
    if name not in TENSOR_TYPES:
        raise ValueError(f"dtype {dtype!r} has no TFLite TensorType")
    return name


def numpy_dtype(dtype: DType) -> np.dtype:
    """The numpy dtype that holds a tensor's elements (int4 is held unpacked as int8)."""
    name = dtype_name(dtype)
    return np.dtype("int8" if name == "int4" else "object" if name == "string" else name)


# -- quantization and sparsity --------------------------------------------------------------


@dataclass(frozen=True)
class Quant:
    """Affine quantization: real = scale * (q - zero_point), per tensor or along ``axis``."""

    scale: float | Sequence[float]
    zero_point: int | Sequence[int] = 0
    axis: int = 0

    @staticmethod
    def of(q: QuantLike) -> Quant | None:
        """Accept ``Quant``, ``(scale, zero_point)``, ``(scale, zero_point, axis)``, a dict."""
        if q is None or isinstance(q, Quant):
            return q
        if isinstance(q, Mapping):
            return Quant(**q)
        return Quant(*q)

    @property
    def scales(self) -> np.ndarray:
        return np.atleast_1d(np.asarray(self.scale, np.float32))

    @property
    def zero_points(self) -> np.ndarray:
        zp = np.atleast_1d(np.asarray(self.zero_point, np.int64))
        return np.repeat(zp, self.scales.size) if zp.size == 1 else zp

    def quantize(self, x: np.ndarray, dtype: DType) -> np.ndarray:
        """Float -> integers of ``dtype`` (round half away from zero, clamp), for test data."""
        shape = [1] * x.ndim
        if self.scales.size > 1:
            shape[self.axis] = self.scales.size
        s = self.scales.reshape(shape).astype(np.float64)
        q = np.sign(x / s) * np.floor(np.abs(x / s) + 0.5) + self.zero_points.reshape(shape)
        info = np.iinfo(numpy_dtype(dtype))
        return np.clip(q, info.min, info.max).astype(numpy_dtype(dtype))

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        shape = [1] * q.ndim
        if self.scales.size > 1:
            shape[self.axis] = self.scales.size
        zp = self.zero_points.reshape(shape)
        return ((q.astype(np.int64) - zp) * self.scales.reshape(shape)).astype(np.float32)


QuantLike = Quant | tuple | Mapping | None

DENSE, SPARSE_CSR = 0, 1
_INDEX_VECTORS = {
    "int32": (1, "Int32Vector", "<i4"),
    "uint16": (2, "Uint16Vector", "<u2"),
    "uint8": (3, "Uint8Vector", "u1"),
}


@dataclass(frozen=True)
class Sparsity:
    """How to store a constant sparse (schema.fbs ``SparsityParameters``).

    Attributes:
        formats: per traversal level, ``DENSE`` (0) or ``SPARSE_CSR`` (1); default: every
            original dimension dense except the last one, block dimensions dense.
        traversal_order: storage order of the original dims, then the block dims
            (numbered ``rank + b``); default ``0 .. rank + len(block_map) - 1``.
        block_map: for each block dimension, the original dimension it subdivides.
        block_size: for each block dimension, its size (must divide that dimension).
        index_dtype: ``"int32"``, ``"uint16"`` or ``"uint8"``: the SparseIndexVector type of
            segments and indices.
    """

    formats: Sequence[int] | None = None
    traversal_order: Sequence[int] | None = None
    block_map: Sequence[int] = ()
    block_size: Sequence[int] = ()
    index_dtype: str = "int32"


@dataclass
class _SparseEncoding:
    traversal_order: list[int]
    block_map: list[int]
    # per level: (format, dense_size, segments or None, indices or None)
    levels: list[tuple[int, int, np.ndarray | None, np.ndarray | None]]
    values: np.ndarray
    index_dtype: str


def encode_sparse(dense: np.ndarray, sp: Sparsity) -> _SparseEncoding:
    """Encode a dense array in TFLite's sparse format.

    A CSR level keeps the indices whose sub-block holds any non-zero value; dense levels keep
    everything (including zeros), so that every combination of formats round-trips.
    """
    rank = dense.ndim
    n_blocks = len(sp.block_map)
    if len(sp.block_size) != n_blocks:
        raise ValueError("block_map and block_size must have the same length")
    order = (
        list(sp.traversal_order) if sp.traversal_order is not None else list(range(rank + n_blocks))
    )
    formats = (
        list(sp.formats)
        if sp.formats is not None
        else ([DENSE] * (rank - 1) + [SPARSE_CSR] + [DENSE] * n_blocks)
    )
    if sorted(order) != list(range(rank + n_blocks)) or sorted(order[:rank]) != list(range(rank)):
        raise ValueError(f"traversal order {order} must list the dims, then the block dims")
    if len(formats) != len(order):
        raise ValueError(f"{len(formats)} formats for {len(order)} traversal levels")
    block_of = {d: b for b, d in enumerate(sp.block_map)}
    # Expanded array: each blocked dim d splits into (outer d, block b), block inner.
    exp_shape: list[int] = []
    axis_of: dict[int, int] = {}  # level id (d for outer, rank + b for block) -> axis
    for d, n in enumerate(dense.shape):
        if d in block_of:
            b = block_of[d]
            bs = sp.block_size[b]
            if n % bs:
                raise ValueError(f"block size {bs} does not divide dimension {d} of {dense.shape}")
            axis_of[d] = len(exp_shape)
            axis_of[rank + b] = len(exp_shape) + 1
            exp_shape += [n // bs, bs]
        else:
            axis_of[d] = len(exp_shape)
            exp_shape.append(n)
    expanded = dense.reshape(exp_shape).transpose([axis_of[lv] for lv in order])
    nonzero = expanded != 0
    paths = np.zeros((1, 0), np.int64)
    levels = []
    for lv, fmt in enumerate(formats):
        size = expanded.shape[lv]
        if fmt == DENSE:
            paths = np.concatenate(
                [np.repeat(paths, size, axis=0), np.tile(np.arange(size), len(paths))[:, None]],
                axis=1,
            )
            levels.append((DENSE, size, None, None))
            continue
        if fmt != SPARSE_CSR:
            raise ValueError(f"unknown dimension format {fmt}")
        # Which children of each kept path have a non-zero anywhere below them.
        sub = nonzero.any(axis=tuple(range(lv + 1, nonzero.ndim)))
        keep = sub[tuple(paths.T)] if lv else sub[None]  # (n_paths, size)
        counts = keep.sum(axis=1)
        segments = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        parent, child = np.nonzero(keep)
        paths = np.concatenate([paths[parent], child[:, None]], axis=1)
        levels.append((SPARSE_CSR, 0, segments, child.astype(np.int64)))
    values = expanded[tuple(paths.T)] if paths.shape[0] else expanded.reshape(-1)[:0]
    return _SparseEncoding(order, list(sp.block_map), levels, values, sp.index_dtype)


# -- tensors and ops ------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorRef:
    """A tensor of a subgraph being built; pass it as an op input or a graph output."""

    index: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    quant: Quant | None = None
    subgraph: int = 0


TensorLike = TensorRef | int | np.ndarray | None


@dataclass
class _Tensor:
    name: str
    shape: list[int]
    dtype: str
    quant: Quant | None = None
    data: np.ndarray | None = None
    sparsity: Sparsity | None = None
    shape_signature: list[int] | None = None
    is_variable: bool = False
    buffer_index: int | None = None  # raw override


@dataclass
class _Op:
    opcode: tuple[int, str | None, int]  # (builtin code, custom code, version)
    inputs: list[int]
    outputs: list[int]
    options: Mapping[str, Any] | None
    custom_options: bytes | None
    intermediates: list[int]
    opcode_index: int | None  # raw override


class SubgraphBuilder:
    """Tensors, ops and graph inputs/outputs of one subgraph. Get one from ModelBuilder."""

    def __init__(self, model: ModelBuilder, index: int, name: str) -> None:
        self.model = model
        self.index = index
        self.name = name
        self.tensors: list[_Tensor] = []
        self.ops: list[_Op] = []
        self.inputs: list[int] = []
        self.outputs: list[int] = []
        self._names: set[str] = set()

    # -- tensors ---------------------------------------------------------------------------

    def _unique(self, name: str) -> str:
        base, n = name, 1
        while name in self._names:
            name = f"{base}_{n}"
            n += 1
        self._names.add(name)
        return name

    def _ref(self, i: int) -> TensorRef:
        t = self.tensors[i]
        return TensorRef(i, t.name, tuple(t.shape), t.dtype, t.quant, self.index)

    def tensor(
        self,
        name: str,
        shape: Sequence[int],
        dtype: DType = "float32",
        *,
        quant: QuantLike = None,
        data: np.ndarray | None = None,
        sparsity: Sparsity | None = None,
        shape_signature: Sequence[int] | None = None,
        is_variable: bool = False,
        buffer_index: int | None = None,
    ) -> TensorRef:
        """Add a tensor (an activation unless ``data`` is given).

        Args:
            name: tensor name (made unique with a suffix if taken).
            shape: static shape; ``None`` entries are written as 1 with -1 in the signature.
            dtype: element type (see ``TENSOR_TYPES``).
            quant: quantization parameters (``Quant``, ``(scale, zero_point[, axis])``).
            data: constant contents, converted to ``dtype``.
            sparsity: store ``data`` in TFLite's sparse format.
            shape_signature: explicit shape signature (-1 for dynamic dims).
            is_variable: mark as a variable tensor.
            buffer_index: raw buffer index to write instead of the writer's choice.

        Returns:
            A reference to the new tensor.
        """
        dtype = dtype_name(dtype)
        dims = [1 if d is None else int(d) for d in shape]
        if shape_signature is None and any(d is None for d in shape):
            shape_signature = [-1 if d is None else int(d) for d in shape]
        if data is not None:
            data = np.asarray(data)
            if data.shape != tuple(dims):
                if data.size != int(np.prod(dims, dtype=np.int64)):
                    raise ValueError(f"{name}: data of shape {data.shape} for tensor shape {dims}")
                data = data.reshape(dims)
            data = data.astype(numpy_dtype(dtype), copy=False)
        if sparsity is not None and data is None:
            raise ValueError(f"{name}: a sparse tensor needs data")
        self.tensors.append(
            _Tensor(
                self._unique(name),
                dims,
                dtype,
                Quant.of(quant),
                data,
                sparsity,
                None if shape_signature is None else list(shape_signature),
                is_variable,
                buffer_index,
            )
        )
        return self._ref(len(self.tensors) - 1)

    def input(
        self,
        name: str,
        shape: Sequence[int],
        dtype: DType = "float32",
        *,
        quant: QuantLike = None,
        shape_signature: Sequence[int] | None = None,
    ) -> TensorRef:
        """Add a graph input."""
        ref = self.tensor(name, shape, dtype, quant=quant, shape_signature=shape_signature)
        self.inputs.append(ref.index)
        return ref

    def const(
        self,
        name: str,
        data: Any,
        dtype: DType | None = None,
        *,
        quant: QuantLike = None,
        sparsity: Sparsity | None = None,
        shape: Sequence[int] | None = None,
    ) -> TensorRef:
        """Add a constant tensor; dtype defaults to the array's."""
        arr = np.asarray(data)
        return self.tensor(
            name,
            arr.shape if shape is None else shape,
            arr.dtype if dtype is None else dtype,
            quant=quant,
            data=arr,
            sparsity=sparsity,
        )

    def output(self, *tensors: TensorRef | int) -> None:
        """Mark tensors as graph outputs (in this order)."""
        self.outputs.extend(_index(t) for t in tensors)

    # -- ops -------------------------------------------------------------------------------

    def _inputs(self, inputs: Sequence[TensorLike]) -> list[int]:
        out = []
        for i, t in enumerate(inputs):
            if isinstance(t, np.ndarray):
                t = self.const(f"const_{len(self.tensors)}_{i}", t)
            out.append(-1 if t is None else _index(t))
        return out

    def _outputs(
        self,
        default_name: str,
        inputs: list[int],
        out_shape: Sequence[int] | None,
        out_dtype: DType | None,
        out_quant: QuantLike,
        outputs: Sequence[TensorRef | int] | None,
    ) -> list[int]:
        if outputs is not None:
            return [_index(t) for t in outputs]
        first = next((self.tensors[i] for i in inputs if 0 <= i < len(self.tensors)), None)
        if out_shape is None:
            if first is None:
                raise ValueError(f"{default_name}: give out_shape (no input to copy it from)")
            out_shape = first.shape
        if out_dtype is None:
            out_dtype = first.dtype if first is not None else "float32"
        if out_quant is None and first is not None and first.dtype == dtype_name(out_dtype):
            out_quant = first.quant
        return [self.tensor(default_name, out_shape, out_dtype, quant=out_quant).index]

    def op(
        self,
        name: str,
        inputs: Sequence[TensorLike],
        *,
        out_shape: Sequence[int] | None = None,
        out_dtype: DType | None = None,
        out_quant: QuantLike = None,
        outputs: Sequence[TensorRef | int] | None = None,
        options: Mapping[str, Any] | None = None,
        version: int = 1,
        intermediates: Sequence[TensorRef | int] = (),
        opcode_index: int | None = None,
    ) -> Any:
        """Add a builtin op.

        Args:
            name: builtin operator name, e.g. ``"CONV_2D"``.
            inputs: tensor refs, raw indices, numpy arrays (made constants) or None (omitted
                optional input, written as -1).
            out_shape, out_dtype, out_quant: the single output to create; shape, dtype and
                quantization default to the first input's.
            outputs: existing tensors to use as outputs instead (several for multi-output ops).
            options: builtin options, snake_case field -> value.
            version: operator version.
            intermediates: intermediate tensors (LSTM).
            opcode_index: raw operator-code index to write instead of the writer's choice.

        Returns:
            The output ``TensorRef`` if the op has one output, else a tuple of them.
        """
        code = builtin_code(name)
        if code == 32:
            raise ValueError("use custom_op() for custom operators")
        ins = self._inputs(inputs)
        outs = self._outputs(name.lower(), ins, out_shape, out_dtype, out_quant, outputs)
        if options:
            options_class(name)  # fail now, with the op's name, if it takes no options
        self.ops.append(
            _Op(
                (code, None, version),
                ins,
                outs,
                options,
                None,
                [_index(t) for t in intermediates],
                opcode_index,
            )
        )
        return self._result(outs)

    def custom_op(
        self,
        custom_code: str,
        inputs: Sequence[TensorLike],
        *,
        out_shape: Sequence[int] | None = None,
        out_dtype: DType | None = None,
        out_quant: QuantLike = None,
        outputs: Sequence[TensorRef | int] | None = None,
        custom_options: bytes | Mapping[str, Any] | None = None,
        version: int = 1,
        opcode_index: int | None = None,
    ) -> Any:
        """Add a custom op (builtin code CUSTOM).

        Args:
            custom_code: the custom code, e.g. ``"Convolution2DTransposeBias"``.
            custom_options: raw bytes, or a dict written as a flexbuffer map.
            Others as for :meth:`op`.
        """
        ins = self._inputs(inputs)
        outs = self._outputs(custom_code, ins, out_shape, out_dtype, out_quant, outputs)
        if isinstance(custom_options, Mapping):
            custom_options = flexbuffers.Dumps(dict(custom_options))
        self.ops.append(
            _Op(
                (32, custom_code, version),
                ins,
                outs,
                None,
                bytes(custom_options) if custom_options is not None else None,
                [],
                opcode_index,
            )
        )
        return self._result(outs)

    def _result(self, outs: list[int]) -> Any:
        refs = tuple(self._ref(i) if 0 <= i < len(self.tensors) else i for i in outs)
        return refs[0] if len(refs) == 1 else refs


def _index(t: TensorRef | int) -> int:
    return t.index if isinstance(t, TensorRef) else int(t)


@dataclass
class _Signature:
    key: str
    subgraph: int
    inputs: dict[str, int]
    outputs: dict[str, int]


class ModelBuilder:
    """Builds a TFLite model. Tensor and op methods act on the primary subgraph (``main``).

    Attributes:
        main: subgraph 0.
        subgraphs: every subgraph, in file order.
    """

    def __init__(self, description: str = "litekiln test model") -> None:
        self.description = description
        self.subgraphs: list[SubgraphBuilder] = []
        self.signatures: list[_Signature] = []
        self.metadata: list[tuple[str, bytes]] = []
        self.main = self.subgraph("main")

    def subgraph(self, name: str = "") -> SubgraphBuilder:
        """Add a subgraph (for CALL/IF/WHILE bodies); the first one is the primary one."""
        sg = SubgraphBuilder(self, len(self.subgraphs), name)
        self.subgraphs.append(sg)
        return sg

    # Delegation to the primary subgraph keeps the common single-subgraph case short.
    def tensor(self, *args: Any, **kw: Any) -> TensorRef:
        return self.main.tensor(*args, **kw)

    def input(self, *args: Any, **kw: Any) -> TensorRef:
        return self.main.input(*args, **kw)

    def const(self, *args: Any, **kw: Any) -> TensorRef:
        return self.main.const(*args, **kw)

    def op(self, *args: Any, **kw: Any) -> Any:
        return self.main.op(*args, **kw)

    def custom_op(self, *args: Any, **kw: Any) -> Any:
        return self.main.custom_op(*args, **kw)

    def output(self, *tensors: TensorRef | int) -> None:
        self.main.output(*tensors)

    def signature(
        self,
        key: str,
        inputs: Mapping[str, TensorRef | int],
        outputs: Mapping[str, TensorRef | int],
        subgraph: int = 0,
    ) -> None:
        """Add a signature def mapping user-facing names to tensors of ``subgraph``."""
        self.signatures.append(
            _Signature(
                key,
                subgraph,
                {k: _index(v) for k, v in inputs.items()},
                {k: _index(v) for k, v in outputs.items()},
            )
        )

    def add_metadata(self, name: str, data: bytes) -> None:
        """Add a metadata entry (stored in its own buffer)."""
        self.metadata.append((name, bytes(data)))

    def build(self, *, version: int = 3, file_identifier: bytes = b"TFL3") -> bytes:
        """Serialise the model.

        Args:
            version: schema version to write (3 is current).
            file_identifier: the 4-byte file identifier.

        Returns:
            The ``.tflite`` file contents.
        """
        return _Writer(self).write(version, file_identifier)


# -- names and options ----------------------------------------------------------------------

_NAME_TO_CODE = {name: code for code, name in BUILTIN_OPCODE2NAME.items()}

# Ops whose options table is not named after the op (schema.fbs builtin_options).
_OPTIONS_OVERRIDES = {
    "AVERAGE_POOL_2D": "Pool2DOptions",
    "MAX_POOL_2D": "Pool2DOptions",
    "L2_POOL_2D": "Pool2DOptions",
    "L2_NORMALIZATION": "L2NormOptions",
    "UNIDIRECTIONAL_SEQUENCE_RNN": "SequenceRNNOptions",
    "MEAN": "ReducerOptions",
    "SUM": "ReducerOptions",
    "REDUCE_PROD": "ReducerOptions",
    "REDUCE_MAX": "ReducerOptions",
    "REDUCE_MIN": "ReducerOptions",
    "REDUCE_ANY": "ReducerOptions",
    "REDUCE_ALL": "ReducerOptions",
    "MAXIMUM": "MaximumMinimumOptions",
    "MINIMUM": "MaximumMinimumOptions",
    "RANDOM_STANDARD_NORMAL": "RandomOptions",
    "RANDOM_UNIFORM": "RandomOptions",
    "MULTINOMIAL": "RandomOptions",
    "CONV_3D_TRANSPOSE": "Conv3DOptions",
}


def builtin_code(name: str) -> int:
    """Builtin operator code of ``name``; ValueError naming close matches if unknown."""
    code = _NAME_TO_CODE.get(name.upper())
    if code is None:
        close = [n for n in _NAME_TO_CODE if name.upper().replace("_", "") in n.replace("_", "")]
        hint = f"; did you mean {close}?" if close else ""
        raise ValueError(f"unknown builtin op {name!r}{hint}")
    return code


@functools.cache
def _union_members() -> dict[str, tuple[str, int]]:
    """Options table name -> (union name, union type code)."""
    out = {}
    for union in ("BuiltinOptions", "BuiltinOptions2"):
        for k, v in vars(getattr(tflite, union)).items():
            if not k.startswith("_") and isinstance(v, int) and v:
                out[k] = (union, v)
    return out


@functools.cache
def options_class(op_name: str) -> str:
    """Name of the options table of a builtin op (``"MAX_POOL_2D"`` -> ``"Pool2DOptions"``)."""
    op_name = op_name.upper()
    if op_name in _OPTIONS_OVERRIDES:
        return _OPTIONS_OVERRIDES[op_name]
    want = op_name.replace("_", "").lower() + "options"
    for table in _union_members():
        if table.lower() == want:
            return table
    raise ValueError(f"builtin op {op_name} takes no builtin options")


@dataclass(frozen=True)
class _Field:
    camel: str  # getter name, e.g. "StrideW"
    kind: str  # "scalar", "vector", "string", "table"
    elem: str = ""  # number type of a scalar or of a vector's elements, e.g. "Int32"


def option_fields(op_name: str) -> dict[str, tuple[str, str]]:
    """The options an op takes: snake_case key -> (kind, number type), e.g. for CONV_2D
    ``{"stride_w": ("scalar", "Int32"), ...}``; kind is scalar, vector, string or table."""
    return {k: (f.kind, f.elem) for k, f in _fields(options_class(op_name)).items()}


@functools.cache
def _fields(table: str) -> dict[str, _Field]:
    """snake_case key -> field description, read from the generated reader class."""
    from litekiln.model.schema import snake_case  # the decoder's key spelling, by definition

    module = importlib.import_module(f"tflite.{table}")
    cls = getattr(module, table)
    out = {}
    for attr, fn in vars(cls).items():
        if attr.startswith("_") or not callable(fn) or isinstance(fn, (classmethod, staticmethod)):
            continue
        if attr in ("Init", "GetRootAs") or attr.startswith("GetRootAs"):
            continue
        if attr.endswith(("Length", "AsNumpy", "IsNone", "BufferHasIdentifier")):
            continue
        if not hasattr(module, f"{table}Add{attr}"):
            continue
        src = inspect.getsource(fn)
        params = list(inspect.signature(fn).parameters)
        if params == ["self", "j"]:
            m = re.search(r"Get\(flatbuffers\.number_types\.(\w+)Flags, a", src)
            kind = "vector" if m else "table"  # a vector of tables: not used by any options
            out[snake_case(attr)] = _Field(attr, kind, m.group(1) if m else "")
        elif "self._tab.String(" in src:
            out[snake_case(attr)] = _Field(attr, "string")
        elif "number_types." in src and "Indirect" not in src:
            m = re.search(r"Get\(flatbuffers\.number_types\.(\w+)Flags, o", src)
            out[snake_case(attr)] = _Field(attr, "scalar", m.group(1) if m else "")
        else:
            out[snake_case(attr)] = _Field(attr, "table")
    return out


@functools.cache
def _enums() -> dict[str, dict[str, int]]:
    """Every enum of the schema: enum name -> {member: value}."""
    out = {}
    for name in dir(tflite):
        obj = getattr(tflite, name)
        if not isinstance(obj, type) or hasattr(obj, "Init") or name.startswith("Builtin"):
            continue
        members = {k: v for k, v in vars(obj).items() if not k.startswith("_")}
        if members and all(isinstance(v, int) for v in members.values()):
            out[name] = members
    return out


def _enum_value(table: str, key: str, value: Any) -> Any:
    """Resolve an enum member name (or numpy dtype) for an options field to its integer."""
    if isinstance(value, (np.dtype, type)):
        return TENSOR_TYPES[dtype_name(value)]
    if not isinstance(value, str):
        return value
    if key.endswith("type") and value in TENSOR_TYPES:  # out_type="int64"
        return TENSOR_TYPES[value]
    member = value.upper()
    candidates = {e: m[member] for e, m in _enums().items() if member in m}
    if len(set(candidates.values())) == 1:
        return next(iter(candidates.values()))
    camel = _fields(table)[key].camel.lower()
    close = {e: v for e, v in candidates.items() if camel in e.lower() or e.lower() in camel}
    if len(set(close.values())) == 1:
        return next(iter(close.values()))
    raise ValueError(
        f"{table}.{key}: cannot tell which enum {value!r} belongs to ({sorted(candidates)}); "
        "pass the integer"
    )


def _write_options(
    b: flatbuffers.Builder, op_name: str, options: Mapping[str, Any]
) -> tuple[str, int, int]:
    """Write an options table; returns (union name, union type code, table offset)."""
    table = options_class(op_name)
    union, kind = _union_members()[table]
    module = importlib.import_module(f"tflite.{table}")
    fields = _fields(table)
    unknown = set(options) - set(fields)
    if unknown:
        raise KeyError(
            f"{op_name}: {table} has no field(s) {sorted(unknown)}; fields: {sorted(fields)}"
        )
    # Vectors and strings are written before the table that points at them.
    offsets = {}
    for key, value in options.items():
        f = fields[key]
        if f.kind == "vector":
            values = list(np.asarray(value).reshape(-1).tolist())
            getattr(module, f"{table}Start{f.camel}Vector")(b, len(values))
            for v in reversed(values):
                getattr(b, f"Prepend{f.elem}")(v)
            offsets[key] = b.EndVector()
        elif f.kind == "string":
            offsets[key] = b.CreateString(value)
        elif f.kind == "table":
            raise ValueError(f"{op_name}: nested table field {key!r} is not supported")
    getattr(module, f"{table}Start")(b)
    for key, value in options.items():
        add = getattr(module, f"{table}Add{fields[key].camel}")
        if key in offsets:
            add(b, offsets[key])
        else:
            add(b, _enum_value(table, key, value))
    return union, kind, getattr(module, f"{table}End")(b)


# -- serialisation --------------------------------------------------------------------------


class _Writer:
    """One serialisation of a ModelBuilder (flatbuffers are built bottom-up)."""

    def __init__(self, model: ModelBuilder) -> None:
        self.m = model
        self.b = flatbuffers.Builder(1024)
        self.buffers: list[bytes | None] = [None]  # buffer 0: the empty sentinel
        self.opcodes: dict[tuple[int, str | None, int], int] = {}

    def ints(self, start: Any, values: Sequence[int], prepend: str = "PrependInt32") -> int:
        start(self.b, len(values))
        for v in reversed(values):
            getattr(self.b, prepend)(int(v))
        return self.b.EndVector()

    def write(self, version: int, file_identifier: bytes) -> bytes:
        b = self.b
        subgraphs = [self.subgraph(sg) for sg in self.m.subgraphs]
        meta = []
        for name, data in self.m.metadata:
            meta.append((name, len(self.buffers)))
            self.buffers.append(data)
        opcodes = [self.opcode(key) for key in self.opcodes]
        buffers = [self.buffer(data) for data in self.buffers]
        signatures = [self.signature(s) for s in self.m.signatures]
        metadata = []
        for name, buf in meta:
            n = b.CreateString(name)
            tflite.MetadataStart(b)
            tflite.MetadataAddName(b, n)
            tflite.MetadataAddBuffer(b, buf)
            metadata.append(tflite.MetadataEnd(b))
        desc = b.CreateString(self.m.description)

        def vec(start: Any, offsets: list[int]) -> int:
            start(b, len(offsets))
            for o in reversed(offsets):
                b.PrependUOffsetTRelative(o)
            return b.EndVector()

        v_opcodes = vec(tflite.ModelStartOperatorCodesVector, opcodes)
        v_subgraphs = vec(tflite.ModelStartSubgraphsVector, subgraphs)
        v_buffers = vec(tflite.ModelStartBuffersVector, buffers)
        v_sigs = vec(tflite.ModelStartSignatureDefsVector, signatures) if signatures else None
        v_meta = vec(tflite.ModelStartMetadataVector, metadata) if metadata else None
        tflite.ModelStart(b)
        tflite.ModelAddVersion(b, version)
        tflite.ModelAddOperatorCodes(b, v_opcodes)
        tflite.ModelAddSubgraphs(b, v_subgraphs)
        tflite.ModelAddDescription(b, desc)
        tflite.ModelAddBuffers(b, v_buffers)
        if v_sigs is not None:
            tflite.ModelAddSignatureDefs(b, v_sigs)
        if v_meta is not None:
            tflite.ModelAddMetadata(b, v_meta)
        b.Finish(tflite.ModelEnd(b), file_identifier=file_identifier)
        return bytes(b.Output())

    def buffer(self, data: bytes | None) -> int:
        b = self.b
        vec = None
        if data:
            # Constants are 16-byte aligned, as the TFLite converter writes them.
            b.StartVector(1, len(data), 16)
            b.head -= len(data)
            b.Bytes[b.head : b.head + len(data)] = data
            vec = b.EndVector()
        tflite.BufferStart(b)
        if vec is not None:
            tflite.BufferAddData(b, vec)
        return tflite.BufferEnd(b)

    def opcode(self, key: tuple[int, str | None, int]) -> int:
        b = self.b
        code, custom, version = key
        c = b.CreateString(custom) if custom is not None else None
        tflite.OperatorCodeStart(b)
        # Codes >= 127 go in the int32 field; the int8 one holds the placeholder 127.
        tflite.OperatorCodeAddDeprecatedBuiltinCode(b, min(code, 127))
        tflite.OperatorCodeAddBuiltinCode(b, code)
        tflite.OperatorCodeAddVersion(b, version)
        if c is not None:
            tflite.OperatorCodeAddCustomCode(b, c)
        return tflite.OperatorCodeEnd(b)

    def subgraph(self, sg: SubgraphBuilder) -> int:
        b = self.b
        tensors = [self.tensor(t) for t in sg.tensors]
        ops = [self.operator(op) for op in sg.ops]
        v_tensors = self.offsets(tflite.SubGraphStartTensorsVector, tensors)
        v_ops = self.offsets(tflite.SubGraphStartOperatorsVector, ops)
        v_in = self.ints(tflite.SubGraphStartInputsVector, sg.inputs)
        v_out = self.ints(tflite.SubGraphStartOutputsVector, sg.outputs)
        name = b.CreateString(sg.name)
        tflite.SubGraphStart(b)
        tflite.SubGraphAddTensors(b, v_tensors)
        tflite.SubGraphAddOperators(b, v_ops)
        tflite.SubGraphAddInputs(b, v_in)
        tflite.SubGraphAddOutputs(b, v_out)
        tflite.SubGraphAddName(b, name)
        return tflite.SubGraphEnd(b)

    def offsets(self, start: Any, offsets: list[int]) -> int:
        start(self.b, len(offsets))
        for o in reversed(offsets):
            self.b.PrependUOffsetTRelative(o)
        return self.b.EndVector()

    def tensor(self, t: _Tensor) -> int:
        b = self.b
        buffer_index = 0
        sparsity = None
        if t.data is not None:
            if t.sparsity is not None:
                enc = encode_sparse(t.data, t.sparsity)
                sparsity = self.sparsity(enc)
                raw = _raw_bytes(enc.values, t.dtype)
            else:
                raw = _raw_bytes(t.data, t.dtype)
            buffer_index = len(self.buffers)
            self.buffers.append(raw)
        if t.buffer_index is not None:
            buffer_index = t.buffer_index
        quant = self.quantization(t.quant) if t.quant is not None else None
        name = b.CreateString(t.name)
        shape = self.ints(tflite.TensorStartShapeVector, t.shape)
        sig = (
            self.ints(tflite.TensorStartShapeSignatureVector, t.shape_signature)
            if t.shape_signature is not None
            else None
        )
        tflite.TensorStart(b)
        tflite.TensorAddShape(b, shape)
        tflite.TensorAddType(b, TENSOR_TYPES[t.dtype])
        tflite.TensorAddBuffer(b, buffer_index)
        tflite.TensorAddName(b, name)
        if quant is not None:
            tflite.TensorAddQuantization(b, quant)
        if t.is_variable:
            tflite.TensorAddIsVariable(b, True)
        if sparsity is not None:
            tflite.TensorAddSparsity(b, sparsity)
        if sig is not None:
            tflite.TensorAddShapeSignature(b, sig)
        return tflite.TensorEnd(b)

    def quantization(self, q: Quant) -> int:
        b = self.b
        scale = self.floats(tflite.QuantizationParametersStartScaleVector, q.scales.tolist())
        zp = self.ints(
            tflite.QuantizationParametersStartZeroPointVector,
            q.zero_points.tolist(),
            "PrependInt64",
        )
        tflite.QuantizationParametersStart(b)
        tflite.QuantizationParametersAddScale(b, scale)
        tflite.QuantizationParametersAddZeroPoint(b, zp)
        tflite.QuantizationParametersAddQuantizedDimension(b, q.axis)
        return tflite.QuantizationParametersEnd(b)

    def floats(self, start: Any, values: Sequence[float]) -> int:
        start(self.b, len(values))
        for v in reversed(values):
            self.b.PrependFloat32(float(v))
        return self.b.EndVector()

    def sparsity(self, enc: _SparseEncoding) -> int:
        b = self.b
        kind, cls, np_type = _INDEX_VECTORS[enc.index_dtype]
        prepend = {
            "Int32Vector": "PrependInt32",
            "Uint16Vector": "PrependUint16",
            "Uint8Vector": "PrependUint8",
        }[cls]
        module = importlib.import_module(f"tflite.{cls}")

        def index_vector(values: np.ndarray) -> int:
            if values.size and (values.max() > np.iinfo(np.dtype(np_type)).max):
                raise ValueError(f"sparse index {values.max()} does not fit {enc.index_dtype}")
            v = self.ints(getattr(module, f"{cls}StartValuesVector"), values.tolist(), prepend)
            getattr(module, f"{cls}Start")(b)
            getattr(module, f"{cls}AddValues")(b, v)
            return getattr(module, f"{cls}End")(b)

        dims = []
        for fmt, dense_size, segments, indices in enc.levels:
            seg = index_vector(segments) if segments is not None else None
            idx = index_vector(indices) if indices is not None else None
            tflite.DimensionMetadataStart(b)
            tflite.DimensionMetadataAddFormat(b, fmt)
            tflite.DimensionMetadataAddDenseSize(b, dense_size)
            if seg is not None:
                tflite.DimensionMetadataAddArraySegmentsType(b, kind)
                tflite.DimensionMetadataAddArraySegments(b, seg)
                tflite.DimensionMetadataAddArrayIndicesType(b, kind)
                tflite.DimensionMetadataAddArrayIndices(b, idx)
            dims.append(tflite.DimensionMetadataEnd(b))
        order = self.ints(tflite.SparsityParametersStartTraversalOrderVector, enc.traversal_order)
        bmap = (
            self.ints(tflite.SparsityParametersStartBlockMapVector, enc.block_map)
            if enc.block_map
            else None
        )
        v_dims = self.offsets(tflite.SparsityParametersStartDimMetadataVector, dims)
        tflite.SparsityParametersStart(b)
        tflite.SparsityParametersAddTraversalOrder(b, order)
        if bmap is not None:
            tflite.SparsityParametersAddBlockMap(b, bmap)
        tflite.SparsityParametersAddDimMetadata(b, v_dims)
        return tflite.SparsityParametersEnd(b)

    def operator(self, op: _Op) -> int:
        b = self.b
        if op.opcode not in self.opcodes:
            self.opcodes[op.opcode] = len(self.opcodes)
        opcode_index = self.opcodes[op.opcode] if op.opcode_index is None else op.opcode_index
        union = None
        if op.options:
            name = BUILTIN_OPCODE2NAME[op.opcode[0]]
            union, kind, table = _write_options(b, name, op.options)
        custom = None
        if op.custom_options is not None:
            custom = self.ints(
                tflite.OperatorStartCustomOptionsVector, list(op.custom_options), "PrependUint8"
            )
        v_in = self.ints(tflite.OperatorStartInputsVector, op.inputs)
        v_out = self.ints(tflite.OperatorStartOutputsVector, op.outputs)
        v_mid = (
            self.ints(tflite.OperatorStartIntermediatesVector, op.intermediates)
            if op.intermediates
            else None
        )
        tflite.OperatorStart(b)
        tflite.OperatorAddOpcodeIndex(b, opcode_index)
        tflite.OperatorAddInputs(b, v_in)
        tflite.OperatorAddOutputs(b, v_out)
        if v_mid is not None:
            tflite.OperatorAddIntermediates(b, v_mid)
        if union == "BuiltinOptions":
            tflite.OperatorAddBuiltinOptionsType(b, kind)
            tflite.OperatorAddBuiltinOptions(b, table)
        elif union == "BuiltinOptions2":
            tflite.OperatorAddBuiltinOptions2Type(b, kind)
            tflite.OperatorAddBuiltinOptions2(b, table)
        if custom is not None:
            tflite.OperatorAddCustomOptions(b, custom)
            tflite.OperatorAddCustomOptionsFormat(b, 0)  # FLEXBUFFERS, the only format
        return tflite.OperatorEnd(b)

    def signature(self, s: _Signature) -> int:
        b = self.b

        def maps(entries: dict[str, int], start: Any) -> int:
            offs = []
            for name, index in entries.items():
                n = b.CreateString(name)
                tflite.TensorMapStart(b)
                tflite.TensorMapAddName(b, n)
                tflite.TensorMapAddTensorIndex(b, index)
                offs.append(tflite.TensorMapEnd(b))
            return self.offsets(start, offs)

        v_in = maps(s.inputs, tflite.SignatureDefStartInputsVector)
        v_out = maps(s.outputs, tflite.SignatureDefStartOutputsVector)
        key = b.CreateString(s.key)
        tflite.SignatureDefStart(b)
        tflite.SignatureDefAddInputs(b, v_in)
        tflite.SignatureDefAddOutputs(b, v_out)
        tflite.SignatureDefAddSignatureKey(b, key)
        tflite.SignatureDefAddSubgraphIndex(b, s.subgraph)
        return tflite.SignatureDefEnd(b)


def _raw_bytes(data: np.ndarray, dtype: str) -> bytes:
    """Little-endian bytes of a constant as TFLite stores it (int4: two per byte, low first)."""
    if dtype == "int4":
        v = data.reshape(-1).astype(np.int8)
        if v.size % 2:
            v = np.concatenate([v, np.zeros(1, np.int8)])
        nib = (v.astype(np.uint8) & 0x0F).reshape(-1, 2)
        return (nib[:, 0] | (nib[:, 1] << 4)).astype(np.uint8).tobytes()
    if dtype == "string":
        raise ValueError("string constants are not supported by the writer")
    return np.ascontiguousarray(data, numpy_dtype(dtype).newbyteorder("<")).tobytes()


# -- convenience ----------------------------------------------------------------------------


@dataclass
class TensorSpec:
    """An op operand for :func:`single_op_model`: shape, dtype, quantization, optional data.

    As a graph input, ``data`` (if given) is the value to feed; as a constant it is the
    contents. Callers that make random data (``tests/oplib.py``) draw it from ``low`` ..
    ``high`` when ``data`` is absent.
    """

    shape: Sequence[int] | None = None
    dtype: DType = "float32"
    quant: QuantLike = None
    data: np.ndarray | None = None
    name: str | None = None
    sparsity: Sparsity | None = None
    low: float | None = None  # range of random data made for this operand (tests/oplib.py)
    high: float | None = None

    @staticmethod
    def of(x: np.ndarray | TensorSpec) -> TensorSpec:
        if isinstance(x, TensorSpec):
            return x
        arr = np.asarray(x)
        return TensorSpec(arr.shape, arr.dtype, None, arr)

    def resolved_shape(self) -> list[int]:
        if self.shape is not None:
            return list(self.shape)
        if self.data is not None:
            return list(np.shape(self.data))
        raise ValueError("TensorSpec needs a shape or data")


def single_op_model(
    op_name: str,
    inputs: Sequence[np.ndarray | TensorSpec | None],
    options: Mapping[str, Any] | None = None,
    *,
    consts: Mapping[int, np.ndarray | TensorSpec] | Sequence[np.ndarray | TensorSpec] | None = None,
    out_shape: Sequence[int] | None = None,
    out_dtype: DType | None = None,
    out_quant: QuantLike = None,
    outputs: Sequence[TensorSpec] | None = None,
    version: int = 1,
    custom_options: bytes | Mapping[str, Any] | None = None,
) -> bytes:
    """A model with one op; non-constant inputs become graph inputs, in order.

    Args:
        op_name: builtin name, or ``"CUSTOM:<code>"`` for a custom op.
        inputs: arrays or specs (graph inputs) or None (omitted optional inputs).
        options: builtin options.
        consts: constant operands: a dict position -> value inserted at that position of the
            op's input list, or a sequence appended after ``inputs``. Specs need ``data``.
        out_shape, out_dtype, out_quant: the single output (defaults: the first input's).
        outputs: specs of several outputs (overrides ``out_*``).
        version: operator version.
        custom_options: for custom ops: raw bytes or a dict (flexbuffer map).

    Returns:
        The model bytes.
    """
    return build_single_op(
        op_name,
        inputs,
        options,
        consts=consts,
        out_shape=out_shape,
        out_dtype=out_dtype,
        out_quant=out_quant,
        outputs=outputs,
        version=version,
        custom_options=custom_options,
    )[0].build()


def build_single_op(
    op_name: str,
    inputs: Sequence[np.ndarray | TensorSpec | None],
    options: Mapping[str, Any] | None = None,
    *,
    consts: Mapping[int, np.ndarray | TensorSpec] | Sequence[np.ndarray | TensorSpec] | None = None,
    out_shape: Sequence[int] | None = None,
    out_dtype: DType | None = None,
    out_quant: QuantLike = None,
    outputs: Sequence[TensorSpec] | None = None,
    version: int = 1,
    custom_options: bytes | Mapping[str, Any] | None = None,
) -> tuple[ModelBuilder, list[TensorRef]]:
    """Like :func:`single_op_model` but returns the builder and the graph input refs."""
    b = ModelBuilder()
    operands: list[tuple[str, np.ndarray | TensorSpec | None]] = [("in", x) for x in inputs]
    if isinstance(consts, Mapping):
        for pos in sorted(consts):
            operands.insert(pos, ("const", consts[pos]))
    elif consts is not None:
        operands += [("const", c) for c in consts]
    refs: list[TensorLike] = []
    graph_inputs = []
    for i, (kind, x) in enumerate(operands):
        if x is None:
            refs.append(None)
            continue
        spec = TensorSpec.of(x)
        name = spec.name or f"{kind}{i}"
        if kind == "const":
            if spec.data is None:
                raise ValueError(f"constant operand {i} needs data")
            ref = b.const(
                name,
                spec.data,
                spec.dtype,
                quant=spec.quant,
                sparsity=spec.sparsity,
                shape=spec.shape,
            )
        else:
            ref = b.input(name, spec.resolved_shape(), spec.dtype, quant=spec.quant)
            graph_inputs.append(ref)
        refs.append(ref)
    outs = None
    if outputs is not None:
        outs = [
            b.tensor(o.name or f"out{j}", o.resolved_shape(), o.dtype, quant=o.quant)
            for j, o in enumerate(outputs)
        ]
    if op_name.upper().startswith("CUSTOM:"):
        y = b.custom_op(
            op_name.split(":", 1)[1],
            refs,
            out_shape=out_shape,
            out_dtype=out_dtype,
            out_quant=out_quant,
            outputs=outs,
            custom_options=custom_options,
            version=version,
        )
    else:
        y = b.op(
            op_name,
            refs,
            out_shape=out_shape,
            out_dtype=out_dtype,
            out_quant=out_quant,
            outputs=outs,
            options=options,
            version=version,
        )
    b.output(*(y if isinstance(y, tuple) else (y,)))
    return b, graph_inputs
