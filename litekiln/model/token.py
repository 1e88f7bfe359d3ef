"""The model token: the identity of a model's bytes in every cache key."""

from __future__ import annotations

import farmhash


def model_token(data: bytes) -> str:
    """farmhash Fingerprint64 of the model bytes, as 16 lowercase hex digits.

    Fingerprint64 is stable across platforms and library versions (unlike Hash64), which is
    what a persistent cache key needs; it is what the TFLite GPU delegate's serialization
    documentation asks for.

    Args:
        data: the complete model file contents.

    Returns:
        The token, e.g. ``"9ae16a3b2f90404f"``.
    """
    return f"{farmhash.fingerprint64(data):016x}"


def made_from(token: str, base: str) -> bool:
    """Whether ``token`` names ``base``'s model or one derived from it: the same model
    resized (``<base>@<shapes>``, `litekiln.resize`) or entered at another subgraph
    (``<base>#<index>``, `litekiln.loading.entry_model`), or both."""
    return token == base or (
        token.startswith(base) and token[len(base) : len(base) + 1] in ("@", "#")
    )
