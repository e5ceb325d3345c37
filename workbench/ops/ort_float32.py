"""Float32 arithmetic in the order and rounding of onnxruntime's CPU kernels.

A float32 decode that requantizes activations per block (MatMulNBits at
accuracy_level 4) turns one ulp of difference in a norm or an activation into a
different int8 value, so the kernels feeding it compute what onnxruntime's do, bit
for bit, given the same inputs (on x86-64 with AVX2 / FMA, where the facts below were
read and measured):

- `sequential_sum`: a row's sum accumulated left to right in the row's dtype, each
  addition rounded (the scalar loops of onnxruntime's SkipLayerNormalization family
  and of its LayerNormalization / SimplifiedLayerNormalization below 16 elements).
- `sum_of_squares_fma8`: onnxruntime's vectorised sum of squares for rows of 16 or
  more (SimplifiedLayerNormalization): 8 float32 lanes, element i into lane i % 8,
  each lane ``fma(x, x, lane)`` (one rounding per step); lanes folded 8 -> 4 (lane l
  plus lane l + 4), 4 -> 2 (l plus l + 2), 2 -> 1; then, when 4 or more elements are
  left, the next 4 as plain float32 ``s + x*x`` (the square rounded, then the sum);
  the rest ``s = fma(x, x, s)``.
- `logistic`: MLAS's logistic (``MlasComputeLogistic``, the FMA3 kernel): x clamped
  to [-18, 18]; p = x * (((a9 x² + a7) x² + a5) x² + a3) x² + a1) and
  q = ((((b10 x² + b8) x² + b6) x² + b4) x² + b2) x² + b0, every step one fused
  multiply-add; p / q + 0.5, clamped below at 0 (and above at 1 where
  ``upper_clamp``: MLAS's SiLU kernel, which QuickGelu with alpha 1 calls, clamps
  both ends; the logistic kernel lets 20 inputs near 18 reach 1 + 2^-23).

A float32 fma is computed as float64: the product of two float32 values is exact in
float64, and the float64 sum rounded to float32 is the fma's result unless that sum
was itself rounded onto a point halfway between two float32 values (double rounding).
Every such sum is kept and checked at the end (`_any_halfway`); where one is
halfway, the chain is recomputed with each fma rounded once (`fma32`: two-sum's
exact error decides a halfway sum), so the result is the correctly rounded fma in every case. (For sums
below float32's normal range, ~1e-38, the check does not apply; no norm or
activation reaches those.)
"""

from __future__ import annotations

import math
import threading

import numpy as np

from . import mlas_jit
from .registry import numpy_any

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)

#: float64 bits below float32's last mantissa bit (53 - 24 = 29 of them), and the
#: pattern of a value exactly halfway between two float32 neighbours
_LOW29 = np.uint64((1 << 29) - 1)
_HALF29 = np.uint64(1 << 28)


def _halfway(sums: np.ndarray) -> np.ndarray:
    """Per element of the float64 `sums`, whether it lies exactly
    halfway between two float32 values (for values in float32's normal range)."""
    bits = sums.view(np.uint64)
    return np.equal(np.bitwise_and(bits, _LOW29), _HALF29)


