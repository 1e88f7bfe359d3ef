"""Where an entry lives in storage, and how one is listed and removed.

Storage keys inside the database (all values are bytes)::

    manifest:<key>                the entry's manifest (manifest.py), written last
    part:<key>:<nonce>:<i>        part i, written first; <nonce> = time_ns hex + random
    use:<key>                     last-use time (ASCII float) for LRU eviction (usage.py)

Removing an entry deletes its manifest in one transaction and its parts after that commit,
so that a concurrent reader sees a plain miss, never a part missing under a good manifest.
"""

from __future__ import annotations

import contextlib
import secrets
import time

from litekiln.cache.backend import STORAGE_ERRORS, Backend, UnsafeValueError
from litekiln.cache.manifest import CorruptError, decode_manifest, part_store_prefix
from litekiln.cache.problems import STORAGE_OR_UNSAFE, warn

MANIFEST = "manifest:"
USE = "use:"
PART = "part:"


def entry_keys(backend: Backend) -> list[str]:
    """The keys of every stored entry (every manifest), sorted."""
    return [k[len(MANIFEST) :] for k in backend.keys(MANIFEST)]


def has_entry(backend: Backend, key: str) -> bool:
    """Whether a manifest is stored under `key` (without reading it)."""
    return backend.contains(MANIFEST + key)


def stored_manifest(backend: Backend, key: str) -> bytes | None:
    """The stored manifest bytes of entry `key`; None if absent or not raw bytes."""
    try:
        return backend.get(MANIFEST + key)
    except UnsafeValueError:
        return None


def new_nonce() -> str:
    """A nonce for one write attempt: 16 hex digits of time_ns, then 8 random hex digits."""
    return f"{time.time_ns():016x}{secrets.token_hex(4)}"


def part_key(key: str, nonce: str, position: int) -> str:
    """Storage key of part number `position` of entry `key`, written by attempt `nonce`."""
    return f"{part_store_prefix(key)}{nonce}:{position}"


def nonce_time_ns(store_key: str) -> int:
    """When the part under `store_key` was written (time_ns); 0 if the key is not ours."""
    try:
        return int(store_key.split(":")[2][:16], 16)
    except (IndexError, ValueError):
        return 0  # not ours: old enough to collect


def parts_of(backend: Backend, key: str, raw: bytes | None) -> list[str]:
    """Storage keys of the parts a stored manifest owns (all of the key's if damaged)."""
    if raw is not None:
        try:
            return [rec["store"] for rec in decode_manifest(raw, key, backend.seal)["parts"]]
        except CorruptError:
            pass
    # A damaged manifest cannot say which parts are its own: take every part of this
    # key. A writer racing on this key then finds its parts gone and skips its commit.
    return backend.keys(part_store_prefix(key))


def discard(backend: Backend, store_keys: list[str]) -> None:
    """Best-effort removal of parts that no manifest will reference.

    Each part's file goes first, then its row: on a full disk deleting a row can fail (SQLite
    needs room in its journal), and the file is where the space is. A row left behind names
    a missing file; it is an orphan that the next open collects.
    """
    for store_key in store_keys:
        with contextlib.suppress(*STORAGE_ERRORS):
            backend.free_value_file(store_key)
        with contextlib.suppress(*STORAGE_ERRORS):
            backend.delete(store_key)


def drop(backend: Backend, key: str, raw: bytes | None) -> bool:
    """Delete entry `key` if its manifest is still `raw` (never a newer, good one).

    A failure warns (`CacheWarning`) and returns False.

    Returns:
        True if the entry was deleted.
    """
    if not backend.writable:
        return False
    try:
        with backend.transact():
            try:
                current = backend.get(MANIFEST + key)
            except UnsafeValueError:
                current = None  # as unreadable as when `raw` came back None
            if current != raw:
                return False
            parts = parts_of(backend, key, raw)
            backend.delete(MANIFEST + key)
            backend.delete(USE + key)
    except STORAGE_OR_UNSAFE as e:
        warn(f"could not drop cache entry {key[:12]}: {e}")
        return False
    # Parts after the manifest's removal is committed (see `writer.commit`): a concurrent
    # reader of this entry then sees a plain miss, not a corrupt entry.
    discard(backend, parts)
    return True


def remove(backend: Backend, key: str) -> None:
    """Delete entry `key` as it is stored now, if there is one.

    Raises:
        UnsafeValueError: its manifest row is not raw bytes.
        OSError, sqlite3.Error, diskcache.Timeout: the storage failed.
    """
    raw = backend.get(MANIFEST + key)
    if raw is not None:
        drop(backend, key, raw)
