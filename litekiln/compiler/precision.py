"""fp16 error guard: which tensors a ``precision="fp16"`` program keeps in float32 storage.

Half storage rounds every stored activation (and the convolution/FC weights) to 11
significant bits. Most models lose ~1e-3 of their output range to it; some lose far more:
MediaPipe's pose_landmark_full amplifies the rounding of its early layers through dozens of
residual blocks to 0.2-0.6 of its segmentation logits' range (LiteRT's own GPU delegate in fp16
is off by 0.58 on the same input). Allowing precision loss should not mean unbounded loss, so
the compiler measures it before choosing storage:

1. run the model on the numpy reference in float32 on calibration inputs (fixed seeds, values
   in [0, 1) and [-1, 1));
2. simulate the fp16 program on the same inputs: every value a GPU op stores in half is
   rounded to fp16 as it is stored (weights too, biases stay float32, as
   :mod:`litekiln.compiler.lower` stores them); the error is
   ``max|fp16 - fp32| / max(1, max|fp32|)`` over the outputs;
3. within ``budget`` (default 2.5e-3, a quarter of the 1e-2 that fp16 results are held to):
   every stored tensor is half. Otherwise each candidate tensor's own share is measured (only
   that tensor rounded, the rest of the graph rerun from there), and the most sensitive
   tensors move to float32 storage, the fewest (binary search over the ranking) that bring
   the simulated error within the budget. A convolution whose input is kept in float32 keeps
   its weights in float32 too.

Partition inputs and outputs are float32 storage in any case (see :func:`boundary_tensors`):
the CPU converts nothing per inference (numpy's float32 <-> float16 conversion costs ~3 ns per
element, 0.6 ms for a 256x256x3 image) and the values that leave the GPU are not rounded.

Only the numpy reference is used here: no TVM, no device.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from litekiln.model.ir import Op, Subgraph, index_bounds
from litekiln.reference import gather_inputs

if TYPE_CHECKING:
    from litekiln.compiler.partition import Partition

#: Default simulated-error budget of fp16 programs (relative to max(1, max|output|)).
DEFAULT_BUDGET = 2.5e-3

#: Ops with weights: name -> (data slot, weight slot, bias slot). Their weights are stored in
#: half exactly when their data input is (lowering.data_and_weights); biases stay float32.
WEIGHTED_OPS: dict[str, tuple[int, int, int]] = {
    "CONV_2D": (0, 1, 2),
    "DEPTHWISE_CONV_2D": (0, 1, 2),
    "FULLY_CONNECTED": (0, 1, 2),
    "TRANSPOSE_CONV": (2, 1, 3),
    "Convolution2DTransposeBias": (0, 1, 2),
}

_FP16_MAX = 65504.0


@dataclass
class Fp16Plan:
    """The outcome of the guard.

    Attributes:
        fp32_tensors: tensors (graph indices) stored in float32 although the program is fp16.
        candidates: how many tensors could have been half (GPU op results inside partitions).
        error_all_half: simulated error with every candidate in half.
        error: simulated error of the chosen storage.
        budget: the budget it was held to.
        seconds: time the analysis took.
    """

    fp32_tensors: frozenset[int] = frozenset()
    candidates: int = 0
    error_all_half: float = 0.0
    error: float = 0.0
    budget: float = DEFAULT_BUDGET
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        return {
            "fp32_tensors": len(self.fp32_tensors),
            "half_tensors": self.candidates - len(self.fp32_tensors),
            "simulated_error_all_half": float(f"{self.error_all_half:.3g}"),
            "simulated_error": float(f"{self.error:.3g}"),
            "budget": self.budget,
            "seconds": round(self.seconds, 2),
        }


def round_half(a: np.ndarray) -> np.ndarray:
    """Float32 values rounded to the nearest fp16 value (saturating at +-65504, as the
    emulated-half kernels do), returned as float32."""
    return np.clip(a, -_FP16_MAX, _FP16_MAX).astype(np.float16).astype(np.float32)


def boundary_tensors(partitions: Iterable[Partition]) -> set[int]:
    """Tensors that cross a partition boundary (float32 storage under fp16)."""
    out: set[int] = set()
    for p in partitions:
        out.update(p.inputs)
        out.update(p.outputs)
    return out


def calibration_inputs(graph: Subgraph) -> list[dict[int, np.ndarray]]:
    """Two fixed input sets: floats in [0, 1) and in [-1, 1); integers over their range, but
    ids within the rows of the table they index (`index_bounds`: a text model's token ids;
    outside, its EMBEDDING_LOOKUP fails and so did the compile); the variable tensors at their
    reset value."""
    bounds = index_bounds(graph)
    sets = []
    for seed, lo in ((0x5EED, 0.0), (0x5EEE, -1.0)):
        rng = np.random.default_rng(seed)
        values: dict[int, np.ndarray] = {}
        for t in graph.inputs:
            tensor = graph.tensors[t]
            if tensor.dtype.kind == "f":
                values[t] = rng.uniform(lo, 1.0, tensor.shape).astype(tensor.dtype)
            elif tensor.dtype.kind == "b":
                values[t] = rng.integers(0, 2, tensor.shape).astype(bool)
            elif t in bounds:
                values[t] = rng.integers(0, bounds[t], tensor.shape).astype(tensor.dtype)
            else:
                info = np.iinfo(tensor.dtype)
                values[t] = rng.integers(
                    max(info.min, -128), min(info.max, 127) + 1, tensor.shape
                ).astype(tensor.dtype)
        values.update(graph.initial_variables())  # (a sequence LSTM's state, at reset)
        sets.append(values)
    return sets


class _Simulator:
    """fp32 reference values and fp16 simulations of one graph on one input set."""

    def __init__(
        self,
        graph: Subgraph,
        gpu_ops: set[int],
        inputs: dict[int, np.ndarray],
        run: Callable[..., list[np.ndarray]],
    ) -> None:
        self.graph = graph
        self.run = run
        self.ops: list[tuple[int, Op]] = [
            (i, op) for i, op in enumerate(graph.ops) if not op.folded
        ]
        self.gpu = gpu_ops
        self.inputs = inputs
        self.exact: dict[int, np.ndarray] = dict(inputs)
        for _, op in self.ops:
            results = run(op, graph, gather_inputs(op, graph, self.exact))
            for t, r in zip(op.outputs, results, strict=True):
                if t >= 0:
                    self.exact[t] = r
        self.scale = {
            t: max(1.0, float(np.abs(self.exact[t]).max()) if self.exact[t].size else 1.0)
            for t in graph.outputs
            if t in self.exact
        }

    def error(self, values: dict[int, np.ndarray]) -> float:
        worst = 0.0
        for t, s in self.scale.items():
            a, b = values[t], self.exact[t]
            if a.dtype.kind != "f" or not a.size:
                continue
            worst = max(worst, float(np.abs(a.astype(np.float64) - b).max()) / s)
        return worst

    def simulate(
        self, half: set[int], start: int = 0, values: dict[int, np.ndarray] | None = None
    ) -> float:
        """Output error when the tensors in ``half`` are stored in fp16 (from op position
        ``start`` on, the earlier values taken from ``values``)."""
        v = dict(values if values is not None else self.inputs)
        g = self.graph
        for i, op in self.ops[start:]:
            xs = gather_inputs(op, g, v)
            if i in self.gpu:
                xs = self._round_constants(op, xs, half)
            for t, r in zip(op.outputs, self.run(op, g, xs), strict=True):
                if t >= 0:
                    v[t] = round_half(r) if t in half and r.dtype == np.float32 else r
        return self.error(v)

    def _round_constants(
        self, op: Op, xs: list[np.ndarray | None], half: set[int]
    ) -> list[np.ndarray | None]:
        g = self.graph
        slots = WEIGHTED_OPS.get(op.name)
        out = list(xs)
        for s, (t, x) in enumerate(zip(op.inputs, xs, strict=True)):
            if x is None or t < 0 or g.tensors[t].data is None or x.dtype != np.float32:
                continue
            if slots is not None:
                data, weight, bias = slots
                if s == bias:
                    continue
                if s == weight:
                    d = op.inputs[data] if data < len(op.inputs) else -1
                    if d < 0 or d not in half:
                        continue
            out[s] = round_half(x)
        return out

    def alone(self, t: int, position: int) -> float:
        """Output error when only ``t`` (written by the op at ``position``) is half."""
        v = dict(self.exact)
        v[t] = round_half(self.exact[t])
        return self.simulate({t}, position + 1, v)


def plan_fp16_storage(
    graph: Subgraph,
    partitions: Sequence[Partition],
    *,
    budget: float = DEFAULT_BUDGET,
    run: Callable[..., list[np.ndarray]] | None = None,
    log: Callable[[str], None] | None = None,
) -> Fp16Plan:
    """Choose the tensors an fp16 program keeps in float32 (see the module docstring).

    Args:
        graph: the subgraph (its constants already dequantized/densified by the loader).
        partitions: the GPU partitions (``ops``, ``inputs``, ``outputs``).
        budget: largest simulated error accepted, relative to max(1, max|output|).
        run: the per-op reference (``litekiln.ops.run_op``; injectable for tests).
        log: called with progress messages.
    """
    if run is None:
        from litekiln.ops import run_op

        run = run_op
    t0 = time.perf_counter()
    gpu_ops = {i for p in partitions for i in p.ops}
    boundary = boundary_tensors(partitions)
    candidates = {
        t
        for i in gpu_ops
        for t in graph.ops[i].outputs
        if t >= 0 and t not in boundary and graph.tensors[t].dtype.kind == "f"
    }
    plan = Fp16Plan(candidates=len(candidates), budget=budget)
    if not candidates:
        return plan
    sims = [_Simulator(graph, gpu_ops, x, run) for x in calibration_inputs(graph)]

    def err(half: set[int]) -> float:
        return max(s.simulate(half) for s in sims)

    plan.error_all_half = plan.error = err(candidates)
    if plan.error_all_half <= budget:
        plan.seconds = time.perf_counter() - t0
        return plan
    if log:
        log(
            f"fp16: simulated error {plan.error_all_half:.2e} with every tensor in half exceeds "
            f"{budget:.1e}; measuring each tensor's share ({len(candidates)} tensors)"
        )
    position = {
        t: k for k, (_, op) in enumerate(sims[0].ops) for t in op.outputs if t in candidates
    }
    share = {t: max(s.alone(t, position[t]) for s in sims) for t in candidates}
    ranked = sorted(candidates, key=lambda t: (-share[t], t))
    # Smallest k such that keeping the k most sensitive tensors in float32 meets the budget.
    lo, hi = 0, len(ranked)
    errors: dict[int, float] = {}
    while lo < hi:
        mid = (lo + hi) // 2
        errors[mid] = err(set(ranked[mid:]))
        if errors[mid] <= budget:
            hi = mid
        else:
            lo = mid + 1
    plan.fp32_tensors = frozenset(ranked[:lo])
    plan.error = errors[lo] if lo in errors else err(set(ranked[lo:]))
    if plan.error > budget:
        plan.notes.append(f"even all-float32 storage leaves {plan.error:.2e} (rounded constants)")
    plan.seconds = time.perf_counter() - t0
    return plan
