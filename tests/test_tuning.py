"""Per-device tuning: schedule variants emitted by the compiler, timed and chosen after the
first inference on a device (in the background: the first start runs the default schedules).

The GPU profile (``schedules="fast"``) emits alternative schedules of the heavy kernels
(`litekiln.artifact.program.Variant`); the runtime times them on the device once, keeps the
fastest and stores the choice beside the device binary. On PoCL the timings mean little, but
everything else is checked: every option computes the same result as the numpy reference,
the choice is stored and reused, ``tune=False`` skips it, and a bad stored choice is retuned.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tvm")

import litekiln  # noqa: E402
from litekiln.artifact.program import GpuProgram  # noqa: E402
from litekiln.runtime.executor import PartitionExecutor  # noqa: E402

# (the small models' variants, past their entries' bound: `keep_variants`)
pytestmark = [pytest.mark.opencl, pytest.mark.usefixtures("keep_variants")]


TOL = 1e-4  # the GPU path's float32 bound (litekiln.check), relative to max(1, max|ref|)


def _interp(path: Path, cache: Path, **kw: Any) -> litekiln.Interpreter:
    return litekiln.Interpreter(model_path=path, cache_dir=cache, schedules="fast", **kw)


def _err(ours: list[np.ndarray], ref: list[np.ndarray]) -> float:
    return max(
        float(np.abs(o - r).max()) / max(1.0, float(np.abs(r).max()))
        for o, r in zip(ours, ref, strict=True)
    )


@pytest.fixture
def counted_tune(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts PartitionExecutor.tune calls."""
    calls: list[int] = []
    real = PartitionExecutor.tune

    def tune(self: PartitionExecutor, reps: int = 5, **kw: Any) -> list[int] | None:
        calls.append(1)
        return real(self, reps, **kw)

    monkeypatch.setattr(PartitionExecutor, "tune", tune)
    return calls


def test_every_option_of_every_variant_matches_the_reference(
    smoke_path: Path, tmp_path: Path
) -> None:
    ref = litekiln.Interpreter(model_path=smoke_path, device="reference")
    inputs = ref.random_inputs(0)
    expected = ref.run(inputs)
    interp = _interp(smoke_path, tmp_path, tune=False)
    interp.allocate_tensors()
    ex = interp._backend.executors[0]  # noqa: SLF001 - the test drives the executor's options
    variants = ex.program.variants
    assert variants, "the GPU profile emits variants for smoke's convolutions and FC"
    assert any(len(v.options) >= 2 for v in variants)
    checked = 0
    for i, v in enumerate(variants):
        for c in range(len(v.options) + 1):
            choices = [0] * len(variants)
            choices[i] = c
            ex.select(choices)
            assert _err(interp.run(inputs), expected) <= TOL, f"{v.func} option {c}"  # type: ignore[arg-type]
            checked += 1
    assert checked == sum(len(v.options) + 1 for v in variants)


def test_choice_is_stored_with_the_binary_and_reused(
    smoke_path: Path, tmp_path: Path, counted_tune: list[int]
) -> None:
    first = _interp(smoke_path, tmp_path)
    first.allocate_tensors()
    ex = first._backend.executors[0]  # noqa: SLF001
    # The first start runs the default schedules: tuning waits for the first inference.
    assert counted_tune == []
    assert ex.choices == [0] * len(ex.program.variants)
    first.run(first.random_inputs(0))
    first._backend.wait_for_graph()  # noqa: SLF001 - waits for the background tuning
    # (the first start ran the default kernels alone; the whole program replaced them)
    chosen = first._backend.executors[0].choices  # noqa: SLF001
    # smoke's variants: its three largest convolutions and its depthwise convolution (4
    # channels per work-item, where the default takes 1 to launch more of them, 2, and 2x2
    # channels x pixels); its
    # global pool, 19K FLOPs over 34 KB, and its fully-connected layer, 10K FLOPs, are too
    # small to be worth tuning
    assert counted_tune == [1] and len(chosen) == 4
    second = _interp(smoke_path, tmp_path)
    second.allocate_tensors()
    assert counted_tune == [1], "the second load must reuse the stored choice"
    ex2 = second._backend.executors[0]  # noqa: SLF001
    assert ex2.choices == chosen
    # A warm start makes kernel objects for the launches it runs only: the stored choice of
    # each variant, not the options it did not choose.
    made = [[o is not None for o in opts] for opts in ex2._options]  # noqa: SLF001
    assert made == [[c == i for i in range(1, len(v.options) + 1)]
                    for c, v in zip(chosen, ex2.program.variants, strict=True)]  # fmt: skip
    x = second.random_inputs(0)
    ref = litekiln.Interpreter(model_path=smoke_path, device="reference").run(x)
    assert _err(second.run(x), ref) <= TOL  # type: ignore[arg-type]


