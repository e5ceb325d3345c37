"""LayerNormalization (opset 17), RMSNormalization (opset 23) and onnxruntime's
SimplifiedLayerNormalization (registered by onnxruntime in the default domain).

All three normalise over the trailing dimensions from `axis` to the end:

    LayerNormalization            y = (x - mean) * inv_std * scale (+ bias)
    RMSNormalization              y = x * inv_rms * scale
    SimplifiedLayerNormalization  y = x * inv_rms * scale

with inv_std = 1 / sqrt(var + epsilon) and inv_rms = 1 / sqrt(mean(x^2) + epsilon).
`stash_type` (default 1, float32) is the precision of the statistics: float16 inputs
are normalised in float32 and rounded once at the end; float64 inputs keep float64
(as onnx.reference and onnxruntime do). The optional statistics outputs
(LayerNormalization's Mean and InvStdDev, SimplifiedLayerNormalization's
inv_std_var) have the stash dtype and shape x.shape[:axis] + (1,) * (rank - axis).
SimplifiedLayerNormalization's Y has the dtype of `scale` (onnxruntime's type V).

Where the plan asks for onnxruntime's rounding (`NodeInfo.onnxruntime_rounding`), the
RMS norms on float32 (x, scale and stash all float32, on the host) round as
onnxruntime's CPU kernel does, bit for bit given the same inputs (its AVX2 / FMA
path): rows of 16 or more elements sum their squares in 8 fma lanes
(`ort_float32.sum_of_squares_fma8`), then ``inv = 1 / sqrt(sum / n + epsilon)`` and
``y = (x * inv) * scale``; shorter rows sum left to right without fma and divide,
``y = x / sqrt(...) * scale``. On float64 both sum left to right and divide.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from onnx import helper

from ..dtypes import FLOATS
from . import layer_norm_jit, mlas_jit
from .ort_float32 import FMA8_MIN_ROW, sequential_sum, sum_of_squares_fma8, sum_of_squares_function
from .registry import KernelFn, NodeInfo, register, settled_call, with_fixed_arrays_form

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)


def _emit(out: Any, value: Any, dtype: np.dtype) -> Any:
    """Place `value` into the preallocated `out`, or return it as a `dtype` array."""
    if value is out:
        return out
    if out is None:
        return value.astype(dtype, copy=False)
    out[...] = value
    return out


def _stash_dtype(info: NodeInfo) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(int(info.attr("stash_type", 1))))


def _compute_dtype(x_dtype: np.dtype | None, stash: np.dtype) -> np.dtype:
    """At least the stash precision, never less than the input's."""
    return stash if x_dtype is None else np.promote_types(x_dtype, stash)


def _trailing_axes(info: NodeInfo) -> Callable[[int], tuple]:
    """`axes_for(ndim)`: the normalised axes (axis..end); constant when the rank is known."""
    axis = int(info.attr("axis", -1))

    def axes_for(ndim: int) -> tuple:
        return tuple(range(axis % ndim if ndim else 0, ndim))

    shape = info.input_shapes[0] if info.input_shapes else None
    if shape is not None:
        known = axes_for(len(shape))
        return lambda _ndim: known
    return axes_for


def _wanted(info: NodeInfo, index: int) -> bool:
    """Whether optional output `index` exists and somebody asked for it."""
    used = info.output_used
    return index < len(used) and bool(used[index])


def _work_buffer(out: Any, dtype: np.dtype) -> Any:
    """Compute straight into Y's buffer when it has the compute dtype."""
    return out if out is not None and out.dtype == dtype else None


def _mean(x: Any, axes: tuple, dtype: np.dtype) -> Any:
    """The mean over `axes` with keepdims, accumulated in `dtype`. (x.sum, not
    xp.mean: numpy's mean is a Python function that costs more than a row's sum.)"""
    total = x.sum(axis=axes, keepdims=True, dtype=dtype)
    total /= x.size // total.size if total.size else 1
    return total


def _inverse_rms(xp: Any, x: Any, axes: tuple, epsilon: Any, dtype: np.dtype) -> Any:
    """1 / sqrt(mean(x^2) + epsilon), reduced with keepdims, squared in `dtype`
    (a float16 square overflows from |x| > 256)."""
    mean_square = _mean(xp.square(x, dtype=dtype), axes, dtype)
    return xp.reciprocal(xp.sqrt(mean_square + epsilon))


