"""Loader tests: real MediaPipe models against LiteRT, built models for folding and sparsity,
the model token, and every way a file can be bad (each must be a ModelError that says why)."""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

import farmhash
import numpy as np
import pytest
from tflite_builder import DENSE, SPARSE_CSR, ModelBuilder, Quant, Sparsity, encode_sparse

import litekiln.ops  # noqa: F401  (the per-op checks run at load, as in every real use)
from litekiln import ModelError
from litekiln.model import load_model, model_token

#: Where the MediaPipe models are found when the zoo has not been made (a mediapipe checkout).
MEDIAPIPE_MODULES = Path(os.environ.get("LITEKILN_MEDIAPIPE_MODULES", "/tmp/mp/mediapipe/modules"))

MEDIAPIPE_MODELS = [
    "face_detection_short_range",
    "face_detection_full_range_sparse",
    "face_landmark",
    "hand_landmark_lite",
    "palm_detection_lite",
    "pose_landmark_full",
    "selfie_segmentation",
]


def find_model(name: str) -> Path | None:
    """A MediaPipe model from the zoo (scripts/make_zoo.py) or a mediapipe checkout."""
    try:
        from litekiln.zoo import ZOO, zoo_path

        if name in ZOO:
            return zoo_path(name)
    except (ImportError, FileNotFoundError):
        pass
    hits = sorted(glob.glob(str(MEDIAPIPE_MODULES / "*" / f"{name}.tflite")))
    return Path(hits[0]) if hits else None


@pytest.fixture(params=MEDIAPIPE_MODELS)
def mediapipe_model(request: pytest.FixtureRequest) -> Path:
    path = find_model(request.param)
    if path is None:
        pytest.skip(f"{request.param}.tflite not found: run scripts/make_zoo.py")
    return path


@pytest.fixture
def sparse_model() -> Path:
    path = find_model("face_detection_full_range_sparse")
    if path is None:
        pytest.skip("face_detection_full_range_sparse.tflite not found: run scripts/make_zoo.py")
    return path


def litert(model: bytes | Path, *, preserve_all_tensors: bool = False) -> Any:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    kw = {"model_path": str(model)} if isinstance(model, Path) else {"model_content": model}
    return Interpreter(
        **kw,
        experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
        experimental_preserve_all_tensors=preserve_all_tensors,
    )


def assert_tensor_details_match(model_bytes_or_path: bytes | Path) -> None:
    """Every tensor of subgraph 0: name, shape, signature, dtype, quantization as in LiteRT."""
    model = load_model(model_bytes_or_path)
    details = litert(model_bytes_or_path).get_tensor_details()
    tensors = model.main.tensors
    assert len(details) == len(tensors)
    for d in details:
        t = tensors[d["index"]]
        where = f"tensor {t.index} {t.name!r}"
        assert t.name == d["name"], where
        assert t.shape == tuple(d["shape"]), where
        assert t.shape_signature == tuple(d["shape_signature"]), where
        assert t.dtype == np.dtype(d["dtype"]), where
        qp = d["quantization_parameters"]
        if t.quantization is None:
            assert qp["scales"].size == 0, where
            continue
        np.testing.assert_array_equal(t.quantization.scale, qp["scales"], err_msg=where)
        np.testing.assert_array_equal(t.quantization.zero_point, qp["zero_points"], err_msg=where)
        if t.quantization.per_channel:
            assert t.quantization.axis == qp["quantized_dimension"], where


# -- real models ----------------------------------------------------------------------------


def test_mediapipe_tensor_details_match_litert(mediapipe_model: Path) -> None:
    assert_tensor_details_match(mediapipe_model)


def test_mediapipe_graph_structure(mediapipe_model: Path) -> None:
    from ai_edge_litert.interpreter import Interpreter

    model = load_model(mediapipe_model)
    assert model.name == mediapipe_model.stem
    assert model.version == 3
    assert model.nbytes == mediapipe_model.stat().st_size
    it = Interpreter(model_path=str(mediapipe_model))
    assert model.main.inputs == [d["index"] for d in it.get_input_details()]
    assert model.main.outputs == [d["index"] for d in it.get_output_details()]
    # Every input of a live op is a graph input, a constant or the output of an earlier op.
    available = set(model.main.inputs) | {t.index for t in model.main.tensors if t.is_constant}
    for op in model.main.live_ops():
        missing = [t for t in op.inputs if t >= 0 and t not in available]
        assert not missing, f"{op.describe()} reads tensors {missing} before they are computed"
        available.update(op.outputs)


