"""MatMulNBits' int8 compute (accuracy_level 4) for 4-bit weights in blocks of 32, as
onnxruntime 1.32's MLAS computes it on x86-64 CPUs with AVX2 and no AVX-512
(``sqnbitgemm_kernel_avx2_int8_blklen32.h``, ``sqnbitgemm_m1_sym_kernel_avx2_int8_blklen32.h``
and the BlkSum path of ``SQ4BitGemm_CompInt8``), bit for bit. `nbits_int8` takes this
form where `mlas_isa.isa` says "avx2" (its own `Blk32Weights` is MLAS's AVX-512 kernel).

A is quantized as `nbits_int8.quantize_rows` does (the AVX2 quantizer rounds alike:
``scale = max|a| / 127``, ``round_half_even(a * (127 / max|a|))``, ``asum = fl(scale *
sum q)``). Per output column, MLAS keeps 8 float32 lanes:

- blocks are taken in pairs (2p, 2p + 1); lane L holds the integer dot of 8 of the
  pair's 64 products: L = 0, 1, 4, 5 elements 0-7, 8-15, 16-23, 24-31 of block 2p,
  L = 2, 3, 6, 7 the same of block 2p + 1 (``maddubs`` + ``hadd`` + ``madd``), and takes
  ``lane = fma(dot, fl(scale_a * scale_b) of its block, lane)`` once per pair;
- an odd last block: lane j takes the dot of its elements 4j..4j+3, ``fma`` with that
  block's scale product;
- lanes are folded ``((x0+x1)+x2)+x3 + (((x4+x5)+x6)+x7)`` (columns in groups of 4;
  the last ``N % 4`` columns ``((x4+x0)+(x6+x2)) + ((x5+x1)+(x7+x3))``), then the bias
  is added.

What the integers are depends on how many rows MLAS's call has (rows go in chunks of
128, so a chunk of one row is possible for M > 1):

- **one row** (the M = 1 kernel): signed weights ``q - zp`` (zp 8 when none is given);
  with zero points the pair is not fused: each block in order takes its own fma into
  lanes j = elements 4j..4j+3. Nothing is added afterwards.
- **several rows**: unsigned weights ``q`` (0..15); afterwards MLAS's float32 SGEMM adds
  the zero points: ``acc = fma(asum[b], fl(-scale_b * zp), acc)`` over blocks from 0,
  and ``y = fl(acc + y)``.

The integer dots are exact in float32 BLAS (|dot| <= 8 * 127 * 15). fma is float64
arithmetic rounded once to float32, every float64 sum checked for a double-rounding tie
(then recomputed by `ort_float32.fma32`). Tests: tests/ops/test_ort_nbits_avx2.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .ort_float32 import fma_chain

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
_BLOCK = 32
#: output columns computed at a time: lanes x rows x columns of a chunk at most this many
_CHUNK_ELEMENTS = 1 << 18
#: MLAS's row chunk (``MlasQNBitGemmBatch``'s StrideM)
_STRIDE_M = 128

#: lanes in the order kept here: the pair's first block's lanes (0, 1, 4, 5), then the
#: second's (2, 3, 6, 7), so a block's scale broadcasts over 4 adjacent lanes
_LANE_ORDER = np.array([0, 1, 4, 5, 2, 3, 6, 7])
#: within a pair of blocks (64 elements), where MLAS's lane L's 8 elements start
_LANE_START = np.array([0, 8, 32, 40, 16, 24, 48, 56])
#: kept lane i is MLAS's lane _LANE_ORDER[i]; MLAS's lane L is kept lane _KEPT[L]
_KEPT = np.argsort(_LANE_ORDER)


@dataclasses.dataclass(frozen=True)
class Avx2Blk32Weights:
    """A 4-bit, block-32 weight laid out for MLAS's AVX2 blklen-32 int8 kernels: the
    integers less their zero point (``q - zp``, zp 8 where none is given) as float32,
    ``lanes[p, i, j, n]`` element j of kept lane i of pair p (kept lane i is MLAS's lane
    ``_LANE_ORDER[i]``) and ``tail[l, j, n]`` element 4l + j of an odd last block; per
    block ``scales[b, n]`` and ``zero_points[b, n]`` (float32) and ``blk_sums[b, n] =
    fl(-scale * zp)``; the gathers that bring A's integers into the same order."""

    lanes: np.ndarray
    tail: np.ndarray | None
    scales: np.ndarray
    zero_points: np.ndarray
    blk_sums: np.ndarray
    has_zero_points: bool
    a_lanes: np.ndarray
    a_tail: np.ndarray | None
    K: int
    blocks: int