#: the guard the fast paths check (a test can force the exact path through it)
_any_halfway = _halfway


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Elementwise fma(a, b, c) of float32 arrays, rounded once (the rare path, where a
    float64 sum fell halfway). a * b is exact in float64; Knuth's two-sum gives the
    float64 sum s and its exact error e (s + e is a * b + c exactly). Rounding s to
    float32 is right unless s is a halfway point with e nonzero: then s moves one
    float64 ulp towards e's side first, off the halfway point, so the tie goes the
    way the exact value lies. Infinities and NaNs go through as the float64 sum does."""
    product = np.multiply(a, b, dtype=F64)
    addend = np.positive(c, dtype=F64)
    total = product + addend
    back = total - addend
    error = (product - back) + (addend - (total - back))
    with np.errstate(invalid="ignore"):  # inf - inf in the error term of a non-finite sum
        nudge = _halfway(total) & (error != 0) & np.isfinite(total)
    total = np.where(nudge, np.nextafter(total, np.where(error > 0, np.inf, -np.inf)), total)
    return total.astype(F32)


# --- sums --------------------------------------------------------------------------


def sequential_sum(values: np.ndarray) -> np.ndarray:
    """The sum over the last axis, left to right, each addition rounded in `values`'
    dtype; keeps the axis (shape ``values.shape[:-1] + (1,)``)."""
    return np.add.accumulate(values, axis=-1)[..., -1:]


#: a row of at least this many elements takes the 8-lane fma sum of squares
FMA8_MIN_ROW = 16


def sum_of_squares_fma8(x: np.ndarray) -> np.ndarray:
    """Per row of the float32 2-D `x` (rows, n) with n >= 16: the sum of squares as
    onnxruntime's vectorised loop rounds it (module docstring); shape (rows, 1).
    Compiled where numba is (`mlas_jit`), else `sum_of_squares_emulated`."""
    return sum_of_squares_function()(x)


def sum_of_squares_function():
    """`sum_of_squares_fma8`'s form for a kernel being built (compiled where numba is and
    is not turned off): a kernel asks once, not at every call."""
    return mlas_jit.sum_of_squares if mlas_jit.available("sum_of_squares") else sum_of_squares_emulated


def sum_of_squares_emulated(x: np.ndarray) -> np.ndarray:
    """`sum_of_squares_fma8` in numpy: the lanes' fmas as float64 sums, checked for
    double rounding."""
    rows, n = x.shape
    steps = n // 8
    body = steps * 8
    squares = np.square(x[:, :body].reshape(rows, steps, 8), dtype=F64)  # exact
    squares = squares.transpose(1, 0, 2).copy()  # (steps, rows, 8), C-contiguous
    lanes = np.zeros((rows, 8), F32)
    # each step's float64 sum is kept in `squares` itself (overwriting the square it
    # consumed) for the double-rounding check
    for k in range(steps):
        total = squares[k]
        np.add(total, lanes, out=total)
        lanes[...] = total
    if numpy_any(_any_halfway(squares)):
        lanes = _exact_lanes(x[:, :body].reshape(rows, steps, 8))
    four = lanes[:, :4] + lanes[:, 4:]
    two = four[:, :2] + four[:, 2:]
    s = two[:, :1] + two[:, 1:]
    j = body
    if n - j >= 4:
        for k in range(j, j + 4):
            s += np.square(x[:, k:k + 1])
        j += 4
    if j < n:
        s = _fma_tail(x[:, j:], s)
    return s


def _exact_lanes(blocks: np.ndarray) -> np.ndarray:
    """The 8 fma lanes of `sum_of_squares_fma8`, each step rounded once (`fma32`)."""
    rows, steps, _ = blocks.shape
    lanes = np.zeros((rows, 8), F32)
    for k in range(steps):
        step = blocks[:, k]
        lanes = fma32(step, step, lanes)
    return lanes


def _fma_tail(tail: np.ndarray, s: np.ndarray) -> np.ndarray:
    """`s = fma(x, x, s)` over the columns of `tail` (rows, < 4), in order."""
    sums = np.empty((tail.shape[1],) + s.shape, F64)
    acc = s.copy()
    for k in range(tail.shape[1]):
        np.add(np.square(tail[:, k:k + 1], dtype=F64), acc, out=sums[k])
        acc[...] = sums[k]
    if numpy_any(_any_halfway(sums)):
        acc = s
        for k in range(tail.shape[1]):
            column = tail[:, k:k + 1]
            acc = fma32(column, column, acc)
    return acc


# --- logistic ------------------------------------------------------------------------

_LOWER, _UPPER = np.float32(-18.0), np.float32(18.0)
_ALPHA = [np.float32(v) for v in (4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05,
                                  8.51377133304701e-03, 2.48287947061529e-01)]  # a9, a7, a5, a3, a1
_BETA = [np.float32(v) for v in (6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06,
                                 1.70198817374094e-03, 1.16817656904453e-01, 9.93151921023180e-01)]  # b10 .. b0
#: the p and q chains side by side: their first step's multiplier and addend, then
#: the addends of the three steps both chains take; q's last addend (b0) apart
_FIRST_MUL = np.array([[_ALPHA[0]], [_BETA[0]]], F64)
_FIRST_ADD = np.array([[_ALPHA[1]], [_BETA[1]]], F64)
_NEXT_ADD = [np.array([[_ALPHA[i + 1]], [_BETA[i + 1]]], F64) for i in range(1, 4)]
_HALF, _ZERO, _ONE = np.float32(0.5), np.float32(0.0), np.float32(1.0)


def logistic(x: np.ndarray, out: np.ndarray | None = None, upper_clamp: bool = False) -> np.ndarray:
    """MLAS's logistic of the float32 array `x` (module docstring), into `out` (a
    float32 array of x's shape, may be x itself) or a new array: compiled where numba
    is (`mlas_jit`), else `logistic_emulated`."""
    return logistic_function()(x, out, upper_clamp)


def logistic_function():
    """`logistic`'s form for a kernel being built (the compiled one where numba is and
    is not turned off): a kernel asks once, not at every call."""
    return _logistic_compiled if mlas_jit.available("logistic") else logistic_emulated


def _logistic_compiled(x: np.ndarray, out: np.ndarray | None = None, upper_clamp: bool = False) -> np.ndarray:
    if x.dtype == F32:
        flat = x.reshape(-1)  # a copy where x is not contiguous
        if out is not None and out.dtype == F32 and out.flags.c_contiguous:
            mlas_jit.logistic(flat, out.reshape(-1), upper_clamp)
            return out
        result = mlas_jit.logistic(flat, np.empty_like(flat), upper_clamp).reshape(x.shape)
        if out is None:
            return result
        out[...] = result
        return out
    return logistic_emulated(x, out, upper_clamp)


def logistic_emulated(x: np.ndarray, out: np.ndarray | None = None, upper_clamp: bool = False) -> np.ndarray:
    """`logistic` in numpy: the fmas as float64 sums, checked for double rounding."""
    shape = x.shape
    flat = x.reshape(-1)  # a copy where x is not contiguous
    v = np.clip(flat, _LOWER, _UPPER)
    v2 = np.square(v)
    w = v2.astype(F64)
    n = flat.shape[0]
    # sums[k] holds step k's float64 sums (row 0: p's chain, row 1: q's); sums[4, 0]
    # stays zero (p has one step fewer)
    sums = np.zeros((5, 2, n), F64)
    chains = np.empty((2, n), F32)
    np.multiply(w, _FIRST_MUL, out=sums[0])
    np.add(sums[0], _FIRST_ADD, out=sums[0])
    chains[...] = sums[0]
    for k, addend in enumerate(_NEXT_ADD, start=1):
        np.multiply(w, chains, out=sums[k])
        np.add(sums[k], addend, out=sums[k])
        chains[...] = sums[k]
    last = sums[4, 1]
    np.multiply(w, chains[1], out=last)
    np.add(last, _BETA[5], out=last)
    q = chains[1]
    q[...] = last
    if numpy_any(_any_halfway(sums)):
        chains[0], chains[1] = _exact_pq(v2)
    p = chains[0]
    np.multiply(p, v, out=p)
    result = np.divide(p, q, out=p)
    result += _HALF
    np.maximum(result, _ZERO, out=result)
    if upper_clamp:
        np.minimum(result, _ONE, out=result)
    result = result.reshape(shape)
    if out is None:
        return result
    out[...] = result
    return out


def _exact_pq(v2: np.ndarray) -> tuple:
    """p's chain (before its last multiply by x) and q, every fma rounded once (`fma32`)."""
    p = fma32(v2, _ALPHA[0], _ALPHA[1])
    for a in _ALPHA[2:]:
        p = fma32(v2, p, a)
    q = fma32(v2, _BETA[0], _BETA[1])
    for b in _BETA[2:]:
        q = fma32(v2, q, b)
    return p, q


