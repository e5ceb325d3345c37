"""Pieces the attention kernels share (`group_query_attention`, `attention`): a
softmax over allowed positions, softcap, one-element integer inputs read on the host or
kept on the device, and tests of whether two arrays share memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..addresses import address
from .registry import (
    host_read,
)


def _masked_softmax(xp: Any, scores: Any, allowed: Any, sink: Any = None) -> Any:
    """Softmax over the last axis restricted to `allowed` (broadcastable bool).

    Disallowed entries get probability 0; a row with nothing allowed is all zeros.
    `sink` (broadcastable to scores[..., :1]) adds exp(sink) to every denominator.
    """
    ct = scores.dtype
    masked = xp.where(allowed, scores, ct.type(-np.inf))
    row_max = xp.max(masked, axis=-1, keepdims=True)
    if sink is not None:
        row_max = xp.maximum(row_max, sink)
    row_max = xp.where(xp.isfinite(row_max), row_max, ct.type(0.0))
    e = xp.where(allowed, xp.exp(masked - row_max), ct.type(0.0))
    denom = xp.sum(e, axis=-1, keepdims=True)
    if sink is not None:
        denom = denom + xp.exp(sink - row_max)
    denom = xp.where(denom > 0, denom, ct.type(1.0))
    return e / denom


def _softcap(xp: Any, scores: Any, softcap: float) -> Any:
    if softcap > 0.0:
        c = scores.dtype.type(softcap)
        return c * xp.tanh(scores / c)
    return scores


def _host_int(value: Any) -> int:
    """Read a one-element integer input on the host (a sync on a device backend)."""
    return int(host_read(value).reshape(-1)[0])


def _clamp(xp: Any, x: Any, lo: int, hi: int) -> Any:
    """`clip` for integer index arrays as two ufuncs: numpy's `clip` checks its bounds in
    Python first, which costs more than the work on a one-element array."""
    return xp.minimum(xp.maximum(x, lo), hi)


def _first_int(xp: Any, value: Any) -> Any:
    """A one-element integer input's value as a (1,) int64 array where the backend
    computes: never read on the host, so a captured graph replays with each step's
    value (the one-token decode path indexes the KV cache with it on the device)."""
    return value.reshape(-1)[:1].astype(np.int64)


def _same_buffer(a: Any, b: Any) -> bool:
    """Whether two arrays are the same memory (the shared past/present KV buffer case)."""
    if a is None or b is None:
        return False
    if a is b:
        return True
    return a.shape == b.shape and a.strides == b.strides and address(a) == address(b)


def _overlap(a: Any, b: Any) -> bool:
    """Whether two arrays' byte extents may overlap (numpy's may_share_memory, from
    addresses: works for device arrays, which numpy cannot inspect)."""
    if a.size == 0 or b.size == 0:
        return False
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        # numpy points a view's base at the array owning its memory: two different
        # owners' allocations never overlap (a growing cache's new present and its past)
        ra = a if a.base is None else a.base
        rb = b if b.base is None else b.base
        if ra is not rb and type(ra) is np.ndarray and type(rb) is np.ndarray and ra.base is None and rb.base is None:
            return False
        return bool(np.may_share_memory(a, b))  # the same extent test, in C

    def extent(x: Any) -> tuple[int, int]:
        lo = hi = address(x)
        for n, st in zip(x.shape, x.strides):
            if st > 0:
                hi += (n - 1) * st
            else:
                lo += (n - 1) * st
        return lo, hi + x.itemsize

    (a0, a1), (b0, b1) = extent(a), extent(b)
    return a0 < b1 and b0 < a1
