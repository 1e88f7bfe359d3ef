"""litekiln's GPU schedules (`litekiln.compiler.schedules`) on PoCL, against numpy.

Each case builds the Relax a TFLite op lowers to (NHWC, OHWI weights, depthwise as a grouped
conv with ``(C*M)HW1`` weights, fused bias/activation/residual add), compiles it with
``schedules="fast"``, checks which rule scheduled each kernel (ours, not dlight's fallback),
that conv/pool kernels use no barriers (no cross-thread reduction), and compares with a float64
numpy reference.

Tolerance: 1e-5 relative to the output's range (rtol=1e-5, atol=1e-5 * max(1, max|ref|)): the
reference is float64; the kernels sum up to ~600 float32 products in another order, so an
output that cancels to near zero carries an absolute error of a few 1e-6 of the terms' scale
(measured up to 1.3e-5 on a 3x3x64 conv whose outputs reach 7); indexing, tiling or predicate
bugs give O(1) errors.  Whole models: the fast-scheduled GPU path against the numpy
reference executor with the same bound as `litekiln.check` uses for float models.

Needs an OpenCL device (PoCL in CI); skipped when pyopencl finds none.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

cl = pytest.importorskip("pyopencl")
tvm = pytest.importorskip("tvm")
from tvm import relax  # noqa: E402

from litekiln.compiler import schedules  # noqa: E402
from litekiln.compiler.codegen import compile_relax_full, schedule_named  # noqa: E402
from litekiln.compiler.schedules import describe_rules, fast_schedule  # noqa: E402
from litekiln.runtime.executor import PartitionExecutor  # noqa: E402

pytestmark = pytest.mark.opencl

RTOL = 1e-5
ATOL = 1e-5
RNG = np.random.default_rng(20261)


def _rand(*shape: int) -> np.ndarray:
    return RNG.uniform(-1.0, 1.0, size=shape).astype(np.float32)


def build_module(inputs: Sequence[tuple[str, Sequence[int]]], body: Callable[..., Any]) -> Any:
    """Module with `main(*inputs)` whose body is `body(bb, *vars)` (returns the result expr)."""
    bb = relax.BlockBuilder()
    params = [relax.Var(n, relax.TensorType(shape=tuple(s), dtype="float32")) for n, s in inputs]
    with bb.function("main", params):
        with bb.dataflow():
            gv = bb.emit_output(body(bb, *params))
        bb.emit_func_output(gv)
    return bb.get()


def rules_used(mod: Any, profile: str = "cpu", neighbours: bool = False) -> dict[str, str]:
    """PrimFunc name -> the rule of `fast_schedule(profile)` that schedules it (after FuseTIR;
    with ``neighbours``, after litekiln's `fuse_matmul_neighbours` too, as the compiler does)."""
    from litekiln.compiler.fusion import fuse_matmul_neighbours

    target = tvm.target.Target("opencl", host="llvm")
    seq = tvm.transform.Sequential(
        [
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            *([fuse_matmul_neighbours()] if neighbours else []),
            relax.transform.FuseTIR(),
        ]
    )
    with target:
        fused = seq(mod)
    return describe_rules(fused, target, profile)


_GUARD_BYTES = 4096


def run_guarded(cl_env: tuple[Any, Any], res: Any, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run the program with a canary zone after every storage; fail on any write past the end.

    Out-of-bounds stores (a tile or work-group tail without its predicate) often leave the
    outputs right and corrupt the heap later; the canaries catch them at the kernel.
    """
    ctx, queue = cl_env
    prog = res.program
    sizes = {s.id: s.nbytes for s in prog.storages}
    padded = dataclasses.replace(
        prog,
        storages=[dataclasses.replace(s, nbytes=s.nbytes + _GUARD_BYTES) for s in prog.storages],
    )
    ex = PartitionExecutor(padded, res.constants, ctx, queue)
    bufs = ex._storage_buffers  # noqa: SLF001 - the test reaches into the executor on purpose
    # A different NaN pattern per storage and word: a stray copy from one tail to another
    # (an out-of-bounds read feeding an out-of-bounds write) must not look untouched.
    canaries = {
        sid: (0x7FC00000 | ((sid << 12) + np.arange(_GUARD_BYTES // 4)) & 0x3FFFFF).astype(
            np.uint32
        )
        for sid in bufs
    }
    for sid, buf in bufs.items():
        cl.enqueue_copy(queue, buf, canaries[sid], dst_offset=sizes[sid])
    queue.finish()
    outs = ex(*args)
    for sid, buf in bufs.items():
        tail = np.empty_like(canaries[sid])
        cl.enqueue_copy(queue, tail, buf, src_offset=sizes[sid])
        queue.finish()
        assert (tail == canaries[sid]).all(), f"a kernel wrote past the end of storage {sid}"
    return outs


_SAME = "same"


@pytest.fixture(params=["gpu", "cpu"])
def profile(request: pytest.FixtureRequest) -> str:
    """Both schedule profiles: ``gpu`` (`LITEKILN_SCHEDULES=fast`) and ``cpu`` (``fast-cpu``)."""
    return str(request.param)


def check(
    cl_env: tuple[Any, Any],
    mod: Any,
    args: Sequence[np.ndarray],
    refs: Sequence[np.ndarray],
    profile: str = "cpu",
    rule: str | None = "SerialReduction",
    gpu_rule: str | None = _SAME,
    schedule: Any = None,
) -> Any:
    """Compile with the fast schedules, run on OpenCL, compare; check the rule and barriers.

    ``rule`` is the rule expected to schedule (one of) the kernels under the ``cpu`` profile,
    ``gpu_rule`` under ``gpu`` (default: the same); ``None``: dlight's rules, which may use
    barriers.  Our rules use none, but those that sum across threads.
    """
    expect = rule if profile == "cpu" or gpu_rule == _SAME else gpu_rule
    if expect is not None:
        used = rules_used(mod, profile)
        assert expect in used.values(), used
    res = compile_relax_full(mod, schedule=schedule or fast_schedule(profile))
    # These combine partial sums across threads (in local memory, behind barriers).
    across_threads = ("WindowReduction", "ColumnReduction", "RowReduction")
    if expect is not None and expect not in across_threads:
        assert "barrier(" not in res.program.source
    outs = run_guarded(cl_env, res, args)
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs, strict=True):
        assert o.shape == r.shape
        np.testing.assert_allclose(o, r, rtol=RTOL, atol=ATOL * max(1.0, float(np.abs(r).max())))
    return res


# --------------------------------------------------------------------------- numpy references


def same_pads(h: int, w: int, k: int, s: int, d: int = 1) -> tuple[int, int, int, int]:
    """TFLite SAME padding as (top, left, bottom, right)."""

    def one(n: int) -> tuple[int, int]:
        eff = (k - 1) * d + 1
        out = (n + s - 1) // s
        total = max((out - 1) * s + eff - n, 0)
        return total // 2, total - total // 2

    (t, b), (le, r) = one(h), one(w)
    return t, le, b, r


def conv_ref(
    x: np.ndarray,
    w: np.ndarray,
    stride: int = 1,
    pad: Sequence[int] = (0, 0, 0, 0),
    dilation: int = 1,
    groups: int = 1,
) -> np.ndarray:
    """NHWC conv, OHWI weights (grouped: O = groups * O/g, I = C/groups); float64."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    n, h, wd, c = x64.shape
    o, kh, kw, i = w64.shape
    pt, pl, pb, pr = pad
    xp = np.pad(x64, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    oh = (h + pt + pb - dilation * (kh - 1) - 1) // stride + 1
    ow = (wd + pl + pr - dilation * (kw - 1) - 1) // stride + 1
    og = o // groups
    out = np.zeros((n, oh, ow, o))
    for a in range(kh):
        for b in range(kw):
            ya, xb = a * dilation, b * dilation
            rows = slice(ya, ya + stride * (oh - 1) + 1, stride)
            cols = slice(xb, xb + stride * (ow - 1) + 1, stride)
            patch = xp[:, rows, cols]
            if groups == 1:
                out += np.einsum("nhwi,oi->nhwo", patch, w64[:, a, b, :])
            else:
                for g in range(groups):
                    out[..., g * og : (g + 1) * og] += np.einsum(
                        "nhwi,oi->nhwo",
                        patch[..., g * i : (g + 1) * i],
                        w64[g * og : (g + 1) * og, a, b, :],
                    )
    return out


def pool_ref(x: np.ndarray, k: int, s: int, pad: Sequence[int], mode: str) -> np.ndarray:
    """NHWC pooling; average excludes padding (TFLite)."""
    x64 = x.astype(np.float64)
    n, h, w, c = x64.shape
    pt, pl, pb, pr = pad
    fill = -np.inf if mode == "max" else 0.0
    xp = np.pad(x64, ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=fill)
    ones = np.pad(np.ones((1, h, w, 1)), ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    oh, ow = (h + pt + pb - k) // s + 1, (w + pl + pr - k) // s + 1
    out = np.empty((n, oh, ow, c))
    for a in range(oh):
        for b in range(ow):
            win = xp[:, a * s : a * s + k, b * s : b * s + k, :]
            cnt = ones[:, a * s : a * s + k, b * s : b * s + k, :].sum()
            out[:, a, b, :] = win.max(axis=(1, 2)) if mode == "max" else win.sum(axis=(1, 2)) / cnt
    return out


def _conv_module(
    x_shape: Sequence[int],
    w: np.ndarray,
    stride: int,
    pads: Sequence[int],
    dilation: int = 1,
    groups: int = 1,
    bias: np.ndarray | None = None,
    act: str = "",
    residual: Sequence[int] | None = None,
) -> Any:
    inputs = [("x", x_shape)] + ([("r", residual)] if residual is not None else [])

    def body(bb: Any, xv: Any, *rest: Any) -> Any:
        y = bb.emit(
            relax.op.nn.conv2d(
                xv,
                relax.const(w),
                strides=(stride, stride),
                padding=list(pads),
                dilation=(dilation, dilation),
                groups=groups,
                data_layout="NHWC",
                kernel_layout="OHWI",
            )
        )
        if bias is not None:
            y = bb.emit(relax.op.add(y, relax.const(bias)))
        if act == "relu":
            y = bb.emit(relax.op.nn.relu(y))
        elif act == "relu6":
            y = bb.emit(relax.op.clip(y, 0.0, 6.0))
        if rest:
            y = bb.emit(relax.op.add(y, rest[0]))
        return y

    return build_module(inputs, body)


# --------------------------------------------------------------------------- convolutions


def test_conv1x1_56x56x64_to_128_bias(cl_env: Any, profile: str) -> None:
    x, w, b = _rand(1, 56, 56, 64), _rand(128, 1, 1, 64), _rand(128)
    ref = conv_ref(x, w) + b
    check(
        cl_env,
        _conv_module(x.shape, w, 1, (0, 0, 0, 0), bias=b),
        [x],
        [ref],
        profile=profile,
        gpu_rule=None,
    )


def test_conv3x3_stride2_same_relu(cl_env: Any, profile: str) -> None:
    # SAME with stride 2 on an even size pads (0, 1): asymmetric, fused into the conv.
    x, w, b = _rand(1, 56, 56, 32), _rand(64, 3, 3, 32), _rand(64)
    pads = same_pads(56, 56, 3, 2)
    ref = np.maximum(conv_ref(x, w, stride=2, pad=pads) + b, 0)
    check(
        cl_env,
        _conv_module(x.shape, w, 2, pads, bias=b, act="relu"),
        [x],
        [ref],
        profile=profile,
        gpu_rule=None,
    )


def test_conv3x3_stride2_rgb_input_odd_channels(cl_env: Any, profile: str) -> None:
    # First layer of MediaPipe detectors: 3 input channels; 6 output channels (fv = 2).
    x, w, b = _rand(1, 64, 64, 3), _rand(6, 3, 3, 3), _rand(6)
    pads = same_pads(64, 64, 3, 2)
    ref = conv_ref(x, w, stride=2, pad=pads) + b
    check(cl_env, _conv_module(x.shape, w, 2, pads, bias=b), [x], [ref], profile=profile)


def test_conv5x5_same_odd_output_channels(cl_env: Any, profile: str) -> None:
    x, w = _rand(1, 15, 17, 8), _rand(5, 5, 5, 8)
    pads = same_pads(15, 17, 5, 1)
    check(
        cl_env,
        _conv_module(x.shape, w, 1, pads),
        [x],
        [conv_ref(x, w, pad=pads)],
        profile=profile,
        gpu_rule=None,
    )


def test_conv3x3_dilated_rate6(cl_env: Any, profile: str) -> None:
    # DeepLab-style atrous conv: rate 6, SAME padding 6 on each side.
    x, w, b = _rand(1, 33, 33, 32), _rand(32, 3, 3, 32), _rand(32)
    pads = same_pads(33, 33, 3, 1, 6)
    ref = conv_ref(x, w, pad=pads, dilation=6) + b
    check(
        cl_env,
        _conv_module(x.shape, w, 1, pads, dilation=6, bias=b),
        [x],
        [ref],
        profile=profile,
        gpu_rule=None,
    )


def test_conv_bias_relu6_residual_add(cl_env: Any, profile: str) -> None:
    x, w, b, r = _rand(1, 28, 28, 64), _rand(64, 3, 3, 64), _rand(64), _rand(1, 28, 28, 64)
    pads = same_pads(28, 28, 3, 1)
    ref = np.clip(conv_ref(x, w, pad=pads) + b, 0, 6) + r
    mod = _conv_module(x.shape, w, 1, pads, bias=b, act="relu6", residual=r.shape)
    check(cl_env, mod, [x, r], [ref], profile=profile, gpu_rule=None)


@pytest.mark.parametrize("min_work_items", [0, 1 << 30])
def test_conv1x1_7x7_pixel_tile_tail(cl_env: Any, min_work_items: int) -> None:
    # Late MobileNet layer: many channels, few pixels.  min_work_items=0 takes the largest
    # tile (8 channels x 4 pixels: 7 is not a multiple of 4, the tail is predicated); a huge
    # one the smallest (4 x 1).
    x, w, b = _rand(1, 7, 7, 256), _rand(256, 1, 1, 256) * 0.1, _rand(256)
    ref = np.clip(conv_ref(x, w) + b, 0, 6)
    mod = _conv_module(x.shape, w, 1, (0, 0, 0, 0), bias=b, act="relu6")
    check(cl_env, mod, [x], [ref], schedule=fast_schedule("cpu", min_work_items=min_work_items))


def _fused_prim_funcs(mod: Any) -> dict[str, Any]:
    target = tvm.target.Target("opencl", host="llvm")
    seq = tvm.transform.Sequential(
        [
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
        ]
    )
    with target:
        fused = seq(mod)
    return {
        gv.name_hint: f for gv, f in fused.functions.items() if isinstance(f, tvm.tirx.PrimFunc)
    }


def test_few_outputs_reduction_variant(cl_env: Any) -> None:
    # hand_landmark_lite's late projection: 7x7x672 -> 112, bias, residual add (5488 outputs
    # of 672 terms): one work-group per output. MobileNet-sized outputs are declined.
    from tvm.s_tir import dlight as dl

    from litekiln.compiler.schedules import FewOutputsReduction

    target = tvm.target.Target("opencl", host="llvm")
    x, w, b, r = _rand(1, 7, 7, 672), _rand(112, 1, 1, 672) * 0.1, _rand(112), _rand(1, 7, 7, 112)
    mod = _conv_module(x.shape, w, 1, (0, 0, 0, 0), bias=b, residual=r.shape)
    convs = [f for n, f in _fused_prim_funcs(mod).items() if "conv2d" in n]
    assert len(convs) == 1
    with target:
        assert FewOutputsReduction().apply(convs[0], target, False) is not None
    big = _conv_module((1, 56, 56, 64), _rand(128, 1, 1, 64), 1, (0, 0, 0, 0))
    (big_conv,) = [f for n, f in _fused_prim_funcs(big).items() if "conv2d" in n]
    with target:
        assert FewOutputsReduction().apply(big_conv, target, False) is None  # 401K outputs
    ref = conv_ref(x, w) + b + r
    res = check(
        cl_env,
        mod,
        [x, r],
        [ref],
        rule=None,
        schedule=dl.ApplyDefaultSchedule(FewOutputsReduction(), dl.gpu.Fallback()),
    )
    assert "barrier(" in res.program.source  # the threads of a group share each sum


@pytest.mark.parametrize(
    "x_shape,w_shape,stride,few",
    [
        # mp_hand_recrop's late convolutions: 2x2/2 of 32 channels to 8 (32 outputs of 128
        # terms), a 1x1 projection to 16 channels of 2x2 pixels (64 outputs of 128 terms)
        ((1, 4, 4, 32), (8, 2, 2, 32), 2, True),
        ((1, 2, 2, 128), (16, 1, 1, 128), 1, True),
        # 512 outputs: left to the other rules
        ((1, 4, 4, 16), (32, 1, 1, 16), 1, False),
    ],
)
def test_few_outputs_of_a_long_sum_take_a_group_each_on_gpus(
    cl_env: Any, x_shape: tuple[int, ...], w_shape: tuple[int, ...], stride: int, few: bool
) -> None:
    """The ``gpu`` profile gives a convolution of at most 256 outputs over 64 terms or more
    one work-group per output (`FewOutputsReduction`): dlight's 32x32 tile made one group
    walk the terms in 16 barrier-separated steps (21 us for 32 outputs on the H200; the
    model 0.201 -> 0.181 ms). Checked against numpy on PoCL. (dlight's cross-thread rule
    takes a convolution with an epilogue, here its bias; a bare one stays with its Matmul.)"""
    x, w, b = _rand(*x_shape), _rand(*w_shape) * 0.1, _rand(w_shape[0])
    mod = _conv_module(x.shape, w, stride, (0, 0, 0, 0), bias=b)
    used = set(rules_used(mod, "gpu").values())
    assert ("FewOutputsReduction" in used) == few, used
    check(cl_env, mod, [x], [conv_ref(x, w, stride) + b], profile="gpu", rule=None)


@pytest.mark.parametrize(
    "x_shape,w_shape,stride,residual",
    [
        ((1, 7, 7, 672), (112, 1, 1, 672), 1, True),  # hand_landmark_lite's late projection
        ((1, 9, 9, 1024), (17, 1, 1, 1024), 1, False),  # posenet's heatmap head: 17 channels
        ((1, 5, 5, 128), (256, 3, 3, 128), 2, False),  # an SSD extra layer: 1152 terms
    ],
)
def test_long_reduction_few_outputs_serial_on_cpu(
    cl_env: Any,
    profile: str,
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    stride: int,
    residual: bool,
) -> None:
    # More than 512 terms for fewer than 16 outputs per term: the GPU profile leaves these to
    # dlight (Matmul, with barriers); the CPU profile keeps them serial (5-17x faster on PoCL).
    x, w, b = _rand(*x_shape), _rand(*w_shape) * 0.1, _rand(w_shape[0])
    pads = same_pads(x_shape[1], x_shape[2], w_shape[1], stride)
    ref = conv_ref(x, w, stride=stride, pad=pads) + b
    r_shape = ref.shape if residual else None
    mod = _conv_module(x.shape, w, stride, pads, bias=b, residual=r_shape)
    args = [x]
    if residual:
        r = _rand(*ref.shape)
        args.append(r)
        ref = ref + r
    check(cl_env, mod, args, [ref], profile=profile, gpu_rule=None)


def test_one_pixel_classifier_stays_with_dlight_on_cpu(cl_env: Any) -> None:
    # MobileNet's 1x1 conv classifier (1024 -> 1001 on one pixel): dlight's GEMV reads the
    # weights along the reduction across threads; serial rows were 1.3-1.5x slower on PoCL.
    x, w, b = _rand(1, 1, 1, 1024), _rand(1001, 1, 1, 1024) * 0.05, _rand(1001)
    mod = _conv_module(x.shape, w, 1, (0, 0, 0, 0), bias=b)
    assert "SerialReduction" not in rules_used(mod, "cpu").values()
    check(cl_env, mod, [x], [conv_ref(x, w) + b], rule=None)


@pytest.mark.parametrize("pixels", [4, 1])
@pytest.mark.parametrize("k,stride,dilation", [(3, 2, 1), (5, 1, 1), (3, 1, 2)])
def test_conv_large_tiles_odd_sizes(
    cl_env: Any, k: int, stride: int, dilation: int, pixels: int
) -> None:
    # Largest tiles on sizes that none of them divide (13 wide, 12 output channels: fv = 4),
    # with 4 pixels per work-item (the tail predicated) and with the CPU profile's one pixel
    # under a kernel window.
    from tvm.s_tir import dlight as dl

    from litekiln.compiler.schedules import SerialReduction

    x, w, b = _rand(1, 13, 13, 8), _rand(12, k, k, 8), _rand(12)
    pads = same_pads(13, 13, k, stride, dilation)
    ref = np.maximum(conv_ref(x, w, stride=stride, pad=pads, dilation=dilation) + b, 0)
    mod = _conv_module(x.shape, w, stride, pads, dilation=dilation, bias=b, act="relu")
    rule = SerialReduction(min_work_items=0, window_tiles=((8, pixels),))
    res = check(cl_env, mod, [x], [ref], schedule=dl.ApplyDefaultSchedule(rule, dl.gpu.Fallback()))
    assert f"conv2d_nhwc_intermediate_local_ptr[{4 * pixels}]" in res.program.source


def test_cpu_profile_one_pixel_per_work_item_under_a_window(cl_env: Any) -> None:
    # 3x3 conv over channels: 8 channels x 1 pixel per work-item (2.2x faster on PoCL than
    # 8 x 4); a 1x1 conv keeps 8 x 4.
    x, w3, w1 = _rand(1, 20, 20, 16), _rand(16, 3, 3, 16), _rand(16, 1, 1, 16)
    pads = same_pads(20, 20, 3, 1)
    res = check(cl_env, _conv_module(x.shape, w3, 1, pads), [x], [conv_ref(x, w3, pad=pads)])
    assert "local_ptr[8];" in res.program.source
    res = check(cl_env, _conv_module(x.shape, w1, 1, (0, 0, 0, 0)), [x], [conv_ref(x, w1)])
    assert "local_ptr[32];" in res.program.source


# --------------------------------------------------------------------------- depthwise


@pytest.mark.parametrize("cin", [4, 12, 16])
def test_cpu_profile_keeps_a_short_channel_loop(cl_env: Any, cin: int) -> None:
    # A 1x1 conv over at most 16 channels: the GPU rules unroll the channel loop, the CPU
    # profile keeps it a loop (1.3-6x faster on PoCL).
    from tvm.s_tir import dlight as dl

    from litekiln.compiler.schedules import SerialReduction

    x, w, b = _rand(1, 24, 20, cin), _rand(32, 1, 1, cin), _rand(32)
    mod = _conv_module(x.shape, w, 1, (0, 0, 0, 0), bias=b, act="relu6")
    ref = np.clip(conv_ref(x, w) + b, 0, 6)
    cpu = check(cl_env, mod, [x], [ref])
    unrolled = check(
        cl_env,
        mod,
        [x],
        [ref],
        schedule=dl.ApplyDefaultSchedule(SerialReduction(min_work_items=0), dl.gpu.Fallback()),
    )
    assert cpu.program.source.count("for (") == unrolled.program.source.count("for (") + 1


@pytest.mark.parametrize("op", ["conv", "depthwise", "max_pool"])
def test_cpu_profile_pads_in_a_kernel_of_its_own(cl_env: Any, op: str) -> None:
    # A padded convolution becomes two kernels under the CPU profile: the padding copy (one
    # work-item per padded pixel) and the convolution, which then tests no tap against the
    # border. Pooling keeps its padding inline (one kernel).
    x = _rand(1, 15, 17, 8)
    pads = same_pads(15, 17, 3, 2)
    w = _rand(8, 3, 3, 1) if op == "depthwise" else _rand(12, 3, 3, 8)
    groups = 8 if op == "depthwise" else 1

    def body(bb: Any, xv: Any) -> Any:
        if op == "max_pool":
            return relax.op.nn.max_pool2d(xv, 3, 2, padding=list(pads), layout="NHWC")
        return relax.op.nn.conv2d(
            xv,
            relax.const(w),
            strides=(2, 2),
            padding=list(pads),
            groups=groups,
            data_layout="NHWC",
            kernel_layout="OHWI",
        )

    if op == "max_pool":
        ref = pool_ref(x, 3, 2, pads, "max")
    else:
        ref = conv_ref(x, w, stride=2, pad=pads, groups=groups)
    res = check(cl_env, build_module([("x", x.shape)], body), [x], [ref])
    assert len(res.program.launches) == (1 if op == "max_pool" else 2)
    if op != "max_pool":
        conv = res.program.source.split("__kernel void")[-1]  # the last kernel: the conv
        assert "condval" not in conv and "?" not in conv


@pytest.mark.parametrize("k,stride", [(5, 1), (3, 2), (3, 1)])
def test_depthwise_bias_relu(cl_env: Any, profile: str, k: int, stride: int) -> None:
    c = 96
    x, w, b = _rand(1, 28, 28, c), _rand(c, k, k, 1), _rand(c)
    pads = same_pads(28, 28, k, stride)
    ref = np.maximum(conv_ref(x, w, stride=stride, pad=pads, groups=c) + b, 0)
    mod = _conv_module(x.shape, w, stride, pads, groups=c, bias=b, act="relu")
    check(cl_env, mod, [x], [ref], profile=profile)


@pytest.mark.parametrize(
    ("shape", "min_work_items", "tile"),
    [
        ((56, 56, 40), 132 * 128, (4, 1)),  # 31,360 work-items of 4 channels: enough
        ((7, 7, 960), 132 * 128, (2, 1)),  # 4 channels: 11,760, 2: 23,520
        ((14, 14, 160), 132 * 128, (1, 1)),  # ConvNeXt's 7x7 depthwise: 7,840 at 4
        ((14, 14, 160), 0, (4, 1)),  # the CPU profile: the largest tile
        ((14, 14, 6), 132 * 128, (1, 1)),
        ((14, 14, 6), 0, (2, 1)),  # 4 does not divide 6
    ],
)
def test_window_only_tile_falls_to_fewer_channels_for_work_items(
    shape: tuple[int, int, int], min_work_items: int, tile: tuple[int, int]
) -> None:
    from litekiln.compiler.schedules import SerialReduction

    rule = SerialReduction(min_work_items=min_work_items)
    h, w, c = shape
    assert rule._tile(c, w, h * w * c, channel_reduction=False, window=True) == tile


@pytest.mark.parametrize("window,stride", [(7, 1), (3, 2)])
@pytest.mark.parametrize("tiles", [((4, 1),), ((2, 1),), ((1, 1),), ((2, 2),)])
def test_depthwise_each_window_only_tile(cl_env: Any, tiles: Any, window: int, stride: int) -> None:
    """Each tile the GPU profile's default or its tuning variants give a depthwise
    convolution (channels x pixels per work-item; the H200 chose 1 and 2 channels, and 2x2
    on the largest maps: docs/benchmarks.md, eighteenth session), on a 7x7 window and a
    strided 3x3 one (an odd width: the last tile's second pixel is predicated off)."""
    from tvm.s_tir import dlight as dl

    from litekiln.compiler.schedules import SerialReduction

    c = 20
    x, w, b = _rand(1, 13, 13, c), _rand(c, window, window, 1), _rand(c)
    pads = same_pads(13, 13, window, stride)
    ref = conv_ref(x, w, stride=stride, pad=pads, groups=c) + b
    mod = _conv_module(x.shape, w, stride, pads, groups=c, bias=b)
    rule = SerialReduction(min_work_items=0, window_only_tiles=tiles)
    res = check(cl_env, mod, [x], [ref], schedule=dl.ApplyDefaultSchedule(rule, dl.gpu.Fallback()))
    channels, pixels = tiles[0]
    assert f"local_ptr[{channels * pixels}]" in res.program.source


def test_depthwise_multiplier2_odd_channels(cl_env: Any, profile: str) -> None:
    # Depth multiplier 2 on 3 channels: grouped conv with 6 outputs, 1 input each.
    x, w = _rand(1, 16, 16, 3), _rand(6, 3, 3, 1)
    pads = same_pads(16, 16, 3, 1)
    ref = conv_ref(x, w, pad=pads, groups=3)
    check(cl_env, _conv_module(x.shape, w, 1, pads, groups=3), [x], [ref], profile=profile)


# --------------------------------------------------------------------------- pooling


@pytest.mark.parametrize(
    "shape,k,s,same",
    [
        ((1, 56, 56, 64), 2, 2, False),
        ((1, 15, 15, 24), 3, 1, True),
        ((1, 28, 28, 6), 3, 2, True),
        ((1, 9, 9, 6), 2, 2, False),  # 48 work-items in a 64-wide group: the tail is masked
    ],
)
def test_max_pool(
    cl_env: Any, profile: str, shape: tuple[int, ...], k: int, s: int, same: bool
) -> None:
    x = _rand(*shape)
    pads = same_pads(shape[1], shape[2], k, s) if same else (0, 0, 0, 0)

    def body(bb: Any, xv: Any) -> Any:
        return relax.op.nn.max_pool2d(xv, pool_size=k, strides=s, padding=list(pads), layout="NHWC")

    ref = pool_ref(x, k, s, pads, "max")
    check(cl_env, build_module([("x", shape)], body), [x], [ref], profile=profile)


@pytest.mark.parametrize(
    "shape,k,s,same,gpu_rule",
    [
        # MobileNet's global pool: threads along channels and slices of the map on a GPU
        ((1, 7, 7, 1024), 7, 1, False, "ColumnReduction"),
        ((1, 16, 16, 12), 3, 1, True, "SerialReduction"),
    ],
)
def test_avg_pool(
    cl_env: Any, profile: str, shape: tuple[int, ...], k: int, s: int, same: bool, gpu_rule: str
) -> None:
    x = _rand(*shape)
    pads = same_pads(shape[1], shape[2], k, s) if same else (0, 0, 0, 0)

    def body(bb: Any, xv: Any) -> Any:
        return relax.op.nn.avg_pool2d(
            xv, pool_size=k, strides=s, padding=list(pads), layout="NHWC", count_include_pad=False
        )

    ref = pool_ref(x, k, s, pads, "avg")
    mod = build_module([("x", shape)], body)
    check(cl_env, mod, [x], [ref], profile=profile, gpu_rule=gpu_rule)


# --------------------------------------------------------------------------- injective


def test_pad_add_broadcast(cl_env: Any, profile: str) -> None:
    a, b = _rand(1, 20, 20, 16), _rand(1, 1, 1, 16)

    def body(bb: Any, av: Any, bv: Any) -> Any:
        p = bb.emit(relax.op.nn.pad(av, [0, 0, 1, 2, 0, 1, 0, 0], "constant", 0.0))
        return relax.op.add(p, bv)

    ref = np.pad(a, ((0, 0), (1, 2), (0, 1), (0, 0))) + b
    mod = build_module([("a", a.shape), ("b", b.shape)], body)
    res = check(cl_env, mod, [a, b], [ref], rule="Injective", profile=profile, gpu_rule=None)
    # Padding is an if_then_else: one element per work-item, not a scalarised 4-loop.
    assert "for (" not in res.program.source


def test_add_odd_channels_scalar(cl_env: Any, profile: str) -> None:
    a, b = _rand(1, 9, 9, 3), _rand(1, 9, 9, 3)

    def body(bb: Any, av: Any, bv: Any) -> Any:
        return relax.op.nn.relu(relax.op.add(av, bv))

    ref = np.maximum(a.astype(np.float64) + b, 0)
    mod = build_module([("a", a.shape), ("b", b.shape)], body)
    check(cl_env, mod, [a, b], [ref], rule="Injective", profile=profile, gpu_rule=None)


@pytest.mark.parametrize("half_pixel", [True, False])
def test_resize_bilinear(cl_env: Any, profile: str, half_pixel: bool) -> None:
    x = _rand(1, 8, 8, 32)
    mode = "half_pixel" if half_pixel else "asymmetric"

    def body(bb: Any, xv: Any) -> Any:
        return relax.op.image.resize2d(
            xv, (16, 16), layout="NHWC", method="linear", coordinate_transformation_mode=mode
        )

    mod = build_module([("x", x.shape)], body)
    res_fast = compile_relax_full(mod, schedule=fast_schedule(profile))
    ctx, queue = cl_env
    out = run_guarded(cl_env, res_fast, [x])[0]
    # Same kernels under the default schedules are the oracle here (test_codegen checks those
    # against numpy): the schedule must not change a single value.
    res_def = compile_relax_full(build_module([("x", x.shape)], body), schedules="default")
    want = PartitionExecutor(res_def.program, res_def.constants, ctx, queue)(x)[0]
    np.testing.assert_allclose(out, want, rtol=RTOL, atol=ATOL)
    if profile == "cpu":
        assert "Injective" in rules_used(build_module([("x", x.shape)], body), profile).values()


def test_concat_channels(cl_env: Any, profile: str) -> None:
    a, b, c = _rand(1, 8, 8, 4), _rand(1, 8, 8, 8), _rand(1, 8, 8, 3)

    def body(bb: Any, av: Any, bv: Any, cv: Any) -> Any:
        return relax.op.concat([av, bv, cv], axis=3)

    mod = build_module([("a", a.shape), ("b", b.shape), ("c", c.shape)], body)
    check(
        cl_env,
        mod,
        [a, b, c],
        [np.concatenate([a, b, c], axis=3)],
        rule="Injective",
        profile=profile,
        gpu_rule=None,
    )


def test_reshape_transpose_copy(cl_env: Any, profile: str) -> None:
    x = _rand(1, 4, 6, 8)

    def body(bb: Any, xv: Any) -> Any:
        r = bb.emit(relax.op.reshape(xv, (1, 24, 8)))
        return relax.op.permute_dims(r, [0, 2, 1])

    ref = x.reshape(1, 24, 8).transpose(0, 2, 1)
    check(
        cl_env,
        build_module([("x", x.shape)], body),
        [x],
        [ref],
        rule="Injective",
        profile=profile,
        gpu_rule=None,
    )


# --------------------------------------------------------------------------- row reductions


def softmax_ref(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize(
    "shape",
    [
        (1, 32, 32, 8),  # a segmentation head's softmax over channels (one row per pixel)
        (1, 13, 17, 21),  # 221 rows: the last work-group's tail is masked
        (1, 1001),  # a classifier: one row, a long serial loop
        (2, 3),
    ],
)
def test_softmax_serial_rows(cl_env: Any, profile: str, shape: tuple[int, ...]) -> None:
    x = _rand(*shape) * 8.0  # logits spread enough that the max matters

    def body(bb: Any, xv: Any) -> Any:
        return relax.op.nn.softmax(xv, axis=-1)

    check(
        cl_env,
        build_module([("x", shape)], body),
        [x],
        [softmax_ref(x)],
        profile=profile,
        rule="SerialRows",
        # (on GPUs short rows only: a classifier's 1001 classes stay with dlight's threads)
        gpu_rule="SerialRows" if shape[-1] <= schedules.GPU_ROW_TERMS else None,
    )


def test_softmax_after_conv_serial_rows(cl_env: Any) -> None:
    # The U-Net head: a 1x1 conv to 8 classes (its own kernel), then the softmax.
    x, w, b = _rand(1, 24, 24, 16), _rand(8, 1, 1, 16), _rand(8)

    def body(bb: Any, xv: Any) -> Any:
        y = bb.emit(
            relax.op.nn.conv2d(xv, relax.const(w), data_layout="NHWC", kernel_layout="OHWI")
        )
        return relax.op.nn.softmax(bb.emit(relax.op.add(y, relax.const(b))), axis=-1)

    mod = build_module([("x", x.shape)], body)
    res = check(cl_env, mod, [x], [softmax_ref(conv_ref(x, w) + b)], rule="SerialRows")
    assert "barrier(" not in res.program.source


def test_dense_falls_back_to_dlight(cl_env: Any, profile: str) -> None:
    # A 1024 -> 100 classifier is a long reduction with few outputs: dlight's rules keep it.
    x, w = _rand(1, 1024), _rand(100, 1024) * 0.05

    def body(bb: Any, xv: Any) -> Any:
        return relax.op.matmul(xv, relax.op.permute_dims(relax.const(w), [1, 0]))

    mod = build_module([("x", x.shape)], body)
    assert "SerialReduction" not in rules_used(mod).values()
    check(cl_env, mod, [x], [x.astype(np.float64) @ w.T], rule=None, profile=profile)


def test_schedule_named() -> None:
    assert schedule_named("fast") is not None and schedule_named("default") is not None
    assert schedule_named("fast-cpu") is not None
    with pytest.raises(ValueError):
        schedule_named("bogus")


# --------------------------------------------------------------------------- whole models


@pytest.mark.slow
@pytest.mark.zoo
@pytest.mark.parametrize("schedules", ["fast", "fast-cpu"])
@pytest.mark.parametrize("name", ["face_detection_short_range", "mobilenet_v1"])
def test_model_fast_matches_reference(
    name: str, schedules: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conftest import zoo_model

    import litekiln

    path = zoo_model(name)
    monkeypatch.setenv("LITEKILN_SCHEDULES", schedules)
    gpu = litekiln.Interpreter(path, use_cache=False)
    ref = litekiln.Interpreter(path, device="reference")
    inputs = gpu.random_inputs(seed=0)
    got, want = gpu.run(inputs), ref.run(inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        # float32 models: accumulated rounding over ~30 layers; 1e-4 of the output's range.
        w64 = np.asarray(w, np.float64)
        scale = max(float(np.abs(w64).max()), 1e-6)
        np.testing.assert_allclose(np.asarray(g, np.float64), w64, rtol=0, atol=1e-4 * scale)


def test_elementwise_vectorised(cl_env: Any, profile: str) -> None:
    a, b = _rand(1, 20, 20, 16), _rand(1, 20, 20, 16)

    def body(bb: Any, av: Any, bv: Any) -> Any:
        return relax.op.clip(relax.op.add(av, bv), 0.0, 6.0)

    ref = np.clip(a.astype(np.float64) + b, 0, 6)
    mod = build_module([("a", a.shape), ("b", b.shape)], body)
    res = check(cl_env, mod, [a, b], [ref], rule="Injective", profile=profile, gpu_rule=None)
    assert ("vstore4" in res.program.source) == (profile == "cpu")


@pytest.mark.parametrize("shortcut", ["pad", "maxpool_pad", "plain"])
def test_blazeblock_epilogue(cl_env: Any, profile: str, shortcut: str) -> None:
    """BlazeFace's block: 1x1 conv + bias, plus the block input (max-pooled and zero-padded
    along channels when the block widens), then ReLU, all fused into the conv's kernel."""
    x, w, b = _rand(1, 16, 16, 24), _rand(28, 1, 1, 24), _rand(28)
    s = {
        "pad": _rand(1, 16, 16, 24),
        "maxpool_pad": _rand(1, 32, 32, 24),
        "plain": _rand(1, 16, 16, 28),
    }[shortcut]

    def body(bb: Any, xv: Any, sv: Any) -> Any:
        y = bb.emit(
            relax.op.nn.conv2d(xv, relax.const(w), data_layout="NHWC", kernel_layout="OHWI")
        )
        y = bb.emit(relax.op.add(y, relax.const(b)))
        r = sv
        if shortcut == "maxpool_pad":  # the pool's kernel gets the pad as its epilogue
            r = bb.emit(relax.op.nn.max_pool2d(r, (2, 2), (2, 2), layout="NHWC"))
        if shortcut != "plain":
            r = bb.emit(relax.op.nn.pad(r, [0, 0, 0, 0, 0, 0, 0, 4], "constant", 0.0))
        return bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(r, y))))

    mod = build_module([("x", x.shape), ("s", s.shape)], body)
    sp = pool_ref(s, 2, 2, (0, 0, 0, 0), "max") if shortcut == "maxpool_pad" else s
    sp = sp if shortcut == "plain" else np.pad(sp, ((0, 0), (0, 0), (0, 0), (0, 4)))
    ref = np.maximum(conv_ref(x, w) + b + sp, 0)
    check(cl_env, mod, [x, s], [ref], profile=profile, rule=None)


@pytest.mark.parametrize(
    "shape,mode",
    [
        ((1, 128, 128, 16), "avg"),  # selfie's squeeze-and-excite pools
        ((1, 16, 16, 96), "avg"),  # 256 terms: SerialReduction's on a CPU, ours on a GPU
        ((1, 64, 64, 16), "avg"),
        ((2, 33, 33, 40), "avg"),  # window not a power of two: the slices' tail is predicated
        ((1, 33, 33, 40), "avg"),
        ((2, 32, 32, 40), "avg"),
        ((1, 48, 40, 600), "max"),  # more channels than one group's threads take
    ],
)
def test_global_pool_window_reduction(
    cl_env: Any, profile: str, shape: tuple[int, ...], mode: str
) -> None:
    x = _rand(*shape)
    k = (shape[1], shape[2])

    def body(bb: Any, xv: Any) -> Any:
        if mode == "max":
            return relax.op.nn.max_pool2d(xv, pool_size=k, strides=k, layout="NHWC")
        return relax.op.nn.avg_pool2d(xv, pool_size=k, strides=k, layout="NHWC")

    ref = (x.max if mode == "max" else x.mean)(axis=(1, 2), keepdims=True)
    # On a CPU one serial work-item per 4 channels (3x faster than dlight's cross-thread
    # reduction on PoCL for selfie's pools).
    res = check(
        cl_env,
        build_module([("x", shape)], body),
        [x],
        [ref],
        profile=profile,
        rule="SerialReduction",
        gpu_rule="WindowReduction",
    )
    if profile == "gpu":
        assert "barrier(" in res.program.source  # the cross-thread sum


# ------------------------------------------------- reductions read whole (pools, norms, GEMV)

#: `ColumnReduction` configurations: the gpu profile's default and its tuning variants.
COLUMN_RULES = {"16x16": {}, "32x8": {"channels": 32}, "8x32": {"channels": 8}}
#: `RowReduction` configurations: the gpu profile's default and its tuning variants.
ROW_RULES = {
    "32 lanes": {},
    "serial": {"lanes": 1},
    "8 lanes": {"lanes": 8},
    "32 lanes, long rows": {"max_terms": None},
    "group per row": {"lanes": 256, "min_terms": 4, "max_terms": None},
}


def _applies(mod: Any, rule: Any) -> list[str]:
    """Names of the fused PrimFuncs of ``mod`` that ``rule`` schedules."""
    target = tvm.target.Target("opencl", host="llvm")
    with target:
        return [n for n, f in _fused_prim_funcs(mod).items() if rule.apply(f, target, False)]


def _check_rule(cl_env: Any, mod: Any, args: Any, ref: np.ndarray, rule: Any) -> Any:
    """``rule`` alone (dlight's Fallback for what it declines) against the numpy ``ref``."""
    from tvm.s_tir import dlight as dl

    assert _applies(mod, rule), "the rule must schedule the reduction"
    return check(
        cl_env,
        mod,
        args,
        [ref],
        rule=None,
        schedule=dl.ApplyDefaultSchedule(rule, dl.gpu.Fallback()),
    )


def _mean_module(shape: Sequence[int], axes: Sequence[int], epilogue: str = "") -> Any:
    def body(bb: Any, xv: Any) -> Any:
        y = bb.emit(relax.op.mean(xv, axis=list(axes), keepdims=True))
        if epilogue == "rsqrt":  # a layer norm's 1 / sqrt(var + eps)
            y = bb.emit(relax.op.rsqrt(relax.op.add(y, relax.const(1e-5, "float32"))))
        elif epilogue == "relu6":
            y = bb.emit(relax.op.clip(y, 0.0, 6.0))
        return y

    return build_module([("x", shape)], body)


def _mean_ref(x: np.ndarray, axes: Sequence[int], epilogue: str = "") -> np.ndarray:
    y = x.astype(np.float64).mean(axis=tuple(axes), keepdims=True)
    if epilogue == "rsqrt":
        return 1.0 / np.sqrt(y + 1e-5)
    if epilogue == "relu6":
        return np.clip(y, 0.0, 6.0)
    return y


@pytest.mark.parametrize("config", list(COLUMN_RULES))
@pytest.mark.parametrize(
    "shape,axes",
    [
        ((1, 14, 14, 96), (1, 2)),  # mobilenet_v3_small's squeeze-excite pools
        ((1, 7, 7, 576), (1, 2)),
        ((1, 8, 8, 320), (1, 2)),  # mobilevit_xxs's head
        ((1, 56, 56, 16), (1, 2)),  # 3136 terms (WindowReduction's by default)
        ((1, 5, 7, 37), (1, 2)),  # 35 terms, 37 channels: tails of both splits predicated
        ((2, 9, 9, 20), (1, 2)),  # two images: the outputs' axes fused
        ((1, 6, 6, 3), (1, 2)),  # 3 outputs: fewer than a group's channels
        ((1, 300, 24), (1,)),  # the rows of a matrix summed
    ],
)
def test_column_reduction(
    cl_env: Any, config: str, shape: tuple[int, ...], axes: tuple[int, ...]
) -> None:
    from litekiln.compiler.schedules import ColumnReduction

    x = _rand(*shape) + 0.5  # a mean away from zero: relative errors stay meaningful
    res = _check_rule(
        cl_env, _mean_module(shape, axes), [x], _mean_ref(x, axes),
        ColumnReduction(**COLUMN_RULES[config]),
    )  # fmt: skip
    assert "barrier(" in res.program.source  # the slices' partial sums meet in local memory


def test_column_reduction_limits() -> None:
    from litekiln.compiler.schedules import ColumnReduction

    rule = ColumnReduction()
    assert _applies(_mean_module((1, 64, 64, 24), (1, 2)), rule) == ["mean"]  # 4096 terms
    # Reductions over the innermost axis (a row's) are not columns.
    assert not _applies(_mean_module((1, 64, 40), (2,)), rule)
    assert not _applies(_mean_module((1, 8, 8, 4, 3), (3, 4)), rule)
    # A 2x2 pool (4 terms) and many outputs (a 3x3 pool of a large map) are SerialReduction's.
    for k, shape in ((2, (1, 56, 56, 16)), (3, (1, 112, 112, 32))):
        pool = build_module(
            [("x", shape)],
            lambda bb, xv, k=k: relax.op.nn.avg_pool2d(xv, (k, k), (k, k), layout="NHWC"),
        )
        assert not _applies(pool, rule)
    # One output: nothing to spread over channels (other rules take it).
    assert not _applies(_mean_module((1, 4, 4, 1), (1, 2)), rule)


def _gemv_case(cin: int, cout: int, act: str) -> tuple[Any, list[np.ndarray], np.ndarray]:
    """A squeeze-excite block's 1x1 convolution on one pixel (bias, activation)."""
    x, w, b = _rand(1, 1, 1, cin), _rand(cout, 1, 1, cin) * 0.2, _rand(cout)
    ref = conv_ref(x, w) + b
    ref = np.maximum(ref, 0) if act == "relu" else ref
    return _conv_module(x.shape, w, 1, (0, 0, 0, 0), bias=b, act=act), [x], ref


_ROW_CASES = {
    # layer-norm statistics: mean over the channels of [1, N, C], + eps, rsqrt
    "ln 4096x24": ((1, 4096, 24), "rsqrt"),
    "ln 64x168": ((1, 64, 168), "rsqrt"),
    "ln 1x168": ((1, 1, 168), "rsqrt"),  # one row
    "ln 33x17": ((1, 33, 17), ""),  # odd rows, odd row length
    "nhwc 2x3x5x40": ((2, 3, 5, 40), ""),  # channels of an NHWC map
    # squeeze-excite GEMVs: 1x1 conv on one pixel
    "se 96->24": (96, 24, "relu"),
    "se 144->576": (144, 576, ""),
    "se 37->19": (37, 19, "relu"),
    "classifier 1024->1000": (1024, 1000, ""),  # long rows: variants only
}


@pytest.mark.parametrize("config", list(ROW_RULES))
@pytest.mark.parametrize("case", list(_ROW_CASES))
def test_row_reduction(cl_env: Any, config: str, case: str) -> None:
    from litekiln.compiler.schedules import RowReduction

    spec = _ROW_CASES[case]
    if isinstance(spec[0], tuple):
        shape, epilogue = spec
        x = _rand(*shape) + 0.5
        mod, args, ref = _mean_module(shape, (-1,), epilogue), [x], _mean_ref(x, (-1,), epilogue)
    else:
        mod, args, ref = _gemv_case(*spec)
    rule = RowReduction(**ROW_RULES[config])
    if case.startswith("classifier") and rule.max_terms is not None:
        assert not _applies(mod, rule)  # dlight's GEMV keeps classifiers by default
        return
    res = _check_rule(cl_env, mod, args, ref, rule)
    assert ("barrier(" in res.program.source) == (rule.lanes > 1)


def test_reduction_rules_on_the_gpu_profile_only(cl_env: Any) -> None:
    # The gpu profile schedules squeeze-excite pools and GEMVs and layer-norm statistics with
    # the coalesced rules; the cpu profile keeps its serial ones (faster on PoCL).
    pool = _mean_module((1, 14, 14, 96), (1, 2), "relu6")
    norm = _mean_module((1, 256, 88), (-1,), "rsqrt")
    gemv, _, _ = _gemv_case(240, 64, "relu")
    assert set(rules_used(pool, "gpu").values()) == {"ColumnReduction"}
    assert set(rules_used(norm, "gpu").values()) == {"RowReduction"}
    assert "RowReduction" in rules_used(gemv, "gpu").values()
    for mod in (pool, norm, gemv):
        assert not {"ColumnReduction", "RowReduction"} & set(rules_used(mod, "cpu").values())
    x = _rand(1, 14, 14, 96) * 4
    check(cl_env, pool, [x], [_mean_ref(x, (1, 2), "relu6")], profile="gpu", rule=None)
    y = _rand(1, 256, 88) + 0.5
    check(cl_env, norm, [y], [_mean_ref(y, (-1,), "rsqrt")], profile="gpu", rule=None)


@pytest.mark.parametrize("profile_name", ["gpu", "cpu"])
def test_degenerate_reductions(cl_env: Any, profile_name: str) -> None:
    # A mean over axes of one element (a reduction of one term, which the compiler rewrites
    # first: `unit_reductions`), a 1x1 conv of two input channels on one pixel, and a mean
    # to one output: whichever rules take them, the results are right.
    from litekiln.compiler.unit_reductions import unit_reductions

    x = _rand(1, 1, 1, 40)
    mod = unit_reductions()(_mean_module((1, 1, 1, 40), (1, 2), "relu6"))
    check(cl_env, mod, [x], [_mean_ref(x, (1, 2), "relu6")], profile=profile_name, rule=None)
    gemv, args, ref = _gemv_case(2, 24, "relu")  # two terms: the shortest real reduction
    check(cl_env, gemv, args, [ref], profile=profile_name, rule=None)
    x = _rand(1, 4, 4, 1)
    mod = _mean_module((1, 4, 4, 1), (1, 2))
    check(cl_env, mod, [x], [_mean_ref(x, (1, 2))], profile=profile_name, rule=None)


#: `LaneReduction` cases: convolutions and a matrix product, odd sizes included.
_LANE_CASES = {
    # SqueezeNet's late 3x3 expand convolution (13x13 maps), SAME, bias and ReLU
    "3x3 13x13x64->256": ((1, 13, 13, 64), (256, 3, 3, 64), 1, "relu"),
    # its classifier, a 1x1 convolution over 512 channels
    "1x1 13x13x512->100": ((1, 13, 13, 512), (100, 1, 1, 512), 1, ""),
    # stride 2, odd channel counts and sizes (tails of the lanes and of the groups)
    "3x3 s2 9x7x37->19": ((1, 9, 7, 37), (19, 3, 3, 37), 2, "relu"),
}


@pytest.mark.parametrize("lanes", [8, 32])
@pytest.mark.parametrize("case", list(_LANE_CASES))
def test_lane_reduction(cl_env: Any, lanes: int, case: str) -> None:
    from litekiln.compiler.schedules import LaneReduction

    x_shape, w_shape, stride, act = _LANE_CASES[case]
    x, w, b = _rand(*x_shape), _rand(*w_shape) * 0.2, _rand(w_shape[0])
    k = w_shape[1]
    pads = same_pads(x_shape[1], x_shape[2], k, stride)
    ref = conv_ref(x, w, stride=stride, pad=pads) + b
    ref = np.maximum(ref, 0) if act == "relu" else ref
    mod = _conv_module(x.shape, w, stride, pads, bias=b, act=act)
    res = _check_rule(cl_env, mod, [x], ref, LaneReduction(lanes=lanes))
    assert "barrier(" in res.program.source  # the lanes' partial sums meet across threads


#: `TiledLaneReduction` cases: SqueezeNet's 3x3 expand convolutions (early and late maps,
#: rows that the pixel tile does not divide), its classifier's shape (1000 classes: 250
#: channel tiles, a group of 5 of them x 2 along the width), a strided convolution.
_TILED_CASES = {
    "3x3 13x13x64->256": ((1, 13, 13, 64), (256, 3, 3, 64), 1, "relu"),
    "3x3 55x55x16->64": ((1, 55, 55, 16), (64, 3, 3, 16), 1, "relu"),
    "1x1 13x13x512->100": ((1, 13, 13, 512), (100, 1, 1, 512), 1, ""),
    "3x3 s2 9x7x32->64": ((1, 9, 7, 32), (64, 3, 3, 32), 2, "relu6"),
    # input channels no lane count divides: the last step's extra lanes predicated off
    "1x1 7x7x261->16": ((1, 7, 7, 261), (16, 1, 1, 261), 1, "relu"),
}


@pytest.mark.parametrize(
    "tile",
    [(4, 4, 8, 1), (4, 8, 8, 1), (2, 4, 8, 1), (4, 4, 16, 1), (4, 4, 8, 4), (4, 8, 4, 4)],
    ids=lambda t: "x".join(map(str, t)),
)
@pytest.mark.parametrize("case", list(_TILED_CASES))
def test_tiled_lane_reduction(cl_env: Any, tile: tuple[int, int, int, int], case: str) -> None:
    from litekiln.compiler.schedules import TiledLaneReduction

    x_shape, w_shape, stride, act = _TILED_CASES[case]
    x, w, b = _rand(*x_shape), _rand(*w_shape) * 0.2, _rand(w_shape[0])
    k = w_shape[1]
    pads = same_pads(x_shape[1], x_shape[2], k, stride)
    ref = conv_ref(x, w, stride=stride, pad=pads) + b
    ref = {"relu": np.maximum(ref, 0), "relu6": np.clip(ref, 0, 6)}.get(act, ref)
    mod = _conv_module(x.shape, w, stride, pads, bias=b, act=act)
    pixels, channels, lanes, vector = tile
    if vector > 1 and x_shape[-1] % (lanes * vector):
        pytest.skip("input channels the lanes' vectors do not divide: not its (limits test)")
    rule = TiledLaneReduction(
        pixels=pixels, channels=channels, lanes=lanes, vector=vector, min_macs=0
    )
    res = _check_rule(cl_env, mod, [x], ref, rule)
    # one barrier: between the lanes' partial tiles and their sum
    assert res.program.source.count("barrier(") == 1


def test_tiled_lane_reduction_limits() -> None:
    """Input channels the lanes (or their vectors) do not divide, unless long, output
    channels that no tile of 2 or 4 divides (19), window-only reductions, short reductions
    and (by default) small convolutions are not its."""
    from litekiln.compiler.schedules import TiledLaneReduction

    rule = TiledLaneReduction(min_macs=0)
    odd_in = _conv_module((1, 9, 9, 37), _rand(16, 3, 3, 37), 1, (1, 1, 1, 1))
    odd_out = _conv_module((1, 9, 9, 32), _rand(19, 3, 3, 32), 1, (1, 1, 1, 1))
    depthwise = _conv_module((1, 8, 8, 32), _rand(32, 3, 3, 1), 1, (1, 1, 1, 1), groups=32)
    short = _conv_module((1, 8, 8, 16), _rand(32, 1, 1, 16), 1, (0, 0, 0, 0))
    for mod in (odd_in, odd_out, depthwise, short):
        assert not _applies(mod, rule)
    # ragged input channels when long (16 steps of the lanes and more), without vectors
    odd_long = _conv_module((1, 7, 7, 261), _rand(16, 1, 1, 261), 1, (0, 0, 0, 0))
    assert _applies(odd_long, rule)
    assert not _applies(odd_long, TiledLaneReduction(vector=2, min_macs=0))
    assert not _applies(odd_long, TiledLaneReduction(lanes=32, min_macs=0))  # 8 steps
    vec_in = _conv_module((1, 9, 9, 40), _rand(16, 3, 3, 40), 1, (1, 1, 1, 1))
    assert _applies(vec_in, TiledLaneReduction(lanes=4, min_macs=0))
    assert not _applies(vec_in, TiledLaneReduction(lanes=4, vector=4, min_macs=0))  # 40 % 16
    # by default, not convolutions of fewer than 1M multiply-adds (this one: 373K)
    assert not _applies(vec_in, TiledLaneReduction(lanes=4))
    ok = _conv_module((1, 9, 9, 32), _rand(32, 3, 3, 32), 1, (1, 1, 1, 1))
    assert _applies(ok, rule)


def _projection_module(m: int, k: int, n: int) -> tuple[Any, list[np.ndarray], np.ndarray]:
    """A vision transformer's projection: ``x @ w + b``, [m, n], added to the residual
    stream, [1, m, n], by broadcasting (DeiT's fc2 and attention projection as litekiln
    lowers litert-torch's export), with its numpy reference."""
    x, r = _rand(m, k), _rand(1, m, n)
    w, b = _rand(k, n) * 0.1, _rand(n)

    def body(bb: Any, xv: Any, rv: Any) -> Any:
        y = bb.emit(relax.op.matmul(xv, relax.const(w)))
        y = bb.emit(relax.op.add(y, relax.const(b)))
        return bb.emit(relax.op.add(rv, y))

    ref = r + (x.astype(np.float64) @ w + b).astype(np.float32)[None]
    return build_module([("x", (m, k)), ("r", (1, m, n))], body), [x, r], ref


def _mixer_module(kind: str, tokens: int, channels: int, hidden: int = 0) -> Any:
    """ResMLP's two products with their neighbours fused in (timm's resmlp_12_224 as litekiln
    lowers litert-torch's export), with the numpy reference:

    * ``"tokens"``: the token mixing, ``(affine(x)^T @ w + b)``: the operand is an affine
      map of the activations (per channel: ``x * alpha + beta``), transposed, computed in
      the kernel;
    * ``"mlp"``: ``gelu(affine(r + s * y) @ w + b)``: the residual update and the affine
      map before the product, the exact GELU after it.
    """
    x = _rand(1, tokens, channels)
    alpha, beta = _rand(1, 1, channels), _rand(1, 1, channels)
    if kind == "tokens":
        w, b = _rand(tokens, tokens) * 0.1, _rand(tokens)

        def body(bb: Any, xv: Any) -> Any:
            a = bb.emit(relax.op.add(relax.op.multiply(xv, relax.const(alpha)), relax.const(beta)))
            a = bb.emit(relax.op.reshape(relax.op.permute_dims(a, [0, 2, 1]), (channels, tokens)))
            y = bb.emit(relax.op.matmul(a, relax.const(w)))
            return bb.emit(relax.op.add(y, relax.const(b)))

        a = (x * alpha + beta)[0].T.astype(np.float64)
        return build_module([("x", x.shape)], body), [x], (a @ w + b).astype(np.float32)
    y, scale = _rand(1, channels, tokens), _rand(1, channels, 1)
    w, b = _rand(channels, hidden) * 0.1, _rand(hidden)

    def mlp(bb: Any, xv: Any, yv: Any) -> Any:
        s = bb.emit(relax.op.permute_dims(relax.op.multiply(yv, relax.const(scale)), [0, 2, 1]))
        a = bb.emit(relax.op.add(xv, s))
        a = bb.emit(relax.op.add(relax.op.multiply(a, relax.const(alpha)), relax.const(beta)))
        h = bb.emit(relax.op.matmul(relax.op.reshape(a, (tokens, channels)), relax.const(w)))
        return bb.emit(relax.op.nn.gelu(relax.op.add(h, relax.const(b))))

    a = ((x + np.transpose(y * scale, (0, 2, 1))) * alpha + beta)[0].astype(np.float64)
    h = a @ w + b
    ref = 0.5 * h * (1.0 + np.vectorize(math.erf)(h / math.sqrt(2.0)))
    return build_module([("x", x.shape), ("y", y.shape)], mlp), [x, y], ref.astype(np.float32)


@pytest.mark.parametrize("case", ["tokens", "mlp"])
def test_shared_matmul_fetches_an_operand_computed_in_the_kernel(cl_env: Any, case: str) -> None:
    """A product whose operand is computed by the kernel's own elementwise blocks (an affine
    map, a transpose, a residual update: ResMLP's token mixing and MLP) is `SharedMatmul`'s:
    those blocks are inlined into the fetch of the operand's tiles, as a convolution's
    padding is; the GELU after the product is its epilogue. Before, the GPU profile gave
    them a thread per output (the token mixing, 22 us on the H200 for 15M multiply-adds)
    or dlight's Matmul (the MLP's fc1, 45 us at 5 TFLOP/s: 0.95x torch's CUDA graph)."""
    from litekiln.compiler.schedules import SharedMatmul

    # (over the GPU profile's 1M multiply-adds: 1.4M and 1.2M)
    mod, args, ref = (
        _mixer_module(case, 120, 96) if case == "tokens" else _mixer_module(case, 50, 64, 384)
    )
    used = rules_used(mod, "gpu", neighbours=True)
    assert list(used.values()) == ["SharedMatmul"], used
    for rule in (SharedMatmul(mn=4, min_macs=0), SharedMatmul(mn=4, splits=4, min_macs=0)):
        res = _check_rule(cl_env, mod, args, ref, rule)
        assert len(res.program.launches) == (2 if rule.splits > 1 else 1)
        if case == "tokens":
            # The operand, [channels, tokens], is computed from [tokens, channels]
            # activations: its tile is fetched along the channels, adjacent threads reading
            # adjacent words (laid out as the intermediate, they read a row apart).
            fetch = r"a0_ptr\[[^\]]*\+ \(convert_int\(get_local_id\(0\)\)\)\)\]"
            assert re.search(fetch, res.program.source), res.program.source


@pytest.mark.parametrize(
    "rule",
    ["lanes 8", "tiles 4x4 on 8", "tiles 4x8 on 8", "tiles 2x4 on 8"],
)
def test_projection_with_residual_takes_the_split_k_rules(cl_env: Any, rule: str) -> None:
    """The residual added as [1, tokens, channels] to the [tokens, channels] sums is the
    reduction's epilogue (unit axes aside): the split-K rules take the projection, and
    the epilogue adds bias and residual right (before, only dlight's Matmul did: DeiT-Tiny's
    fc2 took 53 us on the H200)."""
    from litekiln.compiler.schedules import LaneReduction, TiledLaneReduction

    mod, args, ref = _projection_module(50, 256, 64)
    made = {
        "lanes 8": LaneReduction(lanes=8),
        "tiles 4x4 on 8": TiledLaneReduction(4, 4, min_macs=0),
        "tiles 4x8 on 8": TiledLaneReduction(4, 8, min_macs=0),
        "tiles 2x4 on 8": TiledLaneReduction(2, 4, min_macs=0),
    }[rule]
    res = _check_rule(cl_env, mod, args, ref, made)
    assert len(res.program.launches) == 1  # bias and residual in the epilogue


@pytest.mark.parametrize("tile", [(4, 4, 8), (2, 4, 8), (4, 8, 8)], ids=str)
def test_attention_values_product_takes_the_tiles(cl_env: Any, tile: tuple[int, int, int]) -> None:
    """An attention's ``weights @ values`` per head sums over the tokens, 197 in DeiT: no
    lane count divides them, the last step's extra lanes are predicated off (it took
    `LaneReduction`, 17-22 us on the H200, for 7.5M multiply-adds)."""
    from litekiln.compiler.schedules import TiledLaneReduction

    a, v = _rand(3, 197, 197), _rand(3, 197, 64)

    def body(bb: Any, av: Any, vv: Any) -> Any:
        return bb.emit(relax.op.matmul(av, vv))

    mod = build_module([("a", a.shape), ("v", v.shape)], body)
    ref = (a.astype(np.float64) @ v).astype(np.float32)
    pixels, channels, lanes = tile
    rule = TiledLaneReduction(pixels, channels, lanes=lanes, min_macs=0)
    _check_rule(cl_env, mod, [a, v], ref, rule)


_SHARED_MATMUL = {
    "16x16 on 4": {},
    "16x16 on 8": {"tn": 4, "mn": 4, "lanes": 8},
    "32x32 on 4": {"mm": 4, "mn": 4},
    "32x32 on 2, 64-term steps": {"mm": 4, "mn": 4, "lanes": 2, "step": 32},
    "16x32 on 4, split across 4 groups": {"mn": 4, "splits": 4},
    "32x32 on 2, 32-term steps": {"mm": 4, "mn": 4, "lanes": 2, "step": 16},
    "16x32 on 4, split across 16 groups": {"mn": 4, "splits": 16},
    "32x32 on 4, 64-term steps": {"mm": 4, "mn": 4, "step": 16},
    "32x32 on 4, 128-term steps": {"mm": 4, "mn": 4, "step": 32},
}


#: name -> (input shape, weights [out, kh, kw, in], stride, pads, dilation, activation)
_SHARED_CONVS: dict[str, tuple[Any, ...]] = {
    # 8x8 patches of 3 channels, stride 8: 7x7 x 192 -> 48
    "patch embedding": ((1, 56, 56, 3), (48, 8, 8, 3), 8, (0, 0, 0, 0), 1, ""),
    # SqueezeNet's classifier: 13x13 pixels (no tile divides them) x 512 -> 1000 classes
    "pointwise": ((1, 13, 13, 512), (1000, 1, 1, 512), 1, (0, 0, 0, 0), 1, "relu"),
    "pointwise, stride 2": ((1, 14, 14, 40), (24, 1, 1, 40), 2, (0, 0, 0, 0), 1, ""),
    "pointwise, batch 2": ((2, 7, 7, 64), (32, 1, 1, 64), 1, (0, 0, 0, 0), 1, ""),
    # padded windows: the padding inlined into the fetch of the input's tiles
    "3x3 padded": ((1, 15, 15, 16), (64, 3, 3, 16), 1, (1, 1, 1, 1), 1, "relu"),
    "3x3 stride 2, uneven padding": ((1, 16, 16, 8), (20, 3, 3, 8), 2, (0, 0, 1, 1), 1, ""),
    "3x3 dilated": ((1, 12, 12, 8), (16, 3, 3, 8), 1, (2, 2, 2, 2), 2, ""),
    "1x5": ((1, 9, 12, 8), (16, 1, 5, 8), 1, (0, 2, 0, 2), 1, ""),
}


@pytest.mark.parametrize("config", list(_SHARED_MATMUL))
@pytest.mark.parametrize(
    "case", ["projection", "attention values", "attention scores", *_SHARED_CONVS]
)
def test_shared_matmul(cl_env: Any, config: str, case: str) -> None:
    """Tiles staged in local memory with split-K across the group: a projection over 197
    tokens with bias and residual in the epilogue (no tile divides the tokens), an
    attention's batched products per head (weights @ values sums 197 terms: the last step
    padded; scores = queries @ keys^T, the second operand read along its rows), and NHWC
    convolutions as output pixels x (window taps x input channels): a patch embedding,
    1x1 layers (strided too), padded, strided and dilated windows, a 1x5 one (issue 15:
    SqueezeNet's 1x1 classifier took 34 us on the H200 with the register-tiled rules)."""
    from litekiln.compiler.schedules import SharedMatmul

    rule = SharedMatmul(**_SHARED_MATMUL[config], min_macs=0, conv_min_macs=0)
    if case == "projection":
        mod, args, ref = _projection_module(197, 192, 576)
    elif case in _SHARED_CONVS:
        x_shape, w_shape, stride, pads, dilation, act = _SHARED_CONVS[case]
        x, w, b = _rand(*x_shape), _rand(*w_shape) * 0.1, _rand(w_shape[0])
        mod = _conv_module(x_shape, w, stride, pads, dilation, bias=b, act=act)
        ref = conv_ref(x, w, stride=stride, pad=pads, dilation=dilation) + b
        args, ref = [x], np.maximum(ref, 0) if act == "relu" else ref
    else:
        shapes = {"attention values": ((3, 197, 197), (3, 197, 64))}.get(
            case, ((3, 197, 64), (3, 64, 197))
        )
        a, b = _rand(*shapes[0]), _rand(*shapes[1])

        def body(bb: Any, av: Any, bv: Any) -> Any:
            return bb.emit(relax.op.matmul(av, bv))

        mod = build_module([("a", a.shape), ("b", b.shape)], body)
        args, ref = [a, b], (a.astype(np.float64) @ b).astype(np.float32)
    res = _check_rule(cl_env, mod, args, ref, rule)
    # bias and residual in the epilogue; split across groups, a second kernel sums them
    assert len(res.program.launches) == (2 if rule.splits > 1 else 1)
    assert "__local" in res.program.source


@pytest.mark.parametrize("pad_rows", [True, False])
def test_shared_matmul_pads_the_rows_of_tiles_staged_by_rows(cl_env: Any, pad_rows: bool) -> None:
    """The activations' tile is staged as [rows, terms] (their terms are contiguous): its
    rows of 32 terms are padded to 33 words each, so that the threads reading adjacent rows
    at one term hit distinct local-memory banks (unpadded, a 32-word stride puts them all
    in one): a thread's rows (2) start 66 words apart. The weights' tile, [terms, columns],
    needs no padding."""
    from litekiln.compiler.schedules import SharedMatmul

    mod, args, ref = _projection_module(197, 192, 576)
    res = _check_rule(cl_env, mod, args, ref, SharedMatmul(pad_rows=pad_rows, min_macs=0))
    strides = set(re.findall(r"get_local_id\(1\)\)\) \* (\d+)\)", res.program.source))
    assert ("66" in strides) == pad_rows and ("64" in strides) != pad_rows, strides


#: name -> (input shape, weights [out, kh, kw, in / groups], groups, stride, pads)
_SPLIT_GROUPS: dict[str, tuple[Any, ...]] = {
    # ResNeSt's split attention (radix 2): 2 groups of 32 channels, 3x3, into 2 x 64
    "2 groups, 3x3": ((1, 14, 14, 64), (128, 3, 3, 32), 2, 1, (1, 1, 1, 1)),
    # 4 groups, strided, 81 output pixels (no tile divides them)
    "4 groups, stride 2": ((1, 17, 17, 64), (128, 3, 3, 16), 4, 2, (1, 1, 1, 1)),
}


@pytest.mark.parametrize(
    "config", ["16x16 on 4", "32x32 on 4", "16x32 on 4, split across 4 groups"]
)
@pytest.mark.parametrize("case", list(_SPLIT_GROUPS))
@pytest.mark.parametrize("group", [0, -1])
def test_shared_matmul_one_group_of_a_grouped_convolution(
    cl_env: Any, config: str, case: str, group: int
) -> None:
    """A grouped convolution of a few wide groups is emitted as one convolution per group
    (`emit_nn._group_conv_te`), reading its channels and weight rows at an offset into the
    whole tensors: each is a matrix product whose input tile its output channels share
    (resnest14d's four 2-group 3x3 convolutions took dlight's `GeneralReduction`, 94-131 us
    each on the H200: the one twin under 1.5x PyTorch's CUDA graph). The first and the last
    group, against numpy's grouped convolution."""
    import functools

    from litekiln.compiler.emit_nn import _group_conv_te
    from litekiln.compiler.schedules import SharedMatmul

    x_shape, w_shape, groups, stride, pads = _SPLIT_GROUPS[case]
    group %= groups
    x, w = _rand(*x_shape), _rand(*w_shape) * 0.1
    te_fn = functools.partial(
        _group_conv_te,
        groups=groups,
        group=group,
        strides=(stride, stride),
        pads=tuple(pads),
        dilation=(1, 1),
    )

    def body(bb: Any, xv: Any) -> Any:
        return bb.emit_te(te_fn, xv, relax.const(w), primfunc_name_hint="conv2d_group")

    mod = build_module([("x", x_shape)], body)
    og = w_shape[0] // groups
    ref = conv_ref(x, w, stride=stride, pad=pads, groups=groups)[..., group * og : (group + 1) * og]
    rule = SharedMatmul(**_SHARED_MATMUL[config], min_macs=0, conv_min_macs=0)
    res = _check_rule(cl_env, mod, [x], ref, rule)
    assert len(res.program.launches) == (2 if rule.splits > 1 else 1)
    assert "__local" in res.program.source


def test_shared_matmul_limits() -> None:
    """Grouped and depthwise convolutions (no operand tile shared by the output channels),
    small products (by default) and groups over the device's thread limit are not its."""
    from litekiln.compiler.schedules import SharedMatmul

    grouped = _conv_module((1, 9, 9, 32), _rand(32, 3, 3, 8), 1, (1, 1, 1, 1), groups=4)
    depthwise = _conv_module((1, 9, 9, 32), _rand(32, 3, 3, 1), 1, (1, 1, 1, 1), groups=32)
    for mod in (grouped, depthwise):
        assert not _applies(mod, SharedMatmul(min_macs=0, conv_min_macs=0))
    conv = _conv_module((1, 9, 9, 32), _rand(32, 3, 3, 32), 1, (1, 1, 1, 1))
    assert _applies(conv, SharedMatmul(min_macs=0, conv_min_macs=0))
    # Convolutions under 8M multiply-adds (this one: 746K) are not offered it by default:
    # each variant is a kernel more in the cache entry (issue 16's 15% of the model file).
    assert not _applies(conv, SharedMatmul(min_macs=0))
    # The GPU profile's default rules (64 taps and more) take patch embeddings only: other
    # convolutions have it as a tuning variant, their default schedule unchanged.
    patches = _conv_module((1, 56, 56, 3), _rand(48, 8, 8, 3), 8, (0, 0, 0, 0))
    assert not _applies(conv, SharedMatmul(min_macs=0, conv_min_macs=0, min_taps=64))
    assert _applies(patches, SharedMatmul(min_macs=0, conv_min_macs=0, min_taps=64))
    small, _, _ = _projection_module(50, 64, 64)  # 205K multiply-adds
    assert not _applies(small, SharedMatmul())
    assert _applies(small, SharedMatmul(min_macs=0))
    assert not _applies(small, SharedMatmul(tm=16, tn=16, lanes=4, min_macs=0))  # 1024 threads


def test_lane_reduction_limits() -> None:
    """Short reductions, window-only reductions (depthwise) and rows read once (a GEMV) are
    not its."""
    from litekiln.compiler.schedules import LaneReduction

    rule = LaneReduction()
    short = _conv_module((1, 8, 8, 16), _rand(32, 1, 1, 16), 1, (0, 0, 0, 0))
    depthwise = _conv_module((1, 8, 8, 32), _rand(32, 3, 3, 1), 1, (1, 1, 1, 1), groups=32)
    gemv, _, _ = _gemv_case(1024, 1000, "")
    for mod in (short, depthwise, gemv):
        assert not _applies(mod, rule)


def _private_floats(source: str) -> list[int]:
    """The element counts of the private (per work-item) float arrays in OpenCL C."""
    found = re.findall(r"(__local\s+)?\bfloat\s+\w+\[(\d+)\]", source)
    return [int(n) for local, n in found if not local]


def test_window_reshapes_around_a_product_keep_their_accumulators_private(
    cl_env: Any, profile: str
) -> None:
    """torchvision MaxViT's window attention MLP: the tokens are reshaped into windows and
    back around a matrix product, then GELU and a reshape again. The rule inlines the
    reshapes' index maps into the reader of the product's cached accumulators, which left
    them indexed by ``v // 49 * 49 + v % 49``; TVM could not bound that region and gave each
    work-item a private array of the whole output tile (25088 floats under ``fast-cpu``):
    PoCL's work-group function overflowed its thread's stack and the process died. The
    indices are simplified before lowering (codegen `_lower_tir`): a few dozen floats."""
    windows, tokens, cin, cout = 16, 49, 64, 128
    x = _rand(1, windows * tokens, cin)
    w = _rand(cin, cout)
    bias = _rand(cout)

    def body(bb: Any, xv: Any) -> Any:
        a = relax.op.reshape(xv, (1, windows, tokens, cin))
        a = relax.op.reshape(a, (windows * tokens, cin))
        h = relax.op.add(relax.op.matmul(a, relax.const(w)), relax.const(bias))
        h = relax.op.reshape(h, (1, windows, tokens, cout))
        h = relax.op.multiply(h, relax.op.sigmoid(h))
        return relax.op.reshape(h, (windows * tokens, cout))

    mod = build_module([("x", x.shape)], body)
    h = x.reshape(-1, cin).astype(np.float64) @ w + bias
    ref = (h / (1.0 + np.exp(-h))).astype(np.float32)
    res = check(cl_env, mod, [x], [ref], profile, rule=None)
    floats = _private_floats(str(res.program.source))
    assert floats and max(floats) <= 64, floats


def test_kernels_with_huge_private_arrays_are_refused() -> None:
    """The guard behind that fix: a kernel whose private arrays stay over
    `codegen._MAX_PRIVATE_BYTES` per work-item once its indices are simplified fails its
    lowering, naming the kernel, so that `_Repair` reschedules its function with another
    rule; local (shared) arrays do not count."""
    from tvm.script import tirx as T

    from litekiln.compiler import codegen
    from litekiln.compiler.dispatch import private_bytes

    body = (
        "__kernel void k(__global float* restrict a) {"
        " float acc[32]; half2 h[4]; __local float tile[4096]; int i[3]; ... }"
    )
    assert private_bytes(body) == 32 * 4 + 4 * 2 * 2 + 3 * 4

    @T.prim_func(s_tir=True)
    def reverse(a: T.Buffer((64, 8192), "float32"), b: T.Buffer((64, 8192), "float32")) -> None:
        # Each work-item keeps a whole row, then writes it reversed: 32 KB, a real need.
        T.func_attr({"tirx.noalias": True, "global_symbol": "reverse"})
        c = T.sblock_alloc_buffer((64, 8192), scope="local")
        for t in T.thread_binding(64, thread="threadIdx.x"):
            for k in range(8192):
                with T.sblock("copy"):
                    vt, vk = T.axis.remap("SS", [t, k])
                    c[vt, vk] = a[vt, vk] * T.float32(2)
            for k in range(8192):
                with T.sblock("back"):
                    vt, vk = T.axis.remap("SS", [t, k])
                    b[vt, vk] = c[vt, 8191 - vk]

    target = codegen.make_target("opencl")
    with pytest.raises(codegen.CodegenError, match="kernel reverse_kernel declares 32768 bytes"):
        codegen._lower_tir(tvm.IRModule({"reverse": reverse}), target)
