"""Which schedule a tuned call starts with: a default that fills the device.

A call with tuning variants runs its default schedule until the runtime has timed the
options on the device (at first start, in the background) and whenever its variants were
trimmed from the entry (`litekiln.compiler.budget`). The schedule rules pick defaults for
their shape of work, not for the device's size, and many come out with a few work-groups:
smoke's strided 3x3 convolution runs 8 (14 us on the H200, where an option of 16 wider
groups takes 8), tv_squeezenet1_1's late fire modules 12 (57-72 us; an option of 1014
groups, 7-9 us).

Measured on the H200 (results/h200/session38-graph-trace: every tuned call of eight zoo and
corpus models, each option timed by the runtime's tuning; the options' work-groups read from
the same compiler's programs): of the 63 calls whose default runs fewer than 64 work-groups,
the default took 2.7x the best option on the geometric mean (up to 16.5x); the option whose
work-group count is nearest 512 took 0.43x the default (0.41-0.45x in each half of that
range), and was slower than the default on none (at most 1.00x). Among calls of 64 groups or
more the same choice would be slower than the default on 17 of 129 (up to 1.61x; 0.81x on
the geometric mean): those keep theirs. (The tuning times each option between two events,
the launch's own overhead of a few microseconds included: inside a CUDA graph the kernels'
ratios are larger still.) So `fill_starved_defaults` swaps, for each call whose default is
one launch of fewer than `STARVED_GROUPS` work-groups, the default with its one-launch
option nearest `TARGET_GROUPS` work-groups (on the log scale; the most work-items on a tie)
among those that run more groups than the default. The old default becomes that option: the
tuning still times it, so a device where it wins keeps it.

No TVM here: it reorders plain `Launch`es and `Variant`s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from litekiln.artifact.program import Launch, Variant

#: A default of one launch with fewer work-groups than this starts as one of its options.
STARVED_GROUPS = 64

#: The work-group count the swapped-in option is chosen nearest to: about four per compute
#: unit of a large GPU (an H100 or H200 has 132).
TARGET_GROUPS = 512


def work_groups(launch: Launch) -> int:
    """How many work-groups ``launch`` runs."""
    return math.prod(
        g // max(loc, 1) for g, loc in zip(launch.global_size, launch.local_size, strict=True)
    )


def fill_starved_defaults(
    launches: Sequence[Launch], variants: Sequence[Variant]
) -> tuple[list[Launch], list[Variant], list[str]]:
    """The launches and variants with each starved call's default swapped for its option
    nearest `TARGET_GROUPS` work-groups, and the kernels that became defaults (in launch
    order, without repeats).

    Launch lists keep their lengths: a call's default and its chosen option are one launch
    each, so every other call's ``start`` and ``stop`` stay as they were.
    """
    out = list(launches)
    new_variants: list[Variant] = []
    promoted: list[str] = []
    for v in variants:
        own = launches[v.start : v.stop]
        pick = _pick(own, v.options)
        if pick is None:
            new_variants.append(v)
            continue
        (chosen,) = v.options[pick]
        out[v.start] = chosen
        options = (*v.options[:pick], tuple(own), *v.options[pick + 1 :])
        new_variants.append(Variant(v.start, v.stop, options, v.func))
        if chosen.kernel not in promoted:
            promoted.append(chosen.kernel)
    return out, new_variants, promoted


def _pick(own: Sequence[Launch], options: Sequence[Sequence[Launch]]) -> int | None:
    """The index of the option to start with, or None where the default stays."""
    if len(own) != 1 or work_groups(own[0]) >= STARVED_GROUPS:
        return None
    groups = work_groups(own[0])
    candidates = [i for i, o in enumerate(options) if len(o) == 1 and work_groups(o[0]) > groups]
    if not candidates:
        return None
    return min(
        candidates,
        key=lambda i: (
            abs(math.log(work_groups(options[i][0]) / TARGET_GROUPS)),
            -math.prod(options[i][0].global_size),
            i,
        ),
    )
