"""UNIDIRECTIONAL_SEQUENCE_LSTM: a whole LSTM layer over a sequence, its state in variables.

What Keras 2 (tf_keras) LSTM layers and many older production models convert to. LiteRT's
kernel (``unidirectional_sequence_lstm.cc``, float steps in ``lstm_eval.cc``
``LstmStepFloat``), float32:

* 20 or 24 inputs: the input ``[B, T, I]`` (``[T, B, I]`` when ``time_major``); input
  weights ``[C, I]`` and recurrent weights ``[C, O]`` of the input (optional: CIFG), forget,
  cell and output gates (1-4, 5-8; a recurrent weight of rank 1 is diagonal, ``[C]``,
  multiplied elementwise); the peephole weights ``[C]`` to the input, forget and output
  gates (9-11, optional, all or none); the gate biases ``[C]`` (12-15; the input gate's
  only without CIFG); the projection weights ``[O, C]`` and bias ``[O]`` (16-17,
  optional); the output state ``[B, O]`` and cell state ``[B, C]`` (18-19, *variable*
  tensors: the state the sequence starts from); the layer-norm coefficients ``[C]`` of the
  four gates (20-23, optional; present when the forget gate's is);
* per time step, with ``h`` the output state and ``c`` the cell state::

      i = sigmoid(W_i x + R_i h + p_i * c + b_i)      (CIFG: i = 1 - f)
      f = sigmoid(W_f x + R_f h + p_f * c + b_f)
      g = act(W_c x + R_c h + b_c)
      c = clip(f * c + i * g, cell_clip)
      o = sigmoid(W_o x + R_o h + p_o * c + b_o)      (the new c)
      h = o * act(c);  with projection: h = clip(P h + b_p, proj_clip)

  with layer norm, each gate's sum (before its bias) is normalised over the ``C`` cells
  (``(v - mean) / sqrt(variance + 1e-8)``), scaled by its coefficients, then biased;
  ``act`` is the fused activation (TANH in every converted model; RELU, RELU6,
  RELU_N1_TO_1 too); a clip of 0 is none;
* one output, ``h`` at every step, ``[B, T, O]`` (``[T, B, O]``);
* after the sequence the kernel leaves the last ``h`` and ``c`` in its two variable
  inputs: the next invocation starts from them, until ``reset_all_variables``.

The loader expands each float op into per-step FULLY_CONNECTED, LOGISTIC, TANH, MUL...
ops (:mod:`litekiln.ops.unroll_lstm`), which run on the GPU, and records the final states
as the variables' new values (``Subgraph.variable_updates``); an op it does not expand
keeps two outputs more (the final states, tensors added at load) and runs here, on the
numpy reference, with the reason it was not expanded.

Refused at load, named: the hybrid kernel (int8 weights, float input) and the integer one
(int8 input), and the fused activations NONE (LiteRT leaves the cell gate unwritten:
no defined result) and SIGN_BIT.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from litekiln.model.ir import Op, Subgraph, Tensor
from litekiln.ops import control
from litekiln.ops.base import Check, OpContext, OpDef, register

# Input positions (lstm_shared.h, ``lstm::full``).
INPUT = 0
INPUT_WEIGHTS = (1, 2, 3, 4)  # input, forget, cell, output gates
RECURRENT_WEIGHTS = (5, 6, 7, 8)
PEEPHOLES = (9, 10, 11)  # input, forget, output gates
BIASES = (12, 13, 14, 15)
PROJECTION_WEIGHTS, PROJECTION_BIAS = 16, 17
OUTPUT_STATE, CELL_STATE = 18, 19
LAYER_NORMS = (20, 21, 22, 23)

#: Fused activations the kernel's cell gate and output apply (schema codes).
ACTIVATIONS = {1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6", 4: "TANH"}
#: MeanStddevNormalization's epsilon (portable_tensor_utils.cc).
LAYER_NORM_EPSILON = np.float32(1e-8)


@dataclass(frozen=True)
class LstmShape:
    """The sizes and features of one op, read from its tensors (as its Prepare reads them).

    Attributes:
        batch, steps, n_input, n_cell, n_output: B, T, I, C, O.
        time_major: the input and output are ``[T, B, *]``.
        cifg: no input gate (``i = 1 - f``).
        peephole, projection, layer_norm: those features are present.
        diagonal: which recurrent weights (input, forget, cell, output) are diagonal.
        activation: the fused activation's name.
        cell_clip, proj_clip: the clips (0: none).
    """

    batch: int
    steps: int
    n_input: int
    n_cell: int
    n_output: int
    time_major: bool
    cifg: bool
    peephole: bool
    projection: bool
    layer_norm: bool
    diagonal: tuple[bool, bool, bool, bool]
    activation: str
    cell_clip: float
    proj_clip: float

    @classmethod
    def of(cls, op: Op, graph: Subgraph) -> LstmShape:
        """Read from ``op`` (already validated, or being: may raise IndexError)."""

        def present(i: int) -> Tensor | None:
            return graph.tensors[op.inputs[i]] if i < len(op.inputs) and op.inputs[i] >= 0 else None

        x = graph.tensors[op.inputs[INPUT]]
        time_major = bool(op.options.get("time_major", False))
        rec_out = graph.tensors[op.inputs[RECURRENT_WEIGHTS[3]]]
        n_cell = graph.tensors[op.inputs[INPUT_WEIGHTS[3]]].shape[0]
        n_output = rec_out.shape[0] if len(rec_out.shape) == 1 else rec_out.shape[1]
        ranks = [len(t.shape) if (t := present(i)) is not None else 0 for i in RECURRENT_WEIGHTS]
        return cls(
            batch=x.shape[1] if time_major else x.shape[0],
            steps=x.shape[0] if time_major else x.shape[1],
            n_input=x.shape[2] if len(x.shape) > 2 else 0,
            n_cell=n_cell,
            n_output=n_output,
            time_major=time_major,
            cifg=present(INPUT_WEIGHTS[0]) is None,
            peephole=present(PEEPHOLES[1]) is not None,
            projection=present(PROJECTION_WEIGHTS) is not None,
            layer_norm=len(op.inputs) == 24 and present(LAYER_NORMS[1]) is not None,
            diagonal=(ranks[0] == 1, ranks[1] == 1, ranks[2] == 1, ranks[3] == 1),
            activation=ACTIVATIONS.get(int(op.options.get("fused_activation_function", 0)), ""),
            cell_clip=float(op.options.get("cell_clip", 0.0)),
            proj_clip=float(op.options.get("proj_clip", 0.0)),
        )


def file_outputs(op: Op, graph: Subgraph) -> list[int]:
    """The op's outputs the file declares (not the final states the loader adds)."""
    n = graph.file_tensors or len(graph.tensors)
    return [t for t in op.outputs if t < n]


