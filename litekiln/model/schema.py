"""Tables derived from the TFLite schema: operator names and options as plain Python values.

The ``tflite`` package holds one generated reader class per options table. Rather than a
hand-written decoder per op (that would drift from the schema), options are read by
introspecting the generated getters once per class; the result is a dict with snake_case
keys, vectors as lists of ints/floats, enums as their integer values.
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import Any

# ActivationFunctionType and Padding enums of schema.fbs, named for messages and the ops.
ACTIVATIONS = {0: "NONE", 1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6", 4: "TANH", 5: "SIGN_BIT"}
PADDINGS = {0: "SAME", 1: "VALID"}

_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def snake_case(name: str) -> str:
    """``FusedActivationFunction`` -> ``fused_activation_function``."""
    return _CAMEL.sub("_", name).lower()


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


def builtin_code(name: str) -> int:
    """Code of a builtin operator name (``"CONV_2D"`` -> ``3``)."""
    for code, n in _builtin_table().items():
        if n == name:
            return code
    raise KeyError(name)


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


def decode_options(op: Any) -> dict[str, Any]:
    """Builtin options of a flatbuffer Operator as a plain dict (empty if none)."""
    out: dict[str, Any] = {}
    for union, type_getter, table_getter in (
        ("BuiltinOptions", "BuiltinOptionsType", "BuiltinOptions"),
        ("BuiltinOptions2", "BuiltinOptions2Type", "BuiltinOptions2"),
    ):
        kind = int(getattr(op, type_getter)())
        if kind == 0:
            continue
        cls = _options_classes(union).get(kind)
        table = getattr(op, table_getter)()
        if cls is None or table is None:
            continue
        out.update(_decode_table(cls, table))
    return out
