"""Where the cache lives: the default directory, the private-directory checks, the backend.

A cache holds compiled code that litekiln will run, so it is only ever read from a directory
the user owns and nobody else can write (mode 0700 when litekiln creates it). A linked cache
directory is used where it points; a link inside it (its schema folder, its secret, a value
file's folder) is never followed.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
from dataclasses import dataclass, field
from pathlib import Path

from litekiln import config
from litekiln.cache import recovery, repair
from litekiln.cache.backend import (
    DBNAME,
    STORAGE_ERRORS,
    Backend,
    DiskcacheBackend,
    ReadOnlyBackend,
    is_damaged,
    is_full,
)
from litekiln.cache.errors import CacheError
from litekiln.cache.manifest import SCHEMA_VERSION
from litekiln.cache.problems import STORAGE_OR_UNSAFE, warn
from litekiln.cache.repair import ORPHAN_GRACE_S
from litekiln.cache.seal import Seal, load_secret


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


class UnusableDirectory(Exception):
    """The directory cannot hold a cache (cannot be created, not writable and empty...)."""


# Less free space than this is "no room" for SQLite's journal and shared-memory files.
_NO_ROOM = 128 << 10

# What makes a writable backend fall back to a read-only one (the directory is safe).
_CANNOT_WRITE: tuple[type[BaseException], ...] = (UnusableDirectory, *STORAGE_ERRORS)


def make_private_dir(path: Path) -> None:
    """Create `path` (and missing parents) with mode 0700 if it does not exist.

    Raises:
        UnusableDirectory: it cannot be created.
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
        raise UnusableDirectory(
            f"cannot create cache directory {path}: {e.strerror or e}"
        ) from None


