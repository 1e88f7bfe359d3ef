"""UNIDIRECTIONAL_SEQUENCE_LSTM expanded at load into per-step ops the GPU path runs.

Like a WHILE with a static trip count (:mod:`litekiln.ops.unroll`), a float sequence LSTM
is replaced in the main graph by plain ops, once per time step
(:mod:`litekiln.ops.seq_lstm` gives the kernel's formulas):

* UNPACK of the input along the time axis (one ``[B, I]`` tensor per step);
* per step: CONCATENATION of ``x_t`` and ``h``, one FULLY_CONNECTED by the gates' input and
  recurrent weights stacked (``[G*C, I+O]``, G = 4, or 3 with CIFG; a constant made once)
  and their biases, SPLIT into the gates; with layer norm each gate normalised (MEAN,
  SQUARED_DIFFERENCE, RSQRT, SUB, MUL) before its coefficients and bias; peepholes as
  MUL and ADD; LOGISTIC gates (CIFG: ``1 - f`` by SUB); the cell gate's and the output's
  activation (TANH, RELU, RELU6, RELU_N1_TO_1); the cell update by MUL and ADD; the clips
  by MAXIMUM and MINIMUM; the projection by FULLY_CONNECTED;
* PACK of every step's ``h`` into the op's output tensor (which keeps its index).

The states start from the op's variable tensors (read by the first step), and the last
step's ``h`` and ``c`` are recorded as their new values (``Subgraph.variable_updates``):
the interpreter writes them back after each invocation, as LiteRT's kernel does. New
tensors are appended after the file's (``<output>/step_<t>/<role>``), constants once.

An op stays whole (the numpy reference, on the CPU) where :func:`expansion_blocker` says
why: diagonal recurrent weights, weights computed at run time, or more ops than
:data:`~litekiln.ops.control.UNROLL_MAX_OPS`. It then gets two outputs more, the final
states, which become the variables' new values the same way.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from litekiln.model.ir import Op, Subgraph, Tensor
from litekiln.model.loader import check_graph
from litekiln.model.schema import builtin_code
from litekiln.ops.seq_lstm import (
    BIASES,
    CELL_STATE,
    INPUT,
    INPUT_WEIGHTS,
    LAYER_NORM_EPSILON,
    LAYER_NORMS,
    OUTPUT_STATE,
    PEEPHOLES,
    PROJECTION_BIAS,
    PROJECTION_WEIGHTS,
    RECURRENT_WEIGHTS,
    LstmShape,
    expansion_blocker,
)

log = logging.getLogger("litekiln")

NAME = "UNIDIRECTIONAL_SEQUENCE_LSTM"
_F32 = np.dtype(np.float32)


def expand_sequence_lstm(op: Op, graph: Subgraph) -> bool:
    """Replace ``op`` of ``graph`` by its per-step ops; whether it was. If not, give it its
    final states as two more outputs. Either way the variables' new values are recorded."""
    why = expansion_blocker(op, graph)
    h_var, c_var = op.inputs[OUTPUT_STATE], op.inputs[CELL_STATE]
    if why is not None:
        log.warning("%s stays whole on the CPU: %s", op.describe(), why)
        if len(op.outputs) == 1:
            out = graph.tensors[op.outputs[0]]
            b = OpBuilder(graph, out.name)
            h = b.tensor("final_output_state", graph.tensors[h_var].shape)
            c = b.tensor("final_cell_state", graph.tensors[c_var].shape)
            op.outputs = [*op.outputs, h, c]
        graph.variable_updates[h_var], graph.variable_updates[c_var] = op.outputs[1:3]
        return False
    b = OpBuilder(graph, graph.tensors[op.outputs[0]].name)
    h, c = _expand(op, graph, b, LstmShape.of(op, graph))
    graph.variable_updates[h_var], graph.variable_updates[c_var] = h, c
    b.replace(op)
    log.info("%s expanded: %d steps, %d ops", op.describe(), b.steps, len(b.ops))
    return True


