"""Which launch path each partition takes on this device, and why (CUDA graph or OpenCL).

    python scripts/remote_gpu/graph_probe.py MODEL.tflite... --cache-dir C [--ptx-out DIR]

For each model: opens it with LITEKILN_CUDA_GRAPH=on (a refusal is an error, so its reason is
printed), reports each partition's executor, and with --ptx-out writes the first partition's
PTX (the device binary NVIDIA's OpenCL built) for inspection.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--cache-dir", required=True)
    ap.add_argument("--ptx-out", default="")
    a = ap.parse_args()
    os.environ["LITEKILN_CUDA_GRAPH"] = "on"
    from litekiln.interpreter import Interpreter

    rows = []
    for path in a.models:
        name = os.path.basename(path).rsplit(".", 1)[0]
        t0 = time.perf_counter()
        row: dict = {"model": name}
        try:
            interp = Interpreter(model_path=path, cache_dir=a.cache_dir, cpu_first=False)
            interp.allocate_tensors()
            sess = interp._backend  # noqa: SLF001 - a probe
            row["executors"] = [type(ex).__name__ for ex in sess.executors]
            row["launches"] = [ex.num_launches for ex in sess.executors]
            if a.ptx_out and sess.executors and sess.executors[0].binary:
                os.makedirs(a.ptx_out, exist_ok=True)
                with open(os.path.join(a.ptx_out, f"{name}.ptx"), "wb") as f:
                    f.write(sess.executors[0].binary)
        except Exception as exc:  # noqa: BLE001 - report and go on
            row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            if a.ptx_out:  # the OpenCL path's binary, to see why
                os.environ["LITEKILN_CUDA_GRAPH"] = "off"
                try:
                    interp = Interpreter(model_path=path, cache_dir=a.cache_dir, cpu_first=False)
                    interp.allocate_tensors()
                    os.makedirs(a.ptx_out, exist_ok=True)
                    with open(os.path.join(a.ptx_out, f"{name}.ptx"), "wb") as f:
                        f.write(interp._backend.executors[0].binary)  # noqa: SLF001
                except Exception as exc2:  # noqa: BLE001
                    row["error_off"] = f"{type(exc2).__name__}: {exc2}"[:500]
                os.environ["LITEKILN_CUDA_GRAPH"] = "on"
        row["open_s"] = round(time.perf_counter() - t0, 3)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
