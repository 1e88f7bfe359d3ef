"""TVM Relax -> OpenCL code generator: produces a plain-data `GpuProgram`.

Pipeline (one GPU partition):

1. Relax pipeline (`build_relax_pipeline`): legalize, fuse, schedule (dlight by default; the
   ``schedule`` hook is where our own schedules plug in), lower dataflow and plan memory
   statically.  Afterwards ``mod["main"]`` is a straight-line list of
   ``relax.vm.alloc_storage`` / ``relax.vm.alloc_tensor`` / PrimFunc calls (destination-passing
   style: the outputs are the trailing arguments) / ``vm.builtin.reshape`` views.
2. TIR lowering of the PrimFuncs that ``main`` calls, with TVM's own TIR pipeline.  We capture
   the module right after ``SplitHostDevice``: there each host PrimFunc is a few
   ``DeclBuffer`` statements plus ``T.call_ffi_kernel("<f>_kernel", ptrs..., scalars...,
   extents..., launch_params=[...])``, i.e. the kernel argument order and the static NDRange.
3. OpenCL C: the device part of the fully lowered module goes through TVM's OpenCL codegen
   (``target.build.opencl``) and ``inspect_source()``.
4. FLOPs: each launch records its PrimFunc's floating-point work (`Launch.flops`, for the
   roofline of ``litekiln bench --profile``), counted by TVM's estimator on the function as
   FuseTIR left it, before scheduling (`_func_flops`).

We deliberately do not call ``tvm.compile``: it would also compile the host side with LLVM
(work we throw away, since our runtime replaces TVM's VM and host code) and the PyPI wheel
cannot run OpenCL anyway.  We run the same passes ``tvm.tirx.build`` runs, minus host codegen.

Memory: TVM's ``StaticPlanBlockMemory`` reuses whole storages and places every tensor at byte
offset 0 (true for everything we have seen in 0.27).  We keep offsets in the program anyway;
the executor turns a non-zero offset into an OpenCL sub-buffer (which must respect
``CL_DEVICE_MEM_BASE_ADDR_ALIGN``) rather than passing offsets to kernels, so generated kernels
stay untouched.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx
from tvm.ir.expr import GenericConst

from litekiln.artifact.program import (
    FORMAT_VERSION,
    SCALAR_TYPES,
    BufferArg,
    GpuProgram,
    KernelArg,
    Launch,
    ScalarArg,
    StorageSpec,
    TensorSpec,
    Variant,
    buffer_bytes,
    kernels_only,
)
from litekiln.compiler import ptx
from litekiln.compiler.defaults import fill_starved_defaults
from litekiln.compiler.dispatch import GROUP, SCALAR_BYTES, dispatch_kernels, private_bytes
from litekiln.compiler.fusion import POOL_PREFIXES, fuse_matmul_neighbours
from litekiln.compiler.gated_step import PRIMFUNC_NAME as GATED_STEP
from litekiln.compiler.literals import exact_float_literals
from litekiln.compiler.minify import MinifyError, minify_opencl, strip_ptx
from litekiln.compiler.schedules import RULE_REFUSALS

# `tvm.tirx.build` the attribute is a function: import the module by name.
_tir_build = importlib.import_module("tvm.tirx.build")

log = logging.getLogger("litekiln")

#: Options handed to clBuildProgram.  TVM's OpenCL runtime passes none either; the generated
#: code relies on exact IEEE float semantics (no -cl-fast-relaxed-math) to match the numpy
#: reference within tight tolerances.
DEFAULT_BUILD_OPTIONS = ""

# calling_conv of device kernels after SplitHostDevice (CallingConv::kDeviceKernelLaunch).
_KERNEL_LAUNCH_CONV = 2

# numpy dtype -> OpenCL C scalar type name.
_CTYPE_OF = {np_name: c for c, np_name in SCALAR_TYPES.items()}

# Relax calls that only check shapes/types at runtime (our executor checks at set_input) or
# manage lifetimes (our plan is static): nothing to do for them.
_IGNORED_PACKED = {
    "vm.builtin.check_tensor_info",
    "vm.builtin.match_shape",
    "vm.builtin.check_shape_info",
}
_IGNORED_OPS = {"relax.null_value", "relax.vm.kill_object"}


class CodegenError(RuntimeError):
    """The lowered module contains a construct this code generator cannot translate."""


SchedulePass: TypeAlias = tvm.transform.Pass


@dataclass
class CompileResult:
    """Output of `compile_relax_full`.

    Attributes:
        program: The plain-data program.
        constants: Constant name -> array (uploaded once at load).
        timings: Seconds spent per phase (``relax``, ``tir``, ``opencl_codegen``, ``total``).
        lowered: The Relax module after the Relax pipeline (for debugging; holds TVM objects).
        notes: What the compiler changed on its own for the program to build, one line each
            (a kernel whose schedule failed to compile, scheduled by another rule); the
            model compiler prints them as warnings.
    """

    program: GpuProgram
    constants: dict[str, np.ndarray]
    timings: dict[str, float] = field(default_factory=dict)
    lowered: Any = None
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- pipeline


def default_schedule() -> SchedulePass:
    """The default TIR schedule step: dlight's generic GPU rules.

    Correct everywhere, slow on real GPUs (see `litekiln.compiler.schedules`).  Replace it by
    passing ``schedule=`` to `build_relax_pipeline` / `compile_relax`.
    """
    from tvm.s_tir import dlight as dl  # local import: heavy, only needed at compile time

    from litekiln.compiler.schedules import dlight_rules

    return dl.ApplyDefaultSchedule(
        *dlight_rules("Matmul", "GEMV", "Reduction", "GeneralReduction", "Fallback")
    )


def safe_schedule() -> SchedulePass:
    """The last schedule the compiler tries before giving a partition to the CPU: dlight's
    fallback rule alone (each output element computed by one thread, loops kept serial).
    Slow, but it schedules any static loop nest the other rules may refuse or break on."""
    from tvm.s_tir import dlight as dl

    return dl.ApplyDefaultSchedule(dl.gpu.Fallback())


#: Names accepted by `schedule_named` (and by the ``LITEKILN_SCHEDULES`` setting).
SCHEDULE_NAMES = ("fast", "fast-cpu", "default")


def schedule_named(name: str | None = None) -> SchedulePass:
    """The schedule pass called ``name``.

    Args:
        name: ``"fast"`` (`litekiln.compiler.schedules.fast_schedule` for large GPUs: our
            depthwise/pooling rules, dlight's for the rest), ``"fast-cpu"`` (the same rules
            tuned for CPU OpenCL such as PoCL: serial reductions everywhere, large tiles) or
            ``"default"`` (`default_schedule`, dlight only).  ``None`` reads the
            ``LITEKILN_SCHEDULES`` setting.

    Raises:
        ValueError: an unknown name.
    """
    from litekiln.config import SCHEDULES

    name = SCHEDULES.get(name)
    if name in ("fast", "fast-cpu"):
        from litekiln.compiler.schedules import fast_schedule

        return fast_schedule("cpu" if name == "fast-cpu" else "gpu")
    if name == "default":
        return default_schedule()
    if name == "safe":  # the compiler's own last resort (driver.py), not a user setting
        return safe_schedule()
    raise ValueError(f"unknown schedules {name!r}; expected one of {', '.join(SCHEDULE_NAMES)}")


def build_relax_pipeline(
    target: tvm.target.Target, schedule: SchedulePass | None = None
) -> tvm.transform.Pass:
    """Return the Relax pipeline we compile GPU partitions with.

    It is ``tvm.relax.backend.gpu_generic.get_default_pipeline`` spelled out, so that the
    schedule step is a parameter: this is the hook for our own fast schedules.

    Args:
        target: The device target (``opencl`` with an llvm host).
        schedule: A module pass that schedules every PrimFunc (must bind threads); defaults to
            `default_schedule`.

    Returns:
        A module pass; apply it inside ``with target:``.
    """
    gpu_generic = relax.backend.gpu_generic
    schedule = schedule if schedule is not None else default_schedule()
    passes = (
        gpu_generic.library_dispatch_passes(target)
        + [
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            isolate_pools(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            fuse_matmul_neighbours(),
            relax.transform.FuseTIR(),
            schedule,
        ]
        + gpu_generic.dataflow_lower_passes(target)
        + gpu_generic.finalize_passes(target)
    )
    return tvm.transform.Sequential(passes, name="litekiln_relax_gpu")


def isolate_pools() -> tvm.transform.Pass:
    """Mark pooling PrimFuncs (`fusion.POOL_PREFIXES`) opaque, so that FuseOps fuses
    nothing into them.

    FuseOps puts an injective consumer such as BlazeFace's channel pad (pool, then pad the
    channels to add the block's wider output) into the pool's kernel. That kernel's epilogue
    writes another shape than the pool, which our serial-reduction rule cannot tile, and
    dlight's cross-thread reduction takes 0.25-0.55 ms for it on the H100 (the whole model
    takes 0.7 ms). Alone, the pool is a few microseconds, and the pad fuses into the kernel
    that reads it (the next block's residual add). (Marked out-elementwise-fusable, as
    convolutions are, FuseOps still fused that pad.) An elementwise consumer of the pool's
    own shape joins it after FuseOps (`fusion.fuse_matmul_neighbours`). A pool of at most
    `lowering.SMALL_POOL_TAPS` taps is no reduction (`emit_nn._small_pool`) and is not
    isolated: BlazeFace's 2x2 shortcut pool joins the convolution whose epilogue reads it.
    """

    @tvm.transform.module_pass(opt_level=0, name="litekiln.IsolatePools")
    def _pass(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        for gv, func in list(mod.functions.items()):
            if isinstance(func, tirx.PrimFunc) and gv.name_hint.startswith(POOL_PREFIXES):
                mod[gv] = func.with_attr("op_pattern", 8)
        return mod

    return _pass


TargetLike: TypeAlias = str | dict[str, Any] | tvm.target.Target


def make_target(target: TargetLike) -> tvm.target.Target:
    """Return ``target`` as a Target with an llvm host (needed by SplitHostDevice).

    Args:
        target: A kind name (``"opencl"``), a JSON-style dict (``{"kind": "opencl",
            "max_num_threads": 1024}``; TVM 0.27 rejects the old ``"opencl -key=value"``
            CLI form) or a Target.

    Returns:
        The Target, with ``host`` set to llvm unless it already had a host.
    """
    if isinstance(target, tvm.target.Target):
        return target if target.host is not None else tvm.target.Target(target, host="llvm")
    return tvm.target.Target(target, host="llvm")


# --------------------------------------------------------------------------- helpers


def _key(obj: Any) -> int:
    # Relax/TIR Vars may share names (TVM prints `storage` twice); key on object identity.
    return int(obj.__chandle__())


def _int(expr: Any, what: str) -> int:
    if isinstance(expr, int):
        return expr
    if isinstance(expr, tirx.IntImm):
        return int(expr.value)
    raise CodegenError(
        f"{what}: expected a static integer, got {type(expr).__name__} `{expr}` "
        "(dynamic shapes are not supported)"
    )


def _static_shape(shape_expr: Any, what: str) -> tuple[int, ...]:
    if isinstance(shape_expr, relax.ShapeExpr):
        return tuple(_int(v, what) for v in shape_expr.values)
    raise CodegenError(
        f"{what}: expected a static shape, got {type(shape_expr).__name__} `{shape_expr}`"
    )


def _dtype_str(x: Any) -> str:
    # GenericConst(dtype) prints as the dtype name.
    value = x.value if isinstance(x, GenericConst) else x
    return str(value)


def _tensor_type(var: Any, what: str) -> tuple[tuple[int, ...], str]:
    ty = getattr(var, "ty", None)
    if not isinstance(ty, relax.TensorType):
        raise CodegenError(f"{what}: expected a tensor, got type `{ty}`")
    if ty.shape is None:
        raise CodegenError(f"{what}: tensor of unknown shape `{ty}`")
    return _static_shape(ty.shape, what), str(ty.dtype)


# --------------------------------------------------------------------------- Relax main


@dataclass
class _Call:
    """A PrimFunc call in main (destination-passing style)."""

    func: str
    args: list[int]  # tensor ids, in PrimFunc parameter order


class _MainPlanner:
    """Walks the lowered Relax ``main`` and builds storages, tensors and the call list."""

    def __init__(self) -> None:
        self.storages: list[StorageSpec] = []
        self.tensors: list[TensorSpec] = []
        self.constants: dict[int, str] = {}
        self.constant_arrays: dict[str, np.ndarray] = {}
        self.calls: list[_Call] = []
        self.inputs: list[int] = []
        # relax var key -> tensor id | storage id | list of tensor ids (tuples)
        self._tensor_of: dict[int, int] = {}
        self._storage_of: dict[int, int] = {}
        self._tuple_of: dict[int, list[int]] = {}
        self._const_tensor: dict[int, int] = {}

    # -- creation
    def new_storage(self, nbytes: int, role: str) -> int:
        sid = len(self.storages)
        self.storages.append(StorageSpec(sid, int(nbytes), role))  # type: ignore[arg-type]
        return sid

    def new_tensor(
        self, storage: int, offset: int, shape: Sequence[int], dtype: str, name: str
    ) -> int:
        tid = len(self.tensors)
        spec = TensorSpec(tid, storage, int(offset), tuple(int(s) for s in shape), dtype, name)
        if spec.offset + spec.nbytes > self.storages[storage].nbytes:
            raise CodegenError(
                f"tensor {name} {spec.shape} {dtype} at offset {offset} overflows storage "
                f"{storage} of {self.storages[storage].nbytes} bytes"
            )
        self.tensors.append(spec)
        return tid

    def _constant(self, const: GenericConst) -> int:
        k = _key(const)
        if k in self._const_tensor:
            return self._const_tensor[k]
        value = const.value
        if not hasattr(value, "numpy"):
            raise CodegenError(
                f"constant of kind {type(value).__name__} used as a tensor: `{const}`"
            )
        arr = np.asarray(value.numpy(), order="C")  # (0-d stays 0-d: not ascontiguousarray)
        name = f"const_{len(self.constant_arrays)}"
        sid = self.new_storage(arr.nbytes, "constant")
        tid = self.new_tensor(sid, 0, arr.shape, str(arr.dtype), name)
        self.constants[tid] = name
        self.constant_arrays[name] = arr
        self._const_tensor[k] = tid
        return tid

    # -- lookups
    def tensor_arg(self, expr: Any, what: str) -> int:
        if isinstance(expr, GenericConst):
            return self._constant(expr)
        if isinstance(expr, relax.Var):
            k = _key(expr)
            if k in self._tensor_of:
                return self._tensor_of[k]
            raise CodegenError(f"{what}: `{expr.name}` is not a tensor we know (storage or tuple?)")
        raise CodegenError(f"{what}: unsupported argument {type(expr).__name__} `{expr}`")

    def flat_tensors(self, expr: Any, what: str) -> list[int]:
        """Tensor ids of a result expression (a tensor var, a tuple var or a tuple literal)."""
        if isinstance(expr, relax.Var) and _key(expr) in self._tuple_of:
            return list(self._tuple_of[_key(expr)])
        if isinstance(expr, relax.Tuple):
            out: list[int] = []
            for f in expr.fields:
                out.extend(self.flat_tensors(f, what))
            return out
        return [self.tensor_arg(expr, what)]

    # -- the walk
    def add_params(self, params: Sequence[Any]) -> None:
        for p in params:
            shape, dtype = _tensor_type(p, f"parameter {p.name}")
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            sid = self.new_storage(nbytes, "input")
            tid = self.new_tensor(sid, 0, shape, dtype, p.name)
            self._tensor_of[_key(p)] = tid
            self.inputs.append(tid)

    def add_binding(self, binding: Any, func_names: set[str]) -> None:
        if not isinstance(binding, relax.VarBinding):
            raise CodegenError(f"unsupported binding kind {type(binding).__name__} (match_cast?)")
        var, value = binding.var, binding.value
        name = var.name
        k = _key(var)
        if isinstance(value, relax.Call):
            op = value.op
            if isinstance(op, tvm.ir.Op):
                self._op_call(k, name, op.name, value)
            elif isinstance(op, relax.ExternFunc):
                self._packed_call(k, name, str(op.global_symbol), value)
            elif isinstance(op, relax.GlobalVar):
                if op.name_hint not in func_names:
                    raise CodegenError(
                        f"call to `{op.name_hint}`, which is not a TIR PrimFunc "
                        "(nested Relax functions are unsupported)"
                    )
                args = [
                    self.tensor_arg(a, f"argument {i} of {op.name_hint}")
                    for i, a in enumerate(value.args)
                ]
                self.calls.append(_Call(op.name_hint, args))
            else:
                raise CodegenError(
                    f"binding {name}: call of unsupported callee {type(op).__name__} `{op}`"
                )
        elif isinstance(value, relax.Var):  # alias
            vk = _key(value)
            if vk in self._tensor_of:
                self._tensor_of[k] = self._tensor_of[vk]
            elif vk in self._tuple_of:
                self._tuple_of[k] = self._tuple_of[vk]
            elif vk in self._storage_of:
                self._storage_of[k] = self._storage_of[vk]
            else:
                raise CodegenError(f"binding {name}: alias of unknown var {value.name}")
        elif isinstance(value, relax.Tuple):
            self._tuple_of[k] = self.flat_tensors(value, f"tuple {name}")
        elif isinstance(value, relax.TupleGetItem):
            src = value.tuple_value
            if not (isinstance(src, relax.Var) and _key(src) in self._tuple_of):
                raise CodegenError(f"binding {name}: tuple item of unsupported tuple `{src}`")
            self._tensor_of[k] = self._tuple_of[_key(src)][int(value.index)]
        elif isinstance(value, GenericConst):
            self._tensor_of[k] = self._constant(value)
        else:
            raise CodegenError(
                f"binding {name}: unsupported Relax construct {type(value).__name__}: `{value}`"
            )

    def _op_call(self, k: int, name: str, op_name: str, call: Any) -> None:
        if op_name in _IGNORED_OPS:
            return
        if op_name == "relax.vm.alloc_storage":
            size = _static_shape(call.args[0], f"alloc_storage {name}")
            dtype = _dtype_str(call.args[2])
            scope = str(call.args[3].value) if hasattr(call.args[3], "value") else str(call.args[3])
            if scope != "global":
                raise CodegenError(
                    f"alloc_storage {name}: storage scope {scope!r} (only 'global' supported)"
                )
            nbytes = int(np.prod(size, dtype=np.int64)) * np.dtype(dtype).itemsize
            self._storage_of[k] = self.new_storage(nbytes, "workspace")
            return
        if op_name == "relax.vm.alloc_tensor":
            storage = call.args[0]
            if not (isinstance(storage, relax.Var) and _key(storage) in self._storage_of):
                raise CodegenError(
                    f"alloc_tensor {name}: storage `{storage}` was not allocated by alloc_storage"
                )
            offset = _int(call.args[1], f"alloc_tensor {name} offset")
            shape = _static_shape(call.args[2], f"alloc_tensor {name}")
            dtype = _dtype_str(call.args[3])
            self._tensor_of[k] = self.new_tensor(
                self._storage_of[_key(storage)], offset, shape, dtype, name
            )
            return
        raise CodegenError(
            f"binding {name}: Relax op `{op_name}` survived lowering; no OpenCL kernel exists "
            "for it (it needs a legalization or a CPU fallback)"
        )

    def _packed_call(self, k: int, name: str, symbol: str, call: Any) -> None:
        if symbol in _IGNORED_PACKED:
            return
        if symbol == "vm.builtin.reshape":
            src = self.tensor_arg(call.args[0], f"reshape {name}")
            shape = _static_shape(call.args[1], f"reshape {name}")
            base = self.tensors[src]
            dtype = base.dtype
            view = TensorSpec(-1, base.storage, base.offset, shape, dtype, name)
            if view.nbytes != base.nbytes:
                raise CodegenError(
                    f"reshape {name}: {base.shape} -> {shape} changes the element count"
                )
            self._tensor_of[k] = self.new_tensor(base.storage, base.offset, shape, dtype, name)
            return
        raise CodegenError(
            f"binding {name}: packed function `{symbol}` has no OpenCL equivalent in litekiln"
        )


# --------------------------------------------------------------------------- TIR host side


@dataclass
class _KernelCall:
    kernel: str
    args: list[
        tuple[str, Any]
    ]  # ("param", index) | ("workspace", buffer var key) | ("scalar", (value, ctype))
    launch_params: list[str]
    extents: list[int]


def _scalar_ctype(dtype: str, what: str) -> str:
    if dtype == "bool":
        return "int"
    if dtype not in _CTYPE_OF:
        raise CodegenError(f"{what}: scalar of dtype {dtype} cannot be passed to an OpenCL kernel")
    return _CTYPE_OF[dtype]


_BINARY_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "FloorDiv": lambda a, b: a // b,
    "FloorMod": lambda a, b: a % b,
    # TIR Div/Mod on integers truncate toward zero (C semantics).
    "Div": lambda a, b: int(a / b) if isinstance(a, int) and isinstance(b, int) else a / b,
    "Mod": lambda a, b: a - b * int(a / b),
    "Min": min,
    "Max": max,
    "LT": lambda a, b: a < b,
    "LE": lambda a, b: a <= b,
    "GT": lambda a, b: a > b,
    "GE": lambda a, b: a >= b,
    "EQ": lambda a, b: a == b,
    "NE": lambda a, b: a != b,
    "And": lambda a, b: bool(a) and bool(b),
    "Or": lambda a, b: bool(a) or bool(b),
    "BitwiseAnd": lambda a, b: a & b,
    "BitwiseOr": lambda a, b: a | b,
    "BitwiseXor": lambda a, b: a ^ b,
    "LShift": lambda a, b: a << b,
    "RShift": lambda a, b: a >> b,
}
_CALL_OPS: dict[str, Callable[..., Any]] = {
    "tirx.shift_right": lambda a, b: a >> b,
    "tirx.shift_left": lambda a, b: a << b,
    "tirx.bitwise_and": lambda a, b: a & b,
    "tirx.bitwise_or": lambda a, b: a | b,
    "tirx.bitwise_xor": lambda a, b: a ^ b,
    "tirx.if_then_else": lambda c, a, b: a if c else b,
}


class _HostFuncReader:
    """Reads one host PrimFunc (after SplitHostDevice) for one call into its kernel launches.

    Host code is usually a few ``DeclBuffer`` + ``call_ffi_kernel`` statements, but library
    kernels (e.g. the GPU scan behind cumsum) are written for symbolic shapes: ``Bind``s,
    ``for`` loops over rounds, ``if``s, workspace ``AllocBuffer``s.  Because every call in a
    partition has static shapes, we bind the shape variables from the call's tensors and
    evaluate that host code here, at compile time (a tiny partial evaluator): the result is
    a flat list of launches with constant sizes and scalars.
    """

    # Host loops are unrolled into launches; beyond this many something is wrong.
    MAX_LAUNCHES = 10_000

    def __init__(
        self,
        func: Any,
        name: str,
        kernel_params: dict[str, list[tuple[str, str]]],
        arg_shapes: Sequence[tuple[int, ...]],
    ) -> None:
        self.name = name
        self.kernel_params = kernel_params
        self.param_index = {_key(p): i for i, p in enumerate(func.params)}
        self.buffer_alias: dict[int, Any] = {}  # DeclBuffer var -> source expr
        self.workspaces: dict[
            int, tuple[tuple[int, ...], str]
        ] = {}  # AllocBuffer var -> (shape, dtype)
        self.env: dict[
            int, int | float | bool
        ] = {}  # bound scalar vars (shape vars, Binds, loop vars)
        self.calls: list[_KernelCall] = []
        if len(arg_shapes) != len(func.params):
            raise CodegenError(
                f"{name}: called with {len(arg_shapes)} tensors, "
                f"PrimFunc has {len(func.params)} parameters"
            )
        for p, shape in zip(func.params, arg_shapes, strict=True):
            self._bind_shape(p, shape)
        self._visit(func.body)

    def _bind_shape(self, param: Any, shape: tuple[int, ...]) -> None:
        ty = param.ty
        dims = getattr(ty, "shape", None)
        if dims is None:
            raise CodegenError(f"{self.name}: parameter {param.name} is not a buffer ({ty})")
        if len(dims) != len(shape):
            raise CodegenError(
                f"{self.name}: parameter {param.name} has rank {len(dims)}, "
                f"argument has shape {shape}"
            )
        for d, s in zip(dims, shape, strict=True):
            if isinstance(d, tirx.Var) and _key(d) not in self.env:
                self.env[_key(d)] = int(s)
            elif self._eval(d, f"shape of {param.name}") != s:
                raise CodegenError(
                    f"{self.name}: parameter {param.name} expects shape {list(dims)}, "
                    f"argument has {shape}"
                )

    # -- expressions
    def _eval(self, expr: Any, what: str) -> Any:
        if isinstance(expr, (int, float, bool)):
            return expr
        if isinstance(expr, tirx.IntImm):
            v = int(expr.value)
            return bool(v) if str(expr.ty) == "bool" else v
        if isinstance(expr, tirx.FloatImm):
            return float(expr.value)
        if isinstance(expr, tirx.Var):
            k = _key(expr)
            if k not in self.env:
                raise CodegenError(
                    f"{self.name}: {what}: `{expr.name}` is not known at compile time "
                    "(dynamic shape?)"
                )
            return self.env[k]
        cls = type(expr).__name__
        if cls in _BINARY_OPS:
            return _BINARY_OPS[cls](self._eval(expr.a, what), self._eval(expr.b, what))
        if cls == "Not":
            return not self._eval(expr.a, what)
        if cls == "Select":
            c = self._eval(expr.condition, what)
            return self._eval(expr.true_value if c else expr.false_value, what)
        if cls == "Cast":
            v = self._eval(expr.value, what)
            dt = str(expr.ty)
            if dt.startswith("int") or dt.startswith("uint"):
                return int(v)
            if dt == "bool":
                return bool(v)
            if dt.startswith("float"):
                return float(v)
            raise CodegenError(f"{self.name}: {what}: cast to {dt}")
        if cls == "Let":
            self.env[_key(expr.var)] = self._eval(expr.value, what)
            return self._eval(expr.body, what)
        if (
            isinstance(expr, tvm.ir.Call)
            and isinstance(expr.op, tvm.ir.Op)
            and expr.op.name in _CALL_OPS
        ):
            return _CALL_OPS[expr.op.name](*(self._eval(a, what) for a in expr.args))
        raise CodegenError(f"{self.name}: {what}: cannot evaluate {cls} `{expr}` at compile time")

    # -- statements
    def _visit(self, stmt: Any) -> None:
        if stmt is None:
            return
        if isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                self._visit(s)
        elif isinstance(stmt, tirx.DeclBuffer):
            self.buffer_alias[_key(stmt.buffer)] = stmt.data
            self._visit(getattr(stmt, "body", None))
        elif isinstance(stmt, tirx.AllocBuffer):
            buf = stmt.buffer
            scope = buf.scope()
            if scope != "global":
                raise CodegenError(
                    f"{self.name}: host-side allocation of {buf.name} in scope {scope!r}"
                )
            shape = tuple(int(self._eval(s, f"workspace {buf.name} shape")) for s in buf.shape)
            self.workspaces[_key(buf)] = (shape, str(buf.dtype))
            self._visit(getattr(stmt, "body", None))
        elif isinstance(stmt, tirx.AttrStmt):
            self._visit(stmt.body)
        elif isinstance(stmt, tirx.Bind):
            try:
                self.env[_key(stmt.var)] = self._eval(stmt.value, f"let {stmt.var.name}")
            except CodegenError:
                self.env.pop(_key(stmt.var), None)  # only an error if a launch needs it
        elif isinstance(stmt, tirx.For):
            start = int(self._eval(stmt.min, "loop start"))
            extent = int(self._eval(stmt.extent, "loop extent"))
            for i in range(start, start + extent):
                self.env[_key(stmt.loop_var)] = i
                self._visit(stmt.body)
        elif isinstance(stmt, tirx.IfThenElse):
            if self._eval(stmt.condition, "if condition"):
                self._visit(stmt.then_case)
            else:
                self._visit(stmt.else_case)
        elif isinstance(stmt, tirx.AssertStmt):
            pass  # runtime argument checks; shapes were checked statically in _bind_shape
        elif isinstance(stmt, tirx.Evaluate):
            self._evaluate(stmt.value)
        else:
            raise CodegenError(
                f"{self.name}: host code contains {type(stmt).__name__}, "
                "which litekiln cannot run ahead of time"
            )

    def _evaluate(self, expr: Any) -> None:
        if isinstance(expr, tirx.IntImm):  # no-op `T.evaluate(0)`
            return
        if not isinstance(expr, tvm.ir.Call) or expr.op.name != "tirx.call_ffi_kernel":
            raise CodegenError(f"{self.name}: unsupported host statement `{expr}`")
        if len(self.calls) >= self.MAX_LAUNCHES:
            raise CodegenError(f"{self.name}: more than {self.MAX_LAUNCHES} kernel launches")
        kernel = str(expr.args[0].value)
        launch_params = [str(p) for p in expr.attrs.launch_params]
        if kernel not in self.kernel_params:
            raise CodegenError(f"{self.name}: launches unknown device kernel {kernel}")
        params = self.kernel_params[kernel]
        rest = list(expr.args[1:])
        if len(rest) != len(params) + len(launch_params):
            raise CodegenError(
                f"{self.name}: {kernel} called with {len(rest)} values, expected {len(params)} "
                f"arguments + {len(launch_params)} launch extents"
            )
        for lp in launch_params:
            if not (lp.startswith("blockIdx.") or lp.startswith("threadIdx.")):
                # e.g. "tirx.use_dyn_shared_memory": would need a __local pointer argument.
                raise CodegenError(
                    f"{self.name}: {kernel} uses launch parameter {lp!r} "
                    "(dynamic shared memory is unsupported)"
                )
        args: list[tuple[str, Any]] = []
        for (pname, pkind), value in zip(params, rest[: len(params)], strict=True):
            what = f"{kernel} argument {pname}"
            if pkind == "handle":
                args.append(self._buffer_source(value, what))
            else:
                v = self._eval(value, what)
                args.append(
                    (
                        "scalar",
                        (float(v) if pkind in ("half", "float", "double") else int(v), pkind),
                    )
                )
        extents = [int(self._eval(v, f"{kernel} launch extent")) for v in rest[len(params) :]]
        self.calls.append(_KernelCall(kernel, args, launch_params, extents))

    def _buffer_source(self, expr: Any, what: str) -> tuple[str, Any]:
        for _ in range(64):  # chains are short; the bound guards against cycles
            if isinstance(expr, tvm.ir.Call) and expr.op.name == "tirx.buffer_data":
                expr = expr.args[0]
                continue
            if isinstance(expr, tirx.Var):
                k = _key(expr)
                if k in self.param_index:
                    return ("param", self.param_index[k])
                if k in self.workspaces:
                    return ("workspace", k)
                if k in self.buffer_alias:
                    expr = self.buffer_alias[k]
                    continue
            raise CodegenError(
                f"{self.name}: {what}: cannot resolve the buffer `{expr}` "
                "to a parameter or workspace"
            )
        raise CodegenError(f"{self.name}: {what}: buffer alias chain too long")


def _kernel_params(func: Any, name: str) -> list[tuple[str, str]]:
    out = []
    for p in func.params:
        ty = p.ty
        if isinstance(ty, tvm.ir.PointerType):
            out.append((p.name, "handle"))
        elif isinstance(ty, tvm.ir.PrimType):
            out.append((p.name, _scalar_ctype(str(ty.dtype), f"kernel {name} parameter {p.name}")))
        else:
            raise CodegenError(f"kernel {name}: parameter {p.name} of unsupported type {ty}")
    return out


def _ndrange(call: _KernelCall, where: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    blocks = [1, 1, 1]
    threads = [1, 1, 1]
    axes = {"x": 0, "y": 1, "z": 2}
    rank = 1
    for lp, ext in zip(call.launch_params, call.extents, strict=True):
        kind, axis_name = lp.split(".")
        if axis_name not in axes:
            raise CodegenError(f"{where}: launch parameter {lp!r}")
        axis = axes[axis_name]
        rank = max(rank, axis + 1)
        (blocks if kind == "blockIdx" else threads)[axis] = int(ext)
    local = tuple(threads[:rank])
    global_ = tuple(b * t for b, t in zip(blocks[:rank], threads[:rank], strict=True))
    return global_, local


# --------------------------------------------------------------------------- entry points


_MAX_KERNEL_NAME = 60


def _shorten_kernel_names(
    source: str, launches: list[Launch], *, minify: bool = False
) -> tuple[str, list[Launch]]:
    """Rename kernels whose fused names grow past 60 characters (``minify``: every kernel,
    to ``k0``, ``k1``... in launch order).

    FuseOps names a kernel after every op it fused (e.g. ``fused_conv2d11_add12_tir_abs7_...``,
    300+ characters with the fp16 rounding epilogue); PoCL fails to link such kernels, and no
    driver needs them. The short name keeps a readable prefix and a unique index. A minified
    program names its kernels by index alone: the names recur in the source, the launch plan and
    the PTX (entries, parameters), and each launch's `Launch.func` still names its PrimFunc.
    """
    if minify:
        order = list(dict.fromkeys(ln.kernel for ln in launches))
        mapping = {n: f"k{i}" for i, n in enumerate(order) if n != f"k{i}"}
    else:
        long_names = sorted({ln.kernel for ln in launches if len(ln.kernel) > _MAX_KERNEL_NAME})
        mapping = {n: f"{n[:40]}_k{i}" for i, n in enumerate(long_names)}
    if not mapping:
        return source, launches
    names = sorted(mapping, key=len, reverse=True)
    pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in names) + r")\b")
    source = pattern.sub(lambda m: mapping[m.group(1)], source)
    launches = [
        dataclasses.replace(ln, kernel=mapping.get(ln.kernel, ln.kernel)) for ln in launches
    ]
    return source, launches


def compile_relax_full(
    mod: tvm.IRModule,
    *,
    target: TargetLike = "opencl",
    pipeline: tvm.transform.Pass | Callable[[tvm.target.Target], tvm.transform.Pass] | None = None,
    schedule: SchedulePass | None = None,
    build_options: str = DEFAULT_BUILD_OPTIONS,
    schedules: str | None = None,
    variant_rules: Sequence[Any] = (),
    minify: bool = False,
    dispatch: bool | None = None,
    jobs: int | None = None,
) -> CompileResult:
    """Compile a Relax module (one GPU partition) to a `GpuProgram`.

    Args:
        mod: IRModule whose ``main`` takes and returns static-shape tensors (or a tuple).
        target: OpenCL target: kind name, dict or Target (see `make_target`); ``llvm`` is
            added as host.  TVM's default ``opencl`` target caps work-groups at 256 threads;
            ``{"kind": "opencl", "max_num_threads": 1024}`` lets schedules use 1024 (H100).
        pipeline: The full Relax pipeline (a Pass, or a callable Target -> Pass).  It must end
            with memory planning and VM lowering, like `build_relax_pipeline`.  Default:
            ``build_relax_pipeline(target, schedule)``.
        schedule: Schedule pass for the default pipeline (ignored if ``pipeline`` is given).
            Default: ``schedule_named(schedules)``.
        build_options: clBuildProgram options stored in the program.
        schedules: Name of the schedules when ``schedule`` is not given (``"fast"``,
            ``"fast-cpu"`` or ``"default"``, see `schedule_named`); ``None`` reads
            ``LITEKILN_SCHEDULES``.
            Part of the compile options (cache key): callers holding `CompileOptions` pass
            ``options.schedules``.
        variant_rules: Schedule rules to try, each on its own, on every called PrimFunc as it
            was before scheduling; each one that applies and schedules the function
            differently from the pipeline becomes a `Variant` option of that call, timed by
            the runtime on the device (tuning). Empty: no variants.
        minify: store the kernels in fewer bytes (`litekiln.compiler.minify`): kernels
            named ``k0``, ``k1``..., their OpenCL C minified, comment lines out of the PTX.
            What the model compiler writes to the cache; off, the OpenCL C is TVM's as it
            printed it (for reading, and for tests that look into it).
        dispatch: run the kernels through dispatcher kernels (`litekiln.compiler.dispatch`:
            fewer kernels for a CPU OpenCL driver to compile at their first launch); the
            program then has no PTX. Default: on for the ``fast-cpu`` schedules.
        jobs: processes the tuning variants are scheduled and lowered in, one task per
            PrimFunc (`litekiln.compiler.parallel`; the program does not depend on it).
            Default: `compile_jobs` (``LITEKILN_COMPILE_JOBS``, else one per core).

    Returns:
        A `CompileResult` (program, constants, per-phase timings).

    Raises:
        CodegenError: A construct in the lowered module cannot be translated (named in the
            message), or the target is not OpenCL.
    """
    t_start = time.perf_counter()
    tgt = make_target(target)
    _check_module(mod, tgt)
    # 1. Relax pipeline.
    by_name = pipeline is None and schedule is None
    if by_name:
        schedule = schedule_named(schedules)
    relax_pass = _relax_pass(tgt, pipeline, schedule, schedules)
    lowered, fused = _run_relax_pass(relax_pass, mod, tgt)
    t_relax = time.perf_counter()
    planner, outputs = _plan_main(lowered)
    # 2-3. TIR lowering and OpenCL C of the PrimFuncs that main calls, and their launches.
    notes: list[str] = []
    repair = _Repair(fused, _fallback_rules(schedule), tgt, notes)
    if jobs is None:
        from litekiln.compiler.parallel import compile_jobs

        jobs = compile_jobs()
    if dispatch is None:
        from litekiln.config import SCHEDULES

        dispatch = by_name and SCHEDULES.get(schedules) == "fast-cpu"
    code = _device_code(
        lowered,
        fused,
        planner,
        variant_rules,
        tgt,
        minify=minify,
        repair=repair,
        jobs=jobs,
        ptx_wanted=not dispatch,  # (dispatchers are OpenCL C only: `_dispatch`)
    )
    if dispatch:
        _dispatch(code)
    program = _program(code, build_options, planner, outputs, tgt)
    t_end = time.perf_counter()
    timings = {
        "relax": t_relax - t_start,
        "tir": code.t_tir - t_relax,
        "opencl_codegen": code.t_codegen - code.t_tir,
        "total": t_end - t_start,
    }
    return CompileResult(program, planner.constant_arrays, timings, lowered, notes)


def _check_module(mod: tvm.IRModule, target: tvm.target.Target) -> None:
    if target.kind.name != "opencl":
        raise CodegenError(f"target kind {target.kind.name!r}: litekiln generates OpenCL only")
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise CodegenError("module has no `main` function")


def _relax_pass(
    target: tvm.target.Target,
    pipeline: tvm.transform.Pass | Callable[[tvm.target.Target], tvm.transform.Pass] | None,
    schedule: SchedulePass | None,
    schedules: str | None,
) -> tvm.transform.Pass:
    """The Relax pipeline to run: the one given, or ours with the chosen schedule."""
    if pipeline is None:
        return build_relax_pipeline(
            target, schedule if schedule is not None else schedule_named(schedules)
        )
    if isinstance(pipeline, tvm.transform.Pass):
        return pipeline
    return pipeline(target)


def _run_relax_pass(
    relax_pass: tvm.transform.Pass,
    mod: tvm.IRModule,
    target: tvm.target.Target,
) -> tuple[tvm.IRModule, tvm.IRModule | None]:
    """Run the Relax pipeline on ``mod``.

    Returns:
        ``(lowered, fused)``: the lowered module and a copy of the module right after
        FuseTIR (its PrimFuncs as they were before scheduling; ``None`` if the pipeline has
        no FuseTIR), for the schedule variants to start from and the FLOPs to be counted on.
    """
    captured: dict[str, tvm.IRModule] = {}

    @tvm.ir.instrument.pass_instrument
    class _CaptureFused:
        def run_after_pass(self, m: tvm.IRModule, info: Any) -> None:
            if info.name == "FuseTIR":
                # A copy: the schedule pass updates the module in place.
                captured["fused"] = tvm.IRModule(dict(m.functions.items()))

    with target, tvm.transform.PassContext(instruments=[_CaptureFused()]):
        lowered = relax_pass(mod)
    return lowered, captured.get("fused")


def _plan_main(lowered: tvm.IRModule) -> tuple[_MainPlanner, list[int]]:
    """Walk the lowered ``main``: storages, tensors, PrimFunc calls and the output tensors."""
    main = lowered["main"]
    prim_funcs = {
        gv.name_hint for gv, f in lowered.functions.items() if isinstance(f, tirx.PrimFunc)
    }
    planner = _MainPlanner()
    planner.add_params(main.params)
    body = main.body
    if not isinstance(body, relax.SeqExpr):
        raise CodegenError(f"main body is {type(body).__name__}, expected a SeqExpr")
    for block in body.blocks:
        for binding in block.bindings:
            planner.add_binding(binding, prim_funcs)
    return planner, planner.flat_tensors(body.body, "result of main")


@dataclass
class _LoweredFuncs:
    """The called PrimFuncs (and their schedule variants) after TIR lowering."""

    host_funcs: dict[str, Any]  # name -> host PrimFunc (post-SplitHostDevice)
    kernel_funcs: dict[str, Any]  # kernel name -> device PrimFunc
    source: str  # OpenCL C of every kernel
    t_tir: float  # when the TIR pipeline ended (perf_counter)
    device_mods: list[Any]  # the device functions before OpenCL code generation
    # PrimFunc name -> names of its variants (`<name>__v<k>`), each a host function
    variants_of: dict[str, list[str]] = field(default_factory=dict)
    # (call index, variant name) -> the variant's launches for that call (FLOPs shared out),
    # or None where it cannot be offered (a workspace); read where the variant was lowered
    variant_launches: dict[tuple[int, str], list[Launch] | None] = field(default_factory=dict)


@dataclass
class _DeviceCode:
    """What the program runs: OpenCL C, the launches in order, and the tuning variants."""

    source: str
    launches: list[Launch]
    variants: list[Variant]
    t_tir: float
    t_codegen: float
    ptx: str = ""  # the default kernels as PTX (`litekiln.compiler.ptx`), or ""
    ptx_note: str = ""  # how it was made, or why there is none
    minified: str = (
        "no"  # whether the OpenCL C is minified (`litekiln.compiler.minify`), or why not
    )


def _device_code(
    lowered: tvm.IRModule,
    fused: tvm.IRModule | None,
    planner: _MainPlanner,
    variant_rules: Sequence[Any],
    target: tvm.target.Target,
    *,
    minify: bool = False,
    repair: _Repair | None = None,
    jobs: int = 1,
    ptx_wanted: bool = True,
) -> _DeviceCode:
    """Lower the called PrimFuncs (and variants) to OpenCL C and read their launches.

    ``repair`` reschedules the PrimFuncs whose schedule fails TIR lowering (`_Repair`);
    without it such a failure fails the whole partition. ``jobs``: processes the variants
    are scheduled and lowered in (`litekiln.compiler.parallel`). ``ptx_wanted=False``: no
    PTX (a program whose kernels will run through dispatchers has none)."""
    # The pipeline leaves dead PrimFuncs (e.g. a `reshape` replaced by vm.builtin.reshape).
    used = sorted({c.func for c in planner.calls})
    now = time.perf_counter()
    if not used:
        return _DeviceCode("", [], [], now, now)
    funcs = _lower_used(lowered, used, target, repair)
    flops = _func_flops(fused, lowered, used)
    state: _VariantState | None = None
    if variant_rules and fused is not None:
        # (only where a call does work enough for its options to be kept: `_worth_tuning`)
        tunable = _worth_tuning_funcs(planner, funcs, flops)
        state = _VariantState(fused, lowered, planner, variant_rules, target, flops)
        _add_schedule_variants(funcs, state, [n for n in used if n in tunable], jobs)
    t_codegen = time.perf_counter()
    launches, variants = _LaunchReader(planner, funcs, flops).read()
    variants = [v for v in variants if _worth_tuning(v, launches, planner.tensors)]
    # A default of a few work-groups starts as the option that fills the device.
    launches, variants, promoted = fill_starved_defaults(launches, variants)
    # Variants no option kept (equal to the default) need not be built.
    prune = bool(funcs.variants_of)
    source, short, variants = _finish_kernels(
        funcs.source, launches, variants, prune=prune, minify=minify
    )
    code = _DeviceCode(source, short, variants, funcs.t_tir, t_codegen)
    if ptx_wanted:
        device_mods = funcs.device_mods
        if promoted and state is not None:
            device_mods = _with_variant_kernels(device_mods, funcs, state, promoted)
        code.ptx, code.ptx_note = _default_ptx(device_mods, launches, short)
    else:
        code.ptx_note = "no: kernels run through dispatchers (fast-cpu)"
    if minify:
        code.ptx = strip_ptx(code.ptx)
        try:
            code.source, code.minified = minify_opencl(source, jobs), "yes"
        except MinifyError as exc:  # kept as TVM printed it: it still runs
            code.minified = f"no: {exc}"
    return code


def _dispatch(code: _DeviceCode) -> None:
    """`dispatch_kernels` on ``code``, in place. Its PTX goes: the dispatchers are OpenCL C
    only, and the launches now name them."""
    source, launches, variants = dispatch_kernels(
        code.source, code.launches, code.variants, group=GROUP
    )
    if launches != code.launches or variants != code.variants:
        code.source, code.launches, code.variants = source, launches, variants
        code.ptx, code.ptx_note = "", "no: kernels run through dispatchers (fast-cpu)"


#: The names TVM's memory planning gives the workspaces.
_WORKSPACE_NAME = re.compile(r"alloc\d*")

#: Calls smaller than both get no tuning variants: any schedule runs them in a few
#: microseconds, launch-bound, and the tuning's choice between them is noise (on the H200,
#: tv_mobilenet_v3_small's 7.7K-FLOP squeeze-excite convolution took option 3 in one run and
#: option 4 in the next, 3.9 and 9.3 us), while each option's kernel costs cache bytes
#: (issue 16: 15% of the model file) and compile time.
_TUNE_MIN_FLOPS = 1 << 16
_TUNE_MIN_BYTES = 1 << 18


def _worth_tuning(v: Variant, launches: Sequence[Launch], tensors: Sequence[Any]) -> bool:
    """Whether call ``v``'s default launches do work enough for its options to be timed:
    ``_TUNE_MIN_FLOPS`` floating-point operations or ``_TUNE_MIN_BYTES`` of distinct
    buffers, or a recurrent step's (`compiler.gated_step`: one function a step)."""
    return _does_work(launches[v.start : v.stop], tensors)


