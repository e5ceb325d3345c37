"""The compiled kernels of `nbits_int8_jit`, as module-level numba functions.

Imported by `nbits_int8_jit._kernels` on first use (so `import workbench` never
imports numba). Module level, not closures: numba's on-disk cache keys a closure on
its cell values, and a cell holding another jitted function pickles with a fresh id in
every process, so closures compiled again in each one (about 1.4 s); these load from
the cache.

Every inner loop runs over a chunk's columns through 1-D views, so LLVM sees
contiguous, non-negative indices and vectorizes it (an index computed into a 2-D
array becomes a gather).
"""

from __future__ import annotations

import functools

import numba
import numpy as np

jit = functools.partial(numba.njit, nogil=True, cache=True, fastmath={"contract"})
inline = functools.partial(jit, inline="always")
f32 = np.float32
zero = f32(0.0)
sixteen, sixteenth = f32(16.0), f32(0.0625)


@jit
def quantize(a, qa, sa, asum):
    """A per block of 32, zero padded: ``scale = max|a| / 127``, ``q = rint(a * (127 / max|a|))``."""
    m, k = a.shape
    blocks = sa.shape[1]
    for r in range(m):
        for b in range(blocks):
            k0 = b * 32
            amax = zero
            for j in range(32):
                if k0 + j < k:
                    amax = max(amax, abs(a[r, k0 + j]))
            inv = f32(127.0) / amax if amax != zero else f32(1.0)
            total = zero
            for j in range(32):
                v = np.rint(a[r, k0 + j] * inv) if k0 + j < k else zero
                qa[r, k0 + j] = v
                total += v
            sa[r, b] = amax / f32(127.0)
            asum[r, b] = sa[r, b] * total


@inline
def lane_fma(lane, w, at, a, s_a, sc, zp, lane_sum):
    """``lane = fma(dot - zp * lane_sum, s_a * sc, lane)`` per column: the dot of
    A's 8 integers `a` with the unsigned weights of the lane's 8 inputs, stored as the
    byte rows at..at+3.

    A byte b holds lo + 16 hi; with h = floor(b / 16) (exact in float32),
    ``x lo + y hi = x b + (y - 16 x) h``: two products a byte, no integer unpacking
    (which LLVM does not vectorize here), every term an exact integer."""
    a0, a2, a4, a6 = a[0], a[2], a[4], a[6]
    c0, c2, c4, c6 = a[1] - sixteen * a0, a[3] - sixteen * a2, a[5] - sixteen * a4, a[7] - sixteen * a6
    r0, r1, r2, r3 = w[at], w[at + 1], w[at + 2], w[at + 3]
    for j in range(lane.shape[0]):
        b0, b1, b2, b3 = f32(r0[j]), f32(r1[j]), f32(r2[j]), f32(r3[j])
        dot = (a0 * b0 + c0 * np.floor(b0 * sixteenth) + a2 * b1 + c2 * np.floor(b1 * sixteenth)
               + a4 * b2 + c4 * np.floor(b2 * sixteenth) + a6 * b3 + c6 * np.floor(b3 * sixteenth))
        dot = dot - zp[j] * lane_sum
        lane[j] = dot * (s_a * sc[j]) + lane[j]


@inline
def quad_fma(lane, w, at0, at1, a0, a1, a2, a3, s_a, sc, zp, quad_sum):
    """`lane_fma` for 4 inputs, the byte rows at0 and at1."""
    c0, c2 = a1 - sixteen * a0, a3 - sixteen * a2
    r0, r1 = w[at0], w[at1]
    for j in range(lane.shape[0]):
        b0, b1 = f32(r0[j]), f32(r1[j])
        dot = a0 * b0 + c0 * np.floor(b0 * sixteenth) + a2 * b1 + c2 * np.floor(b1 * sixteenth)
        dot = dot - zp[j] * quad_sum
        lane[j] = dot * (s_a * sc[j]) + lane[j]


