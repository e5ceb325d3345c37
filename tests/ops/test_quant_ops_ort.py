"""Block-quantized ops of onnxruntime-genai's int4/int8 CPU exports, against onnxruntime.

- MatMulNBits at every ``accuracy_level``: level 4 makes onnxruntime's CPU kernel quantize
  A to int8 per block (MLAS CompInt8) for some (bits, block_size) pairs; the kernel must
  reproduce which, and the result (``workbench/ops/contrib_quant.py`` says why and how).
- GatherBlockQuantized (the quantized embedding table), bits 2 / 4 / 8.
- The differential rule: many runs with inputs at stable addresses and new contents,
  capture replaying, each run compared with onnxruntime on copies.
- End to end: the tiny genai int4 Llama with accuracy_level=4 and a quantized embedding
  tied to the lm_head decodes token-exact against onnxruntime.

Every model is built with onnx.helper with the quantized weights as initializers (that
is what makes onnxruntime prepack them and take its int8 path), and every workbench run
goes through ``workbench.InferenceSession``.

Tolerance: max |ours - onnxruntime| <= 3e-6 * max(1, max |onnxruntime|) (both compute in
float32; the remaining difference is summation order: ~6e-7 relative in practice).
"""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import workbench
import workbench.models
from workbench import Generator, SessionOptions

ort = pytest.importorskip("onnxruntime")

MS = "com.microsoft"
OPSETS = [helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)]
REL_TOL = 3e-6


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _pack(values: np.ndarray, bits: int) -> np.ndarray:
    """ints [..., n] < 2**bits -> uint8 [..., ceil(n * bits / 8)], low bits first."""
    per = 8 // bits
    pad = (-values.shape[-1]) % per
    v = np.concatenate([values, np.zeros(values.shape[:-1] + (pad,), values.dtype)], axis=-1)
    v = v.reshape(values.shape[:-1] + (-1, per)).astype(np.uint8)
    packed = np.zeros(v.shape[:-1], np.uint8)
    for i in range(per):
        packed |= (v[..., i] << (bits * i)).astype(np.uint8)
    return packed


def _ort_session(model, threads: int = 1):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _close(got, want, what=""):
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape,
                                                                 got.dtype, want.dtype)
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64)).max(initial=0.0)
    bound = REL_TOL * max(1.0, float(np.abs(want.astype(np.float64)).max(initial=0.0)))
    assert diff <= bound, f"{what}: max |diff| {diff:.3g} > {bound:.3g}"
    return diff


# --- MatMulNBits -------------------------------------------------------------------------


class NBitsWeight:
    """A random [N, K] weight in MatMulNBits layout, with its float32 dequantization."""

    def __init__(self, r, K, N, bits, block_size, with_zp):
        k_blocks = -(-K // block_size)
        q = r.integers(0, 2**bits, (N, k_blocks * block_size))
        self.B = _pack(q.reshape(N, k_blocks, block_size), bits)
        self.scales = (r.random((N, k_blocks)) * 0.05 + 0.005).astype(np.float32)
        zq = r.integers(0, 2**bits, (N, k_blocks)) if with_zp else np.full((N, k_blocks), 2**(bits - 1))
        self.zero_points = _pack(zq, bits).reshape(-1) if with_zp else None
        centred = (q.reshape(N, k_blocks, block_size) - zq[:, :, None]).astype(np.float32)
        self.W = (centred * self.scales[:, :, None]).reshape(N, -1)[:, :K]  # [N, K]
        self.K, self.N, self.bits, self.block_size = K, N, bits, block_size


def _nbits_model(w: NBitsWeight, accuracy_level: int, bias=None, a_type=TensorProto.FLOAT):
    inits = [numpy_helper.from_array(w.B, "B"),
             numpy_helper.from_array(w.scales.reshape(-1), "scales")]
    names = ["A", "B", "scales"]
    if w.zero_points is not None:
        inits.append(numpy_helper.from_array(w.zero_points, "zero_points"))
        names.append("zero_points")
    if bias is not None:
        names += [""] * (5 - len(names)) + ["bias"]
        inits.append(numpy_helper.from_array(bias, "bias"))
    node = helper.make_node("MatMulNBits", names, ["Y"], domain=MS, K=w.K, N=w.N, bits=w.bits,
                            block_size=w.block_size, accuracy_level=accuracy_level)
    graph = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("A", a_type, ["M", w.K])],
                              [helper.make_tensor_value_info("Y", a_type, ["M", w.N])], inits)
    return helper.make_model(graph, opset_imports=OPSETS)