def _does_work(own: Sequence[Launch], tensors: Sequence[Any]) -> bool:
    if any(la.func.startswith(GATED_STEP) for la in own):
        # (a recurrent step's function is called once per time step, its options one text)
        return True
    nbytes = buffer_bytes(own, lambda t: int(tensors[t].nbytes))
    return sum(la.flops for la in own) >= _TUNE_MIN_FLOPS or nbytes >= _TUNE_MIN_BYTES


def _worth_tuning_funcs(
    planner: _MainPlanner, funcs: _LoweredFuncs, flops: dict[str, int]
) -> set[str]:
    """The PrimFuncs with a call whose default launches are `_worth_tuning`: the variants of
    the others would be dropped after they were scheduled and lowered (an unrolled GRU's
    step functions: 7.7 of its 27.9 s of compile went to variants none of which was kept),
    so they are not made. (The default launches are read here and again by the caller's
    `_LaunchReader.read`: milliseconds.)"""
    reader = _LaunchReader(planner, funcs, flops)  # (``funcs`` has no variants yet)
    out: set[str] = set()
    for call in planner.calls:
        if call.func not in out and _does_work(reader.call_launches(call), planner.tensors):
            out.add(call.func)
    return out


def _with_variant_kernels(
    device_mods: list[Any], funcs: _LoweredFuncs, state: _VariantState, kernels: Sequence[str]
) -> list[Any]:
    """``device_mods`` with the device functions of the variant ``kernels`` that became
    defaults (`fill_starved_defaults`) added, for the defaults' PTX: the variants were lowered
    in worker processes, which return OpenCL C only, so their functions are scheduled and
    lowered again here. Where that fails, the modules as they were (the PTX is then not made,
    and says which kernel it lacks)."""
    wanted: dict[str, set[str]] = {}
    for name, vnames in funcs.variants_of.items():
        for vname in vnames:
            if any(k.startswith(vname + "_kernel") for k in kernels):
                wanted.setdefault(name, set()).add(vname)
    base = [m for m in device_mods if len(m.functions)]
    if len(base) != 1 or not wanted:
        return device_mods
    added: dict[Any, Any] = dict(base[0].functions)
    try:
        for name, chosen in wanted.items():
            alt = _schedule_variants(state.fused, state.lowered, [name], state.rules, state.target)
            alt = {gv: f for gv, f in alt.items() if gv.name_hint in chosen}
            for mod in _lower_tir(tvm.IRModule(alt), state.target)[4]:
                added.update(mod.functions)
    except Exception:  # noqa: BLE001 - PTX is an extra: never fail a compile for it
        return device_mods
    return [tvm.IRModule(added)]