@register
class UnidirectionalSequenceLstm(OpDef):
    name = "UNIDIRECTIONAL_SEQUENCE_LSTM"
    versions = (1, 4)
    num_inputs = (20, 24)
    num_outputs = (1, 3)  # (one in the file; two final states added at load: file_outputs)
    foldable = False  # (it reads and writes variable tensors)
    rewritten_at_load = "expanded into per-step ops at load (float32)"

    @classmethod
    def validate(cls, c: Check) -> None:
        """unidirectional_sequence_lstm.cc's Prepare and CheckInputTensorDimensions:
        20 or 24 inputs, one output; input of rank 3; every weight, peephole, bias,
        projection and layer-norm shape against ``I``, ``C``, ``O``; the input gate's
        weights, the peepholes and the projection all or none as the kernel requires; the
        states variable tensors of ``B*O`` and ``B*C`` elements; clips >= 0. litekiln runs
        the float kernel only (hybrid and integer refused, named), with activations RELU,
        RELU_N1_TO_1, RELU6 or TANH. The output's shape is set to ``[..., O]``."""
        super().validate(c)
        op = c.op
        n_out = len(file_outputs(op, c.graph))
        if n_out != 1:
            c.count("outputs", n_out, 1, 1)
        if len(op.inputs) not in (20, 24):
            raise c.fail("input-count", f"{len(op.inputs)} inputs, the kernel takes 20 or 24")
        x = c.input(INPUT)
        if x.type_name == "int8":
            raise c.fail(
                "seq-lstm-integer",
                "the integer (int8 input) sequence LSTM kernel is not implemented in litekiln",
            )
        c.dtype(x, frozenset({"float32"}), "input")
        c.rank(x, 3, None, "input")
        w_out = c.input(INPUT_WEIGHTS[3])
        if w_out.type_name != "float32":
            raise c.fail(
                "seq-lstm-hybrid",
                f"the hybrid kernel ({w_out.type_name} weights, float input) is not "
                "implemented in litekiln",
            )
        opts = op.options
        activation = int(opts.get("fused_activation_function", 0))
        if activation not in ACTIVATIONS:
            raise c.fail(
                "seq-lstm-activation",
                f"fused activation {activation}: litekiln runs RELU, RELU_N1_TO_1, RELU6 "
                "and TANH (with NONE LiteRT leaves the cell gate unwritten)",
            )
        for key in ("cell_clip", "proj_clip"):
            if not float(opts.get(key, 0.0)) >= 0:
                raise c.fail("lstm-clip", f"{key} {opts.get(key)} is negative")
        s = LstmShape.of(op, c.graph)
        n_in, n_cell, n_output = s.n_input, s.n_cell, s.n_output

        def expect(i: int, shape: tuple[int, ...], role: str, required: bool = False) -> None:
            t = c.input(i) if required else c.optional(i)
            if t is None:
                return
            c.dtype(t, frozenset({"float32"}), role)
            if t.shape != shape:
                raise c.fail(
                    "lstm-shapes",
                    f"{role} {t.name!r} has shape {list(t.shape)}, expected {list(shape)} "
                    f"(input {n_in}, cells {n_cell}, outputs {n_output})",
                )

        gates = ("input", "forget", "cell", "output")
        for k, gate in enumerate(gates):
            expect(INPUT_WEIGHTS[k], (n_cell, n_in), f"input-to-{gate} weights", k > 0)
            rec = c.optional(RECURRENT_WEIGHTS[k]) if k == 0 else c.input(RECURRENT_WEIGHTS[k])
            if rec is not None:
                want = (n_cell,) if len(rec.shape) == 1 else (n_cell, n_output)
                expect(RECURRENT_WEIGHTS[k], want, f"recurrent-to-{gate} weights")
        if (c.optional(INPUT_WEIGHTS[0]) is None) != (c.optional(RECURRENT_WEIGHTS[0]) is None):
            raise c.fail(
                "lstm-cifg", "the input gate's input and recurrent weights are all or none"
            )
        peepholes = [c.optional(i) for i in PEEPHOLES]
        for k, gate in zip(PEEPHOLES, ("input", "forget", "output"), strict=True):
            expect(k, (n_cell,), f"cell-to-{gate} weights")
        all_ = (peepholes[0] is not None or s.cifg) and None not in peepholes[1:]
        if not all_ and any(p is not None for p in peepholes):
            raise c.fail("lstm-peephole", "the peephole weights are all or none")
        if s.cifg and c.optional(BIASES[0]) is not None:
            raise c.fail("lstm-cifg", "a CIFG LSTM (no input gate) has no input gate bias")
        for k, gate in enumerate(gates):
            expect(BIASES[k], (n_cell,), f"{gate} gate bias", required=k > 0 or not s.cifg)
        expect(PROJECTION_WEIGHTS, (n_output, n_cell), "projection weights")
        expect(PROJECTION_BIAS, (n_output,), "projection bias")
        if not s.projection and c.optional(PROJECTION_BIAS) is not None:
            raise c.fail("lstm-projection", "a projection bias without projection weights")
        if s.layer_norm:
            if s.cifg != (c.optional(LAYER_NORMS[0]) is None):
                raise c.fail(
                    "lstm-layer-norm",
                    "the input gate's layer-norm coefficients are there exactly when the "
                    "input gate is",
                )
            for k, gate in enumerate(gates):
                expect(LAYER_NORMS[k], (n_cell,), f"{gate} layer-norm coefficients", k > 0)
        for i, n, role in (
            (OUTPUT_STATE, s.batch * n_output, "output state"),
            (CELL_STATE, s.batch * n_cell, "cell state"),
        ):
            t = c.input(i)
            if not t.is_variable:
                raise c.fail("lstm-state", f"{role} {t.name!r} is not a variable tensor")
            c.dtype(t, frozenset({"float32"}), role)
            if t.size != n:
                raise c.fail(
                    "lstm-state",
                    f"{role} {t.name!r} has {t.size} elements ({list(t.shape)}), expected {n}",
                )
        c.output_shape((*x.shape[:-1], n_output))

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        s = LstmShape.of(ctx.op, ctx.graph)
        out, h, c = run_sequence(s, inputs)
        results = [out]
        if len(ctx.op.outputs) == 3:  # the final states (tensors the loader added)
            results += [
                h.reshape(ctx.output_tensor(1).shape),
                c.reshape(ctx.output_tensor(2).shape),
            ]
        return results

    @classmethod
    def cpu_reason(cls, op: Op, graph: Subgraph) -> str:
        why = expansion_blocker(op, graph) or "the loader did not expand it"
        return f"not expanded into per-step ops at load: {why}"


