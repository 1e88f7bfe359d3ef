"""Load a ``.tflite`` flatbuffer into litekiln's graph IR.

Every way a file can be wrong (not a flatbuffer, foreign identifier, truncated, unsupported
schema version, dangling indices, buffers out of range, corrupted tables) surfaces as one
exception type, :class:`litekiln.ModelError`, whose message says what is wrong. The flatbuffer
accessors of the ``tflite`` package do no verification, so this module checks every index and
every vector length against the file before it trusts it.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from litekiln.errors import ModelError
from litekiln.model.densify import densify
from litekiln.model.ir import Model, Op, Quantization, SignatureDef, Subgraph, Tensor
from litekiln.model.token import model_token

#: Newest TFLite schema version we read (TFLITE_SCHEMA_VERSION in schema.fbs).
SCHEMA_VERSION = 3

#: Largest constant (dense element count) the loader materialises; anything larger in a file
#: small enough to load here is a corrupted shape, and allocating it would exhaust memory.
MAX_CONSTANT_ELEMENTS = 1 << 28

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
_INT4 = 17
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


def load_model(
    source: str | os.PathLike[str] | bytes | bytearray | memoryview,
    *,
    token: str | None = None,
    name: str | None = None,
) -> Model:
    """Parse a TFLite model into the graph IR.

    Args:
        source: a path to a ``.tflite`` file, or the model's bytes.
        token: the model token to use; default: farmhash Fingerprint64 of the bytes (hex).
        name: display name; default: the file stem, or ``"model"`` for bytes.

    Returns:
        The loaded :class:`~litekiln.model.ir.Model`, constants dequantized and densified.

    Raises:
        ModelError: the file cannot be read or is not a valid TFLite model.
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
    return _Loader(data, display).load(token)


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

    def length(self, n: int, what: str, elem_size: int = 4) -> int:
        """Validate a vector length read from the file before looping over it."""
        if n < 0 or n * elem_size > self.nbytes:
            raise self.fail(f"corrupt {what}: vector of {n} elements does not fit in the file")
        return n

    def ints(self, obj: Any, field: str, what: str) -> list[int]:
        """Read an int vector field (``Shape``, ``Inputs``...) with bounds checks."""
        n = self.length(getattr(obj, field + "Length")(), what)
        if n == 0:
            return []
        arr = getattr(obj, field + "AsNumpy")()
        if isinstance(arr, int):  # the tflite package returns 0 for an absent vector
            return []
        return [int(v) for v in arr[:n]]

    @staticmethod
    def text(raw: bytes | None) -> str:
        return raw.decode("utf-8", errors="replace") if raw else ""

    def string(self, obj: Any, vtable_offset: int, what: str) -> str:
        """A string field read with a bounds check (the generated readers silently cut a
        string that runs past the end of the file)."""
        tab = obj._tab
        o = tab.Offset(vtable_offset)
        if o == 0:
            return ""
        off = o + tab.Pos
        off += struct.unpack_from("<I", self.data, off)[0]
        length = struct.unpack_from("<I", self.data, off)[0]
        start = off + 4
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
        import tflite  # the generated flatbuffer readers; imported here to keep import cheap

        fb = tflite.Model.GetRootAs(self.data, 0)
        version = fb.Version()
        if version > SCHEMA_VERSION:
            raise self.fail(
                f"unsupported schema version {version}: this litekiln reads TFLite schema "
                f"versions up to {SCHEMA_VERSION}"
            )
        n_sub = self.length(fb.SubgraphsLength(), "subgraph list")
        if n_sub == 0:
            raise self.fail("model has no subgraphs")
        opcodes = self._opcodes(fb)
        buffers = self._buffers(fb)
        subgraphs = [self._subgraph(fb.Subgraphs(i), i, opcodes, buffers) for i in range(n_sub)]
        signatures = self._signatures(fb, subgraphs)
        n_meta = self.length(fb.MetadataLength(), "metadata list")
        metadata_names = [
            self.string(fb.Metadata(i), 4, f"metadata {i} name") for i in range(n_meta)
        ]
        return Model(
            subgraphs=subgraphs,
            token=token if token is not None else model_token(self.data),
            version=version,
            description=self.string(fb, 10, "model description"),
            signatures=signatures,
            metadata_names=metadata_names,
            name=self.name,
            nbytes=self.nbytes,
        )

    def _opcodes(self, fb: Any) -> list[tuple[int, str, int, str | None]]:
        from litekiln.model.schema import builtin_name

        out = []
        for i in range(self.length(fb.OperatorCodesLength(), "operator-code table")):
            oc = fb.OperatorCodes(i)
            # Codes >= 127 live only in the int32 field; older files only fill the int8 one.
            code = max(int(oc.BuiltinCode()), int(oc.DeprecatedBuiltinCode()))
            version = int(oc.Version()) or 1
            custom = (
                self.string(oc, 6, f"custom code of operator-code entry {i}")
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

    def _buffers(self, fb: Any) -> list[memoryview | None]:
        out: list[memoryview | None] = []
        view = memoryview(self.data)
        for i in range(self.length(fb.BuffersLength(), "buffer table")):
            b = fb.Buffers(i)
            off, size = int(b.Offset()), int(b.Size())
            if off > 1:
                # Large models keep buffers after the flatbuffer, addressed by file offset.
                if off + size > self.nbytes:
                    raise self.fail(
                        f"buffer {i} lies outside the file (offset {off} + size {size} > "
                        f"{self.nbytes} bytes): truncated file?"
                    )
                out.append(view[off : off + size])
                continue
            n = b.DataLength()
            if n == 0:
                out.append(None)
                continue
            start = b._tab.Vector(b._tab.Offset(4))
            if start + n > self.nbytes or start < 0:
                raise self.fail(
                    f"buffer {i} lies outside the file ({n} bytes at {start}, file is "
                    f"{self.nbytes} bytes): truncated file?"
                )
            out.append(view[start : start + n])
        return out

    def _quantization(self, t: Any) -> Quantization | None:
        q = t.Quantization()
        if q is None:
            return None
        n_scale = self.length(q.ScaleLength(), "quantization scales")
        if n_scale == 0:
            return None
        scale = np.asarray(q.ScaleAsNumpy()[:n_scale], dtype=np.float32)
        n_zp = self.length(q.ZeroPointLength(), "quantization zero points", 8)
        zp = (
            np.asarray(q.ZeroPointAsNumpy()[:n_zp], dtype=np.int64)
            if n_zp
            else np.zeros(n_scale, np.int64)
        )
        if zp.size == 1 and n_scale > 1:
            zp = np.repeat(zp, n_scale)
        if zp.size != n_scale:
            raise self.fail(
                f"tensor {self.text(t.Name())!r}: {n_scale} quantization scales but "
                f"{zp.size} zero points"
            )
        return Quantization(scale=scale, zero_point=zp, axis=int(q.QuantizedDimension()))

    def _tensor(self, t: Any, index: int, buffers: list[memoryview | None]) -> Tensor:
        name = self.string(t, 10, f"name of tensor {index}")  # Tensor.name
        shape = tuple(self.ints(t, "Shape", f"shape of tensor {index}"))
        sig = tuple(self.ints(t, "ShapeSignature", f"shape signature of tensor {index}")) or shape
        if any(d < 0 for d in shape):
            raise self.fail(f"tensor {index} ({name!r}) has a negative dimension in {shape}")
        ttype = int(t.Type())
        dtype = _DTYPES.get(ttype)
        if dtype is None:
            raise self.fail(f"tensor {index} ({name!r}) has unsupported element type {ttype}")
        quant = self._quantization(t)
        if quant is not None and quant.per_channel and not (0 <= quant.axis < max(len(shape), 1)):
            raise self.fail(
                f"tensor {index} ({name!r}): quantized dimension {quant.axis} out of range "
                f"for shape {shape}"
            )
        buf_index = int(t.Buffer())
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
            dtype=np.dtype(dtype.newbyteorder("=")) if dtype.kind != "O" else dtype,
            quantization=quant,
            is_variable=bool(t.IsVariable()),
        )
        if raw is None:
            return tensor
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if count > MAX_CONSTANT_ELEMENTS:
            raise self.fail(f"tensor {index} ({name!r}) is too large: shape {shape}")
        sparsity = t.Sparsity()
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
        if len(raw) != expected:
            raise self.fail(
                f"tensor {index} ({name!r}): buffer {buf_index} holds {len(raw)} bytes, "
                f"shape {shape} of {dtype.name} needs {expected}"
            )
        tensor.data = np.frombuffer(raw, dtype).reshape(shape).astype(tensor.dtype, copy=False)
        return tensor

    def _densify(
        self,
        sp: Any,
        raw: memoryview,
        dtype: np.dtype,
        shape: tuple[int, ...],
        index: int,
        name: str,
    ) -> np.ndarray:
        traversal = self.ints(sp, "TraversalOrder", "sparsity traversal order")
        block_map = self.ints(sp, "BlockMap", "sparsity block map")
        dims: list[tuple[int, int, np.ndarray | None, np.ndarray | None]] = []
        for i in range(self.length(sp.DimMetadataLength(), "sparsity dimension metadata")):
            dm = sp.DimMetadata(i)
            segments = self._index_vector(dm.ArraySegmentsType(), dm.ArraySegments())
            indices = self._index_vector(dm.ArrayIndicesType(), dm.ArrayIndices())
            dims.append((int(dm.Format()), int(dm.DenseSize()), segments, indices))
        if len(raw) % dtype.itemsize:
            raise self.fail(f"sparse tensor {index} ({name!r}): data size is not whole elements")
        values = np.frombuffer(raw, dtype)
        try:
            return densify(values, shape, traversal, block_map, dims)
        except ValueError as exc:
            raise self.fail(f"sparse tensor {index} ({name!r}): {exc}") from None

    def _index_vector(self, kind: int, table: Any) -> np.ndarray | None:
        import tflite

        if table is None or kind == 0:
            return None
        cls = {1: tflite.Int32Vector, 2: tflite.Uint16Vector, 3: tflite.Uint8Vector}.get(kind)
        if cls is None:
            raise self.fail(f"unknown sparse index vector type {kind}")
        vec = cls()
        vec.Init(table.Bytes, table.Pos)
        n = self.length(vec.ValuesLength(), "sparse index vector", 1)
        arr = vec.ValuesAsNumpy()
        if n == 0 or isinstance(arr, int):
            return np.zeros(0, np.int64)
        return np.asarray(arr[:n], dtype=np.int64)

    def _subgraph(
        self,
        sg: Any,
        index: int,
        opcodes: list[tuple[int, str, int, str | None]],
        buffers: list[memoryview | None],
    ) -> Subgraph:
        from litekiln.model.schema import decode_options

        n_t = self.length(sg.TensorsLength(), f"tensor list of subgraph {index}")
        tensors = [self._tensor(sg.Tensors(i), i, buffers) for i in range(n_t)]

        def check(ids: list[int], what: str, allow_omitted: bool) -> list[int]:
            for t in ids:
                if (t == -1 and allow_omitted) or 0 <= t < n_t:
                    continue
                raise self.fail(
                    f"{what} refers to tensor {t}, but subgraph {index} has {n_t} tensors"
                )
            return ids

        ops: list[Op] = []
        for i in range(self.length(sg.OperatorsLength(), f"operator list of subgraph {index}")):
            o = sg.Operators(i)
            oc = int(o.OpcodeIndex())
            if not 0 <= oc < len(opcodes):
                raise self.fail(
                    f"op #{i} uses operator-code entry {oc}, but the table has {len(opcodes)}"
                )
            code, op_name, version, custom = opcodes[oc]
            where = f"op #{i} ({op_name})"
            inputs = check(self.ints(o, "Inputs", f"inputs of {where}"), f"{where} input", True)
            outputs = check(
                self.ints(o, "Outputs", f"outputs of {where}"), f"{where} output", False
            )
            custom_options = None
            if custom is not None:
                n = self.length(o.CustomOptionsLength(), f"custom options of {where}", 1)
                arr = o.CustomOptionsAsNumpy()
                custom_options = bytes(arr[:n]) if n and not isinstance(arr, int) else b""
            options = decode_options(o)
            ops.append(
                Op(i, op_name, code, version, inputs, outputs, options, custom, custom_options)
            )
        inputs = check(self.ints(sg, "Inputs", f"inputs of subgraph {index}"), "graph input", False)
        outputs = check(
            self.ints(sg, "Outputs", f"outputs of subgraph {index}"), "graph output", False
        )
        sub = Subgraph(
            index, self.string(sg, 12, f"name of subgraph {index}"), tensors, ops, inputs, outputs
        )
        _fold_constants(sub, self.fail)
        return sub

    def _signatures(self, fb: Any, subgraphs: list[Subgraph]) -> list[SignatureDef]:
        out = []
        for i in range(self.length(fb.SignatureDefsLength(), "signature list")):
            s = fb.SignatureDefs(i)
            sg = int(s.SubgraphIndex())
            if not 0 <= sg < len(subgraphs):
                raise self.fail(f"signature {i} refers to missing subgraph {sg}")
            n_t = len(subgraphs[sg].tensors)
            out.append(
                SignatureDef(
                    key=self.string(s, 8, f"signature {i} key"),
                    subgraph_index=sg,
                    inputs=self._signature_tensors(i, n_t, s.Inputs, s.InputsLength(), "input"),
                    outputs=self._signature_tensors(i, n_t, s.Outputs, s.OutputsLength(), "output"),
                )
            )
        return out

    def _signature_tensors(
        self, sig: int, n_tensors: int, get: Callable[[int], Any], n: int, what: str
    ) -> dict[str, int]:
        """Name -> tensor index of signature ``sig``'s inputs or outputs (``what``)."""
        m = {}
        for j in range(self.length(n, what)):
            e = get(j)
            t = int(e.TensorIndex())
            if not 0 <= t < n_tensors:
                raise self.fail(f"signature {sig} {what} refers to missing tensor {t}")
            m[self.string(e, 4, f"signature {sig} {what} name")] = t
        return m


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
    """Fold DENSIFY and DEQUANTIZE ops whose input is a constant into constant outputs."""
    for op in sg.ops:
        if op.name not in ("DEQUANTIZE", "DENSIFY") or len(op.inputs) != 1 or len(op.outputs) != 1:
            continue
        src, dst = (
            sg.tensors[op.inputs[0]] if op.inputs[0] >= 0 else None,
            sg.tensors[op.outputs[0]],
        )
        if src is None or src.data is None:
            continue
        data = src.data if op.name == "DENSIFY" else dequantize_array(src.data, src.quantization)
        if data.shape != dst.shape and data.size == dst.size:
            data = data.reshape(dst.shape)
        if data.shape != dst.shape:
            raise fail(
                f"{op.describe()}: constant input {src.name!r} of shape {src.shape} does not "
                f"match output {dst.name!r} of shape {dst.shape}"
            )
        dst.data = data.astype(dst.dtype, copy=False)
        op.folded = True
