"""int32 arithmetic on the GPU: a language model's positions and masks.

litert-torch's language models compute their positions, cache indices and attention masks
from the fed position with int32 ops (ADD, SUB, comparisons, SELECT, CAST, PACK, RESHAPE);
on the CPU they cost a round trip of the host each (9-19 ops, ~10 us of Python each, per
decode step). The GPU forms of those ops compute int32 values as int32 (`OpDef.int32_data`,
`Lowering` keeps such tensors int32, fp16 never rounds them).

Each case must run wholly on the GPU (the batch helper checks every op's placement) and
match the numpy reference and LiteRT exactly for integer and bool outputs (floats within
1e-4 of the output range; tests/gpu_helper.py). An id that reaches a lookup through a
RESHAPE on the GPU is still checked on the host where it enters.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_helper import Batch, Case
from tflite_builder import ModelBuilder

import litekiln
from litekiln.errors import ModelError


def _arithmetic(g):
    pos = g.x([6], "int32", low=-5, high=40)
    p1 = g.op("ADD", [pos, g.ints([1])], [6])
    p2 = g.op("MUL", [p1, g.ints([3])], [6])
    p3 = g.op("SUB", [p2, pos], [6])
    top = g.op("MAXIMUM", [p3, g.ints([0])], [6])
    return g.op("MINIMUM", [top, g.ints([50])], [6])


def _large_positions(g):
    """Positions past fp16's exact integers (2048) and float32's (2^24): exact all the same."""
    pos = g.x([5], "int32", low=30_000_000, high=40_000_000)
    step = g.op("ADD", [pos, g.ints([1])], [5])
    limit = g.op("LESS", [step, g.ints([35_000_001])], [5], dtype="bool")
    return [step, limit]


def _mask(g):
    """A sliding-window causal mask from the position, applied to scores."""
    pos = g.x([1, 1], "int32", low=0, high=16)
    row = g.ints(np.arange(16, dtype=np.int32).reshape(1, 16))
    causal = g.op("LESS_EQUAL", [row, pos], [1, 16], dtype="bool")
    start = g.op("SUB", [pos, g.ints([[4]])], [1, 1])
    window = g.op("GREATER_EQUAL", [row, start], [1, 16], dtype="bool")
    mask = g.op("LOGICAL_AND", [causal, window], [1, 16], dtype="bool")
    scores = g.x([1, 16])
    masked = g.op("SELECT_V2", [mask, scores, g.w(np.full([1], -1e9, np.float32))], [1, 16])
    return [masked, mask]


def _casts(g):
    x = g.x([12], low=-5.0, high=5.0)
    truncated = g.op("CAST", [x], [12], dtype="int32")  # toward zero, as static_cast
    n = g.x([12], "int32", low=-100, high=100)
    as_float = g.op("CAST", [n], [12], dtype="float32")
    halves = g.op("MUL", [as_float, g.w(np.full([1], 0.5, np.float32))], [12])
    nonzero = g.op("CAST", [g.op("SUB", [n, g.ints([3])], [12])], [12], dtype="bool")
    positive = g.op("GREATER", [x, g.w(np.zeros([1], np.float32))], [12], dtype="bool")
    ones = g.op("CAST", [positive], [12], dtype="int32")
    return [truncated, halves, nonzero, ones]


def _select(g):
    a, b = g.x([3, 4], "int32", low=-9, high=9), g.x([3, 4], "int32", low=-9, high=9)
    cond = g.op("GREATER", [g.x([3, 4]), g.x([3, 4])], [3, 4], dtype="bool")
    picked = g.op("SELECT_V2", [cond, a, b], [3, 4])
    rows = g.op("SELECT", [cond, b, a], [3, 4])
    return [picked, rows]


def _moves(g):
    pos = g.x([1], "int32", low=0, high=8)
    nxt = g.op("ADD", [pos, g.ints([1])], [1])
    scalar = g.op("RESHAPE", [nxt, g.ints([], "int32")], [])
    start = g.op("PACK", [g.ints(0), scalar, g.ints(0)], [3], {"values_count": 3, "axis": 0})
    both = g.op("CONCATENATION", [pos, nxt, g.ints([7, 9])], [4], {"axis": 0})
    grid = g.op("RESHAPE", [both, g.ints([2, 2])], [2, 2])
    flipped = g.op("TRANSPOSE", [grid, g.ints([1, 0])], [2, 2])
    part = g.op("SLICE", [flipped, g.ints([0, 1]), g.ints([2, 1])], [2, 1])
    strided = g.op("STRIDED_SLICE", [both, g.ints([0]), g.ints([4]), g.ints([2])], [2])
    table = g.ints(np.arange(100, 110, dtype=np.int32))
    looked = g.op("GATHER", [table, nxt], [1], {"axis": 0})
    return [start, part, strided, looked]


def _shifted_ids(g):
    """BART's decoder ids (transformers' shift_tokens_right): the ids padded on the left with
    the start token, the last one sliced off; ids past float32's exact integers stay exact."""
    ids = g.x([1, 6], "int32", low=16_777_000, high=16_777_300)
    padded = g.op("PAD", [ids, g.ints([[0, 0], [1, 0]])], [1, 7])
    shifted = g.op("SLICE", [padded, g.ints([0, 0]), g.ints([1, 6])], [1, 6])
    started = g.op("PADV2", [ids, g.ints([[0, 0], [1, 0]]), g.ints(16_777_217)], [1, 7])
    return [shifted, started]


