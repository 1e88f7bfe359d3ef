"""What a compiled model's tuning variants may cost in its cache entry (issue 16).

A call with tuning variants carries each variant's kernels as OpenCL C beside its default
kernels; the runtime times them on the device once and keeps the fastest. On a model of a few
hundred KB those kernels are most of the entry: selfie_segmentation's (249.5 KB, 36 calls with
variants, 129 variant kernels) took 21.6 KB of its 39.0 KB fp32 entry, 15.6% of the model file
where issue 16 allows 15%. On larger models they are a small share of the file.

`trim_variants` keeps the variants' share of the entry (their kernels' bytes in the
compressed source, measured exactly as the cache will store it) within what the entry without
them leaves under `ENTRY_FILL` of the model file (`variant_budget`), so that variants never
take an entry over issue 16's bound. That entry is measured where it can matter: on every
model under `_MEASURE_BELOW` bytes, and on larger ones where the variants would cost more than
`VARIANT_SHARE` of the file (an entry without variants is a few percent of a large model's
file: within the share, the variants cannot take it over the bound). Where the variants cost
more, it drops whole calls' variants, the calls that do the least work first (FLOPs, or bytes
moved weighed as FLOPs), as few as the budget allows: those calls run in microseconds,
launch-bound, where a tuned schedule gains least. Calls whose default kernel runs only a few
work-groups go last: however little their work, their default leaves the device idle and a
variant can fill it (the compiler starts most such calls with an option that fills it already:
`litekiln.compiler.defaults`). What it dropped is counted in the compiled model's stats
(``variants_trimmed``).

Until the thirty-ninth session a small model kept 10 KB of variants whatever its size (a
floor): smoke's entry was 36.6% of its file, and without the floor its strided convolution
lost a quarter of the model's speed on the H200 (its default ran 8 work-groups). That default
now starts as its option of 16 wider groups (`litekiln.compiler.defaults`), and the floor is
gone.

No TVM here: it reads and cuts plain `GpuProgram`s.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from litekiln.artifact.compiled import CompiledModel, PartitionArtifact
from litekiln.artifact.program import FUNCTION_MARKER, GpuProgram, Variant, buffer_bytes
from litekiln.artifact.texts import compress, packed_texts
from litekiln.compiler.defaults import work_groups

#: The variants' compressed kernels may take this share of the model file's size without the
#: entry being measured: a large model's entry without them is a few percent of its file.
VARIANT_SHARE = 0.07

#: The share of the model file the variants may fill the entry up to (issue 16 bounds a
#: compiled fp32 entry at 15% of its model, PTX aside): a point under it, for the variants'
#: own launch options in the plan and `_ENTRY_OVERHEAD`'s estimate.
ENTRY_FILL = 0.14

#: Models smaller than this always have their entry without variants measured: there the
#: entry's own plan and kernels can be most of the bound (smoke's, 7.8% of its 31 KB file).
_MEASURE_BELOW = 1 << 20

#: What an entry stores besides its plan, its OpenCL C and its packed constants: the signed
#: entry manifest (deflated against its preset dictionary: 349 bytes for smoke's entry,
#: `litekiln.cache.manifest`), rounded up.
_ENTRY_OVERHEAD = 512

#: OpenCL C from TVM compresses at least this much (selfie_segmentation's 1.07 M characters:
#: 34x; dlight's and litekiln's schedules of one op print alike): a program whose variant
#: kernels are within the budget by this ratio needs no measuring.
_SURE_RATIO = 8

#: A call whose default kernel runs fewer work-groups than this leaves most of a large GPU
#: idle (mp_hand_recrop's late convolutions: dlight's 32x32 tiles give 1-8 groups, 15-35 us
#: each on the H200): its variants (smaller tiles, one group per output) are what can fill
#: it, so such calls keep their variants longest, whatever their work.
_FEW_GROUPS = 32

#: The FLOPs that take as long as moving one byte: an H100's fp32 peak (67 TFLOP/s) over its
#: bandwidth (3.35 TB/s), rounded. Weighs a call's FLOPs against its bytes.
_FLOPS_PER_BYTE = 20


@dataclass
class _Group:
    """The variants of one PrimFunc in one partition (a function called twice shares its
    variant kernels between its calls: they go together)."""

    partition: int
    func: str
    work: int
    kernels: set[str]
    #: Whether a default launch of the call runs fewer than `_FEW_GROUPS` work-groups.
    starved: bool = False


def variant_budget(model_bytes: int, besides: int | None = None) -> int:
    """The bytes the variants may take in the compressed source of a model of
    ``model_bytes`` whose entry without them is ``besides`` bytes (`entry_bytes`; None: not
    measured, the share)."""
    if besides is None:
        return int(VARIANT_SHARE * model_bytes)
    return max(0, int(ENTRY_FILL * model_bytes) - besides)


def entry_bytes(compiled: CompiledModel, kernels: int | None = None) -> int:
    """What ``compiled``'s cache entry will take without PTX, as `litekiln.cache.models`
    stores it: the plan and the OpenCL C compressed with their dictionaries (the OpenCL C
    ``kernels`` bytes where the caller measured it), the constants no recipe rebuilds, and the
    entry manifest (`_ENTRY_OVERHEAD`)."""
    manifest, sources, _ = compiled.split_texts()
    stored = compiled.stored_constants()
    index = {n: [0, a.dtype.str, list(a.shape)] for n, a in stored.items()}
    doc = {"compiled": manifest, "packed": index, "shared": {}}
    plan = compress(json.dumps(doc, separators=(",", ":")).encode(), "plan")
    if kernels is None:
        kernels = len(packed_texts(sources))
    return len(plan) + kernels + sum(a.nbytes for a in stored.values()) + _ENTRY_OVERHEAD


def trim_variants(
    partitions: Sequence[PartitionArtifact],
    model_bytes: int,
    unvaried: Callable[[list[PartitionArtifact]], CompiledModel] | None = None,
) -> tuple[list[PartitionArtifact], int]:
    """The partitions with their variants' bytes within the budget (`variant_budget`), and
    how many calls lost their variants (0: the partitions as they were).

    Args:
        partitions: the compiled partitions, with their variants.
        model_bytes: the model file's size.
        unvaried: makes the compiled model of the given partitions (the ones without
            variants): on a model under `_MEASURE_BELOW` bytes, or where the share would
            drop variants, its entry is measured, and the variants may fill what it leaves
            under `ENTRY_FILL`. None: the share alone.
    """
    budget = variant_budget(model_bytes)
    programs = [p.program for p in partitions]
    variant_chars = sum(_variant_chars(p) for p in programs)
    measure = unvaried is not None and model_bytes < _MEASURE_BELOW
    if variant_chars == 0 or (not measure and variant_chars <= budget * _SURE_RATIO):
        return list(partitions), 0
    cuts = [p.with_variants([]) for p in programs]
    bare = [b for b in cuts if b is not None]
    if len(bare) < len(cuts):
        return list(partitions), 0  # a source that cannot be cut: leave it whole
    base = len(packed_texts([b.source for b in bare]))
    full = len(packed_texts([p.source for p in programs])) - base
    if not measure and full <= budget:
        return list(partitions), 0
    if unvaried is not None:
        without = [replace(a, program=b) for a, b in zip(partitions, bare, strict=True)]
        budget = variant_budget(model_bytes, entry_bytes(unvaried(without), base))
        if full <= budget:
            return list(partitions), 0
    groups = sorted(_groups(programs), key=lambda g: (g.starved, g.work, g.partition, g.func))

    def dropping(n: int) -> tuple[list[GpuProgram], int]:
        """The programs without the ``n`` least-work groups' variants, and their cost."""
        gone = {(g.partition, g.func) for g in groups[:n]}
        cut = [_without(p, k, gone) for k, p in enumerate(programs)]
        return cut, len(packed_texts([p.source for p in cut])) - base

    # The fewest groups to drop, by bisection (dropping more never costs more bytes):
    # dropping ``lo`` groups is over the budget, dropping ``hi`` is not.
    lo, hi, best = 0, len(groups), bare
    while hi - lo > 1:
        mid = (lo + hi) // 2
        cut, cost = dropping(mid)
        if cost <= budget:
            hi, best = mid, cut
        else:
            lo = mid
    gone = {(g.partition, g.func) for g in groups[:hi]}
    trimmed = sum(1 for k, p in enumerate(programs) for v in p.variants if (k, v.func) in gone)
    out = [replace(a, program=p) for a, p in zip(partitions, best, strict=True)]
    return out, trimmed


