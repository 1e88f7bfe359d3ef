"""A basic LSTM cell stepped over time: its state carried on the device against the host loop.

For each model (basic LSTM cells, ``kernel_type`` BASIC, whose previous activation and state
are graph inputs and whose new ones are graph outputs), in one process:

* ``litert``: LiteRT (CPU), only the step input set at each step: LiteRT's basic kernel
  copies the new activation and state into the cell's input tensors after each ``invoke``
  (lstm.cc ``basic::Eval``), so its state is carried too. The reference of every step.
* ``host``: litekiln, the LiteRT app's explicit loop: ``get_tensor`` the new state,
  ``set_tensor`` it back, every step.
* ``carried``: litekiln with the state kept on the device between invocations
  (``Interpreter.carry_state``, or litekiln's own carry where it already makes one).

Both litekiln loops read the cell's output activation with ``get_tensor`` each step (what an
app consumes). Per mode: the host's wall time per step (median of ``--repeat`` interleaved
rounds of ``--steps`` steps), and each step's error against LiteRT, relative to
``max(1, max|litert|)``.

    python scripts/remote_gpu/state_carry.py [--cache-dir DIR] [--out J] MODEL...
    python scripts/remote_gpu/state_carry.py --make build/lstm_cell.tflite   # the model

Prints one JSON line per model; ``--out`` writes them all.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:  # run from anywhere: the repository's litekiln
    sys.path.insert(0, str(_ROOT))


def make_model(path: str, depth: int = 64, units: int = 128) -> None:
    """One basic LSTM cell (batch 1) with PyTorch's initialisation, U(-k, k), k = 1/sqrt(units):
    a stable recurrence. (With U(-1, 1) weights the recurrence is chaotic: any two float32
    implementations, LiteRT's against a float64 one included, drift apart by ~1e-2 in 50
    steps.) Built with the tests' model builder."""
    sys.path.insert(0, str(_ROOT / "tests"))
    from tflite_builder import ModelBuilder

    rng = np.random.default_rng(19)
    k = 1.0 / np.sqrt(units)
    b = ModelBuilder()
    x, h, c = b.input("x", [1, depth]), b.input("act", [1, units]), b.input("state", [1, units])
    w = b.const("w", rng.uniform(-k, k, [4 * units, depth + units]).astype(np.float32))
    bias = b.const("b", rng.uniform(-k, k, [4 * units]).astype(np.float32))
    shapes = {"act": [1, units], "state": [1, units], "concat": [1, depth + units]}
    outs = [b.tensor(f"cell/{n}", s) for n, s in shapes.items()]
    outs.append(b.tensor("cell/activ", [1, 4 * units]))
    options = {"fused_activation_function": "TANH", "kernel_type": "BASIC"}
    b.op("LSTM", [x, h, w, bias, c], outputs=outs, options=options, version=2)
    b.output(outs[0], outs[1])
    Path(path).write_bytes(b.build())


def state_pairs(interp: Any) -> list[tuple[int, int]]:
    """(output, input) pairs of the basic LSTM cells: new activation -> previous activation,
    new state -> previous state, where both ends are graph tensors."""
    g = interp.model.main
    pairs = []
    for op in g.ops:
        if op.name != "LSTM" or op.options.get("kernel_type") not in (1, "BASIC"):
            continue
        for src, dst in ((op.outputs[0], op.inputs[1]), (op.outputs[1], op.inputs[4])):
            if src in g.outputs and dst in g.inputs:
                pairs.append((src, dst))
    return pairs


def measure(path: str, steps: int, repeat: int, cache_dir: str | None) -> dict[str, Any]:
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    import litekiln

    host = litekiln.Interpreter(model_path=path, cache_dir=cache_dir)
    carried = litekiln.Interpreter(model_path=path, cache_dir=cache_dir)
    pairs = state_pairs(host)
    if not pairs:
        raise SystemExit(f"{path}: no basic LSTM cell with its state as graph inputs/outputs")
    states = {dst for _, dst in pairs}
    x_ins = [t for t in host.model.main.inputs if t not in states]
    act_out = pairs[0][0]
    for src, dst in pairs:
        if carried.get_bindings().get(dst, {}).get("carried_from") != src:
            carried.carry_state(src, dst)
    rng = np.random.default_rng(0)
    xs = [
        {t: rng.uniform(-1, 1, host.model.main.tensors[t].shape).astype(np.float32) for t in x_ins}
        for _ in range(steps)
    ]

    lite = LiteRT(model_path=path)
    lite.allocate_tensors()
    for dst in states:
        lite.set_tensor(dst, np.zeros(host.model.main.tensors[dst].shape, np.float32))
    want = []
    for x in xs:
        for t, v in x.items():
            lite.set_tensor(t, v)
        lite.invoke()
        want.append(lite.get_tensor(act_out))

    def run_host() -> list[np.ndarray]:
        state = {dst: np.zeros(host.model.main.tensors[dst].shape, np.float32) for dst in states}
        out = []
        for x in xs:
            for t, v in {**x, **state}.items():
                host.set_tensor(t, v)
            host.invoke()
            state = {dst: host.get_tensor(src) for src, dst in pairs}
            out.append(host.get_tensor(act_out))
        return out

    def run_carried() -> list[np.ndarray]:
        carried.reset_all_variables()
        out = []
        for x in xs:
            for t, v in x.items():
                carried.set_tensor(t, v)
            carried.invoke()
            out.append(carried.get_tensor(act_out))
        return out

    runs = {"host": run_host, "carried": run_carried}
    for fn in runs.values():  # warm-up: programs, CUDA graph upgrade
        fn()
    for it in (host, carried):
        getattr(it._backend, "wait_for_graph", lambda: None)()  # noqa: SLF001
    times: dict[str, list[float]] = {k: [] for k in runs}
    results: dict[str, list[np.ndarray]] = {}
    for _ in range(repeat):
        for mode, fn in runs.items():
            t0 = time.perf_counter()
            results[mode] = fn()
            times[mode].append((time.perf_counter() - t0) / steps * 1e3)

    def err(got: list[np.ndarray]) -> float:
        return max(
            float(np.abs(g.astype(np.float64) - w).max()) / max(1.0, float(np.abs(w).max()))
            for g, w in zip(got, want, strict=True)
        )

    b = carried.get_bindings()
    return {
        "model": Path(path).stem,
        "device": carried.device,
        "steps": steps,
        "pairs": pairs,
        "host_ms_per_step": round(statistics.median(times["host"]), 4),
        "carried_ms_per_step": round(statistics.median(times["carried"]), 4),
        "host_max_rel_err": err(results["host"]),
        "carried_max_rel_err": err(results["carried"]),
        "state_zero_copy": all(b[dst]["zero_copy"] for _, dst in pairs),
        "bindings": {str(t): v["direct"] + v["host_copies"] for t, v in b.items()},
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="*")
    p.add_argument("--make", metavar="PATH", help="write the LSTM cell model there and stop")
    p.add_argument("--cache-dir")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out")
    a = p.parse_args()
    if a.make:
        make_model(a.make)
        return 0
    rows = []
    for m in a.models:
        rows.append(measure(m, a.steps, a.repeat, a.cache_dir))
        print(json.dumps(rows[-1]), flush=True)
        if a.out:
            Path(a.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
