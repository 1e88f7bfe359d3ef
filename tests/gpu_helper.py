"""Run small op cases on the GPU path (OpenCL) and compare them with the reference and LiteRT.

PoCL compiles slowly (TVM build ~0.5-2 s per partition, plus PoCL's kernel JIT on the first
launch), so cases are *batched*: every case of a :class:`Batch` gets its own graph inputs,
constants, ops and graph outputs inside one model, so one compile serves them all, while each
case keeps its own inputs and outputs and so its own pass/fail. If the batch model as a whole
fails to compile or run, every case is compiled on its own to say which one is at fault.

Usage::

    BATCH = Batch("conv", [Case("k3s1", lambda g: g.op("CONV_2D", [...], [1, 8, 8, 4], {...})),
                           ...])

    @pytest.mark.parametrize("case", BATCH.ids())
    def test_conv(case):
        BATCH.check(case)

Devices: a batch runs on the device ``LITEKILN_DEVICE`` names when a case is checked, and keeps
its results per device, so the same cases run on each device the tests are parametrized over
(tests/conftest.py: PoCL and Intel's OpenCL CPU runtime in CI).

Tolerance (float outputs): ``max|gpu - ref| <= rtol * max(1, max|ref|)``, rtol = 1e-4 (the
session's validate-mode tolerance): both sides compute in float32, so the only differences
are summation order in reductions (convs, FC, pooling, softmax, mean: at most a few hundred
terms of |x| <= ~10, i.e. ~1e-6 relative) and the OpenCL vs libm transcendental functions
(exp, tanh, sigmoid: a few ulp). 1e-4 leaves two orders of magnitude of headroom over that
and still catches every indexing, padding, layout or broadcasting mistake, whose errors are
of the order of the data (inputs are in [-1, 1] unless a case says otherwise). Scaling by
``max(1, max|ref|)`` makes the bound relative for large outputs and absolute for small ones.
Quantized (integer) outputs: at most ``qtol`` quantization steps (default 1: the float view
rounds once, where the reference rounds in its own place). Bool outputs: exact.
"""

from __future__ import annotations

import contextlib
import os
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tflite_builder import ModelBuilder, Quant, TensorRef, numpy_dtype

RTOL = 1e-4

#: "batch/case@device" -> (op names, max|gpu - ref|, max|gpu - litert| or None, unit) of every
#: checked case
MAX_ERRORS: dict[str, tuple[str, float, float | None, str]] = {}


class G:
    """What a case's ``build`` sees: adds inputs, constants and ops to the batch model, with
    names prefixed by the case id, and random data from the batch's seeded generator."""

    def __init__(self, b: ModelBuilder, rng: np.random.Generator, prefix: str) -> None:
        self.b = b
        self.rng = rng
        self.prefix = prefix
        self.ranges: dict[int, tuple[float, float]] = {}  # input index -> (low, high)

    def x(
        self,
        shape: Sequence[int],
        dtype: Any = "float32",
        *,
        quant: Any = None,
        low: float | None = None,
        high: float | None = None,
    ) -> TensorRef:
        """A graph input (random data in [low, high], default [-1, 1]; integers over their
        whole range, or in [low, high) where both are given)."""
        ref = self.b.input(f"{self.prefix}/x", list(shape), dtype, quant=quant)
        if low is not None and high is not None:
            self.ranges[ref.index] = (low, high)
        return ref

    def w(
        self,
        shape_or_data: Sequence[int] | np.ndarray,
        dtype: Any = "float32",
        *,
        quant: Any = None,
        low: float = -1.0,
        high: float = 1.0,
    ) -> TensorRef:
        """A constant: the given array, or random data of that shape in [low, high]."""
        if isinstance(shape_or_data, np.ndarray):
            data = shape_or_data
        else:
            data = self.rng.uniform(low, high, list(shape_or_data)).astype(np.float32)
            if quant is not None:
                data = Quant.of(quant).quantize(data, dtype)  # type: ignore[union-attr]
        return self.b.const(f"{self.prefix}/w", data, dtype, quant=quant)

    def ints(self, values: Sequence[Any], dtype: str = "int32") -> TensorRef:
        return self.b.const(f"{self.prefix}/i", np.asarray(values, numpy_dtype(dtype)), dtype)

    def op(
        self,
        name: str,
        inputs: Sequence[Any],
        shape: Sequence[int],
        options: dict[str, Any] | None = None,
        *,
        version: int = 1,
        dtype: Any = None,
        quant: Any = None,
    ) -> TensorRef:
        out = self.b.tensor(
            f"{self.prefix}/{name.lower()}", list(shape), dtype or _first_dtype(inputs), quant=quant
        )
        self.b.op(name, list(inputs), outputs=[out], options=options, version=version)
        return out


