"""Parallel convolutions of one input, summed, merged into one convolution at compile time.

Re-parameterisable networks train several branches side by side and sum them: MobileOne's
blocks add four 3x3 convolutions of the same map, a 1x1 one and a batch norm of the map
itself; RepVGG's a 3x3, a 1x1 and the batch norm. Their authors fold the branches into one
convolution before deployment, but a model exported as trained (timm's modules before
``reparameterize()``, as litert-torch converts them) keeps every branch: timm's MobileOne-S0
comes as 191 convolutions (86 CONV_2D, 105 DEPTHWISE_CONV_2D), each a kernel launch and a map
written and read back; merged, it runs 45 kernels.

Convolution is linear in its weights, so ``conv(x, W1) + conv(x, W2) = conv(x, W1 + W2)``
when both read ``x`` with the same stride and their windows line up: a 1x1 branch is a 3x3
kernel with its weight in the centre, once the two paddings are accounted for (litert-torch
writes the 3x3 branches as PAD + VALID convolutions and the 1x1 as a VALID convolution of the
unpadded map). A per-channel affine map of ``x`` (the identity branch's batch norm, SUB / MUL
/ ADD by constants) is a 1x1 convolution with a diagonal weight, and ``x`` itself one with the
weight 1.

:func:`find_branch_merges` finds, in a partition, the trees of ADDs (no broadcasting, only
the root with a fused activation, every inner sum read by the tree alone) whose terms include
at least two such branches of one map, and :class:`BranchMerge` describes the convolution
that replaces them: the weights summed in float64 and rounded once, the biases summed, the
padding that lines the windows up. Terms of the tree that are not branches of that map (a
residual from elsewhere) are added to its result, as the convolution's epilogue reads them.

The numerics are a convolution's: the same products in another order (a sum of weights
rounded once, then one accumulation), within float32's rounding of the branches' sum. Only
float, unquantized tensors merge; quantized models keep their per-op grids.

No TVM here: the lowering (`Lowering`) emits the merged convolution through the ordinary
convolution emitters.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from litekiln.artifact.weights import MergedTensor
from litekiln.compiler.partition import Partition
from litekiln.model.ir import Op, Subgraph, Tensor
from litekiln.ops.conv import SAME, out_size, pad_amounts

#: Affine ops a per-channel branch may be made of (each with one constant operand).
_AFFINE_OPS = ("ADD", "SUB", "MUL")


@dataclass(frozen=True)
class _Branch:
    """One term of a sum as a convolution of ``source``, read from the source padded by
    ``top``/``left`` (before its own window), with stride ``stride``: the model's weight
    tensor ``weight`` (``OHWI`` for ``kind == "full"``, ``1HWC`` for ``"depthwise"``), or,
    for ``"diagonal"`` (a per-channel affine map of the source), ``scale`` per channel."""

    source: int
    kind: str  # "full", "depthwise" or "diagonal"
    stride: tuple[int, int]
    top: int
    left: int
    window: tuple[int, int]
    weight: int  # tensor index (-1 for a diagonal)
    scale: tuple[float, ...]  # a diagonal's weights (float64 values)
    bias: np.ndarray | None  # float64, one per output channel
    ops: tuple[int, ...]  # the ops that compute the term (absorbed by the merge)
    multiplier: int = 1  # a depthwise convolution's outputs per input channel


@dataclass(frozen=True)
class BranchMerge:
    """A tree of ADDs rooted at op ``root`` computed as one convolution of ``source``.

    Attributes:
        root: the ADD whose output the merge computes (its fused activation applies last).
        ops: every op the merge replaces, ``root`` included.
        kind: ``"CONV_2D"`` or ``"DEPTHWISE_CONV_2D"``.
        source: the tensor the convolution reads.
        weights: how the summed weights are made from the model's (in the op's TFLite layout,
            ``OHWI``; ``1HWC`` for a depthwise convolution): the recipe the loader replays.
        bias: the summed biases, float32.
        stride: (height, width).
        pads: (top, left, bottom, right) zero padding of ``source``.
        rest: the tree's other terms, added to the convolution's result in order.
        multiplier: a depthwise convolution's outputs per input channel.
    """

    root: int
    ops: frozenset[int]
    kind: str
    source: int
    weights: MergedTensor
    bias: np.ndarray
    stride: tuple[int, int]
    pads: tuple[int, int, int, int]
    rest: tuple[int, ...]
    multiplier: int = 1


def find_branch_merges(
    graph: Subgraph,
    part: Partition,
    readers: Mapping[int, Sequence[Op]],
    pad_folds: Mapping[int, tuple[int, tuple[int, int, int, int]]],
    taken: Collection[int] = (),
) -> list[BranchMerge]:
    """The partition's sums of parallel branches that merge into one convolution.

    Args:
        graph: the partition's subgraph.
        part: the partition.
        readers: tensor -> the partition's ops that read it.
        pad_folds: PADs folded into their convolutions (`Lowering._find_pad_folds`): padded
            tensor -> (source, (top, left, bottom, right)); a branch reads through them.
        taken: ops other fusions emit (layer norms, attentions): never part of a merge.
    """
    producer = {t: i for i in part.ops for t in graph.ops[i].outputs}
    members = set(part.ops)
    absorbed: set[int] = set()
    merges: list[BranchMerge] = []
    for i in reversed(part.ops):
        if i in absorbed or i in taken:
            continue
        op = graph.ops[i]
        if not _sum_node(op, graph, part):
            continue
        inner, terms = _terms(i, graph, part, producer, readers, taken)
        found = _merge(i, inner, terms, graph, part, producer, readers, pad_folds, taken)
        if found is None:
            continue
        if not found.ops <= members:
            continue
        merges.append(found)
        absorbed |= found.ops
    return merges


def _float(t: Tensor) -> bool:
    return t.dtype == np.float32 and t.quantization is None


def _sum_node(op: Op, graph: Subgraph, part: Partition) -> bool:
    """An ADD of two computed float maps of its output's shape (no broadcasting)."""
    if op.name != "ADD" or len(op.inputs) != 2 or len(op.outputs) != 1:
        return False
    out = graph.tensors[op.outputs[0]]
    return (
        _float(out)
        and len(out.shape) == 4
        and all(
            t >= 0
            and graph.tensors[t].data is None
            and _float(graph.tensors[t])
            and graph.tensors[t].shape == out.shape
            for t in op.inputs
        )
    )


