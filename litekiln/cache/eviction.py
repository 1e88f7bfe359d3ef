"""Evicting whole entries: the least recently used ones, or those unused for a while.

diskcache never evicts on its own (an entry spans several of its items, and losing one would
break the entry); these functions remove an entry as a whole, manifest first.
"""

from __future__ import annotations

from litekiln.cache import usage
from litekiln.cache.backend import Backend
from litekiln.cache.entries import scan
from litekiln.cache.index import remove
from litekiln.cache.problems import log


def evict_to(backend: Backend, limit: int, protect: str | None) -> list[str]:
    """Evict least recently used entries until they hold at most `limit` bytes.

    Args:
        backend: the storage.
        limit: bound in bytes of all entries.
        protect: a key never to evict (the entry just stored), or None.

    Returns:
        The keys evicted.

    Raises:
        OSError, sqlite3.Error, diskcache.Timeout, UnsafeValueError: the storage failed.
    """
    volume = backend.volume()
    if volume is not None and volume <= limit:
        return []  # the database and its files are within the limit: no scan needed
    entries = scan(backend)
    total = sum(s.size for s in entries)
    evicted = []
    for s in sorted(entries, key=lambda s: s.last_use):
        if total <= limit:
            break
        if s.key == protect:
            continue
        remove(backend, s.key)
        evicted.append(s.key)
        total -= s.size
    if evicted:
        log.info("evicted %d cache entries to stay within %d bytes", len(evicted), limit)
    return evicted


def evict_unused(backend: Backend, older_than: float) -> list[str]:
    """Evict the entries not used for `older_than` seconds.

    Returns:
        The keys evicted.

    Raises:
        OSError, sqlite3.Error, diskcache.Timeout, UnsafeValueError: the storage failed.
    """
    cutoff = usage.now() - older_than
    evicted = []
    for s in scan(backend):
        if s.last_use < cutoff:
            remove(backend, s.key)
            evicted.append(s.key)
    return evicted


def choose(backend: Backend, limit: int, older_than: float | None) -> list[str]:
    """The keys `evict_unused` and then `evict_to` would evict, without evicting them
    (on a full disk their files are removed first, to make room).

    Raises:
        OSError, sqlite3.Error, diskcache.Timeout, UnsafeValueError: the storage failed.
    """
    entries = sorted(scan(backend), key=lambda s: s.last_use)
    cutoff = None if older_than is None else usage.now() - older_than
    chosen = [s for s in entries if cutoff is not None and s.last_use < cutoff]
    total = sum(s.size for s in entries) - sum(s.size for s in chosen)
    for s in entries:
        if total <= limit:
            break
        if s not in chosen:
            chosen.append(s)
            total -= s.size
    return [s.key for s in chosen]
