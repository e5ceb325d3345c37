"""Matrix products: MatMul and Gemm.

MatMul follows numpy's `matmul` (1-D operands are promoted and the added dimension
removed; batch dimensions broadcast), which is exactly ONNX's definition.

numpy has no BLAS path for float16 (its matmul loop is scalar), so on the CPU a
float16 product is computed in float32 and rounded once; this matches
onnx.reference, whose float16 loop accumulates in float32 as well. CuPy multiplies
float16 natively through cuBLAS.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import NUMERIC
from . import matvec_jit
from .registry import KernelFn, NodeInfo, register, register_with_host_variant

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)


def _emit(out: Any, value: Any, dtype: np.dtype) -> Any:
    """Place `value` into the preallocated `out`, or return it as a `dtype` array."""
    if out is None:
        return value.astype(dtype, copy=False)
    out[...] = value
    return out


def _half_needs_upcast(info: NodeInfo, host: bool) -> bool:
    """numpy multiplies float16 in a scalar loop: on the host, in float32 and rounded once."""
    return host and info.input_dtypes[0] == F16


@register("MatMul", since=1, dtypes=NUMERIC)
def build_matmul(info: NodeInfo) -> KernelFn:
    xp = info.xp

    def run(inputs: list, outs: list) -> tuple:
        return (xp.matmul(inputs[0], inputs[1], out=outs[0]),)
    return run


@register("MatMul", since=1, dtypes=NUMERIC, host=True)
def build_matmul_host(info: NodeInfo) -> KernelFn:
    """The host variant: float16 in float32; a float32 product by a constant
    column-major weight one row at a time compiled (`matvec_jit`)."""
    if _half_needs_upcast(info, host=True):
        def run_half(inputs: list, outs: list) -> tuple:
            product = np.matmul(inputs[0].astype(F32), inputs[1].astype(F32))
            return (_emit(outs[0], product, F16),)
        return run_half
    weight = info.initializer_inputs.get(1)
    if (not info.onnxruntime_rounding and info.input_dtypes[0] == F32 and weight is not None
            and weight.dtype == F32 and weight.ndim == 2 and weight.size >= matvec_jit.MIN_WEIGHTS
            and weight.T.flags.c_contiguous and matvec_jit.available()):
        return _matvec_or_matmul(weight)
    return build_matmul(info)


def _matvec_or_matmul(weight: np.ndarray) -> KernelFn:
    """A float32 MatMul by a constant column-major weight: one row at a time compiled
    (`matvec_jit`), anything else numpy's."""
    rows = weight.T  # (N, K), contiguous
    n, k = rows.shape

    def run(inputs: list, outs: list) -> tuple:
        x, w, out = inputs[0], inputs[1], outs[0]
        if (w is weight and x.dtype == F32 and x.size == k and x.flags.c_contiguous and x.ndim >= 1
                and (out is None or (out.dtype == F32 and out.flags.c_contiguous and out.size == n))):
            y = out if out is not None else np.empty(x.shape[:-1] + (n,), F32)
            matvec_jit.product(x.reshape(k), rows, y.reshape(n))
            return (y,)
        return (np.matmul(x, w, out=out),)
    return run


def _gemm_compute_dtype(info: NodeInfo, alpha: float, beta: float, host: bool) -> np.dtype | None:
    """The dtype to compute in when it is not the operands' own (None: theirs)."""
    dtype = info.input_dtypes[0]
    if _half_needs_upcast(info, host):
        return F32
    if dtype is not None and dtype.kind in "iu" and (alpha != 1.0 or beta != 1.0):
        # float alpha/beta scale integer products: onnx.reference computes in float64
        return F64
    return None


@register_with_host_variant("Gemm", since=1, dtypes=NUMERIC)
def build_gemm(info: NodeInfo, host: bool) -> KernelFn:
    """Y = alpha * A' @ B' + beta * C, with C broadcast to Y (unidirectionally); the host
    variant computes float16 in float32."""
    xp = info.xp
    alpha = float(info.attr("alpha", 1.0))
    beta = float(info.attr("beta", 1.0))
    trans_a = bool(info.attr("transA", 0))
    trans_b = bool(info.attr("transB", 0))
    uses_c = info.has_input(2) and beta != 0.0
    compute_dtype = _gemm_compute_dtype(info, alpha, beta, host)

    def product(inputs: list, out: Any) -> Any:
        a = inputs[0].T if trans_a else inputs[0]
        b = inputs[1].T if trans_b else inputs[1]
        if compute_dtype is not None:
            a, b, out = a.astype(compute_dtype), b.astype(compute_dtype), None
        y = xp.matmul(a, b, out=out)
        if alpha != 1.0:
            y *= alpha
        if uses_c:
            y += inputs[2] if beta == 1.0 else beta * inputs[2]
        return y

    if compute_dtype is None:
        def run(inputs: list, outs: list) -> tuple:
            return (product(inputs, outs[0]),)
        return run

    out_dtype = info.input_dtypes[0]

    def run_converted(inputs: list, outs: list) -> tuple:
        return (_emit(outs[0], product(inputs, None), out_dtype),)
    return run_converted
