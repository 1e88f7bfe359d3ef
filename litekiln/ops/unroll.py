"""Loops unrolled at load: a WHILE with a static trip count becomes its body, N times.

Keras' recurrent layers convert to a WHILE over the time steps whose step counter starts
from a constant and whose bound is a constant (the sequence length): its trip count is
known at load (:func:`litekiln.ops.control.static_trip_count`). The loader then replaces
the WHILE in the main graph by the body's live ops, once per step, and drops the cond:

* each step's activations are new tensors of the main graph (appended after the file's
  tensors, named ``<body tensor>/step_<k>``); the body's constants are appended once and
  shared by every step (the weights are not copied);
* step k reads the tensors step k-1 wrote (step 0 the WHILE's inputs); the last step writes
  the WHILE's output tensors themselves, so the ops after the loop, the graph inputs and the
  graph outputs keep their tensors. A loop variable the last step does not write (passed
  through, or a loop that never runs) is read from where its value is;
* the inlined ops the rest of the graph never reads are dropped (the step counter, once its
  uses have been folded);
* the ops are renumbered: the ops after the loop move by the number of ops inlined less one.

The loader then checks the inlined ops and folds them as it does every op, in order
(:func:`check_and_rewrite`): the counter and everything computed from it (the GATHER index of
the step's input, the SLICE bounds where Keras writes the step's output) become constants,
so the partitioner sees plain FULLY_CONNECTED, LOGISTIC, TANH, MUL... ops, and the model
runs whole on the GPU. A WHILE that cannot be unrolled stays a loop on the CPU (the numpy
reference runs its subgraphs), with a warning that says why; so does any loop that would add
more than :data:`~litekiln.ops.control.UNROLL_MAX_OPS` ops.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from litekiln.model.ir import Model, Op, Subgraph, Tensor
from litekiln.model.loader import check_graph
from litekiln.ops.base import validate_model
from litekiln.ops.control import callees, unroll_plan
from litekiln.ops.fold import fold_op

log = logging.getLogger("litekiln")


def check_and_rewrite(model: Model) -> None:
    """The loader's model check: each op of the main graph validated, then (a WHILE)
    unrolled or (any other op) folded if its inputs are known, in op order, so that each op
    is checked against the constants and the unrolled steps before it."""
    validate_model(model, after_op=_unroll_or_fold)


def _unroll_or_fold(op: Op, graph: Subgraph) -> None:
    if op.name == "WHILE" and unroll_while(op, graph, where=graph.name):
        return
    fold_op(op, graph)


def unroll_while(op: Op, graph: Subgraph, *, where: str = "") -> bool:
    """Replace the WHILE ``op`` of ``graph`` by its body, once per step; whether it was.

    The ops that take its place start at ``op.index``; the ops after it are renumbered.
    """
    n, why = unroll_plan(op, graph)
    if n is None:
        log.warning("%s stays a loop on the CPU: %s", op.describe(), why)
        return False
    _, body = callees(op, graph)
    written = {t for b in body.live_ops() for t in b.outputs}
    inliner = _Inliner(graph, body)
    current = list(op.inputs)
    for k in range(n):
        targets: dict[int, int] = {}
        if k == n - 1:
            for t, dst in zip(body.outputs, op.outputs, strict=True):
                if t in written and t not in targets:
                    targets[t] = dst
        current = inliner.step(current, k, targets)
    rest = graph.ops[op.index + 1 :]
    alias = {dst: t for dst, t in zip(op.outputs, current, strict=True) if dst != t}
    for later in rest:
        later.inputs = [alias.get(t, t) for t in later.inputs]
    steps = _needed(inliner.ops, rest, graph.outputs)
    graph.ops = [*graph.ops[: op.index], *steps, *rest]
    for i, o in enumerate(graph.ops):
        o.index = i
    graph.__dict__.pop("is_quantized", None)  # (a cached property: the body's tensors count)
    check_graph(graph, where or graph.name)
    log.info(
        "%s unrolled: %d steps of %d ops, %d ops kept",
        op.describe(),
        n,
        len(body.live_ops()),
        len(steps),
    )
    return True


class _Inliner:
    """Copies of a body's ops into a graph, step by step."""

    def __init__(self, graph: Subgraph, body: Subgraph) -> None:
        self.graph = graph
        self.body = body
        self.constants: dict[int, int] = {}  # body constant -> its one copy in the graph
        self.ops: list[Op] = []

    def step(self, current: Sequence[int], k: int, targets: dict[int, int]) -> list[int]:
        """Inline one step reading the loop variables ``current`` (tensor indices of the
        graph); body tensors in ``targets`` are written to the given graph tensors.
        Returns the tensors that hold the loop variables after the step."""
        body = self.body
        names = dict(zip(body.inputs, current, strict=True))
        for b in body.live_ops():
            inputs = [self._resolve(t, names) for t in b.inputs]
            outputs = []
            for t in b.outputs:
                if t >= 0:
                    names[t] = (
                        targets[t] if t in targets else self._tensor(body.tensors[t], k).index
                    )
                outputs.append(names.get(t, -1))
            self.ops.append(
                Op(
                    -1,
                    b.name,
                    b.code,
                    b.version,
                    inputs,
                    outputs,
                    dict(b.options),
                    b.custom_code,
                    b.custom_options,
                )
            )
        return [self._resolve(t, names) for t in body.outputs]

    def _resolve(self, t: int, names: dict[int, int]) -> int:
        if t < 0:
            return -1
        if t in names:
            return names[t]
        if t not in self.constants:  # (check_graph: the body reads nothing else)
            src = self.body.tensors[t]
            copy = self._tensor(src, None)
            copy.data = src.data
            copy.was_sparse, copy.int4 = src.was_sparse, src.int4
            self.constants[t] = copy.index
        return self.constants[t]

    def _tensor(self, src: Tensor, step: int | None) -> Tensor:
        """A new tensor of the graph like the body's ``src`` (a step's copy, or the one copy
        of a constant when ``step`` is None), appended after the graph's tensors."""
        tensors = self.graph.tensors
        copy = Tensor(
            index=len(tensors),
            name=src.name if step is None else f"{src.name}/step_{step}",
            shape=src.shape,
            dtype=src.dtype,
            shape_signature=src.shape,  # static: the checks give it the shape the op computes
            quantization=src.quantization,
        )
        tensors.append(copy)
        return copy


def _needed(steps: list[Op], rest: list[Op], outputs: list[int]) -> list[Op]:
    """The inlined ops whose outputs the rest of the graph reads, directly or not."""
    need = set(outputs)
    for op in rest:
        need.update(op.inputs)
    kept = []
    for op in reversed(steps):
        if need.isdisjoint(op.outputs):
            continue
        kept.append(op)
        need.update(op.inputs)
    kept.reverse()
    return kept
