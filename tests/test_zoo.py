"""The model zoo's bookkeeping (litekiln.zoo, scripts/make_zoo.py) and, where the zoo has been
made, its models under LiteRT. The pure-Python tests need neither TensorFlow nor the zoo."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from litekiln import zoo

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def make_zoo() -> ModuleType:
    """scripts/make_zoo.py as a module (it imports TensorFlow only when generating)."""
    spec = importlib.util.spec_from_file_location("make_zoo", REPO / "scripts" / "make_zoo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_zoo"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _fake_model(directory: Path, name: str, data: bytes = b"\0\0\0\0TFL3fake") -> None:
    (directory / f"{name}.tflite").write_bytes(data)
    record = {
        "schema": zoo.RECORD_SCHEMA,
        "name": name,
        "recipe": zoo.ZOO[name].recipe,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    (directory / f"{name}.json").write_text(json.dumps(record))


def test_zoo_dir_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(zoo.ZOO_DIR_ENV, raising=False)
    assert zoo.zoo_dir() == REPO / "models" / "zoo"
    monkeypatch.setenv(zoo.ZOO_DIR_ENV, str(tmp_path / "env"))
    assert zoo.zoo_dir() == tmp_path / "env"
    assert zoo.zoo_dir(tmp_path / "arg") == tmp_path / "arg"


def test_groups_resolve_in_zoo_order() -> None:
    assert zoo.resolve(["small"]) == ["smoke", "smoke_int8"]
    assert zoo.resolve(["smoke_int8", "mediapipe"])[-1] == "smoke_int8"
    assert set(zoo.resolve(["all"])) == set(zoo.ZOO)
    with pytest.raises(KeyError, match="known"):
        zoo.resolve(["no_such_model"])


def test_missing_model_says_how_to_make_it(tmp_path: Path) -> None:
    with pytest.raises(zoo.ZooModelMissing, match="make_zoo.py --only smoke") as info:
        zoo.zoo_path("smoke", tmp_path)
    assert isinstance(info.value, FileNotFoundError)  # callers that catch that keep working


def test_record_must_match_file(tmp_path: Path) -> None:
    _fake_model(tmp_path, "smoke")
    assert zoo.check_model("smoke", tmp_path) is None
    assert zoo.zoo_path("smoke", tmp_path) == tmp_path / "smoke.tflite"
    (tmp_path / "smoke.tflite").write_bytes(b"\0\0\0\0TFL3fakf")  # same size, other bytes
    assert zoo.check_model("smoke", tmp_path) == "sha256 differs from record"
    (tmp_path / "smoke.json").write_text("{")  # a corrupt record is a miss, not a crash
    assert zoo.check_model("smoke", tmp_path) == "no record"


def test_mediapipe_record_must_carry_pinned_digest(tmp_path: Path) -> None:
    _fake_model(tmp_path, "face_landmark")
    assert zoo.check_model("face_landmark", tmp_path) == "record sha256 differs from the pinned one"


def test_ssd_anchors_match_published_layout(make_zoo: ModuleType) -> None:
    anchors = make_zoo.ssd_anchors([19, 10, 5, 3, 2, 1])
    assert anchors.shape == (1917, 4)
    # First cell of the lowest layer: (0.1, 1:1), then (0.2, 2:1) and (0.2, 1:2).
    np.testing.assert_allclose(anchors[0], [0.5 / 19, 0.5 / 19, 0.1, 0.1], rtol=1e-6)
    np.testing.assert_allclose(anchors[1, 2:], [0.2 / np.sqrt(2), 0.2 * np.sqrt(2)], rtol=1e-6)


def test_write_atomic_leaves_no_temp_file(make_zoo: ModuleType, tmp_path: Path) -> None:
    target = tmp_path / "sub" / "x.bin"
    make_zoo.write_atomic(target, b"one")
    make_zoo.write_atomic(target, b"two")
    assert target.read_bytes() == b"two"
    assert sorted(p.name for p in target.parent.iterdir()) == ["x.bin"]


def test_list_and_mediapipe_need_no_tensorflow(tmp_path: Path) -> None:
    # A fresh interpreter, since this test session may have imported TensorFlow already.
    code = (
        "import sys, runpy; sys.argv = ['make_zoo.py', '--list', '--json', '--out', sys.argv[1]];"
        "sys.modules['tensorflow'] = None;"  # any import of it now raises ImportError
        f"runpy.run_path({str(REPO / 'scripts' / 'make_zoo.py')!r}, run_name='__main__')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True
    )
    listing = json.loads(proc.stdout)
    assert {m["name"] for m in listing["models"]} == set(zoo.ZOO)
    assert not any(m["present"] for m in listing["models"])


@pytest.mark.zoo
@pytest.mark.parametrize("name", zoo.model_names(small=True))
def test_small_models_run_in_litert(name: str) -> None:
    try:
        path = zoo.zoo_path(name)
    except zoo.ZooModelMissing:
        pytest.skip(f"{name} not made: python scripts/make_zoo.py --only small")
    litert = pytest.importorskip("ai_edge_litert.interpreter")
    record = zoo.load_record(name)
    assert record is not None
    interp = litert.Interpreter(model_path=str(path))
    interp.allocate_tensors()
    (inp,) = interp.get_input_details()
    assert list(inp["shape"]) == record["inputs"][0]["shape"]
    interp.set_tensor(inp["index"], np.zeros(inp["shape"], inp["dtype"]))
    interp.invoke()
    (out,) = interp.get_output_details()
    assert interp.get_tensor(out["index"]).shape == (1, 10)
