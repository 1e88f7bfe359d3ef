"""The placement view (``litekiln.view``): the HTML page, in Python and in a real browser, and
the node data for Google's AI Edge Model Explorer.

Pure-Python tests check the layout (layers, no overlaps, determinism), that the page fetches
nothing and escapes every string of the model, the profile overlay and the Model Explorer
format. The browser tests open the page in headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven by selenium: the ``view`` extra) and check that it loads without
a console message, draws the partitions, the CPU ops with their reasons and the folded ops, and
answers a click. They skip, saying what to install, where there is no browser.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import zoo_model
from tflite_builder import ModelBuilder

from litekiln.errors import LitekilnError
from litekiln.model import load_model
from litekiln.model.ir import Model
from litekiln.placement import placement
from litekiln.view import (
    _layout,
    model_explorer_data,
    render_view,
    write_model_explorer_data,
    write_view,
)

ROOT = Path(__file__).resolve().parents[1]
H100_RESULTS = ROOT / "results" / "h100" / "house" / "latency.json"
EVIL = '<img src=x onerror="alert(1)">&amp;</script>'


def _split_model() -> Model:
    """x -> CONV_2D (fp16 weights: a folded DEQUANTIZE) -> RELU -> FLOOR (CPU) -> ADD (conv
    output) -> custom op named EVIL (CPU: unknown) -> LOGISTIC; a tensor is named EVIL too.

    Ops: 0 DEQUANTIZE (folded), 1 CONV_2D, 2 RELU, 3 FLOOR, 4 ADD, 5 EVIL, 6 LOGISTIC; GPU
    partitions {1, 2}, {4} and {6}."""
    b = ModelBuilder()
    x = b.input("x", [1, 6, 6, 3])
    rng = np.random.default_rng(0)
    w16 = b.const("w16", rng.uniform(-1, 1, [4, 3, 3, 3]).astype(np.float16))
    w = b.op("DEQUANTIZE", [w16], out_dtype="float32", version=3)
    c = b.op(
        "CONV_2D",
        [x, w, rng.uniform(-1, 1, [4]).astype(np.float32)],
        out_shape=[1, 6, 6, 4],
        options={"padding": "SAME", "stride_w": 1, "stride_h": 1},
    )
    r = b.op("RELU", [c])
    f = b.op("FLOOR", [r])
    a = b.op("ADD", [f, c], options={"fused_activation_function": "NONE"})
    evil_t = b.tensor(EVIL, [1, 6, 6, 4])
    b.custom_op(EVIL, [a], outputs=[evil_t], custom_options=struct.pack("<i", 1))
    b.output(b.op("LOGISTIC", [evil_t]))
    return load_model(b.build(), name="split_model")


@pytest.fixture(scope="module")
def split() -> tuple[Model, dict[str, Any]]:
    model = _split_model()
    info, _ = placement(model, op_table="documented", max_partitions=8, min_partition_ops=1)
    return model, info


@pytest.fixture(scope="module")
def smoke() -> tuple[Model, dict[str, Any]]:
    model = load_model(Path(__file__).parent / "data" / "smoke.tflite")
    info, _ = placement(model, op_table="documented", min_partition_ops=1)
    return model, info


def _fake_profile(model: Model, info: dict[str, Any], ms: float = 0.01) -> dict[str, Any]:
    launches = [
        {"partition": p["index"], "launch": k, "kernel": f"fused_k{p['index']}_{k}", "ms": ms}
        for p in info["partitions"]
        for k in range(3)
    ]
    rec = {
        "model": model.name,
        "gpu_ops": info["gpu_ops"],
        "cpu_ops": info["cpu_ops"],
        "partitions": len(info["partitions"]),
        "litekiln_ms": 0.5,
        "profile": {"launches": launches},
    }
    return {"device": "Test GPU (OpenCL)", "models": [rec]}


# -- the layout --------------------------------------------------------------------------------


def test_the_split_model_places_as_the_test_expects(split: tuple[Model, dict[str, Any]]) -> None:
    _, info = split
    assert [o["where"] for o in info["ops"]] == [
        "folded",
        "gpu:0",
        "gpu:0",
        "cpu",
        "gpu:1",
        "cpu",
        "gpu:2",
    ]


@pytest.mark.parametrize("which", ["smoke", "split"])
def test_layout_layers_edges_down_and_boxes_apart(
    which: str, request: pytest.FixtureRequest
) -> None:
    model, info = request.getfixturevalue(which)
    lay = _layout(model, info)
    for e in lay.edges:  # every edge points down, through one bend per layer it skips
        src, dst = lay.nodes[e.src], lay.nodes[e.dst]
        assert dst.layer > src.layer
        assert len(e.bends) == dst.layer - src.layer - 1
        assert dst.y > src.y + src.height
    rows: dict[int, list[Any]] = {}
    for n in lay.nodes.values():
        rows.setdefault(n.layer, []).append(n)
    for row in rows.values():  # no two boxes of a layer overlap
        row.sort(key=lambda n: n.x)
        for a, b in zip(row, row[1:], strict=False):
            assert a.x + a.width / 2 <= b.x - b.width / 2 + 1e-6
    assert min(n.x - n.width / 2 for n in lay.nodes.values()) >= 0
    assert max(n.x + n.width / 2 for n in lay.nodes.values()) <= lay.width


def test_folded_ops_are_drawn_beside_the_op_they_feed(split: tuple[Model, dict[str, Any]]) -> None:
    model, info = split
    lay = _layout(model, info)
    assert lay.nodes["op:1"].satellites == [0]
    assert "op:0" not in lay.nodes
    page = render_view(model, info)
    assert page.count('class="node chip folded"') == 1


def test_the_page_is_deterministic(smoke: tuple[Model, dict[str, Any]]) -> None:
    model, info = smoke
    assert render_view(model, info) == render_view(model, info)


# -- the page ----------------------------------------------------------------------------------


def test_the_page_fetches_nothing(smoke: tuple[Model, dict[str, Any]], tmp_path: Path) -> None:
    model, info = smoke
    page = write_view(model, info, tmp_path / "sub" / "view.html").read_text()
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page)
    assert csp and "default-src 'none'" in csp.group(1) and "unsafe" not in csp.group(1)
    # The only URL is the SVG namespace, which names and never loads anything.
    assert re.findall(r"https?://[^\s\"'<>]+", page) == ["http://www.w3.org/2000/svg"]
    assert not re.search(r"<(link|img|iframe|object|embed)\b|(?<![-\w])src=|@import", page)
    assert set(re.findall(r"url\(([^)]*)\)", page)) <= {"#hatch", "#arrow"}


def test_every_model_string_is_escaped(split: tuple[Model, dict[str, Any]]) -> None:
    model, info = split
    page = render_view(model, info)
    assert EVIL not in page
    assert "<img" not in page and page.count("</script>") == 2  # the page's own two
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&amp;amp;&lt;/script&gt;" in page
    data = re.search(r'<script type="application/json" id="litekiln-data">(.*?)</script>', page)
    assert data is not None
    assert EVIL in {o["op"] for o in json.loads(data.group(1))["ops"]}


def test_the_page_shows_partitions_cpu_reasons_and_summary(
    split: tuple[Model, dict[str, Any]],
) -> None:
    model, info = split
    page = render_view(model, info)
    assert 'data-gpu="4" data-cpu="2" data-folded="1" data-partitions="3"' in page
    assert "6 ops: 4 on the GPU in 3 partitions, 2 on the CPU" in page
    for p in range(3):
        assert page.count(f'class="node op gpu p{p}"') == len(
            [o for o in info["ops"] if o["where"] == f"gpu:{p}"]
        )
    assert page.count('class="node op cpu"') == 2
    assert page.count('class="legend-item"') == 3 + 3
    assert re.search(r'id="op-3".*?not in the documented GPU op table', page)
    assert "not supported by litekiln" in page


# -- the profile -------------------------------------------------------------------------------


def test_profile_times_join_their_partitions(split: tuple[Model, dict[str, Any]]) -> None:
    model, info = split
    page = render_view(model, info, profile=_fake_profile(model, info))
    assert page.count("0.030 ms in 3 kernels") == 3  # the legend
    assert page.count("0.030 ms, 3 kernels") == 3  # the profile section
    assert "Test GPU (OpenCL): 0.090 ms of kernel time" in page
    assert "(the whole model: 0.5 ms per inference)" in page
    assert 'class="warning"' not in page


def test_profile_takes_the_kernels_own_times_in_the_graph(
    split: tuple[Model, dict[str, Any]],
) -> None:
    """A bench that traced the CUDA graph (`graph_ms` on every launch): the view shows the
    kernels' own times there, not the events' (which count each launch's overhead)."""
    model, info = split
    prof = _fake_profile(model, info)
    for la in prof["models"][0]["profile"]["launches"]:
        la["graph_ms"] = 0.002
    page = render_view(model, info, profile=prof)
    assert page.count("0.006 ms, 3 kernels") == 3
    assert "0.018 ms of kernel time, the sum of each launch's median inside the replayed" in page
    prof["models"][0]["profile"]["launches"][0].pop("graph_ms")  # not every launch traced
    page = render_view(model, info, profile=prof)
    assert "0.090 ms of kernel time" in page and "OpenCL profiling events" in page


def test_a_profile_of_another_placement_is_listed_not_matched(
    split: tuple[Model, dict[str, Any]],
) -> None:
    model, info = split
    prof = _fake_profile(model, info)
    prof["models"][0]["gpu_ops"] = 5
    page = render_view(model, info, profile=prof)
    assert "measured under another placement" in page
    assert '<span class="count">2 ops</span>' in page  # the legend has no times


def test_profile_errors_name_the_problem(
    split: tuple[Model, dict[str, Any]], tmp_path: Path
) -> None:
    model, info = split
    with pytest.raises(LitekilnError, match="no record of model 'split_model'"):
        render_view(model, info, profile={"models": [{"model": "other"}]})
    with pytest.raises(LitekilnError, match="has no kernel profile"):
        render_view(model, info, profile={"models": [{"model": "split_model", "profile": None}]})
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(LitekilnError, match="cannot read the profile"):
        render_view(model, info, profile=tmp_path / "bad.json")


@pytest.mark.zoo
def test_the_h100_profile_of_a_zoo_model() -> None:
    """The committed H100 run measured face_detection_full_range_sparse in one partition (the
    extended op table): drawn with the same options, every kernel lands on it."""
    model = load_model(zoo_model("face_detection_full_range_sparse"))
    info, _ = placement(model, op_table="extended")
    results = json.loads(H100_RESULTS.read_text())
    (rec,) = [r for r in results["models"] if r["model"] == model.name]
    page = render_view(model, info, profile=H100_RESULTS)
    n = len(rec["profile"]["launches"])
    ms = sum(la["ms"] for la in rec["profile"]["launches"])
    assert f"{ms:.3f} ms, {n} kernels" in page
    assert "NVIDIA H100" in page and 'class="warning"' not in page


# -- Model Explorer ----------------------------------------------------------------------------


def test_model_explorer_node_data(split: tuple[Model, dict[str, Any]], tmp_path: Path) -> None:
    """Model Explorer's ModelNodeData: {graph id: {results: {node id: {value, bgColor}}}};
    its TFLite adapter names an op node by the op's index and the primary graph by its name,
    else the signature key, else "main"."""
    model, info = split
    path = write_model_explorer_data(model, info, tmp_path / "me" / "placement.json")
    data = json.loads(path.read_text())
    assert list(data) == ["main"]
    graph = data["main"]
    assert set(graph) == {
        "name",
        "results",
        "showExpandedSummaryOnGroupNode",
        "showLabelCountColumnsInChildrenStatsTable",
    }
    assert sorted(graph["results"], key=int) == [str(i) for i in range(7)]
    values = {k: r["value"] for k, r in graph["results"].items()}
    assert values["0"] == "folded at load"
    assert values["1"] == values["2"] == "GPU partition 0"
    assert values["3"] == "CPU: not in the documented GPU op table (op_table='documented')"
    assert values["5"] == "CPU: not supported by litekiln"
    for r in graph["results"].values():
        assert set(r) == {"value", "bgColor"} and re.fullmatch(r"#[0-9a-f]{6}", r["bgColor"])


def test_model_explorer_graph_id_follows_the_file(smoke: tuple[Model, dict[str, Any]]) -> None:
    model, info = smoke
    assert list(model_explorer_data(model, info)) == [model.main.name or "serving_default"]


@pytest.mark.parametrize("name", ["smoke", "face_detection_full_range_sparse"])
def test_model_explorer_reads_the_node_data(name: str) -> None:
    """With ``ai-edge-model-explorer`` installed (optional: its adapter is ~500 MB): the data
    rebuilds through its own dataclasses unchanged (they add only defaults), and its TFLite
    adapter's graph of the same file has that graph id and a node for every key, labelled
    with the op's name (folded ops included)."""
    adapter = pytest.importorskip("ai_edge_model_explorer_adapter")
    builder = pytest.importorskip("model_explorer.node_data_builder")
    path = zoo_model(name)
    model = load_model(path)
    info, _ = placement(model, op_table="documented", min_partition_ops=1)
    data = model_explorer_data(model, info)
    rebuilt = builder.ModelNodeData(
        graphsData={
            gid: builder.GraphNodeData(
                **{
                    **g,
                    "results": {k: builder.NodeDataResult(**r) for k, r in g["results"].items()},
                }
            )
            for gid, g in data.items()
        }
    )
    written = json.loads(rebuilt.to_json_string())  # ours, plus the builder's defaults
    assert {gid: {k: g[k] for k in data[gid]} for gid, g in written.items()} == data
    converted = adapter.ConvertFlatbufferDirectlyToJson(adapter.VisualizeConfig(), str(path))
    subgraphs = {sg["id"]: sg for sg in json.loads(converted)[0]["subgraphs"]}
    ((gid, g),) = data.items()
    labels = {n["id"]: n["label"] for n in subgraphs[gid]["nodes"]}
    for key in g["results"]:
        o = info["ops"][int(key)]
        assert labels[key] == (o["custom_code"] or o["op"].lower())


# -- in a real browser -------------------------------------------------------------------------


def _browser_or_skip() -> Any:
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.skip("no headless browser: apt-get install chromium chromium-driver")
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium is not installed: pip install -e '.[view]'"
    )
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(arg)
    opts.add_argument("--window-size=1400,900")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    driver = _browser_or_skip()
    try:
        yield driver
    finally:
        driver.quit()