@inline
def fold(x, v, col0, single_from):
    """MLAS's sum of 8 lanes per column; the columns from `single_from` on (N % 4 of
    them, its one-column kernel) in another order."""
    width = v.shape[0]
    split = min(max(single_from - col0, 0), width)
    x0, x1, x2, x3, x4, x5, x6, x7 = x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7]
    for j in range(split):
        v[j] = (((x0[j] + x1[j]) + x2[j]) + x3[j]) + (((x4[j] + x5[j]) + x6[j]) + x7[j])
    for j in range(split, width):
        v[j] = ((x4[j] + x0[j]) + (x6[j] + x2[j])) + ((x5[j] + x1[j]) + (x7[j] + x3[j]))


@inline
def finish(v, out, bias, has_bias, with_chain, asum_r, blk_sums, chain):
    """out = v (+ bias) (+ MLAS's BlkSum SGEMM: fma over blocks from 0, added last);
    out, bias: the chunk's columns."""
    width = v.shape[0]
    if has_bias:
        for j in range(width):
            v[j] = v[j] + bias[j]
    if with_chain:
        chain[:] = zero
        for b in range(asum_r.shape[0]):
            s = asum_r[b]
            bs = blk_sums[b]
            for j in range(width):
                chain[j] = s * bs[j] + chain[j]
        for j in range(width):
            v[j] = chain[j] + v[j]
    for j in range(width):
        out[j] = v[j]


@inline
def layout(qa, sa, nibbles, n_total):
    """A call's rows, blocks, chunk width, first one-column-kernel column, and its
    scratch: a chunk row's folded sums, its BlkSum chain, a lane's 8 integers of A."""
    width = nibbles.shape[2]
    return (qa.shape[0], sa.shape[1], width, n_total - n_total % 4, np.empty(width, f32), np.empty(width, f32),
            np.empty(8, f32))


@jit
def columns_avx2(qa, sa, asum, alone_last, nibbles, row_of, scales, zps, blk_sums, bias, has_bias, has_zp, n_total, y,
                 c_first, c_stop):
    """Column chunks ``c_first <= c < c_stop`` of every row of y, MLAS's AVX2 kernels.
    Several rows take the weights unsigned; a row alone (its M = 1 kernel) signed,
    ``q - zp``: the unsigned dot less zp times A's sum over the lane (exact)."""
    m, blocks, width, single_from, v, chain, a = layout(qa, sa, nibbles, n_total)
    pairs = blocks // 2
    acc = np.empty((8, width), f32)
    for c in range(c_first, c_stop):
        w, sc_c, zp_c = nibbles[c], scales[c], zps[c]
        col0 = c * width
        for r in range(m):
            q = qa[r]
            alone = alone_last and r == m - 1
            acc[:] = zero
            if alone and has_zp:  # the M = 1 kernel with zero points: block by block
                for b in range(blocks):
                    for lane in range(8):
                        k0 = b * 32 + 4 * lane
                        a0, a1, a2, a3 = q[k0], q[k0 + 1], q[k0 + 2], q[k0 + 3]
                        quad_fma(acc[lane], w, row_of[k0 // 2], row_of[k0 // 2 + 1], a0, a1, a2, a3, sa[r, b],
                                 sc_c[b], zp_c[b], (a0 + a1) + (a2 + a3))
            else:  # blocks in pairs (MLAS's lane L: 8 inputs on), then an odd last block by quads
                for p in range(pairs):
                    for lane in range(8):
                        # MLAS's lanes 0, 1, 4, 5: elements 0-7, 8-15, 16-23, 24-31 of the
                        # pair's first block; 2, 3, 6, 7 the same of its second
                        second = (lane // 2) % 2
                        k0 = p * 64 + 32 * second + 16 * (lane // 4) + 8 * (lane % 2)
                        b = 2 * p + second
                        for i in range(8):
                            a[i] = q[k0 + i]
                        lane_sum = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])) \
                            if alone else zero
                        lane_fma(acc[lane], w, p * 32 + 4 * lane, a, sa[r, b], sc_c[b], zp_c[b], lane_sum)
                if blocks % 2:
                    b = blocks - 1
                    for lane in range(8):
                        k0 = b * 32 + 4 * lane
                        a0, a1, a2, a3 = q[k0], q[k0 + 1], q[k0 + 2], q[k0 + 3]
                        quad_sum = (a0 + a1) + (a2 + a3) if alone else zero
                        quad_fma(acc[lane], w, k0 // 2, k0 // 2 + 1, a0, a1, a2, a3, sa[r, b], sc_c[b], zp_c[b],
                                 quad_sum)
            fold(acc, v, col0, single_from)
            finish(v, y[r, col0:col0 + width], bias[col0:col0 + width], has_bias, not alone, asum[r],
                   blk_sums[c], chain)


