"""The compiler never crashes on a model: a partition whose schedule, lowering or code generation
fails falls back along a chain (dlight's generic rules, then a plain safe schedule) and, as a
last resort, its ops run on the CPU, with the TFLite delegate warning and the reason named.

Failures are injected into a schedule rule, into code generation and into lowering; each
model still compiles and matches LiteRT (OpenCL on PoCL).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tflite_builder import ModelBuilder

import litekiln
from litekiln.artifact.compiled import CompileOptions
from litekiln.check import litert_outputs, relative_error
from litekiln.compiler import codegen
from litekiln.compiler.driver import compile_model
from litekiln.model import load_model

pytestmark = pytest.mark.opencl


#: _two_partitions' FLOOR on the CPU (the documented table) and both small partitions kept.
FLOOR_ON_THE_CPU: dict[str, Any] = {"op_table": "documented", "min_partition_ops": 1}


def _two_partitions(tmp_path: Path) -> Path:
    """conv -> FLOOR (CPU only) -> conv: two GPU partitions around one CPU op."""
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    x = b.input("x", [1, 8, 8, 3])
    y = x
    for k, out_c in enumerate((4, 5)):
        w = b.const(f"w{k}", rng.uniform(-1, 1, [out_c, 3, 3, y.shape[3]]).astype(np.float32))
        bias = b.const(f"b{k}", rng.uniform(-1, 1, [out_c]).astype(np.float32))
        y = b.op(
            "CONV_2D", [y, w, bias], out_shape=[1, 8, 8, out_c],
            options={"padding": "SAME", "stride_w": 1, "stride_h": 1},
        )  # fmt: skip
        if k == 0:
            y = b.op("FLOOR", [y], out_shape=[1, 8, 8, out_c])
    b.output(y)
    path = tmp_path / "two.tflite"
    path.write_bytes(b.build())
    return path


def _matches_litert(path: Path, cache: Path, **options: Any) -> None:
    interp = litekiln.Interpreter(model_path=path, cache_dir=cache, **options)
    inputs = interp.random_inputs(1)
    ours = interp.run(inputs)
    assert relative_error(ours, litert_outputs(path, inputs)) <= 1e-4


def _failing(when: Any) -> Any:
    """compile_relax_full that raises where ``when(schedules, call number)`` says."""
    real = codegen.compile_relax_full
    calls: list[str] = []

    def compile_relax_full(mod: Any, **kw: Any) -> Any:
        calls.append(kw["schedules"])
        if when(kw["schedules"], len(calls)):
            raise IndexError("list index out of range (injected)")
        return real(mod, **kw)

    compile_relax_full.calls = calls  # type: ignore[attr-defined]
    return compile_relax_full


def test_a_failing_schedule_falls_back_to_dlights_rules(
    tmp_path: Path, smoke_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    fake = _failing(lambda schedules, n: schedules in ("fast", "fast-cpu"))
    monkeypatch.setattr(codegen, "compile_relax_full", fake)
    compiled = compile_model(load_model(smoke_path))
    assert len(compiled.partitions) == 1 and fake.calls[1:] == ["default"]
    assert "'fast" in capsys.readouterr().err  # the failure is named
    _matches_litert(smoke_path, tmp_path)  # (a fresh cache: compiles again, falls back again)


def test_a_schedule_rule_that_raises_is_survived(
    tmp_path: Path, smoke_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The crash the corpus found: a schedule rule's own IndexError (decompose_reduction with no
    reduction loop left). Every litekiln rule raises here; the model compiles regardless."""
    from litekiln.compiler import schedules

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise IndexError("list index out of range (injected into a schedule rule)")

    for name in dir(schedules):
        rule = getattr(schedules, name)
        if isinstance(rule, type) and hasattr(rule, "_schedule"):
            monkeypatch.setattr(rule, "_schedule", broken)
    _matches_litert(smoke_path, tmp_path)


def test_when_every_schedule_fails_the_partition_runs_on_the_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    path = _two_partitions(tmp_path)
    # The first partition fails with every schedule of the chain; the second compiles.
    fake = _failing(lambda schedules, n: n <= 3)
    monkeypatch.setattr(codegen, "compile_relax_full", fake)
    compiled = compile_model(load_model(path), CompileOptions(**FLOOR_ON_THE_CPU))
    err = capsys.readouterr().err
    assert fake.calls[:3] == [compiled.options.schedules, "default", "safe"]
    assert [p.index for p in compiled.partitions] == [0]  # renumbered
    assert compiled.steps == [("cpu", 0), ("cpu", 1), ("gpu", 0)]
    assert "WARNING: op code #3 cannot be handled by this delegate." in err  # CONV_2D
    assert "code generation failed with every schedule" in compiled.cpu_reasons[0]
    assert "IndexError" in compiled.cpu_reasons[0]
    _matches_litert(path, tmp_path / "cache", **FLOOR_ON_THE_CPU)


def test_a_failing_lowering_sends_the_partition_to_the_cpu(
    tmp_path: Path, smoke_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from litekiln.compiler import lower

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("filter_height")

    monkeypatch.setattr(lower, "lower_partition", broken)
    compiled = compile_model(load_model(smoke_path), warn=False)
    assert compiled.partitions == [] and {k for k, _ in compiled.steps} == {"cpu"}
    assert all("could not lower it (KeyError" in r for r in compiled.cpu_reasons.values())
    _matches_litert(smoke_path, tmp_path)