def _activation(op: Op) -> int:
    return int(op.options.get("fused_activation_function", 0) or 0)


def _private(t: int, reader: Op, part: Partition, readers: Mapping[int, Sequence[Op]]) -> bool:
    """Whether ``reader`` is all that reads ``t``, inside the partition and out."""
    users = readers.get(t, [])
    return t not in part.outputs and len(users) == 1 and users[0] is reader


def _terms(
    root: int,
    graph: Subgraph,
    part: Partition,
    producer: Mapping[int, int],
    readers: Mapping[int, Sequence[Op]],
    taken: Collection[int],
) -> tuple[list[int], list[int]]:
    """The inner ADDs of the tree at ``root`` (root first) and its terms, in order."""
    inner, terms = [root], []
    stack = list(reversed(graph.ops[root].inputs))
    while stack:
        t = stack.pop()
        p = producer.get(t)
        if p is not None and p not in taken:
            op = graph.ops[p]
            if (
                _sum_node(op, graph, part)
                and not _activation(op)
                and _private(t, _reader_of(t, inner, graph), part, readers)
            ):
                inner.append(p)
                stack.extend(reversed(op.inputs))
                continue
        terms.append(t)
    return inner, terms


def _reader_of(t: int, inner: Sequence[int], graph: Subgraph) -> Op:
    """The op of the tree (so far) that reads ``t``."""
    for i in inner:
        if t in graph.ops[i].inputs:
            return graph.ops[i]
    raise AssertionError(f"tensor {t} is not read by the tree")


