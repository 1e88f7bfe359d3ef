"""The threads of the ops that run on the CPU (numpy): LiteRT's ``num_threads``.

The CPU ops spend their time in BLAS (the matrix products of convolutions and fully connected
layers); ``threadpoolctl`` sets how many threads BLAS may use, for the duration of a run only.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any


@functools.cache
def _controller() -> Any:
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()  # lists the loaded BLAS libraries: done once


@contextlib.contextmanager
def cpu_thread_limit(threads: int | None) -> Iterator[None]:
    """Limit BLAS to ``threads`` threads inside the block (None: no change; ~25 us)."""
    if threads is None:
        yield
        return
    with _controller().limit(limits=threads, user_api="blas"):
        yield