def prepare(q: np.ndarray, scales: np.ndarray, zp: np.ndarray, has_zero_points: bool, K: int) -> Avx2Blk32Weights:
    """The layout from the unpacked weights ``q [N, blocks, 32]`` (0..15), ``scales
    [N, blocks]`` (float32) and zero points ``zp [N, blocks]`` (8 where none given)."""
    n, blocks, block = q.shape
    pairs = blocks // 2
    a_lanes = (np.arange(pairs)[:, None, None] * 2 * _BLOCK + _LANE_START[_LANE_ORDER][None, :, None]
               + np.arange(8)[None, None, :]).reshape(-1)
    signed = (q.astype(np.int16) - zp.astype(np.int16)[:, :, None]).reshape(n, blocks * block).T.astype(F32)
    lanes = np.ascontiguousarray(signed[a_lanes].reshape(pairs, 8, 8, n))
    a_tail = tail = None
    if blocks % 2:
        a_tail = (blocks - 1) * _BLOCK + np.arange(_BLOCK)
        tail = np.ascontiguousarray(signed[a_tail].reshape(8, 4, n))
    scales_t = np.ascontiguousarray(scales.T.astype(F32))  # [blocks, N]
    zp_t = np.ascontiguousarray(zp.T.astype(F32))
    blk_sums = np.ascontiguousarray((-(scales_t * zp_t)).astype(F32))  # what MLAS packs
    return Avx2Blk32Weights(lanes, tail, scales_t, zp_t, blk_sums, has_zero_points, a_lanes, a_tail, K, blocks)


def _fold(x: np.ndarray, n_total: int, col0: int) -> np.ndarray:
    """MLAS's 8 lanes ``x [8, M, n]`` (its lane order) of columns col0.. summed as its
    kernels fold them."""
    y = (((x[0] + x[1]) + x[2]) + x[3]) + (((x[4] + x[5]) + x[6]) + x[7])
    single = n_total % 4  # the last N % 4 columns: the one-column kernel's order
    first_single = n_total - single
    nc = x.shape[-1]
    if single and col0 + nc > first_single:
        lo = max(first_single - col0, 0)
        r = x[..., lo:]
        y[:, lo:] = ((r[4] + r[0]) + (r[6] + r[2])) + ((r[5] + r[1]) + (r[7] + r[3]))
    return y


