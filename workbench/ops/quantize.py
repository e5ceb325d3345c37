"""Linear quantization (default domain): QuantizeLinear, DequantizeLinear,
DynamicQuantizeLinear, MatMulInteger, QLinearMatMul.

What `onnxruntime.quantization.quantize_dynamic` writes (its quantized embedding
Gather dequantizes with DequantizeLinear at the model's own opset, often below 19,
which `onnx.reference` does not implement), at every opset onnxruntime's CPU provider
has: 10, 13, 19, 21, 23 and later. Arithmetic as onnxruntime's CPU kernels (MLAS) do it,
pinned by ``tests/ops/test_quant_kernels_ort.py``:

- QuantizeLinear: ``q = saturate(round_half_even(x / scale) + zero_point)``, the division
  in float32 (float16 / bfloat16 inputs and scales widened first); float8 outputs
  ``cast(x / scale)`` as onnxruntime's float8 conversion does it bit for bit (round half
  to even, saturating to the largest finite value with ``saturate``; its top-binade quirks
  without it: see ``to_float8``).
- DequantizeLinear: ``float32(int32(q) - int32(zero_point)) * scale``, rounded once to the
  scale's dtype (or ``output_dtype``).
- Scales and zero points are per tensor (a scalar or one element), per axis (1-D along
  ``axis``, opset 13+), or blocked (opset 21+: the parameters' ``axis`` dimension is
  ``ceil(x.shape[axis] / block_size)``, each entry covering ``block_size`` elements).
- DynamicQuantizeLinear: uint8, ``scale = (max(x, 0) - min(x, 0)) / 255`` (1 when that
  range is empty), ``zero_point = round_half_even(clamp(-min / scale, 0, 255))``.
- MatMulInteger / QLinearMatMul: the int32 accumulation of ``(a - a_zp) @ (b - b_zp)`` is
  exact (computed as a float64 product: every partial sum is an integer far below 2^53),
  except uint8 x int8 on a CPU whose onnxruntime kernel saturates (`u8s8_pairs_saturate`:
  x86-64 without VNNI, where MLAS adds each pair of products into int16 with
  ``vpmaddubsw``), taken as it does there where the plan asks for onnxruntime's
  arithmetic (``NodeInfo.onnxruntime_rounding``: onnxruntime's documented ``reduce_range``
  caveat; the spec's exact sums otherwise);
  QLinearMatMul requantizes ``float32(acc) * float32(a_scale * b_scale / y_scale)``,
  rounded half to even, plus ``y_zp``, saturated (MLAS's requantize output processor).

Every parameter stays on the device (no host reads): the kernels capture.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import helper

from ..errors import KernelError
from . import mlas_isa
from .contrib import F32, pad_inputs
from .registry import KernelFn, NodeInfo, register, register_with_host_variant

F64 = np.dtype(np.float64)
I32 = np.dtype(np.int32)
U8 = np.dtype(np.uint8)
I8 = np.dtype(np.int8)

try:
    import ml_dtypes

    _FLOAT8 = frozenset(np.dtype(getattr(ml_dtypes, n)) for n in (
        "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float4_e2m1fn")
        if hasattr(ml_dtypes, n))
    _SMALL_INTS = frozenset(np.dtype(getattr(ml_dtypes, n)) for n in ("int4", "uint4", "int2", "uint2")
                            if hasattr(ml_dtypes, n))
except ImportError:  # pragma: no cover - ml_dtypes ships with onnx
    ml_dtypes = None
    _FLOAT8 = frozenset()
    _SMALL_INTS = frozenset()


def is_float8(dtype: Any) -> bool:
    return dtype is not None and np.dtype(dtype) in _FLOAT8


def int_range(dtype: np.dtype) -> tuple[int, int]:
    """(min, max) of an integer quantized type (int4 / uint4 / int2 through ml_dtypes)."""
    dtype = np.dtype(dtype)
    info = ml_dtypes.iinfo(dtype) if dtype in _SMALL_INTS else np.iinfo(dtype)
    return int(info.min), int(info.max)


def float8_max(dtype: np.dtype) -> float:
    return float(ml_dtypes.finfo(dtype).max)


def _where(info: NodeInfo) -> str:
    return f"{info.op_type} node {info.name!r}"


class QuantParams:
    """How one node's scale / zero point broadcast against x: per tensor, per axis or blocked."""

    def __init__(self, info: NodeInfo, *, x_index: int = 0):
        self.where = _where(info)
        self.axis = int(info.attr("axis", 1)) if info.opset >= 13 else None
        self.block_size = int(info.attr("block_size", 0)) if info.opset >= 21 else 0
        if self.block_size < 0:
            raise KernelError(f"{self.where}: block_size={self.block_size} must be >= 0")
        self.x_index = x_index

    def expand(self, xp: Any, p: Any, x_shape: tuple, what: str) -> Any:
        """`p` (a scale or zero point) shaped to broadcast against x."""
        rank = len(x_shape)
        if self.block_size == 0 and (p.ndim == 0 or (p.ndim == 1 and p.shape[0] == 1)):
            return p.reshape(())
        if self.axis is None:
            raise KernelError(f"{self.where}: {what} must be a scalar below opset 13, got shape "
                              f"{tuple(p.shape)}")
        axis = self.axis + rank if self.axis < 0 else self.axis
        if not 0 <= axis < max(rank, 1):
            raise KernelError(f"{self.where}: axis={self.axis} is out of range for input of rank {rank}")
        if self.block_size == 0:
            if p.ndim != 1 or p.shape[0] != x_shape[axis]:
                raise KernelError(f"{self.where}: {what} has shape {tuple(p.shape)}, expected a scalar or "
                                  f"({x_shape[axis]},) along axis {axis} of input {tuple(x_shape)}")
            shape = [1] * rank
            shape[axis] = p.shape[0]
            return p.reshape(shape)
        blocks = -(-x_shape[axis] // self.block_size)
        want = tuple(x_shape[:axis]) + (blocks,) + tuple(x_shape[axis + 1:])
        if tuple(p.shape) != want:
            raise KernelError(f"{self.where}: {what} has shape {tuple(p.shape)}, expected {want} for input "
                              f"{tuple(x_shape)} with block_size {self.block_size} along axis {axis}")
        full = xp.repeat(p, self.block_size, axis=axis)
        if full.shape[axis] != x_shape[axis]:
            index = [slice(None)] * rank
            index[axis] = slice(0, x_shape[axis])
            full = full[tuple(index)]
        return full


def _as_f32(xp: Any, a: Any) -> Any:
    return a.astype(F32, copy=False)


def quantize_values(xp: Any, x: Any, scale: Any, zero_point: Any, out_dtype: np.dtype,
                    saturate: bool = True) -> Any:
    """x (any float) -> out_dtype, as QuantizeLinear; scale / zero_point already broadcastable."""
    v = xp.divide(_as_f32(xp, x), _as_f32(xp, scale))
    if is_float8(out_dtype):
        # a float8 zero point is 0 (onnxruntime ignores it): adding it would turn -0 into +0
        return to_float8(xp, v, np.dtype(out_dtype), saturate)
    lo, hi = int_range(out_dtype)
    v = xp.rint(v)
    if zero_point is not None:
        v = v + zero_point.astype(F32)
    # NaN saturates to the type's minimum, as MLAS's clamp-then-convert leaves it
    v = xp.where(xp.isnan(v), np.float32(lo), xp.clip(v, np.float32(lo), np.float32(hi)))
    return v.astype(np.int32).astype(out_dtype)


def to_float8(xp: Any, v: Any, dtype: np.dtype, saturate: bool) -> Any:
    """float32 -> float8, bit for bit as onnxruntime's CPU conversion (``Float8E4M3FN`` /
    ``Float8E5M2`` constructors): round half to even, except in the top binade of e4m3fn
    without saturation, where [464, 480) overflows to NaN, [480, 496) stays 448 and the
    rest overflows (its truncate-then-round order), and an e5m2 rounding past the largest
    value that gives NaN, not inf. Other float8 types go through ml_dtypes' cast."""
    name = dtype.name
    if name not in ("float8_e4m3fn", "float8_e5m2"):
        top = np.float32(float8_max(dtype))
        if saturate:
            v = xp.where(xp.isnan(v), v, xp.clip(v, -top, top))
        return v.astype(dtype)
    u32 = np.uint32
    b = xp.ascontiguousarray(v, dtype=F32).view(u32)
    sign = (b >> u32(24)) & u32(0x80)
    e = (b >> u32(23)) & u32(0xFF)
    m = b & u32(0x7FFFFF)
    is_inf = (b & u32(0x7FFFFFFF)) == u32(0x7F800000)
    is_nan = (e == u32(0xFF)) & ~is_inf

    def rounded(val: Any, d: Any, base: int) -> Any:
        """The subnormal branch's rounding (mask = 1 << (base + d)), as onnxruntime writes it."""
        mask = u32(1) << (u32(base) + d)
        low = m & (mask - u32(1))
        up = ((m & mask) != 0) & (((val & u32(1)) != 0) | (low > 0) | (((m & (mask << u32(1))) != 0) & (low == 0)))
        return val + up.astype(u32)

    if name == "float8_e4m3fn":
        d = xp.clip(u32(120) - xp.minimum(e, u32(120)), 0, 3).astype(u32)
        sub = xp.where(d < 3, (u32(1) << (u32(2) - xp.minimum(d, u32(2)))) | (m >> (u32(21) + xp.minimum(d, u32(2)))),
                       (m > 0).astype(u32))
        sub = rounded(sub, d, 20)
        ex = (e.astype(np.int64) - 120).clip(0, 15).astype(u32)
        normal = (ex << u32(3)) | (m >> u32(20))
        normal = xp.where(normal == u32(0x7F), u32(0x7E), normal)
        up = ((m & u32(0x80000)) != 0) & (((m & u32(0x100000)) != 0) | ((m & u32(0x7FFFF)) != 0))
        overflow = u32(0x7E) if saturate else u32(0x7F)
        normal = xp.where(up & (normal < u32(0x7E)), normal + u32(1),
                          xp.where(up & (normal >= u32(0x7E)), normal if saturate else u32(0x7F), normal))
        mag = xp.where(e < u32(117), u32(0), xp.where(e < u32(121), sub, xp.where(e < u32(136), normal, overflow)))
        mag = xp.where(e == u32(0), u32(0), mag)
        mag = xp.where(is_inf, overflow, xp.where(is_nan, u32(0x7F), mag))
    else:  # float8_e5m2
        d = xp.clip(u32(112) - xp.minimum(e, u32(112)), 0, 2).astype(u32)
        sub = xp.where(d < 2, (u32(1) << (u32(1) - xp.minimum(d, u32(1)))) | (m >> (u32(22) + xp.minimum(d, u32(1)))),
                       (m > 0).astype(u32))
        sub = rounded(sub, d, 21)
        ex = (e.astype(np.int64) - 112).clip(0, 31).astype(u32)
        normal = (ex << u32(2)) | (m >> u32(21))
        up = ((m & u32(0x100000)) != 0) & (((m & u32(0xFFFFF)) != 0) | ((m & u32(0x200000)) != 0))
        overflow = u32(0x7B) if saturate else u32(0x7C)
        normal = xp.where(up & (normal < u32(0x7B)), normal + u32(1),
                          xp.where(up, normal | overflow, normal))
        mag = xp.where(e < u32(110), u32(0), xp.where(e < u32(113), sub, xp.where(e < u32(143), normal, overflow)))
        mag = xp.where(e == u32(0), u32(0), mag)
        mag = xp.where(is_inf, overflow, xp.where(is_nan, u32(0x7F), mag))
    return (sign | mag).astype(np.uint8).view(dtype)


def dequantize_values(xp: Any, q: Any, scale: Any, zero_point: Any, out_dtype: np.dtype) -> Any:
    if is_float8(q.dtype):
        v = q.astype(F32)
        if zero_point is not None:
            v = v - zero_point.astype(F32)
    else:
        v = q.astype(I32)
        if zero_point is not None:
            v = v - zero_point.astype(I32)
        v = v.astype(F32)
    return (v * _as_f32(xp, scale)).astype(out_dtype, copy=False)


def _store(out: Any, value: Any) -> Any:
    if out is None:
        return value if getattr(value, "flags", None) is None or value.flags.c_contiguous else value.copy()
    out[...] = value
    return out


def _attr_dtype(info: NodeInfo, name: str) -> np.dtype | None:
    code = int(info.attr(name, 0) or 0)
    return np.dtype(helper.tensor_dtype_to_np_dtype(code)) if code else None


def _first(*dtypes: Any) -> np.dtype:
    """The first dtype that is not None (np.dtype is falsy: no `or` chains)."""
    return next(np.dtype(d) for d in dtypes if d is not None)


def _declared(info: NodeInfo, index: int) -> np.dtype | None:
    return info.output_dtypes[index] if index < len(info.output_dtypes) else None


@register("QuantizeLinear", since=10)
def build_quantize_linear(info: NodeInfo) -> KernelFn:
    xp = info.xp
    params = QuantParams(info)
    saturate = bool(info.attr("saturate", 1)) if info.opset >= 19 else True
    zp_dtype = info.input_dtypes[2] if len(info.input_dtypes) > 2 else None
    dtype = _first(zp_dtype, _attr_dtype(info, "output_dtype") if info.opset >= 21 else None,
                   _declared(info, 0), U8)
    where = _where(info)

    def run(inputs: list, outs: list) -> tuple:
        x, scale, zp = pad_inputs(inputs, 3)[:3]
        if x.dtype.kind != "f" and x.dtype != I32:
            raise KernelError(f"{where}: input x has dtype {x.dtype}, expected a float type (or int32)")
        s = params.expand(xp, scale, x.shape, "y_scale")
        z = params.expand(xp, zp, x.shape, "y_zero_point") if zp is not None else None
        target = zp.dtype if zp is not None else dtype
        return (_store(outs[0], quantize_values(xp, x, s, z, np.dtype(target), saturate)),)

    return run


@register("DequantizeLinear", since=10)
def build_dequantize_linear(info: NodeInfo) -> KernelFn:
    xp = info.xp
    params = QuantParams(info)
    wanted = _attr_dtype(info, "output_dtype") if info.opset >= 23 else None
    where = _where(info)

    def run(inputs: list, outs: list) -> tuple:
        x, scale, zp = pad_inputs(inputs, 3)[:3]
        if zp is not None and zp.dtype != x.dtype:
            raise KernelError(f"{where}: x_zero_point has dtype {zp.dtype}, expected x's {x.dtype}")
        s = params.expand(xp, scale, x.shape, "x_scale")
        z = params.expand(xp, zp, x.shape, "x_zero_point") if zp is not None else None
        target = _first(wanted, outs[0].dtype if outs[0] is not None else None, scale.dtype)
        return (_store(outs[0], dequantize_values(xp, x, s, z, np.dtype(target))),)

    return run


# --- dynamic quantization -------------------------------------------------------------------


def dynamic_uint8_params(xp: Any, x: Any) -> tuple[Any, Any]:
    """(scale float32 0-d, zero point uint8 0-d) of onnxruntime's dynamic uint8 quantization."""
    x32 = _as_f32(xp, x)
    zero = np.float32(0.0)
    lo = xp.minimum(x32.min(), zero) if x32.size else xp.asarray(zero)
    hi = xp.maximum(x32.max(), zero) if x32.size else xp.asarray(zero)
    span = (hi - lo).astype(F32)
    scale = xp.where(hi == lo, np.float32(1.0), span / np.float32(255.0)).astype(F32)
    initial = (np.float32(0.0) - lo / scale).astype(F32)
    zp = xp.rint(xp.clip(initial, np.float32(0.0), np.float32(255.0))).astype(U8)
    return xp.asarray(scale).reshape(()), xp.asarray(zp).reshape(())


@register("DynamicQuantizeLinear", since=11, dtypes=frozenset({F32}))
def build_dynamic_quantize_linear(info: NodeInfo) -> KernelFn:
    xp = info.xp

    def run(inputs: list, outs: list) -> tuple:
        x = inputs[0]
        scale, zp = dynamic_uint8_params(xp, x)
        y = quantize_values(xp, x, scale, zp, U8)
        return (_store(outs[0], y), _store(outs[1], scale), _store(outs[2], zp))

    return run


# --- integer products -----------------------------------------------------------------------


def centred(xp: Any, q: Any, zp: Any, *, per: str, where: str, what: str) -> Any:
    """q - zp as float64 (exact), zp a scalar or per row of A (`per="row"`) / column of B."""
    v = q.astype(F64)
    if zp is None:
        return v
    z = zp.astype(F64)
    if z.ndim == 0 or z.size == 1:
        return v - z.reshape(())
    if per == "row":
        # A's zero point per row: shape [M] (or [..., M, 1]) against A [..., M, K]
        if z.ndim == 1 and v.ndim >= 2 and z.shape[0] == v.shape[-2]:
            return v - z.reshape(-1, 1)
        if z.ndim == v.ndim and z.shape[-1] == 1:
            return v - z
    else:
        if z.ndim == 1 and z.shape[0] == v.shape[-1]:
            return v - z
        if z.ndim == v.ndim and z.shape[-2] == 1:
            return v - z
    raise KernelError(f"{where}: {what} has shape {tuple(zp.shape)}, which does not fit input "
                      f"{tuple(q.shape)}")


#: CPU flags whose onnxruntime integer kernels multiply uint8 by int8 exactly (VNNI's
#: vpdpbusd accumulates in int32; AMX tiles too)
_EXACT_U8S8 = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
#: products of one saturating pass at most (memory held: 8 bytes each)
_PAIR_CHUNK = 1 << 20


def u8s8_pairs_saturate() -> bool:
    """Whether onnxruntime's CPU kernels here add each pair of uint8 x int8 products into
    int16 with saturation before accumulating in int32 (MLAS's AVX2 and AVX-512 core
    kernels: ``vpmaddubsw``), as on an x86-64 CPU without VNNI. 255 * 127 * 2 = 64770
    comes out as 32767 there."""
    return mlas_isa.isa() in ("avx2", "avx512") and not (_EXACT_U8S8 & mlas_isa.cpu_flags())


def saturating_u8s8(info: NodeInfo, host: bool) -> bool:
    """Whether a node's uint8 x int8 products are taken as onnxruntime's kernel takes them
    on this CPU (`u8s8_pairs_saturate`): in a host variant (`host`), where the plan asks
    for onnxruntime's arithmetic."""
    return host and info.onnxruntime_rounding and u8s8_pairs_saturate()


def integer_matmul(xp: Any, a: Any, b: Any, a_zp: Any, b_zp: Any, where: str,
                   saturate_pairs: bool = False) -> Any:
    """The int32 accumulation of (a - a_zp) @ (b - b_zp), held in float64: exact, or with
    `saturate_pairs` (a uint8 A, an int8 B, numpy) as onnxruntime's saturating kernel
    computes it (`_u8s8_saturated`)."""
    if a.ndim == 0 or b.ndim == 0:
        raise KernelError(f"{where}: inputs must have rank >= 1, got {tuple(a.shape)} and {tuple(b.shape)}")
    k_a, k_b = a.shape[-1], b.shape[0] if b.ndim == 1 else b.shape[-2]
    if k_a != k_b:
        raise KernelError(f"{where}: A {tuple(a.shape)} and B {tuple(b.shape)} do not multiply "
                          f"(inner dimensions {k_a} and {k_b})")
    if saturate_pairs and a.dtype == U8 and b.dtype == I8 and a.ndim >= 2 and b.ndim >= 2:
        return _u8s8_saturated(a, b, a_zp, b_zp, where)
    av = centred(xp, a, a_zp, per="row", where=where, what="a_zero_point")
    bv = centred(xp, b, b_zp, per="col", where=where, what="b_zero_point")
    return xp.matmul(av, bv)


def _u8s8_saturated(a: np.ndarray, b: np.ndarray, a_zp: Any, b_zp: Any, where: str) -> np.ndarray:
    """(a - a_zp) @ (b - b_zp) as MLAS's saturating uint8 x int8 kernel computes it: the
    raw products a[k] * b[k] summed in pairs (k = 0 and 1, 2 and 3, ...; an odd K's last
    product alone) into int16 with saturation, the pairs summed in int32, then the zero
    points applied exactly: - a_zp * sum(b) - b_zp * sum(a) + K * a_zp * b_zp. Measured
    against onnxruntime 1.32 on an AVX2 CPU (tests/ops/test_quant_kernels_ort.py)."""
    k = a.shape[-1]
    ai, bi = a.astype(np.int32), b.astype(np.int32)
    if k % 2:
        ai = np.concatenate((ai, np.zeros(ai.shape[:-1] + (1,), np.int32)), axis=-1)
        bi = np.concatenate((bi, np.zeros(bi.shape[:-2] + (1, bi.shape[-1]), np.int32)), axis=-2)
    a0, a1 = ai[..., 0::2], ai[..., 1::2]
    b0, b1 = bi[..., 0::2, :], bi[..., 1::2, :]
    m, n, pairs = a.shape[-2], b.shape[-1], a0.shape[-1]
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    raw = np.zeros(batch + (m, n), np.int64)
    step = max(1, _PAIR_CHUNK // max(1, m * n * int(np.prod(batch, dtype=np.int64))))
    for start in range(0, pairs, step):
        part = slice(start, min(pairs, start + step))
        pair = a0[..., :, part, None] * b0[..., None, part, :]
        pair += a1[..., :, part, None] * b1[..., None, part, :]
        np.clip(pair, -32768, 32767, out=pair)
        raw += pair.sum(axis=-2)
    acc = raw.astype(F64)
    # minus each zero point, shaped as `centred` shapes it: A's per row ([..., M, 1]), B's per column ([..., 1, N])
    minus_za = centred(np, np.zeros(a.shape[:-1] + (1,), np.uint8), a_zp, per="row", where=where,
                       what="a_zero_point") if a_zp is not None else None
    minus_zb = centred(np, np.zeros(b.shape[:-2] + (1, n), np.int8), b_zp, per="col", where=where,
                       what="b_zero_point") if b_zp is not None else None
    if minus_za is not None:
        acc = acc + minus_za * b.astype(F64).sum(axis=-2, keepdims=True)
    if minus_zb is not None:
        acc = acc + a.astype(F64).sum(axis=-1, keepdims=True) * minus_zb
    if minus_za is not None and minus_zb is not None:
        acc = acc + k * minus_za * minus_zb
    return acc


_INT8S = frozenset({np.dtype(np.int8), U8})


@register_with_host_variant("MatMulInteger", since=10, dtypes=_INT8S, dtype_inputs=(0, 1))
def build_matmul_integer(info: NodeInfo, host: bool) -> KernelFn:
    xp = info.xp
    where = _where(info)
    saturate = saturating_u8s8(info, host)

    def run(inputs: list, outs: list) -> tuple:
        a, b, a_zp, b_zp = pad_inputs(inputs, 4)[:4]
        acc = integer_matmul(xp, a, b, a_zp, b_zp, where, saturate)
        return (_store(outs[0], acc.astype(I32)),)

    return run


def requantize(xp: Any, acc: Any, multiplier: Any, zp: Any, out_dtype: np.dtype) -> Any:
    """MLAS's requantize: round_half_even(float32(acc) * multiplier) + zp, saturated."""
    lo, hi = int_range(out_dtype)
    v = xp.rint(acc.astype(F32) * multiplier)
    if zp is not None:
        v = v + zp.astype(F32)
    return xp.clip(v, np.float32(lo), np.float32(hi)).astype(np.int32).astype(out_dtype)


def _scale_vector(xp: Any, s: Any, n: int, where: str, what: str) -> Any:
    """A scale that is a scalar or one per output column ([N] / [1, N])."""
    s = _as_f32(xp, s)
    if s.size == 1:
        return s.reshape(())
    if s.size == n and (s.ndim == 1 or (s.ndim == 2 and s.shape[0] == 1)):
        return s.reshape(n)
    raise KernelError(f"{where}: {what} has shape {tuple(s.shape)}, expected a scalar or ({n},)")


@register_with_host_variant("QLinearMatMul", since=10, dtypes=_INT8S, dtype_inputs=(0, 3))
def build_qlinear_matmul(info: NodeInfo, host: bool) -> KernelFn:
    xp = info.xp
    where = _where(info)
    saturate = saturating_u8s8(info, host)

    def run(inputs: list, outs: list) -> tuple:
        a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = pad_inputs(inputs, 8)[:8]
        acc = integer_matmul(xp, a, b, a_zp, b_zp, where, saturate)
        n = acc.shape[-1]
        a_s = _scale_vector(xp, a_scale, 1, where, "a_scale")
        b_s = _scale_vector(xp, b_scale, n, where, "b_scale")
        y_s = _scale_vector(xp, y_scale, 1, where, "y_scale")
        multiplier = (a_s * b_s / y_s).astype(F32)
        dtype = y_zp.dtype if y_zp is not None else (outs[0].dtype if outs[0] is not None else a.dtype)
        z = None if y_zp is None else y_zp.reshape(())
        return (_store(outs[0], requantize(xp, acc, multiplier, z, np.dtype(dtype))),)

    return run

