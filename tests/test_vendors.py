"""The OpenCL vendors the tests run on: DeviceProfile's answers for Intel's OpenCL CPU runtime,
and both CI devices (PoCL, Intel) listed where they are installed (docs/vendors.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import CI_FAMILIES, DEVICES, ICD_VENDORS

from litekiln.runtime.profile import DeviceProfile, family_of

HALF_SOURCE = "#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n__kernel void k() {}"


def _intel(**kw: object) -> DeviceProfile:
    """A profile with the values Intel's runtime reports on the CI machine (clinfo)."""
    values: dict[str, object] = dict(
        platform="Intel(R) OpenCL", platform_version="OpenCL 3.1 LINUX",
        vendor="Intel(R) Corporation", name="AMD EPYC", version="OpenCL 3.1 (Build 0)",
        driver="2026.22.10.0.01_160000",
        kind="cpu", family=family_of("Intel(R) OpenCL"),
        extensions=frozenset({"cl_khr_fp16", "cl_khr_fp64", "cl_khr_command_buffer"}),
        max_work_group_size=8192, max_work_item_sizes=(8192, 8192, 8192), address_align=128,
    )  # fmt: skip
    values.update(kw)
    return DeviceProfile(**values)  # type: ignore[arg-type]


def test_profile_recognises_intels_opencl_runtime() -> None:
    intel = _intel()
    assert intel.family == "intel"
    assert family_of("Intel(R) OpenCL Graphics") == "intel"  # its GPU driver: same family
    # A CPU device: PoCL's schedules; no CUDA graph; pyopencl's enqueue (docs/vendors.md).
    assert intel.schedules == "fast-cpu"
    assert not intel.cuda_graph_candidate
    assert not intel.direct_enqueue
    # It lists cl_khr_fp16 and has the half built-ins: half code goes to it unpatched.
    assert intel.half
    assert intel.driver_program(HALF_SOURCE, "").source == HALF_SOURCE
    # Its work-group limits are read from the device, not assumed.
    assert intel.fits((1024,), 8192) and not intel.fits((1024,), 512)
    # Intel's GPU driver is a GPU: the GPU schedules.
    assert _intel(platform="Intel(R) OpenCL Graphics", kind="gpu").schedules == "fast"


def test_ci_devices_are_named_even_where_missing() -> None:
    """The per-device tests always carry a `pocl` and an `intel` id; a missing runtime is a
    skip with the command that installs it, never a silently smaller matrix."""
    from conftest import TEST_DEVICES

    ids = [p.id for p in TEST_DEVICES]
    if ids == ["LITEKILN_DEVICE"]:
        pytest.skip("LITEKILN_DEVICE pins the tests to one device")
    assert ids[: len(CI_FAMILIES)] == list(CI_FAMILIES)
    found = {d.id for d in DEVICES}
    for p in TEST_DEVICES:
        if p.id in CI_FAMILIES and p.id not in found:
            assert p.marks and "not installed" in str(p.marks[0].kwargs["reason"])


def _installed_intel_icd() -> Path:
    icd = ICD_VENDORS / "intel.icd"
    if not icd.is_file():
        pytest.skip("Intel's OpenCL CPU runtime is not installed (scripts/setup_intel_opencl.sh)")
    return icd


def test_icd_folder_names_intel_and_the_systems_drivers() -> None:
    """scripts/setup_intel_opencl.sh's folder: Intel's ICD file naming a library that
    exists, beside a copy of every system ICD file (OCL_ICD_VENDORS names one folder)."""
    icd = _installed_intel_icd()
    lib = Path(icd.read_text().strip())
    assert lib.is_absolute() and lib.name == "libintelocl.so" and lib.exists()
    system = Path("/etc/OpenCL/vendors")
    for f in system.glob("*.icd") if system.is_dir() else []:
        assert (ICD_VENDORS / f.name).read_text() == f.read_text()


@pytest.mark.opencl
def test_both_ci_devices_are_listed_when_installed() -> None:
    _installed_intel_icd()
    from litekiln.runtime.device import list_devices

    families = {family_of(str(d.platform.name)) for _, _, d in list_devices()}
    assert {"pocl", "intel"} <= families, families


@pytest.mark.opencl
def test_intels_device_reads_as_the_profile_expects() -> None:
    """The real driver's answers match the facts `_intel` encodes (clinfo on the CI
    machine), through the same `select_device` an app uses."""
    _installed_intel_icd()
    from litekiln.runtime.device import select_device

    choice = next(d.choice for d in DEVICES if d.id == "intel")
    profile = select_device(choice).profile
    assert (profile.family, profile.kind) == ("intel", "cpu")
    assert profile.platform == "Intel(R) OpenCL"
    assert "cl_khr_fp16" in profile.extensions and profile.half
    assert profile.schedules == "fast-cpu" and not profile.direct_enqueue
    assert profile.max_work_group_size >= 1024
