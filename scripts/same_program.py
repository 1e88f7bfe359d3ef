#!/usr/bin/env python3
"""Whether two caches hold the same compiled programs, field by field.

For checking that a compiler change leaves its output as it was (e.g. a compile over several
processes against one in-process, or against an earlier commit)::

    python scripts/same_program.py CACHE_A CACHE_B

Each cache's compiled-model entries are read in listing order; their manifests compared key
by key, ignoring the compile's timings. Prints every field that differs (for a long text,
whether it is the same when its ``// Function:`` chunks are sorted), then the count. Exit 0
when only the compiler's version differs, 1 otherwise.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

_IGNORED = {"timings_s"}  # (when each phase ran: never the same twice)


def programs(cache_dir: str) -> list[Any]:
    """The manifests of the compiled-model entries of ``cache_dir``."""
    from litekiln.artifact.texts import decompress
    from litekiln.cache.store import CacheStore

    store = CacheStore.open(Path(cache_dir))
    out = []
    for summary in store.ls():
        if summary.kind != "model":
            continue
        entry = store.get(summary.key)
        assert entry is not None
        for name in entry.part_names:
            if name.startswith("artifact"):
                out.append(json.loads(decompress(entry.part(name))))
    return out


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where ``a`` and ``b`` differ, as paths."""
    if type(a) is not type(b):
        return [f"{path}: {type(a).__name__} against {type(b).__name__}"]
    if isinstance(a, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            if key in _IGNORED:
                continue
            if key not in a or key not in b:
                out.append(f"{path}/{key}: in one only")
            else:
                out += differences(a[key], b[key], f"{path}/{key}")
        return out
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items against {len(b)}"]
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in differences(x, y, f"{path}[{i}]")
        ]
    if a == b:
        return []
    if isinstance(a, str) and len(a) > 200:
        same = sorted(a.split("\n// Function: ")) == sorted(b.split("\n// Function: "))
        return [
            f"{path}: texts differ ({len(a)} and {len(b)} characters; same when sorted: {same})"
        ]
    return [f"{path}: {a!r:.80} against {b!r:.80}"]


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    a, b = programs(sys.argv[1]), programs(sys.argv[2])
    found = differences(a, b)
    for line in found:
        print(line)
    real = [d for d in found if "/versions/compiler" not in d]
    print(
        f"{len(a)} and {len(b)} programs; {len(found)} differences, "
        f"{len(real)} beyond the compiler's version"
    )
    return 1 if real else 0


if __name__ == "__main__":
    sys.exit(main())
