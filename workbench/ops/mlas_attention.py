"""GroupQueryAttention's attention as onnxruntime 1.32's CPU kernel computes it, bit for
bit (float32, the numpy backend, on x86-64 CPUs whose MLAS kernels `mlas_isa.isa` names:
FMA3 / AVX2, or AVX-512).

onnxruntime's float32 GroupQueryAttention does not run a softmax over whole score rows:
where the total length exceeds 1 and no softcap, smooth softmax, head sink or output_qk
is asked for, it rotates Q/K (`ort_float32.rotate_pair`), writes the present caches and
calls MLAS's flash attention for a KV cache (``MlasFlashAttentionGQA``). What decides
its rounding, read from its source and confirmed against onnxruntime by probes
(tests/ops/test_gqa_mlas_exact.py: 0 ulps):

- **one new token** (``MlasGQADecodeGQAThreaded``, one task per head): scores by a
  baseline-ISA dot product, 8 lanes each summing every 8th product (products rounded,
  no fma), lanes folded ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)), the tail past a multiple
  of 8 added in order, times the scale; local-window columns set to float32's lowest;
  the row max; `sum_exp` over the whole row; the weighted sum of V rows, one running
  sum per feature in key order (products rounded, no fma); times fl(1 / sum).
- **several tokens** (``MlasFlashAttentionGQAThreaded``): query rows in blocks of
  q_block = min(kv_block, 2 head_size, S), keys in blocks of kv_block = min(L2 bytes /
  (32 head_size), total) (`mlas_isa.l2_cache_bytes`); per block, scores by MLAS's SGEMM
  (`sgemm_fma`: one fma chain over the head per score, then times the scale), the
  attention bias added, causal / window columns set to lowest, a running max m and sum
  l (first block: l = rowsum; later: e = expf(m_old - m_new) (libm), l = e l + rowsum,
  the accumulated output times e), `sum_exp` against -m, and the output accumulated by
  the SGEMM (`sgemm_fma`, or `sgemm_m1` for a one-row block: MLAS's M = 1 kernel);
  finally times fl(1 / l). Blocks past a row's last visible key are skipped.
- `sum_exp` is MLAS's ``ComputeSumExpF32Kernel`` (FMA3): x + (-max), clamped below at
  -88.376; m = round(x / ln 2) by the 1.5 * 2^23 trick (an fma), x reduced by m ln 2
  in two fma steps (high and low parts), a degree-6 polynomial by fma steps, times
  2^m built in the exponent bits; the sum in 8 lanes (element i in lane i % 8, one
  accumulator, the tail's missing lanes zero), folded ((l4+l5)+(l6+l7)) +
  ((l0+l1)+(l2+l3)). Masked (lowest) scores come out exactly 0. Where the CPU has
  AVX-512F, MLAS takes that kernel instead: clamped at -103.97, times 2^m by
  ``vscalefps`` (subnormal results kept), 16 lanes, lanes j and j + 8 added first.
- the SGEMM steps K in panels (`stride_k`: 256 for P x V at head size 64, 128 at 128):
  a panel's chain is added to what the panels before it left.

Not reproduced (the callers keep their own forms there): flash decoding (a one-token
step split over KV chunks when batch x heads < onnxruntime's thread count, e.g. one
head and two threads), the non-flash path (softcap, smooth softmax, head sink,
output_qk, a total length of 1: its result is V's row exactly, as here), float16.

fma is computed as float64 (products of float32 values are exact there) and rounded
to float32 once; a float64 sum that may have been double-rounded (it fell halfway
between two float32 values) is recomputed exactly (`ort_float32.fma_step`,
`ort_float32.fma_chain`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import numpy as np

from . import mlas_jit
from .mlas_isa import isa, l2_cache_bytes
from .ort_float32 import _any_halfway, fma_chain, fma_step
from .registry import numpy_any

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
#: what MLAS writes over masked scores (std::numeric_limits<float>::lowest())
LOWEST = np.float32(np.finfo(np.float32).min)
_ZERO, _ONE = np.float32(0.0), np.float32(1.0)

# MlasExpConstants (compute.cpp): the sum-exp kernel's clamp, rounding bias, log2
# reciprocal, ln2 in two parts, the polynomial (poly_56 applied twice) and 1.0f's bits
_LOWER_SUM_EXP = np.float32(-88.3762626647949)
#: the AVX-512F kernel clamps at the exp kernel's lower range instead (its vscalefps
#: makes subnormals down to the last one that rounds to nonzero)
_LOWER_RANGE = np.float32(-103.9720840454)
_ROUNDING_BIAS = np.float32(12582912.0)  # 1.5 * 2^23
_LOG2_RECIPROCAL = np.float32(1.44269504088896341)
_LOG2_HIGH = np.float32(-6.93145752e-1)
_LOG2_LOW = np.float32(-1.42860677e-6)
_POLY = tuple(np.float32(float.fromhex(h)) for h in
              ("0x1.694000p-10", "0x1.125edcp-7", "0x1.555b5ap-5", "0x1.555450p-3", "0x1.fffff6p-2",
               "0x1.000000p+0", "0x1.000000p+0"))
_ONE_BITS = np.int32(0x3F800000)


# --- fma, rounded once ------------------------------------------------------------------


def _fma(a, b, c) -> np.ndarray:
    """fma(a, b, c) of float32 values, rounded once (`ort_float32.fma_step`)."""
    return fma_step(np.multiply(a, b, dtype=F64), a, b, c)


# --- MLAS's sum of exponentials -------------------------------------------------------


def _exp_steps(x: np.ndarray, fma) -> np.ndarray:
    """MLAS's exp of `x` (already biased by -max), every fma through `fma`. The FMA3
    kernel clamps x at -88.38 and multiplies by 2^m built in the exponent bits; the
    AVX-512F one clamps at -103.97 and scales by ``vscalefps`` (times 2^m rounded once,
    so subnormal results)."""
    wide = isa() == "avx512"
    x = np.maximum(x, _LOWER_RANGE if wide else _LOWER_SUM_EXP)
    biased = fma(x, _LOG2_RECIPROCAL, _ROUNDING_BIAS)
    m = biased - _ROUNDING_BIAS  # exact: the rounded multiple of 1
    x = fma(m, _LOG2_HIGH, x)
    x = fma(m, _LOG2_LOW, x)
    p = fma(_POLY[0], x, _POLY[1])
    for c in _POLY[2:]:
        p = fma(p, x, c)
    if wide:
        return np.ldexp(p, m.astype(np.int32)).astype(F32, copy=False)
    scale = (np.left_shift(biased.view(np.int32), 23) + _ONE_BITS).view(F32)  # 2^m
    return np.multiply(p, scale, dtype=F32)


class _Fmas:
    """fma steps as float64 sums rounded to float32, every sum kept in one buffer so a
    single check afterwards finds any that fell halfway (`tie`: then the caller redoes
    the computation with `_fma`, which rounds such sums exactly)."""

    __slots__ = ("sums", "used")

    def __init__(self, steps: int, shape: tuple) -> None:
        self.sums = np.empty((steps,) + shape, F64)
        self.used = 0

    def __call__(self, a, b, c) -> np.ndarray:
        total = np.multiply(a, b, out=self.sums[self.used], dtype=F64)
        total += c
        self.used += 1
        return total.astype(F32)

    @property
    def tie(self) -> bool:
        return numpy_any(_any_halfway(self.sums[:self.used]))


#: the fma steps of `_exp_steps`
_EXP_FMAS = 3 + len(_POLY) - 1


def sum_exp(scores: np.ndarray, negmax: np.ndarray) -> tuple:
    """(exp(scores + negmax), their sums) as MLAS's sum-exp kernel for this CPU (FMA3, or
    AVX-512F where `mlas_isa.isa` says "avx512") rounds them:
    `scores` float32 (..., n), `negmax` (..., 1); the sums have shape (...)."""
    x = np.add(scores, negmax, dtype=F32)
    steps = _Fmas(_EXP_FMAS, x.shape)
    e = _exp_steps(x, steps)
    if steps.tie:  # rare: a sum fell halfway between two float32 values
        e = _exp_steps(x, _fma)
    return e, lane_sum(e)


def lane_sum(e: np.ndarray) -> np.ndarray:
    """The sum over the last axis as MLAS's sum-exp kernel accumulates it. FMA3: element
    i into lane i % 8, each lane in order, then ((l4+l5)+(l6+l7)) + ((l0+l1)+(l2+l3)).
    AVX-512F: 16 lanes alike, lanes j and j + 8 added (t_j), then ((t0+t1)+(t2+t3)) +
    ((t4+t5)+(t6+t7)) (``vhaddps`` twice and the two halves)."""
    width = 16 if isa() == "avx512" else 8
    n = e.shape[-1]
    chunks = -(-n // width)
    if chunks * width != n:
        padded = np.zeros(e.shape[:-1] + (chunks * width,), F32)
        padded[..., :n] = e
        e = padded
    lanes = e.reshape(e.shape[:-1] + (chunks, width))
    # a reduction over an axis that is not the innermost one adds its slices in order
    acc = np.add.reduce(lanes, axis=-2)
    if width == 16:
        t = acc[..., 8:] + acc[..., :8]
        return ((t[..., 0] + t[..., 1]) + (t[..., 2] + t[..., 3])) + ((t[..., 4] + t[..., 5]) + (t[..., 6] + t[..., 7]))
    low = (acc[..., 0] + acc[..., 1]) + (acc[..., 2] + acc[..., 3])
    high = (acc[..., 4] + acc[..., 5]) + (acc[..., 6] + acc[..., 7])
    return high + low


# --- MLAS's SGEMM -----------------------------------------------------------------------


#: MLAS's default SGEMM panel strides (``MLAS_SGEMM_STRIDEN`` / ``MLAS_SGEMM_STRIDEK``)
_STRIDE_N = _STRIDE_K = 128


def stride_k(n: int, k: int) -> int:
    """The K panel ``MlasSgemmOperation`` steps through for an untransposed A: widened
    where N is small, narrowed where K is (it trades the two strides)."""
    stride_n, stride_k = _STRIDE_N, _STRIDE_K
    if n >= k:
        while stride_k // 2 >= k:
            stride_n, stride_k = stride_n * 2, stride_k // 2
    else:
        while stride_n > 16 and stride_n // 2 >= n:
            stride_n, stride_k = stride_n // 2, stride_k * 2
    return stride_k


def sgemm_fma(a: np.ndarray, b: np.ndarray, alpha: np.float32, c: np.ndarray | None = None) -> np.ndarray:
    """``a @ b`` (..., M, K) x (..., K, N) as MLAS's SGEMM kernels (FMA3 and AVX-512F
    alike) round it: K in panels (`stride_k`), per output and panel one fma chain over
    its k from 0, times alpha, added to what the earlier panels left (to `c` for beta 1),
    fl(acc * alpha + c)."""
    shape = np.broadcast_shapes(a.shape[:-1] + (1,), b.shape[:-2] + (1, b.shape[-1]))
    k_len = a.shape[-1]
    panel = stride_k(b.shape[-1], k_len)
    steps_a = np.moveaxis(a, -1, 0)[..., None]  # [K, ..., M, 1]
    steps_b = np.moveaxis(b, -2, 0)[..., None, :]  # [K, ..., 1, N]
    out = c
    for k0 in range(0, k_len, panel):
        acc = fma_chain(steps_a[k0:k0 + panel], steps_b[k0:k0 + panel], np.zeros(shape, F32))
        if alpha != _ONE:
            acc = np.multiply(acc, alpha, dtype=F32)
        out = acc if out is None else np.add(acc, out, dtype=F32)
    return out


def sgemm_m1(a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
    """``a @ b`` for one row a (..., 1, K) as MLAS's M = 1 kernel (``MlasSgemmKernelM1Avx``,
    alpha 1) rounds it: products rounded, k in groups of 4 summed left to right, each
    group's sum added to the running result (`c` for beta 1, else zero); then a group of
    2 and a single k where K % 4 leaves them."""
    products = np.multiply(np.swapaxes(a, -1, -2), b, dtype=F32)  # (..., K, N)
    k_len = products.shape[-2]
    out = np.zeros(np.broadcast_shapes(a.shape[:-1] + (1,), b.shape[:-2] + (1, b.shape[-1])), F32) \
        if c is None else c.astype(F32, copy=True)
    k = 0
    while k + 4 <= k_len:
        group = ((products[..., k:k + 1, :] + products[..., k + 1:k + 2, :]) + products[..., k + 2:k + 3, :]) \
            + products[..., k + 3:k + 4, :]
        out = group + out
        k += 4
    if k_len - k >= 2:
        out = (products[..., k:k + 1, :] + products[..., k + 1:k + 2, :]) + out
        k += 2
    if k < k_len:
        out = products[..., k:k + 1, :] + out
    return out


# --- the decode kernel's dot products ---------------------------------------------------


def decode_scores(q: np.ndarray, keys: np.ndarray, scale: np.float32) -> np.ndarray:
    """``MlasGQADecodeQK``: q (KV, G, H) against keys (KV, T, H), (KV, G, T)."""
    head = q.shape[-1]
    products = np.multiply(q[:, :, None, :], keys[:, None, :, :], dtype=F32)  # (KV, G, T, H)
    body = head - head % 8
    lanes = products[..., :body].reshape(products.shape[:-1] + (body // 8, 8))
    acc = np.add.reduce(lanes, axis=-2)  # lane l: products l, l + 8, ... in order
    pairs = acc[..., 0::2] + acc[..., 1::2]
    quads = pairs[..., 0::2] + pairs[..., 1::2]
    total = quads[..., 0] + quads[..., 1]
    for h in range(body, head):
        total = total + products[..., h]
    return np.multiply(total, scale, dtype=F32)


def decode_weighted_sum(probs: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``MlasGQADecodeSV``: probs (KV, G, T) times values (KV, T, H), one running sum per
    feature in key order (products rounded), (KV, G, H)."""
    products = np.multiply(probs[..., None], values[:, None, :, :], dtype=F32)  # (KV, G, T, H)
    return np.add.reduce(products, axis=-2)


