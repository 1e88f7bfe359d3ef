"""A zero PAD that one whole-map AVERAGE_POOL_2D reads: a SUM at load, scaled.

PyTorch's ``nn.AvgPool2d(k, ceil_mode=True)`` with a window larger than its input (Hugging
Face's EfficientNet pools its 7x7 map with ``AvgPool2d(1280, ceil_mode=True)``) is written by
litert-torch as a PAD of the map to the window's size with zeros, then a VALID average pool of
that one window: a 1x1280x1280x1280 float tensor, 8.4 GB, for a 7x7x1280 map. LiteRT
allocates it and runs; litekiln's loader bounds a tensor at 2 GiB and refused the model.

The pair's value is the map's sum over the window's area (the zeros add nothing, and a VALID
window counts every cell it covers). The loader (:func:`litekiln.ops.unroll.check_and_rewrite`,
as the PAD is checked) replaces it:

    x [N, H, W, C] --PAD (zeros)--> [N, KH, KW, C] --AVERAGE_POOL_2D (KH x KW, VALID)--> y
    x [N, H, W, C] --SUM (axes 1, 2, kept)--> [N, 1, 1, C] --MUL (1 / (KH * KW))--> y

(the PAD's output tensor becomes the SUM's, of its new shape; the pool is gone). A sum, not a
mean scaled by the map's share of the window: a model resized later (`litekiln.resize`
re-plans the rewritten graph) keeps the value for any map the window covers. Only for
float data, a PAD of constant zeros (PADV2's constant value 0) on the height and width alone,
read by that pool alone, whose window is the whole padded map with no fused activation.
"""

from __future__ import annotations

import logging

import numpy as np

from litekiln.model.ir import Op, Subgraph
from litekiln.ops.conv import VALID
from litekiln.ops.unroll_lstm import OpBuilder

log = logging.getLogger("litekiln")


def pad_pool_as_mean(op: Op, graph: Subgraph) -> bool:
    """Replace the PAD ``op`` and the whole-map average pool that alone reads it by a SUM
    and a MUL (module docstring); whether it did."""
    pool = _whole_map_pool(op, graph)
    if pool is None:
        return False
    x, padded, y = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]], pool.outputs[0]
    n, h, w, c = x.shape
    fh, fw = padded.shape[1], padded.shape[2]
    padded.shape = padded.shape_signature = (n, 1, 1, c)  # the PAD's output is the sum now
    b = OpBuilder(graph, padded.name)
    axes = b.const("sum_axes", [1, 2], np.int32)
    b.op("SUM", [x.index, axes], [padded.index], keep_dims=True)
    scale = b.const("window_area", np.float32(1.0 / (fh * fw)))
    b.op("MUL", [padded.index, scale], [y], fused_activation_function=0)
    graph.replace_op(pool, [])  # (after ``op``: the ops up to ``op`` keep their places)
    b.replace(op)
    log.info("%s and the average pool of its %dx%d map: a SUM of the %dx%d input, scaled",
             op.describe(), fh, fw, h, w)  # fmt: skip
    return True


def _whole_map_pool(op: Op, graph: Subgraph) -> Op | None:
    """The AVERAGE_POOL_2D that alone reads the PAD ``op``'s output with one window over the
    whole padded map, where the pair may be rewritten; else None."""
    if op.name not in ("PAD", "PADV2") or len(op.outputs) != 1 or len(op.inputs) < 2:
        return None
    x, pads = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]]
    out = op.outputs[0]
    if x.dtype != np.float32 or len(x.shape) != 4 or pads.data is None:
        return None
    if len(op.inputs) > 2 and op.inputs[2] >= 0:
        value = graph.tensors[op.inputs[2]].data
        if value is None or np.any(np.asarray(value) != 0):
            return None
    p = np.asarray(pads.data).reshape(-1, 2)
    if p.shape != (4, 2) or np.any(p[0] != 0) or np.any(p[3] != 0) or np.any(p < 0):
        return None
    if out in graph.outputs:
        return None
    readers = graph.readers().get(out, [])
    if len(readers) != 1 or readers[0].name != "AVERAGE_POOL_2D" or readers[0].index < op.index:
        return None
    pool, padded = readers[0], graph.tensors[out]
    opts = pool.options
    fh, fw = int(opts.get("filter_height", 0)), int(opts.get("filter_width", 0))
    whole = (fh, fw) == tuple(padded.shape[1:3]) and int(opts.get("padding", -1)) == VALID
    if not whole or int(opts.get("fused_activation_function", 0)) != 0:
        return None
    if graph.tensors[pool.outputs[0]].shape != (x.shape[0], 1, 1, x.shape[3]):
        return None
    return pool
