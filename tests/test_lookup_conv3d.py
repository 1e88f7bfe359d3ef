"""EMBEDDING_LOOKUP and CONV_3D, two ops that converters emit for users' models.

litert-torch writes PyTorch's ``nn.Embedding`` (every text model's token embedding) as an
EMBEDDING_LOOKUP, and timm's lambda layers' ``nn.Conv3d`` as a CONV_3D; before these tests
litekiln refused both ("not supported by litekiln, not even on the CPU"). Each is checked
against LiteRT's own kernels (``oplib.check_op``): the float copy, LiteRT's hybrid kernel
(8-bit bytes read as signed, times the table's scale, per row where there are several, the
zero point unused), the 8-bit copy, and 3-D windows of every option. A text model whose ids
feed the lookup runs whole on the GPU path (PoCL), its lookup included (the ids an int32
input of the partition: `OpDef.runtime_indices`), against LiteRT, on the inputs
``random_inputs`` draws for it (ids within the table). A
CONV_3D with a constant filter becomes a CONV_2D at load (`litekiln.ops.conv3d_as_2d`: over
two axes where its window is one cell along the third, else over its depth taps stacked as
channels): those run whole on the GPU path, against LiteRT, on every test device.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_helper import Batch, Case, G
from oplib import Quant, Spec, check_op, run_litert
from tflite_builder import ModelBuilder, TensorRef

from litekiln.errors import ModelError, ModelValidationError
from litekiln.model import load_model
from litekiln.ops.conv import out_size

opencl = pytest.mark.opencl

IDS = np.array([3, 0, 7, 3, 9], np.int32)


@pytest.mark.parametrize("table", [[10, 4], [12, 2, 3]], ids=["2d", "3d"])
def test_embedding_lookup_float(table: list[int]) -> None:
    check_op(
        "EMBEDDING_LOOKUP",
        [IDS],
        consts={1: Spec(table)},
        out_shape=[5, *table[1:]],
        out_dtype="float32",
    )


@pytest.mark.parametrize(
    ("dtype", "quant", "version"),
    [
        ("int8", Quant(0.05, 0), 2),
        ("uint8", Quant(0.02, 0), 2),  # bytes over 127 read as negative int8
        ("int8", Quant([0.01 * (i + 1) for i in range(10)], [0] * 10, 0), 3),  # a scale a row
    ],
    ids=["int8", "uint8", "per-row"],
)
def test_embedding_lookup_hybrid(dtype: str, quant: Quant, version: int) -> None:
    """An 8-bit table with a float32 output: exactly LiteRT's hybrid kernel."""
    check_op(
        "EMBEDDING_LOOKUP",
        [IDS],
        consts={1: Spec([10, 6], dtype, quant)},
        version=version,
        out_dtype="float32",
        tol=0.0,
    )


def test_embedding_lookup_int8_copy() -> None:
    check_op(
        "EMBEDDING_LOOKUP",
        [IDS],
        consts={1: Spec([10, 3], "int8", Quant(0.05, 3))},
        version=2,
        out_dtype="int8",
        out_quant=Quant(0.05, 3),
        qtol=0,
    )


def _lookup_model(rows: int = 10, n: int = 4, width: int = 8) -> bytes:
    """ids -> EMBEDDING_LOOKUP -> FULLY_CONNECTED x2 -> SOFTMAX."""
    rng = np.random.default_rng(1)
    b = ModelBuilder()
    ids = b.input("ids", [n], "int32")
    table = rng.uniform(-1, 1, [rows, width]).astype(np.float32)
    x = b.op(
        "EMBEDDING_LOOKUP",
        [ids, b.const("table", table)],
        out_shape=[n, width],
        out_dtype="float32",
    )
    for k in range(2):
        w = (rng.uniform(-1, 1, [width, width]) / np.sqrt(width)).astype(np.float32)
        x = b.op(
            "FULLY_CONNECTED",
            [x, b.const(f"w{k}", w), b.const(f"bias{k}", np.zeros(width, np.float32))],
            out_shape=[n, width],
        )
    b.output(b.op("SOFTMAX", [x], out_shape=[n, width], options={"beta": 1.0}))
    return b.build()


def test_an_id_outside_the_table_is_named() -> None:
    from litekiln.reference import run_graph

    model = load_model(_lookup_model())
    with pytest.raises(ModelError, match=r"id 12 is outside the table's rows \[0, 9\]"):
        run_graph(model.main, {model.main.inputs[0]: np.array([1, 12, 0, 2], np.int32)})


def test_a_constant_id_outside_the_table_is_refused_at_load() -> None:
    b = ModelBuilder()
    table = np.zeros([4, 2], np.float32)
    emb = b.op(
        "EMBEDDING_LOOKUP",
        [b.const("ids", np.array([0, 4], np.int32)), b.const("t", table)],
        out_shape=[2, 2],
        out_dtype="float32",
    )
    x = b.input("x", [2, 2])
    b.output(b.op("ADD", [emb, x], out_shape=[2, 2]))
    with pytest.raises(ModelValidationError, match=r"ids outside \[0, 4\)"):
        load_model(b.build())


