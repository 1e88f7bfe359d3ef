#!/usr/bin/env python3
"""Build one PyTorch model of the external corpus and convert it with litert-torch.

Runs in the corpus virtualenv (``build/corpus-venv``: torch, torchvision, timm, litert-torch),
never in litekiln's ``.venv``: litert-torch pins its own versions of LiteRT, numpy and jax.
``scripts/corpus.py build`` starts it once per model, in a subprocess with a timeout, and reads
the one JSON line it prints after ``CORPUS_RESULT ``. It imports nothing of litekiln.

The module is rebuilt from its recipe alone: ``torch.manual_seed(seed)``, the library's
constructor with random weights (torchvision ``get_model(name, weights=None, **kwargs)``, timm
``create_model(name, pretrained=False, **kwargs)``), then :func:`randomize_constant_tensors`
(no identity norms, no dead branches), in eval mode, on the CPU.
The record holds a digest of the state dict, so that whoever rebuilds it (an H100 run of the
same module, say) can check they hold the same weights: :func:`build_module` is that recipe,
importable from this file.

Usage::

    build/corpus-venv/bin/python scripts/corpus_torch.py '{"library": "timm", ...}'
    build/corpus-venv/bin/python scripts/corpus_torch.py --versions
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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


def build_module(library: str, constructor: str, kwargs: dict[str, Any], seed: int) -> Any:
    """The corpus' PyTorch module: seeded random weights, eval mode, on the CPU.

    Args:
        library: ``"torchvision"`` or ``"timm"``.
        constructor: the model's name in that library.
        kwargs: constructor keyword arguments (besides the weights switch).
        seed: ``torch.manual_seed`` before construction; the weights are a function of it,
            the constructor and the torch version.

    Returns:
        The module (``torch.nn.Module`` in eval mode).
    """
    import torch

    torch.manual_seed(seed)
    if library == "torchvision":
        import torchvision

        module = torchvision.models.get_model(constructor, weights=None, **kwargs)
    elif library == "timm":
        import timm

        module = timm.create_model(constructor, pretrained=False, **kwargs)
    else:
        raise ValueError(f"unknown library {library!r}")
    randomize_constant_tensors(module, seed)
    return module.eval()


def randomize_constant_tensors(module: Any, seed: int) -> list[str]:
    """Give every floating tensor of the state dict whose elements are all equal seeded
    random values (in place), so that a random network looks like a trained one to the
    converter and to an accuracy check.

    Libraries initialise norm layers as identities and some residual branches at zero: LeViT
    sets the last batch norm's scale of each branch to 0, and the converter then folds the
    branch away (9 of its 12 blocks gone). Biases and running means get N(0, 0.1); norm
    scales, running variances, layer scales and zero-initialised weights get U(0.5, 1.5).

    Returns:
        The names of the tensors changed, in state-dict order.
    """
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    changed = []
    with torch.no_grad():
        for name, tensor in module.state_dict(keep_vars=True).items():
            flat = tensor.detach().reshape(-1)
            if not tensor.is_floating_point() or flat.numel() < 2 or not (flat == flat[0]).all():
                continue
            if name.rsplit(".", 1)[-1] in ("bias", "running_mean"):
                value = torch.randn(tensor.shape, generator=gen) * 0.1
            else:
                value = torch.rand(tensor.shape, generator=gen) + 0.5
            tensor.copy_(value.to(tensor.dtype))
            changed.append(name)
    return changed


def state_digest(module: Any) -> str:
    """sha256 over the state dict: each entry's name, dtype, shape and bytes, in key order."""
    h = hashlib.sha256()
    for name, value in sorted(module.state_dict().items()):
        arr = value.detach().cpu().contiguous().numpy()
        h.update(f"{name}|{arr.dtype.str}|{list(arr.shape)}|".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


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
