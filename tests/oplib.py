"""The one helper that checks an op against LiteRT (STYLE.md item 3; cf. tinygrad's helper_test_op).

Usage in an op test::

    from oplib import check_op, Spec

    @pytest.mark.parametrize("act", ["NONE", "RELU6"])
    def test_conv(act):
        check_op("CONV_2D", [Spec([1, 8, 8, 3])], {"padding": "SAME", "stride_w": 1,
                 "stride_h": 1, "fused_activation_function": act},
                 consts={1: Spec([4, 3, 3, 3]), 2: Spec([4])})

``check_op`` writes a one-op model with ``tests/tflite_builder.py``, runs it in LiteRT and on
litekiln's numpy reference (``litekiln.reference.run_graph`` over the loaded model) with the
same seeded random inputs, and asserts that every output has the same shape, the same dtype
and values within the stated tolerance:

* float32: ``|ref - litert| <= atol + rtol * |litert|`` with atol = rtol = 1e-5 (a few ulps
  of accumulated rounding; pass ``tol`` for ops whose kernels sum in a different order).
* float16: atol = rtol = 1e-3 (half precision has 11 significant bits).
* quantized integers: at most ``qtol`` (default 1) quantization steps apart, since the float
  view rounds once where LiteRT's fixed-point kernels round in their own places.
* other integers and bool: exact.

Output shapes need not be given: the model is first written with the first input's shape,
LiteRT computes the real output shapes at ``allocate_tensors``/``invoke``, and the model is
rewritten with those (a given ``out_shape`` is instead checked against LiteRT's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tflite_builder import (
    Quant,
    QuantLike,
    Sparsity,
    TensorSpec,
    build_single_op,
    numpy_dtype,
)

Spec = TensorSpec

__all__ = [
    "OpCheck",
    "Quant",
    "Sparsity",
    "Spec",
    "TensorSpec",
    "check_op",
    "random_array",
    "run_litert",
    "run_reference",
]

#: LiteRT's builtin kernels without the default XNNPACK delegate: the kernels the TFLite GPU
#: delegate documentation compares against, and the same on every machine.
LITERT_RESOLVER = "BUILTIN_WITHOUT_DEFAULT_DELEGATES"

#: (atol, rtol) by output dtype for float outputs; see the module docstring for why.
DEFAULT_TOL = {"float32": (1e-5, 1e-5), "float16": (1e-3, 1e-3), "float64": (1e-10, 1e-10)}


def random_array(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    """Seeded random data for an operand: ``spec.low``..``spec.high`` or a per-dtype default.

    Defaults: floats in [-1, 1]; quantized integers over their whole range; plain integers in
    [-10, 10] ([0, 10] unsigned); bools half true.
    """
    shape = spec.resolved_shape()
    dt = numpy_dtype(spec.dtype)
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if dt.kind == "f":
        lo = -1.0 if spec.low is None else spec.low
        hi = 1.0 if spec.high is None else spec.high
        return rng.uniform(lo, hi, shape).astype(dt)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        if spec.quant is not None:
            lo, hi = info.min, info.max
        else:
            lo, hi = (0 if dt.kind == "u" else -10), 10
        lo = lo if spec.low is None else int(spec.low)
        hi = hi if spec.high is None else int(spec.high)
        if str(spec.dtype) == "int4":
            lo, hi = max(lo, -8), min(hi, 7)
        return rng.integers(lo, hi, shape, endpoint=True).astype(dt)
    raise ValueError(f"no random data for dtype {spec.dtype!r}")


def run_litert(
    model: bytes, feeds: Sequence[np.ndarray], resolver: str = LITERT_RESOLVER
) -> list[np.ndarray]:
    """Run a model in LiteRT (its builtin kernels, or ``resolver``: ``"AUTO"`` for its default
    path, XNNPACK) and return its outputs in graph order."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    it = Interpreter(
        model_content=model,
        experimental_op_resolver_type=getattr(OpResolverType, resolver),
    )
    details = it.get_input_details()
    for d, x in zip(details, feeds, strict=True):
        if tuple(d["shape"]) != x.shape:
            it.resize_tensor_input(d["index"], x.shape)
    it.allocate_tensors()
    for d, x in zip(details, feeds, strict=True):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [np.array(it.get_tensor(d["index"])) for d in it.get_output_details()]


