#!/usr/bin/env python3
"""Make the text dictionaries the cache primes its parts with (`litekiln.artifact.texts`).

Compiles each training model (fp32 and fp16, the GPU schedules, no PTX) into a cache of its
own under ``--work`` (kept: a second run reuses what is there), reads back what each entry
stores -- the plan (``artifact`` part) and the OpenCL C (``source`` part) -- and picks from
them, per kind, the segments that most documents share (zstd's COVER selection: each segment
of ``--segment`` bytes scores the number of documents each of its 8-byte substrings occurs in,
substrings already taken count no more; the best segment of each stretch of the corpus goes
in, the best last, nearest to the data). Writes ``<kind>.lzma`` (the dictionary as its own raw
LZMA stream) and ``index.json`` into ``litekiln/artifact/dictionaries/``.

The training models must not be the models the cache-size bounds are measured on (the zoo):
the default list is corpus models from torchvision, timm and Keras.

Usage::

    .venv/bin/python scripts/text_dictionaries.py --work build/dict-work
    .venv/bin/python scripts/text_dictionaries.py --work build/dict-work \
        --evaluate models/zoo/*.tflite
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import lzma
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from litekiln.artifact import texts  # noqa: E402
from litekiln.cache import CacheStore  # noqa: E402

OUT_DIR = REPO / "litekiln" / "artifact" / "dictionaries"

#: Corpus models (scripts/corpus.py builds them into models/corpus/): none of them is in the
#: zoo, whose entries the cache-size bounds are measured on.
TRAINING = (
    "keras_mobilenetv2",
    "keras_efficientnetb0_int8",
    "keras_gru",
    "keras_lstm",
    "keras_mobilenetv3small",
    "keras_nasnetmobile",
    "keras_mobilenetv2_int8",
    "timm_convnext_atto",
    "timm_deit_tiny_patch16_224",
    "timm_efficientvit_b0",
    "timm_ghostnet_100",
    "timm_lcnet_050",
    "timm_levit_128s",
    "timm_mixnet_s",
    "timm_mobilevit_xxs",
    "timm_pvt_v2_b0",
    "timm_resnet10t",
    "timm_tiny_vit_5m_224",
    "tv_mobilenet_v3_small",
    "tv_resnet18",
    "tv_squeezenet1_1",
    "tv_shufflenet_v2_x1_0",
    "tv_googlenet",
    "tv_regnet_y_400mf",
    "tv_efficientnet_b0",
)

#: What each dictionary is made from: the entry's part holding it.
KINDS = {"plan": "artifact.json.lzma", "source": "source.json.lzma"}
#: Dictionary sizes: the plan is read at every start (its dictionary is decoded with it:
#: 0.3 ms for 32 KB); the source only where a program is built from source.
SIZES = {"plan": 32 << 10, "source": 64 << 10}
#: What the selection reads of each entry's text at most (`sample`): the 50 training entries'
#: OpenCL C is 169 MB with its tuning variants.
SAMPLE = 256 << 10


def compile_into(model: Path, work: Path) -> dict[str, dict[str, bytes]]:
    """What ``model``'s fp32 and fp16 entries store, by precision and kind: compiled into
    ``work/<name>`` where not there yet, and read back once; the texts are kept beside
    (``<name>.<precision>.<kind>``), so that a later run reads them whatever dictionaries its
    entries were written with."""
    cache = work / model.stem
    out: dict[str, dict[str, bytes]] = {}
    for precision in ("fp32", "fp16"):
        kept = {k: work / f"{model.stem}.{precision}.{k}" for k in KINDS}
        if not all(f.exists() for f in kept.values()):
            found = _entry_texts(model, cache, precision)
            if found is None:
                print(f"{model.stem} {precision}: compile failed, left out", file=sys.stderr)
                continue
            for k, f in kept.items():
                f.write_bytes(found[k])
        out[precision] = {k: f.read_bytes() for k, f in kept.items()}
    return out


def _entry_texts(model: Path, cache: Path, precision: str) -> dict[str, bytes] | None:
    """The texts of ``model``'s entry in ``cache`` (compiled first where it is not there)."""
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    found = dict(documents(cache)).get(precision)
    if found is not None:
        return found
    cmd = [
        sys.executable, "-m", "litekiln.cli", "compile", str(model), "--cache-dir",
        str(cache), "--precision", precision, "--schedules", "fast",
    ]  # fmt: skip
    env = {**os.environ, "LITEKILN_PTX": "off"}
    subprocess.run(cmd, capture_output=True, check=False, env=env, cwd=REPO)
    print(f"compiled {model.stem} {precision}", file=sys.stderr)
    return dict(documents(cache)).get(precision)


def documents(cache: Path) -> Iterable[tuple[str, dict[str, bytes]]]:
    """Each compiled entry of ``cache``: its precision and its texts by kind."""
    with CacheStore.open(cache) as store:
        for row in store.ls():
            if row.kind != "model":
                continue
            entry = store.get(row.key, kind="model")
            if entry is None:
                continue
            yield (
                str(row.options.get("precision")),
                {k: texts.decompress(entry.part(p)) for k, p in KINDS.items()},
            )