def _first_dtype(inputs: Sequence[Any]) -> str:
    for t in inputs:
        if isinstance(t, TensorRef):
            return t.dtype
    return "float32"


@dataclass
class Case:
    """One op case: ``build(g)`` returns the tensor(s) to check (graph outputs)."""

    id: str
    build: Callable[[G], TensorRef | Sequence[TensorRef]]
    litert: bool = True  # LiteRT runs this case too
    rtol: float = RTOL
    qtol: int = 1


@dataclass
class _Built:
    model: bytes
    feeds: list[np.ndarray]
    # case id -> (positions in the graph outputs, op indices, op names)
    where: dict[str, tuple[list[int], list[int], list[str]]] = field(default_factory=dict)


@dataclass
class _Result:
    gpu: list[np.ndarray]
    ref: list[np.ndarray]
    cpu_reasons: dict[int, str]
    quant: list[Quant | None]


def build_model(cases: Sequence[Case], seed: int = 0) -> _Built:
    """One model holding every case side by side (no tensor shared between cases).

    Each case draws its constants and inputs from its own generator (seeded by the case id),
    so a case gets the same data whichever batch it is built in.
    """
    b = ModelBuilder()
    built = _Built(b"", [])
    for case in cases:
        rng = np.random.default_rng([seed, zlib.crc32(case.id.encode())])
        g = G(b, rng, case.id)
        n_ops, n_out, n_in = len(b.main.ops), len(b.main.outputs), len(b.main.inputs)
        outs = case.build(g)
        outs = [outs] if isinstance(outs, TensorRef) else list(outs)
        b.output(*outs)
        ops = list(range(n_ops, len(b.main.ops)))
        names = sorted({_op_name(b, i) for i in ops})
        built.where[case.id] = (list(range(n_out, len(b.main.outputs))), ops, names)
        for t in b.main.inputs[n_in:]:
            tensor = b.main.tensors[t]
            dt = numpy_dtype(tensor.dtype)
            lo, hi = g.ranges.get(t, (-1.0, 1.0))
            if dt == np.bool_:
                built.feeds.append(rng.random(tensor.shape) < 0.5)
            elif dt.kind == "f":
                built.feeds.append(rng.uniform(lo, hi, tensor.shape).astype(dt))
            elif t in g.ranges:  # (indices: in [low, high))
                built.feeds.append(rng.integers(int(lo), int(hi), tensor.shape).astype(dt))
            else:
                info = np.iinfo(dt)
                built.feeds.append(
                    rng.integers(info.min, info.max, tensor.shape, endpoint=True).astype(dt)
                )
    built.model = b.build()
    return built


def _op_name(b: ModelBuilder, i: int) -> str:
    from tflite.utils import BUILTIN_OPCODE2NAME

    code, custom, _ = b.main.ops[i].opcode
    return custom or BUILTIN_OPCODE2NAME[code]


