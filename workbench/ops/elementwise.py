"""Elementwise arithmetic and activation kernels (numpy / CuPy ufuncs).

Most kernels are a single ufunc call: `ufunc(*inputs, out=outs[0])` handles the
same-shape and broadcast cases alike and writes straight into a preallocated
output, so the per-run closure is one call. Ops that take several steps
(Sigmoid, Gelu, integer Div) compute into the output or one temporary so that an
output aliasing an input (`may_run_in_place`) still gives the right answer.

Semantics follow the ONNX spec and onnx.reference:
- integer Div truncates toward zero (C semantics), not numpy's floor division;
- Pow keeps the base's dtype, computing mixed dtypes in numpy's promoted type;
- Max/Min propagate NaN; Relu is max(x, 0);
- float16 activations built from several steps are computed in float32 and
  rounded once, as onnxruntime's CPU kernels do;
- float32 Sigmoid on the host is MLAS's logistic, as onnxruntime computes it, where
  the plan asks for onnxruntime's rounding (`NodeInfo.onnxruntime_rounding`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..dtypes import ALL_PLAIN, FLOATS, NUMERIC, SIGNED_INTS, UNSIGNED_INTS
from .ort_float32 import logistic_function
from .registry import KernelFn, NodeInfo, register, register_with_host_variant, ufunc_kernel

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)


def _empty_like(xp: Any, x: Any) -> Any:
    """A fresh array shaped like `x` (also for 0-d `x`, where ufuncs return scalars)."""
    return xp.empty(x.shape, dtype=x.dtype)


def _store(out: Any, value: Any, dtype: np.dtype) -> Any:
    """Write `value` into the preallocated `out` (casting), or return it as `dtype`."""
    if out is None:
        return value.astype(dtype, copy=False)
    out[...] = value
    return out


def _widening_half(info: NodeInfo, compute: Callable[[Any, Any], Any]) -> KernelFn:
    """Run `compute(x, out)` on input 0; float16 goes through float32, rounded once."""
    xp = info.xp
    if info.input_dtypes[0] != F16:
        def run(inputs: list, outs: list) -> tuple:
            x = inputs[0]
            out = outs[0]
            return (compute(x, _empty_like(xp, x) if out is None else out),)
        return run

    def run_half(inputs: list, outs: list) -> tuple:
        wide = inputs[0].astype(F32)
        return (_store(outs[0], compute(wide, wide), F16),)

    return run_half


# --- one-ufunc ops ----------------------------------------------------------------


def _ufunc_builder(name: str) -> Callable[[NodeInfo], KernelFn]:
    """Builder for an op that is exactly one ufunc of the backend (any arity)."""

    def build(info: NodeInfo) -> KernelFn:
        return ufunc_kernel(getattr(info.xp, name), len(info.input_dtypes))

    return build


FLOATS_AND_SIGNED = FLOATS | SIGNED_INTS

# op -> (ufunc name, since, dtypes)
_ONE_UFUNC = {
    "Add": ("add", 7, NUMERIC),
    "Sub": ("subtract", 7, NUMERIC),
    "Mul": ("multiply", 7, NUMERIC),
    "Sqrt": ("sqrt", 6, FLOATS),
    "Reciprocal": ("reciprocal", 6, FLOATS),
    "Neg": ("negative", 6, FLOATS_AND_SIGNED),
    "Abs": ("absolute", 6, NUMERIC),
    "Exp": ("exp", 6, FLOATS),
    "Log": ("log", 6, FLOATS),
    "Tanh": ("tanh", 6, FLOATS),
    "Cos": ("cos", 7, FLOATS),
    "Sin": ("sin", 7, FLOATS),
    "IsNaN": ("isnan", 9, FLOATS),  # output bool: the ufunc's own result type
}

for _op, (_ufunc, _since, _dtypes) in _ONE_UFUNC.items():
    register(_op, since=_since, dtypes=_dtypes, may_run_in_place=_op != "IsNaN")(
        _ufunc_builder(_ufunc))


@register("Relu", since=6, dtypes=FLOATS_AND_SIGNED, may_run_in_place=True)
def relu(info: NodeInfo) -> KernelFn:
    maximum = info.xp.maximum

    def run(inputs: list, outs: list) -> tuple:
        return (maximum(inputs[0], 0, out=outs[0]),)  # NaN stays NaN, as in onnx.reference

    return run


# --- Div and Pow: dtype-dependent semantics --------------------------------------


@register("Div", since=7, dtypes=NUMERIC, may_run_in_place=True)
def div(info: NodeInfo) -> KernelFn:
    xp = info.xp
    dtype = info.input_dtypes[0]
    if dtype is None:
        # unknown at build time (shape inference stopped early): Div's semantics depend on
        # the dtype (integer division truncates), so the runtime dtype picks the kernel
        built: dict[Any, KernelFn] = {}

        def run_any(inputs: list, outs: list) -> tuple:
            dt = inputs[0].dtype
            fn = built.get(dt)
            if fn is None:
                fn = built[dt] = div(dataclasses.replace(info, input_dtypes=(dt,) + tuple(info.input_dtypes[1:])))
            return fn(inputs, outs)
        return run_any
    if dtype in FLOATS:
        return _ufunc_builder("true_divide")(info)
    if dtype in UNSIGNED_INTS:
        return _ufunc_builder("floor_divide")(info)  # floor == trunc without negatives

    def signed(inputs: list, outs: list) -> tuple:
        a, b = inputs
        # Truncate toward zero: a - fmod(a, b) is an exact multiple of b, so the floor
        # division of it is exact. The temporary keeps an aliased output safe.
        exact = a - xp.fmod(a, b)
        return (xp.floor_divide(exact, b, out=outs[0]),)

    return signed


@register("Pow", since=7, dtypes=NUMERIC, dtype_inputs=(0, 1), may_run_in_place=True)
def pow_(info: NodeInfo) -> KernelFn:
    xp = info.xp
    base, exponent = info.input_dtypes[0], info.input_dtypes[1]
    const = info.constant_inputs.get(1)
    if base in FLOATS and const is not None and const.size == 1 and float(const.reshape(-1)[0]) == 2.0:
        square = xp.square  # the usual x**2 of RMS/variance: exact, and faster than pow

        def run_square(inputs: list, outs: list) -> tuple:
            return (square(inputs[0], out=outs[0]),)
        return run_square
    if base == exponent and base is not None:
        return _ufunc_builder("power")(info)

    def run_mixed(inputs: list, outs: list) -> tuple:
        a = inputs[0]
        # onnx.reference: numpy's promoted power, then back to the base's dtype
        return (_store(outs[0], xp.power(a, inputs[1]), a.dtype),)

    return run_mixed


# --- variadic Max / Min ------------------------------------------------------------


def _variadic_builder(name: str) -> Callable[[NodeInfo], KernelFn]:
    """Max/Min over any number of broadcast inputs, folded pairwise into the output."""

    def build(info: NodeInfo) -> KernelFn:
        xp = info.xp
        fn = getattr(xp, name)
        if len(info.input_dtypes) == 1:
            def copy(inputs: list, outs: list) -> tuple:
                out = outs[0]
                if out is None:
                    return (inputs[0].copy(),)
                out[...] = inputs[0]
                return (out,)
            return copy
        if len(info.input_dtypes) == 2:
            return _ufunc_builder(name)(info)

        def fold(inputs: list, outs: list) -> tuple:
            # the first step may not write into `out` when an aliased input is still unread
            acc = fn(inputs[0], inputs[1])
            for x in inputs[2:-1]:
                acc = fn(acc, x)
            return (fn(acc, inputs[-1], out=outs[0]),)

        return fold

    return build


register("Max", since=8, dtypes=NUMERIC, may_run_in_place=True)(_variadic_builder("maximum"))
register("Min", since=8, dtypes=NUMERIC, may_run_in_place=True)(_variadic_builder("minimum"))


# --- Where ----------------------------------------------------------------------------


@register("Where", since=9, dtypes=ALL_PLAIN, dtype_inputs=(1, 2), may_run_in_place=True)
def where(info: NodeInfo) -> KernelFn:
    xp = info.xp
    select = xp.where
    copyto = xp.copyto

    def run(inputs: list, outs: list) -> tuple:
        cond, x, y = inputs
        out = outs[0]
        if out is None:
            return (select(cond, x, y),)
        if out is x or out is y or out is cond:  # in place: read every input before writing
            out[...] = select(cond, x, y)
            return (out,)
        copyto(out, y)
        copyto(out, x, where=cond)
        return (out,)

    return run


# --- activations built from several steps --------------------------------------------


@register_with_host_variant("Sigmoid", since=6, dtypes=FLOATS, may_run_in_place=True)
def sigmoid(info: NodeInfo, host: bool) -> KernelFn:
    """1 / (1 + exp(-x)); its host variant: float32 (and float16, through float32), where
    the plan asks for onnxruntime's rounding, MLAS's logistic, the rational
    approximation onnxruntime's CPU kernel computes, bit for bit (`ort_float32.logistic`)."""
    xp = info.xp

    def compute(x: Any, out: Any) -> Any:
        # 1 / (1 + exp(-x)): exp overflows to inf for very negative x, giving exactly 0
        xp.negative(x, out=out)
        xp.exp(out, out=out)
        out += 1
        return xp.reciprocal(out, out=out)

    as_onnxruntime = host and info.onnxruntime_rounding
    logistic = logistic_function() if as_onnxruntime else None  # compiled or emulated, chosen once

    def compute_as_onnxruntime(x: Any, out: Any) -> Any:
        if x.dtype != F32:
            return compute(x, out)
        return logistic(x, out=out)

    return _widening_half(info, compute_as_onnxruntime if as_onnxruntime else compute)


