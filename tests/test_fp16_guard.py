"""The fp16 error guard (litekiln/compiler/precision.py): half storage where it is harmless,
float32 where rounding would be amplified, and float32 at every partition boundary."""

from __future__ import annotations

import numpy as np
import pytest

from litekiln.artifact.compiled import CompileOptions
from litekiln.model import load_model
from tests.tflite_builder import ModelBuilder

# y = 4096 * ((x + 2**-9) - x) = 8 in exact arithmetic. Storing t1 = x + 2**-9 (x in [0, 1),
# fp16 spacing up to 2**-11) in half moves y by up to 1 of its 8; x itself is the partition
# input (float32), and the constants are exact in fp16.
C1, GAIN = 2.0**-9, 4096.0
SHAPE = [1, 8, 8, 4]


def _op(b: ModelBuilder, name: str, inputs: list, out: str, **kw):
    return b.op(name, inputs, outputs=[b.main.tensor(out, SHAPE)], **kw)


def _cancelling_model() -> bytes:
    b = ModelBuilder()
    x = b.input("x", SHAPE)
    t1 = _op(b, "ADD", [x, b.const("c1", np.full([1], C1, np.float32))], "t1")
    d = _op(b, "SUB", [t1, x], "d")
    y = _op(b, "MUL", [d, b.const("gain", np.full([1], GAIN, np.float32))], "y")
    b.output(y)
    return b.build()


def _benign_model() -> bytes:
    b = ModelBuilder()
    x = b.input("x", SHAPE)
    w = b.const("w", np.random.default_rng(1).uniform(-1, 1, [4, 3, 3, 4]).astype(np.float32))
    bias = b.const("bias", np.zeros([4], np.float32))
    h = _op(
        b,
        "CONV_2D",
        [x, w, bias],
        "h",
        options={
            "padding": "SAME",
            "stride_w": 1,
            "stride_h": 1,
            "fused_activation_function": "RELU",
        },
    )
    y = _op(b, "ADD", [h, x], "y")
    b.output(y)
    return b.build()


def _names(model, tensors) -> set[str]:
    return {model.main.tensors[t].name for t in tensors}


def _plan(data: bytes, budget: float = 2.5e-3):
    from litekiln.compiler.driver import plan_partitions
    from litekiln.compiler.precision import plan_fp16_storage

    model = load_model(data)
    parts = plan_partitions(model, CompileOptions(precision="fp16")).partitions
    return model, plan_fp16_storage(model.main, parts, budget=budget)


def test_guard_keeps_the_amplified_tensors_in_float32() -> None:
    model, plan = _plan(_cancelling_model())
    assert plan.candidates == 2  # t1, d (y is the partition's output: float32 anyway)
    # All-half: 4096 * (rounding of values up to 1) against a result of 8.
    assert plan.error_all_half > 1e-2
    assert _names(model, plan.fp32_tensors) == {"t1"}
    assert plan.error <= 2.5e-3
    assert plan.summary()["fp32_tensors"] == 1


def test_guard_leaves_a_benign_model_in_half() -> None:
    _, plan = _plan(_benign_model())
    assert plan.candidates == 1
    assert plan.fp32_tensors == frozenset()
    assert 0 < plan.error_all_half <= 2.5e-3  # rounding happened and was measured


def test_round_half_matches_fp16_and_saturates() -> None:
    from litekiln.compiler.precision import round_half

    x = np.array([1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 70000.0, -1e9, 0.1], np.float32)
    r = round_half(x)
    assert r.dtype == np.float32
    # Ties to even: 1 + 2**-11 -> 1, 1 + 3*2**-11 -> 1 + 2**-9; beyond fp16: +-65504.
    np.testing.assert_array_equal(r[:4], [1.0, 1.0 + 2.0**-9, 65504.0, -65504.0])
    assert r[4] == np.float32(np.float16(0.1))


def test_fp16_budget_is_validated() -> None:
    with pytest.raises(ValueError, match="fp16_budget"):
        CompileOptions(precision="fp16", fp16_budget=0.0)
    assert CompileOptions(fp16_budget=None).fp16_budget is None


