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
