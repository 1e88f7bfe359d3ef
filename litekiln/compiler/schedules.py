"""GPU schedules for what dominates our models: convolutions, pooling and injective kernels.

dlight's generic GPU rules (`codegen.default_schedule`) turn every reduction into a
cross-thread reduction: a conv2d output element becomes a 256-thread work-group with barriers
and a tree reduction in local memory, a 2x2 max-pool element the same.  That is the wrong shape
for NHWC convolutions, whose reductions are short (kh * kw * cin, a few hundred terms at most)
and whose outputs are many.  The rules here give each work-item a small output tile instead and
keep the reduction serial inside the work-item:

* `SerialReduction` -- any fused PrimFunc with one reduction block (conv2d, depthwise conv2d
  i.e. grouped conv with groups == channels, max/avg pooling, small matmuls) whose producers
  (padding) inline and whose consumers (bias, activation, residual add, the average's divide)
  form one epilogue.  A work-item owns ``pv`` adjacent output pixels (along the innermost
  spatial axis before channels) x ``fv`` adjacent output channels; the accumulators live in
  registers (a ``local`` buffer with constant indices after unrolling), the kernel window is
  unrolled, the input-channel loop stays a loop, and the epilogue runs on the registers and
  stores ``fv`` consecutive channels (NHWC: consecutive work-items store consecutive 4-float
  chunks, so stores coalesce).  No barriers, no local memory.
* `Injective` -- functions made only of spatial blocks (pad, add, resize, concat, reshape
  copies): one work-item per output element, or per 4 consecutive elements stored as one
  vector when the innermost axis allows it.
* `SerialRows` -- reductions chained along the trailing axes of each row (softmax over the
  channels of a map): one work-item per row, every reduction serial in it.
* `ColumnReduction`, `RowReduction` -- reductions that read their input whole, for GPUs:
  global pools (a few hundred channels, each summed over the map: threads along the
  channels and along slices of the map, partial sums combined in local memory) and
  reductions over the contiguous last axis (layer-norm statistics, squeeze-excite GEMVs:
  a warp's lanes along each row, combined across threads).  Both read coalesced, where
  `SerialReduction` gave each work-item 4 outputs and read them strided.
* `RowNormalization` -- a layer norm as one kernel (`compiler.layer_norm` lowers it as one
  function: a row's sum, the sum of its squared differences from the mean, the normalised
  row): a warp's lanes along each row for both sums and for the row's writes.
* `FusedAttention`, `SerialAttention` -- an attention as one kernel (`compiler.attention`:
  scores, softmax, weighted sum of the values): on GPUs a work-group per few query rows,
  their scores and probabilities in local memory, a warp's lanes along each row; on CPU
  OpenCL one work-item per query row.

Rules return ``None`` where they do not apply (or where TVM refuses a schedule step), so
dlight's rules stay the fallback; `fast_schedule` chains them.  Work-group sizes stay within
64-256 (TVM's OpenCL default cap is 256; the H100 allows 1024), and the tile shrinks when a
kernel would otherwise launch too few work-items to fill a large GPU.

Two profiles (`PROFILES`), because the best choice differs by device class (measured on an
H100 through NVIDIA OpenCL and on PoCL, scripts/bench_schedules.py):

* ``gpu`` (``LITEKILN_SCHEDULES=fast``): `SerialReduction` for window reductions only
  (depthwise, pooling, convs on 1-3 input channels: 10-45x faster than dlight's there);
  convolutions over input channels stay with dlight's cross-thread reduction, whose loads
  coalesce along the channel axis (a serial channel loop was 1.3-5x slower on the H100), and
  elementwise kernels with dlight's Fallback (`Injective` measured ~10% slower there).
  Reductions read whole (global pools, layer-norm statistics, squeeze-excite GEMVs of up
  to 512 terms) go to `ColumnReduction` and `RowReduction` (issue 15: `SerialReduction`
  gave them 14-40 us each on the H100, 1-13 GB/s); the schedules they replace stay tuning
  variants (`variant_rules`).
* ``cpu`` (``LITEKILN_SCHEDULES=fast-cpu``): all our rules, largest tiles: 50-150x faster than
  dlight's on PoCL, where barriers and cross-thread reductions are very expensive.  So that
  no kernel of dlight's shape is left to dominate a model there (issue 18), it also takes
  softmax (`SerialRows`: 400x) and the long reductions over few outputs that a GPU leaves to
  dlight (late 1x1 convolutions, global pools: 3-17x), and shapes convolutions for a CPU:
  one pixel per work-item under a kernel window, the padding copied once by a kernel of its
  own (3-7x), loops over few input channels kept loops (1.3-6x).  Classifiers (one output
  pixel) stay with dlight's GEMV, which was faster.
  Figures: docs/benchmarks.md, "PoCL (CPU OpenCL)".

Convolutions over channels also have split-K tuning variants (`LaneReduction`,
`TiledLaneReduction`: registers and lanes, no shared-memory tiles), and matrix products and
all convolutions over channels `SharedMatmul` (tiles staged in shared memory, split-K across
the group's thread planes, and across work-groups for long reductions); the device's timing
picks among them and dlight's Matmul per kernel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import try_inline, try_inline_contiguous_spatial
from tvm.s_tir.dlight.base.utils import max_threads_per_block
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule
from tvm.target import Target

__all__ = [
    "PROFILES",
    "ConfiguredMatmul",
    "FewOutputsReduction",
    "Injective",
    "LaneReduction",
    "RowNormalization",
    "SerialReduction",
    "SerialRows",
    "SharedMatmul",
    "TiledLaneReduction",
    "WindowReduction",
    "fast_rules",
    "fast_schedule",
    "variant_rules",
]

#: Serial reductions are kept only when the work is output-parallel enough: at most this many
#: reduction terms per work-item regardless of the output size ...
_SHORT_REDUCTION = 512
#: ... or at least this many output elements per reduction term (a 7x7x1024 -> 1024 1x1 conv has
#: 49; a 1024 -> 1001 classifier has 1 and is left to dlight's GEMV/cross-thread rules).
_OUTPUTS_PER_TERM = 16
#: Work-items a kernel should launch before its tile grows: an H100 has 132 SMs; 128
#: work-items each, with 8-32 independent accumulators per work-item, keeps them all busy.
_ENOUGH_WORK_ITEMS = 132 * 128
#: Unroll a reduction loop (kernel window, small pool windows) when its extent is at most this.
_UNROLL_EXTENT = 16
#: Fully unroll nested reduction loops when their combined extent is at most this.
_UNROLL_TOTAL = 64


def _static_extent(sch: s_tir.Schedule, loop: s_tir.schedule.LoopRV) -> int | None:
    ext = sch.get(loop).extent
    return int(ext.value) if isinstance(ext, tirx.IntImm) else None


def _threads_per_group(work_items: int, target: Target) -> int:
    """64-256 work-items per group: fewer when the kernel is small, so groups spread out."""
    cap = int(max_threads_per_block(target))
    cap = max(32, min(256, cap))
    if work_items >= 256 * 132 * 2:
        t = 256
    elif work_items >= 128 * 132:
        t = 128
    else:
        t = 64
    return min(t, cap)


def _uses_var(expr: tirx.PrimExpr, var: tirx.Var) -> bool:
    found = False

    def visit(node: tirx.Var) -> None:
        nonlocal found
        found = found or node.same_as(var)

    tvm_ffi.structural_walk(expr, [(tirx.Var, visit)], order="post")
    return found


def _reduces_innermost_axis(block: s_tir.SBlock) -> int:
    """Extent of the reduction over the innermost (NHWC: channel) axis of a read, else 1.

    conv2d reads ``x[n, h*s + ry, w*s + rx, rc]``: the channel reduction ``rc`` (the extent of
    ``rc``); depthwise conv reads ``x[n, .., .., f]`` and pooling ``x[n, .., .., c]``: 1.
    Looking at the indices, not at loop extents, keeps a 5x5 depthwise window (whose unit
    channel loop TVM drops) from passing for a 5-channel reduction.
    """
    extent = 1
    for iv in block.iter_vars:
        if iv.iter_type != tirx.IterVar.CommReduce or not isinstance(iv.dom.extent, tirx.IntImm):
            continue
        for region in block.reads:
            if region.region and _uses_var(region.region[-1].min, iv.var):
                extent = max(extent, int(iv.dom.extent.value))
    return extent


def _largest_divisor(n: int, options: Sequence[int]) -> int:
    for v in options:
        if n % v == 0:
            return v
    return 1


def _padding_producers(sch: s_tir.Schedule, red: s_tir.schedule.SBlockRV) -> set[str]:
    """Names of the blocks that pad the reduction's input (producers with an if_then_else)."""
    return {sch.get(b).name_hint for b in sch.get_producers(red) if _has_if_then_else(sch.get(b))}


def _one_item_per_pixel(
    sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, target: Target
) -> None:
    """Schedule a spatial block as its own kernel, one work-item per pixel (all but the last
    axis) looping over the channels: PoCL ran padding copies 1.5-3x faster so than with one
    work-item per element or per 4 channels stored as one vector."""
    loops = sch.get_loops(block)
    pixels = math.prod(_static_extent(sch, loop) or 1 for loop in loops[:-1])
    bx, tx = sch.split(sch.fuse(*loops[:-1]), factors=[None, _threads_per_group(pixels, target)])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


