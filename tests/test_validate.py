"""The validating loader: every model LiteRT refuses to prepare is refused at load.

Each per-rule test builds a model (tests/tflite_builder.py) that breaks exactly one rule of
an op's kernel (or of LiteRT's interpreter), checks that litekiln refuses it at load with a
``ModelValidationError`` naming the op (index, name) and the rule, and that LiteRT refuses it
too (its builtin kernels, at construction, ``allocate_tensors`` or ``invoke``). Then: the
trial's cases (issue 17), the rules where litekiln is deliberately stricter than LiteRT
(each says what LiteRT does instead), the LiteRT behaviours litekiln copies (declared output
shapes and types replaced by the kernel's), the zoo models (untouched by validation), and a
reference that never lets a raw Python exception out.
"""

from __future__ import annotations

import faulthandler
import math
import os
from typing import Any

import numpy as np
import pytest
from tflite_builder import ModelBuilder, Quant, TensorSpec, single_op_model

import litekiln.ops  # noqa: F401  (registers the per-op checks with the loader)
from litekiln import Interpreter, LitekilnError, ModelError
from litekiln.errors import ModelValidationError
from litekiln.model import load_model
from litekiln.model.loader import MAX_TENSOR_BYTES

F32 = np.float32


def _litert_error(model: bytes) -> str:
    from ai_edge_litert.interpreter import Interpreter as LiteRT
    from ai_edge_litert.interpreter import OpResolverType

    try:
        li = LiteRT(
            model_content=model,
            experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
        )
        li.allocate_tensors()
        for d in li.get_input_details():
            li.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
        li.invoke()
    except (ValueError, RuntimeError) as exc:
        return str(exc) or type(exc).__name__
    return ""


def litert_refuses(model: bytes) -> str:
    """LiteRT's error for ``model`` (builtin kernels; zeros as inputs), "" if it runs it.

    Runs in a forked child: LiteRT aborts on some invalid models (a failed TFLITE_CHECK),
    which counts as a refusal ("crashed ...")."""
    import ai_edge_litert.interpreter  # noqa: F401  (imported once, before the fork)

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running the parent's atexit hooks
        os.close(read)
        faulthandler.disable()  # a LiteRT abort is an answer here, not a test failure
        try:
            os.write(write, _litert_error(model).encode()[:4000])
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        message = f.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return f"crashed (signal {os.WTERMSIG(status)})"
    return message


def refused(model: bytes, rule: str, op: int | None = None, name: str | None = None) -> str:
    """litekiln refuses ``model`` at load naming ``rule`` (and op ``op`` ``name``); LiteRT
    refuses it too. Returns litekiln's message."""
    with pytest.raises(ModelValidationError) as info:
        load_model(model)
    err = info.value
    assert err.rule == rule, str(err)
    assert f"[rule: {rule}]" in str(err)
    if op is not None:
        assert (err.op_index, err.op_name) == (op, name), str(err)
        assert f"op #{op} " in str(err) and (name or "") in str(err)
    assert litert_refuses(model), f"LiteRT runs the model litekiln refuses: {err}"
    return str(err)


def conv_model(
    x: list[int] | None = None,
    w: list[int] | None = None,
    options: dict[str, Any] | None = None,
    *,
    bias: int | None = 4,
    out: list[int] | None = None,
    x_dtype: str = "float32",
) -> bytes:
    """A CONV_2D model: input [1, 6, 6, 3], filter [4, 3, 3, 3], SAME, stride 1."""
    x = x or [1, 6, 6, 3]
    w = w or [4, 3, 3, 3]
    opts = {"padding": "SAME", "stride_w": 1, "stride_h": 1, **(options or {})}
    consts: dict[int, Any] = {1: np.ones(w, F32)}
    if bias is not None:
        consts[2] = np.zeros(bias, F32)
    return single_op_model(
        "CONV_2D",
        [TensorSpec(x, x_dtype)],
        opts,
        consts=consts,
        out_shape=out or [x[0], x[1], x[2], w[0]],
        out_dtype="float32",
    )


# -- counts, versions, types, ranks ----------------------------------------------------------


def test_wrong_input_count() -> None:
    model = single_op_model("ADD", [TensorSpec([2, 3]), TensorSpec([2, 3]), TensorSpec([2, 3])])
    msg = refused(model, "input-count", 0, "ADD")
    assert "3 inputs, the kernel takes 2" in msg


