"""A recurrent step as one kernel: the recurrent product, its gates and the new state.

An unrolled recurrent step (a Keras LSTM or GRU layer's WHILE loop, `litekiln.ops.unroll`; a
sequence LSTM, `litekiln.ops.unroll_lstm`) is a FULLY_CONNECTED of the previous output by the
recurrent weights (``[1, K]`` by ``[N, K]``), terms added at the product's full width (a bias,
the step's row of the batched input product: a GATHER of one row), the sum cut into gates of
one width ``m`` (SPLIT, STRIDED_SLICE), and elementwise ops of the gates and of the previous
state (LOGISTIC, TANH, MUL, ADD, SUB) that make the step's new state and output. Op by op
(with `compiler.fusion`'s merges) that is two kernels a step: the product, then the state
update. The update of a unit reads all its gates, which are columns ``m`` apart in the
product's output: no epilogue of one output element, so no product kernel takes it.

:func:`find_gated_steps` recognises that chain (each intermediate read inside it alone, the
elementwise ops' other operands computed before the product or constant, float32) and
:meth:`GatedStep.emit` writes it as one ``call_te``: a block ``gate_sums`` of the gates'
products, ``[parts, m]``, and one block ``gated_out`` that writes every tensor the step hands
on (the new state, the new output) from a unit's gates. The schedules make it one kernel
(`schedules.GatedStepLanes` on GPUs: a work-group per few units, a warp's lanes sharing each
unit's sums, which stay in registers; `schedules.SerialGatedStep` on CPU OpenCL: a work-item
per unit). A step's row of the batched input product is read through the GATHER's index
tensor, not at a constant row, so that every step of a layer is the same function: one
kernel of the program, compiled and built once.

The elementwise ops are computed in float32 as their emitters compute them (TVM's sigmoid and
tanh, `emit_math`), and each output is rounded once to its storage (half under fp16).
Anything else stays op by op: quantized or non-float tensors, fused activations, a gate or
intermediate read outside the chain, a state computed after the product.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from tvm import relax, te, tirx

from litekiln.compiler.partition import Partition
from litekiln.model.ir import Subgraph
from litekiln.ops.base import is_quantized
from litekiln.reference import gather_inputs, run_op

#: Name of the step's PrimFunc.
PRIMFUNC_NAME = "gated_step"
#: Its blocks (the schedule rules find them by name): the gates' products and the outputs
#: (one block each, under one loop nest).
BLOCKS = ("gate_sums", "gated_out")
#: Name prefix of the blocks that read the outputs' other operands (one per operand).
LEAF = "gated_in"
#: The elementwise ops a step's gates go through (none with a fused activation).
ELEMENTWISE = frozenset({"LOGISTIC", "TANH", "MUL", "ADD", "SUB"})
#: Ops that cut the product's sum into gates.
SLICERS = frozenset({"SPLIT", "SPLIT_V", "STRIDED_SLICE", "SLICE"})
#: Data-movement ops an operand of the step's elementwise ops may be read through
#: (`_Tracer._copy_leaf`).
COPIES = SLICERS | {"RESHAPE", "SQUEEZE", "EXPAND_DIMS", "GATHER"}
#: Most outputs of one step (an LSTM hands on two: the cell state and the output).
MAX_OUTPUTS = 4
#: Most terms of the recurrent product (each lane of the GPU schedule sums K / lanes of them
#: for every gate) and most units (the gates' width).
MAX_TERMS = 4096

# A reference to a value of a unit ``j`` of the step:
#   ("gate", p)                      the product's part p, with the terms at full width
#   ("row", table, index, offset)    table[index[0], offset + j] (a gathered row's slice)
#   ("narrow", t)                    tensor t's element j (m elements)
#   ("flat", t, offset)              tensor t's element offset + j, counted row-major
#   ("scalar", value)                a constant
#   ("node", k)                      the k-th elementwise op's result
Ref = tuple[Any, ...]


@dataclass
class Node:
    """An elementwise op of the step: its name and operands."""

    name: str
    args: list[Ref]
    out: int  # the tensor it writes


@dataclass
class GatedStep:
    """One recurrent step of a partition.

    Attributes:
        operand: the product's ``[1, K]`` operand (the previous output); -1: no product (a
            first step, its product of the initial state folded into a constant term).
        weights: the recurrent weights ``[N, K]`` (a constant), or -1.
        bias: the FULLY_CONNECTED's bias ``[N]``, or -1.
        width: the gates' width ``m``; ``N / m`` parts.
        wide: terms added to the product at full width: ``("tensor", t)`` (``N`` elements),
            ``("row", table, index)`` (a row of ``table`` picked by a one-element index) or
            ``("flat", t, offset)`` (elements ``offset ..`` of ``t``, `_Tracer._copy_leaf`).
        nodes: the elementwise ops, in order.
        outputs: (tensor, node) of each tensor the step hands on.
        ops: every op of the chain (emitted as one call, at ``last``).
        last: the chain's last op in the partition's order.
        n, k: the product's outputs ``N`` and terms ``K``.
    """

    operand: int
    weights: int
    bias: int
    width: int
    wide: list[tuple[Any, ...]]
    nodes: list[Node]
    outputs: list[tuple[int, int]]
    ops: set[int]
    last: int
    n: int = 0
    k: int = 0

    def emit(
        self,
        bb: relax.BlockBuilder,
        stored: Callable[[int], Any],
        out_dtype: Callable[[int], str],
        rounding: Callable[[int], Callable[[Any], Any] | None],
    ) -> dict[int, Any]:
        """The step as one ``call_te``: each output tensor's value (shape ``[1, m]``).

        Args:
            bb: the block builder of the partition's function.
            stored: a tensor's Relax value as stored (half under native fp16; int32 indices).
            out_dtype: the storage dtype of an output tensor.
            rounding: what an output's float32 value goes through before it is stored (fp16
                values under emulated half), or None.
        """
        tensors = self._inputs()
        slot = {t: n for n, t in enumerate(tensors)}
        m, n_parts, k_terms = self.width, self.n // self.width, self.k
        dtypes = [out_dtype(t) for t, _ in self.outputs]
        rounds = [rounding(t) for t, _ in self.outputs]

        def compute(*args: te.Tensor) -> list[te.Tensor]:
            def at(t: int, flat: Any) -> Any:
                x = args[slot[t]]
                idx = [0] * (len(x.shape) - 1) + [flat]
                return x(*idx).astype("float32") if x.dtype != "int32" else x(*idx)

            sums = None
            if self.weights >= 0:
                r = te.reduce_axis((0, k_terms), name="k")
                w = args[slot[self.weights]]
                sums = te.compute(
                    (n_parts, m),
                    lambda p, j: te.sum(
                        at(self.operand, r) * w[p * m + j, r].astype("float32"), axis=r
                    ),
                    name=BLOCKS[0],
                )

            def wide_term(term: tuple[Any, ...], col: Any) -> Any:
                if term[0] == "tensor":
                    return at(term[1], col)
                if term[0] == "flat":
                    x = args[slot[term[1]]]
                    return x(*_unravel(term[2] + col, [int(d) for d in x.shape])).astype("float32")
                table, index = args[slot[term[1]]], args[slot[term[2]]]
                rows = int(table.shape[0])
                row = index(*([0] * len(index.shape))).astype("int32")
                row = tirx.max(tirx.min(row, rows - 1), 0)  # (a valid row: int32 indices)
                return table(row, col).astype("float32")

            def leaf(ref: Ref, j: Any) -> Any:
                """A value the outputs read from memory: a gate's terms, a row's slice, a
                tensor's element."""
                if ref[0] == "terms":
                    col = ref[1] * m + j
                    terms = [wide_term(term, col) for term in self.wide]
                    if self.bias >= 0:
                        terms.insert(0, at(self.bias, col))
                    v = terms[0]
                    for term_value in terms[1:]:
                        v = v + term_value
                    return v
                if ref[0] == "row":
                    return wide_term(("row", ref[1], ref[2]), ref[3] + j)
                if ref[0] == "flat":
                    x = args[slot[ref[1]]]
                    return x(*_unravel(ref[2] + j, [int(d) for d in x.shape])).astype("float32")
                return at(ref[1], j)

            # Every such value is read first (a block each, `LEAF` prefix): the schedules
            # compute them in registers at the start of the kernel, so that their loads are
            # in flight with the products' (read after the sums, a unit's thread waited on
            # them in turn: the step's index, then its row of the input product).
            leaves: dict[Ref, te.Tensor] = {}
            gate_refs = (
                [("terms", p) for p in range(n_parts)] if self.wide or self.bias >= 0 else []
            )
            for ref in gate_refs + [a for nd in self.nodes for a in nd.args]:
                if ref[0] in ("terms", "row", "narrow", "flat") and ref not in leaves:
                    leaves[ref] = te.compute((m,), _bound(leaf, ref), name=f"{LEAF}{len(leaves)}")

            def value(ref: Ref, j: Any, memo: dict[int, Any]) -> Any:
                kind = ref[0]
                if kind == "gate":
                    terms = ("terms", ref[1])
                    v = sums[ref[1], j] if sums is not None else None
                    if terms in leaves:
                        v = leaves[terms][j] if v is None else v + leaves[terms][j]
                    assert v is not None  # (no product: the terms the step began with)
                    return v
                if kind in ("row", "narrow", "flat"):
                    return leaves[ref][j]
                if kind == "scalar":
                    return tirx.const(ref[1], "float32")
                k = ref[1]
                if k not in memo:
                    node = self.nodes[k]
                    xs = [value(a, j, memo) for a in node.args]
                    memo[k] = _ELEMENTWISE_TE[node.name](*xs)
                return memo[k]

            def outs(_i: Any, j: Any) -> list[Any]:
                memo: dict[int, Any] = {}
                out = []
                for (_, k), dt, rnd in zip(self.outputs, dtypes, rounds, strict=True):
                    v = value(("node", k), j, memo)
                    out.append((rnd(v) if rnd is not None else v).astype(dt))
                return out

            res = te.compute((1, m), outs, name=BLOCKS[1])
            return list(res) if isinstance(res, (list, tuple)) else [res]

        call = bb.emit_te(compute, *[stored(t) for t in tensors], primfunc_name_hint=PRIMFUNC_NAME)
        if len(self.outputs) == 1:
            return {self.outputs[0][0]: call}
        return {t: bb.emit(relax.TupleGetItem(call, n)) for n, (t, _) in enumerate(self.outputs)}

    def _inputs(self) -> list[int]:
        """The call's tensors, in order: operand, weights, bias, then every other input."""
        order = [t for t in (self.operand, self.weights, self.bias) if t >= 0]
        for term in self.wide:
            order += list(term[1:3] if term[0] == "row" else term[1:2])
        for node in self.nodes:
            for a in node.args:
                if a[0] == "row":
                    order += [a[1], a[2]]
                elif a[0] in ("narrow", "flat"):
                    order.append(a[1])
        seen: list[int] = []
        for t in order:
            if t not in seen:
                seen.append(t)
        return seen


