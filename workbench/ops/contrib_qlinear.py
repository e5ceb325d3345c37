"""Quantized contrib ops (``com.microsoft``) that onnxruntime's CPU optimizer and its
quantization tools write: MatMulIntegerToFloat, DynamicQuantizeMatMul, QGemm,
QLinearAdd, QLinearMul.

Arithmetic as onnxruntime's CPU kernels (MLAS) do it, pinned by
``tests/ops/test_quant_kernels_ort.py``:

- MatMulIntegerToFloat / DynamicQuantizeMatMul: the exact int32 accumulation of
  ``(a - a_zp) @ (b - b_zp)``, then ``float32(acc) * float32(a_scale * b_scale)`` (one
  scale per output column where b_scale is per column), then ``+ bias``, each a float32
  operation (MLAS's scale-bias output processor). DynamicQuantizeMatMul first quantizes
  A to uint8 with DynamicQuantizeLinear's scale and zero point.
- QGemm: ``acc = (A' - a_zp) @ (B' - b_zp) + C`` (C int32, broadcast), then with
  ``y_scale``: requantized by ``alpha * a_scale * b_scale / y_scale``; without: float32
  ``acc * (alpha * a_scale * b_scale)``.
- QLinearAdd (MLAS's x86-64 AVX2 kernel): ``round_half_even(fma(a, rA, fma(b, rB, zpC -
  (rA * zpA + rB * zpB))))``, ``rA = scaleA / scaleC`` (a one-element operand folded into
  the constant part first), saturated; QLinearMul:
  ``round_half_even(float32((a - zpA) * (b - zpB)) * (scaleA * scaleB / scaleC)) + zpC``,
  saturated. Both broadcast numpy-style.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import KernelError
from .contrib import F32, MS_DOMAIN, pad_inputs
from .quantize import (
    _INT8S,
    I32,
    U8,
    _scale_vector,
    _store,
    dynamic_uint8_params,
    int_range,
    integer_matmul,
    quantize_values,
    requantize,
    saturating_u8s8,
)
from .registry import KernelFn, NodeInfo, register, register_with_host_variant


def _where(info: NodeInfo) -> str:
    return f"{info.op_type} node {info.name!r}"


def _scaled(xp: Any, acc: Any, multiplier: Any, bias: Any) -> Any:
    y = acc.astype(F32) * multiplier
    if bias is not None:
        y = y + bias.astype(F32, copy=False)
    return y.astype(F32, copy=False)


@register_with_host_variant("MatMulIntegerToFloat", domain=MS_DOMAIN, dtypes=_INT8S, dtype_inputs=(0, 1))
def build_matmul_integer_to_float(info: NodeInfo, host: bool) -> KernelFn:
    xp = info.xp
    where = _where(info)
    saturate = saturating_u8s8(info, host)

    def run(inputs: list, outs: list) -> tuple:
        a, b, a_scale, b_scale, a_zp, b_zp, bias = pad_inputs(inputs, 7)[:7]
        acc = integer_matmul(xp, a, b, a_zp, b_zp, where, saturate)
        n = acc.shape[-1]
        multiplier = (_scale_vector(xp, a_scale, 1, where, "a_scale")
                      * _scale_vector(xp, b_scale, n, where, "b_scale")).astype(F32)
        return (_store(outs[0], _scaled(xp, acc, multiplier, bias)),)

    return run


@register_with_host_variant("DynamicQuantizeMatMul", domain=MS_DOMAIN, dtypes=frozenset({F32}))
def build_dynamic_quantize_matmul(info: NodeInfo, host: bool) -> KernelFn:
    xp = info.xp
    where = _where(info)
    saturate = saturating_u8s8(info, host)

    def run(inputs: list, outs: list) -> tuple:
        a, b, b_scale, b_zp, bias = pad_inputs(inputs, 5)[:5]
        if b.dtype not in _INT8S:
            raise KernelError(f"{where}: input B has dtype {b.dtype}, expected int8 or uint8")
        a_scale, a_zp = dynamic_uint8_params(xp, a)
        qa = quantize_values(xp, a, a_scale, a_zp, U8)
        acc = integer_matmul(xp, qa, b, a_zp, b_zp, where, saturate)
        n = acc.shape[-1]
        multiplier = (a_scale * _scale_vector(xp, b_scale, n, where, "b_scale")).astype(F32)
        return (_store(outs[0], _scaled(xp, acc, multiplier, bias)),)

    return run


@register_with_host_variant("QGemm", domain=MS_DOMAIN, dtypes=_INT8S, dtype_inputs=(0, 3))
def build_qgemm(info: NodeInfo, host: bool) -> KernelFn:
    xp = info.xp
    where = _where(info)
    saturate = saturating_u8s8(info, host)
    alpha = np.float32(info.attr("alpha", 1.0))
    trans_a = bool(info.attr("transA", 0))
    trans_b = bool(info.attr("transB", 0))

    def run(inputs: list, outs: list) -> tuple:
        a, a_scale, a_zp, b, b_scale, b_zp, c, y_scale, y_zp = pad_inputs(inputs, 9)[:9]
        if a.ndim != 2 or b.ndim != 2:
            raise KernelError(f"{where}: A and B must be 2-D, got {tuple(a.shape)} and {tuple(b.shape)}")
        if trans_a:
            a = a.T
        if trans_b:
            b = b.T
            if b_zp is not None and b_zp.size > 1:
                b_zp = b_zp.reshape(-1)
        acc = integer_matmul(xp, a, b, a_zp, b_zp, where, saturate)
        if c is not None:
            acc = acc + c.astype(np.float64)
        n = acc.shape[-1]
        scale = (alpha * _scale_vector(xp, a_scale, 1, where, "a_scale")
                 * _scale_vector(xp, b_scale, n, where, "b_scale")).astype(F32)
        if y_scale is None:
            return (_store(outs[0], (acc.astype(F32) * scale).astype(F32)),)
        multiplier = (scale / _scale_vector(xp, y_scale, 1, where, "y_scale")).astype(F32)
        dtype = y_zp.dtype if y_zp is not None else a.dtype
        z = None if y_zp is None else y_zp.reshape(())
        return (_store(outs[0], requantize(xp, acc.astype(I32), multiplier, z, np.dtype(dtype))),)

    return run


def _scalar_param(xp: Any, p: Any, where: str, what: str, dtype: Any) -> Any:
    if p is None:
        return xp.zeros((), dtype=dtype)
    if p.size != 1:
        raise KernelError(f"{where}: {what} must be a scalar, got shape {tuple(p.shape)}")
    return p.reshape(())


def _saturate(xp: Any, v: Any, dtype: np.dtype) -> Any:
    lo, hi = int_range(dtype)
    return xp.clip(v, np.float32(lo), np.float32(hi)).astype(np.int32).astype(dtype)


def _fma(xp: Any, x: Any, y: Any, z: Any) -> Any:
    """float32 fused multiply-add (MLAS's AVX2 kernels): the product of two float32s is
    exact in float64, and so is its sum with a float32 of these magnitudes (small integers
    times a scale ratio), so one rounding to float32 remains."""
    return (x.astype(np.float64) * y.astype(np.float64) + z.astype(np.float64)).astype(F32)


def _binary_params(xp: Any, inputs: list, where: str, zero_as: Any) -> tuple:
    """(A, B, its three float32 scales, its three zero points as `zero_as`) of a
    QLinearAdd / QLinearMul: A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale,
    C_zero_point, each scale and zero point a scalar."""
    a, sa, za, b, sb, zb, sc, zc = pad_inputs(inputs, 8)[:8]
    scales = tuple(_scalar_param(xp, s, where, n, F32).astype(F32) for s, n in
                   ((sa, "A_scale"), (sb, "B_scale"), (sc, "C_scale")))
    zeros = tuple(_scalar_param(xp, z, where, n, a.dtype).astype(zero_as) for z, n in
                  ((za, "A_zero_point"), (zb, "B_zero_point"), (zc, "C_zero_point")))
    return a, b, scales, zeros


@register("QLinearAdd", domain=MS_DOMAIN, dtypes=_INT8S, dtype_inputs=(0, 3))
def build_qlinear_add(info: NodeInfo) -> KernelFn:
    xp = info.xp
    where = _where(info)

    def run(inputs: list, outs: list) -> tuple:
        a, b, (sa, sb, sc), (za, zb, zc) = _binary_params(xp, inputs, where, F32)
        dtype = a.dtype
        ra, rb = (sa / sc).astype(F32), (sb / sc).astype(F32)
        fixed = (zc - (ra * za + rb * zb)).astype(F32)
        af, bf = a.astype(F32), b.astype(F32)
        if b.size == 1:
            v = _fma(xp, af, ra, (fixed + bf.reshape(()) * rb).astype(F32))
        elif a.size == 1:
            v = _fma(xp, bf, rb, (fixed + af.reshape(()) * ra).astype(F32))
        else:
            v = _fma(xp, af, ra, _fma(xp, bf, rb, fixed))
        return (_store(outs[0], _saturate(xp, xp.rint(v), dtype)),)

    return run


@register("QLinearMul", domain=MS_DOMAIN, dtypes=_INT8S, dtype_inputs=(0, 3))
def build_qlinear_mul(info: NodeInfo) -> KernelFn:
    xp = info.xp
    where = _where(info)

    def run(inputs: list, outs: list) -> tuple:
        a, b, (sa, sb, sc), (za, zb, zc) = _binary_params(xp, inputs, where, I32)
        dtype = a.dtype
        ratio = (sa * sb / sc).astype(F32)
        prod = (a.astype(I32) - za) * (b.astype(I32) - zb)
        v = xp.rint(prod.astype(F32) * ratio) + zc.astype(F32)
        return (_store(outs[0], _saturate(xp, v, dtype)),)

    return run
