"""Exact float32 literals in TVM's OpenCL C.

TVM 0.27's OpenCL code generator prints a float32 constant as C++'s ``std::scientific`` does:
seven significant digits (``1.157483e-02f``). A float32 needs up to nine to come back as
itself: 0.011574829 (a quantization scale of smoke_int8) prints as ``1.157483e-02f``, which the
OpenCL compiler reads as 0.011574830, one unit in the last place away. Every constant the
compiler folds into a kernel (a folded dequantization's scale, a quantization simulator's
scale and zero point, hard-swish's 1/6) was so rounded on OpenCL, while TVM's CUDA printer
(the PTX) writes the exact hexadecimal float: the two programs of one model could differ.

`exact_float_literals` puts each such literal back: the kernel's PrimFunc, printed as
TVMScript, holds every float32 constant at full precision; of a kernel's constants, those
whose seven-digit print reads back as another float32 are found by that print in the kernel's
OpenCL C and written with the shortest digits that read back exactly
(``1.1574829e-02f``). A seven-digit print that two of the kernel's constants share cannot be
told apart by its text and is left as it is (counted in the result; none seen in the zoo or
the corpus).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np

from litekiln.artifact.program import FUNCTION_MARKER

if TYPE_CHECKING:
    import tvm

#: A float32 constant in TVMScript: ``T.float32(0.011574828997254372)``.
_SCRIPT_FLOAT32 = re.compile(r"T\.float32\((-?[0-9][0-9.e+-]*)\)")
#: A float32 literal as TVM's OpenCL printer writes it (its sign, if any, precedes it).
_PRINTED = re.compile(r"(?<![\w.])([0-9]\.[0-9]{6}e[+-][0-9]{2,3})f")


def printed(value: float) -> str:
    """``value`` as TVM's OpenCL C printer writes a float32 constant, sign and suffix aside."""
    return f"{abs(value):e}"


def exact(value: float) -> str:
    """The shortest decimal that an OpenCL compiler reads back as float32 ``value``
    (its magnitude)."""
    return np.format_float_scientific(np.float32(abs(value)), unique=True, exp_digits=2)


def inexact_constants(script: str) -> dict[str, str | None]:
    """Of the float32 constants in a PrimFunc's TVMScript, those whose seven-digit print
    reads back as another float32: print -> exact digits, or None where two of them print
    alike."""
    found: dict[str, set[np.float32]] = {}
    for text in _SCRIPT_FLOAT32.findall(script):
        value = float(text)
        if not np.isfinite(value):
            continue
        found.setdefault(printed(value), set()).add(np.float32(abs(value)))
    out: dict[str, str | None] = {}
    for text, values in found.items():
        if any(np.float32(text) != v for v in values):
            out[text] = exact(float(next(iter(values)))) if len(values) == 1 else None
    return out


def exact_float_literals(source: str, device_mod: tvm.IRModule) -> tuple[str, int]:
    """``source`` (TVM's OpenCL C of ``device_mod``, one ``// Function:`` section per
    kernel) with each kernel's inexact float32 literals written exactly, and how many
    literals could not be (their print shared by two of the kernel's constants)."""
    scripts = {gv.name_hint: f.script() for gv, f in device_mod.functions.items()}
    pieces = source.split(FUNCTION_MARKER)
    unresolved = 0
    for i in range(1, len(pieces)):
        name = pieces[i].split(None, 1)[0] if pieces[i].strip() else ""
        script = scripts.get(name)
        if script is None:
            continue
        fixes = inexact_constants(script)
        if not fixes:
            continue
        unresolved += sum(v is None for v in fixes.values())

        def fix(m: re.Match[str], fixes: dict[str, str | None] = fixes) -> str:
            digits = fixes.get(m.group(1))
            return m.group(0) if digits is None else digits + "f"

        pieces[i] = _PRINTED.sub(fix, pieces[i])
    return FUNCTION_MARKER.join(pieces), unresolved