def _inverse(sums: np.ndarray) -> np.ndarray:
    """fl(1 / s) where s > 0, else 0 (as the kernel guards a zero sum)."""
    with np.errstate(divide="ignore"):
        inv = np.divide(_ONE, sums, dtype=F32)
    return np.where(sums > _ZERO, inv, _ZERO).astype(F32, copy=False)


def decode_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, scale: float,
                     window_start: int = 0, bias: np.ndarray | None = None,
                     out: np.ndarray | None = None, total: int | None = None) -> np.ndarray:
    """One new token's attention over the cached rows 0..T-1, ``MlasGQADecodeGQAThreaded``:
    q (KV, G, H), keys / values (KV, L, H) (T = `total`, None: L), the rows before
    `window_start` masked, `bias` (KV | 1, G | 1, W >= T; its first T columns) added to
    the scores. Into `out` (KV, G, H) where given. Compiled where numba is
    (`mlas_jit`: pass a whole cache and `total`, not a view of its rows, which it
    would copy), else `decode_attention_emulated`."""
    return decode_attention_function()(q, keys, values, scale, window_start, bias, out, total)


def decode_attention_function():
    """`decode_attention`'s form for a kernel being built (compiled where numba is and
    is not turned off): a kernel asks once, not at every call."""
    return _decode_attention_compiled if mlas_jit.available("decode_attention") else decode_attention_emulated


