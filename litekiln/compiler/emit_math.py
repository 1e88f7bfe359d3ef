"""Emitters of the elementwise math and reduction ops (one per TFLite op name; the op's
semantics live in its :mod:`litekiln.ops` definition)."""

from __future__ import annotations
