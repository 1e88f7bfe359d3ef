"""Reading entries: a verified `Entry`, or an `EntrySummary` from its manifest alone.

A reader checks every part's size and sha256. If a check fails while the manifest changed
under the reader (a concurrent writer replaced the entry and deleted the old parts), that is
not corruption: it reads the new entry instead.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from litekiln.cache.backend import Backend, UnsafeValueError
from litekiln.cache.index import MANIFEST, entry_keys, has_entry, stored_manifest
from litekiln.cache.manifest import CorruptError, check_part, decode_array, decode_manifest
from litekiln.cache.usage import last_use

# How often a reader starts again because the entry was replaced while it read.
_READ_ATTEMPTS = 5


class Entry:
    """A complete, verified cache entry: its manifest and its parts' bytes.

    Every part was checked against its size and sha256 before the entry was returned.
    Treat the manifest and the returned bytes/arrays as read-only.
    """

    def __init__(self, manifest: dict[str, Any], parts: dict[str, bytes]) -> None:
        self.manifest = manifest
        self._records = {rec["name"]: rec for rec in manifest["parts"]}
        self._parts = parts

    @property
    def key(self) -> str:
        """The entry's cache key."""
        return str(self.manifest["key"])

    @property
    def kind(self) -> str:
        """``"model"``, ``"program"``, ``"weights"`` or ``"device"``."""
        return str(self.manifest["kind"])

    @property
    def fields(self) -> dict[str, Any]:
        """The key fields the entry was stored with."""
        return dict(self.manifest["fields"])

    @property
    def meta(self) -> dict[str, Any]:
        """The JSON metadata the entry was stored with."""
        return dict(self.manifest["meta"])

    @property
    def created(self) -> float:
        """When the entry was first stored (Unix time)."""
        return float(self.manifest["created"])

    @property
    def part_names(self) -> list[str]:
        """Names of the parts, in the order they were stored."""
        return list(self._records)

    @property
    def size(self) -> int:
        """Total bytes of the parts."""
        return sum(len(b) for b in self._parts.values())

    def part(self, name: str) -> bytes:
        """The bytes of part `name` (for an array part: its raw little-endian data).

        Raises:
            KeyError: no part of that name.
        """
        return self._parts[name]

    def array(self, name: str) -> np.ndarray:
        """Part `name` as the numpy array it was stored from (read-only, no copy).

        Raises:
            KeyError: no part of that name.
            ValueError: the part was stored as bytes, not as an array.
        """
        return decode_array(self._records[name], self._parts[name])

    def __repr__(self) -> str:
        return f"Entry({self.kind} {self.key[:12]}, parts={self.part_names})"


