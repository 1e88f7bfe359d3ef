"""Matrix products fused with the layout copies around them (a Relax pass after FuseOps).

TVM's FuseOps puts elementwise consumers into a matrix product's kernel, but neither the
injective ops before it (reshape, transpose, strided slice, a scale) nor the injective ones
after it (a reshape, then GELU): on a vision transformer every attention splits its fused
q/k/v product with a reshape-transpose and three slices, and folds the heads back with a
transpose before the output projection, each a kernel of its own that copies the tensor
(DeiT-Tiny: 5 such kernels per block, 3.3-4.6 us each on the H200, next to 10-25 us per
matrix product). This pass merges those groups into the product's group before FuseTIR:

* a producer group of injective ops only, whose output the product reads, is copied into
  the product's group (it stays for its other readers; dead copies are removed);
* a producer group of plain copies (no transcendental math, no more elements than the
  product's output) whose output the product's epilogue reads (a residual, an unrolled
  RNN step's row of the batched input product) is copied into the group too: it is read
  once per output element;
* a consumer group of injective ops only over the same outputs, unit axes aside (a reshape,
  GELU), the product's only reader, joins the product's group as more epilogue, whatever
  the sizes of the other tensors it reads.

A convolution's group takes the third kind only, into its epilogue (`_conv_epilogue_inputs`):
BlazeFace's shortcut, a 2x2 pool of the block's input (elementwise since
`emit_nn._small_pool`) read through a channel pad by the next convolution's residual add.
Its operands keep their own folds (`lowering.conv_folded`).

A matrix-vector product (fewer than `_MATH_MIN_ROWS` rows) computes a copied producer again
for every column that reads it: it takes at most one producer with transcendental math, and
only where that costs at most `_MATH_MAX_EVALS` evaluations (see there).

The schedule rules then inline the copies into the product's loads and stores (every rule
takes injective producers; `schedules.SharedMatmul` stages them through its fetches).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import tvm
import tvm_ffi
from tvm import relax, tirx

__all__ = ["POOL_PREFIXES", "fuse_matmul_neighbours"]

#: op_pattern of an injective PrimFunc or less (elementwise, broadcast, injective).
_INJECTIVE = 2
#: op_pattern of a broadcast PrimFunc or less (elementwise, broadcast): same-shape epilogues.
_BROADCAST = 1
#: Legalized names of the pools `codegen.isolate_pools` keeps out of FuseOps.
POOL_PREFIXES = ("max_pool2d", "avg_pool2d")
#: op_pattern of a reduction that takes elementwise consumers (matmul, conv2d).
_OUT_ELEMWISE_FUSABLE = 4
#: Most producer groups copied into one product's group (a chain of copies, or both inputs).
_MAX_MERGES = 4
#: Longest group name (FuseTIR names the kernel after it).
_MAX_NAME = 80
_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
#: A product of fewer output rows than this (a matrix-vector product: its rules sum each
#: column in threads of its own, nothing staged) takes no copy with transcendental math:
#: the copy would be computed again for every column that reads each element. An unrolled
#: GRU's recurrent products ([1, 64] x [64, 192]) took the previous steps' gate updates,
#: sigmoid and tanh nested three and four steps deep, into their 64-term sums: 59 us a
#: product on the H200. With more rows the products stage their operands' tiles, and a copy
#: is computed once per tile (a transformer MLP's GELU before fc2: one kernel less).
_MATH_MIN_ROWS = 16
#: ... unless it is the one copy with math such a product takes, and its elements times the
#: product's outputs (the evaluations: each column computes every element it sums) are at
#: most this many. Its own producers with math then stay out, so the math never nests: an
#: unrolled LSTM's recurrent product computes the previous step's output, o * tanh(c), from
#: the gates and the cell state in memory (64 x 256 evaluations) and saves a launch a step.
_MATH_MAX_EVALS = 1 << 16
#: Name of `compiler.layer_norm`'s PrimFuncs (no TVM-free import of it here: the same string).
_NORM_NAME = "layer_norm"
#: Longest row a norm merged into a one-row product may have (`_Fuser._norm_into_product`):
#: every work-group of the product sums it again.
_NORM_MAX_TERMS = 16384
#: TVMScript calls of transcendental math (`_Fuser._has_math`).
_TRANSCENDENTAL = re.compile(
    r"\bT\.(?:exp|exp2|exp10|expm1|log|log2|log10|log1p|tanh|sigmoid|erf|pow|sqrt|rsqrt|"
    r"sin|cos|tan|asin|acos|atan|atan2|sinh|cosh|asinh|acosh|atanh)\("
)


@relax.expr_functor.mutator
class _Substitute(relax.PyExprMutator):
    def __init__(self, mapping: dict[Any, Any]) -> None:
        super().__init__()
        self.mapping = mapping

    def visit_var_(self, var: Any) -> Any:
        return self.mapping.get(var, var)

    def visit_dataflow_var_(self, var: Any) -> Any:
        return self.mapping.get(var, var)


def fuse_matmul_neighbours() -> tvm.transform.Pass:
    """The module pass (between FuseOps and FuseTIR); see the module docstring."""

    @tvm.transform.module_pass(opt_level=0, name="litekiln.FuseMatmulNeighbours")
    def _pass(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        return _Fuser(mod).run()

    return _pass


class _Fuser:
    def __init__(self, mod: tvm.IRModule) -> None:
        self.mod = mod
        self.builder = relax.BlockBuilder(mod)
        self.count = 0
        self.added: dict[int, list[tuple[tvm.ir.GlobalVar, relax.Function]]] = {}
        self._math: dict[str, bool] = {}  # PrimFunc name -> `_transcendental`
        self._took_math: list[tvm.ir.GlobalVar] = []  # groups with a copy with math merged

    # ------------------------------------------------------------------ classification
    def _prim_patterns(self, func: relax.Function) -> list[tuple[int, str]] | None:
        """(op_pattern, PrimFunc name) of each call_tir of a primitive group, or None where
        the body is anything else."""
        body = func.body
        if not isinstance(body, relax.SeqExpr) or len(body.blocks) != 1:
            return None
        out = []
        for b in body.blocks[0].bindings:
            info = self._call_tir(b.value)
            if info is None:
                return None
            out.append(info)
        return out

    def _call_tir(self, value: Any) -> tuple[int, str] | None:
        if not (isinstance(value, relax.Call) and value.op.same_as(_CALL_TIR)):
            return None
        gv = value.args[0]
        prim = self.mod[gv]
        if not isinstance(prim, tirx.PrimFunc):
            return None
        pattern = prim.attrs.get("op_pattern") if prim.attrs is not None else None
        if pattern is None:
            return None
        return int(pattern), gv.name_hint

    def _group(self, value: Any) -> relax.Function | None:
        """The primitive group ``value`` calls (a call_tir wrapped as one), else None."""
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar):
            func = self.mod[value.op]
            primitive = func.attrs is not None and func.attrs.get("Primitive")
            return func if isinstance(func, relax.Function) and primitive else None
        if self._call_tir(value) is None or not isinstance(value.ty, relax.TensorType):
            return None  # (a call of several outputs, `compiler.gated_step`'s: merged with none)
        return self._wrap(value)

    def _wrap(self, call: relax.Call) -> relax.Function:
        """A primitive group of one call_tir: ``call``'s tensors as parameters."""
        tensors = list(call.args[1].fields)
        params = [relax.Var(f"p{i}", t.ty) for i, t in enumerate(tensors)]
        bb = relax.BlockBuilder()
        with bb.function("wrapped", params, attrs={"Primitive": True}, private=True):
            with bb.dataflow():
                out = bb.emit_output(relax.call_tir(call.args[0], params, call.ty))
            bb.emit_func_output(out)
        return bb.get()["wrapped"]

    def _args(self, value: Any) -> list[Any]:
        if isinstance(value.op, tvm.ir.GlobalVar):
            return list(value.args)
        return list(value.args[1].fields)

    def _is_product(self, func: relax.Function) -> bool:
        pats = self._prim_patterns(func) or []
        return any(
            p == _OUT_ELEMWISE_FUSABLE and ("matmul" in name or "attention" in name)
            for p, name in pats
        )

    def _is_norm(self, func: relax.Function) -> bool:
        """A layer or RMS norm's group (`compiler.layer_norm`'s PrimFuncs)."""
        pats = self._prim_patterns(func) or []
        return any(name.startswith(_NORM_NAME) for _, name in pats)

    def _is_conv(self, func: relax.Function) -> bool:
        """A convolution's group (its epilogue takes plain copies, `_block`)."""
        pats = self._prim_patterns(func) or []
        return any(p == _OUT_ELEMWISE_FUSABLE and "conv2d" in name for p, name in pats)

    def _is_pool(self, func: relax.Function) -> bool:
        """A group of one pool (`codegen.isolate_pools` kept it alone through FuseOps)."""
        pats = self._prim_patterns(func) or []
        return len(pats) == 1 and pats[0][1].startswith(POOL_PREFIXES)

    def _pool_epilogue(
        self, bindings: list[Any], i: int, pool: relax.Function, uses: dict[Any, int]
    ) -> None:
        """Merge into pool ``bindings[i]`` the group that follows it where that group is
        elementwise (broadcast at most: no pad, no reshape) over the pool's own shape and
        the pool's only reader: a fused activation, an int8 model's quantization simulator
        after its average pool. The pool's schedules take it as an epilogue, as a
        convolution's; a shape-changing consumer stays out (see `isolate_pools`)."""
        b = bindings[i]
        if i + 1 >= len(bindings) or uses.get(b.var, 0) != 1:
            return
        nxt = bindings[i + 1]
        if not isinstance(nxt, relax.VarBinding):
            return
        epi = self._group(nxt.value)
        if epi is None:
            return
        pats = self._prim_patterns(epi) or []
        epi_args = self._args(nxt.value)
        if (
            not pats
            or any(p > _BROADCAST for p, _ in pats)
            or sum(1 for x in epi_args if x.same_as(b.var)) != 1
            or _shape(nxt.var) != _shape(b.var)
        ):
            return
        k = next(n for n, x in enumerate(epi_args) if x.same_as(b.var))
        func, args = self._merge(pool, self._args(b.value), epi, epi_args, k)
        bindings[i + 1] = relax.VarBinding(nxt.var, relax.Call(self._add(func), args))
        bindings[i] = None

    def _is_attention(self, func: relax.Function) -> bool:
        return any("attention" in name for _, name in self._prim_patterns(func) or [])

    def _operands(self, func: relax.Function) -> set[int]:
        """Indices of ``func``'s parameters that reach its matrix product's operands (not
        its epilogue's: a residual stays an input)."""
        bindings = list(func.body.blocks[0].bindings)
        reach: set[Any] = set()
        for b in reversed(bindings):
            info = self._call_tir(b.value)
            if info is not None and "attention" in info[1]:
                # The queries and the values only: their copies become reads along the rows
                # a warp walks (a query broadcast to a row's lanes, a value row across them).
                # The keys are read across the lanes, key by key: through a copy (a
                # transpose) their kernel reads keys side by side, not 576 floats apart.
                fields = b.value.args[1].fields
                reach.update(relax.analysis.free_vars(fields[0]))
                reach.update(relax.analysis.free_vars(fields[2]))
            elif b.var in reach or (info is not None and info[0] == _OUT_ELEMWISE_FUSABLE):
                reach.update(relax.analysis.free_vars(b.value))
        return {i for i, p in enumerate(func.params) if p in reach}

    def _is_copy(self, func: relax.Function) -> bool:
        pats = self._prim_patterns(func) or []
        return bool(pats) and all(p <= _INJECTIVE for p, _ in pats)

    def _has_math(self, func: relax.Function) -> bool:
        """Whether a group calls transcendental math (exp, tanh, sigmoid, erf...)."""
        return any(self._transcendental(n) for _, n in self._prim_patterns(func) or [])

    def _transcendental(self, name: str) -> bool:
        """Whether the PrimFunc ``name`` calls a transcendental function (cached by name)."""
        known = self._math.get(name)
        if known is None:
            known = _TRANSCENDENTAL.search(self.mod[name].script()) is not None
            self._math[name] = known
        return known

    # ------------------------------------------------------------------ merging
    def _merge(
        self, first: relax.Function, first_args: list[Any], second: relax.Function,
        second_args: list[Any], joint: int,
    ) -> tuple[relax.Function, list[Any]]:  # fmt: skip
        """One group: ``first``, whose result is ``second``'s argument ``joint``, then
        ``second``. Returns it and its arguments."""
        p1 = [relax.Var(f"a{i}", p.ty) for i, p in enumerate(first.params)]
        rest = [i for i in range(len(second.params)) if i != joint]
        p2 = [relax.Var(f"b{i}", second.params[i].ty) for i in rest]
        bb = relax.BlockBuilder()
        with bb.function("merged", p1 + p2, attrs={"Primitive": True}, private=True):
            with bb.dataflow():
                mid = self._inline(bb, first, p1, output=False)
                ins = list(p2)
                ins.insert(joint, mid)
                out = self._inline(bb, second, ins, output=True)
            bb.emit_func_output(out)
        return bb.get()["merged"], first_args + [second_args[i] for i in rest]

    @staticmethod
    def _inline(bb: relax.BlockBuilder, func: relax.Function, args: list[Any], output: bool) -> Any:
        """Emit ``func``'s bindings on ``args``; the last as the block's output if ``output``."""
        mapping = dict(zip(func.params, args, strict=True))
        bindings = func.body.blocks[0].bindings
        for n, b in enumerate(bindings):
            value = _Substitute(mapping).visit_expr(b.value)
            last = output and n == len(bindings) - 1
            mapping[b.var] = bb.emit_output(value) if last else bb.emit(value)
        return mapping[func.body.body]

    def _add(self, func: relax.Function) -> tvm.ir.GlobalVar:
        """``func`` added to the module, named as FuseOps names groups (by its PrimFuncs);
        an equal group added before is reused (an unrolled LSTM's steps make the same
        merges: one kernel, not one per step)."""
        key = tvm_ffi.structural_hash(func, map_free_vars=True)
        for gv, known in self.added.get(key, []):
            if tvm_ffi.structural_equal(func, known, map_free_vars=True):
                return gv
        self.count += 1
        names = [name for _, name in self._prim_patterns(func) or []]
        base = "fused_" + "_".join(n.removeprefix("fused_") for n in names)
        base = base[:_MAX_NAME] if len(base) > _MAX_NAME else base
        taken = {gv.name_hint for gv in self.mod.functions}
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base}_{n}"
        gv = self.builder.add_func(func, name)
        self.mod = self.builder.get()
        self.added.setdefault(key, []).append((gv, func))
        return gv

    def run(self) -> tvm.IRModule:
        main = self.mod["main"]
        if not isinstance(main, relax.Function) or not isinstance(main.body, relax.SeqExpr):
            return self.mod
        blocks = [self._block(b) for b in main.body.blocks]
        if not self.count:
            return self.mod
        self.mod["main"] = relax.Function(
            main.params, relax.SeqExpr(blocks, main.body.body), main.ret_ty,
            main.is_pure, main.attrs,
        )  # fmt: skip
        self.mod = relax.transform.Normalize()(self.mod)
        self.mod = relax.transform.DeadCodeElimination(["main"])(self.mod)
        return self.mod

    def _block(self, block: Any) -> Any:
        if not isinstance(block, relax.DataflowBlock):
            return block
        bindings: list[Any] = list(block.bindings)
        by_var = {b.var: i for i, b in enumerate(bindings)}
        uses: dict[Any, int] = {}
        for b in bindings:
            for v in relax.analysis.free_vars(b.value):
                uses[v] = uses.get(v, 0) + 1
        for i, b in enumerate(bindings):
            if not isinstance(b, relax.VarBinding):
                continue
            func = self._group(b.value)
            if func is not None and self._is_pool(func):
                self._pool_epilogue(bindings, i, func, uses)
                continue
            if func is not None and self._is_conv(func) and not self._is_product(func):
                self._conv_epilogue_inputs(bindings, i, func, by_var)
                continue
            if func is not None and self._is_norm(func) and not self._is_product(func):
                # The copies a norm reads (the slices of a merged query/key/value product
                # that a language model's query and key norms read: Gemma 3, two kernels a
                # layer copying a few KB each). Its row is read twice (the sums, then the
                # normalised row): a slice or a reshape computed twice costs nothing; its
                # rule inlines them into its reads (`schedules.RowNormalization`).
                self._merge_plain_copies(bindings, i, func, by_var, lambda f: set())
                continue
            if func is None or not self._is_product(func):
                continue
            args = self._args(b.value)
            merges = 0
            # (a group made here is met again where it was put: it took its copy with math)
            math_merged = any(b.value.op.same_as(gv) for gv in self._took_math)
            changed = True
            while changed and merges < _MAX_MERGES:
                changed = False
                operands = self._operands(func)
                for k in range(len(args)):
                    found = self._copy_producer(bindings, by_var, args, i, k)
                    if found is None:
                        continue
                    src, prod = found
                    math = self._has_math(prod)
                    if k not in operands and (
                        math or _numel(src.var) > _numel(b.var) or self._is_attention(func)
                    ):
                        # an epilogue's input: a plain copy, read once per output; not an
                        # attention's keys (see `_operands`) nor its other inputs
                        continue
                    if math and _rows(b.var) < _MATH_MIN_ROWS:
                        if math_merged or _numel(src.var) * _numel(b.var) > _MATH_MAX_EVALS:
                            continue
                        math_merged = True
                    prod_args = self._args(src.value)
                    func, args = self._merge(prod, prod_args, func, args, k)
                    merges += 1
                    changed = True
                    break
            normed = (
                None
                if self._is_norm(func)
                else self._norm_into_product(bindings, by_var, args, i, b.var)
            )
            if normed is not None:  # (after the copies: a reshape between them)
                func, args = self._merge(normed[0], self._args(normed[1]), func, args, normed[2])
                merges += 1
            # an epilogue of copies: the product's only reader, as many elements
            for j in range(i + 1, len(bindings)):
                nxt = bindings[j]
                if not isinstance(nxt, relax.VarBinding) or uses.get(b.var, 0) != 1:
                    break
                epi = self._group(nxt.value)
                epi_args = self._args(nxt.value) if epi is not None else []
                if (
                    epi is None
                    or not self._is_copy(epi)
                    or sum(1 for x in epi_args if x.same_as(b.var)) != 1
                    or _shape(nxt.var) != _shape(b.var)
                ):
                    break
                k = next(n for n, x in enumerate(epi_args) if x.same_as(b.var))
                func, args = self._merge(func, args, epi, epi_args, k)
                gv = self._add(func)
                if math_merged:
                    self._took_math.append(gv)
                bindings[j] = relax.VarBinding(nxt.var, relax.Call(gv, args))
                bindings[i] = None
                break
            if bindings[i] is not None and merges:
                gv = self._add(func)
                if math_merged:
                    self._took_math.append(gv)
                bindings[i] = relax.VarBinding(b.var, relax.Call(gv, args))
        return relax.DataflowBlock([b for b in bindings if b is not None])

    def _norm_into_product(
        self, bindings: list[Any], by_var: dict[Any, int], args: list[Any], i: int, out: Any
    ) -> tuple[relax.Function, Any, int] | None:
        """A layer or RMS norm (`_is_norm`) whose result is an operand of the one-row
        product ``bindings[i]`` (a language model's decode step: the norm before the
        attention's query/key/value product, the one before the MLP's products): ``(norm
        group, its call, the argument's index)``, else None. Merged, the product's kernel
        computes the row's statistics itself (`schedules.NormedRowReduction`: each
        work-group sums the row's few KB again, from the cache) and normalises each term as
        it reads it: the norm's launch and its output's round trip are gone (two launches a
        layer of every decoder, ~4 us each in a CUDA graph on the H200). The norm stays for
        its other readers (the residual), and goes where the products were its only ones."""
        if _rows(out) != 1:
            return None
        for k, a in enumerate(args):
            j = by_var.get(a)
            if j is None or j >= i or sum(1 for x in args if x.same_as(a)) != 1:
                continue
            src = bindings[j]
            if src is None or not isinstance(src.var, relax.DataflowVar):
                continue
            prod = self._group(src.value)
            if prod is None or not self._is_norm(prod) or self._is_product(prod):
                continue
            pats = self._prim_patterns(prod) or []
            if sum(1 for _, n in pats if n.startswith(_NORM_NAME)) != 1 or _rows(a) != 1:
                continue
            if _numel(a) > _NORM_MAX_TERMS:
                continue
            return prod, src.value, k
        return None

    def _copy_producer(
        self, bindings: list[Any], by_var: dict[Any, int], args: list[Any], i: int, k: int
    ) -> tuple[Any, relax.Function] | None:
        """The binding before ``bindings[i]`` of a group of plain copies (`_is_copy`) whose
        result is ``args[k]`` of the group there, read once by it, and that group; None
        where there is none."""
        a = args[k]
        j = by_var.get(a)
        if j is None or j >= i or sum(1 for x in args if x.same_as(a)) != 1:
            return None
        src = bindings[j]
        if src is None or not isinstance(src.var, relax.DataflowVar):
            return None
        prod = self._group(src.value)
        if prod is None or not self._is_copy(prod):
            return None
        return src, prod

    def _conv_epilogue_inputs(
        self, bindings: list[Any], i: int, func: relax.Function, by_var: dict[Any, int]
    ) -> None:
        """Merge into convolution ``bindings[i]`` the groups of plain copies (injective, no
        transcendental math, no more elements than the convolution's output) that its
        epilogue reads: BlazeFace's shortcut, a 2x2 pool of the block's input (as
        `emit_nn._small_pool` makes it) that the residual add reads through a channel pad.
        Each element is read once, so the copy costs its reads and saves a launch and a
        round trip of its output.

        The convolution's operands keep their own folds (`lowering.conv_folded`): merging
        an activation that stands alone before a convolution, its only reader, into the
        convolution's loads (computed again at every read of an element) was measured on the
        H200 and lost as often as it won (selfie_segmentation +6%, palm_detection_lite +4%,
        keras_densenet121 -3%: docs/benchmarks.md, twenty-first session)."""
        self._merge_plain_copies(bindings, i, func, by_var, self._operands)

    def _merge_plain_copies(
        self,
        bindings: list[Any],
        i: int,
        func: relax.Function,
        by_var: dict[Any, int],
        skip: Callable[[relax.Function], set[int]],
    ) -> None:
        """Merge into group ``bindings[i]`` (``func``) the groups of plain copies (`_is_copy`,
        no transcendental math, no more elements than its output) whose results it reads as
        arguments not in ``skip(func)`` (asked again after each merge: the arguments move);
        up to `_MAX_MERGES`."""
        b = bindings[i]
        args = self._args(b.value)
        merges = 0
        changed = True
        while changed and merges < _MAX_MERGES:
            changed = False
            skipped = skip(func)
            for k in range(len(args)):
                found = None if k in skipped else self._copy_producer(bindings, by_var, args, i, k)
                if found is None:
                    continue
                src, prod = found
                if self._has_math(prod) or _numel(src.var) > _numel(b.var):
                    continue
                func, args = self._merge(prod, self._args(src.value), func, args, k)
                merges += 1
                changed = True
                break
        if merges:
            bindings[i] = relax.VarBinding(b.var, relax.Call(self._add(func), args))


def _static_shape(var: Any) -> list[int] | None:
    """``var``'s shape (None where it is not a tensor of static shape)."""
    sinfo = var.ty
    shape = getattr(sinfo, "shape", None)
    if not isinstance(sinfo, relax.TensorType) or shape is None:
        return None
    try:
        return [int(d) for d in shape.values]
    except (TypeError, AttributeError):
        return None


def _shape(var: Any) -> list[int] | None:
    """``var``'s static shape without its unit axes (None if not static)."""
    shape = _static_shape(var)
    return None if shape is None else [d for d in shape if d != 1]


def _rows(var: Any) -> int:
    """``var``'s element count over its last axis (-1 if not static)."""
    shape = _static_shape(var)
    return -1 if not shape else math.prod(shape[:-1])


def _numel(var: Any) -> int:
    """``var``'s element count (-1 if not static)."""
    shape = _static_shape(var)
    return -1 if shape is None else math.prod(shape)
