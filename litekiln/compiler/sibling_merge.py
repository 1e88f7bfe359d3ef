"""Sibling convolutions of one map computed as one convolution, their outputs side by side.

Inception-style blocks read one map with several convolutions of the same window: GoogLeNet's
and Inception-v3's modules start with three or four 1x1 convolutions of their input (the 1x1
branch and the reductions before the wider ones). Emitted one by one, each is a kernel that
reads the map again. Stacked along the output channels, their weights make one convolution
whose output holds every sibling's channels side by side: one kernel, the map read once, and
a larger product (more output channels per work-group) for the schedules.

Transformers converted from Hugging Face modules compute their queries, keys and values as
three FULLY_CONNECTEDs of one input: they merge the same way, into one product with three
times the outputs.

Each sibling's output is then a run of channels of the merged output: a convolution that
reads it takes its channels at an offset (the lowering's slice folds, `conv_folded`); a
concatenation, a reshape or a transpose (the heads' layout) reads a slice, which TVM fuses
into its index arithmetic. The lowering keeps apart the siblings whose slices would cost a
kernel (`Lowering._add_sibling_merges`): an output read by an elementwise op, which was the
sibling's epilogue, or one that leaves the partition (HRNet's fuse layers and NASNet's cells
have such siblings).

:func:`find_sibling_merges` finds, in a partition, the groups of at least two CONV_2Ds
(ungrouped) that read the same tensor with the same window, strides, dilations, padding and
fused activation, or FULLY_CONNECTEDs with the same options, with float weights (and biases)
that are constants of the model, and unquantized float outputs. The merged weights travel
as a recipe (`litekiln.artifact.weights.MergedTensor`: the siblings' weight tensors at their
offsets), as the branch merge's do, so that the cache stores no copy of them. The numerics
are each sibling's own: the same products, the same accumulation order per output.

No TVM here: the lowering (`Lowering`) emits the merged convolution through the ordinary
convolution emitter.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np

from litekiln.artifact.weights import MergedTensor
from litekiln.compiler.partition import Partition
from litekiln.model.ir import Op, Subgraph, Tensor

#: The options that must agree between siblings (TFLite's CONV_2D options).
_GEOMETRY = (
    "padding",
    "stride_h",
    "stride_w",
    "dilation_h_factor",
    "dilation_w_factor",
    "fused_activation_function",
)


#: ... and FULLY_CONNECTED's.
_FC_OPTIONS = ("fused_activation_function", "keep_num_dims", "weights_format")
#: The ops that merge.
_KINDS = ("CONV_2D", "FULLY_CONNECTED")


@dataclass(frozen=True)
class SiblingMerge:
    """Convolutions of one map (or fully connected layers of one input) computed as one.

    Attributes:
        ops: the siblings, in the partition's order (the merged convolution is emitted at the
            first).
        outputs: each sibling's output tensor, in that order.
        offsets: each sibling's first channel in the merged output.
        channels: the merged output's channels.
        weights: how the stacked weights (``OHWI``) are made from the model's.
        bias: the stacked biases (zeros for a sibling without one), float32.
    """

    ops: tuple[int, ...]
    outputs: tuple[int, ...]
    offsets: tuple[int, ...]
    channels: int
    weights: MergedTensor
    bias: np.ndarray


def find_sibling_merges(
    graph: Subgraph,
    part: Partition,
    taken: Collection[int] = (),
    keep_apart: Callable[[int], bool] = lambda t: False,
) -> list[SiblingMerge]:
    """The partition's groups of sibling convolutions that merge into one.

    Args:
        graph: the partition's subgraph.
        part: the partition.
        taken: ops other fusions emit (layer norms, attentions, branch merges): never merged.
        keep_apart: output tensors that must stay a convolution's own output (the lowering's
            rule: read where a slice of the merged map would cost a kernel, or stored in
            another precision than the merged map).
    """
    groups: dict[tuple[object, ...], list[int]] = {}
    for i in part.ops:
        if i in taken:
            continue
        key = _sibling_key(graph.ops[i], graph, keep_apart)
        if key is not None:
            groups.setdefault(key, []).append(i)
    merges = []
    for ops in groups.values():
        if len(ops) >= 2:
            merges.append(_merge(ops, graph))
    return merges


def _sibling_key(
    op: Op, graph: Subgraph, keep_apart: Callable[[int], bool]
) -> tuple[object, ...] | None:
    """What a CONV_2D or FULLY_CONNECTED must share with its siblings (its input, its kind, its
    window and options), or None where it cannot be merged."""
    if op.name not in _KINDS or len(op.outputs) != 1 or len(op.inputs) < 2 or op.folded:
        return None
    data, out = op.inputs[0], op.outputs[0]
    if data < 0 or keep_apart(out):
        return None
    x, y = graph.tensors[data], graph.tensors[out]
    if x.data is not None or not _float(x) or not _float(y):
        return None
    w = graph.tensors[op.inputs[1]] if op.inputs[1] >= 0 else None
    rank = 4 if op.name == "CONV_2D" else 2
    if w is None or not _float_constant(w) or len(w.shape) != rank:
        return None
    if len(op.inputs) > 2 and op.inputs[2] >= 0:
        b = graph.tensors[op.inputs[2]]
        if not _float_constant(b) or b.size != int(w.shape[0]):
            return None
    if op.name == "FULLY_CONNECTED":
        if int(op.options.get("weights_format", 0) or 0) or int(y.shape[-1]) != int(w.shape[0]):
            return None
        return (data, op.name, int(w.shape[1]), *_options(op, _FC_OPTIONS))
    if len(x.shape) != 4 or int(w.shape[3]) != int(x.shape[3]):
        return None  # (grouped)
    return (data, op.name, int(w.shape[1]), int(w.shape[2]), *_options(op, _GEOMETRY))


def _options(op: Op, names: Sequence[str]) -> tuple[int, ...]:
    """The op's integer options ``names`` (a dilation defaults to 1, the rest to 0)."""
    return tuple(int(op.options.get(k, 1 if "factor" in k else 0) or 0) for k in names)


def _merge(ops: Sequence[int], graph: Subgraph) -> SiblingMerge:
    offsets, parts, biases = [], [], []
    at = 0
    for i in ops:
        op = graph.ops[i]
        w = graph.tensors[op.inputs[1]]
        assert w.data is not None
        n = int(w.shape[0])
        offsets.append(at)
        origin = (at,) + (0,) * (len(w.shape) - 1)
        parts.append(("tensor", op.inputs[1], (w.data.dtype.str, tuple(w.data.shape)), origin))
        if len(op.inputs) > 2 and op.inputs[2] >= 0:
            data = graph.tensors[op.inputs[2]].data
            assert data is not None
            biases.append(np.asarray(data, np.float32).reshape(-1))
        else:
            biases.append(np.zeros(n, np.float32))
        at += n
    first = graph.tensors[graph.ops[ops[0]].inputs[1]]
    shape = (at, *(int(d) for d in first.shape[1:]))
    return SiblingMerge(
        ops=tuple(ops),
        outputs=tuple(graph.ops[i].outputs[0] for i in ops),
        offsets=tuple(offsets),
        channels=at,
        weights=MergedTensor(shape, tuple(parts)),
        bias=np.concatenate(biases),
    )


def _float(t: Tensor) -> bool:
    """A float tensor without quantization."""
    return t.quantization is None and np.dtype(t.dtype).kind == "f"


def _float_constant(t: Tensor) -> bool:
    """A float, unquantized constant."""
    return t.data is not None and _float(t) and t.data.dtype.kind == "f"
