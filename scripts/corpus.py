#!/usr/bin/env python3
"""The external corpus: models nobody on this team designed, built reproducibly, measured as a
new user would meet litekiln (docs/corpus.md).

Three sources, all from public packages and seeded random weights (no pretrained downloads):

* PyTorch: torchvision and timm models converted with Google's ``litert-torch``. They are
  built in a separate virtualenv, ``build/corpus-venv`` (made here when missing, from the
  ``corpus`` extra of pyproject.toml), by ``scripts/corpus_torch.py``;
* Keras applications (``weights=None``) converted with the TFLite converter (float32, no
  optimizations), in litekiln's own ``.venv`` (tensorflow-cpu, the ``zoo`` extra);
* MediaPipe: every ``.tflite`` of the ``mediapipe`` wheel's ``mediapipe/modules/`` (the zoo's
  seven and seven more), from the wheel ``scripts/make_zoo.py`` caches.

``models/corpus/corpus.json`` is the manifest: per model its recipe (for PyTorch the
constructor, its kwargs, the seed, the input shape: enough to rebuild the same module with the
same weights, checked by the state-dict digest it also holds), sha256, inputs, outputs and op
counts, or the error its build met.

Commands::

    python scripts/corpus.py list
    python scripts/corpus.py build [--only NAME...] [--timeout S]      # models/corpus/
    python scripts/corpus.py measure [--only NAME...] [--json OUT] [--markdown] [--timeout S]
    python scripts/corpus.py report RESULTS.json [--update-doc]        # the table again

``--only`` takes model names, or the groups ``torchvision``, ``timm``, ``torch``, ``keras``,
``mediapipe``, ``ci`` (the subset tests/test_corpus.py measures). Each conversion and each
measurement runs in its own subprocess with a timeout, so one that fails, hangs or dies is
recorded and the rest go on. Exit status: 0 when every requested model was built (build) or
measured without a crash (measure), 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import hashlib
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a plain script: the checkout's litekiln
    sys.path.insert(0, str(REPO))

#: Where the models go (git-ignored, like the zoo).
CORPUS_DIR = REPO / "models" / "corpus"
MANIFEST = "corpus.json"
MANIFEST_SCHEMA = 1
#: Raw measurements, one JSON per run (docs/corpus.md quotes the latest).
RESULTS_DIR = REPO / "results" / "corpus"
DOC = REPO / "docs" / "corpus.md"
#: The PyTorch side's own virtualenv: litert-torch pins its own LiteRT, numpy and jax.
TORCH_VENV = REPO / "build" / "corpus-venv"
TORCH_WORKER = REPO / "scripts" / "corpus_torch.py"
SETUP_LOGS = REPO / "build" / "setup"

#: Seed of every model's random weights (and of the Keras converter's trace).
SEED = 14
#: How the PyTorch weights are made (litekiln/peers/torch_recipe.py, build_module): part of the
#: recipe, so that a change rebuilds the models.
TORCH_WEIGHTS = "torch.manual_seed(seed), constructor, randomize_constant_tensors v1"
#: Seed of the inputs litekiln and LiteRT are both given.
INPUT_SEED = 0
#: The issue's bound: max|ours - LiteRT| / max(1, max|LiteRT|).
TOLERANCE = 1e-4
BUILD_TIMEOUT_S = 900
MEASURE_TIMEOUT_S = 1200
#: Prefix of the line a worker prints its JSON result on (libraries print their own lines).
MARK = "CORPUS_RESULT "


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------- the models


@dataclass(frozen=True)
class CorpusModel:
    """One corpus model and its recipe.

    Attributes:
        name: file stem in the corpus folder, ``<source prefix>_<model>``.
        source: ``torchvision``, ``timm``, ``keras`` or ``mediapipe``.
        constructor: the library's name for it (the wheel member for MediaPipe).
        kwargs: constructor keyword arguments besides the weights switch.
        input_shape: the traced input (NCHW for PyTorch, NHWC for Keras); MediaPipe files
            carry their own.
        sha256: pinned digest (MediaPipe; converted models record theirs when built).
        note: why the recipe differs from the library's default, if it does.
    """

    name: str
    source: str
    constructor: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    input_shape: tuple[int, ...] = ()
    sha256: str | None = None
    note: str = ""
    #: ``"int8"``: full-integer quantization by the TFLite converter (int8 inputs, outputs
    #: and activations, calibrated on seeded random inputs); ``"float"``: none; ``"dynamic"``
    #: and ``"fp16"`` (the probe's only): int8 or fp16 weights, float activations.
    quantize: str = "float"

    @property
    def is_torch(self) -> bool:
        return self.source in ("torchvision", "timm")

    def spec(self) -> dict[str, Any]:
        """The recipe as the manifest records it (a changed recipe means a rebuild)."""
        spec: dict[str, Any] = {"source": self.source, "constructor": self.constructor}
        if self.source != "mediapipe":
            spec.update(kwargs=self.kwargs, seed=SEED, input_shape=list(self.input_shape))
        if self.is_torch:
            spec.update(library=self.source, layout="NCHW", weights=TORCH_WEIGHTS)
        elif self.source == "keras" and self.constructor == "Sequential":
            spec.update(weights="keras.utils.set_random_seed(seed)")
        elif self.source == "keras" and self.quantize != "float":
            spec.update(weights="make_zoo._init_weights(net, seed) v1", quantize=self.quantize)
            spec.update(calibration="make_zoo.full_integer(converter, input_shape, seed) v1")
        elif self.source == "keras":
            spec.update(weights="keras.utils.set_random_seed(seed), batch norms calibrated v1")
        if self.sha256:
            spec["sha256"] = self.sha256
        return spec


def _tv(name: str, **kwargs: Any) -> CorpusModel:
    return CorpusModel(f"tv_{name}", "torchvision", name, kwargs, (1, 3, 224, 224))


def _timm(name: str, size: int = 224, note: str = "") -> CorpusModel:
    return CorpusModel(f"timm_{name}", "timm", name, {}, (1, 3, size, size), note=note)


def _keras(constructor: str, quantize: str = "float") -> CorpusModel:
    """A Keras application, giving logits, not softmax probabilities: with 1000 classes the
    probabilities of a random network are all ~1e-3, so an error relative to
    max(1, max|LiteRT|) would say nothing.

    ``quantize="int8"``: as the TFLite converter quantizes it for integer accelerators
    (post-training, full integer: int8 inputs, outputs and activations), with make_zoo's
    well-conditioned weights (`make_zoo._init_weights`: batch-norm shifts centred on 1,
    statistics of seeded images), not the float recipe's random ones. With those, a Keras
    MobileNetV2 is chaotic and LiteRT's own two int8 kernel sets (XNNPACK and the builtin
    kernels) gave outputs 5.5 quantization steps apart on average, against 0.5 here, so no
    comparison could say anything of the compiler."""
    name, note = "", "classifier_activation=None: logits; batch norms calibrated on a random batch"
    if quantize != "float":
        name, note = f"_{quantize}", "full integer (post-training); well-conditioned weights"
    return CorpusModel(
        f"keras_{constructor.lower()}{name}",
        "keras",
        constructor,
        {"classifier_activation": None},
        (1, 224, 224, 3),
        note=note,
        quantize=quantize,
    )


def _keras_rnn(name: str, layers: list[dict[str, Any]], steps: int, features: int) -> CorpusModel:
    """A sequence model: Keras recurrent layers (``{"layer": "LSTM", ...kwargs}``, in order),
    then a dense layer of 10; TFLite has them as a WHILE over the steps, which litekiln
    unrolls at load."""
    return CorpusModel(
        f"keras_{name}",
        "keras",
        "Sequential",
        {"layers": layers, "dense": 10},
        (1, steps, features),
        note="recurrent layers, then Dense(10): a WHILE over the time steps",
    )


def _mp(folder: str, stem: str, sha256: str | None = None) -> CorpusModel:
    from litekiln import zoo

    member = f"mediapipe/modules/{folder}/{stem}.tflite"
    if sha256 is None:  # one of the zoo's seven: its pinned digest
        sha256 = zoo.get_model(stem).sha256
    return CorpusModel(f"mp_{stem}", "mediapipe", member, sha256=sha256)


_NATIVE = "the architecture's native input size"

MODELS: tuple[CorpusModel, ...] = (
    # torchvision: classic CNNs
    _tv("resnet18"),
    _tv("mobilenet_v2"),
    _tv("mobilenet_v3_small"),
    _tv("mobilenet_v3_large"),
    _tv("efficientnet_b0"),
    _tv("squeezenet1_1"),
    _tv("shufflenet_v2_x1_0"),
    _tv("mnasnet1_0"),
    _tv("regnet_y_400mf"),
    _tv("googlenet", aux_logits=False, init_weights=True),
    _tv("regnet_x_400mf"),
    _tv("mnasnet0_5"),
    # timm: transformers, hybrids and newer CNNs (small variants)
    _timm("deit_tiny_patch16_224"),
    _timm("mobilevit_xxs", 256, _NATIVE),
    _timm("mobilevitv2_050", 256, _NATIVE),
    _timm("convnext_atto"),
    _timm("levit_128s"),
    _timm("efficientvit_b0"),
    _timm("edgenext_xx_small", 256, _NATIVE),
    _timm("fastvit_t8", 256, _NATIVE),
    _timm("mobilenetv4_conv_small"),
    _timm("efficientformerv2_s0"),
    _timm("tiny_vit_5m_224"),
    _timm("mobileone_s0"),
    _timm("lcnet_050"),
    _timm("pvt_v2_b0"),
    _timm("ghostnet_100"),
    _timm("rexnet_100"),
    _timm("repvgg_a0"),
    _timm("resnet10t"),
    _timm("mixnet_s"),
    _timm("hrnet_w18_small"),
    _timm("poolformer_s12"),
    _timm("coat_lite_tiny"),
    _timm("resmlp_12_224"),
    _timm("dla34"),
    # the twenty-fourth session's: lambda layers (a CONV_3D), split attention, cross-covariance
    # attention, rotary embeddings, and a mobile hybrid with attention
    _timm("lambda_resnet26t", 256, _NATIVE),
    _timm("resnest14d"),
    _timm("xcit_nano_12_p16_224"),
    _timm("eva02_tiny_patch14_224"),
    _timm("hgnetv2_b0"),
    _timm("mobilenetv4_hybrid_medium"),
    # Keras applications, weights=None
    _keras("MobileNetV2"),
    _keras("MobileNetV3Small"),
    _keras("MobileNetV3Large"),
    _keras("EfficientNetB0"),
    _keras("EfficientNetV2B0"),
    _keras("NASNetMobile"),
    _keras("DenseNet121"),
    # ... and quantized for integer accelerators (residual adds and pads in int8; swish,
    # squeeze-and-excite, means)
    _keras("MobileNetV2", "int8"),
    _keras("EfficientNetB0", "int8"),
    # Keras recurrent layers: a WHILE over the time steps
    _keras_rnn("lstm", [{"layer": "LSTM", "units": 64}], 32, 16),
    _keras_rnn(
        "gru",
        [{"layer": "GRU", "units": 64, "return_sequences": True}, {"layer": "GRU", "units": 64}],
        32,
        16,
    ),
    # MediaPipe 0.10.14: the zoo's seven ...
    _mp("face_detection", "face_detection_short_range"),
    _mp("face_detection", "face_detection_full_range_sparse"),
    _mp("face_landmark", "face_landmark"),
    _mp("hand_landmark", "hand_landmark_lite"),
    _mp("palm_detection", "palm_detection_lite"),
    _mp("pose_landmark", "pose_landmark_full"),
    _mp("selfie_segmentation", "selfie_segmentation"),
    # ... and the wheel's other seven
    _mp(
        "face_landmark",
        "face_landmark_with_attention",
        "e06a804e0144f9929eda782122916b35d60c697c3c9344013ca2bbe76a6ce2b4",
    ),
    _mp(
        "hand_landmark",
        "hand_landmark_full",
        "11c272b891e1a99ab034208e23937a8008388cf11ed2a9d776ed3d01d0ba00e3",
    ),
    _mp(
        "holistic_landmark",
        "hand_recrop",
        "67d996ce96f9d36fe17d2693022c6da93168026ab2f028f9e2365398d8ac7d5d",
    ),
    _mp(
        "iris_landmark",
        "iris_landmark",
        "d1744d2a09c25f501d39eba4faff47e53ecca8852c5ce19bce8eeac39357521f",
    ),
    _mp(
        "palm_detection",
        "palm_detection_full",
        "1b14e9422c6ad006cde6581a46c8b90dd573c07ab7f3934b5589e7cea3f89a54",
    ),
    _mp(
        "pose_detection",
        "pose_detection",
        "9ba9dd3d42efaaba86b4ff0122b06f29c4122e756b329d89dca1e297fd8f866c",
    ),
    _mp(
        "selfie_segmentation",
        "selfie_segmentation_landscape",
        "a77d03f4659b9f6b6c1f5106947bf40e99d7655094b6527f214ea7d451106edd",
    ),
)
BY_NAME = {m.name: m for m in MODELS}

#: What tests/test_corpus.py measures: built without torch, quick on the numpy reference.
CI_SUBSET = ("keras_mobilenetv3small", "mp_hand_recrop", "mp_iris_landmark", "mp_pose_detection")

GROUPS: dict[str, Callable[[CorpusModel], bool]] = {
    "all": lambda m: True,
    "torch": lambda m: m.is_torch,
    "torchvision": lambda m: m.source == "torchvision",
    "timm": lambda m: m.source == "timm",
    "keras": lambda m: m.source == "keras",
    "mediapipe": lambda m: m.source == "mediapipe",
    "ci": lambda m: m.name in CI_SUBSET,
}


def resolve(names: Sequence[str] | None) -> list[CorpusModel]:
    """Models by name or group, in corpus order."""
    wanted: set[str] = set()
    for n in names or ["all"]:
        if n in GROUPS:
            wanted |= {m.name for m in MODELS if GROUPS[n](m)}
        elif n in BY_NAME:
            wanted.add(n)
        else:
            raise SystemExit(f"unknown model or group {n!r} (see: scripts/corpus.py list)")
    return [m for m in MODELS if m.name in wanted]


# ------------------------------------------------------------------------------------ helpers


def _make_zoo() -> ModuleType:
    """scripts/make_zoo.py as a module: its wheel cache, converter and inspection."""
    if "make_zoo" in sys.modules:
        return sys.modules["make_zoo"]
    spec = importlib.util.spec_from_file_location("make_zoo", REPO / "scripts" / "make_zoo.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_zoo"] = module
    spec.loader.exec_module(module)
    return module


def write_atomic(path: Path, data: bytes) -> None:
    _make_zoo().write_atomic(path, data)


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _worker_result(stdout: str) -> dict[str, Any] | None:
    lines = [ln for ln in stdout.splitlines() if ln.startswith(MARK)]
    return json.loads(lines[-1][len(MARK) :]) if lines else None


def _tail(text: str, n: int = 2000) -> str:
    return text.strip()[-n:]


def _run_worker(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> Any:
    """Run a worker in its own process group; kill the group on timeout.

    Returns:
        (returncode or None on timeout, stdout, stderr, seconds).
    """
    t0 = time.perf_counter()
    pipe = subprocess.PIPE
    proc = subprocess.Popen(
        cmd, stdout=pipe, stderr=pipe, text=True, env=env, cwd=REPO, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        code = None
    return code, out or "", err or "", time.perf_counter() - t0


def _exit_description(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


# ----------------------------------------------------------------------------- the torch venv


def corpus_requirements() -> list[str]:
    """The ``corpus`` extra of pyproject.toml: what build/corpus-venv holds."""
    import tomllib  # Python 3.11+, as the corpus venv's torch wheel is

    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    return list(meta["project"]["optional-dependencies"]["corpus"])


def ensure_torch_venv() -> Path:
    """build/corpus-venv with the corpus extra's packages; made or topped up when needed.

    Idempotent like scripts/setup.sh: a stamp named by the requirements' digest marks a venv
    that holds them; pip's output goes to build/setup/corpus-venv.log.

    Returns:
        The venv's python.

    Raises:
        RuntimeError: venv or pip failed (the log's end is in the message).
    """
    python = TORCH_VENV / "bin" / "python"
    reqs = corpus_requirements()
    digest = hashlib.sha256("\n".join(reqs).encode()).hexdigest()[:12]
    stamp = TORCH_VENV / f".litekiln-corpus-{digest}"
    if stamp.exists():
        return python
    SETUP_LOGS.mkdir(parents=True, exist_ok=True)
    logfile = SETUP_LOGS / "corpus-venv.log"
    steps = []
    if not python.exists():
        log(f"corpus: creating {TORCH_VENV.relative_to(REPO)}")
        steps.append([sys.executable, "-m", "venv", str(TORCH_VENV)])
    log(f"corpus: installing {' '.join(reqs)} into {TORCH_VENV.relative_to(REPO)} (minutes)")
    steps.append([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *reqs])
    with logfile.open("w") as f:
        for cmd in steps:
            if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=False).returncode:
                raise RuntimeError(
                    f"{' '.join(cmd[:4])} ... failed:\n{_tail(logfile.read_text())}\n"
                    f"(log: {logfile})"
                )
    stamp.touch()
    return python


# -------------------------------------------------------------------------------- the manifest


def load_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
        data = json.loads(path.read_text())
        if data.get("schema") == MANIFEST_SCHEMA:
            return dict(data)
    return {"schema": MANIFEST_SCHEMA, "seed": SEED, "models": {}}


def record_build(folder: Path, record: dict[str, Any]) -> None:
    """Put one model's record into the manifest: re-read under a lock, so that two builds
    running at once (a CI subset beside a full build) keep each other's records."""
    import fcntl

    with (folder / f".{MANIFEST}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        manifest = load_manifest(folder)
        manifest["models"][record["name"]] = record
        order = [m.name for m in MODELS if m.name in manifest["models"]]
        manifest["models"] = {name: manifest["models"][name] for name in order}
        write_atomic(folder / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())


def is_built(model: CorpusModel, folder: Path, record: dict[str, Any] | None) -> str | None:
    """None if the model's file is there and matches its record and recipe; else why not."""
    path = folder / f"{model.name}.tflite"
    if not path.exists():
        return "missing"
    if not record or record.get("status") != "built":
        return "no record"
    if record.get("spec") != model.spec():
        return "recipe changed"
    if sha256_file(path) != record.get("sha256"):
        return "sha256 differs from the record"
    return None


# ------------------------------------------------------------------------------------- build


def build_keras(model: CorpusModel) -> tuple[bytes, dict[str, Any]]:
    """A Keras application with seeded random weights, converted by the TFLite converter
    (float32, no optimizations; or full-integer int8, `_keras`; scripts/probe also asks for
    ``dynamic``, int8 weights, ``fp16``, fp16 weights, and ``int16x8``, int16 activations)."""
    mz = _make_zoo()
    tf = mz._tf()
    import keras
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    with mz.quiet_stderr():
        keras.utils.set_random_seed(SEED)
        if model.constructor == "Sequential":
            net = _keras_sequential(keras, model)
        else:
            app = getattr(keras.applications, model.constructor)
            net = app(weights=None, input_shape=model.input_shape[1:], **model.kwargs)
            if model.quantize in ("int8", "int16x8", "dynamic"):  # (well-conditioned, `_keras`)
                mz._init_weights(net, SEED)
            else:
                _calibrate_batch_norms(keras, net, model.input_shape)
        spec = tf.TensorSpec(model.input_shape, tf.float32, name="input")
        serve = tf.function(lambda x: net(x, training=False), input_signature=[spec])
        # Frozen first, as make_zoo.convert explains: handed Keras 3's variables, the
        # converter keeps them as resource variables and leaves batch norm unfolded.
        frozen = convert_variables_to_constants_v2(serve.get_concrete_function())
        converter = tf.lite.TFLiteConverter.from_concrete_functions([frozen], tf.Module())
        if model.quantize in ("int8", "int16x8"):  # (16x8: scripts/probe)
            activations = "int16" if model.quantize == "int16x8" else "int8"
            mz.full_integer(converter, model.input_shape, SEED, activations)
        elif model.quantize in ("dynamic", "fp16"):  # (scripts/probe: weights only)
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            if model.quantize == "fp16":
                converter.target_spec.supported_types = [tf.float16]
        data = bytes(converter.convert())
    return data, {
        "parameters": int(net.count_params()),
        "versions": {"tensorflow": tf.__version__, "keras": keras.__version__},
    }


def _keras_sequential(keras: Any, model: CorpusModel) -> Any:
    """A ``_keras_rnn`` recipe's network: its recurrent layers, then the dense layer."""
    layers = []
    for spec in model.kwargs["layers"]:
        kwargs = dict(spec)
        layers.append(getattr(keras.layers, kwargs.pop("layer"))(**kwargs))
    return keras.Sequential(
        [
            keras.Input(model.input_shape[1:], batch_size=model.input_shape[0]),
            *layers,
            keras.layers.Dense(model.kwargs["dense"]),
        ]
    )


def _calibrate_batch_norms(keras: Any, net: Any, input_shape: tuple[int, ...]) -> None:
    """Give every batch norm the statistics of a seeded random batch (momentum 0, one
    training-mode call), then restore the momenta. With the initial statistics (mean 0,
    variance 1) a random network's activations shrink layer after layer: Keras'
    MobileNetV2 gave logits of 2e-11. Calibrated, they stay of order one, as in a trained
    network, and an accuracy check says something."""
    import numpy as np

    norms = [
        layer
        for layer in net._flatten_layers()
        if isinstance(layer, keras.layers.BatchNormalization)
    ]
    momenta = [layer.momentum for layer in norms]
    for layer in norms:
        layer.momentum = 0.0
    batch = np.random.default_rng(SEED).uniform(-1, 1, (8, *input_shape[1:])).astype(np.float32)
    net(batch, training=True)
    for layer, momentum in zip(norms, momenta, strict=True):
        layer.momentum = momentum


def build_mediapipe(model: CorpusModel, download: bool) -> tuple[bytes, dict[str, Any]]:
    """The file out of the mediapipe wheel (make_zoo's cache), checked against its digest."""
    import zipfile

    from litekiln import zoo

    mz = _make_zoo()
    cache = zoo.zoo_dir(None) / ".downloads"
    if not download and not any(cache.glob(f"mediapipe-{zoo.MEDIAPIPE_VERSION}-*.whl")):
        raise RuntimeError(f"no cached mediapipe wheel in {cache} (python scripts/make_zoo.py)")
    wheel = mz.find_or_download_wheel(cache, None)
    with zipfile.ZipFile(wheel) as zf:
        data = zf.read(model.constructor)
    digest = hashlib.sha256(data).hexdigest()
    if digest != model.sha256:
        raise RuntimeError(f"{model.constructor} has sha256 {digest}, expected {model.sha256}")
    return data, {"wheel": wheel.name, "wheel_member": model.constructor}


def build_one_here(name: str, out: Path, download: bool) -> dict[str, Any]:
    """The ``_build-one`` worker (litekiln's venv): a Keras or MediaPipe model into ``out``."""
    model = BY_NAME[name]
    if model.source == "keras":
        data, provenance = build_keras(model)
    else:
        data, provenance = build_mediapipe(model, download)
    write_atomic(out / f"{name}.tflite", data)
    return provenance


def _build_command(model: CorpusModel, out: Path, download: bool) -> list[str]:
    if model.is_torch:
        spec = {
            "library": model.source,
            "constructor": model.constructor,
            "kwargs": model.kwargs,
            "seed": SEED,
            "input_shape": list(model.input_shape),
            "out": str(out / f"{model.name}.tflite"),
        }
        return [str(ensure_torch_venv()), str(TORCH_WORKER), json.dumps(spec)]
    cmd = [sys.executable, str(Path(__file__).resolve()), "_build-one", model.name]
    return [*cmd, "--out", str(out), *([] if download else ["--no-download"])]


def build_model(
    model: CorpusModel, out: Path, timeout: float, download: bool = True
) -> dict[str, Any]:
    """Build one model in a subprocess; its manifest record (``status`` built or failed)."""
    record: dict[str, Any] = {"name": model.name, "spec": model.spec(), "note": model.note}
    path = out / f"{model.name}.tflite"
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a failed rebuild must not leave the old file looking current
    try:
        cmd = _build_command(model, out, download)
    except RuntimeError as exc:
        return {**record, "status": "failed", "error": str(exc)}
    code, stdout, stderr, seconds = _run_worker(cmd, timeout)
    record["build_seconds"] = round(seconds, 1)
    result = _worker_result(stdout)
    if code != 0 or result is None or not path.exists():
        why = f"timed out after {timeout:.0f} s" if code is None else _exit_description(code)
        error = _last_error_line(stderr) or why
        return {**record, "status": "failed", "error": f"{why}: {error}", "log": _tail(stderr)}
    data = path.read_bytes()
    info = _make_zoo().inspect_model(data)
    info["stored_parameters"] = stored_parameters(data)
    return {
        **record,
        "status": "built",
        "sha256": sha256_file(path),
        "size": path.stat().st_size,
        "built_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "provenance": result,
        **info,
    }


def stored_parameters(data: bytes) -> int:
    """Elements of the constant tensors stored in the file (weights, biases, shapes): the
    parameter count of any model, converted or not (fp16 weights count once)."""
    import numpy as np
    import tflite

    model = tflite.Model.GetRootAsModel(data, 0)
    graph = model.Subgraphs(0)
    total = 0
    for i in range(graph.TensorsLength()):
        t = graph.Tensors(i)
        buf = model.Buffers(t.Buffer())
        if buf is not None and (buf.DataLength() > 0 or buf.Offset() > 1):
            total += int(np.prod(t.ShapeAsNumpy())) if t.ShapeLength() else 1
    return total


def _last_error_line(text: str) -> str:
    """The last line of a traceback that names an exception (``SomeError: message``)."""
    for line in reversed(text.strip().splitlines()):
        if re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt)\b", line.strip()):
            return line.strip()[:500]
    return ""


def cmd_build(args: argparse.Namespace) -> int:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    manifest = load_manifest(out)
    failed = []
    t0 = time.perf_counter()
    for model in resolve(args.only):
        old = manifest["models"].get(model.name)
        problem = "forced" if args.force else is_built(model, out, old)
        if problem is None:
            log(f"present {model.name}")
            continue
        log(f"build   {model.name} ({problem}) ...")
        record = build_model(model, out, args.timeout, download=not args.no_download)
        record_build(out, record)
        if record["status"] == "built":
            size = record["size"] / 1e6
            log(f"  built  {size:6.1f} MB {record['num_ops']:4d} ops {record['build_seconds']} s")
        else:
            failed.append(model.name)
            log(f"  FAILED {record['error'][:300]}")
    done = len(resolve(args.only)) - len(failed)
    seconds = time.perf_counter() - t0
    log(f"{done} built or present, {len(failed)} failed in {seconds:.0f} s; {out / MANIFEST}")
    return 1 if failed else 0


# ----------------------------------------------------------------------------------- measure


def failure(exc: BaseException) -> dict[str, Any]:
    """An exception as the results record it: an error (litekiln refused, saying why) or a
    crash (any other exception, or a litekiln error that carries a traceback)."""
    from litekiln.errors import LitekilnError

    message = str(exc)
    crash = not isinstance(exc, LitekilnError) or "Traceback" in message
    frames = traceback.extract_tb(exc.__traceback__)
    where = ""
    for fr in reversed(frames):
        if "/litekiln/" in fr.filename or "/tvm/" in fr.filename:
            where = f"{_short_path(fr.filename)}:{fr.lineno} {fr.name}"
            break
    return {
        "kind": "crash" if crash else "error",
        "type": type(exc).__name__,
        "message": message[:3000],
        "signature": signature(type(exc).__name__, message),
        "where": where,
        "traceback": "".join(traceback.format_exception(exc))[-4000:],
    }


def _short_path(filename: str) -> str:
    for anchor in ("/litekiln/", "/tvm/"):
        if anchor in filename:
            return anchor.strip("/") + "/" + filename.split(anchor, 1)[1]
    return filename


def signature(type_name: str, message: str) -> str:
    """One line that groups like failures: the type and the message's most telling line
    (TVM puts its check after a C++ backtrace), numbers and quoted names blurred."""
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    telling = [ln for ln in lines if re.search(r"(Error|Check failed|error:)", ln)]
    line = (telling or lines or [""])[-1]
    line = re.sub(r"'[^']*'", "'…'", line)
    line = re.sub(r"\b\d+\b", "N", line)
    return f"{type_name}: {line}"[:200]


def gpu_form(op: Any) -> bool:
    """Whether litekiln has a GPU form of the op at all (either op table)."""
    from litekiln.errors import UnsupportedOpError
    from litekiln.ops import lookup

    try:
        cls = lookup(op)
    except UnsupportedOpError:
        return False
    return bool(cls.gpu or cls.gpu_extended)


def reason_kind(reason: str, has_form: bool) -> str:
    """Why a CPU op is there, in a few words that add up across models."""
    if not has_form:
        return "no GPU form"
    for pattern, kind in (
        (r"documented GPU op table \(op_table|extended table", "documented table only"),
        (r"^version \d+ >", "op version"),
        (r"partition limit|-partition limit", "partition limit"),
        (r"smaller than", "partition too small"),
        (r"between CPU ops", "partition cost"),
        (r"computed at run time", "run-time operand"),
        (r"has dtype|computes \w+ values|reads \w+ data", "non-float tensor"),
        (r"fused activation", "fused activation"),
    ):
        if re.search(pattern, reason):
            return kind
    return "GPU constraint"


class Stages:
    """The child's record, written to a file after every stage, so that a parent whose child
    timed out or died still reads how far it came."""

    def __init__(self, path: Path, name: str) -> None:
        self.path = path
        self.data: dict[str, Any] = {"name": name, "stages": {}, "running": None}

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, default=float))
        os.replace(tmp, self.path)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[dict[str, Any]]:
        """Run a stage; an exception is recorded (error or crash), never raised."""
        rec: dict[str, Any] = {"ok": False}
        self.data["stages"][name] = rec
        self.data["running"] = name
        self.save()
        t0 = time.perf_counter()
        try:
            yield rec
            rec["ok"] = True
        except Exception as exc:  # noqa: BLE001 - recording every failure is the point
            rec["failure"] = failure(exc)
        rec["seconds"] = round(time.perf_counter() - t0, 2)
        self.data["running"] = None
        self.save()