def ops_per_step(s: LstmShape) -> int:
    """How many ops one step adds (an upper bound: for the unrolling cap)."""
    gates = 3 if s.cifg else 4
    n = 3 + gates + 6  # concat, fc, split; activations; cell update and output
    n += 6 * gates if s.layer_norm else 0
    n += 6 if s.peephole else 0
    n += 3 if s.projection else 0
    n += 4 if s.cell_clip > 0 or s.proj_clip > 0 else 0
    return n


def expansion_blocker(op: Op, graph: Subgraph) -> str | None:
    """Why ``op`` (a validated UNIDIRECTIONAL_SEQUENCE_LSTM) is not expanded; None if it is."""
    s = LstmShape.of(op, graph)
    if any(s.diagonal):
        return "diagonal recurrent weights (rank 1) are not expanded"
    skip = {INPUT, OUTPUT_STATE, CELL_STATE}
    for k, t in enumerate(op.inputs):
        if t >= 0 and k not in skip and not graph.tensors[t].is_constant:
            return f"input {k} ({graph.tensors[t].name!r}) is computed at run time, not a constant"
    n = s.steps * ops_per_step(s) + 2
    if n > control.UNROLL_MAX_OPS:
        return (
            f"{s.steps} steps would add ~{n} ops, more than the "
            f"{control.UNROLL_MAX_OPS} ops litekiln unrolls (control.UNROLL_MAX_OPS)"
        )
    return None