def _decode_attention_compiled(q: np.ndarray, keys: np.ndarray, values: np.ndarray, scale: float,
                               window_start: int = 0, bias: np.ndarray | None = None,
                               out: np.ndarray | None = None, total: int | None = None) -> np.ndarray:
    total = keys.shape[1] if total is None else total
    if (q.dtype == F32 and keys.dtype == F32 and values.dtype == F32
            and (bias is None or kernel_reads_bias(bias, q.shape, total))):
        if out is None or out.dtype != F32:
            result = mlas_jit.decode_attention(q, keys, values, scale, window_start, np.empty(q.shape, F32), bias,
                                               total)
            return result if out is None else _into(out, result)
        return mlas_jit.decode_attention(q, keys, values, scale, window_start, out, bias, total)
    return decode_attention_emulated(q, keys, values, scale, window_start, bias, out, total)


def kernel_reads_bias(bias: np.ndarray, q_shape: tuple, total: int) -> bool:
    """Whether the compiled kernel reads `bias` as the emulation broadcasts it: float32
    (KV | 1, G | 1, W >= T)."""
    return (bias.dtype == F32 and bias.ndim == 3 and bias.shape[2] >= total
            and bias.shape[0] in (1, q_shape[0]) and bias.shape[1] in (1, q_shape[1]))


