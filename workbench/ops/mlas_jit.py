"""Compiled twins (numba) of numpy forms of onnxruntime's float32 arithmetic: MLAS's
logistic (`ort_float32.logistic`), onnxruntime's RMS-norm sum of squares
(`ort_float32.sum_of_squares_fma8`) and whole RMS-norm rows
(`normalization._rms_norm_as_onnxruntime`), SkipSimplifiedLayerNormalization's row
(`contrib_norm.row_rms`), MLAS's rotary embedding (`ort_float32.rotate_pair`) and its
one-token GroupQueryAttention decode (`mlas_attention.decode_attention`), and the two with a growing
cache's present rows in one call (`grow_and_attend`). The kernels
themselves are in `mlas_kernels`; each has one signature of C-contiguous arrays, which
the wrappers here give it (`np.ascontiguousarray` copies only where needed).

The emulations are exact but cost tens of numpy calls each (their fmas are float64
sums checked for double rounding); a step of SmolLM2-135M's int4 export ran 30 of each.
Here every fma MLAS takes is one ``llvm.fma.f32`` (`fma32`, exact on any CPU) and
nothing else is fused: the kernels compile without fast-math, so each other product
and sum rounds as written, in the emulation's order. `available` holds each twin to
its emulation once per process (`numba_support.enabled` false: the emulation runs).
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import mlas_isa, numba_support

F32 = np.dtype(np.float32)
def available(name: str) -> bool:
    """Whether the compiled `name` ("logistic", "sum_of_squares", "skip_rms_row",
    "rms_rows", "rotate_rows", "decode_attention", "grow_and_attend") is taken."""
    return numba_support.enabled() and _self_checked(name)


@functools.cache
def _self_checked(name: str) -> bool:
    from . import mlas_attention, ort_float32

    r = np.random.default_rng(11)
    kernels = _kernels()
    if name == "logistic":
        x = np.concatenate([r.standard_normal(4000) * 6, np.linspace(-20, 20, 801), [17.999, 18, -18]])
        x = x.astype(F32)
        same = all(np.array_equal(kernels.logistic(x, np.empty_like(x), clamp),
                                  ort_float32.logistic_emulated(x, upper_clamp=clamp))
                   for clamp in (False, True))
    elif name == "sum_of_squares":
        same = True
        for n in (16, 27, 64, 576, 1539):
            rows = (r.standard_normal((3, n)) * 5).astype(F32)
            same = same and np.array_equal(kernels.sum_of_squares(rows, np.empty((3, 1), F32)),
                                           ort_float32.sum_of_squares_emulated(rows))
    elif name == "skip_rms_row":
        from .contrib_norm import row_rms

        same = True
        for n in (7, 64, 576):
            x, skip, gamma = ((r.standard_normal(n) * 3).astype(F32) for _ in range(3))
            s, y = np.empty(n, F32), np.empty(n, F32)
            skip_rms_row(x, skip, gamma, F32.type(n), F32.type(1e-5), s, y)
            want_s = np.add(x, skip, dtype=F32)
            want_y = np.divide(want_s, row_rms(want_s, np.empty(n, F32), (F32.type(n), F32.type(1e-5)), F32))
            want_y = np.multiply(want_y, gamma, dtype=F32)
            same = same and np.array_equal(s, want_s) and np.array_equal(y.view(np.int32), want_y.view(np.int32))
    elif name == "rms_rows":
        from .normalization import _rms_norm_as_onnxruntime

        same = True
        for rows_, n in ((3, 7), (2, 16), (3, 27), (1, 576)):
            rows = (r.standard_normal((rows_, n)) * 3).astype(F32)
            scale = r.standard_normal(n).astype(F32)
            y, inv = np.empty((rows_, n), F32), np.empty(rows_, F32)
            rms_rows(rows, scale, F32.type(1e-6), y, inv)
            want_y, want_inv = _rms_norm_as_onnxruntime(rows, scale, (-1,), F32.type(1e-6), None,
                                                        ort_float32.sum_of_squares_emulated)
            same = same and np.array_equal(y.view(np.int32), want_y.view(np.int32)) \
                and np.array_equal(inv, want_inv.reshape(-1))
    elif name == "rotate_rows":
        halves = (r.standard_normal((5, 2, 32)) * 4).astype(F32)
        cos, sin = r.uniform(-1, 1, (3, 32)).astype(F32), r.uniform(-1, 1, (3, 32)).astype(F32)
        rotated = np.empty_like(halves)
        rotate_rows(halves, cos, sin, 2, rotated)
        want = ort_float32.rotate_pair(halves[:, 0], halves[:, 1], cos[2], sin[2])
        same = np.array_equal(rotated[:, 0], want[0]) and np.array_equal(rotated[:, 1], want[1])
    elif name == "grow_and_attend":
        same = available("rotate_rows") and available("decode_attention") and _grow_and_attend_checked(r)
    else:
        same = True
        for kv, g, t, h, window, bias_shape in ((3, 3, 37, 64, 0, None), (2, 1, 5, 13, 2, None),
                                                (1, 4, 17, 8, 0, None), (2, 2, 19, 16, 3, (2, 2, 19)),
                                                (3, 2, 21, 8, 0, (1, 1, 21))):
            q = (r.standard_normal((kv, g, h)) * 3).astype(F32)
            keys = (r.standard_normal((kv, t + 3, h)) * 3).astype(F32)  # rows t.. beyond the total
            values = r.standard_normal((kv, t + 3, h)).astype(F32)
            bias = None if bias_shape is None else (r.standard_normal(bias_shape) * 2).astype(F32)
            want = mlas_attention.decode_attention_emulated(q, keys[:, :t], values[:, :t], 0.125, window, bias)
            got = decode_attention(q, keys, values, 0.125, window, np.empty((kv, g, h), F32), bias, total=t)
            same = same and np.array_equal(got.view(np.int32), want.view(np.int32))
    if not same:
        warnings.warn(f"numba's {name} differs from its numpy emulation on this machine; the emulation is taken "
                      "(same values, slower)", RuntimeWarning, stacklevel=2)
    return same


def logistic(flat: np.ndarray, into: np.ndarray, upper_clamp: bool) -> np.ndarray:
    """MLAS's logistic of the float32 vector `flat` into `into` (same shape)."""
    return _kernels().logistic(flat, into, upper_clamp)