def compare(ours: list[Any], ref: list[Any]) -> dict[str, Any]:
    """The issue's metric, the error relative to each output's range (``range_err``: max
    over outputs of ``max|ours - LiteRT| / (max - min of LiteRT's output)``; an output with
    no range is taken relative to ``max(1, max|LiteRT|)``), and check.py's ``rel_err``
    (relative to ``max(1, max|LiteRT|)``) beside it."""
    import numpy as np

    from litekiln.check import integer_step_stats, relative_error, within_integer_bounds

    rel = relative_error(ours, ref)
    worst = 0.0
    for o, r in zip(ours, ref, strict=True):
        if not r.size:
            continue
        if o.shape != r.shape:
            worst = float("inf")
            continue
        r64 = r.astype(np.float64)
        diff = float(np.abs(o.astype(np.float64) - r64).max())
        span = float(np.ptp(r64))
        worst = max(worst, diff / span if span > 0 else diff / max(1.0, float(np.abs(r64).max())))
    out = {
        "rel_err": rel,
        "range_err": worst,
        "max_abs_ref": max((float(np.abs(r).max()) for r in ref if r.size), default=0.0),
        "match": bool(worst <= TOLERANCE),
    }
    if ref and all(r.dtype.kind in "iu" for r in ref):
        # An int8 model's outputs: the quantized-model bounds (`litekiln.check`), in
        # quantization steps of LiteRT's integers, not a float tolerance.
        mean_steps, within2 = integer_step_stats(ours, ref)
        out.update(mean_steps=mean_steps, within_2_steps=within2)
        out["match"] = within_integer_bounds(mean_steps, within2)
    return out