@contextlib.contextmanager
def force_gpu(names: Sequence[str]) -> Iterator[None]:
    """Let the partitioner delegate ``names`` (ops that have an emitter but are outside the
    GPU op tables), so that their emitters can be tested."""
    import pytest

    from litekiln.compiler import partition as part_mod

    original = part_mod.gpu_reason

    def patched(op: Any, graph: Any, **kw: Any) -> str | None:
        return None if op.name in names else original(op, graph, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(part_mod, "gpu_reason", patched)
        yield


def run_model(built: _Built, op_table: str, forced: Sequence[str]) -> _Result:
    import litekiln
    from litekiln.artifact.compiled import CompileOptions
    from litekiln.compiler.driver import plan_partitions
    from litekiln.model import load_model

    model = load_model(built.model)
    with force_gpu(forced):
        plan = plan_partitions(model, CompileOptions(op_table=op_table))
        it = litekiln.Interpreter(model_content=built.model, use_cache=False, op_table=op_table)
        it.allocate_tensors()
    gpu = it.run(built.feeds)
    ref = litekiln.Interpreter(model_content=built.model, device="reference").run(built.feeds)
    g = model.main
    quant = [
        g.tensors[t].quantization if g.tensors[t].dtype.kind in "iu" else None for t in g.outputs
    ]
    # The compiled plan too: a partition the compiler could not lower or build runs on the
    # CPU op by op (compiler/driver.py's fallback), which the partition plan does not show.
    compiled = it._backend.compiled  # type: ignore[union-attr]
    reasons = {**plan.cpu_reasons, **compiled.cpu_reasons}
    return _Result(list(gpu), list(ref), reasons, quant)  # type: ignore[arg-type]


def run_litert_cases(cases: Sequence[Case], seed: int) -> dict[str, list[np.ndarray]]:
    """LiteRT's outputs of the cases it runs (a model of those cases alone, same data)."""
    from oplib import run_litert

    cases = [c for c in cases if c.litert]
    if not cases:
        return {}
    built = build_model(cases, seed)
    outs = run_litert(built.model, built.feeds)
    return {c.id: [outs[k] for k in built.where[c.id][0]] for c in cases}


class Batch:
    """Cases compiled together; results are computed once per device, on first use there."""

    def __init__(
        self,
        name: str,
        cases: Sequence[Case],
        *,
        op_table: str = "extended",
        forced: Sequence[str] = (),
        seed: int = 0,
    ) -> None:
        self.name = name
        self.cases = {c.id: c for c in cases}
        assert len(self.cases) == len(cases), f"{name}: duplicate case ids"
        self.op_table = op_table
        self.forced = tuple(forced)
        self.seed = seed
        # device choice (LITEKILN_DEVICE) -> case id -> its GPU result or the failure
        self._results: dict[
            str, dict[str, tuple[_Result, list[int], list[int], list[str]] | BaseException]
        ] = {}
        self._litert: dict[str, list[np.ndarray] | BaseException] | None = None

    def ids(self) -> list[str]:
        return list(self.cases)

    def _run_litert(self) -> dict[str, list[np.ndarray] | BaseException]:
        cases = list(self.cases.values())
        out: dict[str, list[np.ndarray] | BaseException] = {}
        try:
            out.update(run_litert_cases(cases, self.seed))
        except Exception:  # noqa: BLE001 - find the case LiteRT refuses
            for c in cases:
                try:
                    out.update(run_litert_cases([c], self.seed))
                except Exception as exc:  # noqa: BLE001
                    out[c.id] = exc
        return out

    def _run(self) -> dict[str, tuple[_Result, list[int], list[int], list[str]] | BaseException]:
        """Every case's GPU result on the current device."""
        cases = list(self.cases.values())
        results: dict[str, tuple[_Result, list[int], list[int], list[str]] | BaseException] = {}
        try:
            built = build_model(cases, self.seed)
            res = run_model(built, self.op_table, self.forced)
            for c in cases:
                results[c.id] = (res, *built.where[c.id])
            return results
        except Exception:  # noqa: BLE001 - find the culprit case by case
            pass
        for c in cases:
            try:
                built = build_model([c], self.seed)
                res = run_model(built, self.op_table, self.forced)
                results[c.id] = (res, *built.where[c.id])
            except Exception as exc:  # noqa: BLE001
                results[c.id] = exc
        return results

    def check(self, case_id: str) -> None:
        """Assert the case ran entirely on the GPU and matches the reference (and LiteRT), on
        the device LITEKILN_DEVICE names."""
        if self._litert is None:
            self._litert = self._run_litert()
        device = os.environ.get("LITEKILN_DEVICE", "")
        if device not in self._results:
            self._results[device] = self._run()
        got = self._results[device][case_id]
        if isinstance(got, BaseException):
            raise AssertionError(
                f"{self.name}/{case_id}: GPU path failed on device {device or 'default'}: "
                f"{type(got).__name__}: {got}"
            ) from got
        res, positions, ops, names = got
        case = self.cases[case_id]
        on_cpu = {i: r for i, r in res.cpu_reasons.items() if i in ops}
        assert not on_cpu, (
            f"{case_id}: ops left on the CPU (the test would compare nothing): {on_cpu}"
        )
        lit_outs = self._litert.get(case_id)
        if isinstance(lit_outs, BaseException):
            raise AssertionError(f"{self.name}/{case_id}: LiteRT failed: {lit_outs}") from lit_outs
        worst_ref, worst_lit, unit = 0.0, None, "abs"
        for j, k in enumerate(positions):
            gpu, ref = np.asarray(res.gpu[k]), np.asarray(res.ref[k])
            lit = None if lit_outs is None else np.asarray(lit_outs[j])
            what = f"{case_id} output {j}"
            assert gpu.shape == ref.shape, f"{what}: GPU shape {gpu.shape}, reference {ref.shape}"
            assert gpu.dtype == ref.dtype, f"{what}: GPU dtype {gpu.dtype}, reference {ref.dtype}"
            if lit is not None:
                assert lit.shape == ref.shape, (
                    f"{what}: LiteRT shape {lit.shape}, reference {ref.shape}"
                )
            q = res.quant[k]
            if gpu.dtype == np.bool_ or (q is None and gpu.dtype.kind in "iu"):
                kind = "booleans" if gpu.dtype == np.bool_ else "integers"
                for other, name in [(ref, "reference"), (lit, "LiteRT")]:
                    if other is not None:
                        if name == "LiteRT":
                            worst_lit = 0.0
                        bad = int((gpu != other).sum())
                        assert bad == 0, f"{what}: {bad} of {gpu.size} {kind} differ from {name}"
                continue
            if q is not None:
                unit = "steps"
                steps = _err(gpu.astype(np.int64), ref.astype(np.int64))
                worst_ref = max(worst_ref, steps)
                assert steps <= case.qtol, (
                    f"{what}: GPU differs from the reference by {steps:g} quantization steps "
                    f"(allowed {case.qtol})"
                )
                if lit is not None:
                    s_lit = _err(gpu.astype(np.int64), lit.astype(np.int64))
                    worst_lit = max(worst_lit or 0.0, s_lit)
                    # The reference itself may be one step off LiteRT's fixed-point rounding.
                    assert s_lit <= case.qtol + 1, (
                        f"{what}: GPU differs from LiteRT by {s_lit:g} quantization steps "
                        f"(allowed {case.qtol + 1})"
                    )
                continue
            tol = case.rtol * max(1.0, float(np.abs(ref).max()) if ref.size else 1.0)
            err = _err(gpu, ref)
            worst_ref = max(worst_ref, err)
            assert err <= tol, (
                f"{what}: max|gpu - ref| = {err:.3g} > {tol:.3g}; first bad element at "
                f"{_first_bad(gpu, ref, tol)}"
            )
            if lit is not None:
                e_lit = _err(gpu, lit)
                worst_lit = max(worst_lit or 0.0, e_lit)
                assert e_lit <= tol, f"{what}: max|gpu - litert| = {e_lit:.3g} > {tol:.3g}"
        key = f"{self.name}/{case_id}@{_device_id(device)}"
        MAX_ERRORS[key] = ("+".join(names), worst_ref, worst_lit, unit)
        _dump_errors()


def _device_id(choice: str) -> str:
    """The device's test id (its driver family, tests/conftest.py), else the choice itself."""
    from conftest import DEVICES

    return next((d.id for d in DEVICES if d.choice == choice), choice or "default")


def _err(a: np.ndarray, b: np.ndarray) -> float:
    if a.size == 0:
        return 0.0
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())


