"""Errors and warnings of the cache.

`CacheError` is litekiln's shared one (``litekiln.errors``), re-exported so that cache users
need one import. Everything the cache can survive (a corrupt entry, a full disk, a read-only
directory) is a `CacheWarning`, never an exception: inference goes on, uncached.
"""

from __future__ import annotations

from litekiln.errors import CacheError

__all__ = ["CacheError", "CacheWarning"]


class CacheWarning(UserWarning):
    """The cache skipped something (corrupt entry dropped, write failed, unsafe directory).

    A category of its own so that applications can filter or escalate cache warnings
    (``warnings.simplefilter("error", CacheWarning)``) without touching other warnings.
    """
