"""MatMulNBits' int8 compute (accuracy_level 4) for 4-bit weights in blocks of 32, MLAS's
x86-64 kernels compiled by numba where it is installed: the same float32 arithmetic as
the numpy emulations, bit for bit, at a fraction of their cost.

numpy has no fma and no int8 products, so `nbits_int8` (MLAS's AVX-512 kernel) and
`nbits_int8_avx2` (its AVX2 kernels) stream the weights' integers as float32 (4 bytes
a weight) and emulate each fma with float64 passes: SmolLM2-135M's int4 export took
~140 ms a token there against onnxruntime's ~6. Here the weights are onnxruntime's own
4-bit bytes, each output column's float32 lanes stay in cache, and every ``lane = fma(dot,
fl(scale_a * scale_b), lane)`` is one hardware fma: numba compiles with LLVM's
``contract`` flag only (no reassociation), so ``x * y + z`` becomes ``fma(x, y, z)``
on the CPUs these kernels are taken on (x86-64 with FMA3), and `available` checks
each form once against its numpy emulation before it is used.

Two forms, named by the MLAS kernel they are (`mlas_isa.isa`):

- ``"avx2"``: `nbits_int8_avx2`'s docstring (8 lanes fed per pair of blocks, the
  one-row and several-row kernels, the BlkSum correction after the bias);
- ``"avx512"``: `nbits_int8`'s (unsigned weights, 16 lanes per group of 4 blocks,
  lanes j and j + 8 added, the last blocks by quads, the zero points last).

A is quantized per block as `nbits_int8.quantize_rows` does. The integer dots are exact
in float32 (|dot| < 2^14), so summing them in any order is the same value.
`WORKBENCH_NUMBA=0` turns this off (`numba_support.enabled`: the numpy emulations are
taken); tests run both.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import warnings

import numpy as np

from . import numba_support

F32 = np.dtype(np.float32)
#: the chunk widths a weight's columns may be cut in (`_chunk_width`)
_WIDTHS = (256, 192, 128, 64)
_BLOCK = 32
#: MLAS's row chunk (``MlasQNBitGemmBatch``'s StrideM): a chunk of one row takes the M = 1 kernel
_STRIDE_M = 128
#: weights (N x K) from which a call splits its columns between two threads
_SPLIT_WEIGHTS = 1 << 18


@dataclasses.dataclass(frozen=True)
class JitBlk32Weights:
    """A 4-bit, block-32 weight for the compiled kernel of `form`, in chunks of `width`
    output columns: ``nibbles[c, i, j]`` holds the unsigned integers q (0..15) of inputs
    2i (low 4 bits) and 2i + 1 (high) of column ``c * width + j`` (zero past N and past
    K: onnxruntime's bytes, column-interleaved), i being stored at ``row_of[i]`` (the
    order the kernel reads them, `_visit_order`); per block ``scales``, ``zero_points``
    and ``blk_sums = fl(-scale * zp)`` as float32 ``[chunks, blocks, width]``."""

    form: str
    nibbles: np.ndarray
    row_of: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray
    blk_sums: np.ndarray
    has_zero_points: bool
    N: int
    K: int
    blocks: int
    #: (thread, rows) -> A's quantized scratch (`_scratch`)
    scratch: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)


def _chunk_width(n: int) -> int:
    """Columns per chunk: the widest of 256, 192, 128, 64 that pads N by least (long inner
    loops pay the per-lane set-up less often; SmolLM2's 576 / 960 / 3072 / 49152 are
    multiples of 192)."""
    return min(_WIDTHS, key=lambda c: (-(-n // c) * c - n, -c))


def prepare(q: np.ndarray, scales: np.ndarray, zp: np.ndarray, has_zero_points: bool, K: int,
            form: str) -> JitBlk32Weights:
    """The layout from the unpacked weights ``q [N, blocks, 32]`` (0..15), ``scales
    [N, blocks]`` (float32) and zero points ``zp [N, blocks]`` (8 where none given)."""
    n, blocks, block = q.shape
    width = _chunk_width(n)
    chunks = -(-n // width)
    padded = chunks * width
    taken = np.zeros((padded, blocks * block), np.uint8)
    taken[:n] = q.reshape(n, -1)
    taken[:, K:] = 0  # past K: A's zero padding times anything, kept exactly zero
    pairs = taken.reshape(padded, -1, 2)  # inputs 2i and 2i + 1 share a byte: 4 bits each
    packed = (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)
    order = _visit_order(blocks, form)
    nibbles = np.ascontiguousarray(packed[:, order].reshape(chunks, width, -1).transpose(0, 2, 1))

    def per_block(x: np.ndarray) -> np.ndarray:  # [chunks, blocks, width]: a chunk's values side by side
        out = np.zeros((padded, blocks), F32)
        out[:n] = x
        return np.ascontiguousarray(out.reshape(chunks, width, blocks).transpose(0, 2, 1))

    scales_t = per_block(scales.astype(F32))
    zp_t = per_block(zp.astype(F32))
    return JitBlk32Weights(form, nibbles, np.argsort(order).astype(np.int64), scales_t, zp_t,
                           (-(scales_t * zp_t)).astype(F32), has_zero_points, n, K, blocks)


def _visit_order(blocks: int, form: str) -> np.ndarray:
    """The byte rows (two inputs each) in the order the kernel's lanes read them, so a
    chunk streams through memory front to back: per pair of blocks (AVX2) or group of 4
    (AVX-512), lane by lane, each lane's 4 byte rows; the blocks past them as they are."""
    span = 2 if form == "avx2" else 4
    rows = []
    for first in range(0, blocks - blocks % span, span):
        base = first * 32  # in inputs
        for lane in range(4 * span):
            if form == "avx2":  # MLAS's lane L: 8 inputs from 32 second + 16 (L // 4) + 8 (L % 2)
                k0 = base + 32 * ((lane // 2) % 2) + 16 * (lane // 4) + 8 * (lane % 2)
                k4 = k0 + 4
            else:  # lane 4c + p: inputs base + 0..3 and base + 8..11, base = 64 (p // 2) + 16 c + 4 (p % 2)
                k0 = base + 64 * ((lane % 4) // 2) + 16 * (lane // 4) + 4 * (lane % 2)
                k4 = k0 + 8
            rows += [k0 // 2, k0 // 2 + 1, k4 // 2, k4 // 2 + 1]
    rows += range(len(rows), blocks * 16)
    return np.array(rows, np.int64)


def matmul(a: np.ndarray, w: JitBlk32Weights, bias: np.ndarray | None, into: np.ndarray | None = None) -> np.ndarray:
    """``A [M, K] @ W^T (+ bias)`` as MLAS's CompInt8 blklen-32 kernel of `w.form`
    (float32 [M, N]): into `into` where that is a C-contiguous float32 [M, N] array and N
    fills whole chunks, else a new array."""
    kernel = _kernels()
    m = a.shape[0]
    a = np.ascontiguousarray(a, F32)
    qa, sa, asum = _scratch(w, m)
    kernel.quantize(a, qa, sa, asum)
    has_bias = bias is not None
    chunks, _, width = w.nibbles.shape
    padded = chunks * width
    if has_bias:
        b = np.zeros(padded, F32)  # read in whole chunks
        b[:w.N] = bias.reshape(-1)
    else:
        b = _NO_BIAS  # unread
    if (into is not None and padded == w.N and into.dtype == F32 and into.shape == (m, w.N)
            and into.flags.c_contiguous):
        y = into
    else:
        y = np.empty((m, padded), F32)
    if w.form == "avx2":
        # MLAS computes rows in chunks of 128; a chunk of one row takes its M = 1 kernel
        alone = m % _STRIDE_M == 1
        columns = kernel.columns_avx2
        args = (qa, sa, asum, alone, w.nibbles, w.row_of, w.scales, w.zero_points, w.blk_sums, b, has_bias, w.has_zero_points,
                w.N, y)
    else:
        columns = kernel.columns_avx512
        args = (qa, sa, asum, w.nibbles, w.scales, w.blk_sums, b, has_bias, w.N, y)
    parts = min(numba_support.threads(), chunks) if w.N * w.K * m >= _SPLIT_WEIGHTS else 1
    if parts > 1 and numba_support.parallel():
        (kernel.split_avx2 if w.form == "avx2" else kernel.split_avx512)(*args, parts, chunks)
    else:
        columns(*args, 0, chunks)
    return y if padded == w.N else y[:, :w.N]


_NO_BIAS = np.zeros(max(_WIDTHS), F32)
_scratch_lock = threading.Lock()


def _scratch(w: JitBlk32Weights, m: int) -> tuple:
    """A's integers, scales and sums for `m` rows of `w`, kept per weight and thread
    (a kernel call fills them before reading them; two threads never share them)."""
    key = (threading.get_ident(), m)
    held = w.scratch.get(key)
    if held is None:
        with _scratch_lock:
            held = w.scratch[key] = (np.empty((m, w.blocks * _BLOCK), F32), np.empty((m, w.blocks), F32),
                                     np.empty((m, w.blocks), F32))
    return held


def available(form: str) -> bool:
    """Whether the compiled kernel of `form` is taken: numba importable, not turned off
    by ``WORKBENCH_NUMBA=0``, and found bit for bit its numpy emulation on small cases
    (every row kind, odd and partial block groups, a one-column fold) once per process."""
    return numba_support.enabled() and _self_checked(form)


@functools.cache
def _self_checked(form: str) -> bool:
    r = np.random.default_rng(7)
    for k, n in ((96, 70), (232, 9)):
        blocks = -(-k // _BLOCK)
        for has_zp in (False, True):
            q = r.integers(0, 16, (n, blocks, _BLOCK)).astype(np.uint8)
            scales = (r.random((n, blocks)) * 0.05 + 0.005).astype(F32)
            zp = r.integers(0, 16, (n, blocks)).astype(np.int16) if has_zp else np.full((n, blocks), 8, np.int16)
            bias = r.standard_normal(n).astype(F32)
            jit = prepare(q, scales, zp, has_zp, k, form)
            for m in (1, 3):
                a = (r.standard_normal((m, k)) * 3).astype(F32)
                want = emulated(a, q, scales, zp, has_zp, k, form, bias)
                if not np.array_equal(matmul(a, jit, bias).view(np.int32), want.view(np.int32)):
                    # e.g. a CPU without FMA3, where LLVM cannot contract x * y + z
                    warnings.warn(f"numba's {form} MatMulNBits kernel differs from its numpy emulation on this "
                                  "machine; the emulation is taken (same values, slower)", RuntimeWarning,
                                  stacklevel=2)
                    return False
    return True


def emulated(a: np.ndarray, q: np.ndarray, scales: np.ndarray, zp: np.ndarray, has_zero_points: bool, K: int,
             form: str, bias: np.ndarray | None) -> np.ndarray:
    """The numpy emulation of `form`'s kernel on the same weights (what `available` and
    the tests hold the compiled kernels to)."""
    from . import nbits_int8, nbits_int8_avx2

    if form == "avx2":
        w = nbits_int8_avx2.prepare(q, scales, zp, has_zero_points, K)
        return nbits_int8_avx2.matmul(a, w, bias, nbits_int8.quantize_rows)
    return nbits_int8.matmul(np, a, nbits_int8.prepare_blk32(np, q, scales, zp, K), bias)


@functools.cache
def _kernels():
    """The compiled kernels (numba imported and the functions jitted on first use).

    Every inner loop runs over a chunk's columns through 1-D views, so LLVM sees
    contiguous, non-negative indices and vectorizes it (an index computed into a 2-D
    array becomes a gather)."""
    import numba

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

    return _Kernels(quantize, columns_avx2, columns_avx512, split_avx2, split_avx512)


@dataclasses.dataclass(frozen=True)
class _Kernels:
    quantize: object
    columns_avx2: object
    columns_avx512: object
    split_avx2: object
    split_avx512: object
