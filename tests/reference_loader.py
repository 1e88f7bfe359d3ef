"""The loader's decoding as it was before litekiln read flatbuffers itself: through the
``tflite`` package's generated readers, options by introspecting their getters.

The independent reference of tests/test_flat.py: :class:`ReferenceLoader` decodes a file
with the old code (copied from litekiln/model/loader.py and schema.py as of 5d0b355) and
shares the rest of the load (checks, constant folding, densify) with the loader, so that the
two Model IRs must be identical.
"""

from __future__ import annotations

import functools
import inspect
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from litekiln.model.densify import densify
from litekiln.model.ir import Model, Op, Quantization, SignatureDef, Subgraph, Tensor
from litekiln.model.loader import (
    _DTYPES,
    _INT4,
    _MAX_TENSOR_TYPE,
    _TENSOR_TYPE_OPTIONS,
    MAX_CONSTANT_ELEMENTS,
    SCHEMA_VERSION,
    _fold_constants,
    _Loader,
    _unpack_int4,
    check_graph,
)
from litekiln.model.schema import _OPTIONS_TABLE_OVERRIDES, ACTIVATIONS, snake_case
from litekiln.model.token import model_token


def reference_load(data: bytes, name: str = "model") -> Model:
    """The Model IR the old loader made of ``data`` (its own checks, no per-op checks)."""
    return ReferenceLoader(data, name).load(None)


