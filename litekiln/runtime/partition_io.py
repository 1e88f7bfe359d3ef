"""What both executors (OpenCL launches, CUDA graph) need to know of a partition's tensors.

No TVM, no pyopencl, no CUDA: plain `GpuProgram` lookups.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from litekiln.artifact.program import GpuProgram, TensorSpec


class PartitionIO:
    """Input/output shapes of the program an executor runs (``self.program``)."""

    program: GpuProgram
    _tensor_specs: dict[int, TensorSpec]

    @property
    def num_inputs(self) -> int:
        """Number of partition inputs."""
        return len(self.program.inputs)

    @property
    def num_outputs(self) -> int:
        """Number of partition outputs."""
        return len(self.program.outputs)

    def input_spec(self, i: int) -> TensorSpec:
        """Shape/dtype of input ``i``."""
        return self._tensor_specs[self.program.inputs[i]]

    def output_spec(self, i: int) -> TensorSpec:
        """Shape/dtype of output ``i``."""
        return self._tensor_specs[self.program.outputs[i]]

    def output_in_place(self, i: int, nbytes: int) -> bool:
        """Whether output ``i`` can be written straight into an application buffer of
        ``nbytes`` bytes by pointing its storage there.

        Only when the memory plan gives the output a workspace storage of its own: at offset
        0, holding no other output, and no larger than the buffer. The storage may hold
        intermediates before the output is computed (the plan reuses storage), which then
        pass through the application's buffer too; that is why it must fit whole. Otherwise
        (an output that is a partition input or a constant passed through, one sharing its
        storage, one in a storage larger than the buffer) the executor copies it on the device.
        """
        spec = self.output_spec(i)
        storage = next(s for s in self.program.storages if s.id == spec.storage)
        shared = any(
            k != i and self._tensor_specs[t].storage == spec.storage
            for k, t in enumerate(self.program.outputs)
        )
        return (
            storage.role == "workspace"
            and spec.offset == 0
            and storage.nbytes <= nbytes
            and not shared
            and spec.id not in self.program.constants
        )


def constant_arrays(
    program: GpuProgram,
    constants: Mapping[str, np.ndarray],
    specs: Mapping[int, TensorSpec],
    error: type[Exception],
) -> Iterator[tuple[int, np.ndarray]]:
    """(tensor id, C-contiguous array of the program's dtype) for each of its constants.

    Raises:
        error: a constant is missing or has another shape than the program expects.
    """
    for tid, name in program.constants.items():
        if name not in constants:
            raise error(f"constant {name!r} (tensor {tid}) missing")
        spec = specs[tid]
        arr = np.asarray(constants[name], dtype=spec.dtype, order="C")
        if arr.shape != spec.shape:
            raise error(f"constant {name!r}: shape {arr.shape}, program expects {spec.shape}")
        yield tid, arr
