"""The corpus' PyTorch recipe: one module with the same weights wherever it is rebuilt.

A PyTorch model of the external corpus (docs/corpus.md) is a function of its recipe alone:
``torch.manual_seed(seed)``, the library's constructor with random weights (torchvision
``get_model(name, weights=None, **kwargs)``, timm ``create_model(name, pretrained=False,
**kwargs)``), then :func:`randomize_constant_tensors` (no identity norms, no dead branches), in
eval mode, on the CPU. :func:`state_digest` checks that two machines hold the same weights.

Two users, one copy: ``scripts/corpus_torch.py`` builds and converts the corpus' models in the
corpus virtualenv (torch, torchvision, timm, litert-torch; none of litekiln's dependencies),
and ``litekiln bench --peer torch`` (`litekiln.peers.torch_peer`) rebuilds the same module
to time it beside litekiln. So this module imports only the standard library at load time;
torch, torchvision and timm are imported when a function needs them.
"""

from __future__ import annotations

import hashlib
import re
import sys
from typing import Any

#: The libraries a recipe may name.
LIBRARIES = ("torchvision", "timm")

#: The op torchvision's meta registrations name when its C++ extension did not load.
_MISSING_OP = re.compile(r"operator torchvision::(\w+) does not exist")
#: Their signature (both are non-maximum suppressions: ``nms`` and ``qnms``).
_NMS_SCHEMA = "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"


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

    Raises:
        ValueError: an unknown library.
        ImportError: the library is not installed.
    """
    import torch

    if library not in LIBRARIES:
        raise ValueError(f"unknown library {library!r} (known: {', '.join(LIBRARIES)})")
    torch.manual_seed(seed)
    torchvision = import_torchvision()  # (timm imports it too)
    if library == "torchvision":
        module = torchvision.models.get_model(constructor, weights=None, **kwargs)
    else:
        import timm

        module = timm.create_model(constructor, pretrained=False, **kwargs)
    randomize_constant_tensors(module, seed)
    return module.eval()


def import_torchvision() -> Any:
    """``import torchvision``, also where its C++ operators cannot load.

    PyPI's torchvision for Linux is a CUDA build: beside a CPU build of torch (the test set-up's
    ``torch==2.13.0+cpu``) its ``_C`` extension does not link, and torchvision 0.28's meta
    registrations then fail on the operators it did not define (``torchvision::nms``,
    ``torchvision::qnms``). The model constructors are pure Python and never call those
    operators (detection models do): each missing operator's schema is declared and the import
    retried. The state-dict digest (:func:`state_digest`) still says whether the module is the
    one the corpus recorded.

    Returns:
        The torchvision module.
    """
    import torch

    declared: list[str] = []
    for _ in range(8):
        try:
            import torchvision

            return torchvision
        except RuntimeError as exc:
            missing = _MISSING_OP.search(str(exc))
            if missing is None or missing.group(1) in declared:
                raise
            for name in [m for m in sys.modules if m.partition(".")[0] == "torchvision"]:
                del sys.modules[name]  # the half-imported package, so that it imports again
            lib = torch.library.Library("torchvision", "FRAGMENT")
            lib.define(missing.group(1) + _NMS_SCHEMA)
            _SHIM_LIBRARIES.append(lib)  # a Library object undefines its ops when collected
            declared.append(missing.group(1))
    raise ImportError(f"torchvision does not import: declared {declared} and it still fails")


#: The operator libraries `import_torchvision` declared (kept alive for the process' life).
_SHIM_LIBRARIES: list[Any] = []


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


def library_versions() -> dict[str, str]:
    """The installed versions of what the weights depend on ("" where not installed)."""
    import importlib.metadata as md

    out = {}
    for dist in ("torch", *LIBRARIES):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = ""
    return out