#: (bits, block_size) pairs with an int8 kernel in onnxruntime's MLAS on x86-64
INT8_PAIRS = {(b, bs) for b in (4, 8) for bs in (16, 32, 64, 128, 256, 512, 2048)} | {(2, bs) for bs in (32, 64, 128)}

MATMUL_CASES = [
    pytest.param(bits, level, bs, zp, bias, K, N, id=f"b{bits}-acc{level}-bs{bs}-{zp}zp-{bias}bias-{K}x{N}")
    for bits, level, bs, zp, bias, (K, N) in itertools.product(
        (4, 8), range(5), (16, 32, 64, 128), (False, True), (False, True), ((64, 128), (96, 160)))
]


@pytest.mark.parametrize("bits,level,block_size,with_zp,with_bias,K,N", MATMUL_CASES)
def test_matmul_nbits_accuracy_levels(bits, level, block_size, with_zp, with_bias, K, N):
    r = rng_for("nbits", bits, level, block_size, with_zp, with_bias, K, N)
    w = NBitsWeight(r, K, N, bits, block_size, with_zp)
    bias = r.standard_normal(N).astype(np.float32) if with_bias else None
    model = _nbits_model(w, level, bias)
    ours, peer = workbench.InferenceSession(model), _ort_session(model)
    for M in (1, 2, 5):  # decode, speculative verify, a short prefill
        a = (r.standard_normal((M, K)) * r.choice([0.1, 1.0, 8.0])).astype(np.float32)
        (want,) = peer.run(None, {"A": a})
        (got,) = ours.run(None, {"A": a})
        _close(got, want, f"M={M}")
        fp32 = a @ w.W.T + (0 if bias is None else bias)
        fp32_gap = np.abs(fp32 - want).max() / max(1.0, np.abs(want).max())
        if level == 4 and (bits, block_size) in INT8_PAIRS:
            # onnxruntime really quantized A here: float32 compute would not pass
            assert fp32_gap > 30 * REL_TOL, (M, fp32_gap)
        else:
            assert fp32_gap <= REL_TOL, (M, fp32_gap)


@pytest.mark.parametrize("bits,block_size", [(2, 16), (2, 32), (2, 64), (2, 128), (2, 256),
                                             (4, 256), (8, 256), (4, 512), (8, 512), (4, 2048)])
def test_matmul_nbits_int8_block_size_table(bits, block_size):
    """Which (bits, block_size) pairs onnxruntime computes in int8 at level 4 (2-bit only
    for 32..128; 4- and 8-bit for every block size, A quantized per 256 past 256), with
    a partial last block."""
    r = rng_for("nbits_table", bits, block_size)
    K, N = 2 * block_size + 24, 48
    w = NBitsWeight(r, K, N, bits, block_size, True)
    model = _nbits_model(w, 4)
    ours, peer = workbench.InferenceSession(model), _ort_session(model)
    a = r.standard_normal((5, K)).astype(np.float32)
    (want,) = peer.run(None, {"A": a})
    _close(ours.run(None, {"A": a})[0], want)
    fp32_gap = np.abs(a @ w.W.T - want).max() / np.abs(want).max()
    assert (fp32_gap > 30 * REL_TOL) == ((bits, block_size) in INT8_PAIRS), fp32_gap


def test_matmul_nbits_level4_with_runtime_weights_computes_in_float32():
    """A B fed at run time is never prepacked: onnxruntime takes the float32 path."""
    r = rng_for("nbits_runtime_b")
    w = NBitsWeight(r, 128, 64, 4, 32, False)
    model = _nbits_model(w, 4)
    b_init = model.graph.initializer[0]
    model.graph.initializer.remove(b_init)
    model.graph.input.append(helper.make_tensor_value_info("B", TensorProto.UINT8, list(w.B.shape)))
    ours, peer = workbench.InferenceSession(model), _ort_session(model)
    a = r.standard_normal((3, 128)).astype(np.float32)
    (want,) = peer.run(None, {"A": a, "B": w.B})
    _close(ours.run(None, {"A": a, "B": w.B})[0], want)
    _close(a @ w.W.T, want, "float32")


