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

Value files are reached one folder at a time, never through a symbolic link (``O_NOFOLLOW``
at every step): a link planted inside the cache can neither be read through nor make a
removal delete a file outside it.

Entry structure, checksums and atomicity live in ``store.py``; this module only moves bytes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import sqlite3
import stat
import threading
import urllib.parse
from pathlib import Path
from typing import Any

import diskcache
from diskcache.core import MODE_BINARY, MODE_RAW, UNKNOWN

from litekiln.cache.seal import Seal

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


# SQLite's primary result codes for a damaged database and for a full disk.
_SQLITE_CORRUPT, _SQLITE_NOTADB, _SQLITE_FULL = 11, 26, 13


def is_damaged(e: BaseException) -> bool:
    """Whether `e` says the SQLite database file itself is damaged (not locked, not full)."""
    if not isinstance(e, sqlite3.DatabaseError):
        return False
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    text = str(e)
    return "malformed" in text or "not a database" in text


def is_full(e: BaseException) -> bool:
    """Whether `e` says the disk (or the user's quota) is full."""
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    if isinstance(e, sqlite3.Error):
        code = getattr(e, "sqlite_errorcode", None)
        return (code is not None and code & 0xFF == _SQLITE_FULL) or "disk is full" in str(e)
    return False


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# Without dir_fd (Windows) a path is opened whole, and only its last part is checked.
_WALK = os.open in os.supports_dir_fd and bool(_NOFOLLOW)


class _Folder:
    """The folders of one value file, opened one at a time without following links."""

    def __init__(self, directory: str, filename: str, create: bool) -> None:
        *folders, self.name = re.split(r"[/\\]", filename)
        self._fds: list[int] = []
        self._names = folders
        self._path = os.path.join(directory, *folders)
        if not _WALK:
            if create:
                os.makedirs(self._path, mode=0o700, exist_ok=True)
            return
        self._fds.append(os.open(directory, os.O_RDONLY | _DIRECTORY | _CLOEXEC))
        try:
            for name in folders:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, 0o700, dir_fd=self._fds[-1])
                self._fds.append(
                    os.open(
                        name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=self._fds[-1]
                    )
                )
        except BaseException:
            self.close()
            raise

    def open(self, flags: int, mode: int = 0o600) -> int:
        """Open the value file itself (never through a link)."""
        if not _WALK:
            return os.open(os.path.join(self._path, self.name), flags | _CLOEXEC, mode)
        return os.open(self.name, flags | _NOFOLLOW | _CLOEXEC, mode, dir_fd=self._fds[-1])

    def unlink(self) -> None:
        """Remove the value file (a link there is removed itself, never its target)."""
        if not _WALK:
            os.unlink(os.path.join(self._path, self.name))
        else:
            os.unlink(self.name, dir_fd=self._fds[-1])

    def prune(self) -> None:
        """Remove the file's folders if now empty (as diskcache's own Disk.remove does)."""
        if not _WALK:
            with contextlib.suppress(OSError):
                os.removedirs(self._path)
            return
        for depth in range(len(self._names), 0, -1):
            try:
                os.rmdir(self._names[depth - 1], dir_fd=self._fds[depth - 1])
            except OSError:
                return

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def __enter__(self) -> _Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _refuse_links(e: OSError, filename: str) -> None:
    # O_NOFOLLOW/O_DIRECTORY on a link: ELOOP, or ENOTDIR for a link where a folder was.
    if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        raise UnsafeValueError(
            f"value file {filename} is reached through a symbolic link"
        ) from None


