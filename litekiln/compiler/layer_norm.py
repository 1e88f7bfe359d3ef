"""Layer norms as one kernel: the decomposed form found in a partition, emitted as one TE call.

PyTorch models (converted by litert-torch) and Keras write a layer norm over the last axis as
basic ops: a MEAN over the last axis, the mean of the squared differences from it
(SQUARED_DIFFERENCE, or SUB then MUL / SQUARE), ``+ eps``, RSQRT, and the normalisation with
its affine terms in one of several forms (``(x - mean) * rstd * gamma + beta``; Keras'
``x * (gamma * rstd) + (beta - mean * gamma * rstd)``; with MEAN's ``keep_dims`` off and
RESHAPEs of the row statistics in between). Lowered op by op that is four kernels (the mean,
the squared differences, the variance with eps and rsqrt, the normalisation), each reading
or writing a whole map.

:func:`find_layer_norms` recognises the statistics exactly (a MEAN of ``x`` over its last
axis -- other reduced axes of one element allowed -- and a MEAN over the same axes of
``(x - that mean)^2``) and then takes every elementwise op of the partition that computes
from them, ``x`` and constants, per element (``full``, the shape of ``x``) or per row
(``row``: one value per row of ``x``, whatever unit axes its shape has), as long as one
tensor of the shape of ``x`` is all that leaves the group. :meth:`LayerNorm.emit` then writes
the group as one ``call_te``: a sum of each row, a sum of its squared differences from the
mean (two passes, as the decomposed form: no ``E[x^2] - E[x]^2`` cancellation), and one
elementwise block that evaluates the ops' own expressions from them. The numerics are those
of the decomposed ops (the same eps, the biased variance, float32 throughout); only the
intermediate tensors are gone. The schedules give that function one kernel
(`schedules.RowNormalization` on GPUs, `schedules.SerialRows` on CPU OpenCL).

An RMS norm (the language models' RMSNorm: litert-torch's ``odml.rms_norm`` decomposes into
``x * x``, a MEAN over the last axis, ``+ eps``, RSQRT, ``x * rstd * w``) is found the same
way from its one statistic, the MEAN of ``x * x`` (`_Finder.rms_core`; ``mean`` None), and
emitted with one sum per row, of the squares: four to six kernels become one (litert-torch's
Gemma 3 test configuration: 61 kernels to 44 in its decode step).

Anything else stays op by op: a group whose statistics or intermediates are read outside
it, quantized or non-float tensors, another reduction axis.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tvm import relax, te, tirx

from litekiln.compiler.partition import Partition
from litekiln.model.ir import Op, Subgraph, Tensor
from litekiln.ops.base import is_quantized

#: Name of the fused PrimFunc (``fused_layer_norm...`` after FuseOps).
PRIMFUNC_NAME = "layer_norm"

#: Elementwise binary ops the group may hold (fused activations applied as clamps).
_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "ADD": lambda a, b: a + b,
    "SUB": lambda a, b: a - b,
    "MUL": lambda a, b: a * b,
    "DIV": lambda a, b: a / b,
    "SQUARED_DIFFERENCE": lambda a, b: (a - b) * (a - b),
    "MAXIMUM": lambda a, b: tirx.max(a, b),
    "MINIMUM": lambda a, b: tirx.min(a, b),
}
_UNARY: dict[str, Callable[[Any], Any]] = {
    "RSQRT": lambda a: tirx.rsqrt(a),
    "SQRT": lambda a: tirx.sqrt(a),
    "NEG": lambda a: -a,
    "SQUARE": lambda a: a * a,
    "RESHAPE": lambda a: a,  # between shapes of the same kind (checked)
}
#: Fused activation code -> clamp range (RELU, RELU_N1_TO_1, RELU6).
_CLAMPS = {1: (0.0, None), 2: (-1.0, 1.0), 3: (0.0, 6.0)}


def _nonunit(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(d) for d in shape if d != 1)


@dataclass
class LayerNorm:
    """One layer norm of a partition: its input ``x``, its statistics, its ops.

    Attributes:
        x: the normalised tensor (rows along its last axis).
        mean: the MEAN of ``x`` (the first statistic); None for an RMS norm.
        var: the MEAN of the squared differences (the second); of ``x``'s squares for an
            RMS norm.
        ops: indices of every op of the group (emitted as one call, at ``last``).
        out: the one tensor that leaves the group (shape of ``x``).
        last: index of the op that writes ``out``.
        kinds: each tensor of the group -> ``"full"`` or ``"row"``.
    """

    x: int
    mean: int | None  # (None: an RMS norm, whose statistic is the mean of squares)
    var: int
    ops: set[int]
    out: int
    last: int
    kinds: dict[int, str] = field(default_factory=dict)

    def emit(
        self,
        graph: Subgraph,
        bb: relax.BlockBuilder,
        value: Callable[[int], Any],
        scalar: Callable[[int], float],
        const: Callable[[int], Any],
    ) -> Any:
        """The group as one ``call_te`` (its value: ``out`` in float32).

        Args:
            graph: the subgraph.
            bb: the block builder of the partition's function.
            value: a tensor's float32 Relax value (``x``).
            scalar: a constant of one element, as the lowering rounds it.
            const: a constant tensor as a Relax constant (float32).
        """
        producers = {t: i for i in self.ops for t in graph.ops[i].outputs}
        shape = tuple(int(d) for d in graph.tensors[self.x].shape)
        n = shape[-1]
        rows = shape[:-1] or (1,)
        operands = [value(self.x)]
        tensors: dict[int, int] = {}  # constant tensor -> position among the TE inputs
        scalars: dict[int, float] = {}  # constant of one element -> its value
        for i in sorted(self.ops):
            op = graph.ops[i]
            # (a MEAN's axes and a RESHAPE's shape are no values)
            for t in op.inputs[:1] if op.name in ("MEAN", "RESHAPE") else op.inputs:
                c = graph.tensors[t]
                if c.data is None or t in tensors or t in scalars:
                    continue
                if c.size == 1:
                    scalars[t] = scalar(t)
                else:
                    tensors[t] = len(operands)
                    operands.append(const(t))

        def compute(x: te.Tensor, *consts: te.Tensor) -> te.Tensor:
            def row_of(idx: Sequence[Any]) -> list[Any]:
                return list(idx[:-1]) if len(shape) > 1 else [0]

            if self.mean is None:  # an RMS norm: the mean of the squares, one pass
                k = te.reduce_axis((0, n), "k")
                squares = te.compute(
                    rows,
                    lambda *r: te.sum(
                        x(*r[: len(shape) - 1], k) * x(*r[: len(shape) - 1], k), axis=k
                    ),
                    name="ln_squares",
                )
                nf = tirx.const(float(n), "float32")
                mean_of = lambda idx: tirx.const(0.0, "float32")  # noqa: E731  (unused)
                var_of = lambda idx: squares(*row_of(idx)) / nf  # noqa: E731
            elif n == 1:  # one term: the mean is x itself, the variance 0
                mean_of = lambda idx: x(*idx)  # noqa: E731
                var_of = lambda idx: tirx.const(0.0, "float32")  # noqa: E731
            else:
                k1 = te.reduce_axis((0, n), "k")
                total = te.compute(
                    rows,
                    lambda *r: te.sum(x(*r[: len(shape) - 1], k1), axis=k1),
                    name="ln_sum",
                )
                k2 = te.reduce_axis((0, n), "k")
                nf = tirx.const(float(n), "float32")

                def sq(*r: Any) -> Any:
                    d = x(*r[: len(shape) - 1], k2) - total(*r) / nf
                    return te.sum(d * d, axis=k2)

                squares = te.compute(rows, sq, name="ln_squares")
                mean_of = lambda idx: total(*row_of(idx)) / nf  # noqa: E731
                var_of = lambda idx: squares(*row_of(idx)) / nf  # noqa: E731

            def at(t: int, idx: Sequence[Any]) -> Any:
                if t == self.x:
                    return x(*idx)
                if t == self.mean:
                    return mean_of(idx)
                if t == self.var:
                    return var_of(idx)
                if t in scalars:
                    return tirx.const(scalars[t], "float32")
                op = graph.ops[producers[t]]  # (constant tensors: `_op_value` broadcasts them)
                return self._op_value(graph, op, t, idx, shape, at, consts, tensors)

            return te.compute(shape, lambda *idx: at(self.out, idx), name="ln_out")

        return bb.emit(bb.call_te(compute, *operands, primfunc_name_hint=PRIMFUNC_NAME))

    def _op_value(
        self,
        graph: Subgraph,
        op: Op,
        t: int,
        idx: Sequence[Any],
        shape: tuple[int, ...],
        at: Callable[[int, Sequence[Any]], Any],
        consts: Sequence[te.Tensor],
        tensors: dict[int, int],
    ) -> Any:
        """Op ``op``'s value at output element ``idx`` of ``x`` (its row, for a row op)."""
        out_shape = graph.tensors[t].shape
        full = self.kinds[t] == "full"

        def operand(u: int) -> Any:
            if u in tensors:
                c = consts[tensors[u] - 1]
                where = list(idx) if full else _row_index(out_shape, shape, idx)
                target = shape if full else out_shape
                lead = len(target) - len(c.shape)
                return c(*[0 if int(d) == 1 else where[lead + j] for j, d in enumerate(c.shape)])
            return at(u, idx)

        if op.name in _UNARY:
            return _UNARY[op.name](operand(op.inputs[0]))
        y = _BINARY[op.name](operand(op.inputs[0]), operand(op.inputs[1]))
        lo, hi = _CLAMPS.get(int(op.options.get("fused_activation_function", 0) or 0), (None, None))
        if lo is not None:
            y = tirx.max(y, tirx.const(lo, "float32"))
        if hi is not None:
            y = tirx.min(y, tirx.const(hi, "float32"))
        return y


