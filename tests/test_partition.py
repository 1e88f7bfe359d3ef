"""The partitioner (``litekiln.compiler.partition``) on built graphs, and split runs on PoCL.

Pure-Python tests check the plan: partitions, CPU ops and their reasons, the TFLite-style
warning lines and summary, maximal and acyclic partitions (also on random graphs), the
``max_partitions`` / ``min_partition_ops`` / ``force_cpu`` / ``allow_quantized`` /
``extended_table`` options and version limits. The ``opencl`` tests run split models on the
device (CPU fallback between GPU partitions) and validate mode.
"""

from __future__ import annotations

import itertools
import struct
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from tflite_builder import ModelBuilder, Quant, TensorRef, builtin_code

from litekiln.compiler.partition import PartitionPlan
from litekiln.compiler.partition import partition as _partition
from litekiln.model import load_model
from litekiln.model.ir import Subgraph

S = [1, 4, 4, 3]
GPU_UNARY = ["RELU", "LOGISTIC", "RELU6", "EXP"]
CPU_UNARY = ["FLOOR", "ABS", "LOG", "SQUARE"]  # not in the documented GPU op table

#: What this file's CPU ops are told under the documented table.
NOT_DOCUMENTED = "not in the documented GPU op table (op_table='documented')"


VERSION_2 = "version 2 > 1, the newest the documented GPU op table lists (op_table='documented')"
VERSION_3 = "version 3 > 2, the newest the documented GPU op table lists (op_table='documented')"


def partition(graph: Subgraph, **kw: Any) -> PartitionPlan:
    """The partitioner under the documented op table and fixed fragment rules, which most
    tests here are written for: there FLOOR, ABS, LOG and SQUARE stay on the CPU, and every
    partition is kept (``min_partition_ops=1``) unless a test says otherwise. The defaults
    (every op litekiln runs on the GPU, fragments decided by cost) have tests of their own."""
    kw.setdefault("extended_table", False)
    kw.setdefault("min_partition_ops", 1)
    return _partition(graph, **kw)


def _graph(b: ModelBuilder) -> Subgraph:
    return load_model(b.build()).main


def _unary(b: ModelBuilder, name: str, x: TensorRef) -> TensorRef:
    return b.op(name, [x])


def _add(b: ModelBuilder, x: TensorRef, y: TensorRef) -> TensorRef:
    return b.op("ADD", [x, y], options={"fused_activation_function": "NONE"})


def _chain(names: list[str]) -> ModelBuilder:
    """x -> names[0] -> names[1] -> ... -> output (unary ops, ADD adds a constant)."""
    b = ModelBuilder()
    y = b.input("x", S)
    for n in names:
        y = _add(b, y, np.ones(S, np.float32)) if n == "ADD" else _unary(b, n, y)
    b.output(y)
    return b


# -- plan invariants ------------------------------------------------------------------------


