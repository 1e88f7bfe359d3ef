"""litekiln's own flatbuffer reader (litekiln/model/flat.py) and generated schema tables.

The loader reads ``.tflite`` files without the ``tflite`` package; the old decoding through
that package's generated readers lives on in tests/reference_loader.py as the independent
reference: both must make the identical Model IR of every model we have, and decode every
builtin options table alike.
"""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from reference_loader import decode_options as reference_options
from reference_loader import reference_load
from tflite_builder import ModelBuilder, option_fields, options_class

from litekiln import ModelError
from litekiln.model import Model, load_model
from litekiln.model.flat import FlatbufferError, Table, root
from litekiln.model.schema import BUILTIN_OPERATORS, decode_options, options_table

REPO = Path(__file__).resolve().parents[1]
MODELS = sorted(
    [
        *(REPO / "models" / "zoo").glob("*.tflite"),
        *(REPO / "models" / "corpus").glob("*.tflite"),
        *(REPO / "tests" / "data").glob("*.tflite"),
    ]
)


def assert_same_ir(new: Model, old: Model) -> None:
    """Every field of the two IRs alike: tensors, ops, signatures, metadata."""
    assert (new.version, new.description, new.token) == (old.version, old.description, old.token)
    assert new.metadata_names == old.metadata_names
    assert new.signatures == old.signatures
    assert len(new.subgraphs) == len(old.subgraphs)
    for sn, so in zip(new.subgraphs, old.subgraphs, strict=True):
        assert (sn.index, sn.name, sn.inputs, sn.outputs) == (
            so.index,
            so.name,
            so.inputs,
            so.outputs,
        )
        assert sn.file_tensors == so.file_tensors
        assert len(sn.tensors) == len(so.tensors)
        for tn, to in zip(sn.tensors, so.tensors, strict=True):
            where = f"subgraph {sn.index} tensor {tn.index} ({tn.name!r})"
            assert (tn.index, tn.name, tn.shape, tn.shape_signature) == (
                to.index,
                to.name,
                to.shape,
                to.shape_signature,
            ), where
            assert (tn.dtype, tn.is_variable, tn.int4, tn.was_sparse) == (
                to.dtype,
                to.is_variable,
                to.int4,
                to.was_sparse,
            ), where
            qn, qo = tn.quantization, to.quantization
            assert (qn is None) == (qo is None), where
            if qn is not None and qo is not None:
                assert qn.axis == qo.axis, where
                assert qn.scale.dtype == qo.scale.dtype, where
                assert qn.zero_point.dtype == qo.zero_point.dtype, where
                assert qn.scale.tobytes() == qo.scale.tobytes(), where
                assert qn.zero_point.tobytes() == qo.zero_point.tobytes(), where
            assert (tn.data is None) == (to.data is None), where
            if tn.data is not None and to.data is not None:
                assert tn.data.dtype == to.data.dtype, where
                assert tn.data.shape == to.data.shape, where
                if tn.data.dtype.kind != "O":
                    assert tn.data.tobytes() == to.data.tobytes(), where
        assert len(sn.ops) == len(so.ops)
        for on, oo in zip(sn.ops, so.ops, strict=True):
            where = f"subgraph {sn.index} {on.describe()}"
            assert (on.index, on.name, on.code, on.version) == (
                oo.index,
                oo.name,
                oo.code,
                oo.version,
            ), where
            assert (on.inputs, on.outputs, on.folded) == (oo.inputs, oo.outputs, oo.folded), where
            assert (on.custom_code, on.custom_options) == (oo.custom_code, oo.custom_options), where
            assert on.options == oo.options, where
            assert [type(v) for v in on.options.values()] == [
                type(v) for v in oo.options.values()
            ], where
            assert list(on.options) == list(oo.options), where


@pytest.mark.parametrize("path", MODELS, ids=[p.name for p in MODELS])
def test_same_ir_as_tflite_package(path: Path) -> None:
    """The loader's IR of every model we have is the one the tflite package's readers gave."""
    data = path.read_bytes()
    assert_same_ir(
        load_model(data, name=path.stem, validate=False), reference_load(data, path.stem)
    )


def _options_cases() -> list[str]:
    return [
        name
        for name in BUILTIN_OPERATORS.values()
        if options_table(name) is not None and _has_options_class(name)
    ]


def _has_options_class(name: str) -> bool:
    try:
        options_class(name)
    except ValueError:
        return False
    return True


def _op_table(data: bytes) -> Table:
    """The first op of subgraph 0, read with the flat reader."""
    model = root(data)
    sub = model.tables(8)[0]  # Model.subgraphs
    return sub.tables(10)[0]  # SubGraph.operators


_SAMPLES = {"Bool": True, "Float32": 0.75, "Float64": -0.125}


