"""MatMulNBits' int8 compute (accuracy_level 4) as onnxruntime's CompInt8 does it.

MLAS (onnxruntime 1.32, x86-64) quantizes each row of A per block of K, symmetric
int8 (``scale_a = max|a| / 127``, ``q_a = round_half_even(a * (127 / max|a|))``, float32
operations; an all-zero block is zeros; a partial last block zero padded), takes each
block's integer dot product with the weight's integers minus their zero point, and sums
``dot * (scale_a * scale_b)`` over blocks in float32.

Here the weight side is laid out once, when the kernel is built (`prepare`): the
integers ``q - zp`` as float32 ``[blocks, block, N]`` and the scales ``[blocks, N]``. A
step then quantizes A (a pass over A, never over the weights), multiplies block by
block with float32 BLAS (one stacked matmul) and scales each block's dot products.
A block's dot product is an integer of at most ``127 * 255 * 256 < 2^24`` in magnitude,
so float32 holds it exactly whatever order BLAS sums it in; what is left of float
rounding is the per-block scaling and the sum over blocks (``k_blocks`` terms, not
``K``), in that order as MLAS.

The prepared integers take the bytes of the float32 dequantized weight (numpy has no
int8 or int4 BLAS); they replace that weight, they are not held beside it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

F32 = np.dtype(np.float32)
_F32_127 = np.float32(127.0)
_F32_ONE = np.float32(1.0)

#: how many prepared forms were built (public so tests can check weights are laid out
#: once per node, never per step)
build_count = 0


@dataclasses.dataclass(frozen=True)
class Int8Weights:
    """A constant MatMulNBits weight laid out for int8 compute: ``ints[b, j, n] =
    q[n, b * block + j] - zp[n, b]`` (zero past K) and ``scales[b, n]``, both float32,
    ``block`` the block A is quantized in."""

    ints: Any
    scales: Any
    block: int
    K: int


def prepare(xp: Any, b: Any, scales: Any, zero_points: Any, *, N: int, K: int, bits: int,
            block_size: int, a_block: int) -> Int8Weights:
    """The weight's integers and scales in the layout `matmul` reads, from MatMulNBits'
    packed B ``[N, k_blocks, blob]``, scales and optional packed uint8 zero points.
    `a_block` (<= block_size) is the block A is quantized in: for weights in blocks
    larger than MLAS's largest int8 kernel each weight block spans several A blocks."""
    global build_count
    build_count += 1
    per_byte = 8 // bits
    k_blocks = -(-K // block_size)
    shifts = xp.asarray(np.arange(per_byte, dtype=np.uint8) * np.uint8(bits))
    mask = np.uint8((1 << bits) - 1)

    def unpack(packed: Any) -> Any:
        vals = (packed[..., None] >> shifts) & mask
        return vals.reshape(packed.shape[:-1] + (packed.shape[-1] * per_byte,))

    q = unpack(xp.asarray(b).reshape(N, -1)).reshape(N, k_blocks, block_size)
    if zero_points is None:
        zp = xp.full((N, k_blocks, 1), 1 << (bits - 1), dtype=np.int16)
    else:
        zp = unpack(xp.asarray(zero_points).reshape(N, -1))[:, :k_blocks, None].astype(np.int16)
    ints = (q.astype(np.int16) - zp).reshape(N, k_blocks * block_size)
    ints[:, K:] = 0  # past K: A's zero padding times anything, kept exactly zero
    a_blocks = k_blocks * (block_size // a_block)
    laid = xp.ascontiguousarray(ints.astype(F32).T.reshape(a_blocks, a_block, N))
    sc = xp.asarray(scales).reshape(N, k_blocks).astype(F32).T  # [k_blocks, N]
    sc = xp.ascontiguousarray(xp.repeat(sc, block_size // a_block, axis=0))
    return Int8Weights(laid, sc, a_block, K)


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


def matmul(xp: Any, a: Any, w: Int8Weights) -> Any:
    """``A [M, K] @ W^T`` as CompInt8: exact per-block integer dot products (float32
    BLAS), each times ``scale_a * scale_b``, summed over blocks in order."""
    qa, sa = quantize_rows(xp, a, w.block, w.ints.shape[0])
    dots = xp.matmul(qa, w.ints)  # [blocks, M, N], exact integers
    dots *= sa * w.scales[:, None, :]  # each block's scale_a * scale_b, rounded once as MLAS does
    return dots.sum(axis=0)
