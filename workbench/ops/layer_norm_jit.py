"""LayerNorm rows compiled by numba: LayerNormalization's and SkipLayerNormalization's
float32 rows, the same operations in the same order as their numpy forms
(`normalization.build_layer_norm`, `contrib_norm`'s skip norm), one call instead of a
dozen numpy calls.

Why: GPT-2's exports normalise one 64-768 wide row five times a token, and the numpy
forms cost 14-17 us a row on these machines (a decode step of a tiny export is
0.4-0.9 ms); compiled, a row costs about 1 us plus the call.

The sums differ: numpy's are pairwise in float32, these accumulate in float64 and round
once, so a mean or variance may differ in its last bit (onnxruntime's, vectorised by
Eigen, differ from both); every other product, difference and division rounds in
float32 as the numpy form does. Models that ask for onnxruntime's rounding take no
kernel here that claims it: neither form is onnxruntime's bit for bit.
`WORKBENCH_NUMBA=0` turns it off.
"""

from __future__ import annotations

import functools

import numpy as np

from . import numba_support

F32 = np.dtype(np.float32)
#: stands in for an absent bias or beta (the kernels take one signature)
NONE = np.zeros(1, F32)


def available() -> bool:
    """numba may be used and its kernels agree with the numpy forms on small cases to
    float32 rounding, once per process."""
    return numba_support.enabled() and _self_checked()


@functools.cache
def _self_checked() -> bool:
    r = np.random.default_rng(5)
    x = (r.standard_normal((3, 40)) * 4 + 1).astype(F32)
    gamma, beta = r.standard_normal(40).astype(F32), r.standard_normal(40).astype(F32)
    y = np.empty_like(x)
    layer_norm_rows(x, gamma, beta, F32.type(1e-5), y)
    mean = x.mean(-1, keepdims=True, dtype=np.float64)
    want = (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * gamma + beta
    s, y1 = np.empty(40, F32), np.empty(40, F32)
    skip_layer_norm_row(x[0], x[1], x[2], gamma, beta, F32.type(1e-5), s, y1)
    total = x[0].astype(np.float64) + x[1] + x[2]
    want1 = (total - total.mean()) / np.sqrt(total.var() + 1e-5) * gamma + beta
    return bool(np.allclose(y, want, rtol=1e-5, atol=1e-5) and np.allclose(y1, want1, rtol=1e-5, atol=1e-5))


def layer_norm_rows(rows: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None, eps: np.float32,
                    y: np.ndarray) -> np.ndarray:
    """LayerNormalization of float32 `rows` (R, n) C-contiguous by `gamma` and `beta`
    (n,; beta None: none) into `y` (R, n): d = x - mean, d * (1 / sqrt(mean(d²) + eps))
    * gamma + beta."""
    _kernels()[0](rows, gamma, NONE if beta is None else beta, beta is not None, eps, y)
    return y


def skip_layer_norm_row(x: np.ndarray, skip: np.ndarray, bias: np.ndarray | None, gamma: np.ndarray,
                        beta: np.ndarray | None, eps: np.float32, s: np.ndarray, y: np.ndarray) -> None:
    """SkipLayerNormalization of one float32 row (1-D, C-contiguous): s = x + skip
    (+ bias) into `s`, then (s - mean) / sqrt(E[s²] - mean² + eps) * gamma (+ beta) into `y`."""
    _kernels()[1](x, skip, NONE if bias is None else bias, bias is not None, gamma,
                  NONE if beta is None else beta, beta is not None, eps, s, y)


@functools.cache
def _kernels():
    import numba

    f32 = np.float32

    def rows_kernel(x, gamma, beta, has_beta, eps, y):
        n = x.shape[1]
        for r in range(x.shape[0]):
            row, out = x[r], y[r]
            total = 0.0
            for k in range(n):
                total += row[k]
            mean = f32(total / n)
            squares = 0.0
            for k in range(n):
                d = row[k] - mean
                squares += d * d
            inv = f32(1.0) / np.sqrt(f32(squares / n) + eps)
            for k in range(n):
                v = (row[k] - mean) * inv * gamma[k]
                out[k] = v + beta[k] if has_beta else v
        return y

    def skip_row_kernel(x, skip, bias, has_bias, gamma, beta, has_beta, eps, s, y):
        n = x.shape[0]
        total = 0.0
        squares = 0.0
        for k in range(n):
            v = x[k] + skip[k]
            if has_bias:
                v = v + bias[k]
            s[k] = v
            total += v
            squares += v * v
        mean = f32(total / n)
        mean_sq = f32(squares / n)
        denom = np.sqrt(mean_sq - mean * mean + eps)
        for k in range(n):
            v = (s[k] - mean) / denom * gamma[k]
            y[k] = v + beta[k] if has_beta else v

    jit = numba.njit(nogil=True, cache=True)
    return jit(rows_kernel), jit(skip_row_kernel)
