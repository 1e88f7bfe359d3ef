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
    """LZMA at its strongest, tuned for text (no position bits: 2% smaller on OpenCL C), with a
    dictionary no larger than the data (memory)."""
    dict_size = max(1 << 16, 1 << (max(len(data), 1) - 1).bit_length())
    lzma2 = {"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME, "dict_size": dict_size}
    return lzma.compress(data, format=lzma.FORMAT_XZ, filters=[{**lzma2, "lp": 0, "pb": 0}])


def packed_texts(texts: Sequence[str]) -> bytes:
    """One part of the entry: the texts (one per partition), as a JSON list, compressed."""
    return compress(json.dumps(list(texts)).encode())
