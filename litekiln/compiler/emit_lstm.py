"""Emitters of the recurrent ops: LSTM, the basic kernel (the op's semantics live in
:mod:`litekiln.ops.lstm`)."""

from __future__ import annotations
