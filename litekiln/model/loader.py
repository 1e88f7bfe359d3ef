"""Load a ``.tflite`` flatbuffer into litekiln's graph IR.

Every way a file can be wrong (not a flatbuffer, foreign identifier, truncated, unsupported
schema version, dangling indices, buffers out of range, corrupted tables) surfaces as one
exception type, :class:`litekiln.ModelError`, whose message says what is wrong. The file is
read with litekiln's own flatbuffer reader (:mod:`litekiln.model.flat`, which keeps every
position it follows inside the file) and the schema's generated tables
(:mod:`litekiln.model.schema_tables`): the ``tflite`` package is never imported. This module
checks every index and every vector length against the file before it trusts it.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from litekiln.errors import ModelError, ModelValidationError
from litekiln.model.densify import densify
from litekiln.model.flat import Table, root
from litekiln.model.ir import Model, Op, Quantization, SignatureDef, Subgraph, Tensor
from litekiln.model.schema import (
    Field,
    builtin_name,
    decode_options,
    table_fields,
    union_tables,
)
from litekiln.model.token import model_token

#: Newest TFLite schema version we read (TFLITE_SCHEMA_VERSION in schema.fbs).
SCHEMA_VERSION = 3

#: Largest constant (dense element count) the loader materialises; anything larger in a file
#: small enough to load here is a corrupted shape, and allocating it would exhaust memory.
MAX_CONSTANT_ELEMENTS = 1 << 28

#: Largest tensor the model may declare (bytes): beyond it a shape is corrupt or the model is
#: not one a phone or a GPU runs. (LiteRT lets a 300 TiB input through allocate_tensors and
#: fails when it is first touched.)
MAX_TENSOR_BYTES = 2 << 30

#: Largest sum of the sizes of subgraph 0's non-constant tensors (bytes): the numpy reference
#: keeps every one. The models of the zoo need 0.1-64 MiB.
MAX_ACTIVATION_BYTES = 4 << 30

#: Options that hold a TensorType, and the largest TensorType LiteRT 2.3 knows (FLOAT8_E5M2):
#: its option parser refuses any other value ("Unsupported data type").
_TENSOR_TYPE_OPTIONS = {
    "quantized_bias_type",
    "output_type",
    "out_type",
    "in_data_type",
    "out_data_type",
}
_MAX_TENSOR_TYPE = 22

#: Element types litekiln cannot run: no op of the numpy reference or of the GPU path takes
#: them. complex64 is the exception (`_RUNNABLE`): the CPU's spectral ops (RFFT2D and the
#: ops that read its output, :mod:`litekiln.ops.spectral`) take it; complex128 no op makes.
_UNSUPPORTED_KINDS = {"c": "complex", "O": "string"}
_RUNNABLE = frozenset({np.dtype(np.complex64)})

_FILE_IDENTIFIER = b"TFL3"

# TensorType enum of schema.fbs -> numpy dtype (little-endian, as TFLite stores it).
_DTYPES: dict[int, np.dtype] = {
    0: np.dtype("<f4"),  # FLOAT32
    1: np.dtype("<f2"),  # FLOAT16
    2: np.dtype("<i4"),  # INT32
    3: np.dtype("u1"),  # UINT8
    4: np.dtype("<i8"),  # INT64
    5: np.dtype(object),  # STRING: never a GPU or reference type; kept for completeness
    6: np.dtype("?"),  # BOOL
    7: np.dtype("<i2"),  # INT16
    8: np.dtype("<c8"),  # COMPLEX64
    9: np.dtype("i1"),  # INT8
    10: np.dtype("<f8"),  # FLOAT64
    11: np.dtype("<c16"),  # COMPLEX128
    12: np.dtype("<u8"),  # UINT64
    15: np.dtype("<u4"),  # UINT32
    16: np.dtype("<u2"),  # UINT16
    17: np.dtype("i1"),  # INT4, unpacked to one int8 per element
}
#: The same in the machine's byte order: the IR's tensor types.
_NATIVE_DTYPES = {
    k: np.dtype(v.newbyteorder("=")) if v.kind != "O" else v for k, v in _DTYPES.items()
}
_INT4 = 17
#: The fields the loader reads, by table (vtable offsets and formats from schema_tables).
_MODEL = table_fields("Model")
_OPERATOR_CODE = table_fields("OperatorCode")
_BUFFER = table_fields("Buffer")
_SUBGRAPH = table_fields("SubGraph")
_TENSOR = table_fields("Tensor")
_OPERATOR = table_fields("Operator")
_QUANTIZATION = table_fields("QuantizationParameters")
_SPARSITY = table_fields("SparsityParameters")
_DIM_METADATA = table_fields("DimensionMetadata")
_SIGNATURE = table_fields("SignatureDef")
_TENSOR_MAP = table_fields("TensorMap")
_METADATA = table_fields("Metadata")
#: SparseIndexVector union code -> the ``values`` field of its table (Int32Vector...).
_INDEX_VECTORS = {
    code: table_fields(table)["values"] for code, table in union_tables("SparseIndexVector").items()
}


def _scalar(tab: Table, field: Field) -> Any:
    return tab.scalar(field.offset, field.format, field.default)


_FLATBUFFER_ERRORS = (
    struct.error,
    IndexError,
    ValueError,
    TypeError,
    OverflowError,
    UnicodeDecodeError,
    AttributeError,
    RecursionError,
)


#: Checks every loaded model passes after the loader's own, in order (see
#: :func:`add_model_check`). The op registry (litekiln.ops, a layer above this one) adds its
#: per-op checks when it is imported, as it adds its ops: every path that runs or compiles a
#: model imports it before it loads one.
_MODEL_CHECKS: list[Callable[[Model], None]] = []


def add_model_check(check: Callable[[Model], None]) -> None:
    """Run ``check(model)`` on every model :func:`load_model` loads (once per check).

    Args:
        check: raises :class:`~litekiln.ModelError` for a model that must not be run.
    """
    if check not in _MODEL_CHECKS:
        _MODEL_CHECKS.append(check)


def model_checks_registered() -> bool:
    """Whether the op registry's checks (`add_model_check`) are registered: whether
    :func:`load_model` runs them now (``litekiln.ops`` imported)."""
    return bool(_MODEL_CHECKS)


def load_model(
    source: str | os.PathLike[str] | bytes | bytearray | memoryview,
    *,
    token: str | None = None,
    name: str | None = None,
    validate: bool = True,
) -> Model:
    """Parse a TFLite model into the graph IR and check it.

    Args:
        source: a path to a ``.tflite`` file, or the model's bytes.
        token: the model token to use; default: farmhash Fingerprint64 of the bytes (hex).
        name: display name; default: the file stem, or ``"model"`` for bytes.
        validate: run the checks of :func:`add_model_check` (the per-op rules LiteRT
            checks when it prepares a model). The loader's own checks always run.

    Returns:
        The loaded :class:`~litekiln.model.ir.Model`, constants dequantized and densified.

    Raises:
        ModelError: the file cannot be read or is not a valid TFLite model;
            :class:`~litekiln.errors.ModelValidationError` (a ModelError) when it breaks a
            rule LiteRT (or litekiln) checks before running a model, naming op and rule.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        display = name or "model"
    else:
        path = Path(source)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ModelError(f"{path}: no such model file") from None
        except IsADirectoryError:
            raise ModelError(f"{path}: is a directory, expected a .tflite file") from None
        except OSError as exc:
            raise ModelError(f"{path}: cannot read model file: {exc.strerror or exc}") from None
        display = name or path.stem
    model = _Loader(data, display).load(token)
    if validate:
        run_model_checks(model)
    return model


