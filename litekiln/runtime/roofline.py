"""The roofline of a compiled model: what its launches must cost at least on a device.

Each launch of a `GpuProgram` moves at least the bytes of its buffer arguments
(`GpuProgram.launch_bytes`) and does the FLOPs the compiler counted (`Launch.flops`). At the
device's peak bandwidth and peak fp32 rate it cannot take less than
``max(bytes / bandwidth, FLOPs / rate)``, and the launch path adds the cost of one graph
node (a CUDA graph's kernel node, or one OpenCL enqueue) per launch. The model's floor is
the sum of both over its launches (`model_floor`): how far an end-to-end latency is from it
says how much faster the same launches could run, kernels and launch path together.

The peaks and the node cost are measured here, on the device, with the runtime's own
executors running small programs of litekiln's own (`measure_bandwidth`, `measure_compute`,
`launch_cost`, `graph_node_cost`): they cost about a second on PoCL and milliseconds on a GPU.

No TVM; pyopencl through the executors, CUDA through `litekiln.runtime.cuda`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from litekiln.artifact.program import (
    BufferArg,
    GpuProgram,
    Launch,
    ScalarArg,
    StorageSpec,
    TensorSpec,
)
from litekiln.runtime.device import DeviceHandle
from litekiln.runtime.profile import EMPTY_PROGRAM

_MIB = 1 << 20

#: One float4 copied per work-item: a streaming read and write of every byte once.
_COPY_SOURCE = """__kernel void litekiln_copy(__global const float4* restrict src,
                           __global float4* restrict dst) {
  size_t i = get_global_id(0);
  dst[i] = src[i];
}
"""

#: Eight independent chains of float8 multiply-adds per work-item: enough in flight to hide
#: the FMA units' latency, and vectors that a CPU driver's compiler turns into its SIMD
#: instructions (PoCL: 6x the rate of scalar chains; a GPU runs them as 64 scalar chains).
#: The result is stored, so that no compiler drops the work.
_CHAINS, _LANES = 8, 8
_FMA_SOURCE = (
    "__kernel void litekiln_fma(__global float* out, const float b, const float c, "
    "const int iters) {\n"
    "  float8 x = (float8)((float)get_global_id(0) * 1e-7f);\n"
    "  float8 vb = (float8)(b), vc = (float8)(c);\n"
    + "".join(f"  float8 a{k} = x + {k}.0f;\n" for k in range(_CHAINS))
    + "  for (int i = 0; i < iters; ++i) {\n"
    + "".join(f"    a{k} = mad(a{k}, vb, vc);\n" for k in range(_CHAINS))
    + "  }\n"
    + "  float8 s = "
    + " + ".join(f"a{k}" for k in range(_CHAINS))
    + ";\n"
    + "  out[get_global_id(0)] = s.s0 + s.s1 + s.s2 + s.s3 + s.s4 + s.s5 + s.s6 + s.s7;\n}\n"
)
_FMA_ITERS = 512
_FMA_ITEMS_PER_UNIT = 2048  # work-items per compute unit: every GPU's lanes kept busy


@dataclass(frozen=True)
class LaunchWork:
    """What one launch must do.

    Attributes:
        nbytes: bytes of its buffer arguments (`GpuProgram.launch_bytes`).
        flops: its FLOPs (`Launch.flops`; 0: unknown or none).
        node_s: the cost of launching it (one graph node, or one enqueue), seconds.
    """

    nbytes: int
    flops: int
    node_s: float = 0.0


def kernel_floor(nbytes: int, flops: int, gbps: float, gflops: float) -> float:
    """Seconds a kernel needs at least: ``max(bytes / bandwidth, FLOPs / rate)``.

    Args:
        nbytes: bytes it moves.
        flops: floating-point operations it does.
        gbps: peak bandwidth, GB/s (10^9 bytes a second).
        gflops: peak fp32 rate, GFLOP/s.

    Raises:
        ValueError: a peak is not positive.
    """
    if gbps <= 0 or gflops <= 0:
        raise ValueError(f"peaks must be positive, got {gbps} GB/s and {gflops} GFLOP/s")
    return max(nbytes / (gbps * 1e9), flops / (gflops * 1e9))


def model_floor(work: Iterable[LaunchWork], gbps: float, gflops: float) -> dict[str, float]:
    """The floor of a sequence of launches, seconds.

    Returns:
        ``kernels_s`` (the sum of each launch's `kernel_floor`), ``launches_s`` (the sum of
        the launches' node costs) and ``floor_s`` (both).

    Raises:
        ValueError: a peak is not positive.
    """
    kernels = launches = 0.0
    for w in work:
        kernels += kernel_floor(w.nbytes, w.flops, gbps, gflops)
        launches += w.node_s
    return {"kernels_s": kernels, "launches_s": launches, "floor_s": kernels + launches}


# ------------------------------------------------------------------------------ measuring


def _executor(handle: DeviceHandle, program: GpuProgram) -> Any:
    from litekiln.runtime.executor import PartitionExecutor

    return PartitionExecutor(program, {}, handle.context, handle.queue, profile=handle.profile)


def _local_size(handle: DeviceHandle) -> int:
    p = handle.profile
    return max(1, min(256, p.max_work_group_size, p.max_work_item_sizes[0]))


def _best_device_time(ex: Any, reps: int) -> float:
    """The shortest device time of the program's only launch over ``reps`` runs (after one
    warm-up run: a driver may compile a kernel at its first launch)."""
    ex.profile()
    return min(ex.profile()[0] for _ in range(max(1, reps)))


def copy_bytes(handle: DeviceHandle) -> int:
    """The buffer `measure_bandwidth` copies: 256 MiB on a GPU (far beyond its caches), 64
    MiB elsewhere (a CPU's caches are tens of MiB; the machine is shared), within the
    device's allocation limit and an eighth of its memory."""
    device = handle.device
    want = (256 if handle.profile.kind == "gpu" else 64) * _MIB
    cap = min(int(device.max_mem_alloc_size), int(device.global_mem_size) // 8)
    step = 16 * _local_size(handle)  # float4 per work-item, whole work-groups
    return max(step, min(want, cap) // step * step)


def measure_bandwidth(handle: DeviceHandle, *, nbytes: int | None = None, reps: int = 5) -> float:
    """Peak memory bandwidth, GB/s: a streaming copy of ``nbytes`` (default `copy_bytes`),
    read and written once (2 x ``nbytes`` moved), the fastest of ``reps`` runs.

    Raises:
        ExecutorError: the copy kernel does not build or launch here.
    """
    local = _local_size(handle)
    n = nbytes if nbytes is not None else copy_bytes(handle)
    items = n // 16
    program = GpuProgram(
        source=_COPY_SOURCE,
        build_options="",
        kernels=["litekiln_copy"],
        storages=[StorageSpec(0, n), StorageSpec(1, n)],
        tensors=[
            TensorSpec(0, 0, 0, (n // 4,), "float32"),
            TensorSpec(1, 1, 0, (n // 4,), "float32"),
        ],
        constants={},
        inputs=[],
        outputs=[],
        launches=[Launch("litekiln_copy", (BufferArg(0), BufferArg(1)), (items,), (local,))],
    )
    seconds = _best_device_time(_executor(handle, program), reps)
    return 2 * items * 16 / seconds / 1e9


def measure_compute(handle: DeviceHandle, *, reps: int = 5) -> float:
    """Peak fp32 rate, GFLOP/s: chains of vector multiply-adds (2 FLOPs a lane) in
    ``compute units x 2048`` work-items, the fastest of ``reps`` runs.

    Raises:
        ExecutorError: the kernel does not build or launch here.
    """
    local = _local_size(handle)
    units = max(1, int(handle.device.max_compute_units))
    items = -(-units * _FMA_ITEMS_PER_UNIT // local) * local
    program = GpuProgram(
        source=_FMA_SOURCE,
        build_options="",
        kernels=["litekiln_fma"],
        storages=[StorageSpec(0, 4 * items)],
        tensors=[TensorSpec(0, 0, 0, (items,), "float32")],
        constants={},
        inputs=[],
        outputs=[],
        launches=[
            Launch(
                "litekiln_fma",
                (
                    BufferArg(0),
                    ScalarArg(0.999, "float"),
                    ScalarArg(1e-3, "float"),
                    ScalarArg(_FMA_ITERS, "int"),
                ),
                (items,),
                (local,),
            )
        ],
    )
    seconds = _best_device_time(_executor(handle, program), reps)
    return 2 * _LANES * _CHAINS * _FMA_ITERS * items / seconds / 1e9


def _empty_program(launches: int) -> GpuProgram:
    """``launches`` launches of one empty kernel (one work-item each)."""
    kernel = "litekiln_empty"  # the one kernel of EMPTY_PROGRAM
    return GpuProgram(
        source=EMPTY_PROGRAM,
        build_options="",
        kernels=[kernel],
        storages=[],
        tensors=[],
        constants={},
        inputs=[],
        outputs=[],
        launches=[Launch(kernel, (), (1,), (1,))] * launches,
    )


def launch_cost(handle: DeviceHandle, *, launches: int = 1000, reps: int = 5) -> float:
    """Seconds one OpenCL launch costs: ``launches`` empty kernels enqueued by the
    executors' own launch loop and waited for, the wall-clock time divided by their number
    (median of ``reps``, after a warm-up). Host enqueue and the device's gap between
    kernels, whichever is longer, as a model's launches pay them.

    Raises:
        ExecutorError: the empty kernel does not build or launch here.
    """
    ex = _executor(handle, _empty_program(launches))
    ex.run(wait=True)
    times = []
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        ex.run(wait=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / launches


def graph_node_cost(
    handle: DeviceHandle, cuda_device: Any, *, nodes: int = 1000, reps: int = 10
) -> float:
    """Seconds one kernel node of a CUDA graph costs: a graph of ``nodes`` empty kernels
    (the PTX that the OpenCL driver builds for the empty kernel, run as the partitions' graphs
    are) replayed ``reps`` times, the median device time (CUDA events) divided by ``nodes``.

    Args:
        handle: the OpenCL device (NVIDIA's: it builds the PTX).
        cuda_device: the same GPU's `litekiln.runtime.cuda.CudaDevice`.

    Raises:
        CudaUnsupported: the graph cannot be made here.
        ExecutorError: the empty kernel does not build on the OpenCL device.
    """
    from litekiln.runtime.cuda import CudaUnsupported

    program = _empty_program(nodes)
    ptx = _executor(handle, program).binary
    if not ptx:
        raise CudaUnsupported("the OpenCL driver reports no binary for the empty kernel")
    return empty_graph_seconds(program, ptx, cuda_device, reps) / nodes


def empty_graph_seconds(program: GpuProgram, ptx: bytes, cuda_device: Any, reps: int) -> float:
    """Median device time of ``program`` (empty kernels) replayed as one CUDA graph.

    Raises:
        CudaUnsupported: the graph cannot be made here.
    """
    from litekiln.runtime.cuda import CudaGraphExecutor

    graph = CudaGraphExecutor(program, {}, ptx, cuda_device)
    return graph.graph_time(reps=max(1, reps))
