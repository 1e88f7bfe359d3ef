"""Where each op runs, as a picture: one self-contained HTML page of a model's op graph.

`write_view` draws the ops as a layered graph (inline SVG, top to bottom in execution order),
each op coloured by the GPU partition it runs in, grey on the CPU with the reason, and the ops
the loader folded into constants as small hatched chips beside the op they feed. A side panel
holds the legend, a summary, every CPU op with its reason, each op's details on click and,
given the JSON of ``litekiln bench --profile --out X.json``, each partition's kernels and their
device times. The page fetches nothing: CSS and JS are inline and a Content-Security-Policy
allows no other source. Every string from the model file is escaped.

`write_model_explorer_data` writes the same placement as node data for Google's AI Edge Model
Explorer (``model-explorer model.tflite --node_data_paths=placement.json``), keyed by the node
ids its TFLite adapter gives the ops (the op's index in the file).

Reads only the loaded model and the dict `litekiln.placement.placement` returns; needs no
device, no TVM and no browser. The output depends only on its inputs (no clock, no random).
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import html
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from litekiln.errors import LitekilnError
from litekiln.model.ir import Model, Op, Tensor
from litekiln.version import __version__

#: One colour per GPU partition (cycled past ten; every box also names its partition).
PARTITION_COLOURS = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#b07aa1",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#ff9da7",
    "#9c755f",
    "#17becf",
)
CPU_COLOUR = "#8c8c8c"
FOLDED_COLOUR = "#c9c9c9"
IO_COLOUR = "#404040"

# Geometry, in SVG user units (pixels at 100%). Labels use a monospace font so that their
# width is known here: 11px text, 0.6em a character.
_CHAR_W = 6.7
_SMALL_CHAR_W = 6.0
_BOX_H = 26.0
_CPU_BOX_H = 40.0
_BOX_MIN_W = 96.0
_BOX_MAX_W = 300.0
_CHIP_W = 30.0
_CHIP_GAP = 3.0
_DUMMY_W = 4.0
_H_GAP = 18.0
_V_GAP = 34.0
_MARGIN = 24.0
_SWEEPS = 16  # barycentre sweeps when ordering each layer (alternately down and up)
_PLACE_SWEEPS = 10  # x-placement sweeps


# ------------------------------------------------------------------------------ public API


def write_view(
    model: Model,
    info: Mapping[str, Any],
    path: str | os.PathLike[str],
    *,
    profile: str | os.PathLike[str] | Mapping[str, Any] | None = None,
) -> Path:
    """Write the placement of ``model`` as one self-contained HTML page.

    Args:
        model: the loaded model (`litekiln.model.load_model`).
        info: its placement, as `litekiln.placement.placement` returns it (first item).
        path: the HTML file to write (its folder is created).
        profile: the JSON that ``litekiln bench --profile --out X.json`` wrote (a path, or
            the parsed dict): each partition's kernels and device times join the page.

    Returns:
        The path written.

    Raises:
        LitekilnError: the profile cannot be read, holds no record of this model, or its
            record has no kernel profile.
    """
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_view(model, info, profile=profile), encoding="utf-8")
    return out


def render_view(
    model: Model,
    info: Mapping[str, Any],
    *,
    profile: str | os.PathLike[str] | Mapping[str, Any] | None = None,
) -> str:
    """The HTML text `write_view` writes (same arguments, same errors)."""
    prof = _profile_of(model, info, profile)
    layout = _layout(model, info)
    return _page(model, info, layout, prof)


def write_model_explorer_data(
    model: Model, info: Mapping[str, Any], path: str | os.PathLike[str]
) -> Path:
    """Write the placement as node data for Google's AI Edge Model Explorer.

    Load it beside the same ``.tflite``: ``model-explorer MODEL.tflite
    --node_data_paths=PATH``, or "Upload node data" in its UI.

    Args:
        model: the loaded model.
        info: its placement (`litekiln.placement.placement`).
        path: the JSON file to write (its folder is created).

    Returns:
        The path written.
    """
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(model_explorer_data(model, info), indent=2, sort_keys=True)
    out.write_text(text + "\n", encoding="utf-8")
    return out


def model_explorer_data(model: Model, info: Mapping[str, Any]) -> dict[str, Any]:
    """The placement in Model Explorer's node-data format (its ``ModelNodeData``).

    ``{graph id: {"name", "results": {node id: {"value", "bgColor"}}, ...}}``: the graph id is
    the one Model Explorer's TFLite adapter gives the primary subgraph (its name, else its
    signature key, else ``"main"``) and each node id is the op's index in the file. Values
    are strings (``"GPU partition 0"``, ``"CPU: <reason>"``, ``"folded at load"``), so that
    Model Explorer counts the ops of each kind in every layer; the colours are the HTML
    view's.
    """
    results = {
        str(o["index"]): {"value": _placement_label(o), "bgColor": _fill(o["where"])}
        for o in info["ops"]
    }
    graph = {
        "name": "litekiln placement",
        "results": results,
        "showExpandedSummaryOnGroupNode": True,
        "showLabelCountColumnsInChildrenStatsTable": True,
    }
    return {model_explorer_graph_id(model): graph}


def model_explorer_graph_id(model: Model) -> str:
    """The id Model Explorer's TFLite adapter gives the primary subgraph."""
    g = model.main
    if g.name:
        return g.name
    for s in model.signatures:
        if s.subgraph_index == g.index and s.key:
            return s.key
    return "main"


# ------------------------------------------------------------------------------ colours


def _colour(where: str) -> str:
    if where.startswith("gpu:"):
        return PARTITION_COLOURS[int(where[4:]) % len(PARTITION_COLOURS)]
    return FOLDED_COLOUR if where == "folded" else CPU_COLOUR


