"""litert-torch's attention composite, expanded from its inputs as LiteRT runs it.

litert-torch writes each attention of its generative models as a STABLEHLO_COMPOSITE named
``odml.scaled_dot_product_attention``: the query ``[B, T, N, H]``, the key and value
``[B, S, G, H]`` (G key/value heads: N for multi-head, 1 for multi-query, a divisor of N for
grouped-query attention), an optional additive mask broadcast to ``[B, N, T, S]``, and the
attributes ``scale`` (default ``1 / sqrt(H)``) and ``logit_cap``. LiteRT's default CPU path
(XNNPACK, ``VisitScaledDotAttentionCompositeNode``) does not run its decomposition subgraph:
it computes the attention from those inputs,

    logits = (q * scale) k^T per head (head n reads key/value group n // (N / G)),
    logits = cap * tanh(logits / cap) where a logit cap is given,
    out = softmax(logits + mask) v, back to [B, T, N, H],

and that is what matches PyTorch: the decomposition the converter wrote for a multi-query
model (litert-torch's Gemma 1 and Gemma 3 examples) reads the single key head through a
RESHAPE where a transpose is meant. On Gemma 1's prefill, LiteRT's builtin kernels, which
run the decomposition, are up to 9.2 away from PyTorch's KV cache (whose values reach 8.1);
XNNPACK is within 2.4e-05 of it (probe round 9, results/probe/2026-12-01j). litekiln
replaces the composite by these ops (:func:`expand_sdpa`), partitioned like any others (the
compiler's attention kernel, `litekiln.compiler.attention`, takes no computed mask: a
language model's attentions run op by op); a composite of another name, or of shapes the
formula does not take, keeps its decomposition.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from litekiln.model.ir import Op, Subgraph
from litekiln.ops.unroll_lstm import OpBuilder

log = logging.getLogger("litekiln")

SDPA = "odml.scaled_dot_product_attention"


def composite_attributes(op: Op) -> dict[str, Any] | None:
    """A composite's attributes (a flexbuffer map), or None where they do not decode."""
    from flatbuffers import flexbuffers

    raw = bytes(op.options.get("composite_attributes") or b"")
    if not raw:
        return {}
    try:
        value = flexbuffers.Loads(raw)
    except Exception:  # noqa: BLE001 - the decoder raises assorted errors on bad bytes
        return None
    return value if isinstance(value, dict) else None


def expand_sdpa(op: Op, graph: Subgraph) -> bool:
    """Replace the ``odml.scaled_dot_product_attention`` composite ``op`` by the ops LiteRT's
    XNNPACK computes it with (module docstring); whether it was. The ops that take its place
    start at ``op.index``; its output tensor keeps its index."""
    attrs = composite_attributes(op)
    if attrs is None or len(op.inputs) not in (3, 4) or len(op.outputs) != 1:
        return False
    q, k, v = (graph.tensors[t] for t in op.inputs[:3])
    mask = graph.tensors[op.inputs[3]] if len(op.inputs) == 4 and op.inputs[3] >= 0 else None
    out = graph.tensors[op.outputs[0]]
    tensors = [q, k, v, out] + ([mask] if mask is not None else [])
    if any(t.dtype != np.float32 or t.quantization is not None for t in tensors):
        return False
    if any(len(t.shape) != 4 for t in (q, k, v)) or out.shape != q.shape or k.shape != v.shape:
        return False
    b, t, n, h = q.shape
    bk, s, g, hk = k.shape
    if bk != b or hk != h or g == 0 or n % g:
        return False
    logits_shape = (b, n, t, s)
    if mask is not None:
        try:
            if np.broadcast_shapes(logits_shape, mask.shape) != logits_shape:
                return False
        except ValueError:
            return False
    scale = attrs.get("scale")
    cap = attrs.get("logit_cap")
    if not isinstance(scale, (int, float)):
        scale = 1.0 / math.sqrt(h)
    if cap is not None and not isinstance(cap, (int, float)):
        return False

    ob = OpBuilder(graph, f"{q.name}/sdpa_{op.index}")
    qs = ob.binary("MUL", op.inputs[0], ob.const("scale", [np.float32(scale)]), "q_scaled")
    qt = _transpose(ob, qs, "q_heads")
    kt = _heads(ob, _transpose(ob, op.inputs[1], "k_groups"), n, "k_heads")
    vt = _heads(ob, _transpose(ob, op.inputs[2], "v_groups"), n, "v_heads")
    logits = ob.tensor("logits", logits_shape)
    ob.op("BATCH_MATMUL", [qt, kt], [logits], adj_x=False, adj_y=True,
          asymmetric_quantize_inputs=False)  # fmt: skip
    if cap is not None:
        c = ob.const("logit_cap", [np.float32(cap)])
        logits = ob.binary("MUL", ob.unary("TANH", ob.binary("DIV", logits, c, "capped"),
                                           "capped_tanh"), c, "capped_logits")  # fmt: skip
    if mask is not None:
        logits = ob.binary("ADD", logits, op.inputs[3], "masked")
    probs = ob.unary("SOFTMAX", logits, "probs", beta=1.0)
    heads = ob.tensor("out_heads", (b, n, t, h))
    ob.op("BATCH_MATMUL", [probs, vt], [heads], adj_x=False, adj_y=False,
          asymmetric_quantize_inputs=False)  # fmt: skip
    ob.op("TRANSPOSE", [heads, ob.const("perm", [0, 2, 1, 3], np.int32)], [op.outputs[0]])
    ob.replace(op)
    log.info(
        "%s (%s) expanded as LiteRT's XNNPACK computes it: %d heads over %d key/value groups",
        op.describe(), SDPA, n, g,
    )  # fmt: skip
    return True


def _transpose(ob: OpBuilder, x: int, name: str) -> int:
    """``x`` [B, L, heads, H] as [B, heads, L, H]."""
    bb, ll, hh, dd = ob.graph.tensors[x].shape
    y = ob.tensor(name, (bb, hh, ll, dd))
    ob.op("TRANSPOSE", [x, ob.const(f"{name}_perm", [0, 2, 1, 3], np.int32)], [y])
    return y


def _heads(ob: OpBuilder, x: int, n: int, name: str) -> int:
    """``x`` [B, G, S, H] with each group repeated for the N / G query heads that read it
    (head i reads group i // (N / G)): a GATHER along the heads, or ``x`` where G == N."""
    bb, g, ss, hh = ob.graph.tensors[x].shape
    if g == n:
        return x
    rows = ob.const(f"{name}_groups", np.arange(n) // (n // g), np.int32)
    y = ob.tensor(name, (bb, n, ss, hh))
    ob.op("GATHER", [x, rows], [y], axis=1, batch_dims=0)
    return y
