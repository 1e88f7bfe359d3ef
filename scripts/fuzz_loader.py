#!/usr/bin/env python3
"""Fuzz the model loader: mutated models must load or raise ModelError, never anything else.

Seeds are small models written with tests/tflite_builder.py (every feature the loader reads:
quantization, sparse constants, fp16/int8 DEQUANTIZE, custom options, subgraphs, signatures,
option vectors) and the real MediaPipe models that are present (zoo or mediapipe checkout).
Each case applies a few mutations to one seed:

* ``flip``: flip random bits;
* ``truncate``: cut the file at a random point;
* ``splice``: overwrite a span with bytes from another (or the same) seed;
* ``int``: overwrite a 1/2/4/8-byte integer at a *structural* position (a table's vtable
  offset, a vtable entry, a field, a vector length; found by walking the flatbuffer) with an
  interesting value (0, -1, INT_MAX, the file size, ...).

Cases run in worker processes with a memory limit; a case that takes longer than
``--timeout`` is a hang (the worker is killed and restarted), a worker that dies is a crash.
Every escape, hang and crash is saved under ``--out`` (default tests/data/fuzz_regressions/)
as ``<kind>-<digest>.tflite`` with a ``.json`` note (seed, mutations, traceback); so is every
*costly* case (a ModelError that took over a second or grew peak memory by over 256 MB: a
small corrupt file should fail fast and cheaply), though those do not fail the run.

Usage::

    python scripts/fuzz_loader.py --cases 10000 --seed 0 [--json] [--workers 2]

Every case is reproducible from (``--seed``, case number): ``--only-case N`` reruns one in
this process and prints its traceback.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import multiprocessing as mp
import os
import random
import struct
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "tests" / "data" / "fuzz_regressions"
MEDIAPIPE_MODULES = Path(os.environ.get("LITEKILN_MEDIAPIPE_MODULES", "/tmp/mp/mediapipe/modules"))

#: Real models used as seeds when present, smallest (fastest to load) first.
REAL_SEEDS = [
    "face_detection_short_range",
    "selfie_segmentation",
    "face_detection_full_range_sparse",
]

#: Share of cases whose seed is a real model (the rest mutate the small built models, which
#: load ~30x faster and give small reproducers).
REAL_SHARE = 0.3

#: Address-space limit of a worker: a corrupted shape must fail as ModelError, not by the
#: machine swapping; beyond this numpy raises MemoryError, which counts as an escape.
WORKER_MEMORY_BYTES = 4 << 30

#: A case that takes longer than this, or whose peak memory grows by more than MEMORY_FLAG_MB,
#: is a finding too (a small corrupt file should fail fast and cheaply), though not a failure.
SLOW_FLAG_S = 1.0
MEMORY_FLAG_MB = 256

INTERESTING_INTS = [
    0,
    1,
    2,
    3,
    4,
    7,
    8,
    16,
    127,
    128,
    255,
    256,
    0x7FFF,
    0x8000,
    0xFFFF,
    0x7FFFFFFF,
    0x80000000,
    0xFFFFFFFF,
    -1,
    -2,
]


# -- seeds ----------------------------------------------------------------------------------


def built_seeds() -> dict[str, bytes]:
    """Small models covering what the loader reads, written with the test builder."""
    sys.path.insert(0, str(REPO / "tests"))
    import numpy as np
    from tflite_builder import DENSE, SPARSE_CSR, ModelBuilder, Quant, Sparsity

    rng = np.random.default_rng(0)
    seeds = {}

    b = ModelBuilder()
    x = b.input("x", [1, 8, 8, 3], "int8", quant=Quant(0.02, -3))
    w = b.const(
        "w",
        rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8),
        quant=Quant([0.01, 0.02, 0.03, 0.04], [0, 0, 0, 0], axis=0),
    )
    bias = b.const("bias", np.arange(4, dtype=np.int32), quant=Quant([2e-4] * 4, [0] * 4))
    y = b.op(
        "CONV_2D",
        [x, w, bias],
        out_shape=[1, 8, 8, 4],
        out_quant=Quant(0.05, 1),
        options={"padding": "SAME", "stride_w": 1, "stride_h": 1},
        version=3,
    )
    r = b.op(
        "RESHAPE",
        [y, np.array([1, 256], np.int32)],
        out_shape=[1, 256],
        options={"new_shape": [1, 256]},
    )
    b.output(r)
    b.signature("serving_default", {"x": x}, {"y": r})
    seeds["built_conv_int8"] = b.build()

    b = ModelBuilder()
    x = b.input("x", [8, 8])
    dense = rng.normal(size=(8, 8)).astype(np.float16)
    dense[rng.random((8, 8)) < 0.7] = 0
    dense[:4] = 0
    ws = b.const(
        "w",
        dense,
        sparsity=Sparsity(
            formats=[DENSE, SPARSE_CSR, DENSE], block_map=[1], block_size=[2], index_dtype="uint8"
        ),
    )
    wd = b.op("DENSIFY", [ws])
    wf = b.op("DEQUANTIZE", [wd], out_dtype="float32", version=3)
    w2 = b.const(
        "w2",
        rng.normal(size=(8, 8)).astype(np.float32),
        sparsity=Sparsity(formats=[SPARSE_CSR, SPARSE_CSR]),
    )
    w2d = b.op("DENSIFY", [w2])
    y = b.op("ADD", [b.op("ADD", [x, wf]), w2d])
    b.output(
        b.op(
            "SQUEEZE",
            [b.op("RESHAPE", [y, np.array([1, 64], np.int32)], out_shape=[1, 64])],
            out_shape=[64],
            options={"squeeze_dims": [0]},
        )
    )
    seeds["built_sparse_fp16"] = b.build()

    b = ModelBuilder()
    c = b.input("c", [], "bool")
    x = b.input("x", [2, None], shape_signature=[2, -1])
    then = b.subgraph("then")
    then.output(then.op("NEG", [then.input("x", [2, 1])]))
    other = b.subgraph("else")
    other.output(other.op("RELU", [other.input("x", [2, 1])]))
    y = b.op(
        "IF",
        [c, x],
        out_shape=[2, 1],
        out_dtype="float32",
        options={"then_subgraph_index": 1, "else_subgraph_index": 2},
    )
    z = b.custom_op("MyCustom", [y], custom_options={"alpha": 0.5, "dims": [1, 2]})
    parts = b.op(
        "SPLIT",
        [np.array(0, np.int32), z],
        options={"num_splits": 2},
        outputs=[b.tensor("s0", [1, 1]), b.tensor("s1", [1, 1])],
    )
    i4 = b.const("i4", np.array([-8, -1, 0, 7, 3], np.int8), "int4")
    b.output(*parts, i4)
    b.signature("run", {"c": c, "x": x}, {"a": parts[0], "b": parts[1]})
    b.add_metadata("min_runtime_version", b"1.5.0\0")
    seeds["built_subgraphs_custom"] = b.build()
    return seeds


def find_real_seed(name: str) -> Path | None:
    try:
        from litekiln.zoo import ZOO, zoo_path

        if name in ZOO:
            return zoo_path(name)
    except (ImportError, FileNotFoundError):
        pass
    hits = sorted(glob.glob(str(MEDIAPIPE_MODULES / "*" / f"{name}.tflite")))
    return Path(hits[0]) if hits else None


def load_seeds(real: bool = True) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """(built seeds, real seeds present on this machine)."""
    reals = {}
    if real:
        for name in REAL_SEEDS:
            path = find_real_seed(name)
            if path is not None:
                reals[name] = path.read_bytes()
    return built_seeds(), reals


# -- structure: where the flatbuffer's offsets and lengths live -----------------------------


def structural_positions(data: bytes, max_tables: int = 400) -> list[int]:
    """Byte positions of table headers, vtable entries, fields and vector lengths.

    Walks the model with the generated readers (tables reachable from the root, sampled when
    there are many) and records, for each table, its vtable offset, every vtable slot and
    every present field, plus the length word of each vector it points to.
    """
    import tflite

    positions: set[int] = {0}
    u32 = struct.Struct("<I")
    i32 = struct.Struct("<i")
    u16 = struct.Struct("<H")
    seen = 0

    def table(tab: Any) -> None:
        nonlocal seen
        seen += 1
        pos = tab.Pos
        positions.add(pos)
        vt = pos - i32.unpack_from(data, pos)[0]
        vt_len = u16.unpack_from(data, vt)[0]
        for slot in range(4, min(vt_len, 64), 2):
            positions.add(vt + slot)
            off = u16.unpack_from(data, vt + slot)[0]
            if off:
                fpos = pos + off
                positions.add(fpos)
                target = fpos + u32.unpack_from(data, fpos)[0]
                if 0 < target < len(data) - 4:
                    positions.add(target)  # a vector's length word, if the field is an offset

    def each(n: int, get: Any) -> list[Any]:
        idx = list(range(n))
        if n > 40:
            idx = sorted(random.Random(n).sample(idx, 40))
        return [get(i) for i in idx]

    model = tflite.Model.GetRootAs(data, 0)
    table(model._tab)
    for oc in each(model.OperatorCodesLength(), model.OperatorCodes):
        table(oc._tab)
    for buf in each(model.BuffersLength(), model.Buffers):
        table(buf._tab)
    for sig in each(model.SignatureDefsLength(), model.SignatureDefs):
        table(sig._tab)
    for meta in each(model.MetadataLength(), model.Metadata):
        table(meta._tab)
    for sg in each(model.SubgraphsLength(), model.Subgraphs):
        table(sg._tab)
        for t in each(sg.TensorsLength(), sg.Tensors):
            if seen > max_tables:
                break
            table(t._tab)
            q = t.Quantization()
            if q is not None:
                table(q._tab)
            sp = t.Sparsity()
            if sp is not None:
                table(sp._tab)
                for dm in each(sp.DimMetadataLength(), sp.DimMetadata):
                    table(dm._tab)
        for op in each(sg.OperatorsLength(), sg.Operators):
            if seen > max_tables:
                break
            table(op._tab)
            opts = op.BuiltinOptions()
            if opts is not None:
                table(opts)
    return sorted(p for p in positions if 0 <= p < len(data))


# -- mutations ------------------------------------------------------------------------------


@dataclass
class Case:
    """One fuzz case: which seed, which mutations (descriptions), the mutated bytes."""

    number: int
    seed_name: str
    mutations: list[str] = field(default_factory=list)
    data: bytes = b""


class Mutator:
    """Deterministic mutations of the seeds: case ``n`` of run ``seed`` is always the same."""

    def __init__(self, built: dict[str, bytes], real: dict[str, bytes], seed: int) -> None:
        self.built = built
        self.real = real
        self.seed = seed
        self._positions: dict[str, list[int]] = {}

    def positions(self, name: str, data: bytes) -> list[int]:
        if name not in self._positions:
            self._positions[name] = structural_positions(data)
        return self._positions[name]

    def case(self, number: int) -> Case:
        rng = random.Random(f"{self.seed}:{number}")
        pool = self.real if (self.real and rng.random() < REAL_SHARE) else self.built
        name = rng.choice(sorted(pool))
        data = bytearray(pool[name])
        case = Case(number, name)
        for _ in range(rng.choice([1, 1, 1, 2, 2, 3, 5])):
            kind = rng.choices(["flip", "truncate", "splice", "int"], [3, 1, 2, 6])[0]
            getattr(self, kind)(rng, name, data, case.mutations)
        case.data = bytes(data)
        return case

    def flip(self, rng: random.Random, name: str, data: bytearray, log: list[str]) -> None:
        if not data:
            return
        for _ in range(rng.choice([1, 1, 2, 4, 8])):
            at = rng.randrange(len(data))
            bit = rng.randrange(8)
            data[at] ^= 1 << bit
            log.append(f"flip bit {bit} at {at}")

    def truncate(self, rng: random.Random, name: str, data: bytearray, log: list[str]) -> None:
        n = len(data)
        at = rng.choice(
            [
                rng.randrange(n + 1),
                n - rng.randrange(min(n, 64) + 1),
                rng.randrange(min(n, 256) + 1),
            ]
        )
        del data[at:]
        log.append(f"truncate to {at}")

    def splice(self, rng: random.Random, name: str, data: bytearray, log: list[str]) -> None:
        donors = {**self.built, **self.real}
        donor_name = rng.choice(sorted(donors))
        donor = donors[donor_name]
        if not data or not donor:
            return
        size = rng.choice([4, 8, 16, 64, 256])
        src = rng.randrange(max(1, len(donor) - size))
        dst = rng.randrange(len(data))
        chunk = donor[src : src + size]
        if rng.random() < 0.5:
            data[dst : dst + len(chunk)] = chunk  # overwrite
            log.append(f"splice {len(chunk)} bytes of {donor_name}@{src} over {dst}")
        else:
            data[dst:dst] = chunk  # insert: shifts every offset after dst
            log.append(f"insert {len(chunk)} bytes of {donor_name}@{src} at {dst}")

    def int(self, rng: random.Random, name: str, data: bytearray, log: list[str]) -> None:
        base = self.built.get(name) or self.real.get(name)
        try:
            positions = self.positions(name, base) if base is not None else []
        except Exception:  # noqa: BLE001  (the seed itself is valid; be safe anyway)
            positions = []
        at = (
            rng.choice(positions)
            if positions and rng.random() < 0.9
            else rng.randrange(max(1, len(data)))
        )
        width = rng.choice([4, 4, 4, 2, 1, 8])
        if at + width > len(data):
            return
        n = len(data)
        value = rng.choice(
            INTERESTING_INTS + [n, n - 4, n + 4, n // 2, rng.randrange(1 << 32), rng.randrange(256)]
        )
        old = int.from_bytes(data[at : at + width], "little")
        if rng.random() < 0.3:  # nudge the existing value instead
            value = old + rng.choice([-8, -4, -1, 1, 4, 8, 1 << 16])
        value &= (1 << (8 * width)) - 1
        data[at : at + width] = value.to_bytes(width, "little")
        log.append(f"int{8 * width} at {at}: {old} -> {value}")


# -- running one case -----------------------------------------------------------------------


def classify(data: bytes) -> tuple[str, str]:
    """Load the bytes; return (outcome, detail): outcome is 'ok', 'ModelError' or the
    name of the exception that escaped (detail: its traceback)."""
    from litekiln import ModelError
    from litekiln.model import load_model

    try:
        load_model(data)
    except ModelError as exc:
        return "ModelError", str(exc)
    except BaseException as exc:  # noqa: BLE001  (anything else is the finding)
        if isinstance(exc, KeyboardInterrupt):
            raise
        return type(exc).__name__, traceback.format_exc()
    return "ok", ""


def _worker(
    conn: Any, built: dict[str, bytes], real: dict[str, bytes], seed: int, numbers: list[int]
) -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    except (ImportError, ValueError, OSError):
        pass
    import resource

    import litekiln.model  # noqa: F401  (imported before timing, not inside the first case)

    mutator = Mutator(built, real, seed)
    for number in numbers:
        case = mutator.case(number)
        conn.send(("start", number))
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        outcome, detail = classify(case.data)
        seconds = time.perf_counter() - t0
        grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
        conn.send(("done", number, outcome, detail, seconds, grown_mb))
        if grown_mb > MEMORY_FLAG_MB:
            conn.send(("recycle",))  # a fresh worker, so the next peak is measured from scratch
            return
    conn.send(("exit",))


# -- the run --------------------------------------------------------------------------------


@dataclass
class Report:
    cases: int = 0
    outcomes: Counter = field(default_factory=Counter)
    messages: Counter = field(default_factory=Counter)  # first words of ModelError messages
    findings: list[dict[str, Any]] = field(default_factory=list)  # escapes, hangs, crashes
    costly: list[dict[str, Any]] = field(default_factory=list)  # slow or memory-hungry cases
    slowest: tuple[float, int] = (0.0, -1)
    peak_growth_mb: float = 0.0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "cases": self.cases,
            "outcomes": dict(self.outcomes.most_common()),
            "model_error_kinds": dict(self.messages.most_common(15)),
            "findings": self.findings,
            "costly": self.costly,
            "slowest_case": {"seconds": round(self.slowest[0], 4), "case": self.slowest[1]},
            "largest_memory_growth_mb": round(self.peak_growth_mb),
            "seconds": round(self.seconds, 1),
        }


def _message_kind(msg: str) -> str:
    """A ModelError message without the model name and numbers, to count kinds of error."""
    text = msg.split(": ", 1)[-1]
    return "".join("#" if ch.isdigit() else ch for ch in text)[:70]


def save_finding(out: Path, kind: str, case: Case, detail: str) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(case.data).hexdigest()[:12]
    stem = f"{kind}-{digest}"
    (out / f"{stem}.tflite").write_bytes(case.data)
    note = {
        "kind": kind,
        "case": case.number,
        "seed_model": case.seed_name,
        "mutations": case.mutations,
        "size": len(case.data),
        "detail": detail,
    }
    (out / f"{stem}.json").write_text(json.dumps(note, indent=2) + "\n")
    return {**note, "file": str(out / f"{stem}.tflite")}


def run(
    cases: int,
    seed: int,
    workers: int,
    timeout: float,
    out: Path,
    real: bool = True,
    progress: bool = True,
) -> Report:
    built, reals = load_seeds(real)
    mutator = Mutator(built, reals, seed)
    report = Report()
    start = time.perf_counter()
    ctx = mp.get_context("fork")
    todo = list(range(cases))
    # Each worker gets a contiguous share; a killed worker's remaining share is restarted.
    shares = [todo[i::workers] for i in range(workers)]
    live: dict[Any, dict[str, Any]] = {}

    def launch(numbers: list[int]) -> None:
        if not numbers:
            return
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_worker, args=(child, built, reals, seed, numbers), daemon=True)
        proc.start()
        child.close()
        live[parent] = {
            "proc": proc,
            "numbers": numbers,
            "done": 0,
            "current": None,
            "since": time.perf_counter(),
        }

    def finding(kind: str, number: int, detail: str) -> None:
        case = mutator.case(number)
        report.findings.append(save_finding(out, kind, case, detail))
        report.outcomes[kind] += 1
        report.cases += 1

    for share in shares:
        launch(share)
    last_print = time.perf_counter()
    while live:
        ready = mp.connection.wait(list(live), timeout=0.2)
        for conn in ready:
            w = live[conn]
            try:
                msg = conn.recv()
            except EOFError:
                w["proc"].join()
                code = w["proc"].exitcode
                del live[conn]
                if w["current"] is not None:
                    detail = f"worker died with exit code {code}"
                    finding(f"crash(exit {code})", w["current"], detail)
                    launch(w["numbers"][w["done"] + 1 :])
                else:
                    launch(w["numbers"][w["done"] :])
                continue
            if msg[0] == "start":
                w["current"], w["since"] = msg[1], time.perf_counter()
            elif msg[0] == "done":
                _, number, outcome, detail, seconds, grown_mb = msg
                w["current"], w["done"] = None, w["done"] + 1
                report.cases += 1
                report.outcomes[outcome] += 1
                if outcome == "ModelError":
                    report.messages[_message_kind(detail)] += 1
                elif outcome != "ok":
                    report.findings.append(
                        save_finding(out, f"escape-{outcome}", mutator.case(number), detail)
                    )
                if seconds > SLOW_FLAG_S or grown_mb > MEMORY_FLAG_MB:
                    note = (
                        f"{outcome} after {seconds:.2f} s, peak memory +{grown_mb:.0f} MB: "
                        f"{detail.strip().splitlines()[-1] if detail else ''}"
                    )
                    report.costly.append(save_finding(out, "costly", mutator.case(number), note))
                if seconds > report.slowest[0]:
                    report.slowest = (seconds, number)
                report.peak_growth_mb = max(report.peak_growth_mb, grown_mb)
            elif msg[0] in ("exit", "recycle"):
                w["proc"].join()
                del live[conn]
                if msg[0] == "recycle":
                    launch(w["numbers"][w["done"] :])
        now = time.perf_counter()
        for conn, w in list(live.items()):
            if w["current"] is not None and now - w["since"] > timeout:
                w["proc"].kill()
                w["proc"].join()
                del live[conn]
                finding("hang", w["current"], f"no result after {timeout} s")
                launch(w["numbers"][w["done"] + 1 :])
        if progress and now - last_print > 10:
            last_print = now
            print(f"  {report.cases}/{cases} cases, {dict(report.outcomes)}", file=sys.stderr)
    report.seconds = time.perf_counter() - start
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10000, help="number of cases (10000)")
    parser.add_argument("--seed", type=int, default=0, help="run seed (0)")
    parser.add_argument(
        "--workers",
        type=int,
        default=max(1, min(8, os.cpu_count() or 1)),
        help="worker processes (CPU count, at most 8)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="seconds after which a case counts as a hang (10)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="where reproducers are saved (tests/data/fuzz_regressions)",
    )
    parser.add_argument("--no-real", action="store_true", help="only the built seed models")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--only-case", type=int, help="rerun one case here and print the result")
    args = parser.parse_args(argv)

    if args.only_case is not None:
        built, reals = load_seeds(not args.no_real)
        case = Mutator(built, reals, args.seed).case(args.only_case)
        outcome, detail = classify(case.data)
        print(f"case {case.number}: seed {case.seed_name}, {case.mutations}\n{outcome}: {detail}")
        return 0 if outcome in ("ok", "ModelError") else 1

    report = run(args.cases, args.seed, args.workers, args.timeout, args.out, real=not args.no_real)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(f"cases run: {report.cases} in {report.seconds:.1f} s")
        print("outcomes: " + ", ".join(f"{k} {v}" for k, v in report.outcomes.most_common()))
        print("most common ModelError kinds:")
        for kind, n in report.messages.most_common(10):
            print(f"  {n:6d}  {kind}")
        print(
            f"slowest case: #{report.slowest[1]} ({report.slowest[0] * 1000:.1f} ms); "
            f"largest peak-memory growth of a case: {report.peak_growth_mb:.0f} MB"
        )
        for f in report.costly:
            print(
                f"COSTLY: case {f['case']} ({f['seed_model']}, {f['size']} bytes): "
                f"{f['detail']} -> {f['file']}"
            )
        for f in report.findings:
            print(
                f"FINDING {f['kind']}: case {f['case']} ({f['seed_model']}, {f['mutations']}) "
                f"-> {f['file']}"
            )
            print("    " + f["detail"].strip().splitlines()[-1])
    bad = [k for k in report.outcomes if k not in ("ok", "ModelError")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