class OpBuilder:
    """New tensors and ops that replace one op of a graph (an expanded sequence LSTM, a
    CONV_3D made a CONV_2D: `litekiln.ops.conv3d_as_2d`)."""

    def __init__(self, graph: Subgraph, prefix: str) -> None:
        self.graph = graph
        self.prefix = prefix
        self.ops: list[Op] = []
        self.steps = 0

    def tensor(self, name: str, shape: tuple[int, ...], data: np.ndarray | None = None) -> int:
        tensors = self.graph.tensors
        dtype = _F32 if data is None else data.dtype
        t = Tensor(
            index=len(tensors),
            name=f"{self.prefix}/{name}",
            shape=tuple(shape),
            dtype=dtype,
            shape_signature=tuple(shape),
            data=data,
        )
        tensors.append(t)
        return t.index

    def replace(self, op: Op) -> None:
        """Put the ops built so far in ``op``'s place in the graph, renumber the graph's ops
        and check it (the loader checks the new ops next, in order)."""
        self.graph.replace_op(op, self.ops)
        check_graph(self.graph, self.graph.name)

    def const(self, name: str, value: Any, dtype: Any = np.float32) -> int:
        data = np.ascontiguousarray(np.asarray(value, dtype))
        return self.tensor(name, data.shape, data)

    def op(self, name: str, inputs: list[int], outputs: list[int], **options: Any) -> None:
        self.ops.append(Op(-1, name, builtin_code(name), 1, inputs, outputs, options))

    def fully_connected(
        self, x: int, w: int, bias: int, out: str, shape: tuple[int, ...], into: int = -1
    ) -> int:
        """A plain FULLY_CONNECTED ``x @ w^T + bias`` (``bias`` -1: none; no activation) into
        a new tensor ``out`` of ``shape``, or into tensor ``into``; its output."""
        y = into if into >= 0 else self.tensor(out, shape)
        self.op("FULLY_CONNECTED", [x, w, bias], [y], fused_activation_function=0,
                weights_format=0, keep_num_dims=False)  # fmt: skip
        return y

    def unary(self, name: str, x: int, out: str, **options: Any) -> int:
        y = self.tensor(out, self.graph.tensors[x].shape)
        self.op(name, [x], [y], **options)
        return y

    def binary(self, name: str, x: int, z: int, out: str) -> int:
        tensors = self.graph.tensors
        y = self.tensor(out, np.broadcast_shapes(tensors[x].shape, tensors[z].shape))
        self.op(name, [x, z], [y], fused_activation_function=0)
        return y


def _weights(op: Op, graph: Subgraph, s: LstmShape) -> tuple[np.ndarray, np.ndarray | None]:
    """The gates' input and recurrent weights stacked ``[G*C, I+O]`` (gates input, forget,
    cell, output, less input with CIFG) and their biases ``[G*C]`` (None with layer norm:
    the bias is added after the normalisation)."""

    def data(i: int) -> np.ndarray:
        v = graph.tensors[op.inputs[i]].data
        assert v is not None
        return np.asarray(v, np.float32)

    gates = range(1, 4) if s.cifg else range(4)
    w = np.concatenate(
        [np.concatenate([data(INPUT_WEIGHTS[k]), data(RECURRENT_WEIGHTS[k])], 1) for k in gates]
    )
    bias = None if s.layer_norm else np.concatenate([data(BIASES[k]) for k in gates])
    return w, bias


