"""Float32 constants folded into kernels keep their exact value (`litekiln.compiler.literals`).

TVM's OpenCL printer writes seven significant digits; 0.011574829 (a scale of smoke_int8)
became 0.011574830. The references: the float32 arithmetic of numpy, bit for bit, and the
printed text itself.
"""

from __future__ import annotations

import numpy as np
import pytest
from tflite_builder import ModelBuilder

import litekiln
from litekiln.compiler.literals import exact, exact_float_literals, inexact_constants, printed

#: Seven digits read back as another float32 (TVM printed 1.157483e-02).
SCALE = np.float32(0.011574829)


def test_seven_digits_are_not_enough_and_the_exact_digits_are() -> None:
    assert printed(float(SCALE)) == "1.157483e-02"
    assert np.float32(printed(float(SCALE))) != SCALE
    assert exact(float(SCALE)) == "1.1574829e-02"
    rng = np.random.default_rng(0)
    values = (10.0 ** rng.uniform(-30, 30, 2000) * rng.choice([-1, 1], 2000)).astype(np.float32)
    for v in values:
        assert np.float32(exact(float(v))) == abs(v), v


def test_only_inexact_constants_are_rewritten_and_shared_prints_are_left() -> None:
    near = np.nextafter(SCALE, np.float32(1))  # prints as SCALE does
    script = f"x = y * T.float32({float(SCALE)!r}) + T.float32(0.5) - T.float32(-{float(SCALE)!r})"
    assert inexact_constants(script) == {"1.157483e-02": "1.1574829e-02"}
    shared = f"T.float32({float(SCALE)!r}) T.float32({float(near)!r})"
    assert printed(float(near)) == printed(float(SCALE))
    assert inexact_constants(shared) == {"1.157483e-02": None}


class _Mod:
    """What `exact_float_literals` reads of a device module: its functions' scripts."""

    def __init__(self, scripts: dict[str, str]) -> None:
        self.functions = {
            type("GV", (), {"name_hint": k})(): _Script(v) for k, v in scripts.items()
        }


class _Script:
    def __init__(self, text: str) -> None:
        self.text = text

    def script(self) -> str:
        return self.text


def test_each_kernel_is_fixed_by_its_own_constants() -> None:
    near = np.nextafter(SCALE, np.float32(1))
    source = (
        "// Function: a_kernel\n__kernel void a_kernel(){x=y*1.157483e-02f- -1.157483e-02f;}\n"
        "// Function: b_kernel\n__kernel void b_kernel(){x=y*1.157483e-02f;}\n"
    )
    mod = _Mod(
        {
            "a_kernel": f"T.float32({float(SCALE)!r})",
            "b_kernel": f"T.float32({float(SCALE)!r}) T.float32({float(near)!r})",
        }
    )
    out, unresolved = exact_float_literals(source, mod)  # type: ignore[arg-type]
    assert "x=y*1.1574829e-02f- -1.1574829e-02f;" in out
    assert "b_kernel(){x=y*1.157483e-02f;}" in out  # two constants print alike: left
    assert unresolved == 1


def _quantize_model() -> bytes:
    b = ModelBuilder()
    x = b.input("x", [1, 256], "float32")
    y = b.op("QUANTIZE", [x], out_dtype="int8", out_quant=(float(SCALE), 0))
    b.output(y)
    return b.build()


@pytest.mark.opencl
def test_a_folded_scale_quantizes_exactly_on_the_device() -> None:
    """Values whose quotient by the scale lies next to a rounding boundary: with the scale
    one unit off in the last place, some of them round the other way."""
    it = litekiln.Interpreter(model_content=_quantize_model(), use_cache=False)
    it.allocate_tensors()
    source = it._backend.compiled.partitions[0].program.source  # type: ignore[union-attr]
    assert "1.1574829e-02f" in source and "1.157483e-02f" not in source
    k = np.arange(-128, 128, dtype=np.float32)
    x = ((k + np.float32(0.5)) * SCALE).astype(np.float32)
    x = np.concatenate([x, np.nextafter(x, np.float32(0))])[None]
    want = np.clip(np.rint(x / SCALE), -128, 127).astype(np.int8)
    assert len(np.unique(want)) > 200
    np.testing.assert_array_equal(it.run([x[:, :256]])[0], want[:, :256])
    np.testing.assert_array_equal(it.run([x[:, 256:]])[0], want[:, 256:])