def _row_index(row_shape: Sequence[int], shape: Sequence[int], idx: Sequence[Any]) -> list[Any]:
    """Indices into a row tensor of ``row_shape`` of the row of element ``idx`` of ``x``:
    its axes of more than one element are the rows' own, in order."""
    rows = [i for d, i in zip(shape[:-1], idx[:-1], strict=True) if d != 1]
    it = iter(rows)
    return [0 if d == 1 else next(it) for d in row_shape]


class _Finder:
    """The search of one partition (see :func:`find_layer_norms`)."""

    def __init__(self, graph: Subgraph, part: Partition) -> None:
        self.g = graph
        self.part = part
        self.in_part = set(part.ops)
        self.producer: dict[int, int] = {}
        self.consumers: dict[int, list[int]] = {}
        for i in part.ops:
            for t in graph.ops[i].outputs:
                self.producer[t] = i
            for t in set(graph.ops[i].inputs):
                self.consumers.setdefault(t, []).append(i)
        self.leaving = set(part.outputs)

    def tensor(self, t: int) -> Tensor:
        return self.g.tensors[t]

    def is_const(self, t: int) -> bool:
        return t >= 0 and self.tensor(t).data is not None

    def float_activation(self, t: int) -> bool:
        tensor = self.tensor(t)
        return tensor.data is None and tensor.dtype == np.float32 and not is_quantized(tensor)

    def mean_over_last(self, i: int, x: int | None = None) -> bool:
        """Op ``i`` is a MEAN of ``x`` (any activation if None) over its last axis, other
        reduced axes having one element."""
        op = self.g.ops[i]
        if op.name != "MEAN" or len(op.inputs) < 2 or not self.is_const(op.inputs[1]):
            return False
        src = op.inputs[0]
        if (x is not None and src != x) or not self.float_activation(src):
            return False
        shape = self.tensor(src).shape
        if not shape:
            return False
        axes = {int(a) % len(shape) for a in np.asarray(self.tensor(op.inputs[1]).data).ravel()}
        rank = len(shape)
        return rank - 1 in axes and all(shape[a] == 1 for a in axes - {rank - 1})

    def through_reshapes(self, t: int, want: int) -> bool:
        """Tensor ``t`` is ``want`` or RESHAPEs of it (of this partition)."""
        for _ in range(8):
            if t == want:
                return True
            i = self.producer.get(t)
            if i is None or self.g.ops[i].name != "RESHAPE":
                return False
            t = self.g.ops[i].inputs[0]
        return False

    def core(self, v_op: int) -> tuple[int, int, set[int]] | None:
        """``(x, mean, ops)`` when MEAN op ``v_op`` is the variance of a layer norm: a MEAN
        over the last axis of ``(x - mean)^2``, ``mean`` a MEAN of ``x`` over the same axis."""
        g = self.g
        q = g.ops[v_op].inputs[0]
        qi = self.producer.get(q)
        if qi is None or not self.mean_over_last(v_op):
            return None
        qop = g.ops[qi]
        ops = {v_op, qi}
        if qop.name == "SQUARED_DIFFERENCE":
            pairs = [(qop.inputs[0], qop.inputs[1]), (qop.inputs[1], qop.inputs[0])]
        elif self._square(qi):
            di = self.producer.get(qop.inputs[0])
            if di is None or g.ops[di].name != "SUB":
                return None
            dop = g.ops[di]
            if int(dop.options.get("fused_activation_function", 0) or 0):
                return None
            ops.add(di)
            pairs = [(dop.inputs[0], dop.inputs[1]), (dop.inputs[1], dop.inputs[0])]
        else:
            return None
        for x, m in pairs:
            if self.tensor(x).shape != self.tensor(q).shape or not self.float_activation(x):
                continue
            for mi in self._reshape_sources(m):
                if self.mean_over_last(mi, x):
                    mean = g.ops[mi].outputs[0]
                    path = self._reshape_path(m, mean)
                    return x, mean, ops | {mi} | path
        return None

    def rms_core(self, v_op: int) -> tuple[int, None, set[int]] | None:
        """``(x, None, ops)`` when MEAN op ``v_op`` is the statistic of an RMS norm (the
        LLMs' RMSNorm: litert-torch's ``odml.rms_norm``): a MEAN over the last axis of
        ``x * x`` (a MUL of one tensor by itself, or SQUARE)."""
        q = self.g.ops[v_op].inputs[0]
        qi = self.producer.get(q)
        if qi is None or not self.mean_over_last(v_op) or not self._square(qi):
            return None
        x = self.g.ops[qi].inputs[0]
        if self.tensor(x).shape != self.tensor(q).shape or not self.float_activation(x):
            return None
        return x, None, {v_op, qi}

    def _square(self, i: int) -> bool:
        """Op ``i`` squares one tensor: a MUL of it by itself or a SQUARE, no activation."""
        op = self.g.ops[i]
        return (
            op.name in ("MUL", "SQUARE")
            and len(set(op.inputs)) == 1
            and not int(op.options.get("fused_activation_function", 0) or 0)
        )

    def _reshape_sources(self, t: int) -> list[int]:
        """The ops that computed ``t`` through RESHAPEs only."""
        for _ in range(8):
            i = self.producer.get(t)
            if i is None:
                return []
            if self.g.ops[i].name != "RESHAPE":
                return [i]
            t = self.g.ops[i].inputs[0]
        return []

    def _reshape_path(self, t: int, mean: int) -> set[int]:
        path = set()
        while t != mean:
            i = self.producer[t]
            path.add(i)
            t = self.g.ops[i].inputs[0]
        return path

    def kind(self, t: int, x_shape: tuple[int, ...]) -> str | None:
        shape = tuple(self.tensor(t).shape)
        if shape == x_shape:
            return "full"
        rows = x_shape[:-1]
        if math.prod(shape) == math.prod(rows) and _nonunit(shape) == _nonunit(rows):
            return "row"
        return None

    def fits(self, i: int, region: dict[int, str], x: int, x_shape: tuple[int, ...]) -> bool:
        """Op ``i`` computes per element from the group's tensors and constants."""
        op = self.g.ops[i]
        if len(op.outputs) != 1 or not self.float_activation(op.outputs[0]):
            return False
        t = op.outputs[0]
        kind = self.kind(t, x_shape)
        if kind is None:
            return False
        ins = op.inputs[:1] if op.name == "RESHAPE" else list(op.inputs)
        if op.name == "RESHAPE":
            if kind != region.get(ins[0]) or ins[0] == x:
                return False
        elif op.name in _BINARY:
            code = int(op.options.get("fused_activation_function", 0) or 0)
            if len(ins) != 2 or (code and code not in _CLAMPS):
                return False
        elif op.name not in _UNARY or len(ins) != 1:
            return False
        out_shape = tuple(self.tensor(t).shape)
        shapes = [tuple(self.tensor(u).shape) for u in ins if u >= 0]
        if op.name != "RESHAPE" and tuple(np.broadcast_shapes(*shapes)) != out_shape:
            return False
        computed = False
        for u in ins:
            if u < 0:
                return False
            if self.is_const(u):
                c_shape = tuple(self.tensor(u).shape)
                if self.tensor(u).dtype.kind != "f" or is_quantized(self.tensor(u)):
                    return False
                if tuple(np.broadcast_shapes(c_shape, out_shape)) != out_shape:
                    return False
                continue
            k = region.get(u)
            if k is None:
                return False
            computed = computed or u != x
            if kind == "row" and k != "row":
                return False
            if kind == "row" and _nonunit(self.tensor(u).shape) != _nonunit(out_shape):
                return False
            if kind == "full" and k == "row":
                s = tuple(self.tensor(u).shape)
                padded = (1,) * (len(x_shape) - len(s)) + s
                if len(s) > len(x_shape) or padded[-1] != 1 or padded[:-1] != x_shape[:-1]:
                    return False
        return computed

    def grow(
        self, x: int, mean: int | None, var: int, core_ops: set[int], taken: set[int]
    ) -> LayerNorm | None:
        """The layer norm around the statistics: the elementwise ops that compute from them,
        as long as one tensor of the shape of ``x`` is all that leaves the group."""
        g = self.g
        x_shape = tuple(int(d) for d in self.tensor(x).shape)
        region: dict[int, str] = {x: "full"}
        for i in core_ops:
            t = g.ops[i].outputs[0]
            k = self.kind(t, x_shape)
            if k is None or not self.float_activation(t):
                return None
            region[t] = k
        if region[var if mean is None else mean] != "row" and x_shape[-1] != 1:
            return None
        added: list[int] = []
        order = [i for i in self.part.ops if i not in core_ops and i not in taken]
        changed = True
        while changed:
            changed = False
            for i in order:
                if i in added or not self.fits(i, region, x, x_shape):
                    continue
                added.append(i)
                region[g.ops[i].outputs[0]] = self.kind(g.ops[i].outputs[0], x_shape) or ""
                changed = True
        while True:
            ops = core_ops | set(added)
            leaving = [t for t in region if t != x and self._leaves(t, ops)]
            if len(leaving) == 1 and region[leaving[0]] == "full":
                break
            if not added:
                return None
            dropped = added.pop()
            del region[g.ops[dropped].outputs[0]]
        out = leaving[0]
        if not any(g.ops[i].name == "RSQRT" for i in added) and not any(
            g.ops[i].name == "DIV" for i in added
        ):
            return None  # not a normalisation (a variance used otherwise)
        return LayerNorm(x, mean, var, ops, out, self.producer[out], region)

    def _leaves(self, t: int, ops: set[int]) -> bool:
        return t in self.leaving or any(c not in ops for c in self.consumers.get(t, []))


def find_layer_norms(graph: Subgraph, part: Partition) -> list[LayerNorm]:
    """The layer norms of a partition that can be one kernel each (module docstring).

    Args:
        graph: the subgraph.
        part: the GPU partition.

    Returns:
        The layer norms, their op sets disjoint.
    """
    finder = _Finder(graph, part)
    found: list[LayerNorm] = []
    taken: set[int] = set()
    for i in part.ops:
        if graph.ops[i].name != "MEAN" or i in taken:
            continue
        core = finder.core(i) or finder.rms_core(i)
        if core is None:
            continue
        x, mean, ops = core
        if ops & taken:
            continue
        ln = finder.grow(x, mean, graph.ops[i].outputs[0], ops, taken)
        if ln is not None:
            found.append(ln)
            taken |= ln.ops
    return found
