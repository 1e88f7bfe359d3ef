"""Constants rebuilt from the model: how a compiled model's weights come back at load.

Most constants of a compiled program are the model's own weights, re-laid out (a depthwise
kernel as grouped OHWI, fully-connected weights transposed), widened (int8 and fp16 weights to
float32) or rounded (to fp16). Storing them again in every cache entry made the cache several
times the size of the models. The compiler records instead, per constant, a `WeightRecipe`:
the tensor of the model's main subgraph it comes from and a few numpy steps from a closed set.
The cache stores the recipe; the loader rebuilds the array from the model the app loaded (the
file's bytes, as the model loader read them), so the weights stay in the model file.

The steps, applied in order, then a reshape (no byte moves) to the constant's shape:

* ``["float"]``: the values as the compiler reads them: quantized integers scaled with the
  tensor's affine parameters (in float64, rounded to float32, as the numpy reference
  dequantizes), floats widened to float32, other tensors unchanged;
* ``["astype", dtype]``: numpy's cast (float32 -> float16 rounds to nearest even);
* ``["transpose", perm]``: numpy's transpose.

A recipe's source may also be a `MergedTensor`: the sum of several of the model's tensors,
each added at an offset into a zero array (the parallel convolutions of one map that the
compiler merges, litekiln/compiler/branch_merge.py), with a few values of its own added on a
diagonal (an identity branch's per-channel scale), computed in float64 and rounded once to
float32. The steps then apply to that array.

The compiler keeps a recipe only when it rebuilds the constant bit for bit (with this very
code), so a rebuilt constant is exactly the compiled one.

Verification. The model token keys the entry. When the token is the Fingerprint64 of the
model's bytes (the default), equal tokens mean equal bytes, hence equal weights. A token the
user gives says nothing about the bytes: then `rebuild_weights` also checks the entry's
`weights_digest`, a sha256 over every tensor the recipes read (index, type, shape,
quantization and values) taken at compile time. Shapes and types are checked in any case. A
mismatch raises `WeightMismatch`: the cache drops the entry and the model is compiled again,
never run with other weights.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from litekiln.model.ir import Subgraph, Tensor

#: The step names a recipe may use (see the module docstring).
STEPS = ("float", "astype", "transpose")

Step = tuple[Any, ...]


class WeightMismatch(ValueError):
    """The model's tensors are not the ones a compiled model's constants were made from."""


@dataclass(frozen=True)
class MergedTensor:
    """A float32 array made of the model's tensors: its parts added into a zero array of
    ``shape`` in their order, in float64, then rounded once to float32. A ``"tensor"`` part
    is a float tensor of the main subgraph (of the recorded type and shape) added at its
    offset ``at``; a ``"diagonal"`` part, values added on the diagonal of the first and last
    axes at one (row, column) (``[c, row, column, c]``; along the last axis alone,
    ``[0, row, column, c]``, when the first axis has one element).

    Attributes:
        shape: the array's shape (4-D: a convolution's OHWI or a depthwise one's 1HWC; 2-D:
            a fully connected layer's ``[out, in]``, without diagonals).
        parts: in order, ``("tensor", index, (dtype str, shape), at)`` or ``("diagonal",
            values, row, column)``; the values are float64 (exact in JSON).
    """

    shape: tuple[int, ...]
    parts: tuple[tuple[Any, ...], ...]

    @property
    def tensors(self) -> tuple[int, ...]:
        """The model's tensors it reads."""
        return tuple(int(p[1]) for p in self.parts if p[0] == "tensor")

    def build(self, graph: Subgraph) -> np.ndarray:
        """The array, from ``graph``'s tensors.

        Raises:
            WeightMismatch: a tensor is missing, of another type or shape, or does not fit.
        """
        acc = np.zeros(self.shape, np.float64)
        for part in self.parts:
            if part[0] == "tensor":
                _, t, source, at = part
                tensor = source_tensor(graph, t)
                data = tensor.data
                assert data is not None  # source_tensor checked it
                if (data.dtype.str, data.shape) != source or tensor.quantization is not None:
                    raise WeightMismatch(
                        f"tensor {t} ({tensor.name!r}) holds {data.dtype} {list(data.shape)}, "
                        f"the compiled model was made from {np.dtype(source[0])} "
                        f"{list(source[1])}"
                    )
                window = tuple(slice(a, a + d) for a, d in zip(at, data.shape, strict=True))
                if any(w.stop > n for w, n in zip(window, self.shape, strict=True)):
                    raise WeightMismatch(f"tensor {t} does not fit a merged {list(self.shape)}")
                acc[window] += np.asarray(data, np.float64)
            else:
                _, values, row, column = part
                v = np.asarray(values, np.float64)
                c = np.arange(v.size)
                if self.shape[0] == 1:
                    acc[0, row, column, c] += v
                else:
                    acc[c, row, column, c] += v
        return acc.astype(np.float32)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (the values as JSON numbers: exact for float64); `from_json`
        inverts it."""
        parts: list[list[Any]] = []
        for p in self.parts:
            if p[0] == "tensor":
                parts.append(["tensor", p[1], [p[2][0], list(p[2][1])], list(p[3])])
            else:
                parts.append(["diagonal", [float(v) for v in p[1]], p[2], p[3]])
        return {"shape": list(self.shape), "parts": parts}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> MergedTensor:
        """Parse `to_json` output.

        Raises:
            ValueError: a field is missing or malformed.
        """
        try:
            shape = tuple(int(x) for x in d["shape"])
            parts: list[tuple[Any, ...]] = []
            for p in d["parts"]:
                if p[0] == "tensor" and len(p) == 4:
                    source = (np.dtype(p[2][0]).str, tuple(int(x) for x in p[2][1]))
                    at = tuple(int(x) for x in p[3])
                    if int(p[1]) < 0 or len(at) != len(shape) or len(source[1]) != len(shape):
                        raise ValueError("a part of another rank")
                    parts.append(("tensor", int(p[1]), source, at))
                elif p[0] == "diagonal" and len(p) == 4:
                    values = tuple(float(v) for v in p[1])
                    row, column = int(p[2]), int(p[3])
                    if not (0 <= row < shape[1] and 0 <= column < shape[2]):
                        raise ValueError("a diagonal outside the array")
                    if len(values) > shape[3] or (shape[0] != 1 and len(values) > shape[0]):
                        raise ValueError("a diagonal longer than the array")
                    parts.append(("diagonal", values, row, column))
                else:
                    raise ValueError(f"unknown part {p!r}")
        except (KeyError, TypeError, IndexError, ValueError) as e:
            raise ValueError(f"malformed merged weights {d!r:.200}: {e}") from None
        diagonal = any(p[0] == "diagonal" for p in parts)
        if (
            len(shape) not in (2, 4)
            or (diagonal and len(shape) != 4)
            or any(x <= 0 for x in shape)
            or not parts
        ):
            raise ValueError(f"malformed merged weights of shape {list(shape)}")
        return cls(shape, tuple(parts))


@dataclass(frozen=True)
class WeightRecipe:
    """How to rebuild one constant from a tensor of the model's main subgraph.

    Attributes:
        tensor: index of the source tensor in the main subgraph.
        steps: the steps, in order (see the module docstring).
        dtype: the constant's dtype (numpy name).
        shape: the constant's shape (the last step's result is reshaped to it).
        source: the source tensor's element type (numpy ``dtype.str``) and shape, checked
            before the steps run.
        merge: where the source is no tensor of the model but a sum of them (``tensor`` is
            then -1 and ``source`` the float32 array's type and shape).
    """

    tensor: int
    steps: tuple[Step, ...]
    dtype: str
    shape: tuple[int, ...]
    source: tuple[str, tuple[int, ...]]
    merge: MergedTensor | None = None

    @property
    def tensors(self) -> tuple[int, ...]:
        """The model's tensors the recipe reads."""
        return self.merge.tensors if self.merge is not None else (self.tensor,)

    def rebuild(self, graph: Subgraph, base: np.ndarray | None = None) -> np.ndarray:
        """The constant, rebuilt from ``graph`` (``base``: its source's `float_view`, where
        the caller has it).

        Raises:
            WeightMismatch: as `apply`, or a merged source's tensors do not fit.
        """
        if self.merge is None:
            return self.apply(source_tensor(graph, self.tensor), base)
        x = self.merge.build(graph)
        return self.apply(Tensor(-1, "merged", x.shape, x.dtype, data=x))

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict; `from_json` inverts it."""
        d = {
            "tensor": self.tensor,
            "steps": [list(s) for s in self.steps],
            "dtype": self.dtype,
            "shape": list(self.shape),
            "source": [self.source[0], list(self.source[1])],
        }
        if self.merge is not None:
            d["merge"] = self.merge.to_json()
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> WeightRecipe:
        """Parse `to_json` output.

        Raises:
            ValueError: a field is missing or malformed, or a step is unknown.
        """
        try:
            steps = tuple(_parse_step(s) for s in d["steps"])
            recipe = cls(
                tensor=int(d["tensor"]),
                steps=steps,
                dtype=str(np.dtype(d["dtype"])),
                shape=tuple(int(x) for x in d["shape"]),
                source=(np.dtype(d["source"][0]).str, tuple(int(x) for x in d["source"][1])),
                merge=MergedTensor.from_json(d["merge"]) if "merge" in d else None,
            )
        except (KeyError, TypeError, IndexError) as e:
            raise ValueError(f"malformed weight recipe {d!r:.300}: {e!r}") from None
        misplaced = any(s[0] == "float" for s in steps[1:])
        source_ok = recipe.tensor >= 0 if recipe.merge is None else recipe.tensor == -1
        if not source_ok or any(x < 0 for x in recipe.shape) or misplaced:
            raise ValueError(f"malformed weight recipe {d!r:.300}")
        return recipe

    def apply(self, tensor: Tensor, base: np.ndarray | None = None) -> np.ndarray:
        """The constant, rebuilt from ``tensor`` (C-contiguous; a read-only view of the
        model's bytes when no step moves or converts them).

        Args:
            tensor: the source tensor (``tensor.data`` set).
            base: ``float_view(tensor)`` if the caller has it already (steps ``float``).

        Raises:
            WeightMismatch: the tensor holds no constant or one of another type or shape, or
                the steps do not give the recorded dtype and size.
        """
        data = tensor.data
        if data is None or (data.dtype.str, data.shape) != self.source:
            got = "nothing" if data is None else f"{data.dtype} {list(data.shape)}"
            raise WeightMismatch(
                f"tensor {tensor.index} ({tensor.name!r}) holds {got}, the compiled model was "
                f"made from {np.dtype(self.source[0])} {list(self.source[1])}"
            )
        x = run_steps(tensor, self.steps, base)
        if str(x.dtype) != self.dtype or x.size != math.prod(self.shape):
            raise WeightMismatch(
                f"tensor {tensor.index} ({tensor.name!r}) gives {x.dtype} {list(x.shape)}, the "
                f"compiled model needs {self.dtype} {list(self.shape)}"
            )
        return np.ascontiguousarray(x).reshape(self.shape)


def run_steps(
    tensor: Tensor, steps: tuple[Step, ...], base: np.ndarray | None = None
) -> np.ndarray:
    """``tensor``'s constant after ``steps`` (not reshaped; may be a view of the model's bytes).

    Args:
        tensor: the source tensor.
        steps: recipe steps (see the module docstring).
        base: ``float_view(tensor)`` if the caller has it already.

    Raises:
        WeightMismatch: the tensor holds no constant, or a transpose does not fit its rank.
    """
    if tensor.data is None:
        raise WeightMismatch(f"tensor {tensor.index} ({tensor.name!r}) holds no constant")
    x = tensor.data
    for step in steps:
        if step[0] == "float":
            x = float_view(tensor) if base is None else base
        elif step[0] == "astype":
            x = x.astype(step[1], copy=False)
        else:  # "transpose" (checked by _parse_step)
            if len(step[1]) != x.ndim:
                raise WeightMismatch(
                    f"tensor {tensor.index} ({tensor.name!r}) has rank {x.ndim}, the recipe "
                    f"transposes {len(step[1])} axes"
                )
            x = x.transpose(step[1])
    return x


def _parse_step(s: Any) -> Step:
    if not isinstance(s, (list, tuple)) or not s or s[0] not in STEPS:
        raise ValueError(f"unknown weight recipe step {s!r}")
    if s[0] == "float" and len(s) == 1:
        return ("float",)
    if s[0] == "astype" and len(s) == 2:
        return ("astype", str(np.dtype(s[1])))
    if s[0] == "transpose" and len(s) == 2:
        perm = tuple(int(a) for a in s[1])
        if sorted(perm) != list(range(len(perm))):
            raise ValueError(f"bad transpose {list(perm)} in a weight recipe")
        return ("transpose", perm)
    raise ValueError(f"malformed weight recipe step {s!r}")


def float_view(tensor: Tensor) -> np.ndarray:
    """A constant as the compiler reads it: quantized integers scaled to float32 (computed
    in float64, as :func:`litekiln.ops.base.dequantize`), floats as float32 (no copy when
    they are float32 already), other tensors unchanged.

    Raises:
        WeightMismatch: the tensor holds no constant.
    """
    data = tensor.data
    if data is None:
        raise WeightMismatch(f"tensor {tensor.index} ({tensor.name!r}) holds no constant")
    q = tensor.quantization
    if q is not None and data.dtype.kind in "iu":
        shape = q.broadcast_shape(data.ndim)
        scaled = (data.astype(np.int64) - q.zero_point.reshape(shape)) * q.scale.reshape(shape)
        return scaled.astype(np.float32)
    if data.dtype.kind == "f":
        return data.astype(np.float32, copy=False)
    return data


def weights_digest(graph: Subgraph, tensors: Iterable[int]) -> str:
    """sha256 (hex) over the tensors ``tensors`` of ``graph``: index, element type, shape,
    quantization parameters and values, in index order.

    Raises:
        WeightMismatch: an index is outside the subgraph or its tensor holds no constant.
    """
    h = hashlib.sha256()
    for t in sorted(set(tensors)):
        tensor = source_tensor(graph, t)
        data = tensor.data
        assert data is not None  # source_tensor checked it
        h.update(f"{t}:{data.dtype.str}:{list(data.shape)}".encode())
        q = tensor.quantization
        if q is not None:
            h.update(f"q{q.axis}:".encode())
            h.update(np.ascontiguousarray(q.scale, "<f4").tobytes())
            h.update(np.ascontiguousarray(q.zero_point, "<i8").tobytes())
        h.update(np.ascontiguousarray(data).reshape(-1).data.cast("B"))
    return h.hexdigest()


def source_tensor(graph: Subgraph, t: int) -> Tensor:
    """Tensor ``t`` of ``graph``, which a recipe reads.

    Raises:
        WeightMismatch: no such tensor, or it holds no constant.
    """
    if not 0 <= t < len(graph.tensors):
        raise WeightMismatch(f"the model has no tensor {t} (it has {len(graph.tensors)})")
    tensor = graph.tensors[t]
    if tensor.data is None:
        raise WeightMismatch(f"tensor {t} ({tensor.name!r}) of the model holds no constant")
    return tensor


def rebuild_weights(
    recipes: Mapping[str, WeightRecipe], graph: Subgraph, digest: str | None = None
) -> dict[str, np.ndarray]:
    """Every recipe's constant, rebuilt from ``graph`` (the model's main subgraph).

    Args:
        recipes: constant name -> recipe.
        graph: the main subgraph of the model the app loaded.
        digest: when given (the model's token is not the fingerprint of its bytes), the
            `weights_digest` the source tensors must have.

    Returns:
        Constant name -> array.

    Raises:
        WeightMismatch: a source tensor is missing or of another type or shape, or the
            tensors fail ``digest``.
    """
    sources = (t for r in recipes.values() for t in r.tensors)
    if digest is not None and weights_digest(graph, sources) != digest:
        raise WeightMismatch(
            "the model's weights are not the ones the compiled model was made from (its "
            "token is not a fingerprint of its bytes, so the weights were checked: they differ)"
        )
    floats: dict[int, np.ndarray] = {}  # one float view per source tensor
    out = {}
    for name, recipe in recipes.items():
        base = None
        if recipe.merge is None and recipe.steps and recipe.steps[0] == ("float",):
            base = floats.get(recipe.tensor)
            if base is None:
                base = floats[recipe.tensor] = float_view(source_tensor(graph, recipe.tensor))
        out[name] = recipe.rebuild(graph, base)
    return out
