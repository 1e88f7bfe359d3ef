"""`CacheStore`: the private, checksummed, atomic, pickle-free cache of compiled artifacts.

On-disk layout::

    <cache dir>/                  mode 0700, owned by the user (refused otherwise)
      v1/                         one folder per SCHEMA_VERSION (a new layout = a new folder)
        cache.db (+ -wal, -shm)   diskcache's SQLite database
        ab/cd/<hex>.val           diskcache's files for values of 32 KiB and more

Storage keys inside the database (all values are bytes)::

    manifest:<key>                the entry's manifest (manifest.py), written last
    part:<key>:<nonce>:<i>        part i, written first; <nonce> = time_ns hex + random
    use:<key>                     last-use time (ASCII float) for LRU eviction

A writer stores its parts under keys no reader knows yet, then, in one SQLite transaction,
checks they are all still there and swaps the manifest in; only after that commit does it
delete the parts of the manifest it replaced. So an entry is visible only when complete,
and writers racing on one key end with exactly one good entry (the last to commit). A reader
checks every part's size and sha256; an entry that fails is dropped with a `CacheWarning` and
reported as a miss, unless the manifest changed under the reader (a concurrent writer), in
which case it reads again.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import logging
import os
import secrets
import stat
import time
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from litekiln import config
from litekiln.cache.backend import (
    DBNAME,
    STORAGE_ERRORS,
    Backend,
    DiskcacheBackend,
    NullBackend,
    ReadOnlyBackend,
    UnsafeValueError,
)
from litekiln.cache.errors import CacheError, CacheWarning
from litekiln.cache.keys import canonical_json, is_key, make_key
from litekiln.cache.manifest import (
    KINDS,
    SCHEMA_VERSION,
    CorruptError,
    check_part,
    decode_array,
    decode_manifest,
    encode_manifest,
    encode_part,
    part_store_prefix,
)

log = logging.getLogger("litekiln.cache")

_MANIFEST = "manifest:"
_USE = "use:"
_PART = "part:"

#: Parts that no manifest references and that are older than this are garbage (a writer that
#: crashed between its parts and its manifest). Younger ones may belong to a writer at work.
ORPHAN_GRACE_S = 600.0


def _now() -> float:
    # One place to read the clock, so that tests can drive LRU order deterministically.
    return time.time()


def _warn(message: str) -> None:
    log.warning(message)
    warnings.warn(message, CacheWarning, stacklevel=3)


def default_cache_dir() -> Path:
    """The cache directory used when none is given.

    Returns:
        ``$LITEKILN_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/litekiln`` (XDG: only an
        absolute path counts), else ``~/.cache/litekiln``.
    """
    env = config.CACHE_DIR.get()
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "litekiln"
    return Path.home() / ".cache" / "litekiln"


class _Unusable(Exception):
    """The directory cannot hold a cache (cannot be created, not writable and empty...)."""


def _make_private_dir(path: Path) -> None:
    """Create `path` (and missing parents) with mode 0700 if it does not exist.

    Raises:
        _Unusable: it cannot be created.
    """
    if path.exists():
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700)
        # mkdir's mode passes through the umask, which can only remove bits; set it exactly.
        os.chmod(path, 0o700)
    except FileExistsError:
        pass  # another process created it first; it is checked like any existing folder
    except OSError as e:
        raise _Unusable(f"cannot create cache directory {path}: {e.strerror or e}") from None


def _check_private(path: Path) -> None:
    """Refuse a directory that someone else could have planted compiled code in.

    Raises:
        CacheError: `path` is not a directory, is owned by another user, or is group- or
            other-writable.
    """
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise CacheError(f"cache directory {path} is not a directory")
    if not hasattr(os, "getuid"):
        return  # no POSIX owners (Windows): the user profile's ACLs are all we have
    uid = os.getuid()
    if st.st_uid != uid:
        raise CacheError(
            f"cache directory {path} is owned by uid {st.st_uid}, not by you (uid {uid}); "
            "litekiln only loads compiled code from a directory you own. Choose another "
            "directory (LITEKILN_CACHE_DIR) or remove this one."
        )
    if st.st_mode & 0o022:
        raise CacheError(
            f"cache directory {path} is group- or other-writable (mode "
            f"{stat.S_IMODE(st.st_mode):04o}); other users could plant compiled code there. "
            f"Fix it with: chmod 700 {path}"
        )


def _open_backend(root: Path) -> tuple[Backend, str | None]:
    """Open storage under `root`: read-write if possible, else read-only.

    Returns:
        (backend, why it is read-only or None).

    Raises:
        CacheError: `root` (or its schema folder) is unsafe (see `_check_private`).
        _Unusable: nothing usable there.
    """
    _make_private_dir(root)
    _check_private(root)
    data = root / f"v{SCHEMA_VERSION}"
    failure: BaseException | None = None
    if os.access(root, os.W_OK | os.X_OK):
        try:
            _make_private_dir(data)
            _check_private(data)
            return DiskcacheBackend(data), None
        except CacheError:
            raise
        except (_Unusable, *STORAGE_ERRORS) as e:
            failure = e  # e.g. a read-only file system that access() did not see
    if not (data / DBNAME).is_file():
        raise _Unusable(f"cache directory {root} is not writable and holds no cache")
    _check_private(data)
    try:
        backend = ReadOnlyBackend(data)
    except STORAGE_ERRORS as e:
        raise _Unusable(f"cannot read cache database in {data}: {e}") from None
    why = f"cannot write to {root}" + (f" ({failure})" if failure else "")
    return backend, why


class Entry:
    """A complete, verified cache entry: its manifest and its parts' bytes.

    Every part was checked against its size and sha256 before the entry was returned.
    Treat the manifest and the returned bytes/arrays as read-only.
    """

    def __init__(self, manifest: dict[str, Any], parts: dict[str, bytes]) -> None:
        self.manifest = manifest
        self._records = {rec["name"]: rec for rec in manifest["parts"]}
        self._parts = parts

    @property
    def key(self) -> str:
        """The entry's cache key."""
        return str(self.manifest["key"])

    @property
    def kind(self) -> str:
        """``"model"`` or ``"program"``."""
        return str(self.manifest["kind"])

    @property
    def fields(self) -> dict[str, Any]:
        """The key fields the entry was stored with."""
        return dict(self.manifest["fields"])

    @property
    def meta(self) -> dict[str, Any]:
        """The JSON metadata the entry was stored with."""
        return dict(self.manifest["meta"])

    @property
    def created(self) -> float:
        """When the entry was first stored (Unix time)."""
        return float(self.manifest["created"])

    @property
    def part_names(self) -> list[str]:
        """Names of the parts, in the order they were stored."""
        return list(self._records)

    @property
    def size(self) -> int:
        """Total bytes of the parts."""
        return sum(len(b) for b in self._parts.values())

    def part(self, name: str) -> bytes:
        """The bytes of part `name` (for an array part: its raw little-endian data).

        Raises:
            KeyError: no part of that name.
        """
        return self._parts[name]

    def array(self, name: str) -> np.ndarray:
        """Part `name` as the numpy array it was stored from (read-only, no copy).

        Raises:
            KeyError: no part of that name.
            ValueError: the part was stored as bytes, not as an array.
        """
        return decode_array(self._records[name], self._parts[name])

    def __repr__(self) -> str:
        return f"Entry({self.kind} {self.key[:12]}, parts={self.part_names})"


