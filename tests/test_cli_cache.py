"""`litekiln cache ...` end to end, on a cache that holds the compiled smoke model (PoCL in CI).

The commands run in-process through `litekiln.cli.main` (output via capsys); one test runs the
real ``python -m litekiln.cli`` to check the exit status and the error line of the process.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from cache_fault_helpers import (
    SMOKE,
    Template,
    copy_cache,
    flip,
    infer,
    make_template,
    part_storage_key,
    rewrite,
    same,
    storage_keys,
    the_key,
    val_files,
)

import litekiln
import litekiln.loading as loading
from litekiln.cache import CacheStore
from litekiln.cache.models import ModelCache
from litekiln.cli import main

pytestmark = pytest.mark.opencl

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    return make_template(tmp_path_factory.mktemp("template") / "cache")


@pytest.fixture
def cache(template: Template, tmp_path: Path) -> Path:
    return copy_cache(template, tmp_path / "cache")


def cli(capsys: pytest.CaptureFixture[str], cache_dir: Path, *args: str) -> tuple[int, str, str]:
    """Run ``litekiln cache --cache-dir DIR ARGS...``; (exit status, stdout, stderr)."""
    capsys.readouterr()
    rc = main(["cache", "--cache-dir", str(cache_dir), *args])
    out, err = capsys.readouterr()
    return rc, out, err


def cli_json(capsys: pytest.CaptureFixture[str], cache_dir: Path, *args: str) -> tuple[int, dict]:
    rc, out, err = cli(capsys, cache_dir, *args, "--json")
    assert "Traceback" not in err
    return rc, json.loads(out)


def _clean(directory: Path, entries: int) -> None:
    with CacheStore.open(directory) as s:
        report = s.verify()
    assert report.clean and report.entries == entries, report.as_dict()


def _assert_error(rc: int, err: str, *phrases: str) -> None:
    assert rc == 1
    assert err.startswith("litekiln: error: "), err
    assert "Traceback" not in err
    for phrase in phrases:
        assert phrase in err, err


# ---------------------------------------------------------------- ls / info / verify


def test_ls(capsys, cache: Path) -> None:
    rc, doc = cli_json(capsys, cache, "ls")
    assert rc == 0 and doc["directory"] == str(cache)
    by_kind = {e["kind"]: e for e in doc["entries"]}
    assert sorted(by_kind) == ["model", "program"] and len(doc["entries"]) == 2
    token = litekiln.Interpreter(model_path=SMOKE, device="reference").model.token
    assert by_kind["model"]["token"] == token
    assert by_kind["model"]["key"] == the_key(cache, "model")
    assert all(e["size"] > 0 and e["last_use"] >= e["created"] for e in doc["entries"])
    assert by_kind["program"]["fields"]["driver"]  # keyed by the driver version

    rc, out, _ = cli(capsys, cache, "ls")
    assert rc == 0 and "2 entries" in out
    assert the_key(cache, "model")[:12] in out and the_key(cache, "program")[:12] in out


def test_info_by_prefix(capsys, cache: Path) -> None:
    key = the_key(cache, "model")
    rc, out, _ = cli(capsys, cache, "info", key[:10])
    assert rc == 0
    info = json.loads(out)
    assert info["key"] == key and info["kind"] == "model"
    names = [p["name"] for p in info["parts"]]
    assert names[0] == "artifact.json" and any(n.startswith("const/") for n in names)
    assert all(len(p["sha256"]) == 64 for p in info["parts"])

    rc, out, _ = cli(capsys, cache, "info", the_key(cache, "program")[:10])
    assert rc == 0 and json.loads(out)["meta"]["device"]["driver"]


def test_info_unknown_key_is_a_clear_error(capsys, cache: Path) -> None:
    missing = "0" * 12 if not the_key(cache, "model").startswith("0") else "f" * 12
    rc, out, err = cli(capsys, cache, "info", missing)
    _assert_error(rc, err, "no cache entry matches", missing, str(cache))
    assert out == ""


def test_errors_from_a_real_process(cache: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    base = [sys.executable, "-m", "litekiln.cli", "cache", "--cache-dir", str(cache)]
    p = subprocess.run(
        [*base, "info", "zzzz"], capture_output=True, text=True, env=env, timeout=120
    )
    _assert_error(p.returncode, p.stderr, "no cache entry matches 'zzzz'")
    p = subprocess.run(
        [*base, "verify", "--json"], capture_output=True, text=True, env=env, timeout=120
    )
    assert p.returncode == 0 and json.loads(p.stdout)["clean"] is True


def test_group_writable_cache_dir_is_a_clear_error(capsys, cache: Path) -> None:
    cache.chmod(0o770)
    try:
        rc, _, err = cli(capsys, cache, "ls")
        _assert_error(rc, err, "group- or other-writable", "chmod 700")
    finally:
        cache.chmod(0o700)


def test_verify_clean(capsys, cache: Path) -> None:
    rc, doc = cli_json(capsys, cache, "verify")
    assert rc == 0 and doc["clean"] is True and doc["entries"] == 2 and doc["bad"] == {}
    rc, out, _ = cli(capsys, cache, "verify")
    assert rc == 0 and out.strip()


def test_verify_fix_after_damage(capsys, template: Template, cache: Path) -> None:
    key = the_key(cache, "model")
    rewrite(cache, part_storage_key(cache, key, "artifact.json"), flip)

    rc, doc = cli_json(capsys, cache, "verify")
    assert rc == 1 and doc["clean"] is False
    assert list(doc["bad"]) == [key] and "artifact.json" in doc["bad"][key]

    rc, doc = cli_json(capsys, cache, "verify", "--fix")
    assert rc == 0 and doc["fixed"] is True and list(doc["bad"]) == [key]

    rc, doc = cli_json(capsys, cache, "verify")
    assert rc == 0 and doc["clean"] is True and doc["entries"] == 1  # the binary is left
    assert not [k for k in storage_keys(cache) if key in k]  # nothing of the bad entry

    assert same(infer(cache), template.outputs)  # recompiled and stored again
    _clean(cache, entries=2)


# ---------------------------------------------------------------- prune / clear


def test_prune_to_zero(capsys, cache: Path) -> None:
    keys = sorted([the_key(cache, "model"), the_key(cache, "program")])
    rc, doc = cli_json(capsys, cache, "prune", "--max-size", "0")
    assert rc == 0 and sorted(doc["removed"]) == keys
    assert cli_json(capsys, cache, "ls")[1]["entries"] == []
    assert val_files(cache) == [] and [k for k in storage_keys(cache)] == []
    _clean(cache, entries=0)


def test_clear(capsys, template: Template, cache: Path) -> None:
    rc, out, _ = cli(capsys, cache, "clear")
    assert rc == 0 and "removed 2 entries" in out
    assert cli_json(capsys, cache, "ls")[1]["entries"] == []
    assert val_files(cache) == []
    _clean(cache, entries=0)


# ---------------------------------------------------------------- export / import


def _hit_only(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Make compiling fail; record whether each device binary came from the cache."""

    def no_compiler(*args, **kwargs):
        raise AssertionError("compile_for called: the compiled model should be a hit")

    hits: list[bool] = []
    real_load = ModelCache.load_program

    def load_program(self, *key):
        binary, choices = real_load(self, *key)
        hits.append(binary is not None)
        return binary, choices

    monkeypatch.setattr(loading, "compile_for", no_compiler)
    monkeypatch.setattr(ModelCache, "load_program", load_program)
    return hits


