"""The compiler driver: model IR -> partitions -> Relax -> OpenCL -> :class:`CompiledModel`."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from litekiln.compiler.partition import PartitionPlan, partition
from litekiln.errors import CompileError
from litekiln.model.ir import Model
from litekiln.runtime.artifact import (
    CompiledModel,
    CompileOptions,
    PartitionArtifact,
    compiler_hash,
    litekiln_version,
    tvm_version,
)

Progress = Callable[[int, int, str], None]


def plan_partitions(model: Model, options: CompileOptions) -> PartitionPlan:
    """Partition the model's primary subgraph under ``options`` (no TVM needed)."""
    return partition(
        model.main,
        allow_quantized=options.allow_quantized,
        max_partitions=options.max_partitions,
        min_partition_ops=options.min_partition_ops,
        extended_table=options.op_table == "extended",
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

    Raises:
        CompileError: a partition cannot be lowered or code-generated.
    """
    from litekiln.compiler.codegen import CodegenError, compile_relax_full
    from litekiln.compiler.lower import LowerOptions, lower_partition

    options = options or CompileOptions()
    t0 = time.perf_counter()
    plan = plan_partitions(model, options)
    if warn:
        plan.print_warnings()
    timings: dict[str, float] = {"partition": time.perf_counter() - t0}
    fp16_plan = None
    fp32_tensors: frozenset[int] = frozenset()
    if options.precision == "fp16" and options.fp16_budget is not None and plan.partitions:
        from litekiln.compiler.precision import plan_fp16_storage

        t = time.perf_counter()
        fp16_plan = plan_fp16_storage(
            model.main,
            plan.partitions,
            budget=float(options.fp16_budget),
            log=(lambda m: print(f"litekiln: {m}", file=sys.stderr)) if warn else None,
        )
        fp32_tensors = fp16_plan.fp32_tensors
        timings["fp16_guard"] = time.perf_counter() - t
        if warn and fp32_tensors:
            print(
                f"litekiln: fp16: {len(fp32_tensors)} of {fp16_plan.candidates} tensors kept in "
                f"float32 storage (simulated error {fp16_plan.error_all_half:.2e} all-half, "
                f"{fp16_plan.error:.2e} now; budget {fp16_plan.budget:.1e})",
                file=sys.stderr,
            )
    lower_opts = LowerOptions(
        precision=options.precision,
        quant_simulation=options.quant_simulation,
        half=options.half,
        fp32_tensors=fp32_tensors,
    )
    partitions: list[PartitionArtifact] = []
    constants = {}
    total = len(plan.partitions)
    for p in plan.partitions:
        label = f"partition {p.index + 1}/{total} ({len(p.ops)} ops)"
        if progress:
            progress(p.index, total, label)
        t = time.perf_counter()
        mod = lower_partition(model.main, p, lower_opts)
        timings["lower"] = timings.get("lower", 0.0) + time.perf_counter() - t
        try:
            result = compile_relax_full(
                mod,
                target=_target(options),
                schedules=options.schedules,
                variant_rules=_variant_rules(options),
            )
        except CodegenError as exc:
            raise CompileError(f"{model.name}: {label}: {exc}") from None
        for k, v in result.timings.items():
            timings[k] = timings.get(k, 0.0) + v
        prefix = f"p{p.index}."
        program = result.program
        program.constants = {tid: prefix + name for tid, name in program.constants.items()}
        constants.update({prefix + k: v for k, v in result.constants.items()})
        partitions.append(PartitionArtifact(p.index, p.ops, p.inputs, p.outputs, program))
    if progress:
        progress(total, total, "done")
    timings["total"] = time.perf_counter() - t0
    steps = [
        ("gpu", s.partition) if s.kind == "gpu" else ("cpu", s.op)
        for s in plan.steps  # type: ignore[misc]
    ]
    return CompiledModel(
        token=model.token,
        model_name=model.name,
        options=options,
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
            "timings_s": {k: round(v, 4) for k, v in timings.items()},
            "gpu_ops": plan.gpu_op_count,
            "cpu_ops": plan.cpu_op_count,
            "kernels": sum(len(p.program.launches) for p in partitions),
            **({"fp16": fp16_plan.summary()} if fp16_plan is not None else {}),
        },
    )


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
