"""Symbolic dims written as expressions (`s53 + s70`, torch dynamo's style) resolve
once their names are bound; the memo and capture see the names inside them."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import workbench
from workbench import Generator, SessionOptions, models
from workbench.executor.memo import shape_mentions
from workbench.executor.shapes import evaluate, expression_terms, resolve, symbols_in


@pytest.mark.parametrize("dim, terms", [
    ("s53 + s70", ((1, "s53", 1), (1, "s70", 1))),
    ("2*s0 - 1", ((1, 2, "s0"), (-1, 1, 1))),
    ("past.len + 1", ((1, "past.len", 1), (1, 1, 1))),
    ("16", ((1, 16, 1),)),
])
def test_expressions_parse_into_terms(dim, terms):
    assert expression_terms(dim) == terms


@pytest.mark.parametrize("dim", ["s0", "batch_size", "floor(s0/2)", "s0 +", "s0 ** 2", "__import__('os')"])
def test_names_and_anything_else_are_not_expressions(dim):
    assert expression_terms(dim) is None
    assert evaluate(dim, {"s0": 4}) is None


def test_resolution_needs_every_name_bound():
    assert resolve(("s53 + s70", 16), {"s53": 7, "s70": 1}) == (8, 16)
    assert resolve(("s53 + s70", 16), {"s53": 7}) is None
    assert resolve(("s0 - 5",), {"s0": 2}) is None, "a negative size is no size"
    assert symbols_in("s53 + s70") == {"s53", "s70"} and symbols_in("s0") == {"s0"}
    assert shape_mentions(("s0", "s53 + s70"), frozenset({"s53"}))
    assert not shape_mentions(("s0", "s53 + s70"), frozenset({"s1"}))


def test_transformers_export_decodes_token_exact_with_its_presents_preallocated(tmp_path):
    folder = models.transformers_export(tmp_path / "tf")
    prefill = workbench.InferenceSession(str(folder / "prefill.onnx"))
    decode = workbench.InferenceSession(str(folder / "decode.onnx"),
                                        SessionOptions(shadow="raise", decode_memo_verify=False))
    so = ort.SessionOptions()
    so.log_severity_level = 3
    peer = [ort.InferenceSession(str(folder / f), so, providers=["CPUExecutionProvider"])
            for f in ("prefill.onnx", "decode.onnx")]
    prompt = list(range(3, 11))
    got = Generator(decode, prefill=prefill).generate(prompt, 20, progress=False, eos_token_id=-1,
                                                     return_logits=True, kv="growing")
    want = Generator(peer[1], prefill=peer[0]).generate(prompt, 20, progress=False, eos_token_id=-1,
                                                       return_logits=True, kv="growing")
    assert got.tokens == want.tokens
    for a, b in zip(got.logits, want.logits):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)
    graph = decode.graph
    presents = [v for v in graph.values if v.name.startswith("output.cache.")]
    assert presents and all(isinstance(v.shape[2], str) and "+" in v.shape[2] for v in presents)
    shapes = decode.executor.state.shapes
    assert all(shapes[v.id] is not None for v in presents), "expression dims resolve before the kernels run"
    declines = decode.recording.capture_declines()
    present_declines = declines[declines.detail.str.contains("output.cache", regex=False)]
    assert set(present_declines.reason) <= {"growing_symbol"}, "presents grow: a seam for that reason only"
    memo = decode.recording.memo_timeline()
    assert (memo.action == "replayed").sum() >= 10
