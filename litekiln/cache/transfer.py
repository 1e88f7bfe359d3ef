"""Moving entries between stores through a signed export archive (``archive.py``).

Importing this module imports tarfile and cryptography; the store does so only when exporting
or importing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from litekiln.cache import archive
from litekiln.cache.backend import STORAGE_ERRORS, Backend
from litekiln.cache.entries import Entry, load
from litekiln.cache.errors import CacheError
from litekiln.cache.index import drop, remove
from litekiln.cache.problems import storage_errors, warn
from litekiln.cache.signing import Signer
from litekiln.cache.writer import NewEntry


def export_archive(
    backend: Backend, directory: Path, path: Path, keys: list[str], signer: Signer
) -> list[str]:
    """Write entries `keys` of the store in `directory` to the archive `path`, signed by
    `signer`.

    Each entry is verified while read; a corrupt one is dropped with a warning and left
    out. The file appears atomically (written aside, then renamed).

    Returns:
        The keys exported.

    Raises:
        CacheError: the storage failed, or the archive cannot be written.
    """
    with storage_errors("export", directory):
        entries = _readable_entries(backend, keys)
    archive.write_archive(path, entries, signer)
    return [entry.key for _, entry in entries]


def _readable_entries(backend: Backend, keys: list[str]) -> list[tuple[bytes, Entry]]:
    entries = []
    for key in dict.fromkeys(keys):
        loaded = load(backend, key)
        if loaded.problem is not None:
            # The warning names the code that called `CacheStore.export`.
            warn(f"cache entry {key[:12]} is corrupt: {loaded.problem}; dropped, not exported.", 4)
            drop(backend, key, loaded.raw)
        elif loaded.entry is not None and loaded.raw is not None:
            entries.append((loaded.raw, loaded.entry))
    return entries


def import_archive(
    backend: Backend,
    path: Path,
    store: Callable[[NewEntry], bool],
    keys: list[bytes],
    trust: bool,
    limits: archive.Limits,
) -> list[str]:
    """Insert the entries of the archive `path`, after verifying all of it.

    The entries are written like any new entry, so they are signed with this cache's own
    secret.

    Args:
        backend: the storage, to remove what was inserted if the import fails.
        path: the archive.
        store: stores one entry (with the store's size limit); False if it could not.
        keys: the trusted public keys (raw Ed25519).
        trust: accept an unsigned export or one signed by another key.
        limits: what may be read from the archive.

    Returns:
        The keys imported.

    Raises:
        CacheError: the archive is untrusted, damaged, modified, too large or not an export
            (nothing is inserted), or storing failed (whatever was inserted is removed again).
    """
    manifests = archive.verify_archive(path, limits, keys, trust)
    inserted: list[str] = []
    try:
        for manifest, blobs in archive.read_archive(path, manifests, limits, keys, trust):
            new = _new_entry(manifest, blobs)
            if not store(new):
                raise CacheError(f"could not store entry {new.key[:12]} from {path}")
            inserted.append(new.key)
    except BaseException:
        for key in inserted:
            with contextlib.suppress(*STORAGE_ERRORS):
                remove(backend, key)
        raise
    return inserted


def _new_entry(manifest: dict[str, Any], blobs: list[bytes]) -> NewEntry:
    # read_archive gives one blob per part record, checked against it.
    parts = [
        (rec["name"], blob, {k: rec[k] for k in ("dtype", "shape") if k in rec})
        for rec, blob in zip(manifest["parts"], blobs, strict=True)
    ]
    return NewEntry(
        key=manifest["key"],
        kind=manifest["kind"],
        fields=manifest["fields"],
        meta=manifest["meta"],
        parts=parts,
        created=float(manifest["created"]),
    )