def sum_of_squares(rows: np.ndarray) -> np.ndarray:
    """`ort_float32.sum_of_squares_fma8` of the float32 rows (rows, n >= 16): (rows, 1)."""
    return _kernels().sum_of_squares(rows, np.empty((rows.shape[0], 1), F32))


def skip_rms_row(x: np.ndarray, skip: np.ndarray, gamma: np.ndarray, hidden: np.float32, eps: np.float32,
                 s: np.ndarray, y: np.ndarray) -> None:
    """SkipSimplifiedLayerNormalization of one float32 row, C-contiguous 1-D arrays:
    the sum into `s`, the output into `y` (`contrib_norm.row_rms`'s rounding)."""
    _kernels().skip_rms_row(x, skip, gamma, hidden, eps, s, y)


def rms_rows(rows: np.ndarray, scale: np.ndarray, eps: np.float32, y: np.ndarray, inv: np.ndarray) -> None:
    """onnxruntime's RMS norm of float32 rows (R, n) C-contiguous, by `scale` (n,), into
    `y` (R, n) and the inverse RMS into `inv` (R,)."""
    _kernels().rms_rows(rows, scale, eps, y, inv)


def rotate_rows(halves: np.ndarray, cos: np.ndarray, sin: np.ndarray, position: int,
                rotated: np.ndarray) -> None:
    """`ort_float32.rotate_pair` of the float32 rows' halves (rows, 2, half) by row
    `position` of the cos/sin caches (positions, half), into `rotated` (rows, 2, half).
    Non-contiguous arrays are copied first, the result too."""
    into = rotated if rotated.flags.c_contiguous else np.empty(rotated.shape, F32)
    contiguous = np.ascontiguousarray  # the array itself where it already is
    _kernels().rotate_rows(contiguous(halves), contiguous(cos), contiguous(sin), position, into)
    if into is not rotated:
        rotated[...] = into


def decode_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, scale: float, window_start: int,
                     into: np.ndarray, bias: np.ndarray | None = None, total: int | None = None) -> np.ndarray:
    """`mlas_attention.decode_attention` of float32 q (KV, G, H) over rows 0..total-1 of
    the keys and values (KV, L >= total, H; total None: all L), into `into` (KV, G, H)
    float32; `bias` None or float32 (KV | 1, G | 1, W >= total). Pass a whole cache and
    the rows to read, not a view of those rows, which would be copied first."""
    kernels = _kernels()
    has_bias = bias is not None
    out = into if into.flags.c_contiguous else np.empty(into.shape, F32)
    contiguous = np.ascontiguousarray  # the array itself where it already is
    kernels.decode_attention(contiguous(q), contiguous(keys), contiguous(values),
                             keys.shape[1] if total is None else total, np.float32(scale), window_start, out,
                             _wide(), contiguous(bias) if has_bias else kernels.no_bias, has_bias)
    if out is not into:
        into[...] = out
    return into


