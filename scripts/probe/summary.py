"""The probe's table (scripts/probe/run.sh): one row a model of scripts/probe/models.jsonl,
from OUT_DIR's conv.log and check_NAME.log files.

    .venv/bin/python scripts/probe/summary.py OUT_DIR
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

_CHECK = re.compile(r"^(\S+)\s+(ok|FAIL|ERROR)\s+(rel_err=\S+|mean [0-9.]+ steps, [0-9.]+%)", re.M)
_ERROR = re.compile(r"^\S+\s+ERROR\s+(.*)$", re.M)
_WHERE = re.compile(r"(\d+) ops? run on the GPU in (\d+) partitions?, (\d+) ops? on the CPU")


def rows(out: Path, spec: dict[str, object], conv: dict[str, str]) -> list[str]:
    """The model's rows: one, or one per signature the check compared (``model[decode]``:
    its log holds a result line for each, after the placement of each)."""
    log = out / f"check_{spec['out']}.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    results = list(_CHECK.finditer(text))
    if len(results) <= 1:
        return [row(out, spec, conv)]
    out_rows, start = [], 0
    for match in results:
        part = text[start : match.end()]
        start = match.end()
        out_rows.append(row(out, {**spec, "entry": match.group(1)}, conv, part))
    return out_rows


def row(out: Path, spec: dict[str, object], conv: dict[str, str], part: str | None = None) -> str:
    name = str(spec["out"])
    if spec["lib"] == "aeq":  # AI Edge Quantizer's recipe on a float model
        source = f"AEQ {spec['recipe']} of {Path(str(spec['base'])).stem}"
    elif spec["lib"] == "hf":  # transformers, from its configuration
        source = f"transformers {str(spec['model']).rsplit('.', 1)[-1]}"
    else:
        source = f"{spec['lib']} {spec.get('name', '')}".strip()
    line = conv.get(name, "")
    if line.startswith("FAIL"):
        why = line.split(" ", 2)[2] if line.count(" ") >= 2 else "failed"
        tool = "AI Edge Quantizer" if spec["lib"] == "aeq" else "litert-torch"
        return f"| {name} | {source} | {tool} fails: {why[:90]} | | | |"
    log = out / f"check_{name}.log"
    text = part if part is not None else log.read_text(errors="replace") if log.exists() else ""
    name = str(spec.get("entry", name))
    where = _WHERE.search(text)
    placed = f"{where.group(1)} / {where.group(3)}" if where else ""
    check = _CHECK.search(text)
    full = log.read_text(errors="replace") if log.exists() else ""
    warm = re.search(rf"^{re.escape(name)} \(warm\)\s+(ok|FAIL|ERROR)\s*(.*)$", full, re.M)
    if "Segfault" in text or "Segmentation fault" in text:
        verdict = "crash (segfault)"
    elif check:
        verdict = check.group(2)
        if "LiteRT's own paths disagree" in text:  # (`litekiln.check._second_opinion`)
            verdict += " (LiteRT's own CPU paths disagree more)"
        elif "within the bounds of LiteRT's builtin kernels" in text:
            verdict += " (against LiteRT's builtin kernels)"
    elif "LiteRT cannot run it" in text:  # (scripts/probe/torch_check.py compares it)
        verdict = "LiteRT cannot run it: see torch_check"
    elif _ERROR.search(text):  # refused at load or compile: the message names why
        verdict = "refused: " + _ERROR.search(text).group(1)[:120]  # type: ignore[union-attr]
    elif not text:
        verdict = "not checked"
    else:
        verdict = "error: " + text.strip().splitlines()[-1][:90]
    if warm and warm.group(1) != "ok":  # (run.sh checks each model again at a warm start)
        verdict += f"; warm start {warm.group(1)}: {warm.group(2)[:100]}"
    err = (
        check.group(3).removeprefix("rel_err=") + (" within 2" if "%" in check.group(3) else "")
        if check
        else ""
    )
    params = line.split()[3] if line.startswith("OK") and len(line.split()) > 3 else ""
    return f"| {name} | {source} | {params} | {placed} | {err} | {verdict} |"


def main() -> None:
    out = Path(sys.argv[1])
    conv: dict[str, str] = {}
    if (out / "conv.log").exists():
        for line in (out / "conv.log").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2:
                conv[parts[1]] = line
    specs = [json.loads(s) for s in Path("scripts/probe/models.jsonl").read_text().splitlines()]
    print("| model | source | parameters | ops GPU / CPU | against LiteRT | verdict |")
    print("| --- | --- | ---: | --- | --- | --- |")
    for spec in specs:  # (the models this run converted or checked)
        if str(spec["out"]) in conv or (out / f"check_{spec['out']}.log").exists():
            print("\n".join(rows(out, spec, conv)))


if __name__ == "__main__":
    main()