def _first_of_run(positions: np.ndarray | None) -> int | None:
    """The first of ``positions`` where they are consecutive (a contiguous slice), else
    None."""
    if positions is None:
        return None
    flat = np.asarray(positions).reshape(-1)
    if flat.size == 0:
        return None
    first = int(flat[0])
    return first if np.array_equal(flat, np.arange(first, first + flat.size)) else None


def _unravel(flat: Any, shape: list[int]) -> list[Any]:
    """The index of element ``flat`` of a row-major tensor of ``shape``."""
    idx = []
    for k, d in enumerate(shape):
        stride = int(np.prod(shape[k + 1 :], dtype=np.int64))
        i = tirx.floordiv(flat, stride) if stride > 1 else flat
        idx.append(tirx.floormod(i, d) if k else i)
    return idx


def _bound(leaf: Callable[[Ref, Any], Any], ref: Ref) -> Callable[[Any], Any]:
    """``leaf`` of ``ref`` as a function of the unit alone (TE takes no default arguments)."""
    return lambda j: leaf(ref, j)


_ELEMENTWISE_TE: dict[str, Callable[..., Any]] = {
    "LOGISTIC": tirx.sigmoid,
    "TANH": tirx.tanh,
    "MUL": lambda a, b: a * b,
    "ADD": lambda a, b: a + b,
    "SUB": lambda a, b: a - b,
}


