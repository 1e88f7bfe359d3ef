"""When each entry was last used: one ``use:<key>`` record each, for LRU eviction."""

from __future__ import annotations

import time

from litekiln.cache.backend import STORAGE_ERRORS, Backend, UnsafeValueError
from litekiln.cache.index import USE
from litekiln.cache.problems import log


def now() -> float:
    # One place to read the clock, so that tests can drive LRU order deterministically.
    return time.time()


def record_use(backend: Backend, key: str) -> None:
    """Record that entry `key` is used now.

    Raises:
        OSError, sqlite3.Error, diskcache.Timeout: the storage failed.
    """
    backend.set(USE + key, repr(now()).encode("ascii"))


def touch(backend: Backend, key: str) -> None:
    """`record_use` if the store is writable; a failure is only logged."""
    if not backend.writable:
        return
    try:
        record_use(backend, key)
    except STORAGE_ERRORS as e:
        # LRU order is a nicety; a hit must not fail or nag for it.
        log.debug("cannot record last use of %s: %s", key[:12], e)


def last_use(backend: Backend, key: str, created: float) -> float:
    """When entry `key` was last used; `created` if never, or if the record is damaged."""
    try:
        raw = backend.get(USE + key)
        return float(raw.decode("ascii")) if raw is not None else created
    except (ValueError, UnicodeDecodeError, UnsafeValueError):
        return created
