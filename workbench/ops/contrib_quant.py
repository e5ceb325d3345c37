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
zeros (plus bias). When B, scales (and zero points, g_idx) are initializers, the
dequantized weight is computed once at build time (up to a size cap).

``accuracy_level`` (0-4), as onnxruntime's CPU kernel (1.32, x86-64) applies it: levels
0-3 all compute in float32 (``SQNBIT_CompFp32`` or the unpacked dequantize + SGEMM path;
level 2/3 fp16/bf16 compute exists only on ARM64 for fp16 A). Level 4 takes MLAS's
``SQNBIT_CompInt8`` path only when every condition below holds, else float32:

- the (bits, block_size) pair has an MLAS int8 kernel: bits 4 and 8 with block_size in
  {16, 32, 64, 128, 256}; bits 2 with block_size in {32, 64, 128} (see
  ``_INT8_BLOCK_SIZES``). 4- and 8-bit weights in larger blocks (512 and up) are
  computed in int8 too, with A quantized per block of 256 (``_INT8_LARGEST_BLOCK``,
  measured against the installed onnxruntime);
- B is an initializer (MLAS needs it prepacked at session load; a run-time B always
  takes the unpacked float path), and so are scales and uint8 zero points (with B
  constant but scales / zero points fed at run time onnxruntime reads prepacked data it
  never filled: its result there is garbage). The kernel cannot see which inputs are
  initializers (see ``uses_int8_compute``) and assumes they all are;
- no ``g_idx`` and no float zero points (both force the unpacked path).

CompInt8 quantizes each row of A per block of ``block_size`` along K, symmetric int8
(``scale_a = max|a| / 127``, ``q = round_half_even(a * (127 / max|a|))``; 0 for an
all-zero block; a partial last block is zero padded), then sums ``scale_a * scale_b *
dot(q_a, q_b - zp)`` over blocks. `nbits_int8` does exactly that: the weight's integers
are laid out once when the kernel is built, each step quantizes A and takes the
per-block integer dot products with float32 BLAS (exact), then scales and sums the
blocks. This is MLAS's x86-64 AVX2 / AVX512 / AVX512-VNNI arithmetic (its
``QuantizeARow_CompInt8`` family: float ``127 / max`` multiply, ``roundscale``/``cvtps``
to nearest even); pinned against the installed onnxruntime by
``tests/ops/test_matmulnbits_int8_compute.py``. Not reproduced: ARM64 (KleidiAI / NEON
kernels quantize A differently) and the saturating ``maddubs`` 8-bit kernels of
pre-VNNI CPUs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import KernelError
from . import nbits_int8
from .contrib import F32, HALF_AND_FLOAT, MS_DOMAIN, emit, out_dtype, pad_inputs
from .registry import KernelFn, NodeInfo, register_with_host_variant

#: dequantized weights of at most this many elements are cached at build time
CACHE_LIMIT_ELEMENTS = 1 << 24

#: block sizes with an MLAS CompInt8 (accuracy_level=4) kernel, by bits (onnxruntime 1.32:
#: ``GetQNBitGemmVariant`` / ``MlasIsQNBitGemmAvailable`` in ``mlas/lib/qnbitgemm.cpp``)
_INT8_BLOCK_SIZES = {2: (32, 64, 128), 4: (16, 32, 64, 128, 256), 8: (16, 32, 64, 128, 256)}
#: 4- and 8-bit weights in larger blocks are computed in int8 as well, A quantized per
#: block of this many (the largest kernel's; measured against onnxruntime 1.32 at 512 to
#: 4096: A per 256 agrees to 3e-7 of the output, per the weight's own block not at all)
_INT8_LARGEST_BLOCK = 256
#: the accuracy_level that asks for int8 compute
_ACCURACY_INT8 = 4


def int8_compute_layout(attrs: dict, zero_point_dtype: Any, has_g_idx: bool) -> bool:
    """Whether a MatMulNBits of these attributes and inputs is computed in int8 when its
    weights are initializers (`uses_int8_compute`; the load-time rewrites ask too)."""
    bits = int(attrs.get("bits", 4))
    block_size = int(attrs.get("block_size", 0))
    if int(attrs.get("accuracy_level", 0)) != _ACCURACY_INT8:
        return False
    if block_size not in _INT8_BLOCK_SIZES.get(bits, ()) and not (bits in (4, 8) and block_size > _INT8_LARGEST_BLOCK):
        return False
    if has_g_idx:  # g_idx: unpacked path
        return False
    return zero_point_dtype is None or np.dtype(zero_point_dtype) == np.uint8  # float zero points: float32


