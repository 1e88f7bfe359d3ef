"""The compiler imports TVM without torch (litekiln/compiler/__init__.py): TVM's FFI layer and
``tvm.relax`` import torch where it is installed, seconds of every compile's start."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

pytest.importorskip("tvm")

#: Run in a fresh process: this one may have imported torch or TVM already.
CHILD = r"""
import sys, time
t0 = time.perf_counter()
import litekiln.compiler.codegen
import tvm, tvm.relax, tvm_ffi
print("tvm", round(time.perf_counter() - t0, 2), file=sys.stderr)
assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
import torch  # the process's own import of torch: as ever, and the finder goes
assert torch.nn.functional.relu(torch.tensor([-1.0, 2.0])).tolist() == [0.0, 2.0]
assert not any(type(f).__name__ == "_NoTorchForTvm" for f in sys.meta_path), sys.meta_path
print("ok")
"""

#: A module of TVM imported on its own after TVM (its PyTorch frontend) gets its torch.
CHILD_TVM_FRONTEND = r"""
import sys
import litekiln.compiler.codegen
assert "torch" not in sys.modules
import tvm.relax.frontend.torch as frontend
assert "torch" in sys.modules and hasattr(frontend, "from_exported_program")
print("ok")
"""

#: torch imported first keeps its place, and TVM finds it as it would without litekiln.
CHILD_TORCH_FIRST = r"""
import sys
import torch
import litekiln.compiler.codegen
import tvm_ffi._convert
assert tvm_ffi._convert.torch is torch
assert not any(type(f).__name__ == "_NoTorchForTvm" for f in sys.meta_path), sys.meta_path
print("ok")
"""


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
@pytest.mark.parametrize(
    "code",
    [CHILD, CHILD_TORCH_FIRST, CHILD_TVM_FRONTEND],
    ids=["tvm first", "torch first", "tvm's torch frontend after"],
)
def test_the_compiler_imports_tvm_without_torch(code: str) -> None:
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-3000:]