def measure_one_here(name: str, path: Path, progress: Path, opencl: bool = True) -> dict[str, Any]:
    """The ``_measure-one`` worker: every stage of one model, recorded as it goes (without
    ``opencl``, the stages before the compiler's)."""
    from litekiln.check import litert_outputs
    from litekiln.interpreter import Interpreter
    from litekiln.model import load_model
    from litekiln.placement import placement

    st = Stages(progress, name)
    with st.stage("load") as rec:
        model = load_model(str(path))
        rec["ops"] = len(model.main.ops)
        rec["folded"] = sum(op.folded for op in model.main.ops)
    if not st.data["stages"]["load"]["ok"]:
        return st.data
    with st.stage("placement") as rec:
        rec.update(_placement_record(model, placement))
    inputs: list[Any] = []
    ref: list[Any] | None = None
    with st.stage("litert") as rec:
        inputs = Interpreter(model_path=str(path), device="reference").random_inputs(INPUT_SEED)
        ref = litert_outputs(str(path), inputs)
        rec["outputs"] = [list(r.shape) for r in ref]
    by_reference: list[Any] | None = None
    with st.stage("reference") as rec:
        interp = Interpreter(model_path=str(path), device="reference")
        ours = interp.run(inputs or interp.random_inputs(INPUT_SEED))
        by_reference = ours
        if ref is not None:
            rec.update(compare(ours, ref))
    if not opencl:
        return st.data
    cache = Path(tempfile.mkdtemp(prefix="litekiln-corpus-cache-"))
    try:
        with st.stage("compile") as rec:
            # (cpu_first off: the first inference is the device's, compared below)
            interp = Interpreter(model_path=str(path), cache_dir=str(cache), cpu_first=False)
            t0 = time.perf_counter()
            interp.allocate_tensors()
            rec["allocate_seconds"] = round(time.perf_counter() - t0, 2)
            rec.update(_session_record(interp))
        if st.data["stages"]["compile"]["ok"]:
            with st.stage("opencl") as rec:
                ours = interp.run(inputs or interp.random_inputs(INPUT_SEED))
                if ref is not None:
                    rec.update(compare(ours, ref))
                elif by_reference is not None:
                    # LiteRT cannot run the model (MediaPipe's custom ops): the numpy
                    # reference, each op's semantics, is the oracle of the compiled model.
                    rec.update(compare(ours, by_reference), oracle="reference")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return st.data


