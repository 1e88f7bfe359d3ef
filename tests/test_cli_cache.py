"""`litekiln cache ...` end to end, on a cache that holds the compiled smoke model (PoCL in CI).

The commands run in-process through `litekiln.cli.main` (output via capsys); one test runs the
real ``python -m litekiln.cli`` to check the exit status and the error line of the process.
"""

from __future__ import annotations

import hashlib
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

    assert by_kind["model"]["model_bytes"] == SMOKE.stat().st_size
    assert by_kind["program"]["model_share"] is None  # a device binary, not a compiled model

    rc, out, _ = cli(capsys, cache, "ls")
    assert rc == 0 and "2 entries" in out
    assert the_key(cache, "model")[:12] in out and the_key(cache, "program")[:12] in out
    share = by_kind["model"]["model_share"]
    (line,) = [line for line in out.splitlines() if the_key(cache, "model")[:12] in line]
    assert f"{100 * share:.1f}% of model" in line


def test_info_by_prefix(capsys, cache: Path) -> None:
    key = the_key(cache, "model")
    rc, out, _ = cli(capsys, cache, "info", key[:10], "--json")
    assert rc == 0
    info = json.loads(out)
    assert info["key"] == key and info["kind"] == "model"
    # The manifest and the kernels' texts (OpenCL C; PTX where nvcc made some): every
    # constant of the smoke model is rebuilt from the model file.
    names = [p["name"] for p in info["parts"] if p["name"] != "ptx.json.lzma"]
    assert names == ["artifact.json.lzma", "source.json.lzma"]
    assert all(len(p["sha256"]) == 64 for p in info["parts"])
    assert info["model_bytes"] == SMOKE.stat().st_size
    assert info["model_share"] == pytest.approx(info["size"] / SMOKE.stat().st_size)
    rc, out, _ = cli(capsys, cache, "info", key[:10])
    assert rc == 0 and f"{100 * info['model_share']:.1f}% of the model's" in out

    rc, out, _ = cli(capsys, cache, "info", the_key(cache, "program")[:10], "--json")
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