def test_conv_without_its_bias() -> None:
    refused(conv_model(bias=None), "input-count", 0, "CONV_2D")


def test_wrong_output_count() -> None:
    b = ModelBuilder()
    x = b.input("x", [2, 3])
    ys = b.op("RELU", [x], outputs=[b.tensor("y0", [2, 3]), b.tensor("y1", [2, 3])])
    b.output(*ys)
    refused(b.build(), "output-count", 0, "RELU")


def test_op_version_litert_has_no_kernel_for() -> None:
    model = single_op_model(
        "MEAN",
        [TensorSpec([2, 3])],
        {"keep_dims": True},
        consts={1: np.array([1], np.int32)},
        out_shape=[2, 1],
        version=4,
    )
    assert "versions 1-3" in refused(model, "op-version", 0, "MEAN")


def test_input_type_the_kernel_does_not_take() -> None:
    refused(conv_model(x_dtype="int32"), "dtype", 0, "CONV_2D")


def test_inputs_of_different_types() -> None:
    model = single_op_model("ADD", [TensorSpec([2, 3]), TensorSpec([2, 3], "int32")])
    refused(model, "dtype-mismatch", 0, "ADD")


def test_conv_input_rank() -> None:
    refused(conv_model(x=[6, 6, 3], out=[1, 6, 6, 4]), "rank", 0, "CONV_2D")


def test_complex64_tensor() -> None:
    """complex64 tensors load (RFFT2D makes them, litekiln.ops.spectral); an op that does
    not take them refuses them by its own type rule, as LiteRT's ADD does."""
    model = single_op_model("ADD", [TensorSpec([2], "complex64"), TensorSpec([2], "complex64")])
    with pytest.raises(ModelValidationError, match="complex64") as info:
        load_model(model)
    assert info.value.rule == "dtype"
    assert litert_refuses(model)


def test_complex128_tensor() -> None:
    model = single_op_model("ADD", [TensorSpec([2], "complex128"), TensorSpec([2], "complex128")])
    with pytest.raises(ModelValidationError, match="complex128") as info:
        load_model(model)
    assert info.value.rule == "tensor-dtype"


# -- conv family -----------------------------------------------------------------------------


def test_conv_filter_channels_do_not_divide_the_input() -> None:
    assert "filter-channels" in refused(conv_model(w=[4, 3, 3, 2]), "filter-channels", 0, "CONV_2D")


def test_conv_zero_size_dimension() -> None:
    refused(conv_model(x=[1, 0, 6, 3]), "empty-dimension", 0, "CONV_2D")


@pytest.mark.parametrize("key", ["stride_h", "stride_w", "dilation_h_factor", "dilation_w_factor"])
def test_conv_window_options_positive(key: str) -> None:
    refused(conv_model(options={key: 0}), "window", 0, "CONV_2D")


def test_conv_unknown_padding() -> None:
    refused(conv_model(options={"padding": 5}), "padding", 0, "CONV_2D")


def test_conv_valid_filter_larger_than_the_input() -> None:
    model = conv_model(x=[1, 2, 2, 3], w=[4, 5, 5, 3], options={"padding": "VALID"})
    refused(model, "window", 0, "CONV_2D")


def test_conv_bias_size() -> None:
    refused(conv_model(bias=3), "bias-size", 0, "CONV_2D")


def test_conv_options_of_another_op_read_as_zero() -> None:
    # LiteRT reads only Conv2DOptions; a Pool2DOptions table leaves stride 0.
    b = ModelBuilder()
    x = b.input("x", [1, 6, 6, 3])
    y = b.op("CONV_2D", [x, np.ones([4, 3, 3, 3], F32), np.zeros(4, F32)], out_shape=[1, 6, 6, 4])
    b.output(y)
    data = bytearray(b.build())
    model = load_model(bytes(data), validate=False)
    assert model.main.ops[0].options["stride_w"] == 0  # no options: every field zero
    refused(bytes(data), "window", 0, "CONV_2D")