@pytest.mark.parametrize("bits", [4, 8])
def test_matmul_nbits_level4_float16_and_rounding_ties(bits):
    """float16 A (widened, computed, rounded once) and activations that land exactly
    half way between two int8 steps (MLAS rounds to nearest even)."""
    r = rng_for("nbits_f16", bits)
    K, N = 64, 32
    w = NBitsWeight(r, K, N, bits, 32, True)
    a = np.zeros((2, K), np.float32)
    a[:, 0], a[:, 32] = 127.0, -127.0  # block max 127: the multiplier is exactly 1
    a[:, 1:20] = np.arange(19) + 0.5
    a[:, 33:50] = -(np.arange(17) + 0.5)
    a[1] = r.standard_normal(K)
    model = _nbits_model(w, 4)
    _close(workbench.InferenceSession(model).run(None, {"A": a})[0], _ort_session(model).run(None, {"A": a})[0])
    model16 = _nbits_model(w, 4, a_type=TensorProto.FLOAT16)
    model16.graph.initializer[1].CopyFrom(numpy_helper.from_array(w.scales.reshape(-1).astype(np.float16),
                                                                  "scales"))
    a16 = a.astype(np.float16)
    want = _ort_session(model16).run(None, {"A": a16})[0]
    got = workbench.InferenceSession(model16).run(None, {"A": a16})[0]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-3, atol=1e-3)


# --- GatherBlockQuantized ------------------------------------------------------------------


class QuantTable:
    """A random [rows, cols] table block-quantized along cols (uint8, bits per value)."""

    def __init__(self, r, rows, cols, bits, block_size, with_zp, scale_dtype=np.float32):
        n_blocks = -(-cols // block_size)
        self.q = r.integers(0, 2**bits, (rows, cols))
        self.data = _pack(self.q, bits)
        self.scales = (r.random((rows, n_blocks)) * 0.05 + 0.005).astype(scale_dtype)
        zq = r.integers(0, 2**bits, (rows, n_blocks)) if with_zp else None
        self.zero_points = _pack(zq, bits) if with_zp else None
        self.bits, self.block_size = bits, block_size


def _gbq_model(t: QuantTable, index_shape, index_type=TensorProto.INT64):
    inits = [numpy_helper.from_array(t.data, "data"), numpy_helper.from_array(t.scales, "scales")]
    names = ["data", "ids", "scales"]
    if t.zero_points is not None:
        inits.append(numpy_helper.from_array(t.zero_points, "zero_points"))
        names.append("zero_points")
    node = helper.make_node("GatherBlockQuantized", names, ["Y"], domain=MS, gather_axis=0,
                            quantize_axis=1, block_size=t.block_size, bits=t.bits)
    out_type = helper.np_dtype_to_tensor_dtype(t.scales.dtype)
    graph = helper.make_graph([node], "gbq", [helper.make_tensor_value_info("ids", index_type, index_shape)],
                              [helper.make_tensor_value_info("Y", out_type, None)], inits)
    return helper.make_model(graph, opset_imports=OPSETS)


GBQ_CASES = [
    pytest.param(bits, bs, zp, batch, id=f"b{bits}-bs{bs}-{zp}zp-batch{batch}")
    for bits, bs, zp, batch in itertools.product((4, 8, 2), (16, 32, 64), (False, True), (1, 3))
]


@pytest.mark.parametrize("bits,block_size,with_zp,batch", GBQ_CASES)
def test_gather_block_quantized(bits, block_size, with_zp, batch):
    r = rng_for("gbq", bits, block_size, with_zp, batch)
    rows, cols = 40, 96 + 8  # 104 columns: a partial last block for every block size
    t = QuantTable(r, rows, cols, bits, block_size, with_zp)
    model = _gbq_model(t, [batch, "S"])
    ours, peer = workbench.InferenceSession(model), _ort_session(model)
    assert ours.get_outputs()[0].shape == [batch, "S", cols]  # onnx shape inference knows it
    for S in (1, 7):
        ids = r.integers(-rows, rows, (batch, S))
        ids[0, 0] = rows + 3 if S > 1 else ids[0, 0]  # out of range: a row of zeros
        (want,) = peer.run(None, {"ids": ids})
        (got,) = ours.run(None, {"ids": ids})
        assert got.shape == (batch, S, cols) and got.dtype == np.float32
        np.testing.assert_array_equal(got, want)
        zp = (np.full(t.scales.shape, 2**(bits - 1)) if not with_zp
              else _unpack(t.zero_points, bits, t.scales.shape[1]))
        idx = np.where(ids < 0, ids + rows, ids).reshape(-1)
        blocks = np.arange(cols) // block_size
        expect = (t.q[idx % rows] - zp[idx % rows][:, blocks]) * t.scales[idx % rows][:, blocks]
        expect[(ids.reshape(-1) >= rows)] = 0
        np.testing.assert_allclose(got.reshape(-1, cols), expect, rtol=1e-6)


def _unpack(packed, bits, count):
    per = 8 // bits
    vals = (packed[..., None] >> (np.arange(per) * bits).astype(np.uint8)) & ((1 << bits) - 1)
    return vals.reshape(packed.shape[:-1] + (-1,))[..., :count].astype(np.int64)


@pytest.mark.parametrize("index_type", [TensorProto.INT32, TensorProto.INT64])
def test_gather_block_quantized_float16_scales_and_int32_indices(index_type):
    r = rng_for("gbq_f16", index_type)
    t = QuantTable(r, 30, 64, 4, 32, True, scale_dtype=np.float16)
    model = _gbq_model(t, [1, "S"], index_type)
    ids = r.integers(0, 30, (1, 9)).astype(helper.tensor_dtype_to_np_dtype(index_type))
    (want,) = _ort_session(model).run(None, {"ids": ids})
    (got,) = workbench.InferenceSession(model).run(None, {"ids": ids})
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, want)


