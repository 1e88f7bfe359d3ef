"""Shared fixtures: model files, the OpenCL devices tests run on, an isolated cache directory.

OpenCL devices. Where scripts/setup_intel_opencl.sh installed Intel's OpenCL CPU runtime, its
ICD folder (intel.icd beside copies of the system's ICD files) becomes the ICD loader's
(OCL_ICD_VENDORS), here, before anything asks OpenCL for its platforms: the loader reads the
variable once, at its first call. Tests marked ``each_device``, and the op tests that check
through `gpu_helper.Batch`, run once per device in `TEST_DEVICES` (ids ``pocl``, ``intel``,
and any GPU's family; a device that is not installed is a skip that says so); the other OpenCL
tests run on `DEFAULT_DEVICE`. ``LITEKILN_DEVICE`` set by the caller pins every test to that
one device. ``LITEKILN_CPU_FIRST`` is off (see below).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).parent / "data"

#: The tests check the device's kernels: a start that builds them from source waits for them
#: rather than running its first inferences on the CPU (`Session._cpu_first`), except in the
#: tests of that path, which turn it on (``cpu_first=True`` or the variable, for the
#: subprocesses they start).
os.environ["LITEKILN_CPU_FIRST"] = "off"

#: Written by scripts/setup_intel_opencl.sh (inside the virtualenv the tests run in).
ICD_VENDORS = Path(sys.prefix) / "etc" / "OpenCL" / "vendors"
if "OCL_ICD_VENDORS" not in os.environ and (ICD_VENDORS / "intel.icd").is_file():
    os.environ["OCL_ICD_VENDORS"] = str(ICD_VENDORS)

#: No PTX for NVIDIA GPUs unless a test asks (tests/test_ptx.py): `litekiln compile` would run
#: nvcc on every model the CLI tests compile, for kernels no test machine can run.
os.environ.setdefault("LITEKILN_PTX", "off")

#: The driver families the GPU-path tests always name, with what installs each (CI runs both).
CI_FAMILIES = {
    "pocl": "PoCL is not installed (apt-get install pocl-opencl-icd; scripts/setup.sh)",
    "intel": "Intel's OpenCL CPU runtime is not installed (scripts/setup_intel_opencl.sh)",
}


@dataclass(frozen=True)
class TestDevice:
    """One OpenCL device the GPU-path tests run on."""

    id: str  # the test id: the driver family ("pocl", "intel", "nvidia", ...)
    choice: str  # its LITEKILN_DEVICE value: "P:D" indices
    description: str
    kind: str  # "gpu", "cpu" or "other"


def _find_devices() -> list[TestDevice]:
    """The first device of each driver family, in the ICD loader's order."""
    try:
        import pyopencl as cl

        from litekiln.runtime.device import list_devices
        from litekiln.runtime.profile import family_of

        found: dict[str, TestDevice] = {}
        for p, d, dev in list_devices():
            family = family_of(str(dev.platform.name))
            kind = "gpu" if dev.type & cl.device_type.GPU else "cpu"
            desc = f"{dev.name.strip()} ({dev.platform.name.strip()})"
            found.setdefault(family, TestDevice(family, f"{p}:{d}", desc, kind))
        return list(found.values())
    except Exception:  # noqa: BLE001 - any failure means "no usable OpenCL here"
        return []


DEVICES = _find_devices()
HAS_OPENCL = bool(DEVICES)
#: The device this file set for the tests that are not run per device (below), as a pytest-xdist
#: worker inherits it from the controller: that is no pin by the caller.
_SET_HERE = "_LITEKILN_TESTS_DEFAULT_DEVICE"
_PINNED = os.environ.get("LITEKILN_DEVICE", "")
if _PINNED and os.environ.get(_SET_HERE) == _PINNED:
    _PINNED = ""


def _test_devices() -> list[Any]:
    """pytest params of the devices the ``each_device`` tests run on."""
    if _PINNED:
        return [pytest.param(_PINNED, id="LITEKILN_DEVICE")]
    by_id = {d.id: d for d in DEVICES}
    params = [
        pytest.param(by_id[f].choice, id=f)
        if f in by_id
        else pytest.param(None, id=f, marks=pytest.mark.skip(reason=why))
        for f, why in CI_FAMILIES.items()
    ]
    params += [pytest.param(d.choice, id=d.id) for d in DEVICES if d.id not in CI_FAMILIES]
    return params


TEST_DEVICES = _test_devices()


def _default_device() -> str:
    """The device of the OpenCL tests that are not run per device: the caller's choice, else
    what litekiln picks (the first GPU), else PoCL, the CI device: never Intel's runtime just
    because its ICD file was listed first."""
    if _PINNED or not DEVICES:
        return _PINNED
    pick = next((d for d in DEVICES if d.kind == "gpu"), None)
    pick = pick or next((d for d in DEVICES if d.id == "pocl"), DEVICES[0])
    return pick.choice


