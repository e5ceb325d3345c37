"""Compiled twins (numba) of numpy emulations of onnxruntime's float32 arithmetic:
MLAS's logistic (`ort_float32.logistic`), onnxruntime's RMS-norm sum of squares
(`ort_float32.sum_of_squares_fma8`), MLAS's rotary embedding (`ort_float32.rotate_pair`)
and its one-token GroupQueryAttention decode (`mlas_attention.decode_attention`).

The emulations are exact but cost tens of numpy calls each (their fmas are float64
sums checked for double rounding); a step of SmolLM2-135M's int4 export ran 30 of each.
Here every fma MLAS takes is one ``llvm.fma.f32`` (`fma32`, exact on any CPU) and
nothing else is fused: the kernels compile without fast-math, so each other product
and sum rounds as written, in the emulation's order. `available` holds each twin to
its emulation once per process (`numba_support.enabled` false: the emulation runs).
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import mlas_isa, numba_support

F32 = np.dtype(np.float32)
def available(name: str) -> bool:
    """Whether the compiled `name` ("logistic", "sum_of_squares", "skip_rms_row",
    "rms_rows", "rotate_rows", "decode_attention") is taken."""
    return numba_support.enabled() and _self_checked(name)


@functools.cache
def _self_checked(name: str) -> bool:
    from . import mlas_attention, ort_float32

    r = np.random.default_rng(11)
    kernels = _kernels()
    if name == "logistic":
        x = np.concatenate([r.standard_normal(4000) * 6, np.linspace(-20, 20, 801), [17.999, 18, -18]])
        x = x.astype(F32)
        same = all(np.array_equal(kernels.logistic(x, np.empty_like(x), clamp),
                                  ort_float32.logistic_emulated(x, upper_clamp=clamp))
                   for clamp in (False, True))
    elif name == "sum_of_squares":
        same = True
        for n in (16, 27, 64, 576, 1539):
            rows = (r.standard_normal((3, n)) * 5).astype(F32)
            same = same and np.array_equal(kernels.sum_of_squares(rows, np.empty((3, 1), F32)),
                                           ort_float32.sum_of_squares_emulated(rows))
    elif name == "skip_rms_row":
        from .contrib_norm import row_rms

        same = True
        for n in (7, 64, 576):
            x, skip, gamma = ((r.standard_normal(n) * 3).astype(F32) for _ in range(3))
            s, y = np.empty(n, F32), np.empty(n, F32)
            skip_rms_row(x, skip, gamma, F32.type(n), F32.type(1e-5), s, y)
            want_s = np.add(x, skip, dtype=F32)
            want_y = np.divide(want_s, row_rms(want_s, np.empty(n, F32), (F32.type(n), F32.type(1e-5)), F32))
            want_y = np.multiply(want_y, gamma, dtype=F32)
            same = same and np.array_equal(s, want_s) and np.array_equal(y.view(np.int32), want_y.view(np.int32))
    elif name == "rms_rows":
        from .normalization import _rms_norm_as_onnxruntime

        same = True
        for rows_, n in ((3, 7), (2, 16), (3, 27), (1, 576)):
            rows = (r.standard_normal((rows_, n)) * 3).astype(F32)
            scale = r.standard_normal(n).astype(F32)
            y, inv = np.empty((rows_, n), F32), np.empty(rows_, F32)
            rms_rows(rows, scale, F32.type(1e-6), y, inv)
            want_y, want_inv = _rms_norm_as_onnxruntime(rows, scale, (-1,), F32.type(1e-6), None,
                                                        ort_float32.sum_of_squares_emulated)
            same = same and np.array_equal(y.view(np.int32), want_y.view(np.int32)) \
                and np.array_equal(inv, want_inv.reshape(-1))
    elif name == "rotate_rows":
        halves = (r.standard_normal((5, 2, 32)) * 4).astype(F32)
        cos, sin = r.uniform(-1, 1, (3, 32)).astype(F32), r.uniform(-1, 1, (3, 32)).astype(F32)
        rotated = np.empty_like(halves)
        rotate_rows(halves, cos, sin, 2, rotated)
        want = ort_float32.rotate_pair(halves[:, 0], halves[:, 1], cos[2], sin[2])
        same = np.array_equal(rotated[:, 0], want[0]) and np.array_equal(rotated[:, 1], want[1])
    else:
        same = True
        for kv, g, t, h, window, bias_shape in ((3, 3, 37, 64, 0, None), (2, 1, 5, 13, 2, None),
                                                (1, 4, 17, 8, 0, None), (2, 2, 19, 16, 3, (2, 2, 19)),
                                                (3, 2, 21, 8, 0, (1, 1, 21))):
            q = (r.standard_normal((kv, g, h)) * 3).astype(F32)
            keys = (r.standard_normal((kv, t + 3, h)) * 3).astype(F32)  # rows t.. beyond the total
            values = r.standard_normal((kv, t + 3, h)).astype(F32)
            bias = None if bias_shape is None else (r.standard_normal(bias_shape) * 2).astype(F32)
            want = mlas_attention.decode_attention_emulated(q, keys[:, :t], values[:, :t], 0.125, window, bias)
            got = decode_attention(q, keys, values, 0.125, window, np.empty((kv, g, h), F32), bias, total=t)
            same = same and np.array_equal(got.view(np.int32), want.view(np.int32))
    if not same:
        warnings.warn(f"numba's {name} differs from its numpy emulation on this machine; the emulation is taken "
                      "(same values, slower)", RuntimeWarning, stacklevel=2)
    return same


def logistic(flat: np.ndarray, into: np.ndarray, upper_clamp: bool) -> np.ndarray:
    """MLAS's logistic of the float32 vector `flat` into `into` (same shape)."""
    return _kernels().logistic(flat, into, upper_clamp)


