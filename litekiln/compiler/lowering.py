"""The lowering's core: what every emitter sees (:class:`Ctx`), the emitter registry and the
partition walk (:class:`Lowering`), and the helpers emitters share.

One emitter per op name, registered in :data:`EMITTERS`; each emitter turns one IR op into
Relax expressions. The op's semantics (what it computes) live in its :mod:`litekiln.ops`
definition; an emitter only says how to build the same computation from Relax ops, and the
per-op GPU-vs-reference tests hold the two together.

Weights are transformed once here, with numpy, into the layouts Relax wants (depthwise
``1HW(CM)`` -> ``(CM)HW1`` grouped OHWI; fully-connected ``[out, in]`` -> ``[in, out]``), and
enter the module as Relax constants.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import tvm
from tvm import relax

from litekiln.artifact.weights import MergedTensor
from litekiln.compiler.attention import find_attentions
from litekiln.compiler.gated_step import GatedStep, find_gated_steps
from litekiln.compiler.layer_norm import find_layer_norms
from litekiln.compiler.partition import Partition
from litekiln.compiler.sibling_merge import SiblingMerge
from litekiln.errors import CompileError, UnsupportedOpError
from litekiln.model.ir import Op, Subgraph, Tensor
from litekiln.ops.base import dequantize, is_quantized, lookup

Expr = Any  # relax.Expr; kept loose because TVM's Python typing is dynamic

#: Every op computes in float32 whatever the storage precision: fp16 sums over a 3x3x256
#: window lose ~1e-2 relative (cuDNN accumulates fp16 convolutions in float32 too), and a
#: driver that builds half code without cl_khr_fp16 (NVIDIA) has no half built-ins (max,
#: exp, ...) at all.
ACC_DTYPE = "float32"

#: Quantized partition inputs and outputs of these dtypes are program inputs and outputs of
#: that dtype: the program dequantizes the integers it is handed and quantizes what it returns
#: (a uint8 camera frame moves a quarter of the bytes of its float view, and the CPU makes no
#: pass over it either way). Wider integers keep the CPU path: (q - zero_point) is no longer
#: exact in float32.
INTEGER_IO_DTYPES = frozenset({"int8", "uint8", "int16"})


@dataclass
class LowerOptions:
    """Options that change the lowered program (all part of the cache key)."""

    precision: str = "fp32"  # "fp32" or "fp16"
    quant_simulation: bool = True  # fake-quantize outputs of quantized tensors
    # fp16: "native" stores every tensor (and the convolution/FC weights) in half and
    # computes in float32: each op reads half, converts, computes (convolutions accumulate)
    # in float32 and rounds its result to half; data-movement ops (reshape, pad, concat,
    # slices) move half values. "emulated", for devices without half: fp32 kernels that
    # round every constant and every op output to the nearest fp16 value (the same numerics,
    # without the memory saving).
    half: str = "native"  # "native" or "emulated"
    # fp16: tensors kept in float32 storage (the fp16 error guard, compiler/precision.py).
    # Partition inputs and outputs are float32 storage under fp16 in any case.
    fp32_tensors: frozenset[int] = frozenset()
    # Each layer norm written as basic ops (MEAN, SQUARED_DIFFERENCE, MEAN, RSQRT...) lowered
    # as one call (compiler/layer_norm.py), so that it becomes one kernel; off: op by op (the
    # compiler's fallback when that call does not build).
    fuse_layer_norms: bool = True
    # A per-channel scale of a computed tensor (a squeeze-excite gate: ``x * g``, ``g`` of
    # shape 1x1x1xC) whose only readers are convolutions is multiplied in as each of them
    # loads its input (:meth:`Lowering.scale_folds`): one kernel and one map round trip fewer
    # per gate. Off: the MUL is a kernel of its own (the compiler's fallback, with the layer
    # norms', when the fused form does not build).
    fuse_scales: bool = True
    # Each attention (BATCH_MATMUL, SOFTMAX, BATCH_MATMUL) lowered as one call
    # (compiler/attention.py): one kernel, the scores and probabilities never in memory.
    fuse_attention: bool = True
    # Each unrolled recurrent step (its recurrent product, gates and state update) lowered
    # as one call (compiler/gated_step.py): one kernel a step where op by op it is two.
    fuse_gates: bool = True
    # Parallel convolutions of one map summed by a tree of ADDs (re-parameterisable blocks:
    # MobileOne, RepVGG) computed as one convolution of summed weights
    # (compiler/branch_merge.py).
    merge_branches: bool = True
    # Convolutions of one map with the same window (GoogLeNet's 1x1 branches) computed as one
    # convolution whose output holds each one's channels (compiler/sibling_merge.py).
    merge_siblings: bool = True

    def unfused(self) -> LowerOptions:
        """These options with every multi-op fusion off (the op-by-op fallback)."""
        return replace(
            self,
            fuse_layer_norms=False,
            fuse_scales=False,
            fuse_attention=False,
            fuse_gates=False,
            merge_branches=False,
            merge_siblings=False,
        )

    @property
    def fuses(self) -> bool:
        return (
            self.fuse_layer_norms
            or self.fuse_scales
            or self.fuse_attention
            or self.fuse_gates
            or self.merge_branches
            or self.merge_siblings
        )


#: Option of a convolution the compiler made (a merge of parallel branches): its zero padding
#: (top, left, bottom, right), in place of TFLite's SAME or VALID.
EXPLICIT_PADS = "litekiln_explicit_pads"

#: Name of a convolution emitted with its input's per-channel scale (``conv2d_scaled``,
#: ``fused_conv2d_scaled_add...`` after FuseOps).
SCALED_CONV_NAME = "conv2d_scaled"
#: Name of a convolution that reads its NCHW input through a folded layout transpose.
NCHW_CONV_NAME = "conv2d_nchw_in"
#: Name of a convolution that reads the parts of a folded channel concatenation.
CONCAT_CONV_NAME = "conv2d_concat_in"
#: Name of a convolution that dequantizes its 8-bit input as it loads.
DEQUANT_CONV_NAME = "conv2d_dequant_in"
#: Name of a convolution that reads a folded slice of its input's channels.
SLICE_CONV_NAME = "conv2d_slice_in"
#: Names of the convolutions `conv_folded` emits (the op-by-op fallback looks for them).
FOLDED_CONV_NAMES = (
    SCALED_CONV_NAME,
    NCHW_CONV_NAME,
    CONCAT_CONV_NAME,
    DEQUANT_CONV_NAME,
    SLICE_CONV_NAME,
)


class Ctx:
    """What an emitter sees: the op, its operands as Relax exprs or numpy constants."""

    def __init__(self, lw: Lowering, op: Op) -> None:
        self.lw = lw
        self.op = op
        self.bb = lw.bb

    @property
    def options(self) -> dict[str, Any]:
        return self.op.options

    def tensor(self, i: int) -> Tensor:
        return self.lw.graph.tensors[self.op.inputs[i]]

    def out(self, i: int = 0) -> Tensor:
        return self.lw.graph.tensors[self.op.outputs[i]]

    def has(self, i: int) -> bool:
        return i < len(self.op.inputs) and self.op.inputs[i] >= 0

    def const(self, i: int) -> np.ndarray:
        """A constant operand as a float32 (or integer) numpy array."""
        t = self.tensor(i)
        if t.data is None:
            raise CompileError(f"{self.op.describe()}: operand {i} ({t.name!r}) must be a constant")
        if is_quantized(t):
            return dequantize(t.data, t)
        return t.data.astype(np.float32) if t.data.dtype.kind == "f" else t.data

    def arg(self, i: int) -> Expr:
        """Operand ``i`` as a float32 Relax expression (constants become Relax constants)."""
        return self.lw.value(self.op.inputs[i])

    def arg_stored(self, i: int) -> Expr:
        """Operand ``i`` in its storage dtype (half under native fp16): for data-movement ops
        and for convolutions, which convert while they accumulate."""
        return self.lw.stored(self.op.inputs[i])

    def index(self, i: int) -> Expr:
        """Index operand ``i`` as int32: a partition input the kernel reads at run time
        (`OpDef.runtime_indices`), or a constant."""
        t = self.op.inputs[i]
        if self.lw.graph.tensors[t].data is None:
            return self.lw.stored(t)
        return relax.const(np.asarray(self.lw.graph.tensors[t].data, np.int32), "int32")

    def is_runtime(self, i: int) -> bool:
        """Whether operand ``i`` is computed at run time (not a constant)."""
        return self.lw.graph.tensors[self.op.inputs[i]].data is None

    def emit(self, expr: Expr) -> Expr:
        return self.bb.emit(expr)

    def fconst(self, array: np.ndarray | float) -> Expr:
        return relax.const(np.asarray(array, dtype=self.lw.dtype), self.lw.dtype)

    def wconst(self, array: np.ndarray) -> Expr:
        """A weight constant (convolution, FC) in the storage dtype, rounded as it is stored."""
        return self.lw.const_array(array, self.lw.storage)

    def fail(self, msg: str) -> CompileError:
        return CompileError(f"{self.op.describe()}: {msg}")


Emitter = Callable[[Ctx], list[Expr]]
EMITTERS: dict[str, Emitter] = {}

#: Name prefix of binary ops whose op pattern is set to injective (emit_nn._binary).
BROADCAST_BARRIER = "bcast_"

#: Largest window (taps) of a pool emitted as elementwise reads of its taps
#: (`emit_nn._small_pool`).
SMALL_POOL_TAPS = 4


def emitter(*names: str) -> Callable[[Emitter], Emitter]:
    def deco(fn: Emitter) -> Emitter:
        for n in names:
            EMITTERS[n] = fn
        return fn

    return deco


class Lowering:
    def __init__(self, graph: Subgraph, part: Partition, options: LowerOptions) -> None:
        self.graph = graph
        self.part = part
        self.options = options
        fp16 = options.precision == "fp16"
        self.dtype = ACC_DTYPE  # what ops compute in
        self.storage = "float16" if fp16 and options.half == "native" else "float32"
        self.emulate_half = fp16 and options.half == "emulated"
        self.fp16 = fp16
        self.float_storage = set(options.fp32_tensors) | set(part.inputs) | set(part.outputs)
        self.bb = relax.BlockBuilder()
        self.env: dict[int, Expr] = {}  # tensor -> its value in the storage dtype
        #: Partition inputs taken as their integers (`INTEGER_IO_DTYPES`) -> their parameter.
        self.raw_inputs: dict[int, Expr] = {}
        self.readers = self._readers()  # tensor -> the partition's ops that read it
        self.pad_folds = self._find_pad_folds()
        norms = find_layer_norms(graph, part) if options.fuse_layer_norms else []
        self.layer_norms = {ln.last: ln for ln in norms}  # op writing its output -> the norm
        self.in_layer_norm = {i for ln in norms for i in ln.ops if i != ln.last}
        normed = {i for ln in norms for i in ln.ops}
        attns = [
            a
            for a in (find_attentions(graph, part) if options.fuse_attention else [])
            if not a.ops & normed
        ]
        self.attentions = {a.last: a for a in attns}  # second product -> the attention
        self.in_attention = {i for a in attns for i in a.ops if i != a.last}
        self.branch_merges: dict[int, Op] = {}  # root ADD -> the convolution it becomes
        self.merge_rest: dict[int, tuple[int, ...]] = {}  # root ADD -> its other terms
        #: How each merge's weights are made from the model's (`trace_weights` finds the
        #: constants they become, so that the cache stores the recipe, not the array).
        self.merged_weights: list[MergedTensor] = []
        self.in_branch_merge: set[int] = set()
        taken = normed | {i for a in attns for i in a.ops}
        steps = find_gated_steps(graph, part, taken) if options.fuse_gates else []
        self.gated_steps = {s.last: s for s in steps}  # last op -> the recurrent step
        self.in_gated_step = {i for s in steps for i in s.ops if i != s.last}
        taken |= {i for s in steps for i in s.ops}
        if options.merge_branches and not self.emulate_half:
            self._add_branch_merges(taken)
        #: Sibling convolutions merged (`sibling_merge`): first sibling -> the merge and the
        #: merged convolution; the others are emitted with it.
        self.sibling_merges: dict[int, tuple[SiblingMerge, Op]] = {}
        self.in_sibling_merge: set[int] = set()
        #: The merged weights of sibling convolutions (a part of `merged_weights`).
        self.sibling_weights: list[MergedTensor] = []
        #: Sibling output -> (merged output, first channel), for the slice folds.
        self.sibling_folds: dict[int, tuple[int, int]] = {}
        self.concat_folds = self._find_concat_folds() if options.fuse_scales else {}
        if options.merge_siblings and not self.emulate_half:
            self._add_sibling_merges(
                taken | self.in_branch_merge | set(self.branch_merges), options.fuse_scales
            )
        # (after the merges: a sibling's output read by convolutions is a slice they fold)
        self.scale_folds = self._find_scale_folds() if options.fuse_scales else {}
        self.transpose_folds = self._find_transpose_folds() if options.fuse_scales else {}
        self.slice_folds = self._find_slice_folds() if options.fuse_scales else {}
        self.slice_folds.update(self.sibling_folds)
        self.dequant_folds = self._find_dequant_folds() if options.fuse_scales else set()

    def _add_branch_merges(self, taken: set[int]) -> None:
        """Sums of parallel convolutions of one map (`branch_merge.find_branch_merges`), each
        emitted at its root ADD as one convolution: an op of the merge's kind whose weights
        and bias are tensors added to this lowering's own copy of the graph (the model's
        graph is never changed) and whose padding is explicit (`EXPLICIT_PADS`)."""
        from litekiln.compiler.branch_merge import find_branch_merges

        merges = find_branch_merges(self.graph, self.part, self.readers, self.pad_folds, taken)
        if not merges:
            return
        g = self.graph
        self.graph = g = replace(g, tensors=list(g.tensors))
        for m in merges:
            root = g.ops[m.root]
            w = self._new_constant(f"merged_{m.root}_weights", m.weights.build(g))
            self.merged_weights.append(m.weights)
            b = self._new_constant(f"merged_{m.root}_bias", m.bias)
            options = {
                "padding": 1,
                EXPLICIT_PADS: m.pads,
                "stride_h": m.stride[0],
                "stride_w": m.stride[1],
                "depth_multiplier": m.multiplier,
                "fused_activation_function": 0,
            }
            code = 3 if m.kind == "CONV_2D" else 4  # (TFLite's builtin codes)
            conv = Op(root.index, m.kind, code, 1, [m.source, w, b], list(root.outputs))
            conv.options = options
            self.branch_merges[m.root] = conv
            self.merge_rest[m.root] = m.rest
            self.in_branch_merge |= m.ops - {m.root}

    def _add_sibling_merges(self, taken: set[int], fold: bool) -> None:
        """Sibling convolutions of one map (`sibling_merge.find_sibling_merges`), each group
        emitted at its first sibling as one convolution whose output (a tensor added to this
        lowering's copy of the graph) holds the siblings' channels side by side. Only
        siblings whose outputs cost no kernel as slices merge: read only by convolutions,
        which fold the slice (``fold``: the folds are on), or by concatenations, reshapes and
        transposes, injective ops that take the slice into their own index arithmetic (a
        transformer's queries, keys and values on their way to the heads' layout), but for a
        reshape or transpose whose result leaves the partition: a reshape of the sibling's own
        output is a view there, of a slice a copy (MediaPipe's pose landmark heads)."""
        from litekiln.compiler.sibling_merge import find_sibling_merges

        def keep_apart(t: int) -> bool:
            """Whether sibling output ``t`` stays a convolution's own output: where a slice of
            the merged map would be a kernel of its own (a map that leaves the partition, a
            reader that would have been the sibling's epilogue), or a map that fp16 guards
            (stored in float32, where the merged map is half)."""
            if t in self.part.outputs or (self.fp16 and t in self.float_storage):
                return True
            users = self.readers.get(t, [])
            return not users or not all(
                (fold and self._reads_as_conv_input(u, t))
                or (u.name == "CONCATENATION" and u.outputs[0] not in self.concat_folds)
                or (
                    u.name in ("RESHAPE", "TRANSPOSE")
                    and u.outputs[0] not in self.part.outputs  # (a reshape there is a view)
                    and u.index not in self.in_attention
                    and u.index not in self.in_layer_norm
                    and u.index not in self.layer_norms
                    and u.index not in self.attentions
                )
                for u in users
            )

        merges = find_sibling_merges(self.graph, self.part, taken, keep_apart)
        if not merges:
            return
        self.graph = g = replace(self.graph, tensors=list(self.graph.tensors))
        for m in merges:
            first = g.ops[m.ops[0]]
            w = self._new_constant(f"siblings_{m.ops[0]}_weights", m.weights.build(g))
            self.merged_weights.append(m.weights)
            self.sibling_weights.append(m.weights)
            b = self._new_constant(f"siblings_{m.ops[0]}_bias", m.bias)
            y = g.tensors[m.outputs[0]]
            out = len(g.tensors)
            shape = (*y.shape[:-1], m.channels)
            g.tensors.append(Tensor(out, f"siblings_{m.ops[0]}", shape, np.dtype(np.float32)))
            conv = Op(first.index, first.name, first.code, first.version, [first.inputs[0], w, b],
                      [out], options=dict(first.options))  # fmt: skip
            self.sibling_merges[m.ops[0]] = (m, conv)
            self.in_sibling_merge |= set(m.ops[1:])
            for t, at in zip(m.outputs, m.offsets, strict=True):
                if fold and all(self._reads_as_conv_input(u, t) for u in self.readers[t]):
                    self.sibling_folds[t] = (out, at)

    def _new_constant(self, name: str, data: np.ndarray) -> int:
        """A float32 constant added to this lowering's copy of the graph: its index."""
        t = len(self.graph.tensors)
        self.graph.tensors.append(Tensor(t, name, tuple(data.shape), data.dtype, data=data))
        return t

    def _find_pad_folds(self) -> dict[int, tuple[int, tuple[int, int, int, int]]]:
        """PADs of height/width that only feed convolutions or max pools of this partition:
        padded tensor -> (source tensor, (top, left, bottom, right)). The readers take the
        padding themselves (:func:`conv_data`, `emit_nn._pool`) and the PAD is not emitted:
        one kernel launch and one tensor round trip fewer each.

        * A zero PAD read by convolutions: TF exports stride-2 SAME convolutions as PAD +
          VALID conv (43 of face_detection_full_range_sparse's 139 launches).
        * A PADV2 with minus infinity read by max pools of more than `SMALL_POOL_TAPS` taps:
          litert-torch writes PyTorch's padded ``MaxPool2d`` so (the stems of ResNets and
          ShuffleNets); a max pool's own padding never wins either, as long as every
          window keeps a cell of the map (each side's padding narrower than the window)."""
        g = self.graph
        folds: dict[int, tuple[int, tuple[int, int, int, int]]] = {}
        for i in self.part.ops:
            op = g.ops[i]
            if op.name not in ("PAD", "PADV2") or len(op.inputs) < 2 or not op.outputs:
                continue
            if op.name == "PADV2" and not self._pads_with_minus_infinity(op):
                continue
            t, src, pads_t = op.outputs[0], op.inputs[0], op.inputs[1]
            tensor = g.tensors[t]
            if (
                t in self.part.outputs
                or is_quantized(tensor)
                or g.tensors[src].data is not None
                or pads_t < 0
                or g.tensors[pads_t].data is None
                or len(tensor.shape) != 4
            ):
                continue
            pads = np.asarray(g.tensors[pads_t].data).astype(np.int64).reshape(-1, 2)
            if pads.shape != (4, 2) or pads.min() < 0 or pads[0].any() or pads[3].any():
                continue
            users = self.readers.get(t, [])
            readers = ("CONV_2D", "DEPTHWISE_CONV_2D") if op.name == "PAD" else ("MAX_POOL_2D",)
            if not users or any(
                u.name not in readers or u.inputs[0] != t or t in u.inputs[1:] for u in users
            ):
                continue
            if op.name == "PADV2" and not all(_pool_covers(u, pads) for u in users):
                continue
            folds[t] = (src, (int(pads[1, 0]), int(pads[2, 0]), int(pads[1, 1]), int(pads[2, 1])))
        return folds

    def _pads_with_minus_infinity(self, op: Op) -> bool:
        """Whether a PADV2 pads a float tensor with minus infinity (or float32's lowest)."""
        if len(op.inputs) < 3 or op.inputs[2] < 0:
            return False
        value = self.graph.tensors[op.inputs[2]].data
        if value is None or np.asarray(value).size != 1 or np.asarray(value).dtype.kind != "f":
            return False
        return float(np.asarray(value).reshape(-1)[0]) <= float(np.finfo(np.float32).min)

    def _find_scale_folds(self) -> dict[int, tuple[int, int]]:
        """Per-channel scales of computed maps read only by convolutions of this partition:
        scaled tensor -> (map, scale). A squeeze-and-excite block ends with ``x * g`` (``x``
        a NxHxWxC map, ``g`` the computed 1x1x1xC gate) feeding a 1x1 convolution; emitted
        as one kernel of its own, the product is a whole map written and read back. Folded,
        each of those convolutions multiplies its input by the gate as it loads it
        (:func:`conv_scaled`). Kept apart: a scale with a fused activation, quantized
        tensors, emulated fp16 (its rounding kernels), a product that leaves the partition,
        any reader but operand 0 of an ungrouped CONV_2D."""
        g = self.graph
        folds: dict[int, tuple[int, int]] = {}
        for op in self._fold_candidates("MUL"):
            if len(op.inputs) != 2:
                continue
            if int(op.options.get("fused_activation_function", 0) or 0):
                continue
            t = op.outputs[0]
            out = g.tensors[t]
            if t in self.part.outputs or len(out.shape) != 4 or out.dtype != np.float32:
                continue
            if is_quantized(out) or t in self.pad_folds:
                continue
            operands = [g.tensors[k] for k in op.inputs]
            if any(
                o.data is not None or is_quantized(o) or o.dtype != np.float32 for o in operands
            ):
                continue
            n, _, _, c = out.shape
            full = [k for k, o in zip(op.inputs, operands, strict=True) if o.shape == out.shape]
            gate = [k for k, o in zip(op.inputs, operands, strict=True) if o.shape == (n, 1, 1, c)]
            if len(full) != 1 or len(gate) != 1 or full[0] == gate[0] or c < 2:
                continue
            users = self.readers.get(t, [])
            if not users or any(
                u.name != "CONV_2D"
                or u.inputs[0] != t
                or t in u.inputs[1:]
                or u.inputs[1] < 0
                or g.tensors[u.inputs[1]].data is None
                or len(g.tensors[u.inputs[1]].shape) != 4
                or g.tensors[u.inputs[1]].shape[3] != c  # grouped: not folded
                for u in users
            ):
                continue
            folds[t] = (full[0], gate[0])
        return folds

    def _find_transpose_folds(self) -> dict[int, int]:
        """NCHW -> NHWC transposes of partition inputs read only by convolutions: transposed
        tensor -> the NCHW input. A model converted from PyTorch keeps PyTorch's NCHW input
        and transposes it for its first convolution (through a PAD or not); emitted alone,
        that transpose is a kernel writing the whole image again. Folded, the convolution
        reads the NCHW input itself (:func:`conv_folded`). Readers may be convolutions
        (operand 0) and PADs folded into convolutions (`_find_pad_folds`)."""
        g = self.graph
        folds: dict[int, int] = {}
        for op in self._fold_candidates("TRANSPOSE"):
            if len(op.inputs) != 2:
                continue
            src, t = op.inputs[0], op.outputs[0]
            x, out = g.tensors[src], g.tensors[t]
            if (
                transpose_perm(g, op) != [0, 2, 3, 1]
                or src not in self.part.inputs
                or t in self.part.outputs
                or x.data is not None
                or is_quantized(x)
                or is_quantized(out)
                or x.dtype != np.float32
            ):
                continue
            users = self.readers.get(t, [])
            if users and all(self._reads_as_conv_input(u, t) for u in users):
                folds[t] = src
        return folds

    def _find_dequant_folds(self) -> set[int]:
        """8-bit partition inputs (per-tensor scale) read only as convolutions' data: an
        int8 model's image. Emitted alone, their dequantization is a kernel writing the image
        again in float32, four times its bytes; folded, the convolution dequantizes as it
        loads (:func:`conv_folded`)."""
        g = self.graph
        if self.emulate_half:
            return set()
        folds: set[int] = set()
        for t in self.part.inputs:
            x = g.tensors[t]
            if (
                not is_quantized(x)
                or x.dtype.name not in INTEGER_IO_DTYPES
                or x.quantization is None
                or x.quantization.per_channel
                or len(x.shape) != 4
                or t in self.part.outputs
            ):
                continue
            users = self.readers.get(t, [])
            if users and all(
                u.name in ("CONV_2D", "DEPTHWISE_CONV_2D") and self._reads_as_conv_input(u, t)
                for u in users
            ):
                folds.add(t)
        return folds

    def _find_concat_folds(self) -> dict[int, list[int]]:
        """Concatenations along the channels read only by convolutions: concatenated tensor
        -> its parts, in order. SqueezeNet's fire modules concatenate two convolutions'
        outputs for the next module's 1x1 convolution; emitted alone, the concatenation is
        a kernel that copies both maps into a third. Folded, the convolution reads each
        channel from its part (:func:`conv_folded`). Kept apart: a fused activation,
        quantized or non-float parts, a concatenation that leaves the partition or is read
        by anything but a convolution's data."""
        g = self.graph
        folds: dict[int, list[int]] = {}
        for op in self._fold_candidates("CONCATENATION"):
            t = op.outputs[0]
            out = g.tensors[t]
            parts = [k for k in op.inputs if k >= 0 and g.tensors[k].size]
            if (
                len(out.shape) != 4
                or int(op.options.get("axis", 0)) % 4 != 3
                or int(op.options.get("fused_activation_function", 0) or 0)
                or t in self.part.outputs
                or len(parts) < 2
                or is_quantized(out)
                or out.dtype != np.float32
                or any(
                    is_quantized(g.tensors[k]) or g.tensors[k].dtype != np.float32 for k in parts
                )
            ):
                continue
            users = self.readers.get(t, [])
            if users and all(self._reads_as_conv_input(u, t) for u in users):
                folds[t] = parts
        return folds

    def _find_slice_folds(self) -> dict[int, tuple[int, int]]:
        """SLICEs and STRIDED_SLICEs of a run of channels read only by convolutions: sliced
        tensor -> (its source, the first channel). ShuffleNet's blocks split the shuffled
        channels in two halves and feed one to the branch's 1x1 convolution; emitted alone,
        the slice is a kernel that copies half a map for the convolution to read back.
        Folded, the convolution reads its channels at an offset into the source
        (:func:`conv_folded`). Kept apart: anything but a step-1 run of the last axis of a
        4-D float map, a slice that leaves the partition or is read by anything but a
        convolution's data."""
        from litekiln.ops.shape import slice_ranges, strided_slice_plan

        g = self.graph
        folds: dict[int, tuple[int, int]] = {}
        for op in self._fold_candidates("SLICE", "STRIDED_SLICE"):
            t, src = op.outputs[0], op.inputs[0]
            shape = tuple(int(d) for d in g.tensors[src].shape)
            consts = [g.tensors[k].data if k >= 0 else None for k in op.inputs[1:]]
            if (
                len(shape) != 4
                or any(c is None for c in consts)
                or t in self.part.outputs
                or is_quantized(g.tensors[t])
                or g.tensors[t].dtype != np.float32
                or g.tensors[src].dtype != np.float32
                or g.tensors[src].data is not None
            ):
                continue
            ints = [[int(v) for v in np.asarray(c).astype(np.int64).reshape(-1)] for c in consts]
            if op.name == "SLICE":
                if len(ints) != 2 or len(ints[0]) != 4 or len(ints[1]) != 4:
                    continue
                ranges = slice_ranges(shape, ints[0], ints[1])
            else:
                if len(ints) != 3:
                    continue
                try:
                    plan = strided_slice_plan(shape, ints[0], ints[1], ints[2], op.options)
                except ValueError:
                    continue
                if tuple(plan.shape) != shape or tuple(plan.output) != tuple(
                    len(r) for r in plan.ranges
                ):
                    continue
                ranges = list(plan.ranges)
            if any(r != range(d) for r, d in zip(ranges[:3], shape[:3], strict=True)):
                continue
            channels = ranges[3]
            if channels.step != 1 or len(channels) == 0 or len(channels) == shape[3]:
                continue
            users = self.readers.get(t, [])
            if users and all(self._reads_as_conv_input(u, t) for u in users):
                folds[t] = (src, channels.start)
        return folds

    def _fold_candidates(self, *names: str) -> Iterator[Op]:
        """The partition's ops named one of ``names`` with one output, in order: what a
        convolution may compute as it loads. None under emulated fp16, whose rounding
        kernels keep every map."""
        if self.emulate_half:
            return
        for i in self.part.ops:
            op = self.graph.ops[i]
            if op.name in names and len(op.outputs) == 1:
                yield op

    def _folded_by_convs(self, name: str) -> dict[int, Any]:
        """The folds (tensor -> what the convolutions read instead) of ops named ``name``."""
        folds: dict[str, dict[int, Any]] = {
            "MUL": self.scale_folds,
            "TRANSPOSE": self.transpose_folds,
            "CONCATENATION": self.concat_folds,
            "SLICE": self.slice_folds,
            "STRIDED_SLICE": self.slice_folds,
        }
        return folds.get(name, {})

    def _readers(self) -> dict[int, list[Op]]:
        """Tensor -> the ops of this partition that read it."""
        g = self.graph
        readers: dict[int, list[Op]] = {}
        for i in self.part.ops:
            for t in set(g.ops[i].inputs):
                readers.setdefault(t, []).append(g.ops[i])
        return readers

    def _reads_as_conv_input(self, op: Op, t: int) -> bool:
        """Whether ``op`` reads ``t`` only as a convolution's input, itself or through a PAD
        folded into convolutions."""
        if op.name in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            return op.inputs[0] == t and t not in op.inputs[1:]
        return op.name == "PAD" and bool(op.outputs) and op.outputs[0] in self.pad_folds

    def half_stored(self, t: int) -> bool:
        """Whether op result / partition input ``t`` is stored as fp16 (half storage under
        native fp16, rounded float32 under emulated): not a boundary or guarded tensor."""
        return self.fp16 and t not in self.float_storage and not int_valued(self.graph.tensors[t])

    def storage_dtype(self, t: int) -> str:
        """The dtype op result ``t`` is stored in: half where native fp16 stores it, else
        float32."""
        return "float16" if self.storage == "float16" and self.half_stored(t) else ACC_DTYPE

    def const_array(self, data: np.ndarray, dtype: str) -> Expr:
        """A Relax constant; floats rounded to fp16 first under either fp16 mode."""
        if data.dtype.kind == "f":
            if self.emulate_half or self.storage == "float16":
                data = data.astype(np.float16)
            data = data.astype(dtype)
        return relax.const(np.ascontiguousarray(data), str(data.dtype))

    def stored(self, t: int) -> Expr:
        """Tensor ``t`` as stored: partition inputs and op results in the storage dtype,
        constants in float32 (their values rounded to fp16 under fp16)."""
        if t in self.env:
            return self.env[t]
        tensor = self.graph.tensors[t]
        raw = self.raw_inputs.get(t)
        if raw is not None:
            self.env[t] = self.bb.emit(self._dequantize_input(raw, tensor))
            return self.env[t]
        if tensor.data is None:
            raise CompileError(
                f"tensor {t} ({tensor.name!r}) has no value in partition {self.part.index}"
            )
        if int_valued(tensor):  # (an int32 operand of integer arithmetic: `OpDef.int32_data`)
            c = relax.const(np.array(tensor.data, np.int32, order="C"), "int32")
            self.env[t] = c
            return c
        data = dequantize(tensor.data, tensor) if is_quantized(tensor) else tensor.data
        c = self.const_array(data, ACC_DTYPE)
        self.env[t] = c
        return c

    def value(self, t: int) -> Expr:
        """Tensor ``t`` in float32 (int32 values as they are: `int_valued`): a half tensor
        gets a conversion of its own per use, so that each consumer's kernel converts as it
        loads."""
        x = self.stored(t)
        if dtype_of(x) == "float16":
            return self.bb.emit(relax.op.astype(x, ACC_DTYPE))
        return x

    def build(self) -> tvm.IRModule:
        params = []
        for t in self.part.inputs:
            tensor = self.graph.tensors[t]
            # Booleans (LOGICAL_AND) travel as float 0/1: the session converts them both ways.
            # int32 inputs (run-time indices, `OpDef.runtime_indices`, and the operands of
            # int32 arithmetic, `OpDef.int32_data`) are read as they are.
            index = int_valued(tensor)
            if tensor.dtype.kind not in "fb" and not is_quantized(tensor) and not index:
                raise CompileError(
                    f"partition {self.part.index}: input tensor {t} ({tensor.name!r}) is "
                    f"{tensor.dtype.name}; GPU partitions take float (or bool) tensors and "
                    "int32 indices"
                )
            # An 8- or 16-bit input travels as its integers (a quarter of the bytes) and is
            # dequantized on the device (`_dequantize_input`), not on the CPU.
            raw = is_quantized(tensor) and tensor.dtype.name in INTEGER_IO_DTYPES
            dtype = tensor.dtype.name if raw or index else ACC_DTYPE
            v = relax.Var(f"t{t}", relax.TensorType(shape=tuple(tensor.shape), dtype=dtype))
            params.append(v)
            if raw:
                self.raw_inputs[t] = v  # (its float values emitted where first read: `stored`)
            else:
                self.env[t] = v
        with self.bb.function("main", params):
            with self.bb.dataflow():
                for i in self.part.ops:
                    op = self.graph.ops[i]
                    if (
                        op.name in ("PAD", "PADV2")
                        and op.outputs
                        and op.outputs[0] in self.pad_folds
                    ):
                        continue  # taken by its convolutions (max pools)
                    if i in self.in_layer_norm or i in self.in_attention:
                        continue  # emitted with the layer norm's (attention's) last op
                    if i in self.in_gated_step:
                        continue  # emitted with the recurrent step's last op
                    if i in self.gated_steps:
                        self._emit_gated_step(self.gated_steps[i])
                        continue
                    if i in self.in_branch_merge or i in self.in_sibling_merge:
                        continue  # computed by a merged convolution (its root ADD, first sibling)
                    if i in self.sibling_merges:
                        self._emit_siblings(*self.sibling_merges[i])
                        continue
                    if op.outputs and op.outputs[0] in self._folded_by_convs(op.name):
                        continue  # computed by its convolutions as they load (conv_folded)
                    outs = self._emit(i, op)
                    for t, expr in zip(op.outputs, outs, strict=True):
                        tensor = self.graph.tensors[t]
                        expr = self._fix_shape(op, expr, tensor)
                        if self.options.quant_simulation and is_quantized(tensor):
                            if not (self._keeps_grid(op, tensor) or self._quantized_by_output(t)):
                                expr = self._fake_quant(expr, tensor)
                        elif self.emulate_half and self.half_stored(t):
                            expr = self._round_to_half(expr)
                        want = self.storage_dtype(t)
                        if dtype_of(expr) in ("float16", "float32") and dtype_of(expr) != want:
                            expr = self.bb.emit(relax.op.astype(expr, want))
                        # No `v2 = v1` alias bindings: FuseOps treats them as opaque nodes
                        # and stops fusing there (a conv's bias, residual add and ReLU ended
                        # up in three kernels).
                        self.env[t] = expr if isinstance(expr, relax.Var) else self.bb.emit(expr)
                outs = [self._output(t) for t in self.part.outputs]
                gv = self.bb.emit_output(relax.Tuple(outs))
            self.bb.emit_func_output(gv)
        mod = self.bb.get()
        for gv_, f in list(mod.functions.items()):
            if self.emulate_half and gv_.name_hint.startswith("round_to_half"):
                # Opaque (op pattern 8): never fused, so each rounding reads its input once.
                mod[gv_] = f.with_attr("op_pattern", 8)
            elif gv_.name_hint.startswith(BROADCAST_BARRIER):
                mod[gv_] = f.with_attr("op_pattern", 2)  # injective: see _binary
        return mod

    def _emit_gated_step(self, step: GatedStep) -> None:
        """A recurrent step as one call (`compiler.gated_step`): each tensor it hands on, in
        its storage dtype (rounded to fp16 values in the kernel where emulated half stores
        it)."""

        def rounding(t: int) -> Callable[[Any], Any] | None:
            return half_rounded if self.emulate_half and self.half_stored(t) else None

        for t, y in step.emit(self.bb, self.stored, self.storage_dtype, rounding).items():
            tensor = self.graph.tensors[t]
            if tuple(int(d) for d in y.ty.shape) != tensor.shape:
                y = self.bb.emit(relax.op.reshape(y, tensor.shape))
            self.env[t] = y

    def _emit_siblings(self, m: SiblingMerge, conv: Op) -> None:
        """A group of sibling convolutions: the merged one, then each sibling's output as a
        slice of its channels, but for those its readers fold (`sibling_folds`)."""
        out = conv.outputs[0]
        (y,) = EMITTERS[conv.name](Ctx(self, conv))
        y = self._fix_shape(conv, y, self.graph.tensors[out])
        want = self.storage_dtype(out)
        if dtype_of(y) != want:
            y = relax.op.astype(y, want)
        y = self.env[out] = y if isinstance(y, relax.Var) else self.bb.emit(y)
        for t, at in zip(m.outputs, m.offsets, strict=True):
            if t in self.sibling_folds:
                continue
            shape = self.graph.tensors[t].shape
            axis, n = len(shape) - 1, int(shape[-1])
            self.env[t] = self.bb.emit(relax.op.strided_slice(y, [axis], [at], [at + n]))

    def _emit(self, i: int, op: Op) -> list[Expr]:
        """Op ``i``'s outputs: its emitter's, or a whole layer norm at its last op."""
        ln = self.layer_norms.get(i)
        if ln is not None:
            return [ln.emit(self.graph, self.bb, self.value, self._scalar, self.stored)]
        attn = self.attentions.get(i)
        if attn is not None:  # (`_fix_shape` reshapes it to the second product's output)
            return [attn.emit(self.graph, self.bb, self.value, self._scalar)]
        conv = self.branch_merges.get(i)
        if conv is not None:  # the merged convolution, the other terms, the root's activation
            (y,) = EMITTERS[conv.name](Ctx(self, conv))
            for t in self.merge_rest[i]:
                y = self.bb.emit(relax.op.add(y, self.value(t)))
            return [activation(Ctx(self, op), y)]
        fn = EMITTERS.get(op.name)
        if fn is None:
            raise CompileError(f"{op.describe()}: no GPU lowering for {op.name}")
        return fn(Ctx(self, op))

    def _scalar(self, t: int) -> float:
        """A float constant of one element, rounded as `const_array` rounds it."""
        tensor = self.graph.tensors[t]
        assert tensor.data is not None
        data = dequantize(tensor.data, tensor) if is_quantized(tensor) else tensor.data
        data = np.asarray(data, np.float32)
        if self.emulate_half or self.storage == "float16":
            data = data.astype(np.float16).astype(np.float32)
        return float(data.reshape(-1)[0])

    def _fix_shape(self, op: Op, expr: Expr, tensor: Tensor) -> Expr:
        if not isinstance(expr, relax.Var):
            expr = self.bb.emit(expr)
        shape = tuple(int(d) for d in expr.ty.shape)
        if shape != tensor.shape:
            if int(np.prod(shape)) != tensor.size:
                raise CompileError(
                    f"{op.describe()}: lowered output has shape {shape}, the model declares "
                    f"{tensor.shape}"
                )
            expr = relax.op.reshape(expr, tensor.shape)
        return expr

    def _round_to_half(self, expr: Expr) -> Expr:
        """Round float32 values to the nearest fp16 value (ties to even) with integer ops.

        The mantissa is rounded to fp16's 10 bits on the float32 bit pattern; values beyond
        fp16's range saturate at +-65504 (fp16 subnormals keep float32 precision). The kernel
        is marked opaque so that FuseOps does not inline its producer twice per element.
        """
        from tvm import te

        def fn(x: Any) -> Any:
            return te.compute(x.shape, lambda *idx: half_rounded(x(*idx)), name="round_half")

        x = self.bb.emit(expr) if not isinstance(expr, relax.Var) else expr
        return self.bb.call_te(fn, x, primfunc_name_hint="round_to_half")

    def _keeps_grid(self, op: Op, out: Tensor) -> bool:
        """Whether quantized ``out`` needs no quantization simulator after ``op``: the op
        copies values (`OpDef.copies_values`, no fused activation) from inputs quantized
        exactly as ``out`` is, whose float values are on that grid already (dequantized
        constants and inputs, or simulated results). The simulator would give each value
        back: round(((q - z) * s) / s) is q - z for |q - z| < 2**16. A reshape before an
        int8 model's softmax was a kernel of its own for that alone."""
        if int(op.options.get("fused_activation_function", 0) or 0):
            return False
        try:
            if not lookup(op).copies_values:
                return False
        except UnsupportedOpError:
            return False
        q = out.quantization
        assert q is not None
        same = 0
        for k in op.inputs:
            if k < 0:
                continue
            x = self.graph.tensors[k]
            if is_quantized(x):
                xq = x.quantization
                assert xq is not None
                if not (
                    x.dtype == out.dtype
                    and np.array_equal(xq.scale, q.scale)
                    and np.array_equal(xq.zero_point, q.zero_point)
                    and xq.axis == q.axis
                ):
                    return False
                same += 1
            elif x.dtype.kind == "f":
                return False  # a float operand's values are not on the grid
        return same > 0

    def _quantized_by_output(self, t: int) -> bool:
        """Whether quantized ``t`` needs no simulator after its op because the program
        returns it as its integers (`_output`) and no op of the partition reads it: the
        output's quantization of the raw value gives the simulated value's integers
        (round(((q - z) * s) / s) is q - z, `_keeps_grid`), one rounding instead of two."""
        tensor = self.graph.tensors[t]
        return (
            t in self.part.outputs
            and tensor.dtype.name in INTEGER_IO_DTYPES
            and not self.readers.get(t)
        )

    def _output(self, t: int) -> Expr:
        """Partition output ``t`` as the program returns it: a quantized tensor of
        `INTEGER_IO_DTYPES` as its integers, where quantization is simulated (its float
        values then lie on its grid: no ties, so rounding half to even here gives
        `litekiln.ops.base.quantize`'s integers, which rounds half away from zero)."""
        x = self.env[t]
        tensor = self.graph.tensors[t]
        if not (
            self.options.quant_simulation
            and is_quantized(tensor)
            and tensor.dtype.name in INTEGER_IO_DTYPES
        ):
            return x
        e, _, _ = self._to_grid(x, tensor)
        return self.bb.emit(relax.op.astype(e, tensor.dtype.name))

    def _dequantize_input(self, x: Expr, tensor: Tensor) -> Expr:
        """An integer partition input's float32 values, as `litekiln.ops.base.dequantize`
        computes them on the CPU: (q - zero_point) is exact in float32 for 8- and 16-bit
        integers, and the float32 product with the float32 scale is rounded once, as the
        float64 product is there before its cast."""
        scale, zp = self._affine(tensor)
        f = self.bb.emit(relax.op.astype(x, ACC_DTYPE))
        return relax.op.multiply(relax.op.subtract(f, zp), scale)

    def _fake_quant(self, expr: Expr, tensor: Tensor) -> Expr:
        """Quantization simulator: keep an activation on its learned grid and range."""
        e, scale, zp = self._to_grid(expr, tensor)
        return relax.op.multiply(relax.op.subtract(e, zp), scale)

    def _to_grid(self, x: Expr, tensor: Tensor) -> tuple[Expr, Expr, Expr]:
        """(the integer each value of ``x`` quantizes to with ``tensor``'s parameters, in
        float32: round(x / scale) + zero_point, clamped to the dtype's range; scale;
        zero point)."""
        if dtype_of(x) != ACC_DTYPE:  # a data-movement op's half result
            x = self.bb.emit(relax.op.astype(x, ACC_DTYPE))
        scale, zp = self._affine(tensor)
        info = np.iinfo(tensor.dtype)
        lo = relax.const(np.asarray(info.min, ACC_DTYPE), ACC_DTYPE)
        hi = relax.const(np.asarray(info.max, ACC_DTYPE), ACC_DTYPE)
        e = self.bb.emit(relax.op.add(relax.op.round(relax.op.divide(x, scale)), zp))
        return self.bb.emit(relax.op.minimum(relax.op.maximum(e, lo), hi)), scale, zp

    def _affine(self, tensor: Tensor) -> tuple[Expr, Expr]:
        """``tensor``'s scale and zero point as float32 constants that broadcast against it
        (one value, or one per channel along its quantized axis)."""
        q = tensor.quantization
        assert q is not None
        shape = q.broadcast_shape(len(tensor.shape)) if q.per_channel else ()
        scale = relax.const(q.scale.reshape(shape).astype(np.float32), ACC_DTYPE)
        zp = relax.const(q.zero_point.reshape(shape).astype(np.float32), ACC_DTYPE)
        return scale, zp


# -- helpers ----------------------------------------------------------------------------------


def half_rounded(v: Any) -> Any:
    """Float32 TIR value ``v`` rounded to the nearest fp16 value (ties to even) with integer
    ops, saturated at +-65504 (`Lowering._round_to_half`)."""
    from tvm import tirx

    v = tirx.max(tirx.min(v, tirx.const(65504.0, "float32")), tirx.const(-65504.0, "float32"))
    b = tirx.reinterpret("int32", v)
    r = (b + tirx.const(0x0FFF, "int32") + ((b >> 13) & tirx.const(1, "int32"))) & tirx.const(
        ~0x1FFF, "int32"
    )
    return tirx.reinterpret("float32", r)


def int_valued(tensor: Tensor) -> bool:
    """Whether the GPU path holds ``tensor`` as int32 (integer arithmetic on positions and
    masks, `OpDef.int32_data`; run-time indices): an int32 tensor with no quantization."""
    return tensor.dtype == np.int32 and tensor.quantization is None


def dtype_of(expr: Expr) -> str:
    ty = getattr(expr, "ty", None)
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else ""


def activation(ctx: Ctx, x: Expr, code: int | None = None) -> Expr:
    code = int(ctx.options.get("fused_activation_function", 0) or 0) if code is None else code
    if code == 0:
        return x
    if code == 1:
        return ctx.emit(relax.op.nn.relu(x))
    if code == 2:
        return ctx.emit(relax.op.clip(x, -1.0, 1.0))
    if code == 3:
        return ctx.emit(relax.op.clip(x, 0.0, 6.0))
    if code == 4:
        return ctx.emit(relax.op.tanh(x))
    raise ctx.fail(f"fused activation code {code} has no GPU lowering")


def same_padding(in_size: int, k: int, stride: int, dilation: int) -> tuple[int, int]:
    """TFLite SAME padding: (before, after), the extra cell after."""
    eff = (k - 1) * dilation + 1
    out = (in_size + stride - 1) // stride
    total = max((out - 1) * stride + eff - in_size, 0)
    return total // 2, total - total // 2


def conv_pads(
    ctx: Ctx, h: int, w: int, kh: int, kw: int, sh: int, sw: int, dh: int = 1, dw: int = 1
) -> tuple[int, int, int, int]:
    explicit = ctx.options.get(EXPLICIT_PADS)
    if explicit is not None:  # a convolution the compiler made (`Lowering._add_branch_merges`)
        top, left, bottom, right = (int(v) for v in explicit)
        return (top, left, bottom, right)
    if int(ctx.options.get("padding", 0)) == 1:  # VALID
        return (0, 0, 0, 0)
    t, b = same_padding(h, kh, sh, dh)
    le, r = same_padding(w, kw, sw, dw)
    return (t, le, b, r)


def add_bias(ctx: Ctx, y: Expr, i: int) -> Expr:
    """Add the bias (operand ``i``, if present) to an accumulation-dtype result."""
    if ctx.has(i):
        y = ctx.emit(relax.op.add(y, ctx.fconst(ctx.const(i).reshape(-1))))
    return y


def data_and_weights(ctx: Ctx, i: int, w: np.ndarray) -> tuple[Expr, Expr]:
    """Operand ``i`` and the weights, both as stored (half under native fp16: the kernel
    converts each product's factors and accumulates in float32, ``out_dtype``)."""
    t = ctx.op.inputs[i]
    x = ctx.arg_stored(i)
    if ctx.tensor(i).data is None and ctx.lw.half_stored(t):
        return x, ctx.wconst(w)
    # Float32 data (a partition input, a tensor the fp16 guard keeps in float32, a constant
    # operand, or an fp32 program): float32 weights, unrounded.
    return ctx.arg(i), ctx.fconst(w)


def conv_folded(
    ctx: Ctx,
    w: np.ndarray,
    strides: tuple[int, int],
    pads: tuple[int, int, int, int],
    dilation: tuple[int, int],
    groups: int,
) -> Expr | None:
    """A convolution whose input is computed by a producer folded into it, as one TE call (a
    stage the schedules inline into the convolution's loads); ``None`` when operand 0 has no
    such producer. Five producers fold (see `Lowering`; a zero PAD folds in `conv_data`):

    * a per-channel scale (``_find_scale_folds``): the convolution of ``x * g``;
    * the NCHW -> NHWC transpose of a partition input (``_find_transpose_folds``), with a
      folded PAD in between or not: the convolution reads the NCHW input where it lies;
    * a concatenation along the channels (``_find_concat_folds``), with a folded PAD in
      between or not: each input channel is read from its part;
    * the dequantization of an 8-bit partition input (``_find_dequant_folds``): the
      convolution reads the integers;
    * a slice of a run of channels (``_find_slice_folds``), with a folded PAD in between or
      not: the convolution reads its channels at an offset into the slice's source.

    The stage computes in float32 and, where the unfused program would store its result in
    half (native fp16), rounds to half as that store would: the producer's numerics, then the
    convolution's."""
    lw = ctx.lw
    t = ctx.op.inputs[0]
    from tvm import te, topi

    stage: Callable[..., Any]
    pad = lw.pad_folds.get(t)
    u = pad[0] if pad else t  # the tensor the (folded) PAD pads, or operand 0 itself
    if t in lw.scale_folds:
        src, gate = lw.scale_folds[t]
        half = lw.storage == "float16" and lw.half_stored(t)
        args, name = [lw.stored(src), lw.stored(gate)], SCALED_CONV_NAME

        def stage(x: Any, g: Any) -> Any:
            def elem(n: Any, h: Any, col: Any, c: Any) -> Any:
                v = x[n, h, col, c].astype(ACC_DTYPE) * g[n, 0, 0, c].astype(ACC_DTYPE)
                return v.astype("float16") if half else v

            return te.compute(x.shape, elem, name="scale")

    elif u in lw.transpose_folds:
        half = lw.storage == "float16" and lw.half_stored(t) and lw.half_stored(u)
        args, name = [lw.stored(lw.transpose_folds[u])], NCHW_CONV_NAME

        def stage(x: Any) -> Any:
            n, c, h, wd = x.shape

            def elem(b: Any, i: Any, j: Any, k: Any) -> Any:
                v = x[b, k, i, j].astype(ACC_DTYPE)
                return v.astype("float16") if half else v

            return te.compute((n, h, wd, c), elem, name="nchw_to_nhwc")

    elif t in lw.dequant_folds and not pad:
        q = lw.graph.tensors[t].quantization
        assert q is not None
        scale, zp = float(q.scale[0]), float(q.zero_point[0])
        half = False  # (a partition input: float32 storage, as the unfused program's)
        args, name = [lw.raw_inputs[t]], DEQUANT_CONV_NAME

        def stage(x: Any) -> Any:
            from tvm import tirx

            s_, z_ = tirx.const(scale, ACC_DTYPE), tirx.const(zp, ACC_DTYPE)
            return te.compute(
                x.shape, lambda *i: (x(*i).astype(ACC_DTYPE) - z_) * s_, name="dequantize"
            )

    elif u in lw.concat_folds:
        half = lw.storage == "float16" and lw.half_stored(t) and lw.half_stored(u)
        args, name = [lw.stored(k) for k in lw.concat_folds[u]], CONCAT_CONV_NAME

        def stage(*xs: Any) -> Any:
            from tvm import tirx

            starts = [0]
            for x in xs:
                starts.append(starts[-1] + int(x.shape[3]))
            n, h, wd, _ = xs[0].shape

            def elem(b: Any, i: Any, j: Any, k: Any) -> Any:
                v = xs[-1][b, i, j, k - starts[-2]].astype(ACC_DTYPE)
                for x, lo in zip(xs[-2::-1], starts[-3::-1], strict=True):
                    v = tirx.if_then_else(
                        k < lo + int(x.shape[3]), x[b, i, j, k - lo].astype(ACC_DTYPE), v
                    )
                return v.astype("float16") if half else v

            return te.compute((n, h, wd, starts[-1]), elem, name="concat")

    elif u in lw.slice_folds:
        src, first = lw.slice_folds[u]
        half = lw.storage == "float16" and lw.half_stored(t) and lw.half_stored(u)
        args, name = [lw.stored(src)], SLICE_CONV_NAME
        channels = int(lw.graph.tensors[u].shape[3])

        def stage(x: Any) -> Any:
            n, h, wd, _ = x.shape

            def elem(b: Any, i: Any, j: Any, k: Any) -> Any:
                v = x[b, i, j, first + k].astype(ACC_DTYPE)
                return v.astype("float16") if half else v

            return te.compute((n, h, wd, channels), elem, name="channel_slice")

    else:
        return None
    if pad:
        pads = tuple(a + b for a, b in zip(pads, pad[1], strict=True))  # type: ignore[assignment]

    weights = ctx.wconst(w) if half else ctx.fconst(w)
    unit = int(w.shape[1]) * int(w.shape[2]) * int(w.shape[3]) == 1

    def fn(*xs: Any) -> Any:
        if unit:  # (reduction loops of extent 1: see `_unit_window_conv`)
            return _unit_window_conv(stage(*xs[:-1]), xs[-1], strides, pads, groups)
        return topi.nn.conv(
            stage(*xs[:-1]), xs[-1], strides, pads, dilation, groups, "NHWC", "OHWI",
            out_dtype=ACC_DTYPE,
        )  # fmt: skip

    return ctx.emit(ctx.bb.call_te(fn, *args, weights, primfunc_name_hint=name))


def _unit_window_conv(
    x: Any, k: Any, strides: tuple[int, int], pads: tuple[int, int, int, int], groups: int
) -> Any:
    """A convolution whose window and group width are 1 (a 1x1 depthwise convolution: each
    output channel its input channel times one weight) as the elementwise product it is.
    As a reduction its loops have extent 1, which TVM 0.27 mishandles: dlight's rules take
    the block for a spatial one and run a fused epilogue in both its init and its update,
    adding the bias twice (`unit_reductions` rewrites the Relax ``conv2d`` calls so; this is
    the same for the convolutions a producer is folded into, which are TE calls)."""
    from tvm import te, tirx

    n, h, wd, _ = (int(d) for d in x.shape)
    outs = int(k.shape[0])
    mult = outs // groups
    top, left, bottom, right = pads
    sh, sw = strides
    oh, ow = (h + top + bottom - 1) // sh + 1, (wd + left + right - 1) // sw + 1
    zero = tirx.const(0.0, ACC_DTYPE)

    def value(b: Any, i: Any, j: Any, c: Any) -> Any:
        y, z = i * sh - top, j * sw - left
        v = x[b, y, z, c // mult].astype(ACC_DTYPE)
        inside = [cond for cond, needed in ((y >= 0, top), (y < h, bottom), (z >= 0, left),
                                            (z < wd, right)) if needed]  # fmt: skip
        if inside:
            v = tirx.if_then_else(tirx.all(*inside), v, zero)
        return v * k[c, 0, 0, 0].astype(ACC_DTYPE)

    return te.compute((n, oh, ow, outs), value, name="unit_window_conv")


def patch_embedding(
    ctx: Ctx,
    w: np.ndarray,
    strides: tuple[int, int],
    pads: tuple[int, int, int, int],
    dilation: tuple[int, int],
    groups: int,
) -> Expr | None:
    """A convolution over non-overlapping patches of an NCHW partition input (window =
    stride, no padding, no dilation, one group: a vision transformer's patch embedding,
    ConvNeXt's stem), folded with the input's transpose (``_find_transpose_folds``), as a
    matrix product: [n, patches, filters] = patches x (channels, window rows, window columns)
    times weights [terms, filters], one TE reduction named ``matmul`` that
    `schedules.SharedMatmul` tiles; ``None`` for any other convolution. The terms are ordered
    as the NCHW input lies, so that a tile's consecutive terms are consecutive columns of one
    window row; the weights are laid out once to match. The caller adds the bias and the
    activation to the [n, patches, filters] sums (elementwise: fused into the product's
    kernel), then reshapes to [n, h', w', filters].

    Numerics as `conv_folded`'s: under native fp16 the input is rounded to half as its
    transposed copy would be stored, and each product's factors are converted to float32."""
    from tvm import te

    lw = ctx.lw
    t = ctx.op.inputs[0]
    _, kh, kw, cin = (int(v) for v in w.shape)
    if (
        t not in lw.transpose_folds
        or t in lw.pad_folds
        or (kh, kw) != tuple(strides)
        or kh * kw == 1
        or any(pads)
        or tuple(dilation) != (1, 1)
        or groups != 1
    ):
        return None
    src = lw.transpose_folds[t]
    half = lw.storage == "float16" and lw.half_stored(t)
    o = int(w.shape[0])
    wk = np.ascontiguousarray(w.transpose(3, 1, 2, 0).reshape(cin * kh * kw, o))  # [k, f]
    weights = ctx.wconst(wk) if half else ctx.fconst(wk)
    n, _, h, wd = (int(v) for v in lw.graph.tensors[src].shape)
    wo = wd // kw

    def fn(data: Any, wt: Any) -> Any:
        k = te.reduce_axis((0, cin * kh * kw), name="k")

        def elem(b: Any, p: Any, f: Any) -> Any:
            ci, ry, rx = k // (kh * kw), k // kw % kh, k % kw
            v = data[b, ci, p // wo * kh + ry, p % wo * kw + rx].astype(ACC_DTYPE)
            if half:
                v = v.astype("float16").astype(ACC_DTYPE)
            return te.sum(v * wt[k, f].astype(ACC_DTYPE), axis=k)

        return te.compute((n, h // kh * wo, o), elem, name="matmul")

    call = ctx.bb.call_te(fn, lw.stored(src), weights, primfunc_name_hint=NCHW_CONV_NAME)
    return ctx.emit(call)


def _pool_covers(op: Op, pads: np.ndarray) -> bool:
    """Whether a MAX_POOL_2D can take a PAD's height and width padding (``pads``: [[top,
    bottom], [left, right]] of its rows 1 and 2) as its own: a window of more than
    `SMALL_POOL_TAPS` taps (those are elementwise, `emit_nn._small_pool`) wider than each
    side's padding, so that every window keeps a cell of the map."""
    kh, kw = int(op.options.get("filter_height", 1)), int(op.options.get("filter_width", 1))
    return kh * kw > SMALL_POOL_TAPS and int(max(pads[1])) < kh and int(max(pads[2])) < kw


def epilogue(ctx: Ctx, y: Expr, bias: int) -> list[Expr]:
    """Bias and fused activation (float32)."""
    return [activation(ctx, add_bias(ctx, y, bias))]


def conv_data(
    ctx: Ctx, w: np.ndarray, pads: tuple[int, int, int, int]
) -> tuple[Expr, Expr, tuple[int, int, int, int]]:
    """A convolution's data (operand 0), weights and padding: `data_and_weights` and
    ``pads``, or, when operand 0 is a PAD folded into its convolutions, the PAD's source
    with the PAD's widths added."""
    t = ctx.op.inputs[0]
    fold = ctx.lw.pad_folds.get(t)
    if fold is None:
        return (*data_and_weights(ctx, 0, w), pads)
    src, extra = fold
    top, left, bottom, right = (a + b for a, b in zip(pads, extra, strict=True))
    return (*source_and_weights(ctx, src, w), (top, left, bottom, right))


def source_and_weights(ctx: Ctx, src: int, w: np.ndarray) -> tuple[Expr, Expr]:
    """Tensor ``src``, read in place of operand 0 (a PAD folded into its convolution, a
    TRANSPOSE into its FULLY_CONNECTED), and the weights: both as stored where operand 0
    and ``src`` are both stored in half, else float32, as `data_and_weights` does for
    float32 operands (rounding the source here would cost a cast kernel per reader)."""
    lw, t = ctx.lw, ctx.op.inputs[0]
    if lw.half_stored(t) and lw.half_stored(src):
        return lw.stored(src), ctx.wconst(w)
    return lw.value(src), ctx.fconst(w)


def transpose_perm(g: Subgraph, op: Op) -> list[int] | None:
    """A TRANSPOSE's permutation, where it is a constant (else None)."""
    if len(op.inputs) != 2 or op.inputs[1] < 0:
        return None
    perm = g.tensors[op.inputs[1]].data
    return None if perm is None else [int(v) for v in np.asarray(perm).reshape(-1)]
