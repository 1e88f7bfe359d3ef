"""What runs where: a model's partition plan under the options an app would use, as data.

`litekiln inspect` prints it; anything that draws or checks placement reads the same dict.
Needs no device and no TVM (the partitioner is plain Python).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from litekiln import config
from litekiln.artifact.compiled import CompileOptions
from litekiln.cache.models import ModelCache
from litekiln.compiler.driver import plan_partitions
from litekiln.compiler.partition import PartitionPlan
from litekiln.loading import schedules_for, split_options
from litekiln.model import Model
from litekiln.model.ir import Tensor

_COMPILE_KEYS = ("op_table", "max_partitions", "allow_quantized", "min_partition_ops")


def placement(
    model: Model, *, precision: str | None = None, **options: Any
) -> tuple[dict[str, Any], PartitionPlan]:
    """The model's inputs, outputs, op histogram, partitions and every op's place and reason.

    Args:
        model: the loaded model.
        precision: "fp32" or "fp16" (default: ``LITEKILN_PRECISION``).
        options: compile options that change placement (``op_table``, ``max_partitions``,
            ``allow_quantized``, ``min_partition_ops``); unset ones come from the environment,
            as for `litekiln.Interpreter`.

    Returns:
        The description (JSON-able) and the partition plan it was made from.
    """
    compile_kw = {k: v for k, v in options.items() if k in _COMPILE_KEYS}
    copts, _ = split_options(compile_kw, config.PRECISION.get(precision))
    plan = plan_partitions(model, copts)
    g = model.main
    info = {
        "token": model.token,
        "schema_version": model.version,
        "options": copts.to_dict(),
        "inputs": [_tensor(g.tensors[t]) for t in g.inputs],
        "outputs": [_tensor(g.tensors[t]) for t in g.outputs],
        "op_histogram": model.op_histogram(),
        "partitions": [
            {"index": p.index, "ops": len(p.ops), "inputs": p.inputs, "outputs": p.outputs}
            for p in plan.partitions
        ],
        "gpu_ops": plan.gpu_op_count,
        "cpu_ops": plan.cpu_op_count,
        "ops": _ops(model, plan),
    }
    return info, plan


def cached_kernels(
    model: Model, info: dict[str, Any], *, cache_dir: str | None, device: str | None
) -> int | None:
    """Kernels of the model's cached compilation for ``device``'s schedules, or None."""
    copts = CompileOptions.from_dict(info["options"])
    copts = dataclasses.replace(copts, schedules=schedules_for(device))
    compiled = ModelCache.open(cache_dir).load_model(model.token, copts)
    return None if compiled is None else compiled.stats.get("kernels")


def _tensor(t: Tensor) -> dict[str, Any]:
    return {"index": t.index, "name": t.name, "shape": list(t.shape), "dtype": t.dtype.name}


def _ops(model: Model, plan: PartitionPlan) -> list[dict[str, Any]]:
    owner = {i: p.index for p in plan.partitions for i in p.ops}
    return [
        {
            "index": op.index,
            "op": op.name,
            "code": op.code,
            "version": op.version,
            "custom_code": op.custom_code,
            "where": "folded"
            if op.folded
            else (f"gpu:{owner[op.index]}" if op.index in owner else "cpu"),
            "reason": plan.cpu_reasons.get(op.index, ""),
            "inputs": op.inputs,
            "outputs": op.outputs,
        }
        for op in model.main.ops
    ]
