"""Ed25519 keys that sign cache exports, and the trust an import asks for.

A build machine makes a key pair once (`generate_key`, ``litekiln cache keygen OUT``): the
private key (PKCS#8 PEM, mode 0600) signs exports, and its public key (``OUT.pub``, PEM) is
what the machines that import them trust (``LITEKILN_TRUSTED_KEYS`` or ``--trusted-key``).
An export's signature covers its index, which lists the sha256 of every manifest, which
lists the sha256 of every part: the signature covers every byte that is imported.

Only the export and import paths import this module (and so ``cryptography``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from litekiln import config
from litekiln.cache.errors import CacheError

#: Signed together with the index bytes, so that a signature means "a litekiln export".
CONTEXT = b"litekiln-cache-export-v2\0"
ALGORITHM = "ed25519"


class Untrusted(Exception):
    """The export's signature is missing, bad, or by a key that is not trusted."""


def fingerprint(public: bytes) -> str:
    """A short name of a public key (raw 32 bytes): ``ed25519:`` + 16 hex digits."""
    return f"{ALGORITHM}:{hashlib.sha256(public).hexdigest()[:16]}"


def public_pem(public: bytes) -> str:
    """The PEM (SubjectPublicKeyInfo) text of a raw Ed25519 public key."""
    key = Ed25519PublicKey.from_public_bytes(public)
    pem = key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return pem.decode("ascii")


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def generate_key(path: str | os.PathLike[str]) -> tuple[Path, bytes]:
    """Make a new key pair: the private key at `path` (mode 0600), the public one at
    ``path + ".pub"``.

    Returns:
        (the public key file, the raw public key).

    Raises:
        CacheError: `path` (or its ``.pub``) exists already, or cannot be written.
    """
    private_path = Path(path)
    public_path = private_path.with_name(private_path.name + ".pub")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public = _raw(key.public_key())
    try:
        _write_new(private_path, pem, 0o600)
        try:
            _write_new(public_path, public_pem(public).encode("ascii"), 0o644)
        except BaseException:
            private_path.unlink()
            raise
    except FileExistsError as e:
        raise CacheError(f"{e.filename} exists already; not overwriting a key") from None
    except OSError as e:
        raise CacheError(f"cannot write a key to {e.filename or path}: {e.strerror or e}") from e
    return public_path, public


def _write_new(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    with open(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(path, mode)  # exact, whatever the umask


def load_private_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """The Ed25519 private key in the PEM file `path`.

    Raises:
        CacheError: it does not exist, others can read it, or it is not an unencrypted
            Ed25519 private key.
    """
    try:
        data = Path(path).read_bytes()
        mode = os.stat(path).st_mode
    except OSError as e:
        raise CacheError(f"cannot read signing key {path}: {e.strerror or e}") from None
    if hasattr(os, "getuid") and stat.S_IMODE(mode) & 0o077:
        raise CacheError(
            f"signing key {path} can be read by others (mode {stat.S_IMODE(mode):04o}); "
            f"fix it with: chmod 600 {path}"
        )
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise CacheError(f"{path} is not an unencrypted PEM private key ({e})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise CacheError(f"{path} is not an Ed25519 key (litekiln cache keygen makes one)")
    return key


def load_public_key(path: str | os.PathLike[str]) -> bytes:
    """The raw Ed25519 public key in the PEM file `path` (a ``.pub`` from `generate_key`).

    Raises:
        CacheError: it cannot be read or is not an Ed25519 public key.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise CacheError(f"cannot read trusted key {path}: {e.strerror or e}") from None
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as e:
        raise CacheError(f"trusted key {path} is not a PEM public key ({e})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise CacheError(f"trusted key {path} is not an Ed25519 public key")
    return _raw(key)


@dataclass(frozen=True)
class Signer:
    """What signs an export: a private key, or nothing (an explicitly unsigned export)."""

    key: Ed25519PrivateKey | None

    def sign(self, index: bytes) -> bytes | None:
        """The signature member for the index bytes `index`, or None if unsigned."""
        if self.key is None:
            return None
        doc = {
            "algorithm": ALGORITHM,
            "public_key": base64.b64encode(_raw(self.key.public_key())).decode("ascii"),
            "signature": base64.b64encode(self.key.sign(CONTEXT + index)).decode("ascii"),
        }
        return json.dumps(doc, sort_keys=True).encode("ascii")


def signer(sign_key: str | os.PathLike[str] | None, unsigned: bool) -> Signer:
    """The signer of an export: `sign_key`, else ``LITEKILN_SIGN_KEY``, else none if
    `unsigned` is given.

    Raises:
        CacheError: there is no key and not `unsigned`, or the key cannot be used.
    """
    path = sign_key if sign_key is not None else config.SIGN_KEY.get() or None
    if path is None:
        if unsigned:
            return Signer(None)
        raise CacheError(
            "exports are signed: give a key with --sign-key KEY or LITEKILN_SIGN_KEY (make "
            "one with `litekiln cache keygen KEY`), or pass --unsigned for an export that "
            "only `litekiln cache import --trust` accepts"
        )
    return Signer(load_private_key(path))


def trusted(paths: Sequence[str | os.PathLike[str]] | None) -> list[bytes]:
    """The raw public keys of `paths`, else of ``LITEKILN_TRUSTED_KEYS`` (a path list).

    Raises:
        CacheError: a key file cannot be read.
    """
    if paths is None:
        paths = [p for p in config.TRUSTED_KEYS.get().split(os.pathsep) if p]
    return [load_public_key(p) for p in paths]


def check(signature: bytes | None, index: bytes, keys: list[bytes], trust: bool) -> str:
    """Whether an export whose index is `index` may be imported.

    Args:
        signature: the export's signature member, or None (unsigned).
        index: the index bytes, as read.
        keys: the trusted raw public keys.
        trust: the caller vouches for the export (unsigned or unknown keys accepted).

    Returns:
        Who signed it, in words (for the import's report).

    Raises:
        Untrusted: unsigned or signed by an untrusted key (and not `trust`), or a signature
            that does not match (whatever `trust`: the export was changed after signing).
    """
    if signature is None:
        if trust:
            return "unsigned, trusted by --trust"
        raise Untrusted(
            "it is not signed. Import only exports signed by a key you trust (export with "
            "--sign-key; list the public key in LITEKILN_TRUSTED_KEYS or --trusted-key), or "
            "pass --trust if you know where this file comes from"
        )
    try:
        doc = json.loads(signature)
        if doc.get("algorithm") != ALGORITHM:
            raise ValueError(f"algorithm {doc.get('algorithm')!r}")
        public = base64.b64decode(doc["public_key"], validate=True)
        sig = base64.b64decode(doc["signature"], validate=True)
        key = Ed25519PublicKey.from_public_bytes(public)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise Untrusted(f"its signature is malformed ({e})") from None
    try:
        key.verify(sig, CONTEXT + index)
    except InvalidSignature:
        raise Untrusted(
            f"its signature by {fingerprint(public)} does not match its content: it was "
            "changed after it was signed"
        ) from None
    if public in keys:
        return f"signed by trusted key {fingerprint(public)}"
    if trust:
        return f"signed by {fingerprint(public)}, not a trusted key; accepted by --trust"
    raise Untrusted(
        f"it is signed by {fingerprint(public)}, which is not a trusted key (add its public "
        "key to LITEKILN_TRUSTED_KEYS or pass --trusted-key, or --trust)"
    )
