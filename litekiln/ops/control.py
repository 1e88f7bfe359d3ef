"""Control flow: WHILE, IF and STABLEHLO_COMPOSITE, the ops that call other subgraphs of the
model by index.

Keras' recurrent layers (LSTM, GRU, SimpleRNN, Bidirectional) convert to a WHILE over the
time steps: a cond subgraph compares a step counter with the sequence length, a body
subgraph computes one step. The numpy reference runs the called subgraphs op by op (the
same per-op code as the main graph), so any such model runs on the CPU and matches LiteRT.
A WHILE whose trip count is known at load (:func:`static_trip_count`) is unrolled into the
main graph by :mod:`litekiln.ops.unroll`, so that its steps are partitioned like any other
ops and run on the GPU; the GPU path never runs a loop itself.

The load-time checks follow LiteRT's kernels (``while.cc``, ``if.cc``): callee indices in
range and distinct, operand counts equal to the callees' input and output counts, types
equal, a cond output that is a single bool. The callees are checked (and their constant ops
folded) as the op is, with the shapes they declare: litekiln compiles static shapes, so a
loop whose body changes a tensor's shape from step to step is refused, and so is a callee
whose declared input shapes differ from the op's operands.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from litekiln.errors import LitekilnError
from litekiln.model.ir import Op, Subgraph, Tensor
from litekiln.model.loader import check_graph
from litekiln.ops.base import (
    Check,
    OpContext,
    OpDef,
    is_dynamic,
    register,
    run_op,
    validate_graph,
)
from litekiln.ops.fold import fold_op

#: Unrolling a WHILE may add at most this many ops to the main graph (the body's live ops
#: times the trip count); a longer loop stays a WHILE on the CPU. Keras' recurrent layers
#: have 10-30 ops per step: 20k covers sequences of several hundred steps.
UNROLL_MAX_OPS = 20_000

#: Subgraphs whose checks are under way (a callee that calls back into one is a recursion
#: LiteRT would run until the stack overflows).
_CHECKING: set[int] = set()


def run_subgraph(graph: Subgraph, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Run a called subgraph on the numpy reference.

    Args:
        graph: the subgraph.
        inputs: one array per ``graph.inputs``.

    Returns:
        One array per ``graph.outputs``.
    """
    values = {t: x for t, x in zip(graph.inputs, inputs, strict=True) if x is not None}
    _run(graph.live_ops(), graph, values)
    return [_value(graph, values, t) for t in graph.outputs]


def _run(ops: Iterable[Op], graph: Subgraph, values: dict[int, np.ndarray]) -> None:
    for op in ops:
        args = [None if t < 0 else _value(graph, values, t) for t in op.inputs]
        for t, r in zip(op.outputs, run_op(op, graph, args), strict=True):
            values[t] = r


def _value(graph: Subgraph, values: dict[int, np.ndarray], t: int) -> np.ndarray:
    if t in values:
        return values[t]
    data = graph.tensors[t].data
    if data is None:
        raise LitekilnError(
            f"subgraph {graph.index} ({graph.name!r}): tensor {t} "
            f"({graph.tensors[t].name!r}) has no value"
        )
    return data


def check_callee(c: Check, index: int, role: str) -> Subgraph:
    """Subgraph ``index`` (option ``role``) exists, is no caller of this op, and passes the
    loader's graph checks and its ops' checks (its constant ops folded). An op that reads a
    dynamic tensor (:func:`~litekiln.ops.base.is_dynamic`: its shape is known only when the
    subgraph runs) is not checked: LiteRT prepares it at each run; unrolled into the main
    graph, where the shapes are static, it is checked there."""
    graph = c.graph
    if not 0 <= index < len(graph.model_subgraphs):
        raise c.fail(
            "subgraph-index",
            f"{role} {index}: the model has {len(graph.model_subgraphs)} subgraphs",
        )
    callee = graph.called(index)
    if id(callee) in _CHECKING or callee is graph:
        raise c.fail("subgraph-recursion", f"{role} {index} calls itself, directly or not")
    _CHECKING.add(id(graph))
    try:
        check_graph(callee, f"subgraph {index} ({callee.name!r})")
        dynamic = {
            t.index for t in callee.tensors if is_dynamic(t) and t.index not in callee.inputs
        }
        validate_graph(
            callee,
            f"subgraph {index} ({callee.name!r})",
            after_op=fold_op,
            skip=lambda op: not dynamic.isdisjoint(op.inputs),
        )
    finally:
        _CHECKING.discard(id(graph))
    return callee


