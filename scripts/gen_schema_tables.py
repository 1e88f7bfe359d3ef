#!/usr/bin/env python3
"""Regenerate litekiln/model/schema_tables.py from the installed ``tflite`` package.

The runtime reads ``.tflite`` files with its own flatbuffer reader (litekiln/model/flat.py)
and never imports ``tflite`` (200 generated modules, ~80-150 ms to import) or
``flatbuffers``. What it needs of the schema is written here as plain Python values, derived
from the generated reader classes' getter source: for every table reachable from ``Model``
(builtin options tables through the unions included), each field's getter, snake_case key,
vtable offset, kind, element format and default; the BuiltinOperator names; the union type
codes. `--check` fails when the committed file differs from what the installed package
generates (scripts/check.sh runs it).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "litekiln" / "model" / "schema_tables.py"

#: flatbuffers.number_types.<X>Flags -> struct format character (little-endian file).
_FORMATS = {
    "Bool": "?",
    "Int8": "b",
    "Uint8": "B",
    "Int16": "h",
    "Uint16": "H",
    "Int32": "i",
    "Uint32": "I",
    "Int64": "q",
    "Uint64": "Q",
    "Float32": "f",
    "Float64": "d",
}

#: Union fields whose union is not named after the field (the generated getter names no
#: union: it returns a bare Table). Checked: every other union field is named after its union.
_UNION_OF_FIELD = {
    ("QuantizationParameters", "Details"): "QuantizationDetails",
    ("DimensionMetadata", "ArraySegments"): "SparseIndexVector",
    ("DimensionMetadata", "ArrayIndices"): "SparseIndexVector",
}

#: Getters the ``tflite`` package rewrote by hand, whose source holds no default: the raw
#: field's default of schema.fbs. (``OperatorCode.BuiltinCode`` returns the deprecated int8
#: code for any code below 127; litekiln reads the raw field, as LiteRT does.)
_PATCHED_GETTERS = {("OperatorCode", "BuiltinCode"): 0}

_SLOT = re.compile(r"self\._tab\.Offset\((\d+)\)")
_FLAGS = re.compile(r"flatbuffers\.number_types\.(\w+)Flags, (a|o) \+")
_IMPORT = re.compile(r"from tflite\.(\w+) import (\w+)")
_RETURN = re.compile(r"^\s*return (.+)$", re.M)


def _classes() -> dict[str, type]:
    import tflite

    return {
        name: obj
        for name, obj in vars(tflite).items()
        if inspect.isclass(obj) and getattr(obj, "__module__", "").startswith("tflite.")
    }


def _is_table(cls: type) -> bool:
    return "_tab" in getattr(cls, "__slots__", ())


def _unions(classes: dict[str, type]) -> dict[str, dict[int, str]]:
    """Enum classes whose members (but NONE) are all tables: union name -> code -> table."""
    out = {}
    for name, cls in classes.items():
        if _is_table(cls):
            continue
        members = {k: v for k, v in vars(cls).items() if not k.startswith("_")}
        if "NONE" not in members or len(members) < 2:
            continue
        if all(k == "NONE" or _is_table(classes.get(k, object)) for k in members):
            out[name] = {int(v): k for k, v in members.items() if k != "NONE"}
    return out


def _field(table: str, cls: type, getter: str, unions: dict[str, dict[int, str]]) -> tuple:
    """(getter, key, vtable offset, kind, format, default) of one generated getter."""
    from litekiln.model.schema import snake_case  # the options dicts' key spelling

    fn = vars(cls)[getter]
    src = inspect.getsource(fn)
    params = list(inspect.signature(fn).parameters)
    slot = int(_SLOT.search(src).group(1))  # type: ignore[union-attr]
    if (table, getter) in _PATCHED_GETTERS:
        default = _PATCHED_GETTERS[table, getter]
    else:
        default = ast.literal_eval(_RETURN.findall(src)[-1].strip())
    flags = _FLAGS.search(src)
    imported = _IMPORT.search(src) if "obj.Init(" in src else None
    key = snake_case(getter)
    if params == ["self", "j"]:
        if "self._tab.String(" in src:
            return (getter, key, slot, "vector_string", "", None)
        if imported:
            return (getter, key, slot, "vector_table", imported.group(2), None)
        assert flags and flags.group(2) == "a", (table, getter)
        return (getter, key, slot, "vector", _FORMATS[flags.group(1)], None)
    assert params == ["self"], (table, getter, params)
    if "self._tab.Union(" in src:
        union = _UNION_OF_FIELD.get((table, getter), getter)
        assert union in unions, f"{table}.{getter}: which union? add it to _UNION_OF_FIELD"
        return (getter, key, slot, "union", union, None)
    if "self._tab.String(" in src:
        return (getter, key, slot, "string", "", None)
    if imported:
        assert "self._tab.Indirect(" in src, (table, getter)  # (no struct fields in the schema)
        return (getter, key, slot, "table", imported.group(2), None)
    assert flags and flags.group(2) == "o", (table, getter)
    fmt = _FORMATS[flags.group(1)]
    kind = "scalar"
    if getter.endswith("Type") and "self._tab.Union(" in inspect.getsource(
        vars(cls).get(getter[:-4], lambda: None)
    ):
        kind = "union_type"
    return (getter, key, slot, kind, fmt, default)


def _fields(table: str, cls: type, unions: dict[str, dict[int, str]]) -> tuple[tuple, ...]:
    out = []
    for attr, fn in vars(cls).items():
        if attr.startswith("_") or not inspect.isfunction(fn) or attr == "Init":
            continue
        base = re.sub(r"(IsNone|Length|AsNumpy)$", "", attr)
        if base != attr and base in vars(cls):
            continue  # a vector's helper, not a field
        out.append(_field(table, cls, attr, unions))
    return tuple(out)


def tables() -> tuple[dict[str, tuple[tuple, ...]], dict[str, dict[int, str]]]:
    """Every table reachable from Model (through tables, vectors and unions), and the unions."""
    classes = _classes()
    unions = _unions(classes)
    out: dict[str, tuple[tuple, ...]] = {}
    todo = ["Model"]
    while todo:
        name = todo.pop()
        if name in out:
            continue
        fields = _fields(name, classes[name], unions)
        out[name] = fields
        for _, _, _, kind, fmt, _ in fields:
            if kind in ("table", "vector_table"):
                todo.append(fmt)
            elif kind == "union":
                todo.extend(unions[fmt].values())
    return dict(sorted(out.items())), unions


def builtin_operators() -> dict[int, str]:
    import tflite

    return {
        v: k
        for k, v in vars(tflite.BuiltinOperator).items()
        if not k.startswith("_") and isinstance(v, int)
    }


def render() -> str:
    import tflite

    tabs, unions = tables()
    used_unions = {f[4] for fields in tabs.values() for f in fields if f[3] == "union"}
    lines = [
        '"""The TFLite schema as plain values, for litekiln\'s own flatbuffer reader.',
        "",
        "Generated by `scripts/gen_schema_tables.py` from the `tflite` package "
        f"{tflite.__version__}'s",
        "reader classes; do not edit (`scripts/gen_schema_tables.py --check` fails when stale).",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from typing import Any",
        "",
        f"TFLITE_PACKAGE_VERSION = {_lit(tflite.__version__)}",
        "",
        "#: Table name -> its fields in schema order, each (getter, key, vtable offset, kind,",
        "#: format, default). kind: scalar, union_type (a scalar: the type code of union field",
        "#: ``getter[:-4]``), string, table, union, vector, vector_table, vector_string. format: a",
        "#: struct format character (scalar, union_type, vector), the table's name (table,",
        "#: vector_table) or the union's (union). default: what the generated getter returns for",
        "#: an absent field (None for vectors, strings, tables and unions).",
        "TABLES: dict[str, tuple[tuple[str, str, int, str, str, Any], ...]] = {",
    ]
    for name, fields in tabs.items():
        if not fields:
            lines.append(f"    {_lit(name)}: (),")
            continue
        lines.append(f"    {_lit(name)}: (")
        lines.extend(f"        ({', '.join(_lit(v) for v in f)})," for f in fields)
        lines.append("    ),")
    lines.append("}")
    lines.append("")
    lines.append("#: Union name -> type code -> table name (code 0, NONE, is no table).")
    lines.append("UNIONS: dict[str, dict[int, str]] = {")
    for name, members in sorted(unions.items()):
        if name in used_unions:
            lines.append(f"    {_lit(name)}: {{")
            lines.extend(f"        {code}: {_lit(table)}," for code, table in members.items())
            lines.append("    },")
    lines.append("}")
    lines.append("")
    lines.append("#: BuiltinOperator code -> name.")
    lines.append("BUILTIN_OPERATORS: dict[int, str] = {")
    lines.extend(f"    {code}: {_lit(name)}," for code, name in builtin_operators().items())
    lines.append("}")
    return _ruff_format("\n".join(lines) + "\n")


def _ruff_format(text: str) -> str:
    """The text as ``ruff format`` leaves it (scripts/check.sh requires it so)."""
    ruff = Path(sys.executable).with_name("ruff")
    done = subprocess.run(
        [str(ruff) if ruff.exists() else "ruff", "format", "--stdin-filename", str(OUT), "-"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    return done.stdout


def _lit(value: object) -> str:
    """A literal as ruff format writes it (double-quoted strings)."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--check", action="store_true", help="fail if the committed file is stale")
    a = p.parse_args()
    sys.path.insert(0, str(REPO))
    importlib.import_module("tflite")
    text = render()
    if a.check:
        if not OUT.exists() or OUT.read_text() != text:
            stale = OUT.relative_to(REPO)
            print(f"stale {stale}; run scripts/gen_schema_tables.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
