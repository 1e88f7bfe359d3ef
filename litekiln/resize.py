"""A model re-planned for other input shapes (LiteRT's ``resize_tensor_input``).

litekiln compiles static shapes. Resizing an input gives a new model IR whose every tensor has
the shape that input shape implies, found the way LiteRT's ``AllocateTensors`` finds it: by
running each op once (here on the numpy reference, on zeros) and keeping what it computes.
The resized model gets its own token (the original one plus the input shapes), so it is
compiled once and cached under that shape, beside the original.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from litekiln.errors import InputError, LitekilnError
from litekiln.model.ir import Model, Subgraph
from litekiln.ops.fold import fold_constants
from litekiln.reference import run_graph


def resized(model: Model, shapes: Mapping[int, tuple[int, ...]]) -> Model:
    """``model`` with the graph inputs in ``shapes`` (tensor index -> shape) resized.

    Raises:
        InputError: an index is not a graph input, a dimension is not positive, or the
            model cannot run at these shapes (an op refuses them; its error is named).
    """
    g = model.main
    want = {int(t): tuple(int(d) for d in s) for t, s in shapes.items()}
    for t, shape in want.items():
        if t not in g.inputs:
            raise InputError(f"tensor {t} is not a graph input; inputs are {g.inputs}")
        if any(d <= 0 for d in shape):
            raise InputError(f"input {t} ({g.tensors[t].name!r}): dimensions must be positive")
    if all(want[t] == g.tensors[t].shape for t in want):
        return model
    g = _unfold_shapes(g)
    sized = _infer_shapes(g, {t: want.get(t, g.tensors[t].shape) for t in g.inputs})
    main = dataclasses.replace(g, tensors=sized)
    fold_constants(main)  # the shape arithmetic again, on the new shapes
    suffix = ";".join("x".join(map(str, sized[t].shape)) for t in g.inputs)
    return dataclasses.replace(
        model, subgraphs=[main, *model.subgraphs[1:]], token=f"{model.token}@{suffix}"
    )


def _unfold_shapes(g: Subgraph) -> Subgraph:
    """A copy of ``g`` in which the ops folded from tensor shapes are ops again (their
    outputs computed, not constants): their values change with the input shapes. Every op
    is copied, so that folding the resized graph leaves the original model as it was."""
    stale = {t for op in g.ops if op.folded_shape for t in op.outputs}
    ops = [
        dataclasses.replace(op, folded=False, folded_shape=False)
        if op.folded_shape
        else dataclasses.replace(op)
        for op in g.ops
    ]
    tensors = [dataclasses.replace(t, data=None) if t.index in stale else t for t in g.tensors]
    return dataclasses.replace(g, ops=ops, tensors=tensors)


def _infer_shapes(g: Subgraph, inputs: Mapping[int, tuple[int, ...]]) -> list:
    """Every tensor of ``g`` with the shape its ops compute from ``inputs`` (on zeros)."""
    # Activations lose their declared shapes, so that each op's reference computes its own
    # (RESHAPE then reads its shape operand, as LiteRT's kernel does); constants keep theirs.
    variables = g.initial_variables()  # (they keep their shapes: LiteRT does not resize them)
    open_tensors = [
        t
        if t.is_constant or t.index in variables
        else dataclasses.replace(t, shape=inputs.get(t.index, ()))
        for t in g.tensors
    ]
    probe = dataclasses.replace(g, tensors=open_tensors)
    feeds = {t: np.zeros(shape, g.tensors[t].dtype) for t, shape in inputs.items()}
    feeds.update(variables)
    try:
        values = run_graph(probe, feeds, intermediates=True)
    except LitekilnError as exc:
        shown = {g.tensors[t].name: list(s) for t, s in inputs.items()}
        raise InputError(f"the model cannot run with inputs {shown}: {exc}") from None
    return [
        dataclasses.replace(t, shape=tuple(values[t.index].shape))
        if t.index in values and not t.is_constant
        else t
        for t in g.tensors
    ]
