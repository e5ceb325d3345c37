"""Comparison and boolean logic kernels: one broadcasting ufunc each, output bool.

Equal also compares string tensors (object arrays of str), which only exist on
the host: such a node runs numpy's ufunc whatever the backend and declines
device-graph capture.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..dtypes import ALL_PLAIN, BOOL, NUMERIC
from .registry import CAPTURE_SUPPORTED, CaptureVerdict, KernelFn, NodeInfo, declined, register, ufunc_kernel

STRING = np.dtype(object)

_STRINGS_ON_HOST = declined("host_only_dtype", "string tensors live on the host")


def _is_string(info: NodeInfo) -> bool:
    return any(dt == STRING for dt in info.input_dtypes[:2])


def _string_verdict(info: NodeInfo) -> CaptureVerdict:
    return _STRINGS_ON_HOST if _is_string(info) else CAPTURE_SUPPORTED


def _ufunc_builder(name: str) -> Callable[[NodeInfo], KernelFn]:
    """Builder for a comparison / logic op that is exactly one ufunc (unary or binary)."""

    def build(info: NodeInfo) -> KernelFn:
        xp: Any = np if _is_string(info) else info.xp  # strings live on the host
        return ufunc_kernel(getattr(xp, name), len(info.input_dtypes))

    return build


register("Equal", since=7, dtypes=ALL_PLAIN | {STRING}, capture=_string_verdict)(
    _ufunc_builder("equal"))

# op -> (ufunc name, since, dtypes)
_ONE_UFUNC = {
    "Less": ("less", 7, NUMERIC),
    "Greater": ("greater", 7, NUMERIC),
    "LessOrEqual": ("less_equal", 12, NUMERIC),
    "GreaterOrEqual": ("greater_equal", 12, NUMERIC),
    "And": ("logical_and", 7, BOOL),
    "Or": ("logical_or", 7, BOOL),
    "Not": ("logical_not", 1, BOOL),
}

for _op, (_ufunc, _since, _dtypes) in _ONE_UFUNC.items():
    # the bool ops could reuse a bool input's buffer; comparisons change the dtype
    register(_op, since=_since, dtypes=_dtypes, may_run_in_place=_dtypes is BOOL)(
        _ufunc_builder(_ufunc))
