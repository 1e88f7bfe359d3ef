"""Partition a graph into GPU partitions and CPU ops.

Each live op asks whether the GPU path can run it (:func:`gpu_reason`: the op table, then
:meth:`~litekiln.ops.base.OpDef.gpu_support`, which knows each op's constraints and the
features its GPU form lacks). The ops are then re-ordered topologically, preferring to stay on the
same side as long as the dependencies allow, so that GPU ops cluster into as few partitions as
possible. Each maximal run of GPU ops in that order is one partition; a run in a topological
order can never depend on itself through the CPU, so every partition is acyclic by
construction. There is no cap on partitions by default: when some ops must run on the CPU,
a partition goes back to the CPU only when its ops cost the CPU less than the CPU/GPU round
trip it costs ("Fragment costs" below). ``max_partitions`` and ``min_partition_ops`` set a
fixed cap and size instead.

This module is pure Python (no TVM): ``litekiln inspect`` and the runtime can use it.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TextIO

from litekiln.errors import UnsupportedOpError
from litekiln.model.ir import Op, Subgraph
from litekiln.ops import lookup


@dataclass
class Partition:
    """A set of ops that run on the GPU as one compiled program.

    Attributes:
        index: partition number (execution order).
        ops: op indices, in execution order.
        inputs: non-constant tensors read from outside the partition (graph order).
        outputs: tensors produced inside and read outside (or graph outputs, or the new
            values of variable tensors: ``Subgraph.variable_updates``).
        constants: constant tensors the partition reads.
    """

    index: int
    ops: list[int]
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    constants: list[int] = field(default_factory=list)

    def readers(self, graph: Subgraph) -> dict[int, list[int]]:
        """Tensor -> the ops of this partition that read it, in the partition's order (an op
        that reads a tensor twice listed once)."""
        out: dict[int, list[int]] = {}
        for i in self.ops:
            for t in dict.fromkeys(graph.ops[i].inputs):
                if t >= 0:
                    out.setdefault(t, []).append(i)
        return out


@dataclass
class Step:
    """One step of the execution plan: a GPU partition or a single CPU op."""

    kind: str  # "gpu" or "cpu"
    partition: int | None = None
    op: int | None = None


@dataclass
class PartitionPlan:
    """The result of partitioning: the steps in order, and why each CPU op is on the CPU."""

    partitions: list[Partition]
    steps: list[Step]
    cpu_reasons: dict[int, str]  # op index -> reason
    graph: Subgraph

    @property
    def gpu_op_count(self) -> int:
        return sum(len(p.ops) for p in self.partitions)

    @property
    def cpu_op_count(self) -> int:
        return sum(1 for s in self.steps if s.kind == "cpu")

    def warning_lines(self) -> list[str]:
        """TFLite-style warnings, one per offending op code, then the summary line."""
        by_code: dict[int, list[Op]] = defaultdict(list)
        for i in self.cpu_reasons:
            op = self.graph.ops[i]
            by_code[op.code].append(op)
        lines = []
        for code in sorted(by_code):
            ops = by_code[code]
            lines.append(f"WARNING: op code #{code} cannot be handled by this delegate.")
            names = sorted({o.custom_code or o.name for o in ops})
            kind = "custom code" if ops[0].is_custom else "op"
            for name in names:
                sample = [o for o in ops if (o.custom_code or o.name) == name]
                why = self.cpu_reasons[sample[0].index]
                where = ", ".join(f"#{o.index}" for o in sample[:6]) + (
                    ", ..." if len(sample) > 6 else ""
                )
                lines.append(f"  {kind} {name} ({len(sample)}x: ops {where}): {why}")
        lines.append(self.summary())
        return lines

    def without(self, failed: Mapping[int, str]) -> PartitionPlan:
        """The plan with the partitions in ``failed`` (index -> why) on the CPU, op by op in
        their order, each op with that reason; the other partitions renumbered in order."""
        keep = [p for p in self.partitions if p.index not in failed]
        number = {p.index: k for k, p in enumerate(keep)}
        steps: list[Step] = []
        reasons = dict(self.cpu_reasons)
        for s in self.steps:
            if s.kind == "cpu" or s.partition is None:
                steps.append(s)
            elif s.partition in failed:
                for i in self.partitions[s.partition].ops:
                    steps.append(Step("cpu", op=i))
                    reasons[i] = failed[s.partition]
            else:
                steps.append(Step("gpu", partition=number[s.partition]))
        partitions = [replace(p, index=number[p.index]) for p in keep]
        in_order = {s.op: reasons[s.op] for s in steps if s.kind == "cpu" and s.op is not None}
        return PartitionPlan(partitions, steps, in_order, self.graph)

    def summary(self) -> str:
        g, c, p = self.gpu_op_count, self.cpu_op_count, len(self.partitions)
        return (
            f"litekiln: {g} op{'s' if g != 1 else ''} run on the GPU in {p} "
            f"partition{'s' if p != 1 else ''}, {c} op{'s' if c != 1 else ''} on the CPU."
        )

    def print_warnings(self, stream: TextIO | None = None) -> None:
        stream = stream or sys.stderr
        for line in self.warning_lines():
            print(line, file=stream)


def gpu_reason(
    op: Op, graph: Subgraph, *, allow_quantized: bool = True, extended_table: bool = True
) -> str | None:
    """None if ``op`` can go to the GPU, else why not.

    Args:
        op: the op.
        graph: its subgraph.
        allow_quantized: accept quantized op versions (float view).
        extended_table: every op, at every version, that litekiln's GPU path implements (the
            default); False: the TFLite GPU delegate's documented table only, with its
            version limits (``op_table="documented"``).
    """
    try:
        cls = lookup(op)
    except UnsupportedOpError:
        return "not supported by litekiln"
    if not (cls.gpu or cls.gpu_extended):
        return cls.cpu_reason(op, graph)
    if not extended_table:
        if not cls.gpu:
            return "not in the documented GPU op table (op_table='documented')"
        limit = cls.documented_version_limit(op, graph, allow_quantized)
        if op.version > limit:
            return (
                f"version {op.version} > {limit}, the newest the documented GPU op table "
                "lists (op_table='documented')"
            )
    return cls.gpu_support(op, graph, allow_quantized=allow_quantized)


def partition(
    graph: Subgraph,
    *,
    allow_quantized: bool = True,
    max_partitions: int = 0,
    min_partition_ops: int = 0,
    force_cpu: set[int] | None = None,
    extended_table: bool = True,
    keep_all_outputs: bool = False,
) -> PartitionPlan:
    """Split a subgraph into GPU partitions and CPU ops.

    Args:
        graph: the subgraph (ops in a valid execution order).
        allow_quantized: accept the quantized versions of GPU ops (float view).
        max_partitions: most partitions to delegate; the smallest beyond that go to the CPU
            (0: no cap).
        min_partition_ops: partitions smaller than this go to the CPU; 0 (the default):
            decide by cost (:func:`worth_a_round_trip`): when some ops must run on the CPU,
            a partition whose ops the CPU runs faster than one CPU/GPU round trip costs
            goes to the CPU.
        force_cpu: op indices to keep on the CPU regardless (debugging, validation).
        extended_table: every op litekiln's GPU path implements (default); False: the
            documented table only (see :func:`gpu_reason`).
        keep_all_outputs: every tensor a partition's ops compute is one of its outputs (kept
            after the inference), not only those read outside it.

    Returns:
        The plan: partitions, steps in execution order, reasons for CPU ops.
    """
    live = graph.live_ops()
    reasons: dict[int, str] = {}
    for op in live:
        if force_cpu and op.index in force_cpu:
            reasons[op.index] = "forced onto the CPU"
            continue
        r = gpu_reason(op, graph, allow_quantized=allow_quantized, extended_table=extended_table)
        if r is not None:
            reasons[op.index] = r

    order = _clustered_order(graph, live, set(reasons))
    runs: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if i in reasons:
            if current:
                runs.append(current)
                current = []
        else:
            current.append(i)
    if current:
        runs.append(current)

    # Keep the biggest partitions within the limit; the rest run on the CPU.
    ranked = sorted(range(len(runs)), key=lambda k: -len(runs[k]))
    keep = set(ranked[:max_partitions] if max_partitions > 0 else ranked)
    for k, run in enumerate(runs):
        if k not in keep:
            for i in run:
                reasons[i] = (
                    f"partition of {len(run)} ops beyond the {max_partitions}-partition limit"
                )
        elif min_partition_ops > 0 and len(run) < min_partition_ops:
            for i in run:
                reasons[i] = f"partition of {len(run)} ops is smaller than {min_partition_ops}"
        elif min_partition_ops == 0 and reasons:
            why = worth_a_round_trip(graph, run)
            if why is not None:
                for i in run:
                    reasons[i] = why

    # Re-form steps: consecutive GPU ops (in the chosen order) make one partition.
    steps: list[Step] = []
    partitions: list[Partition] = []
    for i in order:
        if i in reasons:
            steps.append(Step("cpu", op=i))
            continue
        if not steps or steps[-1].kind != "gpu":
            partitions.append(Partition(len(partitions), []))
            steps.append(Step("gpu", partition=partitions[-1].index))
        partitions[-1].ops.append(i)
    _fill_boundaries(graph, partitions, steps, keep_all=keep_all_outputs)
    return PartitionPlan(partitions, steps, {i: reasons[i] for i in order if i in reasons}, graph)


# -- fragment costs -----------------------------------------------------------------------------
#
# When some ops must run on the CPU, every GPU partition costs a CPU/GPU round trip: its inputs
# written to the device, its kernels launched, its outputs read back and waited for. A small
# partition between CPU ops can cost more so than its ops cost on the CPU (the numpy reference
# is the CPU fallback). The figures are measured by scripts/bench_round_trip.py (committed
# under results/round_trip/): on PoCL here, a 1-op partition took 213 us and the numpy
# reference 29 us per small op, ~40 GB/s on cached elementwise data and 2.4 GFLOP/s on a
# convolution. The round trip is the device's; the smallest one measured is used, so that the
# GPU keeps every fragment that pays on the fastest device.

#: One CPU/GPU round trip of a partition (results/round_trip/: the smallest measured).
ROUND_TRIP_S = 213e-6
#: The numpy reference's cost per op, and its throughputs (results/round_trip/pocl.json).
CPU_OP_S = 29e-6
CPU_BYTES_PER_S = 20e9
CPU_FLOPS = 2.4e9

_MACS = {"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "BATCH_MATMUL", "TRANSPOSE_CONV"}


def cpu_seconds(graph: Subgraph, op: Op) -> float:
    """Estimated time of ``op`` on the numpy reference: a fixed cost per op, the bytes it
    moves, and the multiply-adds of the matrix and convolution ops."""
    tensors = [graph.tensors[t] for t in [*op.inputs, *op.outputs] if t >= 0]
    moved = sum(t.size * 4 for t in tensors if t.data is None)
    flops = 0.0
    if op.name in _MACS and len(op.inputs) > 1 and op.inputs[1] >= 0 and op.outputs:
        out = graph.tensors[op.outputs[0]]
        w = graph.tensors[op.inputs[1]]
        x = graph.tensors[op.inputs[0]]
        if op.name == "CONV_2D" and len(w.shape) == 4:
            flops = 2.0 * out.size * w.shape[1] * w.shape[2] * w.shape[3]
        elif op.name == "DEPTHWISE_CONV_2D" and len(w.shape) == 4:
            flops = 2.0 * out.size * w.shape[1] * w.shape[2]
        elif op.name == "FULLY_CONNECTED" and len(w.shape) == 2:
            flops = 2.0 * out.size * w.shape[1]
        elif op.name == "BATCH_MATMUL" and x.shape:
            adj_x = bool(op.options.get("adj_x", False))
            k = x.shape[-2] if adj_x and len(x.shape) > 1 else x.shape[-1]
            flops = 2.0 * out.size * k
        elif op.name == "TRANSPOSE_CONV" and len(op.inputs) > 2 and len(w.shape) == 4:
            flops = 2.0 * graph.tensors[op.inputs[2]].size * w.size
    return CPU_OP_S + moved / CPU_BYTES_PER_S + flops / CPU_FLOPS


def worth_a_round_trip(graph: Subgraph, run: list[int]) -> str | None:
    """None if the partition of ops ``run`` pays for its round trip; else why it goes to the
    CPU (the reason the compiler's warning shows)."""
    cpu = sum(cpu_seconds(graph, graph.ops[i]) for i in run)
    if cpu >= ROUND_TRIP_S:
        return None
    n = len(run)
    return (
        f"a partition of {n} op{'s' if n != 1 else ''} between CPU ops: the CPU runs "
        f"{'it' if n == 1 else 'them'} in ~{cpu * 1e6:.0f} us, less than a CPU/GPU round "
        f"trip ({ROUND_TRIP_S * 1e6:.0f} us)"
    )


def _clustered_order(graph: Subgraph, live: list[Op], cpu: set[int]) -> list[int]:
    """Topological order of ``live`` that stays on one side (GPU/CPU) as long as it can,
    the CPU ops that depend on no GPU op first (a language model's masks and cache positions,
    computed from its integer inputs: left for when the GPU ops that wait for them are all
    that is ready, they split the GPU ops in two)."""
    producers = graph.producers()
    deps: dict[int, set[int]] = {op.index: set() for op in live}
    users: dict[int, list[int]] = defaultdict(list)
    for op in live:
        for t in op.inputs:
            p = producers.get(t)
            if p is not None and p != op.index and p not in deps[op.index]:
                deps[op.index].add(p)
                users[p].append(op.index)
    host: set[int] = set()  # CPU ops with no GPU op upstream
    for op in live:  # (file order is topological)
        if op.index in cpu and deps[op.index] <= host:
            host.add(op.index)
    pending = {i: len(d) for i, d in deps.items()}
    position = {op.index: k for k, op in enumerate(live)}
    ready = sorted((i for i, n in pending.items() if n == 0), key=position.__getitem__)
    order: list[int] = []
    side_gpu = True
    while ready:
        first = [i for i in ready if i in host]
        same = first or [i for i in ready if (i not in cpu) == side_gpu]
        pick = same[0] if same else ready[0]
        side_gpu = pick not in cpu
        ready.remove(pick)
        order.append(pick)
        for u in users[pick]:
            pending[u] -= 1
            if pending[u] == 0:
                ready.append(u)
        ready.sort(key=position.__getitem__)
    if len(order) != len(live):
        raise UnsupportedOpError("the graph has a cycle; ops are not in a valid execution order")
    return order


def _fill_boundaries(
    graph: Subgraph, partitions: list[Partition], steps: list[Step], *, keep_all: bool = False
) -> None:
    owner: dict[int, int] = {}
    for p in partitions:
        for i in p.ops:
            owner[i] = p.index
    producers = graph.producers()
    readers: dict[int, set[int | str]] = defaultdict(set)  # tensor -> partitions / "cpu"
    for s in steps:
        if s.kind == "gpu":
            assert s.partition is not None  # a GPU step names its partition
            ops = partitions[s.partition].ops
        else:
            assert s.op is not None  # a CPU step names its op
            ops = [s.op]
        for i in ops:
            for t in graph.ops[i].inputs:
                if t >= 0:
                    readers[t].add(owner.get(i, "cpu"))
    graph_outputs = set(graph.kept_outputs)  # (with the variables' new values)
    for p in partitions:
        seen: set[int] = set()
        for i in p.ops:
            op = graph.ops[i]
            for t in op.inputs:
                if t < 0 or t in seen:
                    continue
                seen.add(t)
                if graph.tensors[t].is_constant:
                    p.constants.append(t)
                elif owner.get(producers.get(t, -1)) != p.index:
                    p.inputs.append(t)
            for t in op.outputs:
                if t < 0:
                    continue
                if keep_all or t in graph_outputs or readers[t] - {p.index}:
                    p.outputs.append(t)