def _default_ptx(
    device_mods: list[Any], launches: list[Launch], short: list[Launch]
) -> tuple[str, str]:
    """PTX of the default kernels (`litekiln.compiler.ptx`) and a note, or "" and why not."""
    nvcc = ptx.wanted()
    if nvcc is None:
        return "", "not made: not asked for (LITEKILN_PTX) or no nvcc found"
    rename = {a.kernel: b.kernel for a, b in zip(launches, short, strict=True)}
    try:
        text, seconds = ptx.make_ptx(device_mods, rename, nvcc)
    except ptx.PtxUnavailable as exc:
        return "", f"not made: {exc}"
    except Exception as exc:  # noqa: BLE001 - PTX is an extra: never fail a compile for it
        return "", f"not made: {type(exc).__name__}: {str(exc)[:300]}"
    return text, f"{ptx.PTX_ARCH}, {len(set(rename))} kernels, nvcc {seconds:.1f} s"


def _lower_used(
    lowered: tvm.IRModule,
    used: Sequence[str],
    target: tvm.target.Target,
    repair: _Repair | None = None,
) -> _LoweredFuncs:
    tir_mod = tvm.IRModule({gv: f for gv, f in lowered.functions.items() if gv.name_hint in used})
    try:
        return _LoweredFuncs(*_lower_tir(tir_mod, target))
    except Exception:  # noqa: BLE001 - one bad schedule: reschedule it, else re-raise
        repaired = repair.module(tir_mod) if repair is not None else None
        if repaired is None:
            raise
    return _LoweredFuncs(*_lower_tir(repaired, target))


