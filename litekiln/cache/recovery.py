"""Starting a schema folder afresh: after its database is found damaged, or to clear it.

The folder is renamed aside (inside the cache directory), a new one is made, and the old one
is removed without following any link in it (so nothing outside the cache directory is ever
deleted). After damage, the entries that can still be read from the old folder and pass every
check -- the manifest's signature with this cache's secret, each part's size and sha256 -- are
written into the new one; the others are lost, and recompiled when next needed.

A process that finds the folder already replaced (another process got there first) only
reopens it. Renaming needs no free space, so this works on a full disk too.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import sqlite3
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from litekiln.cache.backend import DBNAME, STORAGE_ERRORS, Backend, UnsafeValueError, fetch_value
from litekiln.cache.index import MANIFEST
from litekiln.cache.manifest import CorruptError, check_part, decode_manifest
from litekiln.cache.writer import NewEntry, write

# What makes one entry unsalvageable.
_LOST: tuple[type[BaseException], ...] = (CorruptError, UnsafeValueError, *STORAGE_ERRORS)

#: Names of folders renamed aside; a crash can leave one behind, which the next open removes.
ASIDE_INFIX = ".old-"
_LOCK = ".reset.lock"


def folder_id(data: Path) -> int | None:
    """An identity of the schema folder now at `data` (its inode), or None if absent."""
    try:
        return os.lstat(data).st_ino
    except OSError:
        return None


def start_afresh(
    root: Path,
    data: Path,
    reopen: Callable[[], Backend],
    old: Backend | None,
    salvage: bool,
    seen: int | None,
) -> tuple[Backend, int]:
    """Replace the schema folder `data` of the cache in `root` with an empty one.

    Args:
        root: the cache directory (real path).
        data: its schema folder.
        reopen: opens (creating) the storage in `data`.
        old: the storage open on the old folder, closed first; or None.
        salvage: copy the entries that pass every check into the new folder.
        seen: `folder_id` of the folder found damaged: if another one is there by now,
            another process has already started afresh and this one only reopens.

    Returns:
        (the new storage, how many entries were salvaged).

    Raises:
        OSError, sqlite3.Error, diskcache.Timeout: the new storage cannot be opened.
    """
    if old is not None:
        old.close()
    with _lock(root):
        aside = None
        if seen is None or folder_id(data) == seen:
            aside = root / f".{data.name}{ASIDE_INFIX}{secrets.token_hex(6)}"
            try:
                os.rename(data, aside)
            except FileNotFoundError:
                aside = None
        backend = reopen()
        recovered = 0
        if aside is not None:
            if salvage:
                recovered = _salvage(aside, backend)
            remove_aside(aside)
    return backend, recovered


def remove_aside(path: Path) -> None:
    """Remove a folder renamed aside, never following a link inside it."""
    with contextlib.suppress(OSError):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)


def remove_leftovers(root: Path) -> None:
    """Remove folders a crashed `start_afresh` left renamed aside in `root`."""
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            if name.startswith(".v") and ASIDE_INFIX in name:
                remove_aside(root / name)


@contextlib.contextmanager
def _lock(root: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # no flock (Windows): the folder identity check alone
        yield
        return
    try:
        fd = os.open(root / _LOCK, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError:
        yield  # e.g. no inode left: go on unserialised
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _salvage(aside: Path, backend: Backend) -> int:
    """Write every entry of the old folder that passes every check into `backend`."""
    rows = _readable_rows(aside / DBNAME)
    recovered = 0
    for name, row in rows.items():
        if not name.startswith(MANIFEST):
            continue
        key = name[len(MANIFEST) :]
        try:
            raw = fetch_value(str(aside), *row)
            manifest = decode_manifest(raw, key, backend.seal)
            parts = []
            for rec in manifest["parts"]:
                part = rows.get(rec["store"])
                data = None if part is None else fetch_value(str(aside), *part)
                check_part(rec, data)
                assert data is not None
                extra = {k: rec[k] for k in ("dtype", "shape") if k in rec}
                parts.append((rec["name"], data, extra))
            new = NewEntry(
                key,
                manifest["kind"],
                manifest["fields"],
                manifest["meta"],
                parts,
                float(manifest["created"]),
            )
            recovered += write(backend, new)
        except _LOST:
            continue  # lost: recompiled when next needed
    return recovered


def _readable_rows(db: Path) -> dict[str, tuple[int, Any, Any]]:
    """key -> (mode, filename, value) of every row SQLite can still read, from both ends of
    the table (a damaged page stops a scan; the other direction reads past it)."""
    rows: dict[str, tuple[int, Any, Any]] = {}
    uri = "file:" + urllib.parse.quote(str(db))
    for query in ("?mode=ro", "?immutable=1"):
        for order in ("ASC", "DESC"):
            try:
                con = sqlite3.connect(uri + query, uri=True)
            except sqlite3.Error:
                continue
            try:
                cursor = con.execute(
                    f"SELECT key, mode, filename, value FROM Cache WHERE raw = 1 "
                    f"ORDER BY rowid {order}"
                )
                for key, mode, filename, value in cursor:
                    if isinstance(key, str):
                        if isinstance(value, memoryview):
                            value = bytes(value)
                        rows.setdefault(key, (mode, filename, value))
            except sqlite3.Error:
                pass  # the damaged page: keep what came before it
            finally:
                con.close()
        if rows:
            break
    return rows