def write_value_file(directory: str, filename: str, data: bytes) -> None:
    """Create `filename` under `directory` exclusively (0600), write `data`, fsync; no
    partial file and no link followed.

    Raises:
        OSError: the write failed (e.g. ENOSPC, or ELOOP/ENOTDIR: a folder on the way is a
            link); the partial file is already removed.
    """
    for attempt in range(10):
        # Another process may remove the (then empty) folder between mkdir and open, as
        # Disk.remove prunes empty folders; retry like diskcache's own writer.
        try:
            folder = _Folder(directory, filename, create=True)
        except FileNotFoundError:
            if attempt == 9:
                raise
            continue
        with folder:
            try:
                fd = folder.open(os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            except FileNotFoundError:
                if attempt == 9:
                    raise
                continue
            try:
                with open(fd, "wb") as writer:
                    writer.write(data)
                    writer.flush()
                    os.fsync(writer.fileno())
            except BaseException:
                # A full disk must not leave half a file behind: nothing references it yet.
                with contextlib.suppress(OSError):
                    folder.unlink()
                folder.prune()
                raise
            return


def read_value_file(directory: str, filename: str) -> bytes:
    """The bytes of value file `filename` under `directory`.

    Raises:
        UnsafeValueError: it, or a folder on the way, is a link or not a plain file.
        OSError: it cannot be read (deleted, unreadable).
    """
    try:
        with _Folder(directory, filename, create=False) as folder:
            # O_NONBLOCK: a planted FIFO must not hang the reader.
            fd = folder.open(os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        _refuse_links(e, filename)
        raise
    with open(fd, "rb") as reader:
        if not stat.S_ISREG(os.fstat(reader.fileno()).st_mode):
            raise UnsafeValueError(f"value file {filename} is not a plain file")
        return reader.read()


def remove_value_file(directory: str, filename: str) -> None:
    """Remove value file `filename` under `directory` and its folders if empty; never
    through a link, and silent if it is gone already."""
    try:
        with _Folder(directory, filename, create=False) as folder:
            with contextlib.suppress(FileNotFoundError):
                folder.unlink()
            folder.prune()
    except OSError:
        pass  # gone already, or behind a link: nothing of ours to remove


def fetch_value(directory: str, mode: int, filename: str | None, value: Any) -> bytes:
    """Turn one diskcache ``Cache`` row into bytes, refusing everything but raw bytes.

    Raises:
        UnsafeValueError: the row is in pickle or text mode, names an odd file, or its file is
            reached through a link.
        OSError: the value's file cannot be read (deleted, unreadable).
    """
    if mode == MODE_RAW and type(value) is bytes:
        return value
    if mode == MODE_BINARY and isinstance(filename, str) and _FILENAME_RE.fullmatch(filename):
        return read_value_file(directory, filename)
    raise UnsafeValueError(f"stored value is not raw bytes (diskcache mode {mode})")


def stray_files(directory: Path, fix: bool) -> list[str]:
    """Links and special files under `directory` (litekiln makes none); removed if `fix`.

    A removal takes the link itself, never what it points to.
    """
    found = []
    for top, folders, files in os.walk(directory):  # never descends through a link
        for name in [*folders, *files]:
            path = os.path.join(top, name)
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                continue
            what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a plain file"
            found.append(f"{os.path.relpath(path, directory)} is {what}")
            if fix:
                with contextlib.suppress(OSError):
                    os.unlink(path)
    return found


# The value file the current thread's `SafeDisk.store` wrote last.
_written = threading.local()


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
        filename, _ = self.filename(key, value)
        write_value_file(self._directory, filename, value)
        _written.filename = filename  # for `DiskcacheBackend.set`, should its row fail
        return len(value), MODE_BINARY, filename, None

    def filename(self, key: Any = UNKNOWN, value: Any = UNKNOWN) -> tuple[str, str]:
        # diskcache's naming scheme, without its makedirs (which would follow a link):
        # `write_value_file` creates the folders one at a time.
        hex_name = secrets.token_hex(16)
        filename = os.path.join(hex_name[:2], hex_name[2:4], hex_name[4:] + ".val")
        return filename, os.path.join(self._directory, filename)

    def fetch(self, mode: int, filename: Any, value: Any, read: bool) -> bytes:
        if read:
            raise TypeError("litekiln cache reads whole values, not file handles")
        if mode == MODE_RAW and isinstance(value, memoryview):
            value = bytes(value)
        return fetch_value(self._directory, mode, filename, value)

    def remove(self, file_path: str) -> None:
        # Never delete a path a (possibly tampered) row names unless it is one of ours.
        if isinstance(file_path, str) and _FILENAME_RE.fullmatch(file_path):
            remove_value_file(self._directory, file_path)


class Backend:
    """Str keys to bytes values. Writes raise OSError (EROFS) unless `writable`.

    Attributes:
        seal: signs and checks the manifests kept here (the cache's own secret).
        directory: the schema folder the values live in, or None.
    """

    writable = False
    seal = Seal(None)
    directory: Path | None = None

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

    def keys_after(self, prefix: str, after: str, limit: int) -> list[str]:
        """At most `limit` stored keys that start with `prefix` and sort after `after`."""
        return [k for k in self.keys(prefix) if k > after][:limit]

    def value_file(self, key: str) -> str | None:
        """The file (relative to `directory`) that holds the value of `key`, or None if the
        value is inside the database or absent."""
        return None

    def free_value_file(self, key: str) -> None:
        """Remove the file of `key`'s value but not its row: space back on a full disk, where
        deleting a row may fail. Only for values no manifest references."""
        filename = self.value_file(key)
        if filename is not None and self.directory is not None:
            remove_value_file(str(self.directory), filename)

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
        """Storage-level consistency problems (database integrity, stray files and links)."""
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
        self.directory = directory
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

    def keys_after(self, prefix: str, after: str, limit: int) -> list[str]:
        # One range scan of diskcache's (key, raw) index; `_sql` is diskcache's own helper.
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        rows = self._cache._sql(
            "SELECT key FROM Cache WHERE key > ? AND key < ? AND raw = 1 ORDER BY key LIMIT ?",
            (max(after, prefix), end, limit),
        ).fetchall()
        return [k for (k,) in rows if isinstance(k, str) and k.startswith(prefix)]

    def value_file(self, key: str) -> str | None:
        rows = self._cache._sql(
            "SELECT filename FROM Cache WHERE key = ? AND raw = 1", (key,)
        ).fetchall()
        return _our_file(rows)

    def contains(self, key: str) -> bool:
        return key in self._cache

    def set(self, key: str, value: bytes) -> None:
        _written.filename = None
        try:
            self._cache.set(key, value, retry=True)
        except BaseException:
            # diskcache wrote the value's file, then failed to insert its row (a full disk):
            # nothing references the file, and it holds the space.
            if _written.filename is not None:
                remove_value_file(str(self.directory), _written.filename)
            raise
        finally:
            _written.filename = None

    def delete(self, key: str) -> None:
        self._cache.delete(key, retry=True)

    def transact(self) -> contextlib.AbstractContextManager[None]:
        return self._cache.transact(retry=True)

    def clear(self) -> None:
        self._cache.clear(retry=True)

    def volume(self) -> int | None:
        return int(self._cache.volume())

    def check(self, fix: bool) -> list[str]:
        strays = stray_files(Path(self._cache.directory), fix)
        return strays + [str(w.message) for w in self._cache.check(fix=fix, retry=True)]

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
        self.directory = directory
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
            return fetch_value(self._directory, mode, filename, value)
        except FileNotFoundError:
            return None  # same as diskcache: a vanished file is a missing value

    def keys(self, prefix: str) -> list[str]:
        rows = self._con().execute("SELECT key FROM Cache WHERE raw = 1 ORDER BY key").fetchall()
        return [k for (k,) in rows if isinstance(k, str) and k.startswith(prefix)]

    def value_file(self, key: str) -> str | None:
        rows = (
            self._con()
            .execute("SELECT filename FROM Cache WHERE key = ? AND raw = 1", (key,))
            .fetchall()
        )
        return _our_file(rows)

    def contains(self, key: str) -> bool:
        row = (
            self._con().execute("SELECT 1 FROM Cache WHERE key = ? AND raw = 1", (key,)).fetchone()
        )
        return row is not None

    def check(self, fix: bool) -> list[str]:
        rows = self._con().execute("PRAGMA integrity_check").fetchall()
        strays = stray_files(Path(self._directory), fix=False)
        return strays + ([] if rows == [("ok",)] else [str(r[0]) for r in rows])

    def close(self) -> None:
        con = getattr(self._local, "con", None)
        if con is not None:
            con.close()
            self._local.con = None


def _our_file(rows: list[tuple[Any, ...]]) -> str | None:
    if rows and isinstance(rows[0][0], str) and _FILENAME_RE.fullmatch(rows[0][0]):
        return str(rows[0][0])
    return None
