"""LSTM: the basic kernel (``kernel_type`` BASIC), the one the GPU op table lists (v2).

Basic kernel (reference_ops ``LstmCell``), 5 inputs and 4 outputs:

* inputs: input ``[B, I]``, previous activation ``[B, O]``, weights ``[4*O, I+O]``,
  biases ``[4*O]``, previous cell state ``[B, O]``;
* ``concat = [input, prev_activ]``, ``activ = concat @ W.T + b`` split in four gates
  (input, new input, forget, output) along the last axis;
* ``state = sigmoid(i) * tanh(g) + sigmoid(f) * prev_state``,
  ``output = sigmoid(o) * tanh(state)``;
* outputs: output activation, new state, concat temp, activ temp;
* after it runs, the kernel copies the new activation and state into its previous-activation
  and previous-state inputs (``state_carries``): the next invocation starts from them.

The full kernel (20-24 inputs, peepholes, projection, layer norm) is not implemented yet.
"""

from __future__ import annotations

import numpy as np

from litekiln.model.ir import Op, Subgraph
from litekiln.ops.base import FLOAT32, Check, OpContext, OpDef, register, required

#: LSTMKernelType of schema.fbs.
KERNEL_FULL, KERNEL_BASIC = 0, 1


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(np.float32)


@register
class Lstm(OpDef):
    name = "LSTM"
    gpu = True
    gpu_max_version = 2  # documented GPU table: LSTM v2, basic kernel only (docs/architecture.md)
    # The GPU lowering is compiler/emit_lstm.py (float32 and fp16; the basic kernel only).
    gpu_quant_max_version = 2
    versions = (1, 4)
    num_outputs = None

    @classmethod
    def validate(cls, c: Check) -> None:
        """lstm.cc's basic::Prepare: 5 inputs, 4 outputs, input [B, I], previous activation
        and state [B, O], weights [4*O, I+O], biases [4*O]; float32 (litekiln does not run
        the 8-bit basic kernel). The full kernel is not implemented: it is refused when run."""
        super().validate(c)
        if int(c.op.options.get("kernel_type", KERNEL_FULL)) != KERNEL_BASIC:
            return
        c.count("inputs", len(c.op.inputs), 5, 5)
        c.count("outputs", len(c.op.outputs), 4, 4)
        x, act, w, b, state = (c.input(i) for i in range(5))
        for t, role in (
            (x, "input"),
            (act, "activation"),
            (w, "weights"),
            (b, "biases"),
            (state, "state"),
        ):
            c.dtype(t, FLOAT32, role)
        c.rank(x, 2, None, "input")
        c.rank(act, 2, None, "previous activation")
        c.rank(w, 2, None, "weights")
        c.rank(b, 1, None, "biases")
        c.rank(state, 2, None, "previous state")
        n, depth = x.shape
        units = act.shape[1]
        if (
            act.shape[0] != n
            or w.shape != (4 * units, depth + units)
            or b.shape != (4 * units,)
            or state.shape != (n, units)
        ):
            raise c.fail(
                "lstm-shapes",
                f"input {list(x.shape)}, activation {list(act.shape)}, weights "
                f"{list(w.shape)}, biases {list(b.shape)}, state {list(state.shape)} disagree",
            )
        for i, shape in enumerate(((n, units), (n, units), (n, depth + units), (n, 4 * units))):
            c.output_shape(shape, i)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        if int(ctx.options.get("kernel_type", KERNEL_FULL)) != KERNEL_BASIC:
            raise ctx.fail("only the basic LSTM kernel is implemented (kernel_type BASIC)")
        x, prev_act, w, b, prev_state = (
            np.asarray(required(ctx, inputs, i), np.float32) for i in range(5)
        )
        if w.ndim != 2 or w.shape[0] % 4:
            raise ctx.fail(f"weights of shape {w.shape}, expected [4*units, in+units]")
        units = w.shape[0] // 4
        x2 = x.reshape(-1, x.shape[-1])
        concat = np.concatenate([x2, prev_act.reshape(x2.shape[0], -1)], axis=1)
        if concat.shape[1] != w.shape[1]:
            raise ctx.fail(f"input+state depth {concat.shape[1]} != weights depth {w.shape[1]}")
        activ = (concat @ w.T + b.reshape(-1)).astype(np.float32)
        i_gate = _sigmoid(activ[:, :units])
        g = np.tanh(activ[:, units : 2 * units])
        f_gate = _sigmoid(activ[:, 2 * units : 3 * units])
        o_gate = _sigmoid(activ[:, 3 * units :])
        state = (i_gate * g + f_gate * prev_state.reshape(-1, units)).astype(np.float32)
        out = (o_gate * np.tanh(state)).astype(np.float32)
        return [out, state, concat.astype(np.float32), activ]

    @classmethod
    def state_carries(cls, op: Op) -> tuple[tuple[int, int], ...]:
        """lstm.cc ``basic::Eval`` ends by copying the new activation and state (outputs 0
        and 1) into the previous activation and state (inputs 1 and 4): a basic cell carries
        its state from one invocation to the next unless the app sets those inputs again."""
        if int(op.options.get("kernel_type", KERNEL_FULL)) != KERNEL_BASIC:
            return ()
        return ((0, 1), (1, 4))

    @classmethod
    def gpu_support(cls, op: Op, graph: Subgraph, *, allow_quantized: bool = True) -> str | None:
        if int(op.options.get("kernel_type", KERNEL_FULL)) != KERNEL_BASIC:
            return "only the basic LSTM kernel runs on the GPU"
        reason = super().gpu_support(op, graph, allow_quantized=allow_quantized)
        if reason:
            return reason
        if len(op.inputs) != 5 or len(op.outputs) != 4:
            return f"basic LSTM with {len(op.inputs)} inputs / {len(op.outputs)} outputs"
        for i in (2, 3):
            if not graph.tensors[op.inputs[i]].is_constant:
                return "runtime (non-constant) weights or biases"
        for t in [*op.inputs, *op.outputs]:
            if t >= 0 and graph.tensors[t].dtype.kind != "f":
                return "the 8-bit basic LSTM kernel (uint8 activations, int16 state)"
        return None
