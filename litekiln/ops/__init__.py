"""Every operator litekiln knows: one module per op family, one registry (``base.REGISTRY``).

Importing this package imports every family module, which registers its ops, and makes the
model loader check every op of a model it loads against its kernel's rules
(:func:`validate_model`, through :func:`litekiln.model.loader.add_model_check`: the loader
is a layer below and cannot import the registry), folding every op whose inputs are known
right after its checks, and unrolling every WHILE whose trip count is static
(:func:`litekiln.ops.unroll.check_and_rewrite`).
"""

from litekiln.model.loader import add_model_check
from litekiln.ops import (  # noqa: F401  (imported for their @register side effects)
    control,
    conv,
    detection,
    elementwise,
    generate,
    indexed,
    lstm,
    matmul,
    mediapipe,
    nms,
    pool,
    quant,
    reduce,
    resize,
    rnn,
    seq_lstm,
    shape,
    spectral,
)
from litekiln.ops.base import REGISTRY, Check, OpContext, OpDef, lookup, register, run_op
from litekiln.ops.base import validate_model as validate_model
from litekiln.ops.unroll import check_and_rewrite

add_model_check(check_and_rewrite)  # validate_model; each op then folded, or unrolled (WHILE)

__all__ = [
    "REGISTRY",
    "Check",
    "OpContext",
    "OpDef",
    "lookup",
    "register",
    "run_op",
    "validate_model",
]