@dataclass(frozen=True)
class EntrySummary:
    """One line of `CacheStore.ls`.

    Attributes:
        key: the full cache key.
        kind: ``"model"`` or ``"program"``.
        token: ``fields["token"]`` if present.
        model_name: ``fields["model_name"]``, else ``meta["model_name"]``, if present.
        options: ``fields["options"]`` if present.
        size: bytes held (manifest and parts).
        created: when stored (Unix time).
        last_use: last hit, or `created` (Unix time).
        fields: every key field.
    """

    key: str
    kind: str
    token: Any
    model_name: Any
    options: Any
    size: int
    created: float
    last_use: float
    fields: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict of the summary."""
        return asdict(self)


@dataclass
class VerifyReport:
    """What `CacheStore.verify` found.

    Attributes:
        entries: how many entries were checked.
        bad: key -> problem, for each entry that failed a check.
        orphan_parts: stored parts that no entry references (crashed or racing writers).
        storage: problems diskcache/SQLite found (database integrity, stray or missing files).
        fixed: whether problems were repaired (bad entries and old orphans deleted).
    """

    entries: int = 0
    bad: dict[str, str] = field(default_factory=dict)
    orphan_parts: int = 0
    storage: list[str] = field(default_factory=list)
    fixed: bool = False

    @property
    def clean(self) -> bool:
        """True when nothing at all was wrong."""
        return not self.bad and not self.orphan_parts and not self.storage

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict of the report, with ``clean``."""
        return {**asdict(self), "clean": self.clean}


