"""Attention as one kernel: scores, softmax and the weighted sum of values in one call.

A transformer's attention, converted from PyTorch (litert-torch) or Keras, is a BATCH_MATMUL
of the queries and the keys (the scores), a SOFTMAX over the keys (RESHAPEs of unit axes
around it), and a BATCH_MATMUL of the probabilities and the values. Op by op that is three
kernels, and the scores and the probabilities, a (heads, queries, keys) map each, go out to
memory and back: DeiT-Tiny's 3 x 197 x 197 twice per block, 9.5 + 5.4 + 8.4 us per block on
the H200 (docs/benchmarks.md).

:func:`find_attentions` recognises that chain exactly (each intermediate read by the next op
alone, float32, the same batch axes on the three operands) and :meth:`Attention.emit` writes
it as one ``call_te`` (`attention_te`): the scores, their row maxima, the sums of
``exp(beta * (s - max))``, the probabilities, and the weighted sum. The schedules make it one
kernel (`schedules.FusedAttention` on GPUs: a work-group per few query rows, the rows' scores
and probabilities in local memory, the statistics summed across a warp's lanes;
`schedules.SerialAttention` on CPU OpenCL: one work-item per query row). The numerics are the
decomposed ops' (softmax(beta * s), float32), with the scores and probabilities never
rounded to storage (under fp16 they stay float32). The layout copies that make the operands
(the heads' slices, transposes and scales) are merged into the kernel as its loads
(`compiler.fusion`).

Attentions whose scores sum more than `MAX_TERMS` terms (DeiT's 64-dimension heads) stay op
by op: measured on the H200, the fused kernel gained nothing there. Elementwise ops of the
scores with constants before the SOFTMAX (LeViT's scale, TinyViT's
and LeViT's relative-position biases, broadcast over the windows) go into the kernel too
(`Transform`). Anything else stays op by op (a computed mask, quantized tensors, broadcast
batch axes, one key or more than `MAX_KEYS`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tvm import relax, te, tirx

from litekiln.compiler.partition import Partition
from litekiln.model.ir import Subgraph
from litekiln.ops.base import is_quantized

#: Name of the fused PrimFunc (``fused_..._attention`` after FuseOps).
PRIMFUNC_NAME = "attention"
#: Its blocks, in order (the schedule rules find them by name).
BLOCKS = ("attn_scores", "attn_max", "attn_sum", "attn_prob", "attn_out")
#: The statistics are computed over whole groups of this many query rows (the padding rows
#: repeat the last query), so that no row predicate surrounds their cross-thread reductions
#: (OpenCL barriers cannot sit inside a condition); work-groups take a divisor of it.
ROWS = 8
#: ... and over whole groups of this many keys (the padding keys repeat the last one and are
#: left out of the max and the sum by value); the lanes of a row take a divisor of it.
LANES = 32
#: Most keys: each work-group keeps its rows' scores and probabilities in local memory.
MAX_KEYS = 1024
#: Most terms per score (the heads' dimension): one lane sums its keys' dot products in a
#: chain, which on the H200 made DeiT's 64-term heads no faster fused (22.9 us per block)
#: than as three kernels whose products take the heads' layout copies (23.3 us, and two copy
#: kernels fewer); 16-32 terms (LeViT, MobileViT, TinyViT, PVT-v2) ran faster fused
#: (docs/benchmarks.md, eleventh session).
MAX_TERMS = 32


def attention_te(
    q: te.Tensor,
    k: te.Tensor,
    v: te.Tensor,
    *consts: te.Tensor,
    adj_x: bool = False,
    adj_y: bool = False,
    adj_v: bool = False,
    beta: float = 1.0,
    transforms: tuple[Transform, ...] = (),
) -> te.Tensor:
    """``softmax(beta * f(q @ k)) @ v`` over the last axis of the scores.

    Args:
        q: queries, (*B, M, D) (``adj_x``: (*B, D, M)).
        k: keys, (*B, D, N) (``adj_y``: (*B, N, D)).
        v: values, (*B, N, C) (``adj_v``: (*B, C, N)).
        consts: the transforms' constant tensors, in order.
        beta: the SOFTMAX's beta.
        transforms: ``f``, elementwise ops with constants applied to the scores in order
            (`Transform`).

    Returns:
        (*B, M, C).
    """
    qs, ks, vs = (tuple(int(d) for d in t.shape) for t in (q, k, v))
    batch = qs[:-2]
    nb = len(batch)
    m, d = (qs[-1], qs[-2]) if adj_x else (qs[-2], qs[-1])
    n = ks[-2] if adj_y else ks[-1]
    c = vs[-2] if adj_v else vs[-1]
    mp = -(-m // ROWS) * ROWS
    np_ = -(-n // LANES) * LANES

    def query(b: tuple[Any, ...], i: Any, r: Any) -> Any:
        return q(*b, r, i) if adj_x else q(*b, i, r)

    def key(b: tuple[Any, ...], r: Any, j: Any) -> Any:
        return k(*b, j, r) if adj_y else k(*b, r, j)

    def value(b: tuple[Any, ...], j: Any, col: Any) -> Any:
        return v(*b, col, j) if adj_v else v(*b, j, col)

    rd = te.reduce_axis((0, d), "d")

    def score(*ix: Any) -> Any:
        b = ix[:nb]
        i, j = tirx.min(ix[nb], m - 1), tirx.min(ix[nb + 1], n - 1)
        return te.sum(query(b, i, rd) * key(b, rd, j), axis=rd)

    s = te.compute((*batch, mp, np_), score, name=BLOCKS[0])
    tensors = iter(consts)
    operands = [None if f.scalar is not None else next(tensors) for f in transforms]

    def scaled(*ix: Any) -> Any:
        x = s(*ix)
        if transforms:  # (the padding rows and keys read the last ones' constants)
            i, j = tirx.min(ix[nb], m - 1), tirx.min(ix[nb + 1], n - 1)
            for f, c in zip(transforms, operands, strict=True):
                x = f.apply(x, c, ix[:nb], batch, i, j)
        return x if beta == 1.0 else x * tirx.const(beta, "float32")

    lowest = tirx.const(-3.4028234663852886e38, "float32")
    zero = tirx.const(0.0, "float32")
    r1 = te.reduce_axis((0, np_), "j1")
    mx = te.compute(
        (*batch, mp),
        lambda *ix: te.max(tirx.Select(r1 < n, scaled(*ix, r1), lowest), axis=r1),
        name=BLOCKS[1],
    )
    r2 = te.reduce_axis((0, np_), "j2")
    den = te.compute(
        (*batch, mp),
        lambda *ix: te.sum(tirx.Select(r2 < n, tirx.exp(scaled(*ix, r2) - mx(*ix)), zero), axis=r2),
        name=BLOCKS[2],
    )
    prob = te.compute(
        (*batch, mp, np_),
        lambda *ix: tirx.exp(scaled(*ix) - mx(*ix[:-1])) / den(*ix[:-1]),
        name=BLOCKS[3],
    )
    r3 = te.reduce_axis((0, n), "j3")
    return te.compute(
        (*batch, m, c),
        lambda *ix: te.sum(prob(*ix[:-1], r3) * value(ix[:-2], r3, ix[-1]), axis=r3),
        name=BLOCKS[4],
    )


@dataclass(frozen=True)
class Transform:
    """An elementwise op of the scores with a constant, between the first product and the
    SOFTMAX (a scale, a relative-position bias): ``op`` (MUL, ADD, SUB, DIV: the scores
    first), the constant (``scalar``, or a tensor of ``shape`` broadcast against ``view``,
    the scores' shape at that op: the first product's batch axes regrouped, the last two
    axes the same)."""

    op: str
    view: tuple[int, ...]
    shape: tuple[int, ...] = ()
    scalar: float | None = None

    def apply(
        self, x: Any, c: Any, b: tuple[Any, ...], batch: tuple[int, ...], i: Any, j: Any
    ) -> Any:
        if self.scalar is not None:
            y = tirx.const(self.scalar, "float32")
        else:
            y = c(*self._index(b, batch, i, j))
        return _BINARY[self.op](x, y)

    def _index(self, b: tuple[Any, ...], batch: tuple[int, ...], i: Any, j: Any) -> list[Any]:
        """The constant's element for scores element (b, i, j): the flat batch index
        unravelled over the view's batch axes, broadcast axes at 0."""
        flat: Any = 0
        for ax, ext in zip(b, batch, strict=True):
            flat = flat * ext + ax
        lead = []
        for ext in reversed(self.view[:-2]):
            lead.append(flat % ext)
            flat = flat // ext
        full = [*reversed(lead), i, j]
        out = full[len(full) - len(self.shape) :]
        return [0 if e == 1 else ax for ax, e in zip(out, self.shape, strict=True)]