def uses_int8_compute(info: NodeInfo) -> bool:
    """Whether onnxruntime's CPU kernel would quantize A to int8 for this node (see the
    module docstring for the conditions and why)."""
    # onnxruntime prepacks, and so takes this path, only for initializer B / scales / zero
    # points; a B fed at run time is computed in float32
    weights = info.initializer_inputs
    if not (1 in weights and 2 in weights) or (info.has_input(3) and 3 not in weights):
        return False
    zero_points = weights.get(3)
    return int8_compute_layout(info.attrs, None if zero_points is None else zero_points.dtype, info.has_input(4))


def nbits_layout(info: NodeInfo) -> tuple[int, int, int, int]:
    """(K, N, bits, block_size) of a MatMulNBits node, checked as its kernel needs them."""
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
    return K, N, bits, block_size


def dequantize_nbits(xp: Any, b: Any, scales: Any, zero_points: Any, g_idx: Any, *, N: int, K: int,
                     bits: int, block_size: int) -> Any:
    """The float32 weight W, [N, K], of MatMulNBits inputs B, scales, zero points and
    g_idx (see the module docstring)."""
    k_blocks = -(-K // block_size)
    per_byte = 8 // bits
    shifts = xp.asarray(np.arange(per_byte, dtype=np.uint8) * np.uint8(bits))
    bit_mask = np.uint8((1 << bits) - 1)
    default_zp = float(1 << (bits - 1))

    def unpack(packed: Any) -> Any:
        """uint8 [..., m] -> uint8 [..., m * per_byte], low bits first."""
        vals = (packed[..., None] >> shifts) & bit_mask
        return vals.reshape(packed.shape[:-1] + (packed.shape[-1] * per_byte,))

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


@register_with_host_variant("MatMulNBits", domain=MS_DOMAIN, dtypes=HALF_AND_FLOAT)
def build_matmul_nbits(info: NodeInfo, host: bool) -> KernelFn:
    """The host variant lays accuracy_level 4's weights out for MLAS's kernels on this
    CPU (`nbits_int8.prepare`)."""
    xp = info.xp
    K, N, bits, block_size = nbits_layout(info)
    dtype = out_dtype(info)

    def dequantize(b: Any, scales: Any, zero_points: Any, g_idx: Any) -> Any:
        return dequantize_nbits(xp, b, scales, zero_points, g_idx, N=N, K=K, bits=bits, block_size=block_size)

    int8_weights = None  # accuracy_level 4: the weight laid out once for CompInt8
    cached_wt = None
    const = info.initializer_inputs  # the weights, laid out once below
    zp_present = info.has_input(3)
    gi_present = info.has_input(4)
    if uses_int8_compute(info):  # B, scales and zero points are all initializers
        if const[1].size:  # (no cap: the layout replaces the per-step pass over the weight)
            int8_weights = nbits_int8.prepare(
                xp, const[1], const[2], const[3] if zp_present else None, N=N, K=K, bits=bits,
                block_size=block_size, a_block=min(block_size, _INT8_LARGEST_BLOCK), host=host)
    elif 1 in const and 2 in const and N * K <= CACHE_LIMIT_ELEMENTS:
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
        elif int8_weights is not None:  # MLAS adds the bias where its kernels do (`nbits_int8`)
            lead = a.shape[:-1]
            out = outs[0]
            into = out.reshape(-1, N) if out is not None and out.dtype == F32 and out.flags.c_contiguous else None
            y = nbits_int8.matmul(xp, a.astype(F32, copy=False).reshape(-1, K), int8_weights, bias, into)
            if into is not None and y is into:
                return (out,)
            return (emit(out, y.reshape(lead + (N,)), dtype, like=a),)
        else:
            wt = cached_wt if cached_wt is not None else dequantize(b, scales, zero_points, g_idx).T
            y = xp.matmul(a.astype(F32, copy=False), wt)
        if bias is not None:
            y = y + bias.astype(F32, copy=False)
        return (emit(outs[0], y, dtype, like=a),)

    return run
