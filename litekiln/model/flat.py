"""A small, bounds-checked flatbuffer reader: what the loader needs of a ``.tflite`` file.

The ``tflite`` package's generated readers (and ``flatbuffers``' ``Table``) cost ~80-150 ms
to import and a Python call per field and per vector element; they verify nothing, and
``struct.unpack_from`` reads a negative offset from the end of the buffer. This reader takes
its field offsets from :mod:`litekiln.model.schema_tables` (generated from the ``tflite``
package), reads vectors in one ``struct``/``numpy`` call, and checks every position it
follows against the file: a table, its vtable, a vector or a string outside the file raises
:class:`FlatbufferError` (a ValueError), which the loader reports as a corrupt or truncated
flatbuffer.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

_I32 = struct.Struct("<i").unpack_from
_U32 = struct.Struct("<I").unpack_from
_U16 = struct.Struct("<H").unpack_from

#: struct format character -> bytes per element.
_SIZES = {c: struct.calcsize(c) for c in "?bBhHiIqQfd"}
_SCALARS = {c: struct.Struct("<" + c).unpack_from for c in _SIZES}
#: field count -> reader of a vtable's field offsets (filled as vtable sizes are met).
_VTABLES: dict[int, Any] = {}


class FlatbufferError(ValueError):
    """A position in the flatbuffer lies outside the file (corrupt or truncated)."""


class Table:
    """One flatbuffer table: its position and vtable, fields read by vtable offset.

    Field accessors take the field's vtable offset (``schema_tables.TABLES``' third column)
    and return the schema default (scalars) or None/empty (the rest) for an absent field.
    """

    __slots__ = ("buf", "pos", "slots")

    def __init__(self, buf: bytes, pos: int) -> None:
        size = len(buf)
        if pos < 0 or pos + 4 > size:
            raise FlatbufferError(f"table at {pos} lies outside the {size}-byte file")
        vt = pos - _I32(buf, pos)[0]
        if vt < 0 or vt + 4 > size:
            raise FlatbufferError(f"vtable of the table at {pos} lies outside the file ({vt})")
        n = (_U16(buf, vt)[0] - 4) >> 1  # the vtable: its size, the table's, field offsets
        self.buf = buf
        self.pos = pos
        #: Each field's offset from ``pos`` (0: absent), in vtable order.
        self.slots: tuple[int, ...] = ()
        if n > 0:
            if vt + 4 + 2 * n > size:
                raise FlatbufferError(f"vtable at {vt} ({n} fields) runs past the end")
            read = _VTABLES.get(n)
            if read is None:
                read = _VTABLES[n] = struct.Struct(f"<{n}H").unpack_from
            self.slots = read(buf, vt + 4)

    def field(self, offset: int) -> int:
        """Position of the field at vtable ``offset`` in the file; 0 if absent."""
        i = (offset >> 1) - 2
        slots = self.slots
        if i < len(slots):
            o = slots[i]
            if o:
                return self.pos + o
        return 0

    def has(self, offset: int) -> bool:
        return self.field(offset) != 0

    def scalar(self, offset: int, fmt: str, default: Any) -> Any:
        """A scalar field (``fmt``: a struct format character)."""
        p = self.field(offset)
        return _SCALARS[fmt](self.buf, p)[0] if p else default

    def _ref(self, p: int) -> int:
        """Follow the unsigned offset stored at ``p`` (>= p: never negative)."""
        return p + _U32(self.buf, p)[0]

    def table(self, offset: int) -> Table | None:
        """A sub-table field."""
        p = self.field(offset)
        return Table(self.buf, self._ref(p)) if p else None

    def union(self, type_offset: int, offset: int) -> tuple[int, Table | None]:
        """A union: (type code, its table), (0, None) if absent."""
        kind = self.scalar(type_offset, "B", 0)
        return kind, self.table(offset)

    def string_span(self, offset: int) -> tuple[int, int] | None:
        """(start, length) of a string field's bytes, unchecked against the file's end."""
        p = self.field(offset)
        if not p:
            return None
        start = self._ref(p)
        return start + 4, _U32(self.buf, start)[0]

    def string(self, offset: int) -> bytes | None:
        """A string field's bytes."""
        span = self.string_span(offset)
        if span is None:
            return None
        start, n = span
        if start + n > len(self.buf):
            raise FlatbufferError(f"string of {n} bytes at {start} runs past the end")
        return self.buf[start : start + n]

    def vector(self, offset: int) -> tuple[int, int]:
        """(start of the elements, element count) of a vector field; (0, 0) if absent.

        The count is not checked: check it (``check``) before reading the elements.
        """
        p = self.field(offset)
        if not p:
            return 0, 0
        start = self._ref(p)
        return start + 4, _U32(self.buf, start)[0]

    def check(self, start: int, n: int, elem_size: int) -> None:
        """The ``n`` elements at ``start`` lie inside the file."""
        if start + n * elem_size > len(self.buf):
            raise FlatbufferError(
                f"vector of {n} elements of {elem_size} bytes at {start} runs past the end of "
                f"the {len(self.buf)}-byte file"
            )

    def values(self, offset: int, fmt: str) -> tuple[Any, ...]:
        """A vector of scalars as a tuple of Python values (``fmt``: struct character)."""
        start, n = self.vector(offset)
        return self.unpack(start, n, fmt)

    def unpack(self, start: int, n: int, fmt: str) -> tuple[Any, ...]:
        """The ``n`` scalars at ``start`` (a vector's elements) as Python values."""
        if not n:
            return ()
        self.check(start, n, _SIZES[fmt])
        return struct.unpack_from(f"<{n}{fmt}", self.buf, start)

    def array(self, offset: int, dtype: str) -> np.ndarray:
        """A vector of scalars as a (read-only) numpy array of numpy ``dtype``."""
        start, n = self.vector(offset)
        dt = np.dtype(dtype)
        if not n:
            return np.zeros(0, dt)
        self.check(start, n, dt.itemsize)
        return np.frombuffer(self.buf, dt, count=n, offset=start)

    def tables(self, offset: int) -> list[Table]:
        """A vector of tables."""
        start, n = self.vector(offset)
        if not n:
            return []
        self.check(start, n, 4)
        buf = self.buf
        return [
            Table(buf, p + r)
            for p, r in zip(
                range(start, start + 4 * n, 4),
                struct.unpack_from(f"<{n}I", buf, start),
                strict=True,
            )
        ]


def root(buf: bytes) -> Table:
    """The root table of a flatbuffer (its offset in the first four bytes)."""
    if len(buf) < 4:
        raise FlatbufferError(f"{len(buf)} bytes: too short for a flatbuffer")
    return Table(buf, _U32(buf, 0)[0])
