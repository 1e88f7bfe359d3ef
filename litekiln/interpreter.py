"""``litekiln.Interpreter``: the app-side API, shaped like LiteRT's ``Interpreter``.

Code written against LiteRT's Python interpreter works unchanged: ``allocate_tensors``,
``get_input_details``, ``get_output_details``, ``set_tensor``, ``invoke``, ``get_tensor``,
``tensor``, ``get_tensor_details``, ``get_signature_list``, ``get_signature_runner``; the
detail dicts and tensor indices are LiteRT's. litekiln adds keyword options (device,
precision, cache) and never needs TVM when the compiled model is already cached.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Literal, overload

import numpy as np

# Imported with the module, not at the first Interpreter: an app imports litekiln once at
# start-up, and every later Interpreter construction is then only model parsing, the cache
# hit and the device work. The loading layer brings the flatbuffer readers, the op registry,
# pyopencl (~30 ms here, ~250 ms on the H100) and the cache: ~100-200 ms of imports together.
import litekiln.model.schema  # noqa: F401  (op names and options, read while parsing)
from litekiln import config
from litekiln.errors import InputError
from litekiln.loading import open_session
from litekiln.model import Model, Tensor, load_model
from litekiln.reference import run_graph
from litekiln.runtime.device import DeviceOpener

REFERENCE = "reference"


class Interpreter:
    """Run a TFLite model on the GPU through OpenCL (or on the numpy reference).

    Args:
        model_path: path of a ``.tflite`` file.
        model_content: the model's bytes (instead of ``model_path``).
        experimental_delegates: accepted for LiteRT compatibility; must be empty.
        num_threads: accepted for LiteRT compatibility; not used: the GPU runs the kernels,
            and the few ops left on the CPU run on numpy in the calling thread.
        device: ``"reference"`` for the numpy reference on the CPU; otherwise an OpenCL
            device choice (``"gpu"``, ``"opencl"``, ``"P:D"`` indices or a name substring).
            Default ``$LITEKILN_DEVICE``, else the first OpenCL GPU, else the first device.
        precision: ``"fp32"`` (default) or ``"fp16"``.
        cache_dir: the compiled-model cache directory (default: XDG cache dir).
        model_token: identity of the model in the cache (default: farmhash Fingerprint64
            of the model bytes).
        options: further compiler/runtime options (see :mod:`litekiln.config`).

    Raises:
        ModelError: the model cannot be loaded.
        DeviceError: no usable OpenCL device.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        model_content: bytes | None = None,
        experimental_delegates: list[Any] | None = None,
        num_threads: int | None = None,
        *,
        device: str | None = None,
        precision: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        model_token: str | None = None,
        **options: Any,
    ) -> None:
        if (model_path is None) == (model_content is None):
            raise ValueError("give exactly one of model_path or model_content")
        if num_threads is not None and (not isinstance(num_threads, int) or num_threads < -1):
            raise ValueError(f"num_threads must be an int >= -1 or None, got {num_threads!r}")
        self.num_threads = num_threads
        if experimental_delegates:
            raise ValueError(
                "litekiln is itself the GPU path; experimental_delegates must be empty"
            )
        self._device_choice = config.DEVICE.get(device) or ""
        # The OpenCL driver starts up (and the context is made) in the background while the
        # model is parsed; allocate_tensors() waits for it.
        self._opener = (
            DeviceOpener(self._device_choice or None) if self._device_choice != REFERENCE else None
        )
        source = model_path if model_path is not None else model_content
        assert source is not None
        self._model: Model = load_model(source, token=model_token)
        self._graph = self._model.main
        self._precision = config.PRECISION.get(precision)
        self._cache_dir = os.fspath(cache_dir) if cache_dir is not None else None
        self._options = options
        self._inputs: dict[int, np.ndarray] = {}
        self._values: dict[int, np.ndarray] = {}
        self._backend: Any = None

    # -- LiteRT API -------------------------------------------------------------------------

    def allocate_tensors(self) -> None:
        """Prepare execution: compile (or load from the cache) and allocate device memory."""
        if self._backend is not None:
            return
        if self._device_choice == REFERENCE:
            self._backend = _ReferenceBackend(self._model)
        else:
            assert self._opener is not None
            self._backend = open_session(
                self._model,
                device=self._opener,
                precision=self._precision,
                cache_dir=self._cache_dir,
                **self._options,
            )

    @property
    def device(self) -> str:
        """Where the model runs, in words (``"reference (numpy)"`` or the OpenCL device)."""
        self.allocate_tensors()
        return str(self._backend.device_name)

    @property
    def model(self) -> Model:
        """The loaded graph IR."""
        return self._model

    def get_input_details(self) -> list[dict[str, Any]]:
        return [self._details(self._graph.tensors[t]) for t in self._graph.inputs]

    def get_output_details(self) -> list[dict[str, Any]]:
        return [self._details(self._graph.tensors[t]) for t in self._graph.outputs]

    def get_tensor_details(self) -> list[dict[str, Any]]:
        return [self._details(t) for t in self._graph.tensors]

    def set_tensor(self, tensor_index: int, value: Any) -> None:
        """Set a graph input. The value must have the input's exact shape and dtype.

        Raises:
            InputError: not an input index, or a wrong shape or dtype.
        """
        t = self._input_tensor(tensor_index)
        arr = np.asarray(value)
        if arr.dtype != t.dtype:
            raise InputError(
                f"input {tensor_index} ({t.name!r}) expects dtype {t.dtype.name}, got "
                f"{arr.dtype.name}; convert with .astype(np.{t.dtype.name})"
            )
        if arr.shape != t.shape:
            raise InputError(
                f"input {tensor_index} ({t.name!r}) expects shape {list(t.shape)}, got "
                f"{list(arr.shape)}"
            )
        self._inputs[tensor_index] = np.ascontiguousarray(arr)

    def resize_tensor_input(self, input_index: int, tensor_size: Any, strict: bool = False) -> None:
        """Only the compiled (static) shape is accepted: the plan is static.

        Raises:
            InputError: the requested shape differs from the model's.
        """
        t = self._input_tensor(input_index)
        shape = tuple(int(d) for d in tensor_size)
        signature = t.shape_signature or t.shape
        if strict and (
            len(shape) != len(signature)
            or any(d != -1 and d != n for d, n in zip(signature, shape, strict=True))
        ):
            raise InputError(
                f"input {input_index} ({t.name!r}): strict resizing may change only the "
                f"dimensions the model leaves open (-1 in {list(signature)}), got {list(shape)}"
            )
        if shape != t.shape:
            raise InputError(
                f"input {input_index} ({t.name!r}): litekiln compiles static shapes; the model's "
                f"shape is {list(t.shape)}, resizing to {list(shape)} is not supported"
            )

    def invoke(self) -> None:
        """Run the model on the inputs set with :meth:`set_tensor`.

        Raises:
            InputError: an input has not been set.
        """
        self.allocate_tensors()
        missing = [t for t in self._graph.inputs if t not in self._inputs]
        if missing:
            names = ", ".join(f"{t} ({self._graph.tensors[t].name!r})" for t in missing)
            raise InputError(f"inputs not set before invoke(): {names}; call set_tensor first")
        self._values = self._backend.run(self._inputs)

    def get_tensor(self, tensor_index: int, subgraph_index: int = 0) -> np.ndarray:
        """A copy of a tensor's value after :meth:`invoke` (outputs, inputs, constants).

        Raises:
            InputError: unknown index, or a tensor whose value is not kept.
        """
        if subgraph_index != 0:
            raise InputError("only subgraph 0 is executed")
        if not 0 <= tensor_index < len(self._graph.tensors):
            raise InputError(
                f"tensor index {tensor_index} out of range: the model has "
                f"{len(self._graph.tensors)} tensors"
            )
        if tensor_index in self._values:
            return np.array(self._values[tensor_index], copy=True)
        if tensor_index in self._inputs:
            return np.array(self._inputs[tensor_index], copy=True)
        data = self._graph.tensors[tensor_index].data
        if data is not None:
            return np.array(data, copy=True)
        if tensor_index in self._graph.outputs:
            raise InputError(f"tensor {tensor_index} has no value yet: call invoke() first")
        raise InputError(
            f"tensor {tensor_index} ({self._graph.tensors[tensor_index].name!r}) is an "
            "intermediate tensor, whose value is not kept on the GPU path; use "
            "device='reference' or run(..., intermediates=True) to inspect it"
        )

    def tensor(self, tensor_index: int) -> Callable[[], np.ndarray]:
        """LiteRT's accessor: a callable returning the tensor's current value."""
        return lambda: self.get_tensor(tensor_index)

    def get_signature_list(self) -> dict[str, dict[str, list[str]]]:
        return {
            s.key: {"inputs": list(s.inputs), "outputs": list(s.outputs)}
            for s in self._model.signatures
        }

    def get_signature_runner(
        self, signature_key: str | None = None
    ) -> Callable[..., dict[str, np.ndarray]]:
        """A callable taking named inputs and returning named outputs, as LiteRT's runner."""
        sigs = {s.key: s for s in self._model.signatures}
        if signature_key is None and len(sigs) == 1:
            signature_key = next(iter(sigs))
        if signature_key not in sigs:
            raise InputError(f"no signature {signature_key!r}; the model has {sorted(sigs)}")
        sig = sigs[signature_key]

        def runner(**kwargs: Any) -> dict[str, np.ndarray]:
            unknown = set(kwargs) - set(sig.inputs)
            if unknown:
                raise InputError(f"unknown inputs {sorted(unknown)}; expected {sorted(sig.inputs)}")
            for name, value in kwargs.items():
                self.set_tensor(sig.inputs[name], value)
            self.invoke()
            return {name: self.get_tensor(t) for name, t in sig.outputs.items()}

        return runner

    def num_subgraphs(self) -> int:
        return len(self._model.subgraphs)

    # -- litekiln additions -------------------------------------------------------------------

    @overload
    def run(self, inputs: Any, *, intermediates: Literal[False] = False) -> list[np.ndarray]: ...

    @overload
    def run(self, inputs: Any, *, intermediates: Literal[True]) -> dict[int, np.ndarray]: ...

    def run(
        self, inputs: Any, *, intermediates: bool = False
    ) -> list[np.ndarray] | dict[int, np.ndarray]:
        """One call inference: inputs as a list (graph order) or {index: array}.

        Returns:
            The outputs in graph order, or with ``intermediates=True`` every tensor value the
            execution kept (all tensors on the reference device).
        """
        if not isinstance(inputs, dict):
            inputs = list(inputs)
            if len(inputs) != len(self._graph.inputs):
                raise InputError(
                    f"{len(inputs)} inputs given; the model has {len(self._graph.inputs)} "
                    f"({[self._graph.tensors[t].name for t in self._graph.inputs]})"
                )
            inputs = dict(zip(self._graph.inputs, inputs, strict=True))
        for t, v in inputs.items():
            self.set_tensor(t, v)
        self.invoke()
        if intermediates:
            # Copies: the GPU session reuses its output buffers on the next inference.
            return {t: np.array(v, copy=True) for t, v in self._values.items()}
        return [self.get_tensor(t) for t in self._graph.outputs]

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Seeded random inputs of the right shapes and dtypes (uniform in the input's range)."""
        return random_inputs(self._model, seed)

    # -- helpers ------------------------------------------------------------------------------

    def _input_tensor(self, index: int) -> Tensor:
        if index not in self._graph.inputs:
            raise InputError(
                f"tensor {index} is not a graph input; inputs are "
                f"{[(t, self._graph.tensors[t].name) for t in self._graph.inputs]}"
            )
        return self._graph.tensors[index]

    @staticmethod
    def _details(t: Tensor) -> dict[str, Any]:
        q = t.quantization
        scales = q.scale.astype(np.float32) if q is not None else np.zeros(0, np.float32)
        zps = q.zero_point.astype(np.int32) if q is not None else np.zeros(0, np.int32)
        return {
            "name": t.name,
            "index": t.index,
            "shape": np.asarray(t.shape, dtype=np.int32),
            "shape_signature": np.asarray(t.shape_signature or t.shape, dtype=np.int32),
            "dtype": t.dtype.type,
            "quantization": (float(scales[0]), int(zps[0])) if scales.size == 1 else (0.0, 0),
            "quantization_parameters": {
                "scales": scales,
                "zero_points": zps,
                "quantized_dimension": int(q.axis) if q is not None else 0,
            },
            "sparsity_parameters": {},
        }


class _ReferenceBackend:
    """``device="reference"``: every op on the numpy reference, all values kept."""

    device_name = "reference (numpy, CPU)"

    def __init__(self, model: Model) -> None:
        self._graph = model.main

    def run(self, inputs: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        return run_graph(self._graph, inputs, intermediates=True)


def random_inputs(model: Model, seed: int = 0) -> list[np.ndarray]:
    """Seeded random values for each graph input: floats in [-1, 1), integers over their range."""
    rng = np.random.default_rng(seed)
    out = []
    for t in model.main.inputs:
        tensor = model.main.tensors[t]
        if tensor.dtype.kind == "f":
            out.append(rng.uniform(-1, 1, tensor.shape).astype(tensor.dtype))
        elif tensor.dtype.kind == "b":
            out.append(rng.integers(0, 2, tensor.shape).astype(bool))
        else:
            info = np.iinfo(tensor.dtype)
            lo, hi = max(info.min, -128), min(info.max, 127)
            out.append(rng.integers(lo, hi + 1, tensor.shape).astype(tensor.dtype))
    return out