def _open(browser: Any, page: Path, fragment: str = "") -> None:
    from selenium.webdriver.support.wait import WebDriverWait

    browser.get_log("browser")  # drop what an earlier page logged
    browser.get(page.resolve().as_uri() + fragment)
    WebDriverWait(browser, 10).until(
        lambda b: b.execute_script("return document.body.getAttribute('data-ready')") == "1"
    )
    messages = browser.get_log("browser")
    assert messages == [], f"console: {messages}"
    fetched = browser.execute_script("return performance.getEntriesByType('resource').length")
    assert fetched == 0


def _count(browser: Any, css: str) -> int:
    return int(browser.execute_script(f"return document.querySelectorAll({css!r}).length"))


def test_browser_smoke_model(
    browser: Any, smoke: tuple[Model, dict[str, Any]], tmp_path: Path
) -> None:
    model, info = smoke
    _open(browser, write_view(model, info, tmp_path / "smoke.html"))
    assert _count(browser, "#graph-svg .node.op.gpu.p0") == 12
    assert _count(browser, "#legend .legend-item") == 1 + 3
    # The boxes are laid out and drawn (a size only a rendering engine gives).
    w = browser.execute_script("return document.getElementById('op-3').getBBox().width")
    assert w > 50
    browser.find_element("css selector", "#op-3 rect").click()
    details = browser.find_element("id", "details").text
    assert "#3 ADD" in details and "GPU partition 0" in details
    assert _count(browser, ".edge.hl") == 3  # two inputs, one consumer
    assert browser.get_log("browser") == []


