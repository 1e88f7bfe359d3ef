"""The kinds of entries litekiln caches, over :class:`~litekiln.cache.store.CacheStore`.

(a) compiled models (`load_model`/`save_model`): the manifest of a
    :class:`~litekiln.artifact.compiled.CompiledModel` and the constants that are not the
    model's weights. Those with a recipe (:mod:`litekiln.artifact.weights`) are not stored:
    they are rebuilt from the model at load, and checked against it;
(b) shared constants (kind ``"weights"``): a constant of 4 KiB or more that no recipe
    rebuilds (weights an emitter computed, say) is stored once, keyed by its contents, and
    every compiled model that uploads it (the fp32 and fp16 entries of one model, two models)
    names that entry in its ``meta["needs"]``;
(c) device programs (`load_program`/`save_program`): the driver's binary of one partition's
    program and the tuning choices made with it on that device.

A compiled model's entry has these parts: ``artifact.json.lzma`` (the manifest, LZMA primed
with the plans' dictionary, `litekiln.artifact.texts`), its programs' texts apart
(``source.json.lzma``: the OpenCL C, ~100x compressed; ``ptx.json.lzma``
where the compiler made PTX), read only when a program is built from source (`_Texts`: a
warm start keys its device binary by the source's digest), and ``constants.bin`` (the small
constants without a recipe, packed; absent when there are none). Its meta records the model
file's size and the shared constants' bytes, so that ``litekiln cache ls`` shows what an
entry costs against its model.

What each is keyed by is said, and built, in `litekiln.cache.keys` only. No TVM import here.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from litekiln.artifact.compiled import CompiledModel, CompileOptions
from litekiln.artifact.texts import compress, decompress, packed_texts
from litekiln.artifact.versions import tvm_version
from litekiln.artifact.weights import WeightMismatch
from litekiln.cache import gpu
from litekiln.cache.errors import CacheWarning
from litekiln.cache.keys import (
    make_key,
    model_key_fields,
    program_key_fields,
    shared_key_fields,
)
from litekiln.cache.problems import log
from litekiln.cache.store import CacheStore
from litekiln.model.ir import Model

_ARTIFACT_PART = "artifact.json.lzma"
#: Each partition's OpenCL C, and its PTX where the compiler made some (JSON lists, LZMA),
#: apart from the manifest: a warm start runs the stored device binary and never
#: decompresses them (`_Texts`).
_SOURCE_PART = "source.json.lzma"
_PTX_PART = "ptx.json.lzma"
_PACKED_PART = "constants.bin"
_SHARED_PART = "data"
_GRAPH_PART = "cuda_graph.json"  # a program verified as a CUDA graph: on which GPU
_CUBIN_PART = "cubin"  # a verified program's device code on that GPU

#: Constants without a recipe of at least this many bytes are stored once, shared by contents
#: (kind "weights"); smaller ones are packed into the compiled model's entry.
SHARED_MIN_BYTES = 4096
#: Offsets of packed constants are multiples of this (any dtype's alignment).
_ALIGN = 16


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

    def load_model(
        self, token: str, options: CompileOptions, model: Model | None = None
    ) -> CompiledModel | None:
        """The cached compilation of a model, or None (miss, stale or damaged entry).

        Args:
            token: the model token.
            options: the compile options.
            model: the model the token names: the constants that are its weights are rebuilt
                from it and checked against it (`CompiledModel.bind_weights`); an entry made
                from other weights is dropped with a `CacheWarning` and is a miss. None: those
                constants are left out (enough to read the plan, not to run it).
        """
        key = self.model_key(token, options)
        entry = self.store.get(key, kind="model")
        if entry is None:
            return None
        try:
            doc = json.loads(decompress(entry.part(_ARTIFACT_PART)))
            manifest = doc["compiled"]
            have = tvm_version()
            made_by = manifest.get("versions", {}).get("tvm", "")
            if have is not None and made_by and made_by != have:
                self.store.delete(key)  # compiled by another TVM: recompile here
                return None
            facts = _defer_texts(manifest)
            constants = _unpack(entry, doc["packed"])
            for name, shared_key in doc["shared"].items():
                shared = self.store.get(shared_key, kind="weights")
                if shared is None:
                    log.info("compiled model %s: shared constant %s is gone", key[:12], name)
                    return None  # evicted or damaged: recompiling stores it again
                constants[name] = shared.array(_SHARED_PART)
            compiled = CompiledModel.from_manifest(manifest, constants)
            if facts:
                texts = _Texts(entry, len(compiled.partitions))
                for i, (part, known) in enumerate(zip(compiled.partitions, facts, strict=True)):
                    part.program.defer_texts(known, texts.loader(_SOURCE_PART, i, known),
                                             texts.loader(_PTX_PART, i, None))  # fmt: skip
            if model is not None:
                compiled.bind_weights(model)
                missing = compiled.missing_constants()
                if missing:
                    raise ValueError(f"constants {missing[:3]} are neither stored nor rebuilt")
            return compiled
        except WeightMismatch as exc:
            name = model.name if model is not None else "the model"
            self._drop(
                key,
                f"compiled model {key[:12]} does not fit the weights of {name} ({exc}); "
                "dropped, recompiling.",
            )
            return None
        except (ValueError, KeyError, TypeError, lzma.LZMAError) as exc:
            self._drop(
                key, f"compiled model {key[:12]} is unreadable ({exc}); dropped, recompiling."
            )
            return None

    def _drop(self, key: str, message: str) -> None:
        warnings.warn(f"litekiln cache: {message}", CacheWarning, stacklevel=3)
        self.store.delete(key)

    def save_model(self, compiled: CompiledModel) -> bool:
        """Store a compiled model (atomically; a failure leaves no partial entry).

        The constants with a weight recipe are not stored; the other ones are packed into the
        entry, or, from `SHARED_MIN_BYTES` on, stored once by contents (shared).

        Returns:
            True if stored.
        """
        packed: dict[str, Any] = {}
        shared: dict[str, str] = {}
        blob = bytearray()
        shared_bytes = 0
        for name, arr in compiled.stored_constants().items():
            arr = np.asarray(arr, dtype=arr.dtype.newbyteorder("<"), order="C")
            if arr.nbytes >= SHARED_MIN_BYTES:
                shared_key = self._save_shared(arr)
                if shared_key is None:
                    return False
                shared[name] = shared_key
                shared_bytes += arr.nbytes
                continue
            blob.extend(b"\0" * (-len(blob) % _ALIGN))
            packed[name] = [len(blob), arr.dtype.str, list(arr.shape)]
            blob.extend(arr.tobytes())
        manifest, sources, ptx = compiled.split_texts()
        stats = manifest["stats"] = _stored_stats(compiled.stats)
        doc = {"compiled": manifest, "packed": packed, "shared": shared}
        parts: dict[str, Any] = {
            _ARTIFACT_PART: compress(json.dumps(doc, separators=(",", ":")).encode(), "plan"),
            _SOURCE_PART: packed_texts(sources),
        }
        if any(ptx):
            parts[_PTX_PART] = packed_texts(ptx, dictionary=None)
        if blob:
            parts[_PACKED_PART] = bytes(blob)
        meta = {
            "model_name": compiled.model_name,
            "versions": compiled.versions,
            "stats": stats,
            "model_bytes": compiled.model_bytes,
            "needs": sorted(set(shared.values())),
            "shared_bytes": shared_bytes,
        }
        fields = model_key_fields(compiled.token, compiled.options)
        return self.store.put(make_key(fields), fields, parts, kind="model", meta=meta)

    def _save_shared(self, arr: np.ndarray) -> str | None:
        """The key of the shared entry holding ``arr`` (stored unless it is there already)."""
        digest = hashlib.sha256(arr.reshape(-1).data.cast("B")).hexdigest()
        fields = shared_key_fields(digest, arr.dtype.str, arr.shape)
        key = make_key(fields)
        if self.store.has(key):
            return key
        meta = {"dtype": arr.dtype.name, "shape": list(arr.shape)}
        stored = self.store.put(key, fields, {_SHARED_PART: arr}, kind="weights", meta=meta)
        return key if stored else None

    # -- device binaries ------------------------------------------------------------------

    def load_program(
        self, source_digest: str, build_options: Sequence[str], identity: Mapping[str, str]
    ) -> tuple[bytes | None, list[int] | None]:
        """The binary the driver built from exactly the source of ``source_digest``
        (`DriverProgram.digest`) and ``build_options`` on the device ``identity`` names, and
        the variants chosen there if it was tuned."""
        fields = program_key_fields(source_digest, build_options, identity)
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
        source_digest: str,
        build_options: Sequence[str],
        identity: Mapping[str, str],
        binary: bytes,
        tuning: list[int] | None = None,
        *,
        model_name: str | None = None,
        model_token: str | None = None,
        cuda_uuid: str | None = None,
        cubin: bytes | None = None,
    ) -> bool:
        """Store the binary built from the source of ``source_digest`` and ``build_options``
        on the device ``identity`` names (and the tuning choices made on that device with it).

        Args:
            source_digest: the digest of the exact OpenCL C handed to the driver
                (`DriverProgram.digest`).
            build_options: the exact build options handed to the driver.
            identity: the device's identity (`DeviceProfile.identity`).
            binary: the driver's binary.
            tuning: the schedule variants chosen on this device, if tuned.
            model_name: the model the program belongs to (``CompiledModel.model_name``), for
                ``litekiln cache ls``/``info``; not part of the key.
            model_token: that model's token (``CompiledModel.token``), likewise.
            cuda_uuid: the GPU (CUDA UUID) where this binary, with these choices, ran as a CUDA
                graph and gave the OpenCL path's outputs (`load_graph` finds it then).
            cubin: with ``cuda_uuid``: the device code that graph ran (the binary's PTX
                linked on that GPU), so that a later start compiles nothing.

        Returns:
            True if stored.
        """
        fields = program_key_fields(source_digest, build_options, identity)
        parts: dict[str, Any] = {"binary": binary}
        if tuning is not None:
            parts["tuning"] = json.dumps(tuning).encode()
        if cuda_uuid is not None:
            parts[_GRAPH_PART] = json.dumps({"cuda_uuid": cuda_uuid}).encode()
            if cubin is not None:
                parts[_CUBIN_PART] = cubin
        meta: dict[str, Any] = {"device": dict(identity)}
        if model_name is not None:
            meta["model_name"] = model_name
        if model_token is not None:
            meta["model_token"] = model_token
        return self.store.put(make_key(fields), fields, parts, kind="program", meta=meta)

    def load_graph(
        self,
        source_digest: str,
        build_options: Sequence[str],
        identity: Mapping[str, str],
        cuda_uuid: str,
    ) -> tuple[bytes, list[int] | None, bytes | None] | None:
        """The binary, tuning choices and cubin (None if not stored) under this key
        (`load_program`) if they were verified as a CUDA graph on the GPU ``cuda_uuid``
        (`save_program`), else None."""
        fields = program_key_fields(source_digest, build_options, identity)
        entry = self.store.get(make_key(fields), kind="program")
        if entry is None or _GRAPH_PART not in entry.part_names:
            return None
        try:
            mark = json.loads(entry.part(_GRAPH_PART))
            if mark.get("cuda_uuid") != cuda_uuid:
                return None
        except (KeyError, ValueError, AttributeError):
            return None
        binary, choices = self.load_program(source_digest, build_options, identity)
        if binary is None or ("tuning" in entry.part_names and choices is None):
            return None
        cubin = None
        if _CUBIN_PART in entry.part_names:
            try:
                cubin = entry.part(_CUBIN_PART)
            except (KeyError, ValueError):
                return None  # (damaged: the ordinary start verifies and stores it again)
        return binary, choices, cubin

    def load_gpu(self, choice: str) -> dict[str, Any] | None:
        """`litekiln.cache.gpu.load_gpu` on this cache."""
        return gpu.load_gpu(self.store, choice)

    def save_gpu(self, choice: str, record: Mapping[str, Any]) -> bool:
        """`litekiln.cache.gpu.save_gpu` on this cache."""
        return gpu.save_gpu(self.store, choice, record)


def _stored_stats(stats: Mapping[str, Any]) -> dict[str, Any]:
    """A compiled model's stats as its entry keeps them: the compile's total time only, to the
    hundredth of a second, not each phase's: those digits were 5% of a small model's entry
    (smoke's), and nothing that reads the cache used them (the compiler's own
    `CompiledModel.stats` keeps them)."""
    out = dict(stats)
    timings = out.get("timings_s")
    if isinstance(timings, Mapping) and isinstance(timings.get("total"), (int, float)):
        out["timings_s"] = {"total": round(float(timings["total"]), 2)}
    return out


def _defer_texts(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Take the text facts out of each stored program of ``manifest`` (an entry that keeps
    its texts apart: `save_model`), leaving an empty source for `GpuProgram.from_dict`; []
    for an entry that holds its texts inline."""
    programs = [p["program"] for p in manifest["partitions"]]
    if not programs or any("texts" not in p for p in programs):
        return []
    facts = []
    for p in programs:
        facts.append(p.pop("texts"))
        p["source"] = ""
    return facts


