"""The latest H200 figure of every PyTorch twin of the corpus against torch (issue 15).

Each session times some twins with ``litekiln bench --peer torch`` and commits the JSON
(results/torch_peer/h200_*.json, results/h200/session*/torch_peer.json). This script reads
them all and prints, per twin of the corpus manifest (models/corpus/corpus.json: every
torchvision and timm model built), the newest run that timed it: litekiln's ms, torch eager
+ CUDA graph and torch.compile where that run had them, and the ratios, then the twins no run
has timed. Newest: the session number and the run's letter in the file's path (``session23d``
> ``session23c`` > ``session14d``); a run is one process, so each row's figures compare.

    .venv/bin/python scripts/twins_table.py [--json OUT]

Writes nothing but ``--json``; the table goes to docs/benchmarks.md by hand, with the command.
"""

from __future__ import annotations

import argparse
import glob
import json
import lzma
import os
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
#: (older runs no document names are kept xz-compressed: results/README.md)
SOURCES = (
    "results/torch_peer/h200_*.json",
    "results/torch_peer/h200_*.json.xz",
    "results/h200/session*/torch_peer.json",
)


def run_key(path: str) -> tuple[int, str] | None:
    """(session number, run letter) of a result file, from its path; None without one."""
    m = re.search(r"session(\d+)([a-z]?)", path)
    return (int(m.group(1)), m.group(2)) if m else None


def runs() -> list[tuple[tuple[int, str], str, dict[str, Any]]]:
    """Every torch-peer record: (run key, path relative to the repo, model record)."""
    found = []
    for pattern in SOURCES:
        for path in glob.glob(str(REPO / pattern)):
            key = run_key(path)
            if key is None or path.endswith(("_build.json", "_build.json.xz")):
                continue
            try:
                opener = lzma.open if path.endswith(".xz") else open
                with opener(path, "rt", encoding="utf-8") as f:
                    doc = json.load(f)
            except (OSError, lzma.LZMAError, json.JSONDecodeError):
                continue
            if "H200" not in str(doc.get("device", "")):
                continue
            for model in doc.get("models", []):
                if isinstance(model.get("torch"), dict) and model["torch"].get("modes"):
                    found.append((key, os.path.relpath(path, REPO), model))
    return found


def twins() -> list[str]:
    """The corpus' models converted from PyTorch, by name."""
    with open(REPO / "models/corpus/corpus.json", encoding="utf-8") as f:
        manifest = json.load(f)
    return sorted(
        name
        for name, entry in manifest["models"].items()
        if entry.get("status") == "built"
        and entry.get("spec", {}).get("library") in ("torchvision", "timm")
    )


def latest(records: list[tuple[tuple[int, str], str, dict[str, Any]]]) -> dict[str, Any]:
    """Per model name, the newest record that timed torch's CUDA graph (else any mode)."""
    best: dict[str, tuple[tuple[int, int, str], str, dict[str, Any]]] = {}
    for key, path, model in records:
        name = Path(model["model"]).stem
        modes = model["torch"]["modes"]
        has_graph = isinstance(modes.get("cuda_graph"), dict) and "ms" in modes["cuda_graph"]
        rank = (int(has_graph), key[0], key[1])
        if name not in best or rank > best[name][0]:
            best[name] = (rank, path, model)
    return {name: (path, model) for name, (_, path, model) in best.items()}


def mode_ms(model: dict[str, Any], mode: str) -> float | None:
    entry = model["torch"]["modes"].get(mode)
    return float(entry["ms"]) if isinstance(entry, dict) and "ms" in entry else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    table = latest(runs())
    names = twins()
    rows, missing = [], []
    print(
        "| twin | run | litekiln ms | torch eager + CUDA graph | vs CUDA graph |"
        " torch.compile | vs compile |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for name in names:
        if name not in table:
            missing.append(name)
            continue
        path, model = table[name]
        ours, graph, comp = (
            model["litekiln_ms"],
            mode_ms(model, "cuda_graph"),
            mode_ms(model, "compile"),
        )
        row = {
            "twin": name,
            "run": path,
            "litekiln_ms": ours,
            "cuda_graph_ms": graph,
            "vs_cuda_graph": round(graph / ours, 2) if graph else None,
            "compile_ms": comp,
            "vs_compile": round(comp / ours, 2) if comp else None,
        }
        rows.append(row)

        def cell(v: float | None, suffix: str = "") -> str:
            return "-" if v is None else f"{v:.3f}" if not suffix else f"{v:.2f}{suffix}"

        folder = Path(path).parent.name
        label = folder if folder.startswith("session") else Path(path).stem
        print(
            f"| {name} | {label} "
            f"| {ours:.3f} | {cell(graph)} | {cell(row['vs_cuda_graph'], 'x')} "
            f"| {cell(comp)} | {cell(row['vs_compile'], 'x')} |"
        )
    under = [r["twin"] for r in rows if r["vs_cuda_graph"] is not None and r["vs_cuda_graph"] < 1.5]
    print(
        f"\n{len(rows)} of {len(names)} twins timed; under 1.5x the CUDA graph: "
        f"{', '.join(under) or 'none'}; never timed: {', '.join(missing) or 'none'}"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"rows": rows, "never_timed": missing, "under_1_5x": under}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