# --- LayerNormalization -------------------------------------------------------------


@register("LayerNormalization", since=17, dtypes=FLOATS)
def build_layer_norm(info: NodeInfo) -> KernelFn:
    xp = info.xp
    stash = _stash_dtype(info)
    compute = _compute_dtype(info.input_dtypes[0], stash)
    epsilon = compute.type(info.attr("epsilon", 1e-5))
    axes_for = _trailing_axes(info)
    has_bias = info.has_input(2)
    want_mean, want_inv_std = _wanted(info, 1), _wanted(info, 2)
    mean_dtype = info.output_dtypes[1] if want_mean and info.output_dtypes[1] else stash
    inv_dtype = info.output_dtypes[2] if want_inv_std and info.output_dtypes[2] else stash

    def run(inputs: list, outs: list) -> list:
        x, scale = inputs[0], inputs[1]
        axes = axes_for(x.ndim)
        mean = _mean(x, axes, compute)
        y = xp.subtract(x, mean, out=_work_buffer(outs[0], compute))  # mean promotes x
        inv_std = _inverse_rms(xp, y, axes, epsilon, compute)
        y *= inv_std
        y *= scale
        if has_bias:
            y += inputs[2]
        results = [_emit(outs[0], y, x.dtype)]
        if len(outs) > 1:
            results.append(_emit(outs[1], mean, mean_dtype) if want_mean else None)
        if len(outs) > 2:
            results.append(_emit(outs[2], inv_std, inv_dtype) if want_inv_std else None)
        return results
    return run


@register("LayerNormalization", since=17, dtypes=FLOATS, host=True)
def build_layer_norm_host(info: NodeInfo) -> KernelFn:
    """The host variant: float32 rows compiled (`layer_norm_jit`: the same operations,
    the sums accumulated in float64) where Y alone is asked for and scale and bias
    have the normalised axes' shape; the generic kernel otherwise."""
    generic = build_layer_norm(info)
    compute = _compute_dtype(info.input_dtypes[0], _stash_dtype(info))
    if compute != F32 or _wanted(info, 1) or _wanted(info, 2) or not layer_norm_jit.available():
        return generic
    epsilon = compute.type(info.attr("epsilon", 1e-5))
    axes_for = _trailing_axes(info)

    def compiled_args(inputs: list, outs: list) -> tuple | None:
        """(rows, scale, bias, epsilon, Y's rows) for the compiled call, Y's buffer
        (the preallocated output or a new one); None where the arrays do not fit."""
        x, scale = inputs[0], inputs[1]
        bias = inputs[2] if len(inputs) > 2 else None
        tail = x.shape[x.ndim - len(axes_for(x.ndim)):]
        if (x.dtype != F32 or scale.dtype != F32 or not x.size or scale.shape != tail
                or not x.flags.c_contiguous or not scale.flags.c_contiguous
                or (bias is not None and (bias.dtype != F32 or bias.shape != tail or not bias.flags.c_contiguous))):
            return None
        y = outs[0]
        if y is None or y.dtype != F32 or y.shape != x.shape or not y.flags.c_contiguous:
            y = np.empty(x.shape, F32)
        n = scale.size
        return (x.reshape(-1, n), scale.reshape(-1), None if bias is None else bias.reshape(-1), epsilon,
                y.reshape(-1, n)), y

    def run(inputs: list, outs: list) -> list:
        found = compiled_args(inputs, outs)
        if found is None:
            return generic(inputs, outs)
        args, y = found
        layer_norm_jit.layer_norm_rows(*args)
        return [_emit(outs[0], y, F32), *[None] * (len(outs) - 1)]

    def fixed_arrays_form(inputs: list, outs: list) -> KernelFn | None:
        """The compiled call alone, for these very arrays: into Y's preallocated buffer."""
        found = compiled_args(inputs, outs)
        if found is None or found[1] is not outs[0]:
            return None
        return settled_call(layer_norm_jit.layer_norm_rows, found[0], (outs[0], *[None] * (len(outs) - 1)))

    return with_fixed_arrays_form(run, fixed_arrays_form)


# --- RMSNormalization and SimplifiedLayerNormalization ------------------------------


