"""Stateful cells: the basic recurrent cell, RNN (one step) and UNIDIRECTIONAL_SEQUENCE_RNN
(a sequence), and SVDF (`Svdf`, `expand_svdf`). The basic cell computes
``h = act(x W^T + h R^T + b)`` with the hidden state in a variable tensor
(tflite/kernels/basic_rnn.cc, unidirectional_sequence_rnn.cc; ``RnnBatchStep``).

Each invocation starts from the hidden state the previous one left (zero at first); LiteRT's
kernels write the new state back into their variable input. Float ops (float32 weights) are
expanded at load, as a sequence LSTM is (:mod:`litekiln.ops.unroll_lstm`), into ops the GPU
path runs: per step two FULLY_CONNECTEDs (the input's with the bias, the state's), their ADD
and the activation (TANH, RELU, RELU6, RELU_N1_TO_1 as ops of their own), a sequence cut
by UNPACK along its time axis and its steps' states joined by PACK; the last state is the
variable's new value (``Subgraph.variable_updates``). The hybrid kernels (int8 weights) are
not implemented: such a model is refused, naming it.
"""

from __future__ import annotations

import logging

import numpy as np

from litekiln.model.ir import Op, Subgraph, Tensor
from litekiln.ops.base import FLOAT32, Check, OpContext, OpDef, register, required

log = logging.getLogger("litekiln")

