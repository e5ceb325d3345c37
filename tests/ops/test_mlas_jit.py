"""The compiled twins of onnxruntime's float32 arithmetic (`workbench.ops.mlas_jit`) are
their numpy emulations bit for bit (`ort_float32.logistic_emulated`,
`mlas_attention.decode_attention_emulated`), for both MLAS sum-exp kernels (FMA3 and
AVX-512F) whatever this CPU is; the emulations are held to onnxruntime in
test_norm_sigmoid_exact.py and test_gqa_mlas_exact.py, which run both forms.

Six runs each on one input array refilled in place: activations across the logistic's
clamps, signed zeros, infinities and NaN; decode attention at SmolLM2's layout and
around it (head sizes 64, 128, 13 and 4: no 8-lane body), one to 300 keys, a local
window, a fully masked row, huge score spreads (exps that underflow to subnormals on
AVX-512).
"""

from __future__ import annotations

import numpy as np
import pytest

from workbench.ops import mlas_attention, mlas_isa, mlas_jit, ort_float32

RUNS = 6


def _same_bits(got, want) -> None:
    np.testing.assert_array_equal(np.asarray(got).view(np.int32), np.asarray(want).view(np.int32))


@pytest.mark.parametrize("upper_clamp", [False, True])
def test_compiled_logistic_is_the_emulation_bit_for_bit(upper_clamp):
    assert mlas_jit.available("logistic")
    r = np.random.default_rng(int(upper_clamp))
    x = np.empty(3000, np.float32)
    out = np.empty_like(x)
    for run in range(RUNS):
        x[...] = r.standard_normal(x.size) * (10.0 ** (run % 3 - 1)) * (1 + 8 * (run == 5))
        x[:12] = [18.0, -18.0, 17.99, 18.01, 0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -88.0, 88.0]
        mlas_jit.logistic(x, out, upper_clamp)
        want = ort_float32.logistic_emulated(x, upper_clamp=upper_clamp)
        _same_bits(out, want)


CASES = [  # kv heads, group, keys, head size, window start
    (3, 3, 1, 64, 0), (3, 3, 37, 64, 0), (3, 3, 300, 64, 0), (3, 3, 40, 64, 12), (2, 4, 17, 128, 0),
    (1, 2, 9, 13, 3), (2, 1, 5, 4, 0), (1, 1, 16, 8, 0),
]


@pytest.mark.parametrize("kernel", ["fma3", "avx512"])
@pytest.mark.parametrize(("kv", "group", "keys", "head", "window"), CASES)
def test_compiled_decode_attention_is_the_emulation_bit_for_bit(kv, group, keys, head, window, kernel, monkeypatch):
    assert mlas_jit.available("decode_attention")
    wide = "avx512" if kernel == "avx512" else "avx2"
    monkeypatch.setattr(mlas_isa, "isa", lambda: wide)
    monkeypatch.setattr(mlas_attention, "isa", lambda: wide)
    r = np.random.default_rng([kv, group, keys, head, window, kernel == "avx512"])
    q = np.empty((kv, group, head), np.float32)
    cache_k = np.empty((kv, keys + 7, head), np.float32)  # the rows a step reads are a view of a longer cache
    cache_v = np.empty_like(cache_k)
    out = np.empty((kv, group, head), np.float32)
    for run in range(RUNS):
        spread = (1.0, 3.0, 30.0)[run % 3]  # 30: most exps underflow, some to subnormals
        q[...] = r.standard_normal(q.shape) * spread
        cache_k[...] = r.standard_normal(cache_k.shape) * spread
        cache_v[...] = r.standard_normal(cache_v.shape)
        keys_, values = cache_k[:, :keys], cache_v[:, :keys]
        start = keys if run == 4 else window  # run 4: every key masked, zeros
        want = mlas_attention.decode_attention_emulated(q, keys_, values, 0.125, start)
        whole = mlas_jit.decode_attention(q, cache_k, cache_v, 0.125, start, out, total=keys)
        assert whole is out
        _same_bits(out, want)
        got = mlas_jit.decode_attention(q, keys_, values, 0.125, start, out)  # a view of the rows: copied
        assert got is out
        _same_bits(out, want)


