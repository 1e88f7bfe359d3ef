"""Cache export files: one tar of JSON and raw bytes, never pickle, signed with Ed25519.

Layout of the tar, in this order (members are plain files; nothing is ever extracted to disk
on import)::

    litekiln-cache-export.json    {"format": "litekiln-cache-export", "version": 2,
                                   "schema": 2, "entries": [{"key": <key>,
                                   "manifest_sha256": <hex>, "parts": <count>}, ...]}
    litekiln-cache-export.sig     {"algorithm": "ed25519", "public_key": <base64>,
                                   "signature": <base64>}: the signature of the index
                                   (absent in an export written with --unsigned)
    entries/<key>/manifest        the entry's manifest body (canonical JSON; the exporting
                                  cache's HMAC is not carried: another cache has another
                                  secret)
    entries/<key>/<i>             raw bytes of part i of that manifest's "parts" list

The signature covers the index, the index the sha256 of each manifest, each manifest the
size and sha256 of each part: one signature vouches for every byte.

Import reads the archive as a stream (gzip, bzip2 and xz are decompressed on the fly) and
checks each member's header before reading its data: only plain files, in exactly the order
above, each within its size limit, all within a total (`Limits`); so a small file that
expands to gigabytes is refused after reading a header, never held in memory. The signature
is checked before any entry is read, and every manifest and part (signature chain, sizes,
sha256, keys against fields) before the store inserts anything.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import io
import json
import lzma
import os
import secrets
import tarfile
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from litekiln.cache.errors import CacheError
from litekiln.cache.keys import canonical_json, is_key
from litekiln.cache.manifest import SCHEMA_VERSION, CorruptError, decode_body, manifest_body
from litekiln.cache.signing import Signer, Untrusted, check

FORMAT = "litekiln-cache-export"
FORMAT_VERSION = 2
INDEX = "litekiln-cache-export.json"
SIGNATURE = "litekiln-cache-export.sig"

_BLOCK = 512
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Limits:
    """How much an import reads at most, checked on each member's header before its data.

    Attributes:
        part: bytes of one part (more could not be stored in the cache anyway).
        total: bytes of all members together.
        meta: bytes of the index, the signature or one manifest.
    """

    part: int
    total: int
    meta: int = 16 << 20

    @classmethod
    def for_cache(cls, size_limit: int) -> Limits:
        """The limits for a cache of `size_limit` bytes: an export larger than the cache
        would only evict itself."""
        return cls(part=size_limit, total=size_limit + (64 << 20))


# ---------------------------------------------------------------- writing


def _add(tar: tarfile.TarFile, name: str, data: bytes, mtime: float) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(mtime)
    info.mode = 0o600
    tar.addfile(info, io.BytesIO(data))


def write_archive(path: Path, entries: list[tuple[bytes, Any]], signer: Signer) -> None:
    """Write `entries` ((stored manifest bytes, `Entry`) pairs) to `path` atomically.

    Raises:
        CacheError: the file cannot be written (the partial file is removed).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    now = time.time()
    bodies = [manifest_body(raw) for raw, _ in entries]
    index = canonical_json(
        {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "schema": SCHEMA_VERSION,
            "entries": [
                {
                    "key": entry.key,
                    "manifest_sha256": hashlib.sha256(body).hexdigest(),
                    "parts": len(entry.part_names),
                }
                for body, (_, entry) in zip(bodies, entries, strict=True)
            ],
        }
    )
    signature = signer.sign(index)
    try:
        with open(tmp, "xb") as f:
            # GNU headers: sizes past 8 GiB in base-256, never a pax header (which the
            # reader refuses, as it could not bound its size).
            with tarfile.open(fileobj=f, mode="w", format=tarfile.GNU_FORMAT) as tar:
                _add(tar, INDEX, index, now)
                if signature is not None:
                    _add(tar, SIGNATURE, signature, now)
                for body, (_, entry) in zip(bodies, entries, strict=True):
                    _add(tar, f"entries/{entry.key}/manifest", body, now)
                    for i, name in enumerate(entry.part_names):
                        _add(tar, f"entries/{entry.key}/{i}", entry.part(name), now)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise CacheError(f"cannot write cache export {path}: {e}") from e


