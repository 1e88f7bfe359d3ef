"""Fuzz the loader in-process (a few hundred deterministic cases, a few seconds).

The mutations are those of scripts/fuzz_loader.py (bit flips, truncation, splices, integer
overwrites at structural positions), drawn by hypothesis so that a failure shrinks to a
small reproducer. The long run is ``python scripts/fuzz_loader.py`` (10000 cases, worker
processes, hang and crash detection); every reproducer it saved under
tests/data/fuzz_regressions/ is replayed here too (a differential one also runs on the
reference, where only litekiln errors may come out).

The differential fuzzer (``--differential``: semantic mutants run on LiteRT and on litekiln's
reference) gets a short run here: no crash, hang or non-litekiln exception on litekiln's side.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import litekiln.ops  # noqa: F401  (the loader runs the per-op checks once the registry is in)
from litekiln import ModelError
from litekiln.model import load_model

REPO = Path(__file__).resolve().parents[1]
REGRESSIONS = REPO / "tests" / "data" / "fuzz_regressions"

#: A valid or corrupt model this small loads in milliseconds; seconds means a hang.
CASE_TIMEOUT_S = 5


@functools.lru_cache(maxsize=1)
def fuzz_module() -> Any:
    path = REPO / "scripts" / "fuzz_loader.py"
    spec = importlib.util.spec_from_file_location("fuzz_loader", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_loader"] = module
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=1)
def seeds() -> dict[str, tuple[bytes, list[int]]]:
    """Seed name -> (bytes, structural positions): the built seeds and the smallest real one."""
    fz = fuzz_module()
    built, real = fz.load_seeds(real=True)
    chosen = dict(built)
    if "face_detection_short_range" in real:
        chosen["face_detection_short_range"] = real["face_detection_short_range"]
    return {name: (data, fz.structural_positions(data)) for name, data in chosen.items()}


@contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    """Fail a case that runs too long (SIGALRM; pytest runs tests in the main thread)."""

    def on_alarm(signum: int, frame: Any) -> None:
        raise TimeoutError(f"load_model did not return within {seconds} s (hang?)")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@st.composite
def mutated_models(draw: st.DrawFn) -> tuple[str, bytes, list[str]]:
    pool = seeds()
    name = draw(st.sampled_from(sorted(pool)))
    base, positions = pool[name]
    data = bytearray(base)
    log: list[str] = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["int", "int", "int", "flip", "truncate", "splice"]))
        n = len(data)
        if n == 0:
            break
        if kind == "flip":
            at, bit = draw(st.integers(0, n - 1)), draw(st.integers(0, 7))
            data[at] ^= 1 << bit
            log.append(f"flip bit {bit} at {at}")
        elif kind == "truncate":
            at = draw(st.integers(0, n - 1))
            del data[at:]
            log.append(f"truncate to {at}")
        elif kind == "splice":
            donor_name = draw(st.sampled_from(sorted(pool)))
            donor = pool[donor_name][0]
            size = draw(st.sampled_from([4, 16, 64]))
            src = draw(st.integers(0, max(0, len(donor) - size)))
            dst = draw(st.integers(0, n - 1))
            data[dst : dst + size] = donor[src : src + size]
            log.append(f"splice {size} bytes of {donor_name}@{src} over {dst}")
        else:
            at = draw(st.sampled_from(positions))
            width = draw(st.sampled_from([4, 2, 1]))
            if at + width > n:
                continue
            value = draw(
                st.sampled_from(fuzz_module().INTERESTING_INTS + [n, n + 4])
                | st.integers(0, (1 << 32) - 1)
            )
            value &= (1 << (8 * width)) - 1
            data[at : at + width] = value.to_bytes(width, "little")
            log.append(f"int{8 * width} at {at} := {value}")
    return name, bytes(data), log


def assert_loads_or_model_error(data: bytes, seconds: int = CASE_TIMEOUT_S) -> None:
    with time_limit(seconds):
        try:
            load_model(data)
        except ModelError as exc:
            assert str(exc), "ModelError without a message"


@settings(
    max_examples=300,
    derandomize=True,  # the same cases on every run and machine
    deadline=None,  # the time limit above is the hang check; load times vary with the seed
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=mutated_models())
def test_mutated_models_raise_only_model_error(case: tuple[str, bytes, list[str]]) -> None:
    name, data, log = case
    try:
        assert_loads_or_model_error(data)
    except (ModelError, AssertionError):
        raise
    except BaseException as exc:  # noqa: BLE001  (say which seed and mutations, then re-raise)
        escaped = type(exc).__name__
        raise AssertionError(f"{escaped} escaped load_model for {name} after {log}") from exc


def test_seeds_load() -> None:
    for name, (data, positions) in seeds().items():
        assert load_model(data).subgraphs, name
        assert len(positions) > 20, name


def test_fuzz_script_runs(tmp_path: Path) -> None:
    """The long fuzzer's machinery: workers, results, report (few cases, built seeds only)."""
    report = fuzz_module().run(
        40, seed=1, workers=2, timeout=10.0, out=tmp_path, real=False, progress=False
    )
    assert report.cases == 40
    assert set(report.outcomes) <= {"ok", "ModelError"}, report.to_json()


