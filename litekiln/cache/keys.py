"""Cache keys: a sha256 over canonical JSON of every field that changes what is stored."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

_KEY_RE = re.compile(r"[0-9a-f]{64}")


def canonical_json(value: Any) -> bytes:
    """Serialize `value` to one canonical byte string (sorted keys, no spaces, UTF-8).

    Args:
        value: JSON data: dict (str keys), list, tuple, str, int, float, bool or None.

    Returns:
        The UTF-8 bytes; equal values give equal bytes, whatever their dict order.

    Raises:
        TypeError: `value` holds something JSON cannot represent.
        ValueError: `value` holds NaN or infinity (no canonical JSON form).
    """
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def make_key(fields: dict[str, Any]) -> str:
    """The cache key of an entry: sha256 hex of the canonical JSON of `fields`.

    The cache does not look at the world to build keys; callers pass everything that changes
    what the entry holds. For a compiled model: model token, options, litekiln version, hash
    of the compiler's sources, TVM version, target. For a device program binary: source hash,
    build options, platform/device vendor, name, version and driver version. The fields are
    stored in the entry too, so ``ls``/``info`` can show them; conventional names that
    ``ls`` picks out are ``token``, ``model_name`` and ``options``.

    Args:
        fields: JSON data (see `canonical_json`); nested dicts and lists are fine.

    Returns:
        64 lowercase hex digits.

    Raises:
        TypeError: `fields` is not a dict or holds something JSON cannot represent.
        ValueError: `fields` holds NaN or infinity.
    """
    if not isinstance(fields, dict):
        raise TypeError(f"cache key fields must be a dict, got {type(fields).__name__}")
    return hashlib.sha256(canonical_json(fields)).hexdigest()


def is_key(text: str) -> bool:
    """Whether `text` is a full cache key (64 lowercase hex digits)."""
    return isinstance(text, str) and _KEY_RE.fullmatch(text) is not None