def test_tune_false_runs_the_default_schedules(
    smoke_path: Path, tmp_path: Path, counted_tune: list[int]
) -> None:
    interp = _interp(smoke_path, tmp_path, tune=False)
    interp.allocate_tensors()
    ex = interp._backend.executors[0]  # noqa: SLF001
    assert counted_tune == []
    assert ex.program.variants and ex.choices == [0] * len(ex.program.variants)
    interp.run(interp.random_inputs(0))
    interp._backend.wait_for_graph()  # noqa: SLF001
    assert counted_tune == []
    # Nothing was stored as a choice: a later load with tuning on tunes.
    again = _interp(smoke_path, tmp_path)
    again.allocate_tensors()
    again._backend.wait_for_graph()  # noqa: SLF001
    assert counted_tune == [1]


def test_a_stored_choice_that_does_not_fit_is_retuned(
    smoke_path: Path, tmp_path: Path, counted_tune: list[int]
) -> None:
    from litekiln.cache.models import ModelCache

    interp = _interp(smoke_path, tmp_path)
    interp.allocate_tensors()
    sess = interp._backend  # noqa: SLF001
    sess.wait_for_graph()
    prog, ex = sess.compiled.partitions[0].program, sess.executors[0]
    key = (ex.driver.digest, ex.driver.options, sess.handle.profile.identity())
    cache = ModelCache.open(tmp_path)
    cache.save_program(*key, ex.binary, tuning=[7] * (len(prog.variants) + 1))
    again = _interp(smoke_path, tmp_path)
    again.allocate_tensors()
    again._backend.wait_for_graph()  # noqa: SLF001
    assert counted_tune == [1, 1]
    assert ModelCache.open(tmp_path).load_program(*key)[1] == again._backend.executors[0].choices  # noqa: SLF001


def test_program_json_keeps_variants_and_plan_checks_choices(
    smoke_path: Path, tmp_path: Path
) -> None:
    interp = _interp(smoke_path, tmp_path, tune=False)
    interp.allocate_tensors()
    prog = interp._backend.compiled.partitions[0].program  # noqa: SLF001
    back = GpuProgram.from_json(prog.to_json())
    assert back.variants == prog.variants
    assert back.plan() == prog.launches
    last = [len(v.options) for v in prog.variants]
    assert len(back.plan(last)) >= 1
    with pytest.raises(ValueError):
        back.plan([len(v.options) + 1 for v in prog.variants])
    with pytest.raises(ValueError):
        back.plan([1] * (len(prog.variants) + 1))  # one choice too many


