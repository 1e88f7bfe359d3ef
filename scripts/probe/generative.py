"""Convert one of litert-torch's generative models (``"lib": "generative"`` in
scripts/probe/models.jsonl) the way its examples do, with the configuration its own tests use
(``get_fake_model_config``: the real architecture, few and narrow layers, seeded random
weights).

litert-torch's ``convert_to_tflite`` writes a language model as one file with a ``prefill``
signature (subgraph 0: a prompt of ``PREFILL`` tokens) and a ``decode`` one (subgraph 1: one
token), an external KV cache of ``KV_MAX`` rows as inputs and outputs, every attention a
STABLEHLO_COMPOSITE, and by default its weights quantized (``"quantize": "dynamic_int8"``;
``"none"`` keeps them float). Runs in the corpus virtualenv (build/corpus-venv):

    build/corpus-venv/bin/python scripts/probe/generative.py OUT_DIR '<one line of models.jsonl>'

prints ``OK <out> <seconds> <parameters>`` or ``FAIL <out> <error>``; OUT_DIR/<out>.tflite.
"""

import importlib
import importlib.machinery
import json
import os
import sys
import tempfile
import time
import types

PREFILL, KV_MAX = 8, 64


def _tensorflow_schema_shim() -> None:
    """litert-torch's generative layers import TensorFlow's flatbuffer schema module
    (``tensorflow.lite.python.schema_py_generated``) for LoRA; LiteRT ships the same module,
    and the corpus virtualenv has no TensorFlow."""
    schema = importlib.import_module("ai_edge_litert.schema_py_generated")
    for name in ("tensorflow", "tensorflow.lite", "tensorflow.lite.python"):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__spec__ = importlib.machinery.ModuleSpec(name, None)
            module.__path__ = []
            sys.modules[name] = module
    sys.modules["tensorflow.lite.python.schema_py_generated"] = schema


def main() -> int:
    out_dir, line = sys.argv[1], json.loads(sys.argv[2])
    out = line["out"]
    t0 = time.time()
    try:
        _tensorflow_schema_shim()
        import torch
        from litert_torch.generative.utilities import converter
        from litert_torch.generative.utilities.export_config import ExportConfig

        torch.manual_seed(0)
        example = importlib.import_module(f"litert_torch.generative.examples.{line['module']}")
        config = getattr(example, line.get("config", "get_fake_model_config"))()
        model = getattr(example, line["cls"])(config, KV_MAX).eval()
        with torch.no_grad():  # (the fake configs' weights: seeded, not the zeros some use)
            for p in model.parameters():
                p.copy_(torch.randn_like(p) * 0.05)
        with tempfile.TemporaryDirectory() as tmp:
            converter.convert_to_tflite(
                model, tmp, out, prefill_seq_len=PREFILL, kv_cache_max_len=KV_MAX,
                quantize=line.get("quantize", "dynamic_int8"), config=config,
                export_config=ExportConfig(mask_as_input=bool(line.get("mask_as_input"))),
            )  # fmt: skip
            (made,) = [f for f in os.listdir(tmp) if f.endswith(".tflite")]
            os.replace(os.path.join(tmp, made), os.path.join(out_dir, f"{out}.tflite"))
        params = sum(p.numel() for p in model.parameters())
        print(f"OK {out} {time.time() - t0:.1f} {params}")
    except Exception as exc:  # noqa: BLE001 - the probe records every failure
        print(f"FAIL {out} {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
