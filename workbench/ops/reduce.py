"""Reductions: ReduceSum, ReduceMean, ReduceMax, ArgMax and TopK.

Reduce* take `axes` as an attribute up to opset 12 (ReduceSum) / 17 (ReduceMean,
ReduceMax) and as an optional second input after, together with
`noop_with_empty_axes`. When the axes input is a small initializer it is read once
at build time; otherwise every run reads its values on the host (which declines
device-graph capture). Negative axes are passed through: numpy and CuPy accept them.

float16 sums and means accumulate in float32 (numpy would otherwise accumulate in
float16 along non-contiguous axes); integer means truncate toward zero, as
onnx.reference's `np.mean(..., dtype=x.dtype)` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..dtypes import BOOL, NUMERIC
from .registry import CAPTURE_SUPPORTED, CaptureVerdict, KernelFn, NodeInfo, declined, host_read, register

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
I64 = np.dtype(np.int64)

ALL_AXES = None  # numpy's spelling of "reduce every axis"
NO_AXES = ()  # noop_with_empty_axes with empty axes: the reduction is the identity

#: `reduce(x, axes, out) -> array`, keepdims already bound
Reducer = Callable[[Any, Any, Any], Any]


# --- small helpers ------------------------------------------------------------------


def _emit(xp: Any, out: Any, value: Any, dtype: np.dtype) -> Any:
    """Place `value` into the preallocated `out`, or return it as a `dtype` array."""
    if out is None:
        return xp.asarray(value).astype(dtype, copy=False)
    out[...] = value
    return out


def _reduced_shape(shape: tuple, axes: Any, keepdims: bool) -> tuple:
    ndim = len(shape)
    reduced = range(ndim) if axes is ALL_AXES else {a % ndim for a in axes}
    if keepdims:
        return tuple(1 if i in reduced else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in reduced)


def _axes_from_values(values: Any, noop_with_empty_axes: bool) -> Any:
    """The axes input's values (host read) as numpy's `axis` argument."""
    if values is None or values.size == 0:
        return NO_AXES if noop_with_empty_axes else ALL_AXES
    return tuple(int(a) for a in host_read(values).reshape(-1).tolist())


def _axes_input_capture(info: NodeInfo) -> CaptureVerdict:
    if info.has_input(1) and 1 not in info.constant_inputs:
        return declined("host_read", "reads the axes input's values on the host", (1,))
    return CAPTURE_SUPPORTED


# --- Reduce* ------------------------------------------------------------------------


# Array methods (x.sum, x.max) rather than xp.sum: numpy's module functions add a
# Python wrapper that costs more than the reduction of a decode-sized row.


def _sum_into(xp: Any, x: Any, axes: Any, keepdims: bool, out: Any, dtype: Any = None) -> Any:
    total = x.sum(axis=axes, keepdims=keepdims, out=out, dtype=dtype)
    return total if out is not None else xp.asarray(total)


def _divide_by_count(xp: Any, x: Any, total: Any) -> Any:
    """total / number of reduced elements, in place; integers truncate toward zero
    like onnx.reference's np.mean(..., dtype=x.dtype); an empty set gives NaN."""
    count = x.size // total.size if total.size else 1
    return xp.true_divide(total, count, out=total, casting="unsafe")


def _sum_reducer(xp: Any, dtype: np.dtype | None, keepdims: bool) -> Reducer:
    if dtype == F16:
        def reduce_half(x, axes, out):
            return _emit(xp, out, _sum_into(xp, x, axes, keepdims, None, F32), F16)
        return reduce_half

    def reduce(x, axes, out):
        # dtype=x.dtype: numpy would widen small integers to int64
        return _sum_into(xp, x, axes, keepdims, out, x.dtype)
    return reduce


def _mean_reducer(xp: Any, dtype: np.dtype | None, keepdims: bool) -> Reducer:
    if dtype == F16:
        def reduce_half(x, axes, out):
            total = _sum_into(xp, x, axes, keepdims, None, F32)
            return _emit(xp, out, _divide_by_count(xp, x, total), F16)
        return reduce_half

    def reduce(x, axes, out):
        return _divide_by_count(xp, x, _sum_into(xp, x, axes, keepdims, out, x.dtype))
    return reduce


def _lowest(dtype: np.dtype) -> Any:
    """The max of an empty set: the dtype's lowest value (ONNX, onnx.reference)."""
    if dtype.kind == "b":
        return False
    if dtype.kind in "iu":
        return np.iinfo(dtype).min
    return -np.inf


def _max_reducer(xp: Any, dtype: np.dtype | None, keepdims: bool) -> Reducer:
    def reduce(x, axes, out):
        if x.size == 0:
            shape = _reduced_shape(x.shape, axes, keepdims)
            return _emit(xp, out, xp.full(shape, _lowest(x.dtype), dtype=x.dtype), x.dtype)
        top = x.max(axis=axes, keepdims=keepdims, out=out)
        return top if out is not None else xp.asarray(top)
    return reduce


def _copy(x: Any, out: Any) -> Any:
    """The identity reduction; a copy, so the output never aliases the input."""
    if out is None:
        return x.copy()
    out[...] = x
    return out


def _identity(inputs: list, outs: list) -> tuple:
    return (_copy(inputs[0], outs[0]),)


