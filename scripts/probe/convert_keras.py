"""Convert one Keras line of scripts/probe/models.jsonl (``"lib": "keras"``) to a .tflite.

A ``keras.applications`` constructor with seeded random weights, through the TFLite converter
as the corpus builds its Keras models (scripts/corpus.py `build_keras`), in one of its
``quantize`` modes: ``float``, ``int8`` (full integer), ``dynamic`` (int8 weights) or
``fp16`` (fp16 weights). Runs in the project's virtualenv (tensorflow-cpu):

    .venv/bin/python scripts/probe/convert_keras.py OUT_DIR '<one line of models.jsonl>'

prints ``OK <out> <seconds> <parameters>`` or ``FAIL <out> <error>``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

_SCRIPTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _SCRIPTS)
sys.path.insert(0, os.path.dirname(_SCRIPTS))

import corpus  # noqa: E402


def main() -> None:
    out_dir, spec = sys.argv[1], json.loads(sys.argv[2])
    t = time.time()
    try:
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