def check_operands(
    c: Check, callee: Subgraph, operands: Sequence[int], role: str, *, outputs: bool = False
) -> None:
    """The callee's inputs (or outputs) have the type and shape of ``operands`` (tensor
    indices of the calling graph, -1 for omitted ones, whose slot is not checked)."""
    ids = callee.outputs if outputs else callee.inputs
    what = "outputs" if outputs else "inputs"
    if len(ids) != len(operands):
        raise c.fail(
            "subgraph-arity",
            f"{role} {callee.index} has {len(ids)} {what}, the op gives {len(operands)}",
        )
    for k, (t, mine) in enumerate(zip(ids, operands, strict=True)):
        if mine < 0:
            continue
        theirs, ours = callee.tensors[t], c.tensors[mine]
        if theirs.dtype != ours.dtype:
            raise c.fail(
                "subgraph-dtype",
                f"{role} {callee.index}'s {what[:-1]} {k} {theirs.name!r} has type "
                f"{theirs.type_name}, the op's operand {ours.name!r} {ours.type_name}",
            )
        if theirs.shape != ours.shape:
            raise c.fail(
                "subgraph-shape",
                f"{role} {callee.index}'s {what[:-1]} {k} {theirs.name!r} has shape "
                f"{list(theirs.shape)}, the op's operand {ours.name!r} {list(ours.shape)} "
                "(litekiln runs a called subgraph at the shapes it declares)",
            )


@register
class While(OpDef):
    """WHILE: ``while cond(*vars): vars = body(*vars)``; the outputs are the last vars."""

    name = "WHILE"
    rewritten_at_load = "unrolled at load when its trip count is static"
    quant_aware = True  # the loop passes stored values through; its callees' ops dequantize
    foldable = False  # (a loop with constant inputs is unrolled, or would run at every load)
    num_inputs = None
    num_outputs = None

    @classmethod
    def validate(cls, c: Check) -> None:
        """while.cc: as many outputs as inputs; cond and body distinct subgraphs of the
        model; cond takes the inputs and returns one bool (a scalar or of shape [1]); body
        takes and returns the inputs' types. litekiln also wants static shapes: the
        callees' inputs and the body's outputs of the inputs' shapes."""
        super().validate(c)
        op = c.op
        if len(op.outputs) != len(op.inputs):
            raise c.fail(
                "output-count",
                f"{len(op.outputs)} outputs for {len(op.inputs)} inputs: a loop returns its "
                "variables",
            )
        cond_index = int(op.options.get("cond_subgraph_index", 0))
        body_index = int(op.options.get("body_subgraph_index", 0))
        if cond_index == body_index:
            raise c.fail("subgraph-index", f"cond and body are the same subgraph {cond_index}")
        cond = check_callee(c, cond_index, "cond subgraph")
        body = check_callee(c, body_index, "body subgraph")
        check_operands(c, cond, op.inputs, "cond subgraph")
        if len(cond.outputs) != 1:
            raise c.fail(
                "subgraph-arity", f"cond subgraph {cond_index} has {len(cond.outputs)} outputs"
            )
        flag = cond.tensors[cond.outputs[0]]
        if flag.dtype != np.bool_ or flag.shape not in ((), (1,)):
            raise c.fail(
                "cond-output",
                f"cond subgraph {cond_index} returns {flag.type_name} {list(flag.shape)}, "
                "expected one bool",
            )
        check_operands(c, body, op.inputs, "body subgraph")
        check_operands(c, body, op.inputs, "body subgraph", outputs=True)
        for k, t in enumerate(body.outputs):
            c.output_dtype(body.tensors[t].dtype, k)
            c.output_shape(body.tensors[t].shape, k)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        cond, body = callees(ctx.op, ctx.graph)
        values = list(inputs)
        while bool(np.asarray(run_subgraph(cond, values)[0]).reshape(-1)[0]):
            values = list(run_subgraph(body, values))
        return [np.asarray(v) for v in values]

    @classmethod
    def cpu_reason(cls, op: Op, graph: Subgraph) -> str:
        _, why = unroll_plan(op, graph)
        return f"a loop litekiln could not unroll at load (the GPU path runs no loop): {why}"