_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "MUL": lambda a, b: a * b,
    "ADD": lambda a, b: a + b,
    "SUB": lambda a, b: a - b,
    "DIV": lambda a, b: a / b,
}


@dataclass
class Attention:
    """One attention of a partition.

    Attributes:
        q, k, v: the operands' tensors (the first product's two, the second's values).
        ops: every op of the chain (emitted as one call, at ``last``).
        last: the second product (its output is the chain's).
        adj_x, adj_y: the first product's transposition flags; adj_v: the second's adj_y.
        beta: the SOFTMAX's beta.
        transforms: the ops on the scores before the SOFTMAX, with their constants' tensors.
    """

    q: int
    k: int
    v: int
    ops: set[int]
    last: int
    adj_x: bool
    adj_y: bool
    adj_v: bool
    beta: float
    transforms: list[tuple[str, int, tuple[int, ...]]] = field(default_factory=list)

    def emit(
        self,
        graph: Subgraph,
        bb: relax.BlockBuilder,
        value: Callable[[int], Any],
        scalar: Callable[[int], float],
    ) -> Any:
        """The chain as one ``call_te`` (float32, of the shape the first product's batch
        axes give: the caller reshapes to the second product's output where they differ).

        Args:
            graph: the subgraph.
            bb: the block builder of the partition's function.
            value: a tensor's float32 Relax value (the operands, constant tensors).
            scalar: a constant of one element, as the lowering rounds it.
        """
        fs, consts = [], []
        for op, t, view in self.transforms:
            c = graph.tensors[t]
            if c.size == 1:
                fs.append(Transform(op, view, scalar=scalar(t)))
            else:
                fs.append(Transform(op, view, tuple(int(d) for d in c.shape)))
                consts.append(value(t))

        def compute(*tensors: te.Tensor) -> te.Tensor:  # (emit_te takes no such arguments)
            return attention_te(
                *tensors, adj_x=self.adj_x, adj_y=self.adj_y, adj_v=self.adj_v, beta=self.beta,
                transforms=tuple(fs),
            )  # fmt: skip

        return bb.emit_te(
            compute, value(self.q), value(self.k), value(self.v), *consts,
            primfunc_name_hint=PRIMFUNC_NAME,
        )  # fmt: skip


