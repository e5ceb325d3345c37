"""Block-wise 4-bit weight quantization in `com.microsoft::MatMulNBits` layout.

For a float weight W of shape [K, N] (MatMul's B), each output column n is cut
into `n_blocks = ceil(K / block_size)` blocks along K. Per block:

    asymmetric: scale = (max(w, 0) - min(w, 0)) / 15, zp = round(-min / scale)
    symmetric:  scale = max|w| / 7, zp = 8 (implicit: no zero_points input)
    q = clip(round(w / scale) + zp, 0, 15);  w ~= (q - zp) * scale

Layout expected by onnxruntime:
    B           uint8 [N, n_blocks, block_size / 2], element 2j in the low nibble
    scales      float [N * n_blocks]
    zero_points uint8 [N * ceil(n_blocks / 2)], per column, low nibble first
K is zero-padded to a multiple of block_size (padding quantizes to exactly 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BITS = 4
BLOCK_SIZE = 32


@dataclass(frozen=True)
class Int4Weight:
    packed: np.ndarray  # uint8 [N, n_blocks, block_size // 2]
    scales: np.ndarray  # float32 [N * n_blocks]
    zero_points: np.ndarray | None  # uint8 [N * ceil(n_blocks / 2)] or None (zp = 8)
    K: int
    N: int
    block_size: int


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """Pack uint8 values < 16 pairwise along the last axis, low nibble first."""
    if q.shape[-1] % 2:
        q = np.concatenate([q, np.zeros(q.shape[:-1] + (1,), q.dtype)], axis=-1)
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def _unpack_nibbles(packed: np.ndarray, count: int) -> np.ndarray:
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), np.uint8)
    out[..., 0::2] = packed & 0x0F
    out[..., 1::2] = packed >> 4
    return out[..., :count]


def quantize_int4(w: np.ndarray, block_size: int = BLOCK_SIZE, *, symmetric: bool = False) -> Int4Weight:
    """Quantize a [K, N] float weight for MatMulNBits(bits=4)."""
    if w.ndim != 2:
        raise ValueError(f"quantize_int4 expects a [K, N] weight, got shape {w.shape}")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two >= 16, got {block_size}")
    K, N = w.shape
    n_blocks = -(-K // block_size)
    padded = np.zeros((n_blocks * block_size, N), np.float32)
    padded[:K] = w
    blocks = padded.T.reshape(N, n_blocks, block_size)  # [N, n_blocks, block]
    if symmetric:
        scale = np.abs(blocks).max(axis=-1) / 7.0
        zp = np.full(scale.shape, 8, np.uint8)
    else:
        lo = np.minimum(blocks.min(axis=-1), 0.0)
        hi = np.maximum(blocks.max(axis=-1), 0.0)
        scale = (hi - lo) / 15.0
        safe = np.where(scale == 0, 1.0, scale)
        zp = np.clip(np.round(-lo / safe), 0, 15).astype(np.uint8)
    scale = np.where(scale == 0, 1.0, scale).astype(np.float32)
    q = np.round(blocks / scale[..., None]) + zp[..., None].astype(np.float32)
    q = np.clip(q, 0, 15).astype(np.uint8)
    packed = _pack_nibbles(q)
    zero_points = None if symmetric else _pack_nibbles(zp).reshape(-1)
    return Int4Weight(packed, scale.reshape(-1), zero_points, K, N, block_size)


def dequantize_int4(qw: Int4Weight) -> np.ndarray:
    """The [K, N] float weight MatMulNBits computes with."""
    n_blocks = qw.packed.shape[1]
    q = _unpack_nibbles(qw.packed, qw.block_size).astype(np.float32)
    if qw.zero_points is None:
        zp = np.full((qw.N, n_blocks), 8.0, np.float32)
    else:
        zp = _unpack_nibbles(qw.zero_points.reshape(qw.N, -1), n_blocks).astype(np.float32)
    scales = qw.scales.reshape(qw.N, n_blocks)
    w = (q - zp[..., None]) * scales[..., None]  # [N, n_blocks, block]
    return np.ascontiguousarray(w.reshape(qw.N, -1)[:, : qw.K].T)
