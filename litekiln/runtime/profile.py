"""The device profile: every vendor question litekiln asks, answered in one place.

A :class:`DeviceProfile` is read once from an OpenCL device (`DeviceProfile.of`) and answers:
which driver family it is, whether half arithmetic builds there and how the half code must be
patched for it, the exact source and options handed to its driver, whether the CUDA-graph
launch path applies, which schedule family the compiler should use, how kernels are best
enqueued, its launch limits, and its identity for the device-binary cache key. No other module
of the library tests vendor, platform or device names. The facts behind each answer are in
docs/vendors.md.

No TVM; pyopencl only where a device is read or probed.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from litekiln.artifact.program import GpuProgram

#: Driver families litekiln knows something specific about; everything else is "generic".
FAMILIES = ("nvidia", "pocl", "intel", "generic")

#: Environment variables that switch the drivers' own compiled-kernel caches off (a
#: device-cold start): NVIDIA's compute cache and PoCL's kernel cache.
DRIVER_CACHES_OFF = {
    "CUDA_CACHE_DISABLE": "1",  # NVIDIA's compute (OpenCL, CUDA) kernel cache
    "__GL_SHADER_DISK_CACHE": "0",  # NVIDIA's shader cache (Vulkan: LiteRT's GPU path)
    "POCL_KERNEL_CACHE": "0",
}


def driver_scratch_env(folder: str) -> dict[str, str]:
    """Environment variables that send the drivers' scratch files into ``folder``: PoCL
    writes one into its cache directory at start-up even with its kernel cache off."""
    return {"POCL_CACHE_DIR": folder}


# A driver that builds half code without claiming cl_khr_fp16 (NVIDIA) has no half overloads
# of the built-ins, so `max(half, half)` and `convert_float(half)` are ambiguous between the
# float/double/integer versions (measured on the H100: 5443 such errors in one model). The
# conversions become casts (same rounding: to nearest even float <-> half, and exact
# half -> float); the overloads compute in float and round back, the numerics of any half
# built-in.
HALF_OVERLOADS = (
    (
        "#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n"
        "#define convert_float(x) ((float)(x))\n"
        "#define convert_half(x) ((half)(x))\n"
    )
    + "".join(
        f"half __attribute__((overloadable)) {name}(half a, half b) "
        f"{{ return (half){name}((float)a, (float)b); }}\n"
        for name in ("max", "min", "fmax", "fmin", "pow", "fmod")
    )
    + "".join(
        f"half __attribute__((overloadable)) {name}(half a) {{ return (half){name}((float)a); }}\n"
        for name in (
            "fabs", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "floor", "ceil",
            "round", "rint", "trunc", "sin", "cos", "erf",
        )
    )
)  # fmt: skip

#: A program with no kernels (a partition of pure reshapes): an empty kernel keeps the
#: executors uniform.
EMPTY_PROGRAM = "__kernel void litekiln_empty(void) {}\n"

_HALF_PROBE = """#pragma OPENCL EXTENSION cl_khr_fp16 : enable
__kernel void litekiln_half_probe(__global half* x) { x[0] = x[0] * (half)2.0f; }"""

_FP16 = "cl_khr_fp16"
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def family_of(platform: str) -> str:
    """The driver family of an OpenCL platform name (see `FAMILIES`)."""
    p = platform.lower()
    if "nvidia" in p:
        return "nvidia"
    if "portable computing language" in p or "pocl" in p:
        return "pocl"
    if "intel" in p:
        return "intel"
    return "generic"


class DriverProgram:
    """Exactly what the OpenCL driver is handed to build one program: a device patch
    (``prefix``: half overloads, or nothing), the program's source, and the options. The
    device-binary cache key is `digest` and these options (`litekiln.cache.keys`).

    The program's source may be read only when the driver needs it (``body`` a loader, and
    ``body_sha256`` its digest, known without reading it: `GpuProgram.source_sha256`): a
    warm start keys and loads its stored binary without reading several MB of OpenCL C.
    """

    def __init__(
        self,
        body: str | Callable[[], str],
        options: tuple[str, ...],
        *,
        prefix: str = "",
        body_sha256: str | None = None,
    ) -> None:
        self.options = options
        self.prefix = prefix
        self._body = body
        self._body_sha256 = body_sha256

    @property
    def source(self) -> str:
        """The whole text handed to the driver."""
        if not isinstance(self._body, str):
            self._body = self._body()
        return self.prefix + self._body

    @property
    def source_bytes(self) -> bytes:
        return self.source.encode()

    @property
    def digest(self) -> str:
        """sha256 (hex) of the sha256 of the prefix followed by that of the program's source:
        what `source` is, for a cache key, without reading the source."""
        body = self._body_sha256
        if body is None:
            text = self._body if isinstance(self._body, str) else self.source[len(self.prefix) :]
            body = hashlib.sha256(text.encode()).hexdigest()
            self._body_sha256 = body
        head = hashlib.sha256(self.prefix.encode()).hexdigest()
        return hashlib.sha256((head + body).encode()).hexdigest()


@dataclass(frozen=True)
class DeviceProfile:
    """What litekiln needs to know about one OpenCL device (see the module docstring).

    Attributes:
        platform, platform_version, vendor, name, version, driver: as the driver reports them.
        kind: "gpu", "cpu" or "other".
        family: the driver family (`FAMILIES`).
        extensions: the extensions the device lists.
        max_work_group_size: most work-items per work-group.
        max_work_item_sizes: most work-items per work-group along each axis.
        address_align: sub-buffer origins must be multiples of this many bytes.
    """

    platform: str
    platform_version: str
    vendor: str
    name: str
    version: str
    driver: str
    kind: str
    family: str
    extensions: frozenset[str]
    max_work_group_size: int
    max_work_item_sizes: tuple[int, ...]
    address_align: int
    #: Builds the half probe kernel (on the device's context): see `half`.
    probe_half: Callable[[], bool] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, device: Any, context: Any = None) -> DeviceProfile:
        """Read the profile of a pyopencl device (``context``: where the half probe builds)."""
        import pyopencl as cl

        platform = str(device.platform.name).strip()
        kind = (
            "gpu"
            if device.type & cl.device_type.GPU
            else "cpu"
            if device.type & cl.device_type.CPU
            else "other"
        )
        return cls(
            platform=platform,
            platform_version=str(device.platform.version).strip(),
            vendor=str(device.vendor).strip(),
            name=str(device.name).strip(),
            version=str(device.version).strip(),
            driver=str(device.driver_version).strip(),
            kind=kind,
            family=family_of(platform),
            extensions=frozenset(str(device.extensions).split()),
            max_work_group_size=int(device.max_work_group_size),
            max_work_item_sizes=tuple(int(n) for n in device.max_work_item_sizes),
            address_align=int(device.mem_base_addr_align) // 8,
            probe_half=(lambda: _probe_half(context)) if context is not None else None,
        )

    def as_record(self) -> dict[str, Any]:
        """The profile as JSON data (`from_record` reads it back), the half probe's answer
        included: what a later start needs to know about the device without opening it
        (`litekiln.runtime.device.CudaStart`)."""
        return {
            **self.identity(),
            "kind": self.kind,
            "family": self.family,
            "extensions": sorted(self.extensions),
            "max_work_group_size": self.max_work_group_size,
            "max_work_item_sizes": list(self.max_work_item_sizes),
            "address_align": self.address_align,
            "half": self.half,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> DeviceProfile:
        """The profile `as_record` wrote.

        Raises:
            KeyError, TypeError, ValueError: not such a record.
        """
        half = bool(record["half"])
        return cls(
            platform=str(record["platform"]),
            platform_version=str(record["platform_version"]),
            vendor=str(record["vendor"]),
            name=str(record["name"]),
            version=str(record["version"]),
            driver=str(record["driver"]),
            kind=str(record["kind"]),
            family=str(record["family"]),
            extensions=frozenset(str(e) for e in record["extensions"]),
            max_work_group_size=int(record["max_work_group_size"]),
            max_work_item_sizes=tuple(int(n) for n in record["max_work_item_sizes"]),
            address_align=int(record["address_align"]),
            probe_half=lambda: half,
        )

    @property
    def description(self) -> str:
        """The device, in words."""
        return f"{self.name} ({self.platform}, OpenCL)"

    def identity(self) -> dict[str, str]:
        """What a device-binary cache key needs: platform, vendor, name, versions, driver."""
        return {
            "platform": self.platform,
            "platform_version": self.platform_version,
            "vendor": self.vendor,
            "name": self.name,
            "version": self.version,
            "driver": self.driver,
        }

    # -- the compiler's choices ---------------------------------------------------------------

    @property
    def schedules(self) -> str:
        """The schedule family measured best here: "fast-cpu" on CPU OpenCL devices (PoCL:
        50-150x faster than dlight's; Intel's CPU runtime too), "fast" on GPUs."""
        return "fast-cpu" if self.kind == "cpu" else "fast"

    # -- half precision -----------------------------------------------------------------------

    @functools.cached_property
    def half(self) -> bool:
        """Whether half-precision kernels build here.

        Checked by building a one-line half kernel, not by the extension list: NVIDIA's OpenCL
        builds half arithmetic without listing cl_khr_fp16, PoCL lists nothing and fails.
        Probed once per profile; without a context to probe on, the extension list decides.
        """
        if _FP16 in self.extensions:
            return True
        return bool(self.probe_half()) if self.probe_half is not None else False

    def driver_program(self, source: str, build_options: str) -> DriverProgram:
        """The source and options the driver is handed for a program of ``source``.

        Half code on a device that does not list cl_khr_fp16: TVM guards it with
        ``#ifdef cl_khr_fp16 ... #else #error``, and NVIDIA's OpenCL builds half arithmetic
        without listing (or defining) the extension, so the macro is defined and the built-ins
        it lacks for half are supplied (`HALF_OVERLOADS`); a device that really lacks half
        still fails to build.
        """
        return self._driver(source, build_options, _FP16 in source, not source, None)

    def driver_for(self, program: GpuProgram) -> DriverProgram:
        """`driver_program` of ``program``'s source, read only when the driver needs it (a
        build from source): its digest and whether it uses half come from the program."""
        sha256 = program.source_sha256
        lazy = lambda: program.source  # noqa: E731
        return self._driver(lazy, program.build_options, program.uses_half,
                            sha256 == _EMPTY_SHA256, sha256)  # fmt: skip

    def _driver(
        self,
        source: str | Callable[[], str],
        build_options: str,
        half: bool,
        empty: bool,
        sha256: str | None,
    ) -> DriverProgram:
        options = tuple(build_options.split()) if build_options else ()
        if empty:
            return DriverProgram(EMPTY_PROGRAM, options)
        if half and _FP16 not in self.extensions:
            return DriverProgram(
                source, (*options, f"-D{_FP16}=1"), prefix=HALF_OVERLOADS, body_sha256=sha256
            )
        return DriverProgram(source, options, body_sha256=sha256)

    # -- launching ----------------------------------------------------------------------------

    @property
    def direct_enqueue(self) -> bool:
        """Whether enqueuing through ctypes beats pyopencl's call here (``auto`` mode of
        LITEKILN_FAST_LAUNCH): yes everywhere but on the CPU drivers measured, PoCL and
        Intel's CPU runtime, whose own enqueue dominates (ctypes was the slower call on both)."""
        return not (self.family == "pocl" or (self.family == "intel" and self.kind == "cpu"))

    @property
    def binary_read_compiles(self) -> bool:
        """Whether reading a program's binary compiles its kernels: on PoCL it compiles every
        kernel for any work-group size (face_landmark: 9.7 s) and holds the kernels compiled
        so far for their launch sizes, which a program built from source compiles at their
        first launch (8.2 s). The session then reads the binary for the cache after the first
        inference, in the background (`litekiln.runtime.build`)."""
        return self.family == "pocl"

    @property
    def cuda_graph_candidate(self) -> bool:
        """Whether the CUDA-graph launch path may apply: NVIDIA's OpenCL builds PTX, which the
        CUDA driver loads (`litekiln.runtime.cuda` checks the rest)."""
        return self.family == "nvidia"

    def fits(self, local_size: tuple[int, ...], kernel_limit: int) -> bool:
        """Whether a work-group of ``local_size`` may be launched here (``kernel_limit``: the
        kernel's own CL_KERNEL_WORK_GROUP_SIZE)."""
        items = 1
        for n in local_size:
            items *= n
        if items > min(self.max_work_group_size, kernel_limit):
            return False
        return all(n <= m for n, m in zip(local_size, self.max_work_item_sizes, strict=False))


def _probe_half(context: Any) -> bool:
    import pyopencl as cl

    with quiet_stderr():  # a failing probe is expected; PoCL's compiler prints to fd 2
        try:
            cl.Program(context, _HALF_PROBE).build()
        except cl.Error:
            return False
    return True


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (drivers' compilers write there directly, not via Python)."""
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 (embedded interpreters): nothing to silence
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
