"""Plain-data description of one compiled GPU partition (`GpuProgram`).

This is the on-disk format the cache stores and the only thing the runtime reads about a
compiled partition.  It must stay importable without TVM (numpy only, and numpy only for the
dtype helpers), JSON-serializable and free of pickle.

Model
-----
Every tensor the partition touches lives in a *storage* (one OpenCL buffer) at a byte offset:

* ``role="input"``: one storage per partition parameter, written by ``set_input`` (or bound to
  a buffer of another partition);
* ``role="constant"``: one storage per constant, uploaded once at load;
* ``role="workspace"``: storages of the static memory plan; several intermediates share one
  storage over time (TVM's ``StaticPlanBlockMemory``), the plan is final and needs no runtime
  bookkeeping because the launch order is fixed.

Views (``reshape`` lowered to ``vm.builtin.reshape``) are simply more tensors on the same
storage and offset, so aliasing needs no special op.  An output can be an input or a constant
(or a view of one); it is then the same tensor id.

Launches reference tensors by id; scalars carry their OpenCL C type so the executor can pack
them once.  Sizes are static: ``global_size[i] = blocks[i] * local_size[i]`` per axis,
axis 0 = ``x`` (``get_group_id(0)`` / ``get_local_id(0)`` in TVM's OpenCL codegen).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

#: The comment line before each function of a program's OpenCL C (TVM's code generator writes
#: it, the minifier keeps it): how a program is cut to some of its kernels (`kernels_only`).
FUNCTION_MARKER = "// Function: "

#: Bump whenever the JSON layout or the meaning of a field changes; readers reject other
#: versions (the cache treats that as a miss and recompiles). 3: each launch's FLOPs.
FORMAT_VERSION = 3


@functools.cache
def _itemsize(dtype: str) -> int:
    """Bytes per element of a numpy dtype name (TypeError for a name numpy does not know)."""
    return int(np.dtype(dtype).itemsize)


StorageRole = Literal["input", "constant", "workspace"]
_STORAGE_ROLES = ("input", "constant", "workspace")

#: Every clBuildProgram option the compiler may write into a program (today: none; the code
#: relies on exact IEEE float semantics). A stored program with any other option is refused,
#: whatever its checksums say: options reach the driver's compiler as they are.
BUILD_OPTIONS: frozenset[str] = frozenset()

#: OpenCL C scalar types a launch may pass by value, with their numpy equivalent.
SCALAR_TYPES: dict[str, str] = {
    "char": "int8",
    "uchar": "uint8",
    "short": "int16",
    "ushort": "uint16",
    "int": "int32",
    "uint": "uint32",
    "long": "int64",
    "ulong": "uint64",
    "half": "float16",
    "float": "float32",
    "double": "float64",
}


class ProgramFormatError(ValueError):
    """A serialized `GpuProgram` is malformed or of another format version."""


@dataclass(frozen=True)
class StorageSpec:
    """One device buffer.

    Attributes:
        id: Storage id, unique within the program.
        nbytes: Size in bytes (>= every tensor placed in it).
        role: ``"input"``, ``"constant"`` or ``"workspace"`` (see module docstring).
    """

    id: int
    nbytes: int
    role: StorageRole = "workspace"


@dataclass(frozen=True)
class TensorSpec:
    """A typed, shaped view of a storage.

    Attributes:
        id: Tensor id, unique within the program.
        storage: Id of the storage holding the bytes.
        offset: Byte offset inside the storage.
        shape: Static shape.
        dtype: numpy dtype name (``"float32"``...).
        name: Name of the Relax variable it came from (debugging only).
    """

    id: int
    storage: int
    offset: int
    shape: tuple[int, ...]
    dtype: str
    name: str = ""

    @property
    def nbytes(self) -> int:
        """Size of the tensor in bytes."""
        return math.prod(self.shape) * _itemsize(self.dtype)


@dataclass(frozen=True)
class BufferArg:
    """Kernel argument: the device buffer of tensor ``tensor``."""

    tensor: int


@dataclass(frozen=True)
class ScalarArg:
    """Kernel argument passed by value.

    Attributes:
        value: The value (int or float).
        ctype: OpenCL C type name, one of `SCALAR_TYPES`.
    """

    value: int | float
    ctype: str


KernelArg = BufferArg | ScalarArg


@dataclass(frozen=True)
class Launch:
    """One ``clEnqueueNDRangeKernel``.

    Attributes:
        kernel: Kernel name in `GpuProgram.source`.
        args: Arguments in kernel-signature order.
        global_size: NDRange global size (work-items per axis, axis 0 first).
        local_size: Work-group size per axis (same length as ``global_size``).
        func: Name of the Relax-level PrimFunc that issued the launch (debugging only).
        flops: Floating-point operations of the launch's share of its PrimFunc's work, as
            the compiler counted them before scheduling (a multiply-add is 2; 0: unknown or
            none). For reports (`litekiln bench --profile`'s roofline), never used to run.
    """

    kernel: str
    args: tuple[KernelArg, ...]
    global_size: tuple[int, ...]
    local_size: tuple[int, ...]
    func: str = ""
    flops: int = 0


@dataclass(frozen=True)
class Variant:
    """Alternative schedules of one PrimFunc call, to be timed on the device (tuning).

    Attributes:
        start: Index of the call's first launch in `GpuProgram.launches` (the default
            schedule, option 0).
        stop: One past its last launch.
        options: The other schedules' launches (options 1..n), each replacing
            ``launches[start:stop]`` as a whole; they read and write the same tensors.
        func: The PrimFunc (for reports).
    """

    start: int
    stop: int
    options: tuple[tuple[Launch, ...], ...]
    func: str = ""


class _DeferredText:
    """A text field of `GpuProgram` that may be read on first use (`GpuProgram.defer_texts`).

    A warm start runs the stored device binary and never reads the OpenCL C (several MB of
    text for a model with tuning variants: its decompression and JSON decoding were most of a
    cache read); a first start on a device reads it to build. Assigning a string (the
    dataclass's ``__init__`` does) sets the text; reading a deferred one calls its loader
    once. Installed on the class after the dataclass is made (`_install`), so that the
    dataclass sees plain fields.
    """

    def __init__(self, default: str = "") -> None:
        self.default = default

    @classmethod
    def install(cls, owner: type, name: str) -> None:
        descriptor = cls()
        descriptor.__set_name__(owner, name)
        setattr(owner, name, descriptor)

    def __set_name__(self, owner: type, name: str) -> None:
        self.text = f"_{name}_text"
        self.loader = f"_{name}_loader"

    def __get__(self, obj: Any, _owner: type | None = None) -> Any:
        if obj is None:
            return self
        d = obj.__dict__
        text = d.get(self.text)
        if text is None:
            load = d.get(self.loader)
            text = load() if load is not None else self.default
            d[self.text], d[self.loader] = text, None
        return text

    def __set__(self, obj: Any, value: str) -> None:
        obj.__dict__[self.text] = value
        obj.__dict__[self.loader] = None
        if self.text == "_source_text":
            obj.__dict__.pop("_known", None)  # facts of the stored source no longer hold


@dataclass
class GpuProgram:
    """Everything needed to run one GPU partition, as plain data.

    Attributes:
        source: OpenCL C source of all kernels.
        build_options: Options for ``clBuildProgram``.
        kernels: Names of the kernels that `launches` use (each launched at least once).
        storages: Device buffers to allocate.
        tensors: Typed views of the storages.
        constants: Tensor id -> constant name; the arrays travel separately
            (``dict[name, np.ndarray]``) so the cache can store them raw.
        inputs: Tensor ids of the partition's parameters, in order.
        outputs: Tensor ids of the partition's results, in order.
        launches: Kernel launches in execution order (every call's default schedule).
        variants: Calls with alternative schedules, in launch order, non-overlapping; the
            runtime times them on the device once and keeps the fastest (see `Variant`).
        meta: Free-form provenance (compiler versions, target string...), not used to run.
        format_version: Layout version, see `FORMAT_VERSION`.
        ptx: The kernels of `launches` (the default schedules) as NVIDIA PTX, made by the
            compiler where a CUDA compiler was found (`litekiln.compiler.ptx`), else "": a
            first start on an NVIDIA GPU loads it through the CUDA driver instead of building
            the OpenCL C first.
    """

    source: str  # (a `_DeferredText`, set below)
    build_options: str
    kernels: list[str]
    storages: list[StorageSpec]
    tensors: list[TensorSpec]
    constants: dict[int, str]
    inputs: list[int]
    outputs: list[int]
    launches: list[Launch]
    variants: list[Variant] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    ptx: str = ""  # (a `_DeferredText`, set below)

    @property
    def uses_half(self) -> bool:
        """Whether the kernels compute in half precision (TVM enables cl_khr_fp16 for them)."""
        known = self.__dict__.get("_known")
        if known is not None:
            return bool(known["uses_half"])
        return "cl_khr_fp16" in self.source

    @property
    def source_sha256(self) -> str:
        """sha256 (hex) of `source`'s UTF-8 bytes; known without reading a deferred source."""
        known = self.__dict__.get("_known")
        if known is not None:
            return str(known["source_sha256"])
        return hashlib.sha256(self.source.encode()).hexdigest()

    def text_facts(self) -> dict[str, Any]:
        """What `defer_texts` needs to know of the texts without reading them."""
        return {"source_sha256": self.source_sha256, "uses_half": self.uses_half}

    def defer_texts(
        self,
        facts: dict[str, Any],
        source: Callable[[], str],
        ptx: Callable[[], str] | None = None,
    ) -> None:
        """Read `source` (and `ptx`) from their loaders on first use; ``facts`` (from
        `text_facts` when they were stored) answer `uses_half` and `source_sha256` until
        then. The loaders must return exactly the stored texts (the cache checks the
        source's sha256)."""
        d = self.__dict__
        d["_source_text"], d["_source_loader"] = None, source
        if ptx is not None:
            d["_ptx_text"], d["_ptx_loader"] = None, ptx
        d["_known"] = {
            "source_sha256": str(facts["source_sha256"]),
            "uses_half": bool(facts["uses_half"]),
        }

    def plan(self, choices: list[int] | None = None) -> list[Launch]:
        """The launches to run with option ``choices[i]`` for variant ``i`` (0: default).

        Raises:
            ValueError: ``choices`` does not fit `variants`.
        """
        if not choices or not any(choices):
            return list(self.launches)
        if len(choices) != len(self.variants):
            raise ValueError(f"{len(choices)} choices for {len(self.variants)} variants")
        out: list[Launch] = []
        pos = 0
        for v, c in zip(self.variants, choices, strict=True):
            if not 0 <= c <= len(v.options):
                raise ValueError(f"choice {c} for {v.func}, which has {len(v.options) + 1} options")
            out.extend(self.launches[pos : v.start])
            out.extend(self.launches[v.start : v.stop] if c == 0 else v.options[c - 1])
            pos = v.stop
        out.extend(self.launches[pos:])
        return out

    def with_variants(self, variants: list[Variant]) -> GpuProgram | None:
        """This program with only ``variants`` (some of its own, in order), its source and
        kernel list cut to the kernels it then launches; None where the source cannot be cut
        (a kernel without its `FUNCTION_MARKER`)."""
        wanted = {
            la.kernel
            for la in [*self.launches, *(x for v in variants for o in v.options for x in o)]
        }
        source = kernels_only(self.source, wanted)
        if source is None:
            return None
        return replace(
            self,
            source=source,
            kernels=[k for k in self.kernels if k in wanted],
            variants=list(variants),
        )

    def launch_bytes(self, launch: Launch) -> int:
        """Bytes of the buffers ``launch`` reads or writes: the size of each distinct tensor
        among its buffer arguments, counted once (what the kernel must move at the least when
        it touches every byte of its arguments once; a kernel that reads part of a tensor
        moves less, one that reads a tensor again from memory more).

        Raises:
            KeyError: an argument names no tensor of the program.
        """
        return buffer_bytes([launch], lambda t: self.tensor(t).nbytes)

    def all_launches(self) -> list[Launch]:
        """Every launch of every option (what the runtime prepares kernels for)."""
        return [*self.launches, *(la for v in self.variants for o in v.options for la in o)]

    # ------------------------------------------------------------------ lookups
    def tensor(self, tensor_id: int) -> TensorSpec:
        """Return the tensor with id ``tensor_id``.

        Raises:
            KeyError: No such tensor.
        """
        for t in self.tensors:
            if t.id == tensor_id:
                return t
        raise KeyError(f"no tensor {tensor_id} in program")

    def storage(self, storage_id: int) -> StorageSpec:
        """Return the storage with id ``storage_id``.

        Raises:
            KeyError: No such storage.
        """
        for s in self.storages:
            if s.id == storage_id:
                return s
        raise KeyError(f"no storage {storage_id} in program")

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Check internal consistency (ids resolve, tensors fit in their storage...).

        Raises:
            ProgramFormatError: Describing the first inconsistency found.
        """
        if self.format_version != FORMAT_VERSION:
            raise ProgramFormatError(
                f"program format version {self.format_version}, this runtime reads {FORMAT_VERSION}"
            )
        foreign = [o for o in self.build_options.split() if o not in BUILD_OPTIONS]
        if foreign:
            # Handed to clBuildProgram as they are: only what the compiler itself writes.
            raise ProgramFormatError(
                f"build options {foreign} are not ones the compiler produces "
                f"({sorted(BUILD_OPTIONS) or 'none'})"
            )
        storages = {s.id: s for s in self.storages}
        if len(storages) != len(self.storages):
            raise ProgramFormatError("duplicate storage ids")
        for s in self.storages:
            if s.role not in _STORAGE_ROLES:
                raise ProgramFormatError(f"storage {s.id}: unknown role {s.role!r}")
            if s.nbytes < 0:
                raise ProgramFormatError(f"storage {s.id}: negative size")
        tensors = {t.id: t for t in self.tensors}
        if len(tensors) != len(self.tensors):
            raise ProgramFormatError("duplicate tensor ids")
        for t in self.tensors:
            if t.storage not in storages:
                raise ProgramFormatError(f"tensor {t.id} ({t.name}): unknown storage {t.storage}")
            try:
                _itemsize(t.dtype)
            except TypeError as e:
                raise ProgramFormatError(f"tensor {t.id} ({t.name}): bad dtype {t.dtype!r}") from e
            if t.offset < 0 or t.offset + t.nbytes > storages[t.storage].nbytes:
                raise ProgramFormatError(
                    f"tensor {t.id} ({t.name}): bytes [{t.offset}, {t.offset + t.nbytes}) "
                    f"outside storage {t.storage} of {storages[t.storage].nbytes} bytes"
                )
        for tid, name in self.constants.items():
            if tid not in tensors:
                raise ProgramFormatError(f"constant {name!r}: unknown tensor {tid}")
            if storages[tensors[tid].storage].role != "constant":
                raise ProgramFormatError(f"constant {name!r}: storage role is not 'constant'")
        for kind, ids in (("input", self.inputs), ("output", self.outputs)):
            for tid in ids:
                if tid not in tensors:
                    raise ProgramFormatError(f"{kind} tensor {tid} unknown")
        for tid in self.inputs:
            if storages[tensors[tid].storage].role != "input":
                raise ProgramFormatError(f"input tensor {tid}: storage role is not 'input'")
        kernels = set(self.kernels)
        pos = 0
        for v in self.variants:
            if not pos <= v.start < v.stop <= len(self.launches) or not v.options:
                raise ProgramFormatError(
                    f"variant of {v.func}: bad launch range [{v.start}, {v.stop})"
                )
            pos = v.stop
        for i, launch in enumerate(self.all_launches()):
            if launch.kernel not in kernels:
                raise ProgramFormatError(f"launch {i}: kernel {launch.kernel!r} not listed")
            if (
                len(launch.global_size) != len(launch.local_size)
                or not 1 <= len(launch.global_size) <= 3
            ):
                raise ProgramFormatError(f"launch {i} ({launch.kernel}): bad NDRange rank")
            if launch.flops < 0:
                raise ProgramFormatError(f"launch {i} ({launch.kernel}): negative FLOPs")
            for g, loc in zip(launch.global_size, launch.local_size, strict=True):
                if loc <= 0 or g % loc:
                    raise ProgramFormatError(
                        f"launch {i} ({launch.kernel}): global {launch.global_size} "
                        f"not a multiple of local {launch.local_size}"
                    )
            for a in launch.args:
                if isinstance(a, BufferArg) and a.tensor not in tensors:
                    raise ProgramFormatError(
                        f"launch {i} ({launch.kernel}): unknown tensor {a.tensor}"
                    )
                if isinstance(a, ScalarArg) and a.ctype not in SCALAR_TYPES:
                    raise ProgramFormatError(
                        f"launch {i} ({launch.kernel}): bad scalar type {a.ctype!r}"
                    )

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (only str/int/float/list/dict)."""
        return {
            "format_version": self.format_version,
            "source": self.source,
            "build_options": self.build_options,
            "kernels": _kernels_to_json(self.kernels),
            "storages": [{"id": s.id, "nbytes": s.nbytes, "role": s.role} for s in self.storages],
            "tensors": [
                {
                    "id": t.id,
                    "storage": t.storage,
                    "offset": t.offset,
                    "shape": list(t.shape),
                    "dtype": t.dtype,
                    **({"name": t.name} if t.name else {}),
                }
                for t in self.tensors
            ],
            # JSON object keys are strings: store constants as pairs to keep int ids.
            "constants": [[tid, name] for tid, name in self.constants.items()],
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "launches": [_launch_to_dict(la) for la in self.launches],
            "variants": [
                {
                    "start": v.start,
                    "stop": v.stop,
                    "func": v.func,
                    "options": [
                        [
                            _option_to_dict(
                                la, self.launches[v.start + i] if v.start + i < v.stop else None
                            )
                            for i, la in enumerate(o)
                        ]
                        for o in v.options
                    ],
                }
                for v in self.variants
            ],
            "meta": self.meta,
            **({"ptx": self.ptx} if self.ptx else {}),
        }

    def to_json(self, *, indent: int | None = None) -> str:
        """Serialize to JSON text.

        Args:
            indent: Passed to `json.dumps` (None: compact).

        Returns:
            The JSON document; `from_json` inverts it exactly.
        """
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GpuProgram:
        """Inverse of `to_dict`.

        Raises:
            ProgramFormatError: Wrong format version, missing field or inconsistent content.
        """
        version = d.get("format_version")
        if version != FORMAT_VERSION:
            raise ProgramFormatError(
                f"program format version {version!r}, this runtime reads {FORMAT_VERSION}"
            )
        try:
            launches = [_launch_from_dict(la) for la in d["launches"]]
            variants = [
                Variant(
                    int(v["start"]),
                    int(v["stop"]),
                    tuple(
                        tuple(
                            _launch_from_dict(
                                _option_from_dict(la, d["launches"], int(v["start"]) + i, v["stop"])
                            )
                            for i, la in enumerate(o)
                        )
                        for o in v["options"]
                    ),
                    str(v.get("func", "")),
                )
                for v in d.get("variants", [])
            ]
            prog = cls(
                source=d["source"],
                build_options=d["build_options"],
                kernels=_kernels_from_json(d["kernels"]),
                storages=[
                    StorageSpec(int(s["id"]), int(s["nbytes"]), s["role"]) for s in d["storages"]
                ],
                tensors=[
                    TensorSpec(
                        id=int(t["id"]),
                        storage=int(t["storage"]),
                        offset=int(t["offset"]),
                        shape=tuple(int(x) for x in t["shape"]),
                        dtype=t["dtype"],
                        name=t.get("name", ""),
                    )
                    for t in d["tensors"]
                ],
                constants={int(tid): str(name) for tid, name in d["constants"]},
                inputs=[int(x) for x in d["inputs"]],
                outputs=[int(x) for x in d["outputs"]],
                launches=launches,
                variants=variants,
                meta=dict(d.get("meta", {})),
                format_version=int(version),
                ptx=str(d.get("ptx", "")),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ProgramFormatError(f"malformed program: {e!r}") from e
        prog.validate()
        return prog

    @classmethod
    def from_json(cls, text: str | bytes) -> GpuProgram:
        """Parse a document written by `to_json`.

        Args:
            text: The JSON document.

        Returns:
            The program, validated.

        Raises:
            ProgramFormatError: Not JSON, wrong format version or inconsistent content.
        """
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ProgramFormatError(f"program is not valid JSON: {e}") from e
        if not isinstance(d, dict):
            raise ProgramFormatError("program JSON is not an object")
        return cls.from_dict(d)


_DeferredText.install(GpuProgram, "source")
_DeferredText.install(GpuProgram, "ptx")


def _launch_to_dict(launch: Launch) -> dict[str, Any]:
    return {
        "kernel": launch.kernel,
        "func": launch.func,
        "args": [
            {"buffer": a.tensor}
            if isinstance(a, BufferArg)
            else {"scalar": a.value, "type": a.ctype}
            for a in launch.args
        ],
        "global_size": list(launch.global_size),
        "local_size": list(launch.local_size),
        "flops": launch.flops,
    }


def kernels_only(source: str, names: Collection[str]) -> str | None:
    """``source`` (a program's OpenCL C) without the kernels whose names are not in ``names``
    (functions that are not kernels stay), or None where one of ``names`` has no function
    marked by `FUNCTION_MARKER` in it."""
    marker = "\n" + FUNCTION_MARKER
    head, *parts = ("\n" + source).split(marker)  # (it may start with a marker)
    kept, found = [], set()
    for part in parts:
        name = part.split("\n", 1)[0].strip()
        if "__kernel" in part and name not in names:
            continue
        found.add(name)
        kept.append(part)
    if not set(names) <= found:
        return None
    return marker.join([head, *kept])[1:]


def buffer_bytes(launches: Iterable[Launch], nbytes: Callable[[int], int]) -> int:
    """Bytes of the distinct tensors ``launches`` take as buffer arguments, each counted
    once (``nbytes``: a tensor id's size)."""
    ids = {a.tensor for la in launches for a in la.args if isinstance(a, BufferArg)}
    return sum(nbytes(t) for t in sorted(ids))


def _kernels_to_json(kernels: list[str]) -> list[str] | int:
    """The kernel names, or their count where they are the minified ``k0``... ``k<n-1>``
    in sorted order (`litekiln.compiler.minify`)."""
    if kernels == _minified_names(len(kernels)):
        return len(kernels)
    return list(kernels)


def _kernels_from_json(value: Any) -> list[str]:
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"a program of {value} kernels")
        return _minified_names(value)
    return [str(k) for k in value]


def _minified_names(n: int) -> list[str]:
    return sorted(f"k{i}" for i in range(n))


def _option_to_dict(launch: Launch, default: Launch | None) -> dict[str, Any]:
    """A variant option's launch, without the PrimFunc name and arguments where they are
    those of the default launch at the same place (nearly always: the options of a call
    read and write its tensors; the manifest shrinks by a fifth, issue 16)."""
    d = _launch_to_dict(launch)
    if default is not None and launch.func == default.func and launch.args == default.args:
        del d["func"], d["args"]
    return d


def _option_from_dict(
    d: dict[str, Any], launches: list[Any], index: int, stop: Any
) -> dict[str, Any]:
    """Inverse of `_option_to_dict`: the missing fields from the default launch's record."""
    if "args" in d and "func" in d:
        return d
    if index >= int(stop):
        raise ValueError(f"variant option {d.get('kernel')!r} has no default launch to share")
    default = launches[index]
    return {"func": default.get("func", ""), "args": default.get("args"), **d}


def _launch_from_dict(d: dict[str, Any]) -> Launch:
    args: list[KernelArg] = []
    for a in d["args"]:
        if "buffer" in a:
            args.append(BufferArg(int(a["buffer"])))
        else:
            args.append(ScalarArg(a["scalar"], str(a["type"])))
    return Launch(
        kernel=d["kernel"],
        args=tuple(args),
        global_size=tuple(int(x) for x in d["global_size"]),
        local_size=tuple(int(x) for x in d["local_size"]),
        func=d.get("func", ""),
        flops=int(d["flops"]),
    )
