"""Constant folding at load: every op whose inputs are all known is evaluated once.

An op folds when each of its inputs is a constant, or when it is a SHAPE of an activation:
litekiln compiles static shapes, so every tensor's shape is known at load (a dimension its
signature leaves dynamic, such as Keras' batch, has the size the model was loaded with, and
:meth:`~litekiln.Interpreter.resize_tensor_input` folds again at the new size). Each op is
folded right after its load-time checks (:func:`check_and_fold`), so the ops after it are
checked against the constants it made, as LiteRT's kernels see them when they prepare.

The op's reference (:func:`run_op`, the same code the CPU fallback runs) computes the outputs,
which become constants, and the op is marked ``folded``: executors, the partitioner and the
compiler skip it, as they skip the loader's constant DEQUANTIZE and DENSIFY. Folding runs in
model order, so a chain folds whole: Keras writes a reshape's target as SHAPE ->
STRIDED_SLICE -> PACK -> RESHAPE, and after folding the RESHAPE reads a constant shape; a
TRANSPOSE_CONV's computed output shape becomes a constant the same way. Shape arithmetic
therefore never reaches the partitioner.

An op whose outputs are all empty (static shapes with a 0) folds too, whatever its inputs:
its value is known.

Not folded: an op that writes a graph output (the output stays a computed tensor), an op that
reads or writes a variable tensor, an op whose definition says it must not be (``foldable =
False``: it has state or randomness), an op whose outputs would be much larger than its
inputs (:data:`GROWTH_BYTES`), and an op the reference refuses (the error is raised again when
the op runs, where it belongs). Ops folded through a SHAPE are marked ``folded_shape``: their
values depend on the input shapes, and a resized model folds them again
(:mod:`litekiln.resize`).
"""

from __future__ import annotations

import logging

import numpy as np

from litekiln.errors import LitekilnError
from litekiln.model.fold import fold_candidate
from litekiln.model.ir import Model, Op, Subgraph
from litekiln.ops.base import REGISTRY, run_op, validate_model

log = logging.getLogger("litekiln")

#: A fold may grow the constants it reads by at most this many bytes (a TILE or BROADCAST_TO
#: of a small constant would otherwise put a large array into the model): beyond it, the op
#: stays an op that computes its output at run time.
GROWTH_BYTES = 1 << 20
#: ... and integer results (index tables) by this many: an op that reads indices computed at
#: run time stays on the CPU (GATHER's GPU form needs them constant), so a table of an
#: STFT's frame positions (BirdNET's 511 x 1024 int32: 2 MB, from a RANGE and a broadcast
#: ADD) is worth its bytes in the compiled model.
INDEX_GROWTH_BYTES = 8 << 20


def check_and_fold(model: Model) -> None:
    """The loader's model check: each op validated (:func:`validate_model`), then folded if
    its inputs are known, in op order, so that the next op is checked against constants."""
    validate_model(model, after_op=fold_op)


def fold_constants(graph: Subgraph) -> int:
    """Fold, in op order, the ops of ``graph`` whose inputs are all known; return how many.

    Each folded op's outputs get their computed values as constant data and the op is marked
    ``folded`` (and ``folded_shape`` when its value depends on a run-time tensor's shape).
    """
    return sum(fold_op(op, graph) for op in graph.ops)


def fold_op(op: Op, graph: Subgraph) -> bool:
    """Fold ``op`` if its inputs are known and it may be folded; whether it was."""
    kind = fold_candidate(op, graph)  # (what a warm start asks too: litekiln.loading)
    if kind is None:
        return False
    if kind == "empty":
        return _fold_empty(op, graph)
    if not _may_fold(op, graph):
        return False
    inputs: list[np.ndarray | None] = []
    for t in op.inputs:
        if t < 0:
            inputs.append(None)
        elif kind == "shape":
            # SHAPE reads only its input's shape: a zero-strided view, no data.
            tensor = graph.tensors[t]
            inputs.append(np.broadcast_to(np.zeros((), tensor.dtype), tensor.shape))
        else:
            inputs.append(graph.tensors[t].data)
    try:
        results = run_op(op, graph, inputs)
    except LitekilnError as exc:
        log.debug("%s not folded: %s", op.describe(), exc)
        return False
    if not _small_enough(op, graph, results):
        return False
    for t, value in zip(op.outputs, results, strict=True):
        if t < 0:
            continue
        tensor = graph.tensors[t]
        value = np.array(value, dtype=tensor.dtype, order="C")  # (0-d stays 0-d)
        if value.shape != tensor.shape:
            if tensor.shape_signature == tensor.shape:
                tensor.shape_signature = value.shape
            tensor.shape = value.shape
        tensor.data = value
    read = set(op.inputs)
    op.folded = True
    op.folded_shape = kind == "shape" or any(
        p.folded_shape and read.intersection(p.outputs) for p in graph.ops[: op.index]
    )
    return True


def _fold_empty(op: Op, graph: Subgraph) -> bool:
    """An op whose every output is empty (a SLICE of no element: an unrolled loop's first
    or last step) has a known value, whatever its inputs: it becomes an empty constant."""
    if not _may_fold(op, graph):
        return False
    for tensor in (graph.tensors[t] for t in op.outputs if t >= 0):
        tensor.data = np.zeros(tensor.shape, tensor.dtype)
    op.folded = True
    return True


def _may_fold(op: Op, graph: Subgraph) -> bool:
    cls = REGISTRY.get(op.name)
    if cls is None or not cls.foldable or not op.outputs:
        return False
    tensors = [graph.tensors[t] for t in [*op.inputs, *op.outputs] if t >= 0]
    if any(t.is_variable for t in tensors):
        return False
    return not set(op.outputs).intersection(graph.outputs)


def _small_enough(op: Op, graph: Subgraph, results: list[np.ndarray]) -> bool:
    constants = [graph.tensors[t].data for t in op.inputs if t >= 0]
    read = sum(int(c.nbytes) for c in constants if c is not None)
    written = sum(int(r.nbytes) for r in results)
    indices = all(r.dtype.kind in "iu" for r in results)
    if written <= read + (INDEX_GROWTH_BYTES if indices else GROWTH_BYTES):
        return True
    log.debug("%s not folded: %d bytes of constants from %d", op.describe(), written, read)
    return False