def test_gather_block_quantized_rank3_table():
    """Inner axes between the gathered and the quantized one travel along (scales and
    zero points carry them too)."""
    r = rng_for("gbq_rank3")
    q = r.integers(0, 16, (6, 5, 40))
    scales = (r.random((6, 5, 3)) * 0.1).astype(np.float32)
    zp = _pack(r.integers(0, 16, (6, 5, 3)), 4)
    node = helper.make_node("GatherBlockQuantized", ["data", "ids", "scales", "zp"], ["Y"], domain=MS,
                            gather_axis=0, quantize_axis=2, block_size=16, bits=4)
    graph = helper.make_graph([node], "gbq3", [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(_pack(q, 4), "data"),
                               numpy_helper.from_array(scales, "scales"), numpy_helper.from_array(zp, "zp")])
    model = helper.make_model(graph, opset_imports=OPSETS)
    ids = np.array([5, -1, 0])
    ours = workbench.InferenceSession(model)
    assert ours.get_outputs()[0].shape == [3, 5, 40]
    np.testing.assert_array_equal(ours.run(None, {"ids": ids})[0], _ort_session(model).run(None, {"ids": ids})[0])


# --- differential: stable addresses, changing contents, capture replaying -----------------


RUNS = 8


def _embed_then_project_model(bits):
    """ids -> GatherBlockQuantized -> (+ x) -> MatMulNBits(level 4) -> Relu: the
    shape of a genai int4 model's first and last steps."""
    r = rng_for("diff_model", bits)
    rows, E, N = 64, 64, 96
    t = QuantTable(r, rows, E, 4, 32, True)
    w = NBitsWeight(r, E, N, bits, 32, True)
    nodes = [
        helper.make_node("GatherBlockQuantized", ["data", "ids", "emb_scales", "emb_zp"], ["emb"], domain=MS,
                         gather_axis=0, quantize_axis=1, block_size=32, bits=4),
        helper.make_node("Add", ["emb", "x"], ["h"]),
        helper.make_node("MatMulNBits", ["h", "B", "scales", "zero_points"], ["p"], domain=MS, K=E, N=N,
                         bits=bits, block_size=32, accuracy_level=4),
        helper.make_node("Relu", ["p"], ["y"]),
    ]
    inits = [numpy_helper.from_array(t.data, "data"), numpy_helper.from_array(t.scales, "emb_scales"),
             numpy_helper.from_array(t.zero_points, "emb_zp"), numpy_helper.from_array(w.B, "B"),
             numpy_helper.from_array(w.scales.reshape(-1), "scales"),
             numpy_helper.from_array(w.zero_points, "zero_points")]
    graph = helper.make_graph(
        nodes, "embed_project",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, E])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, N])], inits)
    return helper.make_model(graph, opset_imports=OPSETS), rows, E


