"""The compiled model: what the compiler produces and the runtime loads (no TVM here).

A :class:`CompiledModel` is plain data: the execution plan (GPU partitions and CPU ops in
order), one :class:`~litekiln.artifact.program.GpuProgram` per partition and the constant arrays
the programs upload. Most constants are the model's weights: for those it also holds a
:class:`~litekiln.artifact.weights.WeightRecipe` each, which rebuilds the array from the model
(:mod:`litekiln.artifact.weights`), so that the cache stores only the other constants. It
serialises to a JSON manifest plus raw little-endian arrays (no pickle) for the cache, and the
runtime needs nothing else from the compiler.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from litekiln.artifact.program import GpuProgram
from litekiln.artifact.weights import WeightRecipe, rebuild_weights
from litekiln.model.ir import Model

#: 2: weight recipes (constants rebuilt from the model), the model file's size.
ARTIFACT_FORMAT = 2


@dataclass(frozen=True)
class CompileOptions:
    """Everything that changes the compiled program (all of it goes into the cache key).

    Attributes:
        precision: "fp32" or "fp16".
        allow_quantized: delegate the quantized versions of GPU ops (float view).
        quant_simulation: insert quantization simulators after quantized ops.
        max_partitions: most GPU partitions to delegate (0: no cap).
        min_partition_ops: smallest partition worth delegating (0: decided by cost, the
            partitioner's measured round trip).
        op_table: "extended" (every op and version litekiln's GPU path implements) or
            "documented" (the TFLite GPU documentation's table and version limits).
        target: the code-generation target ("opencl").
        half: for fp16, "native" half kernels, or "emulated" (fp32 kernels rounding every
            value to fp16) for devices without half arithmetic; chosen by the runtime.
        schedules: kernel schedules: "fast" (GPUs), "fast-cpu" (CPU OpenCL such as PoCL) or
            "default" (TVM dlight's generic rules); the runtime picks by device type unless
            set explicitly (argument or LITEKILN_SCHEDULES).
        tuning: with "fast" schedules, also emit alternative schedules of the heavy kernels
            (`GpuProgram.variants`) for the runtime to time on the device at first load.
        preserve_all_tensors: every tensor an op computes is a partition output, kept after
            each inference (LiteRT's ``experimental_preserve_all_tensors``: for inspection;
            costs memory and fusion across the kept tensors).
        fp16_budget: fp16 only: the largest error (relative to max(1, max|output|)) that the
            compiler's simulation of half storage may show on its calibration inputs; tensors
            whose rounding costs most are kept in float32 until it holds
            (litekiln/compiler/precision.py). ``None``: every tensor in half, unchecked.
    """

    precision: str = "fp32"
    allow_quantized: bool = True
    quant_simulation: bool = True
    max_partitions: int = 0
    min_partition_ops: int = 0
    op_table: str = "extended"
    target: str = "opencl"
    half: str = "native"
    schedules: str = "fast"
    tuning: bool = True
    preserve_all_tensors: bool = False
    fp16_budget: float | None = 2.5e-3

    def __post_init__(self) -> None:
        if self.fp16_budget is not None and not (0.0 < float(self.fp16_budget) < 1.0):
            raise ValueError(f"fp16_budget must be in (0, 1) or None, got {self.fp16_budget!r}")
        if self.precision not in ("fp32", "fp16"):
            raise ValueError(f"precision must be 'fp32' or 'fp16', got {self.precision!r}")
        if self.schedules not in ("fast", "fast-cpu", "default"):
            raise ValueError(
                f"schedules must be 'fast', 'fast-cpu' or 'default', got {self.schedules!r}"
            )
        if self.half not in ("native", "emulated"):
            raise ValueError(f"half must be 'native' or 'emulated', got {self.half!r}")
        if self.op_table not in ("documented", "extended"):
            raise ValueError(f"op_table must be 'documented' or 'extended', got {self.op_table!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompileOptions:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass
class PartitionArtifact:
    """One compiled GPU partition: its graph boundary and its program."""

    index: int
    ops: list[int]
    inputs: list[int]
    outputs: list[int]
    program: GpuProgram


@dataclass
class CompiledModel:
    """A compiled model, ready for the runtime.

    Attributes:
        token: the model token it was compiled from.
        model_name: display name.
        options: the compile options.
        steps: execution plan, ``[("gpu", partition) | ("cpu", op index), ...]``.
        partitions: compiled partitions.
        constants: constant name -> array, for all partitions. A compiled model read from
            the cache holds only the constants without a recipe until `bind_weights`.
        cpu_reasons: op index -> why it runs on the CPU.
        versions: litekiln version, compiler source hash, TVM version.
        stats: compile timings and counts (informative only).
        weights: constant name -> how to rebuild it from the model (the constants that are
            model tensors by a few numpy steps).
        weights_digest: sha256 of the tensors the recipes read (`weights_digest`), checked
            when the model's token is not a fingerprint of its bytes.
        model_bytes: size of the model file it was compiled from.
    """

    token: str
    model_name: str
    options: CompileOptions
    steps: list[tuple[str, int]]
    partitions: list[PartitionArtifact]
    constants: dict[str, np.ndarray]
    cpu_reasons: dict[int, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    weights: dict[str, WeightRecipe] = field(default_factory=dict)
    weights_digest: str = ""
    model_bytes: int = 0

    def stored_constants(self) -> dict[str, np.ndarray]:
        """The constants a cache entry must hold: those without a recipe."""
        return {n: a for n, a in self.constants.items() if n not in self.weights}

    def missing_constants(self) -> list[str]:
        """Names of the constants the programs upload that are not in `constants` yet."""
        return [
            name
            for p in self.partitions
            for name in p.program.constants.values()
            if name not in self.constants
        ]

    def bind_weights(self, model: Model) -> None:
        """Rebuild the recipes' constants from ``model`` into `constants`.

        The tensors' shapes and types are always checked; their values too (against
        `weights_digest`) when ``model``'s token is not the fingerprint of its bytes, since
        then the token does not vouch for them.

        Raises:
            WeightMismatch: ``model`` is not the model this was compiled from.
        """
        if not self.weights:
            return
        digest = None if model.fingerprinted else self.weights_digest
        self.constants.update(rebuild_weights(self.weights, model.main, digest))

    def manifest(self) -> dict[str, Any]:
        """JSON-able description of everything but the constant arrays."""
        return {
            "format": ARTIFACT_FORMAT,
            "token": self.token,
            "model_name": self.model_name,
            "options": self.options.to_dict(),
            "steps": [list(s) for s in self.steps],
            "partitions": [
                {
                    "index": p.index,
                    "ops": p.ops,
                    "inputs": p.inputs,
                    "outputs": p.outputs,
                    "program": p.program.to_dict(),
                }
                for p in self.partitions
            ],
            "cpu_reasons": {str(k): v for k, v in self.cpu_reasons.items()},
            "versions": self.versions,
            "stats": self.stats,
            "weights": {
                "digest": self.weights_digest,
                "recipes": {n: r.to_json() for n, r in self.weights.items()},
            },
            "model_bytes": self.model_bytes,
        }

    def split_texts(self) -> tuple[dict[str, Any], list[str], list[str]]:
        """`manifest`, with each program's texts taken out (what a reader needs to know of
        them left in their place, `GpuProgram.text_facts`), and the texts: each partition's
        OpenCL C and PTX (``""`` where it has none). The cache stores the three apart
        (`litekiln.cache.models`); the compiler's variant budget measures them as it will."""
        manifest = self.manifest()
        sources, ptx = [], []
        for p, part in zip(manifest["partitions"], self.partitions, strict=True):
            sources.append(p["program"].pop("source"))
            ptx.append(p["program"].pop("ptx", ""))
            p["program"]["texts"] = part.program.text_facts()
        return manifest, sources, ptx

    @classmethod
    def from_manifest(cls, m: dict[str, Any], constants: dict[str, np.ndarray]) -> CompiledModel:
        """Rebuild from :meth:`manifest` output and the constant arrays (those with a recipe
        come with `bind_weights`).

        Raises:
            ValueError: the manifest is of another format or malformed.
        """
        if m.get("format") != ARTIFACT_FORMAT:
            raise ValueError(f"artifact format {m.get('format')!r}, expected {ARTIFACT_FORMAT}")
        parts = [
            PartitionArtifact(
                index=int(p["index"]),
                ops=[int(i) for i in p["ops"]],
                inputs=[int(i) for i in p["inputs"]],
                outputs=[int(i) for i in p["outputs"]],
                program=GpuProgram.from_dict(p["program"]),
            )
            for p in m["partitions"]
        ]
        weights = m.get("weights", {})
        return cls(
            token=str(m["token"]),
            model_name=str(m.get("model_name", "")),
            options=CompileOptions.from_dict(m["options"]),
            steps=[(str(k), int(i)) for k, i in m["steps"]],
            partitions=parts,
            constants=constants,
            cpu_reasons={int(k): str(v) for k, v in m.get("cpu_reasons", {}).items()},
            versions=dict(m.get("versions", {})),
            stats=dict(m.get("stats", {})),
            weights={
                str(n): WeightRecipe.from_json(r) for n, r in weights.get("recipes", {}).items()
            },
            weights_digest=str(weights.get("digest", "")),
            model_bytes=int(m.get("model_bytes", 0)),
        )