def find_attentions(graph: Subgraph, part: Partition) -> list[Attention]:
    """Every attention chain of ``part`` (see the module docstring)."""
    ops = set(part.ops)
    readers = part.readers(graph)
    keep = set(part.outputs)
    found: list[Attention] = []
    taken: set[int] = set()
    for i in part.ops:
        first = graph.ops[i]
        if first.name != "BATCH_MATMUL" or i in taken:
            continue
        chain = _chain(graph, i, readers, keep, ops)
        if chain is None:
            continue
        members, softmax, last, transforms = chain
        second = graph.ops[last]
        q, k = first.inputs[0], first.inputs[1]
        v = second.inputs[1]
        tensors = [graph.tensors[t] for t in (q, k, v, first.outputs[0], second.outputs[0])]
        if any(is_quantized(t) or t.dtype.name != "float32" for t in tensors):
            continue
        shapes = [tuple(int(d) for d in t.shape) for t in tensors]
        if any(len(s) < 2 for s in shapes[:3]) or not (
            shapes[0][:-2] == shapes[1][:-2] == shapes[2][:-2]
        ):
            continue  # (broadcast batch axes: op by op)
        adj_v = bool(second.options.get("adj_y"))
        n = shapes[1][-2] if first.options.get("adj_y") else shapes[1][-1]
        d = shapes[0][-2] if first.options.get("adj_x") else shapes[0][-1]
        if (
            d > MAX_TERMS
            or not 2 <= n <= MAX_KEYS
            or math.prod(shapes[4])
            != math.prod(
                (*shapes[0][:-2], shapes[3][-2], shapes[2][-2] if adj_v else shapes[2][-1])
            )
        ):
            continue
        beta = float(graph.ops[softmax].options.get("beta", 1.0))
        found.append(
            Attention(
                q,
                k,
                v,
                members,
                last,
                bool(first.options.get("adj_x")),
                bool(first.options.get("adj_y")),
                adj_v,
                beta,
                transforms,
            )  # fmt: skip
        )
        taken |= members
    return found


