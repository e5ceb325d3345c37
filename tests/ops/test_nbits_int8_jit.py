"""MatMulNBits at accuracy_level 4, 4-bit weights in blocks of 32, as numba compiles
MLAS's kernels (`workbench.ops.nbits_int8_jit`): bit for bit the numpy emulation of the
same kernel (`nbits_int8_avx2` for MLAS's AVX2 kernels, `nbits_int8` for its AVX-512
one), on every machine with FMA3, whatever kernel onnxruntime itself takes here (the
emulations are held to onnxruntime in test_ort_nbits_avx2.py and
test_matmulnbits_int8_compute.py, on the CPUs whose kernels they are).

Six runs per shape with A one array refilled in place: SmolLM2-135M's shapes and
around them, zero points or not, an odd number of blocks and a partial last group,
a partial last block, N % 4 != 0 and N not a multiple of the 64-column chunk, a bias,
M of 1, 2, 3, 16 and 129 (MLAS's one-row kernel takes the last row of a 128-row chunk),
and a weight big enough to be split between two threads.
"""

from __future__ import annotations

import numpy as np
import pytest

from workbench.ops import nbits_int8_jit

FORMS = ["avx2", "avx512"]
RUNS = 6
SHAPES = [  # K, N, zero points, M, bias
    (576, 576, False, 1, False), (1536, 576, False, 1, False), (576, 1536, True, 1, True),
    (576, 576, False, 16, False), (576, 130, True, 129, True), (544, 102, True, 1, False),
    (544, 102, False, 5, True), (560, 66, True, 2, False), (32, 4, True, 1, False), (96, 13, False, 2, False),
    (232, 70, False, 3, True), (416, 67, True, 1, True),
    (576, 8192, False, 1, False), (32, 64, False, 1, False),  # split between two threads, and not
]


def _weights(r, K, N, with_zp):
    blocks = -(-K // 32)
    q = r.integers(0, 16, (N, blocks, 32)).astype(np.uint8)
    scales = (r.random((N, blocks)) * 0.05 + 0.005).astype(np.float32)
    zp = r.integers(0, 16, (N, blocks)).astype(np.int16) if with_zp else np.full((N, blocks), 8, np.int16)
    return q, scales, zp


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("K", "N", "with_zp", "M", "with_bias"), SHAPES)
def test_compiled_kernel_is_its_numpy_emulation_bit_for_bit(form, K, N, with_zp, M, with_bias):
    assert nbits_int8_jit.available(form), "numba is a dependency; its kernels pass their self-check"
    r = np.random.default_rng([K, N, with_zp, M, with_bias, FORMS.index(form)])
    q, scales, zp = _weights(r, K, N, with_zp)
    bias = r.standard_normal(N).astype(np.float32) if with_bias else None
    compiled = nbits_int8_jit.prepare(q, scales, zp, with_zp, K, form)
    a = np.empty((M, K), np.float32)
    for run in range(RUNS):
        # SmolLM2-like activations: most near zero, a few large, an all-zero block
        a[...] = r.standard_normal((M, K)) * (10.0 ** (run % 3 - 1))
        a[:, r.integers(0, K, 4)] *= 40.0
        a[run % M, : min(K, 32)] = 0.0
        want = nbits_int8_jit.emulated(a, q, scales, zp, with_zp, K, form, bias)
        got = nbits_int8_jit.matmul(a, compiled, bias)
        assert got.shape == want.shape == (M, N)
        np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32), err_msg=f"run {run}")
        into = np.full((M, N), np.nan, np.float32)  # a planned output buffer, written in place where N fills chunks
        written = nbits_int8_jit.matmul(a, compiled, bias, into)
        assert (written is into) == (compiled.nibbles.shape[0] * compiled.nibbles.shape[2] == N)
        np.testing.assert_array_equal(written.view(np.int32), want.view(np.int32), err_msg=f"run {run} (into)")


def test_the_compiled_kernels_can_be_turned_off(monkeypatch):
    """``WORKBENCH_NUMBA=0`` leaves the numpy emulations (what the differential tests
    against onnxruntime run as their second form)."""
    monkeypatch.setenv("WORKBENCH_NUMBA", "0")
    assert not nbits_int8_jit.available("avx2") and not nbits_int8_jit.available("avx512")
