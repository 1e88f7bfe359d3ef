"""Cache faults end to end, through `litekiln.Interpreter` on OpenCL (PoCL in CI).

Each test damages a cache that holds the compiled smoke model (or its directory, or the disk
under it), then constructs a new Interpreter on it. Each ends in the first run's exact outputs
(same kernels: `np.array_equal`) or a clear litekiln error, and in a cache that `verify` finds
clean; where an entry was damaged, the second Interpreter rebuilt it (with a `CacheWarning`)
and a third one is a hit that neither compiles nor builds from source.

The smoke model is compiled once per module into a template cache, copied per test.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import json
import multiprocessing
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from cache_fault_helpers import (
    DATA,
    SMOKE,
    Template,
    changed_smoke,
    copy_cache,
    flip,
    infer,
    keys_by_kind,
    make_template,
    manifest,
    part_storage_key,
    rewrite,
    same,
    snapshot,
    storage_keys,
    the_key,
    val_files,
)

import litekiln.loading as loading
from litekiln.artifact import texts
from litekiln.artifact.texts import compress, decompress
from litekiln.cache import CacheError, CacheStore, CacheWarning, make_key
from litekiln.cache.backend import DiskcacheBackend
from litekiln.cache.manifest import manifest_body, pack_body
from litekiln.cache.models import ModelCache
from litekiln.errors import DeviceError
from litekiln.model import load_model
from litekiln.runtime.profile import DeviceProfile

pytestmark = pytest.mark.opencl

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    return make_template(tmp_path_factory.mktemp("template") / "cache")


@pytest.fixture
def cache(template: Template, tmp_path: Path) -> Path:
    """A private copy of the template cache for one test."""
    return copy_cache(template, tmp_path / "cache")


@dataclass
class Calls:
    compiles: int = 0
    binary_hits: int = 0
    binary_misses: int = 0
    binary_saves: int = 0  # stored successfully


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """Counts compilations and device-binary cache hits, misses and stores."""
    c = Calls()
    real_compile = loading.compile_for
    real_load, real_save = ModelCache.load_program, ModelCache.save_program

    def compile_for(*args, **kwargs):
        c.compiles += 1
        return real_compile(*args, **kwargs)

    def load_program(self, *key):
        binary, choices = real_load(self, *key)
        if binary is None:
            c.binary_misses += 1
        else:
            c.binary_hits += 1
        return binary, choices

    def save_program(self, *args, **kwargs):
        stored = real_save(self, *args, **kwargs)
        c.binary_saves += bool(stored)
        return stored

    monkeypatch.setattr(loading, "compile_for", compile_for)
    monkeypatch.setattr(ModelCache, "load_program", load_program)
    monkeypatch.setattr(ModelCache, "save_program", save_program)
    return c


def _no_compiler(*args, **kwargs):
    raise AssertionError("compile_for was called: the compiled model should have been a hit")


def _assert_clean(directory: Path, models: int = 1, programs: int = 1) -> None:
    """`verify` finds nothing wrong, and exactly the expected entries are there."""
    with CacheStore.open(directory) as s:
        report = s.verify()
        assert report.clean, report.as_dict()
        assert report.entries == models + programs
    kinds = keys_by_kind(directory)
    assert len(kinds.get("model", [])) == models, kinds
    assert len(kinds.get("program", [])) == programs, kinds


def _assert_hit(
    directory: Path, expected: list[np.ndarray], calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A further Interpreter neither compiles nor builds from source, and warns nothing."""
    monkeypatch.setattr(loading, "compile_for", _no_compiler)
    before = Calls(**vars(calls))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        out = infer(directory)
    assert same(out, expected)
    assert calls.binary_hits == before.binary_hits + 1
    assert (calls.binary_misses, calls.binary_saves) == (before.binary_misses, before.binary_saves)


