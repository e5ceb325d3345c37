"""onnxruntime contrib ops (``com.microsoft``) and the LLM ops of opset 23+, natively.

Every kernel here reproduces what onnxruntime's CPU execution provider computes
(verified against it in ``tests/ops/test_contrib_ops.py``): half-precision inputs are
widened to float32, computed, and rounded back once at the end, as onnxruntime's
CPU kernels do. Kernels use the backend's array module (``info.xp``) and never
read input values on the host unless an output shape can be known no other way.

This module holds the helpers the contrib families share plus the activation
ops; importing it registers the whole family:

- :mod:`.group_query_attention`: GroupQueryAttention; :mod:`.rotary`: RotaryEmbedding
  (both domains); :mod:`.attention`: Attention (opset 23+)
- :mod:`.contrib_norm`: SkipLayerNormalization, SkipSimplifiedLayerNormalization
- :mod:`.contrib_quant`: MatMulNBits

onnxruntime behaviours reproduced on purpose (each pinned by a test): GroupQueryAttention's
``local_window_size`` W lets a query see W keys (itself included); its first prompt
(S == total_sequence_length) uses only ``position_ids[0]`` as a rotary offset; its
softcap applies before ``attention_bias``; an unshared present cache is zero beyond the
written rows. MatMulNBits ignores packed uint8 zero points when ``g_idx`` is given.
Where onnxruntime reads memory it never wrote (GroupQueryAttention without present
outputs but with a past; padded prompt rows under a local window) the result is ours,
not an imitation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import KernelError
from .ort_float32 import logistic_function
from .registry import KernelFn, NodeInfo, register, register_with_host_variant, with_fixed_arrays_form

MS_DOMAIN = "com.microsoft"

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
try:  # bfloat16 exists in numpy only through ml_dtypes (an onnx dependency)
    import ml_dtypes

    BF16: np.dtype | None = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes ships with onnx
    BF16 = None

#: float16 / bfloat16 / float32: what onnxruntime's contrib CPU kernels accept
HALF_AND_FLOAT = frozenset(d for d in (F16, F32, BF16) if d is not None)
#: ... plus float64 where the schema allows it
HALF_FLOAT_DOUBLE = HALF_AND_FLOAT | {F64}


def compute_dtype(dtype: Any) -> np.dtype:
    """float64 stays float64; every other float is computed in float32."""
    return F64 if np.dtype(dtype) == F64 else F32


def out_dtype(info: NodeInfo, index: int = 0, input_index: int = 0) -> np.dtype | None:
    """The declared dtype of output `index`, else that of input `input_index`; None when
    neither is known at build time (the kernel then takes its input's runtime dtype:
    `emit(..., like=x)`, never a float32 default)."""
    if index < len(info.output_dtypes) and info.output_dtypes[index] is not None:
        return np.dtype(info.output_dtypes[index])
    if input_index < len(info.input_dtypes) and info.input_dtypes[input_index] is not None:
        return np.dtype(info.input_dtypes[input_index])
    return None


def emit(out: Any, value: Any, dtype: np.dtype | None, like: Any = None) -> Any:
    """Write `value` into the preallocated `out` (casting), or return it as a contiguous
    array of `dtype` (never a view of an input: callers pass computed values). A `dtype`
    unknown at build time (None) is `like`'s runtime dtype (the input the output follows),
    else `value`'s."""
    if out is None:
        if dtype is None:
            dtype = like.dtype if like is not None else value.dtype
        value = value.astype(dtype, copy=False)
        return value if value.flags.c_contiguous else value.copy()
    if tuple(out.shape) != tuple(value.shape):
        raise KernelError(f"preallocated output has shape {tuple(out.shape)}, "
                          f"the kernel computed {tuple(value.shape)}")
    out[...] = value
    return out


def used(info: NodeInfo, index: int) -> bool:
    """Whether output `index` exists and was asked for."""
    if index >= len(info.output_dtypes) and index >= len(info.output_used):
        return False
    if index < len(info.output_used):
        return bool(info.output_used[index])
    return True


def pad_inputs(inputs: list, n: int) -> list:
    """`inputs` padded with None up to `n` entries (trailing optionals omitted)."""
    return list(inputs) + [None] * (n - len(inputs))


def attr_str(info: NodeInfo, name: str, default: str) -> str:
    value = info.attr(name, default)
    return value.decode() if isinstance(value, bytes) else str(value)


# --- activations -----------------------------------------------------------------

_SQRT_2_OVER_PI = 0.7978845608028654
_GELU_CUBIC = 0.044715


@register("FastGelu", domain=MS_DOMAIN, dtypes=HALF_FLOAT_DOUBLE)
def build_fast_gelu(info: NodeInfo) -> KernelFn:
    """y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), x = X (+ bias)."""
    xp = info.xp
    dtype = out_dtype(info)

    def run(inputs: list, outs: list) -> tuple:
        x, bias = pad_inputs(inputs, 2)[:2]
        ct = compute_dtype(x.dtype)
        v = x.astype(ct)
        if bias is not None:
            v = v + bias.astype(ct)
        inner = v * (ct.type(_SQRT_2_OVER_PI) + ct.type(_SQRT_2_OVER_PI * _GELU_CUBIC) * v * v)
        y = ct.type(0.5) * v * (ct.type(1.0) + xp.tanh(inner))
        return (emit(outs[0], y, dtype, like=x),)

    return run