@pytest.mark.parametrize("mode", ["on", "off", "auto"])
def test_launch_loops_agree_with_the_reference(
    smoke_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    # The ctypes launch loop (LITEKILN_FAST_LAUNCH=on; the default off PoCL) and pyopencl's
    # enqueue (off; auto on PoCL) run the same launches: both match the reference.
    monkeypatch.setenv("LITEKILN_FAST_LAUNCH", mode)
    ref = litekiln.Interpreter(model_path=smoke_path, device="reference")
    inputs = ref.random_inputs(1)
    expected = ref.run(inputs)
    interp = _interp(smoke_path, tmp_path, tune=False)
    interp.allocate_tensors()
    ex = interp._backend.executors[0]  # noqa: SLF001 - which loop runs
    direct = ex.device_profile.direct_enqueue
    assert (ex._fast is not None) == (mode == "on" or (mode == "auto" and direct))  # noqa: SLF001
    for _ in range(2):  # a second run reuses the converted launch arguments
        assert _err(interp.run(inputs), expected) <= TOL


def test_a_bad_launch_mode_is_a_clear_error(
    smoke_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LITEKILN_FAST_LAUNCH", "fastest")
    interp = _interp(smoke_path, tmp_path, tune=False)
    with pytest.raises(Exception, match="LITEKILN_FAST_LAUNCH.*auto, on, off"):
        interp.allocate_tensors()


def test_native_half_programs_have_no_half_vectors(smoke_path: Path) -> None:
    # NVIDIA's OpenCL builds scalar half arithmetic but rejects half2 vectors (and one such
    # kernel fails the whole program): the vectorised matmul variant is dropped from native
    # fp16 programs, while fp32 programs keep it (float2 loads).
    import re

    from litekiln.artifact.compiled import CompileOptions
    from litekiln.compiler.driver import compile_model
    from litekiln.model import load_model

    model = load_model(smoke_path.read_bytes())
    half = (
        compile_model(
            model, CompileOptions(precision="fp16", half="native", schedules="fast"), warn=False
        )
        .partitions[0]
        .program
    )
    assert half.variants, "fp16 programs are tuned too"
    assert "half" in half.source
    assert not re.search(r"\bhalf(2|3|4|8|16)\b", half.source)
    full = compile_model(model, CompileOptions(schedules="fast"), warn=False).partitions[0].program
    assert re.search(r"\bfloat2\b", full.source), "the fp32 program keeps the vectorised variant"


def _guard_mixed_model() -> bytes:
    """fp16 storage that the fp16 guard mixes with float32 (as it does in MediaPipe's
    pose_landmark_full, minutes to compile here): ``t = x + 2**-9`` feeds a difference
    amplified 4096x and stays float32; the convolution after it, the residual add of ``t``
    to the convolution's half output, and the rest are half."""
    from tests.tflite_builder import ModelBuilder

    shape = [1, 8, 8, 4]
    b = ModelBuilder()

    def op(name: str, inputs: list[Any], out: str, **kw: Any) -> Any:
        return b.op(name, inputs, outputs=[b.main.tensor(out, shape)], **kw)

    x = b.input("x", shape)
    t = op("ADD", [x, b.const("c", np.full([1], 2.0**-9, np.float32))], "t")
    d = op("SUB", [t, x], "d")
    y = op("MUL", [d, b.const("gain", np.full([1], 4096.0, np.float32))], "y")
    w = np.random.default_rng(1).uniform(-1, 1, [4, 3, 3, 4]).astype(np.float32)
    conv = {"padding": "SAME", "stride_w": 1, "stride_h": 1, "fused_activation_function": "RELU"}
    h = op("CONV_2D", [y, b.const("w", w), b.const("b", np.zeros([4], np.float32))], "h",
           options=conv)  # fmt: skip
    r = op("ADD", [h, t], "r")
    b.output(op("MUL", [r, b.const("s", np.full([1], 0.5, np.float32))], "out"))
    return b.build()


@pytest.mark.parametrize("name", ["smoke", "face_detection_short_range", "guard_mixed"])
def test_native_half_program_compiles_with_clang(name: str) -> None:
    """The whole native fp16 program, variants included, as the executor hands it to a driver
    that builds half without listing cl_khr_fp16 (NVIDIA), passes clang's OpenCL front end.
    NVIDIA rejected face_detection_short_range's program over a float-input convolution
    variant storing `convert_half2` pairs (8 errors; clang gives the same 8); guard_mixed
    mixes half and fp16-guard float32 tensors. clang-15 comes with PoCL (Debian)."""
    import shutil
    import subprocess

    from conftest import zoo_model

    from litekiln.artifact.compiled import CompileOptions
    from litekiln.compiler.driver import compile_model
    from litekiln.model import load_model
    from litekiln.runtime.profile import HALF_OVERLOADS

    clang = shutil.which("clang-15") or shutil.which("clang")
    if clang is None:
        pytest.skip("no clang (Debian's PoCL brings clang-15)")
    data = _guard_mixed_model() if name == "guard_mixed" else zoo_model(name).read_bytes()
    model = load_model(data)
    compiled = compile_model(
        model, CompileOptions(precision="fp16", half="native", op_table="extended"), warn=False
    )
    if name == "guard_mixed":
        dtypes = {t.dtype for p in compiled.partitions for t in p.program.tensors}
        assert compiled.stats["fp16"]["fp32_tensors"] >= 1 and "float16" in dtypes, dtypes
    for part in compiled.partitions:
        source = part.program.source
        assert "half" in source
        r = subprocess.run(
            [
                clang,
                "-x",
                "cl",
                "-cl-std=CL1.2",
                "-Xclang",
                "-finclude-default-header",
                "-fsyntax-only",
                "-target",
                "spir64",
                "-Dcl_khr_fp16=1",
                "-ferror-limit=0",
                "-",
            ],
            input=HALF_OVERLOADS + source,
            capture_output=True,
            text=True,
            timeout=300,
        )
        # clang (not NVIDIA, which built these kernels) resolves `max((long)a, (long)b)` in
        # a resize's index arithmetic to the executor's `half max(half, half)` overload and
        # then rejects the subscript: not what this test is about.
        errors = [
            line
            for line in r.stderr.splitlines()
            if "error:" in line and "array subscript is not an integer" not in line
        ]
        assert not errors, errors[:5]


def test_a_first_start_builds_the_default_kernels_then_the_whole_program(
    smoke_path: Path, tmp_path: Path
) -> None:
    """Without a stored binary the session builds each partition's default kernels alone
    (`default_program`: the variants' kernels wait), and the first inference runs on them;
    after it the whole program is built in the background, swapped in, tuned and stored, and
    the next start loads the whole program's binary with its choices."""
    from litekiln.runtime.build import default_program

    ref = litekiln.Interpreter(model_path=smoke_path, device="reference")
    inputs = ref.random_inputs(0)
    expected = ref.run(inputs)
    it = _interp(smoke_path, tmp_path / "c")
    it.allocate_tensors()
    sess = it._backend  # noqa: SLF001 - what the session runs
    first, full = sess.executors[0], sess.compiled.partitions[0].program
    cut = default_program(full)
    assert full.variants and cut is not None and first.program.variants == []
    assert first.program.source == cut.source and len(cut.source) < len(full.source)
    assert set(cut.kernels) == {la.kernel for la in full.launches}
    variant_only = {la.kernel for la in full.all_launches()} - set(cut.kernels)
    assert variant_only, "the smoke model's fast schedules have variants of their own"
    assert not any(f"void {k}(" in cut.source for k in variant_only)
    assert _err(it.run(inputs), expected) <= TOL
    sess.wait_for_graph()
    whole = sess.executors[0]
    assert whole is not first and whole.program is full and len(whole.choices) == len(full.variants)
    assert _err(it.run(inputs), expected) <= TOL
    again = _interp(smoke_path, tmp_path / "c")
    again.allocate_tensors()
    ex = again._backend.executors[0]  # noqa: SLF001
    assert ex.from_binary and ex.program.variants and ex.choices == whole.choices
    assert _err(again.run(inputs), expected) <= TOL
    assert default_program(cut) is None  # nothing left to cut


def test_calls_too_small_to_matter_get_no_variants() -> None:
    """Variants only for calls of 64K FLOPs or 256 KB moved and more: smoke's global pool
    and fully-connected layer (19K and 10K FLOPs) have none, its convolutions keep theirs."""
    from litekiln.artifact.compiled import CompileOptions
    from litekiln.compiler.codegen import _TUNE_MIN_BYTES, _TUNE_MIN_FLOPS
    from litekiln.compiler.driver import compile_model
    from litekiln.model import load_model
    from litekiln.zoo import zoo_dir

    model = load_model(zoo_dir() / "smoke.tflite")
    program = compile_model(model, CompileOptions(schedules="fast"), warn=False)
    prog = program.partitions[0].program
    tuned = {v.start for v in prog.variants}
    assert tuned, "smoke's convolutions keep their variants"
    for i, la in enumerate(prog.launches):
        big = la.flops >= _TUNE_MIN_FLOPS or prog.launch_bytes(la) >= _TUNE_MIN_BYTES
        if not big:
            assert i not in tuned, f"{la.func}: {la.flops} FLOPs, variants offered"
    small = [la.func for la in prog.launches if la.flops < _TUNE_MIN_FLOPS]
    assert any("pool" in f for f in small) and any("matmul" in f for f in small), small


def test_calls_too_small_to_matter_are_not_scheduled_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The variants of a PrimFunc none of whose calls is worth tuning are not scheduled at
    all (they would be dropped after): smoke's pool, product and softmax go to no rule, its
    convolutions do, and the program is the one made when every function's variants are
    scheduled and the small ones dropped."""
    from litekiln.artifact.compiled import CompileOptions
    from litekiln.compiler import codegen
    from litekiln.compiler.codegen import _TUNE_MIN_BYTES, _TUNE_MIN_FLOPS
    from litekiln.compiler.driver import compile_model
    from litekiln.model import load_model
    from litekiln.zoo import zoo_dir

    model = load_model(zoo_dir() / "smoke.tflite")
    options = CompileOptions(schedules="fast")
    scheduled: list[str] = []
    real = codegen._schedule_variants

    def spy(fused, lowered, used, *args, **kwargs):  # type: ignore[no-untyped-def]
        scheduled.extend(used)
        return real(fused, lowered, used, *args, **kwargs)

    monkeypatch.setattr(codegen, "_schedule_variants", spy)
    monkeypatch.setenv("LITEKILN_COMPILE_JOBS", "1")  # (the spy sees every task)
    lean = compile_model(model, options, warn=False).partitions[0].program
    assert any("conv2d" in f for f in scheduled), scheduled
    small = {
        la.func
        for la in lean.launches
        if la.flops < _TUNE_MIN_FLOPS and lean.launch_bytes(la) < _TUNE_MIN_BYTES
    }
    assert {"avg_pool2d", "softmax"} <= small, small
    assert not small & set(scheduled), (small, scheduled)

    monkeypatch.setattr(
        codegen, "_worth_tuning_funcs", lambda planner, *_: {c.func for c in planner.calls}
    )
    scheduled.clear()
    full = compile_model(model, options, warn=False).partitions[0].program
    assert small <= set(scheduled)
    assert full.to_json() == lean.to_json() and full.source == lean.source


def test_variant_options_round_trip_without_repeated_fields() -> None:
    """An option's PrimFunc name and arguments are not written again where they are the
    default launch's; reading the program back gives the same launches."""
    from litekiln.artifact.compiled import CompileOptions
    from litekiln.artifact.program import GpuProgram
    from litekiln.compiler.driver import compile_model
    from litekiln.model import load_model
    from litekiln.zoo import zoo_dir

    model = load_model(zoo_dir() / "smoke.tflite")
    prog = compile_model(model, CompileOptions(schedules="fast"), warn=False)
    prog = prog.partitions[0].program
    doc = prog.to_dict()
    options = [la for v in doc["variants"] for o in v["options"] for la in o]
    assert options and all("args" not in la and "func" not in la for la in options)
    back = GpuProgram.from_dict(doc)
    assert back.variants == prog.variants
    assert back.launches == prog.launches


def test_a_kernel_without_profiling_info_does_not_stop_the_tuning(
    smoke_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVIDIA's OpenCL now and then answers PROFILING_INFO_NOT_AVAILABLE for a finished
    kernel of a profiling queue (seen on the H200): the sample is skipped, an option never
    timed is never chosen, and the default stays where it is the one not timed; the other
    variants are tuned (it stopped the whole tuning, leaving every default in place)."""
    import pyopencl as cl

    from litekiln.runtime import executor as executor_module

    interp = _interp(smoke_path, tmp_path, tune=False)
    interp.allocate_tensors()
    ex = interp._backend.executors[0]  # noqa: SLF001 - the test drives the executor's tuning
    real = cl.enqueue_nd_range_kernel
    launches = [0]

    class NoInfo:  # an event whose profiling info the driver does not give
        @property
        def profile(self) -> Any:
            raise cl.RuntimeError("clGetEventProfilingInfo failed: PROFILING_INFO_NOT_AVAILABLE")

    def enqueue(*args: Any, **kw: Any) -> Any:
        event = real(*args, **kw)
        launches[0] += 1
        return NoInfo() if launches[0] % 3 == 0 else event

    monkeypatch.setattr(executor_module.cl, "enqueue_nd_range_kernel", enqueue)
    choices = ex.tune(reps=3)
    monkeypatch.undo()
    assert choices is not None and len(choices) == len(ex.program.variants)
    assert len(ex.tuning_ms) == len(ex.program.variants)
    assert launches[0] > 0
    # Every option that could not be timed (no sample) is infinite and not chosen.
    for chosen, times in zip(choices, ex.tuning_ms, strict=True):
        assert np.isfinite(times[chosen]) or chosen == 0, (chosen, times)
    # The model still computes what the reference computes with the choices applied.
    ref = litekiln.Interpreter(model_path=smoke_path, device="reference")
    inputs = ref.random_inputs(0)
    assert _err(interp.run(inputs), ref.run(inputs)) <= TOL
