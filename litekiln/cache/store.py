"""`CacheStore`: the private, checksummed, atomic, pickle-free cache of compiled artifacts.

On-disk layout::

    <cache dir>/                  mode 0700, owned by the user (refused otherwise)
      secret                      32 random bytes (0600) that sign every manifest (seal.py)
      v2/                         one folder per SCHEMA_VERSION (a new layout = a new folder)
        cache.db (+ -wal, -shm)   diskcache's SQLite database
        ab/cd/<hex>.val           diskcache's files for values of 32 KiB and more

Inside the database an entry is a manifest, its parts and a last-use record (``index.py``).
A writer stores its parts under keys no reader knows yet, then, in one SQLite transaction,
checks they are all still there and swaps the manifest in; only after that commit does it
delete the parts of the manifest it replaced (``writer.py``). So an entry is visible only
when complete, and writers racing on one key end with exactly one good entry (the last to
commit). A reader checks the manifest's signature (HMAC with the cache's secret) and every
part's size and sha256; an entry that fails is dropped with a `CacheWarning` and reported as a
miss, unless the manifest changed under the reader (a concurrent writer), in which case it
reads again (``entries.py``).

The store heals: a failed write removes what it wrote (files first, which frees the space),
a write that would leave the disk nearly full is skipped, orphan parts of crashed writers are
collected a bounded slice per open, a damaged database is started afresh keeping what still
passes every check (``recovery.py``), and ``clear``, ``prune`` and ``verify --fix`` work on a
damaged or full store. No path leaves the cache directory: links inside it are not followed.

`CacheStore` is the facade; each concern has a module of its own:

* ``location.py``: the default directory, the private-directory checks, opening storage.
* ``seal.py``: the cache's secret and the manifests' HMAC.
* ``recovery.py``: starting a damaged (or cleared) schema folder afresh.
* ``index.py``: storage keys; listing and removing entries.
* ``entries.py``: `Entry`, `EntrySummary`, reading and verifying an entry.
* ``writer.py``: writing an entry atomically.
* ``usage.py`` and ``eviction.py``: last-use times, LRU eviction.
* ``repair.py``: `VerifyReport`, verify and fix, orphan collection.
* ``transfer.py``: export and import archives (``archive.py``), signed with Ed25519
  (``signing.py``).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from litekiln import config
from litekiln.cache import eviction, index, recovery, repair, usage, writer
from litekiln.cache.backend import STORAGE_ERRORS, Backend, NullBackend, is_damaged, is_full
from litekiln.cache.entries import Entry, EntrySummary, describe, load, needed, scan
from litekiln.cache.errors import CacheError
from litekiln.cache.keys import canonical_json, is_key, make_key
from litekiln.cache.location import (
    Opened,
    UnusableDirectory,
    default_cache_dir,
    open_backend,
    open_writable,
)
from litekiln.cache.manifest import KINDS, encode_part
from litekiln.cache.problems import STORAGE_OR_UNSAFE, log, warn
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
ORPHAN_GRACE_S = repair.ORPHAN_GRACE_S

#: What one open spends on collecting orphan parts at most: parts looked at, and seconds.
#: The rest is collected by the next opens (the scan resumes where it stopped).
ORPHAN_SCAN_PARTS = 1000
ORPHAN_SCAN_S = 0.02

#: Free space a write never takes (so that SQLite, and the next open, always have room):
#: 1% of the disk, at least 256 KiB and at most 64 MiB.
RESERVE_MIN, RESERVE_MAX = 256 << 10, 64 << 20
#: Free space a write that found the disk full makes, evicting LRU entries (at least).
HEADROOM = 256 << 10

T = TypeVar("T")

# What can stop the storage from being opened (again) for writing.
_REOPEN_ERRORS: tuple[type[BaseException], ...] = (*STORAGE_ERRORS, UnusableDirectory)


class CacheStore:
    """The cache of compiled models and device program binaries.

    Open it with `CacheStore.open`. A store is always usable: if its directory cannot be used
    safely it is *disabled* (every get misses, every put is skipped) and if it cannot be
    written it is *read-only*; `reason` says why. Nothing on the inference path raises for a
    storage problem: it warns (`CacheWarning`) and goes on uncached.

    Attributes:
        directory: the cache directory (the schema folder ``v2`` is inside).
        size_limit: bound in bytes of all entries; least recently used ones are evicted.
        reason: why the store is disabled or read-only, else None.
    """

    def __init__(
        self,
        directory: Path,
        backend: Backend,
        size_limit: int,
        reason: str | None = None,
        opened: Opened | None = None,
    ) -> None:
        self.directory = directory
        self.size_limit = size_limit
        self.reason = reason
        self._backend = backend
        self._opened = opened
        self._folder = None if opened is None else recovery.folder_id(opened.data)
        self._said: set[str] = set()  # one warning per store for repeated skipped writes
        # What was repaired on the way (verify reports it).
        self._events: list[str] = [] if opened is None else list(opened.repairs)

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str] | None = None,
        size_limit: int | None = None,
        explicit: bool | None = None,
    ) -> CacheStore:
        """Open (creating with mode 0700 if needed) the cache in `directory`.

        A damaged database is started afresh (keeping the entries that pass every check),
        and a bounded slice of orphan parts is collected, each time with a warning for what
        was lost.

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
                group/other-writable, not a directory, or a link to nothing.
        """
        if explicit is None:
            explicit = directory is not None or bool(config.CACHE_DIR.get())
        root = Path(directory).expanduser() if directory is not None else default_cache_dir()
        limit = config.CACHE_SIZE.get(size_limit)
        try:
            opened = open_backend(root)
        except CacheError as e:
            if explicit:
                raise
            warn(f"{e} Running without a cache.")
            return cls(root, NullBackend(), limit, reason=str(e))
        except UnusableDirectory as e:
            # Never fatal, even for an explicit directory: inference must go on.
            warn(f"{e}; running without a cache.")
            return cls(root, NullBackend(), limit, reason=str(e))
        if opened.read_only:
            warn(f"litekiln cache is read-only: {opened.read_only}; new results are not stored.")
        store = cls(root, opened.backend, limit, reason=opened.read_only, opened=opened)
        store._collect_orphans()
        return store

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

        A corrupt, truncated, partial or tampered entry (one whose manifest fails its HMAC)
        is dropped with a `CacheWarning` and is a miss; so is any storage failure. A hit
        records its time for LRU eviction.

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
            if not self._damaged(e):
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
        partial is left behind. A write that would leave less than a reserve of the disk free
        is skipped the same way.

        Args:
            key: ``make_key(fields)``.
            fields: the key fields (kept in the manifest for ``ls``/``info``).
            parts: name -> bytes, or a numeric numpy array (stored raw, little-endian, with
                dtype and shape in the manifest; read back with `Entry.array`).
            kind: ``"model"`` (a compiled model), ``"program"`` (a device binary),
                ``"weights"`` (a constant compiled models share) or ``"device"`` (a GPU
                record).
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

    def has(self, key: str) -> bool:
        """Whether an entry is stored under `key` (its manifest is not read or checked: `get`
        does that). False for a disabled store or a storage failure.

        Raises:
            ValueError: `key` is not a cache key.
        """
        _check_key(key)
        if not self.enabled:
            return False
        try:
            return index.has_entry(self._backend, key)
        except STORAGE_ERRORS:
            return False

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
            if not self._damaged(e):
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
        summaries = self._managed("listing", lambda: scan(self._backend))
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
        raw = self._managed("info", lambda: index.stored_manifest(self._backend, full))
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
        keys = self._managed("lookup", lambda: index.entry_keys(self._backend))
        matches = [k for k in keys if k.startswith(prefix)]
        if not matches:
            raise KeyError(f"no cache entry matches {prefix!r}")
        if len(matches) > 1:
            raise KeyError(f"{prefix!r} is ambiguous: it matches {len(matches)} entries")
        return matches[0]

    def verify(self, fix: bool = False) -> VerifyReport:
        """Check every entry: its manifest's signature and every part's size and sha256.

        A damaged database is started afresh (what it lost is in ``report.storage``); on a
        full disk `fix` first removes the files of bad entries and orphans to make room.

        Args:
            fix: delete bad entries and orphan parts older than `ORPHAN_GRACE_S`, remove
                links and special files found inside the cache, and let diskcache repair
                its bookkeeping (ignored when read-only).

        Returns:
            A `VerifyReport` (``report.clean`` when nothing was wrong).

        Raises:
            CacheError: the storage failed, or `fix` on a full disk found nothing to free.
        """
        if fix and self._full:
            self._regain_write("verify --fix", self._free_bad)  # else: a read-only check
        fixed = fix and self.enabled and not self.read_only
        if not self.enabled:
            return VerifyReport(fixed=fixed)
        report = self._managed(
            "verify", lambda: repair.verify(self._backend, fixed, ORPHAN_GRACE_S)
        )
        report.storage[:0] = self._events
        self._events = []
        return report

    def prune(
        self,
        max_size: int | None = None,
        older_than: float | datetime.timedelta | None = None,
    ) -> list[str]:
        """Evict entries: those unused for `older_than`, then LRU down to `max_size`.

        Also deletes orphan parts older than `ORPHAN_GRACE_S`. On a full disk the files of
        the entries to evict go first, to make room for the database's own bookkeeping.

        Args:
            max_size: bound in bytes; None: `size_limit`.
            older_than: seconds (or a timedelta) since last use.

        Returns:
            The keys evicted.

        Raises:
            CacheError: the store is disabled or read-only, or the storage failed.
        """
        if isinstance(older_than, datetime.timedelta):
            older_than = older_than.total_seconds()
        limit = self.size_limit if max_size is None else max_size
        chosen: list[str] = []
        if self._full:

            def free(view: Backend) -> int:
                chosen.extend(eviction.choose(view, limit, older_than))
                return sum(_free_entry_files(view, key) for key in chosen)

            if not self._regain_write("prune", free):
                raise CacheError(
                    f"cannot prune {self.directory}: the disk is full and removing the files "
                    "of the entries to evict did not make room for the database. "
                    "`litekiln cache clear` always works."
                )
        self._require_writable()

        def run() -> list[str]:
            evicted = []
            for key in chosen:
                index.remove(self._backend, key)
                evicted.append(key)
            if older_than is not None:
                evicted += eviction.evict_unused(self._backend, older_than)
            evicted += eviction.evict_to(self._backend, limit, protect=None)
            repair.collect_garbage(self._backend, ORPHAN_GRACE_S)
            return evicted

        return self._managed("prune", run)

    def clear(self) -> int:
        """Delete every entry: the schema folder is started afresh.

        Works on a damaged database and on a full disk (renaming the folder aside needs no
        space); never deletes anything outside the cache directory.

        Returns:
            How many entries there were (0 if the database could not be read).

        Raises:
            CacheError: the store is disabled, or the directory cannot be written.
        """
        if not self.enabled or self._opened is None:
            raise CacheError(f"the cache is disabled: {self.reason}")
        if self.read_only and not self._full:
            raise CacheError(f"the cache is read-only: {self.reason}")
        count = 0
        with contextlib.suppress(*STORAGE_OR_UNSAFE):
            count = len(index.entry_keys(self._backend))
        self._afresh(salvage=False, what="clear")
        return count

    def export(
        self,
        path: str | os.PathLike[str],
        keys: Iterable[str] | None = None,
        *,
        sign_key: str | os.PathLike[str] | None = None,
        unsigned: bool = False,
    ) -> list[str]:
        """Write entries to one archive file (tar of JSON manifests and raw parts), signed
        with an Ed25519 key.

        Each entry is verified while read; a corrupt one is dropped with a warning and left
        out. The file appears atomically (written aside, then renamed).

        Args:
            path: the archive to write.
            keys: full keys or unique prefixes; None: every entry. The entries these need
                (``meta["needs"]``: the shared constants of a compiled model) go with them.
            sign_key: the private key file to sign with (``litekiln cache keygen``); None:
                ``LITEKILN_SIGN_KEY``.
            unsigned: write an unsigned export when there is no key (only
                ``import_(trust=True)`` accepts it).

        Returns:
            The keys exported.

        Raises:
            CacheError: the store is disabled, there is no signing key and not `unsigned`,
                the key cannot be read, or the archive cannot be written.
            KeyError: a key or prefix matches no entry (or several).
        """
        from litekiln.cache import signing, transfer  # tarfile and cryptography: only here

        if not self.enabled:
            raise CacheError(f"cannot export: the cache is disabled ({self.reason})")
        signer = signing.signer(sign_key, unsigned)
        if keys is None:
            wanted = self._managed("export", lambda: index.entry_keys(self._backend))
        else:
            chosen = [self.resolve(k) for k in keys]
            wanted = self._managed("export", lambda: needed(self._backend, chosen))
        return transfer.export_archive(self._backend, self.directory, Path(path), wanted, signer)

    def import_(
        self,
        path: str | os.PathLike[str],
        *,
        trusted_keys: Sequence[str | os.PathLike[str]] | None = None,
        trust: bool = False,
    ) -> list[str]:
        """Insert the entries of an archive written by `export`, after verifying all of it.

        The export must be signed by a trusted key, unless `trust`. Every manifest and part is
        checked (signature, checksums, sizes, keys against fields) before anything is
        inserted; a damaged or modified archive inserts nothing. The archive is read as a
        stream, each member's size checked against limits before it is decompressed.
        Imported entries are signed with this cache's own secret.

        Args:
            path: the archive.
            trusted_keys: public key files whose signatures are accepted; None:
                ``LITEKILN_TRUSTED_KEYS``.
            trust: accept an unsigned export, or one signed by an unknown key (the caller
                vouches for where it came from; docs/security.md).

        Returns:
            The keys imported (existing entries with those keys are replaced).

        Raises:
            CacheError: the file does not exist; the archive is unsigned or signed by an
                untrusted key (and not `trust`), damaged, modified, too large or not an
                export (nothing is inserted); the store is disabled or read-only; or storing
                failed (whatever was inserted is removed again).
        """
        from litekiln.cache import archive, signing, transfer  # only when importing

        if not os.path.exists(path):
            raise CacheError(f"cannot import {path}: the file does not exist")
        self._require_writable()
        keys = signing.trusted(trusted_keys)
        limits = archive.Limits.for_cache(self.size_limit)
        return transfer.import_archive(
            self._backend, Path(path), self._store, keys, trust=trust, limits=limits
        )

    # ------------------------------------------------------------------ internals

    @property
    def _full(self) -> bool:
        return self.read_only and self._opened is not None and self._opened.full

    def _store(self, new: NewEntry) -> bool:
        """Write `new` within the size limit, then evict down to it; False if not stored."""
        if new.size > self.size_limit:
            warn(
                f"{new.kind} {new.key[:12]} ({new.size} bytes) exceeds the cache size limit "
                f"({self.size_limit} bytes); not stored."
            )
            return False
        if not self._room_for(new.size):
            return False
        for attempt in (0, 1):
            try:
                if not writer.write(self._backend, new):
                    return False
                break
            except STORAGE_ERRORS as e:
                if attempt == 0 and self._damaged(e):
                    continue  # started afresh: write it there
                warn(
                    f"could not store {new.kind} {new.key[:12]} in {self.directory}: {e}; "
                    "continuing uncached."
                )
                if is_full(e):
                    self._make_headroom()
                return False
        try:
            eviction.evict_to(self._backend, self.size_limit, protect=new.key)
        except STORAGE_ERRORS as e:
            warn(f"could not evict old cache entries in {self.directory}: {e}")
        return True

    def _space(self) -> tuple[int, int] | None:
        """(free bytes, bytes a write must leave free) on the cache's disk; None if unknown."""
        where = self._backend.directory
        if where is None:
            return None
        try:
            disk = shutil.disk_usage(where)
        except OSError:
            return None
        return disk.free, min(max(RESERVE_MIN, disk.total // 100), RESERVE_MAX)

    def _room_for(self, size: int) -> bool:
        """Whether `size` more bytes leave the disk's reserve free (else warn once)."""
        space = self._space()
        if space is None:
            return True
        free, reserve = space
        if free - size >= reserve:
            return True
        self._say_once(
            "space",
            f"not enough free space for the litekiln cache in {self.directory} "
            f"({free} bytes free, {size} needed, {reserve} kept free); not storing "
            "new entries. `litekiln cache prune` makes room.",
        )
        return False

    def _make_headroom(self) -> None:
        """After a write found the disk full (and removed what it wrote): evict least
        recently used entries until the reserve is free again, so that the database -- and
        the next open -- have room. Each entry's files go first: they hold the space."""
        evicted = 0
        try:
            for summary in sorted(scan(self._backend), key=lambda s: s.last_use):
                space = self._space()
                if space is None or space[0] >= max(2 * space[1], HEADROOM):
                    break
                _free_entry_files(self._backend, summary.key)
                index.remove(self._backend, summary.key)
                evicted += 1
        except STORAGE_OR_UNSAFE as e:
            log.debug("making room in %s failed: %s", self.directory, e)
        if evicted:
            warn(
                f"the disk under the litekiln cache {self.directory} is full: evicted the "
                f"{evicted} least recently used entries to leave room.",
                4,
            )

    def _collect_orphans(self) -> None:
        if not self.enabled or self.read_only:
            return
        try:
            n = repair.collect_orphans(
                self._backend, ORPHAN_GRACE_S, ORPHAN_SCAN_PARTS, ORPHAN_SCAN_S
            )
        except STORAGE_OR_UNSAFE as e:
            if not self._damaged(e):
                log.debug("orphan collection in %s failed: %s", self.directory, e)
            return
        if n:
            log.info("collected %d orphan cache parts in %s", n, self.directory)

    def _damaged(self, e: BaseException) -> bool:
        """If `e` says the database is damaged, start it afresh (salvaging what passes
        every check) with a warning. Returns whether it did."""
        if not is_damaged(e) or self._opened is None or not self._backend.writable:
            return False
        self._afresh(salvage=True, what=f"damaged ({e})")
        return True

    def _afresh(self, salvage: bool, what: str) -> None:
        """Start the schema folder afresh (`recovery.start_afresh`)."""
        assert self._opened is not None
        opened = self._opened
        try:
            backend, recovered = recovery.start_afresh(
                opened.root,
                opened.data,
                lambda: open_writable(opened),
                self._backend,
                salvage,
                self._folder,
            )
        except _REOPEN_ERRORS as e:
            self._backend = NullBackend()
            self.reason = f"cannot start the cache afresh: {e}"
            raise CacheError(f"cache {what}: {self.reason}") from e
        self._backend = backend
        self._folder = recovery.folder_id(opened.data)
        self._opened = Opened(backend, opened.root, opened.data)
        self.reason = None
        if salvage:
            message = (
                f"cache database in {self.directory} is {what}: started it afresh, "
                f"{recovered} entries recovered."
            )
            self._events.append(message)
            warn(message, 4)

    def _regain_write(self, what: str, free: Callable[[Backend], int]) -> bool:
        """On a full disk: remove files with `free` (on the read-only view), then reopen
        for writing. Returns whether the store is writable again."""
        assert self._opened is not None
        freed = self._managed(what, lambda: free(self._backend))
        try:
            backend = open_writable(self._opened)
        except _REOPEN_ERRORS as e:
            log.debug("cache %s: %d files removed, still no room: %s", what, freed, e)
            return False
        self._backend.close()
        self._backend = backend
        self._opened = Opened(backend, self._opened.root, self._opened.data)
        self.reason = None
        return True

    def _free_bad(self, view: Backend) -> int:
        """Files of orphan parts and of bad entries, removed from the read-only view."""
        freed = repair.collect_orphans(view, ORPHAN_GRACE_S, 1 << 30, 5.0)
        report = repair.verify(view, False, ORPHAN_GRACE_S)
        return freed + sum(_free_entry_files(view, key) for key in report.bad)

    def _require_writable(self) -> None:
        if not self.enabled:
            raise CacheError(f"the cache is disabled: {self.reason}")
        if self.read_only:
            raise CacheError(f"the cache is read-only: {self.reason}")

    def _managed(self, what: str, run: Callable[[], T]) -> T:
        """`run()` for a management command: a damaged database is started afresh and
        `run` tried again; any other storage failure is one `CacheError`."""
        for attempt in (0, 1):
            try:
                return run()
            except STORAGE_OR_UNSAFE as e:
                if attempt == 0 and self._damaged(e):
                    continue
                raise CacheError(f"cache {what} failed in {self.directory}: {e}") from e
        raise AssertionError("unreachable")

    def _say_once(self, topic: str, message: str) -> None:
        if topic not in self._said:
            self._said.add(topic)
            warn(message)


def _free_entry_files(view: Backend, key: str) -> int:
    raw = index.stored_manifest(view, key)
    parts = index.parts_of(view, key, raw)
    for part in parts:
        view.free_value_file(part)
    return len(parts)


def _check_key(key: str) -> None:
    if not is_key(key):
        raise ValueError(f"not a cache key (64 lowercase hex digits): {key!r}")
