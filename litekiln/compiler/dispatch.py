"""Dispatcher kernels: a few kernels that each run one of several, for CPU OpenCL (issue 16).

PoCL compiles each kernel at its first launch, for its work-group size, and that is most of a
first start after a plain `litekiln compile` (no device binaries stored). Part of the cost is
per kernel, whatever the kernel holds, and grows with the program: measured on this project's
2-core build machine (PoCL 3.1, its kernel cache off),

- a 30-kernel program of one-line kernels: 55 ms per kernel at first launch; the same 30
  bodies as the cases of one kernel's ``switch``: 133 ms in all;
- hand_landmark_lite (47 kernels, 70 launches): a 318-character padding copy takes 143 ms at
  its first launch. Grouped as below (4 dispatchers and the 2 kernels with local memory),
  its first inference after a plain compile took 5.6-6.6 s against 7.1-8.2 s, for the same
  outputs to the bit; but the build from source is 0.4-1.1 s longer (clang inlines the
  cases into the dispatchers) and a warm inference 12-27% slower (PoCL does not vectorise a
  work-item loop around a ``switch``): docs/benchmarks.md, "First start on PoCL after a
  plain compile, kernels through dispatchers".

`dispatch_kernels` turns each kernel that can be called from another (no ``__local`` memory,
no barrier, only ``__global`` pointer parameters) into a plain (non-kernel) function, and adds, per
work-group size, dispatcher kernels (``__kernel void d0(int id, __global uchar* p0, ...)``)
whose ``switch (id)`` calls one of up to `GROUP` of them with its pointers cast back. Each
launch of such a kernel becomes a launch of its dispatcher with the case's index as its first
argument, then the kernel's own arguments (the dispatcher's unused pointer parameters are
given the launch's first buffer). Kernels that are alone in their group stay as they are.

The compiler applies it to the ``fast-cpu`` schedules (CPU OpenCL) only: a GPU driver
compiles every kernel when it builds the program, and a kernel's own code there is what its
schedule made it. Pure text in, text out; deterministic.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence

from litekiln.artifact.program import (
    FUNCTION_MARKER,
    BufferArg,
    KernelArg,
    Launch,
    ScalarArg,
    Variant,
)

#: Most kernels one dispatcher runs. The first launch of a dispatcher compiles every case:
#: groups of 6 and 10 of hand_landmark_lite's 39 kernels of 64 work-items measured like one
#: group of all 39 (4.1-5.4 s for the program's first inference through pyopencl, run-to-run
#: noise), 16 was slower (5.2-5.9 s); 64 bounds one dispatcher's text in larger models.
GROUP = 64

#: Most bytes of private arrays a dispatcher's work-group may hold, its cases' together: half
#: the stack. PoCL keeps a work-group's private arrays on its worker thread's stack (8 MB),
#: and a `switch`'s cases hardly share theirs: the dispatcher that held MaxViT-T's 25088-float
#: array (codegen `_lower_tir`) had a 12.9 MB frame, that array's 12.85 MB for 128 work-items
#: and 65 KB for its 29 other cases. A kernel over it alone stays a kernel of its own.
STACK_BUDGET = 4 << 20

#: Bytes of OpenCL C's scalar types other than 4.
SCALAR_BYTES = {"char": 1, "uchar": 1, "half": 2, "short": 2, "ushort": 2, "double": 8, "long": 8}
_ARRAY = re.compile(r"(__local\s+)?(?:volatile\s+)?\b([a-z]+?)(\d*)\s+\w+\[(\d+)\]\s*;")


def private_bytes(text: str) -> int:
    """Bytes of the private (per work-item) arrays declared in ``text`` (OpenCL C)."""
    total = 0
    for local, scalar, lanes, n in _ARRAY.findall(text):
        if not local:
            total += SCALAR_BYTES.get(scalar, 4) * int(lanes or 1) * int(n)
    return total


_HEADER = re.compile(r"__kernel\s+void\s+(\w+)\s*\(([^()]*)\)\s*\{")
_PARAM = re.compile(r"^(.*?)\b(\w+)\s*$", re.S)
_IDENT = re.compile(r"[A-Za-z_]\w*")


@dataclasses.dataclass
class _Kernel:
    name: str
    types: list[str]  # each parameter's type, ``restrict`` dropped (for the casts)
    start: int  # the header's span in its chunk
    end: int
    private: int = 0  # bytes of private arrays per work-item


def _callable(chunk: str, name: str) -> _Kernel | None:
    """The kernel ``name`` defined in ``chunk`` (one kernel's text), if it can be called from
    a dispatcher: one kernel in the text, ``__global`` pointer parameters only, no local
    memory, no barrier."""
    if chunk.count("__kernel") != 1 or "__local" in chunk or "barrier" in chunk:
        return None
    m = _HEADER.search(chunk)
    if m is None or m.group(1) != name or not m.group(2).strip():
        return None
    types = []
    for param in m.group(2).split(","):
        p = _PARAM.match(param.strip())
        if p is None or "__global" not in p.group(1) or "*" not in p.group(1):
            return None
        types.append(" ".join(p.group(1).replace("restrict", " ").split()))
    return _Kernel(name, types, m.start(), m.end(), private_bytes(chunk))


def _batches(members: list[_Kernel], group: int, private: int) -> list[list[_Kernel]]:
    """``members`` cut in order into runs of at most ``group`` kernels whose private arrays
    per work-item add up to at most ``private`` bytes."""
    out: list[list[_Kernel]] = [[]]
    held = 0
    for k in members:
        if out[-1] and (len(out[-1]) == group or held + k.private > private):
            out.append([])
            held = 0
        out[-1].append(k)
        held += k.private
    return out


def dispatch_kernels(
    source: str, launches: Sequence[Launch], variants: Sequence[Variant], group: int = GROUP
) -> tuple[str, list[Launch], list[Variant]]:
    """``source`` with its callable kernels run through dispatcher kernels, and the launches
    (default and variants' options) rewritten to launch those (see the module docstring).

    The kernels must be headed by TVM's ``// Function: <name>`` line (what the compiler
    prints, minified or not); a source without it is returned as it is.
    """
    all_launches = [*launches, *(la for v in variants for o in v.options for la in o)]
    head, *chunks = ("\n" + source).split(FUNCTION_MARKER)
    if not chunks or group < 2:
        return source, list(launches), list(variants)
    texts: dict[str, str] = {}
    order: list[str] = []
    for chunk in chunks:
        name = chunk.split("\n", 1)[0].strip()
        texts[name] = chunk
        order.append(name)
    shapes: dict[str, set[tuple[tuple[int, ...], int]]] = {}
    for la in all_launches:
        shapes.setdefault(la.kernel, set()).add((la.local_size, len(la.global_size)))
    # Kernels by work-group size, in order of first launch.
    groups: dict[tuple[tuple[int, ...], int], list[_Kernel]] = {}
    seen: set[str] = set()
    for la in all_launches:
        if la.kernel in seen or la.kernel not in texts:
            continue
        seen.add(la.kernel)
        kernel = _callable(texts[la.kernel], la.kernel)
        if kernel is None or len(shapes[la.kernel]) != 1:
            continue
        shape = next(iter(shapes[la.kernel]))
        if kernel.private * math.prod(shape[0]) > STACK_BUDGET:
            continue
        groups.setdefault(shape, []).append(kernel)
    taken = set(_IDENT.findall(source))
    fresh = (f"d{i}" for i in range(len(taken) + len(all_launches) + 1) if f"d{i}" not in taken)
    cases: dict[str, tuple[str, int, int]] = {}  # kernel -> (dispatcher, case, pointers)
    dispatchers: list[tuple[str, list[_Kernel]]] = []
    callee: dict[str, _Kernel] = {}
    for (local, _), members in groups.items():
        for batch in _batches(members, group, STACK_BUDGET // math.prod(local)):
            if len(batch) < 2:
                continue
            name = next(fresh)
            width = max(len(k.types) for k in batch)
            dispatchers.append((name, batch))
            for case, k in enumerate(batch):
                cases[k.name] = (name, case, width)
                callee[k.name] = k
    if not cases:
        return source, list(launches), list(variants)
    parts = [head]
    for name in order:
        text = texts[name]
        if name in callee:
            k = callee[name]
            params = text[k.start : k.end].split("(", 1)[1]
            text = f"{text[: k.start]}static inline void {name}({params}{text[k.end :]}"
        parts.append(text)
    if not parts[-1].endswith("\n"):
        parts[-1] += "\n"
    for name, members in dispatchers:
        width = max(len(k.types) for k in members)
        params = ",".join(f"__global uchar*p{j}" for j in range(width))
        body = "".join(
            f"case {case}:{k.name}("
            + ",".join(f"({t})p{j}" for j, t in enumerate(k.types))
            + ");break;"
            for case, k in enumerate(members)
        )
        parts.append(f"{name}\n__kernel void {name}(int id,{params}){{switch(id){{{body}}}}}\n")
    out = FUNCTION_MARKER.join(parts)[1:]

    def relaunch(la: Launch) -> Launch:
        if la.kernel not in cases:
            return la
        name, case, width = cases[la.kernel]
        first = next(a for a in la.args if isinstance(a, BufferArg))
        args: list[KernelArg] = [ScalarArg(case, "int"), *la.args]
        args += [first] * (width + 1 - len(args))
        return dataclasses.replace(la, kernel=name, args=tuple(args))

    new_variants = [
        dataclasses.replace(v, options=tuple(tuple(relaunch(la) for la in o) for o in v.options))
        for v in variants
    ]
    return out, [relaunch(la) for la in launches], new_variants