@pytest.mark.parametrize("op_name", _options_cases())
@pytest.mark.parametrize("fill", ["set", "default"])
def test_options_decode_as_introspection(op_name: str, fill: str) -> None:
    """Each options table, its fields set or left out, decodes as the introspection did."""
    import tflite

    options: dict[str, object] = {}
    if fill == "set":
        for key, (kind, elem) in option_fields(op_name).items():
            if kind == "scalar":
                options[key] = _SAMPLES.get(elem, 3)
            elif kind == "vector":
                options[key] = [True, False] if elem == "Bool" else [4, 1, 5]
            elif kind == "string":
                options[key] = "name.ü"
    b = ModelBuilder()
    x = b.input("x", [2])
    b.output(b.op(op_name, [x], out_shape=[2], options=options))
    data = b.build()
    new = decode_options(_op_table(data), op_name)
    fb = tflite.Model.GetRootAs(data, 0)
    old = reference_options(fb.Subgraphs(0).Operators(0), op_name)
    assert new == old
    assert [type(v) for v in new.values()] == [type(v) for v in old.values()]


@pytest.mark.parametrize("op_name", ["CONV_2D", "SOFTMAX", "STABLEHLO_COMPOSITE", "RESHAPE"])
def test_options_absent_decode_as_zero(op_name: str) -> None:
    """An op without its options table: every field at zero, as the introspection gave."""
    import tflite

    b = ModelBuilder()
    x = b.input("x", [2])
    b.output(b.op(op_name, [x], out_shape=[2], options=None))
    data = b.build()
    # (The builder writes an options table for ops that take one; drop the union's type.)
    op = _op_table(data)
    for type_offset in (10, 26):  # Operator.builtin_options_type, builtin_options2_type
        p = op.field(type_offset)
        if p:
            data = data[:p] + b"\x00" + data[p + 1 :]
    new = decode_options(_op_table(data), op_name)
    old = reference_options(tflite.Model.GetRootAs(data, 0).Subgraphs(0).Operators(0), op_name)
    assert new == old
    assert [type(v) for v in new.values()] == [type(v) for v in old.values()]


def test_reader_refuses_positions_outside_the_file() -> None:
    # A table whose vtable offset points before the file start (a negative position).
    data = struct.pack("<Ii", 4, 1000)
    with pytest.raises(FlatbufferError, match="vtable"):
        root(data)
    with pytest.raises(FlatbufferError, match="outside"):
        root(struct.pack("<I", 4000))
    with pytest.raises(FlatbufferError):
        root(b"\x01")
    # A vector whose count runs past the end.
    b = ModelBuilder()
    b.output(b.op("RELU", [b.input("x", [2])], out_shape=[2]))
    good = b.build()
    op = _op_table(good)
    start, n = op.vector(6)  # Operator.inputs
    assert n == 1 and op.values(6, "i") == (0,)
    bad = bytearray(good)
    struct.pack_into("<I", bad, start - 4, 1 << 30)
    with pytest.raises(FlatbufferError, match="runs past the end"):
        Table(bytes(bad), op.pos).values(6, "i")
    assert op.array(6, "<i4").tolist() == [0]
    assert isinstance(op.array(99, "<i4"), np.ndarray) and op.values(99, "i") == ()


def test_loader_error_for_negative_vtable() -> None:
    """A root table whose vtable lies before the file: a ModelError, not a wrap-around."""
    b = ModelBuilder()
    b.output(b.op("RELU", [b.input("x", [2])], out_shape=[2]))
    data = bytearray(b.build())
    pos = struct.unpack_from("<I", data, 0)[0]
    struct.pack_into("<i", data, pos, pos + 64)
    with pytest.raises(ModelError, match="corrupt or truncated flatbuffer"):
        load_model(bytes(data))


def test_runtime_imports_no_tflite_or_flatbuffers(tmp_path: Path) -> None:
    """Importing the Interpreter and loading models imports neither tflite nor flatbuffers."""
    b = ModelBuilder()
    b.output(b.op("RELU", [b.input("x", [2])], out_shape=[2]))
    built = tmp_path / "relu.tflite"
    built.write_bytes(b.build())
    paths = [built, *MODELS[:1], *(p for p in MODELS if p.stem == "tv_mobilenet_v3_small")]
    code = (
        "import sys\n"
        "sys.modules['tflite'] = None  # any import of it fails\n"
        "sys.modules['flatbuffers'] = None\n"
        "from litekiln.interpreter import Interpreter\n"
        "from litekiln.model import load_model\n"
        f"for path in {[str(p) for p in paths]!r}:\n"
        "    load_model(path)\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_schema_tables_up_to_date() -> None:
    """litekiln/model/schema_tables.py is what scripts/gen_schema_tables.py makes now."""
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_schema_tables.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_builtin_code_is_the_larger_of_both_fields() -> None:
    """LiteRT's GetBuiltinCode: max(builtin_code, deprecated_builtin_code), whatever the code.

    (The tflite package's BuiltinCode() returns the int8 field for any code below 127, so a
    file that fills only the int32 field read as ADD through it.)
    """
    b = ModelBuilder()
    b.output(b.op("RELU", [b.input("x", [2])], out_shape=[2]))
    data = bytearray(b.build())
    oc = root(bytes(data)).tables(6)[0]  # Model.operator_codes
    assert oc.scalar(10, "i", 0) == 19  # OperatorCode.builtin_code: RELU
    p = oc.field(4)  # OperatorCode.deprecated_builtin_code
    assert p, "the builder writes the int8 code"
    data[p] = 0
    assert load_model(bytes(data)).main.ops[0].name == "RELU"
