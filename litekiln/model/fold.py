"""Which ops are candidates to fold into constants at load, without the op registry.

The registry's load-time checks (`litekiln.ops.fold`) fold an op whose inputs are all known;
a warm start that skips the registry (`litekiln.loading.open_model`) must know whether they
would change the graph its compiled entry was made from. Both ask :func:`fold_candidate`, so
the two cannot drift apart: when they did, a warm start of EdgeNeXt read its positional
encoding as ops, missed the entry's constant for it, and recompiled at every start.

A candidate is only a candidate: the registry may still keep the op (an op that must not fold,
one that writes a graph output or a variable, one whose outputs would be too large, one its
reference refuses).
"""

from __future__ import annotations

from typing import Literal

from litekiln.model.ir import Op, Subgraph

FoldKind = Literal["shape", "constant", "empty"]


def fold_candidate(op: Op, graph: Subgraph) -> FoldKind | None:
    """Why ``op`` could fold at load, in the order the fold tries them, or None.

    ``"shape"``: a SHAPE of a tensor whose shape is static (its value is that shape);
    ``"constant"``: every present input is a constant; ``"empty"``: every output is empty
    (a static shape with a 0), so its value is known whatever its inputs.
    """
    if op.folded:
        return None
    if (
        op.name == "SHAPE"
        and len(op.inputs) == 1
        and op.inputs[0] >= 0
        and all(d >= 0 for d in graph.tensors[op.inputs[0]].shape)
    ):
        return "shape"
    present = [t for t in op.inputs if t >= 0]
    if present and all(graph.tensors[t].data is not None for t in present):
        return "constant"
    outputs = [graph.tensors[t] for t in op.outputs if t >= 0]
    if outputs and not any(t.size for t in outputs):
        return "empty"
    return None