def test_mediapipe_folded_constants_equal_litert(mediapipe_model: Path) -> None:
    """Each folded DEQUANTIZE/DENSIFY output is exactly what LiteRT's kernels compute."""
    model = load_model(mediapipe_model)
    folded = [op for op in model.main.ops if op.folded]
    if not folded:
        pytest.skip("no constant DEQUANTIZE/DENSIFY in this model")
    it = litert(mediapipe_model, preserve_all_tensors=True)
    try:
        it.allocate_tensors()
        for d in it.get_input_details():
            it.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
        it.invoke()
    except RuntimeError as exc:  # custom ops only MediaPipe's resolver has
        pytest.skip(f"LiteRT cannot run this model: {exc}")
    for op in folded:
        out = model.main.tensors[op.outputs[0]]
        np.testing.assert_array_equal(out.data, it.get_tensor(out.index), err_msg=op.describe())
        assert out.data.dtype == out.dtype


def test_real_sparse_model_densified(sparse_model: Path) -> None:
    model = load_model(sparse_model)
    sparse = [t for t in model.main.tensors if t.was_sparse]
    assert len(sparse) == 46
    densify = [op for op in model.main.ops if op.name == "DENSIFY"]
    assert densify and all(op.folded for op in densify)
    it = litert(sparse_model, preserve_all_tensors=True)
    it.allocate_tensors()
    it.set_tensor(
        it.get_input_details()[0]["index"], np.zeros(it.get_input_details()[0]["shape"], np.float32)
    )
    it.invoke()
    for op in densify:
        src, dst = (model.main.tensors[op.inputs[0]], model.main.tensors[op.outputs[0]])
        assert src.was_sparse and src.data.shape == src.shape
        np.testing.assert_array_equal(src.data, it.get_tensor(dst.index), err_msg=src.name)
        np.testing.assert_array_equal(dst.data, src.data)


# -- folding and sparsity on built models ---------------------------------------------------


def test_fp16_and_int8_dequantize_folded() -> None:
    rng = np.random.default_rng(0)
    w16 = rng.normal(size=(2, 3)).astype(np.float16)
    wq = rng.integers(-128, 128, size=(2, 3)).astype(np.int8)
    q = Quant([0.1, 0.2, 0.3], [0, 1, -1], axis=1)
    b = ModelBuilder()
    x = b.input("x", [2, 3])
    f16 = b.op("DEQUANTIZE", [b.const("w16", w16)], out_dtype="float32", version=3)
    fq = b.op("DEQUANTIZE", [b.const("wq", wq, quant=q)], out_dtype="float32", version=2)
    y = b.op("ADD", [b.op("ADD", [x, f16]), fq])
    b.output(y)
    data = b.build()
    model = load_model(data)
    ops = model.main.ops
    assert [op.folded for op in ops] == [True, True, False, False]
    assert [op.name for op in model.main.live_ops()] == ["ADD", "ADD"]
    np.testing.assert_array_equal(model.main.tensors[f16.index].data, w16.astype(np.float32))
    expected_q = (wq.astype(np.float32) - np.array([0, 1, -1])) * np.float32([0.1, 0.2, 0.3])
    np.testing.assert_allclose(model.main.tensors[fq.index].data, expected_q, rtol=1e-6)
    assert model.main.tensors[fq.index].dtype == np.float32
    # And LiteRT agrees with the folded values.
    it = litert(data)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], np.zeros((2, 3), np.float32))
    it.invoke()
    got = it.get_tensor(it.get_output_details()[0]["index"])
    np.testing.assert_allclose(got, w16.astype(np.float32) + expected_q, rtol=1e-6)


