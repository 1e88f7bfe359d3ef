"""The bench harness (litekiln/bench.py): imports without TVM, its records carry the fields the
docs promise. Timings themselves are never asserted (benchmarks live outside pytest)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

LATENCY_KEYS = {
    "model",
    "litekiln_ms",
    "litert_cpu_ms",
    "litert_gpu_ms",
    "speedup_vs_litert_cpu",
    "speedup_vs_litert_gpu",
    "max_rel_err_vs_litert_cpu",
}


def test_bench_imports_without_tvm() -> None:
    code = "import sys\nsys.modules['tvm'] = None\nimport litekiln.bench, litekiln.cli\nprint('ok')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "tvm" not in proc.stderr.lower()


def test_latency_record_on_reference(smoke_path: Path) -> None:
    pytest.importorskip("ai_edge_litert.interpreter")
    from litekiln.bench import latency_model

    rec = latency_model(
        str(smoke_path), {"device": "reference"}, runs=3, profile=True, litert_gpu=False
    )
    assert set(rec) >= LATENCY_KEYS
    assert rec["litekiln_ms"] > 0 and rec["litert_cpu_ms"] > 0
    assert rec["max_rel_err_vs_litert_cpu"] < 1e-4
    assert rec["launch_overhead"] is None and rec["profile"] is None  # no OpenCL executors
    assert rec["host_breakdown"] is None
    json.dumps(rec)


@pytest.mark.opencl
@pytest.mark.slow
def test_startup_warm_only_and_profile(smoke_path: Path, tmp_path: Path) -> None:
    import litekiln
    from litekiln.bench import latency_model, startup_model

    cache = tmp_path / "cache"
    first = litekiln.Interpreter(model_path=smoke_path, cache_dir=cache)  # compiles
    first.run(first.random_inputs(0))
    first._backend.wait_for_graph()  # noqa: SLF001 - PoCL's binary is stored after the first run
    rec = startup_model(
        str(smoke_path), {}, repeat=1, warm_only=True, cache_dir=str(cache), progress=False
    )
    assert rec["warm_ms"] > 0 and rec["cold_ms"] > 0 and rec["shipped_ms"] > 0
    assert not rec["warm_imported_tvm"] and not rec["cold_compiled_here"]
    assert rec["outputs_agree"]
    assert rec["binaries_dropped_for_cold"] >= 1
    assert rec["cold_estimate_ms"] > rec["cold_ms"]
    # The start-up breakdown: its steps add up to the total (each a median, so close to it),
    # and each case says what the cache really held.
    from litekiln.bench import STEPS

    for case in ("cold", "shipped", "warm"):
        b = rec[f"{case}_breakdown"]
        assert all(b[f"{k}_ms"] >= 0 for k in STEPS)
        assert sum(b[f"{k}_ms"] for k in STEPS) == pytest.approx(b["total_ms"], rel=0.1)
        assert b["imports_ms"] > 0 and b["build_ms"] > 0 and b["first_run_ms"] > 0
    cached = {c: rec[f"{c}_breakdown"]["cache"] for c in ("cold", "shipped", "warm")}
    assert cached["cold"]["model"] and cached["cold"]["binaries"] == "0/1"
    assert cached["shipped"]["binaries"] == cached["warm"]["binaries"] == "1/1"
    json.dumps(rec)

    lat = latency_model(
        str(smoke_path), {"cache_dir": str(cache)}, runs=3, profile=True, litert_gpu=False
    )
    assert lat["launch_overhead"]["launches"] == len(lat["profile"]["launches"]) > 0
    assert lat["profile"]["kernel_sum_ms"] > 0
    hb = lat["host_breakdown"]  # one GPU partition, no CPU ops: its steps carry the time
    assert set(hb) == {"inputs_ms", "launch_ms", "wait_outputs_ms", "cpu_ops_ms", "other_ms"}
    assert hb["cpu_ops_ms"] == 0 and hb["launch_ms"] > 0 and hb["wait_outputs_ms"] > 0
    assert hb["inputs_ms"] + hb["launch_ms"] + hb["wait_outputs_ms"] < 2 * lat["litekiln_p90_ms"]


def test_plot_draws_latencies_and_speedups(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from litekiln.bench import plot_latency

    results = {
        "device": "test",
        "models": [
            {
                "model": "a",
                "litekiln_ms": 0.5,
                "litert_cpu_ms": 1.5,
                "litert_gpu_ms": None,
                "speedup_vs_litert_cpu": 3.0,
                "speedup_vs_litert_gpu": None,
            },
            {
                "model": "b",
                "litekiln_ms": 2.0,
                "litert_cpu_ms": 1.0,
                "litert_gpu_ms": 4.0,
                "speedup_vs_litert_cpu": 0.5,
                "speedup_vs_litert_gpu": 2.0,
            },
        ],
    }
    png = tmp_path / "p.png"
    assert plot_latency(results, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_plot_series_take_the_torch_modes_and_runs_merge(tmp_path: Path) -> None:
    """`--peer torch` results plot each torch mode's latency and litekiln's speed-up over it;
    a mode no model has (and LiteRT GPU, absent here) is left out; several runs' JSON merge
    into one plot."""
    from litekiln.bench import main, merged_results, plot_series

    def model(name: str, ms: float, graph: float | None, compiled: float) -> dict[str, object]:
        modes: dict[str, object] = {"compile": {"ms": compiled, "speedup": compiled / ms}}
        modes["cuda_graph"] = (
            {"ms": graph, "speedup": graph / ms} if graph else {"error": "capture fails"}
        )
        return {
            "model": name,
            "litekiln_ms": ms,
            "litert_cpu_ms": 4 * ms,
            "litert_gpu_ms": None,
            "speedup_vs_litert_cpu": 4.0,
            "speedup_vs_litert_gpu": None,
            "torch": {"modes": modes},
        }

    runs = [
        {"device": "dev", "models": [model("a", 0.5, 1.0, 0.75)]},
        {"device": "dev", "models": [model("b", 0.2, None, 0.5)]},
    ]
    paths = []
    for k, r in enumerate(runs):
        paths.append(str(tmp_path / f"r{k}.json"))
        Path(paths[-1]).write_text(json.dumps(r))
    merged = merged_results(paths)
    assert [m["model"] for m in merged["models"]] == ["a", "b"]
    latency, speedups = plot_series(merged["models"])
    assert latency == [
        ("litekiln", [0.5, 0.2]),
        ("LiteRT CPU", [2.0, 0.8]),
        ("torch eager + CUDA graph", [1.0, None]),
        ("torch.compile", [0.75, 0.5]),
    ]
    assert speedups == [
        ("vs LiteRT CPU", [4.0, 4.0]),
        ("vs torch eager + CUDA graph", [2.0, None]),
        ("vs torch.compile", [1.5, 2.5]),
    ]
    pytest.importorskip("matplotlib")
    png = tmp_path / "p.png"
    assert main(["plot", *paths, str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_holds_back_peer_logs_unless_verbose(
    capfd: pytest.CaptureFixture[str], smoke_path: Path
) -> None:
    """LiteRT's C++ logging (TFLite, absl, Dawn: about 30 lines a model) writes to fd 2
    directly: `litekiln bench` holds it back, `litekiln -v bench` lets it through."""
    pytest.importorskip("ai_edge_litert.interpreter")
    from litekiln.cli import main

    argv = ["bench", "--device", "reference", "--runs", "2", str(smoke_path)]
    assert main(argv) == 0
    out, err = capfd.readouterr()
    assert "warm latency on reference" in out
    for line in (out + err).splitlines():
        assert not line.startswith(("INFO:", "I0000", "W0000", "E0000", "WARNING: [")), line
    assert main(["-v", *argv]) == 0
    out, err = capfd.readouterr()
    assert "INFO:" in err or "I0000" in err  # the same run says it all with -v


def test_a_failing_peer_is_explained_by_what_it_logged() -> None:
    from litekiln.bench import peer_error

    logged = [  # LiteRT 2.3 on a machine without a Vulkan adapter
        "INFO: [delegate_webgpu.cc:342] Create WebGPU environment (use_low_power=0)",
        "Warning: Couldn't load Vulkan: libvulkan.so.1: cannot open shared object file",
        "ERROR: [delegate_webgpu.cc:359] Failed to initialize WebGPU environment: INTERNAL: "
        "No adapters found",
        "E0000 00:00:1795573831.843247   28776 delegate_webgpu.cc:736] Failed to get or "
        "create delegate WebGPU environment",
    ]
    exc = ("RuntimeError", "ERROR: [./litert/cc/litert_compiled_model.h:1961]\n└ ERROR: [x.cc:1]")
    assert peer_error(exc, logged) == (
        "RuntimeError: Failed to initialize WebGPU environment: INTERNAL: No adapters found"
    )
    assert peer_error(("ValueError", "Encountered unresolved custom op: X"), []) == (
        "ValueError: Encountered unresolved custom op: X"
    )


def test_profile_names_the_schedule_each_launch_ran() -> None:
    """`bench --profile` labels each launch with the tuning choice of its call: the labels
    follow `GpuProgram.plan` launch for launch, options of other lengths included."""
    from types import SimpleNamespace

    from litekiln.artifact.program import GpuProgram, Variant
    from litekiln.bench import _chosen_options, _timed_options

    launches = [f"L{i}" for i in range(6)]
    variants = [
        Variant(start=1, stop=2, options=(("a1",), ("a2", "a2b"))),  # type: ignore[arg-type]
        Variant(start=3, stop=5, options=(("b1",),)),  # type: ignore[arg-type]
    ]
    program = SimpleNamespace(launches=launches, variants=variants)
    for choices, want in [
        ([0, 0], ["default"] * 6),
        ([2, 0], ["default", "option 2 of 2", "option 2 of 2", "default", "default", "default",
                  "default"]),
        ([1, 1], ["default", "option 1 of 2", "default", "option 1 of 1", "default"]),
    ]:  # fmt: skip
        plan = GpuProgram.plan(program, choices)  # type: ignore[arg-type]
        assert _chosen_options(program, choices) == want
        assert len(want) == len(plan)
    # the tuning's times, where it ran in this process, on each launch of its variant
    times = [[0.03, 0.01, 0.02], [0.5, 0.4]]
    want_times = [None, times[0], times[0], None, times[1], None]
    assert _timed_options(program, [2, 1], times) == want_times
    assert len(GpuProgram.plan(program, [2, 1])) == len(want_times)  # type: ignore[arg-type]
    assert _timed_options(program, [2, 1], []) == [None] * 6  # choices from the cache


def test_bench_skip_litert_gpu_leaves_its_column_empty(smoke_path: Path, tmp_path: Path) -> None:
    """`--skip-litert-gpu` (A/B runs of another peer that must fit one device call): LiteRT's
    GPU path is neither timed nor tried, LiteRT CPU still is."""
    pytest.importorskip("ai_edge_litert.interpreter")
    from litekiln.cli import main

    out = tmp_path / "b.json"
    argv = ["bench", "--device", "reference", "--runs", "2", "--skip-litert-gpu"]
    assert main([*argv, "--out", str(out), str(smoke_path)]) == 0
    (rec,) = json.loads(out.read_text())["models"]
    assert rec["litert_cpu_ms"] > 0
    assert rec["litert_gpu_ms"] is None and "litert_gpu_error" not in rec


def test_bench_times_every_signature_of_a_language_model(tmp_path: Path) -> None:
    """A model whose signatures run two subgraphs (litert-torch's prefill and decode) gets a
    row each, the second named ``model[decode]``, each against LiteRT's runner of it."""
    pytest.importorskip("ai_edge_litert.interpreter")
    from test_signatures import _model

    from litekiln.cli import main

    path, out = tmp_path / "llm.tflite", tmp_path / "b.json"
    path.write_bytes(_model())
    argv = ["bench", "--device", "reference", "--runs", "2", "--skip-litert-gpu"]
    assert main([*argv, "--out", str(out), str(path)]) == 0
    rows = json.loads(out.read_text())["models"]
    assert [r["model"] for r in rows] == ["llm", "llm[decode]"]
    assert all(r["litert_cpu_ms"] > 0 and r["max_rel_err_vs_litert_cpu"] < 1e-4 for r in rows)
    # Each step timed again as a decode loop runs it: its cache carried, and the same output.
    for r in rows:
        carried = r["carried"]
        assert carried["states"] == ["cache"] and carried["litekiln_ms"] > 0, carried
        assert carried["max_rel_err_vs_uncarried"] == 0.0, carried
