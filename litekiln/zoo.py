"""The model zoo: the models litekiln's scripts, benchmarks and zoo tests use, and where they are.

The zoo is never committed: ``scripts/make_zoo.py`` materialises it from PyPI alone (MediaPipe's
production models come out of the ``mediapipe`` wheel; the TFLite GPU documentation's example
models are generated with TensorFlow and seeded random weights). This module only describes the
zoo and finds files in it, so it imports neither TensorFlow nor LiteRT and is cheap to import
from tests.

Layout of the zoo folder::

    <zoo>/NAME.tflite    the model
    <zoo>/NAME.json      its record (sha256, recipe, inputs/outputs, op counts, LiteRT check),
                         written after the model: a model without a matching record is
                         incomplete and gets made again
    <zoo>/.downloads/    the cached mediapipe wheel

Typical use in a test::

    path = zoo_path("smoke")          # raises ZooModelMissing if it has not been made
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from litekiln import config
from litekiln.errors import LitekilnError

#: Environment variable that moves the zoo folder (``--out`` of make_zoo.py wins over it);
#: the knob itself is ``litekiln.config.ZOO_DIR``.
ZOO_DIR_ENV = config.ZOO_DIR.env

#: The mediapipe release the production models are taken from. Pinned so that the files, and
#: so every recorded reference output and benchmark, stay the same on every machine.
MEDIAPIPE_VERSION = "0.10.14"

#: Bump when the record format changes; records of another version count as missing.
RECORD_SCHEMA = 1

Source = Literal["mediapipe", "generated"]


class ZooModelMissing(LitekilnError, FileNotFoundError):
    """A zoo model was asked for but has not been made (or its record does not match it)."""


@dataclass(frozen=True)
class ZooModel:
    """One model of the zoo.

    Attributes:
        name: the zoo name, also the file stem (``NAME.tflite``).
        source: ``"mediapipe"`` (unzipped from the mediapipe wheel) or ``"generated"``
            (built with TensorFlow by make_zoo.py).
        description: one line for ``--list`` and docs/zoo.md.
        wheel_member: path of the file inside the mediapipe wheel (mediapipe models only).
        sha256: pinned digest of the file (mediapipe models only; generated models record
            theirs when made, since a TensorFlow upgrade may change their bytes).
        recipe: version of the generation recipe; bumping it makes make_zoo.py rebuild the
            model even where a file exists.
        custom_ops: custom op codes the model uses.
        runs_in_litert: whether stock LiteRT (ai_edge_litert, default op resolver, so with
            its XNNPACK delegate) runs it.
        litert_reference_kernels: whether LiteRT runs it with its builtin kernels alone
            (``OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES``). False for models with
            MediaPipe's custom ops, which only the XNNPACK delegate (or MediaPipe) implements.
        small: cheap enough for the unit-test suite (the rest serve scripts and benchmarks).
    """

    name: str
    source: Source
    description: str
    wheel_member: str | None = None
    sha256: str | None = None
    #: 2: batch-norm shifts centred on 1 (well-conditioned random networks, make_zoo.py);
    #: 3: batch-norm statistics from 16 calibration images, not 4.
    recipe: int = 3
    custom_ops: tuple[str, ...] = ()
    runs_in_litert: bool = True
    litert_reference_kernels: bool = True
    small: bool = False


def _mediapipe(name: str, folder: str, sha256: str, description: str, **kw: Any) -> ZooModel:
    return ZooModel(
        name=name,
        source="mediapipe",
        description=description,
        wheel_member=f"mediapipe/modules/{folder}/{name}.tflite",
        sha256=sha256,
        **kw,
    )


_MODELS: tuple[ZooModel, ...] = (
    # --- production models from the mediapipe wheel (digests of the 0.10.14 files) ---
    _mediapipe(
        "face_detection_short_range",
        "face_detection",
        "bbff11cebd1eb27a1e004cae0b0e63ec8c551cbf34a4451148b4908b8db3eca8",
        "BlazeFace short range, 128x128, fp16 weights",
    ),
    _mediapipe(
        "face_detection_full_range_sparse",
        "face_detection",
        "2c3728e6da56f21e21a320433396fb06d40d9088f2247c05e5635a688d45dfe1",
        "BlazeFace full range, 192x192, sparse fp16 weights (DENSIFY)",
    ),
    _mediapipe(
        "face_landmark",
        "face_landmark",
        "1055cb9d4a9ca8b8c688902a3a5194311138ba256bcc94e336d8373a5f30c814",
        "Face mesh, 192x192 -> 468 landmarks",
    ),
    _mediapipe(
        "hand_landmark_lite",
        "hand_landmark",
        "048edd3645c9bf7397d19a9f6e3a42957d6e414c9bea6598030a2e9b624156e6",
        "Hand landmarks (lite), 224x224 -> 21 landmarks",
    ),
    _mediapipe(
        "palm_detection_lite",
        "palm_detection",
        "e9a4aaddf90dda56a87235303cf00e4c2d3fb28725f68fd88772997dac905c18",
        "Palm detector (lite), 192x192",
    ),
    _mediapipe(
        "pose_landmark_full",
        "pose_landmark",
        "e9a5c5cb17f736fafd4c2ec1da3b3d331d6edbe8a0d32395855aeb2cdfd64b9f",
        "BlazePose full, 256x256 -> 39 landmarks + segmentation",
    ),
    _mediapipe(
        "selfie_segmentation",
        "selfie_segmentation",
        "9ee168ec7c8f2a16c56fe8e1cfbc514974cbbb7e434051b455635f1bd1462f5c",
        "Selfie segmentation, 256x256 (MediaPipe custom op Convolution2DTransposeBias)",
        custom_ops=("Convolution2DTransposeBias",),
        litert_reference_kernels=False,
    ),
    # --- the TFLite GPU documentation's example models, seeded random weights ---
    ZooModel(
        "mobilenet_v1",
        "generated",
        "MobileNet v1 1.0, 224x224 -> 1001 classes, float32",
    ),
    ZooModel(
        "deeplab_v3",
        "generated",
        "DeepLab v3, MobileNetV2 backbone (output stride 16), ASPP, 257x257 -> 21 classes",
    ),
    ZooModel(
        "ssd_mobilenet",
        "generated",
        "SSD MobileNet v1, 300x300, 1917 anchors, 91 classes, TFLite_Detection_PostProcess",
        custom_ops=("TFLite_Detection_PostProcess",),
    ),
    ZooModel(
        "posenet",
        "generated",
        "PoseNet, MobileNet v1 backbone (output stride 32), 257x257 -> 9x9 heads",
    ),
    # --- MobileNet v1 quantized three ways (same weights as mobilenet_v1) ---
    ZooModel(
        "mobilenet_v1_int8",
        "generated",
        "MobileNet v1, full-integer int8 (int8 inputs/outputs)",
    ),
    ZooModel(
        "mobilenet_v1_dynamic",
        "generated",
        "MobileNet v1, dynamic-range (int8 weights, float activations)",
    ),
    ZooModel(
        "mobilenet_v1_fp16",
        "generated",
        "MobileNet v1, fp16 weights (DEQUANTIZE to float32)",
    ),
    # --- tiny models for the unit tests ---
    ZooModel(
        "smoke",
        "generated",
        "32x32 float model: conv, depthwise, add, pools, concat, resize, FC, softmax",
        small=True,
    ),
    ZooModel(
        "smoke_int8",
        "generated",
        "smoke, full-integer int8 (int8 inputs/outputs)",
        small=True,
    ),
)

#: Every zoo model by name, in the order make_zoo.py makes them.
ZOO: dict[str, ZooModel] = {m.name: m for m in _MODELS}


#: Group names that stand for several models (in make_zoo.py's ``--only`` and ``resolve``).
GROUPS: dict[str, tuple[str, ...]] = {
    "mediapipe": tuple(m.name for m in _MODELS if m.source == "mediapipe"),
    "generated": tuple(m.name for m in _MODELS if m.source == "generated"),
    "small": tuple(m.name for m in _MODELS if m.small),
    "all": tuple(m.name for m in _MODELS),
}


def model_names(source: Source | None = None, *, small: bool | None = None) -> list[str]:
    """Names of the zoo's models, optionally only those of one source or size class."""
    return [
        m.name
        for m in _MODELS
        if (source is None or m.source == source) and (small is None or m.small == small)
    ]