def test_export_then_import_into_another_dir_is_a_hit(
    capsys, template: Template, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "smoke-cache.tar"
    rc, out, _ = cli(capsys, cache, "export", str(archive))
    assert rc == 0 and "exported 2 entries" in out and archive.is_file()

    other = tmp_path / "other"
    rc, out, _ = cli(capsys, other, "import", str(archive))
    assert rc == 0 and "imported 2 verified entries" in out
    assert other.stat().st_mode & 0o777 == 0o700  # created private
    src, dst = cli_json(capsys, cache, "ls")[1], cli_json(capsys, other, "ls")[1]
    assert sorted(e["key"] for e in src["entries"]) == sorted(e["key"] for e in dst["entries"])

    hits = _hit_only(monkeypatch)
    assert same(infer(other), template.outputs)
    assert hits == [True]
    _clean(other, entries=2)


def test_export_of_one_key_by_prefix(capsys, cache: Path, tmp_path: Path) -> None:
    archive = tmp_path / "model.tar"
    key = the_key(cache, "model")
    rc, out, _ = cli(capsys, cache, "export", str(archive), key[:8])
    assert rc == 0 and "exported 1 entries" in out
    rc, out, _ = cli(capsys, tmp_path / "other", "import", str(archive))
    assert rc == 0 and "imported 1 verified entries" in out
    assert [e["key"] for e in cli_json(capsys, tmp_path / "other", "ls")[1]["entries"]] == [key]


def test_export_of_an_unknown_key_is_a_clear_error(capsys, cache: Path, tmp_path: Path) -> None:
    archive = tmp_path / "none.tar"
    rc, _, err = cli(capsys, cache, "export", str(archive), "zzzz")
    _assert_error(rc, err, "no cache entry matches 'zzzz'")
    assert not archive.exists()


def _tamper(src: Path, dst: Path) -> None:
    """Flip one byte in the largest member (a part's raw bytes)."""
    with tarfile.open(src) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    victim = max(range(len(members)), key=lambda i: len(members[i][1]))
    with tarfile.open(dst, "w") as tar:
        for i, (m, data) in enumerate(members):
            if i == victim:
                data = flip(data)
            tar.addfile(m, io.BytesIO(data))


def test_tampered_export_is_refused(capsys, cache: Path, tmp_path: Path) -> None:
    good, bad = tmp_path / "good.tar", tmp_path / "bad.tar"
    assert cli(capsys, cache, "export", str(good))[0] == 0
    _tamper(good, bad)
    other = tmp_path / "other"
    rc, out, err = cli(capsys, other, "import", str(bad))
    _assert_error(rc, err, "refusing to import", "nothing was imported")
    assert out == ""
    assert cli_json(capsys, other, "ls")[1]["entries"] == []
    assert val_files(other) == [] and storage_keys(other) == []
    _clean(other, entries=0)
    assert cli(capsys, other, "import", str(good))[0] == 0  # the untouched export still works
    _clean(other, entries=2)
