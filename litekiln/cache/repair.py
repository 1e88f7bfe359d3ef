"""Checking and repairing a store: bad entries, orphan parts, stale use records.

An orphan part is one that no manifest references: a writer crashed between its parts and
its manifest, or is still at work. Only orphans older than a grace period are collected:
by `verify(fix=True)` and `prune` all at once, and at every open a bounded slice of them
(`collect_orphans`), resuming where the last open stopped.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from litekiln.cache.backend import STORAGE_ERRORS, Backend
from litekiln.cache.entries import load
from litekiln.cache.index import (
    PART,
    USE,
    discard,
    drop,
    entry_keys,
    nonce_time_ns,
    parts_of,
    stored_manifest,
)
from litekiln.cache.manifest import CorruptError, manifest_body

#: Parts that no manifest references and that are older than this are garbage (a writer that
#: crashed between its parts and its manifest). Younger ones may belong to a writer at work.
ORPHAN_GRACE_S = 600.0


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


def verify(backend: Backend, fix: bool, grace_s: float) -> VerifyReport:
    """Check every part of every entry against its checksum, and the storage itself.

    Args:
        backend: the storage (writable if `fix`).
        fix: delete bad entries, orphan parts older than `grace_s` and stale use records,
            and let diskcache repair its bookkeeping.
        grace_s: how old (seconds) an orphan part must be to be deleted.

    Returns:
        The report.

    Raises:
        OSError, sqlite3.Error, diskcache.Timeout, UnsafeValueError: the storage failed.
    """
    report = VerifyReport(fixed=fix)
    referenced = _check_entries(backend, report)
    orphans = _unreferenced_parts(backend, referenced)
    report.orphan_parts = len(orphans)
    if report.fixed:
        _delete_orphans(backend, orphans, grace_s)
        _delete_stale_uses(backend)
    report.storage = backend.check(fix=report.fixed)
    return report


def _check_entries(backend: Backend, report: VerifyReport) -> set[str]:
    """Load every entry into `report` (dropping bad ones if fixing); the parts of good ones."""
    referenced: set[str] = set()
    for key in entry_keys(backend):
        loaded = load(backend, key)
        if loaded.raw is None and loaded.problem is None:
            continue  # deleted meanwhile
        report.entries += 1
        if loaded.problem is not None:
            report.bad[key] = loaded.problem
            if report.fixed:
                drop(backend, key, loaded.raw)
        elif loaded.entry is not None:
            referenced.update(rec["store"] for rec in loaded.entry.manifest["parts"])
    return referenced


def collect_garbage(backend: Backend, grace_s: float) -> None:
    """Delete orphan parts older than `grace_s` seconds, and use records of no entry.

    Raises:
        OSError, sqlite3.Error, diskcache.Timeout, UnsafeValueError: the storage failed.
    """
    # Parts of damaged entries count as referenced here: verify(fix=True) judges those.
    referenced = {
        k
        for key in entry_keys(backend)
        for k in parts_of(backend, key, stored_manifest(backend, key))
    }
    _delete_orphans(backend, _unreferenced_parts(backend, referenced), grace_s)
    _delete_stale_uses(backend)


def _unreferenced_parts(backend: Backend, referenced: set[str]) -> list[str]:
    return [k for k in backend.keys(PART) if k not in referenced]


def _delete_orphans(backend: Backend, store_keys: list[str], grace_s: float) -> None:
    # Younger orphans may belong to a writer at work.
    cutoff = time.time_ns() - int(grace_s * 1e9)
    discard(backend, [k for k in store_keys if nonce_time_ns(k) < cutoff])


def _delete_stale_uses(backend: Backend) -> None:
    """Remove last-use records of entries that no longer exist (harmless, but clutter)."""
    entries = set(entry_keys(backend))
    discard(backend, [k for k in backend.keys(USE) if k[len(USE) :] not in entries])


# Parts looked at whatever the time budget, so that every open makes progress.
_AT_LEAST = 32

#: Where the last open's orphan scan stopped (a part key), when it did not reach the end.
CURSOR = "gc:cursor"


def collect_orphans(backend: Backend, grace_s: float, max_parts: int, budget_s: float) -> int:
    """Delete orphan parts older than `grace_s`, looking at `max_parts` parts or for
    `budget_s` seconds at most; the next call goes on where this one stopped.

    A part is an orphan when the manifest of its entry is gone or names another write (its
    nonce is not in the manifest's body, inflated but not checked: a damaged manifest that
    still names it, or one that no longer inflates, keeps it until `verify(fix=True)` judges
    the entry).

    Returns:
        How many orphan parts were deleted.

    Raises:
        OSError, sqlite3.Error, diskcache.Timeout, UnsafeValueError: the storage failed.
    """
    deadline = time.monotonic() + budget_s
    cursor = backend.get(CURSOR)
    after = cursor.decode("ascii", "replace") if cursor else PART
    store_keys = backend.keys_after(PART, after, max_parts)
    cutoff = time.time_ns() - int(grace_s * 1e9)
    orphans: list[str] = []
    bodies: dict[str, bytes | None] = {}
    unreadable: set[str] = set()
    last = after
    for looked, store_key in enumerate(store_keys):
        if looked >= _AT_LEAST and time.monotonic() > deadline:
            break  # but always some progress, however slow the machine
        last = store_key
        fields = store_key.split(":")
        if len(fields) != 4 or nonce_time_ns(store_key) >= cutoff:
            continue  # young: may belong to a writer at work
        key, nonce = fields[1], fields[2]
        if key not in bodies:
            # The body, not the stored bytes: those are deflated, the part keys not in them.
            raw = stored_manifest(backend, key)
            try:
                bodies[key] = None if raw is None else manifest_body(raw)
            except CorruptError:
                unreadable.add(key)  # judged by verify(fix=True), with all its parts
                bodies[key] = None
        if key in unreadable:
            continue
        body = bodies[key]
        if body is None or nonce.encode("ascii") not in body:
            orphans.append(store_key)
    discard(backend, orphans)
    finished = len(store_keys) < max_parts and last == (store_keys[-1] if store_keys else after)
    with contextlib.suppress(*STORAGE_ERRORS):
        if not finished:
            backend.set(CURSOR, last.encode("ascii"))
        elif cursor is not None:
            backend.delete(CURSOR)
    return len(orphans)
