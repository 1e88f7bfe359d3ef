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

``--differential`` fuzzes the meaning of models instead (see the section "differential
fuzzing"): semantic mutants of models LiteRT runs (op inputs and outputs, op codes, options,
tensor types, shapes, quantization, buffers, graph inputs and outputs, op order) run on
LiteRT's builtin kernels and on litekiln's numpy reference, and the report counts what one
refuses and the other runs, different outputs, and litekiln's crashes, hangs and
non-litekiln exceptions, with an explanation for each kind of disagreement.

Usage::

    python scripts/fuzz_loader.py --cases 10000 --seed 0 [--json] [--workers 2]
    python scripts/fuzz_loader.py --differential --cases 10000 --workers 2 --timeout 30

Every case is reproducible from (``--seed``, case number): ``--only-case N`` reruns one in
this process and prints its traceback (with ``--differential``: both runtimes' answers).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import multiprocessing as mp
import os
import random
import re
import struct
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
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


def diff_built_seeds() -> dict[str, bytes]:
    """Small models LiteRT runs, covering ops the real seeds lack (float and int8)."""
    sys.path.insert(0, str(REPO / "tests"))
    import numpy as np
    from tflite_builder import ModelBuilder, Quant

    rng = np.random.default_rng(1)
    f32 = np.float32
    seeds = {}

    b = ModelBuilder()
    x = b.input("x", [1, 8, 8, 4])
    a = b.op("MUL", [x, rng.normal(size=4).astype(f32)], options={"fused_activation_function": 0})
    c = b.op("MAXIMUM", [b.op("SUB", [a, x]), np.array(0.1, f32)])
    d = b.op("TRANSPOSE", [b.op("TANH", [c]), np.array([0, 2, 1, 3], np.int32)])
    f = b.op("CONCATENATION", [d, x], out_shape=[1, 8, 8, 8], options={"axis": 3})
    g = b.op(
        "STRIDED_SLICE",
        [
            f,
            np.array([0, 0, 0, 2], np.int32),
            np.array([1, 8, 8, 6], np.int32),
            np.array([1, 1, 1, 1], np.int32),
        ],
        out_shape=[1, 8, 8, 4],
    )
    h = b.op(
        "MEAN", [g, np.array([1, 2], np.int32)], out_shape=[1, 1, 1, 4], options={"keep_dims": True}
    )
    s = b.op(
        "SOFTMAX",
        [
            b.op(
                "RESHAPE",
                [h, np.array([1, 4], np.int32)],
                out_shape=[1, 4],
                options={"new_shape": [1, 4]},
            )
        ],
        options={"beta": 1.0},
    )
    p = b.op(
        "PAD", [x, np.array([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32)], out_shape=[1, 10, 10, 4]
    )
    m = b.op(
        "MAX_POOL_2D",
        [p],
        out_shape=[1, 5, 5, 4],
        options={
            "padding": "VALID",
            "stride_w": 2,
            "stride_h": 2,
            "filter_width": 2,
            "filter_height": 2,
        },
    )
    d2s = b.op("DEPTH_TO_SPACE", [x], out_shape=[1, 16, 16, 1], options={"block_size": 2})
    s2d = b.op("SPACE_TO_DEPTH", [d2s], out_shape=[1, 8, 8, 4], options={"block_size": 2})
    rn = b.op("RESIZE_NEAREST_NEIGHBOR", [s2d, np.array([4, 4], np.int32)], out_shape=[1, 4, 4, 4])
    l2 = b.op("L2_NORMALIZATION", [rn])
    lr = b.op("LEAKY_RELU", [l2], options={"alpha": 0.3})
    hs = b.op("HARD_SWISH", [lr])
    w = rng.normal(size=(3, 64)).astype(f32)
    fc = b.op(
        "FULLY_CONNECTED",
        [
            b.op("RESHAPE", [hs, np.array([1, 64], np.int32)], out_shape=[1, 64]),
            w,
            rng.normal(size=3).astype(f32),
        ],
        out_shape=[1, 3],
        options={"fused_activation_function": "RELU"},
    )
    sq = b.op("SQUARED_DIFFERENCE", [fc, np.array([[0.5, -0.5, 1.0]], f32)])
    am = b.op(
        "ARG_MAX",
        [sq, np.array([1], np.int32)],
        out_shape=[1],
        out_dtype="int32",
        options={"output_type": "INT32"},
    )
    parts = b.op(
        "SPLIT",
        [np.array(3, np.int32), x],
        options={"num_splits": 2},
        outputs=[b.tensor("s0", [1, 8, 8, 2]), b.tensor("s1", [1, 8, 8, 2])],
    )
    dv = b.op("DIV", [parts[0], b.op("ADD", [b.op("EXP", [parts[1]]), np.array(1.0, f32)])])
    rs = b.op(
        "SUM", [dv, np.array([3], np.int32)], out_shape=[1, 8, 8], options={"keep_dims": False}
    )
    ex = b.op("EXPAND_DIMS", [rs, np.array(0, np.int32)], out_shape=[1, 1, 8, 8])
    tc_w = rng.normal(size=(2, 3, 3, 4)).astype(f32)
    tc = b.op(
        "TRANSPOSE_CONV",
        [np.array([1, 16, 16, 2], np.int32), tc_w, x],
        out_shape=[1, 16, 16, 2],
        out_dtype="float32",
        options={"padding": "SAME", "stride_w": 2, "stride_h": 2},
    )
    dw = b.op(
        "DEPTHWISE_CONV_2D",
        [x, rng.normal(size=(1, 3, 3, 8)).astype(f32), np.zeros(8, f32)],
        out_shape=[1, 8, 8, 8],
        options={
            "padding": "SAME",
            "stride_w": 1,
            "stride_h": 1,
            "depth_multiplier": 2,
            "dilation_w_factor": 2,
            "dilation_h_factor": 1,
        },
        version=2,
    )
    ap = b.op(
        "AVERAGE_POOL_2D",
        [dw],
        out_shape=[1, 3, 3, 8],
        options={
            "padding": "SAME",
            "stride_w": 3,
            "stride_h": 3,
            "filter_width": 3,
            "filter_height": 2,
            "fused_activation_function": "RELU6",
        },
    )
    rb = b.op(
        "RESIZE_BILINEAR",
        [ap, np.array([5, 7], np.int32)],
        out_shape=[1, 5, 7, 8],
        options={"half_pixel_centers": True},
        version=3,
    )
    lg = b.op("LOGISTIC", [rb])
    b.output(s, m, am, ex, tc, lg)
    seeds["built_float_ops"] = b.build()

    q = Quant(0.05, 3)
    b = ModelBuilder()
    x = b.input("x", [1, 8, 8, 4], "int8", quant=q)
    y = b.input("y", [1, 8, 8, 4], "int8", quant=Quant(0.03, -2))
    a = b.op("ADD", [x, y], out_quant=Quant(0.08, 1), options={"fused_activation_function": "RELU"})
    m = b.op("MUL", [a, y], out_quant=Quant(0.06, 0))
    lg = b.op("LOGISTIC", [m], out_quant=Quant(1 / 256, -128))
    ap = b.op(
        "AVERAGE_POOL_2D",
        [lg],
        out_shape=[1, 4, 4, 4],
        options={
            "padding": "VALID",
            "stride_w": 2,
            "stride_h": 2,
            "filter_width": 2,
            "filter_height": 2,
        },
    )
    mp_ = b.op(
        "MAX_POOL_2D",
        [x],
        out_shape=[1, 4, 4, 4],
        options={
            "padding": "SAME",
            "stride_w": 2,
            "stride_h": 2,
            "filter_width": 3,
            "filter_height": 3,
        },
    )
    cat = b.op(
        "CONCATENATION",
        [ap, b.op("QUANTIZE", [mp_], out_quant=Quant(1 / 256, -128))],
        out_shape=[1, 4, 4, 8],
        options={"axis": 3},
    )
    wq = Quant([0.01] * 8, [0] * 8, axis=3)
    dw = b.op(
        "DEPTHWISE_CONV_2D",
        [
            cat,
            b.const("dw", rng.integers(-127, 128, (1, 3, 3, 8)).astype(np.int8), quant=wq),
            b.const(
                "dwb",
                rng.integers(-100, 100, 8).astype(np.int32),
                quant=Quant([0.01 / 256] * 8, [0] * 8),
            ),
        ],
        out_shape=[1, 4, 4, 8],
        out_quant=Quant(0.02, 0),
        options={"padding": "SAME", "stride_w": 1, "stride_h": 1, "depth_multiplier": 1},
        version=3,
    )
    pd = b.op(
        "PAD", [dw, np.array([[0, 0], [1, 0], [0, 1], [0, 0]], np.int32)], out_shape=[1, 5, 5, 8]
    )
    rb = b.op(
        "RESIZE_BILINEAR", [pd, np.array([3, 3], np.int32)], out_shape=[1, 3, 3, 8], version=2
    )
    rs = b.op("RESHAPE", [rb, np.array([1, 72], np.int32)], out_shape=[1, 72])
    fc = b.op(
        "FULLY_CONNECTED",
        [
            rs,
            b.const("fw", rng.integers(-127, 128, (10, 72)).astype(np.int8), quant=Quant(0.01, 0)),
            b.const(
                "fb", rng.integers(-100, 100, 10).astype(np.int32), quant=Quant(0.02 * 0.01, 0)
            ),
        ],
        out_shape=[1, 10],
        out_quant=Quant(0.1, -5),
        version=4,
    )
    sm = b.op("SOFTMAX", [fc], out_quant=Quant(1 / 256, -128), options={"beta": 1.0})
    mean = b.op(
        "MEAN",
        [x, np.array([1, 2], np.int32)],
        out_shape=[1, 4],
        out_quant=Quant(0.05, 3),
        options={"keep_dims": False},
        version=2,
    )
    # (The int8 MEAN is an output itself: litekiln's float view of it may be a step off
    # LiteRT's, which check.py's integer bound allows and a float comparison would not.)
    dq = b.op("DEQUANTIZE", [y], out_dtype="float32", out_quant=None, version=2)
    b.output(sm, mean, dq)
    seeds["built_int8_ops"] = b.build()
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
    limit_memory()
    import resource

    import litekiln.model  # noqa: F401  (imported before timing, not inside the first case)
    import litekiln.ops  # noqa: F401  (its per-op checks run at load)

    mutator = Mutator(built, real, seed)
    for number in numbers:
        case = mutator.case(number)
        conn.send(("start", number))
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        outcome, detail = classify(case.data)
        seconds = time.perf_counter() - t0
        grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
        conn.send(("done", number, (outcome, detail, seconds, grown_mb)))
        if grown_mb > MEMORY_FLAG_MB:
            conn.send(("recycle",))  # a fresh worker, so the next peak is measured from scratch
            return
    conn.send(("exit",))


# -- worker processes -----------------------------------------------------------------------


@dataclass
class Event:
    """What the pool of workers reports about one case."""

    kind: str  # "done", "crash" (the worker died in the case) or "hang" (it was killed)
    number: int
    payload: Any = None  # the worker's result ("done"), else its last note about the case
    detail: str = ""


def drive(
    target: Callable[..., None],
    args: tuple[Any, ...],
    numbers: list[int],
    workers: int,
    timeout: float,
) -> Iterator[Event]:
    """Run ``target(conn, *args, share)`` in worker processes over the case ``numbers``.

    A worker says ``("start", n)`` before case n, ``("note", n, payload)`` to leave word of
    how far it got (reported with a crash or a hang; the time limit starts again at each
    note), ``("done", n, payload)`` after it, ``("recycle",)`` to be replaced by a fresh
    worker and ``("exit",)`` when its share is done. A worker that dies in a case is a crash;
    one that stays in a case (or a phase of it) longer than ``timeout`` seconds is killed, a
    hang. Either way the rest of its share goes to a fresh worker.
    """
    ctx = mp.get_context("fork")
    live: dict[Any, dict[str, Any]] = {}

    def launch(share: list[int], stillborn: int = 0) -> None:
        if not share:
            return
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=target, args=(child, *args, share), daemon=True)
        proc.start()
        child.close()
        live[parent] = {
            "proc": proc,
            "share": share,
            "done": 0,
            "current": None,
            "note": None,
            "since": time.perf_counter(),
            "stillborn": stillborn,  # workers before it that died before any case
        }

    for i in range(workers):
        launch(numbers[i::workers])
    while live:
        for conn in mp.connection.wait(list(live), timeout=0.2):
            w = live[conn]
            try:
                msg = conn.recv()
            except EOFError:
                w["proc"].join()
                del live[conn]
                if w["current"] is None:
                    rest = w["share"][w["done"] :]
                    # A worker that dies before its next case starts (at start-up, or making
                    # the case) is retried twice, then that case is reported as its crash.
                    stillborn = w["stillborn"] + 1 if w["done"] == 0 else 1
                    if stillborn < 3 or not rest:
                        launch(rest, stillborn)
                        continue
                    code = w["proc"].exitcode
                    yield Event(
                        f"crash(exit {code})",
                        rest[0],
                        None,
                        f"worker died before case {rest[0]} started (exit {code})",
                    )
                    launch(rest[1:])
                    continue
                code = w["proc"].exitcode
                yield Event(
                    f"crash(exit {code})",
                    w["current"],
                    w["note"],
                    f"worker died with exit code {code}",
                )
                launch(w["share"][w["done"] + 1 :])
                continue
            if msg[0] == "start":
                w["current"], w["note"], w["since"] = msg[1], None, time.perf_counter()
            elif msg[0] == "note":
                w["note"], w["since"] = msg[2], time.perf_counter()
            elif msg[0] == "done":
                w["current"], w["done"] = None, w["done"] + 1
                yield Event("done", msg[1], msg[2])
            elif msg[0] in ("exit", "recycle"):
                w["proc"].join()
                del live[conn]
                if msg[0] == "recycle":
                    launch(w["share"][w["done"] :])
        now = time.perf_counter()
        for conn, w in list(live.items()):
            if w["current"] is not None and now - w["since"] > timeout:
                w["proc"].kill()
                w["proc"].join()
                del live[conn]
                yield Event("hang", w["current"], w["note"], f"no result after {timeout} s")
                launch(w["share"][w["done"] + 1 :])


def limit_memory() -> None:
    """Cap this (worker) process's address space at WORKER_MEMORY_BYTES."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    except (ImportError, ValueError, OSError):
        pass


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


def save_finding(out: Path, kind: str, case: Case, detail: str, **extra: Any) -> dict[str, Any]:
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
        **extra,
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
    start = last_print = time.perf_counter()
    for event in drive(_worker, (built, reals, seed), list(range(cases)), workers, timeout):
        report.cases += 1
        if event.kind != "done":
            report.outcomes[event.kind] += 1
            case = mutator.case(event.number)
            report.findings.append(save_finding(out, event.kind, case, event.detail))
            continue
        number = event.number
        outcome, detail, seconds, grown_mb = event.payload
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
        now = time.perf_counter()
        if progress and now - last_print > 10:
            last_print = now
            print(f"  {report.cases}/{cases} cases, {dict(report.outcomes)}", file=sys.stderr)
    report.seconds = time.perf_counter() - start
    return report


# -- differential fuzzing: litekiln against LiteRT ------------------------------------------
#
# ``--differential`` mutates the *meaning* of models LiteRT runs (the flatbuffer stays well
# formed: the model is unpacked with the schema's object API, a field changed, packed again)
# and runs each mutant on both: LiteRT's builtin kernels (``Interpreter(model_content=...)``,
# ``allocate_tensors``, ``invoke`` on seeded inputs) and litekiln's numpy reference
# (``litekiln.Interpreter(model_content=..., device="reference")``, no OpenCL). A model
# LiteRT refuses must be refused by litekiln too, with a litekiln error; one LiteRT runs
# must give the same outputs (check.py's tolerance).
#
# The oracle is LiteRT's builtin resolver (BUILTIN_WITHOUT_DEFAULT_DELEGATES), not the
# default XNNPACK delegate: the numpy reference follows the builtin kernels (hybrid and
# integer rounding, see ops/qmath.py), and the rules litekiln checks at load are the builtin
# kernels' Prepare functions.

#: Real models used as differential seeds when present (all run on LiteRT's stock build:
#: selfie_segmentation and face_landmark_with_attention need MediaPipe's custom ops), with
#: their share of the cases. Small models weigh more: they run 10-100x faster.
DIFF_REAL_SEEDS = {
    "smoke": 3,
    "smoke_int8": 3,
    "face_detection_short_range": 2,
    "hand_landmark_lite": 1,
    "palm_detection_lite": 1,
    "mobilenet_v1_int8": 1,
}

#: Built seeds (small models of ops the real seeds lack), with their share of the cases.
DIFF_BUILT_SEEDS = {
    "built_conv_int8": 1,
    "built_sparse_fp16": 1,
    "built_float_ops": 3,
    "built_int8_ops": 3,
}

#: Reproducers larger than this are saved only when they are litekiln's findings (mutants
#: of the larger real models would bloat tests/data).
SAVE_MAX_BYTES = 300 << 10

#: Graph inputs larger than this are not materialised (a mutated shape may ask for terabytes;
#: the model is judged on whether it loads and allocates).
DIFF_MAX_INPUT_BYTES = 64 << 20

#: Values a mutation writes into a dimension, an option or a quantization parameter.
DIMS = [0, 1, 2, 3, 4, 7, 8, 16, 255, 1 << 16, (1 << 31) - 1, -1]
OPTION_INTS = [0, 1, 2, 3, 4, 5, 6, 7, -1, -2, 127, 255, 1 << 16, (1 << 31) - 1, -(1 << 31)]
FLOATS = [0.0, -1.0, 1.0, 0.5, 1e-30, 1e30, float("nan"), float("inf"), -float("inf")]
ZERO_POINTS = [0, 1, -1, 127, 128, -128, -129, 255, 256, (1 << 31) - 1, 1 << 40]
QUANT_DIMS = [0, 1, 2, 3, 4, -1, (1 << 31) - 1]
#: TensorType codes a mutation may give a tensor (RESOURCE and VARIANT left out).
TENSOR_TYPES = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 15, 16, 17]


def diff_seeds(real: bool = True) -> dict[str, tuple[bytes, int]]:
    """Seed name -> (model bytes, weight) of the differential fuzzer."""
    built = {**built_seeds(), **diff_built_seeds()}
    out = {name: (built[name], w) for name, w in DIFF_BUILT_SEEDS.items()}
    if real:
        for name, w in DIFF_REAL_SEEDS.items():
            path = find_real_seed(name)
            if path is not None:
                out[name] = (path.read_bytes(), w)
    return out


class ModelMutator:
    """Semantic mutations: case ``n`` of run ``seed`` is always the same model.

    Each case unpacks a seed (cached) into the schema's object API, applies one to three
    mutations of subgraph 0 (op inputs and outputs, op codes and versions, builtin options and
    their type, tensor types, shapes, quantization, buffers, graph inputs and outputs, the op
    order) and packs it again.
    """

    KINDS = {
        "op_inputs": 4,
        "op_outputs": 1,
        "opcode": 1,
        "option": 5,
        "options_type": 1,
        "tensor_type": 2,
        "shape": 3,
        "quantization": 5,
        "buffer": 1,
        "graph_io": 1,
        "op_order": 1,
    }

    def __init__(self, seeds: dict[str, tuple[bytes, int]], seed: int) -> None:
        self.seeds = seeds
        self.seed = seed
        self._models: dict[str, Any] = {}

    def model(self, name: str) -> Any:
        from ai_edge_litert import schema_py_generated as schema

        if name not in self._models:
            self._models[name] = schema.ModelT.InitFromPackedBuf(self.seeds[name][0], 0)
        return self._models[name]

    def case(self, number: int) -> Case:
        import flatbuffers

        names = sorted(self.seeds)
        weights = [self.seeds[n][1] for n in names]
        for attempt in range(8):
            rng = random.Random(f"diff:{self.seed}:{number}:{attempt}")
            name = rng.choices(names, weights)[0]
            model = _clone(self.model(name))
            case = Case(number, name)
            for _ in range(rng.choice([1, 1, 1, 2, 2, 3])):
                kind = rng.choices(list(self.KINDS), list(self.KINDS.values()))[0]
                getattr(self, kind)(rng, model, case.mutations)
            builder = flatbuffers.Builder(1024)
            try:
                builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
            except (struct.error, OverflowError, TypeError, ValueError):
                continue  # a value that does not fit its field: draw again
            case.data = bytes(builder.Output())
            return case
        raise RuntimeError(f"case {number}: no packable mutation in 8 attempts")

    # -- choosing things -----------------------------------------------------------------

    @staticmethod
    def _graph(model: Any) -> Any:
        return model.subgraphs[0]

    def _op(self, rng: random.Random, model: Any) -> tuple[int, Any]:
        ops = self._graph(model).operators or []
        i = rng.randrange(len(ops))
        return i, ops[i]

    def _tensor(self, rng: random.Random, model: Any, used: bool = True) -> tuple[int, Any]:
        """A tensor, usually one that an op reads or writes."""
        g = self._graph(model)
        if used and rng.random() < 0.9:
            _, op = self._op(rng, model)
            n = len(g.tensors)
            ids = [int(t) for t in [*_ints(op.inputs), *_ints(op.outputs)] if 0 <= t < n]
            if ids:
                t = rng.choice(ids)
                return t, g.tensors[t]
        t = rng.randrange(len(g.tensors))
        return t, g.tensors[t]

    # -- mutations -----------------------------------------------------------------------

    def op_inputs(self, rng: random.Random, model: Any, log: list[str]) -> None:
        i, op = self._op(rng, model)
        self._edit_list(rng, model, op, "inputs", f"op {i}", log, allow_omitted=True)

    def op_outputs(self, rng: random.Random, model: Any, log: list[str]) -> None:
        i, op = self._op(rng, model)
        self._edit_list(rng, model, op, "outputs", f"op {i}", log, allow_omitted=False)

    def graph_io(self, rng: random.Random, model: Any, log: list[str]) -> None:
        field_ = rng.choice(["inputs", "outputs"])
        self._edit_list(rng, model, self._graph(model), field_, "graph", log, False)

    def _edit_list(
        self,
        rng: random.Random,
        model: Any,
        obj: Any,
        field_: str,
        where: str,
        log: list[str],
        allow_omitted: bool,
    ) -> None:
        ids = _ints(getattr(obj, field_))
        n_tensors = len(self._graph(model).tensors)
        how = rng.choice(["drop", "append", "replace", "replace"])
        new = rng.choice([-1] * allow_omitted + [rng.randrange(n_tensors)] * 4 + [n_tensors, -2])
        if how == "drop" and ids:
            del ids[rng.randrange(len(ids))]
        elif how == "append" or not ids:
            ids.append(new)
        else:
            ids[rng.randrange(len(ids))] = new
        setattr(obj, field_, ids)
        log.append(f"{where} {field_} {how}: {ids}")

    def opcode(self, rng: random.Random, model: Any, log: list[str]) -> None:
        i, op = self._op(rng, model)
        codes = model.operatorCodes
        how = rng.choice(["index", "version", "builtin"])
        if how == "index":
            op.opcodeIndex = rng.randrange(len(codes))
            log.append(f"op {i} opcode index := {op.opcodeIndex}")
            return
        oc = codes[op.opcodeIndex]
        if how == "version":
            oc.version = rng.choice([0, 1, 2, 3, 4, 5, 7, 12, 100])
            log.append(f"op {i} opcode version := {oc.version}")
        else:
            from litekiln.model.schema import builtin_code
            from litekiln.ops import REGISTRY

            name = rng.choice(sorted(n for n in REGISTRY if n.isupper()))
            oc.builtinCode = builtin_code(name)
            oc.deprecatedBuiltinCode = min(oc.builtinCode, 127)
            log.append(f"op {i} opcode builtin := {name}")

    def option(self, rng: random.Random, model: Any, log: list[str]) -> None:
        i, op = self._op(rng, model)
        opts = op.builtinOptions
        fields = [k for k, v in vars(opts).items() if isinstance(v, (int, float))] if opts else []
        if not fields:
            if op.customOptions is not None and len(op.customOptions):
                raw = bytearray(bytes(op.customOptions))
                at = rng.randrange(len(raw))
                raw[at] = rng.randrange(256)
                op.customOptions = list(raw)
                log.append(f"op {i} custom options byte {at} := {raw[at]}")
            return
        key = rng.choice(fields)
        old = getattr(opts, key)
        if isinstance(old, bool):
            value: Any = not old
        elif isinstance(old, float):
            value = rng.choice(FLOATS)
        else:
            value = rng.choice(OPTION_INTS + [old + 1, old - 1, old * 2])
        setattr(opts, key, value)
        log.append(f"op {i} option {key}: {old} -> {value}")

    def options_type(self, rng: random.Random, model: Any, log: list[str]) -> None:
        """Give an op no options, or the options table of another op."""
        i, op = self._op(rng, model)
        others = [o for o in self._graph(model).operators if o.builtinOptionsType]
        if rng.random() < 0.4 or not others:
            op.builtinOptionsType, op.builtinOptions = 0, None
            log.append(f"op {i} options removed")
            return
        donor = rng.choice(others)
        op.builtinOptionsType = donor.builtinOptionsType
        op.builtinOptions = _copy(donor.builtinOptions)
        log.append(f"op {i} options := {type(donor.builtinOptions).__name__}")

    def tensor_type(self, rng: random.Random, model: Any, log: list[str]) -> None:
        t, tensor = self._tensor(rng, model)
        old, tensor.type = tensor.type, rng.choice(TENSOR_TYPES)
        log.append(f"tensor {t} type: {old} -> {tensor.type}")

    def shape(self, rng: random.Random, model: Any, log: list[str]) -> None:
        t, tensor = self._tensor(rng, model, used=rng.random() < 0.8)
        if rng.random() < 0.15:  # the graph input: a size bound, not a consistency check
            g = self._graph(model)
            ins = _ints(g.inputs)
            if ins and 0 <= ins[0] < len(g.tensors):
                t, tensor = ins[0], g.tensors[ins[0]]
        dims = _ints(tensor.shape)
        how = rng.choice(["set", "set", "set", "add", "drop"])
        if how == "add":
            dims.insert(rng.randrange(len(dims) + 1), rng.choice(DIMS[:8]))
        elif how == "drop" and dims:
            del dims[rng.randrange(len(dims))]
        elif dims:
            k = rng.randrange(len(dims))
            dims[k] = rng.choice(DIMS + [dims[k] + 1, dims[k] * 2, dims[k] * 65536])
        tensor.shape = dims
        if tensor.shapeSignature is not None and rng.random() < 0.5:
            tensor.shapeSignature = None
        log.append(f"tensor {t} shape {how}: {dims}")

    def quantization(self, rng: random.Random, model: Any, log: list[str]) -> None:
        from ai_edge_litert import schema_py_generated as schema

        t, tensor = self._tensor(rng, model)
        q = tensor.quantization
        if q is None or q.scale is None or rng.random() < 0.1:
            q = schema.QuantizationParametersT()
            q.scale, q.zeroPoint = [rng.choice([0.1, 0.02, 1.0])], [0]
            tensor.quantization = q
            log.append(f"tensor {t} quantization added")
            if rng.random() < 0.5:
                return
        scale = [float(s) for s in (q.scale if q.scale is not None else [])]
        zps = _ints(q.zeroPoint)
        how = rng.choice(["scale", "zero_point", "count", "dimension", "drop_zp", "remove"])
        if how == "scale" and scale:
            k = rng.randrange(len(scale))
            scale[k] = rng.choice(FLOATS + [scale[k] * 1e6, -scale[k]])
        elif how == "zero_point" and zps:
            k = rng.randrange(len(zps))
            zps[k] = rng.choice(ZERO_POINTS)
        elif how == "count":
            n = rng.choice([1, 2, 3, len(scale) + 1, max(len(scale) - 1, 1)])
            scale = [scale[0] if scale else 0.1] * n
            zps = [zps[0] if zps else 0] * (n if rng.random() < 0.8 else max(n - 1, 1))
        elif how == "dimension":
            q.quantizedDimension = rng.choice(QUANT_DIMS)
        elif how == "drop_zp":
            zps = []
        elif how == "remove":
            tensor.quantization = None
            log.append(f"tensor {t} quantization removed")
            return
        q.scale, q.zeroPoint = scale, (zps if zps else None)
        log.append(
            f"tensor {t} quantization {how}: scale {scale[:4]}{'...' * (len(scale) > 4)} "
            f"zero point {zps[:4]} dimension {q.quantizedDimension}"
        )

    def buffer(self, rng: random.Random, model: Any, log: list[str]) -> None:
        from ai_edge_litert import schema_py_generated as schema

        t, tensor = self._tensor(rng, model)
        if rng.random() < 0.5 or not tensor.buffer:
            old, tensor.buffer = tensor.buffer, rng.randrange(len(model.buffers))
            log.append(f"tensor {t} buffer: {old} -> {tensor.buffer}")
            return
        old_buf = model.buffers[tensor.buffer]
        data = bytes(old_buf.data) if old_buf.data is not None else b""
        n = len(data)
        new = rng.choice([data[: n // 2], data[:-1], data + bytes(4), b"", data * 2])
        buf = schema.BufferT()
        buf.data = list(new) if new else None
        model.buffers[tensor.buffer] = buf
        log.append(f"tensor {t} buffer {tensor.buffer} bytes: {n} -> {len(new)}")

    def op_order(self, rng: random.Random, model: Any, log: list[str]) -> None:
        ops = self._graph(model).operators
        if len(ops) < 2:
            return
        i, j = rng.sample(range(len(ops)), 2)
        if rng.random() < 0.3:
            del ops[i]
            log.append(f"op {i} deleted")
            return
        ops[i], ops[j] = ops[j], ops[i]
        log.append(f"ops {i} and {j} swapped")


def _ints(values: Any) -> list[int]:
    return [] if values is None else [int(v) for v in values]


def _copy(obj: Any) -> Any:
    import copy

    return copy.deepcopy(obj)


def _clone(model: Any) -> Any:
    """A copy of an unpacked model whose graph and tables may change; the buffers (the bulk)
    are shared until a mutation replaces one."""
    import copy

    out = copy.copy(model)
    out.subgraphs = copy.deepcopy(model.subgraphs)
    out.operatorCodes = copy.deepcopy(model.operatorCodes)
    out.signatureDefs = copy.deepcopy(model.signatureDefs)
    out.buffers = list(model.buffers)
    return out


# -- one mutant on both runtimes --------------------------------------------------------------


@dataclass
class Side:
    """What one runtime made of a mutant.

    Attributes:
        outcome: "ran"; "accepted" (loaded and allocated, not run: its inputs are larger
            than DIFF_MAX_INPUT_BYTES); "refused"; or "escape" (litekiln raised something
            that is not a LitekilnError).
        stage: where it was refused or escaped: "load", "allocate" or "invoke".
        error: the exception's type name.
        message: its message (an escape's traceback).
    """

    outcome: str
    stage: str = ""
    error: str = ""
    message: str = ""


def seeded_inputs(specs: list[tuple[tuple[int, ...], Any]], seed: int) -> list[Any]:
    """Random inputs as litekiln.interpreter.random_inputs draws them, from (shape, dtype)
    specs, so that both runtimes get the same arrays when they agree on the specs."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for shape, dtype in specs:
        dtype = np.dtype(dtype)
        if dtype.kind in "fc":
            out.append(rng.uniform(-1, 1, shape).astype(dtype))
        elif dtype.kind == "b":
            out.append(rng.integers(0, 2, shape).astype(bool))
        else:
            info = np.iinfo(dtype)
            lo, hi = max(info.min, -128), min(info.max, 127)
            out.append(rng.integers(lo, hi + 1, shape).astype(dtype))
    return out


def _input_specs(details: list[dict[str, Any]]) -> list[tuple[tuple[int, ...], Any]]:
    import numpy as np

    return [(tuple(int(d) for d in x["shape"]), np.dtype(x["dtype"])) for x in details]


def _too_large(specs: list[tuple[tuple[int, ...], Any]]) -> bool:
    import numpy as np

    total = 0
    for shape, dtype in specs:
        if np.dtype(dtype).kind in "OSUV":
            return True  # strings: nothing to draw
        total += int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize
    return total > DIFF_MAX_INPUT_BYTES


def run_litekiln(data: bytes, seed: int) -> tuple[Side, list[Any] | None, list[Any]]:
    """Load and run a mutant on litekiln's numpy reference: (what happened, the outputs,
    the input specs)."""
    from litekiln import Interpreter, LitekilnError

    stage = "load"
    try:
        interp = Interpreter(model_content=data, device="reference")
        stage = "allocate"
        interp.allocate_tensors()
        specs = _input_specs(interp.get_input_details())
        if _too_large(specs):
            return Side("accepted"), None, specs
        stage = "invoke"
        outputs = interp.run(seeded_inputs(specs, seed))
    except LitekilnError as exc:
        return Side("refused", stage, type(exc).__name__, str(exc)), None, []
    except Exception as exc:  # noqa: BLE001  (anything else is the finding)
        return Side("escape", stage, type(exc).__name__, traceback.format_exc()), None, []
    return Side("ran"), outputs, specs


def run_litert(data: bytes, seed: int) -> tuple[Side, list[Any] | None, list[Any]]:
    """The same for LiteRT's builtin kernels (see the section's comment for why those)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    stage = "load"
    try:
        li = Interpreter(
            model_content=data,
            experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
        )
        stage = "allocate"
        li.allocate_tensors()
        details = li.get_input_details()
        specs = _input_specs(details)
        if _too_large(specs):
            return Side("accepted"), None, specs
        stage = "invoke"
        for d, x in zip(details, seeded_inputs(specs, seed), strict=True):
            li.set_tensor(d["index"], x)
        li.invoke()
        outputs = [li.get_tensor(d["index"]) for d in li.get_output_details()]
    except Exception as exc:  # noqa: BLE001  (LiteRT says "no" with ValueError/RuntimeError)
        return Side("refused", stage, type(exc).__name__, str(exc)), None, []
    return Side("ran"), outputs, specs


def same_outputs(ours: list[Any], ref: list[Any], tolerance: float) -> str:
    """ "" if litekiln's outputs equal LiteRT's within check.py's bounds, else what differs.

    Float outputs: NaN and infinities in the same places, the rest within ``tolerance`` of
    check.relative_error; integer outputs: check.integer_step_stats' bounds (mean <= 1 step,
    >= 95% within 2); booleans exactly.
    """
    import numpy as np

    from litekiln.check import integer_step_stats, relative_error

    if len(ours) != len(ref):
        return f"{len(ours)} outputs, LiteRT has {len(ref)}"
    for k, (o, r) in enumerate(zip(ours, ref, strict=True)):
        o, r = np.asarray(o), np.asarray(r)
        if o.shape != r.shape:
            return f"output {k}: shape {o.shape}, LiteRT {r.shape}"
        if r.dtype.kind != o.dtype.kind:
            return f"output {k}: dtype {o.dtype}, LiteRT {r.dtype}"
        if r.dtype.kind in "fc":
            if r.dtype.kind == "c":  # compare real and imaginary parts as floats
                o, r = (np.ascontiguousarray(a).view(a.real.dtype) for a in (o, r))
            special = ~np.isfinite(r)
            if not np.array_equal(special, ~np.isfinite(o)) or not np.array_equal(
                o[special], r[special], equal_nan=True
            ):
                return f"output {k}: NaN/inf in other places than LiteRT's"
            err = relative_error([o[~special]], [r[~special]])
            if not err <= tolerance:
                return f"output {k}: relative error {err:.2e} > {tolerance:.0e}"
        elif r.dtype.kind in "iu":
            mean, within2 = integer_step_stats([o], [r])
            if mean > 1.0 or within2 < 0.95:
                return f"output {k}: {mean:.2f} steps on average, {within2:.0%} within 2"
        elif not np.array_equal(o, r):
            return f"output {k}: values differ"
    return ""


#: Why LiteRT refuses a model that litekiln runs, when that is how it should be: (category,
#: a regex on LiteRT's message, the explanation written into the report). A refused-but-run
#: case no rule explains is "unexplained", a finding to look at.
EXPLANATIONS: list[tuple[str, str, str]] = [
    (
        "litert-lacks-custom-op",
        r"Encountered unresolved custom op: (Convolution2DTransposeBias|MaxPoolingWithArgmax2D"
        r"|MaxUnpooling2D|TransformLandmarks|TransformTensorBilinear|Landmarks2TransformMatrix)",
        "MediaPipe's custom op: litekiln implements it, LiteRT's stock build does not",
    ),
]


#: Why litekiln refuses models LiteRT runs (run-but-refused), by the rule it names: where
#: LiteRT's answer is garbage (uninitialised memory, bytes read as another type, meaningless
#: quantization) or undefined, litekiln refuses on purpose. A rule not listed here is a
#: finding: litekiln may be too strict there.
STRICTER: dict[str, str] = {
    "input-not-computed": "LiteRT runs ops in file order and reads the tensor uninitialised",
    "output-not-computed": "LiteRT returns an uninitialised graph output",
    "output-written-twice": "LiteRT overwrites a graph input, constant or earlier output",
    "input-is-constant": "LiteRT lets the caller overwrite a constant through set_tensor",
    "quantization-zero-point": "zero point outside the type's range (or not the symmetric 0 "
    "the kernel assumes): LiteRT computes with it",
    "quantization-scale": "zero, negative or non-finite scale: LiteRT's multipliers are "
    "meaningless or undefined",
    "quantization-missing": "an integer tensor without quantization in a quantized kernel: "
    "LiteRT scales by 0",
    "quantization-per-tensor": "several scales where the kernel reads one",
    "quantization-mismatch": "parameters the kernel assumes equal differ: LiteRT copies the "
    "stored integers",
    "dtype": "a type the kernel does not take: LiteRT reads the bytes as another type",
    "dtype-mismatch": "operands of different types: LiteRT reads the bytes as the other type",
    "window": "a window LiteRT cannot place: it computes an empty output",
    "perm": "not a permutation: LiteRT transposes along repeated strides",
    "tensor-dtype": "a type litekiln does not run (complex, string, INT4 activations)",
    "tensor-size": "litekiln's bound on a tensor's size (LiteRT allocates it, or fails later)",
    "model-size": "litekiln's bound on the model's activations",
    "input-shape": "an input that is not a whole number of rows: LiteRT drops the rest",
    "depth-multiplier": "a hybrid depthwise op whose depth_multiplier disagrees with the shapes",
    "option-value": "an option value whose result LiteRT leaves undefined",
    "output-shape-constant": "a TRANSPOSE_CONV output shape known only when it runs",
    "weights-format": "the shuffled FULLY_CONNECTED weights format litekiln does not run",
    "sparsity": "sparsity metadata that disagrees with the stored values: LiteRT reads past them",
    "quantization-scale-count": "several scales on a scalar (LiteRT accepts them; no kernel "
    "reads them)",
}


def explain(litert: Side, litekiln: Side) -> tuple[str, str]:
    """(category, explanation) of a refused-but-run case; ("unexplained", "") if none fits."""
    for category, pattern, text in EXPLANATIONS:
        if re.search(pattern, litert.message):
            return category, text
    return "unexplained", ""


def judge(
    ours: Side,
    theirs: Side,
    our_out: list[Any] | None,
    their_out: list[Any] | None,
    our_specs: list[Any],
    their_specs: list[Any],
    tolerance: float,
) -> tuple[str, str]:
    """(verdict, detail) of one mutant. Verdicts: litekiln-escape, both-refused,
    refused-but-run (LiteRT refused, litekiln ran), run-but-refused, same, different,
    not-compared (a side only allocated: inputs too large to draw)."""
    if ours.outcome == "escape":
        return "litekiln-escape", ours.message
    if theirs.outcome == "refused":
        if ours.outcome == "refused":
            return "both-refused", ""
        return "refused-but-run", theirs.message
    if ours.outcome == "refused":
        return "run-but-refused", ours.message
    if our_out is None or their_out is None:
        return "not-compared", "inputs too large to draw"
    if [(s, d.str) for s, d in our_specs] != [(s, d.str) for s, d in their_specs]:
        return "different", f"input specs {our_specs}, LiteRT {their_specs}"
    detail = same_outputs(our_out, their_out, tolerance)
    return ("different", detail) if detail else ("same", "")


def _diff_worker(
    conn: Any, seeds: dict[str, tuple[bytes, int]], seed: int, numbers: list[int]
) -> None:
    limit_memory()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)  # LiteRT's error reporter prints every refusal; the message is kept
    import ai_edge_litert.interpreter  # noqa: F401  (imported once, not inside a case)

    import litekiln.interpreter  # noqa: F401
    from litekiln.check import tolerance_for

    mutator = ModelMutator(seeds, seed)
    for number in numbers:
        conn.send(("start", number))
        case = mutator.case(number)
        conn.send(("note", number, "litekiln"))  # a crash or hang from here is litekiln's
        t0 = time.perf_counter()
        ours, our_out, our_specs = run_litekiln(case.data, number)
        conn.send(("note", number, asdict(ours)))  # a crash or hang from here is LiteRT's
        theirs, their_out, their_specs = run_litert(case.data, number)
        verdict, detail = judge(
            ours,
            theirs,
            our_out,
            their_out,
            our_specs,
            their_specs,
            tolerance_for(case.seed_name),
        )
        result = {
            "verdict": verdict,
            "detail": detail,
            "litekiln": asdict(ours),
            "litert": asdict(theirs),
            "seconds": time.perf_counter() - t0,
        }
        conn.send(("done", number, result))
    conn.send(("exit",))


@dataclass
class DiffReport:
    """The counts of a differential run and the cases worth a look."""

    cases: int = 0
    verdicts: Counter = field(default_factory=Counter)
    explanations: Counter = field(default_factory=Counter)  # of refused-but-run cases
    litert_stages: Counter = field(default_factory=Counter)  # where LiteRT refused
    strict_rules: Counter = field(default_factory=Counter)  # litekiln's run-but-refused kinds
    refused_but_run: list[dict[str, Any]] = field(default_factory=list)
    run_but_refused: list[dict[str, Any]] = field(default_factory=list)
    different: list[dict[str, Any]] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)  # escapes, crashes, hangs
    seconds: float = 0.0

    @property
    def litert_refused(self) -> int:
        return self.verdicts["both-refused"] + self.verdicts["refused-but-run"]

    def to_json(self) -> dict[str, Any]:
        refused = self.litert_refused
        return {
            "cases": self.cases,
            "seconds": round(self.seconds, 1),
            "cases_per_second": round(self.cases / self.seconds, 2) if self.seconds else 0,
            "verdicts": dict(self.verdicts.most_common()),
            "litert_refused": refused,
            "refused_but_run_share_of_litert_refused": (
                round(self.verdicts["refused-but-run"] / refused, 4) if refused else 0.0
            ),
            "refused_but_run_explanations": dict(self.explanations.most_common()),
            "litert_refusal_stages": dict(self.litert_stages.most_common()),
            "run_but_refused_kinds": {
                rule: {"count": n, "why": STRICTER.get(rule, "unexplained")}
                for rule, n in self.strict_rules.most_common()
            },
            "refused_but_run": self.refused_but_run,
            "run_but_refused_examples": self.run_but_refused,
            "different": self.different,
            "findings": self.findings,
        }


def _rule_of(message: str) -> str:
    """The rule a litekiln refusal names (``[rule: x]``), else the message's shape."""
    m = re.search(r"\[rule: ([^\]]+)\]", message)
    return m.group(1) if m else _message_kind(message)


def run_differential(
    cases: int,
    seed: int,
    workers: int,
    timeout: float,
    out: Path,
    real: bool = True,
    progress: bool = True,
    save: bool = True,
) -> DiffReport:
    """Run ``cases`` mutants on LiteRT and litekiln's reference; see the section comment."""
    seeds = diff_seeds(real)
    mutator = ModelMutator(seeds, seed)
    report = DiffReport()
    saved: Counter = Counter()
    start = last_print = time.perf_counter()

    def keep(kind: str, key: str, case: Case, detail: str, limit: int, **extra: Any) -> None:
        """Save a reproducer: at most ``limit`` per kind and key, and none over
        SAVE_MAX_BYTES unless it is litekiln's crash, hang or escape."""
        if not save or saved[(kind, key)] >= limit:
            return
        if len(case.data) > SAVE_MAX_BYTES and not kind.startswith("diff-litekiln"):
            return
        saved[(kind, key)] += 1
        save_finding(out, kind, case, detail, **extra)

    events = drive(_diff_worker, (seeds, seed), list(range(cases)), workers, timeout)
    for event in events:
        report.cases += 1
        try:
            case = mutator.case(event.number)
        except Exception as exc:  # noqa: BLE001  (a fuzzer bug: keep the run going, say so)
            case = Case(event.number, "?", [f"mutation failed: {exc!r}"])
        where = {"case": case.number, "seed_model": case.seed_name, "mutations": case.mutations}
        if event.kind != "done":  # the worker's note says how far the case had got
            note = event.payload
            side = "fuzzer" if note is None else "litekiln" if note == "litekiln" else "litert"
            kind = f"{side}-{event.kind.split('(')[0]}"
            report.verdicts[kind] += 1
            report.findings.append(
                {**where, "kind": kind, "detail": event.detail, "litekiln": event.payload}
            )
            keep(
                f"diff-{kind}",
                "",
                case,
                event.detail,
                10 if side == "litert" else 1000,
                litekiln=event.payload,
            )
            continue
        r = event.payload
        verdict = r["verdict"]
        report.verdicts[verdict] += 1
        litert, litekiln = Side(**r["litert"]), Side(**r["litekiln"])
        if litert.outcome == "refused":
            report.litert_stages[litert.stage] += 1
        if verdict == "refused-but-run":
            category, text = explain(litert, litekiln)
            report.explanations[category] += 1
            report.refused_but_run.append(
                {
                    **where,
                    "category": category,
                    "explanation": text,
                    "litert": litert.message.strip().splitlines()[0][:300],
                }
            )
            keep(
                "diff-refused-but-run",
                category,
                case,
                litert.message,
                20,
                category=category,
                explanation=text,
            )
        elif verdict == "run-but-refused":
            rule = _rule_of(litekiln.message)
            report.strict_rules[rule] += 1
            if sum(1 for x in report.run_but_refused if x["rule"] == rule) < 3:
                report.run_but_refused.append({**where, "rule": rule, "litekiln": litekiln.message})
            keep("diff-run-but-refused", rule, case, litekiln.message, 2, rule=rule)
        elif verdict == "different":
            report.different.append({**where, "detail": r["detail"]})
            keep("diff-different", r["detail"][:40], case, r["detail"], 20)
        elif verdict == "litekiln-escape":
            report.findings.append({**where, "kind": verdict, "detail": r["detail"]})
            keep("diff-litekiln-escape", "", case, r["detail"], 1000)
        now = time.perf_counter()
        if progress and now - last_print > 30:
            last_print = now
            rate = report.cases / (now - start)
            print(
                f"  {report.cases}/{cases} cases ({rate:.1f}/s), {dict(report.verdicts)}",
                file=sys.stderr,
                flush=True,
            )
    report.seconds = time.perf_counter() - start
    return report


def print_differential(report: DiffReport) -> None:
    j = report.to_json()
    print(
        f"mutants run: {report.cases} in {report.seconds:.1f} s ({j['cases_per_second']} mutants/s)"
    )
    print("verdicts: " + ", ".join(f"{k} {v}" for k, v in report.verdicts.most_common()))
    print(
        f"LiteRT refused {report.litert_refused} (stages {dict(report.litert_stages)}); "
        f"litekiln ran {report.verdicts['refused-but-run']} of them "
        f"({100 * j['refused_but_run_share_of_litert_refused']:.2f}%)"
    )
    for category, n in report.explanations.most_common():
        text = next((t for c, _, t in EXPLANATIONS if c == category), "")
        print(f"  {n:5d}  {category}: {text}")
    for x in report.refused_but_run:
        if x["category"] == "unexplained":
            print(
                f"  UNEXPLAINED case {x['case']} ({x['seed_model']}, {x['mutations']}): "
                f"{x['litert']}"
            )
    print("litekiln refused what LiteRT ran (run-but-refused), by rule:")
    for rule, n in report.strict_rules.most_common():
        print(f"  {n:5d}  {rule}: {STRICTER.get(rule, 'UNEXPLAINED')}")
    for x in report.different[:30]:
        print(f"DIFFERENT case {x['case']} ({x['seed_model']}, {x['mutations']}): {x['detail']}")
    for f in report.findings:
        print(f"FINDING {f['kind']}: case {f['case']} ({f['seed_model']}, {f['mutations']})")
        print("    " + str(f["detail"]).strip().splitlines()[-1])


def only_differential_case(number: int, seed: int, real: bool) -> int:
    """Rerun one differential case in this process and print both sides."""
    from litekiln.check import tolerance_for

    case = ModelMutator(diff_seeds(real), seed).case(number)
    ours, our_out, our_specs = run_litekiln(case.data, number)
    theirs, their_out, their_specs = run_litert(case.data, number)
    verdict, detail = judge(
        ours, theirs, our_out, their_out, our_specs, their_specs, tolerance_for(case.seed_name)
    )
    print(f"case {number}: seed {case.seed_name}, {case.mutations}")
    print(f"litekiln: {ours.outcome} {ours.stage} {ours.error}: {ours.message}")
    print(f"LiteRT:   {theirs.outcome} {theirs.stage} {theirs.error}: {theirs.message}")
    print(f"verdict: {verdict} {detail}")
    return 0 if verdict not in ("litekiln-escape",) else 1


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
    parser.add_argument(
        "--differential",
        action="store_true",
        help="semantic mutants of models LiteRT runs, on LiteRT and on litekiln's reference",
    )
    args = parser.parse_args(argv)

    if args.differential:
        if args.only_case is not None:
            return only_differential_case(args.only_case, args.seed, not args.no_real)
        report = run_differential(
            args.cases, args.seed, args.workers, args.timeout, args.out, real=not args.no_real
        )
        if args.json:
            print(json.dumps(report.to_json(), indent=2))
        else:
            print_differential(report)
        bad = report.findings or report.verdicts["litekiln-escape"]
        return 1 if bad else 0

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
