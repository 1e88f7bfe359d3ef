"""Byte-level storage under `CacheStore`: str keys to bytes values, nothing else.

Three backends share one small interface (`Backend`):

* `DiskcacheBackend`: read-write, on ``diskcache.Cache`` with `SafeDisk`, which refuses every
  value that is not ``bytes`` and every stored row that is not raw bytes, so that no pickle is
  ever written or read (a tampered database row in pickle mode is a corrupt value, not code
  execution).
* `ReadOnlyBackend`: reads a diskcache database in a directory we cannot write (e.g. a cache
  shipped inside an application bundle). diskcache itself cannot open such a database (its
  constructor writes settings, and WAL mode needs to create files), so this reads diskcache's
  ``Cache`` table directly through SQLite's ``immutable=1`` mode.
* `NullBackend`: holds nothing; the store runs uncached.

Entry structure, checksums and atomicity live in ``store.py``; this module only moves bytes.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import threading
import urllib.parse
from pathlib import Path
from typing import Any

import diskcache
from diskcache.core import MODE_BINARY, MODE_RAW, UNKNOWN

# diskcache keeps values below this size inside SQLite and larger ones as files; its default.
MIN_FILE_SIZE = 1 << 15

DBNAME = "cache.db"

# The only file names SafeDisk produces (diskcache's own scheme: two levels of hex folders).
# A database row naming any other path is refused before it is read or deleted, so a
# tampered row cannot make us read or remove files outside the cache directory.
_FILENAME_RE = re.compile(r"[0-9a-f]{2}[/\\][0-9a-f]{2}[/\\][0-9a-f]{28}\.val")

# Errors that mean "the storage failed" (full disk, read-only file system, locked or broken
# database), which the store turns into a warning and a miss or a skipped write.
STORAGE_ERRORS: tuple[type[BaseException], ...] = (OSError, sqlite3.Error, diskcache.Timeout)


class UnsafeValueError(Exception):
    """A stored row is not raw bytes (pickle/text mode, foreign key type, odd file name).

    Deliberately not an OSError: diskcache turns OSError from `Disk.fetch` into a silent
    miss, and the store must see this one to drop the entry with a warning.
    """


def _write_file(full_path: str, data: bytes) -> None:
    """Create `full_path` exclusively with mode 0600, write `data`, fsync; no partial file.

    Raises:
        OSError: the write failed (e.g. ENOSPC); the partial file is already removed.
    """
    full_dir = os.path.dirname(full_path)
    for attempt in range(10):
        # Another process may remove the (then empty) folder between makedirs and open, as
        # diskcache's Disk.remove prunes empty folders; retry like diskcache's own writer.
        with contextlib.suppress(OSError):
            os.makedirs(full_dir, mode=0o700, exist_ok=True)
        try:
            fd = os.open(full_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            break
        except FileNotFoundError:
            if attempt == 9:
                raise
    try:
        with open(fd, "wb") as writer:
            writer.write(data)
            writer.flush()
            os.fsync(writer.fileno())
    except BaseException:
        # A full disk must not leave half a file behind: nothing references it yet. Its
        # folders go too if now empty (as diskcache's own Disk.remove does).
        with contextlib.suppress(OSError):
            os.unlink(full_path)
        with contextlib.suppress(OSError):
            os.removedirs(full_dir)
        raise


def _fetch(directory: str, mode: int, filename: str | None, value: Any) -> bytes:
    """Turn one diskcache ``Cache`` row into bytes, refusing everything but raw bytes.

    Raises:
        UnsafeValueError: the row is in pickle or text mode, or names an odd file.
        OSError: the value's file cannot be read (deleted, unreadable).
    """
    if mode == MODE_RAW and type(value) is bytes:
        return value
    if mode == MODE_BINARY and isinstance(filename, str) and _FILENAME_RE.fullmatch(filename):
        with open(os.path.join(directory, filename), "rb") as reader:
            return reader.read()
    raise UnsafeValueError(f"stored value is not raw bytes (diskcache mode {mode})")


class SafeDisk(diskcache.Disk):
    """A diskcache `Disk` for str keys and bytes values only: no pickle in either direction.

    Values shorter than `MIN_FILE_SIZE` live in SQLite, longer ones in files written with
    mode 0600, fsync'ed, and removed again if the write fails (diskcache's own writer leaves
    a partial file behind on a full disk). Values under `INLINE_PREFIXES` keys always live in
    SQLite: diskcache deletes a replaced value's file before the enclosing transaction
    commits, and a manifest must never vanish under a reader that still sees its row.
    """

    INLINE_PREFIXES = ("manifest:", "use:")

    def put(self, key: Any) -> tuple[str, bool]:
        # Keys of other types would go through pickle.
        if type(key) is not str:
            raise TypeError(f"litekiln cache keys are str, got {type(key).__name__}")
        return key, True

    def get(self, key: Any, raw: bool) -> str:
        if not raw or type(key) is not str:
            raise UnsafeValueError("cache database holds a key that is not a raw str")
        return key

    def store(self, value: Any, read: bool, key: Any = UNKNOWN) -> tuple[int, int, Any, Any]:
        if read or type(value) is not bytes:
            raise TypeError(f"litekiln cache values are bytes, got {type(value).__name__}")
        if len(value) < self.min_file_size or (
            type(key) is str and key.startswith(self.INLINE_PREFIXES)
        ):
            return 0, MODE_RAW, None, sqlite3.Binary(value)
        filename, full_path = self.filename(key, value)
        _write_file(full_path, value)
        return len(value), MODE_BINARY, filename, None

    def fetch(self, mode: int, filename: Any, value: Any, read: bool) -> bytes:
        if read:
            raise TypeError("litekiln cache reads whole values, not file handles")
        if mode == MODE_RAW and isinstance(value, memoryview):
            value = bytes(value)
        return _fetch(self._directory, mode, filename, value)

    def remove(self, file_path: str) -> None:
        # Never delete a path a (possibly tampered) row names unless it is one of ours.
        if isinstance(file_path, str) and _FILENAME_RE.fullmatch(file_path):
            super().remove(file_path)


class Backend:
    """Str keys to bytes values. Writes raise OSError (EROFS) unless `writable`."""

    writable = False

    def get(self, key: str) -> bytes | None:
        """The value stored under `key`, or None.

        Raises:
            UnsafeValueError: the stored row is not raw bytes.
            OSError, sqlite3.Error, diskcache.Timeout: the storage failed.
        """
        return None

    def keys(self, prefix: str) -> list[str]:
        """Every stored key that starts with `prefix`, sorted."""
        return []

    def contains(self, key: str) -> bool:
        """Whether `key` is stored (without reading its value)."""
        return False

    def set(self, key: str, value: bytes) -> None:
        """Store `value` under `key`, replacing what was there."""
        raise OSError(30, "cache is read-only")

    def delete(self, key: str) -> None:
        """Remove `key` if present."""
        raise OSError(30, "cache is read-only")

    def transact(self) -> contextlib.AbstractContextManager[None]:
        """A context in which every get/set/delete is one atomic, cross-process transaction."""
        return contextlib.nullcontext()

    def clear(self) -> None:
        """Remove everything."""
        raise OSError(30, "cache is read-only")

    def volume(self) -> int | None:
        """An upper bound of the bytes held, or None if unknown (cheap, no scan)."""
        return None

    def check(self, fix: bool) -> list[str]:
        """Storage-level consistency problems (database integrity, stray files)."""
        return []

    def close(self) -> None:
        """Release connections."""


class NullBackend(Backend):
    """Holds nothing: the cache is disabled (unsafe or unusable directory)."""


class DiskcacheBackend(Backend):
    """Read-write storage in `directory` through diskcache and `SafeDisk`.

    Raises (from the constructor):
        OSError, sqlite3.Error, diskcache.Timeout: the database cannot be opened for writing.
    """

    writable = True

    def __init__(self, directory: Path) -> None:
        self._cache = diskcache.Cache(
            str(directory),
            disk=SafeDisk,
            # Entries span several diskcache items; diskcache must never evict one of them on
            # its own (that would leave a broken entry). The store does LRU per entry.
            eviction_policy="none",
            cull_limit=0,
            size_limit=1 << 62,
            statistics=0,
            tag_index=0,
            disk_min_file_size=MIN_FILE_SIZE,
        )

    def get(self, key: str) -> bytes | None:
        value = self._cache.get(key, default=None, retry=True)
        return value

    def keys(self, prefix: str) -> list[str]:
        found = []
        for key in self._cache.iterkeys():  # sorted: stop once past the prefix
            if key.startswith(prefix):
                found.append(key)
            elif key > prefix:
                break
        return found

    def contains(self, key: str) -> bool:
        return key in self._cache

    def set(self, key: str, value: bytes) -> None:
        self._cache.set(key, value, retry=True)

    def delete(self, key: str) -> None:
        self._cache.delete(key, retry=True)

    def transact(self) -> contextlib.AbstractContextManager[None]:
        return self._cache.transact(retry=True)

    def clear(self) -> None:
        self._cache.clear(retry=True)

    def volume(self) -> int | None:
        return int(self._cache.volume())

    def check(self, fix: bool) -> list[str]:
        return [str(w.message) for w in self._cache.check(fix=fix, retry=True)]

    def close(self) -> None:
        self._cache.close()


class ReadOnlyBackend(Backend):
    """Reads a diskcache database in a directory this process cannot write.

    Opens the database with ``mode=ro``, which sees commits still in the WAL file but needs
    the WAL's shared-memory file to exist; failing that (the usual case after a clean close)
    with ``immutable=1``, which needs nothing: no locks, no WAL files. Immutable is right for
    a read-only directory, as nobody can be writing it through us either.

    Raises (from the constructor):
        sqlite3.Error: the database cannot be read or is not a diskcache database.
    """

    def __init__(self, directory: Path) -> None:
        self._directory = str(directory)
        self._local = threading.local()
        base = "file:" + urllib.parse.quote(str(directory / DBNAME))
        probe = "SELECT key, raw, mode, filename, value FROM Cache LIMIT 1"
        for query in ("?mode=ro", "?immutable=1"):
            self._uri = base + query
            try:
                self._con().execute(probe)
                return
            except sqlite3.Error:
                if query == "?immutable=1":
                    raise
                self.close()

    def _con(self) -> sqlite3.Connection:
        # sqlite3 connections are per thread; one per thread, opened lazily.
        con = getattr(self._local, "con", None)
        if con is None:
            con = self._local.con = sqlite3.connect(self._uri, uri=True)
        return con

    def get(self, key: str) -> bytes | None:
        rows = (
            self._con()
            .execute("SELECT mode, filename, value FROM Cache WHERE key = ? AND raw = 1", (key,))
            .fetchall()
        )
        if not rows:
            return None
        mode, filename, value = rows[0]
        try:
            return _fetch(self._directory, mode, filename, value)
        except FileNotFoundError:
            return None  # same as diskcache: a vanished file is a missing value

    def keys(self, prefix: str) -> list[str]:
        rows = self._con().execute("SELECT key FROM Cache WHERE raw = 1 ORDER BY key").fetchall()
        return [k for (k,) in rows if isinstance(k, str) and k.startswith(prefix)]

    def contains(self, key: str) -> bool:
        row = (
            self._con().execute("SELECT 1 FROM Cache WHERE key = ? AND raw = 1", (key,)).fetchone()
        )
        return row is not None

    def check(self, fix: bool) -> list[str]:
        rows = self._con().execute("PRAGMA integrity_check").fetchall()
        return [] if rows == [("ok",)] else [str(r[0]) for r in rows]

    def close(self) -> None:
        con = getattr(self._local, "con", None)
        if con is not None:
            con.close()
            self._local.con = None