def test_dequantize_of_activation_not_folded() -> None:
    b = ModelBuilder()
    x = b.input("x", [4], "int8", quant=Quant(0.5, 0))
    b.output(b.op("DEQUANTIZE", [x], out_dtype="float32", out_quant=None))
    model = load_model(b.build())
    assert not model.main.ops[0].folded


def test_quantized_tensor_details_match_litert() -> None:
    rng = np.random.default_rng(1)
    b = ModelBuilder()
    x = b.input("x", [1, 4, 4, 3], "int8", quant=Quant(0.02, -3))
    w = b.const(
        "w",
        rng.integers(-127, 128, (5, 1, 1, 3)).astype(np.int8),
        quant=Quant(rng.uniform(0.001, 0.01, 5).tolist(), [0] * 5, axis=0),
    )
    bias = b.const("bias", np.arange(5, dtype=np.int32), quant=Quant([1e-4] * 5, [0] * 5))
    y = b.op(
        "CONV_2D",
        [x, w, bias],
        out_shape=[1, 4, 4, 5],
        out_quant=Quant(0.05, 7),
        options={"padding": "VALID", "stride_w": 1, "stride_h": 1},
        version=3,
    )
    b.output(y)
    assert_tensor_details_match(b.build())


SPARSITIES = {
    "csr_last": (Sparsity(), (6, 8)),
    "csr_both": (Sparsity(formats=[SPARSE_CSR, SPARSE_CSR]), (5, 7)),
    "column_major": (Sparsity(formats=[DENSE, SPARSE_CSR], traversal_order=[1, 0]), (4, 6)),
    "block_1x4": (
        Sparsity(formats=[DENSE, SPARSE_CSR, DENSE], block_map=[1], block_size=[4]),
        (4, 8),
    ),
    "block_2x2": (
        Sparsity(formats=[DENSE, SPARSE_CSR, DENSE, DENSE], block_map=[0, 1], block_size=[2, 2]),
        (4, 6),
    ),
    "rank3_uint16": (Sparsity(formats=[DENSE, DENSE, SPARSE_CSR], index_dtype="uint16"), (3, 4, 5)),
    "rank3_uint8": (
        Sparsity(formats=[DENSE, SPARSE_CSR, SPARSE_CSR], index_dtype="uint8"),
        (2, 3, 4),
    ),
    # (An all-zero sparse constant has an empty buffer, which LiteRT too reads as "not a
    # constant", so the smallest valid case is one non-zero value.)
    "one_nonzero": (Sparsity(formats=[SPARSE_CSR, SPARSE_CSR]), (3, 4)),
}


@pytest.mark.parametrize("case", list(SPARSITIES))
@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
def test_sparse_constant_densified(case: str, dtype: str) -> None:
    sparsity, shape = SPARSITIES[case]
    rng = np.random.default_rng(len(case))
    dense = (rng.normal(size=shape) * 10).astype(dtype)
    dense[rng.random(shape) < 0.6] = 0
    if case.startswith("block"):
        dense[: shape[0] // 2] = 0  # whole zero blocks, so the block level has something to skip
    if case == "one_nonzero":
        dense[...] = 0
        dense[1, 2] = 5
    # Integer ADD needs quantization parameters (LiteRT aborts without them).
    quant = Quant(1.0, 0) if dtype == "int8" else None
    b = ModelBuilder()
    x = b.input("x", list(shape), dtype, quant=quant)
    w = b.const("w", dense, sparsity=sparsity, quant=quant)
    b.output(b.op("ADD", [x, b.op("DENSIFY", [w])]))
    data = b.build()
    model = load_model(data)
    tensor = model.main.tensors[w.index]
    assert tensor.was_sparse
    assert tensor.data.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(tensor.data, dense)
    assert model.main.ops[0].folded
    # The encoding really is sparse where it can be, and LiteRT reads it the same way.
    if case == "csr_both":
        assert encode_sparse(dense, sparsity).values.size == np.count_nonzero(dense)
    it = litert(data)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], np.zeros(shape, dtype))
    it.invoke()
    np.testing.assert_array_equal(it.get_tensor(it.get_output_details()[0]["index"]), dense)


