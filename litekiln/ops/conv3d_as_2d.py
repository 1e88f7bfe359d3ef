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
3-D convolution's; only the order of the sums over the window may differ.

Any other float CONV_3D with a constant filter (torchvision's video ResNets: 3x3x3 windows)
is one 2-D convolution over the depth taps stacked as channels (:func:`conv3d_by_depth`):

    x [N, D, H, W, C] --RESHAPE--> [N, D, H*W, C] --PAD (depth; SAME's rows)-->
      --STRIDED_SLICE (one per depth tap: from kd * dilation, every stride-th)-->
      --CONCATENATION (channels)--> [N, OD, H*W, KD*C] --RESHAPE--> [N*OD, H, W, KD*C]
      --CONV_2D (filter [O, KH, KW, KD*C], the bias, h/w strides, dilations, padding)-->
    [N*OD, OH, OW, O] --RESHAPE--> [N, OD, OH, OW, O]

Output depth and depth padding follow TFLite's rules (`litekiln.ops.conv.out_size`,
`pad_amounts`); the two other axes are the CONV_2D's own. The values are the 3-D
convolution's sums in another order.
"""

from __future__ import annotations

import logging

import numpy as np

from litekiln.model.ir import Op, Subgraph
from litekiln.ops.conv import out_size, pad_amounts
from litekiln.ops.unroll_lstm import OpBuilder

log = logging.getLogger("litekiln")

#: CONV_3D's axes (of its NDHWC data) and their option suffixes.
_AXES = ((1, "d"), (2, "h"), (3, "w"))


def _rewritable(op: Op, graph: Subgraph) -> bool:
    """Whether ``op`` is a float CONV_3D with a constant filter (and bias, if any): the
    CONV_3Ds the loader makes CONV_2Ds."""
    if op.name != "CONV_3D" or len(op.outputs) != 1 or len(op.inputs) < 2:
        return False
    x, w = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]]
    bias = graph.tensors[op.inputs[2]] if len(op.inputs) > 2 and op.inputs[2] >= 0 else None
    if w.data is None or (bias is not None and bias.data is None):
        return False
    return x.dtype == np.float32 and len(x.shape) == 5 and len(w.shape) == 5


def unit_axis(op: Op, graph: Subgraph) -> int | None:
    """The data axis (1: depth, 2: height, 3: width) along which ``op``'s window is one cell
    with stride one, the first such; None where there is none, or the op is not a float
    CONV_3D with a constant filter (and bias)."""
    if not _rewritable(op, graph):
        return None
    w = graph.tensors[op.inputs[1]]
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


def conv3d_by_depth(op: Op, graph: Subgraph) -> bool:
    """Replace the float CONV_3D ``op`` (a constant filter, and bias if any) of ``graph`` by
    a CONV_2D over its depth taps stacked as channels and the ops around it (the module
    docstring); whether it was replaced. The new ops take ``op``'s place; the output tensor
    is ``op``'s."""
    if not _rewritable(op, graph):
        return False
    x_t, w_t, y_t = op.inputs[0], op.inputs[1], op.outputs[0]
    x, w, y = graph.tensors[x_t], graph.tensors[w_t], graph.tensors[y_t]
    bias_t = op.inputs[2] if len(op.inputs) > 2 and op.inputs[2] >= 0 else None
    o = op.options
    n, d, h, wd, c = x.shape
    kd = w.shape[0]
    sd = int(o.get("stride_d", 1))
    dd = int(o.get("dilation_d_factor", 1) or 1)
    padding = int(o.get("padding", 0))
    od = out_size(d, kd, sd, dd, padding)
    before, _ = pad_amounts(d, kd, sd, dd, od)
    after = max((od - 1) * sd + (kd - 1) * dd + 1 - d - before, 0)
    b = OpBuilder(graph, y.name)
    rows = b.tensor("rows", (n, d, h * wd, c))
    b.op("RESHAPE", [x_t, b.const("rows_shape", [n, d, h * wd, c], np.int32)], [rows])
    if before or after:
        padded = b.tensor("depth_padded", (n, d + before + after, h * wd, c))
        pads = [[0, 0], [before, after], [0, 0], [0, 0]]
        b.op("PAD", [rows, b.const("depth_pads", pads, np.int32)], [padded])
        rows = padded
    taps = []
    for k in range(kd):
        tap = b.tensor(f"tap{k}", (n, od, h * wd, c))
        start = k * dd
        begin = b.const(f"tap{k}_begin", [0, start, 0, 0], np.int32)
        end = b.const(f"tap{k}_end", [n, start + (od - 1) * sd + 1, h * wd, c], np.int32)
        strides = b.const(f"tap{k}_strides", [1, sd, 1, 1], np.int32)
        b.op("STRIDED_SLICE", [rows, begin, end, strides], [tap], begin_mask=0, end_mask=0,
             ellipsis_mask=0, new_axis_mask=0, shrink_axis_mask=0, offset=False)  # fmt: skip
        taps.append(tap)
    stacked = taps[0]
    if kd > 1:
        stacked = b.tensor("taps", (n, od, h * wd, kd * c))
        b.op("CONCATENATION", taps, [stacked], axis=3, fused_activation_function=0)
    flat_shape = (n * od, h, wd, kd * c)
    flat = b.tensor("as_nhwc", flat_shape)
    b.op("RESHAPE", [stacked, b.const("as_nhwc_shape", list(flat_shape), np.int32)], [flat])
    # filter [KD, KH, KW, I, O] -> [O, KH, KW, KD*I]: channel kd*I + i reads tap kd's channel i
    kernel = np.asarray(w.data, np.float32)
    filt = np.transpose(kernel, (4, 1, 2, 0, 3)).reshape(w.shape[4], w.shape[1], w.shape[2], -1)
    bias = bias_t if bias_t is not None else b.const("bias", np.zeros(w.shape[4], np.float32))
    conv_shape = (n * od, y.shape[2], y.shape[3], y.shape[4])
    conv = b.tensor("conv2d", conv_shape)
    b.op(
        "CONV_2D",
        [flat, b.const("filter_ohwi", np.ascontiguousarray(filt)), bias],
        [conv],
        padding=padding,
        stride_h=int(o.get("stride_h", 1)),
        stride_w=int(o.get("stride_w", 1)),
        dilation_h_factor=int(o.get("dilation_h_factor", 1) or 1),
        dilation_w_factor=int(o.get("dilation_w_factor", 1) or 1),
        fused_activation_function=int(o.get("fused_activation_function", 0) or 0),
    )
    b.op("RESHAPE", [conv, b.const("out_shape", list(y.shape), np.int32)], [y_t])
    b.replace(op)
    log.info("%s: one 2-D convolution over its %d depth taps stacked as channels (%d ops)",
             op.describe(), kd, len(b.ops))  # fmt: skip
    return True
