"""Tables derived from the TFLite schema: operator names and options as plain Python values.

The schema's tables, fields, unions and operator names come from
:mod:`litekiln.model.schema_tables`, generated from the ``tflite`` package's reader classes
by ``scripts/gen_schema_tables.py`` (the runtime never imports ``tflite``). Rather than a
hand-written decoder per op (that would drift from the schema), options are read field by
field from those tables; the result is a dict with snake_case keys, vectors as lists of
ints/floats, enums as their integer values.
"""

from __future__ import annotations

import functools
import re
from typing import Any, NamedTuple

from litekiln.model.flat import Table
from litekiln.model.schema_tables import BUILTIN_OPERATORS, TABLES, UNIONS

# ActivationFunctionType and Padding enums of schema.fbs, named for messages and the ops.
ACTIVATIONS = {0: "NONE", 1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6", 4: "TANH", 5: "SIGN_BIT"}
PADDINGS = {0: "SAME", 1: "VALID"}

#: The Operator's two options unions, searched in this order.
_OPTIONS_UNIONS = ("BuiltinOptions", "BuiltinOptions2")

_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def snake_case(name: str) -> str:
    """``FusedActivationFunction`` -> ``fused_activation_function``."""
    return _CAMEL.sub("_", name).lower()


class Field(NamedTuple):
    """One field of a schema table (a row of ``schema_tables.TABLES``)."""

    getter: str  # the generated reader's getter (``FusedActivationFunction``)
    key: str  # snake_case (``fused_activation_function``): the options dicts' key
    offset: int  # vtable offset
    kind: str  # scalar, union_type, string, table, union, vector, vector_table, vector_string
    format: str  # struct format character, or the table's / union's name
    default: Any  # an absent scalar's value


@functools.cache
def table_fields(table: str) -> dict[str, Field]:
    """Fields of a schema table by snake_case key (``table_fields("Tensor")["name"]``)."""
    return {row[1]: Field(*row) for row in TABLES[table]}


def builtin_name(code: int) -> str | None:
    """Name of a builtin operator code (``3`` -> ``"CONV_2D"``), or None if unknown."""
    return BUILTIN_OPERATORS.get(code)


def builtin_code(name: str) -> int:
    """Code of a builtin operator name (``"CONV_2D"`` -> ``3``)."""
    for code, n in BUILTIN_OPERATORS.items():
        if n == name:
            return code
    raise KeyError(name)


def _decode_table(fields: tuple[tuple[str, str, int, str, str, Any], ...], table: Table) -> dict:
    out: dict[str, Any] = {}
    nbytes = len(table.buf)
    for _, key, offset, kind, fmt, default in fields:
        if kind in ("scalar", "union_type"):
            out[key] = table.scalar(offset, fmt, default)
        elif kind == "string":
            raw = table.string(offset)
            out[key] = None if raw is None else raw.decode("utf-8", errors="replace")
        elif kind == "vector":
            start, n = table.vector(offset)
            if n > nbytes:
                raise ValueError(f"options vector {key} of {n} elements exceeds the file")
            out[key] = list(table.values(offset, fmt))
        elif not table.has(offset):
            out[key] = None  # an absent nested table (no options table has one)
    return out


#: Ops whose options table is not named after the op (schema.fbs ``builtin_options``).
_OPTIONS_TABLE_OVERRIDES = {
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


@functools.cache
def options_table(op_name: str) -> tuple[str, int] | None:
    """(union, type code) of the options table a builtin op reads, None if it takes none.

    ``"MAX_POOL_2D"`` -> ``("BuiltinOptions", <Pool2DOptions>)``; the table is named after
    the op (``CONV_2D`` -> ``Conv2DOptions``) except for the overrides above.
    """
    want = _OPTIONS_TABLE_OVERRIDES.get(op_name, op_name.replace("_", "") + "Options").lower()
    for union in _OPTIONS_UNIONS:
        for kind, table in UNIONS[union].items():
            if table.lower() == want:
                return union, kind
    return None


@functools.cache
def _zero_options(union: str, kind: int) -> tuple[tuple[str, Any], ...]:
    """Every field of an options table at zero (0, False, empty vector)."""
    out: list[tuple[str, Any]] = []
    for _, key, _, shape, fmt, _ in TABLES[UNIONS[union][kind]]:
        if shape.startswith("vector"):
            out.append((key, []))
            continue
        out.append((key, False if fmt == "?" else 0.0 if fmt in ("f", "d") else 0))
    return tuple(out)


@functools.cache
def _union_offsets(union: str) -> tuple[int, int]:
    """Vtable offsets of an Operator's union type field and union field (``BuiltinOptions``)."""
    fields = TABLES["Operator"]
    (getter, offset) = next((f[0], f[2]) for f in fields if f[3] == "union" and f[4] == union)
    return next(f[2] for f in fields if f[0] == getter + "Type"), offset


def decode_options(op: Table, op_name: str) -> dict[str, Any]:
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
    type_offset, table_offset = _union_offsets(union)
    table = op.table(table_offset) if op.scalar(type_offset, "B", 0) == kind else None
    if table is None:
        return dict(_zero_options(union, kind))
    out = _decode_table(TABLES[UNIONS[union][kind]], table)
    if out.get("fused_activation_function", 0) not in ACTIVATIONS:
        out["fused_activation_function"] = 0
    return out


def union_tables(union: str) -> dict[int, str]:
    """Type code -> table name of a schema union (``"SparseIndexVector"``)."""
    return UNIONS[union]