@register("Gelu", domain=MS_DOMAIN, dtypes=HALF_FLOAT_DOUBLE)
def build_ms_gelu(info: NodeInfo) -> KernelFn:
    """y = 0.5 x (1 + erf(x / sqrt 2)): the erf GELU (what the load-time fusion makes of
    it below opset 20, where the default-domain Gelu does not exist yet)."""
    from .elementwise import _erf_function  # noqa: PLC0415 - the backend's erf, shared

    xp = info.xp
    erf = _erf_function(info)
    dtype = out_dtype(info)

    def run(inputs: list, outs: list) -> tuple:
        x = inputs[0]
        ct = compute_dtype(x.dtype)
        # into an array of its own: on a 0-d value `v * c` is a numpy scalar, which
        # erf(t, out=t) refuses
        t = xp.empty(x.shape, dtype=ct)
        xp.multiply(x, ct.type(_SQRT_HALF), out=t, casting="unsafe")
        erf(t, out=t)
        t += ct.type(1.0)
        t *= x
        t *= ct.type(0.5)
        return (emit(outs[0], t, dtype, like=x),)

    return run


_SQRT_HALF = 0.7071067811865476


@register_with_host_variant("QuickGelu", domain=MS_DOMAIN, dtypes=HALF_FLOAT_DOUBLE)
def build_quick_gelu(info: NodeInfo, host: bool) -> KernelFn:
    """y = x * sigmoid(alpha * x): x / (1 + exp(-alpha x)).

    The host variant, float32 where the plan asks for onnxruntime's rounding
    (`NodeInfo.onnxruntime_rounding`), as its CPU kernel computes it, bit for bit:
    t = alpha * x in float32 (skipped where alpha is 1), MLAS's logistic of t
    (`ort_float32.logistic`; clamped to [0, 1] where alpha is 1, MLAS's SiLU kernel),
    times x."""
    xp = info.xp
    dtype = out_dtype(info)
    alpha = float(info.attr("alpha", 1.702))
    as_onnxruntime = host and dtype == F32 and info.onnxruntime_rounding
    #: onnxruntime's kernel: alpha x in float32, skipped where alpha is 1 (its SiLU)
    silu = alpha == 1.0
    scale = np.float32(alpha)
    logistic = logistic_function() if as_onnxruntime else None  # compiled or emulated, chosen once

    def as_onnxruntime_into(x: Any, out: Any) -> tuple:
        """onnxruntime's arithmetic (float32 x, `out` a float32 array or None)."""
        t = x if silu else np.multiply(x, scale)
        with np.errstate(invalid="ignore"):  # -inf * 0 is NaN, as onnxruntime's kernel gives
            return (np.multiply(x, logistic(t, upper_clamp=silu), out=out),)

    def in_place(x: Any, out: Any, minus_alpha: Any, one: Any) -> tuple:
        """x / (1 + exp(-alpha x)), in four passes over one buffer (the load-time SiLU
        fusion's kernel: it must cost less than the Sigmoid and Mul it replaces).
        exp overflows to inf for very negative alpha x, giving x / inf = 0."""
        xp.multiply(x, minus_alpha, out=out)
        xp.exp(out, out=out)
        xp.add(out, one, out=out)
        return (xp.divide(x, out, out=out),)

    def run(inputs: list, outs: list) -> tuple:
        x = inputs[0]
        if as_onnxruntime:
            return as_onnxruntime_into(x if x.dtype == F32 else x.astype(F32), outs[0])
        ct = compute_dtype(x.dtype)
        if x.dtype == ct and dtype == ct:
            out = outs[0] if outs[0] is not None else xp.empty(x.shape, ct)
            return in_place(x, out, ct.type(-alpha), ct.type(1.0))
        v = x.astype(ct)
        z = ct.type(alpha) * v
        # a sigmoid that does not overflow for large |z|
        e = xp.exp(-xp.abs(z))
        sig = xp.where(z >= 0, ct.type(1.0) / (ct.type(1.0) + e), e / (ct.type(1.0) + e))
        return (emit(outs[0], v * sig, dtype, like=x),)

    def fixed_arrays_form(inputs: list, outs: list) -> Any:
        """`run`'s computation on these arrays, where the output is preallocated in x's
        dtype."""
        x, out = inputs[0], outs[0]
        ct = compute_dtype(x.dtype)
        if out is None or x.dtype != ct or dtype != ct:
            return None
        if as_onnxruntime:
            return lambda ins, outs_: as_onnxruntime_into(x, out)
        minus_alpha, one = ct.type(-alpha), ct.type(1.0)
        return lambda ins, outs_: in_place(x, out, minus_alpha, one)

    return with_fixed_arrays_form(run, fixed_arrays_form)


# Registering the other contrib families (they import the helpers above).
from . import (  # noqa: E402,F401,I001
    attention, contrib_bert, contrib_fused, contrib_norm, contrib_qlinear, contrib_quant, group_query_attention, rotary)