def test_depthwise_filter_channels() -> None:
    model = single_op_model(
        "DEPTHWISE_CONV_2D",
        [TensorSpec([1, 5, 5, 3])],
        {"padding": "SAME", "stride_w": 1, "stride_h": 1, "depth_multiplier": 1},
        consts={1: np.ones([1, 3, 3, 4], F32), 2: np.zeros(4, F32)},
        out_shape=[1, 5, 5, 4],
    )
    refused(model, "filter-channels", 0, "DEPTHWISE_CONV_2D")


def test_fully_connected_weights_do_not_match_the_input() -> None:
    model = single_op_model(
        "FULLY_CONNECTED",
        [TensorSpec([2, 5])],
        {"keep_num_dims": True},
        consts={1: np.ones([3, 4], F32), 2: np.zeros(3, F32)},
        out_shape=[2, 3],
    )
    refused(model, "input-shape", 0, "FULLY_CONNECTED")


def test_fully_connected_activation_tanh() -> None:
    model = single_op_model(
        "FULLY_CONNECTED",
        [TensorSpec([2, 4])],
        {"fused_activation_function": "TANH"},
        consts={1: np.ones([3, 4], F32), 2: np.zeros(3, F32)},
        out_shape=[2, 3],
    )
    refused(model, "activation", 0, "FULLY_CONNECTED")


def test_transpose_conv_output_shape_and_input_disagree() -> None:
    model = single_op_model(
        "TRANSPOSE_CONV",
        [TensorSpec([1, 3, 3, 2])],
        {"padding": "SAME", "stride_w": 2, "stride_h": 2},
        consts={0: np.array([1, 9, 9, 4], np.int32), 1: np.ones([4, 3, 3, 2], F32)},
        out_shape=[1, 9, 9, 4],
        out_dtype="float32",
    )
    refused(model, "output-shape-value", 0, "TRANSPOSE_CONV")


# -- quantization ----------------------------------------------------------------------------


def int8_conv(
    w_quant: Quant,
    *,
    x_quant: Quant | None = None,
    out_quant: Quant | None = None,
    bias_quant: Quant | None = None,
) -> bytes:
    x_quant = x_quant or Quant(0.02, -3)
    return single_op_model(
        "CONV_2D",
        [TensorSpec([1, 4, 4, 3], "int8", x_quant)],
        {"padding": "SAME", "stride_w": 1, "stride_h": 1},
        consts={
            1: TensorSpec([2, 1, 1, 3], "int8", w_quant, data=np.ones([2, 1, 1, 3], np.int8)),
            2: TensorSpec([2], "int32", bias_quant or Quant(2e-4, 0), data=np.zeros(2, np.int32)),
        },
        out_shape=[1, 4, 4, 2],
        out_quant=out_quant or Quant(0.05, 1),
        version=3,
    )


def test_per_tensor_quantization_with_three_scales() -> None:
    b = ModelBuilder()
    x = b.input("x", [2, 2], "int8", quant=Quant([0.1, 0.2, 0.3], [0, 0, 0], axis=0))
    b.output(b.op("RELU", [x]))
    with pytest.raises(ModelValidationError, match="3 quantization scales") as info:
        load_model(b.build())
    assert info.value.rule == "quantization-scale-count"
    assert litert_refuses(b.build())


def test_quantized_dimension_out_of_range() -> None:
    msg = refused(int8_conv(Quant([0.01, 0.02], [0, 0], axis=2**31 - 1)), "quantized-dimension")
    assert "quantized dimension 2147483647" in msg


def test_per_tensor_quantization_with_a_huge_quantized_dimension() -> None:
    # LiteRT checks the dimension even of a per-tensor quantization (one scale).
    refused(int8_conv(Quant(0.01, 0, axis=2**31 - 1)), "quantized-dimension")


def test_scales_without_zero_points() -> None:
    b = ModelBuilder()
    x = b.input("x", [2, 2], "int8", quant=Quant(0.1, 0))
    b.output(b.op("RELU", [x]))
    model = load_model(b.build(), validate=False)
    assert model.main.tensors[0].quantization is not None
    # Remove the zero-point vector with the object API, as a converter bug would.
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    m = schema.ModelT.InitFromPackedBuf(b.build(), 0)
    m.subgraphs[0].tensors[0].quantization.zeroPoint = None
    fb = flatbuffers.Builder(256)
    fb.Finish(m.Pack(fb), file_identifier=b"TFL3")
    with pytest.raises(ModelValidationError, match="no zero points") as info:
        load_model(bytes(fb.Output()))
    assert info.value.rule == "quantization-zero-points"
    assert litert_refuses(bytes(fb.Output()))


