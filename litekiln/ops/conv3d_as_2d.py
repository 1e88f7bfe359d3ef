"""CONV_3D as a CONV_2D at load, where one of its three axes has a window of one.

A 3-D convolution whose window is one cell wide along an axis (with stride one there) is a
2-D convolution over the two other axes, run for each position along that one: timm's lambda
layers (``nn.Conv3d(1, k, (r, r, 1))`` over their relative positions: the window spans the
height and width, not the value channels) and video models' per-frame convolutions (a
``(1, k, k)`` window). The loader (:func:`litekiln.ops.unroll.check_and_rewrite`) replaces
such a CONV_3D by ops the GPU path runs:

    x [N, D, H, W, C] --TRANSPOSE--> the unit axis next to N --RESHAPE--> [N*U, A, B, C]
      --CONV_2D (filter [O, KA, KB, C], the bias, strides, dilations, padding, activation)-->
    [N*U, OA, OB, O] --RESHAPE--> [N, U, OA, OB, O] --TRANSPOSE--> [N, OD, OH, OW, O]

(the transposes are left out where the unit axis is already next to N, the depth). Both
ops pad each axis the same way (``ComputePadding3DValues`` is the 2-D rule per axis), and a
window of one with stride one neither pads nor strides its axis, so the values are the
3-D convolution's; only the order of the sums over the window may differ. A CONV_3D with no
such axis stays one op, on the CPU (:class:`litekiln.ops.conv.Conv3D`).
"""

from __future__ import annotations

import logging

import numpy as np

from litekiln.model.ir import Op, Subgraph
from litekiln.ops.unroll_lstm import OpBuilder

log = logging.getLogger("litekiln")

#: CONV_3D's axes (of its NDHWC data) and their option suffixes.
_AXES = ((1, "d"), (2, "h"), (3, "w"))


def unit_axis(op: Op, graph: Subgraph) -> int | None:
    """The data axis (1: depth, 2: height, 3: width) along which ``op``'s window is one cell
    with stride one, the first such; None where there is none, or the op is not a float
    CONV_3D with a constant filter (and bias)."""
    if op.name != "CONV_3D" or len(op.outputs) != 1 or len(op.inputs) < 2:
        return None
    x, w = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]]
    bias = graph.tensors[op.inputs[2]] if len(op.inputs) > 2 and op.inputs[2] >= 0 else None
    if w.data is None or (bias is not None and bias.data is None):
        return None
    if x.dtype != np.float32 or len(x.shape) != 5 or len(w.shape) != 5:
        return None
    for axis, key in _AXES:
        if w.shape[axis - 1] == 1 and int(op.options.get(f"stride_{key}", 1)) == 1:
            return axis
    return None


def conv3d_as_2d(op: Op, graph: Subgraph) -> bool:
    """Replace the CONV_3D ``op`` of ``graph`` by a CONV_2D and the reshapes and transposes
    around it, when it has a unit axis (:func:`unit_axis`); whether it was replaced. The new
    ops take ``op``'s place (the loader checks them next); the output tensor is ``op``'s."""
    axis = unit_axis(op, graph)
    if axis is None:
        return False
    x_t, w_t, y_t = op.inputs[0], op.inputs[1], op.outputs[0]
    x, w, y = graph.tensors[x_t], graph.tensors[w_t], graph.tensors[y_t]
    n = x.shape[0]
    rest = [a for a, _ in _AXES if a != axis]  # the two axes the CONV_2D runs over
    keys = dict(_AXES)
    b = OpBuilder(graph, y.name)
    # x -> [N, U, A, B, C] -> [N*U, A, B, C]
    perm = [0, axis, *rest, 4]
    moved = x_t
    if perm != [0, 1, 2, 3, 4]:
        moved = b.tensor("unit_first", tuple(x.shape[p] for p in perm))
        b.op("TRANSPOSE", [x_t, b.const("unit_first_perm", perm, np.int32)], [moved])
    flat_shape = (n * x.shape[axis], x.shape[rest[0]], x.shape[rest[1]], x.shape[4])
    flat = b.tensor("as_nhwc", flat_shape)
    b.op("RESHAPE", [moved, b.const("as_nhwc_shape", list(flat_shape), np.int32)], [flat])
    # filter [KD, KH, KW, I, O] -> [O, KA, KB, I] (the unit axis' window is one)
    kernel = np.take(np.asarray(w.data, np.float32), 0, axis=axis - 1)
    filt = b.const("filter_ohwi", np.ascontiguousarray(np.transpose(kernel, (3, 0, 1, 2))))
    if len(op.inputs) > 2 and op.inputs[2] >= 0:
        bias = op.inputs[2]
    else:
        bias = b.const("bias", np.zeros(w.shape[4], np.float32))
    o = op.options
    conv_shape = (n * x.shape[axis], y.shape[rest[0]], y.shape[rest[1]], y.shape[4])
    conv = b.tensor("conv2d", conv_shape)
    b.op(
        "CONV_2D",
        [flat, filt, bias],
        [conv],
        padding=int(o.get("padding", 0)),
        stride_h=int(o.get(f"stride_{keys[rest[0]]}", 1)),
        stride_w=int(o.get(f"stride_{keys[rest[1]]}", 1)),
        dilation_h_factor=int(o.get(f"dilation_{keys[rest[0]]}_factor", 1) or 1),
        dilation_w_factor=int(o.get(f"dilation_{keys[rest[1]]}_factor", 1) or 1),
        fused_activation_function=int(o.get("fused_activation_function", 0) or 0),
    )
    # [N*U, OA, OB, O] -> [N, U, OA, OB, O] -> y (the inverse permutation)
    unflat_shape = (n, x.shape[axis], *conv_shape[1:])
    if perm == [0, 1, 2, 3, 4]:
        b.op("RESHAPE", [conv, b.const("out_shape", list(y.shape), np.int32)], [y_t])
    else:
        unflat = b.tensor("unit_first_out", unflat_shape)
        b.op("RESHAPE", [conv, b.const("unit_first_out_shape", list(unflat_shape), np.int32)],
             [unflat])  # fmt: skip
        inverse = [perm.index(i) for i in range(5)]
        b.op("TRANSPOSE", [unflat, b.const("out_perm", inverse, np.int32)], [y_t])
    b.replace(op)
    log.info("%s: a 2-D convolution for each of its %d positions along axis %d (%d ops)",
             op.describe(), x.shape[axis], axis, len(b.ops))  # fmt: skip
    return True
