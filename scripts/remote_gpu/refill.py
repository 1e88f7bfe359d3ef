"""Carry large models to the GPU machine without their weights: the weights are made again there.

The corpus (docs/corpus.md) is about graphs; its weights are random anyway (seeded PyTorch or
Keras initialisers). Its 44 models weigh 550 MB, the device tool carries 64 MiB a call. So the
kit carries *refilled* models: each float weight buffer (a constant float32/float16 tensor of
at least ``MIN_BYTES``) is replaced by values drawn from a stream that is the same on every
machine and every numpy version (PCG64's raw 64-bit output, turned into uniform floats with the
buffer's own mean and standard deviation), so a stripped file (those bytes zeroed: it
compresses to almost nothing) and a small JSON recipe make the exact same bytes again there,
checked by sha256. litekiln compiles the refilled model here and runs it there; LiteRT runs
the same refilled file there, so every comparison is on one file.

    python scripts/remote_gpu/refill.py make SRC.tflite OUT.tflite     # + OUT.tflite.refill.json
    python scripts/remote_gpu/refill.py strip OUT.tflite OUT.stripped  # weights zeroed
    python scripts/remote_gpu/refill.py fill OUT.stripped OUT.tflite.refill.json OUT.tflite

Only numpy and the ``tflite`` flatbuffer readers (carried as a wheel) are needed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

#: Float constants smaller than this stay as they are (biases, scales, shape-like floats), as
#: do the constants a custom op reads (SSD's anchors: their boxes must stay boxes).
MIN_BYTES = 4096
_FLOATS = {0: np.dtype("<f4"), 1: np.dtype("<f2")}  # TensorType FLOAT32, FLOAT16


def weight_buffers(data: bytes) -> list[dict[str, Any]]:
    """Each float weight buffer: its index, byte offset and length in ``data``, dtype."""
    import tflite

    fb = tflite.Model.GetRootAs(data, 0)
    kinds: dict[int, np.dtype] = {}
    custom = set()  # buffers a custom op reads (SSD's anchors): data, not weights; kept
    for s in range(fb.SubgraphsLength()):
        sg = fb.Subgraphs(s)
        for o in range(sg.OperatorsLength()):
            op = sg.Operators(o)
            if fb.OperatorCodes(op.OpcodeIndex()).CustomCode():
                custom.update(sg.Tensors(int(t)).Buffer() for t in op.InputsAsNumpy() if t >= 0)
        for t in range(sg.TensorsLength()):
            tensor = sg.Tensors(t)
            if tensor.Type() in _FLOATS and tensor.Buffer() > 0 and tensor.Sparsity() is None:
                kinds.setdefault(tensor.Buffer(), _FLOATS[tensor.Type()])
    for b in custom:
        kinds.pop(b, None)
    base = np.frombuffer(data, np.uint8).ctypes.data
    out = []
    for b, dtype in sorted(kinds.items()):
        buf = fb.Buffers(b)
        if buf is None or buf.DataLength() < MIN_BYTES or buf.DataLength() % dtype.itemsize:
            continue
        view = buf.DataAsNumpy()
        if isinstance(view, int):
            continue
        out.append(
            {
                "buffer": b,
                "offset": int(view.ctypes.data - base),
                "length": int(buf.DataLength()),
                "dtype": dtype.str,
            }
        )
    return out


def _values(seed: int, count: int, mean: float, std: float, dtype: np.dtype) -> bytes:
    """``count`` floats, uniform with this mean and standard deviation, from PCG64's raw
    stream (stable across numpy versions, unlike its distributions)."""
    raw = np.random.PCG64(seed).random_raw(count).astype(np.uint64)
    unit = (raw >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))  # [0, 1)
    half_width = std * np.sqrt(3.0)
    values = mean + (2.0 * unit - 1.0) * half_width
    return values.astype(dtype).tobytes()


def make(src: Path, out: Path) -> dict[str, Any]:
    data = bytearray(src.read_bytes())
    recipe = []
    for k, w in enumerate(weight_buffers(bytes(data))):
        dtype = np.dtype(w["dtype"])
        old = np.frombuffer(data, dtype, w["length"] // dtype.itemsize, w["offset"])
        old64 = old.astype(np.float64)
        finite = old64[np.isfinite(old64)]
        mean = float(finite.mean()) if finite.size else 0.0
        std = float(finite.std()) if finite.size else 0.0
        seed = 0x6C6B696C6E + k  # "lkiln" + the buffer's rank
        new = _values(seed, old.size, mean, std, dtype)
        data[w["offset"] : w["offset"] + w["length"]] = new
        recipe.append({**w, "seed": seed, "mean": mean, "std": std})
    out.write_bytes(bytes(data))
    meta = {
        "source": src.name,
        "sha256": hashlib.sha256(bytes(data)).hexdigest(),
        "size": len(data),
        "buffers": recipe,
    }
    Path(f"{out}.refill.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def strip(src: Path, out: Path) -> None:
    data = bytearray(src.read_bytes())
    for w in weight_buffers(bytes(data)):
        data[w["offset"] : w["offset"] + w["length"]] = bytes(w["length"])
    out.write_bytes(bytes(data))


def fill(stripped: Path, recipe_path: Path, out: Path) -> None:
    meta = json.loads(recipe_path.read_text())
    data = bytearray(stripped.read_bytes())
    for w in meta["buffers"]:
        dtype = np.dtype(w["dtype"])
        data[w["offset"] : w["offset"] + w["length"]] = _values(
            w["seed"], w["length"] // dtype.itemsize, w["mean"], w["std"], dtype
        )
    digest = hashlib.sha256(bytes(data)).hexdigest()
    if digest != meta["sha256"]:
        raise SystemExit(f"refill: {out.name}: sha256 {digest} != {meta['sha256']}")
    out.write_bytes(bytes(data))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make", help="refill SRC's float weights into OUT (+ OUT.refill.json)")
    m.add_argument("src", type=Path)
    m.add_argument("out", type=Path)
    s = sub.add_parser("strip", help="zero the refilled weights (to carry)")
    s.add_argument("src", type=Path)
    s.add_argument("out", type=Path)
    f = sub.add_parser("fill", help="make the refilled model again from the stripped one")
    f.add_argument("stripped", type=Path)
    f.add_argument("recipe", type=Path)
    f.add_argument("out", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "make":
        meta = make(a.src, a.out)
        print(f"{a.out}: {len(meta['buffers'])} weight buffers refilled")
    elif a.cmd == "strip":
        strip(a.src, a.out)
    else:
        fill(a.stripped, a.recipe, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