def test_template_is_a_hit(
    template: Template, cache: Path, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    _assert_hit(cache, template.outputs, calls, monkeypatch)
    _assert_clean(cache)


# ---------------------------------------------------------------- damaged entries


def _truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _delete(data: bytes) -> None:
    return None


# name -> (entry kind, part name or prefix (None: the manifest), damage). The smoke model's
# entry has no constant part: every constant is rebuilt from the model file (a changed model
# file: test_model_file_changed_under_a_pinned_token_is_detected_and_rebuilt).
DAMAGE = {
    "flipped byte in artifact.json": ("model", "artifact.json", flip),
    "flipped byte in the device binary": ("program", "binary", flip),
    "flipped byte in a model manifest": ("model", None, flip),
    "flipped byte in a program manifest": ("program", None, flip),
    "truncated artifact.json": ("model", "artifact.json", _truncate),
    "truncated device binary": ("program", "binary", _truncate),
    "truncated model manifest": ("model", None, _truncate),
    "deleted artifact.json file": ("model", "artifact.json", _delete),
    "deleted device binary": ("program", "binary", _delete),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_entry_is_rebuilt(
    template: Template, cache: Path, calls: Calls, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    kind, part, change = DAMAGE[damage]
    key = the_key(cache, kind)
    storage_key = f"manifest:{key}" if part is None else part_storage_key(cache, key, part)
    rewrite(cache, storage_key, change)

    with pytest.warns(CacheWarning, match=f"entry {key[:12]} .* corrupt"):
        out = infer(cache)
    assert same(out, template.outputs)
    if kind == "model":  # recompiled; the device binary (same kernels) still hit
        assert (calls.compiles, calls.binary_hits, calls.binary_saves) == (1, 1, 0)
    else:  # the compiled model hit; the program was built from source and stored again
        assert (calls.compiles, calls.binary_misses, calls.binary_saves) == (0, 1, 1)
    _assert_clean(cache)
    assert the_key(cache, kind) == key  # rebuilt under the same key
    _assert_hit(cache, template.outputs, calls, monkeypatch)


def test_model_file_changed_under_a_pinned_token_is_detected_and_rebuilt(
    template: Template,
    cache: Path,
    calls: Calls,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # The app pins the token the template was compiled under, then ships other weights in the
    # same file layout: the token cannot tell, the weights check does.
    token = load_model(SMOKE).token
    changed = changed_smoke(tmp_path)
    want = infer(None, changed, use_cache=False)
    assert not same(want, template.outputs)
    calls.compiles = 0
    key = the_key(cache, "model")
    with pytest.warns(CacheWarning, match=f"{key[:12]} does not fit the weights of smoke"):
        assert same(infer(cache, changed, model_token=token), want)
    assert calls.compiles == 1 and the_key(cache, "model") == key  # rebuilt under its key
    _assert_clean(cache)  # the same kernels: the device binary was a hit
    with monkeypatch.context() as m, warnings.catch_warnings():
        m.setattr(loading, "compile_for", _no_compiler)
        warnings.simplefilter("error", CacheWarning)
        assert same(infer(cache, changed, model_token=token), want)  # now a hit
    # The original file under that token no longer fits the entry either.
    with pytest.warns(CacheWarning, match="does not fit the weights"):
        assert same(infer(cache, SMOKE, model_token=token), template.outputs)


def test_entry_primed_with_a_dictionary_not_shipped_is_rebuilt(
    template: Template,
    cache: Path,
    calls: Calls,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # A runtime whose package lacks the text dictionaries the entry's plan was written with
    # (litekiln.artifact.texts): unreadable, dropped, recompiled under the same key.
    key = the_key(cache, "model")
    monkeypatch.setattr(texts, "_DICTIONARY_DIR", tmp_path / "none")
    texts.dictionaries.cache_clear()
    try:
        with pytest.warns(CacheWarning, match=f"{key[:12]} is unreadable .*does not ship"):
            assert same(infer(cache), template.outputs)
        assert calls.compiles == 1 and the_key(cache, "model") == key
        _assert_clean(cache)
    finally:
        texts.dictionaries.cache_clear()


def test_entry_from_another_driver_version(
    template: Template, cache: Path, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    old_program = the_key(cache, "program")
    real_identity = DeviceProfile.identity

    def upgraded(self):
        return {**real_identity(self), "driver": real_identity(self)["driver"] + "-upgraded"}

    monkeypatch.setattr(DeviceProfile, "identity", upgraded)
    out = infer(cache)
    assert same(out, template.outputs)
    # The compiled model does not depend on the driver: a hit. The binary is a miss.
    assert (calls.compiles, calls.binary_misses, calls.binary_saves) == (0, 1, 1)
    _assert_clean(cache, programs=2)  # one binary per driver version, both good
    programs = keys_by_kind(cache)["program"]
    (new_program,) = set(programs) - {old_program}
    assert manifest(cache, new_program)["fields"]["driver"].endswith("-upgraded")
    _assert_hit(cache, template.outputs, calls, monkeypatch)  # with the new driver
    monkeypatch.setattr(DeviceProfile, "identity", real_identity)
    _assert_hit(cache, template.outputs, calls, monkeypatch)  # and back with the old one


GARBAGE = {
    # Same length, every byte changed: no valid header.
    "garbage": lambda good: bytes((b * 7 + 13) & 0xFF for b in good),
    "empty": lambda good: b"",
}


@pytest.mark.parametrize("kind", list(GARBAGE))
def test_binary_the_driver_rejects_is_rebuilt_from_source(
    template: Template,
    cache: Path,
    calls: Calls,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    kind: str,
) -> None:
    # Checksum-valid (written through the store API), so only the driver can tell.
    with CacheStore.open(cache) as s:
        (summary,) = [e for e in s.ls() if e.kind == "program"]
        entry = s.get(summary.key)
        good = entry.part("binary")
        bad = GARBAGE[kind](good)
        assert s.put(summary.key, summary.fields, {"binary": bad}, kind="program", meta=entry.meta)
    with caplog.at_level("WARNING", logger="litekiln"):
        out = infer(cache)
    assert same(out, template.outputs)
    assert any("binary rejected" in r.getMessage() for r in caplog.records), caplog.text
    assert (calls.compiles, calls.binary_hits, calls.binary_saves) == (0, 1, 1)
    _assert_clean(cache)
    with CacheStore.open(cache) as s:
        rebuilt = s.get(summary.key).part("binary")
    # Replaced by the rebuilt binary (a driver's binaries need not be byte-identical).
    assert rebuilt != bad and rebuilt[:8] == good[:8]
    _assert_hit(cache, template.outputs, calls, monkeypatch)


def test_binary_rejected_and_source_build_failing_is_a_clear_error(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from litekiln.runtime import build

    def from_binary(*args):
        raise build.BuildError("building from the cached device binary failed: simulated")

    def from_source(*args):
        raise build.BuildError("OpenCL build failed on this device: simulated")

    monkeypatch.setattr(build, "_from_binary", from_binary)
    monkeypatch.setattr(build, "_from_source", from_source)
    with pytest.raises(DeviceError, match="partition 0: OpenCL build failed"):
        infer(cache)
    _assert_clean(cache)  # the entries stay as they were


# ---------------------------------------------------------------- concurrency


def _racer(cache_dir: str, barrier, results) -> None:
    try:
        barrier.wait(120)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = infer(cache_dir)
        results.put(("ok", out, [f"{w.category.__name__}: {w.message}" for w in caught]))
    except BaseException as e:  # noqa: BLE001 - report everything to the parent
        results.put(("error", repr(e), []))


def test_four_processes_compile_the_same_model_at_once(
    template: Template, tmp_path: Path, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    cache.chmod(0o700)
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(str(cache), barrier, results)) for _ in range(4)]
    for p in procs:
        p.start()
    try:
        got = [results.get(timeout=240) for _ in procs]
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0] * 4
    for status, out, caught in got:
        assert status == "ok", out
        assert same(out, template.outputs)
        # Racing writers are not faults: no cache warning (corrupt entry, failed write).
        assert not [w for w in caught if w.startswith("CacheWarning")], caught
    _assert_clean(cache)
    _assert_hit(cache, template.outputs, calls, monkeypatch)


# ---------------------------------------------------------------- directories


_READ_ONLY_CHILD = textwrap.dedent(
    """
    import base64, json, sys, warnings
    from cache_fault_helpers import infer
    from litekiln.cache import CacheStore
    import litekiln.loading as loading

    def no_compiler(*a, **k):
        raise AssertionError("compile_for called")

    loading.compile_for = no_compiler
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = infer(sys.argv[1])
        with CacheStore.open(sys.argv[1]) as s:
            read_only, clean = s.read_only, s.verify().clean
    print(json.dumps({
        "outputs": [[base64.b64encode(o.tobytes()).decode(), o.dtype.str, list(o.shape)]
                    for o in out],
        "warnings": [str(w.message) for w in caught],
        "read_only": read_only,
        "clean": clean,
    }))
    """
)


def test_read_only_cache_directory(template: Template, cache: Path, tmp_path: Path) -> None:
    for p in [cache, *cache.rglob("*")]:
        p.chmod(0o500 if p.is_dir() else 0o400)
    before = snapshot(cache)
    cmd = [sys.executable, "-c", _READ_ONLY_CHILD, str(cache)]
    if os.geteuid() == 0:
        # Root ignores file modes: give the child a private mount namespace in which the
        # cache is a read-only bind mount (writes fail with EROFS, as on a read-only medium).
        if shutil.which("unshare") is None:
            pytest.skip("running as root without unshare(1): cannot make a read-only directory")
        probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
        if probe.returncode != 0:
            pytest.skip(f"running as root and unshare -m fails: {probe.stderr.decode()}")
        cmd = [
            "unshare",
            "-m",
            "sh",
            "-c",
            'mount --bind -o ro "$0" "$0" && exec "$@"',
            str(cache),
            *cmd,
        ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO)]),
        "LITEKILN_CACHE_DIR": str(tmp_path / "unused"),
    }
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        out = [
            np.frombuffer(base64.b64decode(b), dtype=dt).reshape(shape)
            for b, dt, shape in res["outputs"]
        ]
        assert same(out, template.outputs)
        assert res["read_only"] is True and res["clean"] is True
        assert any("read-only" in w for w in res["warnings"]), res["warnings"]
        assert snapshot(cache) == before  # not a byte written, not even a last-use time
    finally:
        for p in [cache, *cache.rglob("*")]:
            p.chmod(0o700 if p.is_dir() else 0o600)
    _assert_clean(cache)


def test_group_writable_directory_explicitly_requested(
    template: Template, cache: Path, calls: Calls
) -> None:
    cache.chmod(0o770)
    before = snapshot(cache)
    with pytest.raises(CacheError, match=r"group- or other-writable.*chmod 700"):
        infer(cache)
    assert calls.compiles == 0
    assert snapshot(cache) == before
    cache.chmod(0o700)
    _assert_clean(cache)


def test_group_writable_default_directory(
    template: Template, tmp_path: Path, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    xdg = tmp_path / "xdg"
    xdg.mkdir()
    default = copy_cache(template, xdg / "litekiln")
    default.chmod(0o770)
    monkeypatch.delenv("LITEKILN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    with pytest.warns(CacheWarning):
        assert CacheStore.open().directory == default  # really the default directory
    before = snapshot(default)
    with pytest.warns(CacheWarning, match="group- or other-writable.*without a cache"):
        out = infer(None)
    assert same(out, template.outputs)
    # Uncached: compiled and built from source, nothing read from or written to the directory.
    assert (calls.compiles, calls.binary_hits, calls.binary_saves) == (1, 0, 0)
    assert snapshot(default) == before
    default.chmod(0o700)
    _assert_clean(default)


# ---------------------------------------------------------------- full disk


def _enospc_on_file_write(monkeypatch: pytest.MonkeyPatch) -> None:
    # Parts of 32 KiB and more (the binary; not the compiled model's few KiB, which SQLite
    # holds) are files; fail their fsync.
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)


def _sqlite_full_on_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every part gets written; the manifest commit (last) fails.
    real_set = DiskcacheBackend.set

    def full(self, key: str, value: bytes) -> None:
        if key.startswith("manifest:"):
            raise sqlite3.OperationalError("database or disk is full")
        real_set(self, key, value)

    monkeypatch.setattr(DiskcacheBackend, "set", full)


# name -> (fault, whether the compiled model (no file part) is still stored)
FULL = {
    "ENOSPC writing a part file": (_enospc_on_file_write, True),
    "SQLite full at the manifest commit": (_sqlite_full_on_commit, False),
}


@pytest.mark.parametrize("where", list(FULL))
def test_full_disk(
    template: Template, tmp_path: Path, calls: Calls, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    cache.chmod(0o700)
    CacheStore.open(cache).close()  # its secret is made at first use, before the disk fills
    fault, model_stored = FULL[where]
    with monkeypatch.context() as m:
        fault(m)
        with pytest.warns(CacheWarning, match="could not store .*(No space left|disk is full)"):
            out = infer(cache)
        assert same(out, template.outputs)
        assert (calls.compiles, calls.binary_misses, calls.binary_saves) == (1, 1, 0)
    # No partial entry: no manifest, no part, no value file but the complete model entry's.
    model = the_key(cache, "model") if model_stored else "none"
    left = [k for k in storage_keys(cache) if not k.startswith(("use:", f"part:{model}:"))]
    assert left == ([f"manifest:{model}"] if model_stored else [])
    assert val_files(cache) == []
    _assert_clean(cache, models=int(model_stored), programs=0)


# ---------------------------------------------------------------- trust


def _changed_with_checksums(change):
    """Change a part, then recompute what a reader can check without the cache's secret:
    the part's sha256 in its manifest and the manifest's own checksum header."""

    def tamper(directory: Path, key: str, part: str) -> None:
        store_key = part_storage_key(directory, key, part)
        rewrite(directory, store_key, change)
        new = bytes(rewrite_read(directory, store_key))

        def manifest_change(raw: bytes) -> bytes:
            body = json.loads(manifest_body(raw))
            for rec in body["parts"]:
                if rec["store"] == store_key:
                    rec["size"], rec["sha256"] = len(new), hashlib.sha256(new).hexdigest()
            text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
            data = pack_body(text.encode())
            return raw[:5] + hashlib.sha256(data).hexdigest().encode() + b"\n" + data

        rewrite(directory, f"manifest:{key}", manifest_change)

    return tamper


def rewrite_read(directory: Path, storage_key: str) -> bytes:
    got: list[bytes] = []
    rewrite(directory, storage_key, lambda data: got.append(data) or data)
    return got[0]


def _in_artifact(edit):
    """A change to the compiled model's manifest (an LZMA-compressed JSON part)."""

    def change(data: bytes) -> bytes:
        doc = json.loads(decompress(data))
        edit(doc["compiled"])
        return compress(json.dumps(doc).encode(), "plan")

    return change


def _add_build_option(compiled: dict) -> None:
    compiled["partitions"][0]["program"]["build_options"] = "-DLITEKILN_PWNED"


def _swap_weights(compiled: dict) -> None:
    # Every weight recipe reads the tensor of the next one: other weights, same bytes count.
    recipes = list(compiled["weights"]["recipes"].values())
    for r, other in zip(recipes, recipes[1:] + recipes[:1], strict=True):
        r["tensor"], r["source"] = other["tensor"], other["source"]


TAMPERED = {
    "the weight recipes": ("model", "artifact.json", _in_artifact(_swap_weights)),
    "the OpenCL build options": ("model", "artifact.json", _in_artifact(_add_build_option)),
    "the device binary": ("program", "binary", flip),
}


@pytest.mark.parametrize("what", list(TAMPERED))
def test_tampered_but_checksummed_entry_is_refused(
    template: Template, cache: Path, calls: Calls, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    kind, part, change = TAMPERED[what]
    key = the_key(cache, kind)
    _changed_with_checksums(change)(cache, key, part)
    with pytest.warns(CacheWarning, match=f"{key[:12]} .*signature check"):
        out = infer(cache)
    assert same(out, template.outputs)
    _assert_clean(cache)
    _assert_hit(cache, template.outputs, calls, monkeypatch)


# ---------------------------------------------------------------- a damaged database


def _scribble(cache: Path, start: int, length: int) -> None:
    db = cache / DATA / "cache.db"
    assert not (cache / DATA / "cache.db-wal").exists() or True
    data = bytearray(db.read_bytes())
    end = min(start + length, len(data))
    data[start:end] = bytes((i * 37 + 11) & 0xFF for i in range(end - start))
    db.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["header", "a middle page"])
def test_scribbled_database_is_started_afresh(
    template: Template,
    cache: Path,
    calls: Calls,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    where: str,
) -> None:
    size = (cache / DATA / "cache.db").stat().st_size
    _scribble(cache, 0, 100) if where == "header" else _scribble(cache, size // 2, 4096)
    with pytest.warns(CacheWarning, match="damaged.*started it afresh"):
        out = infer(cache)
    assert same(out, template.outputs)
    _assert_clean(cache)
    _assert_hit(cache, template.outputs, calls, monkeypatch)
    # Nothing was left behind beside the new folder.
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".reset")) == [
        "secret",
        DATA,
    ]


def test_clear_and_verify_on_a_scribbled_database(cache: Path, tmp_path: Path) -> None:
    from litekiln.cli import main

    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    _scribble(cache, 0, 100)
    with pytest.warns(CacheWarning, match="started it afresh"):
        assert main(["cache", "--cache-dir", str(cache), "clear"]) == 0
    _assert_clean(cache, models=0, programs=0)
    _scribble(cache, 0, 100)
    with pytest.warns(CacheWarning, match="started it afresh"), CacheStore.open(cache) as s:
        report = s.verify()
    assert not report.clean and "started it afresh" in report.storage[0]
    _assert_clean(cache, models=0, programs=0)
    assert outside.read_text() == "keep me"


# ---------------------------------------------------------------- links


def test_symlinked_hash_folder_never_leads_outside(
    template: Template, cache: Path, tmp_path: Path, calls: Calls
) -> None:
    from litekiln.cli import main

    (victim, *_) = val_files(cache)
    folder = victim.parent.parent  # v2/ab, holding cd/<hex>.val
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.move(folder, outside / folder.name)
    folder.symlink_to(outside / folder.name, target_is_directory=True)
    kept = sorted(p for p in outside.rglob("*") if p.is_file())
    assert kept

    with pytest.warns(CacheWarning, match="symbolic link"):
        out = infer(cache)  # the entry behind the link is refused and rebuilt
    assert same(out, template.outputs)
    with CacheStore.open(cache) as s:
        assert any("symbolic link" in p for p in s.verify().storage)
    assert main(["cache", "--cache-dir", str(cache), "prune", "--max-size", "0"]) == 0
    assert main(["cache", "--cache-dir", str(cache), "clear"]) == 0
    assert sorted(p for p in outside.rglob("*") if p.is_file()) == kept  # untouched
    assert kept[0].read_bytes()


def test_dangling_cache_symlink_is_a_clear_error(
    cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from litekiln.cli import main

    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(CacheError, match="symbolic link to .*nowhere.*does not exist"):
        infer(link)
    capsys.readouterr()
    assert main(["cache", "--cache-dir", str(link), "ls"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("litekiln: error:") and "does not exist" in err
    assert "Traceback" not in err and not (tmp_path / "nowhere").exists()


def test_cache_warnings_are_printed_once(template: Template, tmp_path: Path) -> None:
    xdg = tmp_path / "xdg"
    xdg.mkdir()
    copy_cache(template, xdg / "litekiln").chmod(0o770)
    env = {**os.environ, "XDG_CACHE_HOME": str(xdg), "PYTHONPATH": str(REPO)}
    env.pop("LITEKILN_CACHE_DIR", None)
    child = "from litekiln.cache import CacheStore; CacheStore.open()"
    proc = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("group- or other-writable") == 1, proc.stderr


# ---------------------------------------------------------------- a really full disk


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A 2 MB tmpfs (needs root, as in CI)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a 2 MB tmpfs needs root (CI runs as root)")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(cache: Path) -> int:
    """Store entries of 240 KB until the disk refuses one; how many went in."""
    with CacheStore.open(cache) as s:
        for i in range(40):
            fields = {"token": f"filler-{i}"}
            data = np.random.default_rng(i).standard_normal(60_000).astype(np.float32)
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("always")
                if not s.put(make_key(fields), fields, {"w": data, "s": b"x" * 1000}):
                    return i
    raise AssertionError("a 2 MB disk took 40 entries of 240 KB")


@pytest.mark.parametrize("reserve", ["kept free", "none (ENOSPC)"])
def test_a_store_that_fills_a_real_disk(
    template: Template,
    tiny_disk: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    reserve: str,
) -> None:
    import litekiln.cache.store as store_mod
    from litekiln.cli import main

    if reserve != "kept free":
        monkeypatch.setattr(store_mod, "RESERVE_MIN", 0)
        monkeypatch.setattr(store_mod, "RESERVE_MAX", 0)
    cache = tiny_disk / "cache"
    stored = _fill(cache)
    assert stored >= 2
    # The failed put left nothing behind (and, if the disk filled, made room evicting the
    # oldest entries), and the next open can write.
    with CacheStore.open(cache) as s:
        assert not s.read_only, s.reason
        report = s.verify()
        assert report.clean and 1 <= report.entries <= stored, report.as_dict()
    args = ["cache", "--cache-dir", str(cache)]
    assert main([*args, "verify", "--fix"]) == 0
    assert main([*args, "prune", "--max-size", "300K"]) == 0
    assert main([*args, "clear"]) == 0
    out = capsys.readouterr().out
    assert "removed" in out
    assert same(infer(cache), template.outputs)  # and the cache works again
    _assert_clean(cache)


def test_a_disk_filled_by_someone_else(tiny_disk: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from litekiln.cli import main

    cache = tiny_disk / "cache"
    stored = _fill(cache)
    ballast = tiny_disk / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o600)
    with contextlib.suppress(OSError):  # every byte left
        while True:
            os.write(fd, bytes(4096))
    os.close(fd)
    assert shutil.disk_usage(tiny_disk).free < 8192
    args = ["cache", "--cache-dir", str(cache)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        assert main([*args, "verify", "--fix"]) == 0
        assert main([*args, "prune", "--max-size", "0"]) == 0
        assert main([*args, "clear"]) == 0
        ballast.unlink()
        with CacheStore.open(cache) as s:
            assert not s.read_only and s.ls() == [] and s.verify().clean
    assert stored >= 2