# -- token ----------------------------------------------------------------------------------


def small_model() -> bytes:
    b = ModelBuilder()
    x = b.input("x", [1, 4])
    b.output(b.op("RELU", [x]))
    return b.build()


def test_model_token_is_farmhash_fingerprint64_hex(tmp_path: Path) -> None:
    data = small_model()
    model = load_model(data)
    assert model.token == f"{farmhash.fingerprint64(data):016x}"
    assert len(model.token) == 16 and model.token == model.token.lower()
    # Fingerprint64 is a fixed function: the empty string's value is FarmHash's constant k2.
    assert model_token(b"") == "9ae16a3b2f90404f"
    path = tmp_path / "m.tflite"
    path.write_bytes(data)
    assert load_model(path).token == model.token
    other = ModelBuilder("another description")
    other.output(other.op("RELU", [other.input("x", [1, 4])]))
    assert load_model(other.build()).token != model.token


def test_user_token_overrides() -> None:
    model = load_model(small_model(), token="my-model-v7")
    assert model.token == "my-model-v7"


def test_path_name_and_source_types(tmp_path: Path) -> None:
    data = small_model()
    path = tmp_path / "tiny.tflite"
    path.write_bytes(data)
    assert load_model(path).name == "tiny"
    assert load_model(str(path), name="x").name == "x"
    assert load_model(bytearray(data)).token == load_model(memoryview(data)).token


def test_signature_defs_and_subgraphs() -> None:
    b = ModelBuilder()
    cond = b.input("cond", [], "bool")
    x = b.input("x", [2])
    then = b.subgraph("then")
    then.output(then.op("NEG", [then.input("x", [2])]))
    other = b.subgraph("else")
    other.output(other.op("RELU", [other.input("x", [2])]))
    y = b.op(
        "IF",
        [cond, x],
        out_shape=[2],
        out_dtype="float32",
        options={"then_subgraph_index": 1, "else_subgraph_index": 2},
    )
    b.output(y)
    b.signature("serving_default", {"cond": cond, "x": x}, {"y": y})
    model = load_model(b.build())
    assert [sg.name for sg in model.subgraphs] == ["main", "then", "else"]
    assert model.main.ops[0].options == {"then_subgraph_index": 1, "else_subgraph_index": 2}
    (sig,) = model.signatures
    assert (sig.key, sig.subgraph_index, sig.inputs, sig.outputs) == (
        "serving_default",
        0,
        {"cond": 0, "x": 1},
        {"y": y.index},
    )


# -- bad files ------------------------------------------------------------------------------


def assert_model_error(source: object, *fragments: str) -> ModelError:
    with pytest.raises(ModelError) as info:
        load_model(source)  # type: ignore[arg-type]
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return info.value


def test_empty_file(tmp_path: Path) -> None:
    assert_model_error(b"", "empty")
    path = tmp_path / "empty.tflite"
    path.write_bytes(b"")
    assert_model_error(path, "empty: empty file")


def test_missing_file_and_directory(tmp_path: Path) -> None:
    assert_model_error(tmp_path / "nope.tflite", "no such model file")
    assert_model_error(tmp_path, "directory")


@pytest.mark.parametrize(
    ("data", "hint"),
    [
        (b"hello, this is plain text and not a model", "not a TFLite model"),
        (b"PK\x03\x04" + bytes(40), "zip"),
        (b"\x89HDF\r\n\x1a\n" + bytes(40), "HDF5"),
        (b"\x08\x01\x12\x04abcd" + bytes(40), "protobuf"),
        (b"\x00\x01", "truncated"),
    ],
)
def test_not_a_flatbuffer(data: bytes, hint: str) -> None:
    assert_model_error(data, hint)


def test_wrong_file_identifier() -> None:
    data = ModelBuilder().build(file_identifier=b"TFL2")
    assert_model_error(data, "file identifier is b'TFL2'", "expected b'TFL3'")


def test_root_offset_past_end() -> None:
    data = bytearray(small_model())
    data[0:4] = (len(data) + 100).to_bytes(4, "little")
    assert_model_error(bytes(data), "root table offset")


