"""MatMulNBits (com.microsoft): Y = A @ dequant(B)^T (+ bias).

Layout (onnxruntime's contrib schema):

- ``B``: uint8 ``[N, k_blocks, blob_size]``, ``k_blocks = ceil(K / block_size)``,
  ``blob_size = block_size * bits / 8``; values packed along K, low bits first.
- ``scales``: ``[N, k_blocks]`` (or flat), same dtype as A.
- ``zero_points`` (optional): packed uint8 ``[N, ceil(k_blocks * bits / 8)]`` (packed
  like B, low bits first) or unpacked float ``[N, k_blocks]``; default ``2^(bits-1)``.
- ``g_idx`` (optional, deprecated): int32 ``[K]``, the block of each input feature.
- ``bias`` (optional): ``[N]``.

``W[n, k] = (q[n, k] - zero_point[n, g(k)]) * scale[n, g(k)]``, with ``g(k) = k //
block_size`` or ``g_idx[k]``. Matching onnxruntime's CPU kernel: with ``g_idx`` present,
packed uint8 zero points are ignored (the default zero point is used; float zero points
are honoured); a ``B`` with a zero-sized dimension means an omitted projection, so Y is
zeros (plus bias). ``accuracy_level`` is ignored: A is never quantized, the product is
computed in float32. When B, scales (and zero points, g_idx) are initializers, the
dequantized weight is computed once at build time (up to a size cap).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import KernelError
from .contrib import F32, HALF_AND_FLOAT, MS_DOMAIN, emit, out_dtype, pad_inputs
from .registry import KernelFn, NodeInfo, register

#: dequantized weights of at most this many elements are cached at build time
_CACHE_LIMIT_ELEMENTS = 1 << 24


@register("MatMulNBits", domain=MS_DOMAIN, dtypes=HALF_AND_FLOAT)
def build_matmul_nbits(info: NodeInfo) -> KernelFn:
    xp = info.xp
    K = int(info.attr("K"))
    N = int(info.attr("N"))
    bits = int(info.attr("bits", 4))
    block_size = int(info.attr("block_size"))
    if bits not in (2, 4, 8):
        raise KernelError(f"MatMulNBits node {info.name!r}: bits={bits} is not supported "
                          "(expected 2, 4 or 8)")
    if int(info.attr("weight_prepacked", 0)) != 0:
        raise KernelError(f"MatMulNBits node {info.name!r}: weight_prepacked="
                          f"{info.attr('weight_prepacked')} is an EP-specific layout; expected 0")
    if block_size < 16 or block_size & (block_size - 1):
        raise KernelError(f"MatMulNBits node {info.name!r}: block_size={block_size} must be a "
                          "power of two >= 16")
    k_blocks = -(-K // block_size)
    per_byte = 8 // bits
    bit_mask = (1 << bits) - 1
    default_zp = float(1 << (bits - 1))
    dtype = out_dtype(info)
    shifts = xp.asarray(np.arange(per_byte, dtype=np.uint8) * np.uint8(bits))

    def unpack(packed: Any) -> Any:
        """uint8 [..., m] -> uint8 [..., m * per_byte], low bits first."""
        vals = (packed[..., None] >> shifts) & np.uint8(bit_mask)
        return vals.reshape(packed.shape[:-1] + (packed.shape[-1] * per_byte,))

    def dequantize(b: Any, scales: Any, zero_points: Any, g_idx: Any) -> Any:
        """The float32 weight W, [N, K]."""
        q = unpack(b.reshape(N, -1))  # [N, k_blocks * block_size]
        sc = scales.reshape(N, k_blocks).astype(F32)
        if zero_points is None or (g_idx is not None and zero_points.dtype == np.uint8):
            zp = None
        elif zero_points.dtype == np.uint8:
            zp = unpack(zero_points.reshape(N, -1))[:, :k_blocks].astype(F32)
        else:
            zp = zero_points.reshape(N, k_blocks).astype(F32)
        if g_idx is None:
            qb = q.reshape(N, k_blocks, block_size).astype(F32)
            centred = qb - (default_zp if zp is None else zp[:, :, None])
            w = (centred * sc[:, :, None]).reshape(N, k_blocks * block_size)
            return w[:, :K]
        g = g_idx.reshape(-1)[:K].astype(np.int64)
        qk = q[:, :K].astype(F32)
        centred = qk - (default_zp if zp is None else xp.take(zp, g, axis=1))
        return centred * xp.take(sc, g, axis=1)

    cached_wt = None
    const = info.constant_inputs
    if 1 in const and 2 in const and N * K <= _CACHE_LIMIT_ELEMENTS:
        zp_present = len(info.input_dtypes) > 3 and info.input_dtypes[3] is not None
        gi_present = len(info.input_dtypes) > 4 and info.input_dtypes[4] is not None
        if (not zp_present or 3 in const) and (not gi_present or 4 in const):
            b0 = const[1]
            if b0.size:
                cached_wt = xp.ascontiguousarray(dequantize(
                    xp.asarray(b0), xp.asarray(const[2]),
                    xp.asarray(const[3]) if zp_present else None,
                    xp.asarray(const[4]) if gi_present else None).T)

    def run(inputs: list, outs: list) -> tuple:
        a, b, scales, zero_points, g_idx, bias = pad_inputs(inputs, 6)[:6]
        if a.shape[-1] != K:
            raise KernelError(f"MatMulNBits node {info.name!r}: input A has last dimension "
                              f"{a.shape[-1]}, expected K={K}")
        if b.size == 0:
            y = xp.zeros(a.shape[:-1] + (N,), dtype=F32)
        else:
            wt = cached_wt if cached_wt is not None else dequantize(b, scales, zero_points, g_idx).T
            y = xp.matmul(a.astype(F32, copy=False), wt)
        if bias is not None:
            y = y + bias.astype(F32, copy=False)
        return (emit(outs[0], y, dtype),)

    return run
