"""Softmax and LogSoftmax.

Before opset 13 the input is seen as a 2-D matrix flattened at `axis` (default 1):
the normalisation runs over *all* dimensions from `axis` to the end. From opset 13
it runs over the single dimension `axis` (default -1). Both are a reduction over a
tuple of axes here, so no reshape is needed.

Both subtract the maximum first (exact for large inputs). float16 is computed in
float16, step for step like onnx.reference (the spec has no stash type here, and the
node tests compare float16 attention to the reference at rtol 1e-3, i.e. one ulp).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..dtypes import FLOATS
from .registry import KernelFn, NodeInfo, register


def _normalised_axes(info: NodeInfo, flatten_at_axis: bool) -> Callable[[int], tuple]:
    """`axes_for(ndim)`: the axes normalised over; constant when the rank is known."""
    if flatten_at_axis:
        axis = int(info.attr("axis", 1))

        def axes_for(ndim: int) -> tuple:
            return tuple(range(axis % ndim if ndim else 0, ndim))
    else:
        axis = int(info.attr("axis", -1))

        def axes_for(ndim: int) -> tuple:
            return (axis,)

    shape = info.input_shapes[0] if info.input_shapes else None
    if shape is not None:
        known = axes_for(len(shape))
        return lambda _ndim: known
    return axes_for


# `work` may be `x` itself, or the output buffer when it is `x`'s (in place): both
# functions read `x` only before the first write.
def _softmax_into(xp: Any, x: Any, axes: tuple, work: Any) -> Any:
    top = x.max(axis=axes, keepdims=True)
    work = xp.subtract(x, top, out=work)
    xp.exp(work, out=work)
    total = work.sum(axis=axes, keepdims=True)
    return xp.divide(work, total, out=work)


def _log_softmax_into(xp: Any, x: Any, axes: tuple, work: Any) -> Any:
    top = x.max(axis=axes, keepdims=True)
    work = xp.subtract(x, top, out=work)
    log_total = xp.log(xp.exp(work).sum(axis=axes, keepdims=True))
    return xp.subtract(work, log_total, out=work)


def _build(info: NodeInfo, compute: Callable, flatten_at_axis: bool) -> KernelFn:
    xp = info.xp
    axes_for = _normalised_axes(info, flatten_at_axis)

    def run(inputs: list, outs: list) -> tuple:
        x, out = inputs[0], outs[0]
        if x.size == 0:  # max() has no identity: nothing to normalise
            return (x.copy() if out is None else out,)
        return (compute(xp, x, axes_for(x.ndim), out),)
    return run


@register("Softmax", since=1, until=12, dtypes=FLOATS, may_run_in_place=True)
def build_softmax_flattened(info: NodeInfo) -> KernelFn:
    return _build(info, _softmax_into, flatten_at_axis=True)


@register("Softmax", since=13, dtypes=FLOATS, may_run_in_place=True)
def build_softmax(info: NodeInfo) -> KernelFn:
    return _build(info, _softmax_into, flatten_at_axis=False)


@register("LogSoftmax", since=1, until=12, dtypes=FLOATS, may_run_in_place=True)
def build_log_softmax_flattened(info: NodeInfo) -> KernelFn:
    return _build(info, _log_softmax_into, flatten_at_axis=True)


@register("LogSoftmax", since=13, dtypes=FLOATS, may_run_in_place=True)
def build_log_softmax(info: NodeInfo) -> KernelFn:
    return _build(info, _log_softmax_into, flatten_at_axis=False)
