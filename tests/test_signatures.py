"""Models with several entry points, and STABLEHLO_COMPOSITE: what litert-torch's generative
models are made of.

litert-torch exports a language model as one file with two signatures on two subgraphs,
``prefill`` (subgraph 0: the prompt's tokens written into the KV cache) and ``decode``
(subgraph 1: one token at a position), each attention a STABLEHLO_COMPOSITE
(``odml.scaled_dot_product_attention``) whose decomposition subgraph LiteRT runs. The test
model here is that shape, small and built by hand: each signature writes its keys into the
cache with DYNAMIC_UPDATE_SLICE (prefill at a constant start, decode at the position it is
given) and attends over the whole cache through a composite; the two composites call
decomposition subgraphs of their own shapes (4 query rows in prefill, 1 in decode).

Each signature must match LiteRT's runner of the same signature, on the numpy reference
and on the GPU path (PoCL), whole on the GPU (decode's cache write at its run-time position
included: `OpDef.runtime_indices`); a
LiteRT-style script that runs prefill, then decode steps that feed the cache back, must
print what it prints with LiteRT. `litekiln compile` stores both signatures' subgraphs
(the decode entry's token is the model's with ``#1``) and `cache info MODEL` lists both.
The composite's rules (stablehlo_composite.cc) are checked on models made wrong.
litert-torch's own composite, ``odml.scaled_dot_product_attention``, is computed from its
inputs and attributes as LiteRT's XNNPACK computes it (multi-head, grouped and multi-query,
masked, logit-capped), not from its decomposition (`litekiln.ops.sdpa`: the converter's
decomposition of a multi-query attention is wrong).

Tolerance: ``1e-4`` of the output's range (fp32 on both sides).
"""

from __future__ import annotations

import functools
import json
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tflite_builder import ModelBuilder

import litekiln
from litekiln.errors import ModelValidationError
from litekiln.model import load_model

TOL = 1e-4
ATTRIBUTES = (
    b"scale\x00\x01\x07\x01\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00?\x0e\x05&\x01"
)
D, ROWS, PROMPT = 8, 6, 4  # features, cache rows, prompt tokens


def _attention(b: ModelBuilder, queries: int, name: str) -> int:
    """A decomposition subgraph: softmax(q k^T / sqrt(D)) v, q [1, queries, D], k and v
    [1, ROWS, D]; returns its index."""
    sg = b.subgraph(name)
    q = sg.input("q", [1, queries, D])
    k = sg.input("k", [1, ROWS, D])
    v = sg.input("v", [1, ROWS, D])
    scores = sg.op("BATCH_MATMUL", [q, k], out_shape=[1, queries, ROWS], options={"adj_y": True})
    scaled = sg.op("MUL", [scores, np.full([1], 1 / np.sqrt(D), np.float32)])
    probs = sg.op("SOFTMAX", [scaled], options={"beta": 1.0})
    sg.output(sg.op("BATCH_MATMUL", [probs, v], out_shape=[1, queries, D]))
    return int(sg.index)


def _composite(
    sg: Any, inputs: list[Any], queries: int, index: int, attributes: bytes | None
) -> Any:
    return sg.op(
        "STABLEHLO_COMPOSITE",
        inputs,
        out_shape=[1, queries, D],
        options={
            # (not litert-torch's "odml.scaled_dot_product_attention": LiteRT's XNNPACK
            # runs that one with a kernel of its own, for 4-D queries only)
            "name": "litekiln.test.attention",
            "decomposition_subgraph_index": index,
            # (a flexbuffer map, as litert-torch writes it: {"scale": 0.5}; opaque to both)
            **({} if attributes is None else {"composite_attributes": list(attributes)}),
            "version": 0,
        },
    )