def _merge(
    root: int,
    inner: list[int],
    terms: list[int],
    graph: Subgraph,
    part: Partition,
    producer: Mapping[int, int],
    readers: Mapping[int, Sequence[Op]],
    pad_folds: Mapping[int, tuple[int, tuple[int, int, int, int]]],
    taken: Collection[int],
) -> BranchMerge | None:
    out = graph.tensors[graph.ops[root].outputs[0]]
    if len(set(terms)) != len(terms):
        return None  # (a term summed twice)
    branches: dict[int, _Branch] = {}  # term -> its branch
    for t in terms:
        p = producer.get(t)
        if p is None or p in taken or not _private(t, _reader_of(t, inner, graph), part, readers):
            continue
        b = _conv_branch(graph.ops[p], graph, pad_folds) or _affine_branch(
            p, graph, part, producer, readers, taken
        )
        if b is not None:
            branches[t] = b
    # The map most branches read, with the kind and stride most of its convolutions have.
    groups: dict[tuple[int, str, tuple[int, int], int], list[int]] = {}
    for t, b in branches.items():
        if b.kind != "diagonal":
            groups.setdefault((b.source, b.kind, b.stride, b.multiplier), []).append(t)
    best: list[int] = []
    best_key: tuple[int, str, tuple[int, int], int] | None = None
    for key, ts in groups.items():
        source, kind, stride, _ = key
        extra = [
            t
            for t, b in branches.items()
            if b.kind == "diagonal" and b.source == source and stride == (1, 1)
        ]
        # The map itself as a term: x + conv(x) (a residual around a branch of x).
        extra += [t for t in terms if t == source and t not in branches and stride == (1, 1)]
        candidates = ts + extra
        if len(candidates) > len(best):
            best, best_key = candidates, key
    # At least two branches that are more than the map itself: ``x + conv(x)`` alone gains
    # nothing (the residual is read by the convolution's epilogue either way).
    if best_key is None or sum(t in branches for t in best) < 2:
        return None
    source, kind, stride, multiplier = best_key
    x = graph.tensors[source]
    if len(x.shape) != 4 or x.shape[0] != out.shape[0]:
        return None
    channels_in, channels_out = int(x.shape[3]), int(out.shape[3])
    diagonal = [t for t in best if t not in groups[best_key]]
    if diagonal and (channels_in != channels_out or x.shape[1:3] != out.shape[1:3]):
        return None
    chosen = [branches[t] if t in branches else _identity(source, channels_in) for t in best]
    top = max(b.top for b in chosen)
    left = max(b.left for b in chosen)
    kh = max(top - b.top + b.window[0] for b in chosen)
    kw = max(left - b.left + b.window[1] for b in chosen)
    h, w = int(x.shape[1]), int(x.shape[2])
    oh, ow = int(out.shape[1]), int(out.shape[2])
    bottom = max(0, stride[0] * (oh - 1) - top + kh - h)
    right = max(0, stride[1] * (ow - 1) - left + kw - w)
    rows = (h + top + bottom - kh) // stride[0] + 1
    columns = (w + left + right - kw) // stride[1] + 1
    if (rows, columns) != (oh, ow):
        return None
    if kind == "full":
        shape = (channels_out, kh, kw, channels_in)
    else:
        if channels_out != channels_in * multiplier:
            return None
        shape = (1, kh, kw, channels_out)
    parts: list[tuple[object, ...]] = []
    bias = np.zeros(channels_out, np.float64)
    for b in chosen:
        dy, dx = top - b.top, left - b.left
        if b.kind == "diagonal":
            parts.append(("diagonal", b.scale, dy, dx))
        else:
            wt = graph.tensors[b.weight]
            assert wt.data is not None
            if wt.shape[0] != shape[0] or wt.shape[3] != shape[3]:
                return None
            typed = (wt.data.dtype.str, wt.data.shape)
            parts.append(("tensor", b.weight, typed, (0, dy, dx, 0)))
        if b.bias is not None:
            bias += b.bias
    ops = set(inner)
    for t in best:
        if t in branches:
            ops |= set(branches[t].ops)
    rest = tuple(t for t in terms if t not in best)
    return BranchMerge(
        root=root,
        ops=frozenset(ops),
        kind="CONV_2D" if kind == "full" else "DEPTHWISE_CONV_2D",
        source=source,
        weights=MergedTensor(shape, tuple(parts)),
        bias=bias.astype(np.float32),
        stride=stride,
        pads=(top, left, bottom, right),
        rest=rest,
        multiplier=multiplier,
    )


def _identity(source: int, channels: int) -> _Branch:
    """The map ``source`` itself as a term: a diagonal weight of ones."""
    return _Branch(source, "diagonal", (1, 1), 0, 0, (1, 1), -1, (1.0,) * channels, None, ())


def _float_const(graph: Subgraph, t: int) -> Tensor | None:
    """Operand ``t`` where it is a float, unquantized constant, else None."""
    if t < 0:
        return None
    tensor = graph.tensors[t]
    if tensor.data is None or tensor.quantization is not None or tensor.data.dtype.kind != "f":
        return None
    return tensor


def _const(graph: Subgraph, t: int) -> np.ndarray | None:
    """A float, unquantized constant operand (a bias, an affine map's constant) as float64,
    else None."""
    tensor = _float_const(graph, t)
    return None if tensor is None else np.asarray(tensor.data, np.float64)


