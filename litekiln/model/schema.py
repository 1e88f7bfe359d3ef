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
