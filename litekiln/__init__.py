"""litekiln: ahead-of-time GPU compiler and loader for TensorFlow Lite models."""

from litekiln.errors import (
    CacheError,
    CompileError,
    DeviceError,
    InputError,
    LitekilnError,
    ModelError,
    UnsupportedOpError,
)
from litekiln.version import __version__

__all__ = [
    "CacheError",
    "CompileError",
    "DeviceError",
    "InputError",
    "Interpreter",
    "LitekilnError",
    "ModelError",
    "UnsupportedOpError",
    "__version__",
    "load_model",
]


def __getattr__(name: str):  # lazy: `import litekiln` stays cheap for the runtime
    if name == "Interpreter":
        from litekiln.interpreter import Interpreter

        return Interpreter
    if name == "load_model":
        import litekiln.ops  # noqa: F401  (registers the op checks load_model runs)
        from litekiln.model import load_model

        return load_model
    raise AttributeError(f"module 'litekiln' has no attribute {name!r}")