def run_reference(model: bytes, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run a model on litekiln's numpy reference and return its outputs in graph order."""
    from litekiln.model import load_model
    from litekiln.reference import run_graph

    graph = load_model(model).main
    values = run_graph(graph, dict(zip(graph.inputs, feeds, strict=True)))
    return [values[t] for t in graph.outputs]


@dataclass
class OpCheck:
    """What check_op compared, for tests that assert more."""

    model: bytes
    feeds: list[np.ndarray]
    litert: list[np.ndarray]
    reference: list[np.ndarray]


def check_op(
    op_name: str,
    inputs: Sequence[np.ndarray | TensorSpec | None],
    options: Mapping[str, Any] | None = None,
    *,
    version: int = 1,
    consts: Mapping[int, np.ndarray | TensorSpec] | Sequence[np.ndarray | TensorSpec] | None = None,
    out_shape: Sequence[int] | None = None,
    out_dtype: Any = None,
    out_quant: QuantLike = None,
    outputs: Sequence[TensorSpec] | int | None = None,
    custom_options: bytes | Mapping[str, Any] | None = None,
    tol: float | tuple[float, float] | None = None,
    qtol: int = 1,
    seed: int = 0,
) -> OpCheck:
    """Check one op against LiteRT: same output shapes, dtypes, and values within tolerance.

    Args:
        op_name: builtin name (``"CONV_2D"``) or ``"CUSTOM:<code>"``.
        inputs: graph-input operands: arrays (fed as given) or specs (random data unless
            ``data``); None for an omitted optional input.
        options: builtin options (snake_case keys).
        version: operator version.
        consts: constant operands: position -> array/spec inserted into the op's inputs, or a
            sequence appended after ``inputs``. Specs without data get random data.
        out_shape, out_dtype, out_quant: the output (shape inferred by LiteRT when omitted;
            dtype and quantization default to the first input's).
        outputs: specs of several outputs, or their number (shapes inferred by LiteRT).
        custom_options: custom ops' options (bytes or a flexbuffer dict).
        tol: float tolerance, ``atol`` for both or ``(atol, rtol)``; default ``DEFAULT_TOL``.
        qtol: allowed difference of quantized outputs, in quantization steps.
        seed: seed of the random inputs.

    Returns:
        The model, inputs and both sets of outputs.

    Raises:
        AssertionError: the reference and LiteRT disagree (the message says how).
    """
    rng = np.random.default_rng(seed)

    def filled(x: np.ndarray | TensorSpec | None) -> TensorSpec | None:
        if x is None:
            return None
        spec = TensorSpec.of(x)
        data = random_array(spec, rng) if spec.data is None else spec.data
        return TensorSpec(**{**vars(spec), "data": np.asarray(data, numpy_dtype(spec.dtype))})

    in_specs = [filled(x) for x in inputs]
    if isinstance(consts, Mapping):
        const_specs: Any = {k: filled(v) for k, v in consts.items()}
    else:
        const_specs = None if consts is None else [filled(v) for v in consts]
    feeds = [np.asarray(s.data) for s in in_specs if s is not None]

    if isinstance(outputs, int):
        out_specs = [
            TensorSpec([1], out_dtype or _first_dtype(in_specs), out_quant) for _ in range(outputs)
        ]
        infer = True
    else:
        out_specs = list(outputs) if outputs is not None else None
        infer = out_specs is None and out_shape is None

    def build(shape: Sequence[int] | None, specs: list[TensorSpec] | None) -> bytes:
        b, _ = build_single_op(
            op_name,
            in_specs,
            options,
            consts=const_specs,
            out_shape=shape,
            out_dtype=out_dtype,
            out_quant=out_quant,
            outputs=specs,
            version=version,
            custom_options=custom_options,
        )
        return b.build()

    model = build(out_shape, out_specs)
    litert = run_litert(model, feeds)
    declared = _declared_shapes(model)
    actual = [r.shape for r in litert]
    if declared != actual:
        if not infer:
            raise AssertionError(
                f"{op_name}: declared output shapes {declared}, LiteRT computes {actual}"
            )
        if out_specs is None:
            model = build(actual[0], None)
        else:
            out_specs = [
                TensorSpec(list(s), o.dtype, o.quant, name=o.name)
                for s, o in zip(actual, out_specs, strict=True)
            ]
            model = build(None, out_specs)
        litert = run_litert(model, feeds)

    reference = run_reference(model, feeds)
    _compare(op_name, model, litert, reference, tol, qtol)
    return OpCheck(model, feeds, litert, reference)


def _first_dtype(specs: Sequence[TensorSpec | None]) -> Any:
    return next((s.dtype for s in specs if s is not None), "float32")


def _declared_shapes(model: bytes) -> list[tuple[int, ...]]:
    from litekiln.model import load_model

    graph = load_model(model).main
    return [graph.tensors[t].shape for t in graph.outputs]


def _compare(
    op_name: str,
    model: bytes,
    litert: list[np.ndarray],
    reference: list[np.ndarray],
    tol: float | tuple[float, float] | None,
    qtol: int,
) -> None:
    from litekiln.model import load_model

    graph = load_model(model).main
    assert len(reference) == len(litert), (
        f"{op_name}: reference gave {len(reference)} outputs, LiteRT {len(litert)}"
    )
    for i, (ref, lit) in enumerate(zip(reference, litert, strict=True)):
        tensor = graph.tensors[graph.outputs[i]]
        what = f"{op_name} output {i} ({tensor.name!r})"
        ref = np.asarray(ref)
        assert ref.shape == lit.shape, f"{what}: reference shape {ref.shape}, LiteRT {lit.shape}"
        assert ref.dtype == lit.dtype, f"{what}: reference dtype {ref.dtype}, LiteRT {lit.dtype}"
        if lit.dtype.kind == "f":
            atol, rtol = (
                DEFAULT_TOL.get(lit.dtype.name, (1e-5, 1e-5))
                if tol is None
                else (tol, tol)
                if isinstance(tol, (int, float))
                else tol
            )
            np.testing.assert_allclose(
                ref,
                lit,
                rtol=rtol,
                atol=atol,
                equal_nan=True,
                err_msg=f"{what}: reference vs LiteRT (atol={atol}, rtol={rtol})",
            )
        elif lit.dtype.kind in "iu" and tensor.quantization is not None:
            steps = np.abs(ref.astype(np.int64) - lit.astype(np.int64))
            worst = int(steps.max()) if steps.size else 0
            assert worst <= qtol, (
                f"{what}: reference and LiteRT differ by up to {worst} quantization steps "
                f"(allowed {qtol}); {int((steps > qtol).sum())} of {steps.size} elements; "
                f"first at {np.unravel_index(int(steps.argmax()), steps.shape)}"
            )
        else:
            mismatch = ref != lit
            assert not mismatch.any(), (
                f"{what}: {int(mismatch.sum())} of {mismatch.size} elements differ; first at "
                f"{np.unravel_index(int(mismatch.argmax()), mismatch.shape)}: reference "
                f"{ref[mismatch][0]!r}, LiteRT {lit[mismatch][0]!r}"
            )
