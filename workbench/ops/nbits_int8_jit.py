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
    """The compiled kernels (`nbits_int8_kernels`, imported and compiled or loaded on first use)."""
    from . import nbits_int8_kernels as k

    return _Kernels(k.quantize, k.columns_avx2, k.columns_avx512, k.split_avx2, k.split_avx512)


@dataclasses.dataclass(frozen=True)
class _Kernels:
    quantize: object
    columns_avx2: object
    columns_avx512: object
    split_avx2: object
    split_avx512: object