def check_private(path: Path) -> None:
    """Refuse a directory that someone else could have planted compiled code in.

    Raises:
        CacheError: `path` is not a directory (or a dangling link), is owned by another user,
            or is group- or other-writable.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        missing = _dangling(path) if os.path.islink(path) else f"{path} does not exist"
        raise CacheError(missing) from None
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


def _dangling(path: Path) -> str:
    return (
        f"cache directory {path} is a symbolic link to {os.readlink(path)}, which does not "
        "exist; create that directory or remove the link"
    )


@dataclass
class Opened:
    """Storage opened under a cache directory.

    Attributes:
        backend: the storage (read-write, or read-only).
        root: the cache directory, links resolved (all work happens inside it).
        data: its schema folder.
        read_only: why it is read-only, or None.
        full: read-only because the disk is full (management commands free space first).
        repairs: what was repaired while opening (``verify`` reports it).
    """

    backend: Backend
    root: Path
    data: Path
    read_only: str | None = None
    full: bool = False
    repairs: list[str] = field(default_factory=list)


def real_root(root: Path) -> Path:
    """`root` with links resolved: a linked cache directory is used where it points.

    Raises:
        CacheError: `root` is a link to nothing.
    """
    if os.path.islink(root):
        if not os.path.exists(root):
            raise CacheError(_dangling(root))
        return Path(os.path.realpath(root))
    return root


def open_backend(root: Path) -> Opened:
    """Open storage under `root`: read-write if possible, else read-only.

    A damaged database is started afresh, keeping the entries that pass every check (with
    a `CacheWarning`). On a full disk, orphan parts' files are removed to make room; if
    that is not enough the storage is read-only (`Opened.full`).

    Raises:
        CacheError: `root` (or its schema folder, or its secret) is unsafe (see
            `check_private`), or a link to nothing.
        UnusableDirectory: nothing usable there.
    """
    root = real_root(root)
    make_private_dir(root)
    check_private(root)
    data = root / f"v{SCHEMA_VERSION}"
    writable = os.access(root, os.W_OK | os.X_OK)
    _refuse_link(data, writable)
    failure: BaseException | None = None
    if writable:
        recovery.remove_leftovers(root)
        repairs: list[str] = []
        try:
            seal = Seal(load_secret(root, create=True))
            return Opened(_open_writable(data, seal, root, repairs), root, data, repairs=repairs)
        except _CANNOT_WRITE as e:
            failure = e  # e.g. a read-only file system that access() did not see
    seal = Seal(load_secret(root, create=False))
    backend = _open_read_only(root, data, failure)
    backend.seal = seal
    why = f"cannot write to {root}" + (f" ({failure})" if failure else "")
    full = failure is not None and disk_full(failure, root)
    return Opened(backend, root, data, why, full=full)


def disk_full(e: BaseException, where: Path) -> bool:
    """Whether `e` comes from a full disk under `where`: said so, or an I/O error SQLite
    reports (creating its journal or shared-memory file) while the disk has no room."""
    if is_full(e):
        return True
    if not isinstance(e, (OSError, sqlite3.Error)):
        return False
    try:
        return shutil.disk_usage(where).free < _NO_ROOM
    except OSError:
        return False


def open_writable(opened: Opened) -> Backend:
    """Storage in `opened.data` opened afresh for writing (after space was freed).

    Raises:
        OSError, sqlite3.Error, diskcache.Timeout, UnusableDirectory: still cannot write.
    """
    return _open_writable(opened.data, opened.backend.seal, opened.root, opened.repairs)


def _refuse_link(data: Path, writable: bool) -> None:
    """litekiln never makes links inside a cache: a schema folder that is one is removed
    (the link only; the cache starts empty) or, in a read-only directory, refused."""
    if not os.path.islink(data):
        return
    if not writable:
        raise CacheError(f"cache folder {data} is a symbolic link; litekiln does not follow it")
    os.unlink(data)
    warn(f"cache folder {data} was a symbolic link (litekiln never makes one): removed it.", 4)


def _open_writable(data: Path, seal: Seal, root: Path, repairs: list[str]) -> Backend:
    seen = recovery.folder_id(data)
    try:
        return _new_backend(data, seal)
    except STORAGE_ERRORS as e:
        if is_damaged(e):
            return _start_afresh(data, seal, root, e, seen, repairs)
        if not disk_full(e, root) or not (data / DBNAME).is_file():
            raise
        if not _make_room(data, seal):
            raise
    return _new_backend(data, seal)  # once more, with the room made


def _new_backend(data: Path, seal: Seal) -> Backend:
    make_private_dir(data)
    check_private(data)
    backend = DiskcacheBackend(data)
    backend.seal = seal
    return backend


def _start_afresh(
    data: Path, seal: Seal, root: Path, e: BaseException, seen: int | None, repairs: list[str]
) -> Backend:
    backend, recovered = recovery.start_afresh(
        root, data, lambda: _new_backend(data, seal), None, salvage=True, seen=seen
    )
    message = (
        f"cache database {data / DBNAME} is damaged ({e}): started it afresh, "
        f"{recovered} entries recovered."
    )
    repairs.append(message)
    warn(message, 5)
    return backend


def _make_room(data: Path, seal: Seal) -> int:
    """On a full disk: remove the files of orphan parts without touching the database
    (deleting rows needs room too). Returns how many were removed."""
    try:
        view = ReadOnlyBackend(data)
    except STORAGE_ERRORS:
        return 0
    view.seal = seal
    try:
        return repair.collect_orphans(view, ORPHAN_GRACE_S, max_parts=1 << 30, budget_s=5.0)
    except STORAGE_OR_UNSAFE:
        return 0
    finally:
        view.close()


def _open_read_only(root: Path, data: Path, failure: BaseException | None) -> Backend:
    if not (data / DBNAME).is_file():
        if failure is not None:
            raise UnusableDirectory(f"cannot write to cache directory {root} ({failure})")
        raise UnusableDirectory(f"cache directory {root} is not writable and holds no cache")
    check_private(data)
    try:
        return ReadOnlyBackend(data)
    except STORAGE_ERRORS as e:
        raise UnusableDirectory(f"cannot read cache database in {data}: {e}") from None