class _GuardedRule(GPUScheduleRule):
    """A rule that declines (returns None) where TVM refuses one of its steps: subclasses
    implement `_apply`."""

    def apply(self, func: tirx.PrimFunc, target: Target, _tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        try:
            return self._apply(func, target)
        except (RuntimeError, ValueError, AssertionError):  # ScheduleError, tvm_ffi errors
            # TVM refused a step (an epilogue that does not compute_at, an exotic producer)
            # or a dlight analysis asserted: leave the function to the next rule.
            return None

    def _apply(self, func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        raise NotImplementedError


#: What a rule raises where it cannot schedule a function: TVM's ScheduleError and tvm_ffi
#: errors, and dlight's analyses' asserts and lookups. A rule that raises one declines.
RULE_REFUSALS = (RuntimeError, ValueError, TypeError, AssertionError, IndexError)


class Declining(GPUScheduleRule):
    """Another rule (dlight's) that declines where its analysis or a schedule step fails:
    dlight's `GEMV` asserts on a product whose operand is computed in its kernel (an LSTM's
    recurrent product taking the previous step's output, o * tanh(c), from the gates), and an
    exception in one rule would otherwise fail the whole partition's schedule profile."""

    def __init__(self, rule: GPUScheduleRule) -> None:
        self.inner = rule

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        try:
            return self.inner.apply(func, target, tunable)
        except RULE_REFUSALS:
            return None

    def is_target_available(self, target: Target) -> bool:
        return bool(self.inner.is_target_available(target))

    def __repr__(self) -> str:
        return f"Declining({type(self.inner).__name__})"


def dlight_rules(*names: str) -> list[GPUScheduleRule]:
    """dlight's GPU rules by name (``"Matmul"``, ``"GEMV"``...), each `Declining`."""
    return [Declining(getattr(dl.gpu, name)()) for name in names]


class _SingleReductionRule(_GuardedRule):
    """Shared entry of the rules for one static reduction block (spatial axes, then reduction
    axes) with only injective blocks around it: subclasses implement `_schedule`."""

    def _apply(self, func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if infos is None:
            return None
        reductions = [b for b in infos if b.is_reduction()]
        if len(reductions) != 1 or any(not b.is_injective() for b in infos if not b.is_reduction()):
            return None
        red_info = reductions[0]
        kinds = red_info.dom_kind()
        n_s = kinds.count("S")
        if set(kinds) - {"S", "R"} or kinds != "S" * n_s + "R" * (len(kinds) - n_s) or n_s == 0:
            return None
        if n_s == len(kinds):
            return None  # no reduction axis left (a reduction over unit axes)
        dom = [int(d) if isinstance(d, (int, tirx.IntImm)) else None for d in red_info.dom()]
        extents = [d for d in dom if d is not None]
        if len(extents) != len(dom):
            return None  # dynamic shapes
        return self._schedule(sch, target, infos, red_info, extents[:n_s], extents[n_s:])

    def _schedule(
        self,
        sch: s_tir.Schedule,
        target: Target,
        infos: list[Any],
        red_info: Any,
        s_ext: list[int],
        r_ext: list[int],
    ) -> s_tir.Schedule | None:
        raise NotImplementedError


class SerialReduction(_SingleReductionRule):
    """One work-item per small output tile, serial reduction (conv2d, depthwise, pooling).

    Args:
        tiles: ``(channels, pixels)`` tiles per work-item for reductions over input channels
            (conv2d: weights are reused across the pixels, inputs across the channels), largest
            first; the first that still launches ``min_work_items`` work-items is taken, else
            the last.  Reductions over a window only (depthwise, pooling) choose among
            ``window_only_tiles`` the same way.
        min_work_items: Work-items a kernel should launch before tiles grow (a large GPU needs
            them to fill its SMs; PoCL on a few CPU cores is fastest with the largest tile,
            ``min_work_items=0``).
        channel_reductions: Also take reductions over input channels (conv2d with 4 or more
            input channels, 1x1 included).  On an H100 dlight's cross-thread reduction, whose
            loads coalesce along the NHWC/OHWI channel axis, beats a serial channel loop
            (measured: 14x14x512 1x1 conv 0.054 ms vs 0.27 ms); on a CPU (PoCL) the serial
            loop wins by 10-50x.  Window-only reductions (depthwise, pooling, convs on 1-3
            input channels) are ours either way.
        long_reductions: Also take long reductions over few outputs (more than 512 terms and
            fewer than 16 outputs per term: a 7x7x672 -> 112 1x1 conv, a global pool), which a
            GPU leaves to dlight's cross-thread rules. Classifiers (one output pixel) stay
            with dlight's GEMV either way.
        window_only_tiles: ``(channels, 1)`` tiles for reductions over a window only
            (depthwise convolutions, pooling), largest first. Where 4 channels per work-item
            leave too few work-items, 2 and then 1 (ConvNeXt's 7x7 depthwise layers on 14x14x160:
            7,840 work-items of 196 multiply-adds each took 22 us per launch on the H200).
        window_tiles: Tiles for reductions over a kernel window (3x3 and 5x5 convolutions,
            depthwise or not, pooling), instead of ``tiles`` and ``window_only_tiles``;
            ``None``: those.
            On PoCL 8 channels x 1 pixel per work-item ran 3x3 and 5x5 convolutions over
            channels 2.2-3.6x faster than 8 x 4: the window's loads and padding tests
            multiply with the pixels of the tile.
        pad_stage: Pad a convolution's input in a kernel of its own (one work-item per
            padded pixel) instead of testing every tap against the border: on PoCL the
            convolutions ran 1.4-5x faster so, the copy included (pooling keeps its padding
            inline: there the copy cost more than it saved).
        unroll_channels: Unroll a loop over at most 16 input channels (with the window, when
            the two together stay small). On PoCL, keeping it a loop ran 1x1 convolutions on
            4-16 channels 1.3-6x faster (hand_landmark's 112x112x16 -> 64: 19 -> 3.3 ms),
            with one exception seen (56x56x12 -> 48: 2x slower).
        unroll_window: Unroll the kernel window's loops (small ones; the tile is always
            unrolled: its sums live in registers). Off, each kernel is a fraction of the
            text for a CPU OpenCL's compiler: PoCL generates every kernel's code at its
            first launch, and hand_landmark_lite's first start after a plain compile went
            from 8.7 to 6.7 s (compile 10.6 -> 6.1 s), its warm inference 18% slower
            (scripts/pocl_first_start.py).
    """

    def __init__(
        self,
        tiles: Sequence[tuple[int, int]] = ((8, 4), (8, 2), (4, 2), (4, 1)),
        min_work_items: int = _ENOUGH_WORK_ITEMS,
        channel_reductions: bool = True,
        long_reductions: bool = False,
        window_tiles: Sequence[tuple[int, int]] | None = None,
        window_only_tiles: Sequence[tuple[int, int]] = ((4, 1), (2, 1), (1, 1)),
        pad_stage: bool = False,
        unroll_channels: bool = True,
        unroll_window: bool = True,
    ) -> None:
        self.tiles = [tuple(t) for t in tiles]
        self.min_work_items = min_work_items
        self.channel_reductions = channel_reductions
        self.long_reductions = long_reductions
        self.window_tiles = None if window_tiles is None else [tuple(t) for t in window_tiles]
        self.window_only_tiles = [tuple(t) for t in window_only_tiles]
        self.pad_stage = pad_stage
        self.unroll_channels = unroll_channels
        self.unroll_window = unroll_window

    def _tile(
        self, channels: int, width: int, outputs: int, channel_reduction: bool, window: bool
    ) -> tuple[int, int]:
        candidates = self.tiles if channel_reduction else self.window_only_tiles
        if window and self.window_tiles is not None:
            candidates = self.window_tiles
        chosen = (1, 1)
        for f, p in candidates:
            fv = _largest_divisor(channels, [v for v in (f, 4, 2) if v <= f])
            pv = min(p, width)  # need not divide the width: the tail is predicated
            chosen = (fv, pv)
            if -(-outputs // (fv * pv)) >= self.min_work_items:
                break
        return chosen

    def _schedule(
        self,
        sch: s_tir.Schedule,
        target: Target,
        infos: list[Any],
        red_info: Any,
        s_ext: list[int],
        r_ext: list[int],
    ) -> s_tir.Schedule | None:
        n_s = len(s_ext)
        outputs = math.prod(s_ext)
        terms = math.prod(r_ext)
        long = terms > _SHORT_REDUCTION and outputs < _OUTPUTS_PER_TERM * terms
        if long and not self.long_reductions:
            return None
        red = red_info.block_rv
        red_name = red_info.name

        # Inline padding into the reduction (or keep it as a kernel of its own, see
        # ``pad_stage``) and the elementwise chain into its last block.
        others = [b for b in infos if b.name != red_name]
        padding = _padding_producers(sch, red) if self.pad_stage else set()
        if len(sch.get(red).reads) < 2:
            padding = set()  # a pool: cheap per tap, the copy cost more than it saved
        remaining = try_inline(sch, [b for b in others if b.name not in padding])
        red = sch.get_sblock(red_name)
        if len(remaining) > 1:
            return None
        epilogue = remaining[0].block_rv if remaining else None
        if epilogue is not None:
            consumers = sch.get_consumers(red)
            epilogue_name = sch.get(epilogue).name_hint
            if len(consumers) != 1 or sch.get(consumers[0]).name_hint != epilogue_name:
                return None
            # The epilogue runs per tile of the reduction's outputs, so it must write exactly
            # those elements: a channel pad after a pool (BlazeFace widening its shortcut)
            # writes more, and its extra channels would never be written.
            red_shape = [int(x) for x in sch.get(red).writes[0].source.shape]
            epi_shape = [int(x) for x in sch.get(epilogue).writes[0].source.shape]
            if red_shape != epi_shape or not _reads_in_place(sch, epilogue, red):
                return None

        loops = sch.get_loops(red)
        s_loops, r_loops = loops[:n_s], loops[n_s:]
        # A reduction over input channels (4 or more) tiles pixels too; a window-only reduction
        # (depthwise conv, pooling, a conv on 1-3 input channels) tiles channels only.
        channel_terms = _reduces_innermost_axis(sch.get(red))
        channel_reduction = n_s >= 2 and channel_terms >= 4
        if channel_reduction and not self.channel_reductions:
            return None
        if long and outputs == s_ext[-1] and channel_terms >= 4:
            # One output pixel: a classifier (GEMV). dlight's GEMV/Reduction read the weights
            # along the reduction across threads; serial rows were 1.3-1.5x slower on PoCL.
            return None
        width = s_ext[-2] if n_s >= 2 else 1
        window = terms > channel_terms
        fv, pv = self._tile(s_ext[-1], width, outputs, channel_reduction, window)
        f_o, f_i = sch.split(s_loops[-1], factors=[None, fv])
        if n_s >= 2:
            w_o, w_i = sch.split(s_loops[-2], factors=[None, pv])
            outer = [*s_loops[:-2], w_o, f_o]
            inner = [w_i, f_i]
        else:
            outer, inner = [f_o], [f_i]
        sch.reorder(*outer, *r_loops, *inner)
        work_items = -(-outputs // (fv * pv))
        fused = sch.fuse(*outer)

        # Accumulators in registers; the epilogue (or a plain write-back) runs per tile.
        # set_scope refuses a buffer that is also a function output: then we fall back.
        epilogue = _sums_in_registers(sch, red, epilogue, fused)
        threads = _threads_per_group(work_items, target)
        bx, tx = sch.split(fused, factors=[None, threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")

        # Unroll the kernel window (small reduction loops) and the tile.
        sch.decompose_reduction(red, r_loops[0])
        for i, (loop, ext) in enumerate(zip(r_loops, r_ext, strict=True)):
            if ext <= 1:
                continue
            channels = channel_reduction and i == len(r_ext) - 1 and ext == channel_terms
            if channels and not self.unroll_channels:
                continue
            if not channels and not self.unroll_window:
                continue
            if ext <= _UNROLL_EXTENT and self._unroll_ok(r_ext, ext):
                sch.unroll(loop)
        for loop in inner:
            sch.unroll(loop)
        for loop in sch.get_loops(epilogue)[2:]:
            sch.unroll(loop)
        for name in padding:
            _one_item_per_pixel(sch, sch.get_sblock(name), target)
        return sch

    @staticmethod
    def _unroll_ok(r_ext: list[int], ext: int) -> bool:
        # The kernel window (all reduction loops but the innermost channel loop) unrolls when
        # small; a long innermost loop (input channels, a global pool row) stays a loop.
        return math.prod(e for e in r_ext if e <= _UNROLL_EXTENT) <= _UNROLL_TOTAL or ext <= 3


#: Slices a long window is cut into by `WindowReduction`'s first stage.
_SLICES = 256
#: `WindowReduction` takes windows of at least this many terms over fewer outputs than ...
_WINDOW_TERMS = 64
#: ... this (one serial work-item per output would leave an H100 nearly idle).
_FEW_OUTPUTS = 4096


class WindowReduction(_SingleReductionRule):
    """A large window over few outputs (global pooling) in two stages, two kernels.

    `SerialReduction` refuses these (a 128x128 window for 16 channels: 16 work-items, each
    summing 16384 terms), and dlight's reduction rules give each output one group that reads
    with a stride of the channel count (0.15 ms for selfie's 128x128x16 pool on the H100).
    Stage 1 cuts the window into up to `_SLICES` slices (``rfactor``) and sums each slice of
    each output in its own work-item (consecutive work-items take consecutive channels:
    coalesced reads; the slice loop unrolled by 8 for loads in flight); stage 2 gives each
    output a group whose threads add the slices' partial sums (a cross-thread reduction) and
    applies the epilogue (the average's division). Only window-only reductions (pooling)
    qualify: a reduction over the innermost (channel) axis is a matmul.

    Args:
        threads: Work-items per group, at most (the target's limit applies too).
    """

    def __init__(self, threads: int = 256) -> None:
        self.threads = threads

    def _schedule(
        self,
        sch: s_tir.Schedule,
        target: Target,
        infos: list[Any],
        red_info: Any,
        s_ext: list[int],
        r_ext: list[int],
    ) -> s_tir.Schedule | None:
        n_s = len(s_ext)
        outputs = math.prod(s_ext)
        terms = math.prod(r_ext)
        # Long reductions over few outputs: what SerialReduction leaves (more than 512 terms)
        # and, ahead of it, windows of 64+ terms for fewer than _FEW_OUTPUTS outputs (selfie's
        # 16x16 pools over 96 channels: 96 serial work-items took 0.10-0.16 ms each).
        if (terms < _WINDOW_TERMS or outputs >= _FEW_OUTPUTS) and (
            terms <= _SHORT_REDUCTION or outputs >= _OUTPUTS_PER_TERM * terms
        ):
            return None
        red_name = red_info.name
        if _reduces_innermost_axis(sch.get(red_info.block_rv)) != 1:
            return None
        remaining = try_inline(sch, [b for b in infos if b.name != red_name])
        red = sch.get_sblock(red_name)
        if len(remaining) > 1:
            return None
        epilogue = remaining[0].block_rv if remaining else None
        if epilogue is not None:
            consumers = sch.get_consumers(red)
            if (
                len(consumers) != 1
                or sch.get(consumers[0]).name_hint != sch.get(epilogue).name_hint
            ):
                return None
            red_shape = [int(x) for x in sch.get(red).writes[0].source.shape]
            epi_shape = [int(x) for x in sch.get(epilogue).writes[0].source.shape]
            if red_shape != epi_shape:
                return None

        cap = min(self.threads, int(max_threads_per_block(target)))
        # Slices divide the window exactly (rfactor over an inexact split sums wrongly in TVM
        # 0.27): the most slices, at most _SLICES, of at least 8 terms each.
        slices = max(
            (d for d in range(1, _SLICES + 1) if terms % d == 0 and terms // d >= 8), default=1
        )
        if slices < 16:
            return None
        loops = sch.get_loops(red)
        r_loops = loops[n_s:]
        r = sch.fuse(*r_loops)
        r_s, r_i = sch.split(r, factors=[slices, None])
        # Stage 1 (its own kernel): partial sums of each slice of the window, one work-item
        # per (slice, output); consecutive work-items take consecutive channels.
        rf = sch.rfactor(r_s, factor_axis=0)
        rf_loops = sch.get_loops(rf)
        # rf loops: the spatial loops, then the slice loop (now spatial), then r_i.
        *sp, k, ri = rf_loops
        sch.reorder(k, *sp, ri)
        fused = sch.fuse(k, *sp)
        bx, tx = sch.split(fused, factors=[None, cap])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        unroll = _largest_divisor(terms // slices, [8, 4, 2])
        ri_o, ri_i = sch.split(ri, factors=[None, unroll])
        sch.unroll(ri_i)
        sch.reverse_compute_at(sch.cache_write(rf, 0, "local"), tx, preserve_unit_loops=False)
        # Stage 2: one group per output, the slices summed across its threads.
        loops = sch.get_loops(red)
        *sp2, k2 = loops
        out = sch.fuse(*sp2)
        sch.bind(out, "blockIdx.x")
        k_o, k_i = sch.split(k2, factors=[None, min(cap, slices)])
        sch.bind(k_i, "threadIdx.x")
        if epilogue is not None:
            sch.set_scope(red, 0, "local")
            sch.reverse_compute_at(epilogue, out, preserve_unit_loops=False)
        return sch


def _no_reuse(block: s_tir.SBlock, outputs: int, terms: int) -> bool:
    """Whether the reduction reads some buffer whole, each element once (a pool, a mean, a
    GEMV's weights): then the kernel is bound by that read, and no tile reuses data (unlike
    a convolution over pixels, a matmul)."""
    for region in block.reads:
        shape = region.source.shape
        if (
            all(isinstance(d, tirx.IntImm) for d in shape)
            and math.prod(int(d) for d in shape) >= outputs * terms
        ):
            return True
    return False


def _last_indices(block: s_tir.SBlock) -> list[tirx.PrimExpr]:
    return [region.region[-1].min for region in block.reads if region.region]


def _single_epilogue(sch: s_tir.Schedule, infos: list[Any], red_name: str) -> Any:
    """Inline the blocks around the reduction: None where more than one is left or the one
    left is not the reduction's only consumer over the same shape, else ``(epilogue,)``
    (``(None,)`` without one)."""
    remaining = try_inline(sch, [b for b in infos if b.name != red_name])
    red = sch.get_sblock(red_name)
    if len(remaining) > 1:
        return None
    epilogue = remaining[0].block_rv if remaining else None
    if epilogue is not None:
        consumers = sch.get_consumers(red)
        if len(consumers) != 1 or sch.get(consumers[0]).name_hint != sch.get(epilogue).name_hint:
            return None
        # The same outputs, unit axes aside: a fully connected layer's [tokens, channels]
        # sums with a residual added as [1, tokens, channels] (the vision transformers'
        # projections; they had dlight's Matmul alone, 3x slower on the H200).
        red_shape = _non_unit(sch.get(red).writes[0].source.shape)
        epi_shape = _non_unit(sch.get(epilogue).writes[0].source.shape)
        if red_shape != epi_shape:
            return None
    return (epilogue,)


def _non_unit(shape: Any) -> list[int]:
    return [int(x) for x in shape if int(x) != 1]


def _reads_in_place(sch: s_tir.Schedule, consumer: Any, producer: Any) -> bool:
    """Whether ``consumer`` reads ``producer``'s output (of its own output's shape) only at
    the element it writes. An epilogue run per tile of the producer's outputs must: one
    that permutes them (a window partition inlined after a product: Swin V2's patch
    merging, rows ``r -> r // 196 * 196 + r % 49 // 7 * 28 ...``) reads, for a tile of two
    rows, a span of rows that other tiles compute, and TVM 0.27 sizes its loop by an
    expression it cannot unroll."""
    buf = sch.get(producer).writes[0].source
    block = sch.get(consumer)
    analyzer = tvm.sym.Analyzer()
    for iv in block.iter_vars:  # (a reshape to the same shape indexes (j // n + i) % m)
        analyzer.bind(iv.var, iv.dom)
    written = [r.min for r in block.writes[0].region]
    for region in block.reads:
        if not region.source.same_as(buf):
            continue
        if len(region.region) != len(written):
            return False
        for r, w in zip(region.region, written, strict=True):
            if not analyzer.can_prove_equal(r.min, w):
                return False
    return True


def _sums_in_registers(
    sch: s_tir.Schedule, red: Any, epilogue: Any, loop: s_tir.schedule.LoopRV
) -> Any:
    """Keep the reduction's sums in registers (``local``) and run the epilogue, or a plain
    write-back where there is none, under ``loop``; returns that block. Done before ``loop``
    is split by the work-group size: splitting then predicates every block alike
    (reverse_compute_at under an inexact split derives a wrong consumer region in TVM 0.27
    and drops the predicate)."""
    if epilogue is None:
        epilogue = sch.cache_write(red, 0, "local")
    else:
        sch.set_scope(red, 0, "local")
    sch.reverse_compute_at(epilogue, loop, preserve_unit_loops=False)
    return epilogue


def _floor_pow2(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


#: `ColumnReduction` takes reductions over at most this many outputs (beyond, one work-item
#: per 4 outputs already fills a GPU) ...
_COLUMN_OUTPUTS = 4096
#: ... of at least this many terms (shorter windows: `SerialReduction`'s); `RowReduction`
#: shares its rows' threads only for rows of at least this many terms.
_COLUMN_TERMS = 16


class ColumnReduction(_SingleReductionRule):
    """Few outputs along the innermost (contiguous) axis, reduced over outer axes, in one
    kernel: the global average pool of an NHWC map (a squeeze-excite block's, 1x14x14x96 ->
    1x1x1x96), a mean over the rows of a ``[N, C]`` matrix.

    `SerialReduction` gives these one work-item per 4 outputs (96 channels: 24 work-items,
    each reading 4 x 196 terms strided by the channel count; ~40 us on the H100) and dlight's
    reduction rules one work-group per output, whose threads also read with the channel
    stride. Here a work-group of ``channels`` x ``slices`` threads owns ``channels``
    consecutive outputs: thread ``(c, s)`` sums terms ``s, s + slices, ...`` of output ``c``
    (``threadIdx.x`` along the channels: a warp reads runs of 16 consecutive floats, whole
    32-byte sectors, where one work-item per output reads one float per sector), then the
    group adds its slices' partial sums in local memory (TVM's cross-thread reduction over
    ``threadIdx.y``; thread ``(c, 0)`` applies the epilogue, the average's division or the
    block's activation, and stores). Reads coalesce, and the kernel runs ``channels *
    slices`` threads per ``channels`` outputs instead of one per 4 (96 channels of 14x14:
    6 groups of 256 threads, 13 terms each, instead of 24 work-items of 4 x 196 terms).

    Applies to one reduction that reads each element of its input once (no reuse: not a
    convolution) with the output's innermost axis as every read's innermost index, at most
    `_COLUMN_OUTPUTS` outputs of at least `_COLUMN_TERMS` terms.

    Args:
        channels: Outputs (consecutive channels) per work-group, at most.
        threads: Threads per work-group, at most (the target's limit applies too); the
            slices are ``threads / channels``, fewer where the reduction is short (each
            thread sums at least ``min_terms`` terms where it can).
        min_terms: Terms per thread the slices aim at, at least.
    """

    def __init__(self, channels: int = 16, threads: int = 256, min_terms: int = 4) -> None:
        self.channels = channels
        self.threads = threads
        self.min_terms = min_terms

    def _schedule(
        self,
        sch: s_tir.Schedule,
        target: Target,
        infos: list[Any],
        red_info: Any,
        s_ext: list[int],
        r_ext: list[int],
    ) -> s_tir.Schedule | None:
        n_s = len(s_ext)
        outputs, terms = math.prod(s_ext), math.prod(r_ext)
        if outputs > _COLUMN_OUTPUTS or terms < _COLUMN_TERMS:
            return None
        block = sch.get(red_info.block_rv)
        if not _no_reuse(block, outputs, terms):
            return None
        inner = block.iter_vars[n_s - 1].var
        if not all(last.same_as(inner) for last in _last_indices(block)):
            return None  # not coalesced along the outputs
        red_name = red_info.name
        found = _single_epilogue(sch, infos, red_name)
        if found is None:
            return None
        (epilogue,) = found
        red = sch.get_sblock(red_name)

        cap = max(1, min(self.threads, int(max_threads_per_block(target))))
        channels = min(self.channels, _floor_pow2(outputs), cap)
        if outputs < channels:
            channels = outputs
        slices = min(cap // channels, _floor_pow2(max(1, terms // self.min_terms)))
        loops = sch.get_loops(red)
        s = sch.fuse(*loops[:n_s]) if n_s > 1 else loops[0]
        r = sch.fuse(*loops[n_s:]) if len(loops) - n_s > 1 else loops[n_s]
        _sums_in_registers(sch, red, epilogue, s)
        bx, tx = sch.split(s, factors=[None, channels])
        r_o, ty = sch.split(r, factors=[None, slices])
        sch.reorder(ty, r_o)
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        sch.bind(ty, "threadIdx.y")
        return sch


class RowReduction(_SingleReductionRule):
    """Reductions over the innermost (contiguous) axis of each row: the mean and variance of
    a layer norm over the channels (``[N, C]``, C = 24-240), the small fully-connected layers
    of a squeeze-excite block (a 1x1 convolution on one pixel: a GEMV, ``Cout`` rows of
    ``Cin`` weights).

    `SerialReduction` gives each work-item 4 rows (64 rows of 168: 16 work-items, each
    reading its rows serially, consecutive work-items 4 rows apart: 1-13 GB/s on an H100).
    Here ``lanes`` threads share each row: lane ``l`` sums terms ``l, l + lanes, ...``
    (a warp reads consecutive floats of a row: coalesced), the lanes' partial sums meet in
    a cross-thread reduction (``threadIdx.x``; warp shuffles in CUDA, local memory in
    OpenCL), and the epilogue (bias and activation, or ``+ eps`` and ``rsqrt``) runs on
    the sum. A work-group holds ``threads / lanes`` rows (``threadIdx.y``). ``lanes=1``
    is one work-item per row with a serial loop and no barrier.

    Applies to one reduction over one axis that reads each element of some input once (a
    row of a matrix, a GEMV's weights; not a matmul) and is every read's innermost index
    or absent from it (a GEMV's vector), at least `_COLUMN_TERMS` terms for ``lanes > 1``.

    Args:
        lanes: Threads per row, at most (a power of two); fewer for short rows, so that each
            sums about ``min_terms`` terms or more.
        threads: Threads per work-group, at most: fewer (64-128) when the rows are few, so
            that the groups spread over the GPU.
        min_terms: Terms per lane the lanes aim at, at least.
        max_terms: Longest rows taken (``None``: any). Rows of more than 512 terms (a
            classifier's 1000 x 1024 weights, a late squeeze-excite layer's 144 x 576) were
            dlight's GEMV's before this rule; they stay so by default, this rule a variant.
    """

    def __init__(
        self,
        lanes: int = 32,
        threads: int = 256,
        min_terms: int = 2,
        max_terms: int | None = _SHORT_REDUCTION,
    ) -> None:
        self.lanes = lanes
        self.threads = threads
        self.min_terms = min_terms
        self.max_terms = max_terms

    def _schedule(
        self,
        sch: s_tir.Schedule,
        target: Target,
        infos: list[Any],
        red_info: Any,
        s_ext: list[int],
        r_ext: list[int],
    ) -> s_tir.Schedule | None:
        n_s = len(s_ext)
        rows, terms = math.prod(s_ext), math.prod(r_ext)
        if len(r_ext) != 1 or (self.lanes > 1 and terms < _COLUMN_TERMS):
            return None
        if self.max_terms is not None and terms > self.max_terms:
            return None  # long rows (classifiers): dlight's GEMV, unless a variant
        block = sch.get(red_info.block_rv)
        if not _no_reuse(block, rows, terms):
            return None
        k = block.iter_vars[n_s].var
        if not all(last.same_as(k) or not _uses_var(last, k) for last in _last_indices(block)):
            return None
        if not any(last.same_as(k) for last in _last_indices(block)):
            return None
        found = _single_epilogue(sch, infos, red_info.name)
        if found is None:
            return None
        cap = max(1, min(self.threads, int(max_threads_per_block(target))))
        lanes = min(self.lanes, cap, _floor_pow2(max(1, terms // self.min_terms)))
        return _lanes_per_row(sch, target, red_info.name, found[0], n_s, rows, lanes, cap)


def _lanes_per_row(
    sch: s_tir.Schedule,
    target: Target,
    red_name: str,
    epilogue: Any,
    n_s: int,
    rows: int,
    lanes: int,
    cap: int,
    unroll: int = 0,
) -> s_tir.Schedule:
    """``lanes`` threads along each row of the reduction (its reduction loops fused: lane
    ``l`` sums terms ``l, l + lanes, ...``), rows along ``threadIdx.y``, as many rows per
    work-group as ``cap`` threads hold, the epilogue (or a write-back) on each row's sum;
    ``lanes == 1``: one work-item per row, no cross-thread reduction. ``unroll``: unroll each
    lane's serial loop by up to that many steps (several loads in flight)."""
    red = sch.get_sblock(red_name)
    per_group = max(1, min(_threads_per_group(rows * lanes, target), cap) // lanes)
    per_group = min(per_group, rows)
    loops = sch.get_loops(red)
    s = sch.fuse(*loops[:n_s]) if n_s > 1 else loops[0]
    r = sch.fuse(*loops[n_s:]) if len(loops) - n_s > 1 else loops[n_s]
    _sums_in_registers(sch, red, epilogue, s)
    bx, ty = sch.split(s, factors=[None, per_group])
    sch.bind(bx, "blockIdx.x")
    if lanes == 1:
        sch.bind(ty, "threadIdx.x")
        return sch
    r_o, tx = sch.split(r, factors=[None, lanes])
    sch.reorder(tx, r_o)
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    if unroll:
        sch.annotate(r_o, "pragma_auto_unroll_max_step", unroll)
        sch.annotate(r_o, "pragma_unroll_explicit", 1)
    return sch


class LaneReduction(_SingleReductionRule):
    """Convolutions and matrix products over input channels with a warp's lanes along the
    reduction: split-K inside the work-group (a tuning variant for GPUs).

    dlight's Matmul (the ``gpu`` profile's choice for convolutions over channels) gives each
    work-group a tile of outputs and walks the whole reduction in 16-deep steps, each a round
    trip through local memory with a barrier: a 3x3 convolution of SqueezeNet's 13x13 maps
    (169 x 256 outputs of 576 terms) makes 176 groups of 36 serial steps, latency-bound on
    an H100 (~40 us for 50 MFLOP). Here ``lanes`` threads share each output: lane ``l`` sums
    terms ``l, l + lanes, ...`` of the fused reduction (kernel window, then channels: a
    warp's lanes read consecutive channels, coalesced), the partial sums meet in a
    cross-thread reduction, and the epilogue runs on the sum. A work-group holds
    ``threads / lanes`` outputs along the output channels, which share their input pixel
    (read once per group from the cache). No local-memory tiles, no barriers but the
    reduction's; little reuse, so it pays where the reduction is long and outputs few.

    Args:
        lanes: Threads per output (a power of two, at most 32: one warp).
        threads: Threads per work-group, at most.
        min_terms: Shortest reduction taken.
        max_outputs: Most outputs taken (larger layers have the parallelism dlight's tiles
            need, and reuse they lack here).
    """

    def __init__(
        self,
        lanes: int = 16,
        threads: int = 256,
        min_terms: int = 128,
        max_outputs: int = 1 << 19,
    ) -> None:
        self.lanes = lanes
        self.threads = threads
        self.min_terms = min_terms
        self.max_outputs = max_outputs

    def _schedule(
        self,
        sch: s_tir.Schedule,
        target: Target,
        infos: list[Any],
        red_info: Any,
        s_ext: list[int],
        r_ext: list[int],
    ) -> s_tir.Schedule | None:
        n_s = len(s_ext)
        rows, terms = math.prod(s_ext), math.prod(r_ext)
        if terms < self.min_terms or rows > self.max_outputs or rows < 2:
            return None
        block = sch.get(red_info.block_rv)
        if _reduces_innermost_axis(block) < 4 or _no_reuse(block, rows, terms):
            return None  # a window-only reduction, or a row read once (`RowReduction`'s)
        found = _single_epilogue(sch, infos, red_info.name)
        if found is None:
            return None
        cap = max(1, min(self.threads, int(max_threads_per_block(target))))
        lanes = min(self.lanes, 32, cap, _floor_pow2(max(1, terms // 8)))
        # Several loads in flight per lane: the serial loop unrolled by up to 8.
        return _lanes_per_row(
            sch, target, red_info.name, found[0], n_s, rows, lanes, cap, unroll=8
        )  # fmt: skip


#: `TiledLaneReduction` takes input channels that its lanes do not divide only where they
#: make this many steps of the lanes or more: the predicated last step then idles few lanes
#: (and short ragged reductions, many in small models, do not cost a variant's bytes).
_RAGGED_MIN_LANE_STEPS = 16


class TiledLaneReduction(_SingleReductionRule):
    """Convolutions over input channels with a register tile per thread and split-K across
    a few lanes (a tuning variant for GPUs; issue 15: SqueezeNet's 3x3 expand convolutions
    ran at 2-3 TFLOP/s with dlight's Matmul and `LaneReduction`).

    Each thread owns ``pixels`` adjacent output pixels (along the width) x ``channels``
    adjacent output channels, accumulated in registers; ``lanes`` threads share that tile's
    reduction, lane ``l`` taking input channels ``l, l + lanes, ...`` under every tap of the
    kernel window (a warp's lanes read consecutive channels: coalesced), so each step loads
    ``pixels + channels`` values for ``pixels * channels`` multiply-adds. With ``vector``
    > 1 a lane takes ``vector`` consecutive channels at a time, as one vector load of the
    input and of each weight row, and keeps that many partial sums per output. The lanes'
    partial tiles meet in local memory behind one barrier; each lane then sums the
    partials of its share of the tile's outputs and runs the epilogue on them. A
    work-group holds a rectangle of tiles (along the width and the output channels; those
    along the channels share their input pixels, read through the cache).

    Applies to one reduction whose innermost axis is the input channels (the kernel window
    outside; a multiple of ``lanes * vector``, or with ``vector`` 1 any count of at least
    16 steps of the lanes: the last step's lanes beyond it are predicated off, as for the
    197 tokens an attention's ``weights @ values`` sums), over at least ``min_terms`` terms,
    to tiles of a multiple of ``lanes`` outputs, where a group holds a warp's threads or
    more.

    Args:
        pixels: Output pixels per thread (fewer where the row is shorter).
        channels: Output channels per thread (the largest of ``channels``, 4 and 2 that
            divides the output channels).
        lanes: Threads sharing each tile's reduction (a power of two, at most 32).
        vector: Consecutive input channels a lane loads at once (1, 2 or 4).
        threads: Threads per work-group, at most.
        min_terms: Shortest reduction taken.
        min_macs: Fewest multiply-adds (outputs x terms) taken: smaller convolutions take
            a few microseconds with any schedule, and every variant costs compile time
            and cache bytes.
    """

    def __init__(
        self,
        pixels: int = 4,
        channels: int = 4,
        lanes: int = 8,
        vector: int = 1,
        threads: int = 128,
        min_terms: int = 64,
        min_macs: int = 1 << 20,
    ) -> None:
        self.pixels = pixels
        self.channels = channels
        self.lanes = lanes
        self.vector = vector
        self.threads = threads
        self.min_terms = min_terms
        self.min_macs = min_macs

    def _group(self, s_ext: list[int], tm: int, cap: int) -> tuple[int, int, int] | None:
        """(channels per thread, tiles per group along the width, along the channels): the
        group's tiles one rectangle of the output (under an inexact split TVM 0.27 derives
        the stages' regions wrong after reverse_compute_at, or refuses them)."""
        per_group = cap // self.lanes
        w_tiles = -(-s_ext[-2] // tm)
        for tn in dict.fromkeys(v for v in (self.channels, 4, 2) if v <= self.channels):
            if s_ext[-1] % tn or (tm * tn) % self.lanes:
                continue
            c_tiles = s_ext[-1] // tn
            gc = max(d for d in range(1, min(c_tiles, per_group) + 1) if c_tiles % d == 0)
            gw = max(d for d in range(1, min(w_tiles, per_group // gc) + 1) if w_tiles % d == 0)
            if gw * gc * self.lanes >= 32:
                return tn, gw, gc
        return None

    def _schedule(
        self,
        sch: s_tir.Schedule,
        target: Target,
        infos: list[Any],
        red_info: Any,
        s_ext: list[int],
        r_ext: list[int],
    ) -> s_tir.Schedule | None:
        n_s, lanes, vec = len(s_ext), self.lanes, self.vector
        rows, terms = math.prod(s_ext), math.prod(r_ext)
        if terms < self.min_terms or rows * terms < self.min_macs or n_s < 2:
            return None
        block = sch.get(red_info.block_rv)
        cin = _reduces_innermost_axis(block)
        ragged = cin % (lanes * vec) and (vec > 1 or cin < _RAGGED_MIN_LANE_STEPS * lanes)
        if cin != r_ext[-1] or ragged or _no_reuse(block, rows, terms):
            return None
        tm = min(self.pixels, s_ext[-2])
        cap = max(lanes, min(self.threads, int(max_threads_per_block(target))))
        shape = self._group(s_ext, tm, cap)
        if shape is None:
            return None
        tn, gw, gc = shape
        found = _single_epilogue(sch, infos, red_info.name)
        if found is None:
            return None
        red = sch.get_sblock(red_info.name)
        # (without an epilogue, a write-back of the sums: the same steps below)
        epilogue = found[0] if found[0] is not None else sch.cache_write(red, 0, "global")
        loops = sch.get_loops(red)
        s_loops, r_loops = loops[:n_s], loops[n_s:]

        # The tile: pixels along the width (a contiguous region, so that the stages below
        # cover the tile's outputs only), channels, and the lanes over the input channels.
        w_o, m_t = sch.split(s_loops[-2], factors=[None, tm])
        c_o, c_t = sch.split(s_loops[-1], factors=[None, tn])
        w_oo, w_oi = sch.split(w_o, factors=[None, gw])
        c_oo, c_oi = sch.split(c_o, factors=[None, gc])
        ci_o, ci_l, ci_v = sch.split(r_loops[-1], factors=[None, lanes, vec])
        lv = sch.fuse(ci_l, ci_v)
        groups, tiles = [*s_loops[:-2], w_oo, c_oo], [w_oi, c_oi]
        sch.reorder(*groups, *tiles, lv, *r_loops[:-1], ci_o, m_t, c_t)
        rf = sch.rfactor(lv, factor_axis=0)  # each lane's partial tile (x vec)
        loops = sch.get_loops(rf)
        bx = sch.fuse(*loops[: len(groups)])
        ty = sch.fuse(*loops[len(groups) : len(groups) + 2])
        lane, v = sch.split(sch.get_loops(rf)[2], factors=[lanes, vec])
        sch.bind(bx, "blockIdx.x")
        sch.bind(ty, "threadIdx.y")
        sch.bind(lane, "threadIdx.x")
        inner = sch.get_loops(rf)[4:]  # (window...), ci_o, m_t, c_t
        sch.reorder(*inner, v)
        if vec > 1:
            sch.vectorize(v)  # (before the reduction is decomposed: TVM refuses it after)
        # Partials accumulate in registers, then go to local memory for the lanes to share.
        partial = sch.cache_write(rf, 0, "local")
        sch.reverse_compute_at(partial, lane, preserve_unit_loops=True)
        sch.set_scope(partial, 0, "shared")
        # The sum over the lanes: each lane takes tm * tn / lanes of the tile's outputs,
        # sums them in a register and runs the epilogue on them.
        sch.reverse_compute_at(red, ty, preserve_unit_loops=True)
        w_loops = sch.get_loops(red)[2:]  # (the lanes' partials, then the tile)
        e = sch.fuse(*w_loops[1:])
        sch.reorder(e, w_loops[0])
        _, e_l = sch.split(e, factors=[None, lanes])
        sch.bind(e_l, "threadIdx.x")
        sch.set_scope(red, 0, "local")
        sch.reverse_compute_at(epilogue, e_l, preserve_unit_loops=True)
        sch.decompose_reduction(rf, sch.get_loops(rf)[3])
        sch.decompose_reduction(red, w_loops[0])

        # The tile unrolled (registers), small window loops too, the channel loop by 4,
        # the lane's channels one vector.
        r_loops = sch.get_loops(rf)  # bx, ty, lane, (window...), ci_o, m_t, c_t, v
        for loop in r_loops[-3:-1]:
            sch.unroll(loop)
        for loop in r_loops[3:-4]:
            if (_static_extent(sch, loop) or _UNROLL_EXTENT + 1) <= 3:
                sch.unroll(loop)
        sch.annotate(r_loops[-4], "pragma_auto_unroll_max_step", 4)
        sch.annotate(r_loops[-4], "pragma_unroll_explicit", 1)
        for loop in sch.get_loops(partial)[3:]:
            sch.unroll(loop)
        return sch


#: Fewest multiply-adds of a convolution `SharedMatmul` takes (8M). Each variant is a kernel
#: more in the cache entry: offered on every convolution of 1M and more, its variants took
#: the entries of the two small real models of the zoo (about 240 KB each, convolutions of
#: 1-4M multiply-adds) from 13.1% and 14.8% of the model file to 16.4% and 18.9%, over the
#: 15% issue 16 allows. The convolutions where it won on the H200 (ResNet-18, SqueezeNet's
#: 3x3 and classifier layers, TinyViT's 1x1 layers) are of 20M and more.
_CONV_MIN_MACS = 1 << 23


class SharedMatmul(_SingleReductionRule):
    """Matrix products through shared memory, with split-K across the work-group (a tuning
    variant for GPUs; issue 15: the vision transformers' 197-token products ran at 1-2
    TFLOP/s with the register-tiled split-K of `TiledLaneReduction`, DeiT-Tiny's fc2
    taking 28-33 us on the H200).

    A work-group computes a ``rows x cols`` tile of the product (``rows = tm * mm``, ``cols
    = tn * mn``): ``tm x tn`` threads own ``mm x mn`` outputs each, in registers, and
    ``lanes`` such planes of threads split the reduction. Each step stages ``lanes * step``
    terms of both operands' tiles in local memory, fetched by all the group's threads
    along the operand's contiguous axis (coalesced whichever way an operand is laid out);
    lane ``z`` then sums terms ``z * step ... z * step + step - 1`` of the step. The lanes'
    partial tiles meet in local memory; each thread sums the partials of some of the
    tile's outputs and runs the epilogue (bias, residual) on them. Rows, columns and terms
    are padded to the tile and step (predicated loads and stores): 197 tokens, 197 terms.

    Applies to one reduction named a matrix product (``matmul``: relax's ``matmul`` and the
    fully connected layers lowered to it, batched or not) over one reduction axis, and to
    NHWC convolutions over input channels, any window, stride, dilation or padding, not
    grouped (`_as_product`), taken as output pixels x (window taps x input channels): a
    vision transformer's patch embedding (DeiT's 16x16 patches of 3 channels took 78-83 us
    on the H200 before), the 1x1 and 3x3 layers of CNNs (SqueezeNet's 1x1 classifier, 512
    terms for 169 x 1000 outputs, took 34 us with the register-tiled rules). The blocks
    that make a convolution's input (its padding, a concatenation folded in) are inlined
    into the fetch of its tiles. Both operands read whole, at least ``min_macs``
    multiply-adds.

    Args:
        tm: Threads along the rows of the tile.
        tn: Threads along its columns (adjacent threads: adjacent columns).
        mm: Rows per thread.
        mn: Columns per thread.
        lanes: Thread planes splitting the reduction.
        step: Terms per lane per staged step.
        min_macs: Fewest multiply-adds taken (a variant costs compile time and cache bytes).
        splits: Work-groups splitting the reduction of each tile (above 1: each writes its
            planes' partial tiles to global memory, and a second kernel sums them and runs
            the epilogue, one thread per output).
        min_terms: Shortest reduction taken.
        pad_rows: Pad the rows of a tile staged as [rows, terms] to 32k + 1 words (no bank
            conflicts where adjacent threads read adjacent rows).
        min_taps: Fewest window taps of a convolution taken (the GPU profile's default
            rules: 64, patch embeddings only; the other convolutions have it as a tuning
            variant).
        conv_min_macs: Fewest multiply-adds of a convolution taken (`_CONV_MIN_MACS`).
    """

    def __init__(
        self,
        tm: int = 8,
        tn: int = 8,
        mm: int = 2,
        mn: int = 2,
        lanes: int = 4,
        step: int = 8,
        min_macs: int = 1 << 20,
        splits: int = 1,
        min_terms: int = 0,
        pad_rows: bool = True,
        min_taps: int = 1,
        conv_min_macs: int = _CONV_MIN_MACS,
    ) -> None:
        self.tm, self.tn, self.mm, self.mn = tm, tn, mm, mn
        self.lanes, self.step = lanes, step
        self.min_macs = min_macs
        self.splits = splits
        self.min_terms = min_terms
        self.pad_rows = pad_rows
        self.min_taps = min_taps
        self.conv_min_macs = conv_min_macs

    def _schedule(
        self,
        sch: s_tir.Schedule,
        target: Target,
        infos: list[Any],
        red_info: Any,
        s_ext: list[int],
        r_ext: list[int],
    ) -> s_tir.Schedule | None:
        n_s = len(s_ext)
        if n_s < 2 or math.prod(s_ext) * math.prod(r_ext) < self.min_macs:
            return None
        s_ext_in, r_ext_in = s_ext, r_ext
        if "matmul" in red_info.name:
            if len(r_ext) != 1:
                return None
        elif math.prod(s_ext) * math.prod(r_ext) < self.conv_min_macs or not self._as_product(
            sch, red_info, s_ext, r_ext, self.min_taps
        ):
            return None
        else:
            s_ext = [*s_ext[:-3], s_ext[-3] * s_ext[-2], s_ext[-1]]
            r_ext = [math.prod(r_ext)]
            n_s = len(s_ext)
        tm, tn, lanes = self.tm, self.tn, self.lanes
        if tm * tn * lanes > int(max_threads_per_block(target)) or r_ext[0] < self.min_terms:
            return None
        if s_ext[-2] < _GEMM_MIN_ROWS:
            return None  # a matrix-vector product: a tile's rows would be padding
        # A convolution's input keeps the blocks that make it (its padding, a concatenation
        # fused in: two reads) until they are inlined into the fetch of its tiles below.
        chain = _input_chain(sch, red_info.block_rv)
        found = _single_epilogue(sch, [b for b in infos if b.name not in chain], red_info.name)
        if found is None:
            return None
        red = sch.get_sblock(red_info.name)
        # the two operands; other reads must be scalars (an attention's scale on q and k)
        operands = [
            n for n, r in enumerate(sch.get(red).reads)
            if math.prod(int(x) for x in r.source.shape) > 1
        ]  # fmt: skip
        if len(operands) != 2:
            return None
        if "matmul" not in red_info.name:
            # [(n,) h, w, f] x [ry, rx, rc] -> [(n,) h * w + w, f] x [(ry * kw + rx) * c + rc]
            # (a 1x1 window's unit axes are gone: [rc]; a 1xk one's: [rx, rc])
            w, n_r = s_ext_in[-2], len(r_ext_in)

            def flat(*iters: Any) -> Any:
                *lead, y, x, f = iters[: len(iters) - n_r]
                term = iters[len(iters) - n_r]
                for r, ext in zip(iters[len(iters) - n_r + 1 :], r_ext_in[1:], strict=True):
                    term = term * ext + r
                return (*lead, y * w + x, f, term)

            ndim = len(s_ext_in) + n_r
            sch.transform_block_layout(red, tirx.IndexMap.from_func(flat, ndim=ndim))
            if found[0] is not None:  # the epilogue over the same pixels, so that each
                # thread's share of the tile is a range of them (else its region grows)

                def pixels(*iters: Any) -> Any:
                    *lead, y, x, f = iters
                    return (*lead, y * w + x, f)

                epi_ndim = len(sch.get(found[0]).iter_vars)
                sch.transform_block_layout(found[0], tirx.IndexMap.from_func(pixels, ndim=epi_ndim))
        block = sch.get(red)
        # Both operands as copies indexed by the block's iterators (an einsum for
        # pad_einsum), each laid out with its contiguous axis innermost so that the fetches
        # below coalesce; the copies are inlined into the fetches again.
        k_var = block.iter_vars[n_s].var
        terms_inner = {}
        # an operand computed in the kernel: laid out as the memory it is computed from
        computed = _source_terms_inner(sch, red, n_s) if "matmul" in red_info.name else {}
        for idx in operands:
            last = block.reads[idx].region[-1].min
            copy = sch.reindex(red, ("read", idx))
            terms_inner[idx] = computed.get(idx, _uses_var(last, k_var))
            if not terms_inner[idx]:
                sch.transform_layout(copy, ("write", 0), lambda *ax: (*ax[:-2], ax[-1], ax[-2]))
        if "matmul" not in red_info.name:
            # the sums as [batch, pixels, channels]: a copy indexed so (inlined below)
            sch.reindex(red, ("write", 0))
        rows, cols, splits = tm * self.mm, tn * self.mn, self.splits
        sch.pad_einsum(red, [1] * (n_s - 2) + [rows, cols, splits * lanes * self.step])
        loops = sch.get_loops(red)
        batch, i, j, k = loops[: n_s - 2], loops[n_s - 2], loops[n_s - 1], loops[n_s]
        i_o, i_t, i_m = sch.split(i, [None, tm, self.mm])
        j_o, j_t, j_n = sch.split(j, [None, tn, self.mn])
        k_s, k_o, k_z, k_i = sch.split(k, [splits, None, lanes, self.step])
        sch.reorder(*batch, i_o, j_o, k_s, k_z, i_t, j_t, k_o, k_i, i_m, j_n)
        # each lane's partial tile (of each of the work-groups splitting the terms)
        rf = sch.rfactor(sch.fuse(k_s, k_z), factor_axis=0)
        k_s, k_z = sch.split(sch.get_loops(rf)[len(batch) + 2], [splits, lanes])
        bx = sch.fuse(*sch.get_loops(rf)[: len(batch) + 3])
        sch.bind(bx, "blockIdx.x")
        kz, it, jt, ko = sch.get_loops(rf)[1:5]
        sch.bind(kz, "threadIdx.z")
        sch.bind(it, "threadIdx.y")
        sch.bind(jt, "threadIdx.x")
        # The thread's tile in registers, the lanes' partial tiles to local memory (or,
        # split across groups, to global memory for a second kernel to sum).
        partial = sch.cache_write(rf, 0, "local")
        sch.reverse_compute_at(partial, jt, preserve_unit_loops=True)
        if splits == 1:
            sch.set_scope(partial, 0, "shared")
        # Each step's operand tiles, fetched by all the group's threads.
        for idx in operands:
            fetch = sch.cache_read(rf, idx, "shared")
            sch.compute_at(fetch, ko, preserve_unit_loops=True)
            if terms_inner[idx] and self.pad_rows:
                # A tile stored as [rows, terms]: adjacent threads read adjacent rows at one
                # term, a row's length apart; padded to 32k + 1 words, they fall in distinct
                # banks (unpadded, SqueezeNet's classifier read its weights 8-way conflicted)
                sch.storage_align(fetch, 0, axis=-2, factor=32, offset=1)
            flat = sch.fuse(*sch.get_loops(fetch)[5:])
            _, z, y, x = sch.split(flat, [None, lanes, tm, tn])
            sch.bind(z, "threadIdx.z")
            sch.bind(y, "threadIdx.y")
            sch.bind(x, "threadIdx.x")
            # the pad copy, the layout copy, then a convolution input's own blocks
            while producers := sch.get_producers(fetch):
                for producer in producers:
                    sch.compute_inline(producer)
        # The lanes' partials summed, each thread some of the tile's outputs, then the
        # epilogue (or the write-back of the padded sums) on them; split across groups,
        # in a kernel of its own, a thread per output.
        if splits == 1:
            sch.reverse_compute_at(red, bx, preserve_unit_loops=True)
            sum_loops = sch.get_loops(red)[1:]  # the lanes, then the tile's outputs
            outputs = sch.fuse(*sum_loops[1:])
            sch.reorder(outputs, sum_loops[0])
            _, z, y, x = sch.split(outputs, [None, lanes, tm, tn])
            sch.bind(z, "threadIdx.z")
            sch.bind(y, "threadIdx.y")
            sch.bind(x, "threadIdx.x")
        else:
            sum_loops = sch.get_loops(red)  # batch, tile rows, columns, the partials, ...
            terms = sum_loops[len(batch) + 2]
            sch.reorder(*sum_loops[: len(batch) + 2], *sum_loops[len(batch) + 3 :], terms)
            outputs = sch.fuse(*sch.get_loops(red)[:-1])
            b_x, x = sch.split(outputs, [None, 256])
            sch.bind(b_x, "blockIdx.x")
            sch.bind(x, "threadIdx.x")
        sch.set_scope(red, 0, "local")
        # (the copies after the sums: unpad, and for a convolution the pixels' layout)
        while True:
            copies = [
                c
                for c in sch.get_consumers(red)
                if found[0] is None or not sch.get(c).same_as(sch.get(found[0]))
            ]
            if not copies:
                break
            try:
                sch.compute_inline(copies[0])
            except (RuntimeError, ValueError):
                sch.reverse_compute_at(copies[0], x, preserve_unit_loops=True)
                break
        if found[0] is not None:
            sch.reverse_compute_at(found[0], x, preserve_unit_loops=True)
        sch.decompose_reduction(rf, ko)
        sch.decompose_reduction(red, sch.get_loops(red)[-1])
        for loop in sch.get_loops(rf)[-3:]:  # the step's terms and the thread's tile
            sch.unroll(loop)
        return sch

    @staticmethod
    def _as_product(
        sch: s_tir.Schedule, red_info: Any, s_ext: list[int], r_ext: list[int], min_taps: int
    ) -> bool:
        """An NHWC convolution over input channels (any window, any stride, padded or not;
        not grouped): a matrix product of output pixels x (window taps x input channels).

        The input channels must be the innermost reduction axis and the input's innermost
        index (so that a term's taps are contiguous channels), and the input must not be
        indexed by the output channel (a grouped or depthwise convolution: no shared
        operand tile)."""
        if not red_info.name.startswith("conv2d") or len(s_ext) not in (3, 4):
            return False
        if len(r_ext) not in (1, 2, 3) or math.prod(r_ext[:-1]) < min_taps:
            return False
        block = sch.get(red_info.block_rv)
        if _reduces_innermost_axis(block) != r_ext[-1]:
            return False
        if len(block.iter_vars) != len(s_ext) + len(r_ext):
            return False
        f_var = block.iter_vars[len(s_ext) - 1].var
        by_channel = [any(_uses_var(x.min, f_var) for x in r.region) for r in block.reads]
        return by_channel.count(False) == 1  # the input; the weights are read by channel


def _source_terms_inner(sch: s_tir.Schedule, red: Any, n_s: int) -> dict[int, bool]:
    """For the one operand of a product computed in the kernel (`fusion`'s neighbours: an
    affine map, a residual update, a transpose), whether the terms are the innermost axis
    of the memory it is computed from: ``{read index: bool}``, empty where no single
    operand is computed or its sources disagree.

    `SharedMatmul` lays each operand's tile out with its contiguous axis innermost, so that
    its fetch coalesces; for a computed operand, the intermediate's own layout says nothing
    of the memory the fetch reads once the blocks are inlined into it (ResMLP's token
    mixing computes its [channels, tokens] operand from [tokens, channels] activations: a
    warp's fetch read 32 rows a word each). Found on a copy of the schedule with the
    blocks inlined into the product: the largest of the buffers read there that the product
    did not read before decide."""
    block = sch.get(red)
    made = {w.source.name for p in sch.get_producers(red) for w in sch.get(p).writes}

    def size(region: Any) -> int:
        return math.prod(int(x) for x in region.source.shape)

    computed = [idx for idx, r in enumerate(block.reads) if r.source.name in made and size(r) > 1]
    if len(computed) != 1:
        return {}
    probe = sch.copy()
    probe_red = probe.get_sblock(block.name_hint)
    try:
        while producers := probe.get_producers(probe_red):
            for producer in producers:
                probe.compute_inline(producer)
    except (RuntimeError, ValueError):  # a producer that does not inline
        return {}
    inlined = probe.get(probe_red)
    k_var = inlined.iter_vars[n_s].var
    before = {r.source.name for r in block.reads}
    sources = [r for r in inlined.reads if r.source.name not in before and size(r) > 1]
    if not sources:
        return {}
    largest = max(size(r) for r in sources)
    votes = {_uses_var(r.region[-1].min, k_var) for r in sources if size(r) == largest}
    return {computed[0]: votes.pop()} if len(votes) == 1 else {}


def _input_chain(sch: s_tir.Schedule, red: Any) -> set[str]:
    """Names of the blocks that compute a convolution's input (the producers of its reads
    that are not a parameter, transitively): its padding, a concatenation fused in."""
    names: set[str] = set()
    todo = list(sch.get_producers(red))
    while todo:
        block = todo.pop()
        name = sch.get(block).name_hint
        if name not in names:
            names.add(name)
            todo += sch.get_producers(block)
    return names


#: `SharedMatmul`'s ``conv_min_macs`` for matrix products only.
_NO_CONVOLUTIONS = 1 << 62

#: Fewest rows `SharedMatmul` takes (fewer: mostly padding in its 16- and 32-row tiles).
_GEMM_MIN_ROWS = 16


#: Most terms per row that `SerialRows` sums in one work-item (MobileNet's 1001 classes,
#: three passes, take a few microseconds on one CPU core).
_ROW_TERMS = 16384
#: ... and on a GPU (`PROFILES`): a work-item's serial row.
GPU_ROW_TERMS = 32


def _static_dom(info: Any) -> list[int] | None:
    dom = info.dom()
    if not all(isinstance(d, (int, tirx.IntImm)) for d in dom):
        return None
    return [int(d) for d in dom]


def _align_last_block(sch: s_tir.Schedule, last: Any, dom: list[int]) -> bool:
    """Give the last block of a row reduction the iterators ``dom`` (its own, in order, with
    the unit axes that normalisation dropped put back); False where they do not match."""
    last_dom = _static_dom(last)
    if last_dom is None:
        return False
    if last_dom == dom:
        return True
    kept, j = [], 0
    for ext in dom:
        if j < len(last_dom) and last_dom[j] == ext:
            kept.append(j)
            j += 1
        elif ext == 1:
            kept.append(-1)
        else:
            return False
    if j != len(last_dom):
        return False

    def layout(*iters: tirx.Var) -> list[tirx.PrimExpr]:
        return [iters[k] if k >= 0 else tirx.const(0, iters[0].ty) for k in kept]

    index_map = tirx.IndexMap.from_func(layout, ndim=len(last_dom))
    sch.transform_block_layout(last.block_rv, index_map)
    return True


class SerialRows(_GuardedRule):
    """One work-item per row for reductions chained along trailing axes (softmax).

    A softmax over the channels of an NHWC map is a max, an exp-sum and a division, each over
    the last axis of every pixel. dlight's `GeneralReduction` gives each pixel a work-group
    of 256 threads that meet at ~20 barriers to reduce 8 or 21 values: on PoCL a 128x128x8
    softmax took 141 ms, the largest kernel of a small U-Net (results/pocl/). Here each
    work-item owns whole rows: the reductions run serially in it, their results live in
    registers, and it writes its row; no barriers, no local memory (0.54 ms). The elementwise
    blocks in between (the exp) are inlined, so the normalisation recomputes the exp rather
    than storing it (storing it in a per-row array was 2.4x slower on PoCL).

    Applies to functions whose blocks (after inlining) are reductions with the same leading
    spatial axes and trailing reduction axes, then one injective block over the same axes;
    rows of more than ``max_terms`` terms are declined.

    On a GPU (``max_terms`` `GPU_ROW_TERMS`) it takes short rows only: a classifier's softmax
    over 10 classes was a group of 256 threads meeting at 17 barriers (smoke's took 1.86 us
    in the H200's CUDA graph, 1.31 us so; smoke_int8's 1.82 and 1.41:
    results/h200/session40-rows-ab); a row of 1000 classes stays with dlight's threads.
    """

    def __init__(self, max_terms: int = _ROW_TERMS) -> None:
        self.max_terms = max_terms

    def _apply(self, func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        found = _row_reductions(sch)
        if found is None:
            return None
        reductions, last, n_s, dom = found
        infos = [*reductions, last]
        r_ext = dom[n_s:]
        if math.prod(r_ext) > self.max_terms:
            return None
        rows = math.prod(dom[:n_s])

        loops = sch.get_loops(last.block_rv)
        threads = min(_threads_per_group(rows, target), max(1, rows))
        bx, tx = sch.split(sch.fuse(*loops[:n_s]), factors=[None, threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        for info in reversed(reductions):
            block = info.block_rv
            for i, _ in enumerate(sch.get(block).writes):
                sch.set_scope(block, i, "local")
            sch.compute_at(block, tx, preserve_unit_loops=False)
        if math.prod(r_ext) <= _UNROLL_TOTAL:
            for info in infos:
                for loop in sch.get_loops(info.block_rv)[2:]:
                    sch.unroll(loop)
        return sch


def _is_sum(block: s_tir.SBlock) -> bool:
    """Whether a reduction block is a sum (its init 0, its update ``acc + term``): a mean or
    variance, not a softmax's max."""
    init, body = block.init, block.body
    return (
        isinstance(init, tirx.BufferStore)
        and isinstance(init.value, tirx.FloatImm)
        and float(init.value.value) == 0.0
        and isinstance(body, tirx.BufferStore)
        and isinstance(body.value, tirx.Add)
    )


def _is_product_sum(block: s_tir.SBlock) -> bool:
    """Whether a reduction block sums products (`_is_sum` of ``acc + a * b``): a matrix
    product's sum, not a mean's nor a softmax's sum of exponentials."""
    if not _is_sum(block):
        return False
    update = block.body.value
    return isinstance(update.b, tirx.Mul) or isinstance(update.a, tirx.Mul)


def _sums_under(sch: s_tir.Schedule, blocks: list[Any], loop: Any, lanes: int) -> None:
    """Compute the sum blocks ``blocks`` (producers first) under ``loop``, each output in a
    register (``lanes == 1``) or in local memory, its terms summed across ``lanes`` lanes
    (``threadIdx.x``: a cross-thread reduction whose result every lane reads)."""
    for block in reversed(blocks):
        for i, _ in enumerate(sch.get(block).writes):
            sch.set_scope(block, i, "local" if lanes == 1 else "shared")
        sch.compute_at(block, loop, preserve_unit_loops=False)
        if lanes > 1:
            r_o, r_tx = sch.split(sch.get_loops(block)[-1], factors=[None, lanes])
            sch.reorder(r_tx, r_o)
            sch.bind(r_tx, "threadIdx.x")


def _row_reductions(sch: s_tir.Schedule) -> tuple[list[Any], Any, int, list[int]] | None:
    """The blocks of a function of row reductions (after inlining the spatial blocks that
    inline): ``(reductions, last, n_s, dom)``, the reductions sharing the leading spatial
    axes and trailing reduction axes of ``dom``, then one injective block over the same
    axes (aligned to ``dom``); None for any other function."""
    infos = try_inline_contiguous_spatial(sch, normalize_prim_func(sch))
    if not infos or len(infos) < 2 or not infos[-1].is_injective():
        return None
    reductions, last = infos[:-1], infos[-1]
    kinds = reductions[0].dom_kind()
    n_s = len(kinds) - len(kinds.lstrip("S"))
    if n_s == 0 or kinds != "S" * n_s + "R" * (len(kinds) - n_s) or n_s == len(kinds):
        return None
    dom = [int(d) for d in reductions[0].dom() if isinstance(d, (int, tirx.IntImm))]
    if len(dom) != len(kinds) or any(
        b.dom_kind() != kinds or _static_dom(b) != dom for b in reductions
    ):
        return None  # dynamic shapes, or reductions over different axes
    if not _align_last_block(sch, last, dom):
        return None
    return reductions, last, n_s, dom


class _LanesPerRow(_GuardedRule):
    """The arguments of the rules that give each row up to ``lanes`` threads
    (`RowNormalization`, `NormedRowReduction`): see theirs."""

    def __init__(self, lanes: int = 32, threads: int = 256, min_terms: int = 2) -> None:
        self.lanes = lanes
        self.threads = threads
        self.min_terms = min_terms

    def _lanes(self, target: Target, terms: int) -> tuple[int, int]:
        """``(cap, lanes)``: the threads a work-group may have, and the lanes a row of
        ``terms`` terms gets (each sums ``min_terms`` or more where it can)."""
        cap = max(1, min(self.threads, int(max_threads_per_block(target))))
        return cap, min(self.lanes, cap, _floor_pow2(max(1, terms // self.min_terms)))


class RowNormalization(_LanesPerRow):
    """A layer norm as one kernel (`compiler.layer_norm`): a row's sum, the sum of its
    squared differences from the mean, then the normalised row, ``lanes`` threads per row.

    Lane ``l`` of a row adds terms ``l, l + lanes, ...`` (a warp reads consecutive floats:
    coalesced); the lanes' partial sums meet in a cross-thread reduction (local memory in
    OpenCL) whose result every lane gets; the second sum re-reads the row (from cache),
    then each lane normalises and writes its terms of the row. A work-group holds
    ``threads / lanes`` rows (``threadIdx.y``); short rows get fewer lanes (each adds at
    least ``min_terms`` terms), and rows shorter than ``2 * min_terms`` one work-item each
    (serial, no barrier). dlight's `GeneralReduction` (the fallback) gives each row a group
    of 256 threads, most of them idle on rows of 64-240 terms.

    Applies to functions of two sums over one trailing axis, then one injective block (see
    `_row_reductions`), and to an RMS norm's one sum of squares (``ln_squares``): a softmax
    (a max first) and other single reductions (`RowReduction`'s, dlight's GEMV) are left to
    the other rules.

    Args:
        lanes: Threads per row, at most (a power of two).
        threads: Threads per work-group, at most (the target's limit applies too).
        min_terms: Terms per lane the lanes aim at, at least.
    """

    def _apply(self, func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        found = _row_reductions(sch)
        if found is None:
            return None
        reductions, last, n_s, dom = found
        if (
            len(dom) - n_s != 1
            or len(reductions) not in (1, 2)
            or not all(_is_sum(sch.get(b.block_rv)) for b in reductions)
            or (len(reductions) == 1 and sch.get(reductions[0].block_rv).name_hint != "ln_squares")
        ):
            return None
        rows, terms = math.prod(dom[:n_s]), dom[-1]
        cap, lanes = self._lanes(target, terms)
        per_group = max(1, min(_threads_per_group(rows * lanes, target), cap) // lanes)
        per_group = min(per_group, rows)
        if n_s > 1:
            # Rows over several axes: a group of whole rows (an inexact split leaves TVM a
            # region of several rows to compute the sums at, which it refuses).
            per_group = max(d for d in range(1, per_group + 1) if rows % d == 0)
        loops = sch.get_loops(last.block_rv)
        s = sch.fuse(*loops[:n_s]) if n_s > 1 else loops[0]
        bx, ty = sch.split(s, factors=[None, per_group])
        sch.bind(bx, "blockIdx.x")
        if lanes == 1:
            sch.bind(ty, "threadIdx.x")
        else:
            c_o, tx = sch.split(sch.get_loops(last.block_rv)[-1], factors=[None, lanes])
            sch.reorder(tx, c_o)
            sch.bind(ty, "threadIdx.y")
            sch.bind(tx, "threadIdx.x")
        _sums_under(sch, [info.block_rv for info in reductions], ty, lanes)
        return sch


class NormedRowReduction(_LanesPerRow):
    """A one-row product that normalises its operand itself (`fusion._Fuser._norm_into_product`:
    a decoder's RMS or layer norm merged into the matrix-vector product after it): the
    norm's row statistics, then the product over the normalised row, in one kernel.

    The product is scheduled as `RowReduction` schedules one (``lanes`` threads along each
    row of the ``[out, in]`` weights, reading it coalesced; ``threads / lanes`` outputs a
    work-group along ``threadIdx.y``), the norm's elementwise stage inlined into its loads
    (``x * rstd * gamma`` computed as each term is read). Each output's lanes first sum the
    statistics of the operand row over the same lanes (a cross-thread reduction, as
    `RowNormalization` does): the row, a few KB, is read again by every output from the
    cache, which costs far less than the norm's own launch and its output's round trip.

    Applies to functions of one or two sums over the operand's one row (the norm's
    statistics: the squares of an RMS norm; a layer norm's sum, then its squared
    differences), then one reduction over one axis that reads some input whole (the
    weights) with its terms along that input's innermost axis, then at most one epilogue.

    Args:
        lanes: Threads per output row, at most (a power of two).
        threads: Threads per work-group, at most (the target's limit applies too).
        min_terms: Terms per lane the lanes aim at, at least.
    """

    def _apply(self, func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if infos is None:
            return None
        reductions = [b for b in infos if b.is_reduction()]
        if len(reductions) not in (2, 3):
            return None
        stats, main = reductions[:-1], reductions[-1]
        for st in stats:
            dom = _static_dom(st)
            kinds = st.dom_kind()
            n_s = len(kinds) - len(kinds.lstrip("S"))
            if (
                dom is None
                or kinds != "S" * n_s + "R"
                or math.prod(dom[:n_s]) != 1
                or not _is_sum(sch.get(st.block_rv))
            ):
                return None  # not one row's statistics
        kinds = main.dom_kind()
        n_s = len(kinds) - len(kinds.lstrip("S"))
        dom = _static_dom(main)
        if dom is None or n_s == 0 or kinds != "S" * n_s + "R":
            return None
        outputs, terms = math.prod(dom[:n_s]), dom[-1]
        block = sch.get(main.block_rv)
        if (
            terms < _COLUMN_TERMS
            or not _is_product_sum(block)
            or not _no_reuse(block, outputs, terms)
        ):
            return None  # (a one-row layer norm's two sums: `RowNormalization`'s)
        k = block.iter_vars[n_s].var
        if not any(last.same_as(k) for last in _last_indices(block)):
            return None  # the weights not read along their rows
        stat_names = [sch.get(st.block_rv).name_hint for st in stats]
        remaining = try_inline(sch, [b for b in infos if not b.is_reduction()])
        if len(remaining) > 1 or any(sch.get(b.block_rv).name_hint in stat_names
                                     for b in remaining):  # fmt: skip
            return None
        red = sch.get_sblock(main.name)
        # (the inlined norm now reads the statistics in the product's own loads)
        last = sch.get(red)
        if not all(last.same_as(k) or not _uses_var(last, k) for last in _last_indices(last)):
            return None
        epilogue = remaining[0].block_rv if remaining else None
        if epilogue is not None:
            consumers = sch.get_consumers(red)
            if (
                len(consumers) != 1
                or sch.get(consumers[0]).name_hint != sch.get(epilogue).name_hint
                or _non_unit(sch.get(epilogue).writes[0].source.shape)
                != _non_unit(sch.get(red).writes[0].source.shape)
            ):
                return None  # an epilogue over other elements than the outputs
        cap, lanes = self._lanes(target, terms)
        _lanes_per_row(sch, target, main.name, epilogue, n_s, outputs, lanes, cap)
        ty = sch.get_loops(sch.get_sblock(main.name))[1]
        blocks = [sch.get_sblock(name) for name in stat_names]
        _sums_under(sch, blocks, ty, lanes)
        return sch


def _attention_blocks(sch: s_tir.Schedule) -> list[Any] | None:
    """The blocks of a fused attention (`compiler.attention.BLOCKS`, in order), once every
    other block (the operands' layout copies, an epilogue) is inlined; else None."""
    from litekiln.compiler.attention import BLOCKS

    # (not dlight's normalize_prim_func: it drops unit loops, and the rules find the output's
    # batch, query, column and key loops by position)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    names = [sch.get(b).name_hint for b in blocks]
    if set(names) & set(BLOCKS) != set(BLOCKS):
        return None
    for block, name in zip(blocks, names, strict=True):
        if name in BLOCKS:
            continue
        try:
            sch.compute_inline(block)  # the operands' layout copies
        except (RuntimeError, ValueError):
            sch.reverse_compute_inline(block)  # an epilogue (raises if it cannot)
    return [sch.get_sblock(name) for name in BLOCKS]


class FusedAttention(_GuardedRule):
    """An attention as one kernel (`compiler.attention`): a work-group per ``rows`` query rows
    of one batch entry, ``lanes`` threads per row.

    Each row's scores are summed in registers by its lanes (key ``l, l + lanes, ...``: a warp
    reads consecutive keys) and kept in local memory; its max and its sum of exponentials
    meet across the lanes (local memory, barriers); its probabilities go to local memory; then
    each lane sums ``probability x value`` over the keys for its output columns (a warp reads
    consecutive values) in a register. The statistics cover the padded rows and keys of
    `attention_te` (whole groups: no predicate around a barrier).

    Args:
        rows: Query rows per work-group (a divisor of `attention.ROWS`).
        lanes: Threads per row (a divisor of `attention.LANES`).
        unroll_by_8: Unroll the key and term loops by 8 (``False``: whole; each lane's loads
            are then all in the text, for the device compiler to issue ahead of their sums:
            by 8, a lane of TinyViT's 196-key windows waited on 53 rounds of loads in turn).
        stage: Operands the work-group first copies whole into local memory, all its threads
            loading consecutive elements: ``k`` (the keys), ``v`` (the values), ``kv``
            (both); the sums then read local memory. Taken only where the copies fit in
            `_STAGED_BYTES` (the rows' scores and probabilities need the rest).
    """

    def __init__(
        self, rows: int = 4, lanes: int = 32, unroll_by_8: bool = True, stage: str = ""
    ) -> None:
        self.rows = rows
        self.lanes = lanes
        self.unroll_by_8 = unroll_by_8
        self.stage = stage

    def _apply(self, func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        from litekiln.compiler.attention import LANES, ROWS

        if ROWS % self.rows or LANES % self.lanes:
            return None
        if self.rows * self.lanes > int(max_threads_per_block(target)):
            return None
        sch = s_tir.Schedule(func)
        found = _attention_blocks(sch)
        if found is None:
            return None
        scores, mx, den, prob, out = found
        loops = sch.get_loops(out)
        nb = len(loops) - 3  # batch axes, then query, column, key
        i, c = loops[nb], loops[nb + 1]
        rows = self.rows
        while rows > int(sch.get(i).extent):
            # (fewer queries than rows: the statistics' regions would be narrower than the
            # work-group's rows, and the extra rows' threads would write past them)
            rows //= 2
        io, ty = sch.split(i, factors=[None, rows])
        bx = sch.fuse(*loops[:nb], io) if nb else io
        co, tx = sch.split(c, factors=[None, self.lanes])
        sch.reorder(bx, ty, tx, co)
        sch.bind(bx, "blockIdx.x")
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
        # Each output summed in a register; the keys unrolled (by 8, or whole: loads in
        # flight together rather than one at a time).
        acc = sch.cache_write(out, 0, "local")
        sch.reverse_compute_at(acc, co, preserve_unit_loops=False)
        self._unroll(sch, sch.get_loops(out)[-1])
        for block in (prob, den, mx, scores):
            # The statistics in registers: the cross-thread reduction hands every lane of
            # the row its result (in local memory, only the lane writing it would be sure to
            # read it: TVM puts no barrier between that write and the other lanes' reads).
            sch.set_scope(block, 0, "local" if block in (den, mx) else "shared")
            sch.compute_at(block, bx, preserve_unit_loops=True)
            inner = sch.get_loops(block)[1:]  # (unit batch loops), rows, keys(, d)
            k = 2 if block == scores else 1
            row, key = inner[len(inner) - k - 1], inner[len(inner) - k]
            sch.bind(row, "threadIdx.y")
            ko, lane = sch.split(key, factors=[None, self.lanes])
            sch.reorder(lane, ko)
            sch.bind(lane, "threadIdx.x")
            if block == scores:  # each score summed in a register, the terms unrolled
                reg = sch.cache_write(scores, 0, "local")
                sch.reverse_compute_at(reg, ko, preserve_unit_loops=False)
                self._unroll(sch, sch.get_loops(scores)[-1])
                if not self.unroll_by_8:
                    sch.unroll(ko)
        if self.stage and not self._stage(sch, bx, scores, out, rows):
            return None
        return sch

    def _stage(self, sch: s_tir.Schedule, bx: Any, scores: Any, out: Any, rows: int) -> bool:
        """Copy the keys (of `scores`) and/or the values (of `out`) the group reads into
        local memory at the top of the group's loop, its threads loading consecutive
        elements; False where they would not fit."""
        # (the key is the scores' last spatial iterator, before the terms; the output's
        # reduction iterator)
        staged = [(scores, -2)] if "k" in self.stage else []
        if "v" in self.stage:
            staged.append((out, -1))
        copies = []  # (the keys' copy first, where they are staged)
        for block, key_at in staged:
            blk = sch.get(block)
            key_var = blk.iter_vars[key_at]
            found = [
                n for n, r in enumerate(blk.reads)
                if r.source.scope() == "global"
                and any(_uses_var(rg.min, key_var.var) for rg in r.region)
            ]  # fmt: skip
            if len(found) != 1:
                return False
            copies.append(sch.cache_read(block, found[0], "shared"))
        size = 0
        for n, copy in enumerate(copies):
            sch.compute_at(copy, bx, preserve_unit_loops=True)
            extents = [_static_extent(sch, loop) for loop in sch.get_loops(copy)[1:]]
            if None in extents:
                return False
            terms = int(extents[-1])  # type: ignore[arg-type]
            keys = n == 0 and "k" in self.stage
            if keys and terms % 2 == 0:
                # The keys as [keys, terms]: adjacent lanes read adjacent keys at one term,
                # a row apart; rows of an odd length put them in distinct banks (TinyViT's
                # 32 terms: all 32 lanes of a warp in one bank before)
                sch.storage_align(copy, 0, axis=-2, factor=terms, offset=1)
                extents[-1] = terms + 1
            size += 4 * math.prod(extents)  # type: ignore[arg-type]
        if size > _STAGED_BYTES:
            return False
        for copy in copies:
            flat = sch.fuse(*sch.get_loops(copy)[1:])
            steps, ty, tx = sch.split(flat, factors=[None, rows, self.lanes])
            sch.bind(ty, "threadIdx.y")
            sch.bind(tx, "threadIdx.x")
            sch.unroll(steps)  # (the loads in flight together)
        return True

    def _unroll(self, sch: s_tir.Schedule, loop: Any) -> None:
        if self.unroll_by_8:
            _, j8 = sch.split(loop, factors=[None, 8])
            sch.unroll(j8)
        else:
            sch.unroll(loop)


#: Most bytes of operands `FusedAttention` stages in local memory (48 KB per group on the
#: NVIDIA OpenCL driver, less its rows' scores and probabilities).
_STAGED_BYTES = 32 * 1024


class SerialAttention(_GuardedRule):
    """An attention as one kernel on CPU OpenCL: one work-item per query row, its scores and
    probabilities in private arrays, its statistics in registers (no barrier, no local
    memory), as `SerialRows` does for a softmax."""

    def _apply(self, func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        found = _attention_blocks(sch)
        if found is None:
            return None
        scores, mx, den, prob, out = found
        loops = sch.get_loops(out)
        nb = len(loops) - 3
        rows = sch.fuse(*loops[: nb + 1])
        extent = int(sch.get(rows).extent)
        threads = min(_threads_per_group(extent, target), max(1, extent))
        bx, tx = sch.split(rows, factors=[None, threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        for block in (prob, den, mx, scores):
            sch.set_scope(block, 0, "local")
            sch.compute_at(block, tx, preserve_unit_loops=False)
        return sch


def _gated_step_blocks(sch: s_tir.Schedule) -> tuple[Any | None, list[Any], Any] | None:
    """The blocks of a recurrent step (`compiler.gated_step`): the gates' sums (None for a
    first step without a product), the blocks that read the outputs' other operands, and the
    loop over the units (fused) under which the outputs' blocks (TE makes one per output) are
    computed; else None."""
    from litekiln.compiler.gated_step import BLOCKS, LEAF

    sums, leaves, outs = None, [], []
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        name = sch.get(block).name_hint
        if name == BLOCKS[0]:
            sums = block
        elif name.startswith(LEAF):
            leaves.append(block)
        elif name.startswith(BLOCKS[1]):
            outs.append(block)
        else:
            sch.compute_inline(block)  # (a copy FuseOps put in: raises where it cannot)
    if not outs:
        return None
    nest = sch.get_loops(outs[0])
    for block in outs[1:]:  # (TE puts a compute's outputs under one loop nest)
        other = sch.get_loops(block)
        if len(other) != len(nest) or not all(
            sch.get_sref(a).same_as(sch.get_sref(b)) for a, b in zip(other, nest, strict=True)
        ):
            return None
    return sums, leaves, (sch.fuse(*nest) if len(nest) > 1 else nest[0])


def _leaves_first(sch: s_tir.Schedule, leaves: list[Any], loop: Any, rows: int = 0) -> None:
    """The outputs' other operands read under ``loop`` before the sums are placed there (so,
    first: their loads in flight with the products'): into registers, or with ``rows`` into
    local memory by the group's first rows of ``threadIdx.y`` (a thread's private array
    indexed by its thread id would live in slow memory)."""
    for leaf in leaves:
        sch.set_scope(leaf, 0, "shared" if rows else "local")
        sch.compute_at(leaf, loop, preserve_unit_loops=True)
        if rows:
            inner = sch.get_loops(leaf)[-1]
            _, ty = sch.split(inner, factors=[None, rows])
            sch.bind(ty, "threadIdx.y")


class GatedStepLanes(_GuardedRule):
    """A recurrent step as one kernel on GPUs (`compiler.gated_step`): a work-group per
    ``units`` units, ``lanes`` threads per unit.

    Each unit's gates are summed by its lanes (lane ``l`` takes terms ``l, l + lanes, ...``
    of the recurrent product for every gate: a warp reads consecutive weights of a row), the
    sums meet across the lanes and stay in registers, and the unit's outputs (the new state,
    the new output) are computed from them: no local memory for the gates, no second launch.

    Args:
        units: Units per work-group (``threadIdx.y``).
        lanes: Threads per unit (a power of two, at most 32: one warp); halved until they
            divide the product's terms.
    """

    def __init__(self, units: int = 1, lanes: int = 32) -> None:
        self.units = units
        self.lanes = lanes

    def _apply(self, func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        if self.units * self.lanes > int(max_threads_per_block(target)):
            return None
        sch = s_tir.Schedule(func)
        found = _gated_step_blocks(sch)
        if found is None:
            return None
        sums, leaves, j = found
        units = _static_extent(sch, j)
        if sums is None and units is not None:  # (no product: a thread per unit)
            threads = min(_threads_per_group(units, target), units)
            bx, tx = sch.split(j, factors=[None, threads])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
            _leaves_first(sch, leaves, tx)
            return sch
        terms = _static_extent(sch, sch.get_loops(sums)[-1])
        if units is None or terms is None or units % self.units:
            return None
        # (no predicate around the lanes' cross-thread sums)
        lanes = _largest_divisor(terms, [self.lanes >> k for k in range(self.lanes.bit_length())])
        bx, ty = sch.split(j, factors=[None, self.units])
        sch.bind(bx, "blockIdx.x")
        sch.bind(ty, "threadIdx.y")
        # The sums in registers: the cross-thread reduction hands every lane of the unit its
        # gates, and every lane computes the unit's outputs (the same values).
        _leaves_first(sch, leaves, ty)
        sch.set_scope(sums, 0, "local")
        sch.compute_at(sums, ty, preserve_unit_loops=True)
        k = sch.get_loops(sums)[-1]
        if lanes > 1:
            k, lane = sch.split(k, factors=[None, lanes])
            sch.reorder(lane, k)
            sch.bind(lane, "threadIdx.x")
        sch.unroll(k)  # (the lane's loads in flight together)
        return sch


class GatedStepShared(_GuardedRule):
    """A recurrent step as one kernel on GPUs, every gate of a unit summed at once: a
    work-group per ``units`` units, ``lanes`` threads per gate of each.

    `GatedStepLanes` walks a unit's gates in turn, each sum's loads then its cross-thread
    reduction, so a step waits on memory once per gate. Here the gates of the group's units
    are rows of ``threadIdx.y`` (``parts x units`` of them): one round of loads, one
    cross-thread reduction for all of them, the sums in local memory, then a thread per unit
    computes its outputs from them.

    Args:
        units: Units per work-group.
        lanes: Threads per gate (a power of two, at most 32); halved until they divide the
            product's terms.
    """

    def __init__(self, units: int = 1, lanes: int = 32) -> None:
        self.units = units
        self.lanes = lanes

    def _apply(self, func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        found = _gated_step_blocks(sch)
        if found is None or found[0] is None:
            return None
        sums, leaves, j = found
        parts, units = _static_extent(sch, sch.get_loops(sums)[0]), _static_extent(sch, j)
        terms = _static_extent(sch, sch.get_loops(sums)[-1])
        if parts is None or units is None or terms is None or units % self.units:
            return None
        lanes = _largest_divisor(terms, [self.lanes >> k for k in range(self.lanes.bit_length())])
        rows = parts * self.units
        if rows * lanes > int(max_threads_per_block(target)):
            return None
        bx, ty = sch.split(j, factors=[None, self.units])
        sch.bind(bx, "blockIdx.x")
        _leaves_first(sch, leaves, bx, rows)
        sch.set_scope(sums, 0, "shared")
        sch.compute_at(sums, bx, preserve_unit_loops=True)
        p, unit, k = sch.get_loops(sums)[-3:]
        row = sch.fuse(p, unit)
        sch.bind(row, "threadIdx.y")
        if lanes > 1:
            k, lane = sch.split(k, factors=[None, lanes])
            sch.reorder(lane, k)
            sch.bind(lane, "threadIdx.x")
        sch.unroll(k)
        # The outputs: a thread per unit among the group's rows (the others idle).
        _, ty = sch.split(ty, factors=[None, rows])
        sch.bind(ty, "threadIdx.y")
        return sch


class SerialGatedStep(_GuardedRule):
    """A recurrent step as one kernel on CPU OpenCL: one work-item per unit, its gates summed
    serially in registers (no barrier, no local memory)."""

    def _apply(self, func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        found = _gated_step_blocks(sch)
        if found is None:
            return None
        sums, leaves, j = found
        units = _static_extent(sch, j)
        if units is None:
            return None
        threads = min(_threads_per_group(units, target), units)
        while units % threads:
            threads -= 1
        bx, tx = sch.split(j, factors=[None, threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        _leaves_first(sch, leaves, tx)
        if sums is not None:
            sch.set_scope(sums, 0, "local")
            sch.compute_at(sums, tx, preserve_unit_loops=False)
        return sch


_has_if_then_else = tvm.get_global_func("s_tir.schedule.HasIfThenElse")


def _vector_friendly(block: s_tir.SBlock) -> bool:
    """Whether vectorising the innermost axis gives plain vector loads/stores.

    True when every buffer access is indexed on its last axis by the block's innermost
    iteration variable itself (elementwise) or by something that does not depend on it
    (broadcast), and the body has no ``if_then_else`` (padding, concat): TVM would scalarise
    those into a per-work-item loop, which is worse than one element per work-item.
    """
    if _has_if_then_else(block) or not block.iter_vars:
        return False
    inner = block.iter_vars[-1].var

    for region in [*block.reads, *block.writes]:
        if not region.region:
            continue
        last = region.region[-1]
        if last.min.same_as(inner):
            continue
        if _uses_var(last.min, inner):
            return False
    return True


class Injective(_GuardedRule):
    """One work-item per output element (per ``vector`` elements when the innermost axis allows).

    Args:
        vector: Elements per work-item when the innermost output extent is a multiple of it
            (stored as one vector); 1 disables vectorisation.
    """

    def __init__(self, vector: int = 4) -> None:
        self.vector = vector

    def _apply(self, func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if infos is None or not infos or any(not b.is_injective() for b in infos):
            return None
        remaining = try_inline(sch, list(infos))
        if len(remaining) != 1:
            return None
        block = remaining[0].block_rv
        loops = sch.get_loops(block)
        if not loops:
            return None
        static = [_static_extent(sch, loop) for loop in loops]
        exts = [e for e in static if e is not None]
        if len(exts) != len(static):
            return None
        total = math.prod(exts)
        vec = 1
        inner_ext = exts[-1]
        if self.vector > 1 and inner_ext % self.vector == 0 and _vector_friendly(sch.get(block)):
            vec = self.vector
        threads = _threads_per_group(total // vec, target)
        fused = sch.fuse(*loops)
        if vec > 1:
            bx, tx, vi = sch.split(fused, factors=[None, threads, vec])
            sch.vectorize(vi)
        else:
            bx, tx = sch.split(fused, factors=[None, threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        return sch


#: Rule settings per device class (see `fast_rules`).
PROFILES: dict[str, dict[str, int | bool]] = {
    # Large GPU (H100): our rules where they beat dlight there (depthwise, pooling: 10-40x);
    # channel reductions and elementwise kernels stay with dlight (measured faster there).
    # Global pooling (selfie's 128x128 squeeze-and-excite pools): `WindowReduction`; smaller
    # pools, layer-norm statistics and squeeze-excite GEMVs: `ColumnReduction`, `RowReduction`
    # (coalesced; not yet timed on the H100 when made the default).
    "gpu": {
        "min_work_items": _ENOUGH_WORK_ITEMS,
        "channel_reductions": False,
        "injective": False,
        "window_reduction": True,
        "coalesced_reductions": True,
        # matrix products: `SharedMatmul` (on the H200 its shapes won most of the vision
        # transformers' products, dlight's Matmul 2-3x slower: docs/benchmarks.md)
        "shared_matmul": True,
        # products of a few outputs: `FewOutputsReduction` (`_FEW_OUTPUTS`)
        "few_outputs": True,
        # softmax-like rows of a few terms: `SerialRows` (one work-item a row)
        "serial_rows": True,
        "serial_row_terms": GPU_ROW_TERMS,
    },
    # CPU OpenCL (PoCL): serial reductions everywhere (long ones over few outputs too) with
    # the largest tiles, but one pixel per work-item under a kernel window; vectorised
    # elementwise kernels; softmax-like row reductions serial per row.
    "cpu": {
        "min_work_items": 0,
        "channel_reductions": True,
        "injective": True,
        "long_reductions": True,
        "window_pixels": 1,
        "pad_stage": True,
        "unroll_channels": False,
        "unroll_window": False,
        "serial_rows": True,
    },
}


def fast_rules(
    profile: str = "gpu",
    *,
    min_work_items: int | None = None,
    channel_reductions: bool | None = None,
    injective: bool | None = None,
) -> list[GPUScheduleRule]:
    """Our rules for a device class, then dlight's generic GPU rules as the fallback.

    Args:
        profile: ``"gpu"`` or ``"cpu"``, a key of `PROFILES`.
        min_work_items: Override of the profile's value (see `SerialReduction`).
        channel_reductions: Override (see `SerialReduction`).
        injective: Override: schedule elementwise/injective kernels with `Injective`
            (else dlight's Fallback: one element per work-item, 256 per group).

    Raises:
        ValueError: an unknown profile.
    """
    if profile not in PROFILES:
        known = ", ".join(PROFILES)
        raise ValueError(f"unknown schedule profile {profile!r}; expected one of {known}")
    cfg = dict(PROFILES[profile])
    for key, value in (
        ("min_work_items", min_work_items),
        ("channel_reductions", channel_reductions),
        ("injective", injective),
    ):
        if value is not None:
            cfg[key] = value
    # (attention: only the fused attention's function, compiler/attention.py)
    rules: list[GPUScheduleRule] = [SerialAttention() if profile == "cpu" else FusedAttention()]
    # (a recurrent step: only `compiler.gated_step`'s function)
    rules.append(SerialGatedStep() if profile == "cpu" else GatedStepShared())
    if cfg.get("window_reduction"):
        rules.append(WindowReduction())
    # (a one-row product with its operand's norm: `NormedRowReduction`, one work-item per
    # output on CPUs)
    rules.append(NormedRowReduction(lanes=32 if profile == "gpu" else 1))
    if cfg.get("coalesced_reductions"):
        rules += [ColumnReduction(), RowReduction(), RowNormalization()]
    if cfg.get("shared_matmul"):
        # Matrix products whose first operand is read along its rows (the terms not its
        # innermost axis: ResMLP's token mixing, its activations transposed in the kernel)
        # look like a window reduction to `SerialReduction`, which gave them a thread per
        # output (22 us on the H200 for 15M multiply-adds): products are these rules' first.
        rules += [
            SharedMatmul(mn=4, splits=4, min_terms=512, conv_min_macs=_NO_CONVOLUTIONS),
            SharedMatmul(mn=4, conv_min_macs=_NO_CONVOLUTIONS),
        ]
    rules.append(
        SerialReduction(
            min_work_items=int(cfg["min_work_items"]),
            channel_reductions=bool(cfg["channel_reductions"]),
            long_reductions=bool(cfg.get("long_reductions", False)),
            window_tiles=((8, int(cfg["window_pixels"])),) if "window_pixels" in cfg else None,
            pad_stage=bool(cfg.get("pad_stage", False)),
            unroll_channels=bool(cfg.get("unroll_channels", True)),
            unroll_window=bool(cfg.get("unroll_window", True)),
        )
    )
    if cfg["injective"]:
        rules.append(Injective())
    if cfg.get("serial_rows"):
        rules.append(SerialRows(max_terms=int(cfg.get("serial_row_terms", _ROW_TERMS))))
    if cfg.get("shared_matmul"):
        # patch embeddings (64 taps and more; the matrix products, the same two rules, are
        # taken before `SerialReduction` above): long reductions split across work-groups,
        # the others 16x32 tiles (the tuning offers the other shapes and dlight's)
        rules += [
            SharedMatmul(mn=4, splits=4, min_terms=512, min_taps=64, conv_min_macs=1 << 20),
            SharedMatmul(mn=4, min_taps=64, conv_min_macs=1 << 20),
        ]
    if cfg.get("few_outputs"):
        # a sum over a handful of outputs (a landmark model's last convolutions: 4-32
        # outputs of 64-256 terms): one work-group per output, its threads sharing the sum,
        # where dlight's 32x32 tiles give one group walking the terms in 16+ steps
        rules.append(FewOutputsReduction(max_outputs=_FEW_OUTPUTS, min_terms=64))
    return rules + dlight_rules("Matmul", "GEMV", "Reduction", "GeneralReduction", "Fallback")


def fast_schedule(profile: str = "gpu", **overrides: object) -> tvm.transform.Pass:
    """The schedule pass with litekiln's rules first and dlight's defaults as fallback.

    Args:
        profile: ``"gpu"`` (large GPUs; the default) or ``"cpu"`` (PoCL); see `PROFILES`.
        overrides: Keyword overrides of the profile, as for `fast_rules`.

    Returns:
        A module pass for `codegen.build_relax_pipeline(target, schedule=...)`.
    """
    return dl.ApplyDefaultSchedule(*fast_rules(profile, **overrides))  # type: ignore[arg-type]


def describe_rules(
    mod: tvm.IRModule, target: Target, profile: str = "gpu", **overrides: object
) -> dict[str, str]:
    """Which rule schedules each PrimFunc of ``mod`` (a module after FuseTIR); for tests/logs."""
    out: dict[str, str] = {}
    with target:
        for gv, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc):
                continue
            for rule in fast_rules(profile, **overrides):  # type: ignore[arg-type]
                if rule.apply(func, target, False) is not None:
                    out[gv.name_hint] = type(getattr(rule, "inner", rule)).__name__
                    break
            else:
                out[gv.name_hint] = "none"
    return out


#: Most outputs of a product `fast_rules` gives `FewOutputsReduction` by default.
_FEW_OUTPUTS = 256


class FewOutputsReduction(_SingleReductionRule):
    """dlight's cross-thread reduction (`GeneralReduction`: one work-group per output, its
    threads sharing the reduction) for reductions with few outputs and many terms.

    The late 1x1 convolutions of the MediaPipe models (hand_landmark_lite's 7x7 layers: 5488
    outputs of 672 terms) give dlight's Matmul 28 groups of 64 threads, each looping over all
    672 input channels: ~39 us per launch on the H100, latency-bound. One group per output
    spreads the same sum over 256 threads. Large outputs (MobileNet's 14x14x512, 100K) would
    make as many groups and lose, hence the limits.

    Args:
        max_outputs: Most outputs a kernel may have.
        min_terms: Fewest terms per output.
    """

    def __init__(self, max_outputs: int = 16384, min_terms: int = 256) -> None:
        self.max_outputs = max_outputs
        self.min_terms = min_terms

    def _apply(self, func: tirx.PrimFunc, target: Target) -> s_tir.Schedule | None:
        if super()._apply(func, target) is None:  # (the shape checks, in `_schedule`)
            return None
        return dl.gpu.GeneralReduction().apply(func, target, False)

    def _schedule(
        self,
        sch: s_tir.Schedule,
        target: Target,
        infos: list[Any],
        red_info: Any,
        s_ext: list[int],
        r_ext: list[int],
    ) -> s_tir.Schedule | None:
        if math.prod(s_ext) > self.max_outputs or math.prod(r_ext) < self.min_terms:
            return None
        return sch


class ConfiguredMatmul(dl.gpu.Matmul):
    """dlight's Matmul rule with a fixed tile configuration instead of its per-target one."""

    def __init__(self, config: dl.gpu.Matmul.Config) -> None:
        self.config = config

    def get_configs(self, target: Target) -> dl.gpu.Matmul.Config:  # noqa: ARG002 - fixed
        return self.config


def variant_rules(profile: str = "gpu") -> list[GPUScheduleRule]:
    """Alternative schedules the compiler emits for the runtime to time on the device.

    Each rule is tried on its own on every kernel; where it applies and differs from the
    profile's choice it becomes an option (`litekiln.artifact.program.Variant`). For the
    ``gpu`` profile they target what dominates the H100 profiles: convolutions over input
    channels (dlight's Matmul by default, 32x32 output tiles per 64-thread group, too few
    groups for a 14x14x512 layer on 132 SMs):

    * our serial-reduction rule over channels too, with the default tiles and with 4x1 tiles
      (more work-items); over a window only (depthwise, pooling), 4 channels per work-item
      where the default takes fewer (to fill the GPU), and 1 and 2 channels and 2 channels x
      2 pixels where it takes more;
    * dlight's Matmul with its CUDA configuration (8x16 threads, 4x4 micro tiles, 16-deep K
      steps, 2-wide vectors) and with small tiles (16x16 threads, 2x2 micro tiles: 4x more
      groups);
    * dlight's Matmul with 16x16 output tiles, as 8x8 threads of 2x2 or 16x16 threads of one
      output each: for the late 14x14 and 7x7 layers (MobileNet's 7x7x1024 1x1 convolutions
      make 32 groups of the CUDA configuration's 32x64 tiles for 132 SMs; 256 groups here).
      Chosen only where the device times them faster (the H100 had only the others so far).
    * `FewOutputsReduction`: one work-group per output for few outputs of long reductions
      (the late 1x1 convolutions of the landmark models).
    * `LaneReduction` with 8 and 32 lanes per output: split-K inside the work-group for
      convolutions and matrix products of 128 terms and more over at most 512K outputs
      (dlight's Matmul walks the whole reduction in barrier-separated steps per tile).
    * `TiledLaneReduction` with 4x4, 4x8 and 2x4 register tiles (pixels x channels) on 8
      lanes: split-K over a few lanes with reuse in registers, for the 3x3 convolutions of
      mid-sized maps (SqueezeNet's expand layers: 1.1-1.4x faster than the variants before
      it on the H200), 1x1 convolutions over many channels and the matrix products of the
      vision transformers; and 4x4 tiles on 16 lanes for reductions of 256 terms and more
      (twice the threads of a small-M matrix product: DeiT-Tiny's 197-token MLP gave 148
      groups of 128 threads to 132 SMs). Tried on the H200 and never chosen there: 4x4
      tiles with vector loads of 4 channels, 4x4 on 4 lanes, 8x4 on 8 (docs/benchmarks.md).
    * `SharedMatmul` for matrix products (relax's ``matmul``, fully connected layers) and
      convolutions over channels (1x1, 3x3, patch embeddings: pixels x window taps):
      operand tiles staged in local memory, split-K across the work-group's thread planes;
      16x16, 16x32 and 32x32 output tiles on 4 planes, 16x16 on 8, 32x32 on 2; 32x32 with
      2 and 4 times the terms staged per step on 4 planes, 4 times on 2; and 16x32 split
      across 4 work-groups for reductions of 512 terms and more (a second kernel sums the
      partials). Larger tiles (64x64 of 8x8 per thread on 2 planes and on 1, 32x64 of 4x8
      on 2) were timed on the H200 on the products of ResMLP, DeiT, TinyViT and CoaT and
      chosen for none: one or two groups per SM hide the loads worse (docs/benchmarks.md,
      twenty-third session).
    * for the reductions that read their input whole (global pools, layer-norm statistics,
      squeeze-excite GEMVs, classifiers): `ColumnReduction` with 32 channels x 8 slices and
      8 channels x 32 slices per group; `RowReduction` with one work-item per row (serial,
      no barrier), with 32 lanes on rows of any length, and with a group of 256 threads per
      row (split-K); dlight's GEMV and Reduction (what some of these kernels had before our
      rules took them).
    * layer norms: `RowNormalization` with one work-item per row and with 128 lanes per row;
      one-row products with their norm: `NormedRowReduction` with 64 and 128 lanes.
    * attentions: `FusedAttention` with 1, 2 and 8 query rows per group, and 8 rows of 16
      lanes; with 4, 2 and 8 rows, the key and term loops unrolled whole; and unrolled whole
      with the keys, the values or both staged in local memory (4 rows; both also with 8),
      where they fit (TinyViT's 196-key windows chose the staged keys on the H200).

    The ``cpu`` profile has none (PoCL is for correctness).
    """
    if profile != "gpu":
        return []
    cfg = dl.gpu.Matmul.Config
    return [
        SerialReduction(channel_reductions=True),
        SerialReduction(tiles=((4, 1),), channel_reductions=True),
        # 4 channels per work-item over a window only, however few the work-items (the
        # default falls to 2 and 1 below `_ENOUGH_WORK_ITEMS`)
        SerialReduction(window_only_tiles=((4, 1),)),
        # ... and 1 and 2 channels, and 2 channels x 2 pixels, however many the work-items:
        # the H200 chose them for MobileNets' 3x3 depthwise layers at every size, 20-35% faster
        # than 4 channels a work-item (1 channel mostly; 2x2 on the largest maps; 4x2 was
        # tried and never chosen: docs/benchmarks.md, eighteenth session)
        SerialReduction(window_only_tiles=((1, 1),), channel_reductions=False),
        SerialReduction(window_only_tiles=((2, 1),), channel_reductions=False),
        SerialReduction(window_only_tiles=((2, 2),), channel_reductions=False),
        ConfiguredMatmul(
            cfg(
                block_size_x=8,
                block_size_y=16,
                micro_size_x=4,
                micro_size_y=4,
                micro_size_k=16,
                vector_size=2,
                unroll=256,
                use_shared=True,
                storage_align=True,
            )
        ),
        ConfiguredMatmul(
            cfg(
                block_size_x=16,
                block_size_y=16,
                micro_size_x=2,
                micro_size_y=2,
                micro_size_k=8,
                vector_size=1,
                unroll=64,
                use_shared=True,
            )
        ),
        ConfiguredMatmul(
            cfg(
                block_size_x=8,
                block_size_y=8,
                micro_size_x=2,
                micro_size_y=2,
                micro_size_k=16,
                vector_size=1,
                unroll=64,
                use_shared=True,
            )
        ),
        ConfiguredMatmul(
            cfg(
                block_size_x=16,
                block_size_y=16,
                micro_size_x=1,
                micro_size_y=1,
                micro_size_k=16,
                vector_size=1,
                unroll=64,
                use_shared=True,
            )
        ),
        FewOutputsReduction(),
        # Split-K inside the work-group for long reductions over few outputs (the 3x3
        # convolutions of small late maps, classifiers run as 1x1 convolutions).
        LaneReduction(lanes=8),
        LaneReduction(lanes=32),
        # Register tiles with split-K over a few lanes (3x3 convolutions of mid-sized maps).
        TiledLaneReduction(),
        TiledLaneReduction(channels=8),
        TiledLaneReduction(pixels=2),
        TiledLaneReduction(lanes=16, min_terms=256),
        # Matrix products through local memory with split-K across the group (the vision
        # transformers' token x channel products, their patch embeddings): 16x16, 16x32
        # and 32x32 tiles on 4 lanes, 16x16 on 8 (the four of seven tried on the H200 that
        # won most kernels of DeiT, TinyViT and LeViT: docs/benchmarks.md).
        SharedMatmul(),
        SharedMatmul(mn=4),
        SharedMatmul(mm=4, mn=4),
        SharedMatmul(tn=4, mn=4, lanes=8),
        # and split 4 ways across work-groups, for long reductions over few outputs (DeiT's
        # fc2: 197 x 192 outputs, 768 terms; 78 groups of 16x32 for 132 SMs otherwise)
        SharedMatmul(mn=4, splits=4, min_terms=512),
        # and 32x32 tiles of 4x4 per thread on 2 planes (more multiply-adds per local-memory
        # read, once the tiles were read without bank conflicts: chosen on the H200 for
        # TinyViT's 1x1 convolutions and the stems of ResNet-18 and SqueezeNet, 5-10% faster
        # there). Split 16 ways across groups was tried for the deepest reductions
        # (ResNet-18's last 3x3 layers, 4608 terms) and lost to the other options.
        SharedMatmul(mm=4, mn=4, lanes=2, step=16),
        # and deeper steps (twice and four times the terms staged between two barriers, on 4
        # planes; four times on 2): fewer waits on global memory a tile. Chosen on the H200
        # for most of the 1x1 and 3x3 convolutions of MobileNetV1, PoseNet and ResNet-18's
        # early layers, 3-11% faster than the best option before (docs/benchmarks.md,
        # eighteenth session). Loads staged in registers a step ahead (software pipelining)
        # were tried with them and lost to these everywhere but once.
        SharedMatmul(mm=4, mn=4, step=16),
        SharedMatmul(mm=4, mn=4, step=32),
        SharedMatmul(mm=4, mn=4, lanes=2, step=32),
        # Reductions read whole (global pools, layer norms, squeeze-excite GEMVs): other
        # shapes of `ColumnReduction` and `RowReduction`, and dlight's rules that had the
        # kernels before those became the defaults (`SerialReduction`'s are above).
        ColumnReduction(channels=32),
        ColumnReduction(channels=8),
        RowReduction(lanes=1),
        RowReduction(max_terms=None),
        RowReduction(lanes=256, min_terms=4, max_terms=None),
        *dlight_rules("GEMV", "Reduction"),
        # Layer norms (`RowNormalization`, 32 lanes per row): one work-item per row (serial,
        # no barrier), and 128 lanes per row (rows of 256 terms and more).
        RowNormalization(lanes=1),
        RowNormalization(lanes=128),
        # One-row products with their operand's norm (`NormedRowReduction`, 32 lanes per
        # output): 64 and 128 lanes (two to four warps an output; hand-written kernels of
        # [N, K] weights were fastest so on the H200 for K of 640 and 2048:
        # scripts/remote_gpu/gemv_probe.py).
        NormedRowReduction(lanes=64),
        NormedRowReduction(lanes=128),
        # Attentions (`FusedAttention`, 4 query rows of 32 lanes per group): 1, 2 and 8 rows
        # (more groups, or the keys and values read by fewer), 8 rows of 16 lanes.
        GatedStepLanes(),
        GatedStepLanes(units=4, lanes=8),
        GatedStepShared(units=2, lanes=16),
        GatedStepShared(units=4, lanes=8),
        GatedStepShared(units=8, lanes=4),
        FusedAttention(rows=1),
        FusedAttention(rows=2),
        FusedAttention(rows=8),
        FusedAttention(rows=8, lanes=16),
        FusedAttention(unroll_by_8=False),
        FusedAttention(rows=2, unroll_by_8=False),
        FusedAttention(rows=8, unroll_by_8=False),
        FusedAttention(unroll_by_8=False, stage="k"),
        FusedAttention(unroll_by_8=False, stage="v"),
        FusedAttention(unroll_by_8=False, stage="kv"),
        FusedAttention(rows=8, unroll_by_8=False, stage="kv"),
    ]