@pytest.fixture(scope="module")
def build_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A key pair made by ``litekiln cache keygen``: (private key, public key)."""
    private = tmp_path_factory.mktemp("keys") / "build.key"
    assert main(["cache", "keygen", str(private)]) == 0
    return private, private.with_name("build.key.pub")


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
    capsys,
    template: Template,
    cache: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    build_key: tuple[Path, Path],
) -> None:
    archive = tmp_path / "smoke-cache.tar"
    rc, out, _ = cli(capsys, cache, "export", str(archive), "--sign-key", str(build_key[0]))
    assert rc == 0 and "exported 2 entries" in out and archive.is_file()

    other = tmp_path / "other"
    monkeypatch.setenv("LITEKILN_TRUSTED_KEYS", str(build_key[1]))
    rc, out, _ = cli(capsys, other, "import", str(archive))
    assert rc == 0 and "imported 2 verified entries" in out
    assert other.stat().st_mode & 0o777 == 0o700  # created private
    src, dst = cli_json(capsys, cache, "ls")[1], cli_json(capsys, other, "ls")[1]
    assert sorted(e["key"] for e in src["entries"]) == sorted(e["key"] for e in dst["entries"])

    hits = _hit_only(monkeypatch)
    assert same(infer(other), template.outputs)
    assert hits == [True]
    _clean(other, entries=2)


def test_export_of_one_key_by_prefix(
    capsys, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, build_key
) -> None:
    archive = tmp_path / "model.tar"
    key = the_key(cache, "model")
    monkeypatch.setenv("LITEKILN_SIGN_KEY", str(build_key[0]))
    rc, out, _ = cli(capsys, cache, "export", str(archive), key[:8])
    assert rc == 0 and "exported 1 entries" in out
    rc, out, _ = cli(
        capsys, tmp_path / "other", "import", str(archive), "--trusted-key", str(build_key[1])
    )
    assert rc == 0 and "imported 1 verified entries" in out
    assert [e["key"] for e in cli_json(capsys, tmp_path / "other", "ls")[1]["entries"]] == [key]


def test_export_of_an_unknown_key_is_a_clear_error(
    capsys, cache: Path, tmp_path: Path, build_key
) -> None:
    archive = tmp_path / "none.tar"
    rc, _, err = cli(capsys, cache, "export", str(archive), "zzzz", "--sign-key", str(build_key[0]))
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


def test_tampered_export_is_refused(
    capsys, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, build_key
) -> None:
    good, bad = tmp_path / "good.tar", tmp_path / "bad.tar"
    assert cli(capsys, cache, "export", str(good), "--sign-key", str(build_key[0]))[0] == 0
    _tamper(good, bad)
    other = tmp_path / "other"
    monkeypatch.setenv("LITEKILN_TRUSTED_KEYS", str(build_key[1]))
    rc, out, err = cli(capsys, other, "import", str(bad))
    _assert_error(rc, err, "refusing to import", "nothing was imported")
    assert out == ""
    assert cli_json(capsys, other, "ls")[1]["entries"] == []
    assert val_files(other) == [] and storage_keys(other) == []
    _clean(other, entries=0)
    assert cli(capsys, other, "import", str(good))[0] == 0  # the untouched export still works
    _clean(other, entries=2)


def _recompute_checksums(src: Path, dst: Path, change) -> None:
    """Change the largest part of the export with `change`, then recompute every checksum
    that can be computed without a secret or private key: the part's sha256 (and size) in its
    manifest, the manifest's own checksum header (the old format) or its sha256 in the index
    (the signed format). A signature, if any, is kept as it was."""
    with tarfile.open(src) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    parts = [n for n in members if n.split("/")[-1].isdigit()]
    victim = max(parts, key=lambda n: len(members[n]))
    members[victim] = change(members[victim])
    _, key, position = victim.split("/")
    name = f"entries/{key}/manifest"
    raw = members[name]
    header, body = (raw[:70], raw[70:]) if raw.startswith(b"LKM1 ") else (b"", raw)
    manifest = json.loads(body)
    rec = manifest["parts"][int(position)]
    rec["size"] = len(members[victim])
    rec["sha256"] = hashlib.sha256(members[victim]).hexdigest()
    body = json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    body = body.encode()
    if header:
        header = b"LKM1 " + hashlib.sha256(body).hexdigest().encode() + b"\n"
    members[name] = header + body
    index = json.loads(members["litekiln-cache-export.json"])
    for listed in index["entries"]:
        if isinstance(listed, dict) and listed["key"] == key:
            listed["manifest_sha256"] = hashlib.sha256(body).hexdigest()
    members["litekiln-cache-export.json"] = json.dumps(index, sort_keys=True).encode()
    with tarfile.open(dst, "w") as tar:
        for member_name, data in members.items():
            info = tarfile.TarInfo(member_name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_tampered_export_with_recomputed_checksums_is_refused(
    capsys, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, build_key
) -> None:
    good, bad = tmp_path / "good.tar", tmp_path / "bad.tar"
    rc, _, err = cli(capsys, cache, "export", str(good), "--sign-key", str(build_key[0]))
    assert rc == 0, err
    _recompute_checksums(good, bad, flip)
    other = tmp_path / "other"
    monkeypatch.setenv("LITEKILN_TRUSTED_KEYS", str(build_key[1]))
    rc, out, err = cli(capsys, other, "import", str(bad))
    _assert_error(rc, err, "refusing to import", "does not match", "nothing was imported")
    assert not other.exists() or cli_json(capsys, other, "ls")[1]["entries"] == []
    # Even --trust (no signature needed) does not accept a signature that does not match.
    rc, out, err = cli(capsys, other, "import", str(bad), "--trust")
    _assert_error(rc, err, "refusing to import", "changed after it was signed")
    assert cli_json(capsys, other, "ls")[1]["entries"] == []


def test_only_trusted_signatures_are_imported(
    capsys, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, build_key
) -> None:
    monkeypatch.delenv("LITEKILN_SIGN_KEY", raising=False)
    monkeypatch.delenv("LITEKILN_TRUSTED_KEYS", raising=False)
    unsigned, signed = tmp_path / "unsigned.tar", tmp_path / "signed.tar"
    rc, _, err = cli(capsys, cache, "export", str(unsigned))
    _assert_error(rc, err, "exports are signed", "--sign-key", "keygen", "--unsigned")
    assert not unsigned.exists()
    rc, out, _ = cli(capsys, cache, "export", str(unsigned), "--unsigned")
    assert rc == 0 and "(unsigned)" in out
    assert cli(capsys, cache, "export", str(signed), "--sign-key", str(build_key[0]))[0] == 0

    other = tmp_path / "other"
    rc, _, err = cli(capsys, other, "import", str(unsigned))
    _assert_error(rc, err, "refusing to import", "not signed", "--trust")
    rc, _, err = cli(capsys, other, "import", str(signed))  # no key is trusted
    _assert_error(rc, err, "refusing to import", "not a trusted key")
    assert cli_json(capsys, other, "ls")[1]["entries"] == []

    rc, out, _ = cli(capsys, other, "import", str(signed), "--trusted-key", str(build_key[1]))
    assert rc == 0 and "imported 2 verified entries" in out
    assert cli(capsys, other, "clear")[0] == 0
    rc, out, _ = cli(capsys, other, "import", str(unsigned), "--trust")
    assert rc == 0 and "imported 2" in out
    _clean(other, entries=2)  # imported entries are signed with this cache's secret


def test_keygen(capsys, tmp_path: Path) -> None:
    key = tmp_path / "k"
    capsys.readouterr()
    assert main(["cache", "keygen", str(key)]) == 0
    out = capsys.readouterr().out
    assert key.stat().st_mode & 0o777 == 0o600
    public = key.with_name("k.pub").read_text()
    assert public.startswith("-----BEGIN PUBLIC KEY-----") and public.strip() in out
    assert main(["cache", "keygen", str(key)]) == 1  # never overwrites a key
    assert "exists already" in capsys.readouterr().err


# ---------------------------------------------------------------- issue 18: rough edges


def test_options_after_the_action(capsys, cache: Path) -> None:
    capsys.readouterr()
    assert main(["cache", "ls", "--cache-dir", str(cache), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["directory"] == str(cache) and len(doc["entries"]) == 2
    assert main(["cache", "verify", "--json", "--cache-dir", str(cache)]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 2


def test_info_by_token_and_by_model_file(capsys, cache: Path) -> None:
    token = litekiln.Interpreter(model_path=SMOKE, device="reference").model.token
    model_key, program_key = the_key(cache, "model"), the_key(cache, "program")
    for query in (token, str(SMOKE)):
        rc, out, err = cli(capsys, cache, "info", query)
        assert rc == 0, err
        assert model_key[:12] in out and token in out and "{" not in out  # words, not JSON
        rc, out, _ = cli(capsys, cache, "info", query, "--json")
        # The compiled model, and the device binary the session stored for it.
        assert rc == 0 and sorted(e["key"] for e in json.loads(out)) == sorted(
            [model_key, program_key]
        )


def test_verify_prints_words(capsys, cache: Path) -> None:
    rc, out, _ = cli(capsys, cache, "verify")
    assert rc == 0 and "2 entries checked, all good" in out
    assert "VerifyReport" not in out and "{" not in out
    rewrite(cache, part_storage_key(cache, the_key(cache, "model"), "artifact.json"), flip)
    rc, out, _ = cli(capsys, cache, "verify")
    assert rc == 1 and "bad entry" in out and "fails its sha256 check" in out


def test_prune_with_a_bad_size_is_an_argparse_error(capsys, cache: Path) -> None:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["cache", "--cache-dir", str(cache), "prune", "--max-size", "10X"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "invalid size '10X'" in err and "Traceback" not in err


def test_import_of_a_missing_file_says_so(capsys, tmp_path: Path) -> None:
    rc, _, err = cli(capsys, tmp_path / "cache", "import", str(tmp_path / "missing.lk"))
    _assert_error(rc, err, "missing.lk", "does not exist")
    assert "damaged" not in err


def test_ls_creates_no_directory(capsys, tmp_path: Path) -> None:
    missing = tmp_path / "no" / "cache"
    for action in ("ls", "verify", "prune", "clear"):
        rc, out, _ = cli(capsys, missing, action)
        assert rc == 0 and "does not exist" in out
    assert not (tmp_path / "no").exists()


def test_ls_names_the_model_and_the_whole_device_of_a_program(
    capsys, template: Template, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The session passes the model to save_program (as it will once it gives these keywords).
    real_save = ModelCache.save_program
    compiled: dict = {}

    def save_program(self, *args, **kwargs):
        kwargs.setdefault("model_name", compiled["name"])
        kwargs.setdefault("model_token", compiled["token"])
        return real_save(self, *args, **kwargs)

    real_compile = loading.compile_for

    def compile_for(*args, **kwargs):
        out = real_compile(*args, **kwargs)
        compiled.update(name=out.model_name, token=out.token)
        return out

    monkeypatch.setattr(ModelCache, "save_program", save_program)
    monkeypatch.setattr(loading, "compile_for", compile_for)
    cache = tmp_path / "cache"
    assert same(infer(cache), template.outputs)
    rc, out, _ = cli(capsys, cache, "ls")
    assert rc == 0
    (program,) = [line for line in out.splitlines() if " program " in line]
    device = cli_json(capsys, cache, "ls")[1]["entries"]
    (fields,) = [e["fields"] for e in device if e["kind"] == "program"]
    assert f"binary for {fields['name']}" in program  # the whole name, not cut
    assert compiled["token"] in program and str(compiled["name"]) in program
    rc, out, _ = cli(capsys, cache, "info", compiled["token"])
    assert rc == 0 and out.count(compiled["token"]) >= 2  # the model and its program


def test_prune_with_a_bad_age_is_an_argparse_error(capsys, cache: Path) -> None:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["cache", "prune", "--older-than", "3x", "--cache-dir", str(cache)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "cannot read '3x' as an age" in err
    assert "Traceback" not in err
