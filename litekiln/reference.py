"""The numpy reference executor: runs a whole subgraph op by op on the CPU.

It is the oracle of every GPU test and the engine of ``device="reference"``; the runtime's CPU
fallback runs the same per-op code (:func:`litekiln.ops.run_op`) between GPU partitions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from litekiln.model.ir import Op, Subgraph
from litekiln.ops import run_op

#: How far the float view of a quantized model (dequantized constants, quantization simulated
#: between ops in float) may drift from the integer semantics of this reference, as a share
#: of a quantized tensor's range (255 steps for int8). Each op rounds once, within a step of
#: the integer op given the same inputs, but a step's difference grows along a chain of ops,
#: most at a softmax (its output moves up to a quarter of its input's scale per input step):
#: on PoCL, the first 30 seeds of the zoo's smoke_int8 (12 ops, softmax over 10) differ by up
#: to 4 steps, keras_efficientnetb0_int8 by 3-4 steps on every seed, mobilenet_v1_int8 by 1-2.
#: The quantized-model issue bounds dynamic-range models' outputs at this share of their range.
FLOAT_VIEW_RANGE_SHARE = 5e-2


def gather_inputs(
    op: Op, graph: Subgraph, values: Mapping[int, np.ndarray]
) -> list[np.ndarray | None]:
    """The arrays an op reads: computed values, else constants, None for omitted inputs."""
    out: list[np.ndarray | None] = []
    for t in op.inputs:
        if t < 0:
            out.append(None)
        elif t in values:
            out.append(values[t])
        else:
            data = graph.tensors[t].data
            if data is None:
                from litekiln.errors import ModelError

                raise ModelError(
                    f"{op.describe()}: input tensor {t} ({graph.tensors[t].name!r}) has no value: "
                    "it is neither a graph input, a constant nor produced by an earlier op"
                )
            out.append(data)
    return out


def run_ops(
    ops: Iterable[Op], graph: Subgraph, values: dict[int, np.ndarray]
) -> dict[int, np.ndarray]:
    """Run ``ops`` in order, reading and extending ``values`` (tensor index -> array)."""
    for op in ops:
        results = run_op(op, graph, gather_inputs(op, graph, values))
        for t, r in zip(op.outputs, results, strict=True):
            if t >= 0:
                values[t] = r
    return values


def run_graph(
    graph: Subgraph, inputs: Mapping[int, np.ndarray], *, intermediates: bool = False
) -> dict[int, np.ndarray]:
    """Execute a subgraph on the numpy reference.

    Args:
        graph: the subgraph to run.
        inputs: values of the graph inputs, by tensor index.
        intermediates: return every computed tensor, not only the graph outputs.

    Returns:
        tensor index -> array for the graph outputs (or every tensor).
    """
    values: dict[int, np.ndarray] = dict(inputs)
    run_ops(graph.live_ops(), graph, values)
    if intermediates:
        return values
    return {t: values[t] if t in values else graph.tensors[t].data for t in graph.outputs}  # type: ignore[misc]
