"""PTX of a partition's default kernels, for NVIDIA GPUs, made where no GPU is.

NVIDIA's OpenCL spends 75-85% of a first start's build in its OpenCL C front end: the default
kernels of a MediaPipe landmark model take 5.7-9.7 s to build there, and 1.0-2.2 s when the
PTX that build produced is handed to the CUDA driver instead (docs/benchmarks.md, "Where the
build time goes"). PTX is NVIDIA's portable virtual instruction set: every later GPU compiles it
to its own code when it loads (it is no device binary), so the compiler makes it once, here, and
the cache ships it. A first start on an NVIDIA GPU then loads it through the CUDA driver
(`litekiln.runtime.cuda.CudaGraphExecutor`) and needs no OpenCL build before its first inference.

The kernels are the program's own: the same scheduled and lowered TIR device functions whose
OpenCL C the program holds, printed as CUDA C by TVM and compiled to PTX by the CUDA toolkit's
``nvcc`` (``-ptx``, no fast math, as the OpenCL build). Same parameters, in the same order, and
the same launch grid: the runtime checks every launch against the PTX's entries
(`litekiln.runtime.cuda.check_ptx`) before it uses them. (TVM 0.27's own LLVM NVPTX back end is
not usable: it emits kernels as ``.func`` and calls the barrier intrinsic with the wrong arity.)

Made at build time (`litekiln compile`) when a CUDA compiler is found (``LITEKILN_PTX=auto``, the
default; ``on``: every compile; ``off``: never). Anything
that fails leaves the program without PTX, with the reason in ``meta["ptx"]``: the first start
then builds OpenCL as before.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from litekiln import config

if TYPE_CHECKING:  # (imported where used: finding nvcc needs no TVM)
    import tvm

#: Oldest virtual architecture CUDA 12/13's nvcc still writes; every GPU since Turing loads it.
PTX_ARCH = "compute_75"
#: What the CUDA target says to TVM's CUDA printer (it only reads the numbers).
_CUDA_TARGET = {"kind": "cuda", "arch": "sm_75", "max_num_threads": 1024}
_NVCC_SECONDS = 600


class PtxUnavailable(RuntimeError):
    """No PTX for this program (no CUDA compiler, or one step failed): the reason."""


def find_nvcc() -> str | None:
    """The CUDA toolkit's ``nvcc``: ``$CUDA_PATH/bin``, ``$PATH``, then ``/usr/local/cuda``."""
    for root in (os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME")):
        if root and os.access(Path(root, "bin", "nvcc"), os.X_OK):
            return str(Path(root, "bin", "nvcc"))
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if os.access(default, os.X_OK) else None


def wanted() -> str | None:
    """The nvcc to make PTX with, or None: ``LITEKILN_PTX=off``, ``auto`` outside an
    ahead-of-time compile (`litekiln.config.AHEAD_OF_TIME`), or no nvcc found."""
    mode = config.PTX.get()
    if mode == "off" or (mode == "auto" and not config.AHEAD_OF_TIME.get()):
        return None
    return find_nvcc()


def _printed_cuda(device_mod: tvm.IRModule) -> str:
    """TVM's CUDA C for ``device_mod``'s kernels."""
    import tvm
    from tvm import tirx

    target = tvm.target.Target(_CUDA_TARGET, host="llvm")
    mod = tvm.IRModule(
        {gv: f.with_attr("target", target) for gv, f in device_mod.functions.items()}
    )
    _pipe, _host, finalize_device = tirx.get_default_tir_pipeline(target)
    # (TVM 0.27's wheel prints CUDA C here and compiles nothing: no NVRTC inside.)
    built = tvm.get_global_func("target.build.cuda")(finalize_device()(mod), target)
    code = str(built.inspect_source())
    if "__global__" not in code:
        raise PtxUnavailable("TVM's CUDA code generation printed no kernel")
    return code


def make_ptx(
    device_mods: Sequence[tvm.IRModule], rename: dict[str, str], nvcc: str
) -> tuple[str, float]:
    """PTX of the kernels named in ``rename`` (TVM's name -> the program's), and seconds.

    Raises:
        PtxUnavailable: more than one device module, a kernel missing, or nvcc failed.
    """
    import tvm

    t0 = time.perf_counter()
    mods = [m for m in device_mods if len(m.functions)]
    if len(mods) != 1:
        raise PtxUnavailable(f"{len(mods)} device modules, one expected")
    (mod,) = mods
    keep = {gv: f for gv, f in mod.functions.items() if gv.name_hint in rename}
    missing = set(rename) - {gv.name_hint for gv in keep}
    if missing:
        raise PtxUnavailable(f"kernel {sorted(missing)[0]} not among the device functions")
    source = _printed_cuda(tvm.IRModule(keep))
    long_names = sorted((n for n, s in rename.items() if n != s), key=len, reverse=True)
    if long_names:
        pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in long_names) + r")\b")
        source = pattern.sub(lambda m: rename[m.group(1)], source)
    if "extern __shared__" in source:
        raise PtxUnavailable("a kernel uses dynamic shared memory, which the launch plan lacks")
    with tempfile.TemporaryDirectory(prefix="litekiln-ptx-") as tmp:
        cu, out = Path(tmp, "kernels.cu"), Path(tmp, "kernels.ptx")
        cu.write_text(source)
        cmd = [nvcc, "-ptx", "-w", f"-arch={PTX_ARCH}", "-O3", "-o", str(out), str(cu)]
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=_NVCC_SECONDS, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PtxUnavailable(f"nvcc: {type(exc).__name__}: {exc}") from None
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise PtxUnavailable(f"nvcc exited {proc.returncode}: {' | '.join(tail)}")
        ptx = out.read_text()
    return ptx, time.perf_counter() - t0
