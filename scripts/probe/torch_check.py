"""A probe model that LiteRT cannot run, checked against PyTorch instead (the module it was
converted from, with the same seeded weights, on the same seeded input).

    .venv/bin/python scripts/probe/torch_check.py OUT_DIR NAME

NAME is a PyTorch line's ``out`` in scripts/probe/models.jsonl, converted into
OUT_DIR/NAME.tflite (scripts/probe/run.sh). PyTorch runs in the corpus virtualenv
(build/corpus-venv); litekiln's numpy reference and its OpenCL path in this one. Prints both
errors as ``max|litekiln - torch| / max(1, max|torch|)`` (NCHW outputs compared as they are:
the models here end in a classifier).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
TORCH_PY = REPO / "build" / "corpus-venv" / "bin" / "python"

_TORCH_SIDE = """
import json, sys
import numpy as np, torch
sys.path[:0] = [sys.argv[3], sys.argv[3] + "/..", sys.argv[3] + "/../.."]
import convert
m, sample = convert.make(json.loads(sys.argv[1]))
x = np.random.default_rng(0).uniform(-1, 1, tuple(sample.shape)).astype(np.float32)
with torch.no_grad():
    y = m(torch.from_numpy(x))
y = y[0] if isinstance(y, (tuple, list)) else y
np.savez(sys.argv[2], x=x, y=y.numpy())
"""


def main() -> None:
    out, name = Path(sys.argv[1]), sys.argv[2]
    lines = (REPO / "scripts" / "probe" / "models.jsonl").read_text().splitlines()
    spec = next(json.loads(s) for s in lines if json.loads(s)["out"] == name)
    with tempfile.TemporaryDirectory() as tmp:
        npz = os.path.join(tmp, "io.npz")
        here = str(Path(__file__).resolve().parent)
        subprocess.run([str(TORCH_PY), "-c", _TORCH_SIDE, json.dumps(spec), npz, here], check=True)
        io = np.load(npz)
        x, want = io["x"], io["y"]
        import litekiln

        model = str(out / f"{name}.tflite")
        ref = litekiln.Interpreter(model_path=model, device="reference").run([x])[0]
        gpu = litekiln.Interpreter(model_path=model, cache_dir=tmp, cpu_first=False).run([x])[0]
    scale = max(1.0, float(np.abs(want).max()))
    for label, got in (("reference", ref), ("opencl", gpu)):
        err = float(np.abs(got.astype(np.float64) - want).max()) / scale
        print(f"{name} {label} vs torch rel_err={err:.2e} ({'ok' if err <= 1e-4 else 'FAIL'})")


if __name__ == "__main__":
    main()