def check_plan(graph: Subgraph, plan: PartitionPlan) -> None:
    """Invariants every plan must satisfy.

    * every live op is in exactly one step (a partition or a CPU op);
    * running the steps in order, every value a step reads already exists (the plan is an
      executable topological order, hence acyclic);
    * no partition input depends, through any path of the graph, on one of the partition's
      own outputs (a partition never has to wait for itself through the CPU);
    * partition inputs/outputs/constants are exactly the boundary of its op set.
    """
    live = {op.index for op in graph.live_ops()}
    seen: list[int] = []
    for s in plan.steps:
        seen += plan.partitions[s.partition].ops if s.kind == "gpu" else [s.op]  # type: ignore[index,list-item]
    assert sorted(seen) == sorted(live), "each live op exactly once"
    assert set(plan.cpu_reasons) == {s.op for s in plan.steps if s.kind == "cpu"}

    available = set(graph.inputs) | {t.index for t in graph.tensors if t.is_constant}
    for s in plan.steps:
        ops = plan.partitions[s.partition].ops if s.kind == "gpu" else [s.op]  # type: ignore[index,list-item]
        produced_here: set[int] = set()
        for i in ops:
            op = graph.ops[i]
            for t in op.inputs:
                if t >= 0:
                    assert t in available or t in produced_here, (
                        f"step {s}: op #{i} reads tensor {t} before it exists"
                    )
            produced_here |= {t for t in op.outputs if t >= 0}
        available |= produced_here

    producers = graph.producers()
    # tensor -> set of tensors it (transitively) depends on
    deps: dict[int, set[int]] = {}

    def depends(t: int) -> set[int]:
        if t not in deps:
            p = producers.get(t)
            out: set[int] = set()
            if p is not None:
                for u in graph.ops[p].inputs:
                    if u >= 0:
                        out |= {u} | depends(u)
            deps[t] = out
        return deps[t]

    readers: dict[int, set[int]] = defaultdict(set)
    for op in graph.live_ops():
        for t in op.inputs:
            if t >= 0:
                readers[t].add(op.index)
    for p in plan.partitions:
        mine = set(p.ops)
        produced = {t for i in p.ops for t in graph.ops[i].outputs if t >= 0}
        for t in p.inputs:
            assert not (depends(t) & produced), (
                f"partition {p.index}: input {t} depends on the partition's own outputs: a cycle"
            )
        read = {t for i in p.ops for t in graph.ops[i].inputs if t >= 0}
        assert set(p.inputs) == {
            t for t in read if t not in produced and not graph.tensors[t].is_constant
        }
        assert set(p.constants) == {t for t in read if graph.tensors[t].is_constant}
        assert set(p.outputs) == {t for t in produced if t in graph.outputs or readers[t] - mine}


# -- split around an unsupported op ---------------------------------------------------------


def test_unsupported_op_in_the_middle() -> None:
    g = _graph(_chain(["RELU", "LOGISTIC", "FLOOR", "ADD", "RELU6"]))
    plan = partition(g)
    check_plan(g, plan)
    assert [p.ops for p in plan.partitions] == [[0, 1], [3, 4]]
    assert [(s.kind, s.partition, s.op) for s in plan.steps] == [
        ("gpu", 0, None),
        ("cpu", None, 2),
        ("gpu", 1, None),
    ]
    assert plan.cpu_reasons == {2: NOT_DOCUMENTED}
    assert plan.gpu_op_count == 4 and plan.cpu_op_count == 1
    # The CPU op reads partition 0's output and feeds partition 1.
    relu_out, floor_out = g.ops[1].outputs[0], g.ops[2].outputs[0]
    assert plan.partitions[0].outputs == [relu_out]
    assert plan.partitions[1].inputs == [floor_out]
    assert plan.warning_lines() == [
        f"WARNING: op code #{builtin_code('FLOOR')} cannot be handled by this delegate.",
        "  op FLOOR (1x: ops #2): not in the documented GPU op table (op_table='documented')",
        "litekiln: 4 ops run on the GPU in 2 partitions, 1 op on the CPU.",
    ]


def test_one_warning_per_op_code() -> None:
    # FLOOR twice, ABS once, plus MEAN (extended table only): one WARNING line per op code,
    # in op-code order, each followed by its ops.
    b = ModelBuilder()
    x = b.input("x", S)
    y = _unary(b, "FLOOR", _unary(b, "RELU", x))  # ops 0, 1
    y = _unary(b, "ABS", _unary(b, "RELU", y))  # ops 2, 3
    y = _unary(b, "FLOOR", _unary(b, "LOGISTIC", y))  # ops 4, 5
    m = b.op(
        "MEAN", [y, np.array([1, 2], np.int32)], out_shape=[1, 3], options={"keep_dims": False}
    )  # op 6
    b.output(m)
    g = _graph(b)
    plan = partition(g)
    check_plan(g, plan)
    floor, abs_, mean = builtin_code("FLOOR"), builtin_code("ABS"), builtin_code("MEAN")
    assert floor < mean < abs_
    lines = plan.warning_lines()
    assert lines == [
        f"WARNING: op code #{floor} cannot be handled by this delegate.",
        "  op FLOOR (2x: ops #1, #5): not in the documented GPU op table (op_table='documented')",
        f"WARNING: op code #{mean} cannot be handled by this delegate.",
        f"  op MEAN (1x: ops #6): {NOT_DOCUMENTED}",
        f"WARNING: op code #{abs_} cannot be handled by this delegate.",
        "  op ABS (1x: ops #3): not in the documented GPU op table (op_table='documented')",
        "litekiln: 3 ops run on the GPU in 3 partitions, 4 ops on the CPU.",
    ]
    assert sum(line.startswith("WARNING") for line in lines) == 3

    ext = partition(g, extended_table=True)
    check_plan(g, ext)
    assert 6 not in ext.cpu_reasons


