"""RotaryEmbedding (com.microsoft, and the default domain from opset 23) and the
rotation GroupQueryAttention applies to its Q and K (`rotate`, `_rotate_rows`).

Positions are gathered from the cos/sin caches on the backend (`_gather_rows`), never
read on the host, so the kernels record into device graphs. Where the plan asks for
onnxruntime's rounding (`NodeInfo.onnxruntime_rounding`), the host variants
(`register(..., host=True)`) rotate float32 by MLAS's rotary kernel, bit for bit
(`ort_float32.rotate_pair`, `onnxruntime_rotary`); elsewhere numpy's own arithmetic.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import KernelError
from . import mlas_isa
from .attention_math import _clamp
from .contrib import (
    F32,
    HALF_AND_FLOAT,
    MS_DOMAIN,
    compute_dtype,
    emit,
    out_dtype,
    pad_inputs,
)
from .gqa_host_decode import SIGNS
from .ort_float32 import rotate_pair
from .registry import KernelFn, NodeInfo, register_with_host_variant


def rotate(xp: Any, x: Any, cos: Any, sin: Any, rot_dim: int, interleaved: bool,
           as_onnxruntime: bool = False) -> Any:
    """Rotary embedding of the last axis of `x` (first `rot_dim` features rotated).

    `cos`/`sin` broadcast against ``x[..., :rot_dim // 2]``. Non-interleaved pairs
    feature i with i + rot_dim/2; interleaved pairs 2i with 2i + 1. `as_onnxruntime`
    (a host variant's, see `onnxruntime_rotary`): float32 rounded as MLAS's rotary
    kernel rounds it (`ort_float32.rotate_pair`).
    """
    half = rot_dim // 2
    exact = as_onnxruntime and _float32(x, cos, sin)
    if interleaved:
        x1 = x[..., 0:rot_dim:2]
        x2 = x[..., 1:rot_dim:2]
        if exact:
            real, imag = rotate_pair(x1, x2, cos, sin)
        else:
            real = x1 * cos - x2 * sin
            imag = x2 * cos + x1 * sin
        rot = xp.stack([real, imag], axis=-1).reshape(real.shape[:-1] + (rot_dim,))
    else:
        x1 = x[..., :half]
        x2 = x[..., half:rot_dim]
        pair = rotate_pair(x1, x2, cos, sin) if exact else (x1 * cos - x2 * sin, x2 * cos + x1 * sin)
        rot = xp.concatenate(pair, axis=-1)
    if rot_dim < x.shape[-1]:
        rot = xp.concatenate([rot, x[..., rot_dim:]], axis=-1)
    return rot


def onnxruntime_rotary(info: NodeInfo) -> bool:
    """Whether a host variant rotates float32 as onnxruntime's CPU kernels do: where
    the plan asks for onnxruntime's rounding, on x86-64 CPUs with AVX2 / FMA (MLAS's
    rotary kernel, ``MlasRotaryEmbedOneRow``: fma(x1, cos, -(x2 sin)), fma(x1, sin,
    x2 cos), interleaved or not)."""
    return info.onnxruntime_rounding and mlas_isa.isa() in ("avx2", "avx512")


def _float32(*arrays: Any) -> bool:
    return all(a.dtype == F32 for a in arrays)


def _rotate_rows(xp: Any, x: Any, cos: Any, sin: Any, rot_dim: int, interleaved: bool,
                 as_onnxruntime: bool = False, host: bool = False) -> Any:
    """`rotate` of a 2-D [M, H] array by one cos/sin row ([rot_dim / 2]), into a fresh
    array in x's dtype, bit for bit as `rotate` computes it, with fewer temporaries.

    Non-interleaved halves (a, b) become (a cos - b sin, b cos + a sin): x * cos plus
    swap(x) * (-sin, sin), the swap being a reversed view of the halves. b * -sin is
    exactly -(b * sin), so adding it is the subtraction, bit for bit. `host`: numpy
    arrays (a host variant's), which take the signs as one host constant.
    """
    if as_onnxruntime and _float32(x, cos, sin):
        return rotate(xp, x, cos, sin, rot_dim, interleaved, True)
    rows, width = x.shape
    half = rot_dim // 2
    if interleaved:
        out = xp.empty_like(x)
        x1, x2 = x[:, 0:rot_dim:2], x[:, 1:rot_dim:2]
        real, imag = out[:, 0:rot_dim:2], out[:, 1:rot_dim:2]
        tmp = x2 * sin
        xp.multiply(x1, cos, out=real)
        xp.subtract(real, tmp, out=real)
        xp.multiply(x1, sin, out=tmp)
        xp.multiply(x2, cos, out=imag)
        xp.add(imag, tmp, out=imag)
        if rot_dim < width:
            out[:, rot_dim:] = x[:, rot_dim:]
        return out
    halves = x[:, :rot_dim].reshape(rows, 2, half)
    out = halves * cos
    if host:
        out += halves[:, ::-1] * (sin * SIGNS)  # (b, a) * (-sin, sin)
    else:  # the same, without a host constant on the device
        swapped = halves[:, ::-1] * sin
        out[:, 0] -= swapped[:, 0]
        out[:, 1] += swapped[:, 1]
    out = out.reshape(rows, rot_dim)
    if rot_dim < width:
        out = xp.concatenate((out, x[:, rot_dim:]), axis=1)
    return out


def _gather_rows(xp: Any, cache: Any, positions: Any, ct: np.dtype) -> Any:
    """cache[positions] (positions clipped into the cache) in the compute dtype."""
    idx = _clamp(xp, positions.astype(np.int64, copy=False), 0, cache.shape[0] - 1)
    return xp.take(cache, idx, axis=0).astype(ct, copy=False)


@register_with_host_variant("RotaryEmbedding", domain=MS_DOMAIN, dtypes=HALF_AND_FLOAT)
def build_ms_rotary_embedding(info: NodeInfo, host: bool) -> KernelFn:
    """com.microsoft RotaryEmbedding: inputs (input, position_ids, cos_cache, sin_cache).

    input is [B, S, hidden] or [B, N, S, H]; position_ids is one offset (shape () or
    (1,)) or [B, S]; caches are [max_position, rotary_dim / 2]. ``scale`` and
    ``is_packed_batching`` do not change the result (as in onnxruntime's CPU kernel).
    The host variant rounds as onnxruntime where the plan asks for it (`onnxruntime_rotary`).
    """
    xp = info.xp
    num_heads, rotary_dim_attr, interleaved, dtype, as_onnxruntime = _rotary_attrs(info, host)
    if rotary_dim_attr > 0 and num_heads <= 0:
        raise KernelError(f"RotaryEmbedding node {info.name!r}: num_heads must be given "
                          "with rotary_embedding_dim")

    def run(inputs: list, outs: list) -> tuple:
        x, position_ids, cos_cache, sin_cache = inputs[:4]
        ct = compute_dtype(x.dtype)
        if x.ndim == 4:
            batch, heads, seq, _ = x.shape
            hidden = heads * x.shape[3]
        elif x.ndim == 3:
            batch, seq, hidden = x.shape
        else:
            raise KernelError(f"RotaryEmbedding node {info.name!r}: input has rank {x.ndim}, "
                              "expected 3 or 4")
        head_size = cos_cache.shape[1] * 2 if rotary_dim_attr == 0 else hidden // num_heads
        rot_dim = rotary_dim_attr if rotary_dim_attr > 0 else head_size
        n_heads = num_heads if num_heads > 0 else hidden // head_size
        if position_ids.size == 1:
            positions = position_ids.reshape(1, 1) + xp.arange(seq, dtype=np.int64)[None, :]
        else:
            positions = position_ids.reshape(batch, seq)
        cos = _gather_rows(xp, cos_cache, positions, ct)[..., : rot_dim // 2]
        sin = _gather_rows(xp, sin_cache, positions, ct)[..., : rot_dim // 2]
        y = _rotate_either_layout(xp, x, cos, sin, n_heads, head_size, rot_dim, interleaved, as_onnxruntime, ct)
        return (emit(outs[0], y, dtype, like=x),)

    return run


def _rotary_attrs(info: NodeInfo, host: bool) -> tuple[int, int, bool, Any, bool]:
    """(num_heads, rotary_embedding_dim, interleaved, output dtype, onnxruntime's
    rounding: a host variant's only), as both domains' RotaryEmbedding take them."""
    return (int(info.attr("num_heads", 0)), int(info.attr("rotary_embedding_dim", 0)),
            int(info.attr("interleaved", 0)) == 1, out_dtype(info), host and onnxruntime_rotary(info))


def _rotate_either_layout(xp: Any, x: Any, cos: Any, sin: Any, heads: int, head_size: int, rot_dim: int,
                          interleaved: bool, as_onnxruntime: bool, ct: Any) -> Any:
    """X rotated, in X's shape: [B, N, S, H] as it is, [B, S, hidden] split into its
    heads; cos / sin [B, S, rot_dim / 2]."""
    if x.ndim == 4:
        y = rotate(xp, x.astype(ct, copy=False), cos[:, None], sin[:, None], rot_dim, interleaved, as_onnxruntime)
    else:
        batch, seq = x.shape[:2]
        xr = x.reshape(batch, seq, heads, head_size).astype(ct, copy=False)
        y = rotate(xp, xr, cos[:, :, None], sin[:, :, None], rot_dim, interleaved, as_onnxruntime)
    return y.reshape(x.shape)


@register_with_host_variant("RotaryEmbedding", domain="", since=23, dtypes=HALF_AND_FLOAT)
def build_rotary_embedding(info: NodeInfo, host: bool) -> KernelFn:
    """ONNX RotaryEmbedding-23: inputs (X, cos_cache, sin_cache, position_ids?).

    X is [B, N, S, H] or [B, S, hidden] (``num_heads`` required); with position_ids the
    caches are [max_position, rotary_dim / 2], without they are [B, S, rotary_dim / 2].
    The host variant rounds as onnxruntime where the plan asks for it (`onnxruntime_rotary`).
    """
    xp = info.xp
    num_heads, rotary_dim_attr, interleaved, dtype, as_onnxruntime = _rotary_attrs(info, host)

    def run(inputs: list, outs: list) -> tuple:
        x, cos_cache, sin_cache, position_ids = pad_inputs(inputs, 4)[:4]
        ct = compute_dtype(x.dtype)
        if x.ndim == 4:
            batch, _, seq, head_size = x.shape
        elif x.ndim == 3:
            if num_heads <= 0:
                raise KernelError(f"RotaryEmbedding node {info.name!r}: num_heads is required "
                                  "for a 3D input")
            batch, seq, hidden = x.shape
            head_size = hidden // num_heads
        else:
            raise KernelError(f"RotaryEmbedding node {info.name!r}: input has rank {x.ndim}, "
                              "expected 3 or 4")
        rot_dim = rotary_dim_attr if rotary_dim_attr > 0 else head_size
        if position_ids is not None:
            cos = _gather_rows(xp, cos_cache, position_ids.reshape(batch, seq), ct)
            sin = _gather_rows(xp, sin_cache, position_ids.reshape(batch, seq), ct)
        else:
            cos = cos_cache.reshape(batch, seq, -1).astype(ct, copy=False)
            sin = sin_cache.reshape(batch, seq, -1).astype(ct, copy=False)
        y = _rotate_either_layout(xp, x, cos[..., : rot_dim // 2], sin[..., : rot_dim // 2], num_heads, head_size,
                                  rot_dim, interleaved, as_onnxruntime, ct)
        return (emit(outs[0], y, dtype, like=x),)

    return run
