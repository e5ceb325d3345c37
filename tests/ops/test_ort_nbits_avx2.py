"""MatMulNBits at accuracy_level 4, 4-bit weights in blocks of 32 (every onnxruntime-genai
int4 CPU export), bit for bit onnxruntime 1.32 where MLAS takes its AVX2 kernels
(`workbench.ops.nbits_int8_avx2`; `mlas_isa.isa()` is "avx2": AVX2 and FMA, no AVX-512).

What differs from MLAS's AVX-512 kernel (`nbits_int8.Blk32Weights`, tested in
test_matmulnbits_int8_compute.py): 8 lanes fed per pair of blocks; a call of one row
(decode, and the last row of a 128-row chunk) uses signed weights with the zero point
inside and no BlkSum correction, several rows unsigned weights and the correction by an
fma chain after the bias. Six runs per shape, A one array refilled in place, 0 ulps
from onnxruntime with 2 threads (its columns split between threads as in a decode), at
SmolLM2-135M's shapes and around them: zero points or not, an odd number of blocks, a
partial last block, N % 4 != 0 (the one-column fold), a bias, M of 1, 2, 3, 16, 129.
Elsewhere (AVX-512 or other CPUs) within test_quant_ops_ort's REL_TOL.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_quant_ops_ort import MS, OPSETS, REL_TOL  # noqa: E402
from test_quant_ops_ort import rng_for as _rng  # noqa: E402

import workbench
from workbench.ops import mlas_isa, nbits_int8, nbits_int8_avx2, nbits_int8_jit

EXACT = mlas_isa.isa() == "avx2"
RUNS = 6

SHAPES = [  # K, N, zero points, M, bias
    (576, 960, False, 1, False), (576, 576, False, 1, False), (576, 3072, False, 1, False),
    (1536, 576, False, 1, False), (576, 49152, False, 1, False),
    (576, 960, False, 16, False), (1536, 576, False, 16, False), (576, 576, False, 129, False),
    (576, 576, True, 1, False), (1536, 576, True, 3, False), (576, 576, True, 129, False),
    (544, 100, False, 1, False), (544, 102, True, 1, False), (544, 102, True, 5, False),
    (560, 64, False, 1, False), (560, 66, True, 2, False), (32, 4, True, 1, False), (96, 13, False, 2, False),
    (576, 576, False, 1, True), (576, 578, True, 3, True),
]


def _ulps(got, want) -> int:
    def ordered(x):
        i = np.asarray(x, np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return int(np.abs(ordered(got) - ordered(want)).max(initial=0))


def _model(r, K, N, with_zp, with_bias):
    blocks = -(-K // 32)
    inits = {"B": r.integers(0, 256, (N, blocks, 16), dtype=np.uint8),
             "scales": (r.random((N, blocks)) * 0.05 + 0.005).astype(np.float32)}
    names = ["A", "B", "scales"]
    if with_zp:
        inits["zero_points"] = r.integers(0, 256, N * -(-blocks // 2), dtype=np.uint8)
        names.append("zero_points")
    if with_bias:
        names += [""] * (5 - len(names)) + ["bias"]
        inits["bias"] = r.standard_normal(N).astype(np.float32)
    node = helper.make_node("MatMulNBits", names, ["Y"], domain=MS, K=K, N=N, bits=4, block_size=32,
                            accuracy_level=4)
    graph = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=OPSETS)


@pytest.mark.parametrize("compiled", [True, False], ids=["numba", "numpy"])
@pytest.mark.parametrize(("K", "N", "with_zp", "M", "with_bias"), SHAPES)
def test_int4_block32_is_onnxruntimes_avx2_result_bit_for_bit(K, N, with_zp, M, with_bias, compiled, monkeypatch):
    """Both the kernel numba compiles (`nbits_int8_jit`) and the numpy emulation."""
    monkeypatch.setenv("WORKBENCH_NUMBA", "1" if compiled else "0")
    r = _rng("avx2", K, N, with_zp, M, with_bias)
    model = _model(r, K, N, with_zp, with_bias)
    ours = workbench.InferenceSession(model)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    peer = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    a = np.empty((M, K), np.float32)
    for run in range(RUNS if N * M < 1 << 20 else 2):
        # SmolLM2-like activations: most near zero, a few large, an all-zero block
        a[...] = r.standard_normal((M, K)) * (10.0 ** (run % 3 - 1))
        a[:, r.integers(0, K, 4)] *= 40.0
        a[run % M, : min(K, 32)] = 0.0
        want = peer.run(None, {"A": a.copy()})[0]
        got = ours.run(None, {"A": a})[0]
        assert got.dtype == np.float32 and got.shape == want.shape
        if EXACT:
            assert _ulps(got, want) == 0, (run, _ulps(got, want), float(np.mean(got != want)))
        else:
            assert float(np.abs(got.astype(np.float64) - want).max() / max(1.0, np.abs(want).max())) <= REL_TOL


@pytest.mark.skipif(not EXACT, reason="the AVX2 layout is chosen where MLAS takes its AVX2 kernels")
def test_the_avx2_layout_is_chosen_and_laid_out_once():
    """On this CPU the numpy backend lays MatMulNBits' 4-bit block-32 weights out for
    MLAS's AVX2 kernels, once per node (not per run)."""
    r = _rng("avx2 layout")
    model = _model(r, 64, 8, False, False)
    before = nbits_int8.build_count
    ours = workbench.InferenceSession(model)
    built = nbits_int8.build_count - before
    for _ in range(3):
        ours.run(None, {"A": r.standard_normal((1, 64)).astype(np.float32)})
    assert nbits_int8.build_count - before == built == 1
    weights = nbits_int8.prepare(np, np.zeros((8, 2, 16), np.uint8), np.ones((8, 2), np.float32), None, N=8, K=64,
                                 bits=4, block_size=32, a_block=32, host=True)
    assert isinstance(weights, (nbits_int8_avx2.Avx2Blk32Weights, nbits_int8_jit.JitBlk32Weights))
    assert isinstance(weights, nbits_int8_jit.JitBlk32Weights) == nbits_int8_jit.available("avx2")