def _into(out: np.ndarray, result: np.ndarray) -> np.ndarray:
    out[...] = result
    return out


def decode_attention_emulated(q: np.ndarray, keys: np.ndarray, values: np.ndarray, scale: float,
                              window_start: int = 0, bias: np.ndarray | None = None,
                              out: np.ndarray | None = None, total: int | None = None) -> np.ndarray:
    """`decode_attention` in numpy (the fmas as float64 sums, checked for double rounding)."""
    if total is not None:
        keys, values = keys[:, :total], values[:, :total]
        bias = None if bias is None else bias[..., :total]
    scores = decode_scores(q, keys, np.float32(scale))
    if bias is not None:
        scores = np.add(scores, bias, dtype=F32)
    if window_start > 0:
        scores[..., :window_start] = LOWEST
    top = np.maximum.reduce(scores, axis=-1, keepdims=True)
    masked = top == LOWEST  # a row with nothing visible: zeros (never for decode's last row)
    e, sums = sum_exp(scores, -top)
    result = decode_weighted_sum(e, values)
    result = np.multiply(result, _inverse(sums)[..., None], dtype=F32, out=out)
    if numpy_any(masked):
        result[np.broadcast_to(masked, result.shape)] = _ZERO
    return result


# --- the flash kernel of a prompt -------------------------------------------------------


