"""How a compiled model's texts are stored: LZMA tuned for text, primed with a dictionary.

The cache (`litekiln.cache.models`) writes a compiled model's plan (the manifest of its
launches, tensors and storages) and its programs' texts (the OpenCL C of all partitions as one
JSON list, the PTX as another) with `compress`; the compiler (`litekiln.compiler.budget`)
measures with `packed_texts` what the kernels will cost in the entry, byte for byte; readers
get the bytes back with `decompress`.

**Dictionaries.** Every compiled model's plan repeats the same field names and values, and
every program the same kernel scaffolding (the index macros, the reduction trees, the
``__kernel void k3(__global float*restrict a,...`` lines). On a small model those are most of
its entry: LZMA alone sees each only once. The package ships one dictionary for plans and one
for OpenCL C (`DICTIONARIES`, under ``dictionaries/``, made by ``scripts/text_dictionaries.py``
from models outside the zoo); a part is compressed as if its dictionary came first, and stores
only what follows it.

Python's `lzma` has no preset dictionary (liblzma has one, for raw streams only, which the
module does not expose), so the priming is done through the stream itself: the dictionary is
shipped as its own raw LZMA1 stream (`TextDictionary.stream`, the filters of `_PRIMED`); a part
compressed with it is the raw stream of ``dictionary + data``, of which the first ``L`` bytes
equal the shipped stream's (the encoder's decisions over the dictionary do not depend on what
follows it, except within its last few kilobytes of look-ahead). The part stores the header
``LKD1``, the dictionary's identity, ``L``, and the rest of the stream; `decompress` puts the
shipped ``stream[:L]`` back in front, decodes, and drops the dictionary's text. Nothing is
assumed about the encoder: ``L`` is measured on each part, and where another liblzma would make
it short, or the plain stream is smaller, the part is plain LZMA (the ``.lzma`` container).
"""

from __future__ import annotations

import functools
import hashlib
import json
import lzma
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from litekiln.errors import LitekilnError

#: The header of a part compressed with a dictionary: the magic, the dictionary's identity
#: (`TextDictionary.ident`), and how many leading bytes of its stream the part shares.
_MAGIC = b"LKD1"
_HEADER = struct.Struct("<4s8sI")

#: The filters of every primed stream (a dictionary's own and the parts made with it): the
#: plain parts' tuning (`compress`) with one fixed window, as the shipped stream and a part's
#: stream must be made alike. 8 MiB holds the largest program text seen (2.5 MB of a 676 KB
#: model's kernels and variants); 16 MiB would double the encoder's set-up (3.5 -> 29 ms).
_PRIMED = [
    {
        "id": lzma.FILTER_LZMA1,
        "preset": 9 | lzma.PRESET_EXTREME,
        "dict_size": 1 << 23,
        "lc": 1,
        "lp": 0,
        "pb": 0,
    }
]

_DICTIONARY_DIR = Path(__file__).resolve().parent / "dictionaries"


@dataclass(frozen=True)
class TextDictionary:
    """A shipped dictionary, as ``index.json`` lists it: a reader needs its identity and
    length from the index, and its stream (read and checked the first time a part names it:
    a warm start reads the plan's only); a writer its text (decoded once per process)."""

    name: str
    file: Path
    #: sha256 of the file (the dictionary compressed alone, raw, with `_PRIMED`).
    sha256: str
    #: The length of its text.
    size: int

    @property
    def ident(self) -> bytes:
        """Its identity in a part's header: the first 8 bytes of its stream's sha256."""
        return bytes.fromhex(self.sha256[:16])

    @functools.cached_property
    def stream(self) -> bytes:
        """The dictionary compressed alone.

        Raises:
            LitekilnError: the file is not the one the index names (a damaged install).
        """
        data = self.file.read_bytes()
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise LitekilnError(
                f"litekiln's text dictionary {self.file} is damaged: reinstall litekiln"
            )
        return data

    @functools.cached_property
    def text(self) -> bytes:
        """The dictionary itself."""
        text = lzma.decompress(self.stream, format=lzma.FORMAT_RAW, filters=_PRIMED)
        if len(text) != self.size:
            raise LitekilnError(f"litekiln's text dictionary {self.file} is damaged: reinstall")
        return text