def _regression_params() -> list[Any]:
    """One param per saved reproducer; those whose note says the bug is still open are not run
    (the open ones take seconds and gigabytes); mark the note fixed to turn them on."""
    params = []
    for path in sorted(REGRESSIONS.glob("*.tflite")):
        try:
            note = json.loads(path.with_suffix(".json").read_text())
        except (OSError, ValueError):
            note = {}
        marks = []
        if str(note.get("status", "")).startswith("open"):
            reason = f"open loader bug: {note.get('analysis', note.get('detail', ''))[:160]}"
            marks.append(pytest.mark.xfail(run=False, strict=True, reason=reason))
        params.append(pytest.param(path, marks=marks, id=path.stem))
    return params or [pytest.param(None, marks=pytest.mark.skip(reason="no saved regressions"))]


@pytest.mark.parametrize("path", _regression_params())
def test_saved_regressions(path: Path) -> None:
    """Every saved reproducer loads or raises ModelError, within a second; a differential
    one that loads also runs on the reference, raising nothing but litekiln errors."""
    assert_loads_or_model_error(path.read_bytes(), seconds=1)
    if not path.name.startswith("diff-"):
        return
    fz = fuzz_module()
    with time_limit(CASE_TIMEOUT_S * 4):
        side, _, _ = fz.run_litekiln(path.read_bytes(), seed=0)
    assert side.outcome != "escape", side.message


def test_differential_fuzz_quick(tmp_path: Path) -> None:
    """A few dozen semantic mutants (small seeds) on LiteRT and on litekiln's reference:
    litekiln never crashes, hangs or lets a non-litekiln exception out, and runs no model
    LiteRT refuses (each would be a finding: the fuzzer's EXPLANATIONS are the exceptions)."""
    report = fuzz_module().run_differential(
        36, seed=5, workers=2, timeout=20.0, out=tmp_path, real=False, progress=False
    )
    assert report.cases == 36
    bad = {k: n for k, n in report.verdicts.items() if k.startswith("litekiln-")}
    assert not bad, report.to_json()
    unexplained = [x for x in report.refused_but_run if x["category"] == "unexplained"]
    assert not unexplained, unexplained
    assert report.verdicts["both-refused"] + report.verdicts["same"] > 0


def test_differential_verdicts() -> None:
    """The judge: refusals on either side, equal and different outputs."""
    fz = fuzz_module()
    ran, refused = fz.Side("ran"), fz.Side("refused", "allocate", "RuntimeError", "no")
    x = [np.ones(3, np.float32)]
    spec = [((3,), np.dtype("float32"))]
    assert fz.judge(refused, refused, None, None, [], [], 1e-4)[0] == "both-refused"
    assert fz.judge(ran, refused, x, None, spec, [], 1e-4)[0] == "refused-but-run"
    assert fz.judge(refused, ran, None, x, [], spec, 1e-4)[0] == "run-but-refused"
    assert fz.judge(ran, ran, x, x, spec, spec, 1e-4)[0] == "same"
    assert fz.judge(ran, ran, x, [x[0] * 2], spec, spec, 1e-4)[0] == "different"
    nan = [np.array([np.nan, 1.0], np.float32)]
    assert fz.judge(ran, ran, nan, nan, spec, spec, 1e-4)[0] == "same"
    escape = fz.Side("escape", "invoke", "ZeroDivisionError", "trace")
    assert fz.judge(escape, ran, None, x, [], spec, 1e-4)[0] == "litekiln-escape"


def test_an_axis_tensor_with_quantization_is_read_as_stored() -> None:
    """LiteRT reads ARG_MAX's axis as the integers stored, whatever quantization the file
    gives the tensor; litekiln's reference dequantized it into another axis (0 for 1) and
    refused its own output's shape (saved: diff-run-but-refused-871b0adbf002)."""
    from oplib import run_litert, run_reference
    from tflite_builder import ModelBuilder

    b = ModelBuilder()
    x = b.input("x", [2, 3])
    axis = b.const("axis", np.array([1], np.int32), quant={"scale": [0.37], "zero_point": [2]})
    b.output(b.op("ARG_MAX", [x, axis], out_shape=[2], out_dtype="int32",
                  options={"output_type": "INT32"}))  # fmt: skip
    model = b.build()
    feeds = [np.random.default_rng(0).uniform(-1, 1, [2, 3]).astype(np.float32)]
    want = run_litert(model, feeds)
    np.testing.assert_array_equal(run_reference(model, feeds)[0], want[0])
