"""The cache store: round trips, every kind of damage, races, permissions, limits, export.

Faults are made on the real storage (bytes flipped in the SQLite rows and files diskcache
keeps, files truncated or deleted, processes racing or dying mid-write); only what cannot be
produced for real in a test (a full disk, a foreign owner) is simulated by patching.
"""

from __future__ import annotations

import errno
import io
import itertools
import json
import multiprocessing
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings
from pathlib import Path

import diskcache
import numpy as np
import pytest

import litekiln.cache.store as store_mod
import litekiln.cache.usage as usage_mod
import litekiln.cache.writer as writer_mod
from litekiln.cache import CacheError, CacheStore, CacheWarning, make_key
from litekiln.cache.backend import DiskcacheBackend, SafeDisk
from litekiln.cache.manifest import MAX_BODY_BYTES, SCHEMA_VERSION, manifest_body, pack_body

_FORK = multiprocessing.get_context("fork")
DATA = f"v{SCHEMA_VERSION}"  # the schema folder inside a cache directory
BIG = 40_000  # float32 elements: 160 KB, above diskcache's 32 KiB file threshold


def _fields(name: str = "face_detection", **extra: object) -> dict:
    return {
        "token": f"tok-{name}",
        "model_name": name,
        "options": {"precision": "fp32"},
        "target": "opencl",
        **extra,
    }


def _parts(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "source": f"__kernel void k{seed}(__global float* a) {{ a[0] = {seed}; }}".encode(),
        "weights": rng.standard_normal(BIG).astype(np.float32),  # stored as a file
        "bias": np.arange(6, dtype=">i2").reshape(2, 3),  # big-endian in, little-endian stored
    }


def _put(store: CacheStore, name: str = "face_detection", seed: int = 0) -> tuple[str, dict]:
    fields = _fields(name)
    key = make_key(fields)
    parts = _parts(seed)
    assert store.put(key, fields, parts, meta={"kernels": [f"k{seed}"], "seed": seed})
    return key, parts


def _assert_entry(entry, parts: dict, seed: int) -> None:
    assert entry is not None
    assert entry.part("source") == parts["source"]
    w = entry.array("weights")
    assert w.dtype == np.float32 and w.shape == (BIG,)
    np.testing.assert_array_equal(w, parts["weights"])
    b = entry.array("bias")
    assert b.dtype.str == "<i2" and b.shape == (2, 3)
    np.testing.assert_array_equal(b, parts["bias"])
    assert entry.meta == {"kernels": [f"k{seed}"], "seed": seed}


