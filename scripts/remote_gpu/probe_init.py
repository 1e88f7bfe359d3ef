"""Where a warm start's device opening goes on NVIDIA: the OpenCL device and the CUDA driver,
each alone and both (one after the other, and in two threads), each case in a fresh process
(3 each, milliseconds from after the imports). Measured on the H100 (2026-11-24,
results/h100/startup_graph/probe_init.jsonl): OpenCL 234, CUDA init 127, CUDA init +
primary context 233, OpenCL then CUDA 337, both in two threads 392 (the drivers contend:
starting CUDA beside OpenCL is slower than after it).

    python scripts/remote_gpu/probe_init.py  # prints one JSON line per case
"""

from __future__ import annotations

import json
import subprocess
import sys

CASES = {
    "opencl": "from litekiln.runtime.device import select_device; select_device(None)",
    "cuda_init": "from litekiln.runtime import cuda; cuda.driver()",
    "cuda_context": "from litekiln.runtime import cuda; cuda.driver(); cuda.CudaDevice(0)",
    "opencl_then_cuda": (
        "from litekiln.runtime.device import select_device; from litekiln.runtime import cuda; "
        "cuda.cuda_device_for(select_device(None).device)"
    ),
    "opencl_and_cuda_threads": (
        "import threading; from litekiln.runtime import cuda; "
        "from litekiln.runtime.device import select_device; "
        "t = threading.Thread(target=lambda: cuda.CudaDevice(0)); t.start(); "
        "h = select_device(None); t.join(); cuda.cuda_device_for(h.device)"
    ),
    "opener": "from litekiln.runtime.device import DeviceOpener; DeviceOpener(None).result()",
}

CHILD = """
import time, sys
t0 = time.perf_counter()
{code}
print((time.perf_counter() - t0) * 1e3)
"""


def main() -> None:
    import pyopencl  # noqa: F401  (imported outside the timing in the children too)

    for name, code in CASES.items():
        times = []
        for _ in range(3):
            src = "import numpy, pyopencl, litekiln.runtime.device\n" + CHILD.format(code=code)
            out = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True)
            try:
                times.append(float(out.stdout.strip().splitlines()[-1]))
            except (IndexError, ValueError):
                times.append(None)
                print(out.stderr[-500:], file=sys.stderr)
        ok = sorted(t for t in times if t is not None)
        print(
            json.dumps({"case": name, "ms": times, "median_ms": ok[len(ok) // 2] if ok else None})
        )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