def _placement_record(model: Any, placement: Callable[..., Any]) -> dict[str, Any]:
    info, plan = placement(model)
    ops = {op.index: op for op in model.main.ops}
    cpu = []
    for index, reason in plan.cpu_reasons.items():
        op = ops[index]
        has_form = gpu_form(op)
        cpu.append(
            {
                "index": index,
                "op": op.name,
                "version": op.version,
                "reason": reason,
                "kind": reason_kind(reason, has_form),
            }
        )
    return {
        "options": info["options"],
        "gpu_ops": info["gpu_ops"],
        "cpu_ops": info["cpu_ops"],
        "partitions": len(info["partitions"]),
        "op_histogram": info["op_histogram"],
        "cpu": cpu,
    }


def _session_record(interp: Any) -> dict[str, Any]:
    sess = interp._backend
    stats = getattr(getattr(sess, "compiled", None), "stats", {}) or {}
    return {
        "compile_seconds": (stats.get("timings_s") or {}).get("total"),
        "kernels": stats.get("kernels"),
        "device_build_seconds": round(float(getattr(sess, "load_seconds", 0.0)), 2),
        "device": str(getattr(sess, "device_name", "")),
    }


def measure_model(
    model: CorpusModel, folder: Path, timeout: float, *, opencl: bool = True
) -> dict[str, Any]:
    """Measure one model in a child process; a timeout or a death is recorded too.

    Args:
        model: the model (built in ``folder``).
        folder: the corpus folder.
        timeout: seconds for the child.
        opencl: also compile and run on the default OpenCL device.

    Returns:
        The model's record: ``stages`` (load, placement, litert, reference, compile, opencl;
        each with ``ok``, its figures and, when it failed, ``failure``), ``seconds``.
    """
    path = folder / f"{model.name}.tflite"
    with tempfile.TemporaryDirectory(prefix="corpus-measure-") as tmp:
        progress = Path(tmp) / "progress.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "_measure-one", model.name]
        cmd += ["--model", str(path), "--progress", str(progress)]
        cmd += [] if opencl else ["--no-opencl"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("LITEKILN_")}
        code, stdout, stderr, seconds = _run_worker(cmd, timeout, env)
        data = _worker_result(stdout)
        if data is None:
            with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
                data = json.loads(progress.read_text())
    data = data or {"name": model.name, "stages": {}, "running": "start"}
    if code != 0 or data.get("running"):
        stage = data.get("running") or "start"
        why = f"timed out after {timeout:.0f} s" if code is None else _exit_description(code)
        kind = "timeout" if code is None else "crash"
        data["stages"].setdefault(stage, {"ok": False})
        data["stages"][stage]["ok"] = False
        data["stages"][stage]["failure"] = {
            "kind": kind,
            "type": "Timeout" if code is None else "ProcessDied",
            "message": f"{why} in stage {stage}",
            "signature": f"{'Timeout' if code is None else 'ProcessDied'}: {why}",
            "where": "",
            "traceback": _tail(stderr),
        }
    data.pop("running", None)
    data["seconds"] = round(seconds, 1)
    data["source"] = model.source
    return data


