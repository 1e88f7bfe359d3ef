"""`CacheStore`: the private, checksummed, atomic, pickle-free cache of compiled artifacts.

On-disk layout::

    <cache dir>/                  mode 0700, owned by the user (refused otherwise)
      v1/                         one folder per SCHEMA_VERSION (a new layout = a new folder)
        cache.db (+ -wal, -shm)   diskcache's SQLite database
        ab/cd/<hex>.val           diskcache's files for values of 32 KiB and more

Inside the database an entry is a manifest, its parts and a last-use record (``index.py``).
A writer stores its parts under keys no reader knows yet, then, in one SQLite transaction,
checks they are all still there and swaps the manifest in; only after that commit does it
delete the parts of the manifest it replaced (``writer.py``). So an entry is visible only
when complete, and writers racing on one key end with exactly one good entry (the last to
commit). A reader checks every part's size and sha256; an entry that fails is dropped with a
`CacheWarning` and reported as a miss, unless the manifest changed under the reader (a
concurrent writer), in which case it reads again (``entries.py``).

`CacheStore` is the facade; each concern has a module of its own:

* ``location.py``: the default directory, the private-directory checks, opening storage.
* ``index.py``: storage keys; listing and removing entries.
* ``entries.py``: `Entry`, `EntrySummary`, reading and verifying an entry.
* ``writer.py``: writing an entry atomically.
* ``usage.py`` and ``eviction.py``: last-use times, LRU eviction.
* ``repair.py``: `VerifyReport`, verify and fix, orphan collection.
* ``transfer.py``: export and import archives (``archive.py``).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from litekiln import config
from litekiln.cache import eviction, index, repair, usage, writer
from litekiln.cache.backend import STORAGE_ERRORS, Backend, NullBackend
from litekiln.cache.entries import Entry, EntrySummary, describe, load, scan
from litekiln.cache.errors import CacheError
from litekiln.cache.keys import canonical_json, is_key, make_key
from litekiln.cache.location import UnusableDirectory, default_cache_dir, open_backend
from litekiln.cache.manifest import KINDS, encode_part
from litekiln.cache.problems import storage_errors, warn
from litekiln.cache.repair import VerifyReport
from litekiln.cache.writer import NewEntry

__all__ = [
    "ORPHAN_GRACE_S",
    "CacheStore",
    "Entry",
    "EntrySummary",
    "VerifyReport",
    "default_cache_dir",
]

#: Parts that no manifest references and that are older than this are garbage (a writer that
#: crashed between its parts and its manifest). Younger ones may belong to a writer at work.
ORPHAN_GRACE_S = 600.0


class CacheStore:
    """The cache of compiled models and device program binaries.

    Open it with `CacheStore.open`. A store is always usable: if its directory cannot be used
    safely it is *disabled* (every get misses, every put is skipped) and if it cannot be
    written it is *read-only*; `reason` says why. Nothing on the inference path raises for a
    storage problem: it warns (`CacheWarning`) and goes on uncached.

    Attributes:
        directory: the cache directory (the schema folder ``v1`` is inside).
        size_limit: bound in bytes of all entries; least recently used ones are evicted.
        reason: why the store is disabled or read-only, else None.
    """

    def __init__(
        self, directory: Path, backend: Backend, size_limit: int, reason: str | None = None
    ) -> None:
        self.directory = directory
        self.size_limit = size_limit
        self.reason = reason
        self._backend = backend
        self._said: set[str] = set()  # one warning per store for repeated skipped writes

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str] | None = None,
        size_limit: int | None = None,
        explicit: bool | None = None,
    ) -> CacheStore:
        """Open (creating with mode 0700 if needed) the cache in `directory`.

        Args:
            directory: the cache directory; None: `default_cache_dir()`.
            size_limit: bound in bytes; None: ``LITEKILN_CACHE_SIZE`` or its default.
            explicit: whether the user asked for this directory. An unsafe explicit directory
                raises; an unsafe default one warns and gives a disabled store. None: True
                when `directory` is given or ``LITEKILN_CACHE_DIR`` is set.

        Returns:
            A store: enabled, read-only or disabled (see `enabled`, `read_only`, `reason`).

        Raises:
            CacheError: `explicit` and the directory is owned by another user,
                group/other-writable, or not a directory.
        """
        if explicit is None:
            explicit = directory is not None or bool(config.CACHE_DIR.get())
        root = Path(directory).expanduser() if directory is not None else default_cache_dir()
        limit = config.CACHE_SIZE.get(size_limit)
        try:
            backend, why_read_only = open_backend(root)
        except CacheError as e:
            if explicit:
                raise
            warn(f"{e} Running without a cache.")
            return cls(root, NullBackend(), limit, reason=str(e))
        except UnusableDirectory as e:
            # Never fatal, even for an explicit directory: inference must go on.
            warn(f"{e}; running without a cache.")
            return cls(root, NullBackend(), limit, reason=str(e))
        if why_read_only:
            warn(f"litekiln cache is read-only: {why_read_only}; new results are not stored.")
        return cls(root, backend, limit, reason=why_read_only)

    @classmethod
    def disabled(cls, reason: str = "cache disabled") -> CacheStore:
        """A store that holds nothing (e.g. for ``LITEKILN_NO_CACHE``)."""
        return cls(Path(os.devnull), NullBackend(), 0, reason=reason)

    @property
    def enabled(self) -> bool:
        """False when the store holds nothing (unsafe or unusable directory)."""
        return not isinstance(self._backend, NullBackend)

    @property
    def read_only(self) -> bool:
        """True when entries can be read but not stored."""
        return self.enabled and not self._backend.writable

    def close(self) -> None:
        """Release the database connections (the store reopens them if used again)."""
        self._backend.close()

    def __enter__(self) -> CacheStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "disabled" if not self.enabled else "read-only" if self.read_only else "rw"
        return f"CacheStore({str(self.directory)!r}, {state})"

    # ------------------------------------------------------------------ get / put

    def get(self, key: str, kind: str | None = None) -> Entry | None:
        """The complete, verified entry stored under `key`, or None (a miss).

        A corrupt, truncated or partial entry is dropped with a `CacheWarning` and is a miss;
        so is any storage failure. A hit records its time for LRU eviction.

        Args:
            key: the entry's key (`make_key` of its fields).
            kind: if given, an entry of another kind is a miss.

        Returns:
            The entry, or None.

        Raises:
            ValueError: `key` is not a cache key (64 lowercase hex digits).
        """
        _check_key(key)
        if not self.enabled:
            return None
        try:
            loaded = load(self._backend, key)
        except STORAGE_ERRORS as e:
            warn(f"cannot read cache entry {key[:12]} in {self.directory}: {e}; recompiling.")
            return None
        if loaded.problem is not None:
            warn(
                f"cache entry {key[:12]} in {self.directory} is corrupt: {loaded.problem}; "
                "dropped, recompiling."
            )
            index.drop(self._backend, key, loaded.raw)
            return None
        entry = loaded.entry
        if entry is None or (kind is not None and entry.kind != kind):
            return None
        usage.touch(self._backend, key)
        return entry

    def put(
        self,
        key: str,
        fields: dict[str, Any],
        parts: Mapping[str, bytes | bytearray | memoryview | np.ndarray],
        *,
        kind: str = "model",
        meta: dict[str, Any] | None = None,
    ) -> bool:
        """Store an entry atomically: parts first, the manifest last, replacing any old one.

        Storage failures (full disk, read-only directory) warn and return False; nothing
        partial is left behind.

        Args:
            key: ``make_key(fields)``.
            fields: the key fields (kept in the manifest for ``ls``/``info``).
            parts: name -> bytes, or a numeric numpy array (stored raw, little-endian, with
                dtype and shape in the manifest; read back with `Entry.array`).
            kind: ``"model"`` (a compiled model) or ``"program"`` (a device binary).
            meta: JSON metadata kept in the manifest (launch plan, build log...).

        Returns:
            True if the entry was stored.

        Raises:
            ValueError: `key` is not ``make_key(fields)``, `kind` is unknown, or `meta` has
                NaN/infinity.
            TypeError: `fields`/`meta` are not JSON data, or a part is neither bytes nor a
                numeric array.
        """
        _check_key(key)
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if make_key(fields) != key:
            raise ValueError(f"cache key {key[:12]} is not make_key(fields)")
        meta = {} if meta is None else meta
        if not isinstance(meta, dict):
            raise TypeError(f"meta must be a dict, got {type(meta).__name__}")
        canonical_json(meta)  # fail here, in the caller's frame, not after writing parts
        encoded = [(name, *encode_part(name, value)) for name, value in parts.items()]
        if not self.enabled:
            return False
        if self.read_only:
            message = f"litekiln cache {self.directory} is read-only; not storing new entries."
            self._say_once("readonly", message)
            return False
        new = NewEntry(key, kind, fields, meta, parts=encoded, created=usage.now())
        return self._store(new)

    def delete(self, key: str) -> bool:
        """Remove the entry under `key` (e.g. one the caller found stale or unreadable).

        Like `get`/`put` it is safe on the inference path: a disabled or read-only store, or
        a storage failure, makes it return False (with a warning for the failure).

        Returns:
            True if an entry was removed.

        Raises:
            ValueError: `key` is not a cache key.
        """
        _check_key(key)
        if not self.enabled or self.read_only:
            return False
        try:
            if not index.has_entry(self._backend, key):
                return False
            # None for an unreadable row; drop matches it as such.
            raw = index.stored_manifest(self._backend, key)
        except STORAGE_ERRORS as e:
            warn(f"cannot delete cache entry {key[:12]}: {e}")
            return False
        return index.drop(self._backend, key, raw)

    # ------------------------------------------------------------------ management

    def ls(self) -> list[EntrySummary]:
        """Summaries of all entries, most recently used first.

        Entries whose manifest is damaged are left out (`verify` reports them).
        """
        if not self.enabled:
            return []
        with self._storage_errors("listing"):
            summaries = scan(self._backend)
        summaries.sort(key=lambda s: s.last_use, reverse=True)
        return summaries

    def info(self, key: str) -> dict[str, Any]:
        """Everything the manifest of one entry says (parts are not read).

        Args:
            key: a full key or a unique prefix of one.

        Returns:
            A JSON-ready dict: the `EntrySummary` fields plus ``meta`` and ``parts`` (name,
            size, sha256, dtype/shape for arrays), or ``{"key", "problem"}`` if the manifest
            is damaged.

        Raises:
            KeyError: no entry, or several, match `key`.
        """
        full = self.resolve(key)
        with self._storage_errors("info"):
            raw = index.stored_manifest(self._backend, full)
        if raw is None:
            raise KeyError(f"no cache entry matches {key!r}")
        return describe(self._backend, full, raw)

    def resolve(self, prefix: str) -> str:
        """The full key of the one entry whose key starts with `prefix`.

        Raises:
            KeyError: no entry, or several, match.
        """
        if not self.enabled or not prefix:
            raise KeyError(f"no cache entry matches {prefix!r}")
        with self._storage_errors("lookup"):
            matches = [k for k in index.entry_keys(self._backend) if k.startswith(prefix)]
        if not matches:
            raise KeyError(f"no cache entry matches {prefix!r}")
        if len(matches) > 1:
            raise KeyError(f"{prefix!r} is ambiguous: it matches {len(matches)} entries")
        return matches[0]

    def verify(self, fix: bool = False) -> VerifyReport:
        """Check every part of every entry against its checksum.

        Args:
            fix: delete bad entries and orphan parts older than `ORPHAN_GRACE_S`, and let
                diskcache repair its bookkeeping (ignored when read-only).

        Returns:
            A `VerifyReport` (``report.clean`` when nothing was wrong).
        """
        fixed = fix and self.enabled and not self.read_only
        if not self.enabled:
            return VerifyReport(fixed=fixed)
        with self._storage_errors("verify"):
            return repair.verify(self._backend, fixed, ORPHAN_GRACE_S)

    def prune(
        self,
        max_size: int | None = None,
        older_than: float | datetime.timedelta | None = None,
    ) -> list[str]:
        """Evict entries: those unused for `older_than`, then LRU down to `max_size`.

        Also deletes orphan parts older than `ORPHAN_GRACE_S`.

        Args:
            max_size: bound in bytes; None: `size_limit`.
            older_than: seconds (or a timedelta) since last use.

        Returns:
            The keys evicted.

        Raises:
            CacheError: the store is disabled or read-only, or the storage failed.
        """
        self._require_writable()
        if isinstance(older_than, datetime.timedelta):
            older_than = older_than.total_seconds()
        limit = self.size_limit if max_size is None else max_size
        with self._storage_errors("prune"):
            evicted = []
            if older_than is not None:
                evicted += eviction.evict_unused(self._backend, older_than)
            evicted += eviction.evict_to(self._backend, limit, protect=None)
            repair.collect_garbage(self._backend, ORPHAN_GRACE_S)
            return evicted

    def clear(self) -> int:
        """Delete every entry.

        Returns:
            How many entries there were.

        Raises:
            CacheError: the store is disabled or read-only, or the storage failed.
        """
        self._require_writable()
        with self._storage_errors("clear"):
            count = len(index.entry_keys(self._backend))
            self._backend.clear()
            return count

    def export(self, path: str | os.PathLike[str], keys: Iterable[str] | None = None) -> list[str]:
        """Write entries to one archive file (tar of JSON manifests and raw parts).

        Each entry is verified while read; a corrupt one is dropped with a warning and left
        out. The file appears atomically (written aside, then renamed).

        Args:
            path: the archive to write.
            keys: full keys or unique prefixes; None: every entry.

        Returns:
            The keys exported.

        Raises:
            CacheError: the store is disabled, or the archive cannot be written.
            KeyError: a key or prefix matches no entry (or several).
        """
        from litekiln.cache import transfer  # tarfile only when exporting

        if not self.enabled:
            raise CacheError(f"cannot export: the cache is disabled ({self.reason})")
        with self._storage_errors("export"):
            if keys is None:
                wanted = index.entry_keys(self._backend)
            else:
                wanted = [self.resolve(k) for k in keys]
        return transfer.export_archive(self._backend, self.directory, Path(path), wanted)

    def import_(self, path: str | os.PathLike[str]) -> list[str]:
        """Insert the entries of an archive written by `export`, after verifying all of it.

        Every manifest and part is checked (checksums, sizes, keys against fields) before
        anything is inserted; a damaged or modified archive inserts nothing. Checksums are not
        signatures: only import archives from a source you trust.

        Args:
            path: the archive.

        Returns:
            The keys imported (existing entries with those keys are replaced).

        Raises:
            CacheError: the archive is damaged, modified or not an export (nothing is
                inserted), the store is disabled or read-only, or storing failed (whatever
                was inserted is removed again).
        """
        from litekiln.cache import transfer  # tarfile only when importing

        self._require_writable()
        return transfer.import_archive(self._backend, Path(path), self._store)

    # ------------------------------------------------------------------ internals

    def _store(self, new: NewEntry) -> bool:
        """Write `new` within the size limit, then evict down to it; False if not stored."""
        if new.size > self.size_limit:
            warn(
                f"{new.kind} {new.key[:12]} ({new.size} bytes) exceeds the cache size limit "
                f"({self.size_limit} bytes); not stored."
            )
            return False
        try:
            if not writer.write(self._backend, new):
                return False
        except STORAGE_ERRORS as e:
            warn(
                f"could not store {new.kind} {new.key[:12]} in {self.directory}: {e}; "
                "continuing uncached."
            )
            return False
        try:
            eviction.evict_to(self._backend, self.size_limit, protect=new.key)
        except STORAGE_ERRORS as e:
            warn(f"could not evict old cache entries in {self.directory}: {e}")
        return True

    def _require_writable(self) -> None:
        if not self.enabled:
            raise CacheError(f"the cache is disabled: {self.reason}")
        if self.read_only:
            raise CacheError(f"the cache is read-only: {self.reason}")

    def _storage_errors(self, what: str) -> contextlib.AbstractContextManager[None]:
        return storage_errors(what, self.directory)

    def _say_once(self, topic: str, message: str) -> None:
        if topic not in self._said:
            self._said.add(topic)
            warn(message)


def _check_key(key: str) -> None:
    if not is_key(key):
        raise ValueError(f"not a cache key (64 lowercase hex digits): {key!r}")
