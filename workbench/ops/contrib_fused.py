"""Fused float contrib ops (``com.microsoft``) that onnxruntime's CPU optimizer and
``onnxruntime.transformers`` fusions write: FusedMatMul, FusedGemm, BiasGelu,
GemmFastGelu, BiasAdd.

- FusedMatMul: ``alpha * op(A) @ op(B)``. ``transA`` / ``transB`` swap the last two axes;
  ``transBatchA`` / ``transBatchB`` first read ``[d0, d1, ..., dn-2, dn-1]`` as
  ``[d1, ..., dn-2, d0, dn-1]`` (onnxruntime's batch transpose), then ``transA`` applies.
- FusedGemm: Gemm, then its ``activation`` (Relu, LeakyRelu, Tanh, Sigmoid, HardSigmoid).
- BiasGelu: erf GELU of ``A + bias``; GemmFastGelu: FastGelu of ``X @ W (+ bias)``;
  BiasAdd: ``X + bias + skip``.

Half-precision inputs are widened to float32 and rounded once at the end, as
onnxruntime's CPU kernels do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import KernelError
from .contrib import (
    _GELU_CUBIC,
    _SQRT_2_OVER_PI,
    _SQRT_HALF,
    F32,
    HALF_AND_FLOAT,
    HALF_FLOAT_DOUBLE,
    MS_DOMAIN,
    attr_str,
    compute_dtype,
    emit,
    pad_inputs,
)
from .registry import KernelFn, NodeInfo, register


def _where(info: NodeInfo) -> str:
    return f"{info.op_type} node {info.name!r}"


def _batch_transposed(x: Any) -> Any:
    """[d0, d1, ..., dn-2, dn-1] read as [d1, ..., dn-2, d0, dn-1]."""
    if x.ndim < 3:
        return x
    n = x.ndim
    return x.transpose(tuple(range(1, n - 1)) + (0, n - 1))


def _swap_last(x: Any) -> Any:
    return x if x.ndim < 2 else x.swapaxes(-1, -2)


@register("FusedMatMul", domain=MS_DOMAIN, dtypes=HALF_FLOAT_DOUBLE, dtype_inputs=(0, 1))
def build_fused_matmul(info: NodeInfo) -> KernelFn:
    xp = info.xp
    where = _where(info)
    alpha = float(info.attr("alpha", 1.0))
    trans_a, trans_b = bool(info.attr("transA", 0)), bool(info.attr("transB", 0))
    batch_a, batch_b = bool(info.attr("transBatchA", 0)), bool(info.attr("transBatchB", 0))

    def run(inputs: list, outs: list) -> tuple:
        a, b = inputs[0], inputs[1]
        ct = compute_dtype(a.dtype)
        dtype = a.dtype
        if batch_a:
            a = _batch_transposed(a)
        if batch_b:
            b = _batch_transposed(b)
        if trans_a:
            a = _swap_last(a)
        if trans_b:
            b = _swap_last(b)
        ka = a.shape[-1]
        kb = b.shape[0] if b.ndim == 1 else b.shape[-2]
        if ka != kb:
            raise KernelError(f"{where}: op(A) {tuple(a.shape)} and op(B) {tuple(b.shape)} do not multiply")
        y = xp.matmul(a.astype(ct, copy=False), b.astype(ct, copy=False))
        if alpha != 1.0:
            y = y * ct.type(alpha)
        return (emit(outs[0], y, dtype),)

    return run


_ACTIVATIONS = ("Relu", "LeakyRelu", "Tanh", "Sigmoid", "HardSigmoid")


def _activation(xp: Any, name: str, alpha: float, beta: float, y: Any, ct: np.dtype) -> Any:
    if name == "Relu":
        return xp.maximum(y, ct.type(0))
    if name == "LeakyRelu":
        return xp.where(y >= 0, y, y * ct.type(alpha))
    if name == "Tanh":
        return xp.tanh(y)
    if name == "Sigmoid":
        return ct.type(1) / (ct.type(1) + xp.exp(-y))
    return xp.clip(y * ct.type(alpha) + ct.type(beta), ct.type(0), ct.type(1))  # HardSigmoid


@register("FusedGemm", domain=MS_DOMAIN, dtypes=frozenset({F32}))
def build_fused_gemm(info: NodeInfo) -> KernelFn:
    xp = info.xp
    where = _where(info)
    alpha, beta = float(info.attr("alpha", 1.0)), float(info.attr("beta", 1.0))
    trans_a, trans_b = bool(info.attr("transA", 0)), bool(info.attr("transB", 0))
    act = attr_str(info, "activation", "")
    if act and act not in _ACTIVATIONS:
        raise KernelError(f"{where}: activation {act!r} is not supported (expected one of {_ACTIVATIONS})")
    act_alpha = float(info.attr("activation_alpha", 0.01 if act == "LeakyRelu" else 0.2))
    act_beta = float(info.attr("activation_beta", 0.5))

    def run(inputs: list, outs: list) -> tuple:
        a, b, c = pad_inputs(inputs, 3)[:3]
        a = a.T if trans_a else a
        b = b.T if trans_b else b
        y = xp.matmul(a, b)
        if alpha != 1.0:
            y = y * F32.type(alpha)
        if c is not None and beta != 0.0:
            y = y + (c if beta == 1.0 else c * F32.type(beta))
        if act:
            y = _activation(xp, act, act_alpha, act_beta, y, F32)
        return (emit(outs[0], y, F32),)

    return run


def gelu_erf(xp: Any, erf: Any, v: Any, ct: np.dtype) -> Any:
    """0.5 v (1 + erf(v / sqrt 2)) into a fresh array (0-d values included)."""
    t = xp.empty(v.shape, dtype=ct)
    xp.multiply(v, ct.type(_SQRT_HALF), out=t)
    erf(t, out=t)
    t += ct.type(1.0)
    t *= v
    t *= ct.type(0.5)
    return t


@register("BiasGelu", domain=MS_DOMAIN, dtypes=HALF_FLOAT_DOUBLE)
def build_bias_gelu(info: NodeInfo) -> KernelFn:
    from .elementwise import _erf_function  # noqa: PLC0415 - the backend's erf, shared

    xp = info.xp
    erf = _erf_function(info)

    def run(inputs: list, outs: list) -> tuple:
        x, bias = inputs[0], inputs[1]
        ct = compute_dtype(x.dtype)
        v = xp.add(x.astype(ct), bias.astype(ct))
        return (emit(outs[0], gelu_erf(xp, erf, v, ct), x.dtype),)

    return run


def fast_gelu(xp: Any, v: Any, ct: np.dtype) -> Any:
    inner = v * (ct.type(_SQRT_2_OVER_PI) + ct.type(_SQRT_2_OVER_PI * _GELU_CUBIC) * v * v)
    return ct.type(0.5) * v * (ct.type(1.0) + xp.tanh(inner))


@register("GemmFastGelu", domain=MS_DOMAIN, dtypes=HALF_AND_FLOAT)
def build_gemm_fast_gelu(info: NodeInfo) -> KernelFn:
    xp = info.xp

    def run(inputs: list, outs: list) -> tuple:
        x, w, bias = pad_inputs(inputs, 3)[:3]
        ct = compute_dtype(x.dtype)
        v = xp.matmul(x.astype(ct, copy=False), w.astype(ct, copy=False))
        if bias is not None:
            v = v + bias.astype(ct)
        return (emit(outs[0], fast_gelu(xp, v, ct), x.dtype),)

    return run


@register("BiasAdd", domain=MS_DOMAIN, dtypes=HALF_AND_FLOAT)
def build_bias_add(info: NodeInfo) -> KernelFn:
    xp = info.xp

    def run(inputs: list, outs: list) -> tuple:
        x, bias, skip = inputs[0], inputs[1], inputs[2]
        ct = compute_dtype(x.dtype)
        v = xp.add(xp.add(x.astype(ct), bias.astype(ct)), skip.astype(ct))
        return (emit(outs[0], v, x.dtype),)

    return run
