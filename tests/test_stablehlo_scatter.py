"""STABLEHLO_SCATTER on the CPU: litert-torch writes PyTorch's F.fold (timm's VOLO) and
index_put / scatter_add with it. The numpy reference against LiteRT for the regions LiteRT
takes (StableHLO's ADD, MAXIMUM, an empty region that replaces), with repeated positions and
positions outside the operand; litert-torch's own form, a builtin ADD region that LiteRT's
kernel refuses, against numpy's ``add.at``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tflite_builder import ModelBuilder

import litekiln
from litekiln.errors import ModelValidationError


def _model(shape, idx, upd_shape, body: str | None, **options: Any) -> bytes:
    """y = scatter(x, idx, u) with subgraph 1 as its update region (``None``: empty)."""
    b = ModelBuilder()
    x = b.input("x", shape)
    u = b.input("u", upd_shape)
    opts = {"update_computation_subgraph_index": 1, **options}
    y = b.op("STABLEHLO_SCATTER", [x, b.const("idx", idx), u], out_shape=shape, options=opts)
    b.output(y)
    sg = b.subgraph("region")
    lhs, rhs = sg.input("lhs", []), sg.input("rhs", [])
    sg.output(sg.op(body, [lhs, rhs], out_shape=[]) if body else rhs)
    return b.build()


ROWS = dict(
    update_window_dims=[1], inserted_window_dims=[0], scatter_dims_to_operand_dims=[0],
    index_vector_dim=1,
)  # fmt: skip
#: VOLO's fold in small: updates [n, c, kh, oh, kw, ow] added at (n, c, i, j), (i, j) read
#: from indices [kh, oh, kw, ow, 2]; here [1, 2, 2, 2] updates at 2-D positions of a 5x5 map.
FOLD = dict(
    update_window_dims=[0, 1], inserted_window_dims=[2, 3], scatter_dims_to_operand_dims=[2, 3],
    index_vector_dim=2,
)  # fmt: skip
FOLD_IDX = np.array([[[0, 0], [4, 4]], [[2, 1], [7, 0]]], np.int32)  # (7, 0): outside, skipped

CASES = {
    # rows 1 and 4, row 1 twice: the region combines both
    "rows_add": ([6, 3], np.array([[1], [4], [1]], np.int32), [3, 3], "STABLEHLO_ADD", ROWS),
    "rows_replace": ([6, 3], np.array([[5], [0]], np.int32), [2, 3], None, ROWS),
    "fold_max": ([1, 2, 5, 5], FOLD_IDX, [1, 2, 2, 2], "STABLEHLO_MAXIMUM", FOLD),
    "fold_add": ([1, 2, 5, 5], FOLD_IDX, [1, 2, 2, 2], "STABLEHLO_ADD", FOLD),
}


def _inputs(shape: list[int], upd_shape: list[int]) -> list[np.ndarray]:
    rng = np.random.default_rng(len(shape) + len(upd_shape))
    return [rng.uniform(-1, 1, s).astype(np.float32) for s in (shape, upd_shape)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_matches_litert(name: str) -> None:
    from oplib import run_litert

    shape, idx, upd_shape, body, options = CASES[name]
    data = _model(shape, idx, upd_shape, body, **options)
    xs = _inputs(shape, upd_shape)
    (want,) = run_litert(data, xs, resolver="AUTO")
    got = litekiln.Interpreter(model_content=data, device="reference").run(xs)[0]
    np.testing.assert_array_equal(got, want)


def test_a_builtin_add_region_runs_as_the_add_it_is() -> None:
    """litert-torch's F.fold: a builtin ADD region (LiteRT refuses it when it allocates)."""
    shape, idx, upd_shape, _, options = CASES["fold_add"]
    data = _model(shape, idx, upd_shape, "ADD", **options)
    x, u = _inputs(shape, upd_shape)
    want = x.copy()
    for a in range(2):
        for b in range(2):
            i, j = FOLD_IDX[a, b]
            if i < 5:
                want[0, :, i, j] += u[0, :, a, b]
    got = litekiln.Interpreter(model_content=data, device="reference").run([x, u])[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)


def test_inconsistent_dimensions_are_refused_at_load() -> None:
    shape, idx, upd_shape, body, options = CASES["rows_add"]
    with pytest.raises(ModelValidationError, match="do not fit an operand of rank 2"):
        litekiln.Interpreter(
            model_content=_model(shape, idx, upd_shape, body, **{**options, "index_vector_dim": 0})
        )
