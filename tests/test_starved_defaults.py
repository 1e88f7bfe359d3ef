"""A tuned call whose default runs few work-groups starts as the option that fills the device
(`litekiln.compiler.defaults`).

The rule is checked on plain launches with hand-made NDRanges (the work-group counts written
out), and on the zoo's smoke model compiled with the GPU schedules: its two calls whose
defaults ran 8 and 32 work-groups start as options of 16 and 64.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from litekiln.artifact.program import BufferArg, Launch, Variant
from litekiln.compiler.defaults import (
    STARVED_GROUPS,
    TARGET_GROUPS,
    fill_starved_defaults,
    work_groups,
)


def _launch(kernel: str, global_size: tuple[int, ...], local_size: tuple[int, ...]) -> Launch:
    return Launch(kernel, (BufferArg(0), BufferArg(1)), global_size, local_size, func="f")


def test_work_groups_multiplies_the_groups_of_each_axis() -> None:
    assert work_groups(_launch("k", (256, 16), (16, 16))) == 16
    assert work_groups(_launch("k", (8192,), (64,))) == 128
    assert work_groups(_launch("k", (64, 8, 4), (8, 8, 4))) == 8


def test_a_starved_default_swaps_with_the_option_nearest_the_target() -> None:
    default = _launch("d", (64, 8), (8, 8))  # 8 groups
    options = (
        (_launch("o1", (1024,), (64,)),),  # 16
        (_launch("o2", (64, 16), (8, 16)),),  # 8: not more than the default
        (_launch("o3", (32768,), (64,)),),  # 512: the target
        (_launch("o4", (131072,), (64,)),),  # 2048
    )
    other = _launch("x", (8192,), (64,))
    launches, variants, promoted = fill_starved_defaults(
        [other, default, other], [Variant(1, 2, options, "f")]
    )
    assert work_groups(options[2][0]) == TARGET_GROUPS
    assert launches == [other, options[2][0], other]
    (v,) = variants
    assert (v.start, v.stop, v.func) == (1, 2, "f")
    # the old default takes the chosen option's place: still timed by the tuning
    assert v.options == (options[0], options[1], (default,), options[3])
    assert promoted == ["o3"]


def test_nearest_on_the_log_scale_and_more_work_items_on_a_tie() -> None:
    default = _launch("d", (256,), (64,))  # 4 groups
    # 256 and 1024 groups are as far from 512 on the log scale: the more work-items wins
    narrow = _launch("narrow", (256 * 64,), (64,))  # 256 groups of 64
    wide = _launch("wide", (1024 * 32,), (32,))  # 1024 groups of 32: 32768 items
    wider = _launch("wider", (256 * 256,), (256,))  # 256 groups of 256: 65536 items
    launches, _, _ = fill_starved_defaults(
        [default], [Variant(0, 1, ((narrow,), (wide,), (wider,)), "f")]
    )
    assert launches == [wider]


@pytest.mark.parametrize(
    "default, options",
    [
        # not starved: 64 groups or more keep their default
        ((STARVED_GROUPS * 64,), ((STARVED_GROUPS * 64 * 8,),)),
        # no option runs more groups than the default
        ((8 * 64,), ((4 * 64,), (8 * 64,))),
    ],
)
def test_defaults_that_stay(default: tuple[int, ...], options: tuple[tuple[int, ...], ...]) -> None:
    d = _launch("d", default, (64,))
    opts = tuple((_launch(f"o{i}", g, (64,)),) for i, g in enumerate(options))
    v = Variant(0, 1, opts, "f")
    assert fill_starved_defaults([d], [v]) == ([d], [v], [])


def test_calls_of_several_launches_keep_their_default() -> None:
    """A default of two launches, or an option of two, is not swapped: the launch list keeps
    its length, so the other calls' positions hold."""
    a, b = _launch("a", (64,), (64,)), _launch("b", (64,), (64,))
    big = _launch("big", (32768,), (64,))
    two_defaults = Variant(0, 2, ((big,),), "f")
    assert fill_starved_defaults([a, b], [two_defaults])[0] == [a, b]
    two_options = Variant(0, 1, ((big, big),), "f")
    assert fill_starved_defaults([a], [two_options])[0] == [a]


def test_smoke_starts_with_the_filling_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The swap on a compiled model: smoke's two starved calls start as their filling
    options, and their schedules' own defaults are options now (each option, those among
    them, runs right: tests/test_tuning.py, every option of every variant against the
    numpy reference)."""
    pytest.importorskip("tvm")
    pytest.importorskip("pyopencl")
    from conftest import zoo_model

    import litekiln
    from litekiln.compiler import budget

    monkeypatch.setattr(budget, "ENTRY_FILL", 10.0)  # every call keeps its variants
    interp = litekiln.Interpreter(
        model_path=zoo_model("smoke"), cache_dir=tmp_path, schedules="fast", tune=False
    )
    interp.allocate_tensors()
    program = interp._backend.executors[0].program  # noqa: SLF001
    groups = {la.func: work_groups(la) for la in program.launches}
    # (the schedules' own defaults: 8 groups for the strided 3x3 convolution, 32 for the 1x1)
    assert groups["fused_conv2d3_add2_relu1"] == 16
    assert groups["fused_conv2d2_add_add1"] == 64
    assert len(program.variants) == 4
    old = {v.func: min(work_groups(o[0]) for o in v.options) for v in program.variants}
    assert old["fused_conv2d3_add2_relu1"] == 8 and old["fused_conv2d2_add_add1"] == 32