def _expand(op: Op, graph: Subgraph, b: OpBuilder, s: LstmShape) -> tuple[int, int]:
    """Emit the steps into ``b``; returns the final (h, c) tensors, shaped as the variables."""
    batch, cells, n_out = s.batch, s.n_cell, s.n_output
    consts: dict[str, int] = {}

    def const(name: str, value: Any, dtype: Any = np.float32) -> int:
        if name not in consts:
            consts[name] = b.const(name, value, dtype)
        return consts[name]

    def opt(i: int) -> int | None:
        t = op.inputs[i] if i < len(op.inputs) else -1
        return t if t >= 0 else None

    w, bias = _weights(op, graph, s)
    gates = 3 if s.cifg else 4
    w_t = const("gate_weights", w)
    bias_t = const("gate_bias", bias) if bias is not None else -1
    axis_t = const("split_axis", 1, np.int32)

    # The input, one tensor per step; the states, as [B, O] and [B, C].
    x = op.inputs[INPUT]
    xs = [b.tensor(f"step_{t}/input", (batch, s.n_input)) for t in range(s.steps)]
    b.op("UNPACK", [x], xs, num=s.steps, axis=0 if s.time_major else 1)
    h = _reshaped(b, op.inputs[OUTPUT_STATE], (batch, n_out), "initial_output_state")
    c = _reshaped(b, op.inputs[CELL_STATE], (batch, cells), "initial_cell_state")

    def act(v: int, name: str) -> int:
        return b.unary(s.activation, v, name)

    def clip(v: int, limit: float, name: str) -> int:
        lo = b.binary("MAXIMUM", v, const(f"clip_low_{limit}", -limit), f"{name}_low")
        return b.binary("MINIMUM", lo, const(f"clip_high_{limit}", limit), name)

    def norm(v: int, k: int, step: str) -> int:
        coeff, gate_bias = op.inputs[LAYER_NORMS[k]], op.inputs[BIASES[k]]
        mean = b.tensor(f"{step}/mean", (batch, 1))
        b.op("MEAN", [v, const("norm_axis", [1], np.int32)], [mean], keep_dims=True)
        sq = b.tensor(f"{step}/squares", (batch, cells))
        b.op("SQUARED_DIFFERENCE", [v, mean], [sq])
        var = b.tensor(f"{step}/variance", (batch, 1))
        b.op("MEAN", [sq, consts["norm_axis"]], [var], keep_dims=True)
        var = b.binary("ADD", var, const("norm_epsilon", LAYER_NORM_EPSILON), f"{step}/var_eps")
        inv = b.unary("RSQRT", var, f"{step}/inv_stddev")
        centred = b.binary("SUB", v, mean, f"{step}/centred")
        normed = b.tensor(f"{step}/normalized", (batch, cells))
        b.op("MUL", [centred, inv], [normed], fused_activation_function=0)
        scaled = b.binary("MUL", normed, coeff, f"{step}/scaled")
        return b.binary("ADD", scaled, gate_bias, f"{step}/biased")

    outs: list[int] = []
    for t in range(s.steps):
        p = f"step_{t}"
        cat = b.tensor(f"{p}/concat", (batch, s.n_input + n_out))
        b.op("CONCATENATION", [xs[t], h], [cat], axis=1, fused_activation_function=0)
        pre = b.fully_connected(cat, w_t, bias_t, f"{p}/gates", (batch, gates * cells))
        names = ("forget", "cell", "output") if s.cifg else ("input", "forget", "cell", "output")
        parts = [b.tensor(f"{p}/{n}_pre", (batch, cells)) for n in names]
        b.op("SPLIT", [axis_t, pre], parts, num_splits=gates)
        pre_of = dict(zip(names, parts, strict=True))

        def gate(n: str, cell: int | None, p: str = p, pre_of: dict[str, int] = pre_of) -> int:
            """A gate's sum before its activation: the peephole added (the previous cell
            state for the input and forget gates, the new one for the output gate), then
            the layer norm with its coefficients and the bias, as LiteRT's kernel does."""
            k = ("input", "forget", "cell", "output").index(n)
            v = pre_of[n]
            w_peep = opt(PEEPHOLES[(0, 1, -1, 2)[k]]) if k != 2 else None
            if w_peep is not None and cell is not None:
                m = b.binary("MUL", cell, w_peep, f"{p}/{n}_peephole")
                v = b.binary("ADD", v, m, f"{p}/{n}_peeped")
            return norm(v, k, f"{p}/{n}") if s.layer_norm else v

        f = b.unary("LOGISTIC", gate("forget", c), f"{p}/forget")
        if s.cifg:
            i = b.binary("SUB", const("ones", np.ones((1, cells))), f, f"{p}/input")
        else:
            i = b.unary("LOGISTIC", gate("input", c), f"{p}/input")
        g = act(gate("cell", None), f"{p}/cell_gate")
        kept = b.binary("MUL", f, c, f"{p}/kept")
        added = b.binary("MUL", i, g, f"{p}/added")
        c = b.binary("ADD", kept, added, f"{p}/cell_state")
        if s.cell_clip > 0:
            c = clip(c, s.cell_clip, f"{p}/cell_state_clipped")
        o = b.unary("LOGISTIC", gate("output", c), f"{p}/output")
        h = b.binary("MUL", o, act(c, f"{p}/cell_act"), f"{p}/hidden")
        if s.projection:
            proj_b = opt(PROJECTION_BIAS)
            h = b.fully_connected(
                h, op.inputs[PROJECTION_WEIGHTS], -1 if proj_b is None else proj_b,
                f"{p}/projected", (batch, n_out),
            )  # fmt: skip
            if s.proj_clip > 0:
                h = clip(h, s.proj_clip, f"{p}/projected_clipped")
        outs.append(h)
    b.op("PACK", outs, [op.outputs[0]], values_count=s.steps, axis=0 if s.time_major else 1)
    b.steps = s.steps
    h_var, c_var = (graph.tensors[op.inputs[i]] for i in (OUTPUT_STATE, CELL_STATE))
    return (
        _reshaped(b, h, h_var.shape, "final_output_state"),
        _reshaped(b, c, c_var.shape, "final_cell_state"),
    )


def _reshaped(b: OpBuilder, t: int, shape: tuple[int, ...], name: str) -> int:
    """``t`` as ``shape`` (itself when it has it already; else a RESHAPE)."""
    if b.graph.tensors[t].shape == tuple(shape):
        return t
    y = b.tensor(name, shape)
    b.op("RESHAPE", [t, b.const(f"{name}_shape", list(shape), np.int32)], [y])
    return y
