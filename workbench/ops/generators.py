"""Kernels that generate or mask tensors: Constant ConstantOfShape Range Trilu CumSum.

ConstantOfShape and Range have data-dependent output shapes, and Trilu's `k` /
CumSum's `axis` are scalar inputs whose values decide the computation. When those
inputs are small initializers they arrive in `info.constant_inputs` and are read
once in the builder (capture-supported); otherwise the kernel reads them on the
host each run and declines capture (`host_read`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ..dtypes import ALL_PLAIN, NUMERIC
from .registry import CAPTURE_SUPPORTED, CaptureVerdict, KernelFn, NodeInfo, declined, host_read, register

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
INT64 = np.dtype(np.int64)
STRING = np.dtype(object)


def _is_given(info: NodeInfo, pos: int) -> bool:
    """Whether optional input `pos` is present."""
    return pos in info.constant_inputs or info.has_input(pos)


def _host_read_verdict(positions: tuple[int, ...], what: str) -> Callable[[NodeInfo], CaptureVerdict]:
    """Supported when every input in `positions` is constant or omitted, else host_read."""

    def verdict(info: NodeInfo) -> CaptureVerdict:
        if all(p in info.constant_inputs or not _is_given(info, p) for p in positions):
            return CAPTURE_SUPPORTED
        return declined("host_read", f"reads the {what} input's values on the host", positions)

    return verdict


def _scalar(array: Any) -> Any:
    """A one-element tensor's value as a Python number (`item` copies from a device)."""
    return host_read(array).reshape(-1)[0].item()


def _host_ints(array: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in host_read(array).reshape(-1).tolist())


def _place_copy(xp: Any, out: Any, value: Any) -> Any:
    """Copy `value` into `out`, or return a fresh copy (a later in-place op may reuse it)."""
    if out is None:
        return value.copy() if value.dtype == STRING else xp.array(value, copy=True)
    out[...] = value
    return out


# --- Constant ------------------------------------------------------------------------

# value_* attribute -> dtype of the tensor it makes
_TYPED_ATTRS = {
    "value_float": np.float32, "value_floats": np.float32,
    "value_int": np.int64, "value_ints": np.int64,
    "value_string": object, "value_strings": object,
}


def _constant_value(info: NodeInfo) -> np.ndarray:
    attrs = info.attrs
    if attrs.get("value") is not None:
        return np.asarray(attrs["value"])
    sparse = attrs.get("sparse_value")
    if isinstance(sparse, onnx.SparseTensorProto):
        return _dense(sparse)
    for name, dtype in _TYPED_ATTRS.items():
        if attrs.get(name) is not None:
            return np.array(attrs[name], dtype=dtype)
    raise ValueError(f"Constant node {info.name!r} has no value attribute")


def _dense(sparse: onnx.SparseTensorProto) -> np.ndarray:
    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices)
    dense = np.zeros(tuple(sparse.dims), dtype=values.dtype)
    if indices.ndim == 1:  # linear indices into the flattened tensor
        dense.reshape(-1)[indices] = values
    else:  # one row of coordinates per value
        dense[tuple(indices.T)] = values
    return dense


@register("Constant", since=1)
def constant(info: NodeInfo) -> KernelFn:
    xp = info.xp
    host = _constant_value(info)
    value = host if host.dtype == STRING else xp.asarray(host)  # on the device once

    def run(inputs: list, outs: list) -> tuple:
        return (_place_copy(xp, outs[0], value),)

    return run


# --- ConstantOfShape -------------------------------------------------------------------


def _fill_value(info: NodeInfo) -> np.ndarray:
    value = info.attr("value")
    if value is None:
        return np.zeros((), dtype=F32)
    value = np.asarray(value)
    if value.size != 1:
        raise ValueError(f"ConstantOfShape node {info.name!r}: 'value' must hold one element, "
                         f"it has {value.size}")
    return value.reshape(())


@register("ConstantOfShape", since=9, data_dependent_shape=True,
          capture=_host_read_verdict((0,), "shape"))
def constant_of_shape(info: NodeInfo) -> KernelFn:
    xp = info.xp
    fill = _fill_value(info)
    scalar = fill[()]  # a numpy scalar of the output dtype
    static_shape = _host_ints(info.constant_inputs[0]) if 0 in info.constant_inputs else None

    def run(inputs: list, outs: list) -> tuple:
        out = outs[0]
        if out is not None:  # the executor resolved the shape: no need to read it
            out[...] = scalar
            return (out,)
        shape = static_shape if static_shape is not None else _host_ints(inputs[0])
        return (xp.full(shape, scalar, dtype=fill.dtype),)

    return run


# --- Range ------------------------------------------------------------------------------


def _range_compute_dtype(info: NodeInfo, dtype: np.dtype) -> np.dtype:
    """Floats are generated in float64 (float32/float16 at stash_type 1, as the reference)."""
    if dtype.kind in "iu":
        return INT64
    if dtype == F16 and info.opset >= 27:
        return F64 if info.attr("stash_type", 1) == onnx.TensorProto.DOUBLE else F32
    return F64


