"""Shared fixtures: model files, OpenCL availability, an isolated cache directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


def _has_opencl() -> bool:
    try:
        from litekiln.runtime.device import list_devices

        return bool(list_devices())
    except Exception:  # noqa: BLE001 - any failure means "no usable OpenCL here"
        return False


HAS_OPENCL = _has_opencl()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_OPENCL:
        return
    skip = pytest.mark.skip(reason="no OpenCL device (install pocl-opencl-icd)")
    for item in items:
        if "opencl" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No test reads or writes the user's real cache."""
    if "LITEKILN_CACHE_DIR" not in os.environ or os.environ.get("CI"):
        d = tmp_path_factory.mktemp("cache")
        os.chmod(d, 0o700)
        monkeypatch.setenv("LITEKILN_CACHE_DIR", str(d))


def zoo_model(name: str) -> Path:
    """A zoo model's path, skipping the test if the zoo does not hold it."""
    from litekiln.zoo import ZooModelMissing, zoo_path

    if (DATA / f"{name}.tflite").exists():  # the small models are committed test data
        return DATA / f"{name}.tflite"
    try:
        return zoo_path(name)
    except ZooModelMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture
def smoke_path() -> Path:
    """A small float model (convs, depthwise, pool, add, concat, resize, FC, softmax)."""
    return DATA / "smoke.tflite"


@pytest.fixture
def smoke_int8_path() -> Path:
    """The int8 (full-integer) version of the smoke model."""
    return DATA / "smoke_int8.tflite"
