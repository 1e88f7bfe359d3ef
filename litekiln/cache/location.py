"""Where the cache lives: the default directory, the private-directory checks, the backend.

A cache holds compiled code that litekiln will run, so it is only ever read from a directory
the user owns and nobody else can write (mode 0700 when litekiln creates it).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from litekiln import config
from litekiln.cache.backend import (
    DBNAME,
    STORAGE_ERRORS,
    Backend,
    DiskcacheBackend,
    ReadOnlyBackend,
)
from litekiln.cache.errors import CacheError
from litekiln.cache.manifest import SCHEMA_VERSION


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


def open_backend(root: Path) -> tuple[Backend, str | None]:
    """Open storage under `root`: read-write if possible, else read-only.

    Returns:
        (backend, why it is read-only or None).

    Raises:
        CacheError: `root` (or its schema folder) is unsafe (see `check_private`).
        UnusableDirectory: nothing usable there.
    """
    make_private_dir(root)
    check_private(root)
    data = root / f"v{SCHEMA_VERSION}"
    failure: BaseException | None = None
    if os.access(root, os.W_OK | os.X_OK):
        try:
            return _open_writable(data), None
        except _CANNOT_WRITE as e:
            failure = e  # e.g. a read-only file system that access() did not see
    backend = _open_read_only(root, data)
    return backend, f"cannot write to {root}" + (f" ({failure})" if failure else "")


def _open_writable(data: Path) -> Backend:
    make_private_dir(data)
    check_private(data)
    return DiskcacheBackend(data)


def _open_read_only(root: Path, data: Path) -> Backend:
    if not (data / DBNAME).is_file():
        raise UnusableDirectory(f"cache directory {root} is not writable and holds no cache")
    check_private(data)
    try:
        return ReadOnlyBackend(data)
    except STORAGE_ERRORS as e:
        raise UnusableDirectory(f"cannot read cache database in {data}: {e}") from None