def resolve(names: list[str] | tuple[str, ...]) -> list[str]:
    """Expand model and group names (see ``GROUPS``) into model names, in zoo order.

    Raises:
        KeyError: a name is neither a model nor a group.
    """
    wanted: set[str] = set()
    for name in names:
        if name in GROUPS:
            wanted.update(GROUPS[name])
        else:
            wanted.add(get_model(name).name)
    return [name for name in ZOO if name in wanted]


def get_model(name: str) -> ZooModel:
    """Return the zoo entry called ``name``.

    Raises:
        KeyError: no such model; the message lists the known names.
    """
    try:
        return ZOO[name]
    except KeyError:
        raise KeyError(f"no zoo model named {name!r}; known: {', '.join(ZOO)}") from None


def _default_zoo_dir() -> Path:
    # In a source checkout the zoo sits in <repo>/models/zoo (git-ignored via /models/), so
    # every worktree has its own; an installed litekiln has no repo, so use the user cache.
    repo = Path(__file__).resolve().parents[1]
    if (repo / "pyproject.toml").is_file():
        return repo / "models" / "zoo"
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "litekiln" / "zoo"


def zoo_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """The zoo folder: ``override``, else ``$LITEKILN_ZOO_DIR``, else ``<repo>/models/zoo``.

    The folder is not created here; make_zoo.py creates it.
    """
    if override is not None:
        return Path(override).expanduser()
    configured = config.ZOO_DIR.get()
    if configured:
        return Path(configured).expanduser()
    return _default_zoo_dir()


