"""MatMulNBits' int8 compute (accuracy_level 4, `ops.nbits_int8`) against onnxruntime.

- Every accuracy_level (0-4), bits 4 and 8, block sizes 16..128, with and without zero
  points, K not a multiple of the block: six runs each with A at a stable address (one
  array refilled in place) and new contents, each compared with onnxruntime.
- The weights are laid out once per node when the session is built, never per run
  (`nbits_int8.build_count`; the dequantizer is not called while running).
- A GatherBlockQuantized embedding reading the lm_head's packed weight, then the lm_head.
- The tiny genai int4 Llama at accuracy_level 4 decodes 64 tokens token-exact.
- 4-bit weights in blocks of 32 (onnxruntime-genai's int4 CPU exports) at SmolLM2-135M's
  shapes (K 576 and 1536; N 576, 960, 1536, 49152; with and without zero points; the
  decode's M=1 and a 16-token prefill), plus a partial last block and N % 4 != 0: bit
  for bit onnxruntime's result (0 ulps) over six runs refilling A in place, where
  onnxruntime takes MLAS's AVX512 kernels (this is the arithmetic `nbits_int8`
  reproduces); elsewhere within REL_TOL.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import workbench
import workbench.models
from workbench import Generator
from workbench.ops import contrib_quant, nbits_int8, nbits_int8_jit

ort = pytest.importorskip("onnxruntime")

# the int4 packing, seeded draws and opsets the other MatMulNBits tests use; both
# compute in float32 from the same integers: what is left is the rounding of the
# per-block scaling and the sum over blocks (~5e-7 of the output in practice); one
# activation rounded differently would be ~1e-3, far outside REL_TOL
from test_quant_ops_ort import MS, OPSETS, REL_TOL, _pack  # noqa: E402
from test_quant_ops_ort import rng_for as _rng  # noqa: E402


def _weights(r, K, N, bits, block, with_zp):
    k_blocks = -(-K // block)
    q = r.integers(0, 2**bits, (N, k_blocks, block))
    inits = {"B": _pack(q, bits), "scales": (r.random((N, k_blocks)) * 0.05 + 0.005).astype(np.float32)}
    if with_zp:
        inits["zero_points"] = _pack(r.integers(0, 2**bits, (N, k_blocks)), bits).reshape(-1)
    return inits


def _nbits_model(K, N, bits, block, level, inits):
    names = ["A"] + list(inits)
    node = helper.make_node("MatMulNBits", names, ["Y"], domain=MS, K=K, N=N, bits=bits, block_size=block,
                            accuracy_level=level)
    graph = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=OPSETS)


def _ort(model):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _ulps(got, want):
    """Largest distance in float32 ulps (+0 and -0 the same)."""
    def ordered(x):
        i = x.astype(np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return int(np.abs(ordered(got) - ordered(want)).max(initial=0))


def _mlas_avx512() -> bool:
    """Whether onnxruntime's MLAS takes its AVX512 int8 kernels on this CPU (it needs
    AVX512 F, BW, DQ and VL)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next(line for line in f if line.startswith("flags")).split())
    except (OSError, StopIteration):
        return False
    return {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags


def _rel(got, want):
    return float(np.abs(got.astype(np.float64) - want).max() / max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("with_zp", [False, True])
@pytest.mark.parametrize("block", [16, 32, 64, 128])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("level", [0, 1, 2, 3, 4])
def test_matmul_nbits_every_level_matches_onnxruntime_over_runs(level, bits, block, with_zp, monkeypatch):
    r = _rng("grid", level, bits, block, with_zp)
    K, N = 2 * block + 7, 40  # a partial last block
    model = _nbits_model(K, N, bits, block, level, _weights(r, K, N, bits, block, with_zp))
    before = nbits_int8.build_count
    ours, peer = workbench.InferenceSession(model), _ort(model)
    assert nbits_int8.build_count - before == (1 if level == 4 else 0)
    if level == 4:  # the weights were laid out at build: a run never dequantizes them again
        monkeypatch.setattr(contrib_quant, "dequantize_nbits", None)
    a = np.empty((3, K), np.float32)  # one address, new contents every run
    for run in range(6):
        a[...] = r.standard_normal((3, K)) * (10.0 ** (run % 3 - 1))
        a[run % 3, : block] = 0.0  # an all-zero block
        want = peer.run(None, {"A": a.copy()})[0]
        got = ours.run(None, {"A": a})[0]
        assert got.shape == want.shape and got.dtype == np.float32
        assert _rel(got, want) <= REL_TOL, (run, _rel(got, want))
    assert nbits_int8.build_count - before == (1 if level == 4 else 0)


@pytest.mark.parametrize("bits", [4, 8])
def test_level4_is_int8_not_float32(bits):
    """The check bites: at level 4 onnxruntime's result is far from the float32 one, and
    ours is onnxruntime's."""
    r = _rng("bites", bits)
    K, N, block = 100, 24, 32
    inits = _weights(r, K, N, bits, block, True)
    a = r.standard_normal((2, K)).astype(np.float32)
    want4 = _ort(_nbits_model(K, N, bits, block, 4, inits)).run(None, {"A": a})[0]
    want0 = _ort(_nbits_model(K, N, bits, block, 0, inits)).run(None, {"A": a})[0]
    got = workbench.InferenceSession(_nbits_model(K, N, bits, block, 4, inits)).run(None, {"A": a})[0]
    assert _rel(got, want4) <= REL_TOL
    assert _rel(want0, want4) > 30 * REL_TOL


def test_embedding_shares_lm_head_weight():
    """GatherBlockQuantized over the lm_head's packed weight (reshaped, as genai's tied
    export has it), then the lm_head at level 4: six runs with new ids and inputs."""
    r = _rng("tied")
    vocab, hidden, block = 96, 96, 32  # the table unpacks to whole blocks
    inits = _weights(r, hidden, vocab, 4, block, False)
    k_blocks = -(-hidden // block)
    nodes = [
        helper.make_node("Reshape", ["B", "table_shape"], ["table"]),
        helper.make_node("GatherBlockQuantized", ["table", "ids", "scales"], ["emb"], domain=MS, gather_axis=0,
                         quantize_axis=1, block_size=block, bits=4),
        helper.make_node("Add", ["emb", "x"], ["h"]),
        helper.make_node("MatMulNBits", ["h", "B", "scales"], ["y"], domain=MS, K=hidden, N=vocab, bits=4,
                         block_size=block, accuracy_level=4),
    ]
    consts = [numpy_helper.from_array(v, k) for k, v in inits.items()]
    consts.append(numpy_helper.from_array(np.array([vocab, k_blocks * block // 2], np.int64), "table_shape"))
    graph = helper.make_graph(nodes, "tied", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4]),
                                              helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, hidden])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, vocab])], consts)
    model = helper.make_model(graph, opset_imports=OPSETS)
    ours, peer = workbench.InferenceSession(model), _ort(model)
    ids, x = np.empty((1, 4), np.int64), np.empty((1, 4, hidden), np.float32)
    for _ in range(6):
        ids[...] = r.integers(0, vocab, (1, 4))
        x[...] = r.standard_normal((1, 4, hidden)) * 0.1
        want = peer.run(None, {"ids": ids.copy(), "x": x.copy()})[0]
        assert _rel(ours.run(None, {"ids": ids, "x": x})[0], want) <= REL_TOL