def _fallback_rules(schedule: SchedulePass | None) -> list[Any]:
    """The rules a PrimFunc whose schedule fails to lower is scheduled with instead: those of
    the schedule pass (an ``ApplyDefaultSchedule``: ours, then dlight's), else dlight's
    generic ones, ending with dlight's fallback rule (each output by one thread)."""
    from tvm.s_tir import dlight as dl

    rules = list(getattr(schedule, "rules", None) or default_schedule().rules)
    if not any(isinstance(getattr(r, "inner", r), dl.gpu.Fallback) for r in rules):
        rules.append(dl.gpu.Fallback())
    return rules


def _lowering_error(gv: tvm.ir.GlobalVar, func: Any, target: tvm.target.Target) -> str | None:
    """Why ``func`` alone fails TVM's TIR pipeline and OpenCL code generation, or None."""
    try:
        _lower_tir(tvm.IRModule({gv: func}), target)
    except Exception as exc:  # noqa: BLE001 - any failure: the caller reschedules or drops it
        text = str(exc).strip()
        lines = [ln for ln in text.splitlines() if "Check failed" in ln] or text.splitlines()
        return f"{type(exc).__name__}: {(lines[0] if lines else '').strip()[:200]}"
    return None


@dataclass
class _Repair:
    """Reschedules the PrimFuncs whose schedule fails TIR lowering, one by one.

    A rule can schedule a function into a form one of TVM's lowering passes refuses (dlight's
    cross-thread reductions on some fused reductions: "Cross-thread reduction requires all
    the reduction-related loops to be the deepest"); the whole program's lowering fails
    then. Each function is lowered alone to find the ones at fault; each of those takes the
    first of ``rules`` (the schedule pass's own, in order, then dlight's fallback) whose
    schedule of the function as it was before scheduling lowers, and a note says so. The
    other functions keep their schedules."""

    fused: tvm.IRModule | None  # the PrimFuncs before scheduling (after FuseTIR)
    rules: list[Any]
    target: tvm.target.Target
    notes: list[str]

    def module(self, tir_mod: tvm.IRModule) -> tvm.IRModule | None:
        """``tir_mod`` with its failing functions rescheduled; None where none fails alone
        or one cannot be rescheduled (the caller re-raises the whole module's error)."""
        if self.fused is None:
            return None
        raw = {gv.name_hint: f for gv, f in self.fused.functions.items()}
        out: dict[tvm.ir.GlobalVar, Any] = {}
        notes = []
        for gv, func in tir_mod.functions.items():
            why = _lowering_error(gv, func, self.target)
            if why is None:
                out[gv] = func
                continue
            before = raw.get(gv.name_hint)
            found = self._reschedule(gv, before, func) if before is not None else None
            if found is None:
                return None
            out[gv], rule = found
            notes.append(f"kernel {gv.name_hint} does not compile ({why}): {rule}")
        if not notes:
            return None
        self.notes.extend(notes)
        return tvm.IRModule(out)

    def _reschedule(self, gv: tvm.ir.GlobalVar, before: Any, failed: Any) -> tuple[Any, str] | None:
        """The first other rule's schedule of ``before`` that lowers, and a note naming
        the rule that failed and the one taken; None if none lowers."""
        bad = "its rule"
        for rule in self.rules:
            try:
                with self.target:
                    sch = rule.apply(before, self.target, False)
            except RULE_REFUSALS:
                continue
            if sch is None:
                continue
            new = (sch[0] if isinstance(sch, list) else sch).mod["main"]
            for key, value in (failed.attrs or {}).items():
                new = new.with_attr(key, value)
            if tvm_ffi.structural_equal(new, failed):
                bad = _rule_name(rule)  # the schedule that failed
                continue
            if _lowering_error(gv, new, self.target) is None:
                return new, f"{bad}'s schedule replaced by {_rule_name(rule)}'s"
        return None


