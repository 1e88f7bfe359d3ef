"""How `litekiln.check` judges quantized models against LiteRT (scripts/check_model.py, the
corpus and the probe): 16-bit outputs in 8-bit steps, and the second opinion of LiteRT's
builtin kernels where its default path alone would fail a model."""

from __future__ import annotations

import numpy as np
import pytest

from litekiln import check


def test_int16_outputs_are_counted_in_8bit_steps() -> None:
    ref = np.zeros(100, np.int16)
    ours = np.full(100, 256, np.int16)  # one 8-bit step of the same range everywhere
    assert check.integer_step_stats([ours], [ref]) == (1.0, 1.0)
    ours8 = np.full(100, 3, np.int8)
    assert check.integer_step_stats([ours8], [np.zeros(100, np.int8)]) == (3.0, 0.0)


def _steps(a: list[np.ndarray], b: list[np.ndarray]) -> tuple[bool, float]:
    m, w = check.integer_step_stats(a, b)
    return check.within_integer_bounds(m, w), m


@pytest.mark.parametrize(
    ("ours", "default", "builtin", "ok", "says"),
    [
        (0, 5, 0, True, "builtin kernels"),  # exactly LiteRT's builtin kernels
        (3, 0, 6, True, "disagree beyond"),  # LiteRT's paths 6 apart, ours 3 from the nearer
        (5, 0, 0, False, "0 apart"),  # LiteRT agrees with itself; ours 5 steps off
        (15, 0, 6, False, "6 apart"),  # 9 from the nearer: beyond LiteRT's own 6
    ],
)
def test_second_opinion(monkeypatch, ours, default, builtin, ok, says) -> None:
    def full(v: int) -> list[np.ndarray]:
        return [np.full(50, v, np.int8)]

    monkeypatch.setattr(
        check, "litert_outputs", lambda path, inputs, builtin=False, signature=None: full(builtin_v)
    )
    builtin_v = builtin
    got, note = check._second_opinion("m.tflite", [], full(ours), full(default), _steps, "steps")
    assert got is ok
    assert says in note