# ------------------------------------------------------------------------- summary and report


STAGES = ("load", "placement", "litert", "reference", "compile", "opencl")


def verdict(m: dict[str, Any]) -> dict[str, Any]:
    """The per-model facts the summary and table count."""
    st = m["stages"]

    def ok(stage: str) -> bool:
        return bool(st.get(stage, {}).get("ok"))

    failures = {s: st[s]["failure"] for s in STAGES if s in st and "failure" in st[s]}
    ours = {s: f for s, f in failures.items() if s != "litert"}
    place = st.get("placement", {})
    cpu = place.get("cpu", [])
    whole = (
        ok("placement")
        and place.get("partitions") == 1
        and all(c["kind"] == "no GPU form" for c in cpu)
    )
    return {
        "load": ok("load"),
        "compile": ok("compile"),
        "litert_ok": ok("litert"),
        "reference_match": ok("reference") and bool(st["reference"].get("match")),
        "opencl_match": ok("opencl") and bool(st["opencl"].get("match")),
        "whole_on_gpu": bool(whole),
        "crashes": {s: f for s, f in ours.items() if f["kind"] == "crash"},
        "timeouts": {s: f for s, f in ours.items() if f["kind"] == "timeout"},
        "errors": {s: f for s, f in ours.items() if f["kind"] == "error"},
    }