def run_model_checks(model: Model) -> None:
    """Run the checks of :func:`add_model_check` on ``model``, as :func:`load_model` does
    (for a model loaded before they were registered).

    Raises:
        ModelValidationError: as :func:`load_model`.
    """
    for check in _MODEL_CHECKS:
        check(model)


def _check_header(data: bytes, where: str) -> None:
    if len(data) == 0:
        raise ModelError(f"{where}: empty file, expected a TFLite flatbuffer")
    if len(data) < 8:
        raise ModelError(f"{where}: truncated ({len(data)} bytes), expected a TFLite flatbuffer")
    ident = data[4:8]
    if ident != _FILE_IDENTIFIER:
        hint = ""
        if data[:4] == b"PK\x03\x04":
            hint = " (this is a zip archive)"
        elif data[:8] == b"\x89HDF\r\n\x1a\n":
            hint = " (this is an HDF5/Keras file)"
        elif data[:2] in (b"\x08\x01", b"\n\x0b") or data[:1] == b"\x08":
            hint = " (this may be a TensorFlow protobuf, e.g. a SavedModel .pb)"
        raise ModelError(
            f"{where}: not a TFLite model: file identifier is {ident!r}, expected b'TFL3'{hint}"
        )
    root = struct.unpack_from("<I", data, 0)[0]
    if root + 4 > len(data):
        raise ModelError(
            f"{where}: truncated or corrupt: root table offset {root} is past the end of the "
            f"{len(data)}-byte file"
        )