def _conv_branch(
    op: Op, graph: Subgraph, pad_folds: Mapping[int, tuple[int, tuple[int, int, int, int]]]
) -> _Branch | None:
    """A CONV_2D (ungrouped) or DEPTHWISE_CONV_2D (any multiplier) without activation or
    dilation, with constant float weights, as a branch of the map it reads (through a folded
    PAD)."""
    if op.name not in ("CONV_2D", "DEPTHWISE_CONV_2D") or len(op.outputs) != 1:
        return None
    o = op.options
    if _activation(op) or int(o.get("dilation_h_factor", 1)) != 1:
        return None
    if int(o.get("dilation_w_factor", 1)) != 1 or len(op.inputs) < 2:
        return None
    # (the weights are only looked at here: `MergedTensor.build` reads them, once)
    w = _float_const(graph, op.inputs[1])
    bias = _const(graph, op.inputs[2]) if len(op.inputs) > 2 and op.inputs[2] >= 0 else None
    if (
        w is None
        or len(w.shape) != 4
        or (len(op.inputs) > 2 and op.inputs[2] >= 0 and bias is None)
    ):
        return None
    data = op.inputs[0]
    x = graph.tensors[data]
    if data < 0 or x.data is not None or not _float(x) or len(x.shape) != 4:
        return None
    stride = (int(o.get("stride_h", 1)), int(o.get("stride_w", 1)))
    kh, kw = int(w.shape[1]), int(w.shape[2])
    if int(o.get("padding", 0)) == 1:  # VALID
        top = left = 0
    else:
        top = _same_before(int(x.shape[1]), kh, stride[0])
        left = _same_before(int(x.shape[2]), kw, stride[1])
    source = data
    fold = pad_folds.get(data)
    if fold is not None:
        source = fold[0]
        top, left = top + fold[1][0], left + fold[1][1]
    channels = int(graph.tensors[source].shape[3])
    if op.name == "CONV_2D":
        if int(w.shape[3]) != channels:
            return None  # grouped
        kind, outputs = "full", int(w.shape[0])
    else:
        if int(w.shape[0]) != 1 or int(w.shape[3]) % channels:
            return None
        kind, outputs = "depthwise", int(w.shape[3])
    if bias is not None and bias.size != outputs:
        return None
    return _Branch(
        source, kind, stride, top, left, (kh, kw), op.inputs[1], (),
        None if bias is None else bias.reshape(-1), (op.index,),
        multiplier=outputs // channels if kind == "depthwise" else 1,
    )  # fmt: skip


def _same_before(size: int, window: int, stride: int) -> int:
    """SAME padding before the map along one axis (TFLite's; the odd cell goes after)."""
    return pad_amounts(size, window, stride, 1, out_size(size, window, stride, 1, SAME))[0]


def _affine_branch(
    last: int,
    graph: Subgraph,
    part: Partition,
    producer: Mapping[int, int],
    readers: Mapping[int, Sequence[Op]],
    taken: Collection[int],
) -> _Branch | None:
    """A chain of ADD / SUB / MUL by per-channel constants ending at op ``last``, read from a
    computed map: ``a * x + b`` per channel, as a diagonal branch of ``x``."""
    ops: list[int] = []
    scale: np.ndarray | float = 1.0
    shift: np.ndarray | float = 0.0
    step = _affine_step(graph.ops[last], graph)
    if step is None:
        return None
    i = last
    while step is not None:
        k, c = step
        op = graph.ops[i]
        # y = f(x); the chain so far maps y to scale * y + shift.
        if op.name == "ADD":
            shift = shift + scale * c
        elif op.name == "MUL":
            scale = scale * c
        elif k == 0:  # x - c
            shift = shift - scale * c
        else:  # c - x
            shift, scale = shift + scale * c, -scale
        ops.append(i)
        src = op.inputs[k]
        p = producer.get(src)
        if p is None or p in taken or not _private(src, op, part, readers):
            break
        step = _affine_step(graph.ops[p], graph)
        i = p
    channels = int(graph.tensors[src].shape[3])
    a = np.broadcast_to(np.asarray(scale, np.float64), (channels,))
    b = np.broadcast_to(np.asarray(shift, np.float64), (channels,)).copy()
    return _Branch(src, "diagonal", (1, 1), 0, 0, (1, 1), -1, tuple(map(float, a)), b, tuple(ops))


def _affine_step(op: Op, graph: Subgraph) -> tuple[int, np.ndarray] | None:
    """An ADD / SUB / MUL of a computed float map by a per-channel (or scalar) constant,
    without activation or broadcasting of the map: (the map's operand, the constant as one
    value per channel or one value), else None."""
    if op.name not in _AFFINE_OPS or len(op.inputs) != 2 or len(op.outputs) != 1:
        return None
    if _activation(op):
        return None
    consts = [_const(graph, t) for t in op.inputs]
    if sum(c is not None for c in consts) != 1:
        return None
    k = 0 if consts[0] is None else 1  # the computed operand
    c = consts[1 - k]
    assert c is not None
    x = graph.tensors[op.inputs[k]]
    out = graph.tensors[op.outputs[0]]
    if not _float(x) or not _float(out) or x.shape != out.shape or len(out.shape) != 4:
        return None
    if c.size not in (1, out.shape[3]) or (c.size > 1 and c.shape[-1] != out.shape[3]):
        return None
    return k, c.reshape(-1)