def _build_reduce(info: NodeInfo, make_reducer: Callable[..., Reducer],
                  axes_as_input: bool) -> KernelFn:
    xp = info.xp
    keepdims = bool(info.attr("keepdims", 1))
    reduce = make_reducer(xp, info.input_dtypes[0], keepdims)
    if not axes_as_input:
        axes = info.attr("axes")
        static_axes = tuple(axes) if axes else ALL_AXES
    else:
        noop = bool(info.attr("noop_with_empty_axes", 0))
        if 1 in info.constant_inputs:
            static_axes = _axes_from_values(np.asarray(info.constant_inputs[1]), noop)
        elif not info.has_input(1):
            static_axes = _axes_from_values(None, noop)
        else:
            def run_dynamic(inputs: list, outs: list) -> tuple:
                axes = _axes_from_values(inputs[1], noop)
                if axes == NO_AXES:
                    return (_copy(inputs[0], outs[0]),)
                return (reduce(inputs[0], axes, outs[0]),)
            return run_dynamic

    if static_axes == NO_AXES:
        return _identity

    def run(inputs: list, outs: list) -> tuple:
        return (reduce(inputs[0], static_axes, outs[0]),)
    return run


def _register_reduce(op_type: str, make_reducer: Callable[..., Reducer], axes_input_since: int,
                     dtypes: frozenset) -> None:
    @register(op_type, since=1, until=axes_input_since - 1, dtypes=dtypes)
    def build_axes_attribute(info: NodeInfo) -> KernelFn:
        return _build_reduce(info, make_reducer, axes_as_input=False)

    # The axes input's values decide the output shape.
    @register(op_type, since=axes_input_since, dtypes=dtypes, data_dependent_shape=True,
              capture=_axes_input_capture)
    def build_axes_input(info: NodeInfo) -> KernelFn:
        return _build_reduce(info, make_reducer, axes_as_input=True)


_register_reduce("ReduceSum", _sum_reducer, axes_input_since=13, dtypes=NUMERIC)
_register_reduce("ReduceMean", _mean_reducer, axes_input_since=18, dtypes=NUMERIC)
_register_reduce("ReduceMax", _max_reducer, axes_input_since=18, dtypes=NUMERIC | BOOL)


# --- ArgMax -------------------------------------------------------------------------


@register("ArgMax", since=1, dtypes=NUMERIC)
def build_argmax(info: NodeInfo) -> KernelFn:
    xp = info.xp
    axis = int(info.attr("axis", 0))
    keepdims = bool(info.attr("keepdims", 1))

    if not info.attr("select_last_index", 0):
        def run(inputs: list, outs: list) -> tuple:
            if outs[0] is None:
                return (xp.asarray(xp.argmax(inputs[0], axis=axis, keepdims=keepdims)).astype(I64),)
            return (xp.argmax(inputs[0], axis=axis, keepdims=keepdims, out=outs[0]),)
        return run

    def run_last(inputs: list, outs: list) -> tuple:
        # argmax finds the first maximum: search the flipped axis and map back
        x = inputs[0]
        last = x.shape[axis] - 1
        found = xp.argmax(xp.flip(x, axis), axis=axis, keepdims=keepdims)
        return (_emit(xp, outs[0], last - found, I64),)
    return run_last


# --- TopK ---------------------------------------------------------------------------


def _first_k(axis: int, k: int) -> tuple:
    """An index taking elements [0, k) along `axis` (negative axes need no rank)."""
    if axis < 0:
        return (Ellipsis, slice(0, k)) + (slice(None),) * (-axis - 1)
    return (slice(None),) * axis + (slice(0, k),)


def _top_k(xp: Any, x: Any, k: int, axis: int, largest: bool) -> tuple:
    """Values and int64 indices of the k largest/smallest along `axis`, sorted;
    equal values keep the lower index first (ONNX's tie-break)."""
    if not largest:
        order = xp.argsort(x, axis=axis, kind="stable")[_first_k(axis, k)]
    else:
        # A stable ascending sort of the reversed axis, read backwards, is a
        # descending order whose ties run in increasing original index.
        last = x.shape[axis] - 1
        reversed_order = xp.argsort(xp.flip(x, axis), axis=axis, kind="stable")
        order = last - xp.flip(reversed_order, axis)[_first_k(axis, k)]
    return xp.take_along_axis(x, order, axis=axis), order.astype(I64, copy=False)


def _build_topk(info: NodeInfo, k_static: int | None) -> KernelFn:
    xp = info.xp
    axis = int(info.attr("axis", -1))
    largest = bool(info.attr("largest", 1))  # `sorted=0` leaves the order free: we sort

    def run(inputs: list, outs: list) -> tuple:
        k = k_static if k_static is not None else int(host_read(inputs[1]).reshape(-1)[0])
        values, indices = _top_k(xp, inputs[0], k, axis, largest)
        return _emit(xp, outs[0], values, values.dtype), _emit(xp, outs[1], indices, I64)
    return run


def _k_input_capture(info: NodeInfo) -> CaptureVerdict:
    if 1 not in info.constant_inputs:
        return declined("host_read", "reads the k input's value on the host", (1,))
    return CAPTURE_SUPPORTED


@register("TopK", since=1, until=9, dtypes=NUMERIC)
def build_topk_k_attribute(info: NodeInfo) -> KernelFn:
    return _build_topk(info, int(info.attr("k")))


@register("TopK", since=10, dtypes=NUMERIC, data_dependent_shape=True, capture=_k_input_capture)
def build_topk_k_input(info: NodeInfo) -> KernelFn:
    k = info.constant_inputs.get(1)
    return _build_topk(info, None if k is None else int(np.asarray(k).reshape(-1)[0]))