def _act(v: np.ndarray, name: str) -> np.ndarray:
    if name == "TANH":
        return np.tanh(v)
    if name == "RELU":
        return np.maximum(v, 0)
    if name == "RELU6":
        return np.clip(v, 0, 6)
    return np.clip(v, -1, 1)  # RELU_N1_TO_1


def _sigmoid(v: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-v.astype(np.float64)))).astype(np.float32)


def _normalize(v: np.ndarray) -> np.ndarray:
    mean = v.mean(axis=-1, keepdims=True, dtype=np.float32)
    var = np.square(v - mean).mean(axis=-1, keepdims=True, dtype=np.float32)
    return ((v - mean) / np.sqrt(var + LAYER_NORM_EPSILON)).astype(np.float32)


def run_sequence(
    s: LstmShape, inputs: list[np.ndarray | None]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LiteRT's float kernel over the whole sequence: (output, final h, final c)."""

    def get(i: int) -> np.ndarray | None:
        v = inputs[i] if i < len(inputs) else None
        return None if v is None else np.asarray(v, np.float32)

    x = get(INPUT)
    assert x is not None
    seq = x if s.time_major else x.transpose(1, 0, 2)  # [T, B, I]
    h = get(OUTPUT_STATE).reshape(s.batch, s.n_output)  # type: ignore[union-attr]
    c = get(CELL_STATE).reshape(s.batch, s.n_cell)  # type: ignore[union-attr]
    w_in = [get(i) for i in INPUT_WEIGHTS]
    w_rec = [get(i) for i in RECURRENT_WEIGHTS]
    peep = dict(zip((0, 1, 3), (get(i) for i in PEEPHOLES), strict=True))
    bias = [get(i) for i in BIASES]
    norm = [get(i) if s.layer_norm else None for i in LAYER_NORMS]
    proj_w, proj_b = get(PROJECTION_WEIGHTS), get(PROJECTION_BIAS)

    def gate(k: int, xt: np.ndarray, h: np.ndarray, cell: np.ndarray | None) -> np.ndarray:
        w, r = w_in[k], w_rec[k]
        assert w is not None and r is not None
        acc = xt @ w.T
        acc = acc + (h * r if r.ndim == 1 else h @ r.T)
        p = peep.get(k)
        if p is not None and cell is not None:
            acc = acc + p * cell
        b = bias[k]
        assert b is not None
        if norm[k] is not None:
            return (_normalize(acc.astype(np.float32)) * norm[k] + b).astype(np.float32)
        return (acc + b).astype(np.float32)

    outs = []
    for t in range(s.steps):
        xt = seq[t]
        f = _sigmoid(gate(1, xt, h, c))
        i = (1.0 - f).astype(np.float32) if s.cifg else _sigmoid(gate(0, xt, h, c))
        g = _act(gate(2, xt, h, None), s.activation)
        c = (f * c + i * g).astype(np.float32)
        if s.cell_clip > 0:
            c = np.clip(c, -s.cell_clip, s.cell_clip)
        o = _sigmoid(gate(3, xt, h, c))
        h = (o * _act(c, s.activation)).astype(np.float32)
        if proj_w is not None:
            h = (h @ proj_w.T + (proj_b if proj_b is not None else 0)).astype(np.float32)
            if s.proj_clip > 0:
                h = np.clip(h, -s.proj_clip, s.proj_clip)
        outs.append(h)
    out = np.stack(outs, axis=0 if s.time_major else 1).astype(np.float32)
    return out, h, c
