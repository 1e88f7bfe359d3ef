"""``litekiln.Interpreter``: the app-side API, shaped like LiteRT's ``Interpreter``.

Code written against LiteRT's Python interpreter works unchanged: the constructor's
arguments, ``allocate_tensors``, ``get_input_details``, ``get_output_details``,
``get_tensor_details``, ``set_tensor``, ``resize_tensor_input``, ``invoke``, ``get_tensor``,
``tensor``, ``reset_all_variables``, ``get_signature_list``, ``get_signature_runner`` (a
runner object with LiteRT's methods), ``num_subgraphs``; the detail dicts and tensor indices
are LiteRT's. litekiln adds keyword options (device, precision, cache) and never needs TVM
when the compiled model is already cached.

Threads: one Interpreter may serve several threads. Each thread has its own inputs (what it
set, or wrote through ``tensor()``) and its own outputs (those of its own last ``invoke``);
inferences run one at a time. A thread therefore never reads another thread's results.
"""

from __future__ import annotations

# First: on NVIDIA the CUDA driver starts in a thread while numpy and the rest import.
from litekiln.runtime import early  # isort: split

early.start_cuda()

import logging
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np

from litekiln import config
from litekiln.errors import DeviceError, InputError
from litekiln.loading import open_device
from litekiln.runtime.threads import cpu_thread_limit

if TYPE_CHECKING:
    from litekiln.model import Model, SignatureDef, Tensor
    from litekiln.runtime.device import DeviceHandle, DeviceOpener

# The rest of litekiln (the flatbuffer readers, the op registry the parser checks every op
# against, the compiled-model format, the runtime session: ~100 ms of imports on the H100) is
# imported by the first Interpreter, right after it has set the device opening: the imports
# then overlap the driver's start-up (a CUDA context: ~240 ms there) instead of preceding it.
# Later Interpreters find them imported.

REFERENCE = "reference"
log = logging.getLogger("litekiln")
_NO_STAGES: dict[int, np.ndarray] = {}

#: LiteRT's experimental constructor flags that change nothing litekiln does (delegate
#: clustering, node fusion and profiling of LiteRT's own delegates); accepted as booleans.
_LITERT_FLAGS = (
    "experimental_disable_delegate_clustering",
    "experimental_default_delegate_latest_features",
    "experimental_compress_quantization_zero_points",
    "experimental_disable_delegate_node_fusion",
    "experimental_force_delegate_node_profiling",
)
#: LiteRT's op resolvers: all of them resolve to litekiln's own registry.
_RESOLVERS = ("AUTO", "BUILTIN", "BUILTIN_REF", "BUILTIN_WITHOUT_DEFAULT_DELEGATES")


class _ThreadState:
    """One thread's view of an Interpreter: its input buffers and its last results."""

    def __init__(self) -> None:
        self.inputs: dict[int, np.ndarray] = {}  # written by set_tensor / through tensor()
        self.values: dict[int, np.ndarray] | None = None  # its last invoke's tensors
        self.zeros: dict[int, np.ndarray] = {}  # outputs read before any invoke