def _rms_settings(info: NodeInfo) -> tuple:
    """(compute dtype, epsilon in it, the trailing axes by rank, inv_std_var wanted, its dtype)."""
    stash = _stash_dtype(info)
    compute = _compute_dtype(info.input_dtypes[0], stash)
    want_inv = _wanted(info, 1)
    return (compute, compute.type(info.attr("epsilon", 1e-5)), _trailing_axes(info), want_inv,
            info.output_dtypes[1] if want_inv and info.output_dtypes[1] else stash)


def _build_rms_norm(info: NodeInfo, y_dtype_of: Callable[[Any, Any], np.dtype]) -> KernelFn:
    """Shared by both RMS norms on any backend; `y_dtype_of(x, scale)` names Y's dtype."""
    xp = info.xp
    compute, epsilon, axes_for, want_inv, inv_dtype = _rms_settings(info)

    def run(inputs: list, outs: list) -> list:
        x, scale = inputs[0], inputs[1]
        inv_rms = _inverse_rms(xp, x, axes_for(x.ndim), epsilon, compute)
        y = xp.multiply(x, inv_rms, out=_work_buffer(outs[0], compute))  # inv_rms promotes x
        y *= scale
        return _rms_results(outs, y, inv_rms, y_dtype_of(x, scale), want_inv, inv_dtype)
    return run


