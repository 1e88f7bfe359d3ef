"""How a compiled model's texts are stored: LZMA, tuned for text.

The cache (`litekiln.cache.models`) writes a compiled model's manifest and its programs' texts
(the OpenCL C of all partitions as one JSON list, the PTX as another) with `compress`; the
compiler (`litekiln.compiler.budget`) measures with `packed_texts` what the kernels will cost
in the entry, byte for byte.
"""

from __future__ import annotations

import json
import lzma
from collections.abc import Sequence


def compress(data: bytes) -> bytes:
    """LZMA at its strongest, tuned for text, in the ``.lzma`` container (``lzma.decompress``
    reads it as it reads xz).

    Tuned on the cache's own parts: no position bits (2% smaller on OpenCL C) and one bit of
    literal context (2.5% smaller on a small model's OpenCL C than the default three, the same
    on large ones); the ``.lzma`` header is 13 bytes where xz's framing is about 60 (a part's
    integrity is its sha256 in the signed entry manifest, not the container's CRC). The
    dictionary is no larger than the data (memory). On the zoo's smoke model these took its
    two parts from 3748 to 3591 bytes.
    """
    dict_size = max(1 << 16, 1 << (max(len(data), 1) - 1).bit_length())
    lzma1 = {"id": lzma.FILTER_LZMA1, "preset": 9 | lzma.PRESET_EXTREME, "dict_size": dict_size}
    return lzma.compress(
        data, format=lzma.FORMAT_ALONE, filters=[{**lzma1, "lc": 1, "lp": 0, "pb": 0}]
    )


def packed_texts(texts: Sequence[str]) -> bytes:
    """One part of the entry: the texts (one per partition), as a JSON list, compressed."""
    return compress(json.dumps(list(texts)).encode())