def test_summary_singular_and_all_gpu() -> None:
    g = _graph(_chain(["RELU"]))
    plan = partition(g)
    assert plan.warning_lines() == [
        "litekiln: 1 op run on the GPU in 1 partition, 0 ops on the CPU."
    ]
    g = _graph(_chain(["FLOOR"]))
    plan = partition(g)
    assert plan.summary() == "litekiln: 0 ops run on the GPU in 0 partitions, 1 op on the CPU."
    assert plan.partitions == []


def test_many_ops_of_one_code_are_elided() -> None:
    names = []
    for _ in range(8):
        names += ["RELU", "FLOOR"]
    g = _graph(_chain(names))
    plan = partition(g, max_partitions=100)
    assert plan.warning_lines()[1] == (
        f"  op FLOOR (8x: ops #1, #3, #5, #7, #9, #11, ...): {NOT_DOCUMENTED}"
    )


# -- maximal, acyclic partitions ------------------------------------------------------------


def test_no_cycle_through_the_cpu() -> None:
    """A (GPU) feeds B (CPU) and C (GPU); C also reads B. Putting A and C in one partition
    would make it wait for B, which waits for the partition: a cycle. D (GPU, reads only A)
    sits after B in the file but joins A's partition; E (GPU, reads C and D) joins C's."""
    b = ModelBuilder()
    x = b.input("x", S)
    a = _unary(b, "RELU", x)  # op 0
    bb = _unary(b, "FLOOR", a)  # op 1, CPU
    d = _unary(b, "LOGISTIC", a)  # op 2
    c = _add(b, a, bb)  # op 3
    e = _add(b, c, d)  # op 4
    b.output(e)
    g = _graph(b)
    plan = partition(g)
    check_plan(g, plan)
    assert [p.ops for p in plan.partitions] == [[0, 2], [3, 4]]
    assert [s.kind for s in plan.steps] == ["gpu", "cpu", "gpu"]
    # Partition 1 reads A (from partition 0), B (from the CPU) and D (from partition 0).
    assert set(plan.partitions[1].inputs) == {a.index, bb.index, d.index}
    assert set(plan.partitions[0].outputs) == {a.index, d.index}


def test_clustering_merges_interleaved_gpu_ops() -> None:
    """Two independent branches, each alternating GPU and CPU ops in file order: the plan
    groups the GPU ops that are ready together (3 partitions, not 4)."""
    b = ModelBuilder()
    x = b.input("x", S)
    p1 = _unary(b, "RELU", x)  # 0
    q1 = _unary(b, "FLOOR", p1)  # 1 CPU
    p2 = _unary(b, "RELU6", x)  # 2
    q2 = _unary(b, "ABS", p2)  # 3 CPU
    r1 = _unary(b, "LOGISTIC", q1)  # 4
    r2 = _unary(b, "EXP", q2)  # 5
    b.output(_add(b, r1, r2))  # 6
    g = _graph(b)
    plan = partition(g)
    check_plan(g, plan)
    assert [p.ops for p in plan.partitions] == [[0, 2], [4, 5, 6]]
    assert [s.kind for s in plan.steps] == ["gpu", "cpu", "cpu", "gpu"]


def _random_graph(rng: np.random.Generator, n_ops: int) -> Subgraph:
    b = ModelBuilder()
    tensors = [b.input("x0", S), b.input("x1", S)]
    for _ in range(n_ops):
        kind = rng.random()
        if kind < 0.35:
            x, y = (tensors[int(i)] for i in rng.choice(len(tensors), 2))
            t = _add(b, x, y)
        else:
            name = (GPU_UNARY if kind < 0.7 else CPU_UNARY)[int(rng.integers(4))]
            t = _unary(b, name, tensors[int(rng.integers(len(tensors)))])
        tensors.append(t)
    # Every op's output is read by something or is a graph output: no dead ops.
    read = {t for op in b.main.ops for t in op.inputs}
    b.output(*[t for t in tensors[2:] if t.index not in read])
    return _graph(b)