def _first_bad(a: np.ndarray, b: np.ndarray, tol: float) -> str:
    bad = np.abs(a.astype(np.float64) - b.astype(np.float64)) > tol
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    return f"{idx}: gpu {a[idx]!r}, ref {b[idx]!r} ({int(bad.sum())} of {a.size} elements bad)"


def _dump_errors() -> None:
    """With $LITEKILN_GPU_ERRORS set, keep a table of the per-case max errors there."""
    path = os.environ.get("LITEKILN_GPU_ERRORS")
    if not path:
        return
    with open(path, "w") as f:
        for k, (names, e_ref, e_lit, unit) in sorted(MAX_ERRORS.items()):
            lit = "-" if e_lit is None else f"{e_lit:.3g}"
            f.write(f"{k}\t{names}\t{e_ref:.3g}\t{lit}\t{unit}\n")


def run_uncached(
    model: bytes, feeds: Sequence[np.ndarray], schedules: str, precision: str = "fp32"
) -> list[np.ndarray]:
    """``model`` run once on the default OpenCL device, compiled with ``schedules`` and
    ``precision`` and no cache."""
    import litekiln

    it = litekiln.Interpreter(
        model_content=model, use_cache=False, schedules=schedules, precision=precision
    )
    it.allocate_tensors()
    return list(it.run(list(feeds)))