@pytest.mark.parametrize("kernel", ["fma3", "avx512"])
@pytest.mark.parametrize("per_head", [False, True], ids=["one bias row", "a row per head"])
def test_compiled_decode_attention_adds_a_bias_as_the_emulation(kernel, per_head, monkeypatch):
    """An attention bias (a graph's causal mask: zeros and float32's lowest, or any
    values), broadcast from one row or one per head, wider than the keys read, as the
    prepared decode passes it (`bias[0, :, 0]`)."""
    wide = "avx512" if kernel == "avx512" else "avx2"
    monkeypatch.setattr(mlas_isa, "isa", lambda: wide)
    monkeypatch.setattr(mlas_attention, "isa", lambda: wide)
    kv, group, keys, head = 2, 3, 29, 16
    r = np.random.default_rng([kv, group, keys, head, per_head, kernel == "avx512"])
    q = np.empty((kv, group, head), np.float32)
    cache_k = np.empty((kv, keys, head), np.float32)
    cache_v = np.empty_like(cache_k)
    mask = np.empty((1, kv * group if per_head else 1, 1, keys + 5), np.float32)
    out = np.empty((kv, group, head), np.float32)
    for run in range(RUNS):
        q[...] = r.standard_normal(q.shape) * 3
        cache_k[...] = r.standard_normal(cache_k.shape) * 3
        cache_v[...] = r.standard_normal(cache_v.shape)
        mask[...] = r.standard_normal(mask.shape) * (0 if run % 2 else 2)
        mask[..., keys - run - 1:] = np.finfo(np.float32).min  # the later keys masked out
        rows = mask[0, :, 0]  # wider than the keys: the kernel reads its first `keys` columns
        bias = rows.reshape(kv, group, -1) if per_head else rows.reshape(1, 1, -1)
        window = 3 if run == 5 else 0
        want = mlas_attention.decode_attention_emulated(q, cache_k, cache_v, 0.125, window, bias[..., :keys])
        got = mlas_jit.decode_attention(q, cache_k, cache_v, 0.125, window, out, bias, total=keys)
        _same_bits(out, want)
        assert got is out


def test_compiled_rotation_is_the_emulation_bit_for_bit():
    """MLAS's rotary embedding of non-interleaved halves (fma(x1, cos, -(x2 sin)),
    fma(x1, sin, x2 cos)), rows as the prepared decode holds them ((rows, 2, half)), by
    one row of the cos/sin caches; a strided output is written through a copy."""
    assert mlas_jit.available("rotate_rows")
    r = np.random.default_rng(21)
    halves = np.empty((12, 2, 32), np.float32)  # rows x (first, second half) x half
    rotated = np.empty_like(halves)
    wide = np.empty((12, 2, 40), np.float32)
    for run in range(RUNS):
        halves[...] = r.standard_normal(halves.shape) * (10.0 ** (run % 3))
        angles = r.uniform(0, 2 * np.pi, (7, 32))
        cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
        position = run % 7
        into = rotated if run % 2 else wide[:, :, :32]
        mlas_jit.rotate_rows(halves, cos, sin, position, into)
        real, imag = ort_float32.rotate_pair(halves[:, 0], halves[:, 1], cos[position], sin[position])
        _same_bits(into[:, 0], real)
        _same_bits(into[:, 1], imag)


@pytest.mark.parametrize("n", [16, 17, 23, 24, 28, 64, 576, 1536, 1539])
def test_compiled_sum_of_squares_is_the_emulation_bit_for_bit(n):
    """onnxruntime's RMS-norm sum of squares (8 fma lanes, folded, then 4 plain squares
    where 4 are left, then fmas), rows of every tail length."""
    assert mlas_jit.available("sum_of_squares")
    r = np.random.default_rng(n)
    rows = np.empty((4, n), np.float32)
    for run in range(RUNS):
        rows[...] = r.standard_normal(rows.shape) * (10.0 ** (run % 3 - 1))
        _same_bits(mlas_jit.sum_of_squares(rows), ort_float32.sum_of_squares_emulated(rows))


def test_each_compiled_decode_kernel_has_one_signature_that_takes_read_only_and_strided_arrays():
    """The rotation and the decode kernel are compiled once, for C-contiguous arrays,
    their inputs read-only (an initializer's cos/sin caches are): a read-only cache, a
    strided view (copied by the wrapper) and a writable array all run on that one
    signature, never compiling another mid-decode."""
    assert mlas_jit.available("rotate_rows") and mlas_jit.available("decode_attention")
    r = np.random.default_rng(8)
    cos, sin = (r.uniform(-1, 1, (6, 8)).astype(np.float32) for _ in range(2))
    cos.flags.writeable = sin.flags.writeable = False
    halves = r.standard_normal((4, 2, 8)).astype(np.float32)
    rotated = np.empty_like(halves)
    mlas_jit.rotate_rows(halves, cos, sin, 3, rotated)
    mlas_jit.rotate_rows(np.ascontiguousarray(np.broadcast_to(halves, (4, 2, 8))), cos.copy(), sin, 1, rotated)
    keys = r.standard_normal((2, 9, 8)).astype(np.float32)
    keys.flags.writeable = False
    q, out = r.standard_normal((2, 3, 8)).astype(np.float32), np.empty((2, 3, 8), np.float32)
    mlas_jit.decode_attention(q, keys, keys, 0.25, 0, out, total=5)
    mlas_jit.decode_attention(q, keys[:, ::2], keys[:, ::2], 0.25, 0, out)
    kernels = mlas_jit._kernels()
    assert len(kernels.rotate_rows.overloads) == 1
    assert len(kernels.decode_attention.overloads) == 1


