"""SkipLayerNormalization and SkipSimplifiedLayerNormalization (com.microsoft).

    sum    = input + skip (+ bias)             (skip broadcasts: [B,S,H], [1,S,H], [S,H])
    output = (sum - mean) * inv_std * gamma (+ beta)       SkipLayerNormalization
    output = sum * inv_rms * gamma                         SkipSimplifiedLayerNormalization

Optional outputs, as onnxruntime's CPU kernel produces them: ``mean`` and
``inv_std_var`` (float32, shape ``sum.shape[:-1] + (1,)``; the simplified op's
``mean`` is all zeros) and ``input_skip_bias_sum`` (the sum, in the input dtype).
Like onnxruntime, the variance is ``E[x^2] - E[x]^2`` and half inputs are summed and
normalised in float32 (the sum output is rounded, the normalisation is not).

SkipSimplifiedLayerNormalization rounds as onnxruntime's CPU kernel does, bit for bit
given the same inputs: the squares summed left to right in the compute dtype
(`ort_float32.sequential_sum`; onnxruntime's scalar loop, no fma), then
``sqrt(sum / hidden + epsilon)`` and ``sum / that * gamma`` (a division, then a
product). SkipLayerNormalization keeps numpy's pairwise sums, or on one float32 row
on the host its compiled twin's float64 ones (`layer_norm_jit`; onnxruntime's differ
from both; not matched yet).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..addresses import SameArrays
from . import layer_norm_jit, mlas_jit
from .contrib import F32, F64, HALF_AND_FLOAT, MS_DOMAIN, emit, out_dtype
from .ort_float32 import sequential_sum
from .registry import KernelFn, NodeInfo, register_with_host_variant, with_fixed_arrays_form


def row_rms(row: np.ndarray, scratch: np.ndarray, consts: tuple, ct: np.dtype) -> Any:
    """sqrt(mean(row²) + eps) of one host row, as a scalar of the compute dtype `ct`,
    rounded as onnxruntime's kernel rounds it: the squares (into `scratch`, a row of
    `ct` that may be the output's buffer) summed left to right in `ct`, the rest in
    `ct`'s arithmetic (a float64 sqrt rounded to float32 is float32's sqrt).
    `consts`: (row length, eps) as scalars of `ct`."""
    np.multiply(row, row, out=scratch)
    np.add.accumulate(scratch, out=scratch)
    return ct.type(math.sqrt(scratch[-1] / consts[0] + consts[1]))


def _build_skip_norm(info: NodeInfo, simplified: bool, host: bool) -> KernelFn:
    """Both skip norms; `host`: the host variant (numpy's reductions and one-row forms,
    the simplified norm's float32 row compiled)."""
    xp = info.xp
    eps = float(info.attr("epsilon", 1e-12))
    dtype = out_dtype(info)
    sum_dtype = out_dtype(info, 3)
    wanted = tuple(_wanted(info, index, [None] * 4) for index in range(4))
    if host:
        # the simplified norm sums left to right, as onnxruntime does; the other keeps
        # numpy's pairwise sums
        row_sum = _sequential_sum if simplified else np.add.reduce
    else:
        def row_sum(a: Any, axis: int, keepdims: bool) -> Any:
            return xp.sum(a, axis=axis, keepdims=keepdims)
    scalars: dict = {}  # (compute dtype, hidden) -> (hidden, eps) as scalars of that dtype
    #: (function, arguments) of the last one-row call into preallocated outputs: the same
    #: arrays again (a replayed launch) go straight to it
    planned = SameArrays()
    # one float32 row compiled, chosen once: the simplified norm's with its rounding
    # (`mlas_jit`), the other's with its numpy form's operations (`layer_norm_jit`)
    compiled_row = None
    if host and simplified and mlas_jit.available("skip_rms_row"):
        compiled_row = mlas_jit.skip_rms_row
    elif host and not simplified and layer_norm_jit.available():
        compiled_row = layer_norm_jit.skip_layer_norm_row

    def compiled_one_row(args: tuple, results: tuple) -> list:
        """`one_row` compiled, on flat float32 rows."""
        compiled_row(*args)
        return list(results)

    def compiled_call(inputs: list, outs: list, x: Any, skip: Any, gamma: Any, beta: Any, bias: Any,
                      consts: tuple) -> list | None:
        """The compiled one-row call (kept for these arrays where its outputs are the
        preallocated ones), or None where it does not apply: not float32 throughout, not
        one contiguous row, a mean or inverse-std output asked for."""
        n_out, hidden = len(outs), x.shape[-1]
        if (x.dtype != F32 or skip.dtype != F32 or gamma.dtype != F32 or gamma.ndim != 1 or x.size != hidden
                or skip.size != hidden or gamma.size != hidden or not x.flags.c_contiguous
                or not skip.flags.c_contiguous or not gamma.flags.c_contiguous
                or not all(v is None or _flat_row(v, hidden) for v in (beta, bias))
                or any(n_out > i and (outs[i] is not None or wanted[i]) for i in (1, 2))):
            return None
        y_out, sum_out = outs[0], outs[3] if n_out > 3 else None
        y = y_out if _row_buffer(y_out, x.shape) else np.empty(x.shape, F32)
        s = sum_out if _row_buffer(sum_out, x.shape) else np.empty(x.shape, F32)
        results = [y if y is y_out or dtype == F32 else emit(y_out, y, dtype), None, None, None]
        if n_out > 3 and (sum_out is not None or wanted[3]):
            results[3] = s if s is sum_out or sum_dtype == F32 else emit(sum_out, s, sum_dtype)
        if simplified:
            args = (x.reshape(-1), skip.reshape(-1), gamma, *consts, s.reshape(-1), y.reshape(-1))
        else:
            args = (x.reshape(-1), skip.reshape(-1), None if bias is None else bias.reshape(-1), gamma,
                    None if beta is None else beta.reshape(-1), consts[1], s.reshape(-1), y.reshape(-1))
        call = (args, tuple(results[:max(n_out, 1)]))
        if y is y_out and results[0] is y and (n_out <= 3 or results[3] is None or s is sum_out):
            planned.keep(inputs, outs, (compiled_one_row, call))
        return compiled_one_row(*call)

    def one_row(x: Any, skip: Any, s: Any, gamma: Any, flat: Any, s_flat: Any,
                consts: tuple, ct: np.dtype, results: tuple) -> list:
        """The simplified norm of one row into its sum (`s`, flat: `s_flat`) and output
        (flat: `flat`) buffers."""
        np.add(x, skip, out=s, dtype=ct)
        return normalize_row(gamma, flat, s_flat, consts, ct, results)

    def normalize_row(gamma: Any, flat: Any, s_flat: Any, consts: tuple, ct: np.dtype, results: tuple) -> list:
        """`one_row` once the sum is in place."""
        np.divide(s_flat, row_rms(s_flat, flat, consts, ct), out=flat)
        np.multiply(flat, gamma, out=flat, dtype=ct)
        return list(results)

    def run(inputs: list, outs: list) -> list:
        plan = planned.kept_for(inputs, outs)
        if plan is not None:
            return plan[0](*plan[1])
        n_in, n_out = len(inputs), len(outs)
        x, skip, gamma = inputs[0], inputs[1], inputs[2]
        if simplified:
            beta, bias = None, inputs[3] if n_in > 3 else None
        else:
            beta, bias = inputs[3] if n_in > 3 else None, inputs[4] if n_in > 4 else None
        ct = F64 if x.dtype == F64 else F32
        shape = x.shape
        hidden = shape[-1]
        consts = scalars.get((ct, hidden))
        if consts is None:
            consts = scalars[(ct, hidden)] = (ct.type(hidden), ct.type(eps))
        if compiled_row is not None and (bias is None or not simplified):
            result = compiled_call(inputs, outs, x, skip, gamma, beta, bias, consts)
            if result is not None:
                return result
        y_out = outs[0]
        sum_out = outs[3] if n_out > 3 else None
        # the sum goes straight into the sum output where that holds the compute dtype
        s_buf = sum_out if (sum_out is not None and sum_out.dtype == ct and sum_out.shape == shape
                            and bias is None) else None
        s = xp.add(x, skip, out=s_buf, dtype=ct)
        if bias is not None:
            xp.add(s, bias, out=s, dtype=ct)
        # y's buffer: the output itself where it holds the compute dtype
        y = y_out if (y_out is not None and y_out.dtype == ct and y_out.shape == s.shape) else None
        mean = None
        if (simplified and host and s.size == hidden and s is s_buf and y is y_out and bias is None
                and gamma.ndim == 1 and not any(n_out > i and (outs[i] is not None or wanted[i]) for i in (1, 2))):
            # one row (decode) into preallocated outputs: kept for the same arrays again
            # (the sum is in s already: it may be x's or skip's own buffer, written in place)
            plan = (gamma, y.reshape(-1), s.reshape(-1), consts, ct, tuple([y, None, None, s][:max(n_out, 1)]))
            planned.keep(inputs, outs, (one_row, (x, skip, s, *plan)))
            return normalize_row(*plan)
        if simplified and host and s.size == hidden:
            # one row (decode), as `normalize_row` computes it
            y = np.empty(s.shape, ct) if y is None else y
            flat, s_flat = y.reshape(-1), s.reshape(-1)
            denom = row_rms(s_flat, flat, consts, ct)
            np.divide(s_flat, denom, out=flat)
            if gamma.ndim == 1:
                np.multiply(flat, gamma, out=flat, dtype=ct)
            else:
                np.multiply(y, gamma, out=y, dtype=ct)
        else:
            y = xp.multiply(s, s, out=y)
            mean_sq = row_sum(y, axis=-1, keepdims=True)
            mean_sq /= consts[0]
            if simplified:
                denom = mean_sq
                denom += consts[1]
                xp.sqrt(denom, out=denom)
                xp.divide(s, denom, out=y)
            else:
                mean = row_sum(s, axis=-1, keepdims=True)
                mean /= consts[0]
                denom = xp.multiply(mean, mean)
                xp.subtract(mean_sq, denom, out=denom)
                denom += consts[1]
                xp.sqrt(denom, out=denom)
                xp.subtract(s, mean, out=y)
                xp.divide(y, denom, out=y)
            xp.multiply(y, gamma, out=y, dtype=ct)
            if beta is not None:
                xp.add(y, beta, out=y, dtype=ct)
        results: list = [y if y is y_out else emit(y_out, y, dtype), None, None, None]
        if n_out > 1 and (outs[1] is not None or wanted[1]):
            m = xp.zeros(shape[:-1] + (1,), dtype=F32) if mean is None else mean
            results[1] = emit(outs[1], m, F32)
        if n_out > 2 and (outs[2] is not None or wanted[2]):
            inv = ct.type(1.0) / denom
            if not hasattr(inv, "shape") or inv.shape != shape[:-1] + (1,):
                inv = xp.full(shape[:-1] + (1,), inv, dtype=ct)
            results[2] = emit(outs[2], inv, F32)
        if n_out > 3 and (sum_out is not None or wanted[3]):
            results[3] = s if s is sum_out else emit(sum_out, s, sum_dtype)
        return results[:max(n_out, 1)]

    def fixed_arrays_form(inputs: list, outs: list) -> Any:
        """The one-row call kept for these very arrays, if the last call kept one."""
        plan = planned.kept_for(inputs, outs)
        if plan is None:
            return None
        fn, args = plan
        return lambda ins, outs_: fn(*args)

    return with_fixed_arrays_form(run, fixed_arrays_form)


def _flat_row(a: Any, hidden: int) -> bool:
    """Whether a beta or bias is `hidden` contiguous float32s, as the compiled rows read it."""
    return a.dtype == F32 and a.size == hidden and a.flags.c_contiguous


def _row_buffer(out: Any, shape: tuple) -> bool:
    """Whether a preallocated output holds one float32 row of `shape`, contiguous."""
    return out is not None and out.dtype == F32 and out.shape == shape and out.flags.c_contiguous


def _sequential_sum(a: np.ndarray, axis: int, keepdims: bool) -> np.ndarray:
    """`row_sum` for the simplified norm on the host: over the last axis, left to right."""
    return sequential_sum(a)


def _wanted(info: NodeInfo, index: int, outs: list) -> bool:
    if outs[index] is not None:
        return True
    return not info.output_used or index >= len(info.output_used) or bool(info.output_used[index])


@register_with_host_variant("SkipLayerNormalization", domain=MS_DOMAIN, dtypes=HALF_AND_FLOAT, per_node=True)
def build_skip_layer_norm(info: NodeInfo, host: bool) -> KernelFn:
    return _build_skip_norm(info, simplified=False, host=host)


@register_with_host_variant("SkipSimplifiedLayerNormalization", domain=MS_DOMAIN, dtypes=HALF_AND_FLOAT,
                            per_node=True)
def build_skip_simplified_layer_norm(info: NodeInfo, host: bool) -> KernelFn:
    return _build_skip_norm(info, simplified=True, host=host)
