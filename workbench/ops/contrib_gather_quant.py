"""GatherBlockQuantized (com.microsoft): Gather rows of a block-quantized table, dequantized.

onnxruntime-genai's int4 exports read the token embedding with it (often from the same
packed initializer as a tied lm_head MatMulNBits). Semantics of onnxruntime's CPU kernel
(``contrib_ops/cpu/quantization/gather_block_quantized.cc``) for ``uint8`` data:

- ``data``: uint8, the quantized values packed along the last axis, ``8 / bits`` per byte,
  low bits first (bits 2, 4 or 8; attribute ``bits``, default 4). The unpacked last
  dimension is ``data.shape[-1] * 8 / bits``.
- ``indices``: int32 / int64, any shape; negative indices count from the end; an index
  out of range yields a row of zeros (no error).
- ``scales``: float32 / float16 (the output dtype), same rank as data, the last axis
  ``ceil(unpacked / block_size)`` blocks (``block_size`` default 128, a power of two
  >= 16); ``zero_points`` (optional): uint8 like scales, packed along the last axis as
  data is (``ceil(blocks * bits / 8)``); default zero point ``2^(bits - 1)``.
- ``gather_axis`` must be 0 and ``quantize_axis`` the last axis (defaults 0 and 1).
- ``out[i..., j..., c] = float(q - zp) * scale``, computed in float32 and rounded once
  to the scales dtype; shape ``indices.shape + data.shape[1:]`` with the last dimension
  unpacked.

Int4x2 / UInt4x2 / float8 data (also accepted by onnxruntime) are not implemented here.
Only the gathered rows are unpacked (a vocabulary-sized table is never dequantized
whole). The kernel never reads a value on the host: gather is fancy indexing on the
device, so it captures like Gather.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import KernelError
from .contrib import F16, F32, MS_DOMAIN, emit, pad_inputs
from .registry import KernelFn, NodeInfo, register

_U8 = np.dtype(np.uint8)


@register("GatherBlockQuantized", domain=MS_DOMAIN, dtypes=frozenset({_U8}))
def build_gather_block_quantized(info: NodeInfo) -> KernelFn:
    xp = info.xp
    bits = int(info.attr("bits", 4))
    block_size = int(info.attr("block_size", 128))
    gather_axis = int(info.attr("gather_axis", 0))
    quantize_axis = int(info.attr("quantize_axis", 1))
    where = f"GatherBlockQuantized node {info.name!r}"
    if bits not in (2, 4, 8):
        raise KernelError(f"{where}: bits={bits} is not supported for uint8 data (expected 2, 4 or 8)")
    if block_size < 16 or block_size & (block_size - 1):
        raise KernelError(f"{where}: block_size={block_size} must be a power of two >= 16")
    data_shape = info.input_shapes[0] if info.input_shapes else None
    if data_shape is not None:
        rank = len(data_shape)
        if rank < 2:
            raise KernelError(f"{where}: data must have rank >= 2, got {rank}")
        if gather_axis % rank != 0:
            raise KernelError(f"{where}: gather_axis={gather_axis}; uint8 data needs gather_axis 0")
        if quantize_axis % rank != rank - 1:
            raise KernelError(f"{where}: quantize_axis={quantize_axis}; uint8 data needs the last axis "
                              f"({rank - 1})")
    per_byte = 8 // bits
    bit_mask = np.uint8((1 << bits) - 1)
    default_zp = np.float32(1 << (bits - 1))
    shifts = xp.asarray(np.arange(per_byte, dtype=np.uint8) * np.uint8(bits))

    def unpack(packed: Any, count: int) -> Any:
        """uint8 [..., m] -> uint8 [..., count] (count <= m * per_byte), low bits first."""
        if per_byte == 1:
            return packed[..., :count]
        vals = (packed[..., None] >> shifts) & bit_mask
        return vals.reshape(packed.shape[:-1] + (packed.shape[-1] * per_byte,))[..., :count]

    def run(inputs: list, outs: list) -> tuple:
        data, indices, scales, zero_points = pad_inputs(inputs, 4)[:4]
        if data.ndim < 2:
            raise KernelError(f"{where}: data must have rank >= 2, got shape {tuple(data.shape)}")
        if scales.dtype not in (F32, F16):
            raise KernelError(f"{where}: scales must be float32 or float16, got {scales.dtype}")
        rows, width = data.shape[0], data.shape[-1] * per_byte
        n_blocks = -(-width // block_size)
        if scales.shape != data.shape[:-1] + (n_blocks,):
            raise KernelError(f"{where}: scales have shape {tuple(scales.shape)}, expected "
                              f"{tuple(data.shape[:-1]) + (n_blocks,)} for data {tuple(data.shape)} "
                              f"and block_size {block_size}")
        zp_width = -(-n_blocks // per_byte)
        if zero_points is not None and zero_points.shape != data.shape[:-1] + (zp_width,):
            raise KernelError(f"{where}: zero_points have shape {tuple(zero_points.shape)}, expected "
                              f"{tuple(data.shape[:-1]) + (zp_width,)}")
        inner = data.shape[1:-1]
        flat = indices.reshape(-1).astype(np.int64, copy=False)
        valid = (flat >= -rows) & (flat < rows)
        picked = xp.where(valid, xp.where(flat < 0, flat + rows, flat), 0)
        q = unpack(data[picked], width).astype(F32)  # [G, *inner, width]
        block_of = xp.asarray(np.arange(width) // block_size)
        sc = xp.take(scales[picked].astype(F32, copy=False), block_of, axis=-1)
        if zero_points is None:
            centred = q - default_zp
        else:
            zp = unpack(zero_points[picked], n_blocks).astype(F32)
            centred = q - xp.take(zp, block_of, axis=-1)
        values = centred * sc
        values = xp.where(valid.reshape((-1,) + (1,) * (values.ndim - 1)), values, np.float32(0))
        out_shape = tuple(indices.shape) + tuple(inner) + (width,)
        return (emit(outs[0], values.reshape(out_shape), scales.dtype),)

    return run