@register
class If(OpDef):
    """IF: runs the then or the else subgraph on the inputs after the condition."""

    name = "IF"
    quant_aware = True
    num_inputs = (1, 1 << 16)
    num_outputs = None

    @classmethod
    def validate(cls, c: Check) -> None:
        """if.cc: a bool condition (one element); both branches take the other inputs and
        return as many values as the op has outputs, of the outputs' types; litekiln also
        wants both branches to return the same (static) shapes."""
        super().validate(c)
        op = c.op
        flag = c.input(0)
        if flag.dtype != np.bool_ or math.prod(flag.shape) != 1:
            raise c.fail(
                "cond-input",
                f"condition {flag.name!r} is {flag.type_name} {list(flag.shape)}, expected "
                "one bool",
            )
        shapes = []
        for role in ("then", "else"):
            branch = check_callee(c, int(op.options.get(f"{role}_subgraph_index", 0)), role)
            check_operands(c, branch, op.inputs[1:], f"{role} subgraph")
            if len(branch.outputs) != len(op.outputs):
                raise c.fail(
                    "subgraph-arity",
                    f"{role} subgraph {branch.index} has {len(branch.outputs)} outputs, the "
                    f"op {len(op.outputs)}",
                )
            shapes.append([branch.tensors[t] for t in branch.outputs])
        for k, (a, b) in enumerate(zip(*shapes, strict=True)):
            if a.dtype != b.dtype or a.shape != b.shape:
                raise c.fail(
                    "subgraph-shape",
                    f"output {k}: the then branch returns {a.type_name} {list(a.shape)}, the "
                    f"else branch {b.type_name} {list(b.shape)} (litekiln compiles static shapes)",
                )
            c.output_dtype(a.dtype, k)
            c.output_shape(a.shape, k)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        flag = inputs[0]
        if flag is None:
            raise ctx.fail("input 0 (the condition) is required")
        role = "then" if bool(np.asarray(flag).reshape(-1)[0]) else "else"
        branch = ctx.graph.called(int(ctx.options.get(f"{role}_subgraph_index", 0)))
        return run_subgraph(branch, inputs[1:])

    @classmethod
    def cpu_reason(cls, op: Op, graph: Subgraph) -> str:
        return "a branch (IF): its subgraphs run on the CPU"