@pytest.mark.parametrize("seed", range(40))
def test_random_graphs_give_acyclic_maximal_plans(seed: int) -> None:
    rng = np.random.default_rng(seed)
    g = _random_graph(rng, int(rng.integers(3, 25)))
    plan = partition(g, max_partitions=100)
    check_plan(g, plan)
    # Maximal: every op the GPU can run is in a partition (no partition limit here), no two
    # steps in a row are partitions, and no op of a partition could have joined an earlier
    # partition: each depends on a CPU op scheduled after that earlier partition.
    assert set(plan.cpu_reasons.values()) <= {NOT_DOCUMENTED}
    kinds = [s.kind for s in plan.steps]
    assert all(not (a == b == "gpu") for a, b in itertools.pairwise(kinds))
    producers = g.producers()

    def op_deps(i: int, memo: dict[int, set[int]] = {}) -> set[int]:  # noqa: B006
        if i not in memo:
            out: set[int] = set()
            for t in g.ops[i].inputs:
                p = producers.get(t)
                if p is not None:
                    out |= {p} | op_deps(p)
            memo[i] = out
        return memo[i]

    for k, step in enumerate(plan.steps):
        if step.kind != "gpu":
            continue
        cpu_after = {t.op for t in plan.steps[k + 1 :] if t.kind == "cpu"}
        for later in plan.steps[k + 1 :]:
            if later.kind == "gpu":
                for i in plan.partitions[later.partition].ops:  # type: ignore[index]
                    assert op_deps(i) & cpu_after, (
                        f"op #{i} could have joined partition {step.partition}"
                    )


def test_cpu_ops_that_need_no_gpu_op_run_first_so_a_partition_is_not_split() -> None:
    # G1 reads x; C1 (CPU) reads x; G2 reads C1 and G1. Running C1 first gives one partition
    # {G1, G2}; the greedy GPU-first order gave {G1}, C1, {G2} (an expected failure here
    # until the CPU ops with no GPU op upstream were ordered first).
    b = ModelBuilder()
    x = b.input("x", S)
    g1 = _unary(b, "RELU", x)
    c1 = _unary(b, "FLOOR", x)
    b.output(_add(b, g1, c1))
    g = _graph(b)
    plan = partition(g)
    check_plan(g, plan)
    assert len(plan.partitions) == 1


# -- partition limits ------------------------------------------------------------------------


LIMITS = ["RELU", "RELU6", "FLOOR", "LOGISTIC", "ABS", "EXP", "RELU", "ADD"]
#          0       1        2 CPU    3           4 CPU  5      6       7   -> runs [0,1] [3] [5,6,7]


def test_max_partitions_drops_the_smallest() -> None:
    g = _graph(_chain(LIMITS))
    plan = partition(g)
    check_plan(g, plan)
    assert [p.ops for p in plan.partitions] == [[0, 1], [3], [5, 6, 7]]

    plan = partition(g, max_partitions=2)
    check_plan(g, plan)
    assert [p.ops for p in plan.partitions] == [[0, 1], [5, 6, 7]]
    assert plan.cpu_reasons[3] == "partition of 1 ops beyond the 2-partition limit"
    assert plan.summary() == "litekiln: 5 ops run on the GPU in 2 partitions, 3 ops on the CPU."
    # The dropped op's code gets its own warning line.
    assert f"WARNING: op code #{builtin_code('LOGISTIC')} cannot be handled by this delegate." in (
        plan.warning_lines()
    )

    plan = partition(g, max_partitions=1)
    assert [p.ops for p in plan.partitions] == [[5, 6, 7]]
    assert plan.cpu_reasons[0] == "partition of 2 ops beyond the 1-partition limit"

    plan = partition(g, max_partitions=0)  # 0: no cap
    assert [p.ops for p in plan.partitions] == [[0, 1], [3], [5, 6, 7]]
    check_plan(g, plan)


