"""The cache's texts primed with the shipped dictionaries (`litekiln.artifact.texts`).

A compiled model's plan and OpenCL C are compressed as if a dictionary of what such texts
repeat came first; the part stores only what follows it. These tests check that what comes
back is what went in (plans and kernels of a model the dictionaries were not made from, odd
and empty inputs), that a part is never larger than plain LZMA, that the dictionaries gain
what they are for on a small model's entry, and that a part whose dictionary this litekiln
does not ship, or that is damaged, is an error the cache turns into a rebuilt entry.
"""

from __future__ import annotations

import json
import lzma
import os
import shutil
import struct
from pathlib import Path

import pytest

from litekiln.artifact import texts
from litekiln.errors import LitekilnError
from litekiln.zoo import ZOO

DICTIONARY_DIR = Path(texts.__file__).parent / "dictionaries"


def _plain(data: bytes) -> bytes:
    """Plain LZMA, as the cache stored every part before the dictionaries: the reference the
    primed parts are measured against."""
    filters = [
        {"id": lzma.FILTER_LZMA1, "preset": 9 | lzma.PRESET_EXTREME, "lc": 1, "lp": 0, "pb": 0}
    ]
    return lzma.compress(data, format=lzma.FORMAT_ALONE, filters=filters)


# A plan and a kernel in the shapes the compiler writes them (written here, not taken from the
# dictionaries' training models).
PLAN = json.dumps(
    {
        "compiled": {
            "format": 2,
            "token": "0123456789abcdef",
            "model_name": "my_model",
            "options": {"precision": "fp32", "target": "opencl", "schedules": "fast"},
            "partitions": [
                {
                    "index": 0,
                    "program": {
                        "storages": [
                            {"id": i, "nbytes": 4 << i, "role": "constant"} for i in range(12)
                        ],
                        "tensors": [
                            {
                                "id": i,
                                "storage": i,
                                "offset": 0,
                                "shape": [1, 8, 8, i + 1],
                                "dtype": "float32",
                            }
                            for i in range(12)
                        ],  # fmt: skip
                        "launches": [
                            {
                                "kernel": f"k{i}",
                                "args": [{"buffer": i}, {"buffer": i + 1}],
                                "global_size": [256 * (i + 1)],
                                "local_size": [64],
                            }
                            for i in range(11)
                        ],  # fmt: skip
                    },
                }
            ],
        },
        "packed": {},
        "shared": {},
    },
    separators=(",", ":"),
).encode()

KERNEL = (
    "#define G0 (convert_int(get_group_id(0)))\n#define L0 (convert_int(get_local_id(0)))\n"
    "// Function: k0\n__kernel void k0(__global float*restrict a,__global float*restrict b,"
    "__global float*restrict c){for(int d=0;d<3;++d){a[((G0*64)+L0)]=max((b[(((G0*64)+L0)*3+d)]"
    "+c[d]),0.000000e+00f);}}\n"
)


def test_the_package_ships_both_dictionaries_made_without_the_zoo() -> None:
    ds = texts.dictionaries()
    assert set(ds) == {"plan", "source"}
    index = json.loads((DICTIONARY_DIR / "index.json").read_text())
    for name, d in ds.items():
        assert len(d.text) == d.size == index[name]["size"] > 16 << 10
        # the bounds of the cache's size are measured on the zoo: its models trained nothing
        assert not set(index[name]["trained_on"]) & set(ZOO)


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (PLAN, "plan"),
        (json.dumps([KERNEL]).encode(), "source"),
        (json.dumps([KERNEL * 40, KERNEL.replace("float", "half")]).encode(), "source"),
        (b"", "plan"),
        (b"\x00\xff" * 1000, "source"),
        (os.urandom(5000), "plan"),
        (PLAN, None),
    ],
)
def test_what_is_compressed_comes_back_and_is_never_larger_than_plain(
    data: bytes, kind: str | None
) -> None:
    part = texts.compress(data, kind)
    assert texts.decompress(part) == data
    assert len(part) <= len(_plain(data))


def test_the_dictionaries_gain_on_a_small_model(tmp_path: Path) -> None:
    """The plan and the kernels of a model none of the dictionaries was made from: primed,
    each part is at least a fifth smaller than plain LZMA (measured: about half for the
    plan, a quarter for the kernels)."""
    for data, kind in ((PLAN, "plan"), (json.dumps([KERNEL * 3]).encode(), "source")):
        part = texts.compress(data, kind)
        assert part.startswith(b"LKD1")
        assert len(part) < 0.8 * len(_plain(data)), kind


def test_a_part_sharing_none_of_its_dictionary_still_reads() -> None:
    """Where another liblzma's encoder makes the dictionary's stream otherwise, a part
    shares less of it, down to nothing: it stores the whole stream and still reads back."""
    d = texts.dictionaries()["plan"]
    full = lzma.compress(d.text + PLAN, format=lzma.FORMAT_RAW, filters=texts._PRIMED)
    part = struct.pack("<4s8sI", b"LKD1", d.ident, 0) + full
    assert texts.decompress(part) == PLAN


def test_a_part_of_another_dictionary_or_damaged_is_an_error() -> None:
    part = texts.compress(PLAN, "plan")
    other = part[:4] + bytes(8) + part[12:]
    with pytest.raises(ValueError, match="does not ship"):
        texts.decompress(other)
    with pytest.raises(ValueError, match="truncated"):
        texts.decompress(part[:10])
    too_far = part[:12] + struct.pack("<I", 1 << 30) + part[16:]
    with pytest.raises(ValueError, match="shares more"):
        texts.decompress(too_far)
    with pytest.raises((ValueError, lzma.LZMAError)):
        texts.decompress(part[: len(part) // 2])


def test_a_damaged_dictionary_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "dictionaries"
    shutil.copytree(DICTIONARY_DIR, copy)
    stream = bytearray((copy / "plan.lzma").read_bytes())
    stream[100] ^= 0xFF
    (copy / "plan.lzma").write_bytes(bytes(stream))
    monkeypatch.setattr(texts, "_DICTIONARY_DIR", copy)
    texts.dictionaries.cache_clear()
    try:
        ds = texts.dictionaries()
        assert ds["source"].stream  # the other one reads
        with pytest.raises(LitekilnError, match="plan.lzma is damaged: reinstall"):
            texts.decompress(texts.compress(PLAN, "plan"))
    finally:
        texts.dictionaries.cache_clear()
