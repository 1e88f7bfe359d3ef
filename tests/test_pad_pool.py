"""A zero PAD read by one whole-map AVERAGE_POOL_2D becomes a SUM at load, scaled
(`litekiln.ops.pad_pool`): litert-torch's form of ``nn.AvgPool2d(k, ceil_mode=True)`` with a
window larger than the map (Hugging Face's EfficientNet: a 7x7 map padded to 1280x1280, an
8.4 GB tensor litekiln refused).

Checked against LiteRT (which runs the pair as written) on a map padded to 16x16, on the
numpy reference and the OpenCL device, also after the input is resized; the 1280x1280 form
against the value it stands for (LiteRT would allocate the 8.4 GB); and the pairs that must
stay as they are.
"""

from __future__ import annotations

import numpy as np
import pytest
from tflite_builder import ModelBuilder

import litekiln
from litekiln.model import load_model
from litekiln.ops.conv import VALID

F32 = np.float32


def _pad_pool(
    size: int,
    *,
    channels: int = 8,
    pads: list[list[int]] | None = None,
    activation: int = 0,
    second_reader: bool = False,
) -> bytes:
    """x [1, 7, 7, C] -> PAD to ``size`` x ``size`` (zeros after the map, as litert-torch
    pads) -> AVERAGE_POOL_2D of one ``size`` x ``size`` VALID window -> [1, 1, 1, C]."""
    p = pads or [[0, 0], [0, size - 7], [0, size - 7], [0, 0]]
    padded = [1, 7 + sum(p[1]), 7 + sum(p[2]), channels + sum(p[3])]
    b = ModelBuilder()
    x = b.input("x", [1, 7, 7, channels])
    y = b.op("PAD", [x, np.array(p, np.int32)], out_shape=padded)
    opts = {
        "padding": VALID, "stride_w": size, "stride_h": size, "filter_width": size,
        "filter_height": size, "fused_activation_function": activation,
    }  # fmt: skip
    z = b.op("AVERAGE_POOL_2D", [y], options=opts, out_shape=[1, 1, 1, padded[3]])
    outs = [z]
    if second_reader:
        outs.append(b.op("RELU", [y], out_shape=padded))
    b.output(*outs)
    return b.build()


def _live(model: bytes) -> list[str]:
    return [op.name for op in load_model(model).main.live_ops()]


def _litert(model: bytes, x: np.ndarray) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    interp = LiteRT(model_content=model)
    interp.resize_tensor_input(interp.get_input_details()[0]["index"], list(x.shape))
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return np.asarray(interp.get_tensor(interp.get_output_details()[0]["index"]))


def test_the_pair_is_a_mean_and_matches_litert() -> None:
    model = _pad_pool(16)
    assert _live(model) == ["SUM", "MUL"]
    x = np.random.default_rng(0).uniform(-1, 1, (1, 7, 7, 8)).astype(F32)
    expected = _litert(model, x)
    np.testing.assert_allclose(expected[0, 0, 0], x.sum((1, 2))[0] / 256, rtol=1e-5, atol=1e-7)
    for device in ("reference", None):  # None: the tests' OpenCL device
        (got,) = litekiln.Interpreter(model_content=model, device=device).run([x])
        assert got.shape == (1, 1, 1, 8)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_a_resized_input_keeps_the_pairs_value() -> None:
    """The rewritten graph is what a resize re-plans: an 8x8 map (padded to 17x17, one
    16x16 window over all of it) still averages over the window's 256 cells."""
    model = _pad_pool(16)
    x = np.random.default_rng(3).uniform(-1, 1, (1, 8, 8, 8)).astype(F32)
    expected = _litert(model, x)
    np.testing.assert_allclose(expected[0, 0, 0], x.sum((1, 2))[0] / 256, rtol=1e-5, atol=1e-7)
    interp = litekiln.Interpreter(model_content=model, device="reference")
    interp.resize_tensor_input(interp.get_input_details()[0]["index"], [1, 8, 8, 8])
    interp.allocate_tensors()
    (got,) = interp.run([x])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_the_1280_window_of_efficientnet_runs_without_its_8_gb() -> None:
    model = _pad_pool(1280, channels=16)
    assert _live(model) == ["SUM", "MUL"]
    x = np.random.default_rng(1).uniform(-1, 1, (1, 7, 7, 16)).astype(F32)
    (got,) = litekiln.Interpreter(model_content=model, device="reference").run([x])
    np.testing.assert_allclose(got[0, 0, 0], x.sum((1, 2))[0] / 1280**2, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize(
    "kw",
    [
        {"activation": 1},  # a fused RELU
        {"pads": [[0, 0], [0, 9], [0, 9], [0, 2]]},  # channels padded: the pool sees them
        {"second_reader": True},  # another op reads the padded map
    ],
    ids=["activation", "channel-pads", "two-readers"],
)
def test_pairs_that_stay_as_written(kw: dict) -> None:
    model = _pad_pool(16, **kw)
    live = _live(model)
    assert "PAD" in live and "AVERAGE_POOL_2D" in live and "SUM" not in live
    x = np.random.default_rng(2).uniform(-1, 1, (1, 7, 7, 8)).astype(F32)
    got = litekiln.Interpreter(model_content=model, device="reference").run([x])[0]
    np.testing.assert_allclose(got, _litert(model, x), rtol=1e-5, atol=1e-6)