def _fill(where: str) -> str:
    """A light tint of the op's colour (box backgrounds; text stays dark on it)."""
    base = _colour(where)
    r, g, b = (int(base[i : i + 2], 16) for i in (1, 3, 5))
    mix = 0.35 if where.startswith("gpu:") else 0.45
    return "#{:02x}{:02x}{:02x}".format(*(round(255 - (255 - c) * mix) for c in (r, g, b)))


def _css_class(where: str) -> str:
    return f"gpu p{where[4:]}" if where.startswith("gpu:") else where


def _placement_label(o: Mapping[str, Any]) -> str:
    where = str(o["where"])
    if where.startswith("gpu:"):
        return f"GPU partition {where[4:]}"
    if where == "cpu":
        return f"CPU: {o['reason']}" if o["reason"] else "CPU"
    return "folded at load"


# ------------------------------------------------------------------------------ layout


@dataclass
class _Node:
    """One box of the drawing: a graph input or output, an op, or a bend of a long edge."""

    key: str
    kind: str  # "input" | "output" | "op" | "dummy"
    ref: int  # tensor index (input/output), op index (op), -1 (dummy)
    width: float
    height: float
    label: str = ""
    sub: str = ""  # second line (a CPU op's reason)
    satellites: list[int] = field(default_factory=list)  # folded ops drawn left of the op
    layer: int = 0
    x: float = 0.0  # centre of the whole slot (chips and box)
    y: float = 0.0  # top

    @property
    def chips_w(self) -> float:
        return len(self.satellites) * (_CHIP_W + _CHIP_GAP)

    @property
    def anchor(self) -> float:
        """x of the main box's centre, where edges attach."""
        return self.x + self.chips_w / 2


@dataclass
class _Edge:
    src: str
    dst: str
    tensors: list[int]
    bends: list[str] = field(default_factory=list)  # dummy node keys, top to bottom


@dataclass
class _Layout:
    nodes: dict[str, _Node]
    edges: list[_Edge]
    layer_top: list[float]
    layer_h: list[float]
    width: float
    height: float


def _layout(model: Model, info: Mapping[str, Any]) -> _Layout:
    """Longest-path layers, long edges split by bends, barycentre order, compact x."""
    nodes, edges = _graph(model, info)
    _assign_layers(nodes, edges)
    _add_bends(nodes, edges)
    rows = _order(nodes, edges)
    layer_top, layer_h = _place_y(nodes, rows)
    width = _place_x(nodes, edges, rows)
    return _Layout(nodes, edges, layer_top, layer_h, width, layer_top[-1] + layer_h[-1] + _MARGIN)


def _text_w(text: str, char_w: float = _CHAR_W) -> float:
    return len(text) * char_w + 16.0


def _truncate(text: str, width: float, char_w: float) -> str:
    n = int((width - 16.0) / char_w)
    return text if len(text) <= n else text[: max(1, n - 1)] + "\u2026"


def _op_node(o: Mapping[str, Any]) -> _Node:
    label = f"#{o['index']} {o['op']}"
    w = _text_w(label)
    if o["where"] != "cpu":
        return _Node(
            f"op:{o['index']}", "op", o["index"], min(max(w, _BOX_MIN_W), _BOX_MAX_W), _BOX_H, label
        )
    reason = str(o["reason"]) or "on the CPU"
    w = min(max(w, _text_w(reason, _SMALL_CHAR_W), _BOX_MIN_W), _BOX_MAX_W)
    sub = _truncate(reason, w, _SMALL_CHAR_W)
    return _Node(
        f"op:{o['index']}", "op", o["index"], w, _CPU_BOX_H, _truncate(label, w, _CHAR_W), sub
    )


def _io_node(kind: str, t: Tensor) -> _Node:
    shape = "x".join(str(d) for d in t.shape) or "scalar"
    label = f"{kind} #{t.index} {t.dtype.name}[{shape}]"
    w = min(max(_text_w(label), _BOX_MIN_W), _BOX_MAX_W)
    return _Node(f"{kind[:3]}:{t.index}", kind, t.index, w, _BOX_H, _truncate(label, w, _CHAR_W))


def _hosts(g_ops: list[Op], where: dict[int, str]) -> dict[int, int]:
    """Folded op -> the live op drawn with it (the first live op its output reaches)."""
    readers: dict[int, list[int]] = {}
    for op in g_ops:
        for t in op.inputs:
            if t >= 0:
                readers.setdefault(t, []).append(op.index)
    host: dict[int, int] = {}
    for op in reversed(g_ops):  # consumers come later in the file: resolve them first
        if where[op.index] != "folded":
            continue
        consumers = sorted({r for t in op.outputs for r in readers.get(t, [])})
        for c in consumers:
            if where[c] != "folded":
                host[op.index] = c
                break
            if c in host:
                host[op.index] = host[c]
                break
    return host


def _graph(model: Model, info: Mapping[str, Any]) -> tuple[dict[str, _Node], list[_Edge]]:
    g = model.main
    ops = {int(o["index"]): o for o in info["ops"]}
    where = {i: str(o["where"]) for i, o in ops.items()}
    host = _hosts(g.ops, where)
    nodes: dict[str, _Node] = {}
    for t in g.inputs:
        nodes[f"inp:{t}"] = _io_node("input", g.tensors[t])
    for op in g.ops:
        if op.index not in host:
            nodes[f"op:{op.index}"] = _op_node(ops[op.index])
    for f, h in sorted(host.items()):
        nodes[f"op:{h}"].satellites.append(f)

    source: dict[int, str] = {t: f"inp:{t}" for t in g.inputs}
    for op in g.ops:
        for t in op.outputs:
            if t >= 0:
                source.setdefault(t, f"op:{host.get(op.index, op.index)}")
    pairs: dict[tuple[str, str], list[int]] = {}
    for op in g.ops:
        if op.index in host:
            continue
        for t in op.inputs:
            src = source.get(t) if t >= 0 else None
            if src is not None and src != f"op:{op.index}":
                pairs.setdefault((src, f"op:{op.index}"), []).append(t)
    for t in g.outputs:
        nodes[f"out:{t}"] = _io_node("output", g.tensors[t])
        if t in source:
            pairs.setdefault((source[t], f"out:{t}"), []).append(t)
    edges = [_Edge(s, d, sorted(set(ts))) for (s, d), ts in pairs.items()]
    return nodes, edges