class Interpreter:
    """Run a TFLite model on the GPU through OpenCL (or on the numpy reference).

    Args:
        model_path: path of a ``.tflite`` file.
        model_content: the model's bytes (instead of ``model_path``).
        experimental_delegates: accepted for LiteRT compatibility; must be empty (litekiln
            is itself the GPU path).
        num_threads: threads the CPU ops may use (their matrix products); None: numpy's
            default. An int >= 1, as for LiteRT.
        experimental_op_resolver_type: LiteRT's op resolver choice; every value runs
            litekiln's own ops.
        experimental_preserve_all_tensors: keep every intermediate tensor readable after
            ``invoke`` (on the GPU too: each becomes an output of its partition).
        device: ``"reference"`` for the numpy reference on the CPU; otherwise an OpenCL
            device choice (``"gpu"``, ``"opencl"``, ``"P:D"`` indices or a name substring).
            Default ``$LITEKILN_DEVICE``, else the first OpenCL GPU, else the first device.
        precision: ``"fp32"`` (default) or ``"fp16"``.
        cache_dir: the compiled-model cache directory (default: XDG cache dir).
        model_token: identity of the model in the cache (default: farmhash Fingerprint64
            of the model bytes).
        options: further compiler/runtime options (see :mod:`litekiln.config`); LiteRT's
            other ``experimental_*`` flags are accepted and change nothing here.

    Raises:
        ModelError: the model cannot be loaded.
        ValueError: an argument has the wrong type or value (as LiteRT raises).
        TypeError: an unknown keyword argument.
        DeviceError: no usable OpenCL device.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        model_content: bytes | None = None,
        experimental_delegates: list[Any] | None = None,
        num_threads: int | None = None,
        experimental_op_resolver_type: Any = None,
        experimental_preserve_all_tensors: bool = False,
        *,
        device: str | None = None,
        precision: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        model_token: str | None = None,
        **options: Any,
    ) -> None:
        self._check_arguments(
            model_path, model_content, experimental_delegates, num_threads,
            experimental_op_resolver_type, experimental_preserve_all_tensors, options,
        )  # fmt: skip
        self.num_threads = num_threads
        self._device_choice = config.DEVICE.get(device) or ""
        # The driver starts up (and the context is made) in the background while the model is
        # parsed; allocate_tensors() waits for it. (On a GPU known from an earlier start, the
        # CUDA driver alone: `litekiln.runtime.device.CudaStart`.)
        self._opener = _opener(self._device_choice, cache_dir, options)
        from litekiln.loading import open_model, split_options

        source = model_path if model_path is not None else model_content
        assert source is not None
        model = open_model(source, token=model_token)
        self._precision = config.PRECISION.get(precision)
        self._cache_dir = os.fspath(cache_dir) if cache_dir is not None else None
        self._options = {k: v for k, v in options.items() if k not in _LITERT_FLAGS}
        if experimental_preserve_all_tensors:
            self._options["preserve_all_tensors"] = True
        self._preserve_all = bool(experimental_preserve_all_tensors)
        split_options(self._options, self._precision)  # unknown options fail here, now
        self._adopt(model)

    def _adopt(self, model: Model) -> None:
        """The model-dependent state of a new interpreter (of the model's entry subgraph)."""
        self._original: Model = model
        self._model = model
        self._graph = model.main
        #: The interpreters of the signatures whose subgraph is not the primary one
        #: (`get_signature_runner`), by subgraph index.
        self._entries: dict[int, Interpreter] = {}
        self._shapes: dict[int, tuple[int, ...]] = {}  # resized inputs (resize_tensor_input)
        self._lock = threading.RLock()
        self._states: weakref.WeakKeyDictionary[threading.Thread, _ThreadState] = (
            weakref.WeakKeyDictionary()
        )
        self._last_invoker: _ThreadState | None = None
        self._local = threading.local()  # .state: this thread's _ThreadState (a quick lookup)
        self._input_set = frozenset(self._graph.inputs)
        #: The session's `input_stages` as last seen (graph input -> the host array its
        #: launch path stages it in), and for each, the thread whose input buffer that array
        #: is: `set_tensor` writes the value there and the inference copies it no further.
        self._stages: dict[int, np.ndarray] = _NO_STAGES
        self._stage_holders: dict[int, _ThreadState] = {}
        self._variables = self._initial_variables()
        #: Carried states: graph input -> the graph output fed back into it after each invoke:
        #: those LiteRT's kernels carry themselves (the basic LSTM's), then carry_state's.
        self._carries: dict[int, int] = self._kernel_carries()
        self._kernel_carried = frozenset(self._carries)
        #: Variable tensors kept on the device between invocations (`_carry_variables`).
        self._device_variables: frozenset[int] = frozenset()
        self._backend: Any = None

    @staticmethod
    def _check_arguments(
        model_path: Any,
        model_content: Any,
        delegates: Any,
        num_threads: Any,
        resolver: Any,
        preserve: Any,
        options: Mapping[str, Any],
    ) -> None:
        """LiteRT's argument checks (same exception types), at construction."""
        if (model_path is None) == (model_content is None):
            raise ValueError("give exactly one of model_path or model_content")
        if num_threads is not None:
            if not isinstance(num_threads, int) or isinstance(num_threads, bool):
                raise ValueError(f"type of num_threads should be int, got {num_threads!r}")
            if num_threads < 1:
                raise ValueError(f"num_threads should be >= 1, got {num_threads}")
        if delegates:
            raise ValueError(
                "litekiln is itself the GPU path; experimental_delegates must be empty"
            )
        name = getattr(resolver, "name", resolver)
        if resolver is not None and name not in _RESOLVERS:
            raise ValueError(f"unrecognized experimental_op_resolver_type {resolver!r}")
        for flag, value in [("experimental_preserve_all_tensors", preserve)] + [
            (k, options[k]) for k in _LITERT_FLAGS if k in options
        ]:
            if not isinstance(value, bool):
                raise ValueError(f"{flag} must be a bool, got {value!r}")

    # -- LiteRT API -------------------------------------------------------------------------

    def allocate_tensors(self) -> None:
        """Prepare execution: re-plan for resized inputs, then compile (or load from the
        cache) and allocate device memory.

        Raises:
            InputError: the model cannot run at the shapes its inputs were resized to.
            CompileError, DeviceError: as their names say.
        """
        with self._lock:
            if self._backend is not None:
                return
            from litekiln.loading import open_session
            from litekiln.resize import resized

            self._model = resized(self._original, self._shapes)
            self._graph = self._model.main
            self._input_set = frozenset(self._graph.inputs)
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
            self._backend.cpu_threads = self.num_threads
            if hasattr(self._backend, "carry"):  # carried states survive a re-plan
                for dst, src in self._carries.items():
                    self._backend.carry(src, dst)
                    # A start value set before the device existed (set_tensor, or `run`
                    # on a fresh interpreter) goes into the carried buffer: this thread's.
                    mine = self._states.get(threading.current_thread())
                    value = mine.inputs.get(dst) if mine is not None else None
                    if value is not None:
                        self._backend.write_bound(dst, value)
                    for state in self._states.values():
                        state.inputs.pop(dst, None)
                self._device_variables = self._carry_variables()

    @property
    def device(self) -> str:
        """Where the model runs, in words (``"reference (numpy)"`` or the OpenCL device; the
        CPU while a first start builds the device's programs, see `wait_for_device`)."""
        self.allocate_tensors()
        return str(getattr(self._backend, "runs_on", self._backend.device_name))

    def wait_for_device(self, timeout: float | None = None) -> bool:
        """Wait for the device to run the inferences, and for its background work.

        A start that must build the device's programs from source (a new device or driver,
        nothing stored for it) is ready at once: its inferences run on the CPU while the
        programs build in a background thread, and the device takes over between two
        inferences once built (option ``cpu_first``, ``LITEKILN_CPU_FIRST``). This waits for
        that, and for the rest of the first start's background work (timing the schedule
        variants, storing the binaries, the CUDA graph upgrade on NVIDIA GPUs).

        Args:
            timeout: seconds to wait at most (None: until done).

        Returns:
            Whether the inferences now run on the device (False: the timeout passed first,
            the build failed (a warning said why), or ``device="reference"``).
        """
        self.allocate_tensors()
        wait = getattr(self._backend, "wait_for_graph", None)
        if wait is None:
            return False
        wait(timeout)
        return not self._backend.on_cpu

    @property
    def model(self) -> Model:
        """The loaded graph IR (re-planned for resized inputs after ``allocate_tensors``)."""
        return self._model

    def get_input_details(self) -> list[dict[str, Any]]:
        return [self._details(self._input_view(t)) for t in self._graph.inputs]

    def get_output_details(self) -> list[dict[str, Any]]:
        return [self._details(self._graph.tensors[t]) for t in self._graph.outputs]

    def get_tensor_details(self, subgraph_index: int = 0) -> list[dict[str, Any]]:
        """Details of every tensor of a subgraph (LiteRT's list).

        Raises:
            ValueError: no such subgraph.
        """
        graph = self._subgraph(subgraph_index)
        if graph is self._original.main:
            graph = self._graph
        listed = graph.tensors[: graph.file_tensors or None]  # (not an unrolled loop's steps)
        return [self._details(self._input_view(t.index) if t.index in graph.inputs else t)
                for t in listed]  # fmt: skip

    def num_subgraphs(self) -> int:
        return len(self._model.subgraphs)

    def set_tensor(self, tensor_index: int, value: Any) -> None:
        """Set a graph input (a copy of ``value``) for this thread's next ``invoke``.

        Raises:
            InputError: not an input index, or a wrong shape or dtype.
        """
        t = self._input_view(tensor_index)
        if self._is_bound(tensor_index) and tensor_index not in self._carries:
            raise InputError(
                f"input {tensor_index} ({t.name!r}) is bound to a device buffer (bind_input): "
                "write the new value into that buffer, or unbind() it first"
            )
        arr = np.asarray(value)
        if arr.dtype != t.dtype:
            raise InputError(
                f"input {tensor_index} ({t.name!r}) expects dtype {t.dtype.name}, got "
                f"{arr.dtype.name}; convert with .astype(np.{t.dtype.name})"
            )
        if arr.shape != t.shape:
            raise InputError(
                f"input {tensor_index} ({t.name!r}) expects shape {list(t.shape)}, got "
                f"{list(arr.shape)}; resize_tensor_input() changes it"
            )
        with self._lock:
            if self._is_bound(tensor_index):  # a carried state: its next value, on the device
                self._backend.write_bound(tensor_index, arr)
                return
            state = self._state()
            stage = self._current_stages().get(tensor_index)
            buf = state.inputs.get(tensor_index)
            if stage is not None and (buf is None or buf is stage):
                # Straight into the array the inference stages the input in: one host copy
                # per inference, not two. (A buffer of its own, once the thread has one, stays:
                # a view from tensor() may be writing it.)
                self._take_stage(tensor_index, stage, state)
                np.copyto(stage, arr)
                return
            np.copyto(self._input_buffer(tensor_index), arr)

    def resize_tensor_input(self, input_index: int, tensor_size: Any, strict: bool = False) -> None:
        """Give an input another shape; ``allocate_tensors`` then re-plans the model for it
        (compiled once for that shape and cached under it).

        Args:
            input_index: the input's tensor index.
            tensor_size: the new shape.
            strict: allow only the dimensions the model leaves open (-1 in
                ``shape_signature``) to change, as LiteRT's ``strict``.

        Raises:
            InputError: not an input, a non-positive dimension, or a strict resize of a fixed
                dimension.
        """
        t = self._input_tensor(input_index)
        shape = tuple(int(d) for d in np.asarray(tensor_size).reshape(-1))
        signature = t.shape_signature or t.shape
        if strict and (
            len(shape) != len(signature)
            or any(d != -1 and d != n for d, n in zip(signature, shape, strict=True))
        ):
            raise InputError(
                f"input {input_index} ({t.name!r}): strict resizing may change only the "
                f"dimensions the model leaves open (-1 in {list(signature)}), got {list(shape)}"
            )
        if any(d <= 0 for d in shape):
            raise InputError(f"input {input_index} ({t.name!r}): dimensions must be positive")
        with self._lock:
            if shape == self._input_view(input_index).shape:
                return
            self._shapes[input_index] = shape
            self._backend = None  # re-planned by the next allocate_tensors
            self._last_invoker = None
            for state in self._states.values():
                state.inputs.pop(input_index, None)
                state.values = None
                state.zeros.clear()

    def invoke(self) -> None:
        """Run the model on this thread's inputs (set with ``set_tensor`` or ``tensor()``).

        Raises:
            InputError: an input has not been set in this thread.
        """
        with self._lock:
            if self._backend is None:
                self.allocate_tensors()
            state = self._state()
            inputs = self._inputs_for_invoke(state)
            for t, stage in self._current_stages().items():
                holder = self._stage_holders.get(t)
                if holder is not None and holder is not state:  # this run overwrites it
                    self._release_stage(t, holder, stage)
            last = self._last_invoker
            if last is not None and last is not state:
                last.values = _detached(last)
            variables = self._variables
            state.values = self._backend.run({**variables, **inputs} if variables else inputs)
            self._last_invoker = state
            for var, src in self._graph.variable_updates.items():  # LiteRT's kernels write
                if var not in self._device_variables:  # (new states; else kept on the device)
                    self._variables[var] = np.array(state.values[src], copy=True)
            for dst, src in self._carries.items():
                if not self._is_bound(dst):  # carried on the host (device="reference")
                    np.copyto(self._input_buffer(dst), state.values[src])

    def get_tensor(self, tensor_index: int, subgraph_index: int = 0) -> np.ndarray:
        """A copy of a tensor's value: this thread's inputs and results (zeros before its
        first ``invoke``), constants, and intermediates with
        ``experimental_preserve_all_tensors``.

        Raises:
            InputError: unknown index, or an intermediate tensor that is not kept.
        """
        return np.array(self._value(tensor_index, subgraph_index), copy=True)

    def tensor(self, tensor_index: int) -> Callable[[], np.ndarray]:
        """LiteRT's accessor: a callable returning a numpy view of the tensor's current buffer.

        Writes through an input's view reach this thread's next ``invoke`` (LiteRT's
        ``interp.tensor(i)()[0][:] = image``). An output's view shows this thread's last
        results; a constant's view is read-only.
        """
        self._check_index(tensor_index)

        def view() -> np.ndarray:
            with self._lock:
                if tensor_index in self._input_set and not self._is_bound(tensor_index):
                    self._current_stages()
                    holder = self._stage_holders.get(tensor_index)
                    if holder is not None and holder is self._state():
                        # The app writes this array from now on: one of the thread's own,
                        # which no other thread's inference overwrites (as a stage would be).
                        self._release_stage(tensor_index, holder, holder.inputs[tensor_index])
                    return self._input_buffer(tensor_index)
                return self._value(tensor_index, 0)

        return view

    def reset_all_variables(self) -> None:
        """Reset the model's variable tensors (state kept across invocations: the states a
        UNIDIRECTIONAL_SEQUENCE_LSTM writes back after each ``invoke``) to zero, and
        the inputs given a carried state by ``carry_state``. (As in LiteRT, the inputs in
        which a basic LSTM carries its own state keep it: set them to restart.)"""
        with self._lock:
            self._variables = self._initial_variables()
            explicit = [t for t in self._carries if t not in self._kernel_carried]
            if self._backend is not None and hasattr(self._backend, "reset_state"):
                self._backend.reset_state([*explicit, *self._device_variables])
            for state in self._states.values():
                for dst in explicit:
                    state.inputs.pop(dst, None)

    def carry_state(self, output_index: int, input_index: int) -> None:
        """Feed a graph output back into a graph input after every ``invoke``, on the device.

        For recurrent models that take their state as inputs and return the new state as
        outputs, such as a basic LSTM cell (previous activation and cell state in, new ones
        out): where a LiteRT app copies each new state out with ``get_tensor`` and back in with
        ``set_tensor``, here the state never leaves the device. litekiln binds a buffer of its
        own to the input (in the GPU path's memory, OpenCL or CUDA) and at the end of each
        ``invoke`` copies the output into it on the device, from where its partition left it
        (one copy of the state's bytes). The output is read as before (``get_tensor``, or a
        buffer the app binds to it).

        The state starts at zero, as LiteRT's variable tensors do; ``set_tensor`` on the
        input sets it (an initial state), ``reset_all_variables`` zeroes it, ``get_tensor``
        reads either end. It holds for every thread and across ``resize_tensor_input``;
        ``unbind`` of either end ends it. With ``device="reference"`` it is carried on the
        host. Where an op on the CPU reads the input or makes the output, that end is copied
        through the host (``get_bindings`` says why).

        Args:
            output_index: the graph output holding the new state.
            input_index: the graph input taking the previous state (same shape and dtype).

        Raises:
            InputError: not a graph output and a graph input, differing shapes or dtypes,
                an input already carrying a state, or an input already bound.
        """
        g = self._graph
        with self._lock:
            if output_index not in g.outputs or input_index not in g.inputs:
                raise InputError(
                    f"carry_state({output_index}, {input_index}) takes a graph output and a "
                    f"graph input: the outputs are {list(g.outputs)}, the inputs "
                    f"{list(g.inputs)}"
                )
            if input_index in self._carries:
                raise InputError(
                    f"input {input_index} ({g.tensors[input_index].name!r}) already carries "
                    f"output {self._carries[input_index]}; unbind({input_index}) first"
                )
            out, inp = g.tensors[output_index], self._input_view(input_index)
            if tuple(out.shape) != tuple(inp.shape) or out.dtype != inp.dtype:
                raise InputError(
                    f"cannot carry output {output_index} ({out.name!r}, "
                    f"{out.dtype.name}{list(out.shape)}) into input {input_index} "
                    f"({inp.name!r}, {inp.dtype.name}{list(inp.shape)}): shapes and dtypes "
                    "must match"
                )
            self.allocate_tensors()
            if hasattr(self._backend, "carry"):
                self._backend.carry(output_index, input_index)
            self._carries[input_index] = output_index
            for state in self._states.values():
                state.inputs.pop(input_index, None)  # zero, like a reset

    def carry_signature_state(self, signature_key: str | None = None) -> list[str]:
        """Carry each output of a signature into the signature's input of the same name, on
        the device (`carry_state` for each pair of the same shape and dtype).

        litert-torch's language models take their KV caches as inputs of their ``prefill``
        and ``decode`` signatures and return the updated caches as outputs of the same names:
        a LiteRT app copies every cache out and back in at every step (tens of MB a token for
        a model of a real size). Carried, the caches stay where the step left them: the app
        sets only the tokens and the position and reads only the logits. ``set_tensor`` on a
        carried input (of the signature's interpreter, `for_signature`) sets its state (the
        caches ``prefill`` returned, for ``decode``); its runner may then be called without
        the carried inputs.

        Returns:
            The names carried.

        Raises:
            ValueError: no such signature, or None with several signatures.
            InputError: an input of that name already carries a state, or is bound.
        """
        sig = self._signature(signature_key)
        entry = self.for_signature(sig.key)
        g = entry._graph
        names = []
        for name, out in sig.outputs.items():
            inp = sig.inputs.get(name)
            if inp is None:
                continue
            a, b = g.tensors[out], entry._input_view(inp)
            if tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype:
                entry.carry_state(out, inp)
                names.append(name)
        return names

    def get_signature_list(self) -> dict[str, dict[str, list[str]]]:
        return {
            s.key: {"inputs": list(s.inputs), "outputs": list(s.outputs)}
            for s in self._model.signatures
        }

    def get_signature_runner(self, signature_key: str | None = None) -> SignatureRunner:
        """The runner of one signature (LiteRT's ``SignatureRunner``).

        A signature of another subgraph than the primary one (a generative model's
        ``decode`` beside its ``prefill``) runs that subgraph as a model of its own:
        `for_signature`.

        Raises:
            ValueError: no such signature, or None with several signatures.
            ModelError: the signature's subgraph breaks a rule litekiln or LiteRT checks.
        """
        sig = self._signature(signature_key)
        return SignatureRunner(self.for_signature(sig.key), sig.inputs, sig.outputs)

    def for_signature(self, signature_key: str | None = None) -> Interpreter:
        """The interpreter whose graph is the signature's subgraph (litekiln's; LiteRT has
        only the runner): this one for the primary subgraph's signatures, else one made at
        the first call and kept, with this one's options and device choice, compiled and
        cached on its own (its token is the model's with ``#<subgraph index>``). Its
        tensor indices, details and ``invoke`` are those of that subgraph.

        Raises:
            ValueError: no such signature, or None with several signatures.
            ModelError: the subgraph breaks a rule litekiln or LiteRT checks.
        """
        index = self._signature(signature_key).subgraph_index
        return self if index == self._original.main.index else self._entry(index)

    def _signature(self, signature_key: str | None) -> SignatureDef:
        sigs = {s.key: s for s in self._original.signatures}
        if signature_key is None:
            if len(sigs) != 1:
                raise ValueError(
                    f"signature_key is None and the model has {len(sigs)} signatures "
                    f"{sorted(sigs)}; None is only allowed with exactly one"
                )
            signature_key = next(iter(sigs))
        if signature_key not in sigs:
            raise ValueError(
                f"invalid signature_key {signature_key!r}; the model has {sorted(sigs)}"
            )
        return sigs[signature_key]

    def _entry(self, index: int) -> Interpreter:
        """The interpreter of subgraph ``index`` as an entry point of its own (a signature's
        subgraph: a generative model's ``decode`` beside its ``prefill``): the same model
        file, options and device choice; compiled and cached on its own (its token is the
        model's with ``#<index>``), on a device context of its own. Made once, at the first
        runner that asks for it.

        Raises:
            ModelError: the subgraph breaks a rule litekiln or LiteRT checks.
        """
        with self._lock:
            child = self._entries.get(index)
            if child is not None:
                return child
            from litekiln.loading import entry_model

            model = entry_model(self._original, index)
            child = object.__new__(Interpreter)
            child.num_threads = self.num_threads
            child._device_choice = self._device_choice
            child._opener = _opener(self._device_choice, self._cache_dir, self._options)
            child._precision = self._precision
            child._cache_dir = self._cache_dir
            child._options = dict(self._options)
            child._preserve_all = self._preserve_all
            child._adopt(model)
            self._entries[index] = child
            return child

    # -- device buffers: LiteRT's tensor buffers, bound once ----------------------------------

    def get_device(self) -> DeviceHandle:
        """The OpenCL device the model runs on, to allocate the buffers to bind there.

        Returns:
            A handle with ``context`` (pyopencl.Context), ``queue`` (its in-order
            pyopencl.CommandQueue, which the model's kernels use), ``device`` and ``profile``.

        Raises:
            DeviceError: ``device="reference"`` (no device).
        """
        return self._session().handle

    def bind_input(self, tensor_index: int, buffer: Any, *, sync: bool = True) -> None:
        """Read a graph input from a device buffer of the application's, from now on.

        ``invoke`` then reads the input where the application keeps it, with no copy through
        the host (LiteRT: an input ``TensorBuffer`` made from OpenCL memory or a CUDA pointer,
        passed to ``CompiledModel.run_by_index``). ``set_tensor`` refuses the input until
        ``unbind``; ``get_tensor`` reads the buffer back. The binding holds for every thread
        and until ``unbind`` or a resize.

        Args:
            tensor_index: the input's tensor index (as for ``set_tensor``).
            buffer: a ``pyopencl.array.Array`` (shape, dtype and layout checked) or a
                ``pyopencl.Buffer`` (size checked; C-contiguous elements of the input's dtype)
                in ``get_device().context``; or on NVIDIA GPUs a CUDA tensor through DLPack
                (torch, cupy: shape, dtype, layout and device checked), read by the CUDA graph
                path. Write it through ``get_device().queue``, or finish your own queue, before
                ``invoke``.
            sync: CUDA tensors: at each ``invoke``, ask the tensor's library to order its
                pending work before litekiln's stream (DLPack's ``__dlpack__(stream=...)``:
                15-40 us per invoke on the H100 with torch, once per library). ``False`` when
                the application makes sure of it (it synchronises its stream before
                ``invoke``, and does not write an output buffer that is still being read).

        Raises:
            InputError: not a graph input; host memory; a buffer whose shape, dtype, size or
                layout does not fit.
            DeviceError: a buffer of another OpenCL context or CUDA device, CUDA memory
                without the CUDA path, or ``device="reference"``.
        """
        self._bind(tensor_index, buffer, "input", sync)

    def bind_output(self, tensor_index: int, buffer: Any, *, sync: bool = True) -> None:
        """Write a graph output into a device buffer of the application's, from now on.

        After ``invoke`` the buffer holds the output (the device work is finished when
        ``invoke`` returns); ``get_tensor`` reads it back. Kernels write it in place when the
        memory plan gives the output a storage of its own, else it is copied there on the
        device. Takes the same buffers and ``sync`` as ``bind_input`` (for an output: pending
        reads of the buffer come before the next ``invoke`` writes it).

        Raises:
            InputError: not a graph output, or a buffer that does not fit (see ``bind_input``).
            DeviceError: as for ``bind_input``.
        """
        self._bind(tensor_index, buffer, "output", sync)

    def unbind(self, tensor_index: int | None = None) -> None:
        """Unbind one tensor's buffer (None: all): back to ``set_tensor`` / ``get_tensor``.

        An unbound input must be set again (``set_tensor``) before the next ``invoke``.
        Unbinding either end of a carried state (``carry_state``) ends the carry.
        """
        with self._lock:
            if self._backend is not None and hasattr(self._backend, "unbind"):
                self._backend.unbind(tensor_index)
            for dst, src in list(self._carries.items()):
                if tensor_index is None or tensor_index in (dst, src):
                    del self._carries[dst]

    def get_bindings(self) -> dict[int, dict[str, Any]]:
        """The bound tensors: index -> ``role``, ``name``, ``buffer`` (in words),
        ``zero_copy`` (no inference copies it through the host), ``direct`` (where the GPU
        reads or writes the buffer itself), ``host_copies`` (why the host copies it) and
        ``carried_from`` (an input carrying a state: the output fed back into it, else None)."""
        with self._lock:
            bindings = getattr(self._backend, "bindings", {}) if self._backend else {}
            return {
                t: {
                    "role": b.buffer.slot.role,
                    "name": b.buffer.slot.name,
                    "buffer": b.buffer.describe(),
                    "zero_copy": b.zero_copy,
                    "direct": list(b.direct),
                    "host_copies": list(b.host),
                    "carried_from": self._carries.get(t, self._variable_source(t)),
                }
                for t, b in bindings.items()
            }

    def _bind(self, tensor_index: int, buffer: Any, role: str, sync: bool) -> None:
        with self._lock:
            session = self._session()
            session.bind(tensor_index, buffer, role, sync=sync)
            for state in self._states.values():  # (the buffer holds the value now)
                state.inputs.pop(tensor_index, None)

    def _session(self) -> Any:
        """The runtime session (allocating it), for what only a device has."""
        self.allocate_tensors()
        if isinstance(self._backend, _ReferenceBackend):
            raise DeviceError(
                "device='reference' runs the numpy reference: there is no device to bind "
                "buffers on or to allocate them in"
            )
        return self._backend

    def _is_bound(self, tensor_index: int) -> bool:
        backend = self._backend
        return backend is not None and tensor_index in getattr(backend, "bindings", {})

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

        Raises:
            InputError: a wrong number of inputs, or a wrong shape or dtype.
        """
        if not isinstance(inputs, dict):
            inputs = list(inputs)
            if len(inputs) != len(self._graph.inputs):
                raise InputError(
                    f"{len(inputs)} inputs given; the model has {len(self._graph.inputs)} "
                    f"({[self._graph.tensors[t].name for t in self._graph.inputs]})"
                )
            inputs = dict(zip(self._graph.inputs, inputs, strict=True))
        with self._lock:
            for t, v in inputs.items():
                self.set_tensor(t, v)
            self.invoke()
            values = self._state().values
            assert values is not None
            if intermediates:
                # Copies: the GPU session reuses its output buffers on the next inference.
                return {t: np.array(v, copy=True) for t, v in values.items()}
            return [self.get_tensor(t) for t in self._graph.outputs]

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Seeded random inputs of the right shapes and dtypes (uniform in the input's range)."""
        from litekiln.model.ir import index_bounds

        bounds = index_bounds(self._graph)
        return _random_arrays(
            [self._input_view(t) for t in self._graph.inputs],
            seed,
            [bounds.get(t) for t in self._graph.inputs],
        )

    # -- helpers ------------------------------------------------------------------------------

    def _state(self) -> _ThreadState:
        state: _ThreadState | None = getattr(self._local, "state", None)
        if state is None:
            me = threading.current_thread()
            with self._lock:  # (the states are iterated under the lock by invoke)
                state = self._states.get(me)
                if state is None:
                    state = self._states[me] = _ThreadState()
            self._local.state = state
        return state

    def _current_stages(self) -> dict[int, np.ndarray]:
        """The session's `input_stages` (none on OpenCL or the reference), with their
        holders found again when the mapping changed (another launch path, a binding)."""
        find = getattr(self._backend, "input_stages", None)
        stages: dict[int, np.ndarray] = find() if find is not None else _NO_STAGES
        if stages is not self._stages:
            self._stages = stages
            self._stage_holders = {
                t: state
                for state in self._states.values()
                for t, buf in state.inputs.items()
                if stages.get(t) is buf
            }
        return stages

    def _take_stage(self, index: int, stage: np.ndarray, state: _ThreadState) -> None:
        """Make ``stage`` ``state``'s buffer of input ``index`` (about to be written)."""
        holder = self._stage_holders.get(index)
        if holder is not None and holder is not state:
            self._release_stage(index, holder, stage)
        self._stage_holders[index] = state
        state.inputs[index] = stage

    def _release_stage(self, index: int, holder: _ThreadState, stage: np.ndarray) -> None:
        """Give ``holder`` a buffer of its own for input ``index``, holding the value it has
        in ``stage`` (which is about to be overwritten, or handed to the app)."""
        del self._stage_holders[index]
        if holder.inputs.get(index) is not stage:
            return
        own = holder.inputs[index] = stage.copy()
        if holder.values is not None:  # (its last invoke's values include its inputs)
            for t, v in holder.values.items():
                if v is stage:
                    holder.values[t] = own

    def _input_view(self, index: int) -> Tensor:
        """An input tensor with its current shape (resized ones before allocate_tensors)."""
        t = self._input_tensor(index)
        shape = self._shapes.get(index)
        if shape is None or shape == t.shape:
            return t
        from litekiln.model import Tensor

        return Tensor(t.index, t.name, shape, t.dtype, t.shape_signature, t.quantization)

    def _input_tensor(self, index: int) -> Tensor:
        if index not in self._input_set:
            raise InputError(
                f"tensor {index} is not a graph input; inputs are "
                f"{[(t, self._graph.tensors[t].name) for t in self._graph.inputs]}"
            )
        return self._graph.tensors[index]

    def _input_buffer(self, index: int) -> np.ndarray:
        """This thread's buffer of an input (zeros until written)."""
        state = self._state()
        buf = state.inputs.get(index)
        t = self._input_view(index)
        if buf is None or buf.shape != t.shape:
            buf = state.inputs[index] = np.zeros(t.shape, t.dtype)
        return buf

    def _inputs_for_invoke(self, state: _ThreadState) -> dict[int, np.ndarray]:
        """This thread's host inputs (a bound input is read from its buffer instead)."""
        if not self._carries and not getattr(self._backend, "bindings", None):
            mine = state.inputs
            if all(t in mine for t in self._graph.inputs):  # (else: the error below)
                return {t: mine[t] for t in self._graph.inputs}
        wanted = [t for t in self._graph.inputs if not self._is_bound(t)]
        for t in wanted:
            if t in self._carries:  # a state carried on the host: zero until set
                self._input_buffer(t)
        missing = [t for t in wanted if t not in state.inputs]
        if missing:
            names = ", ".join(f"{t} ({self._graph.tensors[t].name!r})" for t in missing)
            elsewhere = any(t in s.inputs for s in self._states.values() for t in missing)
            hint = (
                ": they were set in another thread, and each thread keeps its own inputs"
                if elsewhere
                else "; call set_tensor first"
            )
            raise InputError(f"inputs not set before invoke() in this thread: {names}{hint}")
        return {t: state.inputs[t] for t in wanted}

    def _check_index(self, tensor_index: int) -> None:
        if not 0 <= tensor_index < len(self._graph.tensors):
            raise InputError(
                f"tensor index {tensor_index} out of range: the model has "
                f"{len(self._graph.tensors)} tensors"
            )

    def _subgraph(self, subgraph_index: int) -> Any:
        n = len(self._original.subgraphs)
        if not 0 <= int(subgraph_index) < n:
            raise ValueError(
                f"subgraph_index is out of range: {subgraph_index} for the model, which has "
                f"{n} subgraphs"
            )
        return self._original.subgraphs[int(subgraph_index)]

    def _value(self, tensor_index: int, subgraph_index: int) -> np.ndarray:
        """The array behind a tensor for this thread (not a copy)."""
        if subgraph_index != 0:
            self._subgraph(subgraph_index)
            raise InputError(f"only subgraph 0 runs; subgraph {subgraph_index} has no values")
        self._check_index(tensor_index)
        with self._lock:
            state = self._state()
            if self._is_bound(tensor_index):  # what the device buffer holds, read back
                value = self._backend.read_bound(tensor_index)
                value.flags.writeable = False
                return value
            if tensor_index in self._input_set:
                return self._input_buffer(tensor_index)
            if tensor_index in self._variables:  # (its value now: after the last invoke's)
                return self._variables[tensor_index]
            if state.values is not None and tensor_index in state.values:
                return state.values[tensor_index]
            t = self._graph.tensors[tensor_index]
            if t.data is not None:
                view = t.data.view()
                view.flags.writeable = False
                return view
            kept = tensor_index in self._graph.outputs or self._preserve_all
            if not kept:
                raise InputError(
                    f"tensor {tensor_index} ({t.name!r}) is an intermediate tensor, whose "
                    "value is not kept; construct the Interpreter with "
                    "experimental_preserve_all_tensors=True to read it"
                )
            if state.values is None and self._last_invoker is not None:
                raise InputError(
                    f"tensor {tensor_index} ({t.name!r}): this thread has not invoked the "
                    "model; each thread reads the results of its own invoke()"
                )
            if tensor_index not in state.zeros:  # LiteRT: zeros before the first invoke
                state.zeros[tensor_index] = np.zeros(t.shape, t.dtype)
            return state.zeros[tensor_index]

    def _variable_source(self, tensor: int) -> int | None:
        """The tensor a variable kept on the device is carried from (None: not one)."""
        if tensor in self._device_variables:
            return self._graph.variable_updates[tensor]
        return None

    def _carry_variables(self) -> frozenset[int]:
        """Keep the float variable tensors that kernels write back (``variable_updates``: a
        UNIDIRECTIONAL_SEQUENCE_LSTM's states) on the device between invocations, as carried
        states; the others go through ``self._variables`` on the host."""
        g = self._graph
        kept = set()
        for var, src in g.variable_updates.items():
            if g.tensors[var].dtype.kind == "f" and g.tensors[var].quantization is None:
                self._backend.carry(src, var)
                self._backend.write_bound(var, self._variables[var])
                kept.add(var)
        return frozenset(kept)

    def _kernel_carries(self) -> dict[int, int]:
        """The states LiteRT's kernels carry in their own inputs (``OpDef.state_carries``:
        the basic LSTM's activation and cell state), as carried states: graph input -> graph
        output. A state whose new value is not a graph output is not carried: warned."""
        from litekiln.ops.base import lookup

        g = self._original.main
        out: dict[int, int] = {}
        for k, op in enumerate(g.ops):
            for o, i in lookup(op).state_carries(op):
                src, dst = op.outputs[o], op.inputs[i]
                if dst not in g.inputs or dst in out:
                    continue  # LiteRT overwrites an earlier op's output there: not a state
                if src in g.outputs:
                    out[dst] = src
                    continue
                log.warning(
                    "op #%d (%s) copies its output %d (%r) into graph input %d (%r) after "
                    "each invocation in LiteRT; litekiln carries it only when that output is "
                    "a graph output: set input %d before each invoke()",
                    k, op.name, src, g.tensors[src].name, dst, g.tensors[dst].name, dst,
                )  # fmt: skip
        return out

    def _initial_variables(self) -> dict[int, np.ndarray]:
        """Variable tensors at their reset value: zero (the zero point when quantized)."""
        return self._original.main.initial_variables()

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
                "block_size": 0,  # blockwise quantization: not in the models litekiln loads
            },
            "sparsity_parameters": {},
        }


