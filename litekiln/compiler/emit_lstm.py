"""Emitters of the recurrent ops: LSTM, the basic kernel (the op's semantics live in
:mod:`litekiln.ops.lstm`)."""

from __future__ import annotations

import numpy as np
from tvm import relax

from litekiln.compiler.lowering import ACC_DTYPE, Ctx, Expr, emitter
from litekiln.ops.lstm import KERNEL_BASIC, KERNEL_FULL


@emitter("LSTM")
def _lstm(ctx: Ctx) -> list[Expr]:
    """The basic cell (lstm.cc ``basic::Eval``, reference_ops ``LstmCell``): the concatenation
    ``[input, prev_activ]``, one matrix product with the bias (all four gates at once), then
    the gate arithmetic. Fused, that is four kernels per cell: concat, matmul + bias, the new
    state, and the activation (FuseOps does not merge the state's kernel into the activation's,
    the state being an output as well). The weights enter in float32 whatever the precision
    (the fp16 guard does not round them: ``precision.WEIGHTED_OPS`` lists convolutions and FC
    only); under fp16 the outputs are stored in half like any op's, the gates computed in
    float32. LiteRT also copies the new activation and state back into the input tensors
    (state across invocations); litekiln, here as in the reference, does not."""
    if int(ctx.options.get("kernel_type", KERNEL_FULL)) != KERNEL_BASIC:
        raise ctx.fail("only the basic LSTM kernel (kernel_type BASIC) has a GPU lowering")
    w = ctx.const(2)  # [4 * units, depth + units]
    b = ctx.const(3).reshape(-1)  # [4 * units]
    units = w.shape[0] // 4
    # Ranks and shapes as Lstm.validate (basic::Prepare) checked them: x [B, depth], h and
    # c [B, units].
    x, h, c = ctx.arg(0), ctx.arg(1), ctx.arg(4)
    concat = ctx.emit(relax.op.concat([x, h], axis=1))
    wt = ctx.fconst(np.ascontiguousarray(w.T))  # [depth + units, 4 * units]
    activ = ctx.emit(relax.op.matmul(concat, wt, out_dtype=ACC_DTYPE))
    activ = ctx.emit(relax.op.add(activ, ctx.fconst(b)))

    def gate(k: int) -> Expr:
        return relax.op.strided_slice(activ, [1], [k * units], [(k + 1) * units])

    # Gate order of the weights' rows: input, new input (candidate), forget, output.
    i_gate, g, f_gate, o_gate = (
        relax.op.sigmoid(gate(0)),
        relax.op.tanh(gate(1)),
        relax.op.sigmoid(gate(2)),
        relax.op.sigmoid(gate(3)),
    )
    state = ctx.emit(relax.op.add(relax.op.multiply(i_gate, g), relax.op.multiply(f_gate, c)))
    out = ctx.emit(relax.op.multiply(o_gate, relax.op.tanh(state)))
    return [out, state, concat, activ]