def matmul(a: np.ndarray, w: Avx2Blk32Weights, bias: np.ndarray | None, quantize_rows) -> np.ndarray:
    """``A [M, K] @ W^T (+ bias)`` as MLAS's AVX2 CompInt8 blklen-32 kernels (float32 [M, N])."""
    qa, sa = quantize_rows(np, a, _BLOCK, w.blocks)  # [blocks, M, 32], [blocks, M, 1]
    m = a.shape[0]
    sa = sa[:, :, 0]  # [blocks, M]
    asum = (sa * qa.sum(axis=-1)).astype(F32)  # MLAS's fl(scale_a * sum q_a)
    qrow = qa.transpose(1, 0, 2).reshape(m, -1)  # [M, K padded]
    pairs = w.lanes.shape[0]
    a_lanes = qrow[:, w.a_lanes].reshape(m, pairs, 8, 8).transpose(1, 2, 0, 3)  # [pairs, 8, M, 8]
    a_tail = None if w.a_tail is None else qrow[:, w.a_tail].reshape(m, 8, 4).transpose(1, 0, 2)  # [8, M, 4]
    # MLAS computes rows in chunks of 128; a chunk of one row (the last, where M % 128 is 1)
    # takes its M = 1 kernel
    alone = m % _STRIDE_M == 1
    fused = slice(0, m - 1 if alone else m)
    n = w.scales.shape[1]
    chunk = max(64, min(n, _CHUNK_ELEMENTS // (max(pairs, 1) * 8 * m)) // 4 * 4)
    y = np.empty((m, n), F32)
    for n0 in range(0, n, chunk):
        cols = slice(n0, min(n, n0 + chunk))
        sc = sa[:, :, None] * w.scales[:, None, cols]  # [blocks, M, nc]: fl(scale_a * scale_b)
        dots = np.matmul(a_lanes, w.lanes[:, :, :, cols]) if pairs else None  # [pairs, 8, M, nc], exact
        tail_dots = None if a_tail is None else np.matmul(a_tail, w.tail[:, :, cols])  # [8, M, nc]
        if fused.stop:
            y[fused, cols] = _rows_fused(a_lanes[:, :, fused], a_tail, dots, tail_dots, sc, asum, w, cols, n,
                                         bias, fused)
        if alone:
            last = slice(m - 1, m)
            y[last, cols] = _rows_alone(a_lanes[:, :, last], None if a_tail is None else a_tail[:, last],
                                        None if dots is None else dots[:, :, last],
                                        None if tail_dots is None else tail_dots[:, last], sc[:, last], w, cols, n,
                                        bias)
    return y


def _pair_chain(dots: np.ndarray | None, tail_dots: np.ndarray | None, sc: np.ndarray,
                w: Avx2Blk32Weights) -> np.ndarray:
    """The pair-fused kernels' 8 lanes (MLAS's order) [8, r, nc]: per pair, ``lane =
    fma(dot, scale of the lane's block, lane)``; then an odd last block's quads."""
    r, nc = sc.shape[1:]
    acc = np.zeros((8, r, nc), F32)
    if dots is not None:
        pairs = dots.shape[0]
        by_block = dots.reshape(pairs, 2, 4, r, nc)  # kept lanes: 4 per block of the pair
        scales = sc[:2 * pairs].reshape(pairs, 2, 1, r, nc)
        acc = fma_chain(by_block, scales, acc.reshape(2, 4, r, nc)).reshape(8, r, nc)[_KEPT]
    if tail_dots is not None:
        acc = fma_chain(tail_dots[None], sc[w.blocks - 1][None, None], acc)
    return acc


def _rows_fused(a_lanes, a_tail, dots, tail_dots, sc, asum, w, cols, n_total, bias, rows) -> np.ndarray:
    """Rows MLAS computes several at a time: unsigned integers q (the signed dots plus
    zp times A's lane sums: exact), then the BlkSum SGEMM adds the zero points."""
    zp = w.zero_points[:, cols]  # [blocks, nc]
    pairs = 0 if dots is None else dots.shape[0]
    unsigned = tail_unsigned = None
    if pairs:
        zp_lanes = zp[:2 * pairs].reshape(pairs, 2, 1, 1, -1)  # [pairs, 2, 1, 1, nc]
        lane_sums = a_lanes.sum(axis=-1).reshape(pairs, 2, 4, -1, 1)  # [pairs, 2, 4, r, 1]
        unsigned = (dots[:, :, rows].reshape(lane_sums.shape[:-1] + (-1,)) + zp_lanes * lane_sums).reshape(
            pairs, 8, lane_sums.shape[3], -1)
    if tail_dots is not None:
        tail_unsigned = tail_dots[:, rows] + zp[w.blocks - 1] * a_tail[:, rows].sum(axis=-1)[..., None]
    y = _fold(_pair_chain(unsigned, tail_unsigned, sc[:, rows], w), n_total, cols.start)
    if bias is not None:
        y += bias[cols].astype(F32, copy=False)
    # the zero points: fma over blocks from 0 (float32 SGEMM), the chain added to y
    chain = fma_chain(asum[:, rows, None], w.blk_sums[:, None, cols], np.zeros(y.shape, F32))
    return chain + y


def _rows_alone(a_lanes, a_tail, dots, tail_dots, sc, w, cols, n_total, bias) -> np.ndarray:
    """A row MLAS computes alone (its M = 1 kernel): signed integers q - zp."""
    if not w.has_zero_points:  # zp 8 everywhere: the pair-fused kernel
        acc = _pair_chain(dots, tail_dots, sc, w)
    else:
        acc = _block_chain(dots, tail_dots, a_lanes, sc, w, cols)
    y = _fold(acc, n_total, cols.start)
    if bias is not None:
        y += bias[cols].astype(F32, copy=False)
    return y


def _block_chain(dots, tail_dots, a_lanes, sc, w, cols) -> np.ndarray:
    """The M = 1 kernel with zero points: each block in order takes its own fma, lane l
    the dot of its elements 4l..4l+3 (of q - zp)."""
    pairs = 0 if dots is None else dots.shape[0]
    r, nc = sc.shape[1:]
    acc = np.zeros((8, r, nc), F32)
    if pairs:
        # kept lane i of a block holds its elements 8k..8k+7 (k = 0, 1, 2, 3 in order:
        # MLAS's lanes 0, 1, 4, 5 start at 0, 8, 16, 24), two quads each
        quads_a = a_lanes.reshape(pairs, 2, 4, r, 2, 4)  # [pairs, block, k, r, half, 4]
        quads_w = w.lanes[:, :, :, cols].reshape(pairs, 2, 4, 2, 4, nc)  # [pairs, block, k, half, 4, nc]
        quad_dots = np.matmul(quads_a.transpose(0, 1, 2, 4, 3, 5), quads_w)  # [pairs, block, k, half, r, nc]
        per_block = quad_dots.reshape(2 * pairs, 8, r, nc)  # quad l = 2k + half: elements 4l..4l+3
        acc = fma_chain(per_block, sc[:2 * pairs, None], acc)
    if tail_dots is not None:
        acc = fma_chain(tail_dots[None], sc[w.blocks - 1][None, None], acc)
    return acc