class _Loader:
    """One load of one model file; keeps the bytes and the name for messages."""

    def __init__(self, data: bytes, name: str) -> None:
        self.data = data
        self.name = name
        self.nbytes = len(data)

    # -- helpers ---------------------------------------------------------------------------

    def fail(self, msg: str) -> ModelError:
        return ModelError(f"{self.name}: {msg}")

    def invalid(self, rule: str, msg: str) -> ModelValidationError:
        """A model-level rule broken (LiteRT's or litekiln's); ``rule`` names it."""
        return ModelValidationError(f"{self.name}: {msg} [rule: {rule}]", rule=rule)

    def length(self, n: int, what: str, elem_size: int = 4) -> int:
        """Validate a vector length read from the file before looping over it."""
        if n < 0 or n * elem_size > self.nbytes:
            raise self.fail(f"corrupt {what}: vector of {n} elements does not fit in the file")
        return n

    def ints(self, tab: Table, offset: int, what: str) -> list[int]:
        """Read an int32 vector field (``shape``, ``inputs``...) with bounds checks."""
        start, n = tab.vector(offset)
        return list(tab.unpack(start, self.length(n, what), "i")) if n else []

    def tables(self, tab: Table, offset: int, what: str) -> list[Table]:
        """Read a vector of tables, its length checked first."""
        self.length(tab.vector(offset)[1], what)
        return tab.tables(offset)

    def string(self, tab: Table, offset: int, what: str) -> str:
        """A string field read with a bounds check; "" when absent."""
        span = tab.string_span(offset)
        if span is None:
            return ""
        start, length = span
        if start + length > self.nbytes:
            raise self.fail(f"{what} runs past the end of the file: truncated?")
        return self.data[start : start + length].decode("utf-8", errors="replace")

    # -- top level -------------------------------------------------------------------------

    def load(self, token: str | None) -> Model:
        _check_header(self.data, self.name)
        try:
            return self._load(token)
        except ModelError:
            raise
        except _FLATBUFFER_ERRORS as exc:
            raise self.fail(
                f"corrupt or truncated flatbuffer ({type(exc).__name__}: {exc})"
            ) from None
        except MemoryError:
            raise self.fail("corrupt model: a table asks for more memory than exists") from None

    def _load(self, token: str | None) -> Model:
        fb = root(self.data)
        version = _scalar(fb, _MODEL["version"])
        if version > SCHEMA_VERSION:
            raise self.fail(
                f"unsupported schema version {version}: this litekiln reads TFLite schema "
                f"versions up to {SCHEMA_VERSION}"
            )
        sub_tables = self.tables(fb, _MODEL["subgraphs"].offset, "subgraph list")
        if not sub_tables:
            raise self.fail("model has no subgraphs")
        opcodes = self._opcodes(fb)
        buffers = self._buffers(fb)
        subgraphs = [self._subgraph(sg, i, opcodes, buffers) for i, sg in enumerate(sub_tables)]
        for sub in subgraphs:
            sub.model_subgraphs = subgraphs
        check_graph(subgraphs[0], self.name)
        signatures = self._signatures(fb, subgraphs)
        metadata_names = [
            self.string(m, _METADATA["name"].offset, f"metadata {i} name")
            for i, m in enumerate(self.tables(fb, _MODEL["metadata"].offset, "metadata list"))
        ]
        return Model(
            subgraphs=subgraphs,
            token=token if token is not None else model_token(self.data),
            version=version,
            description=self.string(fb, _MODEL["description"].offset, "model description"),
            signatures=signatures,
            metadata_names=metadata_names,
            name=self.name,
            nbytes=self.nbytes,
            fingerprinted=token is None,
        )

    def _opcodes(self, fb: Table) -> list[tuple[int, str, int, str | None]]:
        out = []
        f = _OPERATOR_CODE
        entries = self.tables(fb, _MODEL["operator_codes"].offset, "operator-code table")
        for i, oc in enumerate(entries):
            # Codes >= 127 live only in the int32 field; older files only fill the int8 one
            # (LiteRT's GetBuiltinCode takes the larger).
            code = max(_scalar(oc, f["builtin_code"]), _scalar(oc, f["deprecated_builtin_code"]))
            # An explicit 0 is kept: LiteRT looks version 0 up, finds no kernel and refuses.
            version = _scalar(oc, f["version"])
            custom = (
                self.string(oc, f["custom_code"].offset, f"custom code of operator-code entry {i}")
                if code == 32
                else None
            )
            name = builtin_name(code)
            if name is None:
                raise self.fail(
                    f"operator code #{code} (table entry {i}) is not a TFLite builtin operator"
                )
            out.append((code, custom or name, version, custom))
        return out

    def _buffers(self, fb: Table) -> list[memoryview | None]:
        out: list[memoryview | None] = []
        view = memoryview(self.data)
        f = _BUFFER
        data_offset = f["data"].offset
        for i, b in enumerate(self.tables(fb, _MODEL["buffers"].offset, "buffer table")):
            off, size = _scalar(b, f["offset"]), _scalar(b, f["size"])
            if off > 1:
                # Large models keep buffers after the flatbuffer, addressed by file offset.
                if off + size > self.nbytes:
                    raise self.fail(
                        f"buffer {i} lies outside the file (offset {off} + size {size} > "
                        f"{self.nbytes} bytes): truncated file?"
                    )
                out.append(view[off : off + size])
                continue
            start, n = b.vector(data_offset)
            if n == 0:
                out.append(None)
                continue
            if start + n > self.nbytes:
                raise self.fail(
                    f"buffer {i} lies outside the file ({n} bytes at {start}, file is "
                    f"{self.nbytes} bytes): truncated file?"
                )
            out.append(view[start : start + n])
        return out

    def _quantization(
        self, t: Table, index: int, name: str, shape: tuple[int, ...]
    ) -> Quantization | None:
        """The tensor's affine parameters, checked as LiteRT's ``ParseQuantization`` does."""
        q = t.table(_TENSOR["quantization"].offset)
        if q is None:
            return None
        f = _QUANTIZATION
        n_scale = self.length(q.vector(f["scale"].offset)[1], "quantization scales")
        if n_scale == 0:
            return None
        where = f"tensor {index} ({name!r})"
        if not q.has(f["zero_point"].offset):
            raise self.invalid(
                "quantization-zero-points", f"{where} has quantization scales but no zero points"
            )
        scale = q.array(f["scale"].offset, "<f4").astype(np.float32)
        n_zp = self.length(q.vector(f["zero_point"].offset)[1], "quantization zero points", 8)
        if n_zp != n_scale:
            raise self.invalid(
                "quantization-zero-points",
                f"{where} has {n_scale} quantization scales but {n_zp} zero points",
            )
        zp = q.array(f["zero_point"].offset, "<i8").astype(np.int64)
        axis = _scalar(q, f["quantized_dimension"])
        if axis < 0 or (shape and axis >= len(shape)):
            raise self.invalid(
                "quantized-dimension",
                f"{where}: quantized dimension {axis} is not a dimension of shape {list(shape)}",
            )
        if n_scale != 1 and (not shape or n_scale != shape[axis]):
            # (LiteRT lets a scalar carry several scales; no kernel could use them.)
            expected = f"1 or {shape[axis]} (dimension {axis})" if shape else "1 (a scalar)"
            raise self.invalid(
                "quantization-scale-count",
                f"{where} of shape {list(shape)} has {n_scale} quantization scales, "
                f"expected {expected}",
            )
        return Quantization(scale=scale, zero_point=zp, axis=axis)

    def _tensor(self, t: Table, index: int, buffers: list[memoryview | None]) -> Tensor:
        f = _TENSOR
        name = self.string(t, f["name"].offset, f"name of tensor {index}")
        shape = tuple(self.ints(t, f["shape"].offset, f"shape of tensor {index}"))
        sig = (
            tuple(self.ints(t, f["shape_signature"].offset, f"shape signature of tensor {index}"))
            or shape
        )
        if any(d < 0 for d in shape):
            raise self.fail(f"tensor {index} ({name!r}) has a negative dimension in {shape}")
        ttype = _scalar(t, f["type"])
        dtype = _DTYPES.get(ttype)
        if dtype is None:
            raise self.fail(f"tensor {index} ({name!r}) has unsupported element type {ttype}")
        quant = self._quantization(t, index, name, shape)
        buf_index = _scalar(t, f["buffer"])
        if not 0 <= buf_index < len(buffers):
            raise self.fail(
                f"tensor {index} ({name!r}) refers to buffer {buf_index}, but the model has "
                f"{len(buffers)} buffers"
            )
        raw = buffers[buf_index]
        tensor = Tensor(
            index=index,
            name=name,
            shape=shape,
            shape_signature=sig,
            dtype=_NATIVE_DTYPES[ttype],
            quantization=quant,
            is_variable=bool(_scalar(t, f["is_variable"])),
            int4=ttype == _INT4,
        )
        if raw is None:
            return tensor
        count = math.prod(shape)
        if count > MAX_CONSTANT_ELEMENTS:
            raise self.fail(f"tensor {index} ({name!r}) is too large: shape {shape}")
        sparsity = t.table(f["sparsity"].offset)
        if sparsity is not None:
            tensor.data = self._densify(sparsity, raw, dtype, shape, index, name)
            tensor.was_sparse = True
            return tensor
        if dtype.kind == "O":
            return tensor  # string constants are left as raw bytes' absence: unused here
        if ttype == _INT4:
            tensor.data = _unpack_int4(np.frombuffer(raw, np.uint8), count).reshape(shape)
            return tensor
        expected = count * dtype.itemsize
        if len(raw) < expected:  # LiteRT accepts a larger buffer and reads its start
            raise self.fail(
                f"tensor {index} ({name!r}): buffer {buf_index} holds {len(raw)} bytes, "
                f"shape {shape} of {dtype.name} needs {expected}"
            )
        tensor.data = (
            np.frombuffer(raw[:expected], dtype).reshape(shape).astype(tensor.dtype, copy=False)
        )
        return tensor

    def _densify(
        self,
        sp: Table,
        raw: memoryview,
        dtype: np.dtype,
        shape: tuple[int, ...],
        index: int,
        name: str,
    ) -> np.ndarray:
        f, g = _SPARSITY, _DIM_METADATA
        traversal = self.ints(sp, f["traversal_order"].offset, "sparsity traversal order")
        block_map = self.ints(sp, f["block_map"].offset, "sparsity block map")
        dims: list[tuple[int, int, np.ndarray | None, np.ndarray | None]] = []
        for dm in self.tables(sp, f["dim_metadata"].offset, "sparsity dimension metadata"):
            segments = self._index_vector(
                *dm.union(g["array_segments_type"].offset, g["array_segments"].offset)
            )
            indices = self._index_vector(
                *dm.union(g["array_indices_type"].offset, g["array_indices"].offset)
            )
            dims.append((_scalar(dm, g["format"]), _scalar(dm, g["dense_size"]), segments, indices))
        if len(raw) % dtype.itemsize:
            raise self.fail(f"sparse tensor {index} ({name!r}): data size is not whole elements")
        values = np.frombuffer(raw, dtype)
        try:
            return densify(values, shape, traversal, block_map, dims)
        except ValueError as exc:
            raise self.invalid("sparsity", f"sparse tensor {index} ({name!r}): {exc}") from None

    def _index_vector(self, kind: int, table: Table | None) -> np.ndarray | None:
        if table is None or kind == 0:
            return None
        values = _INDEX_VECTORS.get(kind)
        if values is None:
            raise self.fail(f"unknown sparse index vector type {kind}")
        n = self.length(table.vector(values.offset)[1], "sparse index vector", 1)
        if n == 0:
            return np.zeros(0, np.int64)
        return table.array(values.offset, "<" + values.format).astype(np.int64)

    def _subgraph(
        self,
        sg: Table,
        index: int,
        opcodes: list[tuple[int, str, int, str | None]],
        buffers: list[memoryview | None],
    ) -> Subgraph:
        f, g = _SUBGRAPH, _OPERATOR
        tensors = [
            self._tensor(t, i, buffers)
            for i, t in enumerate(
                self.tables(sg, f["tensors"].offset, f"tensor list of subgraph {index}")
            )
        ]
        n_t = len(tensors)

        def check(ids: list[int], what: str, allow_omitted: bool) -> list[int]:
            for t in ids:
                if (t == -1 and allow_omitted) or 0 <= t < n_t:
                    continue
                raise self.fail(
                    f"{what} refers to tensor {t}, but subgraph {index} has {n_t} tensors"
                )
            return ids

        ops: list[Op] = []
        op_tables = self.tables(sg, f["operators"].offset, f"operator list of subgraph {index}")
        for i, o in enumerate(op_tables):
            oc = _scalar(o, g["opcode_index"])
            if not 0 <= oc < len(opcodes):
                raise self.fail(
                    f"op #{i} uses operator-code entry {oc}, but the table has {len(opcodes)}"
                )
            code, op_name, version, custom = opcodes[oc]
            where = f"op #{i} ({op_name})"
            inputs = check(
                self.ints(o, g["inputs"].offset, f"inputs of {where}"), f"{where} input", True
            )
            outputs = check(
                self.ints(o, g["outputs"].offset, f"outputs of {where}"), f"{where} output", False
            )
            custom_options = None
            if custom is not None:
                start, n = o.vector(g["custom_options"].offset)
                self.length(n, f"custom options of {where}", 1)
                o.check(start, n, 1)
                custom_options = self.data[start : start + n] if n else b""
            options = decode_options(o, op_name) if custom is None else {}
            for key in _TENSOR_TYPE_OPTIONS.intersection(options):
                if not 0 <= int(options[key]) <= _MAX_TENSOR_TYPE:
                    raise self.invalid(
                        "option-tensor-type",
                        f"op #{i} ({op_name}): option {key} = {options[key]} is no TensorType "
                        "LiteRT knows",
                    )
            ops.append(
                Op(i, op_name, code, version, inputs, outputs, options, custom, custom_options)
            )
        inputs = check(
            self.ints(sg, f["inputs"].offset, f"inputs of subgraph {index}"), "graph input", False
        )
        outputs = check(
            self.ints(sg, f["outputs"].offset, f"outputs of subgraph {index}"),
            "graph output",
            False,
        )
        # A tensor of no elements that no op writes and no input provides is an empty
        # constant: TensorFlow's converter writes the shape of `tf.reshape(x, [])` so, an
        # int32 [0] on the empty buffer (BirdNET's spectrogram framing), and LiteRT reads it.
        written = {t for op in ops for t in op.outputs}
        for t in tensors:
            if (
                t.data is None
                and 0 in t.shape
                and not t.is_variable
                and t.dtype.kind != "O"
                and t.index not in written
                and t.index not in inputs
            ):
                t.data = np.empty(t.shape, t.dtype)
        sub = Subgraph(
            index,
            self.string(sg, f["name"].offset, f"name of subgraph {index}"),
            tensors,
            ops,
            inputs,
            outputs,
            file_tensors=n_t,
        )
        _fold_constants(sub, self.fail)
        return sub

    def _signatures(self, fb: Table, subgraphs: list[Subgraph]) -> list[SignatureDef]:
        out = []
        f = _SIGNATURE
        for i, s in enumerate(self.tables(fb, _MODEL["signature_defs"].offset, "signature list")):
            sg = _scalar(s, f["subgraph_index"])
            if not 0 <= sg < len(subgraphs):
                raise self.fail(f"signature {i} refers to missing subgraph {sg}")
            n_t = len(subgraphs[sg].tensors)
            out.append(
                SignatureDef(
                    key=self.string(s, f["signature_key"].offset, f"signature {i} key"),
                    subgraph_index=sg,
                    inputs=self._signature_tensors(i, n_t, s, f["inputs"].offset, "input"),
                    outputs=self._signature_tensors(i, n_t, s, f["outputs"].offset, "output"),
                )
            )
        return out

    def _signature_tensors(
        self, sig: int, n_tensors: int, s: Table, offset: int, what: str
    ) -> dict[str, int]:
        """Name -> tensor index of signature ``sig``'s inputs or outputs (``what``)."""
        m = {}
        f = _TENSOR_MAP
        for e in self.tables(s, offset, what):
            t = _scalar(e, f["tensor_index"])
            if not 0 <= t < n_tensors:
                raise self.fail(f"signature {sig} {what} refers to missing tensor {t}")
            m[self.string(e, f["name"].offset, f"signature {sig} {what} name")] = t
        return m


