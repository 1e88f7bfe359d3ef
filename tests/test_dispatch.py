"""Dispatcher kernels for CPU OpenCL (`litekiln.compiler.dispatch`, issue 16).

The rules (which kernels join a dispatcher, how launches are rewritten) are pinned on small
sources; real generated programs (a convolution, pooling, softmax with cross-thread
reductions, elementwise chains; with the GPU tuning variants too) are compiled with and
without dispatchers and must give the same bits on PoCL, every variant option included.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from litekiln.artifact.program import BufferArg, Launch, ScalarArg, Variant
from litekiln.compiler.dispatch import dispatch_kernels


def _k(name: str, params: str, body: str) -> str:
    return f"// Function: {name}\n__kernel void {name}({params}){{{body}}}\n"


_HEAD = "#define G0 (convert_int(get_group_id(0)))\n"
_SRC = (
    _HEAD
    + _k("k0", "__global float*restrict a,__global const float*restrict b", "a[G0]=b[G0];")
    + _k("k1", "__global int*restrict a", "a[G0]=1;")
    + _k("k2", "__global float*restrict a", "__local float s[4];s[0]=1.f;a[0]=s[0];")
    + _k("k3", "__global float*restrict a,int n", "a[n]=0.f;")
    + _k("k4", "__global float*restrict a", "a[0]=2.f;")
    + _k("k5", "__global float*restrict a", "a[1]=2.f;barrier(CLK_GLOBAL_MEM_FENCE);")
)


def _launch(kernel: str, *args: Any, local: tuple[int, ...] = (64,)) -> Launch:
    return Launch(kernel, tuple(args), (256,) * len(local), local, func=f"f_{kernel}")


def test_kernels_callable_from_a_dispatcher_share_one_per_work_group_size() -> None:
    b0, b1, b2 = BufferArg(0), BufferArg(1), BufferArg(2)
    launches = [
        _launch("k0", b0, b1),
        _launch("k1", b2),
        _launch("k2", b0),  # local memory: stays
        _launch("k3", b0, ScalarArg(3, "int")),  # a scalar parameter: stays
        _launch("k4", b1, local=(128,)),  # alone at its size: stays
        _launch("k5", b1),  # a barrier: stays
        _launch("k0", b2, b0),  # launched again, with other buffers
    ]
    src, out, variants = dispatch_kernels(_SRC, launches, [])
    assert variants == []
    assert [la.kernel for la in out] == ["d0", "d0", "k2", "k3", "k4", "k5", "d0"]
    # the case, the kernel's own arguments, then the launch's first buffer in unused slots
    assert out[0].args == (ScalarArg(0, "int"), b0, b1)
    assert out[1].args == (ScalarArg(1, "int"), b2, b2)
    assert out[6].args == (ScalarArg(0, "int"), b2, b0)
    assert [(la.global_size, la.local_size, la.func) for la in out] == [
        (la.global_size, la.local_size, la.func) for la in launches
    ]
    assert "static inline void k0(__global float*restrict a" in src
    assert "static inline void k1(" in src
    for stays in ("k2", "k3", "k4", "k5"):
        assert f"__kernel void {stays}(" in src
    assert (
        "// Function: d0\n__kernel void d0(int id,__global uchar*p0,__global uchar*p1)"
        "{switch(id){case 0:k0((__global float*)p0,(__global const float*)p1);break;"
        "case 1:k1((__global int*)p0);break;}}\n"
    ) in src
    assert src.startswith(_HEAD)


def test_variant_options_launch_through_the_dispatchers_and_names_stay_free() -> None:
    src = _SRC.replace("k4", "d0")  # a kernel already called d0: the dispatcher is d1
    b0 = BufferArg(0)
    launches = [_launch("k0", b0, b0)]
    v = Variant(0, 1, ((_launch("k1", b0),), (_launch("d0", b0),)), func="f")
    out_src, out, (var,) = dispatch_kernels(src, launches, [v])
    assert out[0].kernel == "d1"
    assert [la.kernel for o in var.options for la in o] == ["d1", "d1"]
    assert "case 2:d0((__global float*)p0);" in out_src
    assert (var.start, var.stop, var.func) == (0, 1, "f")


def test_nothing_to_group_leaves_the_program_as_it_is() -> None:
    b0 = BufferArg(0)
    launches = [_launch("k0", b0, b0), _launch("k1", b0, local=(32,))]
    assert dispatch_kernels(_SRC, launches, []) == (_SRC, launches, [])
    assert (
        dispatch_kernels("__kernel void k0(__global float*a){}", launches[:1], [])[1]
        == (launches[:1])
    )
    # a kernel launched at two work-group sizes stays itself
    two = [_launch("k0", b0, b0), _launch("k0", b0, b0, local=(32,)), _launch("k1", b0)]
    assert [la.kernel for la in dispatch_kernels(_SRC, two, [])[1]] == ["k0", "k0", "k1"]


def test_groups_are_cut_at_the_group_size() -> None:
    src = _HEAD + "".join(
        _k(f"k{i}", "__global float*restrict a", f"a[{i}]=1.f;") for i in range(5)
    )
    launches = [_launch(f"k{i}", BufferArg(0)) for i in range(5)]
    _, out, _ = dispatch_kernels(src, launches, [], group=2)
    assert [la.kernel for la in out] == ["d0", "d0", "d1", "d1", "k4"]


def test_groups_are_cut_at_the_stack_budget() -> None:
    """PoCL keeps a work-group's private arrays, every case's of a dispatcher together, on its
    worker thread's stack: a dispatcher holds at most `STACK_BUDGET` of them (here 64
    work-items: two kernels of half that a dispatcher), and a kernel over it alone
    stays a kernel of its own."""
    from litekiln.compiler.dispatch import STACK_BUDGET

    per_item = STACK_BUDGET // 64 // 2  # two fit a group of 64 work-items, three do not
    body = f"float c[{per_item // 4}];c[0]=1.f;a[0]=c[0];"
    src = _HEAD + "".join(_k(f"k{i}", "__global float*restrict a", body) for i in range(5))
    big = f"float c[{STACK_BUDGET // 64 // 4 + 1}];c[0]=1.f;a[0]=c[0];"
    src += _k("k5", "__global float*restrict a", big)
    launches = [_launch(f"k{i}", BufferArg(0)) for i in range(6)]
    _, out, _ = dispatch_kernels(src, launches, [])
    assert [la.kernel for la in out] == ["d0", "d0", "d1", "d1", "k4", "k5"]


# --------------------------------------------------------------------------- real kernels

cl = pytest.importorskip("pyopencl")
tvm = pytest.importorskip("tvm")
from tvm import relax  # noqa: E402

from litekiln.compiler.codegen import compile_relax_full  # noqa: E402
from litekiln.compiler.schedules import variant_rules  # noqa: E402
from litekiln.runtime.executor import PartitionExecutor  # noqa: E402


def _module() -> Any:
    """conv 3x3 + bias + relu, max pool, softmax over channels, a global mean, an
    elementwise chain and a 1x1 conv."""
    rng = np.random.default_rng(7)
    w = relax.const(rng.uniform(-1, 1, (16, 3, 3, 8)).astype(np.float32))
    w1 = relax.const(rng.uniform(-1, 1, (8, 1, 1, 16)).astype(np.float32))
    b = relax.const(rng.uniform(-1, 1, (16,)).astype(np.float32))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 18, 18, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(
                relax.op.nn.conv2d(x, w, padding=(1, 1), data_layout="NHWC", kernel_layout="OHWI")
            )
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, b)))
            y = bb.emit(relax.op.nn.max_pool2d(y, (2, 2), (2, 2), layout="NHWC"))
            s = bb.emit(relax.op.nn.softmax(y, axis=-1))
            m = bb.emit(relax.op.mean(y, axis=[1, 2], keepdims=False))
            t = bb.emit(relax.op.tanh(relax.op.multiply(s, y)))
            z = bb.emit(relax.op.nn.conv2d(t, w1, data_layout="NHWC", kernel_layout="OHWI"))
            out = bb.emit_output(relax.Tuple([s, m, z]))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("schedules", ["fast-cpu", "fast"])
def test_dispatched_program_gives_the_same_bits_on_pocl(
    schedules: str, cl_env: tuple[Any, Any]
) -> None:
    """With and without dispatchers, every option of every variant (the GPU rules' variants
    on ``fast``): the same outputs; ``fast-cpu`` dispatches by default, ``fast`` does not."""
    ctx, queue = cl_env
    kw: dict[str, Any] = {"schedules": schedules, "minify": True}
    if schedules == "fast":
        kw["variant_rules"] = variant_rules("gpu")
    default = compile_relax_full(_module(), **kw)
    plain = compile_relax_full(_module(), dispatch=False, **kw)
    disp = compile_relax_full(_module(), dispatch=True, **kw)
    assert (default.program.source == disp.program.source) == (schedules == "fast-cpu")
    p, d = plain.program, disp.program
    assert len(d.kernels) < len(p.kernels), (d.kernels, p.kernels)
    assert any(k.startswith("d") for k in d.kernels) and not d.ptx
    assert len(d.launches) == len(p.launches)
    x = np.random.default_rng(3).uniform(-1, 1, (1, 18, 18, 8)).astype(np.float32)
    ex_p = PartitionExecutor(p, plain.constants, ctx, queue)
    ex_d = PartitionExecutor(d, disp.constants, ctx, queue)
    plans = [[0] * len(p.variants)]
    for i, v in enumerate(p.variants):
        for c in range(1, len(v.options) + 1):
            plans.append([c if j == i else 0 for j in range(len(p.variants))])
    assert (len(plans) > 2) == (schedules == "fast")
    for choices in plans:
        ex_p.select(choices)
        ex_d.select(choices)
        outs_p, outs_d = ex_p(x), ex_d(x)
        assert len(outs_p) == 3
        for a, b in zip(outs_p, outs_d, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"choices {choices}")
    # and they compute: softmax rows sum to 1, the pooled mean is numpy's
    s, m, _ = ex_d(x)
    np.testing.assert_allclose(s.sum(-1), 1.0, rtol=1e-5)
    pooled = np.maximum(_conv_ref(x), 0).reshape(1, 9, 2, 9, 2, 16).max(axis=(2, 4))
    np.testing.assert_allclose(m, pooled.mean(axis=(1, 2)), rtol=1e-4, atol=1e-5)


def _conv_ref(x: np.ndarray) -> np.ndarray:
    """The module's 3x3 convolution plus bias, in numpy."""
    rng = np.random.default_rng(7)
    w = rng.uniform(-1, 1, (16, 3, 3, 8)).astype(np.float32)
    rng.uniform(-1, 1, (8, 1, 1, 16))  # (the 1x1 convolution's weights, drawn between)
    b = rng.uniform(-1, 1, (16,)).astype(np.float32)
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    out = np.zeros((1, 18, 18, 16), np.float32)
    for i in range(3):
        for j in range(3):
            out += np.einsum("nhwc,oc->nhwo", xp[:, i : i + 18, j : j + 18], w[:, i, j])
    return out + b