def test_per_channel_filter_zero_points_must_be_zero() -> None:
    refused(int8_conv(Quant([0.01, 0.02], [0, 3], axis=0)), "quantization-zero-point", 0, "CONV_2D")


def test_per_channel_scales_need_an_int8_filter_dimension() -> None:
    # Two scales along dimension 3 (3 channels there): the interpreter's scale-count rule.
    refused(int8_conv(Quant([0.01, 0.02], [0, 0], axis=3)), "quantization-scale-count")


def test_bias_scale_far_from_input_times_filter() -> None:
    # uint8 conv: bias scale must be input scale x filter scale (within 2% of the output).
    model = single_op_model(
        "CONV_2D",
        [TensorSpec([1, 4, 4, 3], "uint8", Quant(0.02, 128))],
        {"padding": "SAME", "stride_w": 1, "stride_h": 1},
        consts={
            1: TensorSpec(
                [2, 1, 1, 3], "uint8", Quant(0.01, 128), data=np.full([2, 1, 1, 3], 130, np.uint8)
            ),
            2: TensorSpec([2], "int32", Quant(1.0, 0), data=np.zeros(2, np.int32)),
        },
        out_shape=[1, 4, 4, 2],
        out_quant=Quant(0.05, 128),
        version=1,
    )
    refused(model, "bias-scale", 0, "CONV_2D")


def test_activation_clamp_overflows_int32() -> None:
    model = single_op_model(
        "ADD",
        [TensorSpec([4], "int8", Quant(0.1, 0)), TensorSpec([4], "int8", Quant(0.1, 0))],
        {"fused_activation_function": "RELU6"},
        out_quant=Quant(1e-12, 0),
    )
    refused(model, "activation-range", 0, "ADD")


def test_softmax_int8_output_parameters() -> None:
    model = single_op_model(
        "SOFTMAX",
        [TensorSpec([1, 5], "int8", Quant(0.1, 0))],
        {"beta": 1.0},
        out_quant=Quant(0.1, 0),
    )
    refused(model, "quantization-params", 0, "SOFTMAX")


def test_per_channel_fc_weights_with_a_zero_point() -> None:
    """LiteRT's per-channel FULLY_CONNECTED never reads its weights' zero points (it takes them
    as 0): weights with another are refused, naming the channel, where the float view would
    compute something else than LiteRT (the differential fuzzer's case 1840, seed 31)."""
    zps = [0, 0, -128, 0]
    w = TensorSpec(
        [4, 8], "int8", Quant([0.01, 0.02, 0.03, 0.04], zps, 0),
        data=np.arange(32, dtype=np.int8).reshape(4, 8),
    )  # fmt: skip
    model = single_op_model(
        "FULLY_CONNECTED",
        [TensorSpec([1, 8], "int8", Quant(0.1, 3))],
        consts={1: w},
        out_shape=[1, 4],
        out_quant=Quant(0.5, -2),
        version=4,
    )
    with pytest.raises(ModelValidationError, match="-128 at channel 2") as info:
        load_model(model)
    assert info.value.rule == "quantization-zero-point"
    zps[2] = 0  # symmetric weights load
    w.quant = Quant([0.01, 0.02, 0.03, 0.04], zps, 0)
    load_model(single_op_model("FULLY_CONNECTED", [TensorSpec([1, 8], "int8", Quant(0.1, 3))],
                               consts={1: w}, out_shape=[1, 4], out_quant=Quant(0.5, -2),
                               version=4))  # fmt: skip


def test_option_with_an_unknown_tensor_type() -> None:
    model = single_op_model(
        "FULLY_CONNECTED",
        [TensorSpec([1, 4])],
        {"quantized_bias_type": 99},
        consts={1: np.ones([2, 4], F32)},
        out_shape=[1, 2],
    )
    refused(model, "option-tensor-type")


# -- shapes and options of the other families --------------------------------------------------


def test_binary_shapes_do_not_broadcast() -> None:
    refused(single_op_model("ADD", [TensorSpec([2, 3]), TensorSpec([2, 4])]), "broadcast", 0, "ADD")


