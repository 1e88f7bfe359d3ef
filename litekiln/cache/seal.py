"""The cache's own secret, and the HMAC that signs every manifest with it.

A cache directory holds one random 32-byte secret (``secret``, mode 0600, created at first
use). Every manifest is stored with HMAC-SHA256(secret, body) instead of a plain checksum,
and the manifest lists the sha256 of each of its parts, so the HMAC covers the whole entry.
An entry changed outside litekiln -- even with every checksum recomputed -- fails it, and is
dropped and rebuilt like any damaged entry. Whoever can read the secret (the user the cache
belongs to) can still forge entries: docs/security.md says what this does and does not stop.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from litekiln.cache.errors import CacheError

#: The secret's file name, in the cache directory (beside the schema folders).
SECRET_FILE = "secret"
_SECRET_LEN = 32
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class Seal:
    """Signs and checks manifest bodies with a cache's secret (None: checks nothing true)."""

    def __init__(self, secret: bytes | None) -> None:
        self._secret = secret

    @property
    def usable(self) -> bool:
        """Whether there is a secret (else every check fails and nothing can be signed)."""
        return self._secret is not None

    def sign(self, body: bytes) -> bytes:
        """HMAC-SHA256 of `body`, as 64 lowercase hex digits (ASCII).

        Raises:
            OSError: the cache has no secret (nothing can be stored).
        """
        if self._secret is None:
            raise OSError(30, "the cache has no secret to sign entries with")
        return hmac.new(self._secret, body, hashlib.sha256).hexdigest().encode("ascii")

    def check(self, body: bytes, mac: bytes) -> bool:
        """Whether `mac` is this cache's HMAC of `body` (constant-time comparison)."""
        if self._secret is None:
            return False
        return hmac.compare_digest(self.sign(body), mac)


def load_secret(root: Path, create: bool) -> bytes | None:
    """The secret of the cache in `root`; made (0600) if missing or damaged and `create`.

    Returns:
        32 bytes, or None if there is none and `create` is False.

    Raises:
        CacheError: the secret is a link or not a plain file, belongs to another user, or is
            writable by others.
        OSError: it cannot be read, or made (e.g. a full disk).
    """
    path = root / SECRET_FILE
    secret = _read(path)
    if secret is not None and len(secret) == _SECRET_LEN:
        return secret
    if not create:
        return None
    # Write aside, then link into place: two processes making it at once agree on one.
    tmp = root / f".{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
    try:
        with open(fd, "wb") as f:
            f.write(secrets.token_bytes(_SECRET_LEN))
            f.flush()
            os.fsync(f.fileno())
        if secret is None:
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        else:  # damaged (wrong length): replace it; entries signed with it are rebuilt
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    again = _read(path)
    if again is None or len(again) != _SECRET_LEN:
        raise OSError(f"cannot make the cache secret {path}")
    return again


def _read(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        if os.path.islink(path):
            raise CacheError(f"cache secret {path} is a symbolic link; remove it") from None
        raise e
    with open(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise CacheError(f"cache secret {path} is not a plain file; remove it")
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise CacheError(f"cache secret {path} belongs to uid {st.st_uid}, not to you")
        if st.st_mode & 0o022:
            raise CacheError(
                f"cache secret {path} is writable by others; remove it (entries are rebuilt)"
            )
        return f.read(_SECRET_LEN + 1)
