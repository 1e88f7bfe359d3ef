"""litekiln.Interpreter has LiteRT's shape: same details, same indices, clear errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import litekiln
from litekiln.check import litert_outputs, relative_error

LiteRT = pytest.importorskip("ai_edge_litert.interpreter").Interpreter

KEYS = ("name", "index", "shape", "shape_signature", "dtype", "quantization")


@pytest.mark.parametrize("fixture", ["smoke_path", "smoke_int8_path"])
def test_details_match_litert(fixture: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(fixture)
    ours = litekiln.Interpreter(model_path=path, device="reference")
    theirs = LiteRT(model_path=str(path))
    theirs.allocate_tensors()
    for a, b in [
        (ours.get_input_details(), theirs.get_input_details()),
        (ours.get_output_details(), theirs.get_output_details()),
    ]:
        assert len(a) == len(b)
        for da, db in zip(a, b, strict=True):
            for k in KEYS:
                va, vb = da[k], db[k]
                if isinstance(vb, np.ndarray):
                    assert np.array_equal(va, vb), k
                elif k == "quantization":
                    assert va[1] == vb[1] and va[0] == pytest.approx(vb[0]), k
                else:
                    assert va == vb, k
            qa, qb = da["quantization_parameters"], db["quantization_parameters"]
            np.testing.assert_allclose(qa["scales"], qb["scales"])
            assert np.array_equal(qa["zero_points"], qb["zero_points"])
    names_a = [d["name"] for d in ours.get_tensor_details()]
    names_b = [d["name"] for d in theirs.get_tensor_details()]
    assert names_a == names_b


def test_reference_matches_litert_with_litert_calling_convention(smoke_path: Path) -> None:
    interp = litekiln.Interpreter(model_path=str(smoke_path), device="reference")
    interp.allocate_tensors()
    x = np.random.default_rng(0).uniform(-1, 1, (1, 32, 32, 3)).astype(np.float32)
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    y = interp.get_tensor(interp.get_output_details()[0]["index"])
    ref = litert_outputs(str(smoke_path), [x])
    assert relative_error([y], ref) <= 1e-4
    assert interp.tensor(interp.get_output_details()[0]["index"])().shape == (1, 10)


def test_model_content_and_token(smoke_path: Path) -> None:
    data = smoke_path.read_bytes()
    a = litekiln.Interpreter(model_content=data, device="reference")
    b = litekiln.Interpreter(model_path=smoke_path, device="reference")
    assert a.model.token == b.model.token and len(a.model.token) == 16
    c = litekiln.Interpreter(model_content=data, device="reference", model_token="my-model-v3")
    assert c.model.token == "my-model-v3"


def test_wrong_dtype_shape_and_index_are_clear_errors(smoke_path: Path) -> None:
    interp = litekiln.Interpreter(model_path=smoke_path, device="reference")
    idx = interp.get_input_details()[0]["index"]
    with pytest.raises(litekiln.InputError, match=r"expects dtype float32, got float64"):
        interp.set_tensor(idx, np.zeros((1, 32, 32, 3)))
    with pytest.raises(
        litekiln.InputError, match=r"expects shape \[1, 32, 32, 3\], got \[1, 16, 16, 3\]"
    ):
        interp.set_tensor(idx, np.zeros((1, 16, 16, 3), np.float32))
    with pytest.raises(litekiln.InputError, match="not a graph input"):
        interp.set_tensor(9999, np.zeros(1, np.float32))
    with pytest.raises(litekiln.InputError, match="inputs not set"):
        interp.invoke()
    with pytest.raises(litekiln.InputError, match="out of range"):
        interp.get_tensor(10**6)
    # Resizing re-plans at allocate_tensors; this model's RESHAPE to [1, 512] cannot take a
    # batch of 2 (LiteRT refuses it at allocate_tensors too).
    interp.resize_tensor_input(idx, [2, 32, 32, 3])
    with pytest.raises(litekiln.InputError, match=r"cannot run with inputs.*RESHAPE"):
        interp.allocate_tensors()


def test_bad_model_file_is_model_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"PK\x03\x04 this is a zip")
    with pytest.raises(litekiln.ModelError, match="zip archive"):
        litekiln.Interpreter(model_path=bad)
    with pytest.raises(litekiln.ModelError, match="no such model file"):
        litekiln.Interpreter(model_path=tmp_path / "missing.tflite")


def test_no_opencl_device_message(monkeypatch: pytest.MonkeyPatch, smoke_path: Path) -> None:
    import litekiln.runtime.device as device

    monkeypatch.setattr(device, "list_devices", lambda: [])
    monkeypatch.setattr(device, "_OPEN", {})  # no device opened earlier in this process
    with pytest.raises(litekiln.DeviceError, match="pocl-opencl-icd"):
        litekiln.Interpreter(model_path=smoke_path, use_cache=False).allocate_tensors()


def test_int8_model_runs_on_reference(smoke_int8_path: Path) -> None:
    interp = litekiln.Interpreter(model_path=smoke_int8_path, device="reference")
    x = interp.random_inputs(0)
    y = interp.run(x)[0]
    ref = litert_outputs(str(smoke_int8_path), x)[0]
    assert y.dtype == np.int8
    # Float view of an integer kernel: within a couple of quantization steps.
    assert np.abs(y.astype(int) - ref.astype(int)).max() <= 2
