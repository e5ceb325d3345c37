"""The compiled kernels of `mlas_jit`, as module-level numba functions.

Imported by `mlas_jit._kernels` on first use (so `import workbench` never imports
numba). Module level, not closures: numba's on-disk cache keys a closure on its cell
values, and a cell holding another jitted function pickles with a fresh id in every
process, so closures compiled again in each one (about 2.4 s); these load from the
cache. The constants are MLAS's (`mlas_attention`, `ort_float32`); each kernel's
arithmetic is documented where it is used, in `mlas_jit`.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import types
from numba.core.extending import intrinsic

from . import mlas_attention as ma
from . import ort_float32 as of


@intrinsic
def fma32(typingctx, a, b, c):
    """fma(a, b, c) of float32 values, rounded once (``llvm.fma.f32``)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        return builder.fma(*args)
    return sig, codegen


def _bitcast(source, target):
    """An intrinsic giving the `target` value whose bits are the `source` word."""
    @intrinsic
    def of_bits(typingctx, word):
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(target))
        return target(source), codegen
    return of_bits


float32_of_bits = _bitcast(types.int32, types.float32)  # the float32 of an int32's bits
float64_of_bits = _bitcast(types.int64, types.float64)  # the float64 of an int64's bits


jit = functools.partial(numba.njit, nogil=True, cache=True)
# MLAS's constants, as the kernels read them (numba freezes a global's value when it compiles)
f32 = np.float32
alpha = tuple(of._ALPHA)
beta = tuple(of._BETA)
lower, upper = of._LOWER, of._UPPER
half, zero, one = f32(0.5), f32(0.0), f32(1.0)
lowest = ma.LOWEST
bias_rounding, log2_reciprocal = ma._ROUNDING_BIAS, ma._LOG2_RECIPROCAL
log2_high, log2_low = ma._LOG2_HIGH, ma._LOG2_LOW
poly = tuple(ma._POLY)
clamp_fma3, clamp_avx512 = ma._LOWER_SUM_EXP, ma._LOWER_RANGE
one_bits = np.int64(ma._ONE_BITS)


@jit
def logistic_kernel(x, into, upper_clamp):
    for i in range(x.shape[0]):
        v = np.minimum(np.maximum(x[i], lower), upper)
        v2 = v * v
        p = fma32(v2, alpha[0], alpha[1])
        p = fma32(v2, p, alpha[2])
        p = fma32(v2, p, alpha[3])
        p = fma32(v2, p, alpha[4])
        q = fma32(v2, beta[0], beta[1])
        q = fma32(v2, q, beta[2])
        q = fma32(v2, q, beta[3])
        q = fma32(v2, q, beta[4])
        q = fma32(v2, q, beta[5])
        r = np.maximum((p * v) / q + half, zero)
        into[i] = np.minimum(r, one) if upper_clamp else r
    return into


@jit
def fma8_sum_of_squares(x, lanes):
    """onnxruntime's vectorised sum of squares of one row: 8 lanes of fma(x, x, lane),
    folded 8 -> 4 -> 2 -> 1; then 4 more as s + x*x where 4 are left; the rest fma."""
    n = x.shape[0]
    body = n - n % 8
    for lane in range(8):
        lanes[lane] = zero
    for k0 in range(0, body, 8):
        for lane in range(8):
            v = x[k0 + lane]
            lanes[lane] = fma32(v, v, lanes[lane])
    f0, f1, f2, f3 = lanes[0] + lanes[4], lanes[1] + lanes[5], lanes[2] + lanes[6], lanes[3] + lanes[7]
    t0, t1 = f0 + f2, f1 + f3
    s = t0 + t1
    j = body
    if n - j >= 4:
        for k in range(j, j + 4):
            s = s + x[k] * x[k]
        j += 4
    for k in range(j, n):
        s = fma32(x[k], x[k], s)
    return s


@jit
def sum_of_squares_kernel(rows, sums):
    lanes = np.empty(8, f32)
    for r in range(rows.shape[0]):
        sums[r, 0] = fma8_sum_of_squares(rows[r], lanes)
    return sums

r1, c1 = types.Array(types.float32, 1, "C", readonly=True), types.float32[::1]
r2, c2 = types.Array(types.float32, 2, "C", readonly=True), types.float32[:, ::1]