@functools.cache
def dictionaries() -> dict[str, TextDictionary]:
    """The shipped dictionaries by name (``plan``, ``source``), as ``index.json`` lists them;
    none where the package has none."""
    index_file = _DICTIONARY_DIR / "index.json"
    if not index_file.is_file():
        return {}
    return {
        name: TextDictionary(name, _DICTIONARY_DIR / i["file"], str(i["sha256"]), int(i["size"]))
        for name, i in json.loads(index_file.read_text()).items()
    }


def _by_ident(ident: bytes) -> TextDictionary:
    for d in dictionaries().values():
        if d.ident == ident:
            return d
    raise ValueError(
        f"cache part compressed with text dictionary {ident.hex()}, which this litekiln does "
        "not ship"
    )


def _plain(data: bytes) -> bytes:
    """LZMA at its strongest, tuned for text, in the ``.lzma`` container (``lzma.decompress``
    reads it as it reads xz).

    Tuned on the cache's own parts: no position bits (2% smaller on OpenCL C) and one bit of
    literal context (2.5% smaller on a small model's OpenCL C than the default three, the same
    on large ones); the ``.lzma`` header is 13 bytes where xz's framing is about 60 (a part's
    integrity is its sha256 in the signed entry manifest, not the container's CRC). The
    window is no larger than the data (memory).
    """
    dict_size = max(1 << 16, 1 << (max(len(data), 1) - 1).bit_length())
    lzma1 = {"id": lzma.FILTER_LZMA1, "preset": 9 | lzma.PRESET_EXTREME, "dict_size": dict_size}
    return lzma.compress(
        data, format=lzma.FORMAT_ALONE, filters=[{**lzma1, "lc": 1, "lp": 0, "pb": 0}]
    )


def _shared_prefix(a: bytes, b: bytes) -> int:
    """How many leading bytes ``a`` and ``b`` share (bisection over slices: C speed)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


#: A primed part of a text this long or longer that shares all of its dictionary's stream but
#: up to `_SURE_SHARE` bytes (the encoder's look-ahead over the dictionary's end changes its
#: last few: 9 on smoke's plan) is kept without making the plain stream too: the compiler's
#: variant budget compresses megabytes of kernels several times, and on them the dictionary
#: gains far more than the primed header's 16 bytes. Any other part is kept primed only
#: where that is the smaller.
_SURE_LENGTH = 64 << 10
_SURE_SHARE = 256


def compress(data: bytes, dictionary: str | None = None) -> bytes:
    """``data`` compressed for the cache: primed with the shipped dictionary ``dictionary``
    where the package has it and that is smaller, plain LZMA otherwise."""
    d = dictionaries().get(dictionary) if dictionary else None
    if d is None:
        return _plain(data)
    full = lzma.compress(d.text + data, format=lzma.FORMAT_RAW, filters=_PRIMED)
    shared = _shared_prefix(full, d.stream)
    primed = _HEADER.pack(_MAGIC, d.ident, shared) + full[shared:]
    if len(data) >= _SURE_LENGTH and shared >= len(d.stream) - _SURE_SHARE:
        return primed
    plain = _plain(data)
    return primed if len(primed) < len(plain) else plain


def decompress(part: bytes) -> bytes:
    """The bytes `compress` was given.

    Raises:
        ValueError: ``part`` is damaged, or names a dictionary this litekiln does not ship.
        lzma.LZMAError: its stream is damaged.
    """
    if not part.startswith(_MAGIC):
        return lzma.decompress(part)
    if len(part) < _HEADER.size:
        raise ValueError("cache part is truncated")
    _, ident, shared = _HEADER.unpack_from(part)
    d = _by_ident(ident)
    if shared > len(d.stream):
        raise ValueError("cache part shares more of its dictionary than it has")
    out = lzma.decompress(
        d.stream[:shared] + part[_HEADER.size :], format=lzma.FORMAT_RAW, filters=_PRIMED
    )
    if len(out) < d.size:
        raise ValueError("cache part is shorter than its dictionary")
    return out[d.size :]


def packed_texts(texts: Sequence[str], dictionary: str | None = "source") -> bytes:
    """One part of the entry: the texts (one per partition), as a JSON list, compressed (the
    OpenCL C with the ``source`` dictionary; PTX with none)."""
    return compress(json.dumps(list(texts)).encode(), dictionary)