def test_browser_split_model(
    browser: Any, split: tuple[Model, dict[str, Any]], tmp_path: Path
) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    model, info = split
    _open(browser, write_view(model, info, tmp_path / "split.html"))
    assert _count(browser, "#graph-svg .node.op.gpu") == 4
    assert _count(browser, "#graph-svg .node.op.cpu") == 2
    assert _count(browser, "#graph-svg .node.chip.folded") == 1
    assert _count(browser, "#legend .legend-item") == 3 + 3
    fills = browser.execute_script(
        "return [0, 1, 2].map(p => getComputedStyle("
        "document.querySelector('.node.p' + p + ' rect')).fill)"
    )
    assert len(set(fills)) == 3, fills  # one colour per partition
    cpu_fill = browser.execute_script(
        "return getComputedStyle(document.querySelector('.node.cpu rect')).fill"
    )
    assert cpu_fill not in fills
    # The CPU op's reason is on its box, and in the panel.
    assert "not in the documented GPU op table" in browser.find_element("id", "op-3").text
    panel = browser.find_element("id", "cpu-ops").text
    assert "#3 FLOOR not in the documented GPU op table" in panel
    assert "not supported by litekiln" in panel
    # The model's hostile strings are text, never markup.
    assert _count(browser, "img") == 0
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 - reading it is the check
    browser.find_element("css selector", '#cpu-ops a[data-op="5"]').click()
    details = browser.find_element("id", "details").text
    assert EVIL in details and "not supported by litekiln" in details
    assert browser.execute_script("return location.hash") == "#op=5"
    # Legend focus dims the other partitions.
    browser.find_element("css selector", '.legend-item[data-focus="p1"]').click()
    opacity = browser.execute_script(
        "return [getComputedStyle(document.getElementById('op-4')).opacity,"
        " getComputedStyle(document.getElementById('op-1')).opacity]"
    )
    assert opacity == ["1", "0.15"]
    assert browser.get_log("browser") == []