@dataclass(frozen=True)
class EntrySummary:
    """One line of `CacheStore.ls`.

    Attributes:
        key: the full cache key.
        kind: ``"model"``, ``"program"``, ``"weights"`` (a constant compiled models share) or
            ``"device"`` (a GPU record).
        token: the model token: ``fields["token"]``, else ``meta["model_token"]`` (the model a
            device program was built for), if present.
        model_name: ``fields["model_name"]``, else ``meta["model_name"]``, if present.
        device: the device a program binary was built on (its name), else None.
        options: ``fields["options"]`` if present.
        size: bytes held (manifest and parts).
        created: when stored (Unix time).
        last_use: last hit, or `created` (Unix time).
        fields: every key field.
        shared_size: bytes of the shared entries it needs (``meta["shared_bytes"]``), which
            several entries may count.
        model_bytes: size of the model file it was made from (``meta["model_bytes"]``), if
            recorded.
        model_share: ``(size + shared_size) / model_bytes``: what the entry costs against its
            model, if known.
    """

    key: str
    kind: str
    token: Any
    model_name: Any
    device: Any
    options: Any
    size: int
    created: float
    last_use: float
    fields: dict[str, Any]
    shared_size: int = 0
    model_bytes: int | None = None
    model_share: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict of the summary."""
        return asdict(self)


@dataclass
class Loaded:
    """What reading one entry gave: nothing, a verified entry, or a problem."""

    raw: bytes | None = None  # the manifest bytes read (None: no entry)
    entry: Entry | None = None
    problem: str | None = None


def load(backend: Backend, key: str) -> Loaded:
    """Read and verify entry `key`; a concurrent replacement makes it read again.

    Raises:
        OSError, sqlite3.Error, diskcache.Timeout: the storage failed.
    """
    for _ in range(_READ_ATTEMPTS):
        try:
            raw = backend.get(MANIFEST + key)
        except UnsafeValueError as e:
            return Loaded(problem=f"manifest: {e}")
        if raw is None:
            return Loaded()
        try:
            manifest = decode_manifest(raw, key, backend.seal)
            parts = {rec["name"]: _read_part(backend, rec) for rec in manifest["parts"]}
        except (CorruptError, UnsafeValueError) as e:
            # A writer may have swapped the manifest and deleted the parts we were
            # reading: that is not corruption, read the new entry instead.
            if backend.get(MANIFEST + key) != raw:
                continue
            return Loaded(raw=raw, problem=str(e))
        return Loaded(raw=raw, entry=Entry(manifest, parts))
    return Loaded()  # kept changing under us: call it a miss


def _read_part(backend: Backend, rec: dict[str, Any]) -> bytes:
    try:
        data = backend.get(rec["store"])
    except UnsafeValueError as e:
        raise CorruptError(f"part {rec['name']!r}: {e}") from None
    check_part(rec, data)  # raises for a missing part: `data` is bytes below
    assert data is not None
    return data


def summarize(backend: Backend, manifest: dict[str, Any], manifest_size: int) -> EntrySummary:
    """The `EntrySummary` of a decoded manifest of `manifest_size` stored bytes."""
    fields, meta = manifest["fields"], manifest["meta"]
    created = float(manifest["created"])
    size = manifest_size + sum(rec["size"] for rec in manifest["parts"])
    shared = _count(meta.get("shared_bytes")) or 0
    model_bytes = _count(meta.get("model_bytes")) or None
    return EntrySummary(
        key=manifest["key"],
        kind=manifest["kind"],
        token=fields.get("token", meta.get("model_token")),
        model_name=fields.get("model_name", meta.get("model_name")),
        device=(
            fields.get("name")
            if manifest["kind"] == "program"
            else meta.get("device")
            if manifest["kind"] == "device"
            else None
        ),
        options=fields.get("options"),
        size=size,
        created=created,
        last_use=last_use(backend, manifest["key"], created),
        fields=fields,
        shared_size=shared,
        model_bytes=model_bytes,
        model_share=None if model_bytes is None else (size + shared) / model_bytes,
    )


def _count(value: Any) -> int | None:
    """A byte count from an entry's meta: a non-negative int, else None."""
    return value if type(value) is int and value >= 0 else None


def needed(backend: Backend, keys: list[str]) -> list[str]:
    """`keys` and the entries they need (``meta["needs"]``), each once, needs after.

    An entry whose manifest is missing or damaged is kept (its reader reports it); a needed
    key that is not stored is left out.
    """
    out = dict.fromkeys(keys)
    for key in keys:
        raw = stored_manifest(backend, key)
        if raw is None:
            continue
        try:
            needs = decode_manifest(raw, key, backend.seal)["meta"].get("needs", [])
        except CorruptError:
            continue
        if isinstance(needs, list):
            for k in needs:
                if isinstance(k, str) and has_entry(backend, k):
                    out.setdefault(k)
    return list(out)


def scan(backend: Backend) -> list[EntrySummary]:
    """Summaries of every entry whose manifest is intact (parts are not read)."""
    out = []
    for key in entry_keys(backend):
        raw = stored_manifest(backend, key)
        if raw is None:
            continue
        try:
            out.append(summarize(backend, decode_manifest(raw, key, backend.seal), len(raw)))
        except CorruptError:
            continue
    return out


def describe(backend: Backend, key: str, raw: bytes) -> dict[str, Any]:
    """What the stored manifest `raw` of entry `key` says, for ``cache info``.

    Returns:
        The `EntrySummary` fields plus ``meta`` and ``parts`` (without storage keys), or
        ``{"key", "problem"}`` if the manifest is damaged.
    """
    try:
        manifest = decode_manifest(raw, key, backend.seal)
    except CorruptError as e:
        return {"key": key, "problem": str(e)}
    info = summarize(backend, manifest, len(raw)).as_dict()
    info["meta"] = manifest["meta"]
    info["parts"] = [{k: v for k, v in rec.items() if k != "store"} for rec in manifest["parts"]]
    return info