@dataclass
class _Loaded:
    raw: bytes | None = None  # the manifest bytes read (None: no entry)
    entry: Entry | None = None
    problem: str | None = None


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
            backend, why_read_only = _open_backend(root)
        except CacheError as e:
            if explicit:
                raise
            _warn(f"{e} Running without a cache.")
            return cls(root, NullBackend(), limit, reason=str(e))
        except _Unusable as e:
            # Never fatal, even for an explicit directory: inference must go on.
            _warn(f"{e}; running without a cache.")
            return cls(root, NullBackend(), limit, reason=str(e))
        if why_read_only:
            _warn(f"litekiln cache is read-only: {why_read_only}; new results are not stored.")
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
            loaded = self._load(key)
        except STORAGE_ERRORS as e:
            _warn(f"cannot read cache entry {key[:12]} in {self.directory}: {e}; recompiling.")
            return None
        if loaded.problem is not None:
            _warn(
                f"cache entry {key[:12]} in {self.directory} is corrupt: {loaded.problem}; "
                "dropped, recompiling."
            )
            self._drop(key, loaded.raw)
            return None
        entry = loaded.entry
        if entry is None or (kind is not None and entry.kind != kind):
            return None
        self._touch(key)
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
        return self._put(key, kind, fields, meta, encoded, created=_now())

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
            if not self._backend.contains(_MANIFEST + key):
                return False
            raw = self._raw(key)  # None for an unreadable row; _drop matches it as such
        except STORAGE_ERRORS as e:
            _warn(f"cannot delete cache entry {key[:12]}: {e}")
            return False
        return self._drop(key, raw)

    # ------------------------------------------------------------------ management

    def ls(self) -> list[EntrySummary]:
        """Summaries of all entries, most recently used first.

        Entries whose manifest is damaged are left out (`verify` reports them).
        """
        if not self.enabled:
            return []
        with self._storage_errors("listing"):
            summaries = self._scan()
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
            raw = self._raw(full)
        if raw is None:
            raise KeyError(f"no cache entry matches {key!r}")
        try:
            manifest = decode_manifest(raw, full)
        except CorruptError as e:
            return {"key": full, "problem": str(e)}
        info = self._summary(manifest, len(raw)).as_dict()
        info["meta"] = manifest["meta"]
        info["parts"] = [
            {k: v for k, v in rec.items() if k != "store"} for rec in manifest["parts"]
        ]
        return info

    def resolve(self, prefix: str) -> str:
        """The full key of the one entry whose key starts with `prefix`.

        Raises:
            KeyError: no entry, or several, match.
        """
        if not self.enabled or not prefix:
            raise KeyError(f"no cache entry matches {prefix!r}")
        with self._storage_errors("lookup"):
            matches = [k for k in self._keys() if k.startswith(prefix)]
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
        report = VerifyReport(fixed=fix and self.enabled and not self.read_only)
        if not self.enabled:
            return report
        with self._storage_errors("verify"):
            referenced: set[str] = set()
            for key in self._keys():
                loaded = self._load(key)
                if loaded.raw is None and loaded.problem is None:
                    continue  # deleted meanwhile
                report.entries += 1
                if loaded.problem is not None:
                    report.bad[key] = loaded.problem
                    if report.fixed:
                        self._drop(key, loaded.raw)
                elif loaded.entry is not None:
                    referenced.update(rec["store"] for rec in loaded.entry.manifest["parts"])
            orphans = [k for k in self._backend.keys(_PART) if k not in referenced]
            report.orphan_parts = len(orphans)
            if report.fixed:
                self._delete_orphans(orphans)
                self._delete_stale_uses()
            report.storage = self._backend.check(fix=report.fixed)
        return report

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
                cutoff = _now() - older_than
                for s in self._scan():
                    if s.last_use < cutoff:
                        self._evict(s.key)
                        evicted.append(s.key)
            evicted += self._evict_to(limit, protect=None)
            # Parts of damaged entries count as referenced here: verify(fix=True) judges those.
            referenced = {k for key in self._keys() for k in self._parts_of(key, self._raw(key))}
            self._delete_orphans([k for k in self._backend.keys(_PART) if k not in referenced])
            self._delete_stale_uses()
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
            count = len(self._keys())
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
        from litekiln.cache import archive  # tarfile only when exporting

        if not self.enabled:
            raise CacheError(f"cannot export: the cache is disabled ({self.reason})")
        with self._storage_errors("export"):
            wanted = self._keys() if keys is None else [self.resolve(k) for k in keys]
            entries = []
            for key in dict.fromkeys(wanted):
                loaded = self._load(key)
                if loaded.problem is not None:
                    _warn(
                        f"cache entry {key[:12]} is corrupt: {loaded.problem}; dropped, "
                        "not exported."
                    )
                    self._drop(key, loaded.raw)
                elif loaded.entry is not None and loaded.raw is not None:
                    entries.append((loaded.raw, loaded.entry))
        archive.write_archive(Path(path), entries)
        return [entry.key for _, entry in entries]

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
        from litekiln.cache import archive  # tarfile only when importing

        self._require_writable()
        path = Path(path)
        manifests = archive.verify_archive(path)
        inserted: list[str] = []
        try:
            for manifest, blobs in archive.read_archive(path, manifests):
                encoded = [
                    (rec["name"], blob, {k: rec[k] for k in ("dtype", "shape") if k in rec})
                    for rec, blob in zip(manifest["parts"], blobs)
                ]
                key = manifest["key"]
                if not self._put(
                    key,
                    manifest["kind"],
                    manifest["fields"],
                    manifest["meta"],
                    encoded,
                    created=float(manifest["created"]),
                ):
                    raise CacheError(f"could not store entry {key[:12]} from {path}")
                inserted.append(key)
        except BaseException:
            for key in inserted:
                with contextlib.suppress(*STORAGE_ERRORS):
                    self._evict(key)
            raise
        return inserted

    # ------------------------------------------------------------------ internals

    def _keys(self) -> list[str]:
        return [k[len(_MANIFEST) :] for k in self._backend.keys(_MANIFEST)]

    def _raw(self, key: str) -> bytes | None:
        try:
            return self._backend.get(_MANIFEST + key)
        except UnsafeValueError:
            return None

    def _load(self, key: str) -> _Loaded:
        """Read and verify entry `key`; a concurrent replacement makes it read again."""
        mkey = _MANIFEST + key
        for _ in range(5):
            try:
                raw = self._backend.get(mkey)
            except UnsafeValueError as e:
                return _Loaded(problem=f"manifest: {e}")
            if raw is None:
                return _Loaded()
            try:
                manifest = decode_manifest(raw, key)
                parts = {}
                for rec in manifest["parts"]:
                    try:
                        data = self._backend.get(rec["store"])
                    except UnsafeValueError as e:
                        raise CorruptError(f"part {rec['name']!r}: {e}") from None
                    check_part(rec, data)
                    parts[rec["name"]] = data
            except (CorruptError, UnsafeValueError) as e:
                # A writer may have swapped the manifest and deleted the parts we were
                # reading: that is not corruption, read the new entry instead.
                if self._backend.get(mkey) != raw:
                    continue
                return _Loaded(raw=raw, problem=str(e))
            return _Loaded(raw=raw, entry=Entry(manifest, parts))
        return _Loaded()  # kept changing under us: call it a miss

    def _put(
        self,
        key: str,
        kind: str,
        fields: dict[str, Any],
        meta: dict[str, Any],
        encoded: list[tuple[str, bytes, dict[str, Any]]],
        created: float,
    ) -> bool:
        total = sum(len(data) for _, data, _ in encoded)
        if total > self.size_limit:
            _warn(
                f"{kind} {key[:12]} ({total} bytes) exceeds the cache size limit "
                f"({self.size_limit} bytes); not stored."
            )
            return False
        # Each attempt writes under its own nonce, so racing writers never share a part.
        nonce = f"{time.time_ns():016x}{secrets.token_hex(4)}"
        written: list[str] = []
        try:
            records = []
            for i, (name, data, extra) in enumerate(encoded):
                store_key = f"{part_store_prefix(key)}{nonce}:{i}"
                self._backend.set(store_key, data)
                written.append(store_key)
                records.append(
                    {
                        "name": name,
                        "store": store_key,
                        "size": len(data),
                        "sha256": _sha256(data),
                        **extra,
                    }
                )
            manifest = {
                "schema": SCHEMA_VERSION,
                "key": key,
                "kind": kind,
                "fields": fields,
                "meta": meta,
                "created": created,
                "parts": records,
            }
            committed = self._commit(key, encode_manifest(manifest), written)
        except STORAGE_ERRORS as e:
            self._discard(written)
            _warn(
                f"could not store {kind} {key[:12]} in {self.directory}: {e}; continuing uncached."
            )
            return False
        if not committed:
            self._discard(written)
            log.debug("entry %s was dropped while being written; not stored", key[:12])
            return False
        try:
            self._evict_to(self.size_limit, protect=key)
        except STORAGE_ERRORS as e:
            _warn(f"could not evict old cache entries in {self.directory}: {e}")
        return True

    def _commit(self, key: str, manifest: bytes, written: list[str]) -> bool:
        """Swap the manifest in; False if one of our parts vanished meanwhile."""
        mkey = _MANIFEST + key
        with self._backend.transact():
            # A concurrent drop of this key (corrupt entry) may have deleted our parts.
            if not all(self._backend.contains(k) for k in written):
                return False
            try:
                old = self._backend.get(mkey)
            except UnsafeValueError:
                old = b""  # unreadable: its parts are found by prefix
            self._backend.set(mkey, manifest)
            self._backend.set(_USE + key, repr(_now()).encode("ascii"))
            stale = [] if old is None else [k for k in self._parts_of(key, old) if k not in written]
        # The replaced entry's parts go only once the new manifest is committed: diskcache
        # removes a deleted value's file at once, even inside a transaction, so deleting them
        # before the commit would let a reader holding the old manifest find a part missing
        # while the manifest looks unchanged, and call a good entry corrupt.
        self._discard(stale)
        return True

    def _parts_of(self, key: str, raw: bytes | None) -> list[str]:
        """Storage keys of the parts a stored manifest owns (all of the key's if damaged)."""
        if raw is not None:
            try:
                return [rec["store"] for rec in decode_manifest(raw, key)["parts"]]
            except CorruptError:
                pass
        # A damaged manifest cannot say which parts are its own: take every part of this
        # key. A writer racing on this key then finds its parts gone and skips its commit.
        return self._backend.keys(part_store_prefix(key))

    def _drop(self, key: str, raw: bytes | None) -> bool:
        """Delete entry `key` if its manifest is still `raw` (never a newer, good one)."""
        if not self._backend.writable:
            return False
        mkey = _MANIFEST + key
        try:
            with self._backend.transact():
                try:
                    current = self._backend.get(mkey)
                except UnsafeValueError:
                    current = None  # as unreadable as when `raw` came back None
                if current != raw:
                    return False
                parts = self._parts_of(key, raw)
                self._backend.delete(mkey)
                self._backend.delete(_USE + key)
        except (*STORAGE_ERRORS, UnsafeValueError) as e:
            _warn(f"could not drop cache entry {key[:12]}: {e}")
            return False
        # Parts after the manifest's removal is committed (see `_commit`): a concurrent reader
        # of this entry then sees a plain miss, not a corrupt entry.
        self._discard(parts)
        return True

    def _evict(self, key: str) -> None:
        raw = self._backend.get(_MANIFEST + key)
        if raw is not None:
            self._drop(key, raw)

    def _discard(self, store_keys: list[str]) -> None:
        """Best-effort removal of parts that no manifest will reference."""
        for store_key in store_keys:
            with contextlib.suppress(*STORAGE_ERRORS):
                self._backend.delete(store_key)

    def _delete_orphans(self, store_keys: list[str]) -> None:
        cutoff = time.time_ns() - int(ORPHAN_GRACE_S * 1e9)
        old = [k for k in store_keys if _nonce_time_ns(k) < cutoff]
        self._discard(old)

    def _delete_stale_uses(self) -> None:
        """Remove last-use records of entries that no longer exist (harmless, but clutter)."""
        entries = set(self._keys())
        self._discard([k for k in self._backend.keys(_USE) if k[len(_USE) :] not in entries])

    def _touch(self, key: str) -> None:
        if not self._backend.writable:
            return
        try:
            self._backend.set(_USE + key, repr(_now()).encode("ascii"))
        except STORAGE_ERRORS as e:
            # LRU order is a nicety; a hit must not fail or nag for it.
            log.debug("cannot record last use of %s: %s", key[:12], e)

    def _last_use(self, key: str, created: float) -> float:
        try:
            raw = self._backend.get(_USE + key)
            return float(raw.decode("ascii")) if raw is not None else created
        except (ValueError, UnicodeDecodeError, UnsafeValueError):
            return created

    def _summary(self, manifest: dict[str, Any], manifest_size: int) -> EntrySummary:
        fields = manifest["fields"]
        created = float(manifest["created"])
        return EntrySummary(
            key=manifest["key"],
            kind=manifest["kind"],
            token=fields.get("token"),
            model_name=fields.get("model_name", manifest["meta"].get("model_name")),
            options=fields.get("options"),
            size=manifest_size + sum(rec["size"] for rec in manifest["parts"]),
            created=created,
            last_use=self._last_use(manifest["key"], created),
            fields=fields,
        )

    def _scan(self) -> list[EntrySummary]:
        out = []
        for key in self._keys():
            raw = self._raw(key)
            if raw is None:
                continue
            try:
                out.append(self._summary(decode_manifest(raw, key), len(raw)))
            except CorruptError:
                continue
        return out

    def _evict_to(self, limit: int, protect: str | None) -> list[str]:
        """Evict least recently used entries until they hold at most `limit` bytes."""
        volume = self._backend.volume()
        if volume is not None and volume <= limit:
            return []  # the database and its files are within the limit: no scan needed
        entries = self._scan()
        total = sum(s.size for s in entries)
        evicted = []
        for s in sorted(entries, key=lambda s: s.last_use):
            if total <= limit:
                break
            if s.key == protect:
                continue
            self._evict(s.key)
            evicted.append(s.key)
            total -= s.size
        if evicted:
            log.info("evicted %d cache entries to stay within %d bytes", len(evicted), limit)
        return evicted

    def _require_writable(self) -> None:
        if not self.enabled:
            raise CacheError(f"the cache is disabled: {self.reason}")
        if self.read_only:
            raise CacheError(f"the cache is read-only: {self.reason}")

    @contextlib.contextmanager
    def _storage_errors(self, what: str):  # type: ignore[no-untyped-def]
        try:
            yield
        except (*STORAGE_ERRORS, UnsafeValueError) as e:
            raise CacheError(f"cache {what} failed in {self.directory}: {e}") from e

    def _say_once(self, topic: str, message: str) -> None:
        if topic not in self._said:
            self._said.add(topic)
            _warn(message)


def _check_key(key: str) -> None:
    if not is_key(key):
        raise ValueError(f"not a cache key (64 lowercase hex digits): {key!r}")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _nonce_time_ns(store_key: str) -> int:
    # part:<key>:<nonce>:<i>, nonce = 16 hex digits of time_ns + 8 random hex digits.
    try:
        return int(store_key.split(":")[2][:16], 16)
    except (IndexError, ValueError):
        return 0  # not ours: old enough to collect