def summarize(models: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(models)
    v = [verdict(m) for m in models]

    def pct(key: str) -> dict[str, Any]:
        k = sum(bool(x[key]) for x in v)
        return {"count": k, "of": n, "percent": round(100.0 * k / n, 1) if n else 0.0}

    all_three = [x["load"] and x["compile"] and x["opencl_match"] for x in v]
    crash_sigs: Counter[str] = Counter()
    compiler_crashes = 0
    for x in v:
        for stage, f in x["crashes"].items():
            crash_sigs[f"{stage}: {f['signature']}"] += 1
            compiler_crashes += stage == "compile"
    reasons: Counter[str] = Counter()
    reason_models: dict[str, set[str]] = {}
    kinds: Counter[str] = Counter()
    for m in models:
        for c in m["stages"].get("placement", {}).get("cpu", []):
            key = f"{c['op']} v{c['version']}: {c['reason']}"
            reasons[key] += 1
            reason_models.setdefault(key, set()).add(m["name"])
            kinds[c["kind"]] += 1
    return {
        "models": n,
        "load": pct("load"),
        "compile": pct("compile"),
        "reference_match": pct("reference_match"),
        "opencl_match": pct("opencl_match"),
        "load_compile_match": {
            "count": sum(all_three),
            "of": n,
            "percent": round(100.0 * sum(all_three) / n, 1) if n else 0.0,
        },
        "whole_on_gpu": pct("whole_on_gpu"),
        "models_with_crash": sum(bool(x["crashes"]) for x in v),
        "compiler_crashes": compiler_crashes,
        "timeouts": sum(bool(x["timeouts"]) for x in v),
        "crash_signatures": dict(crash_sigs.most_common()),
        "cpu_op_kinds": dict(kinds.most_common()),
        "cpu_reasons": [
            {"reason": r, "ops": k, "models": len(reason_models[r])}
            for r, k in sorted(reasons.items(), key=lambda kv: (-len(reason_models[kv[0]]), -kv[1]))
        ],
    }


def _fmt_err(stage: dict[str, Any] | None) -> str:
    if not stage:
        return "–"
    if "failure" in stage:
        return stage["failure"]["kind"]
    if "rel_err" not in stage:
        return "n/a"
    mark = "" if stage["match"] else " ✗"
    if "mean_steps" in stage:  # an int8 model: LiteRT's integers, in quantization steps
        return f"{stage['mean_steps']:.2f} steps, {100 * stage['within_2_steps']:.1f}% <= 2{mark}"
    against = " vs the reference" if stage.get("oracle") == "reference" else ""
    return f"{stage['rel_err']:.1e}{against}{mark}"


def _result_word(x: dict[str, Any]) -> str:
    if x["crashes"]:
        stage, f = next(iter(x["crashes"].items()))
        return f"**crash** ({stage}: {f['type']})"
    if x["timeouts"]:
        return f"timeout ({next(iter(x['timeouts']))})"
    if x["errors"]:
        stage, f = next(iter(x["errors"].items()))
        return f"error ({stage}: {f['type']})"
    if not x["litert_ok"]:
        return "LiteRT fails; ok vs the reference" if x["opencl_match"] else "LiteRT fails"
    if x["opencl_match"] and x["reference_match"]:
        return "ok"
    return "mismatch"


def markdown(results: dict[str, Any]) -> str:
    """The table and summary docs/corpus.md commits."""
    s = results["summary"]
    lines = [
        f"Measured {results['date']} on {results['machine']['device']} "
        f"(`{results['command']}`; litekiln {results['versions'].get('litekiln', '?')}, "
        f"commit {results['git']['commit'][:10]}"
        + (", working tree with uncommitted changes" if results["git"]["dirty"] else "")
        + f"; {results['seconds'] / 60:.0f} min; raw: "
        f"[{results['json_path']}](../{results['json_path']})).",
        "",
    ]
    lines += _summary_lines(s)
    lines += [
        "",
        "| model | source | input | params | MB | ops | GPU / CPU ops | partitions | reference "
        "| OpenCL | compile s | result |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for m in results["models"]:
        x = verdict(m)
        st = m["stages"]
        place = st.get("placement", {})
        ops = st.get("load", {}).get("ops", "–")
        gc = f"{place['gpu_ops']} / {place['cpu_ops']}" if "gpu_ops" in place else "–"
        comp = st.get("compile", {}).get("compile_seconds")
        lines.append(
            f"| {m['name']} | {m['source']} | {_build_cells(m.get('build', {}))} | {ops} | {gc} "
            f"| {place.get('partitions', '–')} "
            f"| {_fmt_err(st.get('reference'))} | {_fmt_err(st.get('opencl'))} "
            f"| {f'{comp:.1f}' if comp else '–'} | {_result_word(x)} |"
        )
    lines += ["", "### Crashes and errors, by signature", ""]
    lines += _failure_lines(results["models"])
    lines += ["", "### Why ops stay on the CPU (most common first)", ""]
    lines += ["| op: reason | models | ops |", "| --- | ---: | ---: |"]
    if not s["cpu_reasons"]:
        lines.append("| none: every op of every model runs on the GPU | | |")
    for r in s["cpu_reasons"][:25]:
        lines.append(f"| {r['reason'].replace('|', '/')} | {r['models']} | {r['ops']} |")
    if len(s["cpu_reasons"]) > 25:
        lines.append(f"| ({len(s['cpu_reasons']) - 25} more in the JSON) | | |")
    return "\n".join(lines) + "\n"


def _build_cells(b: dict[str, Any]) -> str:
    """input | params | MB."""
    shape = "x".join(map(str, b["inputs"][0])) if b.get("inputs") else "–"
    params = f"{b['parameters'] / 1e6:.1f} M" if b.get("parameters") else "–"
    size = f"{b['size'] / 1e6:.1f}" if b.get("size") else "–"
    return f"{shape} | {params} | {size}"


def _summary_lines(s: dict[str, Any]) -> list[str]:
    def p(key: str) -> str:
        return f"{s[key]['percent']:.0f}% ({s[key]['count']}/{s[key]['of']})"

    kinds = ", ".join(f"{k} {n}" for k, n in s["cpu_op_kinds"].items()) or "none"
    return [
        f"- **load, compile and match LiteRT within 1e-4 (int8 models: the quantized bounds, "
        f"mean <= 1 step, 95% within 2) (OpenCL; where LiteRT cannot run a model, the numpy "
        f"reference): {p('load_compile_match')}**",
        f"- load: {p('load')}; compile: {p('compile')}; numpy reference matches LiteRT: "
        f"{p('reference_match')}; OpenCL matches LiteRT (or the reference where LiteRT "
        f"fails): {p('opencl_match')}",
        f"- **whole on the GPU** (one partition, only ops with no GPU form on the CPU): "
        f"**{p('whole_on_gpu')}**",
        f"- **compiler crashes: {s['compiler_crashes']}**; models with any crash: "
        f"{s['models_with_crash']}; timeouts: {s['timeouts']}",
        f"- CPU ops by kind, over all models: {kinds}",
    ]


def _failure_lines(models: list[dict[str, Any]]) -> list[str]:
    groups: dict[tuple[str, str, str], list[str]] = {}
    for m in models:
        for stage in STAGES:
            f = m["stages"].get(stage, {}).get("failure")
            if f:
                where = f" (at {f['where']})" if f.get("where") else ""
                key = (f["kind"], stage, f["signature"] + where)
                groups.setdefault(key, []).append(m["name"])
    if not groups:
        return ["None."]
    rows = ["| kind | stage | signature | models |", "| --- | --- | --- | --- |"]
    order = {"crash": 0, "timeout": 1, "error": 2}
    for (kind, stage, sig), names in sorted(groups.items(), key=lambda kv: order[kv[0][0]]):
        sig = sig.replace("|", "/").replace("\n", " ")
        rows.append(f"| {kind} | {stage} | `{sig}` | {', '.join(names)} |")
    return rows


def _git_state() -> dict[str, Any]:
    def git(*a: str) -> str:
        p = subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True, check=False)
        return p.stdout.strip()

    changed = [ln[3:] for ln in git("status", "--porcelain").splitlines() if ln[:2] != "??"]
    changed = [c for c in changed if c.startswith("litekiln/")]
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(changed), "changed": changed}


