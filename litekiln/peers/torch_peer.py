"""``litekiln bench --peer torch``: the model's own PyTorch module, timed beside litekiln.

A model converted from PyTorch (the corpus' torchvision and timm models, docs/corpus.md) has a
twin: the module it was converted from. Its recipe (`Recipe`: library, constructor, kwargs,
seed, input shape) comes from the corpus manifest (``corpus.json`` beside the model, else
``models/corpus/corpus.json``; matched by the file's sha256, else by name) or from
``--torch-recipe FILE.json``. The module is rebuilt in the bench's own process
(`litekiln.peers.torch_recipe.build_module`), its state-dict digest checked against the
recorded one, and run on the inputs litekiln got (the corpus models keep PyTorch's NCHW
input), in fp32 with TF32 off, batch 1:

* ``eager``: the module as it is;
* ``cuda_graph``: the module captured once into a ``torch.cuda.CUDAGraph`` and replayed (CUDA
  only);
* ``compile``: ``torch.compile`` (inductor; mode ``reduce-overhead``, i.e. CUDA graphs, on
  CUDA; ``default`` on the CPU). Its first call, timed apart, compiles.

Each is timed as litekiln is (`litekiln.bench`): inputs in from host memory, inference, outputs
back in host memory (which synchronises), median of ``runs`` after ``warmup`` untimed runs;
and ``resident``: inputs already on the device, outputs left there, synchronised (torch's best
case). Each mode's outputs are compared with litekiln's. ``speedup`` = torch ms / litekiln ms,
as every speed-up of the bench (above 1: litekiln faster).

Never a failure of the bench: a model without a recipe, a machine without torch or the model's
library, a torch.compile that cannot compile (no C compiler, say) each leave a one-line
``note`` or ``error`` in the record.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from litekiln.check import relative_error
from litekiln.peers import torch_recipe
from litekiln.peers.timing import time_runs

#: The modes, in the order they run and print.
MODES = ("eager", "cuda_graph", "compile")
#: The corpus manifest's file name; `find_recipe` looks beside the model, then here.
MANIFEST = "corpus.json"
DEFAULT_MANIFEST = Path("models") / "corpus" / MANIFEST


@dataclass(frozen=True)
class Recipe:
    """How to rebuild a model's PyTorch module (`torch_recipe.build_module`), and what to
    check it against.

    Attributes:
        library: ``torchvision`` or ``timm``.
        constructor: the model's name in that library.
        kwargs: constructor keyword arguments.
        seed: ``torch.manual_seed`` before construction.
        input_shape: the traced input's shape (NCHW), if recorded.
        source: where the recipe was found, for the report.
        state_dict_sha256: the recorded digest of the weights, if any.
        versions: the library versions the record was made with.
        file_matches: whether the model file is the one the record was converted from (its
            sha256); None where the record holds no sha256.
    """

    library: str
    constructor: str
    kwargs: dict[str, Any]
    seed: int
    input_shape: tuple[int, ...] | None
    source: str
    state_dict_sha256: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    file_matches: bool | None = None

    @classmethod
    def from_json(
        cls,
        spec: dict[str, Any],
        source: str,
        *,
        digest: str | None,
        versions: dict[str, str] | None,
        file_matches: bool | None,
    ) -> Recipe:
        missing = [k for k in ("library", "constructor", "seed") if k not in spec]
        if missing:
            raise ValueError(f"{source}: the recipe lacks {', '.join(missing)}")
        shape = spec.get("input_shape")
        return cls(
            library=str(spec["library"]),
            constructor=str(spec["constructor"]),
            kwargs=dict(spec.get("kwargs") or {}),
            seed=int(spec["seed"]),
            input_shape=tuple(int(n) for n in shape) if shape else None,
            source=source,
            state_dict_sha256=digest or None,
            versions=dict(versions or {}),
            file_matches=file_matches,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "library": self.library,
            "constructor": self.constructor,
            "kwargs": self.kwargs,
            "seed": self.seed,
            "input_shape": list(self.input_shape) if self.input_shape else None,
            "source": self.source,
        }


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def find_recipe(model_path: str | Path, recipe_file: str | Path | None = None) -> Recipe | str:
    """The PyTorch recipe of a model, or one line saying why there is none.

    Args:
        model_path: the .tflite file.
        recipe_file: ``--torch-recipe``: one recipe (``{"library", "constructor", "kwargs",
            "seed", "input_shape"}``, optionally ``"state_dict_sha256"`` to check the weights
            and ``"sha256"``, the converted file's), used for every model; or a corpus
            manifest. None: the corpus manifest beside the model, else
            ``models/corpus/corpus.json`` under the current directory.

    Returns:
        The `Recipe`; a string (the note) when the model has none.

    Raises:
        ValueError: ``recipe_file`` is not a recipe or a manifest.
    """
    model_path = Path(model_path)
    sha = file_sha256(model_path)
    if recipe_file is not None:
        data = json.loads(Path(recipe_file).read_text())
        if not isinstance(data, dict) or not ("models" in data or "library" in data):
            raise ValueError(f"--torch-recipe {recipe_file}: neither a recipe nor a manifest")
        if "models" not in data:
            return Recipe.from_json(
                data,
                f"--torch-recipe {recipe_file}",
                digest=data.get("state_dict_sha256"),
                versions=data.get("versions"),
                file_matches=None if not data.get("sha256") else data["sha256"] == sha,
            )
        manifests = [Path(recipe_file)]
    else:
        manifests = [model_path.parent / MANIFEST, DEFAULT_MANIFEST]
    seen: set[Path] = set()
    for manifest in manifests:
        if manifest.resolve() in seen or not manifest.is_file():
            continue
        seen.add(manifest.resolve())
        found = _from_manifest(manifest, model_path.stem, sha)
        if found is not None:
            return found
    where = " or ".join(str(m) for m in manifests)
    return f"no PyTorch recipe for {model_path.name} (not in {where}; give one with --torch-recipe)"


def _from_manifest(manifest: Path, name: str, sha: str) -> Recipe | str | None:
    """The model's entry in a corpus manifest: by the file's sha256, else by name."""
    models = json.loads(manifest.read_text()).get("models") or {}
    hit = next((k for k, m in models.items() if m.get("sha256") == sha), None)
    key = hit or (name if name in models else None)
    if key is None:
        return None
    entry = models[key]
    spec = entry.get("spec") or {}
    if spec.get("library") not in torch_recipe.LIBRARIES:
        return f"{key} ({manifest}) came from {spec.get('source', 'elsewhere')}, not PyTorch"
    how = "sha256" if hit else "name only: the file's sha256 differs from the record's"
    prov = entry.get("provenance") or {}
    return Recipe.from_json(
        spec,
        f"{manifest} [{key}, matched by {how}]",
        digest=prov.get("state_dict_sha256"),
        versions=prov.get("versions"),
        file_matches=hit is not None if entry.get("sha256") else None,
    )


# ---------------------------------------------------------------------------------- timing


def _time(step: Callable[[], object], runs: int, warmup: int) -> dict[str, float]:
    t = time_runs(step, runs, warmup)
    return {"ms": round(t["median_ms"], 4), "min_ms": round(t["min_ms"], 4),
            "p90_ms": round(t["p90_ms"], 4)}  # fmt: skip


def _flatten(out: Any) -> list[Any]:
    """A module's outputs as a flat list of tensors (a tensor, or nested tuples/lists/dicts)."""
    if isinstance(out, dict):
        return [t for v in out.values() for t in _flatten(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in _flatten(v)]
    return [out]


def _error(exc: BaseException) -> str:
    """One line for a failure: the exception's type and its first lines that say something
    (dynamo's ``backend='inductor' raised:`` is followed by the reason)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    said = " ".join(lines[:2]) if lines and lines[0].endswith(":") else "".join(lines[:1])
    return f"{type(exc).__name__}: {said}"[:300]


def compare(theirs: list[np.ndarray], ours: list[np.ndarray]) -> dict[str, Any]:
    """litekiln's outputs against torch's: ``max_abs_err`` = max|litekiln - torch|,
    ``max_rel_err`` = that over max(1, max|torch|) (`litekiln.check.relative_error`)."""
    if [t.shape for t in theirs] != [o.shape for o in ours]:
        return {
            "max_abs_err": None,
            "max_rel_err": None,
            "compare_error": f"output shapes differ: torch {[list(t.shape) for t in theirs]}, "
            f"litekiln {[list(o.shape) for o in ours]}",
        }
    worst = 0.0
    for t, o in zip(theirs, ours, strict=True):
        if t.size:
            worst = max(worst, float(np.abs(o.astype(np.float64) - t.astype(np.float64)).max()))
    return {"max_abs_err": worst, "max_rel_err": relative_error(ours, theirs)}


@contextlib.contextmanager
def strict_fp32(torch: Any) -> Iterator[None]:
    """fp32 everywhere: TF32 off for matmuls and cuDNN's convolutions (restored after)."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


class _Runner:
    """One module on one device: each mode as a host-to-host step and a resident step."""

    def __init__(self, torch: Any, module: Any, inputs: list[np.ndarray], device: Any) -> None:
        self.torch = torch
        self.device = device
        self.cuda = device.type == "cuda"
        self.module = module.to(device)
        self.host = [torch.from_numpy(np.ascontiguousarray(x)) for x in inputs]
        self.resident = [x.to(device) for x in self.host]

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def to_host(self, outs: Any) -> list[np.ndarray]:
        return [t.detach().cpu().numpy() for t in _flatten(outs)]  # .cpu() waits for the device

    def eager(self) -> tuple[Callable[[], list[np.ndarray]], Callable[[], None]]:
        def step() -> list[np.ndarray]:
            return self.to_host(self.module(*[x.to(self.device) for x in self.host]))

        def resident() -> None:
            self.module(*self.resident)
            self.sync()

        return step, resident

    def cuda_graph(self) -> tuple[Callable[[], list[np.ndarray]], Callable[[], None]]:
        torch = self.torch
        if not self.cuda:
            raise _Unavailable("not available: no CUDA device here (CUDA graphs need one)")
        static = [x.clone() for x in self.resident]
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # warm-up off the capture stream, as torch asks
            for _ in range(3):
                self.module(*static)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = _flatten(self.module(*static))

        def step() -> list[np.ndarray]:
            for dst, src in zip(static, self.host, strict=True):
                dst.copy_(src)
            graph.replay()
            return [t.cpu().numpy() for t in captured]

        def resident() -> None:
            graph.replay()
            self.sync()

        return step, resident  # (their closures keep the graph and its buffers alive)

    def compile(self, mode: str) -> tuple[Callable[[], list[np.ndarray]], Callable[[], None]]:
        torch = self.torch
        _dynamo_reset()  # no graphs of an earlier model
        compiled = torch.compile(self.module, mode=mode)
        begin = getattr(torch.compiler, "cudagraph_mark_step_begin", None)
        mark = begin if (self.cuda and mode == "reduce-overhead" and begin) else (lambda: None)

        def step() -> list[np.ndarray]:
            mark()  # a new inference: CUDA graph trees may reuse the last one's outputs
            return self.to_host(compiled(*[x.to(self.device) for x in self.host]))

        def resident() -> None:
            mark()
            compiled(*self.resident)
            self.sync()

        return step, resident


class _Unavailable(Exception):
    """A mode that this machine cannot run (said as it is, not as an error's type)."""


def _mode_names(modes: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown torch mode(s) {unknown}; known: {', '.join(MODES)}")
    return tuple(m for m in MODES if m in modes)


@dataclass
class TorchPeer:
    """The ``torch`` peer of ``litekiln bench`` (see the module docstring).

    Attributes:
        recipe_file: ``--torch-recipe``; None: the corpus manifest (`find_recipe`).
        modes: which of `MODES` to run.
        device: ``cuda``/``cpu``; None: CUDA where torch sees a device, else the CPU.
    """

    recipe_file: str | None = None
    modes: tuple[str, ...] = MODES
    device: str | None = None
    name: str = "torch"

    def __post_init__(self) -> None:
        self.modes = _mode_names(self.modes)

    def measure(
        self,
        path: str,
        inputs: list[np.ndarray],
        ours: list[np.ndarray],
        litekiln_ms: float,
        *,
        runs: int,
        warmup: int,
    ) -> dict[str, Any]:
        """Time the model's PyTorch twin; compare its outputs with litekiln's.

        Args:
            path: the .tflite file.
            inputs: the inputs litekiln ran on, in the graph's input order.
            ours: litekiln's outputs on them, in the graph's output order.
            litekiln_ms: litekiln's median (the speed-ups' denominator).
            runs: timed runs per mode.
            warmup: untimed runs before them.

        Returns:
            The record's ``torch`` entry: the recipe and where it came from, versions, the
            weights' check, and per mode its times, its outputs' errors against litekiln's and
            ``speedup``; or only ``note`` (no recipe) / ``error`` (no torch, no library, a
            module that does not build or run).
        """
        try:
            recipe = find_recipe(path, self.recipe_file)
        except (OSError, ValueError) as exc:
            return {"error": _error(exc)}
        if isinstance(recipe, str):
            return {"note": recipe}
        try:
            import torch
        except ImportError as exc:
            return {"recipe": recipe.describe(), "error": f"torch does not import here: {exc}"}
        rec: dict[str, Any] = {"recipe": recipe.describe(), "versions": {}}
        try:
            t0 = time.perf_counter()
            module = torch_recipe.build_module(
                recipe.library, recipe.constructor, recipe.kwargs, recipe.seed
            )
            rec["build_s"] = round(time.perf_counter() - t0, 3)
        except Exception as exc:  # noqa: BLE001 - no such library or constructor here: report
            rec["versions"] = torch_recipe.library_versions()
            rec["error"] = f"cannot build the module: {_error(exc)}"
            return rec
        rec["versions"] = torch_recipe.library_versions()
        rec["weights"] = _weights(recipe, torch_recipe.state_digest(module), rec["versions"])
        if recipe.input_shape and [list(x.shape) for x in inputs] != [list(recipe.input_shape)]:
            rec["error"] = (
                f"the model's inputs {[list(x.shape) for x in inputs]} are not the recipe's "
                f"{list(recipe.input_shape)}"
            )
            return rec
        device = torch.device(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        rec["device"] = (
            f"cuda: {torch.cuda.get_device_name(device)}"
            if device.type == "cuda"
            else f"cpu ({torch.get_num_threads()} threads)"
        )
        modes: dict[str, dict[str, Any]] = {}
        with strict_fp32(torch), torch.no_grad():
            try:
                runner = _Runner(torch, module, inputs, device)
            except Exception as exc:  # noqa: BLE001 - e.g. out of device memory: report
                rec["error"] = f"cannot place the module on {device}: {_error(exc)}"
                return rec
            for mode in self.modes:
                modes[mode] = self._mode(runner, mode, ours, litekiln_ms, runs, warmup)
                with contextlib.suppress(Exception):  # (a failed mode may leave it dirty)
                    runner.sync()
            if "compile" in self.modes:
                _dynamo_reset()  # free the compiled graphs
        del runner, module
        if device.type == "cuda":
            torch.cuda.empty_cache()
        rec["modes"] = modes
        rec["speedup_vs"] = {m: r.get("speedup") for m, r in modes.items()}
        return rec

    def _mode(
        self,
        runner: _Runner,
        mode: str,
        ours: list[np.ndarray],
        litekiln_ms: float,
        runs: int,
        warmup: int,
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        try:
            if mode == "compile":
                out["mode"] = "reduce-overhead" if runner.cuda else "default"
                step, resident = runner.compile(out["mode"])
                t0 = time.perf_counter()
                step()  # compiles (and, with reduce-overhead, records the first graph)
                out["compile_s"] = round(time.perf_counter() - t0, 2)
            elif mode == "cuda_graph":
                step, resident = runner.cuda_graph()
            else:
                step, resident = runner.eager()
            theirs = step()
            timing = _time(step, runs, warmup)
            out.update(timing)
            out["resident_ms"] = _time(resident, runs, warmup)["ms"]
        except _Unavailable as exc:
            return {"error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - e.g. torch.compile without a C compiler
            out["error"] = _error(exc)
            return out
        out["speedup"] = float(f"{timing['ms'] / litekiln_ms:.4g}") if litekiln_ms else None
        out.update(compare(theirs, ours))
        return out

    def print_rows(self, rec: dict[str, Any]) -> None:
        """The peer's lines under a model's row of the bench's table."""
        if "note" in rec:
            print(f"  torch: {rec['note']}")
            return
        v = rec.get("versions") or {}
        lib = (rec.get("recipe") or {}).get("library", "")
        where = ", ".join(f"{d} {v.get(d) or 'not installed'}" for d in ("torch", lib) if v)
        where = where or "torch"
        if "modes" not in rec:
            print(f"  torch ({where}): {rec.get('error')}")
            return
        w = rec.get("weights") or {}
        print(f"  torch ({where}) on {rec['device']}; weights: {w.get('verdict')}")
        for mode, r in rec["modes"].items():
            label = {"eager": "eager", "cuda_graph": "eager + CUDA graph"}.get(mode, "")
            label = label or f"torch.compile ({r.get('mode', '')})"
            if r.get("ms") is None:
                print(f"    {label:30s} n/a: {r.get('error')}")
                continue
            err, x = r.get("max_rel_err"), r.get("speedup")
            extra = f", compile {r['compile_s']:.1f} s" if "compile_s" in r else ""
            print(
                f"    {label:30s} {r['ms']:9.3f} ms (resident {r['resident_ms']:.3f})"
                f"  litekiln x{format(x, '.3g') if x is not None else 'n/a'}"
                f"  rel err {format(err, '.1e') if err is not None else 'n/a'}{extra}"
            )
        if rec.get("error"):
            print(f"    {rec['error']}")

    @staticmethod
    def print_notes() -> None:
        print(
            "torch: the model's PyTorch module rebuilt from its recipe (fp32, TF32 off), same "
            "inputs; ms as litekiln's (inputs in, outputs back on the host), resident: inputs "
            "on the device, outputs left there; x: torch ms / litekiln ms (above 1: litekiln "
            "faster); rel err: max|litekiln - torch| / max(1, max|torch|)."
        )


def _weights(recipe: Recipe, digest: str, versions: dict[str, str]) -> dict[str, Any]:
    """Whether the rebuilt module holds the recorded weights, and whether the model file is
    the one converted from them: ``comparable`` says whether output errors mean anything."""
    recorded = recipe.state_dict_sha256
    same = None if not recorded else digest == recorded
    if not recorded:
        verdict = "no recorded state-dict digest to check against"
    elif same:
        verdict = "the recorded ones (state-dict sha256 matches)"
    else:
        lib = recipe.library
        old = {k: recipe.versions.get(k, "?") for k in ("torch", lib)}
        new = {k: versions.get(k, "?") for k in ("torch", lib)}
        verdict = (
            f"DIFFER from the recorded ones (state-dict sha256 {digest[:12]}, recorded "
            f"{recorded[:12]}; here {_pairs(new)}, recorded with {_pairs(old)}): outputs are "
            "not comparable"
        )
    if recipe.file_matches is False:
        verdict += (
            "; the model file is not the one the record was converted from (its sha256 differs: "
            "a kit's refilled model?): timings compare, outputs do not"
        )
    return {
        "state_dict_sha256": digest,
        "recorded_sha256": recorded,
        "match": same,
        "file_matches_record": recipe.file_matches,
        "comparable": same is not False and recipe.file_matches is not False,
        "verdict": verdict,
    }


def _dynamo_reset() -> None:
    import torch._dynamo  # (not always imported by `import torch`)

    torch._dynamo.reset()


def _pairs(d: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items())