def test_min_partition_ops() -> None:
    g = _graph(_chain(LIMITS))
    plan = partition(g, min_partition_ops=2)
    check_plan(g, plan)
    assert [p.ops for p in plan.partitions] == [[0, 1], [5, 6, 7]]
    assert plan.cpu_reasons[3] == "partition of 1 ops is smaller than 2"
    plan = partition(g, min_partition_ops=3)
    assert [p.ops for p in plan.partitions] == [[5, 6, 7]]
    assert plan.cpu_reasons[0] == "partition of 2 ops is smaller than 3"
    assert plan.cpu_reasons[1] == "partition of 2 ops is smaller than 3"
    plan = partition(g, min_partition_ops=4)
    assert plan.partitions == []


def test_force_cpu() -> None:
    g = _graph(_chain(["RELU", "RELU6", "LOGISTIC"]))
    plan = partition(g, force_cpu={1})
    check_plan(g, plan)
    assert [p.ops for p in plan.partitions] == [[0], [2]]
    assert plan.cpu_reasons == {1: "forced onto the CPU"}


# -- versions, quantized ops, custom ops -------------------------------------------------------


def _dwconv(version: int, dilation: int = 1) -> Subgraph:
    b = ModelBuilder()
    x = b.input("x", S)
    y = b.op(
        "DEPTHWISE_CONV_2D",
        [x, np.ones([1, 3, 3, 3], np.float32), np.zeros(3, np.float32)],
        options={
            "padding": "SAME",
            "stride_w": 1,
            "stride_h": 1,
            "depth_multiplier": 1,
            "dilation_w_factor": dilation,
            "dilation_h_factor": dilation,
        },
        version=version,
    )
    b.output(y)
    return _graph(b)


def test_version_limits() -> None:
    assert partition(_dwconv(1)).cpu_reasons == {}
    assert partition(_dwconv(2, dilation=2)).cpu_reasons == {}
    plan = partition(_dwconv(3))
    assert plan.cpu_reasons == {0: VERSION_3}
    assert plan.warning_lines()[:2] == [
        f"WARNING: op code #{builtin_code('DEPTHWISE_CONV_2D')} cannot be handled by this "
        "delegate.",
        f"  op DEPTHWISE_CONV_2D (1x: ops #0): {VERSION_3}",
    ]


def _qadd(version: int) -> Subgraph:
    b = ModelBuilder()
    x = b.input("x", S, "int8", quant=Quant(0.02, 3))
    y = b.input("y", S, "int8", quant=Quant(0.03, -2))
    b.output(
        b.op(
            "ADD",
            [x, y],
            out_quant=Quant(0.04, 1),
            version=version,
            options={"fused_activation_function": "NONE"},
        )
    )
    return _graph(b)


def test_quantized_add_needs_allow_quantized() -> None:
    assert partition(_qadd(2)).cpu_reasons == {}
    assert partition(_qadd(2), allow_quantized=False).cpu_reasons == {0: VERSION_2}
    assert partition(_qadd(1), allow_quantized=False).cpu_reasons == {
        0: "quantized tensors, and quantized models are not allowed"
    }
    assert partition(_qadd(3)).cpu_reasons == {0: VERSION_3}


def test_custom_ops_are_named_by_custom_code() -> None:
    b = ModelBuilder()
    x = b.input("x", [1, 4, 4, 2])
    y = _unary(b, "RELU", x)  # op 0
    w = np.ones([3, 3, 3, 2], np.float32)
    t = b.custom_op(
        "Convolution2DTransposeBias",
        [y, w, np.zeros(3, np.float32)],
        out_shape=[1, 8, 8, 3],
        custom_options=struct.pack("<3i", 1, 2, 2),
    )  # op 1: SAME, stride 2
    u = b.custom_op("MyUnknownOp", [t], out_shape=[1, 8, 8, 3])  # op 2
    b.output(_unary(b, "RELU", u))  # op 3
    g = _graph(b)
    plan = partition(g)
    check_plan(g, plan)
    assert plan.warning_lines() == [
        "WARNING: op code #32 cannot be handled by this delegate.",
        f"  custom code Convolution2DTransposeBias (1x: ops #1): {NOT_DOCUMENTED}",
        "  custom code MyUnknownOp (1x: ops #2): not supported by litekiln",
        "litekiln: 2 ops run on the GPU in 2 partitions, 2 ops on the CPU.",
    ]