def sum_of_squares(rows: np.ndarray) -> np.ndarray:
    """`ort_float32.sum_of_squares_fma8` of the float32 rows (rows, n >= 16): (rows, 1)."""
    return _kernels().sum_of_squares(rows, np.empty((rows.shape[0], 1), F32))


def skip_rms_row(x: np.ndarray, skip: np.ndarray, gamma: np.ndarray, hidden: np.float32, eps: np.float32,
                 s: np.ndarray, y: np.ndarray) -> None:
    """SkipSimplifiedLayerNormalization of one float32 row, C-contiguous 1-D arrays:
    the sum into `s`, the output into `y` (`contrib_norm.row_rms`'s rounding)."""
    _kernels().skip_rms_row(x, skip, gamma, hidden, eps, s, y)


def rms_rows(rows: np.ndarray, scale: np.ndarray, eps: np.float32, y: np.ndarray, inv: np.ndarray) -> None:
    """onnxruntime's RMS norm of float32 rows (R, n) C-contiguous, by `scale` (n,), into
    `y` (R, n) and the inverse RMS into `inv` (R,)."""
    _kernels().rms_rows(rows, scale, eps, y, inv)


def rotate_rows(halves: np.ndarray, cos: np.ndarray, sin: np.ndarray, position: int,
                rotated: np.ndarray) -> None:
    """`ort_float32.rotate_pair` of the float32 rows' halves (rows, 2, half) by row
    `position` of the cos/sin caches (positions, half), into `rotated` (rows, 2, half).
    The kernel takes C-contiguous arrays (one signature, compiled once); others are
    copied first, the result too."""
    into = rotated if rotated.flags.c_contiguous else np.empty(rotated.shape, F32)
    _kernels().rotate_rows(_contiguous(halves), _contiguous(cos), _contiguous(sin), position, into)
    if into is not rotated:
        rotated[...] = into


def decode_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, scale: float, window_start: int,
                     into: np.ndarray, bias: np.ndarray | None = None, total: int | None = None) -> np.ndarray:
    """`mlas_attention.decode_attention` of float32 q (KV, G, H) over rows 0..total-1 of
    the keys and values (KV, L >= total, H; total None: all L), into `into` (KV, G, H)
    float32; `bias` None or float32 (KV | 1, G | 1, W >= total). The kernel takes
    C-contiguous arrays (one signature, compiled once): a whole cache and the rows
    to read, not a view of those rows; others are copied first."""
    kernels = _kernels()
    has_bias = bias is not None
    out = into if into.flags.c_contiguous else np.empty(into.shape, F32)
    kernels.decode_attention(_contiguous(q), _contiguous(keys), _contiguous(values),
                             keys.shape[1] if total is None else total, np.float32(scale), window_start, out,
                             _wide(), _contiguous(bias) if has_bias else kernels.no_bias, has_bias)
    if out is not into:
        into[...] = out
    return into


def _wide() -> bool:
    """Whether MLAS takes its AVX-512F sum-exp kernel here (16 lanes), else FMA3's (8)."""
    return mlas_isa.isa() == "avx512"


def _contiguous(a: np.ndarray) -> np.ndarray:
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


@functools.cache
def _kernels():
    import numba
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

    @intrinsic
    def float32_of_bits(typingctx, word):
        """The float32 whose bits are the int32 `word`."""
        sig = types.float32(types.int32)

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(types.float32))
        return sig, codegen

    @intrinsic
    def float64_of_bits(typingctx, word):
        """The float64 whose bits are the int64 `word`."""
        sig = types.float64(types.int64)

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(types.float64))
        return sig, codegen

    jit = functools.partial(numba.njit, nogil=True, cache=True)
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

    return _Kernels(logistic=logistic_kernel, sum_of_squares=sum_of_squares_kernel, skip_rms_row=skip_rms_row_kernel,
                    rms_rows=rms_rows_kernel, rotate_rows=rotate_rows_kernel, decode_attention=decode_attention_kernel,
                    no_bias=np.zeros((1, 1, 1), f32))


@dataclass(frozen=True, slots=True)
class _Kernels:
    logistic: Any
    sum_of_squares: Any
    skip_rms_row: Any
    rms_rows: Any
    rotate_rows: Any
    decode_attention: Any
    no_bias: np.ndarray  # the bias argument where there is none