@pytest.mark.parametrize("bits", [4, 8])
def test_quant_ops_replayed_with_stable_addresses_and_new_contents(bits):
    model, rows, E = _embed_then_project_model(bits)
    session = workbench.InferenceSession(model, SessionOptions(decode_memo_verify=False, capture=True))
    oracle = _ort_session(model)
    rng = np.random.default_rng(bits)
    ids = np.empty((1, 3), np.int64)
    x = np.empty((1, 3, E), np.float32)
    for run in range(RUNS):
        ids[...] = rng.integers(-rows, rows, (1, 3))
        x[...] = rng.standard_normal((1, 3, E)) * 0.5
        (got,) = session.run(None, {"ids": ids, "x": x})
        (want,) = oracle.run(None, {"ids": ids.copy(), "x": x.copy()})
        _close(got, want, f"run {run}")
    rec = session.recording
    events = rec.capture_events()
    assert (events.event == "replay").any(), "the graph must actually replay for this test to bite"
    timings = rec.node_timings()
    nodes = rec.nodes()
    for op in ("GatherBlockQuantized", "MatMulNBits"):
        index = nodes.query(f"op_type == '{op}'").plan_index.iloc[0]
        assert "replayed" in set(timings[timings.plan_index == index]["mode"]), op


# --- end to end: the genai int4 tiny Llama at accuracy_level 4, quantized tied embedding ----


def _genai_int4_level4_tied():
    """`workbench.models.llama("tiny", flavor="genai", quant="int4")` as onnxruntime-genai's
    int4 CPU export has it: every MatMulNBits at accuracy_level 4, and the embedding a
    GatherBlockQuantized over the lm_head's packed weight (tied embeddings: the same
    initializers feed both, reshaped to the table's [vocab, hidden / 2] layout)."""
    model = workbench.models.llama("tiny", flavor="genai", quant="int4")
    graph = model.graph
    lm_head = next(n for n in graph.node if n.name == "/lm_head/MatMulNBits")
    for node in graph.node:
        if node.op_type == "MatMulNBits":
            next(a for a in node.attribute if a.name == "accuracy_level").i = 4
    attrs = {a.name: helper.get_attribute_value(a) for a in lm_head.attribute}
    vocab, hidden, bs = attrs["N"], attrs["K"], attrs["block_size"]
    n_blocks = -(-hidden // bs)
    shapes = {"data": [vocab, n_blocks * bs // 2], "scales": [vocab, n_blocks],
              "zp": [vocab, -(-n_blocks // 2)]}
    reshaped = []
    for (key, shape), source in zip(shapes.items(), lm_head.input[1:4], strict=True):
        const = f"/model/embed_tokens/{key}_shape"
        graph.initializer.append(numpy_helper.from_array(np.array(shape, np.int64), const))
        reshaped.append(helper.make_node("Reshape", [source, const], [f"/model/embed_tokens/{key}"],
                                         name=f"/model/embed_tokens/Reshape_{key}"))
    index = next(i for i, n in enumerate(graph.node) if n.name == "/model/embed_tokens/Gather")
    gather = graph.node[index]
    gbq = helper.make_node("GatherBlockQuantized",
                           ["/model/embed_tokens/data", gather.input[1], "/model/embed_tokens/scales",
                            "/model/embed_tokens/zp"], list(gather.output), domain=MS,
                           name="/model/embed_tokens/GatherBlockQuantized", gather_axis=0, quantize_axis=1,
                           block_size=bs, bits=4)
    graph.node.remove(gather)
    for offset, node in enumerate(reshaped + [gbq]):
        graph.node.insert(index + offset, node)
    graph.initializer.remove(next(i for i in graph.initializer if i.name == "model.embed_tokens.weight"))
    return model


def test_genai_int4_level4_tied_embedding_decodes_token_exact_vs_onnxruntime():
    model = _genai_int4_level4_tied()
    data = model.SerializeToString()
    ours = workbench.InferenceSession(data)
    peer = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    assert {p.node.op_type for p in ours.plan.nodes} >= {"GatherBlockQuantized", "MatMulNBits"}
    prompt = [1, 17, 99, 250, 3, 42]
    got = Generator(ours).generate(prompt, 16, progress=False, return_logits=True, eos_token_id=-1)
    want = Generator(peer).generate(prompt, 16, progress=False, return_logits=True, eos_token_id=-1)
    assert got.tokens == want.tokens
    for step, (g, w) in enumerate(zip(got.logits, want.logits, strict=True)):
        _close(np.asarray(g, np.float32), np.asarray(w, np.float32), f"logits step {step}")
    # the check bites: onnxruntime's level-0 (float32) logits are far from its level-4 ones
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            next(a for a in node.attribute if a.name == "accuracy_level").i = 0
    fp32 = Generator(ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]))
    level0 = fp32.generate(prompt, 1, progress=False, return_logits=True, eos_token_id=-1).logits[0]
    gap = np.abs(np.asarray(level0) - np.asarray(want.logits[0])).max() / np.abs(want.logits[0]).max()
    assert gap > 30 * REL_TOL, gap