def check_tensors(model_name: str, tensors: Iterable[Tensor]) -> None:
    """Element types litekiln runs and sizes within :data:`MAX_TENSOR_BYTES`.

    Raises:
        ModelValidationError: naming the tensor (rule ``tensor-dtype`` or ``tensor-size``).
    """
    unsupported = _UNSUPPORTED_KINDS
    for tensor in tensors:
        dtype = tensor.dtype
        kind = unsupported.get(dtype.kind) if dtype not in _RUNNABLE else None
        if tensor.int4 and tensor.data is None:
            kind = "INT4 activation"  # (INT4 constants are unpacked to int8 at load)
        if kind is not None:
            raise _invalid(
                model_name,
                "tensor-dtype",
                f"tensor {tensor.index} ({tensor.name!r}) has element type {tensor.type_name}: "
                f"litekiln runs no {kind} tensors",
            )
        nbytes = math.prod(tensor.shape) * dtype.itemsize
        if nbytes > MAX_TENSOR_BYTES:
            raise _invalid(
                model_name,
                "tensor-size",
                f"tensor {tensor.index} ({tensor.name!r}) of shape {list(tensor.shape)} needs "
                f"{nbytes} bytes, more than the {MAX_TENSOR_BYTES >> 30} GiB litekiln allows a "
                "tensor",
            )


