"""Exception types shared by every layer of litekiln.

Every error a user can provoke (a bad model file, a wrong input, an unusable cache directory,
a missing OpenCL driver) is one of these, with a message that names what was wrong and what
was expected. Nothing here imports TVM.
"""

from __future__ import annotations


class LitekilnError(Exception):
    """Base class of every error litekiln raises on purpose."""


class ModelError(LitekilnError, ValueError):
    """The model file is not a valid, loadable TFLite flatbuffer."""


class InputError(LitekilnError, ValueError):
    """A tensor given to the interpreter has the wrong shape, dtype or index."""


class UnsupportedOpError(LitekilnError):
    """An operator that litekiln cannot execute, not even on the CPU reference."""


class DeviceError(LitekilnError):
    """No usable OpenCL device, or the device rejected a program or a launch."""


class CompileError(LitekilnError):
    """Lowering or code generation failed for a GPU partition."""


class CacheError(LitekilnError):
    """The cache directory cannot be used (unsafe permissions, foreign owner, unwritable)."""


class ModelValidationError(ModelError):
    """The model breaks a rule LiteRT checks before it runs one (a kernel's ``Prepare``, the
    interpreter's checks of tensors and quantization), or one litekiln adds (size bounds).

    Attributes:
        rule: short name of the rule broken (``"input-count"``, ``"filter-channels"``...),
            also in the message as ``[rule: ...]``.
        op_index: index of the op that breaks it, None for a model-level rule.
        op_name: that op's name (builtin name or custom code), None for a model-level rule.
    """

    def __init__(
        self,
        message: str,
        *,
        rule: str,
        op_index: int | None = None,
        op_name: str | None = None,
    ) -> None:
        super().__init__(message)
        self.rule = rule
        self.op_index = op_index
        self.op_name = op_name


class ResourceError(LitekilnError, MemoryError):
    """The numpy reference ran out of memory executing an op (a model larger than the host)."""