def test_concatenation_axis_out_of_range() -> None:
    model = single_op_model(
        "CONCATENATION", [TensorSpec([2, 3]), TensorSpec([2, 3])], {"axis": 2}, out_shape=[2, 6]
    )
    refused(model, "axis", 0, "CONCATENATION")


def test_concatenation_inputs_differ_off_the_axis() -> None:
    model = single_op_model(
        "CONCATENATION", [TensorSpec([2, 3]), TensorSpec([3, 3])], {"axis": 1}, out_shape=[2, 6]
    )
    refused(model, "input-shape", 0, "CONCATENATION")


def test_reshape_element_count() -> None:
    model = single_op_model(
        "RESHAPE", [TensorSpec([2, 3])], consts={1: np.array([4, 2], np.int32)}, out_shape=[4, 2]
    )
    refused(model, "new-shape", 0, "RESHAPE")


def test_strided_slice_zero_stride() -> None:
    model = single_op_model(
        "STRIDED_SLICE",
        [TensorSpec([4, 4])],
        consts={
            1: np.array([0, 0], np.int32),
            2: np.array([4, 4], np.int32),
            3: np.array([1, 0], np.int32),
        },
        out_shape=[4, 4],
    )
    refused(model, "slice", 0, "STRIDED_SLICE")


def test_split_does_not_divide() -> None:
    model = single_op_model(
        "SPLIT",
        [TensorSpec([2, 5])],
        {"num_splits": 2},
        consts={0: np.array(1, np.int32)},
        outputs=[TensorSpec([2, 2]), TensorSpec([2, 3])],
    )
    refused(model, "split", 0, "SPLIT")


def test_depth_to_space_block_size() -> None:
    model = single_op_model(
        "DEPTH_TO_SPACE", [TensorSpec([1, 2, 2, 6])], {"block_size": 2}, out_shape=[1, 4, 4, 1]
    )
    refused(model, "block-size", 0, "DEPTH_TO_SPACE")


def test_resize_bilinear_align_corners_and_half_pixel() -> None:
    model = single_op_model(
        "RESIZE_BILINEAR",
        [TensorSpec([1, 4, 4, 1])],
        {"align_corners": True, "half_pixel_centers": True},
        consts={1: np.array([8, 8], np.int32)},
        out_shape=[1, 8, 8, 1],
        version=3,
    )
    refused(model, "option-value", 0, "RESIZE_BILINEAR")


def test_mean_axis_out_of_range() -> None:
    model = single_op_model(
        "MEAN",
        [TensorSpec([2, 3])],
        {"keep_dims": True},
        consts={1: np.array([2], np.int32)},
        out_shape=[2, 1],
    )
    refused(model, "axis", 0, "MEAN")


def test_pool_stride_zero() -> None:
    model = single_op_model(
        "MAX_POOL_2D",
        [TensorSpec([1, 4, 4, 1])],
        {"padding": "VALID", "stride_w": 0, "stride_h": 1, "filter_width": 2, "filter_height": 2},
        out_shape=[1, 3, 3, 1],
    )
    refused(model, "window", 0, "MAX_POOL_2D")


def test_gather_axis_out_of_range() -> None:
    model = single_op_model(
        "GATHER",
        [TensorSpec([3, 4])],
        {"axis": 2},
        consts={1: np.array([0, 1], np.int32)},
        out_shape=[3, 2],
    )
    refused(model, "axis", 0, "GATHER")


# -- the trial's cases (issue 17) ------------------------------------------------------------


