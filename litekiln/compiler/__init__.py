"""litekiln compiler: partitioning, lowering to TVM Relax, OpenCL code generation.

TVM imports torch where torch is installed: its FFI layer (``tvm_ffi``) first thing, and
``tvm.relax`` for a DLPack exchange with torch tensors that the compiler never makes. On a
build machine that has torch (one that converts PyTorch models with litert-torch, say) that
import was 3.5 of the 6 s TVM took to import, in every ``litekiln compile`` and every
compiling start. The finder below refuses torch to the imports made while TVM's package
initialises (those imports of torch are optional: they catch the ImportError). torch that
the process imported before keeps its place; torch imported later, outside TVM's
initialisation, is torch as ever (the finder goes then).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType


def _tvm_initialising() -> bool:
    """Whether TVM's package (``tvm`` or ``tvm_ffi``) is being imported: the imports its
    ``__init__`` makes, ``tvm.relax`` among them. A module of TVM imported later on its own
    (its PyTorch frontend, say) is not refused torch."""
    return any(
        getattr(getattr(sys.modules.get(name), "__spec__", None), "_initializing", False)
        for name in ("tvm", "tvm_ffi")
    )


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
