"""The entry manifest: JSON that lists an entry's parts with their sizes and sha256.

Stored form: ``b"LKM2 " + HMAC-SHA256(cache secret, body) hex + b"\\n" + body``, body being
canonical JSON of::

    {"schema": 2, "key": <64 hex>, "kind": "model" | "program" | "weights", "fields": {...},
     "meta": {...}, "created": <unix time>,
     "parts": [{"name": str, "store": <storage key>, "size": int, "sha256": <64 hex>,
                ["dtype": "<f4", "shape": [..]]}, ...]}

The manifest is signed with the cache's own secret (``seal.py``), and lists each part's
sha256, so a flipped byte anywhere (even one that keeps the JSON valid), or an entry changed
outside litekiln with its checksums recomputed, is caught. Its key must equal
`make_key(fields)`, so an entry cannot pretend to be another one. Parts with
``dtype``/``shape`` are raw little-endian arrays. An export carries the bodies alone
(``archive.py``): another cache has another secret.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from litekiln.cache.keys import canonical_json, is_key, make_key
from litekiln.cache.seal import Seal

#: Bump when the entry layout changes; the store keeps each schema in its own subfolder.
#: 2: manifests signed with the cache's secret (1: a plain sha256).
SCHEMA_VERSION = 2

#: What an entry can hold: a compiled model, one device program binary, one constant that
#: compiled models share ("weights"), or the record of a GPU a device choice opened ("device").
#: The last two were added within schema 2: a reader that does not know the kind finds such an
#: entry corrupt, which is a miss, never a crash.
KINDS = ("model", "program", "weights", "device")

_MAGIC = b"LKM2 "
_HEADER_LEN = len(_MAGIC) + 64 + 1
# Array parts hold plain numbers only: bool, ints, floats, complex (never objects).
ARRAY_KINDS = "biufc"


class CorruptError(Exception):
    """A stored manifest or part fails its checks; the message says which and how."""


def encode_manifest(manifest: dict[str, Any], seal: Seal) -> bytes:
    """Serialize `manifest` with its signature header.

    Raises:
        OSError: `seal` has no secret.
    """
    body = canonical_json(manifest)
    return _MAGIC + seal.sign(body) + b"\n" + body


def manifest_body(raw: bytes) -> bytes:
    """The body (canonical JSON) of a stored manifest, without its signature header."""
    return raw[_HEADER_LEN:]


def part_store_prefix(key: str) -> str:
    """Storage-key prefix of every part of entry `key` (any writer, any attempt)."""
    return f"part:{key}:"


def decode_manifest(raw: bytes, key: str, seal: Seal) -> dict[str, Any]:
    """Check and parse a stored manifest of entry `key`.

    Args:
        raw: the stored bytes.
        key: the key the manifest was found under.
        seal: the cache's secret, which signed it.

    Returns:
        The manifest dict (see the module docstring).

    Raises:
        CorruptError: bad header or signature, bad JSON, other schema, wrong key, or a
            malformed field; the message names the problem.
    """
    if len(raw) < _HEADER_LEN or not raw.startswith(_MAGIC) or raw[_HEADER_LEN - 1] != 0x0A:
        raise CorruptError("manifest header is damaged")
    mac, body = raw[len(_MAGIC) : _HEADER_LEN - 1], raw[_HEADER_LEN:]
    if not seal.check(body, mac):
        raise CorruptError(
            "manifest fails its signature check (damaged, changed outside litekiln, or "
            "signed with another cache's secret)"
            if seal.usable
            else "manifest cannot be checked: the cache has no secret"
        )
    return decode_body(body, key)


def decode_body(body: bytes, key: str) -> dict[str, Any]:
    """Parse and check the body of a manifest of entry `key` (its signature is checked
    elsewhere: `decode_manifest`, or an export's signed index).

    Raises:
        CorruptError: bad JSON, other schema, wrong key, or a malformed field.
    """
    try:
        return _decode_body(body, key)
    except (ValueError, TypeError, OverflowError, RecursionError) as e:
        # Only a crafted body that passed its signature gets here (NaN in its fields, absurd
        # nesting or numbers): still just a corrupt entry, never a crash.
        raise CorruptError(f"manifest is malformed ({type(e).__name__}: {e})") from None


def _decode_body(body: bytes, key: str) -> dict[str, Any]:
    try:
        manifest = json.loads(body)
    except ValueError as e:
        raise CorruptError(f"manifest is not valid JSON ({e})") from None
    if not isinstance(manifest, dict):
        raise CorruptError("manifest is not a JSON object")
    if manifest.get("schema") != SCHEMA_VERSION:
        raise CorruptError(f"manifest schema {manifest.get('schema')!r} != {SCHEMA_VERSION}")
    if manifest.get("key") != key:
        raise CorruptError("manifest belongs to another key")
    if manifest.get("kind") not in KINDS:
        raise CorruptError(f"manifest kind {manifest.get('kind')!r} is not one of {KINDS}")
    fields = manifest.get("fields")
    if not isinstance(fields, dict) or make_key(fields) != key:
        raise CorruptError("manifest fields do not hash to its key")
    if not isinstance(manifest.get("meta"), dict):
        raise CorruptError("manifest meta is not a JSON object")
    if not isinstance(manifest.get("created"), (int, float)):
        raise CorruptError("manifest has no creation time")
    parts = manifest.get("parts")
    if not isinstance(parts, list):
        raise CorruptError("manifest parts is not a list")
    names = set()
    for rec in parts:
        _check_part_record(rec, key)
        if rec["name"] in names:
            raise CorruptError(f"manifest lists part {rec['name']!r} twice")
        names.add(rec["name"])
    return manifest


def _check_part_record(rec: Any, key: str) -> None:
    if not isinstance(rec, dict) or not isinstance(rec.get("name"), str) or not rec["name"]:
        raise CorruptError("manifest has a malformed part record")
    name = rec["name"]
    store = rec.get("store")
    if not isinstance(store, str) or not store.startswith(part_store_prefix(key)):
        raise CorruptError(f"part {name!r} has a bad storage key")
    size = rec.get("size")
    if type(size) is not int or size < 0:
        raise CorruptError(f"part {name!r} has a bad size")
    if not isinstance(rec.get("sha256"), str) or not is_key(rec["sha256"]):
        raise CorruptError(f"part {name!r} has a bad sha256")
    if "dtype" in rec or "shape" in rec:
        try:
            dtype = np.dtype(rec["dtype"])
            shape = tuple(int(d) for d in rec["shape"])
        except (KeyError, TypeError, ValueError):
            raise CorruptError(f"part {name!r} has a bad dtype/shape") from None
        if dtype.kind not in ARRAY_KINDS or any(d < 0 for d in shape):
            raise CorruptError(f"part {name!r} has a bad dtype/shape")
        if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != size:
            raise CorruptError(f"part {name!r}: dtype/shape do not match its size")


def check_part(rec: dict[str, Any], data: bytes | None) -> None:
    """Check one part's bytes against its manifest record.

    Raises:
        CorruptError: the part is missing, has another size, or fails its sha256.
    """
    name = rec["name"]
    if data is None:
        raise CorruptError(f"part {name!r} is missing")
    if len(data) != rec["size"]:
        raise CorruptError(
            f"part {name!r} is truncated or resized ({len(data)} of {rec['size']} bytes)"
        )
    if hashlib.sha256(data).hexdigest() != rec["sha256"]:
        raise CorruptError(f"part {name!r} fails its sha256 check")


def encode_part(name: str, value: Any) -> tuple[bytes, dict[str, Any]]:
    """Bytes to store for one part, and the dtype/shape record for an array.

    Args:
        name: the part's name (any non-empty str).
        value: bytes-like, or a numpy array of numbers (stored raw, little-endian, C order).

    Returns:
        (data, extra manifest fields: ``{}`` or ``{"dtype": ..., "shape": [...]}``).

    Raises:
        TypeError: `value` is neither bytes-like nor a numeric numpy array, or `name` is bad.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"cache part names are non-empty str, got {name!r}")
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in ARRAY_KINDS:
            raise TypeError(f"part {name!r}: dtype {value.dtype} cannot be stored raw")
        # Little-endian on disk whatever the host; '|' dtypes (1 byte) are unchanged.
        arr = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<"))
        return arr.tobytes(), {"dtype": arr.dtype.str, "shape": list(arr.shape)}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value), {}
    raise TypeError(f"part {name!r}: expected bytes or a numpy array, got {type(value).__name__}")


def decode_array(rec: dict[str, Any], data: bytes) -> np.ndarray:
    """The numpy array a part holds (read-only view on `data`).

    Raises:
        ValueError: the part was stored as plain bytes, not as an array.
    """
    if "dtype" not in rec:
        raise ValueError(f"part {rec['name']!r} holds bytes, not an array")
    return np.frombuffer(data, dtype=np.dtype(rec["dtype"])).reshape(rec["shape"])
