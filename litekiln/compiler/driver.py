"""The compiler driver: model IR -> partitions -> Relax -> OpenCL -> :class:`CompiledModel`."""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from litekiln.artifact.compiled import CompiledModel, CompileOptions, PartitionArtifact
from litekiln.artifact.versions import compiler_hash, litekiln_version, tvm_version
from litekiln.compiler.partition import Partition, PartitionPlan, partition
from litekiln.model.ir import Model

if TYPE_CHECKING:  # lower imports TVM, precision the numpy reference: loaded when compiling
    from litekiln.compiler.codegen import CompileResult
    from litekiln.compiler.lower import LowerOptions
    from litekiln.compiler.precision import Fp16Plan

Progress = Callable[[int, int, str], None]


def plan_partitions(model: Model, options: CompileOptions) -> PartitionPlan:
    """Partition the model's primary subgraph under ``options`` (no TVM needed)."""
    return partition(
        model.main,
        allow_quantized=options.allow_quantized,
        max_partitions=options.max_partitions,
        min_partition_ops=options.min_partition_ops,
        extended_table=options.op_table == "extended",
        keep_all_outputs=options.preserve_all_tensors,
    )


def compile_model(
    model: Model,
    options: CompileOptions | None = None,
    *,
    progress: Progress | None = None,
    warn: bool = True,
) -> CompiledModel:
    """Compile every GPU partition of a model.

    Args:
        model: the loaded model.
        options: compile options (precision, op table, partition limits...).
        progress: called as ``progress(done, total, label)`` while partitions compile.
        warn: print the TFLite-style op warnings and the placement summary to stderr.

    Returns:
        The compiled model (plain data; the runtime loads it without TVM).

    A partition that cannot be lowered, or whose code generation fails with every schedule of
    the fallback chain (`SCHEDULE_CHAIN`), runs on the CPU instead: the compiler warns, op by
    op, with the reason, and never fails the model for it.
    """
    _import_tvm_side()
    run = _Compilation(model, options or CompileOptions(), progress, warn)
    plan = run.partition()
    fp16_plan = run.plan_fp16(plan)
    partitions, constants, failed = run.compile_partitions(plan, fp16_plan)
    if failed:
        plan, partitions = run.demote(plan, partitions, failed)
    partitions = run.trim_variants(partitions, plan, constants, fp16_plan)
    return run.artifact(plan, partitions, constants, fp16_plan)


#: The schedules a partition's code generation tries, in order: the options' own (litekiln's
#: rules for the device family), dlight's generic rules, and dlight's fallback rule alone.
SCHEDULE_CHAIN = ("dlight's generic rules", "a plain safe schedule")
_CHAIN_NAMES = {"dlight's generic rules": "default", "a plain safe schedule": "safe"}


def _import_tvm_side() -> None:
    # TVM loads (seconds) before the clock starts, so the timings are the compiler's own; and a
    # missing TVM fails here, before any warning is printed, partitions or not.
    importlib.import_module("litekiln.compiler.codegen")
    importlib.import_module("litekiln.compiler.lower")