# --- fused multiply-add, vectorised -------------------------------------------------


def fma_f32(a: np.ndarray, b, c) -> np.ndarray:
    """fma(a, b, c) of float32 operands (arrays or float32 scalars), rounded once: the
    float64 sum rounded to float32 (`fma_step`)."""
    return fma_step(np.multiply(a, b, dtype=F64), a, b, c)


def fma_step(product: np.ndarray, a, b, c, out: np.ndarray | None = None) -> np.ndarray:
    """fma(a, b, c) of float32 operands given their exact float64 product ``a * b``: the
    float64 sum ``product + c`` rounded to float32 (into `out`, which may be c itself).
    A sum that fell halfway between two float32 values (module docstring) may have been
    rounded there from an exact value on either side: those elements, and only those,
    are recomputed with the fma rounded once (`fma32`)."""
    total = product + c
    half = _any_halfway(total)
    fix = None
    if numpy_any(half):
        where = np.nonzero(half)
        picked = [np.broadcast_to(x, total.shape)[where].astype(F32, copy=False) for x in (a, b, c)]
        fix = fma32(*picked)
    if out is None:
        out = total.astype(F32)
    else:
        out[...] = total
    if fix is not None:
        out[where] = fix
    return out


#: elements of float64 scratch `fma_chain` works in at a time (its step blocks)
_CHAIN_ELEMENTS = 1 << 21
_scratch = threading.local()


