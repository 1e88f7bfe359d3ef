"""The two kinds of entries litekiln caches, over :class:`~litekiln.cache.store.CacheStore`.

(a) compiled models (`load_model`/`save_model`): the manifest of a
    :class:`~litekiln.artifact.compiled.CompiledModel` and its constants;
(b) device programs (`load_program`/`save_program`): the driver's binary of one partition's
    program and the tuning choices made with it on that device.

What each is keyed by is said, and built, in `litekiln.cache.keys` only. No TVM import here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from litekiln.artifact.compiled import CompiledModel, CompileOptions
from litekiln.artifact.versions import tvm_version
from litekiln.cache.keys import make_key, model_key_fields, program_key_fields
from litekiln.cache.store import CacheStore

_MANIFEST_PART = "artifact.json"
_CONST_PREFIX = "const/"


class ModelCache:
    """Compiled models and device binaries in one private cache directory."""

    def __init__(self, store: CacheStore) -> None:
        self.store = store

    @classmethod
    def open(cls, cache_dir: str | os.PathLike[str] | None = None) -> ModelCache:
        """Open the cache (default: ``$LITEKILN_CACHE_DIR`` or the XDG cache dir).

        Raises:
            CacheError: an explicitly given directory is unsafe (foreign owner, writable by
                group/others).
        """
        return cls(CacheStore.open(cache_dir))

    # -- compiled models ------------------------------------------------------------------

    def model_key(self, token: str, options: CompileOptions) -> str:
        return make_key(model_key_fields(token, options))

    def load_model(self, token: str, options: CompileOptions) -> CompiledModel | None:
        """The cached compilation of a model, or None (miss, stale or damaged entry)."""
        key = self.model_key(token, options)
        entry = self.store.get(key, kind="model")
        if entry is None:
            return None
        try:
            manifest = json.loads(entry.part(_MANIFEST_PART))
            have = tvm_version()
            made_by = manifest.get("versions", {}).get("tvm", "")
            if have is not None and made_by and made_by != have:
                self.store.delete(key)  # compiled by another TVM: recompile here
                return None
            names = [
                n[len(_CONST_PREFIX) :] for n in entry.part_names if n.startswith(_CONST_PREFIX)
            ]
            constants = {n: entry.array(_CONST_PREFIX + n) for n in names}
            return CompiledModel.from_manifest(manifest, constants)
        except (ValueError, KeyError, TypeError) as exc:
            import warnings

            from litekiln.cache.errors import CacheWarning

            warnings.warn(
                f"litekiln cache: compiled model {key[:12]} is unreadable ({exc}); dropped, "
                "recompiling.",
                CacheWarning,
                stacklevel=2,
            )
            self.store.delete(key)
            return None

    def save_model(self, compiled: CompiledModel) -> bool:
        """Store a compiled model (atomically; a failure leaves no partial entry)."""
        fields = model_key_fields(compiled.token, compiled.options)
        parts: dict[str, Any] = {_MANIFEST_PART: json.dumps(compiled.manifest()).encode()}
        for name, arr in compiled.constants.items():
            parts[_CONST_PREFIX + name] = arr
        meta = {
            "model_name": compiled.model_name,
            "versions": compiled.versions,
            "stats": compiled.stats,
        }
        return self.store.put(make_key(fields), fields, parts, kind="model", meta=meta)

    # -- device binaries ------------------------------------------------------------------

    def load_program(
        self, source: bytes, build_options: Sequence[str], identity: Mapping[str, str]
    ) -> tuple[bytes | None, list[int] | None]:
        """The binary the driver built from exactly ``source`` and ``build_options`` on the
        device ``identity`` names, and the variants chosen there if it was tuned."""
        fields = program_key_fields(source, build_options, identity)
        entry = self.store.get(make_key(fields), kind="program")
        if entry is None:
            return None, None
        try:
            binary = entry.part("binary")
        except (KeyError, ValueError):
            return None, None
        choices = None
        if "tuning" in entry.part_names:
            try:
                raw = json.loads(entry.part("tuning"))
                if isinstance(raw, list) and all(isinstance(c, int) for c in raw):
                    choices = raw
            except (KeyError, ValueError):
                choices = None  # retuned and stored again by the session
        return binary, choices

    def save_program(
        self,
        source: bytes,
        build_options: Sequence[str],
        identity: Mapping[str, str],
        binary: bytes,
        tuning: list[int] | None = None,
        *,
        model_name: str | None = None,
        model_token: str | None = None,
    ) -> bool:
        """Store the binary built from ``source`` and ``build_options`` on the device
        ``identity`` names (and the tuning choices made on that device with it).

        Args:
            source: the exact OpenCL C bytes handed to the driver.
            build_options: the exact build options handed to the driver.
            identity: the device's identity (`DeviceProfile.identity`).
            binary: the driver's binary.
            tuning: the schedule variants chosen on this device, if tuned.
            model_name: the model the program belongs to (``CompiledModel.model_name``), for
                ``litekiln cache ls``/``info``; not part of the key.
            model_token: that model's token (``CompiledModel.token``), likewise.

        Returns:
            True if stored.
        """
        fields = program_key_fields(source, build_options, identity)
        parts: dict[str, Any] = {"binary": binary}
        if tuning is not None:
            parts["tuning"] = json.dumps(tuning).encode()
        meta: dict[str, Any] = {"device": dict(identity)}
        if model_name is not None:
            meta["model_name"] = model_name
        if model_token is not None:
            meta["model_token"] = model_token
        return self.store.put(make_key(fields), fields, parts, kind="program", meta=meta)