@jit
def columns_avx512(qa, sa, asum, nibbles, scales, blk_sums, bias, has_bias, n_total, y, c_first, c_stop):
    """Column chunks ``c_first <= c < c_stop`` of every row of y, MLAS's AVX-512 kernel
    (unsigned weights)."""
    m, blocks, width, single_from, v, chain, a = layout(qa, sa, nibbles, n_total)
    groups = blocks // 4
    acc = np.empty((16, width), f32)
    x = np.empty((8, width), f32)
    no_zp = np.zeros(width, f32)
    for c in range(c_first, c_stop):
        w, sc_c = nibbles[c], scales[c]
        col0 = c * width
        for r in range(m):
            q = qa[r]
            acc[:] = zero
            for g in range(groups):
                for lane in range(16):
                    # lane 4c + p: products base + 0..3 and base + 8..11 of the group's 128
                    offset = 64 * ((lane % 4) // 2) + 16 * (lane // 4) + 4 * (lane % 2)
                    k0 = g * 128 + offset
                    b = g * 4 + offset // 32
                    for i in range(4):
                        a[i] = q[k0 + i]
                        a[4 + i] = q[k0 + 8 + i]
                    lane_fma(acc[lane], w, g * 64 + 4 * lane, a, sa[r, b], sc_c[b], no_zp, zero)
            for lane in range(8):
                low, high, out = acc[lane], acc[lane + 8], x[lane]
                for j in range(width):
                    out[j] = low[j] + high[j]
            for b in range(groups * 4, blocks):  # the last blocks, lane j their elements 4j..4j+3
                for lane in range(8):
                    k0 = b * 32 + 4 * lane
                    quad_fma(x[lane], w, k0 // 2, k0 // 2 + 1, q[k0], q[k0 + 1], q[k0 + 2], q[k0 + 3], sa[r, b],
                             sc_c[b], no_zp, zero)
            fold(x, v, col0, single_from)
            finish(v, y[r, col0:col0 + width], bias[col0:col0 + width], has_bias, True, asum[r], blk_sums[c],
                   chain)


# a weight's column chunks split between threads (used where `numba_support.parallel`)
split = functools.partial(numba.njit, nogil=True, cache=True, parallel=True)


@split
def split_avx2(qa, sa, asum, alone_last, nibbles, row_of, scales, zps, blk_sums, bias, has_bias, has_zp,
               n_total, y, parts, chunks):
    for part in numba.prange(parts):
        columns_avx2(qa, sa, asum, alone_last, nibbles, row_of, scales, zps, blk_sums, bias, has_bias, has_zp,
                     n_total, y, chunks * part // parts, chunks * (part + 1) // parts)


@split
def split_avx512(qa, sa, asum, nibbles, scales, blk_sums, bias, has_bias, n_total, y, parts, chunks):
    for part in numba.prange(parts):
        columns_avx512(qa, sa, asum, nibbles, scales, blk_sums, bias, has_bias, n_total, y,
                       chunks * part // parts, chunks * (part + 1) // parts)