def test_tiny_llama_level4_decodes_64_tokens_token_exact():
    model = workbench.models.llama("tiny", flavor="genai", quant="int4")
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            next(a for a in node.attribute if a.name == "accuracy_level").i = 4
    data = model.SerializeToString()
    before = nbits_int8.build_count
    ours = workbench.InferenceSession(data)
    built = nbits_int8.build_count - before
    assert built == sum(p.node.op_type == "MatMulNBits" for p in ours.plan.nodes) > 0
    prompt = [1, 17, 99, 250, 3, 42]
    got = Generator(ours).generate(prompt, 64, progress=False, return_logits=True, eos_token_id=-1)
    want = Generator(_ort(model)).generate(prompt, 64, progress=False, return_logits=True, eos_token_id=-1)
    assert got.tokens == want.tokens
    worst = max(_rel(np.asarray(g, np.float32), np.asarray(w, np.float32))
                for g, w in zip(got.logits, want.logits, strict=True))
    assert worst <= 1e-4, worst
    assert nbits_int8.build_count - before == built  # 64 steps, no weight laid out again


# SmolLM2-135M's MatMulNBits (onnxruntime-genai int4 CPU export: bits 4, block 32,
# accuracy_level 4, no zero points): qkv, o_proj, gate/up, down, lm_head; then zero
# points, a partial last block with N % 4 != 0, fewer than 4 blocks, a 16-token prefill
SMOLLM2_SHAPES = [  # K, N, zero points, M
    (576, 960, False, 1), (576, 576, False, 1), (576, 1536, False, 1), (1536, 576, False, 1),
    (576, 49152, False, 1), (576, 1536, True, 1), (1536, 576, True, 3), (300, 43, True, 2),
    (71, 10, False, 1), (576, 960, False, 16),
]


