"""Cast and CastLike.

Between numpy's plain dtypes (floats, ints, bool) a cast is one assignment into
the preallocated output (C-style conversion: floats truncate toward zero, nonzero
is True). Strings (object arrays of str) live on the host: number -> string uses
numpy's shortest round-trip text, string -> number parses each element, both as
onnx.reference does; those nodes decline device-graph capture.

Targets numpy has no arithmetic for (bfloat16, float8*, float4, int4/uint4,
int2/uint2) need saturation and rounding modes defined by the spec: the kernels
do not accept them, so such nodes run on the onnx.reference host fallback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from onnx import helper

from ..dtypes import ALL_PLAIN
from .registry import CAPTURE_SUPPORTED, CaptureVerdict, KernelFn, NodeInfo, declined, host_read, register

STRING = np.dtype(object)
#: dtypes cast natively; anything else (ml_dtypes' exotic types) goes through onnx.reference
NATIVE = ALL_PLAIN | {STRING}

CastFn = Callable[[Any, Any], Any]  # (x, out or None) -> result


def _cast_target(info: NodeInfo) -> np.dtype | None:
    """The dtype Cast converts to, from its `to` attribute."""
    to = info.attr("to")
    if to is None:
        raise ValueError(f"Cast node {info.name!r} has no 'to' attribute")
    return np.dtype(helper.tensor_dtype_to_np_dtype(int(to)))


def _castlike_target(info: NodeInfo) -> np.dtype | None:
    """CastLike's target: the dtype of input 1 (or of the output), None when unknown."""
    for dt in (info.input_dtypes[1] if len(info.input_dtypes) > 1 else None,
               info.output_dtypes[0] if info.output_dtypes else None):
        if dt is not None:
            return np.dtype(dt)
    return None


def _verdict(source: np.dtype | None, target: np.dtype | None) -> CaptureVerdict:
    if STRING in (source, target):
        return declined("host_only_dtype", "string tensors live on the host")
    return CAPTURE_SUPPORTED


# --- the conversions -------------------------------------------------------------------


def _plain_cast(target: np.dtype) -> CastFn:
    def cast(x: Any, out: Any) -> Any:
        if out is None:
            return x.astype(target)
        out[...] = x  # assignment converts with C semantics (unsafe casting)
        return out

    return cast


def _to_string(x: Any, out: Any) -> Any:
    text = host_read(x).astype(np.str_).astype(object)  # python str elements (a device x copies)
    if out is None:
        return text
    out[...] = text
    return out


def _from_string(target: np.dtype, xp: Any) -> CastFn:
    def cast(x: Any, out: Any) -> Any:
        # object array of str: float("INF"), int("7"), ... parsed on the host, then placed
        # where the backend computes (a device `out[...] = host_array` would be a fill)
        value = xp.asarray(host_read(x).astype(target))
        if out is None:
            return value
        out[...] = value
        return out

    return cast


def _cast_fn(info: NodeInfo, source: np.dtype, target: np.dtype) -> CastFn:
    if target not in NATIVE or source not in NATIVE:
        raise TypeError(f"Cast from {source} to {target} has no native kernel")
    if target == STRING:
        return _to_string
    if source == STRING:
        return _from_string(target, info.xp)
    return _plain_cast(target)


def _kernel(info: NodeInfo, source: np.dtype | None, target: np.dtype | None) -> KernelFn:
    if source is not None and target is not None:
        cast = _cast_fn(info, source, target)

        def run(inputs: list, outs: list) -> tuple:
            return (cast(inputs[0], outs[0]),)
        return run

    # a dtype shape inference left unknown: choose the conversion per run dtypes
    chosen: dict[tuple, CastFn] = {}

    def run_dynamic(inputs: list, outs: list) -> tuple:
        x = inputs[0]
        to = target if target is not None else np.dtype(inputs[1].dtype)
        key = (np.dtype(x.dtype), to)
        cast = chosen.get(key)
        if cast is None:
            cast = chosen[key] = _cast_fn(info, *key)
        return (cast(x, outs[0]),)

    return run_dynamic


# --- registration ---------------------------------------------------------------------


def _cast_verdict(info: NodeInfo) -> CaptureVerdict:
    return _verdict(info.input_dtypes[0], _cast_target(info))


def _castlike_verdict(info: NodeInfo) -> CaptureVerdict:
    return _verdict(info.input_dtypes[0], _castlike_target(info))


def _native_target(target_of: Callable[[NodeInfo], np.dtype | None]) -> Callable[[NodeInfo], bool]:
    return lambda info: (target := target_of(info)) is None or target in NATIVE


@register("Cast", since=6, dtypes=NATIVE, may_run_in_place=True, capture=_cast_verdict,
          accept=_native_target(_cast_target))
def cast(info: NodeInfo) -> KernelFn:
    return _kernel(info, info.input_dtypes[0], _cast_target(info))


@register("CastLike", since=15, dtypes=NATIVE, dtype_inputs=(0, 1), may_run_in_place=True,
          capture=_castlike_verdict, accept=_native_target(_castlike_target))
def cast_like(info: NodeInfo) -> KernelFn:
    return _kernel(info, info.input_dtypes[0], _castlike_target(info))