def _opener(
    choice: str, cache_dir: str | os.PathLike[str] | None, options: Mapping[str, Any]
) -> DeviceOpener | None:
    """The device ``choice`` names, opening in the background (None: the numpy reference)."""
    if choice == REFERENCE:
        return None
    return open_device(choice or None, cache_dir, use_cache=bool(options.get("use_cache", True)))


class SignatureRunner:
    """LiteRT's ``SignatureRunner``: ``runner(**inputs)`` returns ``{output name: array}``.

    Inputs are given by their signature names; an input of another shape than the current
    one resizes it first (and re-plans the model, as LiteRT's runner does).
    """

    def __init__(
        self, interpreter: Interpreter, inputs: Mapping[str, int], outputs: Mapping[str, int]
    ) -> None:
        self._interpreter = interpreter
        self._inputs = dict(inputs)
        self._outputs = dict(outputs)

    def __call__(self, **kwargs: Any) -> dict[str, np.ndarray]:
        """Run the signature. Inputs that carry a state (`Interpreter.carry_signature_state`)
        may be left out: they keep the state; given, they set it.

        Raises:
            ValueError: a wrong number of inputs or an unknown input name.
            InputError: a value of the wrong dtype.
        """
        interp = self._interpreter
        carried = {n for n, t in self._inputs.items() if t in interp._carries}
        unknown = sorted(set(kwargs) - set(self._inputs))
        if unknown:
            raise ValueError(f"invalid input names {unknown}; expected {sorted(self._inputs)}")
        missing = sorted(set(self._inputs) - set(kwargs) - carried)
        if missing:
            raise ValueError(
                f"invalid number of inputs for the signature: expected {len(self._inputs)} "
                f"({sorted(self._inputs)}), got {len(kwargs)}; missing {missing}"
            )
        with interp._lock:
            arrays = {name: np.asarray(v) for name, v in kwargs.items()}
            for name, arr in arrays.items():
                interp.resize_tensor_input(self._inputs[name], arr.shape)
            interp.allocate_tensors()
            for name, arr in arrays.items():
                interp.set_tensor(self._inputs[name], arr)
            interp.invoke()
            return {name: interp.get_tensor(t) for name, t in self._outputs.items()}

    def get_input_details(self) -> dict[str, dict[str, Any]]:
        """Input name -> LiteRT's tensor details."""
        interp = self._interpreter
        return {n: interp._details(interp._input_view(t)) for n, t in self._inputs.items()}

    def get_output_details(self) -> dict[str, dict[str, Any]]:
        """Output name -> LiteRT's tensor details."""
        g = self._interpreter._graph
        return {n: Interpreter._details(g.tensors[t]) for n, t in self._outputs.items()}


