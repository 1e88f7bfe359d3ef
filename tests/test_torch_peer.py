"""``litekiln bench --peer torch`` (litekiln/peers): the corpus recipe in one copy, the recipe
lookup, and the torch peer itself on a real converted PyTorch model.

The model: ``tests/data/tv_mobilenet_v3_small_tiny.tflite`` (600 KB), a torchvision
``mobilenet_v3_small(num_classes=10, width_mult=0.25)`` built by the corpus recipe (seed 14)
and converted by litert-torch at 1x3x64x64, NCHW, as the corpus' models are; its recipe, the
state-dict digest of its weights and the command that made it are in
``tests/data/tv_mobilenet_v3_small_tiny.torch.json``. The corpus' own models (550 MB, made in
the corpus virtualenv) are not in CI; where ``models/corpus/`` holds tv_squeezenet1_1, its
recipe is checked too.

torch comes from the ``torch-peer`` extra (scripts/test.sh installs it: torch 2.13.0's CPU build,
which pip takes from this machine's disk, and PyPI's torchvision 0.28.0, whose C++ operators
cannot load beside a CPU torch: `torch_recipe.import_torchvision` deals with that). The
weights recorded under torch 2.14.1 come out the same under 2.13.0: the digest check says so.
torch.compile's success path is not run here (inductor compiles C++ for two minutes on two
busy cores); its failure path is (an error string, not a crash).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from litekiln.peers.torch_peer import Recipe, TorchPeer, _weights, compare, find_recipe

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
TINY = DATA / "tv_mobilenet_v3_small_tiny.tflite"
TINY_RECIPE = DATA / "tv_mobilenet_v3_small_tiny.torch.json"
CORPUS = REPO / "models" / "corpus" / "corpus.json"


def _manifest(
    tmp_path: Path, model: Path, entry: dict[str, Any], name: str, key: str | None = None
) -> Path:
    """A corpus folder holding ``model`` as NAME.tflite and a manifest with one entry (named
    ``key``, default NAME)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    dst = tmp_path / f"{name}.tflite"
    shutil.copy(model, dst)
    manifest = {"schema": 1, "models": {key or name: entry}}
    (tmp_path / "corpus.json").write_text(json.dumps(manifest))
    return dst


def _tiny_entry(**changes: Any) -> dict[str, Any]:
    r = json.loads(TINY_RECIPE.read_text())
    entry = {
        "spec": {
            "source": "torchvision",
            **{k: r[k] for k in Recipe.__dataclass_fields__ if k in r},
        },
        "sha256": r["sha256"],
        "provenance": {"state_dict_sha256": r["state_dict_sha256"], "versions": r["versions"]},
    }
    entry.update(changes)
    return entry


# ---------------------------------------------------------------------------- no torch needed


