"""The private, checksummed, atomic, pickle-free cache of compiled artifacts.

Three kinds of entries share one store: compiled models (``kind="model"``: a compressed JSON
manifest with kernel sources, launch plan and the recipes that rebuild the weights from the
model file, and the few other constants as raw little-endian arrays), constants that compiled
models share (``kind="weights"``, keyed by their contents) and device program binaries
(``kind="program"``: one binary blob and small JSON metadata). Callers build keys
with `make_key` from every field that changes what an entry holds::

    store = CacheStore.open()                      # default dir, never raises
    key = make_key({"token": token, "options": opts, "litekiln": __version__, ...})
    entry = store.get(key)
    if entry is None:                              # miss, or a corrupt entry was dropped
        ... compile ...
        store.put(key, fields, {"source": src.encode(), "w0": weights}, meta=plan)
    weights = entry.array("w0")

This package never imports TVM: the runtime uses it on devices that have only numpy,
pyopencl, diskcache and pyfarmhash. Layout and guarantees: see ``store.py``.
"""

from litekiln.cache.errors import CacheError, CacheWarning
from litekiln.cache.keys import make_key
from litekiln.cache.manifest import KINDS, SCHEMA_VERSION
from litekiln.cache.store import (
    CacheStore,
    Entry,
    EntrySummary,
    VerifyReport,
    default_cache_dir,
)

__all__ = [
    "KINDS",
    "SCHEMA_VERSION",
    "CacheError",
    "CacheStore",
    "CacheWarning",
    "Entry",
    "EntrySummary",
    "VerifyReport",
    "default_cache_dir",
    "make_key",
]