@numba.njit(types.none(r1, r1, r1, types.float32, types.float32, c1, c1), nogil=True, cache=True)
def skip_rms_row_kernel(x, skip, gamma, hidden, eps, s, y):
    """SkipSimplifiedLayerNormalization of one row (`contrib_norm.row_rms`): s = x +
    skip; the squares, each rounded, summed left to right; s / sqrt(sum / hidden +
    eps) * gamma. `s` may be x's or skip's own buffer (each element read before it
    is written)."""
    total = zero
    for i in range(x.shape[0]):
        v = x[i] + skip[i]
        s[i] = v
        total = total + v * v
    denom = np.sqrt(total / hidden + eps)
    for i in range(s.shape[0]):
        y[i] = (s[i] / denom) * gamma[i]


@numba.njit(types.none(r2, r1, types.float32, c2, c1), nogil=True, cache=True)
def rms_rows_kernel(rows, scale, eps, y, inv):
    """onnxruntime's RMS norm of each row (`normalization._rms_norm_as_onnxruntime`):
    from 16 elements the fma8 sum of squares and x * (1 / rms), below it the squares
    summed left to right and x / rms; then times scale."""
    n = rows.shape[1]
    count = f32(n)
    lanes = np.empty(8, f32)
    for r in range(rows.shape[0]):
        x = rows[r]
        if n >= 16:
            total = fma8_sum_of_squares(x, lanes)
        else:
            total = x[0] * x[0]
            for k in range(1, n):
                total = total + x[k] * x[k]
        denom = np.sqrt(total / count + eps)
        inverse = one / denom
        inv[r] = inverse
        if n >= 16:
            for k in range(n):
                y[r, k] = (x[k] * inverse) * scale[k]
        else:
            for k in range(n):
                y[r, k] = (x[k] / denom) * scale[k]

# one signature each, of C-contiguous arrays (numba would compile another for each
# layout it meets, mid-decode): compiled once, up front, and fast on contiguous rows
# (inputs read-only: an initializer's array is; a writable one converts)
c3 = types.float32[:, :, ::1]
r2, r3 = (types.Array(types.float32, ndim, "C", readonly=True) for ndim in (2, 3))


@numba.njit(types.none(r3, r2, r2, types.int64, c3), nogil=True, cache=True)
def rotate_rows_kernel(halves, cos_rows, sin_rows, position, rotated):
    cos, sin = cos_rows[position], sin_rows[position]
    for r in range(halves.shape[0]):
        for j in range(halves.shape[2]):
            a, b = halves[r, 0, j], halves[r, 1, j]
            rotated[r, 0, j] = fma32(a, cos[j], -(b * sin[j]))
            rotated[r, 1, j] = fma32(a, sin[j], b * cos[j])


@jit
def exp_biased(x, wide):
    """MLAS's sum-exp kernel's exp of x (already biased by -max)."""
    x = np.maximum(x, clamp_avx512 if wide else clamp_fma3)
    biased = fma32(x, log2_reciprocal, bias_rounding)
    m = biased - bias_rounding
    x = fma32(m, log2_high, x)
    x = fma32(m, log2_low, x)
    p = fma32(poly[0], x, poly[1])
    for c in poly[2:]:
        p = fma32(p, x, c)
    if wide:  # vscalefps: p * 2^m rounded once (exact in float64, then one rounding)
        # 2^m as a float64 (m within -150..128 after the clamp: a normal number)
        return f32(np.float64(p) * float64_of_bits((np.int64(m) + 1023) << 52))
    # 2^m built in the exponent bits, as the FMA3 kernel's integer shift does
    word = ((np.int64(m) << 23) + one_bits) & 0xFFFFFFFF  # int32 arithmetic, wrapping
    return p * float32_of_bits(np.int32(word - (1 << 32) if word >= 1 << 31 else word))


@numba.njit(types.none(r3, r3, r3, types.int64, types.float32, types.int64, c3, types.boolean, r3,
                       types.boolean), nogil=True, cache=True)


