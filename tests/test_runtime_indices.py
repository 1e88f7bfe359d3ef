"""Run-time indices on the GPU: token ids, gather positions, cache positions.

A language model reads tables at integers only run time knows: EMBEDDING_LOOKUP of its token
ids, GATHER / GATHER_ND of its rope and mask tables at the positions, DYNAMIC_UPDATE_SLICE of
its KV cache at the position, and it reduces its boolean position masks (REDUCE_ALL) and
reshapes them; a classifier of fed ids one-hot encodes them (ONE_HOT). Those integers come
from the graph inputs, from the CPU, or from int32 ops on the GPU (tests/test_int32_gpu.py);
the GPU forms take them as int32 tensors of the partition (`OpDef.runtime_indices`), so that
the model's float work stays in one partition.

Each case must run on the GPU (the batch helper checks every op's placement) and match the
numpy reference and LiteRT (tests/gpu_helper.py: 1e-4 of the output range; bools exact). A
DYNAMIC_UPDATE_SLICE start outside the operand is clamped as LiteRT clamps it; an id or
position outside its table is refused on the host before the run, with the op named, as the
CPU form refuses it. The partitioner runs the CPU ops that depend on no GPU op first, so
that a mask computed from an integer input does not split the GPU ops in two.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_helper import Batch, Case
from tflite_builder import ModelBuilder, Quant

import litekiln
from litekiln.errors import ModelError


def _embedding(ids: int, rows: int, width: int):
    def build(g):
        table = g.w([rows, width])
        x = g.x([ids], "int32", low=0, high=rows)
        return g.op("EMBEDDING_LOOKUP", [x, table], [ids, width], dtype="float32")

    return build


def _embedding_int8(per_row: bool):
    """litert-torch's dynamic-int8 token embedding: an int8 table looked up as float32
    (LiteRT's hybrid kernel: each byte times its row's scale, or the table's)."""

    def build(g):
        rows, width = 12, 16
        scale = [0.01 * (r + 1) for r in range(rows)] if per_row else 0.03
        quant = Quant(scale, [0] * rows if per_row else 0, 0)
        table = g.w([rows, width], "int8", quant=quant)
        x = g.x([5], "int32", low=0, high=rows)
        version = 3 if per_row else 2
        return g.op("EMBEDDING_LOOKUP", [x, table], [5, width], dtype="float32", version=version)

    return build


def _gather(shape, pos_shape, axis):
    def build(g):
        n = shape[axis]
        pos = g.x(pos_shape, "int32", low=0, high=n)
        out = [*shape[:axis], *pos_shape, *shape[axis + 1 :]]
        return g.op("GATHER", [g.x(shape), pos], out, {"axis": axis})

    return build


def _gather_nd(shape, idx_shape):
    def build(g):
        depth = idx_shape[-1]
        idx = g.x(idx_shape, "int32", low=0, high=min(shape[:depth]))
        out = [*idx_shape[:-1], *shape[depth:]]
        return g.op("GATHER_ND", [g.x(shape), idx], out)

    return build


def _dus(shape, update, low, high):
    def build(g):
        start = g.x([len(shape)], "int32", low=low, high=high)
        return g.op("DYNAMIC_UPDATE_SLICE", [g.x(shape), g.x(update), start], shape)

    return build


def _bool_reduce(name):
    def build(g):
        x = g.x([3, 5])
        flags = g.op("GREATER", [x, g.w(np.zeros([1], np.float32))], [3, 5], dtype="bool")
        reduced = g.op(name, [flags, g.ints([1])], [3], {"keep_dims": False}, dtype="bool")
        column = g.op("RESHAPE", [reduced, g.ints([3, 1])], [3, 1], dtype="bool")
        y = g.op("SELECT_V2", [column, g.x([3, 4]), g.x([3, 4])], [3, 4], dtype="float32")
        return [y, reduced]

    return build


def _one_hot(shape, depth, axis):
    def build(g):
        idx = g.x(shape, "int32", low=-1, high=depth + 1)  # (outside: a row of off values)
        out = list(shape)
        out.insert(len(shape) if axis == -1 else axis, depth)
        values = [g.w(np.full([], v, np.float32)) for v in (2.5, -1.0)]
        return g.op("ONE_HOT", [idx, g.ints([depth]), *values], out, {"axis": axis},
                    dtype="float32")  # fmt: skip

    return build


CASES = Batch(
    "runtime_indices",
    [
        Case("embedding", _embedding(7, 12, 16)),
        Case("embedding_one_id", _embedding(1, 50, 8)),
        Case("embedding_int8", _embedding_int8(False)),
        Case("embedding_int8_per_row", _embedding_int8(True)),
        Case("gather_axis0", _gather([9, 5], [4], 0)),
        Case("gather_axis1_2d_positions", _gather([2, 7, 3], [2, 3], 1)),
        Case("gather_nd_rows", _gather_nd([6, 5, 4], [3, 1])),
        Case("gather_nd_elements", _gather_nd([5, 5, 3], [2, 4, 2])),
        Case("dus_inside", _dus([1, 8, 4], [1, 3, 4], 0, 5)),
        Case("dus_clamped", _dus([2, 6, 5], [1, 2, 5], -4, 12)),
        Case("one_hot_last_axis", _one_hot([2, 5], 6, -1)),
        Case("one_hot_axis0", _one_hot([4], 3, 0)),
        Case("reduce_all", _bool_reduce("REDUCE_ALL")),
        Case("reduce_any", _bool_reduce("REDUCE_ANY")),
    ],
)


@pytest.mark.opencl
@pytest.mark.parametrize("case", CASES.ids())
def test_runtime_indices_on_the_gpu(case: str) -> None:
    CASES.check(case)


def _lookup_then_scale() -> bytes:
    """ids [4] -> EMBEDDING_LOOKUP of a [10, 6] table -> x2: the ids a graph input."""
    b = ModelBuilder()
    ids = b.input("ids", [4], "int32")
    table = b.const("table", np.arange(60, dtype=np.float32).reshape(10, 6) / 60)
    rows = b.op("EMBEDDING_LOOKUP", [ids, table], out_shape=[4, 6], out_dtype="float32")
    b.output(b.op("MUL", [rows, np.full([1], 2, np.float32)]))
    return b.build()


@pytest.mark.opencl
def test_an_id_outside_the_table_is_refused_on_the_gpu_path_as_on_the_cpu() -> None:
    model = _lookup_then_scale()
    gpu = litekiln.Interpreter(model_content=model, use_cache=False)
    gpu.allocate_tensors()
    assert gpu._backend.compiled.cpu_reasons == {}  # noqa: SLF001 - all on the GPU
    good = np.array([0, 9, 3, 3], np.int32)
    np.testing.assert_allclose(gpu.run([good])[0], np.arange(60).reshape(10, 6)[good] / 30)
    errors = []
    for device in (gpu, litekiln.Interpreter(model_content=model, device="reference")):
        with pytest.raises(ModelError) as err:
            device.run([np.array([0, 10, 3, 3], np.int32)])
        errors.append(str(err.value))
    assert errors[0] == "op #0 EMBEDDING_LOOKUP (v1): ids 10 outside [0, 10)", errors
    assert errors[1].startswith("op #0 EMBEDDING_LOOKUP (v1): id 10 "), errors
    np.testing.assert_allclose(gpu.run([good])[0], np.arange(60).reshape(10, 6)[good] / 30)


def test_cpu_ops_that_need_no_gpu_op_run_first() -> None:
    """An integer from an input (FLOOR_DIV: int32 on the CPU) read after a GPU op that does
    not need it: one partition, the CPU op before it (the GPU-first order made two). (Every
    partition delegated: the cost model would keep ops this small on the CPU.)"""
    from litekiln.compiler.partition import partition
    from litekiln.model import load_model

    b = ModelBuilder()
    x = b.input("x", [1, 4], "float32")
    pos = b.input("pos", [4], "int32")
    y = b.op("MUL", [x, np.full([1], 3, np.float32)])
    shifted = b.op("FLOOR_DIV", [pos, np.full([1], 2, np.int32)])  # (int32: on the CPU)
    limit = b.op("LESS", [shifted, np.full([1], 3, np.int32)], out_dtype="bool")
    mask = b.op("RESHAPE", [limit, np.array([1, 4], np.int32)], out_shape=[1, 4])
    b.output(b.op("SELECT_V2", [mask, y, x], out_shape=[1, 4], out_dtype="float32"))
    plan = partition(load_model(b.build()).main, min_partition_ops=1)
    assert len(plan.partitions) == 1, plan.summary()
    kinds = [s.kind for s in plan.steps]
    assert kinds == ["cpu", "gpu"], kinds
