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
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from litekiln.model.ir import Model, Op, Subgraph, Tensor
from litekiln.model.loader import check_graph
from litekiln.model.schema import builtin_code
from litekiln.ops.base import validate_model
from litekiln.ops.control import callees, decomposition, unroll_plan
from litekiln.ops.conv3d_as_2d import conv3d_as_2d, conv3d_by_depth
from litekiln.ops.fold import fold_op
from litekiln.ops.pad_pool import pad_pool_as_mean
from litekiln.ops.rnn import expand_rnn, expand_svdf
from litekiln.ops.sdpa import SDPA, expand_sdpa
from litekiln.ops.spectral import rfft_as_products
from litekiln.ops.unroll_lstm import expand_sequence_lstm

log = logging.getLogger("litekiln")


def check_and_rewrite(model: Model) -> None:
    """The loader's model check: each op of the main graph validated, then (a WHILE)
    unrolled or (any other op) folded if its inputs are known, in op order, so that each op
    is checked against the constants and the unrolled steps before it. A float
    UNIDIRECTIONAL_SEQUENCE_LSTM is expanded into its steps the same way
    (:mod:`litekiln.ops.unroll_lstm`), a CONV_3D with a window of one along an axis
    becomes a CONV_2D (:mod:`litekiln.ops.conv3d_as_2d`), and a zero PAD that one
    whole-map average pool reads becomes a SUM (:mod:`litekiln.ops.pad_pool`). Once a loop is
    unrolled, the ops after it are also simplified (:func:`simplify_op`) before they fold,
    and the ops nothing reads any more are dropped at the end."""
    unrolled = False

    def after_op(op: Op, graph: Subgraph) -> None:
        nonlocal unrolled
        if op.name == "WHILE" and unroll_while(op, graph, where=graph.name):
            unrolled = True
            return
        if op.name == "UNIDIRECTIONAL_SEQUENCE_LSTM" and expand_sequence_lstm(op, graph):
            return  # (its steps are checked next)
        if op.name == "CONV_3D" and (conv3d_as_2d(op, graph) or conv3d_by_depth(op, graph)):
            return  # (the CONV_2D and the ops around it are checked next)
        if op.name in ("PAD", "PADV2") and pad_pool_as_mean(op, graph):
            return  # (the SUM and the MUL that replace it and its pool are checked next)
        if op.name == "RFFT2D" and rfft_as_products(op, graph):
            return  # (the products and the ops around them are checked next)
        if op.name in ("RNN", "UNIDIRECTIONAL_SEQUENCE_RNN") and expand_rnn(op, graph):
            return  # (its steps are checked next)
        if op.name == "SVDF" and expand_svdf(op, graph):
            return  # (its ops are checked next)
        if op.name == "STABLEHLO_COMPOSITE" and inline_composite(op, graph):
            return  # (its decomposition's ops are checked next)
        if unrolled:
            simplify_op(op, graph)
        fold_op(op, graph)

    validate_model(model, after_op=after_op)
    if unrolled:
        batch_step_products(model.main)
        _drop_dead_ops(model.main)


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
    steps = _needed(inliner.ops, rest, graph.kept_outputs)
    graph.replace_op(op, steps)
    check_graph(graph, where or graph.name)
    log.info(
        "%s unrolled: %d steps of %d ops, %d ops kept",
        op.describe(),
        n,
        len(body.live_ops()),
        len(steps),
    )
    return True


def inline_composite(op: Op, graph: Subgraph) -> bool:
    """Replace the STABLEHLO_COMPOSITE ``op`` of ``graph`` by its decomposition's ops (once,
    as one step of a loop); whether it was. The decomposition's activations become new
    tensors named ``<its tensor>/<composite name>_<op index>``, its constants are new
    tensors sharing the decomposition's arrays, and its outputs are
    written to the op's own output tensors. A composite whose output is a graph output that
    the decomposition does not compute (an input passed through, a constant) stays an op,
    run on the CPU by the numpy reference."""
    if op.options.get("name") == SDPA and expand_sdpa(op, graph):
        return True  # (computed from its inputs, as LiteRT's XNNPACK does: `litekiln.ops.sdpa`)
    callee = decomposition(op, graph)
    written = {t for b in callee.live_ops() for t in b.outputs}
    targets: dict[int, int] = {}
    for t, dst in zip(callee.outputs, op.outputs, strict=True):
        if t in written and t not in targets:
            targets[t] = dst
        elif dst in graph.kept_outputs:
            log.warning(
                "%s stays an op on the CPU: graph output %r is an input or constant of its "
                "decomposition",
                op.describe(),
                graph.tensors[dst].name,
            )
            return False
    inliner = _Inliner(graph, callee)
    label = str(op.options.get("name") or "composite").rsplit(".", 1)[-1]
    results = inliner.step(list(op.inputs), op.index, targets, tag=label)
    rest = graph.ops[op.index + 1 :]
    alias = {dst: t for dst, t in zip(op.outputs, results, strict=True) if dst != t}
    for later in rest:
        later.inputs = [alias.get(t, t) for t in later.inputs]
    graph.replace_op(op, inliner.ops)
    log.info("%s (%s) inlined: %d ops", op.describe(), op.options.get("name"), len(inliner.ops))
    return True


