"""litekiln compiler: partitioning, lowering to TVM Relax, OpenCL code generation.

TVM imports torch where torch is installed: its FFI layer (``tvm_ffi``) first thing, and
``tvm.relax`` for a DLPack exchange with torch tensors that the compiler never makes. On a
build machine that has torch (one that converts PyTorch models with litert-torch, say) that
import was 3.5 of the 6 s TVM took to import, in every ``litekiln compile`` and every
compiling start. The finder below refuses torch to TVM's modules while they initialise
(their imports of torch are optional: they catch the ImportError). torch that the process
imported before keeps its place; torch imported later, outside TVM's initialisation, is
torch as ever (the finder goes then).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType


def _tvm_initialising() -> bool:
    """Whether a module of TVM (``tvm``, ``tvm_ffi`` or one of theirs) is being executed."""
    for name, module in list(sys.modules.items()):
        if (name.startswith(("tvm.", "tvm_ffi.")) or name in ("tvm", "tvm_ffi")) and getattr(
            getattr(module, "__spec__", None), "_initializing", False
        ):
            return True
    return False


class _NoTorchForTvm(importlib.abc.MetaPathFinder):
    """Refuses ``torch`` to the imports made while TVM's modules initialise."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch" and not fullname.startswith("torch."):
            return None
        if _tvm_initialising():
            raise ImportError("litekiln: torch is not imported for TVM")
        _remove_finder()  # torch for its own sake: the usual import, from now on
        return None


_FINDER = _NoTorchForTvm()


def _remove_finder() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


if "tvm_ffi" not in sys.modules and "torch" not in sys.modules:
    sys.meta_path.insert(0, _FINDER)
