"""Export archives read as streams with limits: a small file that expands to gigabytes is
refused before it is decompressed, within 100 MB of resident memory (measured in a child
process), whether the import trusts the file or not."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

if not os.path.exists("/proc/self/status"):
    pytest.skip("measures memory through /proc (Linux)", allow_module_level=True)

from litekiln.cache import make_key
from litekiln.cache.keys import canonical_json

REPO = Path(__file__).resolve().parent.parent
GiB = 1 << 30

# Imports the cache and its export path, then imports the archive; prints the refusal and
# the child's peak resident memory before and after (KiB).
_CHILD = textwrap.dedent(
    """
    import json, sys
    from litekiln.cache import CacheError, CacheStore
    import litekiln.cache.archive, litekiln.cache.signing, litekiln.cache.transfer

    def peak_kib():  # VmHWM: this process's own peak (ru_maxrss keeps the forking parent's)
        with open("/proc/self/status") as f:
            return int(next(l for l in f if l.startswith("VmHWM:")).split()[1])

    store = CacheStore.open(sys.argv[1])
    base = peak_kib()
    try:
        store.import_(sys.argv[2], trust=sys.argv[3] == "trust")
        outcome = "imported"
    except CacheError as e:
        outcome = str(e)
    print(json.dumps({"outcome": outcome, "base_kib": base, "peak_kib": peak_kib()}))
    """
)


def _header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o600
    return info.tobuf(format=tarfile.GNU_FORMAT)


def _bomb(path: Path, members: list[tuple[str, bytes | int]]) -> None:
    """A gzip'd tar: members given as bytes, or as a size of zeros (gzip members of 64 MiB
    of zeros, concatenated: a few MB on disk)."""
    zeros = gzip.compress(bytes(64 << 20), compresslevel=9)
    with open(path, "wb") as f:
        for name, data in members:
            size = data if isinstance(data, int) else len(data)
            f.write(gzip.compress(_header(name, size)))
            if isinstance(data, int):
                for _ in range(data // (64 << 20)):
                    f.write(zeros)
            else:
                f.write(gzip.compress(data + bytes(-len(data) % 512)))
        f.write(gzip.compress(bytes(1024)))


def _import(tmp_path: Path, archive: Path, trust: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _CHILD,
            str(tmp_path / "cache"),
            str(archive),
            str(trust and "trust"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _entry_of(size: int) -> list[tuple[str, bytes | int]]:
    """An export whose index and manifest are well formed, and whose one part is `size`
    bytes of zeros (its sha256 is wrong: it is never computed)."""
    fields = {"token": "bomb"}
    key = make_key(fields)
    part = {"name": "w", "store": f"part:{key}:0:0", "size": size, "sha256": "0" * 64}
    manifest = {"schema": 2, "key": key, "kind": "model", "fields": fields, "meta": {}}
    body = canonical_json({**manifest, "created": 0, "parts": [part]})
    listed = {"key": key, "manifest_sha256": hashlib.sha256(body).hexdigest(), "parts": 1}
    index = {"format": "litekiln-cache-export", "version": 2, "schema": 2, "entries": [listed]}
    return [
        ("litekiln-cache-export.json", canonical_json(index)),
        (f"entries/{key}/manifest", body),
        (f"entries/{key}/0", size),
    ]


BOMBS = {
    # The index itself expands to 3 GiB (the old reader held a member whole).
    "a 3 GiB index": [("litekiln-cache-export.json", 3 * GiB)],
    # A part of 3 GiB behind a well-formed index and manifest.
    "a 3 GiB part": _entry_of(3 * GiB),
}


@pytest.mark.slow
@pytest.mark.parametrize("trust", [False, True], ids=["untrusted", "--trust"])
@pytest.mark.parametrize("bomb", list(BOMBS))
def test_gzip_bomb_is_refused_within_100_mb(tmp_path: Path, bomb: str, trust: bool) -> None:
    archive = tmp_path / "bomb.tar.gz"
    _bomb(archive, BOMBS[bomb])
    assert archive.stat().st_size < 8 << 20
    got = _import(tmp_path, archive, trust)
    assert got["outcome"].startswith("refusing to import"), got
    assert "nothing was imported" in got["outcome"]
    grew = (got["peak_kib"] - got["base_kib"]) / 1024
    print(
        f"{bomb} ({'--trust' if trust else 'untrusted'}): peak RSS {got['peak_kib'] / 1024:.1f} "
        f"MiB, {grew:.1f} MiB over the {got['base_kib'] / 1024:.1f} MiB of a process that has "
        "imported litekiln"
    )
    assert grew < 100 and got["peak_kib"] < 100 * 1024, got


def test_size_limits_are_checked_on_the_header(tmp_path: Path) -> None:
    from litekiln.cache import CacheError, CacheStore

    archive = tmp_path / "big.tar.gz"
    _bomb(archive, BOMBS["a 3 GiB part"])
    with CacheStore.open(tmp_path / "cache") as store:
        refused = "3221225472 bytes, over the limit|more than 2214592512 bytes"
        with pytest.raises(CacheError, match=refused):
            store.import_(archive, trust=True)
        with pytest.raises(CacheError, match="not signed"):  # untrusted: refused before
            store.import_(archive)
        small = CacheStore.open(tmp_path / "small", size_limit=1 << 20)
        with pytest.raises(CacheError, match="more than .* bytes .*import limit"):
            small.import_(archive, trust=True)