def _range_values(xp: Any, start: Any, limit: Any, delta: Any, dtype: np.dtype,
                  compute: np.dtype) -> Any:
    if compute.kind == "f":
        start, limit, delta = (float(np.asarray(v, dtype=compute)) for v in (start, limit, delta))
    return xp.arange(start, limit, delta, dtype=compute).astype(dtype, copy=False)


@register("Range", since=11, dtypes=NUMERIC, data_dependent_shape=True,
          capture=_host_read_verdict((0, 1, 2), "start/limit/delta"))
def range_(info: NodeInfo) -> KernelFn:
    xp = info.xp
    known = [dt for dt in (info.input_dtypes[0], info.output_dtypes[0]) if dt is not None]
    # np.dtype is falsy: no `or` chains; unknown at build time (a model whose shape
    # inference stopped early): the inputs' runtime dtype, never a float32 default
    static_dtype = np.dtype(known[0]) if known else None
    consts = info.constant_inputs
    if all(p in consts for p in (0, 1, 2)):
        dtype = static_dtype if static_dtype is not None else np.asarray(consts[0]).dtype
        compute = _range_compute_dtype(info, dtype)
        value = _range_values(xp, *(_scalar(consts[p]) for p in (0, 1, 2)), dtype, compute)

        def run_static(inputs: list, outs: list) -> tuple:
            return (_place_copy(xp, outs[0], value),)
        return run_static

    def run(inputs: list, outs: list) -> tuple:
        dtype = static_dtype if static_dtype is not None else inputs[0].dtype
        value = _range_values(xp, *(_scalar(x) for x in inputs), dtype, _range_compute_dtype(info, dtype))
        out = outs[0]
        if out is None:
            return (value,)
        out[...] = value
        return (out,)

    return run


# --- Trilu ------------------------------------------------------------------------------


@register("Trilu", since=14, dtypes=ALL_PLAIN, may_run_in_place=True,
          capture=_host_read_verdict((1,), "k"))
def trilu(info: NodeInfo) -> KernelFn:
    xp = info.xp
    upper = bool(info.attr("upper", 1))
    static_k = int(_scalar(info.constant_inputs[1])) if 1 in info.constant_inputs else None
    masks: dict[tuple, Any] = {}  # (rows, cols, k) -> bool mask of the entries set to zero

    def zero_mask(rows: int, cols: int, k: int) -> Any:
        key = (rows, cols, k)
        mask = masks.get(key)
        if mask is None:
            if len(masks) >= 64:  # a growing dim would otherwise keep every size
                masks.clear()
            # tri(r, c, j) is True where col - row <= j
            below = xp.tri(rows, cols, k - 1, dtype=bool)
            mask = masks[key] = below if upper else ~xp.tri(rows, cols, k, dtype=bool)
        return mask

    def run(inputs: list, outs: list) -> tuple:
        x = inputs[0]
        if static_k is not None:
            k = static_k
        else:
            k_input = inputs[1] if len(inputs) > 1 else None
            k = 0 if k_input is None else int(_scalar(k_input))
        mask = zero_mask(x.shape[-2], x.shape[-1], k)
        out = outs[0]
        if out is None:
            return (xp.where(mask, xp.zeros((), dtype=x.dtype), x),)
        xp.copyto(out, x)
        xp.copyto(out, xp.zeros((), dtype=x.dtype), where=mask)
        return (out,)

    return run


# --- CumSum -----------------------------------------------------------------------------


@register("CumSum", since=11, dtypes=NUMERIC, capture=_host_read_verdict((1,), "axis"))
def cumsum(info: NodeInfo) -> KernelFn:
    xp = info.xp
    exclusive = bool(info.attr("exclusive", 0))
    reverse = bool(info.attr("reverse", 0))
    static_axis = int(_scalar(info.constant_inputs[1])) if 1 in info.constant_inputs else None

    def run(inputs: list, outs: list) -> tuple:
        x = inputs[0]
        axis = static_axis if static_axis is not None else int(_scalar(inputs[1]))
        if axis < 0:
            axis += x.ndim
        out = outs[0]
        if out is None:
            out = xp.empty(x.shape, dtype=x.dtype)
        src, dst = x, out
        if reverse:  # a cumulative sum over flipped views runs from the end
            src, dst = xp.flip(x, axis), xp.flip(out, axis)
        if exclusive:  # dst[0] = 0, dst[i] = sum(src[:i])
            head = [slice(None)] * x.ndim
            head[axis] = slice(0, 1)
            dst[tuple(head)] = 0
            if x.shape[axis] > 1:
                lead, tail = list(head), list(head)
                lead[axis], tail[axis] = slice(0, -1), slice(1, None)
                xp.cumsum(src[tuple(lead)], axis=axis, dtype=x.dtype, out=dst[tuple(tail)])
        else:
            xp.cumsum(src, axis=axis, dtype=x.dtype, out=dst)
        return (out,)

    return run