# ---------------------------------------------------------------- reading


class _Refused(Exception):
    pass


@dataclass
class _Header:
    name: str
    size: int


class _TarStream:
    """The members of a tar read in order from a stream, refusing anything but plain files
    within the limits (checked on the header, before the data is read)."""

    def __init__(self, stream: io.BufferedIOBase, limits: Limits) -> None:
        self._stream = stream
        self._limits = limits
        self._declared = 0  # member sizes so far

    def _exact(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self._stream.read(min(n - len(out), _CHUNK))
            if not chunk:
                raise _Refused("it is truncated")
            out += chunk
        return bytes(out)

    def next(self) -> _Header | None:
        """The next member's header; None at the end of the archive."""
        block = self._stream.read(_BLOCK)
        if len(block) < _BLOCK and block:
            block += self._exact(_BLOCK - len(block))
        if not block or block == bytes(_BLOCK):
            return None
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.HeaderError as e:
            raise _Refused(f"a tar header is damaged ({e})") from None
        if info.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
            raise _Refused(f"member {info.name!r} is not a plain file")
        self._declared += info.size
        if self._declared > self._limits.total:
            raise _Refused(
                f"its members hold more than {self._limits.total} bytes (the import limit)"
            )
        return _Header(info.name, info.size)

    def chunks(self, header: _Header, limit: int) -> Iterator[bytes]:
        """The data of `header`'s member, in chunks; refused before reading if too large."""
        if header.size > limit:
            raise _Refused(
                f"member {header.name!r} holds {header.size} bytes, over the limit of {limit}"
            )
        left = header.size
        while left:
            chunk = self._exact(min(left, _CHUNK))
            left -= len(chunk)
            yield chunk
        pad = -header.size % _BLOCK
        if pad:
            self._exact(pad)

    def read(self, header: _Header, limit: int) -> bytes:
        """The whole data of a (small) member."""
        return b"".join(self.chunks(header, limit))


def _decompressed(raw: io.BufferedReader) -> io.BufferedIOBase:
    """`raw`, decompressed on the fly if it is gzip, bzip2 or xz (reads stay bounded)."""
    magic = raw.read(6)
    raw.seek(0)
    if magic.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if magic.startswith(b"BZh"):
        return bz2.BZ2File(raw)
    if magic.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(raw)
    return raw


@contextlib.contextmanager
def _open(path: Path, limits: Limits) -> Iterator[_TarStream]:
    try:
        with open(path, "rb") as raw, _decompressed(raw) as stream:
            yield _TarStream(stream, limits)
    except FileNotFoundError:
        raise CacheError(f"cannot import {path}: the file does not exist") from None
    except _Refused as e:
        raise _refusal(path, str(e)) from None
    except Untrusted as e:
        raise CacheError(f"refusing to import {path}: {e}; nothing was imported.") from None
    except (OSError, EOFError, lzma.LZMAError, zlib.error) as e:
        raise _refusal(path, f"it is not a readable archive ({e})") from None


def _refusal(path: Path, detail: str) -> CacheError:
    return CacheError(
        f"refusing to import {path}: {detail}. The export is damaged or was modified; "
        "nothing was imported."
    )


def _parse_index(data: bytes) -> list[dict[str, Any]]:
    try:
        index = json.loads(data)
    except ValueError:
        raise _Refused("its index is not valid JSON") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise _Refused("it is not a litekiln cache export")
    if index.get("version") != FORMAT_VERSION or index.get("schema") != SCHEMA_VERSION:
        raise _Refused(
            f"export format {index.get('version')!r}/schema {index.get('schema')!r} is not "
            f"{FORMAT_VERSION}/{SCHEMA_VERSION} (export it again with this litekiln)"
        )
    entries = index.get("entries")
    if not isinstance(entries, list) or not all(
        isinstance(e, dict)
        and _hex64(e.get("key"))
        and _hex64(e.get("manifest_sha256"))
        and type(e.get("parts")) is int
        for e in entries
    ):
        raise _Refused("its index lists malformed entries")
    keys = [e["key"] for e in entries]
    if len(set(keys)) != len(keys):
        raise _Refused("its index lists a key twice")
    return entries


def _hex64(value: Any) -> bool:
    return isinstance(value, str) and is_key(value)


def _expect(header: _Header | None, name: str) -> _Header:
    if header is None:
        raise _Refused(f"member {name!r} is missing")
    if header.name != name:
        raise _Refused(f"unexpected member {header.name!r} (expected {name!r})")
    return header


def _entries(
    tar: _TarStream, limits: Limits, keys: list[bytes], trust: bool, keep: bool
) -> Iterator[tuple[dict[str, Any], list[bytes]]]:
    """Check the index and signature, then yield each entry, every member checked."""
    index_bytes = tar.read(_expect(tar.next(), INDEX), limits.meta)
    entries = _parse_index(index_bytes)
    header = tar.next()
    signature = None
    if header is not None and header.name == SIGNATURE:
        signature = tar.read(header, limits.meta)
        header = tar.next()
    check(signature, index_bytes, keys, trust)  # before any entry is read
    for listed in entries:
        key = listed["key"]
        body = tar.read(_expect(header, f"entries/{key}/manifest"), limits.meta)
        if hashlib.sha256(body).hexdigest() != listed["manifest_sha256"]:
            raise _Refused(f"entry {key[:12]}: its manifest does not match the index")
        try:
            manifest = decode_body(body, key)
        except CorruptError as e:
            raise _Refused(f"entry {key[:12]}: {e}") from None
        if len(manifest["parts"]) != listed["parts"]:
            raise _Refused(f"entry {key[:12]}: its manifest does not match the index")
        blobs = []
        for i, rec in enumerate(manifest["parts"]):
            part = _expect(tar.next(), f"entries/{key}/{i}")
            if part.size != rec["size"]:
                raise _Refused(
                    f"entry {key[:12]}: part {rec['name']!r} is truncated or resized "
                    f"({part.size} of {rec['size']} bytes)"
                )
            blob = _checked(tar, part, rec, limits.part, keep)
            if keep:
                blobs.append(blob)
        yield manifest, blobs
        header = tar.next()
    if header is not None:
        raise _Refused(f"unexpected member {header.name!r}")


def _checked(
    tar: _TarStream, header: _Header, rec: dict[str, Any], limit: int, keep: bool
) -> bytes:
    """A part's data hashed as it streams (kept only if `keep`), checked against `rec`."""
    digest = hashlib.sha256()
    kept = bytearray() if keep else None
    for chunk in tar.chunks(header, limit):
        digest.update(chunk)
        if kept is not None:
            kept += chunk
    if digest.hexdigest() != rec["sha256"]:
        raise _Refused(f"part {rec['name']!r} fails its sha256 check")
    return bytes(kept) if kept is not None else b""


def verify_archive(
    path: Path, limits: Limits, keys: list[bytes], trust: bool
) -> list[dict[str, Any]]:
    """Check a whole export without keeping its parts in memory.

    Args:
        path: the export.
        limits: what may be read.
        keys: the trusted public keys (raw).
        trust: accept it unsigned or signed by another key.

    Returns:
        The manifests of its entries, in order.

    Raises:
        CacheError: anything is wrong (the message says what).
    """
    with _open(path, limits) as tar:
        return [manifest for manifest, _ in _entries(tar, limits, keys, trust, keep=False)]


def read_archive(
    path: Path, manifests: list[dict[str, Any]], limits: Limits, keys: list[bytes], trust: bool
) -> Iterator[tuple[dict[str, Any], list[bytes]]]:
    """Entries of an export already passed by `verify_archive`, checked again as read.

    The second check guards against the file changing between verification and import.

    Yields:
        (manifest, part bytes in manifest order).

    Raises:
        CacheError: an entry no longer matches what was verified.
    """
    with _open(path, limits) as tar:
        entries = _entries(tar, limits, keys, trust, keep=True)
        for verified in manifests:
            manifest, blobs = next(entries, (None, []))
            if manifest != verified:
                raise _Refused(f"entry {verified['key'][:12]} changed during the import")
            yield manifest, blobs
