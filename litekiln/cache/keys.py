"""Cache keys: the one place that says what every kind of entry is keyed by.

A key is the sha256 of the canonical JSON of its fields; the fields are stored in the entry too,
so that ``cache ls``/``info`` can show them. Four kinds of entries:

* a **compiled model** (`model_key_fields`): the model token, every compile option, the
  litekiln version, a hash of the compiler's own sources (`compiler_hash`) and the target. The
  TVM version is not in the key, because a runtime-only install has no TVM to ask: the entry
  records the version that made it, and where TVM is installed a different one is a miss
  (`ModelCache.load_model`).
* a **shared constant** (`shared_key_fields`): the sha256 of its bytes, its dtype and shape:
  a constant that compiled models need and no recipe rebuilds from the model, stored once
  whichever entries need it (content-addressed);
* a **device program** (`program_key_fields`): the digest of the exact source handed to the
  OpenCL driver (`litekiln.runtime.profile.DriverProgram.digest`: a sha256 over the sha256 of
  each piece, the device patch the runtime prepends and the compiled program's own source, so
  that a warm start keys its binary without reading the source) and the exact build options
  (after every device patch the runtime applies), the device's identity (platform, vendor,
  name, versions, driver) and the litekiln version. Whatever changes what the driver is given
  changes the key.
* a **GPU record** (`gpu_key_fields`): the device choice (``""`` or ``"gpu"``) and the
  litekiln version: what an NVIDIA start learnt about the GPU that choice opened, so that a
  later start opens it through CUDA alone (`litekiln.runtime.device.CudaStart`; the record
  itself says which GPU and drivers it holds for).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from litekiln.artifact.versions import compiler_hash, litekiln_version

if TYPE_CHECKING:
    from litekiln.artifact.compiled import CompileOptions

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

    The store does not look at the world to build keys: `model_key_fields` and
    `program_key_fields` gather the fields. Conventional names that ``ls`` picks out are
    ``token``, ``model_name`` and ``options``.

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


def model_key_fields(token: str, options: CompileOptions) -> dict[str, Any]:
    """The fields of a compiled model's key (see the module docstring)."""
    return {
        "kind": "model",
        "token": token,
        "options": options.to_dict(),
        "litekiln": litekiln_version(),
        "compiler": compiler_hash(),
        "target": options.target,
    }


def shared_key_fields(sha256: str, dtype: str, shape: Sequence[int]) -> dict[str, Any]:
    """The fields of a shared constant's key: its contents (sha256 of its little-endian
    bytes), dtype (numpy's ``dtype.str``) and shape."""
    return {"kind": "weights", "sha256": sha256, "dtype": dtype, "shape": [int(d) for d in shape]}


def program_key_fields(
    source_digest: str, build_options: Sequence[str], identity: Mapping[str, str]
) -> dict[str, Any]:
    """The fields of a device program's key.

    Args:
        source_digest: the digest of the exact OpenCL C handed to the driver
            (`DriverProgram.digest`).
        build_options: the exact build options handed to the driver, in order.
        identity: the device's identity (platform, vendor, name, versions, driver).
    """
    return {
        "kind": "binary",
        "source": source_digest,
        "build_options": list(build_options),
        "litekiln": litekiln_version(),
        **identity,
    }


def gpu_key_fields(choice: str) -> dict[str, Any]:
    """The fields of the key of the GPU record of the device choice ``choice``."""
    return {"kind": "gpu", "choice": choice, "litekiln": litekiln_version()}
