"""Lower a GPU partition of the graph IR to a TVM Relax function (NHWC).

The walk and what emitters share live in :mod:`litekiln.compiler.lowering`; the emitters, one
per TFLite op name, in the ``emit_*`` modules, imported here so that :data:`EMITTERS` is full.
"""

from __future__ import annotations

import tvm

from litekiln.artifact.weights import MergedTensor
from litekiln.compiler import (  # noqa: F401  (each registers its emitters)
    emit_lstm,
    emit_math,
    emit_mediapipe,
    emit_nn,
    emit_shape,
)
from litekiln.compiler.lowering import (
    ACC_DTYPE,
    BROADCAST_BARRIER,
    EMITTERS,
    Lowering,
    LowerOptions,
)
from litekiln.compiler.partition import Partition
from litekiln.compiler.unit_reductions import unit_reductions
from litekiln.model.ir import Subgraph

__all__ = ["ACC_DTYPE", "BROADCAST_BARRIER", "EMITTERS", "LowerOptions", "lower_partition"]


def lower_partition(
    graph: Subgraph,
    part: Partition,
    options: LowerOptions | None = None,
    merged: list[MergedTensor] | None = None,
    siblings: list[MergedTensor] | None = None,
) -> tvm.IRModule:
    """Build the Relax module of one GPU partition.

    Args:
        graph: the subgraph the partition belongs to.
        part: the partition (ops, inputs, outputs).
        options: precision and quantization-simulation options.
        merged: where given, the merged weights' recipes (`Lowering.merged_weights`) are
            appended to it, for `litekiln.compiler.weights.trace_weights`.
        siblings: where given, those of them that stack sibling convolutions are appended to
            it (the compile's stats count them apart from sums of branches).

    Returns:
        An IRModule whose ``main`` takes the partition inputs (in ``part.inputs`` order) and
        returns a tuple of the partition outputs (in ``part.outputs`` order).

    Raises:
        CompileError: an op has no lowering or its operands are not what the lowering needs.
    """
    lowering = Lowering(graph, part, options or LowerOptions())
    mod = lowering.build()
    if merged is not None:
        merged.extend(lowering.merged_weights)
    if siblings is not None:
        siblings.extend(lowering.sibling_weights)
    # Reductions over one element become the elementwise ops they are: TVM mishandles them
    # (litekiln/compiler/unit_reductions.py).
    return unit_reductions()(mod)
