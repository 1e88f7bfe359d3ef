"""Tracing a compiled program's constants back to the model's tensors (`WeightRecipe`).

The emitters and TVM's pipeline turn weights into constants through numpy and Relax (a
transpose here, a dequantization or an fp16 rounding there), and will keep changing. Rather
than follow each constant through them, the tracer finds, after code generation, which tensor
of the model each constant is and by which steps of :mod:`litekiln.artifact.weights`: among
the model's constants of the same size, those whose values (as float32, rounded through fp16,
or as half) have the same multiset of bit patterns, then the transposes whose reshape to the
constant's shape merges or splits dimensions only. Merged convolutions' weights
(`MergedTensor`, a sum of the model's tensors that the lowering made) are candidates too, as
sources of their own. A recipe is kept only if `WeightRecipe.rebuild` -- the code the loader
runs -- gives the constant bit for bit. A constant that matches nothing (computed by TVM's
constant folding, quantization parameters, weights concatenated by an emitter) is stored in
the cache instead.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from litekiln.artifact.weights import MergedTensor, Step, WeightMismatch, WeightRecipe, run_steps
from litekiln.model.ir import Subgraph, Tensor

#: Points compared before a candidate is rebuilt whole.
_SAMPLES = 16
_FLOAT = ("float",)
_TO_HALF = ("astype", "float16")
_TO_FLOAT = ("astype", "float32")


def trace_weights(
    graph: Subgraph, constants: Mapping[str, np.ndarray], merged: Sequence[MergedTensor] = ()
) -> dict[str, WeightRecipe]:
    """The recipe of every constant that is a tensor of ``graph`` by a few numpy steps.

    Args:
        graph: the model's main subgraph, as the compiler lowered it.
        constants: constant name -> array (every partition's).
        merged: sums of the model's tensors the lowering made (merged convolutions).

    Returns:
        Constant name -> recipe, for the constants found; `WeightRecipe.apply` on the
        recipe's tensor gives each one bit for bit.
    """
    tracer = _Tracer(graph, merged)
    out = {}
    for name, array in constants.items():
        recipe = tracer.find(np.asarray(array, order="C"))  # (0-d stays 0-d)
        if recipe is not None:
            out[name] = recipe
    return out


class _Tracer:
    def __init__(self, graph: Subgraph, merged: Sequence[MergedTensor] = ()) -> None:
        self.graph = graph
        self.by_size: dict[int, list[Tensor]] = {}
        for t in graph.tensors:
            if t.data is not None and t.data.dtype.kind in "biuf" and not t.is_variable:
                self.by_size.setdefault(int(t.data.size), []).append(t)
        # Merged weights as tensors of their own, of negative indices (-1, -2...).
        self.merged: dict[int, MergedTensor] = {}
        for m in dict.fromkeys(merged):
            try:
                data = m.build(graph)
            except WeightMismatch:
                continue
            index = -1 - len(self.merged)
            self.merged[index] = m
            tensor = Tensor(index, f"merged{index}", data.shape, data.dtype, data=data)
            self.by_size.setdefault(int(data.size), []).append(tensor)
        # (tensor, steps) -> (value, order-free checksum of its bit patterns)
        self.bases: dict[tuple[int, tuple[Step, ...]], tuple[np.ndarray, int]] = {}

    def find(self, const: np.ndarray) -> WeightRecipe | None:
        if const.dtype.kind not in "biuf" or const.size == 0:
            return None
        want = _checksum(const)
        # Tensors of the constant's own type first: a float32 constant is then the folded
        # float32 tensor, not its fp16 source widened at every load.
        candidates = self.by_size.get(int(const.size), [])
        for tensor in sorted(
            candidates, key=lambda t: t.data is None or t.data.dtype != const.dtype
        ):
            assert tensor.data is not None  # by_size holds constants only
            for steps in _step_prefixes(tensor, const.dtype):
                base, checksum = self._base(tensor, steps)
                if checksum != want or base.dtype != const.dtype:
                    continue
                for perm in _perms(base.shape, const.shape):
                    if not _sample_equal(base.transpose(perm), const):
                        continue
                    full = (
                        steps if perm == tuple(range(base.ndim)) else (*steps, ("transpose", perm))
                    )
                    source = (tensor.data.dtype.str, tensor.data.shape)
                    merge = self.merged.get(tensor.index)
                    index = tensor.index if merge is None else -1
                    recipe = WeightRecipe(
                        index, full, str(const.dtype), const.shape, source, merge=merge
                    )
                    if _bit_equal(self._apply(recipe, tensor), const):
                        return recipe
        return None

    def _base(self, tensor: Tensor, steps: tuple[Step, ...]) -> tuple[np.ndarray, int]:
        key = (tensor.index, steps)
        if key not in self.bases:
            with np.errstate(over="ignore"):  # (a large float rounded to fp16: inf, no match)
                value = run_steps(tensor, steps)
            self.bases[key] = (value, _checksum(value))
        return self.bases[key]

    def _apply(self, recipe: WeightRecipe, tensor: Tensor) -> np.ndarray | None:
        try:
            if recipe.merge is not None:
                return recipe.rebuild(self.graph)  # (as the loader will: from the model)
            return recipe.apply(tensor)
        except WeightMismatch:
            return None


def _step_prefixes(tensor: Tensor, dtype: np.dtype) -> Iterator[tuple[Step, ...]]:
    """The value steps worth trying for a constant of ``dtype`` from ``tensor``, cheapest at
    load first."""
    data = tensor.data
    assert data is not None
    quantized = tensor.quantization is not None and data.dtype.kind in "iu"
    if data.dtype == dtype and not quantized:
        yield ()  # the tensor's own bytes: nothing to convert at load
    if data.dtype.kind == "f" or quantized:
        if dtype == np.float32:
            if data.dtype != dtype or quantized:
                yield (_FLOAT,)
            yield (_FLOAT, _TO_HALF, _TO_FLOAT)  # rounded to fp16, computed in float32
        elif dtype == np.float16 and (data.dtype != dtype or quantized):
            yield (_FLOAT, _TO_HALF)
    elif data.dtype != dtype:
        yield (("astype", str(dtype)),)


def _perms(src: tuple[int, ...], dst: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    """Transposes of ``src`` whose reshape to ``dst`` only merges or splits dimensions, the
    identity first; one per order of the dimensions longer than 1."""
    target = _cumulative(dst)
    seen = set()
    identity = tuple(range(len(src)))
    for perm in itertools.chain([identity], itertools.permutations(range(len(src)))):
        order = tuple(a for a in perm if src[a] != 1)
        if order in seen:
            continue
        seen.add(order)
        mine = _cumulative(tuple(src[a] for a in perm))
        if mine <= target or target <= mine:
            yield perm


def _cumulative(shape: tuple[int, ...]) -> set[int]:
    out, acc = set(), 1
    for d in shape:
        if d != 1:
            acc *= d
            out.add(acc)
    return out


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view(f"u{x.dtype.itemsize}") if x.dtype.kind != "b" else x.view(np.uint8)


def _checksum(x: np.ndarray) -> int:
    """Sum of the bit patterns: the same for any order of the same values."""
    return int(_bits(x).sum(dtype=np.uint64))


def _sample_equal(view: np.ndarray, const: np.ndarray) -> bool:
    """Whether ``view``, read in C order, agrees with ``const`` at a few spread positions."""
    n = int(const.size)
    flat = sorted({k * n // _SAMPLES for k in range(min(_SAMPLES, n))})
    idx = np.unravel_index(flat, view.shape) if view.ndim else ()
    got = _bits(view)[idx] if view.ndim else _bits(view)
    return bool(np.array_equal(got, _bits(const).reshape(-1)[flat]))


def _bit_equal(a: np.ndarray | None, b: np.ndarray) -> bool:
    return (
        a is not None
        and a.shape == b.shape
        and a.dtype == b.dtype
        and bool(np.array_equal(_bits(a), _bits(b)))
    )