def find_gated_steps(graph: Subgraph, part: Partition, taken: set[int]) -> list[GatedStep]:
    """Every recurrent step of ``part`` (see the module docstring) whose ops are not in
    ``taken`` (another fusion's)."""
    pos = {i: n for n, i in enumerate(part.ops)}
    readers = part.readers(graph)
    keep = set(part.outputs)
    found: list[GatedStep] = []
    used = set(taken)
    for i in part.ops:
        if graph.ops[i].name not in ("FULLY_CONNECTED", "ADD") or i in used:
            continue
        step = _Tracer(graph, part, pos, readers, keep).trace(i)
        if step is not None and not step.ops & used:
            found.append(step)
            used |= step.ops
    return found


class _Tracer:
    def __init__(
        self,
        graph: Subgraph,
        part: Partition,
        pos: dict[int, int],
        readers: dict[int, list[int]],
        keep: set[int],
    ) -> None:
        self.graph, self.part, self.pos, self.readers, self.keep = graph, part, pos, readers, keep
        self.producer = {t: i for i in part.ops for t in graph.ops[i].outputs if t >= 0}
        #: Data-movement ops the step's operands were read through (`_copy_leaf`,
        #: `_row_slice`).
        self.copies: set[int] = set()

    def _float(self, t: int) -> bool:
        x = self.graph.tensors[t]
        return x.dtype.name == "float32" and not is_quantized(x)

    def _size(self, t: int) -> int:
        return int(np.prod(self.graph.tensors[t].shape, dtype=np.int64))

    def _flat(self, t: int, n: int) -> bool:
        """Whether tensor ``t`` holds ``n`` elements along its last axis (leading unit axes)."""
        shape = tuple(int(d) for d in self.graph.tensors[t].shape)
        return bool(shape) and shape[-1] == n and all(d == 1 for d in shape[:-1])

    def _const(self, t: int) -> bool:
        return self.graph.tensors[t].data is not None

    def trace(self, fc: int) -> GatedStep | None:
        """The step that starts at op ``fc``: a FULLY_CONNECTED (the recurrent product), or
        an ADD of two terms at full width (a first step, whose product of the initial state
        was folded into a constant); else None."""
        g = self.graph
        op = g.ops[fc]
        if len(op.outputs) != 1 or int(op.options.get("fused_activation_function", 0) or 0):
            return None
        wide: list[tuple[Any, ...]] = []
        members = {fc}
        if op.name == "ADD":
            a = w = bias = -1
            n, k = self._size(op.outputs[0]), 0
            for t in op.inputs:
                term = self._term(t, n, fc, members)
                if term is None:
                    return None
                wide.append(term)
        else:
            if len(op.inputs) < 2:
                return None
            a, w = op.inputs[0], op.inputs[1]
            bias = op.inputs[2] if len(op.inputs) > 2 else -1
            wt = g.tensors[w]
            if not (self._const(w) and len(wt.shape) == 2 and self._float(w) and self._float(a)):
                return None
            n, k = (int(d) for d in wt.shape)
            if not (self._flat(a, k) and 2 <= k <= MAX_TERMS):
                return None
            if bias >= 0 and not (
                self._const(bias) and self._float(bias) and self._size(bias) == n
            ):
                return None
        cur = op.outputs[0]
        while True:  # the full-width chain: reshapes, terms added
            if not self._float(cur) or self._size(cur) != n or cur in self.keep:
                return None
            rs = self.readers.get(cur, [])
            if len(rs) != 1:
                break
            nxt = g.ops[rs[0]]
            if nxt.name == "RESHAPE" and nxt.inputs[0] == cur:
                members.add(rs[0])
                cur = nxt.outputs[0]
                continue
            if nxt.name != "ADD" or int(nxt.options.get("fused_activation_function", 0) or 0):
                break
            other = nxt.inputs[1] if nxt.inputs[0] == cur else nxt.inputs[0]
            term = None if other == cur else self._term(other, n, fc, members)
            if term is None:
                return None
            wide.append(term)
            members.add(rs[0])
            cur = nxt.outputs[0]
        known: dict[int, Ref] = {}
        m = self._slices(cur, members, known, gate=True)
        if m is None or n % m or m > MAX_TERMS:
            return None
        nodes: list[Node] = []
        for i in self.part.ops[self.pos[fc] + 1 :]:
            op_i = g.ops[i]
            if i in members:
                continue
            reads = [t for t in op_i.inputs if t in known]
            if not reads:
                continue
            args = self._node_args(op_i, fc, m, known) if self._eligible(
                op_i, m
            ) else None  # fmt: skip
            if args is None:
                break  # (a reader of the step's values that is not elementwise: the next step)
            known[op_i.outputs[0]] = ("node", len(nodes))
            nodes.append(Node(op_i.name, args, op_i.outputs[0]))
            members.add(i)
        self.absorb_copies(members)
        # The gates are read by the nodes alone.
        for t, ref in known.items():
            if ref[0] == "gate" and (
                t in self.keep or any(r not in members for r in self.readers.get(t, []))
            ):
                return None
        last = max(members, key=self.pos.__getitem__)
        outputs = []
        for node_k, node in enumerate(nodes):
            outside = [r for r in self.readers.get(node.out, []) if r not in members]
            if node.out in self.keep or outside:
                if any(self.pos[r] < self.pos[last] for r in outside):
                    return None
                outputs.append((node.out, node_k))
        if not outputs or len(outputs) > MAX_OUTPUTS:
            return None
        return GatedStep(a, w, bias, m, wide, nodes, outputs, members, last, n=n, k=k)

    def _term(self, t: int, n: int, fc: int, members: set[int]) -> tuple[Any, ...] | None:
        """A term added at full width: a gathered row (`_row`: its GATHER joins ``members``)
        or a tensor ready before op ``fc``; else None."""
        if not self._float(t) or not self._flat(t, n):
            return None
        term = self._row(t)
        if term is not None:
            members.add(self.producer[t])
            return term
        return self._copy_leaf(t, n, fc) or (("tensor", t) if self._before(t, fc) else None)

    def _before(self, t: int, fc: int) -> bool:
        """Whether ``t`` is ready before op ``fc``: a constant, a partition input or the
        output of an earlier op."""
        if self._const(t):
            return True
        p = self.producer.get(t)
        return p is None or self.pos[p] < self.pos[fc]

    def _row(self, t: int) -> tuple[Any, ...] | None:
        """``("row", table, index)`` where ``t`` is a GATHER of one row read once (a term at
        full width); else None."""
        if t not in self.producer or len(self.readers.get(t, [])) != 1:
            return None
        return self._row_of(t)

    def _slices(
        self, t: int, members: set[int], known: dict[int, Ref], *, gate: bool,
        row: tuple[Any, ...] | None = None,
    ) -> int | None:  # fmt: skip
        """Every reader of ``t`` cuts it into contiguous slices of one width
        at multiples of it: their outputs become ``known`` (gates, or slices of ``row``), the
        slicers ``members``; the width, or None."""
        width = None
        found: dict[int, Ref] = {}
        slicers = []
        for s in self.readers.get(t, []):
            op = self.graph.ops[s]
            if op.name not in SLICERS:
                return None
            data = 1 if op.name == "SPLIT" else 0
            if op.inputs[data] != t or any(
                x != t and not self._const(x) for x in op.inputs if x >= 0
            ):
                return None
            positions = self._ramp(t, [s])
            if positions is None:
                return None
            for u in op.outputs:
                first = _first_of_run(positions.get(u))
                size = self._size(u)
                if first is None or not self._float(u) or not self._flat(u, size):
                    return None
                if width is None:
                    width = size
                if size != width or first % width:
                    return None
                found[u] = ("gate", first // width) if gate else (*(row or ()), first)
            slicers.append(s)
        if width is None:
            return None
        members.update(slicers)
        known.update(found)
        return width

    def _eligible(self, op: Any, m: int) -> bool:
        return (
            op.name in ELEMENTWISE
            and not int(op.options.get("fused_activation_function", 0) or 0)
            and len(op.outputs) == 1
            and self._float(op.outputs[0])
            and self._flat(op.outputs[0], m)
        )

    def _node_args(self, op: Any, fc: int, m: int, known: dict[int, Ref]) -> list[Ref] | None:
        """The op's operands as references, or None where one is out of reach."""
        args: list[Ref] = []
        arity = 1 if op.name in ("LOGISTIC", "TANH") else 2
        if len(op.inputs) != arity:
            return None
        for t in op.inputs:
            if t in known:
                args.append(known[t])
                continue
            if not self._float(t):
                return None
            if self._const(t) and self._size(t) == 1:
                data = np.asarray(self.graph.tensors[t].data)
                args.append(("scalar", float(data.reshape(-1)[0])))
                continue
            if not self._flat(t, m):
                return None
            ref = self._row_slice(t, m, known) or self._copy_leaf(t, m, fc)
            if ref is not None:
                args.append(ref)
            elif self._before(t, fc):
                args.append(("narrow", t))
            else:
                return None
        return args

    def _copy_leaf(self, t: int, m: int, fc: int) -> Ref | None:
        """``("flat", source, offset)`` where ``t`` (``m`` elements) is elements ``offset ..
        offset + m`` of ``source``, a tensor ready before op ``fc``, through data-movement
        ops alone (slices, reshapes, a gather at constant positions: litert-torch's step
        reads its row of the batched input product so, then cuts it into the gates' parts);
        the ops join the step where the step alone reads them (`_absorb_copies`). None
        otherwise."""
        chain = []
        cur = t
        while True:
            p = self.producer.get(cur)
            if p is None or self.graph.ops[p].name not in COPIES:
                break
            op = self.graph.ops[p]
            data = op.inputs[1 if op.name == "SPLIT" else 0]
            if any(x != data and x >= 0 and not self._const(x) for x in op.inputs):
                break
            if not self._float(data):
                break
            chain.append(p)
            cur = data
        if not chain or not self._before(cur, fc):
            return None
        positions = self._ramp(cur, chain[::-1])
        first = _first_of_run(positions.get(t) if positions else None)
        if first is None or self._size(t) != m:
            return None
        self.copies.update(chain)
        return ("flat", cur, first)

    def _ramp(self, source: int, ops: list[int]) -> dict[int, np.ndarray] | None:
        """Where the elements of each output of data-movement ``ops`` (run in order, their
        other operands constant) come from in ``source``: the ops' own references run on
        ``source``'s positions (float32, exact below 2**24). None where one refuses."""
        if self._size(source) >= 1 << 24:
            return None
        shape = self.graph.tensors[source].shape
        values = {source: np.arange(self._size(source), dtype=np.float32).reshape(shape)}
        for p in ops:
            op = self.graph.ops[p]
            try:
                res = run_op(op, self.graph, gather_inputs(op, self.graph, values))
            except Exception:  # (not ours to judge: the op stays a kernel of its own)
                return None
            values.update({u: r for u, r in zip(op.outputs, res, strict=True) if u >= 0})
        return values

    def absorb_copies(self, members: set[int]) -> None:
        """The data-movement ops the step's operands were read through (`_copy_leaf`,
        `_row_slice`) whose outputs only the step reads join it (the others stay, for their
        other readers)."""
        grew = True
        while grew:
            grew = False
            for p in self.copies - members:
                outs = [u for u in self.graph.ops[p].outputs if u >= 0]
                if all(
                    u not in self.keep and all(r in members for r in self.readers.get(u, []))
                    for u in outs
                ):
                    members.add(p)
                    grew = True

    def _row_slice(self, t: int, m: int, known: dict[int, Ref]) -> Ref | None:
        """A slice of a gathered row (`_row`), read from the table: the GATHER and its
        slicers join the step where only it reads them (`absorb_copies`: a GRU with the
        reset gate before the candidate's product adds the row's third part there)."""
        s = self.producer.get(t)
        if s is None or self.graph.ops[s].name not in SLICERS:
            return None
        op = self.graph.ops[s]
        data = op.inputs[1 if op.name == "SPLIT" else 0]
        gather = self.producer.get(data)
        if gather is None:
            return None
        row = self._row_of(data)
        if row is None:
            return None
        trial_members: set[int] = set()
        trial: dict[int, Ref] = {}
        width = self._slices(data, trial_members, trial, gate=False, row=row)
        if width != m or t not in trial:
            return None
        self.copies.update(trial_members | {gather})  # (they join where only it reads them)
        known.update(trial)
        return trial[t]

    def _row_of(self, t: int) -> tuple[Any, ...] | None:
        """``("row", table, index)`` where GATHER output ``t`` is one row of a 2-D float table
        picked by a constant index in range; else None."""
        p = self.producer[t]
        op = self.graph.ops[p]
        if op.name != "GATHER" or t in self.keep:
            return None
        if int(op.options.get("axis", 0) or 0) != 0 or int(op.options.get("batch_dims", 0) or 0):
            return None
        table, index = op.inputs[0], op.inputs[1]
        tt, it = self.graph.tensors[table], self.graph.tensors[index]
        n = self._size(t)
        if len(tt.shape) != 2 or int(tt.shape[1]) != n or not self._float(table):
            return None
        if it.data is None or it.dtype.name != "int32" or it.size != 1:
            return None
        if not 0 <= int(np.asarray(it.data).reshape(-1)[0]) < int(tt.shape[0]):
            return None
        return ("row", table, index)