def _llm(
    *,
    mutate: Callable[[ModelBuilder, dict[str, Any]], None] | None = None,
    attributes: bytes | None = ATTRIBUTES,
) -> bytes:
    """The two-signature model (module docstring); ``mutate`` may change the built parts
    (``prefill_attn``, ``decode_attn``: decomposition indices) before the signatures."""
    rng = np.random.default_rng(0)
    w_k = rng.uniform(-0.5, 0.5, [D, D]).astype(np.float32)
    w_q = rng.uniform(-0.5, 0.5, [D, D]).astype(np.float32)
    b = ModelBuilder()
    prefill, decode = b.main, b.subgraph("decode")
    parts: dict[str, Any] = {}

    def step(sg: Any, n: int, attn: int, start: Any) -> dict[str, Any]:
        x = sg.input("x", [1, n, D])
        cache = sg.input("cache", [1, ROWS, D])
        keys = sg.op("FULLY_CONNECTED", [x, sg.const("w_k", w_k), None],
                     out_shape=[1, n, D], options={"keep_num_dims": True})  # fmt: skip
        query = sg.op("FULLY_CONNECTED", [x, sg.const("w_q", w_q), None],
                      out_shape=[1, n, D], options={"keep_num_dims": True})  # fmt: skip
        new_cache = sg.op("DYNAMIC_UPDATE_SLICE", [cache, keys, start])
        y = _composite(sg, [query, new_cache, new_cache], n, attn, attributes)
        sg.output(y, new_cache)
        return {"x": x, "cache": cache, "y": y, "new_cache": new_cache}

    parts["prefill_attn"] = _attention(b, PROMPT, "attention_prefill")
    parts["decode_attn"] = _attention(b, 1, "attention_decode")
    if mutate is not None:
        mutate(b, parts)
    p = step(prefill, PROMPT, parts["prefill_attn"], np.zeros([3], np.int32))
    pos = decode.input("pos", [3], "int32")
    d = step(decode, 1, parts["decode_attn"], pos)
    b.signature("prefill", {"x": p["x"], "cache": p["cache"]},
                {"y": p["y"], "cache": p["new_cache"]}, subgraph=0)  # fmt: skip
    b.signature("decode", {"x": d["x"], "cache": d["cache"], "pos": pos},
                {"y": d["y"], "cache": d["new_cache"]}, subgraph=1)  # fmt: skip
    return b.build()


@functools.cache
def _model() -> bytes:
    return _llm()