DEFAULT_DEVICE = _default_device()
if DEFAULT_DEVICE:
    os.environ["LITEKILN_DEVICE"] = os.environ[_SET_HERE] = DEFAULT_DEVICE


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "each_device: run once per OpenCL device in conftest.TEST_DEVICES"
    )
    config.addinivalue_line(
        "markers",
        "not_on(*families, reason): an each_device case left out on these driver families",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "cl_device" in metafunc.fixturenames and _each_device(metafunc):
        metafunc.parametrize("cl_device", TEST_DEVICES, indirect=True)


def _each_device(metafunc: pytest.Metafunc) -> bool:
    """Marked ``each_device``, or an op test of a module that checks through gpu_helper's
    batches (tests/test_gpu_ops.py)."""
    if metafunc.definition.get_closest_marker("each_device"):
        return True
    from gpu_helper import Batch

    return any(isinstance(v, Batch) for v in vars(metafunc.module).values())


@pytest.fixture(autouse=True)
def cl_device(request: pytest.FixtureRequest) -> Iterator[str]:
    """The OpenCL device choice a test runs on: its parameter (each_device tests), else
    `DEFAULT_DEVICE`; set as LITEKILN_DEVICE for the test's duration."""
    choice = getattr(request, "param", None) or DEFAULT_DEVICE
    with pytest.MonkeyPatch.context() as mp:
        if choice:
            mp.setenv("LITEKILN_DEVICE", choice)
        yield choice


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _deselect_not_on(config, items)
    if HAS_OPENCL:
        return
    skip = pytest.mark.skip(reason="no OpenCL device (install pocl-opencl-icd)")
    for item in items:
        if "opencl" in item.keywords:
            item.add_marker(skip)


def _deselect_not_on(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop the each_device cases whose ``not_on`` marker names their device's family (the
    largest models on Intel's runtime, whose compiler takes minutes on them: PoCL runs them,
    Intel's the smaller ones and every op test)."""
    families = {d.choice: d.id for d in DEVICES}
    keep, drop = [], []
    for item in items:
        spec = getattr(item, "callspec", None)
        choice = spec.params.get("cl_device") if spec is not None else None
        family = families.get(choice) if choice and not _PINNED else None
        marks = [m for m in item.iter_markers("not_on") if family in m.args]
        (drop if marks else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(autouse=True)
def _isolated_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No test reads or writes the user's real cache."""
    if "LITEKILN_CACHE_DIR" not in os.environ or os.environ.get("CI"):
        d = tmp_path_factory.mktemp("cache")
        os.chmod(d, 0o700)
        monkeypatch.setenv("LITEKILN_CACHE_DIR", str(d))


@pytest.fixture(scope="module")
def keep_variants() -> Iterator[None]:
    """Compiles in the module keep every tuning variant: the tests of the tuning's mechanics
    run on small models, whose entries' bound (`litekiln.compiler.budget`, issue 16's 15% of
    the model file) keeps none of their variants."""
    from litekiln.compiler import budget

    with pytest.MonkeyPatch.context() as m:
        m.setattr(budget, "ENTRY_FILL", 10.0)
        yield


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
def compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the models compiled (cache misses) while the test runs."""
    from litekiln import loading

    names: list[str] = []
    real = loading.compile_for

    def compile_for(model: Any, *args: Any, **kwargs: Any) -> Any:
        names.append(model.name)
        return real(model, *args, **kwargs)

    monkeypatch.setattr(loading, "compile_for", compile_for)
    return names


@pytest.fixture
def smoke_path() -> Path:
    """A small float model (convs, depthwise, pool, add, concat, resize, FC, softmax)."""
    return DATA / "smoke.tflite"


@pytest.fixture
def smoke_int8_path() -> Path:
    """The int8 (full-integer) version of the smoke model."""
    return DATA / "smoke_int8.tflite"


@pytest.fixture(scope="module")
def cl_env() -> tuple[Any, Any]:
    """An OpenCL context and in-order queue on one device, PoCL preferred (our CI device),
    for tests that run programs directly (executors, kernels)."""
    cl = pytest.importorskip("pyopencl")
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        platforms = []
    devices = [d for p in platforms for d in p.get_devices()]
    if not devices:
        pytest.skip("no OpenCL device")
    pocl = [d for d in devices if "Portable Computing Language" in d.platform.name]
    ctx = cl.Context([(pocl or devices)[0]])
    return ctx, cl.CommandQueue(ctx)