def _rule_name(rule: Any) -> str:
    """A schedule rule's name in messages: the dlight rule a `Declining` wraps (every rule of
    the GPU profile is one), else the rule's class."""
    return type(getattr(rule, "inner", rule)).__name__


@dataclass
class _VariantState:
    """What a variant task reads (`_variant_task`): shared with the forked processes."""

    fused: tvm.IRModule
    lowered: tvm.IRModule
    planner: _MainPlanner
    rules: Sequence[Any]
    target: tvm.target.Target
    flops: dict[str, int]


@dataclass
class _VariantResult:
    """One PrimFunc's variants, as plain data (a forked task returns it)."""

    names: list[str]  # `<name>__v<k>`, in rule order
    source: str  # their OpenCL C
    launches: dict[tuple[int, str], list[Launch] | None]  # see `_LoweredFuncs`


def _add_schedule_variants(
    funcs: _LoweredFuncs, state: _VariantState, used: Sequence[str], jobs: int
) -> None:
    """Schedule and lower the variants of each used PrimFunc (`_variant_task`, one task per
    function, over ``jobs`` processes) and add them to ``funcs``, in the order of ``used``."""
    from litekiln.compiler.parallel import fork_map

    texts = [funcs.source]
    for name, result in zip(used, fork_map(_variant_task, state, used, jobs), strict=True):
        if result is None:
            continue
        texts.append(result.source)
        funcs.variants_of.setdefault(name, []).extend(result.names)
        funcs.variant_launches.update(result.launches)
    funcs.source = "\n".join(texts)  # (one join: the variants' text is megabytes)