def _computed_index(g):
    """A float table read at a computed position (GATHER_ND, as a rope table)."""
    pos = g.x([1], "int32", low=0, high=5)
    at = g.op("RESHAPE", [g.op("ADD", [pos, g.ints([1])], [1]), g.ints([1, 1])], [1, 1])
    table = g.x([6, 5])
    return g.op("GATHER_ND", [table, at], [1, 5])


def _rope_angles(g):
    pos = g.x([1], "int32", low=0, high=4000)
    inv_freq = g.w((1.0 / 10000 ** (np.arange(8) / 8)).astype(np.float32))
    angle = g.op("MUL", [g.op("CAST", [pos], [1], dtype="float32"), inv_freq], [8])
    return [g.op("COS", [angle], [8]), g.op("SIN", [angle], [8])]


CASES = Batch(
    "int32_gpu",
    [
        Case("arithmetic", _arithmetic),
        Case("large_positions", _large_positions),
        Case("mask", _mask),
        Case("casts", _casts),
        Case("select", _select),
        Case("moves", _moves),
        Case("shifted_ids", _shifted_ids),
        Case("computed_index", _computed_index),
        Case("rope_angles", _rope_angles),
    ],
)


@pytest.mark.opencl
@pytest.mark.parametrize("case", CASES.ids())
def test_int32_ops_on_the_gpu(case: str) -> None:
    CASES.check(case)


def _ids_reshaped_then_looked_up() -> bytes:
    """ids [1, 4] -> RESHAPE [4] -> EMBEDDING_LOOKUP of a [10, 6] table -> x2 (a token
    embedding as litert-torch writes it); the position + 3000, compared with 3002."""
    b = ModelBuilder()
    ids = b.input("ids", [1, 4], "int32")
    pos = b.input("pos", [2], "int32")
    flat = b.op("RESHAPE", [ids, np.array([4], np.int32)], out_shape=[4])
    table = b.const("table", np.arange(60, dtype=np.float32).reshape(10, 6) / 60)
    rows = b.op("EMBEDDING_LOOKUP", [flat, table], out_shape=[4, 6], out_dtype="float32")
    b.output(b.op("MUL", [rows, np.full([1], 2, np.float32)]))
    later = b.op("ADD", [pos, np.full([1], 3000, np.int32)])
    b.output(later, b.op("LESS", [later, np.full([1], 3002, np.int32)], out_dtype="bool"))
    return b.build()


@pytest.mark.opencl
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_an_id_reshaped_on_the_gpu_is_still_checked_and_positions_stay_exact(
    precision: str,
) -> None:
    model = _ids_reshaped_then_looked_up()
    gpu = litekiln.Interpreter(model_content=model, use_cache=False, precision=precision)
    gpu.allocate_tensors()
    assert gpu._backend.compiled.cpu_reasons == {}  # noqa: SLF001 - all on the GPU
    good = np.array([[0, 9, 3, 3]], np.int32)
    pos = np.array([1, 2], np.int32)  # 3001 and 3002: fp16 would make both 3002
    rows, later, less = gpu.run([good, pos])
    np.testing.assert_allclose(rows, np.arange(60).reshape(10, 6)[good[0]] / 30, rtol=1e-3)
    assert later.dtype == np.int32 and later.tolist() == [3001, 3002]
    assert less.tolist() == [True, False]
    refusal = r"op #1 EMBEDDING_LOOKUP \(v1\): ids 10 outside \[0, 10\)"
    with pytest.raises(ModelError, match=refusal):
        gpu.run([np.array([[0, 10, 3, 3]], np.int32), pos])


def _scalar_constants() -> bytes:
    """pos [1] -> +1 -> RESHAPE [] -> PACK with two 0-d constants -> [3]: int32 scalars
    that the compiled program holds as constants (traced back to the model's tensors)."""
    b = ModelBuilder()
    pos = b.input("pos", [1], "int32")
    nxt = b.op("RESHAPE", [b.op("ADD", [pos, np.ones([1], np.int32)]), np.array([], np.int32)],
               out_shape=[])  # fmt: skip
    zero, seven = (b.const(n, np.array(v, np.int32)) for n, v in (("zero", 0), ("seven", 7)))
    b.output(b.op("PACK", [zero, nxt, seven], out_shape=[3], options={"values_count": 3}))
    b.output(b.op("ADD", [pos, seven]))  # (a kernel's 0-d operand)
    return b.build()


@pytest.mark.opencl
def test_scalar_int32_constants_keep_their_shape_through_the_cache(tmp_path) -> None:
    """A warm start rebuilds the program's constants from the model (`WeightRecipe`): a 0-d
    constant must come back 0-d (numpy's ascontiguousarray made it [1], which the program
    refused: "constant ...: shape (1,), program expects ()")."""
    model = _scalar_constants()
    for start in ("cold", "warm"):
        it = litekiln.Interpreter(model_content=model, cache_dir=tmp_path)
        it.allocate_tensors()
        assert it._backend.compiled.cpu_reasons == {}, start  # noqa: SLF001
        packed, added = it.run([np.array([4], np.int32)])
        assert packed.dtype == np.int32 and packed.tolist() == [0, 5, 7], start
        assert added.dtype == np.int32 and added.tolist() == [11], start