def _erf_function(info: NodeInfo) -> Callable[..., Any]:
    """`erf(x, out=None)` for the node's arrays: scipy's for numpy's (`host_arrays`, the
    registry's one test of the array module), else the array module's own special
    functions (cupyx's); math.erf where scipy is missing."""
    xp = info.xp
    if not info.host_arrays:
        # an array module standing in for CuPy (the test double) names its own special module
        special = getattr(xp, "__cupyx_scipy_special__", None)
        if special is None:
            import cupyx.scipy.special as special  # noqa: PLC0415 - only on the CUDA backend
        return special.erf
    try:
        from scipy.special import erf  # noqa: PLC0415 - optional dependency

        return erf
    except ImportError:  # pragma: no cover - scipy ships in the dev environment
        scalar_erf = np.vectorize(math.erf, otypes=[np.float64])

        def erf_slow(x: Any, out: Any = None) -> Any:
            return _store(out, scalar_erf(x), x.dtype)

        return erf_slow


@register("Erf", since=9, dtypes=FLOATS, may_run_in_place=True)
def erf(info: NodeInfo) -> KernelFn:
    erf_fn = _erf_function(info)

    def compute(x: Any, out: Any) -> Any:
        return erf_fn(x, out=out)

    return _widening_half(info, compute)


_SQRT_HALF = math.sqrt(0.5)
_SQRT_TWO_OVER_PI = math.sqrt(2.0 / math.pi)


@register("Gelu", since=20, dtypes=FLOATS, may_run_in_place=True)
def gelu(info: NodeInfo) -> KernelFn:
    xp = info.xp
    approximate = info.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ValueError(f"Gelu node {info.name!r}: approximate={approximate!r}, "
                         "expected 'none' or 'tanh'")
    erf_fn = _erf_function(info)

    def exact(x: Any, out: Any) -> Any:
        # 0.5 * x * (1 + erf(x / sqrt(2)))
        t = xp.multiply(x, _SQRT_HALF, out=_empty_like(xp, x))
        erf_fn(t, out=t)
        t += 1
        t *= x
        return xp.multiply(t, 0.5, out=out)

    def tanh(x: Any, out: Any) -> Any:
        # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
        t = xp.multiply(x, x, out=_empty_like(xp, x))
        t *= 0.044715
        t += 1
        t *= x
        t *= _SQRT_TWO_OVER_PI
        xp.tanh(t, out=t)
        t += 1
        t *= x
        return xp.multiply(t, 0.5, out=out)

    return _widening_half(info, exact if approximate == "none" else tanh)