def test_trial_input_declared_at_300_tib() -> None:
    """LiteRT lets a 300 TiB input through allocate_tensors; litekiln refuses it by name."""
    model = single_op_model("RELU", [TensorSpec([300, 1024, 1024, 1024 // 4, 1024])])
    with pytest.raises(ModelValidationError) as info:
        load_model(model)
    err = info.value
    assert err.rule == "tensor-size" and "'in0'" in str(err)
    assert math.prod([300, 1024, 1024, 256, 1024]) * 4 > MAX_TENSOR_BYTES


def test_trial_zero_size_dimension_in_conv_is_no_zero_division() -> None:
    refused(conv_model(x=[1, 6, 6, 0]), "empty-dimension", 0, "CONV_2D")
    # Loaded without the checks, the reference still answers with a litekiln error (it
    # divided by the 0 groups of a 0-channel input).
    model = load_model(conv_model(x=[1, 6, 6, 0]), validate=False)
    from litekiln.reference import run_graph

    with pytest.raises(LitekilnError):
        run_graph(model.main, {model.main.inputs[0]: np.zeros([1, 6, 6, 0], F32)})


def test_trial_pool_options_of_the_wrong_table_are_zero_not_a_key_error() -> None:
    """MAX_POOL_2D given Conv2DOptions: LiteRT reads zeros (stride 0, refused); litekiln's
    options hold every Pool2DOptions key (the compiler's KeyError 'filter_height')."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    model = single_op_model(
        "MAX_POOL_2D",
        [TensorSpec([1, 4, 4, 1])],
        {"padding": "VALID", "stride_w": 1, "stride_h": 1, "filter_width": 2, "filter_height": 2},
        out_shape=[1, 3, 3, 1],
    )
    m = schema.ModelT.InitFromPackedBuf(model, 0)
    op = m.subgraphs[0].operators[0]
    op.builtinOptionsType, op.builtinOptions = (
        schema.BuiltinOptions.Conv2DOptions,
        (schema.Conv2DOptionsT(padding=1, strideW=1, strideH=1)),
    )
    fb = flatbuffers.Builder(256)
    fb.Finish(m.Pack(fb), file_identifier=b"TFL3")
    bad = bytes(fb.Output())
    options = load_model(bad, validate=False).main.ops[0].options
    assert options["filter_height"] == 0 and options["stride_h"] == 0
    refused(bad, "window", 0, "MAX_POOL_2D")


# -- deliberately stricter than LiteRT (LiteRT runs these; each says what it computes) ----------


def test_stricter_input_read_before_it_is_written() -> None:
    """LiteRT runs ops in file order: the first reads the second's output uninitialised."""
    b = ModelBuilder()
    x = b.input("x", [2])
    t = b.tensor("t", [2])
    y = b.op("ADD", [x, t])
    b.op("RELU", [x], outputs=[t])
    b.output(y)
    with pytest.raises(ModelValidationError) as info:
        load_model(b.build())
    assert info.value.rule == "input-not-computed" and "'t'" in str(info.value)
    assert litert_refuses(b.build()) == ""


def test_stricter_zero_point_outside_the_type() -> None:
    """LiteRT computes with an int8 zero point of 200; litekiln refuses the parameters."""
    model = single_op_model(
        "ADD",
        [TensorSpec([4], "int8", Quant(0.1, 200)), TensorSpec([4], "int8", Quant(0.1, 0))],
        out_quant=Quant(0.1, 0),
    )
    with pytest.raises(ModelValidationError) as info:
        load_model(model)
    assert info.value.rule == "quantization-zero-point"
    assert litert_refuses(model) == ""


def test_stricter_non_finite_scale() -> None:
    model = single_op_model(
        "ADD",
        [TensorSpec([4], "int8", Quant(float("nan"), 0)), TensorSpec([4], "int8", Quant(0.1, 0))],
        out_quant=Quant(0.1, 0),
    )
    with pytest.raises(ModelValidationError) as info:
        load_model(model)
    assert info.value.rule == "quantization-scale"


def test_stricter_transpose_perm_not_a_permutation() -> None:
    """LiteRT 2.3 transposes with a repeated axis (reading along repeated strides)."""
    model = single_op_model(
        "TRANSPOSE",
        [TensorSpec([2, 3, 4])],
        consts={1: np.array([0, 0, 1], np.int32)},
        out_shape=[2, 2, 3],
    )
    with pytest.raises(ModelValidationError) as info:
        load_model(model)
    assert info.value.rule == "perm"


def test_stricter_op_writing_a_graph_input() -> None:
    """LiteRT 2.3 runs an op in place on a graph input; litekiln's values are written once."""
    b = ModelBuilder()
    x = b.input("x", [2])
    b.op("RELU", [x], outputs=[x])
    b.output(x)
    with pytest.raises(ModelValidationError) as info:
        load_model(b.build())
    assert info.value.rule == "output-written-twice"
    assert litert_refuses(b.build()) == ""


# -- what LiteRT's kernels decide, litekiln takes --------------------------------------------


def test_declared_output_shape_is_replaced_by_the_computed_one() -> None:
    model = conv_model(out=[1, 3, 3, 4])  # declared wrong; the conv computes [1, 6, 6, 4]
    loaded = load_model(model)
    out = loaded.main.tensors[loaded.main.outputs[0]]
    assert out.shape == (1, 6, 6, 4)
    interp = Interpreter(model_content=model, device="reference")
    assert list(interp.get_output_details()[0]["shape"]) == [1, 6, 6, 4]
    assert interp.run([np.ones([1, 6, 6, 3], F32)])[0].shape == (1, 6, 6, 4)
    assert litert_refuses(model) == ""


def test_output_type_set_by_the_kernel() -> None:
    model = single_op_model("ADD", [TensorSpec([2]), TensorSpec([2])], out_dtype="int32")
    assert load_model(model).main.tensors[2].dtype == np.float32  # ADD sets its output's type
    assert litert_refuses(model) == ""


def test_unknown_fused_activation_reads_as_none() -> None:
    model = single_op_model(
        "ADD", [TensorSpec([2]), TensorSpec([2])], {"fused_activation_function": 9}
    )
    assert load_model(model).main.ops[0].options["fused_activation_function"] == 0
    interp = Interpreter(model_content=model, device="reference")
    x = np.array([-1.0, 2.0], F32)
    assert interp.run([x, x])[0].tolist() == [-2.0, 4.0]
    assert litert_refuses(model) == ""


def test_larger_bias_buffer_still_loads() -> None:
    # Buffers larger than the shape needs are read from their start (LiteRT's rule).
    b = ModelBuilder()
    x = b.input("x", [1, 2, 2, 1])
    w = b.const("w", np.ones([1, 1, 1, 1], F32))
    big = b.const("big", np.zeros(5, F32))
    bias = b.tensor("bias", [1], buffer_index=2)  # big's buffer (5 floats) read as one
    b.output(
        b.op(
            "CONV_2D",
            [x, w, bias],
            out_shape=[1, 2, 2, 1],
            options={"padding": "SAME", "stride_w": 1, "stride_h": 1},
        ),
        big,
    )
    model = load_model(b.build())
    assert model.main.tensors[bias.index].data is not None


# -- valid models are untouched; the reference stays inside litekiln's errors ------------------


@pytest.mark.zoo
def test_zoo_models_validate_without_changes() -> None:
    from conftest import zoo_model

    from litekiln.zoo import ZOO

    for name in ZOO:
        path = zoo_model(name)
        raw = load_model(path, validate=False)
        checked = load_model(path)
        for a, b in zip(raw.main.tensors, checked.main.tensors, strict=True):
            assert (a.shape, a.dtype) == (b.shape, b.dtype), (name, a.name)


def test_run_errors_are_litekiln_errors() -> None:
    """A model loaded without the checks: what the reference cannot run is a ModelError."""
    model = load_model(conv_model(w=[4, 3, 3, 2]), validate=False)
    from litekiln.reference import run_graph

    with pytest.raises(ModelError, match="cannot execute|channels"):
        run_graph(model.main, {model.main.inputs[0]: np.zeros([1, 6, 6, 3], F32)})


def test_ieee_results_of_the_reference_raise_no_numpy_warnings() -> None:
    """LOG of zeros and a CAST of its -inf to int32 (MPNet's relative position buckets, at
    load and on the CPU): the values are IEEE's (LiteRT's too), and numpy's "divide by zero"
    and "invalid value" warnings do not reach the user."""
    import warnings

    x = np.array([[0.0, 1.0, -1.0]], np.float32)
    log = single_op_model("LOG", [TensorSpec([1, 3])])
    cast = single_op_model("CAST", [TensorSpec([1, 3])], out_dtype="int32")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        interp = Interpreter(model_content=log, device="reference")
        (y,) = interp.run([x])
        assert y[0, 0] == -np.inf and y[0, 1] == 0.0 and np.isnan(y[0, 2])
        interp = Interpreter(model_content=cast, device="reference")
        (z,) = interp.run([np.full((1, 3), -np.inf, np.float32)])
        assert z.dtype == np.int32
    # (with the warnings as errors, the same numpy calls do fail: the test can see them)
    with warnings.catch_warnings(), pytest.raises(RuntimeWarning):
        warnings.simplefilter("error")
        np.log(x)