@pytest.mark.parametrize("budget", [2.5e-3, None])
def test_fp16_program_on_device(budget: float | None, tmp_path) -> None:
    """End to end on the OpenCL device: the guard's program meets 1e-2 where unguarded half
    storage does not; its partition input and output are float32 either way."""
    pytest.importorskip("tvm")
    import litekiln
    from litekiln.compiler.driver import compile_model

    data = _cancelling_model()
    model = load_model(data)
    compiled = compile_model(
        model, CompileOptions(precision="fp16", half="native", fp16_budget=budget), warn=False
    )
    program = compiled.partitions[0].program
    specs = {s.id: s for s in program.tensors}
    assert {specs[t].dtype for t in program.inputs + program.outputs} == {"float32"}
    if budget is not None:
        assert compiled.stats["fp16"]["fp32_tensors"] == 1
    else:
        assert "fp16" not in compiled.stats

    x = np.random.default_rng(3).uniform(0, 1, SHAPE).astype(np.float32)
    want = ((x + np.float32(C1)) - x) * np.float32(GAIN)  # numpy fp32
    interp = litekiln.Interpreter(
        model_content=data, precision="fp16", cache_dir=tmp_path, fp16_budget=budget
    )
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    got = interp.get_tensor(interp.get_output_details()[0]["index"])
    err = float(np.abs(got - want).max()) / max(1.0, float(np.abs(want).max()))
    if budget is not None:
        assert err <= 1e-3, err
    else:
        assert err > 1e-2, err  # what the guard prevents


def test_cli_fp16_budget(tmp_path, capsys) -> None:
    """`litekiln compile --fp16-budget`: the value reaches the compiler (and the cache key:
    the same model under another budget is another entry); a bad value is a usage error."""
    pytest.importorskip("tvm")
    import json

    from litekiln.cli import main

    model = tmp_path / "cancel.tflite"
    model.write_bytes(_cancelling_model())
    cache = tmp_path / "cache"
    base = ["compile", str(model), "--precision", "fp16", "--cache-dir", str(cache), "--json"]
    assert main(base) == 0
    assert main([*base, "--fp16-budget", "off"]) == 0
    capsys.readouterr()
    assert main(["cache", "--cache-dir", str(cache), "ls", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    entries = listing["entries"] if isinstance(listing, dict) else listing
    budgets = sorted(str(e["options"].get("fp16_budget")) for e in entries if e.get("options"))
    assert budgets == ["0.0025", "None"], entries
    with pytest.raises(SystemExit) as exc:
        main([*base, "--fp16-budget", "1.5"])
    assert exc.value.code == 2
    assert "expected a number in (0, 1) or 'off'" in capsys.readouterr().err


def _token_mixing_model() -> bytes:
    """ResMLP's token mixing: x + s * transpose(fc(transpose(x * a + c))), [1, 49, 16]."""
    rng = np.random.default_rng(5)
    tokens, channels = 49, 16
    b = ModelBuilder()

    def t(name: str, shape: list[int]) -> object:
        return b.main.tensor(name, shape)

    def const(name: str, shape: list[int], scale: float = 1.0) -> object:
        return b.const(name, (rng.uniform(-1, 1, shape) * scale).astype(np.float32))

    x = b.input("x", [1, tokens, channels])
    a = b.op("MUL", [x, const("a", [1, 1, channels])], outputs=[t("xa", [1, tokens, channels])])
    a = b.op("ADD", [a, const("c", [1, 1, channels])], outputs=[t("xc", [1, tokens, channels])])
    perm = b.const("perm", np.array([0, 2, 1], np.int32))
    tr = b.op("TRANSPOSE", [a, perm], outputs=[t("tr", [1, channels, tokens])])
    fc = b.op(
        "FULLY_CONNECTED",
        [tr, const("w", [tokens, tokens], 0.2), const("bias", [tokens])],
        outputs=[t("fc", [channels, tokens])],
        options={"keep_num_dims": False},
    )
    s = b.op("MUL", [fc, const("s", [1, channels, 1])], outputs=[t("s", [1, channels, tokens])])
    back = b.op("TRANSPOSE", [s, perm], outputs=[t("back", [1, tokens, channels])])
    y = b.op("ADD", [x, back], outputs=[t("y", [1, tokens, channels])])
    b.output(y)
    return b.build()


@pytest.mark.parametrize("half", ["native", "emulated"])
def test_token_mixing_in_half(half: str, tmp_path) -> None:
    """The token mixing emitted as ``w @ x`` (`emit_nn._fully_connected_by_columns`) reads
    its source in half where it is stored so: within fp16's 1e-2 of the numpy reference,
    natively stored and emulated."""
    pytest.importorskip("tvm")
    import litekiln

    data = _token_mixing_model()
    x = np.random.default_rng(6).uniform(-1, 1, [1, 49, 16]).astype(np.float32)
    want = litekiln.Interpreter(model_content=data, device="reference").run([x])[0]
    interp = litekiln.Interpreter(
        model_content=data, precision="fp16", half=half, cache_dir=tmp_path, fp16_budget=None
    )
    got = interp.run([x])[0]
    err = float(np.abs(got - want).max()) / max(1.0, float(np.abs(want).max()))
    assert err <= 1e-2, err
