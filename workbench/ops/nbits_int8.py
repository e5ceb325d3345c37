"""MatMulNBits' int8 compute (accuracy_level 4) as onnxruntime's CompInt8 does it.

MLAS (onnxruntime 1.32, x86-64) quantizes each row of A per block of K, symmetric
int8 (``scale_a = max|a| / 127``, ``q_a = round_half_even(a * (127 / max|a|))``, float32
operations; an all-zero block is zeros; a partial last block zero padded) and keeps
``asum = scale_a * sum(q_a)`` per block. The weights are laid out once, when the kernel
is built (`prepare`); a step quantizes A (a pass over A, never over the weights) and
takes integer dot products with float32 BLAS (a sum of at most 256 int8 x int8 products
is an integer far inside float32's 24 bits: exact whatever order BLAS sums in).

Two forms:

- **4-bit weights in blocks of 32** (every onnxruntime-genai int4 CPU export), `Blk32Weights`
  (on CPUs where MLAS takes its AVX2 kernels instead, the numpy backend lays the weights
  out for those: `nbits_int8_avx2`, chosen by `mlas_isa.isa`):
  bit-for-bit MLAS's AVX512 / AVX512-VNNI kernel (``sqnbitgemm_kernel_avx512_int8_blklen32.h``
  and the BlkSum path of ``QNBitGemm``), whose float32 arithmetic is, per output:

  1. the weights' integers are used *unsigned* (0..15, the zero point not subtracted);
  2. blocks in groups of 4, each output has 16 float32 lanes; lane ``L = 4c + p`` holds
     the integer dot of 8 of the group's 128 products (``_lane_offsets``) and takes
     ``lane = fma(dot, fl(scale_a * scale_b), lane)`` once per group;
  3. lanes ``L`` and ``L + 8`` are added (8 lanes left); each of the last ``k_blocks % 4``
     blocks then adds ``fma(dot of elements 4j..4j+3, fl(scale_a * scale_b), lane_j)``;
  4. the 8 lanes are summed ``((x0+x1)+x2)+x3 + (((x4+x5)+x6)+x7)`` (the last
     ``N % 4`` columns: ``((x4+x0)+(x6+x2)) + ((x5+x1)+(x7+x3))``), then the bias added;
  5. the zero points come last, by MLAS's float32 SGEMM: ``acc = fma(asum[b],
     fl(-scale_b * zp), acc)`` over blocks in order from 0, and ``y += acc``.

  numpy has no fma: ``fma(x, y, z)`` is computed as float64 ``x * y + z`` (the product
  of a float32 by a dot of at most 2^14 is exact in float64) rounded to float32 once.
  That differs from a true fma only if the float64 sum is inexact *and* lands exactly on
  a float32 rounding tie, which needs the two terms' exponents ~30 apart: not seen in
  any test (``tests/ops/test_matmulnbits_int8_compute.py`` asserts 0 ulps).

- **other bits and block sizes**, `Int8Weights`: the weights' integers ``q - zp`` laid out
  as float32 ``[blocks, block, N]``, one stacked matmul, each block's dot times
  ``scale_a * scale_b``, summed over blocks in order: MLAS's quantities in a different
  float order (a few float32 ulps of the largest term, ~3e-7 of the output).

The prepared integers take the bytes of the float32 dequantized weight (numpy has no
int8 or int4 BLAS); they replace that weight, they are not held beside it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from . import mlas_isa, nbits_int8_avx2, nbits_int8_jit

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
_F32_127 = np.float32(127.0)
_F32_ONE = np.float32(1.0)
_F32_ZERO = np.float32(0.0)

#: how many prepared forms were built (public so tests can check weights are laid out
#: once per node, never per step)
build_count = 0

#: MLAS's blklen-32 kernel: blocks per lane group, lanes per output, products per lane
_GROUP, _LANES, _PER_LANE = 4, 16, 8
#: output columns computed at a time (the float64 lane products of a chunk stay in cache)
_CHUNK = 4096


def _lane_offsets() -> np.ndarray:
    """``[16, 8]``: which of a group's 128 products (4 blocks of 32) lane ``L = 4c + p``
    sums. VNNI's ``dpbusd`` over the group's first 64 and last 64 bytes gives 16 lanes of
    4 products each; unpacking their 64-bit halves and adding pairs leaves lane ``(c, p)``
    with products ``base + {0..3, 8..11}``, ``base = 64 (p // 2) + 16 c + 4 (p % 2)`` (the
    AVX512BW ``maddubs`` path sums the same products)."""
    lane = np.arange(_LANES)
    c, p = lane // 4, lane % 4
    base = 64 * (p // 2) + 16 * c + 4 * (p % 2)
    return base[:, None] + np.r_[0:4, 8:12][None, :]


@dataclasses.dataclass(frozen=True)
class Int8Weights:
    """A constant MatMulNBits weight laid out for int8 compute: ``ints[b, j, n] =
    q[n, b * block + j] - zp[n, b]`` (zero past K) and ``scales[b, n]``, both float32,
    ``block`` the block A is quantized in."""

    ints: Any
    scales: Any
    block: int
    K: int


@dataclasses.dataclass(frozen=True)
class Blk32Weights:
    """A 4-bit, block-32 weight laid out for MLAS's blklen-32 int8 kernel (see the module
    docstring): the unsigned integers as float32, ``lanes[g * 16 + L, i, n]`` the i-th
    product of lane L of group g and ``tail[t * 8 + j, i, n]`` element ``4 j + i`` of the
    t-th block past the groups; per block ``scales[b, n]`` (float32) and ``zp_sums[b, n] =
    fl(-scale * zp)`` (as float64); the gathers that bring A's integers into the same
    order (``a_lanes``, ``a_tail``)."""

    lanes: Any
    tail: Any
    scales: Any
    zp_sums: Any
    a_lanes: Any
    a_tail: Any
    lane_block: Any
    K: int
    blocks: int


def _unpack(xp: Any, packed: Any, bits: int) -> Any:
    per_byte = 8 // bits
    shifts = xp.asarray(np.arange(per_byte, dtype=np.uint8) * np.uint8(bits))
    vals = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return vals.reshape(packed.shape[:-1] + (packed.shape[-1] * per_byte,))


def prepare(xp: Any, b: Any, scales: Any, zero_points: Any, *, N: int, K: int, bits: int,
            block_size: int, a_block: int, host: bool = False) -> Int8Weights | Blk32Weights:
    """The weight's integers and scales in the layout `matmul` reads, from MatMulNBits'
    packed B ``[N, k_blocks, blob]``, scales and optional packed uint8 zero points.
    `a_block` (<= block_size) is the block A is quantized in: for weights in blocks
    larger than MLAS's largest int8 kernel each weight block spans several A blocks.
    `host`: for a host variant, where MLAS's kernels for this CPU lay the weights out."""
    global build_count
    build_count += 1
    k_blocks = -(-K // block_size)
    q = _unpack(xp, xp.asarray(b).reshape(N, -1), bits).reshape(N, k_blocks, block_size)
    if zero_points is None:
        zp = xp.full((N, k_blocks), 1 << (bits - 1), dtype=np.int16)
    else:
        zp = _unpack(xp, xp.asarray(zero_points).reshape(N, -1), bits)[:, :k_blocks].astype(np.int16)
    if bits == 4 and block_size == 32 and a_block == 32:
        scales32 = xp.asarray(scales).reshape(N, k_blocks).astype(F32)
        isa = mlas_isa.isa() if host else None  # MLAS's kernels: a host variant's only
        if isa in ("avx2", "avx512") and nbits_int8_jit.available(isa):  # MLAS's kernel, compiled
            return nbits_int8_jit.prepare(q, scales32, zp, zero_points is not None, K, isa)
        if isa == "avx2":  # MLAS's AVX2 kernels, emulated by numpy
            return nbits_int8_avx2.prepare(q, scales32, zp, zero_points is not None, K)
        return prepare_blk32(xp, q, scales32, zp, K)
    ints = (q.astype(np.int16) - zp[:, :, None]).reshape(N, k_blocks * block_size)
    ints[:, K:] = 0  # past K: A's zero padding times anything, kept exactly zero
    a_blocks = k_blocks * (block_size // a_block)
    laid = xp.ascontiguousarray(ints.astype(F32).T.reshape(a_blocks, a_block, N))
    sc = xp.asarray(scales).reshape(N, k_blocks).astype(F32).T  # [k_blocks, N]
    sc = xp.ascontiguousarray(xp.repeat(sc, block_size // a_block, axis=0))
    return Int8Weights(laid, sc, a_block, K)


def prepare_blk32(xp: Any, q: Any, scales: Any, zp: Any, K: int) -> Blk32Weights:
    """The AVX-512 kernel's layout (`Blk32Weights`) of ``q [N, blocks, 32]`` (unsigned),
    float32 ``scales [N, blocks]`` and zero points ``zp [N, blocks]``."""
    N, k_blocks, block = q.shape
    groups = k_blocks // _GROUP
    span = _GROUP * block
    offsets = _lane_offsets()
    a_lanes = (np.arange(groups)[:, None, None] * span + offsets[None]).reshape(-1)
    tail0 = groups * span
    a_tail = tail0 + np.arange((k_blocks - groups * _GROUP) * block)
    qt = q.reshape(N, k_blocks * block).T.astype(F32)  # [K padded, N], unsigned
    lanes = xp.ascontiguousarray(qt[xp.asarray(a_lanes)].reshape(-1, _PER_LANE, N))
    tail = xp.ascontiguousarray(qt[xp.asarray(a_tail)].reshape(-1, 4, N))
    zp_sums = (-(scales * zp.astype(F32))).astype(F32).T.astype(F64)  # what MLAS packs
    lane_block = offsets[:, 0] // block  # the block of the group each lane reads
    return Blk32Weights(lanes, tail, xp.ascontiguousarray(scales.T), xp.ascontiguousarray(zp_sums),
                        xp.asarray(a_lanes), xp.asarray(a_tail), xp.asarray(lane_block), K, k_blocks)


def quantize_rows(xp: Any, a: Any, block: int, blocks: int) -> tuple[Any, Any]:
    """A float32 ``[M, K]`` quantized per block as MLAS does, zero padded to `blocks`
    blocks: the integers as float32 ``[blocks, M, block]`` and the scales ``[blocks, M, 1]``."""
    m, k = a.shape
    if blocks * block != k:
        padded = xp.zeros((m, blocks * block), dtype=F32)
        padded[:, :k] = a
        a = padded
    a = a.reshape(m, blocks, block).transpose(1, 0, 2)
    amax = xp.abs(a).max(axis=-1, keepdims=True)
    # an all-zero block quantizes to zeros whatever its multiplier: avoid 127 / 0
    q = xp.rint(a * (_F32_127 / xp.where(amax == 0, _F32_ONE, amax)))
    return q, amax / _F32_127


def matmul(xp: Any, a: Any, w: Int8Weights | Blk32Weights, bias: Any = None, into: Any = None) -> Any:
    """``A [M, K] @ W^T (+ bias)`` as CompInt8 (float32 ``[M, N]``); the compiled kernel
    writes straight into `into` where it can (`nbits_int8_jit.matmul`)."""
    if isinstance(w, nbits_int8_jit.JitBlk32Weights):
        return nbits_int8_jit.matmul(a, w, bias, into)
    if isinstance(w, Blk32Weights):
        return _matmul_blk32(xp, a, w, bias)
    if isinstance(w, nbits_int8_avx2.Avx2Blk32Weights):
        return nbits_int8_avx2.matmul(a, w, bias, quantize_rows)
    qa, sa = quantize_rows(xp, a, w.block, w.ints.shape[0])
    dots = xp.matmul(qa, w.ints)  # [blocks, M, N], exact integers
    dots *= sa * w.scales[:, None, :]  # each block's scale_a * scale_b, rounded once as MLAS does
    y = dots.sum(axis=0)
    return y if bias is None else y + bias.astype(F32, copy=False)


def _matmul_blk32(xp: Any, a: Any, w: Blk32Weights, bias: Any) -> Any:
    qa, sa = quantize_rows(xp, a, 32, w.blocks)  # [blocks, M, 32], [blocks, M, 1]
    asum = (sa[:, :, 0] * qa.sum(axis=-1)).astype(F64)  # [blocks, M]: MLAS's fl(scale_a * sum q_a)
    m = a.shape[0]
    qrow = qa.transpose(1, 0, 2).reshape(m, -1)  # [M, K padded]
    a_lanes = qrow[:, w.a_lanes].reshape(m, -1, _PER_LANE).transpose(1, 0, 2)  # [G*16, M, 8]
    a_tail = qrow[:, w.a_tail].reshape(m, -1, 4).transpose(1, 0, 2)  # [T*8, M, 4]
    sa = sa[:, :, 0]
    n = w.scales.shape[1]
    y = xp.empty((m, n), dtype=F32)
    for n0 in range(0, n, _CHUNK):
        cols = slice(n0, min(n, n0 + _CHUNK))
        y[:, cols] = _blk32_columns(xp, a_lanes, a_tail, sa, asum, w, cols, n)
    if bias is not None:
        y += bias.astype(F32, copy=False)
    # the zero points: MLAS's SGEMM, fma over blocks in order, added to the kernel's y
    corr = asum[:, :, None] * w.zp_sums[:, None, :]  # [blocks, M, N], exact products
    acc = corr[0].astype(F32)
    step = xp.empty(acc.shape, dtype=F64)
    for b in range(1, w.blocks):
        xp.add(corr[b], acc, out=step)
        acc[...] = step
    y += acc
    return y


def _blk32_columns(xp: Any, a_lanes: Any, a_tail: Any, sa: Any, asum: Any, w: Blk32Weights,
                   cols: slice, n: int) -> Any:
    """Output columns `cols` of the MLAS blklen-32 kernel, bias and zero points not yet added."""
    m = sa.shape[1]
    sc = sa[:, :, None] * w.scales[:, None, cols]  # [blocks, M, n_c]: fl(scale_a * scale_b)
    groups = w.lanes.shape[0] // _LANES
    nc = sc.shape[-1]
    acc = xp.zeros((_LANES, m, nc), dtype=F32)
    if groups:
        dots = xp.matmul(a_lanes, w.lanes[:, :, cols])  # [G*16, M, n_c], exact integers
        dots = dots.reshape(groups, _LANES, m, nc)
        step = xp.empty((_LANES, m, nc), dtype=F64)
        for g in range(groups):
            xp.multiply(dots[g], sc[g * _GROUP + w.lane_block], out=step, dtype=F64)
            step += acc  # fma(dot, scale, lane): the product is exact in float64
            acc[...] = step
    x = acc[:8] + acc[8:]
    tail = w.tail.shape[0] // 8
    if tail:
        dots = xp.matmul(a_tail, w.tail[:, :, cols]).reshape(tail, 8, m, nc)
        step = xp.empty((8, m, nc), dtype=F64)
        for t in range(tail):
            xp.multiply(dots[t], sc[groups * _GROUP + t], out=step, dtype=F64)
            step += x
            x[...] = step
    y = (((x[0] + x[1]) + x[2]) + x[3]) + (((x[4] + x[5]) + x[6]) + x[7])
    single = n % 4  # MLAS's one-column kernel: the lanes summed in another order
    if single and cols.stop == n:
        r = x[:, :, nc - single:]
        y[:, nc - single:] = ((r[4] + r[0]) + (r[6] + r[2])) + ((r[5] + r[1]) + (r[7] + r[3]))
    return y