class ReferenceLoader(_Loader):
    """The old decoding methods over the loader's shared checks."""

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
        for sub in subgraphs:
            sub.model_subgraphs = subgraphs
        check_graph(subgraphs[0], self.name)
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
            fingerprinted=token is None,
        )

    def _opcodes(self, fb: Any) -> list[tuple[int, str, int, str | None]]:
        out = []
        for i in range(self.length(fb.OperatorCodesLength(), "operator-code table")):
            oc = fb.OperatorCodes(i)
            # Codes >= 127 live only in the int32 field; older files only fill the int8 one.
            code = max(int(oc.BuiltinCode()), int(oc.DeprecatedBuiltinCode()))
            # An explicit 0 is kept: LiteRT looks version 0 up, finds no kernel and refuses.
            version = int(oc.Version())
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

    def _quantization(
        self, t: Any, index: int, name: str, shape: tuple[int, ...]
    ) -> Quantization | None:
        """The tensor's affine parameters, checked as LiteRT's ``ParseQuantization`` does."""
        q = t.Quantization()
        if q is None:
            return None
        n_scale = self.length(q.ScaleLength(), "quantization scales")
        if n_scale == 0:
            return None
        where = f"tensor {index} ({name!r})"
        if q.ZeroPointIsNone():
            raise self.invalid(
                "quantization-zero-points", f"{where} has quantization scales but no zero points"
            )
        scale = np.asarray(q.ScaleAsNumpy()[:n_scale], dtype=np.float32)
        n_zp = self.length(q.ZeroPointLength(), "quantization zero points", 8)
        if n_zp != n_scale:
            raise self.invalid(
                "quantization-zero-points",
                f"{where} has {n_scale} quantization scales but {n_zp} zero points",
            )
        zp = np.asarray(q.ZeroPointAsNumpy()[:n_zp], dtype=np.int64)
        axis = int(q.QuantizedDimension())
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
        quant = self._quantization(t, index, name, shape)
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
            int4=ttype == _INT4,
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
            raise self.invalid("sparsity", f"sparse tensor {index} ({name!r}): {exc}") from None

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
        inputs = check(self.ints(sg, "Inputs", f"inputs of subgraph {index}"), "graph input", False)
        outputs = check(
            self.ints(sg, "Outputs", f"outputs of subgraph {index}"), "graph output", False
        )
        sub = Subgraph(
            index,
            self.string(sg, 12, f"name of subgraph {index}"),
            tensors,
            ops,
            inputs,
            outputs,
            file_tensors=n_t,
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


@functools.lru_cache(maxsize=1)
def _builtin_table() -> dict[int, str]:
    import tflite

    return {
        v: k
        for k, v in vars(tflite.BuiltinOperator).items()
        if not k.startswith("_") and isinstance(v, int)
    }


def builtin_name(code: int) -> str | None:
    """Name of a builtin operator code (``3`` -> ``"CONV_2D"``), or None if unknown."""
    return _builtin_table().get(code)


@functools.lru_cache(maxsize=2)
def _options_classes(union: str) -> dict[int, type]:
    import tflite

    enum = getattr(tflite, union)
    out = {}
    for name, value in vars(enum).items():
        if name.startswith("_") or not isinstance(value, int) or value == 0:
            continue
        cls = getattr(tflite, name, None)
        if cls is not None:
            out[value] = cls
    return out


_SKIP_SUFFIXES = ("IsNone", "Length", "AsNumpy")
_SKIP = {"Init", "GetRootAs"}


@functools.cache
def _getters(cls: type) -> tuple[tuple[str, str, str], ...]:
    """(getter, key, kind) for each field of a generated options class."""
    out = []
    for attr, fn in vars(cls).items():
        if attr.startswith("_") or attr in _SKIP or attr.endswith(_SKIP_SUFFIXES):
            continue
        if not callable(fn) or isinstance(fn, (classmethod, staticmethod)):
            continue
        if attr.startswith("GetRootAs") or attr.endswith("BufferHasIdentifier"):
            continue
        params = list(inspect.signature(fn).parameters)
        if params == ["self"]:
            out.append((attr, snake_case(attr), "scalar"))
        elif params == ["self", "j"] and hasattr(cls, attr + "Length"):
            out.append((attr, snake_case(attr), "vector"))
    return tuple(out)


def _decode_table(cls: type, table: Any) -> dict[str, Any]:
    obj = cls()
    obj.Init(table.Bytes, table.Pos)
    out: dict[str, Any] = {}
    for getter, key, kind in _getters(cls):
        if kind == "scalar":
            value = getattr(obj, getter)()
            if isinstance(value, bytes):
                value = value.decode("utf-8", errors="replace")
            elif not isinstance(value, (int, float, bool, str)) and value is not None:
                continue  # nested tables are not used by any op we execute
            out[key] = value
        else:
            n = getattr(obj, getter + "Length")()
            if n > len(table.Bytes):
                raise ValueError(f"options vector {key} of {n} elements exceeds the file")
            out[key] = [getattr(obj, getter)(j) for j in range(n)]
    return out


@functools.cache
def options_table(op_name: str) -> tuple[str, int] | None:
    """(union, type code) of the options table a builtin op reads, None if it takes none.

    ``"MAX_POOL_2D"`` -> ``("BuiltinOptions", <Pool2DOptions>)``; the table is named after
    the op (``CONV_2D`` -> ``Conv2DOptions``) except for the overrides above.
    """
    want = _OPTIONS_TABLE_OVERRIDES.get(op_name, op_name.replace("_", "") + "Options").lower()
    for union in ("BuiltinOptions", "BuiltinOptions2"):
        for kind, cls in _options_classes(union).items():
            if cls.__name__.lower() == want:
                return union, kind
    return None


@functools.cache
def _zero_options(union: str, kind: int) -> tuple[tuple[str, Any], ...]:
    """Every field of an options table at zero (0, False, empty vector)."""
    cls = _options_classes(union)[kind]
    out: list[tuple[str, Any]] = []
    for getter, key, shape in _getters(cls):
        if shape == "vector":
            out.append((key, []))
            continue
        source = inspect.getsource(getattr(cls, getter))
        out.append((key, False if "Bool" in source else 0.0 if "Float" in source else 0))
    return tuple(out)


def decode_options(op: Any, op_name: str) -> dict[str, Any]:
    """The builtin options of flatbuffer Operator ``op`` (a ``op_name`` op) as LiteRT reads
    them, as a plain dict (empty for an op that takes no options).

    LiteRT reads only the table its op expects (``builtin_options_as_Conv2DOptions()``):
    another table, or none, leaves its params zero-initialised, so the dict then holds every
    field of the expected table at zero (a CONV_2D without options has stride 0, which its
    kernel refuses; a SOFTMAX without options has beta 0). A fused activation outside the
    ActivationFunctionType enum reads as NONE (``ConvertActivation``).
    """
    expected = options_table(op_name)
    if expected is None:
        return {}
    union, kind = expected
    type_getter, table_getter = (
        ("BuiltinOptionsType", "BuiltinOptions")
        if union == "BuiltinOptions"
        else ("BuiltinOptions2Type", "BuiltinOptions2")
    )
    table = getattr(op, table_getter)() if int(getattr(op, type_getter)()) == kind else None
    if table is None:
        return dict(_zero_options(union, kind))
    out = _decode_table(_options_classes(union)[kind], table)
    if out.get("fused_activation_function", 0) not in ACTIVATIONS:
        out["fused_activation_function"] = 0
    return out