def _groups(programs: Sequence[GpuProgram]) -> list[_Group]:
    """Each partition's variant groups, with the work of their calls' default launches."""
    out: dict[tuple[int, str], _Group] = {}
    for k, p in enumerate(programs):
        for v in p.variants:
            own = p.launches[v.start : v.stop]
            flops = sum(la.flops for la in own)
            nbytes = buffer_bytes(own, lambda t, p=p: p.tensor(t).nbytes)  # type: ignore[misc]
            work = max(flops, _FLOPS_PER_BYTE * nbytes)
            kernels = {la.kernel for o in v.options for la in o}
            starved = any(work_groups(la) < _FEW_GROUPS for la in own)
            g = out.get((k, v.func))
            if g is None:
                out[(k, v.func)] = _Group(k, v.func, work, kernels, starved)
            else:
                g.work += work
                g.kernels |= kernels
                g.starved |= starved
    return list(out.values())


def _without(program: GpuProgram, k: int, dropped: set[tuple[int, str]]) -> GpuProgram:
    """``program`` (partition ``k``) without the variants of the dropped groups."""
    kept: list[Variant] = [v for v in program.variants if (k, v.func) not in dropped]
    if len(kept) == len(program.variants):
        return program
    cut = program.with_variants(kept)
    return program if cut is None else cut


def _variant_chars(program: GpuProgram) -> int:
    """Characters of the kernels only `program`'s variants launch."""
    defaults = {la.kernel for la in program.launches}
    _, *parts = ("\n" + program.source).split("\n" + FUNCTION_MARKER)
    sizes = {part.split("\n", 1)[0].strip(): len(part) for part in parts}
    return sum(n for name, n in sizes.items() if name not in defaults and name in program.kernels)