def _variant_task(state: _VariantState, name: str) -> _VariantResult | None:
    """The variants of PrimFunc ``name`` (`_schedule_variants`), lowered to OpenCL C, and
    their launches for each call of it; None if there are none."""
    alt = _schedule_variants(state.fused, state.lowered, [name], state.rules, state.target)
    if not alt:
        return None
    try:
        lowered_alt = _lower_tir(tvm.IRModule(alt), state.target)
    except Exception:  # noqa: BLE001 - a variant that does not lower is not offered
        alt = {gv: f for gv, f in alt.items() if _lowering_error(gv, f, state.target) is None}
        if not alt:
            return None
        lowered_alt = _lower_tir(tvm.IRModule(alt), state.target)
    host, kernels, source, _, _ = lowered_alt
    params = {k: _kernel_params(f, k) for k, f in kernels.items()}
    names = [gv.name_hint for gv in alt]
    launches: dict[tuple[int, str], list[Launch] | None] = {}
    planner = state.planner
    for ci, call in enumerate(planner.calls):
        if call.func != name:
            continue
        for vname in names:
            try:
                option = _call_launches(call, vname, planner, host, params, workspaces=False)
            except CodegenError:
                launches[ci, vname] = None  # e.g. a variant that needs a workspace
                continue
            launches[ci, vname] = _share_flops(
                option, state.flops.get(name, 0), lambda k: _stored_ops(kernels[k].body)
            )
    return _VariantResult(names, source, launches)


class _LaunchReader:
    """Reads the launches of every PrimFunc call, and the variant options worth timing."""

    def __init__(self, planner: _MainPlanner, funcs: _LoweredFuncs, flops: dict[str, int]) -> None:
        self.planner = planner
        self.funcs = funcs
        self.flops = flops
        self.kernel_params = {
            name: _kernel_params(f, name) for name, f in funcs.kernel_funcs.items()
        }
        self._per_item: dict[str, float] = {}  # kernel -> TVM's count per work-item (weights)
        self.bodies = _kernel_bodies(funcs.source) if funcs.variants_of else {}
        self.vector_check = _HALF_PROGRAM_VECTOR if "cl_khr_fp16" in funcs.source else _HALF_VECTOR

    def read(self) -> tuple[list[Launch], list[Variant]]:
        """The launches of all calls, in order, and each call's variants (if any)."""
        launches: list[Launch] = []
        variants: list[Variant] = []
        for ci, call in enumerate(self.planner.calls):
            start = len(launches)
            launches.extend(self.call_launches(call))
            options = self._options(ci, call, self._signature(launches[start:]))
            if options:
                variants.append(Variant(start, len(launches), tuple(options), call.func))
        return launches, variants

    def call_launches(self, call: _Call) -> list[Launch]:
        """The default launches of ``call``, with its PrimFunc's FLOPs shared out."""
        launches = _call_launches(
            call, call.func, self.planner, self.funcs.host_funcs, self.kernel_params
        )
        return _share_flops(launches, self.flops.get(call.func, 0), self._kernel_weight)

    def _kernel_weight(self, kernel: str) -> float:
        if kernel not in self._per_item:
            func = self.funcs.kernel_funcs.get(kernel)
            self._per_item[kernel] = _stored_ops(func.body) if func is not None else 0.0
        return self._per_item[kernel]

    def _signature(self, launches: Sequence[Launch]) -> tuple[Any, ...]:
        # What an option runs: kernel code (names blanked), NDRanges and arguments.
        return tuple(
            (self.bodies.get(ln.kernel), ln.global_size, ln.local_size, ln.args) for ln in launches
        )

    def _options(self, ci: int, call: _Call, default: tuple[Any, ...]) -> list[tuple[Launch, ...]]:
        """The call's variants that build everywhere and run other code than the default."""
        seen = {default}
        options = []
        for vname in self.funcs.variants_of.get(call.func, []):
            option = self._variant(self.funcs.variant_launches.get((ci, vname)))
            if option is None or self._signature(option) in seen:
                continue  # unusable here, or another rule giving the same kernel
            seen.add(self._signature(option))
            options.append(tuple(option))
        return options

    def _variant(self, option: list[Launch] | None) -> list[Launch] | None:
        """A variant's launches for a call (`_LoweredFuncs.variant_launches`), or None where
        it cannot be offered."""
        if option is None:
            return None  # e.g. a variant that needs a workspace: keep the default only
        if any(self.vector_check.search(self.bodies.get(ln.kernel) or "") for ln in option):
            # Vector half code (half2 loads of a vectorised matmul variant): NVIDIA's
            # OpenCL builds scalar half but rejects half vectors and their conversions,
            # and one such kernel fails the whole program's build. In a program with
            # half code, float vectors go too: the executor's `half max(half, half)`
            # (and co.) overloads capture `max(float2, float2)` (clang: "passing
            # float2 to parameter of incompatible type half").
            return None
        if any(_local_bytes(self.bodies.get(ln.kernel) or "") > _MAX_LOCAL_BYTES for ln in option):
            # Local arrays over what a GPU gives a work-group (a staged copy whose region TVM
            # could not narrow: a TinyViT attention variant declared 392 KB): NVIDIA's
            # ptxas refuses the kernel, and with it the whole variants program.
            return None
        return option