def record_path(name: str, directory: str | os.PathLike[str] | None = None) -> Path:
    """Path of the JSON record of model ``name`` (whether or not it exists)."""
    get_model(name)
    return zoo_dir(directory) / f"{name}.json"


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in chunks (the largest zoo models are tens of MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_record(
    name: str, directory: str | os.PathLike[str] | None = None
) -> dict[str, Any] | None:
    """The JSON record of model ``name``, or None when it is missing or unreadable.

    A corrupt record is treated as missing (the model will be made again), never as an error.
    """
    path = record_path(name, directory)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def check_model(
    name: str, directory: str | os.PathLike[str] | None = None, *, hash_file: bool = True
) -> str | None:
    """Why model ``name`` is not usable as it stands, or None when it is complete and valid.

    A model is valid when its file and record exist, the record is of this schema and recipe,
    and the file's size and (with ``hash_file``) sha256 match the record and, for mediapipe
    models, the pinned digest.
    """
    model = get_model(name)
    path = zoo_dir(directory) / f"{name}.tflite"
    if not path.is_file():
        return "missing"
    record = load_record(name, directory)
    if record is None:
        return "no record"
    if record.get("schema") != RECORD_SCHEMA:
        return f"record schema {record.get('schema')} != {RECORD_SCHEMA}"
    if record.get("recipe") != model.recipe:
        return f"recipe {record.get('recipe')} != {model.recipe}"
    if record.get("size") != path.stat().st_size:
        return "size differs from record"
    if model.sha256 is not None and record.get("sha256") != model.sha256:
        return "record sha256 differs from the pinned one"
    if hash_file and sha256_file(path) != record.get("sha256"):
        return "sha256 differs from record"
    return None


def zoo_path(name: str, directory: str | os.PathLike[str] | None = None) -> Path:
    """Path of zoo model ``name``, checked to be present and complete (not re-hashed).

    Args:
        name: a zoo model name (see ``ZOO``).
        directory: the zoo folder; default ``zoo_dir()``.

    Returns:
        The ``.tflite`` file.

    Raises:
        KeyError: unknown model name.
        ZooModelMissing: the model has not been made or is incomplete; the message says how
            to make it.
    """
    problem = check_model(name, directory, hash_file=False)
    if problem is not None:
        raise ZooModelMissing(
            f"zoo model {name!r} is not usable ({problem}) in {zoo_dir(directory)}; "
            f"make it with: python scripts/make_zoo.py --only {name}"
        )
    return zoo_dir(directory) / f"{name}.tflite"