def test_every_delegated_op_has_an_emitter() -> None:
    """Whatever the partitioner may send to the GPU (either table) must have a lowering: an
    op without one would cost its whole partition a trip to the CPU (the compiler's fallback)."""
    pytest.importorskip("tvm")
    from litekiln.compiler.lower import EMITTERS
    from litekiln.ops.base import REGISTRY

    missing = sorted(
        name
        for name, cls in REGISTRY.items()
        if (cls.gpu or cls.gpu_extended) and name not in EMITTERS
    )
    assert missing == [], f"ops in a GPU table without a GPU lowering: {missing}"


# -- split runs on the device ----------------------------------------------------------------


def _split_model() -> bytes:
    """conv -> relu -> mul -> FLOOR (op 3, CPU) -> add(conv output) -> logistic: GPU
    partitions {0, 1, 2} and {4, 5}, the conv output crossing from the first to the second."""
    b = ModelBuilder()
    x = b.input("x", [1, 6, 6, 3])
    rng = np.random.default_rng(0)
    c = b.op(
        "CONV_2D",
        [
            x,
            rng.uniform(-1, 1, [4, 3, 3, 3]).astype(np.float32),
            rng.uniform(-1, 1, [4]).astype(np.float32),
        ],
        out_shape=[1, 6, 6, 4],
        options={"padding": "SAME", "stride_w": 1, "stride_h": 1},
    )
    r = _unary(b, "RELU", c)
    f = _unary(
        b,
        "FLOOR",
        b.op(
            "MUL", [r, np.full([4], 3.0, np.float32)], options={"fused_activation_function": "NONE"}
        ),
    )
    y = _unary(b, "LOGISTIC", _add(b, f, c))
    b.output(y)
    return b.build()


@pytest.mark.opencl
def test_split_run_matches_reference(capsys: pytest.CaptureFixture[str]) -> None:
    import litekiln

    model = _split_model()
    x = np.random.default_rng(1).uniform(-1, 1, [1, 6, 6, 3]).astype(np.float32)
    it = litekiln.Interpreter(
        model_content=model, use_cache=False, op_table="documented", min_partition_ops=1
    )
    (gpu,) = it.run([x])
    err = capsys.readouterr().err
    assert f"WARNING: op code #{builtin_code('FLOOR')} cannot be handled by this delegate." in err
    assert (
        "  op FLOOR (1x: ops #3): not in the documented GPU op table (op_table='documented')" in err
    )
    assert "litekiln: 5 ops run on the GPU in 2 partitions, 1 op on the CPU." in err
    assert err.count("WARNING:") == 1
    (ref,) = litekiln.Interpreter(model_content=model, device="reference").run([x])
    assert np.abs(gpu - ref).max() <= 1e-4
    # Exactly what the plan says ran: two GPU partitions around one CPU op.
    assert [k for k, _ in it._backend.compiled.steps] == ["gpu", "cpu", "gpu"]


def _validate_model() -> bytes:
    """conv (op 0, also a graph output) -> add (op 1) -> FLOOR (op 2, CPU) -> relu (op 3)."""
    b = ModelBuilder()
    x = b.input("x", [1, 5, 5, 2])
    rng = np.random.default_rng(2)
    c = b.op(
        "CONV_2D",
        [
            x,
            rng.uniform(-1, 1, [3, 3, 3, 2]).astype(np.float32),
            rng.uniform(-1, 1, [3]).astype(np.float32),
        ],
        out_shape=[1, 5, 5, 3],
        options={"padding": "SAME", "stride_w": 1, "stride_h": 1},
    )
    a = _add(b, c, np.full([3], 0.25, np.float32))
    y = _unary(b, "RELU", _unary(b, "FLOOR", a))
    b.output(c, y)
    return b.build()


