"""Emitters of the data-movement and matrix ops: slices, splits, tiles, gathers, pads, batch
matmul (one per TFLite op name; the op's semantics live in its :mod:`litekiln.ops` definition).
"""

from __future__ import annotations