@pytest.mark.zoo
def test_browser_zoo_model_with_profile(browser: Any, tmp_path: Path) -> None:
    """A real MediaPipe model (388 ops, 228 of them folded) with the H100 profile; opening it
    at an op's fragment selects and centres that op."""
    model = load_model(zoo_model("face_detection_full_range_sparse"))
    info, _ = placement(model, op_table="documented", min_partition_ops=1)
    page = write_view(model, info, tmp_path / "fd.html")
    _open(browser, page, "#op-377")
    assert _count(browser, "#graph-svg .node.op.gpu.p0") == 156
    assert _count(browser, "#graph-svg .node.op.gpu.p1") == 2
    assert _count(browser, "#graph-svg .node.op.cpu") == 2
    assert _count(browser, "#graph-svg .node.folded") == 228
    assert "#377 DEPTH_TO_SPACE" in browser.find_element("id", "details").text
    box = browser.execute_script(
        "var r = document.getElementById('op-377').getBoundingClientRect();"
        "var p = document.getElementById('graph').getBoundingClientRect();"
        "return [r.top >= p.top, r.bottom <= p.bottom]"
    )
    assert box == [True, True]  # scrolled into view
    info_ext, _ = placement(model, op_table="extended")
    _open(browser, write_view(model, info_ext, tmp_path / "fdp.html", profile=H100_RESULTS))
    assert "NVIDIA H100" in browser.find_element("id", "profile").text
    assert browser.get_log("browser") == []
