"""The entry manifest: JSON that lists an entry's parts with their sizes and sha256.

Stored form: ``b"LKZ2 " + HMAC-SHA256(cache secret, packed) hex + b"\\n" + packed``, packed
being the body deflated (raw deflate, level 9) against the preset dictionary `_ZDICT`, and the
body canonical JSON of::

    {"schema": 2, "key": <64 hex>, "kind": "model" | "program" | "weights", "fields": {...},
     "meta": {...}, "created": <unix time>,
     "parts": [{"name": str, "store": <storage key>, "size": int, "sha256": <64 hex>,
                ["dtype": "<f4", "shape": [..]]}, ...]}

The manifest is signed with the cache's own secret (``seal.py``), and lists each part's
sha256, so a flipped byte anywhere (even one that keeps the JSON valid), or an entry changed
outside litekiln with its checksums recomputed, is caught. Its key must equal
`make_key(fields)`, so an entry cannot pretend to be another one. Parts with
``dtype``/``shape`` are raw little-endian arrays. An export carries the bodies alone, plain
(``archive.py``): another cache has another secret.

The body is deflated because a small model's entry is mostly its manifest: smoke's (31 KB
model) was 1434 of the entry's 5182 bytes as plain JSON, 345 deflated against the dictionary
(the field names and the values every entry repeats; 745 without it). Manifests stored plain,
``b"LKM2 "`` + HMAC(body) + ``b"\\n"`` + body, as litekiln wrote them until then, are still read.
"""

from __future__ import annotations

import hashlib
import json
import zlib
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

_MAGIC = b"LKZ2 "  # a deflated body (written)
_PLAIN_MAGIC = b"LKM2 "  # a plain body (read only)
_HEADER_LEN = len(_MAGIC) + 64 + 1
#: The largest body a stored manifest may inflate to (a manifest lists a few parts: ~2 KB).
MAX_BODY_BYTES = 1 << 20
#: The deflate dictionary of manifest bodies: what every body repeats. Never edit it: the
#: manifests written with it are read with it. Another dictionary needs another magic.
_ZDICT = (
    b'{"created":1800000000.0,"fields":{"build_options":[],"driver":"","kind":"binary",'
    b'"litekiln":"0.1.0","name":"","platform":"NVIDIA CUDA","platform_version":"OpenCL 3.0 '
    b'CUDA","source":"","vendor":"NVIDIA Corporation","version":"OpenCL 3.0 CUDA"},"key":"",'
    b'"kind":"program","meta":{"device":{"driver":"","name":"","platform":"","vendor":""},'
    b'"model_name":"","model_token":""},"parts":[{"name":"binary","sha256":"","size":0,'
    b'"store":"part:"},{"name":"tuning","sha256":"","size":0,"store":"part:"}],"schema":2}'
    b'{"created":1800000000.0,"fields":{"digest":"","dtype":"<f4","kind":"weights",'
    b'"shape":[]},"key":"","kind":"weights","meta":{"dtype":"float32","shape":[]},"parts":[{'
    b'"dtype":"<f4","name":"data","sha256":"","shape":[],"size":0,"store":"part:"}],'
    b'"schema":2}{"created":1800000000.0,"fields":{"compiler":"","kind":"model",'
    b'"litekiln":"0.1.0","options":{"allow_quantized":true,"fp16_budget":0.0025,"half":'
    b'"native","max_partitions":0,"min_partition_ops":0,"op_table":"extended","precision":'
    b'"fp32","preserve_all_tensors":false,"quant_simulation":true,"schedules":"fast","target":'
    b'"opencl","tuning":true},"target":"opencl","token":""},"key":"","kind":"model","meta":{'
    b'"model_bytes":0,"model_name":"","needs":[],"shared_bytes":0,"stats":{"cpu_ops":0,'
    b'"gpu_ops":0,"kernels":0,"timings_s":{"lower":0.0,"opencl_codegen":0.0,"partition":0.0,'
    b'"relax":0.0,"tir":0.0,"total":0.0,"variant_budget":0.0,"weights":0.0},"variants":0,'
    b'"variants_trimmed":0},"versions":{"compiler":"","litekiln":"0.1.0","tvm":"0.27.0.post1"'
    b'}},"parts":[{"name":"artifact.json.lzma","sha256":"","size":0,"store":"part:"},{"name":'
    b'"source.json.lzma","sha256":"","size":0,"store":"part:"},{"name":"constants.bin",'
    b'"sha256":"","size":0,"store":"part:"}],"schema":2}'
)
# Array parts hold plain numbers only: bool, ints, floats, complex (never objects).
ARRAY_KINDS = "biufc"


class CorruptError(Exception):
    """A stored manifest or part fails its checks; the message says which and how."""


def encode_manifest(manifest: dict[str, Any], seal: Seal) -> bytes:
    """Serialize `manifest`: its body deflated, with its signature header.

    Raises:
        OSError: `seal` has no secret.
    """
    packed = pack_body(canonical_json(manifest))
    return _MAGIC + seal.sign(packed) + b"\n" + packed


def pack_body(body: bytes) -> bytes:
    """A manifest body as stored: deflated against `_ZDICT` (what the signature covers)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zdict=_ZDICT)
    return packer.compress(body) + packer.flush()


def manifest_body(raw: bytes) -> bytes:
    """The body (canonical JSON) of a stored manifest, without its signature header; its
    signature is not checked.

    Raises:
        CorruptError: the header is damaged, or the body does not inflate.
    """
    magic, _, stored = _split(raw)
    return _inflate(stored) if magic == _MAGIC else stored


def _split(raw: bytes) -> tuple[bytes, bytes, bytes]:
    """(magic, signature, stored body) of a stored manifest.

    Raises:
        CorruptError: the header is damaged.
    """
    magic = raw[: len(_MAGIC)]
    if (
        len(raw) < _HEADER_LEN
        or magic not in (_MAGIC, _PLAIN_MAGIC)
        or raw[_HEADER_LEN - 1] != 0x0A
    ):
        raise CorruptError("manifest header is damaged")
    return magic, raw[len(_MAGIC) : _HEADER_LEN - 1], raw[_HEADER_LEN:]


def _inflate(packed: bytes) -> bytes:
    """The body a deflated manifest holds, at most `MAX_BODY_BYTES`.

    Raises:
        CorruptError: the data is not one complete deflate stream of at most that size.
    """
    unpacker = zlib.decompressobj(-15, zdict=_ZDICT)
    try:
        body = unpacker.decompress(packed, MAX_BODY_BYTES)
    except zlib.error as e:
        raise CorruptError(f"manifest body does not inflate ({e})") from None
    if unpacker.unconsumed_tail or not unpacker.eof or unpacker.unused_data:
        raise CorruptError(
            f"manifest body is not one deflate stream of at most {MAX_BODY_BYTES} bytes"
        )
    return body


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
    magic, mac, stored = _split(raw)
    if not seal.check(stored, mac):
        raise CorruptError(
            "manifest fails its signature check (damaged, changed outside litekiln, or "
            "signed with another cache's secret)"
            if seal.usable
            else "manifest cannot be checked: the cache has no secret"
        )
    body = _inflate(stored) if magic == _MAGIC else stored
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
        arr = np.asarray(value, dtype=value.dtype.newbyteorder("<"), order="C")
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