def test_random_inputs_draw_ids_within_the_table() -> None:
    """A model's random ids stay in the rows of the table they index (they would fail the
    lookup in LiteRT too otherwise): `index_bounds` follows the ids to the lookup."""
    from litekiln.interpreter import random_inputs
    from litekiln.model.ir import index_bounds

    model = load_model(_lookup_model(rows=3))
    assert index_bounds(model.main) == {model.main.inputs[0]: 3}
    for seed in range(5):
        (ids,) = random_inputs(model, seed)
        assert ids.dtype == np.int32 and ids.min() >= 0 and ids.max() < 3


@opencl
def test_text_model_runs_whole_on_the_gpu_its_lookup_included() -> None:
    from litekiln.compiler.partition import partition

    data = _lookup_model(rows=100, n=64, width=256)
    plan = partition(load_model(data).main)
    assert plan.cpu_reasons == {} and [len(p.ops) for p in plan.partitions] == [4]
    got, want = _run_ids(data, seed=3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _run_ids(data: bytes, seed: int, **options: object) -> tuple[np.ndarray, np.ndarray]:
    """(litekiln's output, LiteRT's) on 64 seeded ids of 100 rows."""
    from litekiln import Interpreter

    interp = Interpreter(model_content=data, **options)
    interp.allocate_tensors()
    ids = np.random.default_rng(seed).integers(0, 100, 64).astype(np.int32)
    interp.set_tensor(interp.get_input_details()[0]["index"], ids)
    interp.invoke()
    got = interp.get_tensor(interp.get_output_details()[0]["index"])
    (want,) = run_litert(data, [ids])
    return got, want


@opencl
def test_text_model_compiles_in_fp16() -> None:
    """The fp16 guard simulates the graph on calibration inputs (`precision.calibration_inputs`);
    it drew the token ids over int8's range, the lookup refused id -47 and the compile of a
    litert-torch text decoder died with a traceback. The ids now stay within the table; the
    fp16 outputs are within the fp16 bound of LiteRT's."""
    from litekiln.compiler.precision import calibration_inputs

    data = _lookup_model(rows=100, n=64, width=256)
    graph = load_model(data).main
    for values in calibration_inputs(graph):
        ids = values[graph.inputs[0]]
        assert ids.min() >= 0 and ids.max() < 100
    got, want = _run_ids(data, seed=4, precision="fp16")
    assert np.abs(got - want).max() <= 1e-2 * max(1.0, float(np.abs(want).max()))


CONV3D_CASES = [
    # input, filter [KD, KH, KW, I, O], options, bias
    ([1, 5, 6, 7, 2], [3, 3, 3, 2, 4], {"padding": "SAME"}, True),
    ([2, 4, 5, 6, 3], [2, 3, 1, 3, 5], {"padding": "VALID"}, True),
    ([1, 6, 7, 8, 2], [3, 2, 3, 2, 3], {"padding": "SAME", "stride_d": 2, "stride_h": 2}, False),
    ([1, 7, 7, 7, 1], [3, 3, 2, 1, 2], {"padding": "VALID", "dilation_d_factor": 2}, True),
    ([1, 6, 6, 4, 1], [5, 5, 1, 1, 3], {"padding": "SAME"}, False),  # timm's lambda layer
    (
        [1, 4, 4, 4, 2],
        [1, 3, 3, 2, 2],
        {"padding": "SAME", "fused_activation_function": "RELU6"},
        True,
    ),
]


@pytest.mark.parametrize(
    ("x", "w", "options", "bias"), CONV3D_CASES, ids=[f"c{i}" for i in range(len(CONV3D_CASES))]
)
def test_conv3d(x: list[int], w: list[int], options: dict, bias: bool) -> None:
    opts = {"stride_d": 1, "stride_h": 1, "stride_w": 1, **options}
    consts = {1: Spec(w)}
    if bias:
        consts[2] = Spec([w[4]])
    check_op("CONV_3D", [Spec(x)], opts, consts=consts, tol=1e-5)


def test_conv3d_filter_channels_must_match() -> None:
    """LiteRT refuses it too (conv3d.cc: input->dims->data[4] != filter->dims->data[3])."""
    b = ModelBuilder()
    w = np.zeros([2, 2, 2, 2, 4], np.float32)
    y = b.op(
        "CONV_3D",
        [b.input("x", [1, 4, 4, 4, 3]), b.const("w", w)],
        out_shape=[1, 4, 4, 4, 4],
        options={"padding": "SAME", "stride_d": 1, "stride_h": 1, "stride_w": 1},
    )
    b.output(y)
    with pytest.raises(ModelValidationError, match="input has 3 channels"):
        load_model(b.build())


@pytest.mark.parametrize(
    ("quant", "match"),
    [(Quant(0.05, 3), "must be symmetric"), (Quant([0.1, 0.2], [0, 0], 1), "per-axis scales")],
    ids=["zero-point", "scales-on-columns"],
)
def test_embedding_lookup_hybrid_tables_litert_refuses(quant: Quant, match: str) -> None:
    """LiteRT's Prepare refuses these (embedding_lookup.cc); so does the load."""
    b = ModelBuilder()
    table = b.const("t", np.ones([3, 2], np.int8), quant=quant)
    y = b.op(
        "EMBEDDING_LOOKUP",
        [b.input("ids", [2], "int32"), table],
        out_shape=[2, 2],
        out_dtype="float32",
        version=3,
    )
    b.output(y)
    with pytest.raises(ModelValidationError, match=match):
        load_model(b.build())


def _conv3d(x: list[int], w: list[int], bias: bool = True, **options: object):
    opts = {"padding": "SAME", "stride_d": 1, "stride_h": 1, "stride_w": 1, **options}
    code = 0 if opts["padding"] == "SAME" else 1
    dims = [
        out_size(
            x[1 + a],
            w[a],
            int(opts[f"stride_{k}"]),  # type: ignore[call-overload]
            int(opts.get(f"dilation_{k}_factor", 1)),  # type: ignore[call-overload]
            code,
        )
        for a, k in enumerate("dhw")
    ]

    def build(g: G) -> TensorRef:
        ins = [g.x(x), g.w(w)]
        if bias:
            ins.append(g.w([w[4]]))
        return g.op("CONV_3D", ins, [x[0], *dims, w[4]], opts)

    return build


CONV3D_GPU = Batch(
    "conv3d_as_2d",
    [
        Case("lambda_w1", _conv3d([1, 6, 6, 5, 1], [5, 5, 1, 1, 4], bias=False)),
        Case("frames_d1", _conv3d([2, 3, 7, 6, 3], [1, 3, 3, 3, 5], stride_h=2, padding="VALID")),
        Case("h1_dilated", _conv3d([1, 7, 4, 8, 2], [3, 1, 3, 2, 3], dilation_d_factor=2)),
        Case(
            "w1_strided_relu",
            _conv3d([1, 8, 9, 3, 2], [3, 3, 1, 2, 4], stride_d=2, fused_activation_function="RELU"),
        ),
    ],
)


@opencl
@pytest.mark.parametrize("case", CONV3D_GPU.ids())
def test_conv3d_with_a_unit_axis_runs_on_the_gpu(case: str) -> None:
    CONV3D_GPU.check(case)


CONV3D_DEPTH_GPU = Batch(
    "conv3d_by_depth",
    [
        Case("k333_same", _conv3d([1, 5, 6, 7, 3], [3, 3, 3, 3, 4])),
        Case(
            "depth_stride2_valid",
            _conv3d([1, 7, 5, 5, 2], [3, 2, 2, 2, 3], stride_d=2, padding="VALID"),
        ),
        # SAME over an even window, dilated: 2 rows of depth padding, split 1 / 1; the h and w
        # windows pad their odd row after
        Case("depth_dilated_even", _conv3d([1, 6, 5, 4, 2], [2, 2, 2, 2, 3], dilation_d_factor=2)),
        Case(
            "batch2_strided_relu6",
            _conv3d(
                [2, 4, 5, 4, 2],
                [2, 3, 2, 2, 3],
                bias=False,
                stride_h=2,
                stride_d=2,
                fused_activation_function="RELU6",
            ),
        ),
    ],
)


@opencl
@pytest.mark.parametrize("case", CONV3D_DEPTH_GPU.ids())
def test_conv3d_over_every_axis_runs_on_the_gpu(case: str) -> None:
    """torchvision's r3d_18 (3x3x3 windows) ran 20 CONV_3D on the CPU in 14 partitions; as
    one CONV_2D over the depth taps stacked as channels, against LiteRT's conv3d kernel."""
    CONV3D_DEPTH_GPU.check(case)


def test_conv3d_by_depth_is_one_conv2d_and_a_computed_filter_stays_on_the_cpu() -> None:
    from litekiln.compiler.partition import partition

    def model(filter_input: bool) -> bytes:
        b = ModelBuilder()
        w = np.ones([2, 2, 2, 2, 3], np.float32)
        y = b.op(
            "CONV_3D",
            [
                b.input("x", [1, 4, 4, 4, 2]),
                b.input("w", w.shape) if filter_input else b.const("w", w),
            ],
            out_shape=[1, 4, 4, 4, 3],
            options={"padding": "SAME", "stride_d": 1, "stride_h": 1, "stride_w": 1},
        )
        b.output(y)
        return b.build()

    graph = load_model(model(False)).main
    names = [op.name for op in graph.ops]
    assert names.count("CONV_2D") == 1 and "CONV_3D" not in names, names
    assert names.count("STRIDED_SLICE") == 2 and "CONCATENATION" in names, names
    assert partition(graph).cpu_reasons == {}
    graph = load_model(model(True)).main
    assert [op.name for op in graph.ops] == ["CONV_3D"]
    assert partition(graph).cpu_reasons == {0: "no GPU form in litekiln"}