def launched_kernels(model: bytes, schedules: str, precision: str = "fp32") -> list[str]:
    """The kernels ``model`` launches, in order, compiled with ``schedules`` (tuning off);
    the model must run whole on the GPU."""
    from litekiln.artifact.compiled import CompileOptions
    from litekiln.compiler.driver import compile_model
    from litekiln.model import load_model

    options = CompileOptions(schedules=schedules, precision=precision, tuning=False)
    compiled = compile_model(load_model(model), options, warn=False)
    assert not compiled.cpu_reasons, compiled.cpu_reasons
    return [la.func for p in compiled.partitions for la in p.program.launches]


def planned(build: Callable[[G], Any]) -> tuple[Any, Any]:
    """The model of one case ``build`` (loaded) and its partition plan (default options)."""
    from litekiln.artifact.compiled import CompileOptions
    from litekiln.compiler.driver import plan_partitions
    from litekiln.model import load_model

    model = load_model(build_model([Case("c", build)]).model)
    return model, plan_partitions(model, CompileOptions())


def rules_of_first_partition(build: Callable[[G], Any], schedules: str) -> list[str]:
    """The rules of ``schedules`` (``fast``: the GPU profile, else the CPU one) that schedule
    the functions of case ``build``'s first partition, lowered with the default options."""
    from test_schedules import rules_used

    from litekiln.compiler.lower import lower_partition

    model, plan = planned(build)
    mod = lower_partition(model.main, plan.partitions[0])
    return list(rules_used(mod, "gpu" if schedules == "fast" else "cpu").values())


def assert_matches_reference(
    data: bytes, precision: str, cache_dir: Any, rng: np.random.Generator
) -> None:
    """A whole model on the GPU path (the cache ``cache_dir``) against the numpy reference on
    the same random inputs in [-1, 1): every output of the same shape, within 1e-5 (fp32) or
    1e-2 (fp16) of the largest reference value (at least 1)."""
    import litekiln
    from litekiln.model import load_model

    model = load_model(data)
    xs = [
        rng.uniform(-1, 1, t.shape).astype(np.float32)
        for t in (model.main.tensors[i] for i in model.main.inputs)
    ]
    want = litekiln.Interpreter(model_content=data, device="reference").run(xs)
    got = litekiln.Interpreter(model_content=data, precision=precision, cache_dir=cache_dir).run(xs)
    tol = 1e-5 if precision == "fp32" else 1e-2
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=tol * max(1.0, float(np.abs(w).max())), rtol=0)