def decode_attention_kernel(q, keys, values, total, scale, window_start, into, wide, bias, has_bias):
    kv_heads, group, head = q.shape
    bias_kv, bias_g = bias.shape[0] > 1, bias.shape[1] > 1  # else broadcast
    body = head - head % 8
    width = 16 if wide else 8
    scores = np.empty(total, f32)
    lanes = np.empty(16, f32)
    row = np.empty(head, f32)
    for kv in range(kv_heads):
        for g in range(group):
            qv = q[kv, g]
            for t in range(total):  # MlasGQADecodeQK: 8 lanes of every 8th product, then the tail
                k = keys[kv, t]
                if body:  # the lanes in locals: registers, not memory, between the steps
                    a0, a1, a2, a3 = qv[0] * k[0], qv[1] * k[1], qv[2] * k[2], qv[3] * k[3]
                    a4, a5, a6, a7 = qv[4] * k[4], qv[5] * k[5], qv[6] * k[6], qv[7] * k[7]
                    for h0 in range(8, body, 8):
                        a0, a1 = a0 + qv[h0] * k[h0], a1 + qv[h0 + 1] * k[h0 + 1]
                        a2, a3 = a2 + qv[h0 + 2] * k[h0 + 2], a3 + qv[h0 + 3] * k[h0 + 3]
                        a4, a5 = a4 + qv[h0 + 4] * k[h0 + 4], a5 + qv[h0 + 5] * k[h0 + 5]
                        a6, a7 = a6 + qv[h0 + 6] * k[h0 + 6], a7 + qv[h0 + 7] * k[h0 + 7]
                    s = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
                else:
                    s = zero
                for h in range(body, head):
                    s = s + qv[h] * k[h]
                scores[t] = s * scale
            if has_bias:  # added to the scaled scores, each sum rounded (before the window's mask)
                b = bias[kv if bias_kv else 0, g if bias_g else 0]
                for t in range(total):
                    scores[t] = scores[t] + b[t]
            for t in range(min(window_start, total)):
                scores[t] = lowest
            top = scores[0]
            for t in range(1, total):
                top = np.maximum(top, scores[t])
            o = into[kv, g]
            if top == lowest:  # nothing visible: zeros
                o[:] = zero
                continue
            negmax = -top
            for lane in range(width):
                lanes[lane] = zero
            for t in range(total):  # exps into `scores`, summed in the kernel's lanes
                e = exp_biased(scores[t] + negmax, wide)
                scores[t] = e
                lane = t % width
                lanes[lane] = e if t < width else lanes[lane] + e
            if wide:
                t0, t1, t2, t3 = lanes[8] + lanes[0], lanes[9] + lanes[1], lanes[10] + lanes[2], lanes[11] + lanes[3]
                t4, t5, t6, t7 = lanes[12] + lanes[4], lanes[13] + lanes[5], lanes[14] + lanes[6], lanes[15] + lanes[7]
                sums = ((t0 + t1) + (t2 + t3)) + ((t4 + t5) + (t6 + t7))
            else:
                sums = ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7])) + ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
            inverse = one / sums if sums > zero else zero
            v0 = values[kv, 0]
            e0 = scores[0]
            for h in range(head):  # MlasGQADecodeSV: one running sum per feature, in key order
                row[h] = e0 * v0[h]
            for t in range(1, total):
                vt = values[kv, t]
                e = scores[t]
                for h in range(head):
                    row[h] = row[h] + e * vt[h]
            for h in range(head):
                o[h] = row[h] * inverse

NO_BIAS = np.zeros((1, 1, 1), f32)  # the decode kernel's bias argument where there is none


@numba.njit(types.none(r3, r2, r2, types.int64, c3, r3, r3, r2, r2, c3, c3, types.int64, r3, types.float32, c3,
                       types.boolean, r3, types.boolean), nogil=True, cache=True)
def grow_and_attend_kernel(halves, cos_rows, sin_rows, position, rotated, past_k, past_v, k_rows, v_rows,
                           present_k, present_v, pos, q, scale, into, wide, bias, has_bias):
    """One growing cache's decode call: the rotation (`rotate_rows_kernel`, into
    `rotated`, which `q` and `k_rows` view), the presents (the past rows 0..pos-1, then
    the new K/V row at pos) and the attention over rows 0..pos (`decode_attention_kernel`)."""
    rotate_rows_kernel(halves, cos_rows, sin_rows, position, rotated)
    for h in range(present_k.shape[0]):
        present_k[h, :pos] = past_k[h]
        present_v[h, :pos] = past_v[h]
        present_k[h, pos] = k_rows[h]
        present_v[h, pos] = v_rows[h]
    decode_attention_kernel(q, present_k, present_v, pos + 1, scale, 0, into, wide, bias, has_bias)