def _feeds(key: str, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = PROMPT if key == "prefill" else 1
    feeds = {
        "x": rng.uniform(-1, 1, [1, n, D]).astype(np.float32),
        "cache": rng.uniform(-1, 1, [1, ROWS, D]).astype(np.float32),
    }
    if key == "decode":
        feeds["pos"] = np.array([0, PROMPT + seed % 2, 0], np.int32)
    return feeds


def _litert(model: bytes, key: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from ai_edge_litert.interpreter import Interpreter

    return Interpreter(model_content=model).get_signature_runner(key)(**feeds)


def _assert_close(got: dict[str, np.ndarray], want: dict[str, np.ndarray], what: str) -> None:
    assert sorted(got) == sorted(want), what
    for name, w in want.items():
        assert got[name].shape == w.shape, f"{what} {name}"
        err = float(np.max(np.abs(got[name] - w))) / max(1.0, float(np.max(np.abs(w))))
        assert err <= TOL, f"{what} {name}: error {err:.2e}"


@pytest.mark.parametrize("key", ["prefill", "decode"])
def test_each_signature_matches_litert_on_the_reference(key: str) -> None:
    model = _model()
    it = litekiln.Interpreter(model_content=model, device="reference")
    for seed in (0, 1):
        feeds = _feeds(key, seed)
        got = it.get_signature_runner(key)(**feeds)
        _assert_close(got, _litert(model, key, feeds), f"{key} seed {seed} (reference)")


@pytest.mark.opencl
@pytest.mark.parametrize("key", ["prefill", "decode"])
def test_each_signature_matches_litert_with_its_attention_on_the_gpu(key: str) -> None:
    model = _model()
    it = litekiln.Interpreter(model_content=model, use_cache=False)
    runner = it.get_signature_runner(key)
    feeds = _feeds(key, 1)
    _assert_close(runner(**feeds), _litert(model, key, feeds), f"{key} (GPU path)")
    entry = it.for_signature(key)
    assert (entry is it) == (key == "prefill")
    compiled = entry._backend.compiled  # noqa: SLF001 - what the session really runs
    live = {op.name for op in entry.model.main.live_ops()}
    assert "STABLEHLO_COMPOSITE" not in live, "the composite was not inlined"
    assert {"BATCH_MATMUL", "SOFTMAX", "DYNAMIC_UPDATE_SLICE"} <= live
    # (decode's cache write at its run-time position too: an int32 input of the partition)
    assert compiled.cpu_reasons == {} and compiled.steps == [("gpu", 0)], compiled.cpu_reasons


DECODE_LOOP = """
interpreter = Interpreter(model_path=MODEL)
print(sorted(interpreter.get_signature_list()))
prefill = interpreter.get_signature_runner("prefill")
decode = interpreter.get_signature_runner("decode")
for name, d in sorted(decode.get_input_details().items()):
    print("decode in", name, d["shape"].tolist(), d["dtype"].__name__)
rng = np.random.default_rng(3)
cache = np.zeros((1, 6, 8), np.float32)
out = prefill(x=rng.uniform(-1, 1, (1, 4, 8)).astype(np.float32), cache=cache)
cache = out["cache"]
print("prefill", np.round(out["y"], 3).tolist())
for step in range(4, 6):
    x = rng.uniform(-1, 1, (1, 1, 8)).astype(np.float32)
    out = decode(x=x, cache=cache, pos=np.array([0, step, 0], np.int32))
    cache = out["cache"]
    print("decode", step, np.round(out["y"], 3).tolist())
print("cache", np.round(cache, 3).tolist())
try:
    interpreter.get_signature_runner("generate")
except ValueError:
    print("unknown signature refused")
"""


@pytest.mark.opencl
def test_a_decode_loop_prints_what_it_prints_with_litert(tmp_path: Path) -> None:
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    path = tmp_path / "llm.tflite"
    path.write_bytes(_model())

    def run(interpreter: Any) -> list[str]:
        lines: list[str] = []
        glob = {"Interpreter": interpreter, "MODEL": str(path), "np": np,
                "print": lambda *a: lines.append(" ".join(map(str, a)))}  # fmt: skip
        exec(textwrap.dedent(DECODE_LOOP), glob)  # noqa: S102 - the test's own script
        return lines

    cache = tmp_path / "cache"
    ours = run(functools.partial(litekiln.Interpreter, cache_dir=cache))
    assert ours == run(LiteRT)
    assert "unknown signature refused" in ours


@pytest.mark.opencl
def test_a_decode_loop_with_its_cache_carried_on_the_device_matches_litert(
    tmp_path: Path,
) -> None:
    """``carry_signature_state``: the decode step's cache output fed back into its cache
    input on the device; the runner then takes the step without the cache (given, it sets
    it: here prefill's), and each step gives what LiteRT gives with the cache copied by hand."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    model = _model()
    lit = LiteRT(model_content=model)
    it = litekiln.Interpreter(model_content=model, cache_dir=tmp_path)
    assert it.carry_signature_state("decode") == ["cache"]
    ours = {k: it.get_signature_runner(k) for k in ("prefill", "decode")}
    theirs = {k: lit.get_signature_runner(k) for k in ("prefill", "decode")}
    rng = np.random.default_rng(5)
    feeds = _feeds("prefill", 0)
    got, want = ours["prefill"](**feeds), theirs["prefill"](**feeds)
    _assert_close(got, want, "prefill")
    cache = want["cache"]
    for step in range(PROMPT, ROWS):
        x = rng.uniform(-1, 1, [1, 1, D]).astype(np.float32)
        pos = np.array([0, step, 0], np.int32)
        first = {"cache": got["cache"]} if step == PROMPT else {}
        got = ours["decode"](x=x, pos=pos, **first)
        want = theirs["decode"](x=x, pos=pos, cache=cache)
        cache = want["cache"]
        _assert_close(got, want, f"decode step {step}, its cache carried")
    with pytest.raises(ValueError, match=r"missing \['x'\]"):
        ours["decode"](pos=np.zeros([3], np.int32))


@pytest.mark.opencl
def test_compile_stores_every_signature_and_cache_info_lists_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from litekiln.cli.main import main
    from litekiln.model import model_token

    monkeypatch.setenv("LITEKILN_MIN_PARTITION_OPS", "1")  # (kernels in both entries)

    path = tmp_path / "llm.tflite"
    path.write_bytes(_model())
    cache = tmp_path / "cache"
    token = model_token(path.read_bytes())
    assert main(["compile", str(path), "--cache-dir", str(cache), "--json"]) == 0
    (first,) = json.loads(capsys.readouterr().out)
    assert (first["token"], first["subgraph"], first["cached"]) == (token, 0, False)
    (entry,) = first["entries"]
    assert (entry["token"], entry["subgraph"], entry["name"]) == (f"{token}#1", 1, "llm:decode")
    assert entry["cached"] is False and entry["kernels"] > 0
    assert main(["compile", str(path), "--cache-dir", str(cache)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all("already cached" in line for line in lines), lines
    assert "[llm:decode]" in lines[1] and f"token {token}#1" in lines[1]
    assert main(["cache", "info", str(path), "--cache-dir", str(cache), "--json"]) == 0
    tokens = sorted(i["token"] for i in json.loads(capsys.readouterr().out))
    assert tokens == [token, f"{token}#1"]
    # An app's decode runner finds its entry: nothing is compiled again.
    it = litekiln.Interpreter(model_path=path, cache_dir=cache)
    decode = it.for_signature("decode")
    decode.allocate_tensors()
    assert decode._backend.startup["model_cached"] is True  # noqa: SLF001


def test_the_cli_runs_and_inspects_a_signature_and_names_a_wrong_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from litekiln.cli.main import main

    path = tmp_path / "llm.tflite"
    path.write_bytes(_model())
    assert main(["inspect", str(path), "--signature", "decode", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["token"].endswith("#1")
    assert [i["shape"] for i in info["inputs"]] == [[3], [1, 1, D], [1, ROWS, D]]
    assert main(["run", str(path), "--signature", "decode", "--device", "reference"]) == 0
    assert "[1, 1, 8] float32" in capsys.readouterr().out
    assert main(["run", str(path), "--signature", "generate", "--device", "reference"]) != 0
    err = capsys.readouterr().err
    assert "'generate'" in err and "'decode'" in err and "Traceback" not in err


def _bad_arity(b: ModelBuilder, parts: dict[str, Any]) -> None:
    sg = b.subgraphs[parts["prefill_attn"]]
    sg.output(sg.input("extra", [1]))


def _bad_index(b: ModelBuilder, parts: dict[str, Any]) -> None:
    parts["prefill_attn"] = 9


def _bad_shape(b: ModelBuilder, parts: dict[str, Any]) -> None:
    parts["prefill_attn"] = parts["decode_attn"]  # 1 query row for prefill's 4


@pytest.mark.parametrize(
    ("mutate", "rule"),
    [
        (_bad_arity, "subgraph-arity"),
        (_bad_index, "subgraph-index"),
        (_bad_shape, "subgraph-shape"),
    ],
)
def test_the_loader_checks_composites_as_litert_does(
    mutate: Callable[[ModelBuilder, dict[str, Any]], None], rule: str
) -> None:
    with pytest.raises(ModelValidationError) as err:
        load_model(_llm(mutate=mutate))
    assert err.value.rule == rule, str(err.value)
    assert err.value.op_name == "STABLEHLO_COMPOSITE", str(err.value)


# -- litert-torch's attention composite -------------------------------------------------------


def _sdpa_model(groups: int, *, mask: bool, cap: float | None, scale: float | None) -> bytes:
    """q [1, 3, 4, 8], k and v [1, 6, groups, 8] -> odml.scaled_dot_product_attention, whose
    decomposition is deliberately wrong (2 q): LiteRT's XNNPACK and litekiln compute the
    attention from the inputs and attributes, never from the decomposition."""
    from flatbuffers import flexbuffers

    t, n, h, s = 3, 4, 8, 6
    b = ModelBuilder()
    q = b.input("q", [1, t, n, h])
    k = b.input("k", [1, s, groups, h])
    v = b.input("v", [1, s, groups, h])
    inputs = [q, k, v]
    if mask:
        causal = np.triu(np.full([t, s], -1e9, np.float32), 1 + s - t)[None, None]
        inputs.append(b.const("mask", causal))
    dec = b.subgraph("wrong_decomposition")
    dq = dec.input("q", [1, t, n, h])
    for name in ["k", "v", "mask"][: len(inputs) - 1]:
        shape = [1, 1, t, s] if name == "mask" else [1, s, groups, h]
        dec.input(name, shape)
    dec.output(dec.op("MUL", [dq, np.full([1], 2, np.float32)]))
    # (float32 values, as litert-torch writes them: XNNPACK reads them through a float
    # pointer, and a 64-bit value, which flexbuffers picks for 0.3, reads as another number)
    fbb = flexbuffers.Builder()
    with fbb.Map():
        for key, value in (("scale", scale), ("logit_cap", cap)):
            if value is not None:
                fbb.Key(key)
                fbb.Float(value, 4)
    y = b.op(
        "STABLEHLO_COMPOSITE",
        inputs,
        out_shape=[1, t, n, h],
        options={
            "name": "odml.scaled_dot_product_attention",
            "decomposition_subgraph_index": dec.index,
            "composite_attributes": list(fbb.Finish()),
            "version": 0,
        },
    )
    b.output(y)
    return b.build()


def _sdpa_numpy(q, k, v, mask, scale, cap):
    n, g = q.shape[2], k.shape[2]
    kk = np.repeat(k, n // g, axis=2).transpose(0, 2, 1, 3)
    vv = np.repeat(v, n // g, axis=2).transpose(0, 2, 1, 3)
    logits = (q * scale).transpose(0, 2, 1, 3) @ kk.transpose(0, 1, 3, 2)
    if cap is not None:
        logits = cap * np.tanh(logits / cap)
    if mask is not None:
        logits = logits + mask
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return ((e / e.sum(-1, keepdims=True)) @ vv).transpose(0, 2, 1, 3)


@pytest.mark.parametrize(
    ("groups", "mask", "cap", "scale"),
    [(4, True, None, 0.125), (2, True, 30.0, None), (1, True, None, 0.3), (1, False, 5.0, None)],
    ids=["multi-head", "grouped-capped", "multi-query", "multi-query-unmasked"],
)
def test_the_attention_composite_is_computed_as_litert_computes_it(
    groups: int, mask: bool, cap: float | None, scale: float | None
) -> None:
    from oplib import run_litert

    model = _sdpa_model(groups, mask=mask, cap=cap, scale=scale)
    rng = np.random.default_rng(groups)
    feeds = [
        rng.uniform(-1, 1, s).astype(np.float32) for s in ([1, 3, 4, 8], *[[1, 6, groups, 8]] * 2)
    ]
    (want,) = run_litert(model, feeds, resolver="AUTO")  # (XNNPACK: its attention kernel)
    causal = np.triu(np.full([3, 6], -1e9, np.float32), 4)[None, None] if mask else None
    expected = _sdpa_numpy(*feeds, causal, scale or 1 / np.sqrt(8), cap)
    assert np.abs(want - expected).max() < 1e-5, "LiteRT ran the decomposition, not its kernel"
    from litekiln.loading import open_model

    loaded = open_model(model, checks=True)
    assert "STABLEHLO_COMPOSITE" not in loaded.op_histogram()
    assert loaded.op_histogram()["BATCH_MATMUL"] == 2
    got = litekiln.Interpreter(model_content=model, device="reference").run(feeds)[0]
    assert np.abs(got - want).max() < 1e-5