#: Most bytes of local (shared) memory a variant's kernel may declare: the 48 KB an NVIDIA
#: GPU gives a work-group's static arrays (OpenCL guarantees 32 KB; AMD and Intel GPUs give 64).
_MAX_LOCAL_BYTES = 48 * 1024
_LOCAL_ARRAY = re.compile(r"__local\s+(?:volatile\s+)?(\w+)\s+\w+\[(\d+)\]")


def _share_flops(
    launches: list[Launch], total: int, weight: Callable[[str], float]
) -> list[Launch]:
    """``launches`` (one call's) with the call's FLOPs shared out between them.

    One launch takes them all. Several (a convolution's padding kernel and its own, a scan, a
    two-stage reduction) share them in proportion to each kernel's operations per work-item
    (``weight``: `_stored_ops` of its body) times its work-items: a count of each thread's code
    that includes padded iterations and cross-thread steps, so it weighs the kernels against
    each other without measuring the work; where it counts nothing for any of them, in
    proportion to the work-items.
    """
    if not total or not launches:
        return launches
    if len(launches) == 1:
        return [dataclasses.replace(launches[0], flops=total)]
    items = [float(np.prod(ln.global_size)) for ln in launches]
    weights = [weight(ln.kernel) * n for ln, n in zip(launches, items, strict=True)]
    shares = _split(total, weights if any(weights) else items)
    return [dataclasses.replace(ln, flops=f) for ln, f in zip(launches, shares, strict=True)]


def _local_bytes(body: str) -> int:
    """Bytes of the ``__local`` arrays a kernel's OpenCL C declares."""
    total = 0
    for kind, n in _LOCAL_ARRAY.findall(body):
        scalar = kind.rstrip("0123456789")
        total += SCALAR_BYTES.get(scalar, 4) * int(kind[len(scalar) :] or 1) * int(n)
    return total


def _estimate_flops(func: Any) -> float | None:
    """TVM's count of a PrimFunc's floating-point operations (a multiply-add is 2), or None
    where it cannot count them (a loop of symbolic extent, a construct it does not know)."""
    from tvm.s_tir.analysis import estimate_tir_flops

    try:
        return float(estimate_tir_flops(tvm.IRModule({"main": func})))
    except Exception:  # noqa: BLE001 - TVM's estimator refuses what it cannot count: unknown
        return None


def _stored_ops(stmt: Any) -> float:
    """The operations of the values a device kernel's thread stores (TVM's count of each
    `BufferStore`), its loops multiplied out, the larger branch of each ``if``; unlike TVM's
    count of the whole kernel, without the address arithmetic of its ``Bind``s (the
    common subexpressions of its indices: a padding kernel does no float work)."""
    if stmt is None or isinstance(stmt, (tirx.Bind, tirx.Evaluate)):
        return 0.0
    if isinstance(stmt, tirx.SeqStmt):
        return sum(_stored_ops(s) for s in stmt.seq)
    if isinstance(stmt, tirx.For):
        extent = stmt.extent.value if isinstance(stmt.extent, tirx.IntImm) else 1
        return float(extent) * _stored_ops(stmt.body)
    if isinstance(stmt, tirx.IfThenElse):
        return max(_stored_ops(stmt.then_case), _stored_ops(stmt.else_case))
    if isinstance(stmt, tirx.BufferStore):
        from tvm.s_tir.analysis import estimate_tir_flops

        try:
            return float(estimate_tir_flops(stmt))
        except Exception:  # noqa: BLE001 - an expression TVM's estimator does not know
            return 0.0
    return _stored_ops(getattr(stmt, "body", None))


def _func_flops(
    fused: tvm.IRModule | None, lowered: tvm.IRModule, used: Sequence[str]
) -> dict[str, int]:
    """The FLOPs of each used PrimFunc (0 where TVM cannot count them).

    Counted on the function as FuseTIR left it, before scheduling: its loop nest is the
    computation itself (a matmul of M x N x K counts 2*M*N*K), where the scheduled function
    also holds the iterations a tiling pads, the guards and the cross-thread reduction
    steps. A function made after FuseTIR (or a pipeline without it) is counted as
    scheduled.
    """
    before = {} if fused is None else _prim_funcs(fused)
    after = _prim_funcs(lowered)
    out: dict[str, int] = {}
    for name in used:
        func = before.get(name, after.get(name))
        count = _estimate_flops(func) if func is not None else None
        out[name] = max(0, round(count or 0.0))
    return out


def _prim_funcs(mod: tvm.IRModule) -> dict[str, Any]:
    return {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}


