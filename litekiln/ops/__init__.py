"""Every operator litekiln knows: one module per op family, one registry (``base.REGISTRY``).

Importing this package imports every family module, which registers its ops.
"""

from litekiln.ops import (  # noqa: F401  (imported for their @register side effects)
    conv,
    detection,
    elementwise,
    lstm,
    mediapipe,
    pool,
    quant,
    reduce,
    resize,
    shape,
)
from litekiln.ops.base import REGISTRY, OpContext, OpDef, lookup, register, run_op

__all__ = ["REGISTRY", "OpContext", "OpDef", "lookup", "register", "run_op"]
