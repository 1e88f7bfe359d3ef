#!/usr/bin/env python3
"""Build one PyTorch model of the external corpus and convert it with litert-torch.

Runs in the corpus virtualenv (``build/corpus-venv``: torch, torchvision, timm, litert-torch),
never in litekiln's ``.venv``: litert-torch pins its own versions of LiteRT, numpy and jax.
``scripts/corpus.py build`` starts it once per model, in a subprocess with a timeout, and reads
the one JSON line it prints after ``CORPUS_RESULT ``. Of litekiln it imports one module,
``litekiln.peers.torch_recipe``, which needs nothing but the standard library (and torch):
the recipe lives there, in one copy, because ``litekiln bench --peer torch`` rebuilds the same
module to time it beside litekiln.

The module is rebuilt from its recipe alone: ``torch.manual_seed(seed)``, the library's
constructor with random weights (torchvision ``get_model(name, weights=None, **kwargs)``, timm
``create_model(name, pretrained=False, **kwargs)``), then ``randomize_constant_tensors``
(no identity norms, no dead branches), in eval mode, on the CPU (``torch_recipe.build_module``).
The record holds a digest of the state dict (``torch_recipe.state_digest``), so that whoever
rebuilds it (``litekiln bench --peer torch`` on an H100, say) can check they hold the same
weights.

Usage::

    build/corpus-venv/bin/python scripts/corpus_torch.py '{"library": "timm", ...}'
    build/corpus-venv/bin/python scripts/corpus_torch.py --versions
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a plain script: the checkout's litekiln
    sys.path.insert(0, str(REPO))

# The recipe, in one copy; litekiln/__init__.py imports only its errors and version, so this
# pulls in none of litekiln's dependencies (tests/test_torch_peer.py checks).
from litekiln.peers.torch_recipe import (  # noqa: E402
    build_module,
    randomize_constant_tensors,
    state_digest,
)

__all__ = ["build_module", "convert", "randomize_constant_tensors", "state_digest", "versions"]

#: Prefix of the one line of stdout that carries the result (the libraries print their own).
MARK = "CORPUS_RESULT "


def versions() -> dict[str, str]:
    """Versions of everything that shapes the converted file."""
    import importlib.metadata as md

    out = {"python": sys.version.split()[0]}
    for dist in ("torch", "torchvision", "timm", "litert-torch", "ai-edge-litert", "numpy"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = ""
    return out


def sample_input(shape: list[int], seed: int) -> Any:
    """The tracing sample: standard normal values from a generator seeded with ``seed``."""
    import torch

    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def convert(spec: dict[str, Any]) -> dict[str, Any]:
    """Build the module of ``spec``, convert it, write ``spec["out"]`` atomically.

    Returns:
        Provenance: parameters, state-dict digest, versions, the converter's seconds and how
        far LiteRT's run of the converted file is from PyTorch's on the tracing sample.
    """
    import litert_torch
    import numpy as np
    import torch

    t0 = time.perf_counter()
    module = build_module(spec["library"], spec["constructor"], spec["kwargs"], spec["seed"])
    sample = sample_input(spec["input_shape"], spec["seed"])
    with torch.no_grad():
        expected = module(sample)
    t1 = time.perf_counter()
    edge = litert_torch.convert(module, (sample,))
    out = Path(spec["out"])
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        edge.export(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 -> what a plain open() gives
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    t2 = time.perf_counter()
    got = edge(sample.numpy())
    got = got if isinstance(got, (list, tuple)) else [got]
    ref = expected if isinstance(expected, (list, tuple)) else [expected]
    worst = 0.0
    for g, r in zip(got, ref, strict=True):
        r64 = r.detach().numpy().astype(np.float64)
        err = float(np.abs(np.asarray(g, np.float64) - r64).max())
        worst = max(worst, err / max(1.0, float(np.abs(r64).max())))
    return {
        "parameters": int(sum(p.numel() for p in module.parameters())),
        "state_dict_sha256": state_digest(module),
        "versions": versions(),
        "build_module_seconds": round(t1 - t0, 2),
        "convert_seconds": round(t2 - t1, 2),
        # LiteRT (XNNPACK) on the converted file against PyTorch on the CPU, same sample:
        # max|LiteRT - torch| / max(1, max|torch|). Says whether the conversion is faithful.
        "litert_vs_torch": worst,
    }


def main(argv: list[str]) -> int:
    if argv == ["--versions"]:
        print(MARK + json.dumps(versions()), flush=True)
        return 0
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    result = convert(json.loads(argv[0]))
    print(MARK + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
