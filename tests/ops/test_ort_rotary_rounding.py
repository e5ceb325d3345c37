"""Rotary embedding rounds as onnxruntime's CPU kernel does, bit for bit (float32), where
the plan asks for onnxruntime's rounding.

onnxruntime rotates through MLAS's kernel (``MlasRotaryEmbedOneRow``): ``fma(x1, cos,
-(x2 * sin))`` and ``fma(x1, sin, x2 * cos)``, interleaved pairs or halves alike. The
rotated K rows are what the KV cache keeps, and a MatMulNBits at accuracy_level 4
downstream requantizes activations per block, so one ulp here becomes another int8
value there (SmolLM2's genai int4 export: its first layer's present key differed from
onnxruntime's in 496 of 3072 values before). Each test runs 6+ times with inputs at
stable addresses and new contents, against onnxruntime: equal, not close. Where MLAS's
kernels are not x86-64 ones (`mlas_isa.isa()` "none"), within the old tolerance.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from oracles import tensor

import workbench
from workbench import SessionOptions
from workbench.ops import mlas_isa
from workbench.ops.ort_float32 import rotate_pair

RUNS = 7
OPSET = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
HEADS, HEAD, MAX_POS = 6, 64, 64
EXACT = mlas_isa.isa() in ("avx2", "avx512")
ROUNDED = SessionOptions(onnxruntime_rounding="always")


def _agree(got, want, what):
    if EXACT:
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=what)


def _peer(model):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _caches():
    half = HEAD // 2
    angles = np.arange(MAX_POS)[:, None] * (1.0 / 10000 ** (np.arange(half) / half))[None]
    return (numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"),
            numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin"))


def test_rotate_pair_is_the_fused_form_rounded_once():
    """Against float64's exact products, the sums rounded to float32 (no sum of these
    operands falls halfway, so float64 then float32 is the fma here)."""
    rng = np.random.default_rng(3)
    x1, x2, c, s = (rng.standard_normal(4096).astype(np.float32) for _ in range(4))
    real, imag = rotate_pair(x1, x2, c, s)
    want_real = (x1.astype(np.float64) * c + -(x2 * s)).astype(np.float32)
    want_imag = (x1.astype(np.float64) * s + x2 * c).astype(np.float32)
    np.testing.assert_array_equal(real, want_real)
    np.testing.assert_array_equal(imag, want_imag)


@pytest.mark.parametrize("interleaved", [0, 1])
def test_ms_rotary_embedding_equals_onnxruntime_bit_for_bit(interleaved):
    """com.microsoft RotaryEmbedding ([B, S, hidden]), the same arrays refilled with new
    values and positions every run."""
    seq = 5
    node = helper.make_node("RotaryEmbedding", ["x", "position_ids", "cos", "sin"], ["y"],
                            domain="com.microsoft", num_heads=HEADS, interleaved=interleaved)
    _agree_over_runs(node, "rotary", OPSET, 8, seq, seed=8 + interleaved, stride=4)


@pytest.mark.parametrize("seq", [1, 3, 8])
def test_gqa_rotated_keys_equal_onnxruntime_bit_for_bit(seq):
    """GroupQueryAttention with rotary on a growing cache: the rotated keys it writes to
    the present cache are onnxruntime's, every run."""
    past = 6
    width = (HEADS + 4) * HEAD
    node = helper.make_node(
        "GroupQueryAttention",
        ["qkv", "", "", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos", "sin"],
        ["attn", "present_key", "present_value"], domain="com.microsoft",
        num_heads=HEADS, kv_num_heads=2, do_rotary=1)
    cache = [1, 2, past, HEAD]
    graph = helper.make_graph(
        [node], "gqa_rotary",
        [tensor("qkv", [1, seq, width]), tensor("past_key", cache), tensor("past_value", cache),
         tensor("seqlens_k", [1], TensorProto.INT32), tensor("total_sequence_length", [], TensorProto.INT32)],
        [tensor("attn", None), tensor("present_key", None), tensor("present_value", None)], list(_caches()))
    model = helper.make_model(graph, opset_imports=OPSET, ir_version=8)
    ours, peer = workbench.InferenceSession(model, ROUNDED), _peer(model)
    rng = np.random.default_rng(seq)
    feeds = {"qkv": np.empty((1, seq, width), np.float32), "past_key": np.empty(cache, np.float32),
             "past_value": np.empty(cache, np.float32), "seqlens_k": np.array([past + seq - 1], np.int32),
             "total_sequence_length": np.array(past + seq, np.int32)}
    for run in range(RUNS):
        for name in ("qkv", "past_key", "past_value"):
            feeds[name][...] = rng.standard_normal(feeds[name].shape) * 2
        want = peer.run(None, feeds)
        got = ours.run(None, feeds)
        _agree(got[1], want[1], f"run {run}: present_key")
        _agree(got[2], want[2], f"run {run}: present_value")


@pytest.mark.parametrize("interleaved", [0, 1])
def test_onnx_rotary_embedding_23_equals_onnxruntime_bit_for_bit(interleaved):
    """ONNX RotaryEmbedding (opset 23, [B, S, hidden] with position_ids): the same MLAS
    kernel in onnxruntime, the same rounding here."""
    seq = 5
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "position_ids"], ["y"], num_heads=HEADS,
                            interleaved=interleaved)
    _agree_over_runs(node, "rotary23", [helper.make_opsetid("", 23)], 10, seq, seed=23 + interleaved, stride=5)


def _agree_over_runs(node, name: str, opsets: list, ir_version: int, seq: int, *, seed: int, stride: int) -> None:
    """A one-node rotary model over x [1, seq, heads * head] at positions moving by
    `stride` each run: RUNS runs refilling x and the positions in place, every output
    onnxruntime's bit for bit."""
    graph = helper.make_graph(
        [node], name,
        [tensor("x", [1, seq, HEADS * HEAD]), tensor("position_ids", [1, seq], TensorProto.INT64)],
        [tensor("y", [1, seq, HEADS * HEAD])], list(_caches()))
    model = helper.make_model(graph, opset_imports=opsets, ir_version=ir_version)
    ours, peer = workbench.InferenceSession(model, ROUNDED), _peer(model)
    rng = np.random.default_rng(seed)
    feeds = {"x": np.empty((1, seq, HEADS * HEAD), np.float32), "position_ids": np.empty((1, seq), np.int64)}
    for run in range(RUNS):
        feeds["x"][...] = rng.standard_normal(feeds["x"].shape) * 3
        feeds["position_ids"][...] = np.arange(seq) + stride * run
        _agree(ours.run(None, feeds)[0], peer.run(None, feeds)[0], f"run {run}")