# Where a built model is cut. (Cutting only the last byte or two can leave a valid file: the
# flatbuffer ends with a string's NUL terminator and alignment padding.)
TRUNCATIONS = {
    "8": lambda n: 8,
    "12": lambda n: 12,
    "16": lambda n: 16,
    "32": lambda n: 32,
    "64": lambda n: 64,
    "n/4": lambda n: n // 4,
    "n/3": lambda n: n // 3,
    "n/2": lambda n: n // 2,
    "2n/3": lambda n: 2 * n // 3,
    "3n/4": lambda n: 3 * n // 4,
    "n-16": lambda n: n - 16,
    "n-4": lambda n: n - 4,
}


@pytest.mark.parametrize("cut", list(TRUNCATIONS))
def test_truncated_built_model(cut: str) -> None:
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    x = b.input("x", [1, 8, 8, 3])
    w = b.const("w", rng.normal(size=(4, 3, 3, 3)).astype(np.float32))
    y = b.op(
        "CONV_2D",
        [x, w, b.const("b", np.zeros(4, np.float32))],
        out_shape=[1, 8, 8, 4],
        options={"padding": "SAME", "stride_w": 1, "stride_h": 1},
    )
    b.output(y)
    data = b.build()
    assert_model_error(data[: TRUNCATIONS[cut](len(data))])


@pytest.mark.parametrize("fraction", [0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.9999])
def test_truncated_real_model(fraction: float) -> None:
    path = find_model("face_detection_short_range")
    if path is None:
        pytest.skip("face_detection_short_range.tflite not found: run scripts/make_zoo.py")
    data = path.read_bytes()
    assert_model_error(data[: max(8, int(len(data) * fraction))])


def test_unsupported_schema_version() -> None:
    b = ModelBuilder()
    b.output(b.op("RELU", [b.input("x", [2])]))
    assert_model_error(b.build(version=4), "unsupported schema version 4", "up to 3")


def test_no_subgraphs() -> None:
    b = ModelBuilder()
    b.subgraphs.clear()
    assert_model_error(b.build(), "no subgraphs")


def test_dangling_tensor_index_in_op() -> None:
    b = ModelBuilder()
    x = b.input("x", [2])
    b.output(b.op("ADD", [x, 99], out_shape=[2]))
    assert_model_error(b.build(), "op #0 (ADD) input refers to tensor 99", "has 2 tensors")


def test_dangling_tensor_index_in_graph_output() -> None:
    b = ModelBuilder()
    b.output(b.op("RELU", [b.input("x", [2])]), 7)
    assert_model_error(b.build(), "graph output refers to tensor 7")


def test_dangling_tensor_index_in_signature() -> None:
    b = ModelBuilder()
    x = b.input("x", [2])
    y = b.op("RELU", [x])
    b.output(y)
    b.signature("serving_default", {"x": x}, {"y": 12})
    assert_model_error(b.build(), "signature 0", "missing tensor 12")


def test_buffer_index_out_of_range() -> None:
    b = ModelBuilder()
    x = b.input("x", [2])
    w = b.tensor("w", [2], buffer_index=57)
    b.output(b.op("ADD", [x, w]))
    assert_model_error(b.build(), "tensor 1 ('w') refers to buffer 57")


def test_buffer_smaller_than_shape() -> None:
    b = ModelBuilder()
    x = b.input("x", [4])
    c = b.const("c", np.ones(3, np.float32))
    w = b.tensor("w", [4], buffer_index=1)  # c's 12-byte buffer, read as 4 floats
    b.output(b.op("ADD", [x, w]), c)
    assert_model_error(b.build(), "'w'", "holds 12 bytes", "needs 16")


def test_buffer_larger_than_shape_reads_its_start_as_litert_does() -> None:
    b = ModelBuilder()
    x = b.input("x", [2])
    c = b.const("c", np.array([1, 2, 3], np.float32))
    w = b.tensor("w", [2], buffer_index=1)  # c's 12-byte buffer, read as 2 floats
    b.output(b.op("ADD", [x, w]), c)
    data = b.build()
    w_data = load_model(data).main.tensors[w.index].data
    assert w_data is not None and w_data.tolist() == [1.0, 2.0]
    li = litert(data)
    li.allocate_tensors()
    li.set_tensor(li.get_input_details()[0]["index"], np.zeros(2, np.float32))
    li.invoke()
    assert li.get_tensor(li.get_output_details()[0]["index"]).tolist() == [1.0, 2.0]


