"""How the cache reports what goes wrong: a warning it survives, or one `CacheError`.

On the inference path a problem is warned (once) as a `CacheWarning` and the caller goes on
uncached (`warn`). A management command (``ls``, ``verify``, ``prune``...) has no cheaper
way out than failing, so there a storage failure becomes one `CacheError` (`storage_errors`).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

from litekiln.cache.backend import STORAGE_ERRORS, UnsafeValueError
from litekiln.cache.errors import CacheError, CacheWarning

log = logging.getLogger("litekiln.cache")

#: A storage failure, or a stored row that is not raw bytes.
STORAGE_OR_UNSAFE: tuple[type[BaseException], ...] = (*STORAGE_ERRORS, UnsafeValueError)


def warn(message: str, stacklevel: int = 2) -> None:
    """Warn `message` as a `CacheWarning`, once: the warning is what the user sees (and what
    an app filters, or routes to logging with ``logging.captureWarnings``); the log gets it
    at debug level only, so that a logger with no handler (Python's last resort prints
    warnings) does not print it a second time.

    Args:
        message: what the cache skipped, and why.
        stacklevel: the frame the warning names, counted from the caller of `warn` as
            `warnings.warn` counts: 2 is the code that called the caller.
    """
    log.debug("%s", message)
    warnings.warn(message, CacheWarning, stacklevel=stacklevel + 1)


@contextlib.contextmanager
def storage_errors(what: str, directory: Path) -> Iterator[None]:
    """Turn a storage failure inside the block into one `CacheError`.

    Args:
        what: the command that failed (``"listing"``, ``"prune"``...), for the message.
        directory: the cache directory, for the message.

    Raises:
        CacheError: the storage failed or held a row that is not raw bytes.
    """
    try:
        yield
    except STORAGE_OR_UNSAFE as e:
        raise CacheError(f"cache {what} failed in {directory}: {e}") from e
