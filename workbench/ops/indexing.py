"""Indexing kernels: Slice, Gather, GatherElements, GatherND, ScatterND.

Slice declares `produces_view` (a basic slice is a strided view of input 0). Its
starts/ends/axes/steps are inputs from opset 10: constant ones are parsed once in
the builder; non-constant ones are read on the host each run (capture declines
with `host_read`). The gather/scatter ops read their indices on the device, so
they capture; their output shapes depend only on input shapes.

Negative indices count from the end of their axis, as ONNX allows for every op
here; numpy's fancy indexing and `take` already read them that way.
"""

from __future__ import annotations

import math
from typing import Any

from ..dtypes import ALL_PLAIN
from .layout import (
    constant_ints,
    host_ints,
    host_read_verdict,
    is_static,
    place,
    shape_memo,
)
from .registry import KernelFn, NodeInfo, register

# --- Slice -------------------------------------------------------------------------------


def slice_index(shape: tuple, starts: list[int], ends: list[int],
                axes: list[int] | None, steps: list[int] | None) -> tuple:
    """The numpy index of an ONNX Slice, clamped as the spec says.

    Python slicing differs for negative steps: ONNX clamps an adjusted start to
    [0, dim-1] and an end to [-1, dim-1] (-1: run through index 0), where Python
    would make an out-of-range negative start an empty slice.
    """
    rank = len(shape)
    index = [slice(None)] * rank
    if axes is None:
        axes = list(range(len(starts)))
    if steps is None:
        steps = [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ValueError("Slice: starts, ends, axes and steps differ in length")
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        axis = axis + rank if axis < 0 else axis
        dim = shape[axis]
        if step == 0:
            raise ValueError("Slice: a step is 0")
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            index[axis] = slice(min(max(start, 0), dim), min(max(end, 0), dim), step)
        else:
            end = min(max(end, -1), dim - 1)
            index[axis] = slice(min(max(start, 0), dim - 1), None if end < 0 else end, step)
    return tuple(index)


def _slice_kernel(starts: list[int], ends: list[int], axes: list[int] | None,
                  steps: list[int] | None) -> KernelFn:
    index_of = shape_memo(lambda s: slice_index(s, starts, ends, axes, steps))

    def run(inputs: list, outs: list) -> tuple:
        x = inputs[0]
        return (place(outs[0], x[index_of(x.shape)]),)

    return run


@register("Slice", since=1, until=9, produces_view=True)
def slice_1(info: NodeInfo) -> KernelFn:
    axes = info.attr("axes")
    return _slice_kernel([int(v) for v in info.attr("starts")], [int(v) for v in info.attr("ends")],
                         [int(v) for v in axes] if axes else None, None)


_SLICE_INPUTS = (1, 2, 3, 4)  # starts, ends, axes, steps


@register("Slice", since=10, produces_view=True, data_dependent_shape=True,
          capture=host_read_verdict(_SLICE_INPUTS, "starts/ends/axes/steps"))
def slice_10(info: NodeInfo) -> KernelFn:

    def run_dynamic(inputs: list, outs: list) -> tuple:
        x = inputs[0]
        params = [host_ints(inputs[p]) if p < len(inputs) and inputs[p] is not None else None
                  for p in _SLICE_INPUTS]
        return (place(outs[0], x[slice_index(x.shape, *params)]),)

    if not is_static(info, _SLICE_INPUTS):
        return run_dynamic
    starts, ends, axes, steps = (constant_ints(info, p) for p in _SLICE_INPUTS)
    if starts is None or ends is None:  # required inputs we cannot see: read them each run
        return run_dynamic
    return _slice_kernel(starts, ends, axes, steps)


# --- Gather family -------------------------------------------------------------------------


@register("Gather", since=1)
def gather(info: NodeInfo) -> KernelFn:
    xp = info.xp
    axis = int(info.attr("axis", 0))

    def run(inputs: list, outs: list) -> tuple:
        out = outs[0]
        if out is None:
            return (xp.take(inputs[0], inputs[1], axis=axis),)
        return (xp.take(inputs[0], inputs[1], axis=axis, out=out),)

    return run


@register("GatherElements", since=11)
def gather_elements(info: NodeInfo) -> KernelFn:
    xp = info.xp
    axis = int(info.attr("axis", 0))

    def run(inputs: list, outs: list) -> tuple:
        data, indices = inputs[0], inputs[1]
        if data.shape != indices.shape:
            data = data[_crop_to(data.shape, indices.shape, axis)]
        return (place(outs[0], xp.take_along_axis(data, indices, axis=axis)),)

    return run


def _crop_to(data_shape: tuple, indices_shape: tuple, axis: int) -> tuple:
    """GatherElements: indices may be shorter than data on the other axes; crop data."""
    if len(data_shape) != len(indices_shape):
        raise ValueError(f"GatherElements: data rank {len(data_shape)} != indices rank "
                         f"{len(indices_shape)}")
    axis = axis + len(data_shape) if axis < 0 else axis
    return tuple(slice(None) if d == axis else slice(0, n) for d, n in enumerate(indices_shape))


@register("GatherND", since=11)
def gather_nd(info: NodeInfo) -> KernelFn:
    xp = info.xp
    batch_dims = int(info.attr("batch_dims", 0))

    def run(inputs: list, outs: list) -> tuple:
        return (place(outs[0], _gather_nd(xp, inputs[0], inputs[1], batch_dims)),)

    return run


def _gather_nd(xp: Any, data: Any, indices: Any, batch_dims: int) -> Any:
    """Flatten the batch dims into one, index each batch with the last axis of `indices`."""
    k = indices.shape[-1]
    batch = data.shape[:batch_dims]
    queries = indices.shape[batch_dims:-1]
    rest = data.shape[batch_dims + k:]
    if k == 0:  # each index tuple selects the whole batch entry
        flat = data.reshape((math.prod(batch), 1) + data.shape[batch_dims:])
        picked = xp.broadcast_to(flat, (flat.shape[0], math.prod(queries)) + rest)
        return picked.reshape(batch + queries + rest)
    n_batch, n_queries = math.prod(batch), math.prod(queries)
    flat_data = data.reshape((n_batch,) + data.shape[batch_dims:])
    flat_indices = indices.reshape(n_batch, n_queries, k)
    key = (xp.arange(n_batch).reshape(n_batch, 1),) + tuple(flat_indices[..., j] for j in range(k))
    return flat_data[key].reshape(batch + queries + rest)


# --- ScatterND -----------------------------------------------------------------------------

# reduction attribute -> numpy ufunc name; "none" (default) assigns, the last write wins
_SCATTER_UFUNCS = {"add": "add", "mul": "multiply", "max": "maximum", "min": "minimum"}


@register("ScatterND", since=11, dtypes=ALL_PLAIN)
def scatter_nd(info: NodeInfo) -> KernelFn:
    reduction = info.attr("reduction", "none")
    if isinstance(reduction, bytes):
        reduction = reduction.decode()
    if reduction != "none" and reduction not in _SCATTER_UFUNCS:
        raise ValueError(f"ScatterND: unknown reduction {reduction!r}")
    accumulate = (getattr(info.xp, _SCATTER_UFUNCS[reduction]).at
                  if reduction != "none" else None)

    def run(inputs: list, outs: list) -> tuple:
        data, indices, updates = inputs[0], inputs[1], inputs[2]
        out = place(outs[0], data) if outs[0] is not None else data.copy()
        key = tuple(indices[..., j] for j in range(indices.shape[-1]))
        if accumulate is None:
            out[key] = updates
        else:
            accumulate(out, key, updates)  # unbuffered: repeated indices all apply
        return (out,)

    return run
