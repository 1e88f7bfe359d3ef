"""Convert one Keras line of scripts/probe/models.jsonl (``"lib": "keras"``) to a .tflite.

A ``keras.applications`` constructor with seeded random weights, through the TFLite converter
as the corpus builds its Keras models (scripts/corpus.py `build_keras`), in one of its
``quantize`` modes: ``float``, ``int8`` (full integer), ``dynamic`` (int8 weights) or
``fp16`` (fp16 weights). ``"lib": "keras_custom"`` lines name a model of
scripts/probe/keras_custom.py instead (several inputs and outputs, token ids, recurrent
layers), converted the same way (``int8``, and ``int16x8``: int16 activations with int8
weights, single float input only; ``dynamic``, ``fp16``).
Runs in the project's virtualenv (tensorflow-cpu):

    .venv/bin/python scripts/probe/convert_keras.py OUT_DIR '<one line of models.jsonl>'

prints ``OK <out> <seconds> <parameters>`` or ``FAIL <out> <error>``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Any

_SCRIPTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _SCRIPTS)
sys.path.insert(0, os.path.dirname(_SCRIPTS))

import corpus  # noqa: E402
from probe.keras_custom import BUILDERS  # noqa: E402


def build_custom(name: str, quantize: str) -> tuple[bytes, dict[str, Any]]:
    """A keras_custom.py model with seeded random weights, frozen and converted as
    `corpus.build_keras` converts the applications (each input its own signature argument)."""
    mz = corpus._make_zoo()  # noqa: SLF001
    tf = mz._tf()  # noqa: SLF001
    import keras
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    with mz.quiet_stderr():
        keras.utils.set_random_seed(corpus.SEED)
        net = BUILDERS[name](keras)
        specs = [tf.TensorSpec(x.shape, x.dtype, name=x.name) for x in net.inputs]

        def serve(*xs: Any) -> Any:
            return net(list(xs) if len(xs) > 1 else xs[0], training=False)

        fn = tf.function(serve, input_signature=specs)
        frozen = convert_variables_to_constants_v2(fn.get_concrete_function())
        converter = tf.lite.TFLiteConverter.from_concrete_functions([frozen], tf.Module())
        if quantize in ("int8", "int16x8"):
            (shape,) = [tuple(x.shape) for x in net.inputs]
            activations = "int16" if quantize == "int16x8" else "int8"
            mz.full_integer(converter, shape, corpus.SEED, activations)
        elif quantize in ("dynamic", "fp16"):  # int8 or fp16 weights, float activations
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            if quantize == "fp16":
                converter.target_spec.supported_types = [tf.float16]
        elif quantize != "float":
            raise ValueError(
                f"keras_custom models convert float, int8, int16x8, dynamic or fp16, not {quantize}"
            )
        data = bytes(converter.convert())
    return data, {"parameters": int(net.count_params())}


def main() -> None:
    out_dir, spec = sys.argv[1], json.loads(sys.argv[2])
    t = time.time()
    try:
        if spec["lib"] == "keras_custom":
            data, info = build_custom(spec["name"], spec.get("quantize", "float"))
        else:
            model = corpus._keras(spec["name"], spec.get("quantize", "float"))  # noqa: SLF001
            if "shape" in spec:
                model = dataclasses.replace(model, input_shape=tuple(spec["shape"]))
            data, info = corpus.build_keras(model)
        with open(os.path.join(out_dir, f"{spec['out']}.tflite"), "wb") as f:
            f.write(data)
        print("OK", spec["out"], round(time.time() - t, 1), info["parameters"])
    except Exception as e:  # noqa: BLE001 - a converter failure is a result
        print("FAIL", spec["out"], type(e).__name__, str(e)[:300])


if __name__ == "__main__":
    main()