def check_activation_bytes(sg: Subgraph, model_name: str) -> None:
    """The non-constant tensors together within :data:`MAX_ACTIVATION_BYTES`.

    Raises:
        ModelValidationError: rule ``model-size``.
    """
    total = sum(math.prod(t.shape) * t.dtype.itemsize for t in sg.tensors if t.data is None)
    if total > MAX_ACTIVATION_BYTES:
        raise _invalid(
            model_name,
            "model-size",
            f"the non-constant tensors need {total} bytes together, more than the "
            f"{MAX_ACTIVATION_BYTES >> 30} GiB litekiln allows a model",
        )


def _invalid(model_name: str, rule: str, msg: str) -> ModelValidationError:
    return ModelValidationError(f"{model_name}: {msg} [rule: {rule}]", rule=rule)


def check_graph(sg: Subgraph, model_name: str) -> None:
    """litekiln's model-level rules for the subgraph it runs.

    Tensors no op writes pass :func:`check_tensors` (an op's output gets its type and shape
    from the op's checks, as LiteRT's kernels set them, and is checked after them, with the
    total size: :func:`check_activation_bytes`); no
    graph input is a constant; every op reads only tensors that exist when it runs (graph
    inputs, constants, variables, earlier ops' outputs) and writes only tensors no other op,
    constant or graph input provides; every graph output is computed. LiteRT checks none of
    the ordering rules: it runs such a model on uninitialised memory.

    Raises:
        ModelValidationError: a rule is broken; ``rule`` says which.
    """

    def invalid(rule: str, msg: str) -> ModelValidationError:
        return _invalid(model_name, rule, msg)

    written = {t for op in sg.ops for t in op.outputs}
    check_tensors(model_name, [t for t in sg.tensors if t.index not in written])
    for t in sg.inputs:
        if sg.tensors[t].data is not None:
            raise invalid(
                "input-is-constant",
                f"graph input {t} ({sg.tensors[t].name!r}) is a constant",
            )
    folded = {t for op in sg.ops if op.folded for t in op.outputs}
    ready = {
        t.index
        for t in sg.tensors
        if (t.data is not None and t.index not in folded) or t.is_variable
    }
    ready.update(sg.inputs)
    for op in sg.ops:
        for t in op.inputs if not op.folded else ():
            if t >= 0 and t not in ready:
                raise invalid(
                    "input-not-computed",
                    f"{op.describe()} reads tensor {t} ({sg.tensors[t].name!r}) before any op "
                    "writes it (it is no graph input, constant or earlier op's output)",
                )
        for t in op.outputs:  # (a folded op's constant output exists from its place on)
            if t in ready:
                what = (
                    "a graph input"
                    if t in sg.inputs
                    else "a constant"
                    if sg.tensors[t].data is not None and t not in folded
                    else "written by an earlier op"
                )
                raise invalid(
                    "output-written-twice",
                    f"{op.describe()} writes tensor {t} ({sg.tensors[t].name!r}), which is {what}",
                )
            ready.add(t)
    for t in sg.outputs:
        if t not in ready:
            raise invalid(
                "output-not-computed",
                f"graph output {t} ({sg.tensors[t].name!r}) is no graph input, constant or "
                "op output",
            )


