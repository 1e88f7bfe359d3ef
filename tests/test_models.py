"""Whole models against LiteRT: the numpy reference on every zoo model present, and the GPU
path on the small and MediaPipe models, once per OpenCL device (``each_device``: PoCL and
Intel's OpenCL CPU runtime in CI; tests/conftest.py). Tolerances: litekiln/check.py."""

from __future__ import annotations

import pytest
from conftest import zoo_model

from litekiln.check import check_model
from litekiln.zoo import ZOO

LITERT_RUNS = [n for n in ZOO if n not in ("face_landmark_with_attention",)]
# Every float and fp16-weight zoo model that LiteRT runs (the GPU-path issue's scope); the
# int8 and dynamic-range models are checked by tests/test_quantized_ops.py.
#: Intel's OpenCL compiler takes 1-3 minutes on each of these (CI, 2 cores): they run on PoCL
#: only; Intel's runtime, the second vendor, runs the others and every op test.
_POCL_ONLY = pytest.mark.not_on("intel", reason="1-3 min of Intel's compiler: PoCL runs it")
_HEAVY = ("hand_landmark_lite", "deeplab_v3", "ssd_mobilenet", "posenet")
GPU_CI = [
    pytest.param(n, marks=_POCL_ONLY) if n in _HEAVY else n
    for n in [
        "face_detection_short_range",
        "face_detection_full_range_sparse",
        "face_landmark",
        "hand_landmark_lite",
        "palm_detection_lite",
        "pose_landmark_full",
        "selfie_segmentation",
        "mobilenet_v1",
        "mobilenet_v1_fp16",
        "deeplab_v3",
        "ssd_mobilenet",
        "posenet",
        "smoke",
    ]
]


@pytest.mark.parametrize("name", LITERT_RUNS)
def test_reference_matches_litert(name: str) -> None:
    r = check_model(zoo_model(name), device="reference")
    assert r.ok, r.line()


@pytest.mark.opencl
@pytest.mark.slow
@pytest.mark.each_device
@pytest.mark.parametrize("name", GPU_CI)
def test_gpu_path_matches_litert(name: str) -> None:
    r = check_model(zoo_model(name), use_cache=False)
    assert r.ok, r.line()


# precision="fp16" against LiteRT fp32 (bound 1e-2 * max(1, max|LiteRT|)). PoCL has no half
# arithmetic, so there CI runs the fp16-rounding fp32 kernels: the numerics of half storage
# with float accumulation, which the native half kernels share; Intel's runtime runs the
# native half kernels (it lists cl_khr_fp16), as the H100 does. ssd_mobilenet is compared
# before its non-maximum suppression (litekiln.check.RANKING_OPS).
FP16_CI = [
    "smoke",
    "face_detection_short_range",
    "mobilenet_v1_fp16",
    pytest.param("ssd_mobilenet", marks=_POCL_ONLY),
]

# Quantized models through the float view (8-bit I/O (de)quantized on the CPU, quantization
# simulated between ops): int8 outputs within the step bounds, dynamic-range outputs
# within 5e-2 of the output range (litekiln/check.py).
QUANTIZED_CI = ["smoke_int8", "mobilenet_v1_int8", "mobilenet_v1_dynamic"]


@pytest.mark.opencl
@pytest.mark.slow
@pytest.mark.each_device
@pytest.mark.parametrize("name", FP16_CI)
def test_gpu_fp16_matches_litert_fp32(name: str) -> None:
    r = check_model(zoo_model(name), use_cache=False, precision="fp16")
    assert r.ok, r.line()
    assert r.tolerance == 1e-2


@pytest.mark.opencl
@pytest.mark.slow
@pytest.mark.each_device
@pytest.mark.parametrize("name", QUANTIZED_CI)
def test_gpu_quantized_matches_litert(name: str) -> None:
    r = check_model(zoo_model(name), use_cache=False)
    assert r.ok, r.line()


def test_the_line_of_an_integer_model_states_its_steps() -> None:
    """An int8 model is judged in quantization steps (`within_integer_bounds`): its line
    says so, not a relative error against the float tolerance that does not apply to it."""
    from litekiln.check import CheckResult

    steps = [
        {"mean_steps": 0.25, "within_2_steps": 1.0},
        {"mean_steps": 0.5, "within_2_steps": 0.97},
    ]
    line = CheckResult("m", True, 0.0234, 1e-4, outputs=steps).line()
    assert "mean 0.50 steps, 97.0% within 2 (at most 1, at least 95%)" in line
    assert "rel_err" not in line
    assert "rel_err=4.77e-07 (tol 1e-04)" in CheckResult("f", True, 4.77e-7, 1e-4).line()


def test_dynamic_range_models_are_told_apart() -> None:
    """`dynamic_range`: float activations into 8-bit constant weights (LiteRT's hybrid
    kernels). Any such model, not only the zoo's by name, is judged by the float view's bound
    (a Keras DenseNet121 with int8 weights was 1.9e-2 of its output range from LiteRT, and
    failed check_model's 1e-4)."""
    from litekiln.check import dynamic_range
    from litekiln.model import load_model

    kinds = {
        "mobilenet_v1_dynamic": True,
        "mobilenet_v1": False,
        "mobilenet_v1_int8": False,
        "mobilenet_v1_fp16": False,
    }
    for name, hybrid in kinds.items():
        assert dynamic_range(load_model(zoo_model(name)).main) is hybrid, name
