"""One-row float32 products by a constant weight, compiled by numba: a decode step's
``x @ W`` with W in the column-major layout the load-time optimizer gives it
(`rewrite.matvec_layout`: ``W.T`` contiguous, one output's K weights side by side).

numpy hands such a product to its BLAS's sgemv, which on these 2-core machines
streams SmolLM2-135M's float32 weights in ~20 ms a token (onnxruntime's whole step is
~18 ms). Here each output is one dot over its contiguous row, the rows split between
two threads (numba's parallel loop on a thread-safe layer, else one thread), four rows
a pass (each element of x loaded once for the four; 20-30% faster than a row at a
time on SmolLM2's lm_head, 49152 x 576, where onnxruntime's MLAS was ahead); the sums
are reassociated (vectorised), so a product differs from BLAS's in the last bits, as
BLAS's differs from onnxruntime's: a float model keeps "within a few ulps". Models that
ask for onnxruntime's rounding never come here. `WORKBENCH_NUMBA=0` turns it off.
"""

from __future__ import annotations

import functools

import numpy as np

from . import numba_support

F32 = np.dtype(np.float32)
#: weights (N x K) from which the compiled product is taken (smaller ones: BLAS's call
#: costs less than a parallel loop's start)
MIN_WEIGHTS = 1 << 17


def available() -> bool:
    """numba may be used (`numba_support.enabled`) and its kernel compiles and agrees
    with numpy on a small case, once per process."""
    return numba_support.enabled() and _self_checked()


@functools.cache
def _self_checked() -> bool:
    r = np.random.default_rng(3)
    w = r.standard_normal((300, 200)).astype(F32)
    x = r.standard_normal(200).astype(F32)
    y = np.empty(300, F32)
    _kernels()(x, w, y)
    return bool(np.allclose(y, w @ x, rtol=1e-5, atol=1e-5))


def product(x: np.ndarray, w_rows: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``y[n] = sum_k x[k] w_rows[n, k]`` for contiguous float32 `x` (K,), `w_rows`
    (N, K) and `y` (N,)."""
    return _kernels()(x, w_rows, y)


@functools.cache
def _kernels():
    import numba

    zero = np.float32(0.0)

    def rows(x, w, y):
        # four rows a pass: each x[k] loaded once for four products, four sums in flight
        quads = w.shape[0] // 4
        for q in numba.prange(quads):
            n = 4 * q
            r0, r1, r2, r3 = w[n], w[n + 1], w[n + 2], w[n + 3]
            s0 = s1 = s2 = s3 = zero
            for k in range(x.shape[0]):
                xk = x[k]
                s0 += xk * r0[k]
                s1 += xk * r1[k]
                s2 += xk * r2[k]
                s3 += xk * r3[k]
            y[n], y[n + 1], y[n + 2], y[n + 3] = s0, s1, s2, s3
        for n in range(4 * quads, w.shape[0]):
            row = w[n]
            s = zero
            for k in range(row.shape[0]):
                s += x[k] * row[k]
            y[n] = s
        return y

    return numba.njit(nogil=True, cache=True, parallel=numba_support.parallel(), fastmath={"reassoc", "contract"})(rows)
