"""The compiled-model format: what the compiler produces, the cache stores and the runtime runs.

Plain data only (no TVM, no OpenCL): :class:`CompileOptions`, :class:`CompiledModel` with one
:class:`PartitionArtifact` per GPU partition, each holding a
:class:`~litekiln.artifact.program.GpuProgram` (kernels, launch plan, memory plan). It sits
below the compiler, the cache and the runtime, which all three read or write it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from litekiln.artifact.compiled import CompiledModel, CompileOptions, PartitionArtifact
    from litekiln.artifact.program import GpuProgram

__all__ = ["CompileOptions", "CompiledModel", "GpuProgram", "PartitionArtifact"]


def __getattr__(name: str) -> Any:
    # Lazy: the cache's keys import `litekiln.artifact.versions` alone, and a warm start reads
    # its GPU record (`litekiln.loading.open_device`) before the rest is needed.
    if name == "GpuProgram":
        from litekiln.artifact.program import GpuProgram

        return GpuProgram
    if name in ("CompiledModel", "CompileOptions", "PartitionArtifact"):
        from litekiln.artifact import compiled

        return getattr(compiled, name)
    raise AttributeError(f"module 'litekiln.artifact' has no attribute {name!r}")