@pytest.mark.parametrize("n", [5, 16, 27, 576])
def test_compiled_norm_rows_are_the_numpy_forms_bit_for_bit(n):
    """SkipSimplifiedLayerNormalization's row (its sum written over x's own buffer, as a
    decode's in-place sum is) and the RMS norm's rows (fma8 from 16 elements, a plain
    sum and a division below), against their numpy forms, 6 runs."""
    from workbench.ops.contrib_norm import row_rms
    from workbench.ops.normalization import _rms_norm_as_onnxruntime

    assert mlas_jit.available("skip_rms_row") and mlas_jit.available("rms_rows")
    r = np.random.default_rng(n)
    x, skip, gamma, y = (np.empty(n, np.float32) for _ in range(4))
    rows, rows_y, inv = np.empty((3, n), np.float32), np.empty((3, n), np.float32), np.empty(3, np.float32)
    hidden, eps = np.float32(n), np.float32(1e-5)
    for run in range(RUNS):
        spread = 10.0 ** (run % 3 - 1)
        x[...], skip[...] = r.standard_normal((2, n)) * spread
        gamma[...] = r.standard_normal(n)
        want_s = np.add(x, skip, dtype=np.float32)
        want_y = np.multiply(np.divide(want_s, row_rms(want_s, np.empty(n, np.float32), (hidden, eps), np.dtype(np.float32))),
                             gamma, dtype=np.float32)
        mlas_jit.skip_rms_row(x, skip, gamma, hidden, eps, x, y)  # the sum into x itself
        _same_bits(x, want_s)
        _same_bits(y, want_y)
        rows[...] = r.standard_normal(rows.shape) * spread
        want_rows, want_inv = _rms_norm_as_onnxruntime(rows, gamma, (-1,), eps, None,
                                                       ort_float32.sum_of_squares_emulated)
        mlas_jit.rms_rows(rows, gamma, eps, rows_y, inv)
        _same_bits(rows_y, want_rows)
        _same_bits(inv, want_inv.reshape(-1))


def test_growing_cache_call_is_the_three_steps_bit_for_bit():
    """`grow_and_attend`: the rotation, a growing cache's presents (past rows, then the
    new row) and the attention over every row in one compiled call give the bits of
    `rotate_rows`, numpy's row copies and `decode_attention` one after another. Eight
    steps of a cache growing from 1 row, the QKV rows refilled in place, a bias on odd
    steps, read-only cos/sin caches (an initializer's); compiled once, one signature."""
    assert mlas_jit.available("grow_and_attend")
    r = np.random.default_rng(41)
    kv, group, head = 3, 3, 64
    rows, half = kv * group + kv, head // 2
    halves = np.empty((rows, 2, half), np.float32)  # the packed Q and K rows, refilled in place
    v_rows = np.empty((kv, head), np.float32)
    angles = r.uniform(0, 2 * np.pi, (16, half))
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    cos.flags.writeable = sin.flags.writeable = False
    past_k = r.standard_normal((kv, 1, head)).astype(np.float32)
    past_v = r.standard_normal((kv, 1, head)).astype(np.float32)
    for run in range(RUNS + 2):
        halves[...] = r.standard_normal(halves.shape) * 3
        v_rows[...] = r.standard_normal(v_rows.shape)
        length = past_k.shape[1]
        bias = (r.standard_normal((1, group, length + 3)) * 2).astype(np.float32) if run % 2 else None
        results = []
        for fused in (True, False):
            rotated = np.empty_like(halves)
            flat = rotated.reshape(rows, head)
            q, k_rows = flat[:kv * group].reshape(kv, group, head), flat[kv * group:]
            present_k, present_v = (np.empty((kv, length + 1, head), np.float32) for _ in range(2))
            out = np.empty((kv, group, head), np.float32)
            if fused:
                mlas_jit.grow_and_attend(halves, cos, sin, run, rotated, past_k, past_v, k_rows, v_rows,
                                         present_k, present_v, q, np.float32(0.125), out, bias)
            else:
                mlas_jit.rotate_rows(halves, cos, sin, run, rotated)
                present_k[:, :length], present_v[:, :length] = past_k, past_v
                present_k[:, length], present_v[:, length] = k_rows, v_rows
                mlas_jit.decode_attention(q, present_k, present_v, 0.125, 0, out, bias)
            results.append((rotated, present_k, present_v, out))
        for got, want in zip(*results):
            _same_bits(got, want)
        past_k, past_v = results[0][1], results[0][2]
    assert len(mlas_jit._kernels().grow_and_attend.overloads) == 1
