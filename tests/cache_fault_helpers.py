"""Helpers shared by the end-to-end cache tests (test_cache_faults.py, test_cli_cache.py).

PoCL compiles are slow: each test module compiles the smoke model once into a *template*
cache directory (`make_template`) and copies it per test (`copy_cache`). The helpers under
"raw storage" reach past `CacheStore` into diskcache's SQLite database and value files to damage
an entry the way a disk or a crash would.
"""

from __future__ import annotations

import gc
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import litekiln
from litekiln.cache import CacheStore
from litekiln.cache.manifest import SCHEMA_VERSION, decode_manifest
from litekiln.cache.seal import Seal, load_secret

SMOKE = Path(__file__).parent / "data" / "smoke.tflite"
DATA = f"v{SCHEMA_VERSION}"  # the schema folder inside a cache directory


def smoke_inputs() -> dict[int, np.ndarray]:
    """Fixed inputs for the smoke model (same in every process)."""
    it = litekiln.Interpreter(model_path=SMOKE, device="reference")
    rng = np.random.default_rng(1234)
    return {
        d["index"]: rng.standard_normal(tuple(d["shape"])).astype(d["dtype"])
        for d in it.get_input_details()
    }


def infer(
    cache_dir: str | Path | None, model_path: Path = SMOKE, **options: Any
) -> list[np.ndarray]:
    """Construct an Interpreter on `cache_dir`, run the smoke model (or a changed copy of it,
    `model_path`) once, return its outputs."""
    it = litekiln.Interpreter(
        model_path=model_path, cache_dir=None if cache_dir is None else str(cache_dir), **options
    )
    it.allocate_tensors()
    for index, value in smoke_inputs().items():
        it.set_tensor(index, value)
    it.invoke()
    outs = [np.array(it.get_tensor(d["index"]), copy=True) for d in it.get_output_details()]
    # What a first start stores after its first inference (PoCL's binary, tuning choices) is
    # stored in the background: done before the test looks at the cache.
    getattr(it._backend, "wait_for_graph", lambda: None)()  # noqa: SLF001
    del it
    gc.collect()  # release the store's database connections before the test looks at files
    return outs


def changed_smoke(directory: Path) -> Path:
    """A copy of the smoke model in `directory` with its largest weights (the fully-connected
    layer's) doubled: the same file layout, other weights."""
    from litekiln.model import load_model

    raw = SMOKE.read_bytes()
    model = load_model(raw)
    fc = max((t for t in model.main.tensors if t.data is not None), key=lambda t: t.nbytes)
    assert fc.data is not None and fc.data.dtype == np.float32
    at = raw.find(fc.data.tobytes())
    assert at > 0
    new = (fc.data * 2).astype("<f4").tobytes()
    path = Path(directory) / "smoke.tflite"
    path.write_bytes(raw[:at] + new + raw[at + len(new) :])
    return path


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    """Bit-identical outputs (same kernels, same inputs)."""
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y)
        for x, y in zip(a, b, strict=True)
    )


@dataclass
class Template:
    directory: Path
    outputs: list[np.ndarray]


def make_template(directory: Path) -> Template:
    """Compile the smoke model into an empty cache at `directory` (mode 0700)."""
    directory.mkdir(mode=0o700)
    directory.chmod(0o700)
    outputs = infer(directory)
    with CacheStore.open(directory) as s:
        kinds = sorted(e.kind for e in s.ls())
        assert kinds == ["model", "program"], kinds
        report = s.verify()
        assert report.clean, report
    gc.collect()
    return Template(directory, outputs)


def copy_cache(template: Template, dst: Path) -> Path:
    """A private copy of the template cache (modes preserved: 0700 folders)."""
    shutil.copytree(template.directory, dst)
    assert dst.stat().st_mode & 0o777 == 0o700
    return dst


# ---------------------------------------------------------------- raw storage


def keys_by_kind(directory: Path) -> dict[str, list[str]]:
    with CacheStore.open(directory) as s:
        out: dict[str, list[str]] = {}
        for e in s.ls():
            out.setdefault(e.kind, []).append(e.key)
    return out


def the_key(directory: Path, kind: str) -> str:
    (key,) = keys_by_kind(directory)[kind]
    return key


def _db(directory: Path) -> sqlite3.Connection:
    return sqlite3.connect(Path(directory) / DATA / "cache.db", isolation_level=None)


def row(directory: Path, storage_key: str) -> tuple[int, str | None, bytes | None]:
    con = _db(directory)
    try:
        rows = con.execute(
            "SELECT mode, filename, value FROM Cache WHERE key = ?", (storage_key,)
        ).fetchall()
    finally:
        con.close()
    assert len(rows) == 1, storage_key
    return rows[0]


def manifest(directory: Path, key: str) -> dict[str, Any]:
    _, _, raw = row(directory, f"manifest:{key}")
    return decode_manifest(bytes(raw), key, Seal(load_secret(Path(directory), create=False)))


def part_storage_key(directory: Path, key: str, name: str) -> str:
    """Storage key of part `name` of entry `key` (`name` may be a prefix, e.g. "const/")."""
    recs = [r for r in manifest(directory, key)["parts"] if r["name"].startswith(name)]
    assert recs, (name, [r["name"] for r in manifest(directory, key)["parts"]])
    return str(recs[0]["store"])


def rewrite(directory: Path, storage_key: str, change: Callable[[bytes], bytes | None]) -> str:
    """Apply `change(bytes) -> bytes | None` (None: delete) to a stored value where it lives.

    Returns:
        "sqlite" or "file": where the value was.
    """
    mode, filename, value = row(directory, storage_key)
    if filename is None:  # held inside SQLite
        new = change(bytes(value))
        con = _db(directory)
        try:
            if new is None:
                con.execute("DELETE FROM Cache WHERE key = ?", (storage_key,))
            else:
                con.execute("UPDATE Cache SET value = ? WHERE key = ?", (new, storage_key))
        finally:
            con.close()
        return "sqlite"
    path = Path(directory) / DATA / filename
    new = change(path.read_bytes())
    if new is None:
        path.unlink()
    else:
        path.write_bytes(new)
    return "file"


def flip(data: bytes, at: int | None = None) -> bytes:
    at = len(data) // 2 if at is None else at
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


def storage_keys(directory: Path) -> list[str]:
    con = _db(directory)
    try:
        return [k for (k,) in con.execute("SELECT key FROM Cache ORDER BY key")]
    finally:
        con.close()


def val_files(directory: Path) -> list[Path]:
    return sorted((Path(directory) / DATA).rglob("*.val"))


def snapshot(directory: Path) -> list[tuple[str, int, int]]:
    """Every file under `directory` with its size and mtime (to show nothing was written)."""
    return sorted(
        (str(p.relative_to(directory)), p.stat().st_size, p.stat().st_mtime_ns)
        for p in Path(directory).rglob("*")
        if p.is_file()
    )
