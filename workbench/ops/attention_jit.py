"""One query token's MaskedSoftmaxAttention in float32, compiled by numba.

A torch-style decoder's attention, fused at load (`fused_attention`), is a dozen numpy
calls on a decode step (two batched products, the scale, the mask, five for the
softmax), about 18 us on a tiny model, for a few thousand multiplies. Here one call
does the same arithmetic per query head: the scores (one dot over the head width each,
summed in order), times the scale, the mask (kept or filled, or added), the softmax
(max subtracted, exp, sum, division; a NaN probability zeroed under ``nan_guard``)
and the weighted sum of the values in key order. The sums run in another order than
BLAS's, so a value differs from numpy's in the last bits, as BLAS's differs from
onnxruntime's: a float model keeps "within a few ulps". Models that ask for
onnxruntime's rounding never come here; `WORKBENCH_NUMBA=0` turns it off.
"""

from __future__ import annotations

import functools

import numpy as np

from . import numba_support

F32 = np.dtype(np.float32)


def available() -> bool:
    """numba may be used (`numba_support.enabled`) and the kernel compiles and agrees
    with numpy on small cases, once per process."""
    return numba_support.enabled() and _self_checked()


@functools.cache
def _self_checked() -> bool:
    r = np.random.default_rng(5)
    same = True
    for heads, repeat, keys, width, mode in ((4, 2, 9, 16, "where"), (3, 1, 5, 8, "add"), (2, 2, 1, 4, "where")):
        q = r.standard_normal((heads, width)).astype(F32)
        k = r.standard_normal((heads // repeat, keys, width)).astype(F32)
        v = r.standard_normal((heads // repeat, keys, width)).astype(F32)
        keep = r.random((1, keys)) < 0.7
        keep[:, -1] = True
        bias = np.where(keep, 0, -np.inf).astype(F32)
        got = np.empty((heads, width), F32)
        decode(q, k, v, repeat, F32.type(0.25), keep if mode == "where" else None, bias if mode == "add" else None,
               F32.type(-3.0e38), True, got)
        scores = np.einsum("hd,htd->ht", q, np.repeat(k, repeat, axis=0)) * np.float32(0.25)
        scores = np.where(keep, scores, np.float32(-3.0e38)) if mode == "where" else scores + bias
        e = np.exp(scores - scores.max(axis=-1, keepdims=True))
        want = np.einsum("ht,htd->hd", e / e.sum(axis=-1, keepdims=True), np.repeat(v, repeat, axis=0))
        same = same and bool(np.allclose(got, want, rtol=1e-5, atol=1e-6))
    return same


def decode(q: np.ndarray, keys: np.ndarray, values: np.ndarray, repeat: int, scale: np.float32,
           keep: np.ndarray | None, bias: np.ndarray | None, fill: np.float32, nan_guard: bool,
           into: np.ndarray, key_scale: np.float32 | None = None) -> np.ndarray:
    """Attention of one token: q (H, D), keys / values (H / repeat, T, D) (query head h
    reads kv head h // repeat), float32; the scores times `scale`, or, with `key_scale`,
    each q element times `scale` and each key element times `key_scale` before their
    product (the scale split over both sides); the mask either `keep` (bool, (H | 1,
    T): a score kept, else `fill`) or `bias` (float32, (H | 1, T): added) or neither;
    into `into` (H, D). Arrays are made C-contiguous first where they are not (the
    kernel has one signature, compiled once)."""
    kernels = _kernels()
    where, add, split = keep is not None, bias is not None, key_scale is not None
    contiguous = np.ascontiguousarray  # the array itself where it already is
    kernels(contiguous(q), contiguous(keys), contiguous(values), repeat, scale,
            key_scale if split else F32.type(1), split, contiguous(keep) if where else _NO_KEEP,
            contiguous(bias) if add else _NO_BIAS, where, add, fill, nan_guard, into)
    return into


_NO_KEEP = np.ones((1, 1), bool)
_NO_BIAS = np.zeros((1, 1), F32)



@functools.cache
def _kernels():
    import numba
    from numba import types

    f32, zero = np.float32, np.float32(0.0)
    r2, r3 = (types.Array(types.float32, ndim, "C", readonly=True) for ndim in (2, 3))
    keep_rows = types.Array(types.boolean, 2, "C", readonly=True)

    @numba.njit(types.none(r2, r3, r3, types.int64, types.float32, types.float32, types.boolean, keep_rows, r2,
                           types.boolean, types.boolean, types.float32, types.boolean, types.float32[:, ::1]),
                nogil=True, cache=True)
    def decode_kernel(q, keys, values, repeat, scale, key_scale, split, keep, bias, where, add, fill, nan_guard,
                      into):
        heads, width = q.shape
        total = keys.shape[1]
        scores = np.empty(total, f32)
        row = np.empty(width, f32)
        keep_per_head, bias_per_head = keep.shape[0] > 1, bias.shape[0] > 1
        for h in range(heads):
            kv = h // repeat
            for d in range(width):
                row[d] = q[h, d] * scale if split else q[h, d]
            for t in range(total):
                s = zero
                if split:  # each element scaled before the product, as the chain scales it
                    for d in range(width):
                        s += row[d] * (keys[kv, t, d] * key_scale)
                else:
                    for d in range(width):
                        s += row[d] * keys[kv, t, d]
                    s = s * scale
                if where:
                    s = s if keep[h if keep_per_head else 0, t] else fill
                elif add:
                    s = s + bias[h if bias_per_head else 0, t]
                scores[t] = s
            top = scores[0]
            for t in range(1, total):
                if np.isnan(scores[t]) or scores[t] > top:  # a NaN propagates, as numpy's max
                    top = scores[t]
                if np.isnan(top):
                    break
            sum_ = zero
            for t in range(total):
                e = np.exp(scores[t] - top)
                scores[t] = e
                sum_ += e
            for d in range(width):
                into[h, d] = zero
            for t in range(total):
                p = scores[t] / sum_
                if nan_guard and np.isnan(p):
                    p = zero
                for d in range(width):
                    into[h, d] += p * values[kv, t, d]

    return decode_kernel