def test_opcode_index_out_of_range() -> None:
    b = ModelBuilder()
    b.output(b.op("RELU", [b.input("x", [2])], opcode_index=5))
    assert_model_error(b.build(), "op #0 uses operator-code entry 5", "the table has 1")


def test_omitted_op_output_rejected() -> None:
    b = ModelBuilder()
    x = b.input("x", [2])
    b.op("DEQUANTIZE", [b.const("w", np.ones(2, np.float16))], outputs=[-1])
    b.output(b.op("RELU", [x]))
    assert_model_error(b.build(), "op #0 (DEQUANTIZE) output refers to tensor -1")


def test_unknown_builtin_code() -> None:
    b = ModelBuilder()
    b.output(b.op("RELU", [b.input("x", [2])]))
    data = b.build()
    # Rewrite the one operator code's builtin_code (RELU = 19) to a code no schema defines.
    model = __import__("tflite").Model.GetRootAs(data, 0)
    oc = model.OperatorCodes(0)
    pos = oc._tab.Pos + oc._tab.Offset(10)  # builtin_code is field 3 (vtable slot 10)
    patched = bytearray(data)
    assert int.from_bytes(patched[pos : pos + 4], "little") == 19
    patched[pos : pos + 4] = (9999).to_bytes(4, "little")
    assert_model_error(bytes(patched), "operator code #9999", "not a TFLite builtin")


def test_bad_sparsity_metadata() -> None:
    dense = np.eye(4, dtype=np.float32)
    b = ModelBuilder()
    x = b.input("x", [4, 4])
    w = b.const("w", dense, sparsity=Sparsity())
    b.output(b.op("ADD", [x, b.op("DENSIFY", [w])]))
    data = bytearray(b.build())
    # Corrupt the CSR indices (written as int32 in an Int32Vector): point one past the end.
    enc = encode_sparse(dense, Sparsity())
    needle = np.asarray(enc.levels[1][3], "<i4").tobytes()
    at = bytes(data).find(needle)
    assert at > 0
    data[at : at + 4] = (4).to_bytes(4, "little")
    assert_model_error(bytes(data), "sparse tensor 1 ('w')")


def test_modelerror_is_valueerror() -> None:
    with pytest.raises(ValueError):
        load_model(b"")


# -- builtin options: every table the schema has, written and decoded ------------------------


def _options_cases() -> list[str]:
    from tflite.utils import BUILTIN_OPCODE2NAME
    from tflite_builder import options_class

    names = []
    for name in BUILTIN_OPCODE2NAME.values():
        try:
            options_class(name)
        except ValueError:
            continue
        names.append(name)
    return names


_SAMPLE_VALUES = {"Bool": True, "Float32": 0.5, "Float64": 0.25}


@pytest.mark.parametrize("op_name", _options_cases())
def test_builtin_options_round_trip(op_name: str) -> None:
    """Each options field, set to a non-default value, decodes to that value."""
    from tflite_builder import option_fields

    options: dict[str, object] = {}
    for key, (kind, elem) in option_fields(op_name).items():
        if kind == "scalar":
            options[key] = _SAMPLE_VALUES.get(elem, 2)
        elif kind == "vector":
            options[key] = [True, False, True] if elem == "Bool" else [3, 1, 2]
        elif kind == "string":
            options[key] = "composite.name"
    b = ModelBuilder()
    x = b.input("x", [2])
    b.output(b.op(op_name, [x], out_shape=[2], options=options))
    # (Decoding alone: a one-input op with these options is no model its kernel prepares.)
    op = load_model(b.build(), validate=False).main.ops[0]
    assert op.name == op_name
    for key, value in options.items():
        got = op.options.get(key)
        assert got == value, f"{op_name}.{key}: wrote {value!r}, read {got!r}"