def _split(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` split in proportion to ``weights`` (not all 0), in integers that add up to
    it (each share rounded at its running sum)."""
    whole = float(sum(weights))
    out, done, run = [], 0, 0.0
    for w in weights:
        run += w
        upto = round(total * run / whole)
        out.append(upto - done)
        done = upto
    return out


def _finish_kernels(
    source: str, launches: list[Launch], variants: list[Variant], *, prune: bool, minify: bool
) -> tuple[str, list[Launch], list[Variant]]:
    """Drop unused kernels (``prune``) and shorten long kernel names, in source and launches;
    ``minify``: name every kernel by its index."""
    launches_all = [*launches, *(ln for v in variants for o in v.options for ln in o)]
    if prune:
        source = kernels_only(source, {ln.kernel for ln in launches_all}) or source
    source = _drop_prototypes(source)
    source, launches_all = _shorten_kernel_names(source, launches_all, minify=minify)
    launches, rest = launches_all[: len(launches)], iter(launches_all[len(launches) :])
    variants = [
        dataclasses.replace(v, options=tuple(tuple(next(rest) for _ in o) for o in v.options))
        for v in variants
    ]
    return source, launches, variants


def _program(
    code: _DeviceCode,
    build_options: str,
    planner: _MainPlanner,
    outputs: list[int],
    target: tvm.target.Target,
) -> GpuProgram:
    """Assemble and validate the plain-data program."""
    launches, variants = code.launches, code.variants
    program = GpuProgram(
        source=code.source,
        build_options=build_options,
        kernels=sorted(
            {ln.kernel for ln in [*launches, *(x for v in variants for o in v.options for x in o)]}
        ),
        storages=planner.storages,
        # (without the names TVM's memory planning gives the workspaces, "alloc12": they
        # say nothing, and cost the cache entry bytes)
        tensors=[
            dataclasses.replace(t, name="") if _WORKSPACE_NAME.fullmatch(t.name) else t
            for t in planner.tensors
        ],
        constants=planner.constants,
        inputs=planner.inputs,
        outputs=outputs,
        launches=launches,
        variants=variants,
        meta={
            "tvm_version": tvm.__version__,
            "target": str(target.kind.name),
            "ptx": code.ptx_note,
            "minified": code.minified,
        },
        format_version=FORMAT_VERSION,
        ptx=code.ptx,
    )
    program.meta = _jsonable(program.meta)
    program.validate()
    return program


def _call_launches(
    call: _Call,
    func_name: str,
    planner: _MainPlanner,
    host_funcs: dict[str, Any],
    kernel_params: dict[str, list[tuple[str, str]]],
    *,
    workspaces: bool = True,
) -> list[Launch]:
    """The launches of one PrimFunc call, read from the host function ``func_name``.

    Raises:
        CodegenError: the host code does something we cannot read, or (``workspaces=False``)
            needs a workspace buffer.
    """
    # One reader per call: host code is evaluated for the call's static shapes.
    arg_shapes = [planner.tensors[t].shape for t in call.args]
    reader = _HostFuncReader(host_funcs[func_name], func_name, kernel_params, arg_shapes)
    if reader.workspaces and not workspaces:
        raise CodegenError(f"{func_name}: needs a workspace")
    ws_tensors: dict[int, int] = {}
    out: list[Launch] = []
    for kc in reader.calls:
        args: list[KernelArg] = []
        for kind, val in kc.args:
            if kind == "param":
                if val >= len(call.args):
                    raise CodegenError(
                        f"{func_name}: kernel {kc.kernel} uses parameter {val}, "
                        f"call has {len(call.args)}"
                    )
                args.append(BufferArg(call.args[val]))
            elif kind == "workspace":
                if val not in ws_tensors:
                    shape, dtype = reader.workspaces[val]
                    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
                    sid = planner.new_storage(nbytes, "workspace")
                    ws_tensors[val] = planner.new_tensor(
                        sid, 0, shape, dtype, f"{func_name}_workspace"
                    )
                args.append(BufferArg(ws_tensors[val]))
            else:
                value, ctype = val
                args.append(ScalarArg(value, ctype))
        gsize, lsize = _ndrange(kc, f"{func_name}/{kc.kernel}")
        out.append(Launch(kc.kernel, tuple(args), gsize, lsize, call.func))
    return out


def _kernel_bodies(source: str) -> dict[str, str]:
    """Kernel name -> its OpenCL C definition with the name blanked (to spot equal kernels).

    TVM's OpenCL source is one chunk per kernel, each starting ``// Function: <name>``.
    """
    out = {}
    for chunk in source.split("// Function: ")[1:]:
        name = chunk.split("\n", 1)[0].strip()
        body = chunk[
            chunk.rfind(f"__kernel void {name}(") :
        ]  # the definition, after all declarations
        # (stripped: where a kernel's chunk ends its module's text, its trailing blank lines
        # differ from a twin's that does not)
        out[name] = body.replace(name, "K").strip()
    return out


#: A kernel prototype as TVM writes it: one line, no body.
_PROTOTYPE = re.compile(r"^__kernel void \w+\([^;{}]*\);\n", re.M)


def _drop_prototypes(source: str) -> str:
    """``source`` without kernel prototypes.

    TVM's OpenCL codegen heads every kernel's chunk with a prototype of every kernel in the
    module: O(kernels^2) lines that no kernel needs (kernels never call one another). They
    were 40% of a 6.4 MB program with tuning variants: text the cache stores and every
    driver parses.
    """
    return _PROTOTYPE.sub("", source)


# half2 x, and convert_half2(y) (a float-input kernel storing half pairs)
_HALF_VECTOR = re.compile(r"(?<![A-Za-z0-9])half(2|3|4|8|16)\b")
_HALF_PROGRAM_VECTOR = re.compile(r"(?<![A-Za-z0-9])(half|float)(2|3|4|8|16)\b")


def _schedule_variants(
    fused: tvm.IRModule,
    lowered: tvm.IRModule,
    used: Sequence[str],
    rules: Sequence[Any],
    target: tvm.target.Target,
) -> dict[tvm.ir.GlobalVar, Any]:
    """Each rule's schedule of each used PrimFunc, where it differs from the pipeline's.

    Returns:
        GlobalVar ``<name>__v<k>`` -> scheduled PrimFunc (global symbol set accordingly).
    """
    out: dict[tvm.ir.GlobalVar, Any] = {}
    funcs = {gv.name_hint: f for gv, f in fused.functions.items() if isinstance(f, tirx.PrimFunc)}
    chosen = {
        gv.name_hint: f for gv, f in lowered.functions.items() if isinstance(f, tirx.PrimFunc)
    }
    for name in used:
        func = funcs.get(name)
        if func is None or name not in chosen:
            continue
        seen = [chosen[name]]
        for k, rule in enumerate(rules, start=1):
            try:
                with target:
                    sch = rule.apply(func, target, False)
            except RULE_REFUSALS:
                sch = None
            if sch is None:
                continue
            scheduled = sch.mod["main"]
            if any(tvm_ffi.structural_equal(scheduled, f) for f in seen):
                continue
            seen.append(scheduled)
            vname = f"{name}__v{k}"
            out[tvm.ir.GlobalVar(vname)] = scheduled.with_attr("global_symbol", vname)
    return out


def compile_relax(
    mod: tvm.IRModule,
    *,
    target: TargetLike = "opencl",
    pipeline: tvm.transform.Pass | Callable[[tvm.target.Target], tvm.transform.Pass] | None = None,
) -> tuple[GpuProgram, dict[str, np.ndarray]]:
    """Compile a Relax module (one GPU partition) to a `GpuProgram` and its constants.

    See `compile_relax_full` for the arguments (this is the short form).

    Returns:
        ``(program, constants)`` where ``constants`` maps constant name -> array.

    Raises:
        CodegenError: A construct cannot be translated; the message names it.
    """
    res = compile_relax_full(mod, target=target, pipeline=pipeline)
    return res.program, res.constants


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


#: The default TIR pipeline's first passes, run before `_lower_tir`'s extra simplification:
#: simplified earlier, a reduction whose terms are split across threads is no longer
#: recognised by LowerCrossThreadReduction, and each thread writes its own partial sum (seen
#: on MobileNetV3's squeeze-excite products). The pipeline runs them again: no-ops then.
_EARLY_LOWERING = [
    s_tir.transform.CanonicalizeLoop(),
    s_tir.transform.LowerCrossThreadReduction(),
    s_tir.transform.LowerInitBlock(),
]


def _lower_tir(
    tir_mod: tvm.IRModule, target: tvm.target.Target, simplify: frozenset[str] = frozenset()
) -> tuple[dict[str, Any], dict[str, Any], str, float, list[Any]]:
    """Run TVM's TIR pipeline; return host funcs (post-SplitHostDevice), kernels, OpenCL C,
    when the pipeline ended, and the device modules (before their OpenCL code generation).

    A kernel that comes out with more than `_PRIVATE_SIMPLIFY_BYTES` of private arrays per
    work-item is lowered again with its PrimFunc's indices simplified first (``simplify``:
    those PrimFuncs' names). A rule that inlines a reshape's index map into the reader of
    cached accumulators leaves them indexed by ``v // 49 * 49 + v % 49`` (torchvision
    MaxViT's window reshapes around a matrix product), which the pipeline's
    CompactBufferAllocation, before its own simplification, cannot bound: 32 accumulators
    became a private array of 25088 floats per work-item, and PoCL's work-group function
    overflowed its thread's stack. Simplified, they are 32 again. Only those PrimFuncs: the
    extra simplification rewrites other kernels' indices too, unmeasured on the GPU.

    Raises:
        CodegenError: A kernel still over `_MAX_PRIVATE_BYTES` once simplified (`_Repair`
            reschedules its PrimFunc), or the pipeline did not split host and device code.
    """
    captured: dict[str, tvm.IRModule] = {}

    @tvm.ir.instrument.pass_instrument
    class _CaptureSplit:
        def run_after_pass(self, mod: tvm.IRModule, info: Any) -> None:
            if info.name.endswith("SplitHostDevice"):
                captured["split"] = mod

    # Same steps as tvm.tirx.build (bind target, pipeline, split, finalize), minus host codegen.
    bound = tirx.transform.BindTarget(target)(tir_mod)
    if simplify:
        picked = tvm.IRModule(
            {gv: f for gv, f in bound.functions.items() if gv.name_hint in simplify}
        )
        passes = [*_EARLY_LOWERING, s_tir.transform.StmtSimplify()]
        bound = tvm.IRModule(dict(bound.functions.items()))
        bound.update(tvm.transform.Sequential(passes)(picked))
    pipe, _finalize_host, finalize_device = tirx.get_default_tir_pipeline(target)
    with tvm.transform.PassContext(instruments=[_CaptureSplit()]):
        lowered = pipe(bound)
    if "split" not in captured:
        raise CodegenError("TIR pipeline did not run SplitHostDevice; cannot find kernel launches")
    t_tir = time.perf_counter()
    split = captured["split"]
    host_funcs: dict[str, Any] = {}
    kernel_funcs: dict[str, Any] = {}
    for gv, f in split.functions.items():
        conv = f.attrs.get("calling_conv", None) if f.attrs is not None else None
        if conv is not None and int(conv) == _KERNEL_LAUNCH_CONV:
            kernel_funcs[gv.name_hint] = f
        else:
            host_funcs[gv.name_hint] = f
    _host_mod, device_mods = _tir_build.split_host_device_mods(lowered)
    sources = []
    for dev_target, dev_mod in device_mods.items():
        if len(dev_mod.functions) == 0:
            continue
        if dev_target.kind.name != "opencl":
            raise CodegenError(f"device functions for target {dev_target.kind.name}")
        final = finalize_device()(dev_mod)
        rt_mod = _tir_build.codegen_build(final, dev_target)
        text, unresolved = exact_float_literals(rt_mod.inspect_source(), final)
        if unresolved:
            log.debug("%d float32 literal(s) left as TVM printed them (shared prints)", unresolved)
        sources.append(text)
    source = "\n".join(sources)
    sizes = {k: private_bytes(body) for k, body in _kernel_bodies(source).items()}
    owners = {_KERNEL_OF.sub("", k) for k, n in sizes.items() if n > _PRIVATE_SIMPLIFY_BYTES}
    retry = frozenset(owners & {gv.name_hint for gv in tir_mod.functions}) - simplify
    if retry:
        return _lower_tir(tir_mod, target, simplify | retry)
    for kernel, n in sizes.items():
        if n > _MAX_PRIVATE_BYTES:
            raise CodegenError(
                f"kernel {kernel} declares {n} bytes of private arrays per work-item (at most"
                f" {_MAX_PRIVATE_BYTES}: its schedule could not narrow a cached region)"
            )
    return host_funcs, kernel_funcs, source, t_tir, list(device_mods.values())


#: Private arrays per work-item over which `_lower_tir` simplifies a PrimFunc's indices and
#: lowers it again: about what a GPU keeps in registers.
_PRIVATE_SIMPLIFY_BYTES = 1024
#: SplitHostDevice names a PrimFunc's kernels ``<name>_kernel`` (``_kernel_1``, ...).
_KERNEL_OF = re.compile(r"_kernel(_\d+)?$")
#: Most bytes of private arrays one work-item of a kernel may declare. A GPU keeps about 1 KB
#: of them in registers and the rest in slow local memory; a CPU OpenCL (PoCL) keeps them for
#: the whole work-group on its thread's stack (8 MB): 16 KB x 256 work-items is 4 MB. Our
#: rules' accumulators take at most a few hundred bytes; more is a schedule whose cached
#: region TVM could not narrow (`_lower_tir`).
_MAX_PRIVATE_BYTES = 16 * 1024