def _assign_layers(nodes: dict[str, _Node], edges: list[_Edge]) -> None:
    """Each node one layer below its lowest predecessor (the dict is in execution order);
    an op that reads only constants sits just above its first consumer."""
    preds: dict[str, list[str]] = {k: [] for k in nodes}
    succs: dict[str, list[str]] = {k: [] for k in nodes}
    for e in edges:
        preds[e.dst].append(e.src)
        succs[e.src].append(e.dst)
    for k, n in nodes.items():
        n.layer = max((nodes[p].layer + 1 for p in preds[k]), default=0)
    for k in reversed(list(nodes)):
        n = nodes[k]
        if n.kind == "op" and not preds[k] and succs[k]:
            n.layer = max(0, min(nodes[s].layer for s in succs[k]) - 1)


def _add_bends(nodes: dict[str, _Node], edges: list[_Edge]) -> None:
    for i, e in enumerate(edges):
        top, bottom = nodes[e.src].layer, nodes[e.dst].layer
        for layer in range(top + 1, bottom):
            key = f"bend:{i}:{layer}"
            nodes[key] = _Node(key, "dummy", -1, _DUMMY_W, 0.0, layer=layer)
            e.bends.append(key)


def _segments(edges: list[_Edge]) -> list[tuple[str, str]]:
    out = []
    for e in edges:
        chain = [e.src, *e.bends, e.dst]
        out += list(zip(chain, chain[1:], strict=False))
    return out


def _order(nodes: dict[str, _Node], edges: list[_Edge]) -> list[list[str]]:
    """Order each layer by the barycentre of its neighbours, sweeping down and up; keep the
    order with the fewest crossings."""
    depth = max(n.layer for n in nodes.values()) + 1
    rows: list[list[str]] = [[] for _ in range(depth)]
    for k, n in nodes.items():  # execution order: a sensible start
        rows[n.layer].append(k)
    up: dict[str, list[str]] = {k: [] for k in nodes}
    down: dict[str, list[str]] = {k: [] for k in nodes}
    for a, b in _segments(edges):
        down[a].append(b)
        up[b].append(a)
    pos = {k: i for row in rows for i, k in enumerate(row)}
    best, best_crossings = [list(r) for r in rows], _crossings(rows, down, pos)
    for sweep in range(_SWEEPS):
        downward = sweep % 2 == 0
        layers = range(1, depth) if downward else range(depth - 2, -1, -1)
        nbrs = up if downward else down
        for li in layers:
            row = rows[li]

            def key(k: str, nbrs: dict[str, list[str]] = nbrs) -> tuple[float, int]:
                ns = nbrs[k]
                return (sum(pos[n] for n in ns) / len(ns) if ns else pos[k], pos[k])

            row.sort(key=key)
            for i, k in enumerate(row):
                pos[k] = i
        crossings = _crossings(rows, down, pos)
        if crossings < best_crossings:
            best, best_crossings = [list(r) for r in rows], crossings
    return best


def _crossings(rows: list[list[str]], down: dict[str, list[str]], pos: dict[str, int]) -> int:
    total = 0
    for row in rows:
        ends = sorted((pos[a], pos[b]) for a in row for b in down[a])
        seen: list[int] = []
        for _, b in ends:
            total += len(seen) - bisect.bisect_right(seen, b)
            bisect.insort(seen, b)
    return total


def _place_y(nodes: dict[str, _Node], rows: list[list[str]]) -> tuple[list[float], list[float]]:
    tops, heights = [], []
    y = _MARGIN
    for row in rows:
        h = max((nodes[k].height for k in row), default=0.0)
        tops.append(y)
        heights.append(h)
        for k in row:
            nodes[k].y = y + (h - nodes[k].height) / 2
        y += h + _V_GAP
    return tops, heights


def _isotonic(targets: list[float], weights: list[float]) -> list[float]:
    """Non-decreasing values nearest to ``targets`` (weighted least squares; pool adjacent
    violators)."""
    blocks: list[tuple[float, float, int]] = []  # value, weight, count
    for t, w in zip(targets, weights, strict=True):
        value, weight, count = t, w, 1
        while blocks and blocks[-1][0] > value:
            v, wt, n = blocks.pop()
            value = (v * wt + value * weight) / (wt + weight)
            weight, count = wt + weight, n + count
        blocks.append((value, weight, count))
    return [v for v, _, n in blocks for _ in range(n)]


def _place_row(nodes: dict[str, _Node], row: list[str], want: dict[str, float]) -> None:
    """x of each node of a row as near ``want`` (its anchor) as the row's order and spacing
    allow."""
    offsets = [0.0]
    for a, b in zip(row, row[1:], strict=False):
        offsets.append(offsets[-1] + (nodes[a].width + nodes[b].width) / 2 + _H_GAP)
    targets, weights = [], []
    for k, off in zip(row, offsets, strict=True):
        n = nodes[k]
        centre = want.get(k, n.anchor) - n.chips_w / 2
        targets.append(centre - off)
        weights.append(2.0 if n.kind == "dummy" else 1.0)
    for k, y, off in zip(row, _isotonic(targets, weights), offsets, strict=True):
        nodes[k].x = y + off


