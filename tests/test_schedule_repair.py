"""A kernel whose schedule fails TVM's lowering is rescheduled alone (codegen `_Repair`).

EfficientViT-B0 (timm, through litert-torch) has grouped 1x1 convolutions of 16 channels per
group (14x14x192 in 12 groups). dlight's rules schedule them as cross-thread reductions that
TVM's LowerCrossThreadReduction then refuses ("Cross-thread reduction requires all the
reduction-related loops to be the deepest"), and before the repair that one kernel sent the
whole partition, 206 ops, down the fallback chain to dlight's serial fallback schedule: 1.4 ms
on the H200, 0.46x PyTorch's CUDA graph. Now the kernel at fault takes the next rule that
compiles, with a warning naming both, and every other kernel keeps its schedule; the model's
outputs match the numpy reference on PoCL."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("tvm")

import litekiln  # noqa: E402
from litekiln.artifact.compiled import CompileOptions  # noqa: E402
from litekiln.compiler.driver import compile_model  # noqa: E402
from litekiln.model import load_model  # noqa: E402

# (the small models' variants, past their entries' bound: `keep_variants`)
pytestmark = pytest.mark.usefixtures("keep_variants")


from tests.tflite_builder import ModelBuilder  # noqa: E402

RNG = np.random.default_rng(5)


def _w(*shape: int) -> np.ndarray:
    return RNG.uniform(-1, 1, shape).astype(np.float32)


def _grouped_then_plain() -> bytes:
    """EfficientViT's grouped 1x1 convolution (192 channels in groups of 16) followed by a
    plain 1x1 convolution that dlight's Matmul schedules."""
    b = ModelBuilder()
    x = b.input("x", [1, 14, 14, 192])
    opts = {"padding": "SAME", "stride_w": 1, "stride_h": 1}
    g = b.op(
        "CONV_2D",
        [x, b.const("gw", _w(192, 1, 1, 16)), b.const("gb", _w(192))],
        out_shape=[1, 14, 14, 192],
        options=opts,
        version=6,
    )
    y = b.op(
        "CONV_2D",
        [g, b.const("pw", _w(32, 1, 1, 192)), b.const("pb", _w(32))],
        out_shape=[1, 14, 14, 32],
        options={**opts, "fused_activation_function": "RELU"},
    )
    b.output(y)
    return b.build()


def _reference(data: bytes, x: np.ndarray) -> np.ndarray:
    ref = litekiln.Interpreter(model_content=data, device="reference")
    return ref.run([x])[0]


def test_the_kernel_that_fails_to_lower_is_rescheduled_alone(capsys: Any) -> None:
    model = load_model(_grouped_then_plain())
    compiled = compile_model(model, CompileOptions(schedules="fast", tuning=False), warn=True)
    err = capsys.readouterr().err
    assert not compiled.cpu_reasons, compiled.cpu_reasons
    notes = [ln for ln in err.splitlines() if "does not compile" in ln]
    assert len(notes) == 1, err  # the grouped convolution, and only it
    assert "Cross-thread reduction" in notes[0], notes[0]
    assert "schedule replaced by" in notes[0], notes[0]
    # The partition kept its own schedules: no fallback down the chain, no op by op.
    assert "trying the next" not in err, err
    assert "lowering them op by op" not in err, err
    program = compiled.partitions[0].program
    assert len(program.launches) == 2, [la.func for la in program.launches]
    # The plain convolution kept the fast profile's choice (dlight's Matmul: 2-D groups).
    plain = next(la for la in program.launches if "relu" in la.func)
    assert len(plain.local_size) == 2 and np.prod(plain.local_size) > 1, plain


@pytest.mark.opencl
def test_the_repaired_program_matches_the_reference(tmp_path: Any) -> None:
    data = _grouped_then_plain()
    x = RNG.uniform(-1, 1, (1, 14, 14, 192)).astype(np.float32)
    want = _reference(data, x)
    gpu = litekiln.Interpreter(model_content=data, schedules="fast", tune=False, cache_dir=tmp_path)
    got = gpu.run([x])[0]
    tol = 1e-4 * max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, atol=tol, rtol=0)


def test_variants_that_fail_to_lower_are_not_offered() -> None:
    """The GPU profile's tuning variants include rules that schedule the grouped convolution
    into the same refused form; those are dropped, the others offered, and the compile
    does not fall back."""
    model = load_model(_grouped_then_plain())
    compiled = compile_model(model, CompileOptions(schedules="fast"), warn=False)
    assert not compiled.cpu_reasons, compiled.cpu_reasons
    program = compiled.partitions[0].program
    assert len(program.launches) == 2
    offered = {v.func: len(v.options) for v in program.variants}
    assert any("relu" in f for f in offered), offered  # the plain convolution's variants