def grow_and_attend(halves: np.ndarray, cos: np.ndarray, sin: np.ndarray, position: int, rotated: np.ndarray,
                    past_k: np.ndarray, past_v: np.ndarray, k_rows: np.ndarray, v_rows: np.ndarray,
                    present_k: np.ndarray, present_v: np.ndarray, q: np.ndarray, scale: np.float32, into: np.ndarray,
                    bias: np.ndarray | None) -> None:
    """`rotate_rows`, then the presents of a growing cache (KV, L + 1, H) as the past
    rows (KV, L, H) and the new K/V rows (KV, H) at L, then `decode_attention` of q over
    all L + 1 rows into `into`, in one compiled call: the same arithmetic as the three
    steps, bit for bit (`available("grow_and_attend")`). Every array float32 and
    C-contiguous; q and k_rows view `rotated`; bias None or (KV | 1, G | 1, >= L + 1)."""
    kernels = _kernels()
    has_bias = bias is not None
    kernels.grow_and_attend(halves, cos, sin, position, rotated, past_k, past_v, k_rows, v_rows, present_k,
                            present_v, past_k.shape[1], q, scale, into, _wide(),
                            bias if has_bias else kernels.no_bias, has_bias)


def _grow_and_attend_checked(r: np.random.Generator) -> bool:
    """`grow_and_attend` against `rotate_rows`, the presents written by numpy and
    `decode_attention`, on a few growing caches (with and without a bias)."""
    for kv, group, head, past, bias_shape in ((2, 2, 16, 4, None), (3, 3, 64, 9, (1, 1, 12)), (1, 4, 8, 1, (1, 4, 2))):
        rows, half = kv * group + kv, head // 2
        halves = (r.standard_normal((rows, 2, half)) * 3).astype(F32)
        cos, sin = r.uniform(-1, 1, (past + 3, half)).astype(F32), r.uniform(-1, 1, (past + 3, half)).astype(F32)
        past_k, past_v = ((r.standard_normal((kv, past, head)) * 2).astype(F32) for _ in range(2))
        v_rows = r.standard_normal((kv, head)).astype(F32)
        bias = None if bias_shape is None else (r.standard_normal(bias_shape) * 2).astype(F32)
        got, want = [], []
        for fused in (True, False):
            rotated = np.empty((rows, 2, half), F32)
            flat = rotated.reshape(rows, head)
            q, k_rows = flat[:kv * group].reshape(kv, group, head), flat[kv * group:]
            present_k, present_v, out = np.empty((kv, past + 1, head), F32), np.empty((kv, past + 1, head), F32), \
                np.empty((kv, group, head), F32)
            if fused:
                grow_and_attend(halves, cos, sin, past, rotated, past_k, past_v, k_rows, v_rows, present_k, present_v,
                                q, F32.type(0.125), out, bias)
            else:
                rotate_rows(halves, cos, sin, past, rotated)
                present_k[:, :past], present_v[:, :past] = past_k, past_v
                present_k[:, past], present_v[:, past] = k_rows, v_rows
                decode_attention(q, present_k, present_v, 0.125, 0, out, bias)
            (got if fused else want).append((rotated, present_k, present_v, out))
        if not all(np.array_equal(a.view(np.int32), b.view(np.int32)) for a, b in zip(got[0], want[0])):
            return False
    return True


def _wide() -> bool:
    """Whether MLAS takes its AVX-512F sum-exp kernel here (16 lanes), else FMA3's (8)."""
    return mlas_isa.isa() == "avx512"



@functools.cache
def _kernels():
    """The compiled kernels (`mlas_kernels`, imported and compiled or loaded on first use)."""
    from . import mlas_kernels as k

    return _Kernels(logistic=k.logistic_kernel, sum_of_squares=k.sum_of_squares_kernel,
                    skip_rms_row=k.skip_rms_row_kernel, rms_rows=k.rms_rows_kernel, rotate_rows=k.rotate_rows_kernel,
                    decode_attention=k.decode_attention_kernel, grow_and_attend=k.grow_and_attend_kernel,
                    no_bias=k.NO_BIAS)


@dataclass(frozen=True, slots=True)
class _Kernels:
    logistic: Any
    sum_of_squares: Any
    skip_rms_row: Any
    rms_rows: Any
    rotate_rows: Any
    decode_attention: Any
    grow_and_attend: Any
    no_bias: np.ndarray  # the bias argument where there is none
