"""What produced a compiled model: the versions recorded in it and used in its cache key."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from pathlib import Path

from litekiln.version import __version__

#: The packages whose sources decide what the compiler emits: a changed emitter, schedule, op
#: rule or artifact field makes every earlier compilation stale, which a version number alone
#: would not say.
_COMPILER_SOURCES = ("compiler", "ops", "model", "artifact")


def litekiln_version() -> str:
    """This litekiln's version (declared once, in ``litekiln/version.py``)."""
    return __version__


def tvm_version() -> str | None:
    """Installed apache-tvm version, read from package metadata (never imports TVM); None
    where TVM cannot be imported.

    The import system is asked first: an app's runtime has no TVM (or blocks it), and
    importing importlib.metadata to scan every installed distribution cost each start
    20-40 ms for that answer.
    """
    try:
        if importlib.util.find_spec("tvm") is None:
            return None
    except (ImportError, ValueError):  # a blocked import (sys.modules["tvm"] = None)
        return None
    from importlib import metadata

    try:
        return metadata.version("apache-tvm")
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def compiler_hash() -> str:
    """sha256 (16 hex digits) of the sources that decide what the compiler emits.

    Reading ~40 small files costs about a millisecond, once per process.
    """
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for sub in _COMPILER_SOURCES:
        for f in sorted((root / sub).glob("*.py")):
            h.update(f"{sub}/{f.name}".encode())
            h.update(f.read_bytes())
    # The dictionaries the cache's texts are primed with (`litekiln.artifact.texts`): an entry
    # written with others is stale.
    for f in sorted((root / "artifact" / "dictionaries").glob("*")):
        h.update(f"artifact/dictionaries/{f.name}".encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]
