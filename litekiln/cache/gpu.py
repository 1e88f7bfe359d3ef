"""GPU records: what an NVIDIA start learnt about the GPU a device choice opened
(`litekiln.runtime.device.known_gpu`), kept as an entry of kind ``"device"``.

Apart from `litekiln.cache.models` so that reading one at the very start of a warm start
(`litekiln.loading.open_device`, on the device opener's thread) imports the store alone, not
the compiled-model format.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from litekiln.cache.keys import gpu_key_fields, make_key
from litekiln.cache.store import CacheStore

_RECORD_PART = "record.json"


def load_gpu(store: CacheStore, choice: str) -> dict[str, Any] | None:
    """The record of the GPU that the device choice ``choice`` opened before, or None."""
    entry = store.get(make_key(gpu_key_fields(choice)), kind="device")
    if entry is None:
        return None
    try:
        record = json.loads(entry.part(_RECORD_PART))
    except (KeyError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def save_gpu(store: CacheStore, choice: str, record: Mapping[str, Any]) -> bool:
    """Store the record of the GPU that the device choice ``choice`` opened (unless the same
    record is stored already). Returns True if it is stored."""
    if load_gpu(store, choice) == dict(record):
        return True
    fields = gpu_key_fields(choice)
    data = json.dumps(dict(record), sort_keys=True).encode()
    profile = record.get("profile")
    meta = {"device": str(profile.get("name", "")) if isinstance(profile, dict) else ""}
    return store.put(make_key(fields), fields, {_RECORD_PART: data}, kind="device", meta=meta)