def _chain(
    graph: Subgraph, first: int, readers: dict[int, list[int]], keep: set[int], ops: set[int]
) -> tuple[set[int], int, int, list[tuple[str, int, tuple[int, ...]]]] | None:
    """(ops, the SOFTMAX, the second BATCH_MATMUL, the transforms of the scores) of the
    chain from ``first``, or None."""
    members = {first}
    t = graph.ops[first].outputs[0]
    softmax = -1
    rows = _shape(graph, t)[-2:]
    transforms: list[tuple[str, int, tuple[int, ...]]] = []
    while True:
        rs = readers.get(t, [])
        if t in keep or len(rs) != 1 or rs[0] not in ops:
            return None
        j = rs[0]
        op = graph.ops[j]
        out = _shape(graph, op.outputs[0]) if op.outputs else ()
        if op.name == "RESHAPE" and op.inputs[0] == t:
            if out[-2:] != rows:  # (batch axes regrouped: the rows stay rows)
                return None
        elif op.name in _BINARY and softmax < 0:
            c = _constant_operand(graph, op, t, out)
            if c < 0 or out[-2:] != rows or math.prod(out) != math.prod(_shape(graph, t)):
                return None  # (the output may gain unit axes from the constant's rank)
            transforms.append((op.name, c, out))
        elif op.name == "SOFTMAX" and softmax < 0:
            softmax = j
        elif op.name == "BATCH_MATMUL" and softmax >= 0 and op.inputs[0] == t:
            if op.options.get("adj_x") or op.inputs[1] == t:
                return None
            members.add(j)
            return members, softmax, j, transforms
        else:
            return None
        members.add(j)
        t = op.outputs[0]


def _constant_operand(graph: Subgraph, op: Any, t: int, out: tuple[int, ...]) -> int:
    """The constant operand of a binary op on ``t`` (SUB and DIV: ``t`` first), or -1 where
    it has none, a fused activation, or a shape that does not broadcast to ``out``."""
    if len(op.inputs) != 2 or op.options.get("fused_activation_function", 0) not in (0, "NONE"):
        return -1
    a, b = op.inputs
    c = b if a == t else a if (b == t and op.name in ("MUL", "ADD")) else -1
    if c < 0 or c == t:
        return -1
    tensor = graph.tensors[c]
    if tensor.data is None or is_quantized(tensor) or tensor.data.dtype.kind != "f":
        return -1
    shape, full = _shape(graph, c), out
    if len(shape) > len(full) or any(
        d not in (1, f) for d, f in zip(reversed(shape), reversed(full), strict=False)
    ):
        return -1
    return c


def _shape(graph: Subgraph, t: int) -> tuple[int, ...]:
    return tuple(int(d) for d in graph.tensors[t].shape)