def _build_rms_norm_host(info: NodeInfo, y_dtype_of: Callable[[Any, Any], np.dtype]) -> KernelFn:
    """The RMS norms' host variant: float32 rows compiled (`mlas_jit`), with onnxruntime's
    rounding, taken also where the plan does not ask for it (then it is the fastest
    form too); onnxruntime's rounding in numpy where the plan asks for it and the rows
    do not fit the compiled form; the generic kernel otherwise. Chosen once per build."""
    generic = _build_rms_norm(info, y_dtype_of)
    compute, epsilon, axes_for, want_inv, inv_dtype = _rms_settings(info)
    as_onnxruntime = compute in (F32, F64) and info.onnxruntime_rounding
    compiled = (compute == F32 and (info.onnxruntime_rounding or info.faster_onnxruntime_rounding)
                and mlas_jit.available("rms_rows"))
    if not (as_onnxruntime or compiled):
        return generic
    sum_of_squares = sum_of_squares_function() if as_onnxruntime else None  # compiled or emulated

    def run(inputs: list, outs: list) -> list:
        x, scale = inputs[0], inputs[1]
        axes = axes_for(x.ndim)
        if compiled and x.dtype == F32 and scale.dtype == F32 and x.size:
            found = _rms_norm_compiled(x, scale, len(axes), epsilon, outs[0])
            if found is not None:
                return _rms_results(outs, *found, y_dtype_of(x, scale), want_inv, inv_dtype)
        if as_onnxruntime and x.dtype == compute and scale.dtype == compute and x.size:
            y, inv_rms = _rms_norm_as_onnxruntime(x, scale, axes, epsilon, _work_buffer(outs[0], compute),
                                                  sum_of_squares)
            return _rms_results(outs, y, inv_rms, y_dtype_of(x, scale), want_inv, inv_dtype)
        return generic(inputs, outs)

    def fixed_arrays_form(inputs: list, outs: list) -> KernelFn | None:
        """The compiled call alone, for these very arrays: `_rms_norm_compiled`'s with its
        checks and reshapes made here once, into the preallocated outputs (Y, and
        inv_std_var where asked for). None where the compiled form or the outputs do
        not fit: the plain kernel then."""
        x, scale, y = inputs[0], inputs[1], outs[0]
        if (not compiled or x.dtype != F32 or scale.dtype != F32 or not x.size or y is None
                or y.dtype != F32 or y.shape != x.shape or not y.flags.c_contiguous):
            return None
        n_axes = len(axes_for(x.ndim))
        rows_shape = x.shape[:x.ndim - n_axes]
        if (scale.shape != x.shape[x.ndim - n_axes:] or not x.flags.c_contiguous
                or not scale.flags.c_contiguous):
            return None
        n = scale.size
        inv_out = outs[1] if len(outs) > 1 and want_inv else None
        if inv_out is not None:
            if (inv_out.dtype != F32 or inv_out.shape != rows_shape + (1,) * n_axes
                    or not inv_out.flags.c_contiguous):
                return None
            inv = inv_out.reshape(-1)
        elif len(outs) > 1 and want_inv:
            return None  # inv_std_var asked for, with no buffer to write it into
        else:
            inv = np.empty(x.size // n, F32)
        args = (x.reshape(-1, n), scale.reshape(-1), epsilon, y.reshape(-1, n), inv)
        return settled_call(mlas_jit.rms_rows, args, (y, inv_out, *[None] * (len(outs) - 2))[:max(len(outs), 1)])

    return with_fixed_arrays_form(run, fixed_arrays_form)


def _rms_results(outs: list, y: Any, inv_rms: Any, y_dtype: np.dtype, want_inv: bool,
                 inv_dtype: np.dtype) -> list:
    """Y, and inv_std_var where the node has that output."""
    results = [_emit(outs[0], y, y_dtype)]
    if len(outs) > 1:
        results.append(_emit(outs[1], inv_rms, inv_dtype) if want_inv else None)
    return results


def _rms_norm_compiled(x: np.ndarray, scale: np.ndarray, n_axes: int, epsilon: Any, out: Any) -> tuple | None:
    """`_rms_norm_as_onnxruntime` of float32 x and a scale of the normalized axes' shape,
    compiled (`mlas_jit.rms_rows`); None where the arrays do not fit (a broadcast scale,
    a non-contiguous x)."""
    rows_shape = x.shape[:x.ndim - n_axes]
    if scale.shape != x.shape[x.ndim - n_axes:] or not x.flags.c_contiguous or not scale.flags.c_contiguous:
        return None
    n = scale.size
    y = out if (out is not None and out.dtype == F32 and out.shape == x.shape
                and out.flags.c_contiguous) else np.empty(x.shape, F32)
    inv = np.empty(x.size // n, F32)
    mlas_jit.rms_rows(x.reshape(-1, n), scale.reshape(-1), epsilon, y.reshape(-1, n), inv)
    return y, inv.reshape(rows_shape + (1,) * n_axes)


def _rms_norm_as_onnxruntime(x: np.ndarray, scale: np.ndarray, axes: tuple, epsilon: Any,
                             out: np.ndarray | None, sum_of_squares=sum_of_squares_fma8) -> tuple:
    """(y, inv_rms) as onnxruntime's CPU kernel rounds them (module docstring), for x
    and scale of one float dtype; y into `out` where given."""
    dtype = x.dtype
    rows_shape = x.shape[:len(x.shape) - len(axes)]
    n = int(np.prod(x.shape[len(rows_shape):], dtype=np.int64))
    rows = x.reshape(-1, n)
    count = dtype.type(n)
    y = out if out is not None and out.flags.c_contiguous else np.empty(x.shape, dtype)
    if dtype == F32 and n >= FMA8_MIN_ROW:
        denom = sum_of_squares(rows)
        denom /= count
        denom += epsilon
        np.sqrt(denom, out=denom)
        inv = np.divide(dtype.type(1), denom)
        np.multiply(rows, inv, out=y.reshape(rows.shape))
    else:
        denom = sequential_sum(np.multiply(rows, rows))
        denom /= count
        denom += epsilon
        np.sqrt(denom, out=denom)
        inv = np.divide(dtype.type(1), denom)
        np.divide(rows, denom, out=y.reshape(rows.shape))
    y *= scale
    return y, inv.reshape(rows_shape + (1,) * len(axes))


def _x_dtype(x: Any, _scale: Any) -> np.dtype:
    return x.dtype


def _scale_dtype(_x: Any, scale: Any) -> np.dtype:
    return scale.dtype  # onnxruntime's type V


@register("RMSNormalization", since=23, dtypes=FLOATS)
def build_rms_norm(info: NodeInfo) -> KernelFn:
    return _build_rms_norm(info, _x_dtype)


@register("RMSNormalization", since=23, dtypes=FLOATS, host=True)
def build_rms_norm_host(info: NodeInfo) -> KernelFn:
    return _build_rms_norm_host(info, _x_dtype)


@register("SimplifiedLayerNormalization", domain="", since=1, dtypes=FLOATS)
def build_simplified_layer_norm(info: NodeInfo) -> KernelFn:
    return _build_rms_norm(info, _scale_dtype)


@register("SimplifiedLayerNormalization", domain="", since=1, dtypes=FLOATS, host=True)
def build_simplified_layer_norm_host(info: NodeInfo) -> KernelFn:
    return _build_rms_norm_host(info, _scale_dtype)