class _Inliner:
    """Copies of a body's ops into a graph, step by step."""

    def __init__(self, graph: Subgraph, body: Subgraph) -> None:
        self.graph = graph
        self.body = body
        self.constants: dict[int, int] = {}  # body constant -> its one copy in the graph
        self.ops: list[Op] = []

    def step(
        self, current: Sequence[int], k: int, targets: dict[int, int], tag: str = "step"
    ) -> list[int]:
        """Inline one step reading the loop variables ``current`` (tensor indices of the
        graph); body tensors in ``targets`` are written to the given graph tensors; the
        step's new tensors are named ``<body tensor>/<tag>_<k>``. Returns the tensors that
        hold the loop variables after the step."""
        body = self.body
        names = dict(zip(body.inputs, current, strict=True))
        for b in body.live_ops():
            inputs = [self._resolve(t, names) for t in b.inputs]
            outputs = []
            for t in b.outputs:
                if t >= 0:
                    names[t] = (
                        targets[t]
                        if t in targets
                        else self._tensor(body.tensors[t], f"{tag}_{k}").index
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

    def _tensor(self, src: Tensor, step: str | None) -> Tensor:
        """A new tensor of the graph like the body's ``src`` (a step's copy, named
        ``<name>/<step>``, or the one copy of a constant when ``step`` is None), appended
        after the graph's tensors."""
        tensors = self.graph.tensors
        copy = Tensor(
            index=len(tensors),
            name=src.name if step is None else f"{src.name}/{step}",
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


# -- the unrolled graph simplified ------------------------------------------------------------
#
# Keras writes a step's output into its sequence buffer as CONCATENATION(SLICE(buffer, rows
# before k), new row, SLICE(buffer, rows after k)). Unrolled, each buffer is made from the
# previous one, and a GPU compiler that fuses these movements inlines the chain into one
# expression that doubles at every step (a 32-step GRU never finished compiling). A SLICE of
# a CONCATENATION that takes whole operands is those operands, and a CONCATENATION of a
# CONCATENATION along the same axis is one: after both, the last buffer is the steps' rows
# concatenated once, and the rows before a step are the earlier steps' rows.


def simplify_op(op: Op, graph: Subgraph) -> bool:
    """Rewrite ``op`` (checked, not yet folded) into a simpler op of the same outputs:
    a SLICE of a CONCATENATION along its axis becomes the operands it takes (a SLICE of the
    one operand it falls in, a CONCATENATION of the whole ones), and a CONCATENATION's
    operands that are CONCATENATIONs along the same axis are replaced by theirs. Whether it
    changed ``op``."""
    if op.folded:
        return False
    if op.name == "SLICE":
        return _slice_of_concat(op, graph)
    if op.name == "CONCATENATION":
        return _flatten_concat(op, graph)
    return False


def _plain_concat(graph: Subgraph, t: int) -> tuple[Op, int] | None:
    """The live CONCATENATION that writes ``t`` and its axis, when it only moves values
    (no fused activation, no quantization to rescale)."""
    producer = graph.producers().get(t)
    if producer is None:
        return None
    cat = graph.ops[producer]
    if cat.name != "CONCATENATION" or cat.folded or cat.options.get("fused_activation_function"):
        return None
    tensors = [graph.tensors[u] for u in [*cat.inputs, *cat.outputs] if u >= 0]
    if any(u.quantization is not None for u in tensors):
        return None
    rank = len(graph.tensors[t].shape)
    return cat, int(cat.options.get("axis", 0)) % max(rank, 1)


def _flatten_concat(op: Op, graph: Subgraph) -> bool:
    mine = _plain_concat(graph, op.outputs[0]) if op.outputs else None
    if mine is None or mine[0] is not op:
        return False
    axis = mine[1]
    inputs: list[int] = []
    for t in op.inputs:
        inner = _plain_concat(graph, t) if t >= 0 else None
        if inner is not None and inner[1] == axis and t not in graph.outputs:
            inputs.extend(inner[0].inputs)
        else:
            inputs.append(t)
    if inputs == op.inputs:
        return False
    op.inputs = inputs
    return True


def _slice_of_concat(op: Op, graph: Subgraph) -> bool:
    x, begin_t, size_t = (graph.tensors[t] if t >= 0 else None for t in op.inputs[:3])
    if x is None or begin_t is None or size_t is None or begin_t.data is None:
        return False
    found = _plain_concat(graph, x.index)
    out = graph.tensors[op.outputs[0]]
    if found is None or size_t.data is None or len(out.shape) != len(x.shape):
        return False
    cat, axis = found
    begin = [int(v) for v in begin_t.data.reshape(-1)]
    others = [k for k in range(len(x.shape)) if k != axis]
    if any(begin[k] != 0 or out.shape[k] != x.shape[k] for k in others):
        return False  # (only a slice along the concatenation's axis is its operands)
    lo, hi = begin[axis], begin[axis] + out.shape[axis]
    spans, start = [], 0
    for t in cat.inputs:
        n = graph.tensors[t].shape[axis]
        spans.append((t, start, start + n))
        start += n
    whole = [t for t, a, b in spans if lo <= a and b <= hi and a < b]
    if whole and sum(graph.tensors[t].shape[axis] for t in whole) == hi - lo:
        if len(whole) == 1:
            return _alias(op, graph, whole[0])
        op.name, op.code, op.version = cat.name, cat.code, cat.version
        op.options = {"axis": axis, "fused_activation_function": 0}
        op.inputs = whole
        return True
    inside = [(t, a) for t, a, b in spans if a <= lo and hi <= b and a < b]
    if len(inside) != 1:
        return False
    t, a = inside[0]
    begin[axis] -= a
    data = np.asarray(begin, begin_t.dtype).reshape(begin_t.shape)
    shifted = _new_tensor(graph, f"{begin_t.name}/shifted", begin_t.shape, begin_t.dtype, data)
    op.inputs = [t, shifted.index, *op.inputs[2:]]
    return True


def _alias(op: Op, graph: Subgraph, source: int) -> bool:
    """Make the ops after ``op`` read ``source`` where they read ``op``'s output (which is
    then unread: dropped at the end); not for a graph output."""
    out = op.outputs[0]
    if out in graph.outputs or graph.tensors[source].shape != graph.tensors[out].shape:
        return False
    for later in graph.ops[op.index + 1 :]:
        later.inputs = [source if t == out else t for t in later.inputs]
    return True


# -- the steps' input products as one ----------------------------------------------------------
#
# Each step of an unrolled Keras RNN multiplies its own row of the input sequence by the same
# input weights: GATHER(X, t) then FULLY_CONNECTED(., W). Those products read nothing the
# recurrence writes, yet each is a launch of its own in the chain of steps (a 32-step LSTM:
# 32 of its 127 launches). One FULLY_CONNECTED of all of X's rows by W computes them at once
# (LiteRT's own fused sequence kernels do the same), and each step takes its row of the
# result: a GATHER of one row, which the GPU compiler lowers as a slice and merges into the
# kernel that reads it.

#: Fewest steps' products worth batching.
_BATCH_MIN = 4


def batch_step_products(graph: Subgraph) -> int:
    """Replace the FULLY_CONNECTED ops that multiply rows of one tensor (each a GATHER of
    one constant row along axis 0) by the same constant weights into one product of all the
    rows, each op becoming a GATHER of its row of the product; how many ops were replaced.

    Only float products without kept dimensions whose rows are most of the tensor (half or
    more, each row once) are batched."""
    producers = graph.producers()
    groups: dict[tuple[Any, ...], list[tuple[Op, int]]] = {}
    for op in graph.live_ops():
        found = _row_product(op, graph, producers)
        if found is not None:
            key, row = found
            groups.setdefault(key, []).append((op, row))
    done = 0
    inserted: list[tuple[int, Op]] = []
    for (x, *_), members in groups.items():
        rows = [row for _, row in members]
        steps = graph.tensors[x].shape[0]
        if len(members) < _BATCH_MIN or len(set(rows)) != len(rows) or 2 * len(rows) < steps:
            continue
        first = members[0][0]
        n = graph.tensors[first.outputs[0]].shape[-1]
        out = _new_tensor(graph, f"{graph.tensors[first.outputs[0]].name}/all_steps",
                          [steps, n], graph.tensors[first.outputs[0]].dtype)  # fmt: skip
        batched = Op(-1, first.name, first.code, first.version,
                     [x, *first.inputs[1:]], [out.index], dict(first.options))  # fmt: skip
        inserted.append((first.index, batched))
        for op, row in members:
            index = _new_tensor(graph, f"{graph.tensors[op.outputs[0]].name}/row", [1],
                                np.dtype(np.int32), np.array([row], np.int32))  # fmt: skip
            op.name, op.code, op.version = "GATHER", builtin_code("GATHER"), 1
            op.inputs = [out.index, index.index]
            op.options = {"axis": 0, "batch_dims": 0}
        done += len(members)
    if inserted:
        at = dict(inserted)  # (each before the first step's op it replaces)
        pairs = ((at.get(i), op) for i, op in enumerate(graph.ops))
        graph.ops = [new for pair in pairs for new in pair if new is not None]
        for i, o in enumerate(graph.ops):
            o.index = i
        check_graph(graph, graph.name)
        log.info("%d steps' input products batched into %d", done, len(inserted))
    return done


def _row_product(
    op: Op, graph: Subgraph, producers: dict[int, int]
) -> tuple[tuple[Any, ...], int] | None:
    """For a FULLY_CONNECTED of one constant row of a tensor X (a live GATHER along axis 0)
    by constant weights: its batching key (X, the weights, the bias, the options) and the
    row; else None."""
    if op.name != "FULLY_CONNECTED" or len(op.inputs) < 2 or len(op.outputs) != 1:
        return None
    if op.options.get("keep_num_dims") or op.inputs[0] < 0:
        return None
    tensors = [graph.tensors[t] for t in [*op.inputs, *op.outputs] if t >= 0]
    if any(t.quantization is not None or t.dtype != np.float32 for t in tensors):
        return None
    weights = graph.tensors[op.inputs[1]]
    bias = op.inputs[2] if len(op.inputs) > 2 else -1
    if weights.data is None or (bias >= 0 and graph.tensors[bias].data is None):
        return None
    g = producers.get(op.inputs[0])
    gather = graph.ops[g] if g is not None else None
    if gather is None or gather.name != "GATHER" or len(gather.inputs) != 2:
        return None
    if gather.options.get("axis", 0) != 0 or gather.options.get("batch_dims", 0) != 0:
        return None
    x, index = (graph.tensors[t] for t in gather.inputs)
    if index.data is None or index.data.size != 1 or x.data is not None or len(x.shape) < 2:
        return None
    k = weights.shape[-1]
    out = graph.tensors[op.outputs[0]]
    if math.prod(x.shape[1:]) != k or list(out.shape) != [1, weights.shape[0]]:
        return None
    row = int(index.data.reshape(-1)[0])
    if not 0 <= row < x.shape[0]:
        return None
    options = tuple(sorted(op.options.items()))
    return (x.index, weights.index, bias, op.version, options), row


def _new_tensor(graph: Subgraph, name: str, shape: Sequence[int], dtype: np.dtype,
                data: np.ndarray | None = None) -> Tensor:  # fmt: skip
    """A new tensor of ``graph`` (appended after its tensors): a constant where ``data``."""
    t = Tensor(index=len(graph.tensors), name=name, shape=tuple(shape), dtype=dtype,
               shape_signature=tuple(shape), data=data)  # fmt: skip
    graph.tensors.append(t)
    return t


def _drop_dead_ops(graph: Subgraph) -> None:
    """Drop the live ops whose outputs nothing reads (no later op, no graph output) and
    renumber the ops."""
    need = set(graph.kept_outputs)
    keep: list[Op] = []
    for op in reversed(graph.ops):
        if not op.folded and need.isdisjoint(op.outputs):
            continue
        keep.append(op)
        if not op.folded:
            need.update(op.inputs)
    keep.reverse()
    if len(keep) == len(graph.ops):
        return
    graph.ops = keep
    for i, op in enumerate(keep):
        op.index = i
