"""Partition a graph into GPU partitions and CPU ops.

Each live op asks its registry definition whether the GPU path can run it
(:meth:`~litekiln.ops.base.OpDef.gpu_support`, which knows the GPU op table, version limits
and per-op constraints). The ops are then re-ordered topologically, preferring to stay on the
same side as long as the dependencies allow, so that GPU ops cluster into as few partitions as
possible. Each maximal run of GPU ops in that order is one partition; a run in a topological
order can never depend on itself through the CPU, so every partition is acyclic by
construction. Partitions beyond ``max_partitions`` (smallest first) and partitions of fewer
than ``min_partition_ops`` ops go back to the CPU: their CPU/GPU synchronisation would cost
more than they save.

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
        outputs: tensors produced inside and read outside (or graph outputs).
        constants: constant tensors the partition reads.
    """

    index: int
    ops: list[int]
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    constants: list[int] = field(default_factory=list)


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
    op: Op, graph: Subgraph, *, allow_quantized: bool = True, extended_table: bool = False
) -> str | None:
    """None if ``op`` can go to the GPU, else why not.

    Args:
        op: the op.
        graph: its subgraph.
        allow_quantized: accept quantized op versions (float view).
        extended_table: also accept ops outside the documented GPU op table that the TFLite
            GPU delegate runs (MEAN, HARD_SWISH, TANH, DIV, DEPTH_TO_SPACE, ...).
    """
    try:
        cls = lookup(op)
    except UnsupportedOpError:
        return "not supported by litekiln"
    if not cls.gpu and not (extended_table and cls.gpu_extended):
        return "not in the GPU op table" + (
            " (it is in the extended table: op_table='extended')" if cls.gpu_extended else ""
        )
    return cls.gpu_support(op, graph, allow_quantized=allow_quantized)


def partition(
    graph: Subgraph,
    *,
    allow_quantized: bool = True,
    max_partitions: int = 8,
    min_partition_ops: int = 1,
    force_cpu: set[int] | None = None,
    extended_table: bool = False,
    keep_all_outputs: bool = False,
) -> PartitionPlan:
    """Split a subgraph into GPU partitions and CPU ops.

    Args:
        graph: the subgraph (ops in a valid execution order).
        allow_quantized: accept the quantized versions of GPU ops (float view).
        max_partitions: most partitions to delegate; the smallest beyond that go to the CPU.
        min_partition_ops: partitions smaller than this go to the CPU.
        force_cpu: op indices to keep on the CPU regardless (debugging, validation).
        extended_table: also delegate ops the TFLite GPU delegate runs beyond its documented
            table (see :func:`gpu_reason`).
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
    keep = sorted(range(len(runs)), key=lambda k: -len(runs[k]))[: max(max_partitions, 0)]
    for k, run in enumerate(runs):
        if k not in keep:
            for i in run:
                reasons[i] = (
                    f"partition of {len(run)} ops beyond the {max_partitions}-partition limit"
                )
        elif len(run) < min_partition_ops:
            for i in run:
                reasons[i] = f"partition of {len(run)} ops is smaller than {min_partition_ops}"

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


def _clustered_order(graph: Subgraph, live: list[Op], cpu: set[int]) -> list[int]:
    """Topological order of ``live`` that stays on one side (GPU/CPU) as long as it can."""
    producers = graph.producers()
    deps: dict[int, set[int]] = {op.index: set() for op in live}
    users: dict[int, list[int]] = defaultdict(list)
    for op in live:
        for t in op.inputs:
            p = producers.get(t)
            if p is not None and p != op.index and p not in deps[op.index]:
                deps[op.index].add(p)
                users[p].append(op.index)
    pending = {i: len(d) for i, d in deps.items()}
    position = {op.index: k for k, op in enumerate(live)}
    ready = sorted((i for i, n in pending.items() if n == 0), key=position.__getitem__)
    order: list[int] = []
    side_gpu = True
    while ready:
        same = [i for i in ready if (i not in cpu) == side_gpu]
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
    graph_outputs = set(graph.outputs)
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