def test_a_rule_that_asserts_declines_and_the_next_takes_the_kernel() -> None:
    """dlight's analyses assert on shapes they do not expect (its GEMV on an LSTM's
    recurrent product computing the previous step's output in its kernel): wrapped in
    `Declining`, as every dlight rule of the schedule profiles is, such a rule declines and
    the next one schedules the kernel, instead of failing the whole partition's profile."""
    import tvm
    from tvm.s_tir import dlight as dl

    from litekiln.compiler.schedules import Declining, fast_rules

    class Asserting(dl.gpu.GEMV):  # type: ignore[misc]
        def apply(self, func: Any, target: Any, tunable: bool) -> Any:
            raise AssertionError("expr.extent == 1")

    target = tvm.target.Target("opencl", host="llvm")

    from tvm import te

    a = te.placeholder((64,), name="a")
    func = te.create_prim_func([a, te.compute((64,), lambda i: a[i] * 2.0, name="b")])
    with target:
        assert Declining(Asserting()).apply(func, target, False) is None
        with pytest.raises(AssertionError):
            Asserting().apply(func, target, False)
        assert Declining(dl.gpu.Fallback()).apply(func, target, False) is not None
    dlight = [r for r in fast_rules("gpu") if type(r).__module__.startswith("tvm.")]
    assert dlight == [], f"dlight rules not wrapped: {dlight}"


def test_variants_whose_kernels_declare_too_much_local_memory_are_not_offered(
    smoke_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A variant kernel declaring more local memory than a GPU gives a work-group (48 KB on
    NVIDIA: a TinyViT attention variant once declared 392 KB and ptxas refused the whole
    variants program) is not offered. Unbounded, some of smoke's variant kernels declare
    ``__local`` arrays (staged matrix products); bounded at 0 bytes, none is offered. (The
    defaults stay defaults here: a default swapped for an option that fills the device,
    `litekiln.compiler.defaults`, is offered as an option whatever its local memory.)"""
    from litekiln.compiler import codegen

    monkeypatch.setattr(codegen, "fill_starved_defaults", lambda la, v: (list(la), list(v), []))

    assert codegen._local_bytes("__local float a[8]; __local half2 b[4]; __local float c[1]") == 52

    def with_local(bound: int) -> tuple[int, int]:
        monkeypatch.setattr(codegen, "_MAX_LOCAL_BYTES", bound)
        compiled = compile_model(
            load_model(smoke_path), CompileOptions(schedules="fast"), warn=False
        )
        (program,) = [p.program for p in compiled.partitions]
        bodies = codegen._kernel_bodies(program.source)
        kernels = {la.kernel for v in program.variants for o in v.options for la in o}
        return len(kernels), sum(1 for k in kernels if codegen._local_bytes(bodies[k]) > 0)

    kernels, local = with_local(1 << 30)
    assert kernels > 0 and local > 0, (kernels, local)
    kernels, local = with_local(0)
    assert local == 0, (kernels, local)


def _product_then_window_partition() -> bytes:
    """Swin V2's patch merging in small: a fully connected layer over 36 rows, then the rows
    permuted into windows (reshape, transpose, reshape), all fused into one kernel."""
    b = ModelBuilder()
    x = b.input("x", [1, 36, 16])
    y = b.op(
        "FULLY_CONNECTED",
        [x, b.const("w", _w(8, 16)), b.const("b", _w(8))],
        out_shape=[1, 36, 8],
        options={"keep_num_dims": True},
    )
    six = [1, 2, 3, 2, 3, 8]
    r = b.op("RESHAPE", [y, b.const("s", np.array(six, np.int32))], out_shape=six)
    perm = b.const("p", np.array([0, 1, 3, 2, 4, 5], np.int32))
    t = b.op("TRANSPOSE", [r, perm], out_shape=[1, 2, 2, 3, 3, 8])
    b.output(b.op("RESHAPE", [t, b.const("s2", np.array([36, 8], np.int32))], out_shape=[36, 8]))
    return b.build()


def test_a_product_whose_epilogue_permutes_rows_compiles_without_repair(
    capsys: Any, tmp_path: Any
) -> None:
    """`SerialReduction` runs an epilogue per tile of the product's outputs only where the
    epilogue reads them in place: a row permutation after the product (timm's
    swinv2_cr_tiny_ns) made TVM size the tile's epilogue loop by an expression it could not
    unroll, and the kernel went to the repair."""
    data = _product_then_window_partition()
    compiled = compile_model(
        load_model(data), CompileOptions(schedules="fast-cpu", tuning=False), warn=True
    )
    err = capsys.readouterr().err
    assert not compiled.cpu_reasons, compiled.cpu_reasons
    assert "does not compile" not in err, err
    x = RNG.uniform(-1, 1, (1, 36, 16)).astype(np.float32)
    cpu = litekiln.Interpreter(
        model_content=data, schedules="fast-cpu", tune=False, cache_dir=tmp_path
    )
    np.testing.assert_allclose(cpu.run([x])[0], _reference(data, x), atol=1e-5, rtol=0)