_INPUT, _WEIGHTS, _RECURRENT, _BIAS, _STATE = range(5)
#: The activations the expansion writes as ops (ActivationFunctionType codes).
_ACTIVATION_OPS = {0: None, 1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6", 4: "TANH"}


def _activation(x: np.ndarray, code: int) -> np.ndarray:
    """``tensor_utils::ApplyActivationToVector``."""
    if code == 1:
        return np.maximum(x, 0)
    if code == 2:
        return np.clip(x, -1, 1)
    if code == 3:
        return np.clip(x, 0, 6)
    if code == 4:
        return np.tanh(x)
    return x


def _float_weights(c: Check, a: Tensor, b: Tensor, refused: str) -> None:
    """Both weight tensors float32: the float kernel is the one litekiln implements."""
    if a.type_name != "float32" or b.type_name != "float32":
        raise c.fail(
            "dtype",
            f"weights {a.type_name} and {b.type_name}: {refused} not implemented in litekiln, "
            "only float32 weights",
        )


class _Rnn(OpDef):
    rewritten_at_load = "expanded into per-step ops at load (float weights)"
    versions = (1, 3)
    num_inputs = (5, 5)
    #: Whether the input is a sequence (rank 3) rather than one step (rank 2).
    sequence = False

    @classmethod
    def validate(cls, c: Check) -> None:
        """basic_rnn.cc / unidirectional_sequence_rnn.cc: a float32 input ([batch, input]; a
        sequence [time, batch, input], or batch-major); float32 weights [units, input],
        recurrent weights [units, units] and bias [units]; a hidden state [batch, units];
        the output [batch, units] (a sequence: one per step, as the input is laid out)."""
        super().validate(c)
        x, w, r, b, h = (c.input(i) for i in range(5))
        c.dtype(x, FLOAT32, "input")
        _float_weights(c, w, r, "the hybrid kernel (int8 weights) is")
        c.rank(x, 3 if cls.sequence else 2, None, "input")
        c.rank(w, 2, None, "weights")
        c.rank(r, 2, None, "recurrent weights")
        c.rank(b, 1, None, "bias")
        c.rank(h, 2, None, "hidden state")
        major = bool(c.op.options.get("time_major")) if cls.sequence else True
        batch = x.shape[1 if major and cls.sequence else 0]
        units, depth = w.shape
        if (
            x.shape[-1] != depth
            or b.shape != (units,)
            or r.shape != (units, units)
            or h.shape != (batch, units)
        ):
            raise c.fail(
                "shape",
                f"input {list(x.shape)}, weights {list(w.shape)}, recurrent weights "
                f"{list(r.shape)}, bias {list(b.shape)} and hidden state {list(h.shape)} do "
                "not fit one cell",
            )
        act = int(c.op.options.get("fused_activation_function", 0) or 0)
        if act not in _ACTIVATION_OPS:
            raise c.fail("activation", f"fused activation {act}: not one litekiln applies here")
        c.output_dtype(np.dtype(np.float32))
        c.output_shape((*x.shape[:-1], units) if cls.sequence else (batch, units))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x, w, r, b, h = (np.asarray(required(ctx, inputs, i), np.float32) for i in range(5))
        act = int(ctx.options.get("fused_activation_function", 0) or 0)
        major = bool(ctx.options.get("time_major")) if cls.sequence else True
        steps = (np.moveaxis(x, 0 if major else 1, 0)) if cls.sequence else x[None]
        outs = []
        for xt in steps:
            h = _activation((xt @ w.T + b) + h @ r.T, act).astype(np.float32)
            outs.append(h)
        if not cls.sequence:
            return [h, h][: len(ctx.op.outputs)]
        y = np.stack(outs, axis=0 if major else 1)
        return [y, h][: len(ctx.op.outputs)]


@register
class Rnn(_Rnn):
    name = "RNN"


@register
class UnidirectionalSequenceRnn(_Rnn):
    name = "UNIDIRECTIONAL_SEQUENCE_RNN"
    sequence = True


def expand_rnn(op: Op, graph: Subgraph) -> bool:
    """Replace the RNN or UNIDIRECTIONAL_SEQUENCE_RNN ``op`` by its per-step ops (module
    docstring); whether it did. Either way its hidden state's new value is recorded: where
    it stays whole (an activation that has no op here, weights computed at run time), its
    last state becomes an output of its own."""
    from litekiln.ops.control import UNROLL_MAX_OPS
    from litekiln.ops.unroll_lstm import OpBuilder

    sequence = op.name == "UNIDIRECTIONAL_SEQUENCE_RNN"
    x_t, w_t, r_t, b_t, h_var = op.inputs[:5]
    x = graph.tensors[x_t]
    act = int(op.options.get("fused_activation_function", 0) or 0)
    major = bool(op.options.get("time_major")) if sequence else True
    steps = x.shape[0 if major else 1] if sequence else 1
    constant = all(graph.tensors[t].data is not None for t in (w_t, r_t, b_t))
    out = graph.tensors[op.outputs[0]]
    if not constant or 5 * steps > UNROLL_MAX_OPS:
        why = "its weights are computed at run time" if not constant else "too many steps"
        log.warning("%s stays whole on the CPU: %s", op.describe(), why)
        if sequence and len(op.outputs) == 1:
            b = OpBuilder(graph, out.name)
            op.outputs = [*op.outputs, b.tensor("final_state", graph.tensors[h_var].shape)]
        graph.variable_updates[h_var] = op.outputs[-1]
        return False
    b = OpBuilder(graph, out.name)
    batch, units = graph.tensors[h_var].shape
    zeros = b.const("no_bias", np.zeros(units, np.float32))
    if sequence:
        frames = [b.tensor(f"step_{t}/x", (batch, x.shape[-1])) for t in range(steps)]
        b.op("UNPACK", [x_t], frames, num=steps, axis=0 if major else 1)
    else:
        frames = [x_t]
    h = h_var
    states = []
    for t, xt in enumerate(frames):
        last = t == len(frames) - 1 and not sequence
        xw = b.fully_connected(xt, w_t, b_t, f"step_{t}/input_product", (batch, units))
        hr = b.fully_connected(h, r_t, zeros, f"step_{t}/state_product", (batch, units))
        name = _ACTIVATION_OPS[act]
        sum_t = (
            op.outputs[0] if last and name is None else b.tensor(f"step_{t}/sum", (batch, units))
        )
        pre = sum_t
        b.op("ADD", [xw, hr], [pre], fused_activation_function=0)
        if name is not None:
            h = op.outputs[0] if last else b.tensor(f"step_{t}/state", (batch, units))
            b.op(name, [pre], [h])
        else:
            h = pre
        states.append(h)
        b.steps += 1
    if sequence:
        b.op("PACK", states, [op.outputs[0]], values_count=steps, axis=0 if major else 1)
    graph.variable_updates[h_var] = h
    b.replace(op)
    log.info("%s expanded: %d steps, %d ops", op.describe(), b.steps, len(b.ops))
    return True


@register
class Svdf(OpDef):
    """A singular-value-decomposition filter (svdf.cc; Google's keyword spotters): each of
    ``num_units * rank`` filters projects the input (``weights_feature``) into the newest
    column of its memory, the state, whose columns shift left by one per invocation; each
    filter's memory is weighted over time (``weights_time``), the ranks of a unit summed, the
    bias added, the activation applied (``EvalFloatSVDF``). Float weights only."""

    name = "SVDF"
    rewritten_at_load = "expanded at load into products over its state (float weights)"
    versions = (1, 4)
    num_inputs = (5, 5)

    @classmethod
    def validate(cls, c: Check) -> None:
        """svdf.cc: a float32 input [batch, input]; float32 weights_feature [filters, input]
        and weights_time [filters, memory]; rank > 0 dividing the filters; a bias [units]
        (optional); the state [batch, filters * memory]; the output [batch, units]."""
        super().validate(c)
        x, wf, wt, h = c.input(0), c.input(1), c.input(2), c.input(4)
        bias = c.optional(3)
        c.dtype(x, FLOAT32, "input")
        _float_weights(c, wf, wt, "the hybrid and integer kernels are")
        c.rank(x, 2, None, "input")
        c.rank(wf, 2, None, "weights_feature")
        c.rank(wt, 2, None, "weights_time")
        c.rank(h, 2, None, "state")
        rank = int(c.op.options.get("rank", 0))
        filters, memory = wf.shape[0], wt.shape[1]
        if rank <= 0 or filters % rank:
            raise c.fail("option-value", f"rank {rank} for {filters} filters")
        units, batch = filters // rank, x.shape[0]
        if (
            wf.shape[1] != x.shape[1]
            or wt.shape[0] != filters
            or (bias is not None and bias.shape != (units,))
            or h.shape != (batch, filters * memory)
        ):
            raise c.fail("shape", "input, weights, bias and state do not fit one SVDF")
        act = int(c.op.options.get("fused_activation_function", 0) or 0)
        if act not in _ACTIVATION_OPS:
            raise c.fail("activation", f"fused activation {act}: not one litekiln applies here")
        c.output_dtype(np.dtype(np.float32))
        c.output_shape((batch, units))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        x, wf, wt = (np.asarray(required(ctx, inputs, i), np.float32) for i in range(3))
        bias = inputs[3]
        state = np.asarray(required(ctx, inputs, 4), np.float32)
        rank = int(ctx.options.get("rank", 1))
        filters, memory = wf.shape[0], wt.shape[1]
        new = _svdf_state(state.reshape(x.shape[0], filters, memory), x @ wf.T)
        y = (new * wt).sum(axis=2).reshape(x.shape[0], filters // rank, rank).sum(axis=2)
        if bias is not None:
            y = y + bias
        act = int(ctx.options.get("fused_activation_function", 0) or 0)
        y = _activation(y.astype(np.float32), act).astype(np.float32)
        flat = new.reshape(state.shape).astype(np.float32)
        return [y, flat][: len(ctx.op.outputs)]


def _svdf_state(state: np.ndarray, newest: np.ndarray) -> np.ndarray:
    """The memory [batch, filters, memory] shifted left one column, ``newest`` last."""
    return np.concatenate([state[:, :, 1:], newest[:, :, None]], axis=2)


def expand_svdf(op: Op, graph: Subgraph) -> bool:
    """Replace the float SVDF ``op`` by ops the GPU path runs (FULLY_CONNECTED, SLICE and
    CONCATENATION for the shifted memory, MUL and SUM for the time weights and the ranks,
    ADD, the activation); the new memory becomes the state variable's value after each
    invocation. Where the weights are computed at run time it stays whole (on the CPU),
    with the new memory as an output of its own. Whether it was replaced."""
    from litekiln.ops.unroll_lstm import OpBuilder

    x_t, wf_t, wt_t, bias_t, s_var = op.inputs[:5]
    wf, wt = graph.tensors[wf_t], graph.tensors[wt_t]
    out = graph.tensors[op.outputs[0]]
    b = OpBuilder(graph, out.name)
    if wf.data is None or wt.data is None or (bias_t >= 0 and graph.tensors[bias_t].data is None):
        log.warning("%s stays whole on the CPU: its weights are computed at run time",
                    op.describe())  # fmt: skip
        if len(op.outputs) == 1:
            op.outputs = [*op.outputs, b.tensor("new_state", graph.tensors[s_var].shape)]
        graph.variable_updates[s_var] = op.outputs[1]
        return False
    rank = int(op.options.get("rank", 1))
    batch = graph.tensors[x_t].shape[0]
    filters, memory = wf.shape[0], wt.shape[1]
    units = filters // rank
    zeros = b.const("no_bias", np.zeros(filters, np.float32))
    newest = b.fully_connected(x_t, wf_t, zeros, "newest", (batch, filters))
    col = b.tensor("newest_column", (batch, filters, 1))
    b.op("RESHAPE", [newest, b.const("column_shape", [batch, filters, 1], np.int32)], [col])
    mem3 = b.tensor("memory_3d", (batch, filters, memory))
    if memory > 1:
        old = b.tensor("memory", (batch, filters, memory))
        b.op("RESHAPE", [s_var, b.const("memory_shape", [batch, filters, memory], np.int32)],
             [old])  # fmt: skip
        kept = b.tensor("memory_kept", (batch, filters, memory - 1))
        begin = b.const("kept_begin", [0, 0, 1], np.int32)
        size = b.const("kept_size", [batch, filters, memory - 1], np.int32)
        b.op("SLICE", [old, begin, size], [kept])
        b.op("CONCATENATION", [kept, col], [mem3], axis=2, fused_activation_function=0)
    else:
        mem3 = col
    state = b.tensor("new_state", (batch, filters * memory))
    b.op("RESHAPE", [mem3, b.const("state_shape", [batch, filters * memory], np.int32)], [state])
    weighted = b.tensor("time_weighted", (batch, filters, memory))
    b.op("MUL", [mem3, wt_t], [weighted], fused_activation_function=0)
    per_filter = b.tensor("per_filter", (batch, filters))
    b.op("SUM", [weighted, b.const("time_axis", [2], np.int32)], [per_filter], keep_dims=False)
    y = per_filter
    if rank > 1:
        ranks = b.tensor("ranks", (batch, units, rank))
        b.op("RESHAPE", [per_filter, b.const("ranks_shape", [batch, units, rank], np.int32)],
             [ranks])  # fmt: skip
        y = b.tensor("per_unit", (batch, units))
        b.op("SUM", [ranks, b.const("rank_axis", [2], np.int32)], [y], keep_dims=False)
    act = _ACTIVATION_OPS[int(op.options.get("fused_activation_function", 0) or 0)]
    if bias_t >= 0:
        biased = op.outputs[0] if act is None else b.tensor("biased", (batch, units))
        b.op("ADD", [y, bias_t], [biased], fused_activation_function=0)
        y = biased
    if act is not None:
        b.op(act, [y], [op.outputs[0]])
    elif y != op.outputs[0]:
        b.op("RESHAPE", [y, b.const("out_shape", [batch, units], np.int32)], [op.outputs[0]])
    graph.variable_updates[s_var] = state
    b.replace(op)
    log.info("%s expanded: %d ops", op.describe(), len(b.ops))
    return True