def _unpack_int4(packed: np.ndarray, count: int) -> np.ndarray:
    """INT4 constants pack two values per byte, low nibble first, two's complement."""
    lo = (packed & 0x0F).astype(np.int8)
    hi = (packed >> 4).astype(np.int8)
    both = np.stack([lo, hi], axis=1).reshape(-1)[:count]
    return np.where(both > 7, both - 16, both).astype(np.int8)


def dequantize_array(data: np.ndarray, quant: Quantization | None) -> np.ndarray:
    """Float32 view of a constant: fp16 widened, quantized integers scaled.

    Args:
        data: the stored constant.
        quant: its quantization parameters, or None.

    Returns:
        A float32 array of the same shape.
    """
    if data.dtype == np.float16 or quant is None:
        return data.astype(np.float32)
    shape = quant.broadcast_shape(data.ndim)
    scale = quant.scale.reshape(shape).astype(np.float32)
    zp = quant.zero_point.reshape(shape)
    return ((data.astype(np.int64) - zp) * scale).astype(np.float32)


def _fold_constants(sg: Subgraph, fail: Callable[[str], ModelError]) -> None:
    """Fold DENSIFY and DEQUANTIZE ops whose input is a constant into constant outputs.

    The output takes the input's shape and (DEQUANTIZE) float32, whatever the file declares:
    LiteRT's kernels resize their output and set its type so.
    """
    for op in sg.ops:
        if op.name not in ("DEQUANTIZE", "DENSIFY") or len(op.inputs) != 1 or len(op.outputs) != 1:
            continue
        src, dst = (
            sg.tensors[op.inputs[0]] if op.inputs[0] >= 0 else None,
            sg.tensors[op.outputs[0]],
        )
        if src is None or src.data is None or dst is src:
            continue
        if op.name == "DENSIFY":
            data = src.data
        elif src.data.dtype.kind in "iuf" and src.data.dtype.itemsize <= 2:
            data = dequantize_array(src.data, src.quantization)
        else:
            continue  # not a type DEQUANTIZE takes: the op's checks refuse it
        if dst.shape != data.shape or dst.dtype != data.dtype or dst.int4:
            if dst.shape_signature == dst.shape:
                dst.shape_signature = data.shape
            dst.shape, dst.dtype, dst.int4 = (
                data.shape,
                data.dtype,
                src.int4 and op.name != "DEQUANTIZE",
            )
        dst.data = data
        op.folded = True