def _int4_block32_weights(r, K, N, with_zp):
    """Random 4-bit weights in blocks of 32, drawn as packed bytes (random bytes are
    random nibble pairs; packing 28M values one by one takes seconds)."""
    k_blocks = -(-K // 32)
    inits = {"B": r.integers(0, 256, (N, k_blocks, 16), dtype=np.uint8),
             "scales": (r.random((N, k_blocks)) * 0.05 + 0.005).astype(np.float32)}
    if with_zp:
        inits["zero_points"] = r.integers(0, 256, N * -(-k_blocks // 2), dtype=np.uint8)
    return inits


@pytest.mark.parametrize("compiled", [True, False], ids=["numba", "numpy"])
@pytest.mark.parametrize(("K", "N", "with_zp", "M"), SMOLLM2_SHAPES)
def test_int4_block32_is_onnxruntimes_result_bit_for_bit(K, N, with_zp, M, compiled, monkeypatch):
    """MLAS's blklen-32 arithmetic (unsigned weight integers; 16 fma lanes over groups of
    4 blocks, lanes L and L + 8 added, 8 lanes for the last k_blocks % 4 blocks, its two
    lane-folding orders; the zero points by a float32 fma chain over blocks): six runs,
    A refilled in place at one address, each 0 ulps from onnxruntime (2 threads, so the
    columns are split between threads as in a decode). Both the kernel numba compiles
    (`nbits_int8_jit`) and the numpy emulation."""
    monkeypatch.setenv("WORKBENCH_NUMBA", "1" if compiled else "0")
    r = _rng("smollm2", K, N, with_zp, M)
    model = _nbits_model(K, N, 4, 32, 4, _int4_block32_weights(r, K, N, with_zp))
    laid_out = []
    prepare = nbits_int8_jit.prepare
    monkeypatch.setattr(nbits_int8_jit, "prepare", lambda *args: laid_out.append(args[-1]) or prepare(*args))
    ours = workbench.InferenceSession(model)
    if _mlas_avx512():
        assert laid_out == (["avx512"] if compiled else [])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    peer = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    exact = _mlas_avx512()
    a = np.empty((M, K), np.float32)
    for run in range(6):
        # SmolLM2-like activations: most near zero, a few large, an all-zero block
        a[...] = r.standard_normal((M, K)) * (10.0 ** (run % 3 - 1))
        a[:, r.integers(0, K, 4)] *= 40.0
        a[run % M, 32:64] = 0.0
        want = peer.run(None, {"A": a.copy()})[0]
        got = ours.run(None, {"A": a})[0]
        assert got.dtype == np.float32 and got.shape == want.shape
        if exact:
            assert _ulps(got, want) == 0, (run, _ulps(got, want), _rel(got, want))
        else:  # MLAS's AVX2 / NEON kernels order the float sums differently
            assert _rel(got, want) <= REL_TOL, (run, _rel(got, want))


def test_int4_block32_one_flipped_activation_is_visible():
    """The check bites: rounding one of A's int8 values the other way (what a 1-ulp
    difference in A can do at a rounding tie) moves the result far past the ulp bound."""
    r = _rng("flip")
    K, N = 576, 64
    inits = _weights(r, K, N, 4, 32, False)
    w = nbits_int8.prepare(np, inits["B"], inits["scales"], None, N=N, K=K, bits=4, block_size=32, a_block=32,
                           host=True)
    a = r.standard_normal((1, K)).astype(np.float32)
    block = a[0, :32]
    scale = np.abs(block).max() / np.float32(127)
    i = int(np.argsort(np.abs(block))[5])
    b = a.copy()
    b[0, i] = (np.rint(block[i] / scale) + 0.5) * scale  # onto the next rounding boundary
    b[0, i] = np.nextafter(b[0, i], np.float32(np.inf) * np.sign(b[0, i]))
    ya, yb = nbits_int8.matmul(np, a, w), nbits_int8.matmul(np, b, w)
    assert _ulps(ya, yb) > 1000