def _place_x(nodes: dict[str, _Node], edges: list[_Edge], rows: list[list[str]]) -> float:
    """Place each row under its predecessors, then over its successors, a few times over;
    returns the drawing's width."""
    for n in nodes.values():  # slot widths include the folded-op chips
        n.width += n.chips_w
        n.x = 0.0
    up: dict[str, list[str]] = {k: [] for k in nodes}
    down: dict[str, list[str]] = {k: [] for k in nodes}
    for a, b in _segments(edges):
        down[a].append(b)
        up[b].append(a)
    for row in rows:
        _place_row(nodes, row, {})

    def mean_anchor(ks: list[str]) -> float:
        return sum(nodes[k].anchor for k in ks) / len(ks)

    for sweep in range(_PLACE_SWEEPS):
        downward = sweep % 2 == 0
        nbrs = up if downward else down
        for row in rows if downward else reversed(rows):
            _place_row(nodes, row, {k: mean_anchor(nbrs[k]) for k in row if nbrs[k]})
    for row in rows:  # a last pass that weighs both sides
        _place_row(nodes, row, {k: mean_anchor(up[k] + down[k]) for k in row if up[k] or down[k]})
    left = min(n.x - n.width / 2 for n in nodes.values())
    for n in nodes.values():
        n.x = round(n.x - left + _MARGIN, 1)
    return max(n.x + n.width / 2 for n in nodes.values()) + _MARGIN


# ------------------------------------------------------------------------------ profile


