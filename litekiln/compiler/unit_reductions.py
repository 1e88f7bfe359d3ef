"""Rewrite reductions over a single element into the elementwise ops they are.

A reduction whose every reduced axis has one element (a 1x1 depthwise convolution, a
FULLY_CONNECTED or BATCH_MATMUL with one input feature, a MEAN over a 1x1 map, a 1x1 pool, a
softmax over one class) legalizes to a TIR block with reduction loops of extent 1. TVM 0.27
mishandles those blocks: litekiln's serial-reduction rule finds no reduction loop to split
(IndexError), and dlight's rules, treating the block as spatial, inline the fused epilogue
into both its init and its update, so a bias or residual add is applied twice (a 1x1
depthwise convolution of MediaPipe's hand_recrop was off by its bias). This pass, run on the
Relax function before legalization, replaces each such call by the elementwise expression it
computes:

* ``matmul`` with an inner dimension of 1: the broadcast product ``a * b``;
* ``mean``/``sum``/``max``/``min``/``prod`` over axes of size 1: a reshape;
* ``conv2d`` (NHWC, OHWI) whose window and group width are 1: a strided slice (after the
  padding), each input channel repeated ``depth_multiplier`` times, times the weights;
* ``max_pool2d``/``avg_pool2d`` with a 1x1 window and no padding: a strided slice;
* ``softmax``/``log_softmax`` over an axis of size 1: ones/zeros (NaN stays NaN).
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

_REDUCE = {"relax.mean", "relax.sum", "relax.max", "relax.min", "relax.prod"}


def _shape(expr: Any) -> tuple[int, ...] | None:
    ty = getattr(expr, "ty", None)
    shape = getattr(ty, "shape", None) if isinstance(ty, relax.TensorType) else None
    if shape is None:
        return None
    try:
        return tuple(int(d) for d in shape)
    except (TypeError, ValueError):  # a symbolic dimension
        return None


def _dtype(expr: Any) -> str:
    ty = getattr(expr, "ty", None)
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else ""


def _ints(values: Any) -> list[int]:
    return [int(v) for v in values] if values is not None else []


@relax.expr_functor.mutator
class _UnitReductions(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> Any:
        call = self.visit_expr_post_order(call)
        op = getattr(call.op, "name", "")
        rewrite = getattr(self, "_" + op.replace("relax.", "").replace(".", "_"), None)
        if op in _REDUCE:
            rewrite = self._reduce
        if rewrite is None:
            return call
        new = rewrite(call)
        return call if new is None else self.builder_.normalize(new)

    # -- matmul ------------------------------------------------------------------------------

    def _matmul(self, call: relax.Call) -> Any:
        a, b = call.args
        sa, sb = _shape(a), _shape(b)
        if not sa or not sb or len(sa) < 2 or len(sb) < 2 or sa[-1] != 1:
            return None
        out_dtype = str(call.attrs.out_dtype) or _dtype(a)
        if out_dtype in ("", "void"):
            out_dtype = _dtype(a)
        a = a if _dtype(a) == out_dtype else relax.op.astype(a, out_dtype)
        b = b if _dtype(b) == out_dtype else relax.op.astype(b, out_dtype)
        return relax.op.multiply(a, b)

    # -- reductions --------------------------------------------------------------------------

    def _reduce(self, call: relax.Call) -> Any:
        (x,) = call.args[:1]
        shape, out = _shape(x), _shape(call)
        if shape is None or out is None:
            return None
        axes = _ints(call.attrs.axis) if call.attrs.axis is not None else list(range(len(shape)))
        if any(shape[a % len(shape)] != 1 for a in axes):
            return None
        return relax.op.reshape(x, out)

    # -- convolutions ------------------------------------------------------------------------

    def _nn_conv2d(self, call: relax.Call) -> Any:
        x, w = call.args
        at = call.attrs
        sx, sw, out = _shape(x), _shape(w), _shape(call)
        if (
            sx is None
            or sw is None
            or out is None
            or str(at.data_layout) != "NHWC"
            or str(at.kernel_layout) != "OHWI"
            or str(at.out_layout) not in ("NHWC", "")
        ):
            return None
        o, kh, kw, wi = sw
        if kh * kw * wi != 1:
            return None
        groups = int(at.groups)
        if groups != sx[3] or o % groups:
            return None
        pads = _ints(at.padding)
        if any(pads):
            x = relax.op.nn.pad(
                x, [0, 0, pads[0], pads[2], pads[1], pads[3], 0, 0], "constant", 0.0
            )
        sh, sw_ = _ints(at.strides)
        _, oh, ow, _ = out
        x = relax.op.strided_slice(
            x, [1, 2], [0, 0], [(oh - 1) * sh + 1, (ow - 1) * sw_ + 1], [sh, sw_]
        )
        mult = o // groups
        if mult > 1:
            x = relax.op.repeat(x, mult, axis=3)
        out_dtype = str(at.out_dtype) if str(at.out_dtype) not in ("", "void") else _dtype(x)
        if _dtype(x) != out_dtype:
            x = relax.op.astype(x, out_dtype)
        k = relax.op.reshape(w, [o])
        if _dtype(w) != out_dtype:
            k = relax.op.astype(k, out_dtype)
        return relax.op.multiply(x, k)

    def _pool(self, call: relax.Call) -> Any:
        (x,) = call.args
        at = call.attrs
        sx, out = _shape(x), _shape(call)
        if (
            sx is None
            or out is None
            or _ints(at.pool_size) != [1, 1]
            or any(_ints(at.padding))
            or str(at.layout) != "NHWC"
        ):
            return None
        sh, sw = _ints(at.strides)
        _, oh, ow, _ = out
        return relax.op.strided_slice(
            x, [1, 2], [0, 0], [(oh - 1) * sh + 1, (ow - 1) * sw + 1], [sh, sw]
        )

    _nn_max_pool2d = _pool
    _nn_avg_pool2d = _pool

    # -- softmax ---------------------------------------------------------------------------------

    def _softmax_like(self, call: relax.Call, value: float) -> Any:
        (x,) = call.args
        shape = _shape(x)
        if shape is None or shape[int(call.attrs.axis) % len(shape)] != 1:
            return None
        # x - x is 0 for finite x and NaN for NaN/inf, as the real softmax gives NaN there.
        zero = relax.op.subtract(x, x)
        return relax.op.add(zero, relax.const(value, _dtype(x)))

    def _nn_softmax(self, call: relax.Call) -> Any:
        return self._softmax_like(call, 1.0)

    def _nn_log_softmax(self, call: relax.Call) -> Any:
        return self._softmax_like(call, 0.0)


def unit_reductions() -> tvm.transform.Pass:
    """The module pass: every Relax function rewritten (see the module's docstring)."""

    @tvm.transform.module_pass(opt_level=0, name="litekiln.UnitReductions")
    def _pass(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        rewriter = _UnitReductions(mod)
        for gv, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                mod[gv] = rewriter.visit_expr(func)
        return relax.transform.DeadCodeElimination()(mod)

    return _pass