def _detached(state: _ThreadState) -> dict[int, np.ndarray] | None:
    """A thread's last results, copied out of the buffers the next inference will overwrite
    (its own input buffers stay shared: they are its own)."""
    if state.values is None:
        return None
    own = {id(a) for a in state.inputs.values()}
    return {t: (v if id(v) in own else v.copy()) for t, v in state.values.items()}


class _ReferenceBackend:
    """``device="reference"``: every op on the numpy reference, all values kept."""

    device_name = "reference (numpy, CPU)"

    def __init__(self, model: Model) -> None:
        self._graph = model.main
        self.cpu_threads: int | None = None

    def run(self, inputs: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        with cpu_thread_limit(self.cpu_threads):
            from litekiln.reference import run_graph

            return run_graph(self._graph, inputs, intermediates=True)


def random_inputs(model: Model, seed: int = 0) -> list[np.ndarray]:
    """Seeded random values for each graph input: floats in [-1, 1), integers over their range
    (ids and positions in the rows of the table they index: `index_bounds`)."""
    from litekiln.model.ir import index_bounds

    bounds = index_bounds(model.main)
    return _random_arrays(
        [model.main.tensors[t] for t in model.main.inputs],
        seed,
        [bounds.get(t) for t in model.main.inputs],
    )


def _random_arrays(
    tensors: list[Tensor], seed: int, bounds: list[int | None] | None = None
) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for i, tensor in enumerate(tensors):
        bound = bounds[i] if bounds else None
        if tensor.dtype.kind == "f":
            out.append(rng.uniform(-1, 1, tensor.shape).astype(tensor.dtype))
        elif tensor.dtype.kind == "b":
            out.append(rng.integers(0, 2, tensor.shape).astype(bool))
        elif bound is not None:
            out.append(rng.integers(0, bound, tensor.shape).astype(tensor.dtype))
        else:
            info = np.iinfo(tensor.dtype)
            lo, hi = max(info.min, -128), min(info.max, 127)
            out.append(rng.integers(lo, hi + 1, tensor.shape).astype(tensor.dtype))
    return out