def _environment() -> dict[str, Any]:
    """Versions and machine (in this, the parent's, process: the children share both)."""
    import importlib.metadata as md

    versions = {}
    for dist in ("litekiln", "apache-tvm", "ai-edge-litert", "numpy", "pyopencl", "tensorflow-cpu"):
        with contextlib.suppress(md.PackageNotFoundError):
            versions[dist] = md.version(dist)
    from litekiln.version import __version__

    versions["litekiln"] = __version__
    device = ""
    with contextlib.suppress(Exception):
        from litekiln.runtime.device import DeviceOpener

        device = DeviceOpener(None).result().description
    return {
        "versions": versions,
        "machine": {
            "device": device,
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        },
    }


def cmd_measure(args: argparse.Namespace) -> int:
    folder: Path = args.corpus
    manifest = load_manifest(folder)
    started = _dt.datetime.now(_dt.timezone.utc)
    t0 = time.perf_counter()
    models: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    date = started.date().isoformat()
    out = Path(args.json) if args.json else RESULTS_DIR / f"{date}.json"
    environment, git = _environment(), _git_state()
    todo = list(resolve(args.only))

    def snapshot(left: list[str]) -> dict[str, Any]:
        """The results so far; ``models_left``: the requested models not measured yet (the
        file is rewritten after each model, so a run stopped early keeps what it measured)."""
        return {
            "schema": 1,
            "date": date,
            "started": started.isoformat(timespec="seconds"),
            "command": " ".join(["python scripts/corpus.py", *args.argv]),
            "json_path": _rel(out),
            "tolerance": TOLERANCE,
            "metric": "max|ours - LiteRT| / max(1, max|LiteRT|) over all outputs",
            "input_seed": INPUT_SEED,
            "defaults": "litekiln.Interpreter(model_path=...) with no LITEKILN_* variables set",
            "git": git,
            **environment,
            "seconds": round(time.perf_counter() - t0, 1),
            "summary": summarize(models),
            "not_built": skipped,
            **({"models_left": left} if left else {}),
            "models": models,
        }

    for k, model in enumerate(todo):
        problem = is_built(model, folder, manifest["models"].get(model.name))
        if problem is not None:
            error = manifest["models"].get(model.name, {}).get("error")
            skipped.append({"name": model.name, "why": problem, "build_error": error})
            log(f"skip    {model.name}: not built ({problem})")
            continue
        log(f"measure {model.name} ...")
        m = measure_model(model, folder, args.timeout, opencl=not args.no_opencl)
        m["build"] = _build_facts(manifest["models"][model.name])
        x = verdict(m)
        ref, ocl = (_fmt_err(m["stages"].get(s)) for s in ("reference", "opencl"))
        log(f"  {_result_word(x)}  reference {ref}  OpenCL {ocl}  {m['seconds']} s")
        models.append(m)
        left = [later.name for later in todo[k + 1 :]]
        if left:
            write_atomic(out, (json.dumps(snapshot(left), indent=1, default=float) + "\n").encode())
    results = snapshot([])
    write_atomic(out, (json.dumps(results, indent=1, default=float) + "\n").encode())
    log(f"results: {out}")
    text = markdown(results)
    if args.markdown:
        sys.stdout.write(text)
    else:
        log("\n".join(_summary_lines(results["summary"])))
    return 1 if results["summary"]["models_with_crash"] else 0