def _profile_of(
    model: Model,
    info: Mapping[str, Any],
    profile: str | os.PathLike[str] | Mapping[str, Any] | None,
) -> dict[str, Any] | None:
    """This model's kernel times from a ``bench --profile`` result, grouped by partition."""
    if profile is None:
        return None
    if isinstance(profile, Mapping):
        results, source = profile, "the profile"
    else:
        source = str(profile)
        try:
            results = json.loads(Path(profile).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise LitekilnError(f"cannot read the profile {source}: {exc}") from exc
    records = [r for r in results.get("models", []) if isinstance(r, Mapping)]
    rec = next((r for r in records if r.get("model") == model.name), None)
    if rec is None:
        names = ", ".join(str(r.get("model")) for r in records) or "none"
        raise LitekilnError(f"{source} holds no record of model {model.name!r} (it has: {names})")
    launches = (rec.get("profile") or {}).get("launches")
    if not launches:
        raise LitekilnError(
            f"{source}: the record of {model.name!r} has no kernel profile "
            "(run `litekiln bench --profile --out FILE`)"
        )
    # Each kernel's own time inside the CUDA graph where the bench traced it (`graph_ms`);
    # else the events around each launch, which count the launch's overhead too.
    key = "graph_ms" if all("graph_ms" in la for la in launches) else "ms"
    parts: dict[int, dict[str, Any]] = {}
    for la in launches:
        p = parts.setdefault(int(la["partition"]), {"ms": 0.0, "kernels": []})
        p["ms"] += float(la[key])
        p["kernels"].append([int(la["launch"]), str(la["kernel"]), float(la[key])])
    for p in parts.values():
        p["ms"] = round(p["ms"], 5)
    measured = (len(parts), rec.get("gpu_ops"), rec.get("cpu_ops"))
    shown = (len(info["partitions"]), info.get("gpu_ops"), info.get("cpu_ops"))
    note = ""
    if measured != shown:
        note = (
            f"The profile was measured under another placement ({measured[0]} partitions, "
            f"{measured[1]} GPU ops, {measured[2]} CPU ops) than this view shows ({shown[0]}, "
            f"{shown[1]}, {shown[2]}): its partitions are listed, not matched to the drawing. "
            "Draw the view with the options of the benchmark."
        )
    return {
        "device": str(results.get("device") or rec.get("device") or ""),
        "inference_ms": rec.get("litekiln_ms"),
        "graph_device_ms": rec.get("graph_device_ms"),
        "kernel_sum_ms": round(sum(p["ms"] for p in parts.values()), 4),
        "in_graph": key == "graph_ms",
        "partitions": {str(i): parts[i] for i in sorted(parts)},
        "matched": not note,
        "note": note,
    }


# ------------------------------------------------------------------------------ rendering


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _tensor_data(t: Tensor) -> dict[str, Any]:
    return {
        "index": t.index,
        "name": t.name,
        "shape": list(t.shape),
        "dtype": t.dtype.name,
        "constant": t.is_constant,
    }


def _plain(value: object) -> object:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return repr(value)


def _page_data(
    model: Model, info: Mapping[str, Any], layout: _Layout, prof: dict[str, Any] | None
) -> dict[str, Any]:
    g = model.main
    host = {f: n.ref for n in layout.nodes.values() for f in n.satellites}

    def tensors(ids: list[int]) -> list[dict[str, Any]]:
        return [_tensor_data(g.tensors[t]) for t in ids if t >= 0]

    ops = []
    for o in info["ops"]:
        op = g.ops[o["index"]]
        ops.append(
            {
                "index": o["index"],
                "op": o["op"],
                "code": o["code"],
                "version": o["version"],
                "custom_code": o["custom_code"],
                "where": o["where"],
                "reason": o["reason"],
                "inputs": tensors(op.inputs),
                "outputs": tensors(op.outputs),
                "options": {k: _plain(v) for k, v in sorted(op.options.items())},
                "drawn_with": host.get(o["index"]),
            }
        )
    return {"model": model.name, "ops": ops, "profile": prof}


def _json_for_script(data: object) -> str:
    """JSON that cannot end its <script> element or open a comment inside it."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for ch, esc in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e")):
        text = text.replace(ch, esc)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _node_svg(n: _Node, ops: dict[int, Mapping[str, Any]], model: Model) -> str:
    h = n.height
    left = n.x - n.width / 2
    if n.kind == "dummy":
        return ""
    if n.kind in ("input", "output"):
        t = model.main.tensors[n.ref]
        tip = f"graph {n.kind} #{t.index} {t.name}\n{t.dtype.name}{list(t.shape)}"
        return (
            f'<g class="node io {n.kind}" id="{n.kind[:3]}-{n.ref}">'
            f"<title>{_e(tip)}</title>"
            f'<rect x="{left:.1f}" y="{n.y:.1f}" width="{n.width:.1f}" height="{h:.1f}" '
            f'rx="{h / 2:.1f}"/>'
            f'<text x="{n.x:.1f}" y="{n.y + h / 2 + 4:.1f}">{_e(n.label)}</text></g>'
        )
    o = ops[n.ref]
    where = str(o["where"])
    parts = []
    chip_x = left
    for f in n.satellites:
        fo = ops[f]
        tip = f"#{f} {fo['op']} v{fo['version']}: folded at load (constant) into #{n.ref}'s input"
        parts.append(
            f'<g class="node chip folded" id="op-{f}" data-op="{f}"><title>{_e(tip)}</title>'
            f'<rect x="{chip_x:.1f}" y="{n.y + 3:.1f}" width="{_CHIP_W:.1f}" '
            f'height="{_BOX_H - 6:.1f}" rx="3"/>'
            f'<text x="{chip_x + _CHIP_W / 2:.1f}" y="{n.y + _BOX_H / 2 + 3.5:.1f}">'
            f"{_e(str(fo['op'])[:3])}</text></g>"
        )
        chip_x += _CHIP_W + _CHIP_GAP
    box_w = n.width - n.chips_w
    tip = f"#{n.ref} {o['op']} v{o['version']}: {_placement_label(o)}"
    text_y = n.y + (h / 2 + 4 if not n.sub else 16)
    sub = (
        f'<text class="reason" x="{n.anchor:.1f}" y="{n.y + 32:.1f}">{_e(n.sub)}</text>'
        if n.sub
        else ""
    )
    parts.append(
        f'<g class="node op {_css_class(where)}" id="op-{n.ref}" data-op="{n.ref}" '
        f'data-where="{_e(where)}"><title>{_e(tip)}</title>'
        f'<rect x="{chip_x:.1f}" y="{n.y:.1f}" width="{box_w:.1f}" height="{h:.1f}" rx="4"/>'
        f'<text x="{n.anchor:.1f}" y="{text_y:.1f}">{_e(n.label)}</text>{sub}</g>'
    )
    return "".join(parts)


def _edge_svg(e: _Edge, layout: _Layout, where: dict[str, str], model: Model) -> str:
    nodes = layout.nodes
    src, dst = nodes[e.src], nodes[e.dst]
    pts = [(src.anchor, src.y + src.height)]
    for b in e.bends:
        n = nodes[b]
        top = layout.layer_top[n.layer]
        pts += [(n.x, top), (n.x, top + layout.layer_h[n.layer])]
    pts.append((dst.anchor, dst.y))
    d = f"M{pts[0][0]:.1f},{pts[0][1]:.1f}"
    for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
        my = (y0 + y1) / 2
        d += f" C{x0:.1f},{my:.1f} {x1:.1f},{my:.1f} {x1:.1f},{y1:.1f}"
    ws, wd = where.get(e.src, ""), where.get(e.dst, "")
    cls = f"edge p{ws[4:]}" if ws == wd and ws.startswith("gpu:") else "edge cross"
    if ws == wd == "cpu":
        cls = "edge cpu"
    g = model.main
    tip = "\n".join(
        f"tensor #{t} {g.tensors[t].name} {list(g.tensors[t].shape)}" for t in e.tensors
    )
    ref = {"op": "", "inp": "inp-", "out": "out-"}

    def end(key: str) -> str:
        kind, idx = key.split(":")
        return f"{ref[kind]}{idx}"

    return (
        f'<path class="{cls}" data-src="{end(e.src)}" data-dst="{end(e.dst)}" d="{d}">'
        f"<title>{_e(tip)}</title></path>"
    )


def _svg(model: Model, info: Mapping[str, Any], layout: _Layout) -> str:
    ops = {int(o["index"]): o for o in info["ops"]}
    where = {f"op:{i}": str(o["where"]) for i, o in ops.items()}
    w, h = layout.width, layout.height
    edges = "".join(_edge_svg(e, layout, where, model) for e in layout.edges)
    boxes = "".join(_node_svg(n, ops, model) for n in layout.nodes.values())
    return (
        f'<svg id="graph-svg" xmlns="http://www.w3.org/2000/svg" width="{w:.0f}" '
        f'height="{h:.0f}" viewBox="0 0 {w:.0f} {h:.0f}" data-width="{w:.0f}" '
        f'data-height="{h:.0f}" role="img" aria-label="op graph">'
        '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#eeeeee"/>'
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#a8a8a8" stroke-width="2.5"/></pattern>'
        '<marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="6" '
        'markerHeight="6" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#666"/></marker>'
        "</defs>"
        f'<g class="edges">{edges}</g><g class="nodes">{boxes}</g></svg>'
    )


def _summary(info: Mapping[str, Any]) -> dict[str, int]:
    wheres = [str(o["where"]) for o in info["ops"]]
    return {
        "ops": sum(w != "folded" for w in wheres),
        "gpu": sum(w.startswith("gpu:") for w in wheres),
        "cpu": wheres.count("cpu"),
        "folded": wheres.count("folded"),
        "partitions": len(info["partitions"]),
    }


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _legend(info: Mapping[str, Any], prof: dict[str, Any] | None) -> str:
    counts = _summary(info)
    timed = prof["partitions"] if prof and prof["matched"] else {}
    items = []
    for p in info["partitions"]:
        i = p["index"]
        extra = ""
        if str(i) in timed:
            t = timed[str(i)]
            extra = (
                f'<span class="time">{t["ms"]:.3f} ms in '
                f"{_plural(len(t['kernels']), 'kernel')}</span>"
            )
        items.append(
            f'<li class="legend-item" data-focus="p{i}"><span class="swatch p{i}"></span>'
            f'GPU partition {i}<span class="count">{_plural(p["ops"], "op")}</span>{extra}</li>'
        )
    items.append(
        '<li class="legend-item" data-focus="cpu"><span class="swatch cpu"></span>CPU '
        f'(numpy reference)<span class="count">{_plural(counts["cpu"], "op")}</span></li>'
    )
    items.append(
        '<li class="legend-item" data-focus="folded"><span class="swatch folded"></span>'
        f'folded at load<span class="count">{_plural(counts["folded"], "op")}</span></li>'
    )
    items.append(
        '<li class="legend-item" data-focus="io"><span class="swatch io"></span>'
        "graph input / output</li>"
    )
    return f'<ul id="legend">{"".join(items)}</ul>'


def _cpu_table(info: Mapping[str, Any]) -> str:
    rows = [
        f'<li><a href="#op-{o["index"]}" data-op="{o["index"]}">#{o["index"]} {_e(o["op"])}</a>'
        f' <span class="reason">{_e(o["reason"] or "on the CPU")}</span></li>'
        for o in info["ops"]
        if o["where"] == "cpu"
    ]
    if not rows:
        return '<p class="muted">Every op runs on the GPU.</p>'
    return f'<ul id="cpu-ops">{"".join(rows)}</ul>'


def _profile_html(prof: dict[str, Any] | None) -> str:
    if prof is None:
        return (
            '<p class="muted">No profile. <code>litekiln bench --profile --out X.json</code> '
            "measures each kernel; give it to the view to see their times here.</p>"
        )
    head = (
        f"<p>{_e(prof['device'])}: {prof['kernel_sum_ms']:.3f} ms of kernel time, the sum of "
        + (
            "each launch's median inside the replayed CUDA graph (CUPTI)"
            if prof.get("in_graph")
            else "each launch's median, each timed on its own by OpenCL profiling events"
        )
    )
    whole = [
        f"{prof[k]} ms {what}"
        for k, what in (("inference_ms", "per inference"), ("graph_device_ms", "on the device"))
        if isinstance(prof.get(k), int | float)
    ]
    head += f" (the whole model: {', '.join(whole)}).</p>" if whole else ".</p>"
    if prof["note"]:
        head += f'<p class="warning">{_e(prof["note"])}</p>'
    blocks = []
    for i, p in prof["partitions"].items():
        top = sorted(p["kernels"], key=lambda k: (-k[2], k[0]))
        rows = "".join(
            f"<tr><td>{la}</td><td>{_e(k)}</td><td>{ms:.4f}</td></tr>" for la, k, ms in top
        )
        blocks.append(
            f'<details class="partition-profile" data-partition="{_e(i)}"><summary>partition '
            f"{_e(i)}: {p['ms']:.3f} ms, {_plural(len(p['kernels']), 'kernel')}</summary>"
            f"<table><thead><tr><th>launch</th><th>kernel</th><th>ms</th></tr></thead>"
            f"<tbody>{rows}</tbody></table></details>"
        )
    return head + "".join(blocks)


def _options_line(info: Mapping[str, Any]) -> str:
    opts = info.get("options") or {}
    keep = ("precision", "op_table", "max_partitions", "min_partition_ops", "allow_quantized")
    return ", ".join(f"{k}={_e(opts[k])}" for k in keep if k in opts)


def _header(model: Model, info: Mapping[str, Any]) -> str:
    c = _summary(info)
    summary = (
        f"{_plural(c['ops'], 'op')}: {c['gpu']} on the GPU in "
        f"{_plural(c['partitions'], 'partition')}, {c['cpu']} on the CPU; "
        f"{c['folded']} folded into constants at load"
    )
    return (
        f"<header><h1>{_e(model.name)}</h1>"
        f'<p id="summary" data-gpu="{c["gpu"]}" data-cpu="{c["cpu"]}" '
        f'data-folded="{c["folded"]}" data-partitions="{c["partitions"]}">{summary}</p>'
        f'<p class="muted">token {_e(model.token)} \u00b7 {_options_line(info)} \u00b7 '
        f"litekiln {_e(__version__)}</p></header>"
    )


def _focus_css(info: Mapping[str, Any]) -> str:
    keys = [f"p{p['index']}" for p in info["partitions"]] + ["cpu", "folded", "io"]
    keep = ",".join(f'#graph-svg[data-focus="{k}"] .{k}' for k in keys)
    colours = "".join(
        f".node.p{i} rect{{fill:{_fill(f'gpu:{i}')};stroke:{_colour(f'gpu:{i}')}}}"
        f".swatch.p{i}{{background:{_fill(f'gpu:{i}')};border-color:{_colour(f'gpu:{i}')}}}"
        f".edge.p{i}{{stroke:{_colour(f'gpu:{i}')}}}"
        for i in range(len(info["partitions"]))
    )
    cpu = (
        f".node.cpu rect{{fill:{_fill('cpu')};stroke:{CPU_COLOUR}}}"
        f".swatch.cpu{{background:{_fill('cpu')};border-color:{CPU_COLOUR}}}"
    )
    return f"{colours}{cpu}{keep}{{opacity:1}}"


_CSS = """
*{box-sizing:border-box}
body{margin:0;font:13px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
 color:#202020;background:#fafafa;height:100vh;display:flex;flex-direction:column}
header{padding:8px 16px;border-bottom:1px solid #ddd;background:#fff}
h1{font-size:17px;margin:0 0 2px}
header p{margin:0}
.muted{color:#666}
main{flex:1;display:flex;min-height:0}
#graph-pane{flex:1;display:flex;flex-direction:column;min-width:0}
.toolbar{padding:4px 8px;border-bottom:1px solid #ddd;background:#fff;display:flex;gap:6px;
 align-items:center}
.toolbar button{font:inherit;padding:1px 8px}
#graph{flex:1;overflow:auto;background:#fff;cursor:grab}
#graph.panning{cursor:grabbing}
#graph-svg{display:block;margin:0 auto}
#panel{width:380px;overflow:auto;border-left:1px solid #ddd;padding:8px 14px;background:#fafafa}
#panel h2{font-size:14px;margin:14px 0 6px}
#legend,#cpu-ops{list-style:none;padding:0;margin:0}
.legend-item{display:flex;flex-wrap:wrap;align-items:center;gap:0 8px;padding:2px 4px;
 cursor:pointer;border-radius:3px}
.legend-item .time{flex-basis:100%;padding-left:30px;color:#555;font-size:12px}
.legend-item:hover,.legend-item.active{background:#e8e8e8}
.legend-item .count{margin-left:auto;color:#555;font-variant-numeric:tabular-nums}
.swatch{width:22px;height:14px;border:1.5px solid #888;border-radius:3px;flex:none}
.swatch.folded{background:repeating-linear-gradient(45deg,#eee 0 3px,#bbb 3px 5px)}
.swatch.io{background:#fff;border-color:#404040;border-radius:7px}
#cpu-ops li{margin:3px 0}
#cpu-ops .reason,.warning{color:#8a4b00}
#details table,.partition-profile table{border-collapse:collapse;width:100%;font-size:12px}
#details td,.partition-profile td,.partition-profile th{padding:2px 4px;vertical-align:top;
 border-bottom:1px solid #e4e4e4;text-align:left;overflow-wrap:anywhere}
#details td:first-child{color:#555;white-space:nowrap}
.partition-profile summary{cursor:pointer}
.node{cursor:pointer}
.node rect{stroke-width:1.4}
.node text{font:11px "DejaVu Sans Mono",ui-monospace,Menlo,Consolas,monospace;text-anchor:middle;
 fill:#1a1a1a;pointer-events:none}
.node.cpu rect{stroke-dasharray:4 2}
.node text.reason{font-size:10px;fill:#7a3f00}
.node.folded rect{fill:url(#hatch);stroke:#a0a0a0;opacity:.85}
.node.folded text{fill:#666;font-size:9px}
.node.io rect{fill:#fff;stroke:#404040}
.node.selected rect{stroke:#000;stroke-width:3}
.edge{fill:none;stroke:#9a9a9a;stroke-width:1.3;marker-end:url(#arrow);opacity:.8}
.edge.cross{stroke:#555;stroke-dasharray:5 3;stroke-width:1.6}
.edge.hl{stroke:#000;stroke-width:2.6;opacity:1}
#graph-svg[data-focus] .node,#graph-svg[data-focus] .edge{opacity:.15}
"""

_JS = """
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("litekiln-data").textContent);
  var ops = {};
  data.ops.forEach(function (o) { ops[o.index] = o; });
  var svg = document.getElementById("graph-svg");
  var pane = document.getElementById("graph");
  var W = Number(svg.getAttribute("data-width"));
  var H = Number(svg.getAttribute("data-height"));
  var scale = 1;

  function setScale(s) {
    scale = Math.min(3, Math.max(0.05, s));
    svg.setAttribute("width", String(Math.round(W * scale)));
    svg.setAttribute("height", String(Math.round(H * scale)));
    document.getElementById("zoom-level").textContent = Math.round(scale * 100) + "%";
  }
  function zoomBy(f) {
    var cx = (pane.scrollLeft + pane.clientWidth / 2) / scale;
    var cy = (pane.scrollTop + pane.clientHeight / 2) / scale;
    setScale(scale * f);
    pane.scrollLeft = cx * scale - pane.clientWidth / 2;
    pane.scrollTop = cy * scale - pane.clientHeight / 2;
  }
  document.getElementById("zoom-in").addEventListener("click", function () { zoomBy(1.25); });
  document.getElementById("zoom-out").addEventListener("click", function () { zoomBy(0.8); });
  document.getElementById("zoom-fit").addEventListener("click", function () {
    setScale(Math.min(1, (pane.clientWidth - 8) / W));
  });
  document.getElementById("zoom-reset").addEventListener("click", function () { setScale(1); });
  pane.addEventListener("wheel", function (ev) {
    if (!ev.ctrlKey) { return; }
    ev.preventDefault();
    zoomBy(ev.deltaY < 0 ? 1.1 : 1 / 1.1);
  }, {passive: false});

  var drag = null;
  pane.addEventListener("mousedown", function (ev) {
    if (ev.target.closest && ev.target.closest(".node")) { return; }
    drag = {x: ev.clientX, y: ev.clientY, l: pane.scrollLeft, t: pane.scrollTop};
    pane.classList.add("panning");
  });
  window.addEventListener("mousemove", function (ev) {
    if (!drag) { return; }
    pane.scrollLeft = drag.l - (ev.clientX - drag.x);
    pane.scrollTop = drag.t - (ev.clientY - drag.y);
  });
  window.addEventListener("mouseup", function () {
    drag = null;
    pane.classList.remove("panning");
  });

  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    if (cls) { e.className = cls; }
    return e;
  }
  function row(body, key, value) {
    var tr = el("tr");
    tr.appendChild(el("td", key));
    var td = el("td");
    if (value instanceof Node) { td.appendChild(value); } else { td.textContent = String(value); }
    tr.appendChild(td);
    body.appendChild(tr);
  }
  function tensors(list) {
    var ul = el("ul");
    list.forEach(function (t) {
      var kind = t.constant ? " (constant)" : "";
      ul.appendChild(el("li", "#" + t.index + " " + t.dtype + "[" + t.shape.join(",") + "]" +
        kind + " " + t.name));
    });
    return ul;
  }
  function placement(o) {
    if (o.where.indexOf("gpu:") === 0) { return "GPU partition " + o.where.slice(4); }
    if (o.where === "cpu") { return "CPU"; }
    return "folded into constants at load";
  }
  function partitionTimes(body, o) {
    var prof = data.profile;
    if (!prof || !prof.matched || o.where.indexOf("gpu:") !== 0) { return; }
    var p = prof.partitions[o.where.slice(4)];
    if (!p) { return; }
    var top = p.kernels.slice().sort(function (a, b) { return b[2] - a[2] || a[0] - b[0]; });
    var ul = el("ul");
    top.slice(0, 5).forEach(function (k) {
      ul.appendChild(el("li", k[2].toFixed(4) + " ms  " + k[1]));
    });
    row(body, "partition time", p.ms.toFixed(3) + " ms in " + p.kernels.length +
      " kernels (a kernel fuses several ops: times are per partition)");
    row(body, "slowest kernels", ul);
  }
  function centre(node) {
    var r = node.getBoundingClientRect();
    var p = pane.getBoundingClientRect();
    pane.scrollTop += r.top + r.height / 2 - (p.top + p.height / 2);
    pane.scrollLeft += r.left + r.width / 2 - (p.left + p.width / 2);
  }
  function showDetails(o) {
    var box = document.getElementById("details");
    box.textContent = "";
    box.appendChild(el("h3", "#" + o.index + " " + o.op));
    var table = el("table");
    var body = el("tbody");
    row(body, "runs", placement(o));
    if (o.reason) { row(body, "why on the CPU", o.reason); }
    partitionTimes(body, o);
    if (o.drawn_with !== null) { row(body, "drawn with", "#" + o.drawn_with); }
    row(body, "version", o.version);
    row(body, "builtin code", o.code);
    if (o.custom_code) { row(body, "custom code", o.custom_code); }
    var opts = Object.keys(o.options);
    if (opts.length) {
      row(body, "options", opts.map(function (k) {
        return k + "=" + JSON.stringify(o.options[k]);
      }).join(", "));
    }
    row(body, "inputs", tensors(o.inputs));
    row(body, "outputs", tensors(o.outputs));
    table.appendChild(body);
    box.appendChild(table);
  }
  function select(index, scroll) {
    var o = ops[index];
    if (!o) { return; }
    Array.prototype.forEach.call(svg.querySelectorAll(".selected, .hl"), function (e) {
      e.classList.remove("selected");
      e.classList.remove("hl");
    });
    var g = document.getElementById("op-" + index);
    var shown = o.drawn_with !== null ? document.getElementById("op-" + o.drawn_with) : g;
    if (g) { g.classList.add("selected"); }
    if (shown) {
      var id = shown.getAttribute("data-op");
      Array.prototype.forEach.call(svg.querySelectorAll(".edge"), function (e) {
        if (e.getAttribute("data-src") === id || e.getAttribute("data-dst") === id) {
          e.classList.add("hl");
        }
      });
      if (scroll) { centre(shown); }
    }
    showDetails(o);
    if (window.history && window.history.replaceState) {
      try { window.history.replaceState(null, "", "#op=" + index); } catch (err) { /* file: */ }
    }
  }
  svg.addEventListener("click", function (ev) {
    var g = ev.target.closest ? ev.target.closest("[data-op]") : null;
    if (g) { select(Number(g.getAttribute("data-op")), false); }
  });
  Array.prototype.forEach.call(document.querySelectorAll("#cpu-ops a"), function (a) {
    a.addEventListener("click", function (ev) {
      ev.preventDefault();
      select(Number(a.getAttribute("data-op")), true);
    });
  });
  Array.prototype.forEach.call(document.querySelectorAll(".legend-item"), function (li) {
    li.addEventListener("click", function () {
      var key = li.getAttribute("data-focus");
      var on = svg.getAttribute("data-focus") !== key;
      Array.prototype.forEach.call(document.querySelectorAll(".legend-item"), function (x) {
        x.classList.remove("active");
      });
      if (on) { svg.setAttribute("data-focus", key); li.classList.add("active"); }
      else { svg.removeAttribute("data-focus"); }
    });
  });
  if (W > pane.clientWidth) { setScale(Math.max(0.5, (pane.clientWidth - 8) / W)); }
  else { setScale(1); }
  // "#op=12" (or the anchor "#op-12") selects op 12 and centres it, once the browser has
  // done its own scrolling to the anchor.
  var m = /^#op[=-](\\d+)$/.exec(window.location.hash);
  if (m) { select(Number(m[1]), false); }
  window.addEventListener("load", function () {
    window.setTimeout(function () {
      if (m) { select(Number(m[1]), true); }
      document.body.setAttribute("data-ready", "1");
    }, 0);
  });
}());
"""


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def _page(
    model: Model, info: Mapping[str, Any], layout: _Layout, prof: dict[str, Any] | None
) -> str:
    css = _CSS + _focus_css(info) + "\n"
    csp = (
        f"default-src 'none'; style-src {_csp_hash(css)}; script-src {_csp_hash(_JS)}; "
        "img-src data:; base-uri 'none'; form-action 'none'"
    )
    data = _json_for_script(_page_data(model, info, layout, prof))
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="generator" content="litekiln {_e(__version__)}">'
        f"<title>{_e(model.name)}: where each op runs (litekiln)</title>"
        f"<style>{css}</style></head>\n<body>"
        f"{_header(model, info)}\n<main>"
        '<section id="graph-pane"><div class="toolbar">'
        '<button id="zoom-out" type="button" title="zoom out">\u2212</button>'
        '<span id="zoom-level">100%</span>'
        '<button id="zoom-in" type="button" title="zoom in">+</button>'
        '<button id="zoom-fit" type="button">fit width</button>'
        '<button id="zoom-reset" type="button">100%</button>'
        '<span class="muted">click an op for its details \u00b7 drag to pan \u00b7 '
        "ctrl+wheel to zoom</span></div>"
        f'<div id="graph">{_svg(model, info, layout)}</div></section>\n'
        '<aside id="panel">'
        f"<h2>Where the ops run</h2>{_legend(info, prof)}"
        '<h2>Selected op</h2><div id="details"><p class="muted">Click an op in the graph.'
        "</p></div>"
        f"<h2>Ops on the CPU, and why</h2>{_cpu_table(info)}"
        f'<h2>Kernel times</h2><div id="profile">{_profile_html(prof)}</div>'
        "</aside></main>\n"
        f'<script type="application/json" id="litekiln-data">{data}</script>\n'
        f"<script>{_JS}</script>\n</body></html>\n"
    )