@register
class StablehloComposite(OpDef):
    """STABLEHLO_COMPOSITE: a named op (``odml.scaled_dot_product_attention``,
    ``odml.rms_norm``...) whose meaning is its decomposition subgraph, run on the op's
    inputs (stablehlo_composite.cc). litert-torch writes one for each attention of its
    generative models; a runtime that knows the name may run a kernel of its own, any other
    runs the decomposition. litekiln inlines the decomposition into the graph at load
    (:func:`litekiln.ops.unroll.inline_composite`), so that its ops are partitioned like any
    other; the numpy reference runs the subgraph (a composite inside a loop kept as a loop)."""

    name = "STABLEHLO_COMPOSITE"
    rewritten_at_load = (
        "inlined at load: its decomposition's ops take its place (odml.scaled_dot_product_"
        "attention: computed from its inputs, as LiteRT's XNNPACK does)"
    )
    quant_aware = True  # the decomposition's own ops dequantize
    foldable = False  # (inlined: its ops fold one by one)
    num_inputs = (1, 1 << 16)
    num_outputs = None

    @classmethod
    def validate(cls, c: Check) -> None:
        """stablehlo_composite.cc: at least one input; the decomposition subgraph exists and
        takes as many inputs and returns as many outputs as the op has. litekiln also wants
        the decomposition's inputs declared at the operands' types and shapes (LiteRT resizes
        them at each run; litekiln compiles static shapes)."""
        super().validate(c)
        op = c.op
        index = int(op.options.get("decomposition_subgraph_index", 0))
        callee = check_callee(c, index, "decomposition subgraph")
        check_operands(c, callee, op.inputs, "decomposition subgraph")
        if len(callee.outputs) != len(op.outputs):
            raise c.fail(
                "subgraph-arity",
                f"decomposition subgraph {index} has {len(callee.outputs)} outputs, the op "
                f"{len(op.outputs)}",
            )
        for k, t in enumerate(callee.outputs):
            c.output_dtype(callee.tensors[t].dtype, k)
            c.output_shape(callee.tensors[t].shape, k)

    @classmethod
    def reference(cls, ctx: OpContext, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        return run_subgraph(decomposition(ctx.op, ctx.graph), inputs)

    @classmethod
    def cpu_reason(cls, op: Op, graph: Subgraph) -> str:
        name = op.options.get("name") or "unnamed"
        return f"a composite ({name}) whose decomposition could not be inlined: it runs on the CPU"


def decomposition(op: Op, graph: Subgraph) -> Subgraph:
    """A STABLEHLO_COMPOSITE's decomposition subgraph."""
    return graph.called(int(op.options.get("decomposition_subgraph_index", 0)))


def callees(op: Op, graph: Subgraph) -> tuple[Subgraph, Subgraph]:
    """A WHILE's (cond, body) subgraphs."""
    return (
        graph.called(int(op.options.get("cond_subgraph_index", 0))),
        graph.called(int(op.options.get("body_subgraph_index", 0))),
    )


def _cone(graph: Subgraph, outputs: Iterable[int]) -> tuple[list[Op], set[int]]:
    """The live ops of ``graph`` that ``outputs`` depend on (in order) and the positions of
    the graph inputs they read."""
    need = {t for t in outputs if t >= 0}
    producers = graph.producers()
    chosen: set[int] = set()
    stack = list(need)
    while stack:
        t = stack.pop()
        p = producers.get(t)
        if p is None or p in chosen:
            continue
        chosen.add(p)
        for u in graph.ops[p].inputs:
            if u >= 0 and u not in need:
                need.add(u)
                stack.append(u)
    positions = {k for k, t in enumerate(graph.inputs) if t in need}
    return [op for op in graph.live_ops() if op.index in chosen], positions


def static_trip_count(op: Op, graph: Subgraph) -> tuple[int | None, str]:
    """How many times a WHILE runs its body, when that is known at load.

    The loop variables the condition depends on, through the condition and the body (a
    step counter and its bound, in Keras' loops), must start from constants; the
    condition is then evaluated at load on the numpy reference, stepping only the part of
    the body that computes those variables, until it is false. The count is refused when
    unrolling would add more than :data:`UNROLL_MAX_OPS` ops, or when the body keeps state
    (variable tensors).

    Returns:
        (trip count, "") or (None, why the count is not known at load).
    """
    cond, body = callees(op, graph)
    body_ops = body.live_ops()
    if any(t.is_variable for t in body.tensors):
        return None, "its body keeps state in variable tensors"
    most = UNROLL_MAX_OPS // max(1, len(body_ops))
    cond_ops, control = _cone(cond, cond.outputs)
    while True:
        _, more = _cone(body, [body.outputs[k] for k in control])
        if more <= control:
            break
        control |= more
    state: dict[int, np.ndarray] = {}
    for k in sorted(control):
        t = op.inputs[k]
        data = graph.tensors[t].data if t >= 0 else None
        if data is None:
            name = graph.tensors[t].name if t >= 0 else "an omitted input"
            return None, f"its trip count depends on {name!r}, which is computed at run time"
        state[k] = data
    step_ops, _ = _cone(body, [body.outputs[k] for k in control])
    try:
        for n in range(most + 1):
            values = {cond.inputs[k]: v for k, v in state.items()}
            _run(cond_ops, cond, values)
            if not bool(np.asarray(_value(cond, values, cond.outputs[0])).reshape(-1)[0]):
                return n, ""
            values = {body.inputs[k]: v for k, v in state.items()}
            _run(step_ops, body, values)
            state = {k: _value(body, values, body.outputs[k]) for k in control}
    except LitekilnError as exc:
        return None, f"its condition could not be evaluated at load: {exc}"
    return None, (
        f"it runs more than {most} times; unrolled, its {len(body_ops)}-op body would add "
        f"more than the {UNROLL_MAX_OPS} ops litekiln unrolls"
    )


def unroll_plan(op: Op, graph: Subgraph) -> tuple[int | None, str]:
    """Whether a WHILE of ``graph`` can be unrolled (:mod:`litekiln.ops.unroll`).

    Returns:
        (trip count, "") or (None, why it stays a loop).
    """
    n, why = static_trip_count(op, graph)
    if n is None:
        return None, why
    _, body = callees(op, graph)
    written = {t for b in body.live_ops() for t in b.outputs}
    seen: set[int] = set()
    for k, (src, dst) in enumerate(zip(op.inputs, op.outputs, strict=True)):
        out = body.outputs[k]
        quants = [body.tensors[body.inputs[k]], body.tensors[out]]
        quants += [graph.tensors[t] for t in (src, dst) if t >= 0]
        if any(not _same_quantization(q, quants[0]) for q in quants[1:]):
            return None, f"loop variable {k} changes its quantization between the subgraphs"
        # The last step writes a loop output itself when the body computes it (once);
        # else the output is another tensor's value, which a graph output cannot be.
        computed = n > 0 and out in written and out not in seen
        seen.add(out)
        if dst in graph.outputs and not computed:
            return None, (
                f"graph output {graph.tensors[dst].name!r} is a loop variable the body does "
                "not compute (passed through, a constant or another output's value)"
            )
    return n, ""


def _same_quantization(a: Tensor, b: Tensor) -> bool:
    qa, qb = a.quantization, b.quantization
    if qa is None or qb is None:
        return qa is qb
    return (
        qa.axis == qb.axis
        and np.array_equal(qa.scale, qb.scale)
        and np.array_equal(qa.zero_point, qb.zero_point)
    )