class _Texts:
    """The OpenCL C and PTX parts of one compiled model's entry: held compressed (read and
    checked with the entry), decompressed the first time a program reads one."""

    def __init__(self, entry: Any, partitions: int) -> None:
        if _SOURCE_PART not in entry.part_names:
            raise ValueError(f"the entry lists its programs' texts apart but has no {_SOURCE_PART}")
        self._raw = {n: entry.part(n) for n in (_SOURCE_PART, _PTX_PART) if n in entry.part_names}
        self._partitions = partitions
        self._lists: dict[str, list[str]] = {}
        self._lock = threading.Lock()

    def loader(self, part: str, index: int, known: dict[str, Any] | None) -> Any:
        """A loader of partition ``index``'s text in ``part`` (`GpuProgram.defer_texts`);
        None where the entry has no such part (a program without PTX)."""
        if part not in self._raw:
            return None
        return lambda: self._text(part, index, known)

    def _text(self, part: str, index: int, known: dict[str, Any] | None) -> str:
        with self._lock:
            texts = self._lists.get(part)
            if texts is None:
                texts = json.loads(decompress(self._raw[part]))
                if not isinstance(texts, list) or len(texts) != self._partitions:
                    raise ValueError(f"cache part {part} does not list one text per partition")
                self._lists[part] = texts
        text = str(texts[index])
        if known is not None:
            digest = hashlib.sha256(text.encode()).hexdigest()
            if digest != known["source_sha256"]:
                raise ValueError(
                    f"cache part {part}: partition {index}'s source is not the one stored"
                )
        return text


def _unpack(entry: Any, packed: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The packed constants of a compiled model's entry (read-only views).

    Raises:
        KeyError, ValueError, TypeError: the index does not fit the packed bytes.
    """
    if not packed:
        return {}
    data = entry.part(_PACKED_PART)
    out = {}
    for name, (offset, dtype, shape) in packed.items():
        dt = np.dtype(dtype)
        if dt.kind not in "biuf":
            raise ValueError(f"packed constant {name!r} of dtype {dtype}")
        count = int(np.prod(shape, dtype=np.int64))
        if offset < 0 or offset + count * dt.itemsize > len(data):
            raise ValueError(f"packed constant {name!r} lies outside {_PACKED_PART}")
        out[str(name)] = np.frombuffer(data, dt, count, int(offset)).reshape(shape)
    return out
