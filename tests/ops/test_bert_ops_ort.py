"""com.microsoft Attention, MultiHeadAttention and EmbedLayerNormalization (what
`onnxruntime.transformers` fusions write for BERT- and GPT-style models) against
onnxruntime's CPU kernels, by the differential rule of `test_quant_kernels_ort.differential`:
8 runs, inputs at stable addresses refilled each run, capture on."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from test_quant_kernels_ort import MS, differential, rng_for
from test_quant_kernels_ort import _model as model_of

import workbench

pytest.importorskip("onnxruntime")

B, S, HEADS, H = 2, 5, 4, 8
D = HEADS * H


def _mask_for(kind: str, rng, total: int):
    if kind == "none":
        return None
    if kind == "raw2d":
        m = (rng.random((B, total)) > 0.3).astype(np.int32)
        m[:, 0] = 1
        return m
    if kind == "raw3d":  # position 0 unmasked: no row is masked whole (its softmax is then rounding noise)
        m = (rng.random((B, S, total)) > 0.3).astype(np.int32)
        m[:, :, 0] = 1
        return m
    if kind == "end":
        return rng.integers(1, total + 1, (B,)).astype(np.int32)
    if kind == "start_end":
        end = rng.integers(2, total + 1, (B,))
        return np.concatenate([end, rng.integers(0, 2, (B,))]).astype(np.int32)
    raise AssertionError(kind)


ATTN_CASES = [
    pytest.param(mask, causal, past, bias, id=f"{mask}-causal{causal}-past{past}-bias{bias}")
    for mask in ("none", "raw2d", "raw3d", "end", "start_end")
    for causal in (0, 1)
    for past in (0, 3)
    for bias in (False, True)
    if not (mask == "raw3d" and past)
    if not (past and bias)  # onnxruntime: "Attention cannot have both past and attention_bias"
]


@pytest.mark.parametrize("mask_kind,causal,past_len,with_bias", ATTN_CASES)
def test_attention(mask_kind, causal, past_len, with_bias):
    r = rng_for("attention", mask_kind, causal, past_len, with_bias)
    total = past_len + S
    inits = {"weights": (r.standard_normal((D, 3 * D)) * 0.2).astype(np.float32),
             "bias": (r.standard_normal(3 * D) * 0.1).astype(np.float32)}
    names = ["x", "weights", "bias"]
    feeds = {"x": np.zeros((B, S, D), np.float32)}
    mask0 = _mask_for(mask_kind, r, total)
    names.append("mask" if mask0 is not None else "")
    if mask0 is not None:
        feeds["mask"] = mask0
    names.append("past" if past_len else "")
    if past_len:
        feeds["past"] = np.zeros((2, B, HEADS, past_len, H), np.float32)
    if with_bias:
        names.append("attention_bias")
        feeds["attention_bias"] = np.zeros((1, HEADS, S, total), np.float32)
    while names[-1] == "":
        names.pop()
    outputs = ["y", "present"] if past_len else ["y"]
    node = helper.make_node("Attention", names, outputs, domain=MS, num_heads=HEADS, unidirectional=causal)
    model = model_of([node], feeds, inits, outputs, 17)

    def fill(rng, run):
        out = {"x": rng.standard_normal((B, S, D)).astype(np.float32)}
        if mask0 is not None:
            out["mask"] = _mask_for(mask_kind, rng, total)
        if past_len:
            out["past"] = rng.standard_normal((2, B, HEADS, past_len, H)).astype(np.float32)
        if with_bias:
            out["attention_bias"] = rng.standard_normal((1, HEADS, S, total)).astype(np.float32)
        return out

    differential(model, fill, exact=False, rtol=2e-5)


def test_attention_qkv_hidden_sizes_and_scale():
    r = rng_for("attention_sizes")
    qk, v = 16, 24
    inits = {"weights": (r.standard_normal((D, 2 * qk + v)) * 0.2).astype(np.float32),
             "bias": np.zeros(2 * qk + v, np.float32)}
    node = helper.make_node("Attention", ["x", "weights", "bias"], ["y"], domain=MS, num_heads=2,
                            qkv_hidden_sizes=[qk, qk, v], scale=0.3)
    model = model_of([node], {"x": np.zeros((B, S, D), np.float32)}, inits, ["y"], 17)
    differential(model, lambda rng, run: {"x": rng.standard_normal((B, S, D)).astype(np.float32)},
                 exact=False, rtol=2e-5)


MHA_CASES = [
    pytest.param(layout, mask, causal, past, id=f"{layout}-{mask}-causal{causal}-past{past}")
    for layout in ("separate", "separate_bias", "cross_bnsh")  # packed QKV / KV: not on onnxruntime's CPU
    for mask in ("none", "raw2d")
    for causal in (0, 1)
    for past in (0, 3)
    if not (layout in ("packed_qkv", "cross_bnsh") and past)
    if not (layout == "cross_bnsh" and causal)
]


@pytest.mark.parametrize("layout,mask_kind,causal,past_len", MHA_CASES)
def test_multi_head_attention(layout, mask_kind, causal, past_len):
    r = rng_for("mha", layout, mask_kind, causal, past_len)
    L = S if layout != "cross_bnsh" else 7
    total = past_len + L
    shapes = {"separate": {"query": (B, S, D), "key": (B, L, D), "value": (B, L, D)},
              "separate_bias": {"query": (B, S, D), "key": (B, L, D), "value": (B, L, D)},
              "packed_qkv": {"query": (B, S, HEADS, 3, H)},
              "packed_kv": {"query": (B, S, D), "key": (B, L, HEADS, 2, H)},
              "cross_bnsh": {"query": (B, S, D), "key": (B, HEADS, L, H), "value": (B, HEADS, L, H)}}[layout]
    feeds = {k: np.zeros(v, np.float32) for k, v in shapes.items()}
    names = ["query", "key" if "key" in shapes else "", "value" if "value" in shapes else ""]
    inits = {}
    if layout in ("separate_bias", "packed_qkv", "packed_kv"):
        inits["bias"] = (r.standard_normal(3 * D) * 0.1).astype(np.float32)
        names.append("bias")
    else:
        names.append("")
    mask0 = _mask_for(mask_kind, r, total)
    names.append("mask" if mask0 is not None else "")
    if mask0 is not None:
        feeds["mask"] = mask0
    names.append("")  # attention_bias
    if past_len:
        names += ["past_key", "past_value"]
        feeds["past_key"] = np.zeros((B, HEADS, past_len, H), np.float32)
        feeds["past_value"] = np.zeros((B, HEADS, past_len, H), np.float32)
    while names[-1] == "":
        names.pop()
    outputs = ["y", "present_key", "present_value"] if past_len else ["y"]
    node = helper.make_node("MultiHeadAttention", names, outputs, domain=MS, num_heads=HEADS,
                            unidirectional=causal)
    model = model_of([node], feeds, inits, outputs, 17)

    def fill(rng, run):
        out = {k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()}
        if mask0 is not None:
            out["mask"] = _mask_for(mask_kind, rng, total)
        if past_len:
            for k in ("past_key", "past_value"):
                out[k] = rng.standard_normal((B, HEADS, past_len, H)).astype(np.float32)
        return out

    differential(model, fill, exact=False, rtol=2e-5)


@pytest.mark.parametrize("segments", [False, True])
@pytest.mark.parametrize("mask", [False, True])
@pytest.mark.parametrize("position_ids", [False, True])
def test_embed_layer_normalization(segments, mask, position_ids):
    r = rng_for("embed_ln", segments, mask, position_ids)
    vocab, max_pos, hidden = 30, 16, 24
    inits = {"word": r.standard_normal((vocab, hidden)).astype(np.float32),
             "position": r.standard_normal((max_pos, hidden)).astype(np.float32),
             "gamma": (r.random(hidden) + 0.5).astype(np.float32), "beta": r.standard_normal(hidden).astype(np.float32)}
    feeds = {"ids": np.zeros((B, S), np.int32)}
    names = ["ids", "segment_ids" if segments else "", "word", "position", "segment" if segments else "",
             "gamma", "beta", "mask" if mask else "", "position_ids" if position_ids else ""]
    if segments:
        feeds["segment_ids"] = np.zeros((B, S), np.int32)
        inits["segment"] = r.standard_normal((2, hidden)).astype(np.float32)
    if mask:
        feeds["mask"] = np.zeros((B, S), np.int32)
    if position_ids:
        feeds["position_ids"] = np.zeros((B, S), np.int32)
    while names[-1] == "":
        names.pop()
    outputs = ["y", "mask_index", "embedding_sum"]
    node = helper.make_node("EmbedLayerNormalization", names, outputs, domain=MS, epsilon=1e-5)
    model = model_of([node], feeds, inits, outputs, 17)

    def fill(rng, run):
        out = {"ids": rng.integers(0, vocab, (B, S)).astype(np.int32)}
        if segments:
            out["segment_ids"] = rng.integers(0, 2, (B, S)).astype(np.int32)
        if mask:
            out["mask"] = (rng.random((B, S)) > 0.4).astype(np.int32)
        if position_ids:
            out["position_ids"] = rng.integers(0, max_pos, (B, S)).astype(np.int32)
        return out

    differential(model, fill, exact=False, rtol=2e-5)


def test_embed_layer_normalization_id_out_of_range_names_the_node():
    r = rng_for("embed_bad")
    inits = {"word": r.standard_normal((10, 8)).astype(np.float32), "position": r.standard_normal((8, 8)).astype(np.float32),
             "gamma": np.ones(8, np.float32), "beta": np.zeros(8, np.float32)}
    node = helper.make_node("EmbedLayerNormalization", ["ids", "", "word", "position", "", "gamma", "beta"], ["y"],
                            domain=MS, name="embed_bad")
    model = model_of([node], {"ids": np.zeros((1, 3), np.int32)}, inits, ["y"], 17)
    session = workbench.InferenceSession(model.SerializeToString())
    with pytest.raises(workbench.WorkbenchError, match="embed_bad"):
        session.run(None, {"ids": np.array([[1, 12, 2]], np.int32)})


@pytest.mark.parametrize("packing", ["qkv", "kv"])
def test_multi_head_attention_packed_layouts_equal_the_separate_one(packing):
    """onnxruntime's CPU kernel has no packed QKV [B, S, N, 3, H] / packed KV [B, L, N, 2, H]
    (its CUDA one has): the packed layouts against the separate layout onnxruntime ran."""
    r = rng_for("mha_packed", packing)
    q, k, v = (r.standard_normal((B, S, HEADS, H)).astype(np.float32) for _ in range(3))
    bias = (r.standard_normal(3 * D) * 0.1).astype(np.float32)
    flat = {n: a.reshape(B, S, D) for n, a in (("query", q), ("key", k), ("value", v))}
    separate = model_of([helper.make_node("MultiHeadAttention", ["query", "key", "value", "bias"], ["y"], domain=MS,
                                          num_heads=HEADS)], flat, {"bias": bias}, ["y"], 17)
    want = _peer_run(separate, flat)
    if packing == "qkv":
        feeds = {"query": np.stack([q, k, v], axis=3)}
        names = ["query", "", "", "bias"]
    else:
        feeds = {"query": flat["query"], "key": np.stack([k, v], axis=3)}
        names = ["query", "key", "", "bias"]
    packed = model_of([helper.make_node("MultiHeadAttention", names, ["y"], domain=MS, num_heads=HEADS)],
                      feeds, {"bias": bias}, ["y"], 17)
    (got,) = workbench.InferenceSession(packed.SerializeToString()).run(None, feeds)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def _peer_run(model, feeds):
    import onnxruntime as ort  # noqa: PLC0415

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]