def _chain_scratch(steps: int, shape: tuple) -> tuple:
    """Per-thread scratch for `fma_chain`: float64 products, sums and accumulators before
    each step (one more), the sums' low bits and halfway flags; reused across calls
    (fresh memory would be page-faulted in on every call)."""
    size = math.prod(shape)
    held = getattr(_scratch, "chain", None)
    if held is None or held[0].size < steps * size or held[2].size < (steps + 1) * size:
        n = max(steps * size, 0 if held is None else held[0].size)
        held = _scratch.chain = (np.empty(n, F64), np.empty(n, F64),
                                 np.empty(max((steps + 1) * size, n + 1), F64), np.empty(n, np.uint64),
                                 np.empty(n, bool))
    full = (steps,) + shape
    return (held[0][:steps * size].reshape(full), held[1][:steps * size].reshape(full),
            held[2][:(steps + 1) * size].reshape((steps + 1,) + shape),
            held[3][:steps * size].reshape(full), held[4][:steps * size].reshape(full))


def fma_chain(a: np.ndarray, b: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """``acc = fma(a[s], b[s], acc)`` for s along the first axis of a and b (float32,
    broadcasting to ``(steps,) + acc.shape``), each fma rounded once to float32; a new
    array (acc is not modified).

    The float64 sum of the exact product and acc, rounded to float32, is the fma unless
    the float64 sum was itself rounded onto a float32 halfway point. Halfway sums are
    common where the sum is exact (a small integer times a scale: a true tie, rounded
    right), so after each block of steps the halfway ones are sorted: only one with a
    nonzero two-sum error (its float64 rounding happened) marks its element, and a
    marked element's whole chain is recomputed with `fma32` at the end."""
    steps = a.shape[0]
    start = acc
    acc = np.array(acc, F32, copy=True)
    count = acc.size
    block = max(1, min(steps, _CHAIN_ELEMENTS // max(count, 1)))
    marked = None
    for s0 in range(0, steps, block):
        n = min(steps, s0 + block) - s0
        products, totals, before, bits, half = _chain_scratch(n, acc.shape)
        np.multiply(a[s0:s0 + n], b[s0:s0 + n], out=products, dtype=F64)  # exact
        np.copyto(before[0], acc)  # float64 accumulators: a same-dtype add is the faster loop
        for k in range(n):
            np.add(products[k], before[k], out=totals[k])
            np.copyto(acc, totals[k], casting="unsafe")  # rounded to float32
            np.copyto(before[k + 1], acc)
        np.equal(np.bitwise_and(totals.view(np.uint64), _LOW29, out=bits), _HALF29, out=half)
        if not numpy_any(half):
            continue
        flagged = np.flatnonzero(half)  # step k of the block * count + cell
        product = products.reshape(-1)[flagged]
        total = totals.reshape(-1)[flagged]
        addend = before.reshape(-1)[flagged]
        back = total - addend
        error = (product - back) + (addend - (total - back))  # two-sum: the float64 rounding
        rounded = error != 0
        if numpy_any(rounded):
            if marked is None:
                marked = np.zeros(count, bool)
            marked[flagged[rounded] % count] = True
    if marked is not None:
        cells = np.unravel_index(np.flatnonzero(marked), acc.shape)
        exact = np.broadcast_to(np.asarray(start, F32), acc.shape)[cells]  # host-ok: numpy-only, recomputed elements
        full = (steps,) + acc.shape
        for s in range(steps):
            exact = fma32(np.broadcast_to(a, full)[s][cells], np.broadcast_to(b, full)[s][cells], exact)
        acc[cells] = exact
    return acc


# --- rotary embedding -------------------------------------------------------------------


def rotate_pair(x1: np.ndarray, x2: np.ndarray, cos, sin) -> tuple:
    """MLAS's non-interleaved rotary embedding (``MlasRotaryEmbedOneRow``, the AVX2
    kernel onnxruntime's GroupQueryAttention and RotaryEmbedding call) of float32
    halves: (``fma(x1, cos, -(x2 * sin))``, ``fma(x1, sin, x2 * cos)``), each inner
    product rounded to float32."""
    return fma_f32(x1, cos, -(x2 * sin)), fma_f32(x1, sin, x2 * cos)