def _build_facts(record: dict[str, Any]) -> dict[str, Any]:
    """What the results repeat of a model's manifest record."""
    provenance = record.get("provenance", {})
    return {
        "spec": record["spec"],
        "sha256": record["sha256"],
        "size": record["size"],
        "parameters": provenance.get("parameters") or record.get("stored_parameters"),
        "inputs": [t["shape"] for t in record.get("inputs", [])],
        "litert_vs_torch": provenance.get("litert_vs_torch"),
    }


def _rel(path: Path) -> str:
    with contextlib.suppress(ValueError):
        return str(path.resolve().relative_to(REPO))
    return str(path)


BEGIN, END = "<!-- corpus-table: begin -->", "<!-- corpus-table: end -->"


def cmd_report(args: argparse.Namespace) -> int:
    results = json.loads(Path(args.results).read_text())
    text = markdown(results)
    if not args.update_doc:
        sys.stdout.write(text)
        return 0
    doc = DOC.read_text()
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{text}{END}{tail}")
    log(f"updated {_rel(DOC)}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    manifest = load_manifest(args.out)
    for m in MODELS:
        rec = manifest["models"].get(m.name)
        state = "built" if is_built(m, args.out, rec) is None else (rec or {}).get("status", "-")
        shape = "x".join(map(str, m.input_shape)) if m.input_shape else "(file)"
        print(f"{m.name:38s} {m.source:12s} {shape:14s} {state}")
    return 0


# -------------------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Build and measure the external corpus (docs/corpus.md).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("Commands::", 1)[1] if __doc__ else None,
    )
    sub = p.add_subparsers(dest="command", required=True)
    only = {"nargs": "+", "metavar": "NAME", "help": "models or groups (" + ", ".join(GROUPS) + ")"}

    b = sub.add_parser("build", help="materialise the models into models/corpus/")
    b.add_argument("--only", **only)  # type: ignore[arg-type]
    b.add_argument("--out", type=Path, default=CORPUS_DIR)
    b.add_argument("--timeout", type=float, default=BUILD_TIMEOUT_S, help="seconds per model")
    b.add_argument("--force", action="store_true", help="rebuild models that are present")
    b.add_argument("--no-download", action="store_true", help="use only the cached wheel")

    m = sub.add_parser("measure", help="measure the built models; JSON to results/corpus/")
    m.add_argument("--only", **only)  # type: ignore[arg-type]
    m.add_argument("--corpus", type=Path, default=CORPUS_DIR)
    m.add_argument("--json", metavar="OUT", help="results file (default results/corpus/DATE.json)")
    m.add_argument("--markdown", action="store_true", help="print the table for docs/corpus.md")
    m.add_argument("--timeout", type=float, default=MEASURE_TIMEOUT_S, help="seconds per model")
    m.add_argument("--no-opencl", action="store_true", help="stop before the compiler (quick)")

    r = sub.add_parser("report", help="the markdown table of a results file")
    r.add_argument("results")
    r.add_argument("--update-doc", action="store_true", help=f"replace the table in {_rel(DOC)}")

    ls = sub.add_parser("list", help="the models and whether each is built")
    ls.add_argument("--out", type=Path, default=CORPUS_DIR)

    w = sub.add_parser("_build-one")  # workers, started by build and measure
    w.add_argument("name")
    w.add_argument("--out", type=Path, required=True)
    w.add_argument("--no-download", action="store_true")
    w = sub.add_parser("_measure-one")
    w.add_argument("name")
    w.add_argument("--model", type=Path, required=True)
    w.add_argument("--progress", type=Path, required=True)
    w.add_argument("--no-opencl", action="store_true")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.command == "_build-one":
        result = build_one_here(args.name, args.out, not args.no_download)
        print(MARK + json.dumps(result), flush=True)
        return 0
    if args.command == "_measure-one":
        data = measure_one_here(args.name, args.model, args.progress, not args.no_opencl)
        print(MARK + json.dumps(data, default=float), flush=True)
        return 0
    commands = {"build": cmd_build, "measure": cmd_measure, "report": cmd_report}
    return commands.get(args.command, cmd_list)(args)


if __name__ == "__main__":
    sys.exit(main())