class _Compilation:
    """One `compile_model` call: its steps, in order, share the model, options and timings."""

    def __init__(
        self, model: Model, options: CompileOptions, progress: Progress | None, warn: bool
    ) -> None:
        self.model = model
        self.options = options
        self.progress = progress
        self.warn = warn
        self.t0 = time.perf_counter()
        # Phase -> seconds, in the order the phases first ran (the manifest keeps that order).
        self.timings: dict[str, float] = {}
        self.variants_trimmed = 0
        #: Merged convolutions' weights (`Lowering.merged_weights`), for the weight tracer.
        self.merged: list[Any] = []
        #: Of them, the stacked weights of sibling convolutions (`Lowering.sibling_weights`).
        self.siblings: list[Any] = []
        #: The weights' recipes and digest (`_weights`), made once: the variants' budget
        #: measures an artifact without variants before the one stored.
        self._traced: tuple[dict[str, Any], Any, str] | None = None

    def partition(self) -> PartitionPlan:
        """Split the model into GPU partitions and CPU ops (and say so, when warning)."""
        plan = plan_partitions(self.model, self.options)
        if self.warn:
            plan.print_warnings()
        self.timings["partition"] = time.perf_counter() - self.t0
        return plan

    def plan_fp16(self, plan: PartitionPlan) -> Fp16Plan | None:
        """The fp16 error guard: which tensors stay in float32 storage (fp16 with a budget)."""
        options = self.options
        if options.precision != "fp16" or options.fp16_budget is None or not plan.partitions:
            return None
        from litekiln.compiler.precision import plan_fp16_storage

        t = time.perf_counter()
        fp16_plan = plan_fp16_storage(
            self.model.main,
            plan.partitions,
            budget=float(options.fp16_budget),
            log=(lambda m: print(f"litekiln: {m}", file=sys.stderr)) if self.warn else None,
        )
        self.timings["fp16_guard"] = time.perf_counter() - t
        if self.warn and fp16_plan.fp32_tensors:
            print(
                f"litekiln: fp16: {len(fp16_plan.fp32_tensors)} of {fp16_plan.candidates} "
                f"tensors kept in float32 storage (simulated error "
                f"{fp16_plan.error_all_half:.2e} all-half, {fp16_plan.error:.2e} now; "
                f"budget {fp16_plan.budget:.1e})",
                file=sys.stderr,
            )
        return fp16_plan

    def compile_partitions(
        self, plan: PartitionPlan, fp16_plan: Fp16Plan | None
    ) -> tuple[list[PartitionArtifact], dict[str, np.ndarray], dict[int, str]]:
        """Lower and code-generate each GPU partition, reporting progress.

        Returns:
            The compiled partitions, their constants (named ``p<index>.<name>``), and the
            partitions that could not be compiled (index -> why).
        """
        from litekiln.compiler.lower import LowerOptions

        lower_opts = LowerOptions(
            precision=self.options.precision,
            quant_simulation=self.options.quant_simulation,
            half=self.options.half,
            fp32_tensors=fp16_plan.fp32_tensors if fp16_plan is not None else frozenset(),
        )
        partitions: list[PartitionArtifact] = []
        constants: dict[str, np.ndarray] = {}
        failed: dict[int, str] = {}
        total = len(plan.partitions)
        for p in plan.partitions:
            label = f"partition {p.index + 1}/{total} ({len(p.ops)} ops)"
            if self.progress:
                self.progress(p.index, total, label)
            compiled = self.compile_partition(p, lower_opts, label)
            if isinstance(compiled, str):
                failed[p.index] = compiled
                continue
            partitions.append(compiled[0])
            constants.update(compiled[1])
        if self.progress:
            self.progress(total, total, "done")
        return partitions, constants, failed

    def demote(
        self, plan: PartitionPlan, partitions: list[PartitionArtifact], failed: dict[int, str]
    ) -> tuple[PartitionPlan, list[PartitionArtifact]]:
        """Give the partitions that failed to the CPU, renumber the others, and say so."""
        new_plan = plan.without(failed)
        renumbered = [replace(a, index=k) for k, a in enumerate(partitions)]
        if self.warn:
            print("litekiln: some partitions run on the CPU after all:", file=sys.stderr)
            new_plan.print_warnings()
        return new_plan, renumbered

    def compile_partition(
        self, p: Partition, lower_opts: LowerOptions, label: str
    ) -> tuple[PartitionArtifact, dict[str, np.ndarray]] | str:
        """One GPU partition: our IR -> Relax -> OpenCL; its constants renamed ``p<index>.``.

        Returns:
            The partition and its constants, or why it cannot run on the GPU: it could not be
            lowered, or its code generation failed with every schedule of the chain.
        """
        mod = self._lower(p, lower_opts, label)
        if isinstance(mod, str):
            return mod
        result = self._generate_fused(p, mod, lower_opts, label)
        if isinstance(result, str):
            return result
        if self.warn:
            for note in result.notes:
                print(f"litekiln: {self.model.name}: {label}: {note}", file=sys.stderr)
        for k, v in result.timings.items():
            self._add_time(k, v)
        # Every partition names its constants from const_0: prefix them to keep them apart.
        prefix = f"p{p.index}."
        program = result.program
        program.constants = {tid: prefix + name for tid, name in program.constants.items()}
        constants = {prefix + k: v for k, v in result.constants.items()}
        return PartitionArtifact(p.index, p.ops, p.inputs, p.outputs, program), constants

    def _lower(self, p: Partition, lower_opts: LowerOptions, label: str) -> Any:
        """The partition's Relax module, or why it cannot be lowered. A lowering with fused
        patterns (layer norms, per-channel scales) that fails is tried again op by op, with a
        warning."""
        from litekiln.compiler.lower import lower_partition

        t = time.perf_counter()
        try:
            return lower_partition(self.model.main, p, lower_opts, self.merged, self.siblings)
        except Exception as exc:  # noqa: BLE001 - any failure moves the partition to the CPU
            if not lower_opts.fuses:
                return f"the compiler could not lower it ({_why(exc)})"
            self._say(f"{label}: lowering with fused patterns failed ({_why(exc)})")
        finally:
            self._add_time("lower", time.perf_counter() - t)
        return self._lower(p, lower_opts.unfused(), label)

    def _generate_fused(
        self, p: Partition, mod: Any, lower_opts: LowerOptions, label: str
    ) -> CompileResult | str:
        """`_generate`, except that a module with fused layer norms (compiler/layer_norm.py),
        fused attentions (compiler/attention.py), recurrent steps (compiler/gated_step.py)
        or folded convolutions
        (`lowering.conv_folded`) whose code generation fails with the options' schedules is
        lowered again op by op (with a warning saying why) before the fallback schedules."""
        from litekiln.compiler import attention, gated_step
        from litekiln.compiler.codegen import compile_relax_full
        from litekiln.compiler.layer_norm import PRIMFUNC_NAME
        from litekiln.compiler.lowering import FOLDED_CONV_NAMES

        fused = any(
            name in gv.name_hint
            for gv in mod.get_global_vars()
            for name in (
                PRIMFUNC_NAME,
                attention.PRIMFUNC_NAME,
                gated_step.PRIMFUNC_NAME,
                *FOLDED_CONV_NAMES,
            )  # fmt: skip
        )
        if not fused:
            return self._generate(mod, label)
        try:
            return compile_relax_full(
                mod, target=_target(self.options), schedules=self.options.schedules,
                variant_rules=_variant_rules(self.options), minify=True,
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - the op-by-op form is the fallback
            self._say(f"{label}: code generation with fused patterns failed ({_why(exc)})")
        unfused = self._lower(p, lower_opts.unfused(), label)
        return unfused if isinstance(unfused, str) else self._generate(unfused, label)

    def _say(self, what: str) -> None:
        if self.warn:
            print(
                f"litekiln: {self.model.name}: {what}; lowering them op by op",
                file=sys.stderr,
            )

    def _generate(self, mod: Any, label: str) -> CompileResult | str:
        """Code generation along the schedule chain: the options' schedules, then the
        fallbacks; the result of the first that works, or why none did."""
        from litekiln.compiler.codegen import compile_relax_full

        attempts = [(self.options.schedules, _variant_rules(self.options))] + [
            (_CHAIN_NAMES[name], []) for name in SCHEDULE_CHAIN
        ]
        errors: list[str] = []
        for schedules, variants in attempts:
            try:
                return compile_relax_full(
                    mod, target=_target(self.options), schedules=schedules,
                    variant_rules=variants, minify=True,
                )  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - a failed schedule falls back, never crashes
                errors.append(f"{schedules}: {_why(exc)}")
                if self.warn:
                    print(
                        f"litekiln: {self.model.name}: {label}: code generation with the "
                        f"'{schedules}' schedules failed ({_why(exc)}); trying the next",
                        file=sys.stderr,
                    )
        return "code generation failed with every schedule (" + "; ".join(errors) + ")"

    def trim_variants(
        self,
        partitions: list[PartitionArtifact],
        plan: PartitionPlan,
        constants: dict[str, np.ndarray],
        fp16_plan: Fp16Plan | None,
    ) -> list[PartitionArtifact]:
        """The partitions with their tuning variants within the cache budget
        (`litekiln.compiler.budget`; what the entry takes without them is measured on the
        compiled model without them, where the budget needs it)."""
        from litekiln.compiler.budget import trim_variants

        def unvaried(without: list[PartitionArtifact]) -> CompiledModel:
            return self.artifact(plan, without, constants, fp16_plan)

        t = time.perf_counter()
        partitions, self.variants_trimmed = trim_variants(partitions, self.model.nbytes, unvaried)
        self.timings["variant_budget"] = time.perf_counter() - t
        return partitions

    def artifact(
        self,
        plan: PartitionPlan,
        partitions: list[PartitionArtifact],
        constants: dict[str, np.ndarray],
        fp16_plan: Fp16Plan | None,
    ) -> CompiledModel:
        """The compiled model: execution plan, programs, constants (with the recipes that
        rebuild the model's weights among them), versions and stats."""
        recipes, digest = self._weights(constants)
        siblings = set(self.siblings)
        self.timings["total"] = time.perf_counter() - self.t0
        steps = [("gpu", s.partition) if s.kind == "gpu" else ("cpu", s.op) for s in plan.steps]
        return CompiledModel(
            token=self.model.token,
            model_name=self.model.name,
            options=self.options,
            steps=steps,  # type: ignore[arg-type]
            partitions=partitions,
            constants=constants,
            cpu_reasons=plan.cpu_reasons,
            versions={
                "litekiln": litekiln_version(),
                "compiler": compiler_hash(),
                "tvm": tvm_version() or "",
            },
            stats={
                "timings_s": {k: round(v, 4) for k, v in self.timings.items()},
                "gpu_ops": plan.gpu_op_count,
                "cpu_ops": plan.cpu_op_count,
                "kernels": sum(len(p.program.launches) for p in partitions),
                "variants": sum(len(p.program.variants) for p in partitions),
                "variants_trimmed": self.variants_trimmed,
                # sums of parallel convolutions compiled as one (compiler/branch_merge.py)
                "merged_convolutions": sum(
                    r.merge is not None and r.merge not in siblings for r in recipes.values()
                ),
                # groups of sibling convolutions compiled as one (compiler/sibling_merge.py)
                "sibling_merges": sum(r.merge in siblings for r in recipes.values()),
                **({"fp16": fp16_plan.summary()} if fp16_plan is not None else {}),
            },
            weights=recipes,
            weights_digest=digest,
            model_bytes=self.model.nbytes,
        )

    def _weights(self, constants: dict[str, np.ndarray]) -> tuple[Any, str]:
        """The recipes that rebuild the model's weights among ``constants``, and their
        digest: traced once per set of constants (they do not depend on the variants)."""
        from litekiln.artifact.weights import weights_digest
        from litekiln.compiler.weights import trace_weights

        if self._traced is None or self._traced[0] is not constants:
            t = time.perf_counter()
            recipes = trace_weights(self.model.main, constants, self.merged)
            sources = (t for r in recipes.values() for t in r.tensors)
            digest = weights_digest(self.model.main, sources)
            self.timings["weights"] = time.perf_counter() - t
            self._traced = (constants, recipes, digest)
        return self._traced[1], self._traced[2]

    def _add_time(self, phase: str, seconds: float) -> None:
        self.timings[phase] = self.timings.get(phase, 0.0) + seconds


def _why(exc: BaseException) -> str:
    """An exception in one line: its type and the first line of its message."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first[:200]}" if first else type(exc).__name__


def _variant_rules(options: CompileOptions) -> list[object]:
    """Alternative schedules to emit for on-device tuning (GPU profile only)."""
    if not options.tuning or options.schedules != "fast":
        return []
    from litekiln.compiler.schedules import variant_rules

    return variant_rules("gpu")


def _target(options: CompileOptions) -> dict[str, object]:
    # TVM's default OpenCL target caps work-groups at 256 threads, which every OpenCL device we
    # target (PoCL, NVIDIA) accepts; fast schedules raise it per device family later.
    return {"kind": options.target}


def stderr_progress(done: int, total: int, label: str) -> None:
    """A one-line progress bar on stderr (only when stderr is a terminal)."""
    if not sys.stderr.isatty() or total == 0:
        return
    width = 30
    filled = int(width * done / total)
    end = "\n" if done >= total else ""
    print(
        f"\r  compiling [{'#' * filled}{'.' * (width - filled)}] {label:<40}",
        end=end,
        file=sys.stderr,
        flush=True,
    )