@pytest.fixture(scope="module")
def signing_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A build key pair: (private key file, public key file)."""
    from litekiln.cache.signing import generate_key

    private = tmp_path_factory.mktemp("keys") / "build.key"
    public, _ = generate_key(private)
    return private, public


@pytest.fixture
def store(tmp_path: Path):
    s = CacheStore.open(tmp_path / "cache", explicit=True)
    yield s
    s.close()


# ---------------------------------------------------------------- helpers on raw storage


def _db(store: CacheStore) -> sqlite3.Connection:
    return sqlite3.connect(store.directory / DATA / "cache.db", isolation_level=None)


def _row(store: CacheStore, storage_key: str) -> tuple[int, str | None, bytes | None]:
    with _db(store) as con:
        rows = con.execute(
            "SELECT mode, filename, value FROM Cache WHERE key = ?", (storage_key,)
        ).fetchall()
    assert len(rows) == 1, storage_key
    return rows[0]


def _manifest(store: CacheStore, key: str) -> dict:
    _, _, raw = _row(store, f"manifest:{key}")
    return json.loads(manifest_body(raw))


def _part_key(store: CacheStore, key: str, name: str) -> str:
    (rec,) = [r for r in _manifest(store, key)["parts"] if r["name"] == name]
    return rec["store"]


def _rewrite(store: CacheStore, storage_key: str, change) -> None:
    """Apply `change(bytes) -> bytes | None` to a stored value where it really lives."""
    mode, filename, value = _row(store, storage_key)
    if filename is None:  # held inside SQLite
        assert mode == 1
        new = change(value)
        with _db(store) as con:
            if new is None:
                con.execute("DELETE FROM Cache WHERE key = ?", (storage_key,))
            else:
                con.execute("UPDATE Cache SET value = ? WHERE key = ?", (new, storage_key))
    else:  # held in a file
        path = store.directory / DATA / filename
        new = change(path.read_bytes())
        if new is None:
            path.unlink()
        else:
            path.write_bytes(new)


def _flip(data: bytes, at: int | None = None) -> bytes:
    at = len(data) // 2 if at is None else at
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


def _storage_keys(store: CacheStore) -> list[str]:
    with _db(store) as con:
        return [k for (k,) in con.execute("SELECT key FROM Cache ORDER BY key")]


def _val_files(store: CacheStore) -> list[Path]:
    return sorted((store.directory / DATA).rglob("*.val"))


def _assert_clean_and_empty(store: CacheStore) -> None:
    """Nothing of a dropped or failed entry is left: no rows, no files, verify is clean."""
    assert [k for k in _storage_keys(store) if not k.startswith("use:")] == []
    assert _val_files(store) == []
    report = store.verify()
    assert report.clean, report


# ---------------------------------------------------------------- keys and round trip


def test_make_key_is_canonical_and_covers_every_field() -> None:
    a = make_key({"token": "t", "options": {"fp16": True, "tuning": False}})
    b = make_key({"options": {"tuning": False, "fp16": True}, "token": "t"})
    assert a == b and len(a) == 64 and int(a, 16) >= 0
    assert make_key({"token": "t", "options": {"fp16": False, "tuning": False}}) != a
    with pytest.raises(ValueError):
        make_key({"x": float("nan")})
    with pytest.raises(TypeError):
        make_key({"x": object()})


def test_round_trip_survives_reopening(store: CacheStore, tmp_path: Path) -> None:
    key, parts = _put(store)
    _assert_entry(store.get(key), parts, 0)
    assert store.get(key, kind="program") is None  # another kind is a miss
    store.close()
    with CacheStore.open(tmp_path / "cache") as again:
        entry = again.get(key)
        _assert_entry(entry, parts, 0)
        assert entry.fields == _fields() and entry.kind == "model"
        (summary,) = again.ls()
        assert (summary.key, summary.token, summary.model_name) == (
            key,
            "tok-face_detection",
            "face_detection",
        )
        assert summary.options == {"precision": "fp32"}
        assert summary.size > BIG * 4
        info = again.info(key[:8])
        assert [p["name"] for p in info["parts"]] == ["source", "weights", "bias"]
        assert info["parts"][2]["dtype"] == "<i2" and info["parts"][2]["shape"] == [2, 3]


def test_manifest_is_stored_deflated_and_the_plain_form_still_reads(store: CacheStore) -> None:
    key, parts = _put(store)
    _, _, raw = _row(store, f"manifest:{key}")
    body = manifest_body(raw)
    assert raw.startswith(b"LKZ2 ") and json.loads(body)["key"] == key
    # Deflated against the dictionary of what every manifest repeats: under half its JSON.
    assert len(raw) - 70 < len(body) / 2, (len(raw), len(body))
    # A manifest as litekiln stored it before (plain JSON, signed as it is) is still read.
    plain = b"LKM2 " + store._backend.seal.sign(body) + b"\n" + body
    _rewrite(store, f"manifest:{key}", lambda _: plain)
    _assert_entry(store.get(key), parts, 0)


def test_manifest_that_inflates_past_its_bound_is_corrupt(store: CacheStore) -> None:
    key, _ = _put(store)
    _, _, raw = _row(store, f"manifest:{key}")
    # Signed with the cache's own secret, so only the inflation bound can refuse it.
    bomb = pack_body(manifest_body(raw)[:-1] + b" " * MAX_BODY_BYTES + b"}")
    assert len(bomb) < 4 * 1024
    signed = b"LKZ2 " + store._backend.seal.sign(bomb) + b"\n" + bomb
    _rewrite(store, f"manifest:{key}", lambda _: signed)
    with pytest.warns(CacheWarning, match="deflate stream of at most"):
        assert store.get(key) is None
    assert not any(k.startswith(f"manifest:{key}") for k in _storage_keys(store))


def test_program_entry_and_replacement(store: CacheStore) -> None:
    fields = {
        "source_sha256": "ab" * 32,
        "build_options": "-cl-fast-relaxed-math",
        "platform": "PoCL",
        "device": "cpu",
        "driver": "6.0",
    }
    key = make_key(fields)
    assert store.put(
        key, fields, {"binary": b"\x7fELF" + bytes(100)}, kind="program", meta={"log": ""}
    )
    assert store.put(key, fields, {"binary": b"\x7fELF" + bytes(200)}, kind="program")
    entry = store.get(key, kind="program")
    assert entry is not None and len(entry.part("binary")) == 204
    # The replaced entry's part is gone, not orphaned.
    assert len([k for k in _storage_keys(store) if k.startswith("part:")]) == 1
    with pytest.raises(ValueError, match="not make_key"):
        store.put(make_key({"other": 1}), fields, {"binary": b""}, kind="program")


def test_nothing_is_pickled(store: CacheStore) -> None:
    _put(store)
    with _db(store) as con:
        rows = con.execute("SELECT raw, mode, typeof(key), typeof(value) FROM Cache").fetchall()
    assert rows
    for raw, mode, key_type, value_type in rows:
        # raw=1: the key is stored as is; mode 1/2: raw bytes in SQLite / in a file.
        assert raw == 1 and key_type == "text"
        assert (mode, value_type) in ((1, "blob"), (2, "null"))
    # The Disk under it refuses anything that would go through pickle, keys included.
    raw_cache = diskcache.Cache(str(store.directory / DATA), disk=SafeDisk)
    with pytest.raises(TypeError):
        raw_cache.set("manifest:x", {"a": 1})
    with pytest.raises(TypeError):
        raw_cache.set(("manifest", "x"), b"bytes")
    raw_cache.close()


def test_pickle_row_is_refused_not_loaded(store: CacheStore) -> None:
    key, _ = _put(store)
    import pickle

    class Boom:
        def __reduce__(self):
            return (os.system, ("touch /tmp/litekiln-pwned",))

    with _db(store) as con:  # what an attacker with write access to the database could do
        con.execute(
            "UPDATE Cache SET mode = 4, value = ? WHERE key = ?",
            (pickle.dumps(Boom()), f"manifest:{key}"),
        )
    with pytest.warns(CacheWarning, match="corrupt"):
        assert store.get(key) is None
    assert not os.path.exists("/tmp/litekiln-pwned")
    _assert_clean_and_empty(store)


def test_runtime_import_needs_no_tvm(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['tvm'] = None\n"
        "import numpy as np\n"
        "from litekiln.cache import CacheStore, make_key\n"
        f"s = CacheStore.open({str(tmp_path / 'c')!r})\n"
        "f = {'token': 't'}; k = make_key(f)\n"
        "assert s.put(k, f, {'w': np.ones(3, np.float32)})\n"
        "assert s.get(k).array('w').sum() == 3\n"
        "loaded = [m for m, mod in sys.modules.items() if mod is not None]\n"
        "assert not any(m == 'tvm' or m.startswith('tvm.') for m in loaded), loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])


def test_delete_is_safe_on_the_inference_path(store: CacheStore) -> None:
    key, _ = _put(store)
    assert store.delete(key) is True
    assert store.get(key) is None and store.delete(key) is False
    _assert_clean_and_empty(store)
    assert CacheStore.disabled().delete(key) is False
    report = store.verify()
    assert report.as_dict()["clean"] is True and report.as_dict()["entries"] == 0


# ---------------------------------------------------------------- damaged entries


def _manifest_body_flip(data: bytes) -> bytes:
    # Inside the model name: the JSON stays valid, only the checksum can tell. A stored
    # manifest's body is deflated: changed, then deflated again under its old signature.
    if data.startswith(b"LKZ2 "):
        head = data[: data.index(b"\n") + 1]
        return head + pack_body(_manifest_body_flip(manifest_body(data)))
    return _flip(data, data.index(b'"model_name":"') + 15)


def _manifest_checksum_flip(data: bytes) -> bytes:
    return _flip(data, 10)  # inside the HMAC hex of the header


DAMAGE = {
    "flipped manifest byte": ("manifest", _manifest_body_flip, "signature"),
    "flipped manifest signature": ("manifest", _manifest_checksum_flip, "signature"),
    "flipped byte in part held in SQLite": ("source", _flip, "sha256"),
    "flipped byte in part held in a file": ("weights", _flip, "sha256"),
    "truncated part in SQLite": ("source", lambda d: d[: len(d) // 2], "truncated"),
    "truncated part file": ("weights", lambda d: d[:1000], "truncated"),
    "deleted part row": ("source", lambda d: None, "missing"),
    "deleted part file": ("weights", lambda d: None, "missing"),
    "deleted manifest": ("manifest", lambda d: None, None),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_entry_is_a_miss_and_dropped(
    store: CacheStore, damage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    target, change, problem = DAMAGE[damage]
    key, _ = _put(store)
    other_key, other_parts = _put(store, "hand_landmark", seed=1)
    storage_key = f"manifest:{key}" if target == "manifest" else _part_key(store, key, target)
    _rewrite(store, storage_key, change)

    if problem is None:
        # A missing manifest is an ordinary miss; its parts are orphans that verify reports.
        with warnings.catch_warnings():
            warnings.simplefilter("error", CacheWarning)
            assert store.get(key) is None
        assert store.verify().orphan_parts == 3
        monkeypatch.setattr(store_mod, "ORPHAN_GRACE_S", 0.0)
        store.verify(fix=True)
    else:
        report = store.verify()
        assert list(report.bad) == [key] and problem in report.bad[key]
        with pytest.warns(CacheWarning, match=f"{key[:12]}.*corrupt.*{problem}"):
            assert store.get(key) is None
        with warnings.catch_warnings():
            warnings.simplefilter("error", CacheWarning)
            assert store.get(key) is None  # dropped: now a plain miss

    report = store.verify()
    assert report.clean and report.entries == 1, report
    assert [s.key for s in store.ls()] == [other_key]
    _assert_entry(store.get(other_key), other_parts, 1)  # the neighbour is untouched
    assert not [k for k in _storage_keys(store) if key in k]
    # The caller recompiles and stores again.
    key2, parts = _put(store)
    assert key2 == key
    _assert_entry(store.get(key), parts, 0)


def test_verify_fix_drops_bad_entries(store: CacheStore) -> None:
    key, _ = _put(store)
    good, parts = _put(store, "other", seed=2)
    _rewrite(store, _part_key(store, key, "weights"), _flip)
    report = store.verify(fix=True)
    assert report.fixed and list(report.bad) == [key]
    after = store.verify()
    assert after.clean and after.entries == 1
    _assert_entry(store.get(good), parts, 2)


def _die_before_manifest(directory: str) -> None:
    def crash(*args, **kwargs):
        os._exit(3)  # the process dies after its parts are written, before the manifest

    writer_mod.commit = crash
    s = CacheStore.open(directory)
    _put(s)


def test_writer_killed_mid_entry_leaves_no_visible_entry(
    store: CacheStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = _FORK.Process(target=_die_before_manifest, args=(str(store.directory),))
    p.start()
    p.join(30)
    assert p.exitcode == 3
    assert _val_files(store)  # its parts did reach the disk ...
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        assert store.get(make_key(_fields())) is None  # ... but no entry is visible
    assert store.ls() == []
    report = store.verify()
    assert report.orphan_parts == 3 and not report.bad
    store.verify(fix=True)  # too young to collect: a writer might still be at work
    assert store.verify().orphan_parts == 3
    monkeypatch.setattr(store_mod, "ORPHAN_GRACE_S", 0.0)
    store.prune()
    _assert_clean_and_empty(store)


# ---------------------------------------------------------------- concurrency


def _race(directory: str, writer: int, barrier, queue) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = CacheStore.open(directory)
        fields = _fields("shared")
        key = make_key(fields)
        barrier.wait()
        stored, consistent = 0, True
        for r in range(8):
            tag = writer * 100 + r
            parts = {
                "source": f"writer {tag}".encode(),
                "weights": np.full(BIG, tag, dtype=np.float32),
            }
            stored += s.put(key, fields, parts, meta={"tag": tag})
            e = s.get(key)  # whoever won, the entry must be whole and self-consistent
            if e is None:
                consistent = False
                continue
            t = e.meta["tag"]
            consistent &= e.part("source") == f"writer {t}".encode()
            consistent &= bool((e.array("weights") == t).all())
        s.close()
    queue.put((writer, stored, consistent, [str(w.message) for w in caught]))


def test_four_processes_writing_one_key_end_with_one_good_entry(store: CacheStore) -> None:
    barrier, queue = _FORK.Barrier(4), _FORK.Queue()
    procs = [
        _FORK.Process(target=_race, args=(str(store.directory), w, barrier, queue))
        for w in range(4)
    ]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    for writer, stored, consistent, caught in results:
        assert (stored, consistent, caught) == (8, True, []), (writer, caught)

    key = make_key(_fields("shared"))
    entry = store.get(key)
    tag = entry.meta["tag"]
    assert entry.part("source") == f"writer {tag}".encode()
    assert (entry.array("weights") == tag).all()
    assert [s.key for s in store.ls()] == [key]
    assert len([k for k in _storage_keys(store) if k.startswith("part:")]) == 2
    assert len(_val_files(store)) == 1
    assert store.verify().clean


# ---------------------------------------------------------------- directories


def _read_only_child(directory: str, key: str, conn, drop_to: int | None) -> None:
    if drop_to is not None:  # root ignores permissions: become an ordinary user first
        os.setgid(drop_to)
        os.setuid(drop_to)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = CacheStore.open(directory)
        e = s.get(key)
        out = {
            "read_only": s.read_only,
            "source": e.part("source") if e else None,
            "weights_sum": float(e.array("weights").sum()) if e else None,
            "put": s.put(make_key(_fields("new")), _fields("new"), {"a": b"x"}),
            "ls": [x.key for x in s.ls()],
            "verify_clean": s.verify().clean,
        }
    out["warnings"] = [str(w.message) for w in caught]
    conn.send(out)


def test_read_only_directory_reads_and_skips_writes() -> None:
    base = Path(tempfile.mkdtemp(prefix="litekiln-ro-"))
    directory = base / "cache"
    try:
        with CacheStore.open(directory) as s:
            key, parts = _put(s)
        drop_to = None
        if os.geteuid() == 0:
            drop_to = 65534  # nobody
            os.chmod(base, 0o755)
            for p in [directory, *directory.rglob("*")]:
                os.chown(p, drop_to, drop_to)
        for p in [directory, *directory.rglob("*")]:
            os.chmod(p, 0o500 if p.is_dir() else 0o400)
        before = sorted((str(p), p.stat().st_size) for p in directory.rglob("*"))

        parent, child = _FORK.Pipe()
        proc = _FORK.Process(target=_read_only_child, args=(str(directory), key, child, drop_to))
        proc.start()
        out = parent.recv()
        proc.join(30)
        assert proc.exitcode == 0
        assert out["read_only"] is True
        assert out["source"] == parts["source"]
        assert out["weights_sum"] == pytest.approx(float(parts["weights"].sum()), rel=1e-5)
        assert out["put"] is False and out["ls"] == [key] and out["verify_clean"]
        assert any("read-only" in w for w in out["warnings"]), out["warnings"]
        assert sorted((str(p), p.stat().st_size) for p in directory.rglob("*")) == before
    finally:
        for p in [base, *base.rglob("*")]:
            os.chmod(p, 0o700)
        shutil.rmtree(base)


def test_new_directory_is_private(tmp_path: Path) -> None:
    directory = tmp_path / "a" / "b" / "cache"
    old = os.umask(0o022)
    try:
        CacheStore.open(directory).close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(directory / DATA).st_mode) == 0o700


def test_default_dir_follows_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LITEKILN_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert store_mod.default_cache_dir() == tmp_path / "home" / ".cache" / "litekiln"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert store_mod.default_cache_dir() == tmp_path / "xdg" / "litekiln"
    monkeypatch.setenv("LITEKILN_CACHE_DIR", str(tmp_path / "mine"))
    assert store_mod.default_cache_dir() == tmp_path / "mine"


def _use_default_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.delenv("LITEKILN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "litekiln"


def _assert_disabled_and_untouched(store: CacheStore, directory: Path) -> None:
    assert not store.enabled
    fields = _fields()
    assert store.put(make_key(fields), fields, {"a": b"x"}) is False
    assert store.get(make_key(fields)) is None
    assert store.ls() == []
    assert list(directory.iterdir()) == []  # nothing was written into the unsafe directory


def test_group_writable_directory_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    explicit = tmp_path / "shared"
    explicit.mkdir()
    os.chmod(explicit, 0o770)
    with pytest.raises(CacheError, match="group- or other-writable.*chmod 700"):
        CacheStore.open(explicit)

    default = _use_default_dir(monkeypatch, tmp_path)
    default.mkdir(parents=True)
    os.chmod(default, 0o757)
    with pytest.warns(CacheWarning, match="other-writable.*without a cache"):
        s = CacheStore.open()
    _assert_disabled_and_untouched(s, default)


def test_directory_owned_by_another_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    explicit = tmp_path / "theirs"
    explicit.mkdir(mode=0o700)
    default = _use_default_dir(monkeypatch, tmp_path)
    default.mkdir(parents=True, mode=0o700)
    me = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: me + 1)  # now every directory is someone else's
    with pytest.raises(CacheError, match=f"owned by uid {me}, not by you"):
        CacheStore.open(explicit)
    monkeypatch.setenv("LITEKILN_CACHE_DIR", str(explicit))  # asked for through the env: explicit
    with pytest.raises(CacheError, match="owned by"):
        CacheStore.open()
    monkeypatch.delenv("LITEKILN_CACHE_DIR")
    with pytest.warns(CacheWarning, match="owned by"):
        s = CacheStore.open()
    _assert_disabled_and_untouched(s, default)


# ---------------------------------------------------------------- full disk


def test_disk_full_while_writing_a_part_file(
    store: CacheStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fsync = os.fsync

    def full(fd: int) -> None:
        # The file exists with (some of) its data, as when the disk fills at flush time.
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.warns(CacheWarning, match="could not store.*No space left"):
        assert store.put(make_key(_fields()), _fields(), _parts()) is False
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert store.get(make_key(_fields())) is None
    _assert_clean_and_empty(store)  # the earlier, small part and the half file are gone
    key, parts = _put(store)  # space again: works
    _assert_entry(store.get(key), parts, 0)


def test_disk_full_while_committing_the_manifest(
    store: CacheStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_set = DiskcacheBackend.set

    def full(self, key: str, value: bytes) -> None:
        if key.startswith("manifest:"):
            raise sqlite3.OperationalError("database or disk is full")
        real_set(self, key, value)

    monkeypatch.setattr(DiskcacheBackend, "set", full)
    with pytest.warns(CacheWarning, match="disk is full.*uncached"):
        assert store.put(make_key(_fields()), _fields(), _parts()) is False
    monkeypatch.setattr(DiskcacheBackend, "set", real_set)
    assert store.get(make_key(_fields())) is None
    _assert_clean_and_empty(store)


# ---------------------------------------------------------------- size bound


def test_lru_eviction_keeps_recently_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = itertools.count(1000)
    monkeypatch.setattr(usage_mod, "now", lambda: float(next(clock)))
    entry_size = BIG * 4 + 2000
    s = CacheStore.open(tmp_path / "cache", size_limit=3 * entry_size)
    a, _ = _put(s, "a", 1)
    b, _ = _put(s, "b", 2)
    c, _ = _put(s, "c", 3)
    assert {x.key for x in s.ls()} == {a, b, c}
    assert s.get(a) is not None  # a is now more recent than b
    d, d_parts = _put(s, "d", 4)
    assert {x.key for x in s.ls()} == {a, c, d}
    assert sum(x.size for x in s.ls()) <= s.size_limit
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        assert s.get(b) is None  # evicted whole: a clean miss, not a corrupt entry
    _assert_entry(s.get(d), d_parts, 4)
    assert [x.key for x in s.ls()][0] == d  # most recently used first
    assert s.verify().clean

    assert s.prune(max_size=2 * entry_size) == [c]  # c is now the least recently used
    # The clock has moved on by more than that since both were last used.
    assert sorted(s.prune(older_than=0.5)) == sorted([a, d])
    assert s.ls() == [] and s.verify().clean

    with pytest.warns(CacheWarning, match="exceeds the cache size limit"):
        assert not CacheStore.open(tmp_path / "small", size_limit=1000).put(
            make_key(_fields()), _fields(), _parts()
        )


# ---------------------------------------------------------------- export / import


def test_export_import_round_trip(
    store: CacheStore, tmp_path: Path, signing_key: tuple[Path, Path]
) -> None:
    private, public = signing_key
    a, a_parts = _put(store, "a", 1)
    b, b_parts = _put(store, "b", 2)
    archive = tmp_path / "models.tar"
    assert sorted(store.export(archive, sign_key=private)) == sorted([a, b])
    assert tarfile.is_tarfile(archive)

    with CacheStore.open(tmp_path / "other") as other:
        assert sorted(other.import_(archive, trusted_keys=[public])) == sorted([a, b])
        _assert_entry(other.get(a), a_parts, 1)
        _assert_entry(other.get(b), b_parts, 2)
        assert {x.key: x.created for x in other.ls()} == {x.key: x.created for x in store.ls()}
        assert other.verify().clean

    only_b = tmp_path / "b.tar"
    assert store.export(only_b, keys=[b[:10]], sign_key=private) == [b]
    with CacheStore.open(tmp_path / "third") as third:
        assert third.import_(only_b, trusted_keys=[public]) == [b]
        assert [x.key for x in third.ls()] == [b]


def _rewrite_tar(src: Path, dst: Path, edit) -> None:
    with tarfile.open(src) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    assert "litekiln-cache-export.sig" in members
    edit(members)
    with tarfile.open(dst, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _member(members: dict, suffix: str) -> str:
    # The second entry's member, so a refusal must also undo nothing-yet-inserted first ones.
    return sorted(n for n in members if n.endswith(suffix))[-1]


TAMPER = {
    "flipped part byte": lambda m: m.update({(n := _member(m, "/1")): _flip(m[n])}),
    "flipped manifest byte": lambda m: m.update(
        {(n := _member(m, "/manifest")): _manifest_body_flip(m[n])}
    ),
    "truncated part": lambda m: m.update({(n := _member(m, "/1")): m[n][:100]}),
    "missing part": lambda m: m.pop(_member(m, "/2")),
    "extra member": lambda m: m.update({"entries/evil.sh": b"rm -rf ~"}),
    "rewritten index": lambda m: m.update(
        {
            "litekiln-cache-export.json": json.dumps(
                {**json.loads(m["litekiln-cache-export.json"]), "version": 2}
            ).encode()
        }
    ),
}


@pytest.mark.parametrize("trust", [False, True])
@pytest.mark.parametrize("tamper", list(TAMPER))
def test_tampered_export_is_refused_and_inserts_nothing(
    store: CacheStore, tmp_path: Path, tamper: str, trust: bool, signing_key: tuple[Path, Path]
) -> None:
    private, public = signing_key
    _put(store, "a", 1)
    _put(store, "b", 2)
    good = tmp_path / "good.tar"
    store.export(good, sign_key=private)
    bad = tmp_path / "bad.tar"
    _rewrite_tar(good, bad, TAMPER[tamper])
    with CacheStore.open(tmp_path / "target") as target:
        # Refused by the signature, and by the checksums even when the caller says --trust.
        with pytest.raises(CacheError, match="(?i)refusing to import.*nothing was imported"):
            target.import_(bad, trusted_keys=[public], trust=trust)
        assert target.ls() == [] and _storage_keys(target) == []
        assert _val_files(target) == []
        assert len(target.import_(good, trusted_keys=[public])) == 2  # the untouched one


def test_truncated_or_foreign_export_is_refused(
    store: CacheStore, tmp_path: Path, signing_key: tuple[Path, Path]
) -> None:
    _put(store)
    good = tmp_path / "good.tar"
    store.export(good, sign_key=signing_key[0])
    cut = tmp_path / "cut.tar"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 3])
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar at all" * 100)
    with CacheStore.open(tmp_path / "target") as target:
        for path in (cut, junk):
            with pytest.raises(CacheError, match="refusing to import"):
                target.import_(path, trusted_keys=[signing_key[1]])
        assert _storage_keys(target) == []


# ---------------------------------------------------------------- orphans, collected on open


def _crashed_writer_parts(store: CacheStore, n: int, age_s: float = 3600.0) -> list[str]:
    """Parts a writer that crashed `age_s` ago left behind (no manifest names them)."""
    backend = store._backend
    when = time.time_ns() - int(age_s * 1e9)
    keys = []
    for i in range(n):
        key = make_key(_fields(f"crashed-{i}"))
        store_key = f"part:{key}:{when:016x}{i:08x}:0"
        big = i == 0 and age_s > 60  # one part in a file, the rest in SQLite
        backend.set(store_key, bytes(BIG * 4) if big else b"half an entry")
        keys.append(store_key)
    return keys


def _put_long_ago(
    store: CacheStore, monkeypatch: pytest.MonkeyPatch, age_s: float = 7200.0
) -> tuple[str, dict]:
    """`_put`, its parts written under the nonce of a writer `age_s` ago (older than the
    orphan scan's grace, so that the scan weighs them)."""
    nonce = f"{time.time_ns() - int(age_s * 1e9):016x}abcdef01"
    with monkeypatch.context() as m:
        m.setattr(writer_mod, "new_nonce", lambda: nonce)
        return _put(store)


def test_orphans_are_collected_on_open_a_bounded_slice_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "cache"
    with CacheStore.open(directory) as s:
        # The good entry is as old as the orphans, so that the scan weighs its parts too: its
        # manifest is stored deflated, and a scan of the stored bytes for the parts' nonce
        # once took every part of every entry older than the grace period for an orphan.
        key, parts = _put_long_ago(s, monkeypatch)
        orphans = _crashed_writer_parts(s, 5)
        young = _crashed_writer_parts(s, 1, age_s=1.0)  # a writer at work: kept
        assert s.verify().orphan_parts == 6
    assert len(_val_files(s)) == 2
    monkeypatch.setattr(store_mod, "ORPHAN_SCAN_PARTS", 2)  # a slice of 2 parts per open
    left = []
    for _ in range(6):
        with CacheStore.open(directory) as s:
            left.append(len([k for k in _storage_keys(s) if k in orphans]))
    assert left[0] < 5 and left[-1] == 0 and left == sorted(left, reverse=True), left
    with CacheStore.open(directory) as s:
        assert [k for k in _storage_keys(s) if k.startswith("part:") and k in young] == young
        _assert_entry(s.get(key), parts, 0)  # the entry's own parts are no orphans
        assert len(_val_files(s)) == 1  # the orphan's file is gone too
        assert s.verify().orphan_parts == 1


def test_parts_of_a_manifest_that_does_not_inflate_wait_for_verify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The open's orphan scan cannot read which parts a manifest names when its body does
    not inflate: it leaves them, however old, and `verify(fix=True)` drops the entry whole."""
    directory = tmp_path / "cache"
    with CacheStore.open(directory) as s:
        key, _ = _put_long_ago(s, monkeypatch)
        _rewrite(s, f"manifest:{key}", lambda raw: raw[: raw.index(b"\n") + 1] + b"\xff" * 16)
        parts = [k for k in _storage_keys(s) if k.startswith(f"part:{key}:")]
        assert len(parts) == 3
    with CacheStore.open(directory) as s:  # (the open scans for orphans)
        assert [k for k in _storage_keys(s) if k.startswith(f"part:{key}:")] == parts
        report = s.verify(fix=True)
        assert key in report.bad
        assert not [k for k in _storage_keys(s) if k.startswith(f"part:{key}:")]


def test_opening_spends_little_on_orphans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "cache"
    with CacheStore.open(directory) as s:
        for i in range(20):
            _put(s, f"model-{i}", seed=i)
        _crashed_writer_parts(s, 300)
    start = time.perf_counter()
    with CacheStore.open(directory) as s:
        took = time.perf_counter() - start
        assert s.verify().orphan_parts < 300  # some collected
    assert took < 1.0, took  # a 20 ms budget, plus the open itself


def test_tvm_version_is_read_only_where_tvm_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache drops entries compiled by another TVM only where one is installed: an app's
    runtime without it (or with it blocked) reads no package metadata for that."""
    import importlib.util
    from importlib import metadata

    from litekiln.artifact.versions import tvm_version

    if importlib.util.find_spec("tvm") is not None:
        assert tvm_version() == metadata.version("apache-tvm")
    monkeypatch.setitem(sys.modules, "tvm", None)  # as scripts/remote_gpu/run.sh blocks it
    assert tvm_version() is None