@pytest.mark.opencl
def test_validate_mode_names_first_diverging_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    from tvm import relax

    from litekiln.compiler import lower
    from litekiln.loading import open_session

    model = load_model(_validate_model())
    g = model.main
    conv_out, add_out = g.ops[0].outputs[0], g.ops[1].outputs[0]
    feeds = {g.inputs[0]: np.random.default_rng(3).uniform(-1, 1, [1, 5, 5, 2]).astype(np.float32)}

    fixed = {"op_table": "documented", "min_partition_ops": 1}  # FLOOR on the CPU, kept apart
    good = open_session(model, use_cache=False, validate=True, **fixed)
    good.run(feeds)
    assert good.last_report is not None and good.last_report.ok, str(good.last_report)
    assert good.last_report.checked == 3  # conv and add (partition 0), relu (partition 1)

    # The GPU's ADD is now off by +1.0; the conv before it (also checked) stays right.
    original = lower.EMITTERS["ADD"]

    def off_by_one(ctx):  # type: ignore[no-untyped-def]
        (y,) = original(ctx)
        return [ctx.emit(relax.op.add(y, ctx.fconst(1.0)))]

    monkeypatch.setitem(lower.EMITTERS, "ADD", off_by_one)
    bad = open_session(model, use_cache=False, validate=True, **fixed)
    values = bad.run(feeds)
    report = bad.last_report
    assert report is not None and not report.ok
    assert (report.tensor, report.op) == (add_out, 1)
    assert report.name == g.tensors[add_out].name
    assert report.max_abs_error == pytest.approx(1.0, abs=1e-5)
    assert report.tolerance == pytest.approx(
        1e-4 * max(1.0, float(np.abs(values[add_out] - 1).max())), rel=1e-3
    )
    assert report.checked == 2  # conv_out matched first, then add_out diverged
    assert conv_out in values
    assert f"tensor {add_out} ({report.name!r}), output of op #1, diverges" in str(report)


# -- the defaults: every op litekiln runs on the GPU, no cap, fragments decided by cost -------


def _fragments(n: int, conv: bool) -> Subgraph:
    """``n`` GPU fragments, each between two ops litekiln cannot run anywhere (custom ops:
    the partitioner's view of a CPU op): a tiny RELU, or a 3x3 convolution of 56x56x32."""
    b = ModelBuilder()
    shape = [1, 56, 56, 32] if conv else S
    y = b.input("x", shape)
    w = np.zeros([32, 3, 3, 32], np.float32)
    for _ in range(n):
        y = b.custom_op("MyCpuOp", [y], out_shape=shape)
        if conv:
            y = b.op(
                "CONV_2D",
                [y, w, np.zeros(32, np.float32)],
                options={"padding": "SAME", "stride_h": 1, "stride_w": 1},
            )
        else:
            y = _unary(b, "RELU", y)
    b.output(b.custom_op("MyCpuOp", [y], out_shape=shape))
    return _graph(b)


def test_default_keeps_every_partition_that_pays_for_its_round_trip() -> None:
    from litekiln.compiler.partition import ROUND_TRIP_S, cpu_seconds

    convs = _fragments(10, conv=True)
    plan = _partition(convs)  # no cap: ten partitions, each worth its round trip
    check_plan(convs, plan)
    assert len(plan.partitions) == 10
    conv = next(op for op in convs.ops if op.name == "CONV_2D")
    assert cpu_seconds(convs, conv) > 10 * ROUND_TRIP_S  # ~60 MFLOP on the numpy reference

    relus = _fragments(3, conv=False)
    plan = _partition(relus)  # a RELU of 48 values: cheaper on the CPU than a round trip
    check_plan(relus, plan)
    assert plan.partitions == []
    relu = next(op for op in relus.ops if op.name == "RELU")
    assert plan.cpu_reasons[relu.index] == (
        "a partition of 1 op between CPU ops: the CPU runs it in ~29 us, less than a CPU/GPU "
        f"round trip ({ROUND_TRIP_S * 1e6:.0f} us)"
    )
    # A fixed size instead of the cost: every fragment kept.
    assert len(_partition(relus, min_partition_ops=1).partitions) == 3


def test_default_runs_a_whole_gpu_model_on_the_gpu_however_small() -> None:
    g = _graph(_chain(["RELU"]))
    plan = _partition(g)
    assert [p.ops for p in plan.partitions] == [[0]] and plan.cpu_reasons == {}


def test_default_table_takes_versions_by_feature() -> None:
    # DEPTHWISE_CONV_2D v3 (the documented table stops at v2): the default table takes it.
    assert _partition(_dwconv(3)).cpu_reasons == {}
    assert _partition(_dwconv(3), extended_table=False).cpu_reasons == {0: VERSION_3}
