"""Ops the ONNX standard deprecated, which onnx.reference no longer implements."""

from __future__ import annotations

import numpy as np

from .registry import NodeInfo, register


@register("Scatter", since=9, until=10)
def scatter(info: NodeInfo):
    """Deprecated in opset 11 in favour of ScatterElements (same semantics, no reduction)."""
    axis = int(info.attr("axis", 0))

    def run(inputs, outs):
        data, indices, updates = inputs
        out = outs[0] if outs[0] is not None else np.empty_like(data)
        out[...] = data
        idx = np.where(indices < 0, indices + data.shape[axis], indices)
        np.put_along_axis(out, idx, updates, axis=axis)
        return (out,)

    return run
