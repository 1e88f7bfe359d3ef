"""Cache export files: one tar of JSON and raw bytes, never pickle.

Layout of the tar (members are plain files; nothing is ever extracted to disk on import)::

    litekiln-cache-export.json    {"format": "litekiln-cache-export", "version": 1,
                                   "schema": 1, "entries": [<key>, ...]}
    entries/<key>/manifest        the entry's stored manifest (self-checksummed)
    entries/<key>/<i>             raw bytes of part i of that manifest's "parts" list

Import checks everything (index, every manifest's checksum and key, every part's size and
sha256, no missing or extra member) before the store inserts anything.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from litekiln.cache.errors import CacheError
from litekiln.cache.keys import canonical_json, is_key
from litekiln.cache.manifest import SCHEMA_VERSION, CorruptError, check_part, decode_manifest

FORMAT = "litekiln-cache-export"
FORMAT_VERSION = 1
INDEX = "litekiln-cache-export.json"


def _add(tar: tarfile.TarFile, name: str, data: bytes, mtime: float) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(mtime)
    info.mode = 0o600
    tar.addfile(info, io.BytesIO(data))


def write_archive(path: Path, entries: list[tuple[bytes, Any]]) -> None:
    """Write `entries` ((stored manifest bytes, `Entry`) pairs) to `path` atomically.

    Raises:
        CacheError: the file cannot be written (the partial file is removed).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    now = time.time()
    index = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "schema": SCHEMA_VERSION,
        "entries": [entry.key for _, entry in entries],
    }
    try:
        with open(tmp, "xb") as f:
            with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tar:
                _add(tar, INDEX, canonical_json(index), now)
                for raw, entry in entries:
                    _add(tar, f"entries/{entry.key}/manifest", raw, now)
                    for i, name in enumerate(entry.part_names):
                        _add(tar, f"entries/{entry.key}/{i}", entry.part(name), now)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise CacheError(f"cannot write cache export {path}: {e}") from e


class _Refused(Exception):
    pass


class _Reader:
    """Members of an export by name, refusing anything but unique plain files."""

    def __init__(self, tar: tarfile.TarFile) -> None:
        self._tar = tar
        self.members: dict[str, tarfile.TarInfo] = {}
        for m in tar.getmembers():
            if not m.isfile():
                raise _Refused(f"member {m.name!r} is not a plain file")
            if m.name in self.members:
                raise _Refused(f"member {m.name!r} appears twice")
            self.members[m.name] = m

    def read(self, name: str) -> bytes:
        member = self.members.get(name)
        if member is None:
            raise _Refused(f"member {name!r} is missing")
        f = self._tar.extractfile(member)
        if f is None:
            raise _Refused(f"member {name!r} cannot be read")
        with f:
            return f.read()


@contextlib.contextmanager
def _open(path: Path) -> Iterator[_Reader]:
    try:
        with tarfile.open(path, "r:*") as tar:
            yield _Reader(tar)
    except _Refused as e:
        raise _refusal(path, str(e)) from None
    except CorruptError as e:
        raise _refusal(path, str(e)) from None
    except (OSError, EOFError, tarfile.TarError) as e:
        raise _refusal(path, f"not a readable tar file ({e})") from None


def _refusal(path: Path, detail: str) -> CacheError:
    return CacheError(
        f"refusing to import {path}: {detail}. The export is damaged or was modified; "
        "nothing was imported."
    )


def _read_index(reader: _Reader) -> list[str]:
    try:
        index = json.loads(reader.read(INDEX))
    except ValueError:
        raise _Refused("its index is not valid JSON") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise _Refused("it is not a litekiln cache export")
    if index.get("version") != FORMAT_VERSION or index.get("schema") != SCHEMA_VERSION:
        raise _Refused(
            f"export format {index.get('version')!r}/schema {index.get('schema')!r} is not "
            f"{FORMAT_VERSION}/{SCHEMA_VERSION} (export it again with this litekiln)"
        )
    keys = index.get("entries")
    if not isinstance(keys, list) or not all(is_key(k) for k in keys):
        raise _Refused("its index lists malformed keys")
    if len(set(keys)) != len(keys):
        raise _Refused("its index lists a key twice")
    return keys


def _check_entry(reader: _Reader, key: str, keep: bool) -> tuple[dict[str, Any], list[bytes]]:
    try:
        manifest = decode_manifest(reader.read(f"entries/{key}/manifest"), key)
    except CorruptError as e:
        raise _Refused(f"entry {key[:12]}: {e}") from None
    blobs = []
    for i, rec in enumerate(manifest["parts"]):
        data = reader.read(f"entries/{key}/{i}")
        try:
            check_part(rec, data)
        except CorruptError as e:
            raise _Refused(f"entry {key[:12]}: {e}") from None
        if keep:
            blobs.append(data)
    return manifest, blobs


def verify_archive(path: Path) -> list[dict[str, Any]]:
    """Check a whole export without keeping its parts in memory.

    Returns:
        The manifests of its entries, in order.

    Raises:
        CacheError: anything is wrong (the message says what).
    """
    with _open(path) as reader:
        keys = _read_index(reader)
        expected = {INDEX}
        manifests = []
        for key in keys:
            manifest, _ = _check_entry(reader, key, keep=False)
            manifests.append(manifest)
            expected.add(f"entries/{key}/manifest")
            expected.update(f"entries/{key}/{i}" for i in range(len(manifest["parts"])))
        extra = sorted(set(reader.members) - expected)
        if extra:
            raise _refusal(path, f"unexpected member {extra[0]!r}")
        return manifests


def read_archive(
    path: Path, manifests: list[dict[str, Any]]
) -> Iterator[tuple[dict[str, Any], list[bytes]]]:
    """Entries of an export already passed by `verify_archive`, checked again as read.

    The second check guards against the file changing between verification and import.

    Yields:
        (manifest, part bytes in manifest order).

    Raises:
        CacheError: an entry no longer matches what was verified.
    """
    with _open(path) as reader:
        for verified in manifests:
            manifest, blobs = _check_entry(reader, verified["key"], keep=True)
            if manifest != verified:
                raise _Refused(f"entry {verified['key'][:12]} changed during the import")
            yield manifest, blobs
