"""Writing an entry atomically: its parts first, then its manifest in one transaction.

A writer stores its parts under keys no reader knows yet (a nonce of its own), then, in one
SQLite transaction, checks they are all still there and swaps the manifest in; only after
that commit does it delete the parts of the manifest it replaced. So an entry is visible only
when complete, and writers racing on one key end with exactly one good entry (the last to
commit).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from litekiln.cache.backend import STORAGE_ERRORS, Backend, UnsafeValueError
from litekiln.cache.index import MANIFEST, discard, new_nonce, part_key, parts_of
from litekiln.cache.manifest import SCHEMA_VERSION, encode_manifest
from litekiln.cache.problems import log
from litekiln.cache.usage import record_use


@dataclass
class NewEntry:
    """An entry to store: its manifest's fields and its encoded parts.

    Attributes:
        key: ``make_key(fields)``.
        kind: one of `manifest.KINDS`.
        fields: the key fields.
        meta: JSON metadata.
        parts: (name, stored bytes, ``{}`` or the array's dtype/shape) per part, in order.
        created: when first stored (Unix time).
    """

    key: str
    kind: str
    fields: dict[str, Any]
    meta: dict[str, Any]
    parts: list[tuple[str, bytes, dict[str, Any]]]
    created: float

    @property
    def size(self) -> int:
        """Total bytes of the parts."""
        return sum(len(data) for _, data, _ in self.parts)


def write(backend: Backend, new: NewEntry) -> bool:
    """Store `new`, replacing the entry under its key; nothing partial is left behind.

    Returns:
        True if stored; False if its parts were deleted before its manifest went in (a
        concurrent drop of this key), in which case nothing was stored.

    Raises:
        OSError, sqlite3.Error, diskcache.Timeout: the storage failed; the parts written so
            far are removed again.
    """
    # Each attempt writes under its own nonce, so racing writers never share a part.
    nonce = new_nonce()
    written: list[str] = []
    try:
        records = []
        for position, (name, data, extra) in enumerate(new.parts):
            store_key = part_key(new.key, nonce, position)
            backend.set(store_key, data)
            written.append(store_key)
            records.append(_part_record(name, store_key, data, extra))
        manifest = encode_manifest(_manifest(new, records), backend.seal)
        committed = commit(backend, new.key, manifest, written)
    except STORAGE_ERRORS:
        discard(backend, written)
        raise
    if not committed:
        discard(backend, written)
        log.debug("entry %s was dropped while being written; not stored", new.key[:12])
    return committed


def _part_record(name: str, store_key: str, data: bytes, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "store": store_key,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        **extra,
    }


def _manifest(new: NewEntry, records: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "schema": SCHEMA_VERSION,
        "key": new.key,
        "kind": new.kind,
        "fields": new.fields,
        "meta": new.meta,
        "created": new.created,
        "parts": records,
    }


def commit(backend: Backend, key: str, manifest: bytes, written: list[str]) -> bool:
    """Swap the manifest in; False if one of our parts vanished meanwhile.

    Raises:
        OSError, sqlite3.Error, diskcache.Timeout: the storage failed.
    """
    with backend.transact():
        # A concurrent drop of this key (corrupt entry) may have deleted our parts.
        if not all(backend.contains(k) for k in written):
            return False
        try:
            old = backend.get(MANIFEST + key)
        except UnsafeValueError:
            old = b""  # unreadable: its parts are found by prefix
        backend.set(MANIFEST + key, manifest)
        record_use(backend, key)
        stale = [] if old is None else [k for k in parts_of(backend, key, old) if k not in written]
    # The replaced entry's parts go only once the new manifest is committed: diskcache
    # removes a deleted value's file at once, even inside a transaction, so deleting them
    # before the commit would let a reader holding the old manifest find a part missing
    # while the manifest looks unchanged, and call a good entry corrupt.
    discard(backend, stale)
    return True