def test_the_recipe_imports_nothing_but_the_standard_library() -> None:
    """scripts/corpus_torch.py runs in the corpus venv and takes the recipe from the package:
    importing it must not need numpy, pyopencl, TVM, tflite or torch."""
    code = (
        "import sys\n"
        "for m in ('numpy', 'pyopencl', 'tvm', 'tflite', 'torch', 'diskcache'):\n"
        "    sys.modules[m] = None\n"
        f"sys.path.insert(0, {str(REPO / 'scripts')!r})\n"
        "import corpus_torch\n"
        "from litekiln.peers import torch_recipe\n"
        "assert corpus_torch.build_module is torch_recipe.build_module\n"
        "assert corpus_torch.state_digest is torch_recipe.state_digest\n"
        "print(sorted(m for m in sys.modules if m.startswith('litekiln')))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr
    assert "litekiln.check" not in proc.stdout and "litekiln.bench" not in proc.stdout


def test_recipe_from_the_manifest_beside_the_model(tmp_path: Path) -> None:
    model = _manifest(tmp_path, TINY, _tiny_entry(), "tv_tiny")
    recipe = find_recipe(model)
    assert isinstance(recipe, Recipe)
    assert (recipe.library, recipe.constructor, recipe.seed) == (
        "torchvision",
        "mobilenet_v3_small",
        14,
    )
    assert recipe.kwargs == {"num_classes": 10, "width_mult": 0.25}
    assert recipe.input_shape == (1, 3, 64, 64) and recipe.file_matches is True
    assert "matched by sha256" in recipe.source


def test_a_file_that_is_not_the_recorded_one_matches_by_name_and_says_so(tmp_path: Path) -> None:
    model = _manifest(tmp_path, TINY, _tiny_entry(sha256="0" * 64), "tv_tiny")
    recipe = find_recipe(model)
    assert isinstance(recipe, Recipe) and recipe.file_matches is False
    assert "name only" in recipe.source
    verdict = _weights(recipe, recipe.state_dict_sha256 or "", {})
    assert not verdict["comparable"] and "refilled" in verdict["verdict"]


def test_models_without_a_pytorch_recipe_get_a_note(tmp_path: Path, smoke_path: Path) -> None:
    keras = {"spec": {"source": "keras", "constructor": "MobileNetV2"}, "sha256": "x"}
    note = find_recipe(_manifest(tmp_path / "k", smoke_path, keras, "smoke"))
    assert isinstance(note, str) and "keras, not PyTorch" in note
    note = find_recipe(_manifest(tmp_path / "o", smoke_path, {"sha256": "x"}, "other", "smoke"))
    assert isinstance(note, str) and note.startswith("no PyTorch recipe for other.tflite")


def test_user_recipe_file(tmp_path: Path) -> None:
    recipe = find_recipe(TINY, TINY_RECIPE)
    assert isinstance(recipe, Recipe) and recipe.file_matches is True
    assert recipe.state_dict_sha256 and recipe.source.startswith("--torch-recipe")
    bare = tmp_path / "r.json"
    bare.write_text(json.dumps({"library": "torchvision", "constructor": "x", "seed": 1}))
    recipe = find_recipe(TINY, bare)
    assert isinstance(recipe, Recipe) and recipe.file_matches is None
    assert _weights(recipe, "ab" * 32, {})["match"] is None
    bare.write_text(json.dumps({"library": "torchvision", "constructor": "x"}))
    with pytest.raises(ValueError, match="lacks seed"):
        find_recipe(TINY, bare)
    bare.write_text("[]")
    with pytest.raises(ValueError, match="neither a recipe nor a manifest"):
        find_recipe(TINY, bare)


def test_other_weights_are_said_to_differ_with_the_versions() -> None:
    recipe = find_recipe(TINY, TINY_RECIPE)
    assert isinstance(recipe, Recipe)
    w = _weights(recipe, "f" * 64, {"torch": "2.11.0", "torchvision": "0.26.0"})
    assert w["match"] is False and not w["comparable"]
    assert "DIFFER" in w["verdict"] and "here torch 2.11.0, torchvision 0.26.0" in w["verdict"]
    assert "recorded with torch 2.14.1" in w["verdict"] and "not comparable" in w["verdict"]


def test_compare_outputs() -> None:
    ref = [np.array([[1.0, -3.0]], np.float32)]
    got = compare(ref, [np.array([[1.0, -2.5]], np.float32)])
    assert got["max_abs_err"] == pytest.approx(0.5) and got["max_rel_err"] == pytest.approx(0.5 / 3)
    bad = compare(ref, [np.zeros((2, 2), np.float32)])
    assert bad["max_rel_err"] is None and "shapes differ" in bad["compare_error"]


def test_a_model_without_a_recipe_is_a_note_not_a_failure(smoke_path: Path, tmp_path: Path) -> None:
    pytest.importorskip("ai_edge_litert.interpreter")
    from litekiln.bench import latency_model

    peer = TorchPeer(recipe_file=None, modes=("eager",))
    rec = latency_model(
        str(smoke_path), {"device": "reference"}, runs=2, profile=False, litert_gpu=False,
        breakdown=False, peers=(peer,),
    )  # fmt: skip
    assert (
        set(rec["torch"]) == {"note"}
        and "no PyTorch recipe for smoke.tflite" in rec["torch"]["note"]
    )


def test_torch_modes_option() -> None:
    from litekiln.cli.main import build_parser

    parser = build_parser()
    a = parser.parse_args(
        ["bench", str(TINY), "--peer", "torch", "--torch-modes", "eager,cuda-graph"]
    )
    assert a.peers == ["torch"] and a.torch_modes == ("eager", "cuda_graph")
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", str(TINY), "--torch-modes", "eager,jit"])


# ---------------------------------------------------------------------------- torch


@pytest.fixture(scope="module")
def torch() -> Any:
    torch = pytest.importorskip(
        "torch", reason="the torch-peer extra is not installed (scripts/test.sh)"
    )
    from litekiln.peers.torch_recipe import import_torchvision

    try:
        import_torchvision()
    except ImportError as exc:
        pytest.skip(f"torchvision does not import: {exc}")
    return torch


def test_the_recipe_rebuilds_the_recorded_weights(torch: Any) -> None:
    from litekiln.peers.torch_recipe import build_module, state_digest

    r = json.loads(TINY_RECIPE.read_text())
    module = build_module(r["library"], r["constructor"], r["kwargs"], r["seed"])
    assert state_digest(module) == r["state_dict_sha256"]
    built = json.loads(CORPUS.read_text())["models"] if CORPUS.is_file() else {}
    # CI builds only corpus.CI_SUBSET (tests/test_corpus.py), no torch model: there the
    # committed recipe above is the check; where the whole corpus is built, one of its own too
    if "tv_squeezenet1_1" in built:
        entry = built["tv_squeezenet1_1"]
        s = entry["spec"]
        module = build_module(s["library"], s["constructor"], s["kwargs"], s["seed"])
        assert state_digest(module) == entry["provenance"]["state_dict_sha256"]


@pytest.mark.opencl
@pytest.mark.slow
def test_bench_peer_torch_matches_litekiln(torch: Any, tmp_path: Path) -> None:
    """The whole command on PoCL: litekiln's OpenCL outputs against the module's own."""
    model = _manifest(tmp_path / "corpus", TINY, _tiny_entry(), "tv_mobilenet_v3_small_tiny")
    out = tmp_path / "lat.json"
    cmd = [
        sys.executable, "-m", "litekiln.cli", "bench", str(model), "--runs", "3",
        "--peer", "torch", "--torch-modes", "eager,cuda_graph", "--cache-dir",
        str(tmp_path / "cache"), "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = json.loads(out.read_text())["models"][0]["torch"]
    assert rec["weights"]["match"] is True and rec["weights"]["comparable"], rec["weights"]
    assert "matched by sha256" in rec["recipe"]["source"]
    eager = rec["modes"]["eager"]
    assert eager["ms"] > 0 and eager["resident_ms"] > 0 and eager["speedup"] > 0
    assert eager["max_rel_err"] < 1e-5, eager
    assert rec["speedup_vs"]["eager"] == eager["speedup"]
    if not torch.cuda.is_available():
        assert "no CUDA device" in rec["modes"]["cuda_graph"]["error"]
    assert "torch (torch " in proc.stdout and "eager" in proc.stdout
    assert "n/a: not available: no CUDA device" in proc.stdout


@pytest.mark.slow
def test_a_torch_compile_that_cannot_compile_is_an_error_string(
    torch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No working C compiler for inductor: the compile mode says why; eager still runs."""
    import torch._inductor.config as inductor

    from litekiln.interpreter import Interpreter

    monkeypatch.setattr(inductor.cpp, "cxx", ("/nonexistent/c++",))
    interp = Interpreter(model_path=str(TINY), device="reference")
    inputs = interp.random_inputs(0)
    ours = interp.run(inputs)
    peer = TorchPeer(recipe_file=str(TINY_RECIPE), modes=("eager", "compile"), device="cpu")
    rec = peer.measure(str(TINY), inputs, ours, 1.0, runs=2, warmup=1)
    assert rec["modes"]["eager"]["max_rel_err"] < 1e-5
    err = rec["modes"]["compile"]["error"]
    assert (
        err and rec["modes"]["compile"].get("ms") is None and rec["speedup_vs"]["compile"] is None
    )
    peer.print_rows(rec)  # prints the error, does not raise
