"""The compiled-model format: what the compiler produces, the cache stores and the runtime runs.

Plain data only (no TVM, no OpenCL): :class:`CompileOptions`, :class:`CompiledModel` with one
:class:`PartitionArtifact` per GPU partition, each holding a
:class:`~litekiln.artifact.program.GpuProgram` (kernels, launch plan, memory plan). It sits
below the compiler, the cache and the runtime, which all three read or write it.
"""

from litekiln.artifact.compiled import CompiledModel, CompileOptions, PartitionArtifact
from litekiln.artifact.program import GpuProgram

__all__ = ["CompileOptions", "CompiledModel", "GpuProgram", "PartitionArtifact"]
