"""Model loading: ``.tflite`` flatbuffer -> litekiln graph IR."""

from litekiln.model.ir import Model, Op, Quantization, SignatureDef, Subgraph, Tensor
from litekiln.model.loader import dequantize_array, load_model
from litekiln.model.token import model_token

__all__ = [
    "Model",
    "Op",
    "Quantization",
    "SignatureDef",
    "Subgraph",
    "Tensor",
    "dequantize_array",
    "load_model",
    "model_token",
]