def sample(doc: bytes, limit: int) -> bytes:
    """At most about ``limit`` bytes of ``doc``: where it is longer, every n-th of its
    kernels (a program's text with its tuning variants runs to megabytes; one in n of them
    has the words all of them share)."""
    if len(doc) <= limit:
        return doc
    marker = b"// Function: "
    head, *kernels = doc.split(marker)
    step = -(-len(doc) // limit)
    return head + b"".join(marker + k for k in kernels[::step])


def _dmers(doc: bytes, d: int) -> np.ndarray:
    """Each position's ``d``-byte substring as one integer (``d`` <= 8)."""
    b = np.frombuffer(doc, dtype=np.uint8).astype(np.uint64)
    if len(b) < d:
        return np.empty(0, np.uint64)
    out = np.zeros(len(b) - d + 1, np.uint64)
    for k in range(d):
        out |= b[k : len(b) - d + 1 + k] << np.uint64(8 * k)
    return out


def cover(docs: list[bytes], size: int, segment: int = 192, d: int = 8) -> bytes:
    """A dictionary of at most ``size`` bytes from ``docs`` (COVER selection, see above)."""
    values = [_dmers(doc, d) for doc in docs]
    vocab, inverse = np.unique(np.concatenate(values), return_inverse=True)
    freq = np.zeros(len(vocab))
    ids, at = [], 0
    for doc, v in zip(docs, values, strict=True):
        own = inverse[at : at + len(v)]
        at += len(v)
        freq[np.unique(own)] += 1
        ids.append(np.concatenate([own, np.full(len(doc) - len(v), -1, np.int64)]))
    freq[freq < 2] = 0  # a substring of one document only primes nothing else
    text, every = b"".join(docs), np.concatenate(ids)
    width = segment - d + 1
    stretches = max(size // segment, 1)
    span = len(text) // stretches
    picked = []
    for s in range(stretches):
        lo = s * span
        window = every[lo : lo + span]
        score = np.where(window >= 0, freq[np.maximum(window, 0)], 0.0)
        if len(score) < width:
            continue
        sums = np.concatenate([[0.0], np.cumsum(score)])
        run = sums[width:] - sums[:-width]
        j = int(np.argmax(run))
        if run[j] <= 0:
            continue
        picked.append((float(run[j]), s, text[lo + j : lo + j + segment]))
        taken = window[j : j + width]
        freq[np.unique(taken[taken >= 0])] = 0
    picked.sort()
    return b"".join(seg for _, _, seg in picked)[-size:]


def write(kind: str, dictionary: bytes, models: list[str]) -> dict[str, object]:
    """Write ``<kind>.lzma``; its row of the index."""
    stream = lzma.compress(dictionary, format=lzma.FORMAT_RAW, filters=texts._PRIMED)
    (OUT_DIR / f"{kind}.lzma").write_bytes(stream)
    return {
        "file": f"{kind}.lzma",
        "size": len(dictionary),
        "sha256": hashlib.sha256(stream).hexdigest(),
        "made": datetime.date.today().isoformat(),
        "trained_on": models,
    }


def evaluate(models: list[Path], work: Path) -> None:
    """Per model and precision: each part's bytes plain and primed."""
    print(f"{'model':34s} prec  part    {'raw':>9s} {'plain':>7s} {'primed':>7s}")
    totals = {"plain": 0, "primed": 0}
    for m in models:
        for precision, docs in compile_into(m, work).items():
            for kind, raw in sorted(docs.items()):
                plain, primed = len(texts._plain(raw)), len(texts.compress(raw, kind))
                totals["plain"] += plain
                totals["primed"] += primed
                print(f"{m.stem:34s} {precision}  {kind:6s} {len(raw):9d} {plain:7d} {primed:7d}")
    print(f"all parts: {totals['plain']} -> {totals['primed']} bytes")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="where the compiled caches go")
    ap.add_argument("--models", nargs="*", default=None, help="training models (.tflite)")
    ap.add_argument("--segment", type=int, default=192, help="segment length (bytes)")
    ap.add_argument(
        "--evaluate", nargs="*", type=Path, default=None,
        help="only measure the shipped dictionaries on these models' entries",
    )  # fmt: skip
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.evaluate is not None:
        evaluate(args.evaluate, args.work / "evaluate")
        return 0
    models = [Path(m) for m in args.models] if args.models else [
        REPO / "models" / "corpus" / f"{n}.tflite" for n in TRAINING
    ]  # fmt: skip
    docs: dict[str, list[bytes]] = {k: [] for k in KINDS}
    for m in models:
        for found in compile_into(m, args.work / "train").values():
            for kind, raw in found.items():
                docs[kind].append(sample(raw, SAMPLE))
    OUT_DIR.mkdir(exist_ok=True)
    index = {}
    for kind, kind_docs in docs.items():
        d = cover(kind_docs, SIZES[kind], args.segment)
        index[kind] = write(kind, d, [m.stem for m in models])
        print(f"{kind}: {len(d)} bytes from {len(kind_docs)} entries", file=sys.stderr)
    (OUT_DIR / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