def block_sizes(head_size: int, total: int, seq: int) -> tuple[int, int]:
    """(q_block, kv_block) as onnxruntime's GroupQueryAttention sizes MLAS's tiles."""
    kv_block = max(l2_cache_bytes() // (4 * 4 * 2 * head_size), 1)
    q_block = min(kv_block, 2 * head_size)
    return min(q_block, seq), min(kv_block, total)


@functools.cache
def _expf():
    """libm's expf (what the kernel's std::exp on a float calls)."""
    libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    fn = libm.expf
    fn.restype = ctypes.c_float
    fn.argtypes = [ctypes.c_float]
    return fn


def _expf_of(x: np.ndarray) -> np.ndarray:
    fn = _expf()
    flat = [fn(v) for v in x.reshape(-1).tolist()]
    return np.array(flat, F32).reshape(x.shape)


def flash_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, scale: float, past: int,
                    total: int, window: int = -1, bias: np.ndarray | None = None) -> np.ndarray:
    """Several new tokens' attention, ``MlasFlashAttentionGQAThreaded``: q (KV, G, S, H)
    (query row s sits at position past + s), keys / values (KV, >= total, H) (rows
    0..total-1 are read), `window` the local window (-1: none), `bias` broadcastable to
    (KV, G, S, total). Returns (KV, G, S, H)."""
    kv_heads, group, seq, head = q.shape
    q_block, kv_block = block_sizes(head, total, seq)
    alpha = np.float32(scale)
    out = np.empty((kv_heads, group, seq, head), F32)
    for q0 in range(0, seq, q_block):
        rows = min(q_block, seq - q0)
        qpos = past + q0 + np.arange(rows)[:, None]  # (rows, 1)
        m = np.full((kv_heads, group, rows), LOWEST, F32)
        denominator = np.zeros((kv_heads, group, rows), F32)
        acc = np.zeros((kv_heads, group, rows, head), F32)
        for ir in range(0, total, kv_block):
            if ir >= past + q0 + rows:
                break
            width = min(kv_block, total - ir)
            k_blk = keys[:, None, ir:ir + width, :]  # (KV, 1, w, H)
            scores = sgemm_fma(q[:, :, q0:q0 + rows, :], np.swapaxes(k_blk, -1, -2), alpha)
            if bias is not None:
                b = np.broadcast_to(bias, (kv_heads, group, seq, bias.shape[-1]))
                scores = np.add(scores, b[:, :, q0:q0 + rows, ir:ir + width], dtype=F32)
            kpos = ir + np.arange(width)[None, :]
            hidden = kpos > qpos
            if window >= 0:
                hidden = hidden | (kpos < np.maximum(qpos + 1 - window, 0))
            scores = np.where(hidden, LOWEST, scores).astype(F32, copy=False)
            top = np.maximum.reduce(scores, axis=-1)  # (KV, G, rows)
            live = top != LOWEST
            m_old = m
            m = np.where(live, np.maximum(m, top), m).astype(F32, copy=False)
            e, sums = sum_exp(scores, -m[..., None])
            e = np.where(live[..., None], e, _ZERO).astype(F32, copy=False)
            if ir:
                diff = np.subtract(m_old, m, dtype=F32)
                grow = _expf_of(diff)
                denominator = np.where(live, np.add(np.multiply(grow, denominator, dtype=F32), sums, dtype=F32),
                                       denominator)
                acc = np.where(live[..., None], np.multiply(acc, grow[..., None], dtype=F32), acc)
            else:
                denominator = np.where(live, sums, denominator)
            v_blk = values[:, None, ir:ir + width, :]
            if rows == 1:
                acc = sgemm_m1(e, v_blk, acc if ir else None)
            else:
                acc = sgemm_fma(e, v_blk, _ONE, acc if ir else None)
        np.multiply(acc, _inverse(denominator)[..., None], out=out[:, :, q0:q0 + rows], dtype=F32)
    return out
