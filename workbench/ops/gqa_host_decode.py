"""GroupQueryAttention's one-token decode on the numpy backend, from views prepared once.

A decode loop calls the kernel with the very same query/key/value, cos/sin and
output arrays every step (a replayed launch passes the same ones), their contents
new; the caches and the position inputs may be new arrays (a growing cache, a
position computed by eager nodes). Everything that depends only on those arrays' geometry — the Q/K rows as
(head, half, feature) views, their half-swapped views, the output as
(kv head, group, feature), scratch for the rotated rows — is worked out once and
kept (`HostDecode.prepare`, held by `SameArrays`); a call then reads the position
and does the arithmetic, about twenty numpy calls, which is what the per-token cost
of this kernel is bound by on the CPU.

Attention is computed by the same operations, in the same order, as the general
one-token path of `group_query_attention` (scores scaled after the product,
max-subtracted softmax). The rotation is too (x·cos + swap(x)·(−sin, sin)) where
the cos/sin caches are computed at run time; where they are the model's constant
initializers it is one matrix product (`rotary_matrix`), which may round the last
bit differently. Where the plan asks for onnxruntime's rounding (float32), both are
onnxruntime's instead, as the general path computes them then: the rotation
`ort_float32.rotate_pair` (``exact_rotary``) and the attention MLAS's decode kernel
(`mlas_attention.decode_attention`, ``exact_attention``); on a growing cache, both
compiled, they and the presents are one compiled call (`HostDecode._grown`). Only the plain
configuration is taken here: full non-interleaved rotary or none, no softcap,
head sink or smooth softmax, and one float dtype throughout; anything else returns None
and goes the general way. An attention bias (a mask computed by the graph, new every
step) is read at each call, as the general path reads it.
"""

from __future__ import annotations

import numpy as np

from ..addresses import address
from . import mlas_jit
from .mlas_attention import decode_attention_function, kernel_reads_bias
from .ort_float32 import rotate_pair
from .registry import numpy_first_int
from .rotary_matrix import RotationMatrix

#: (-1, +1) down the halves axis; int8, so multiplying keeps the other operand's dtype
SIGNS = np.array([[-1], [1]], np.int8)


def _query_and_key_rows(query: np.ndarray, key: np.ndarray | None, q_hidden: int,
                        kv_hidden: int) -> np.ndarray | None:
    """query's head rows followed by key's, as one (heads + kv heads) x feature view
    where the two are adjacent in one buffer (packed QKV, or the views a Split of a
    fused projection gives), else None."""
    if key is None:
        return query.reshape(-1)[:q_hidden + kv_hidden]
    base = query.base  # numpy keeps the owner of a view's memory here (the fused projection's buffer, say)
    if not isinstance(base, np.ndarray) or key.base is not base or not base.flags.c_contiguous:
        return None
    start = address(query) - address(base)  # in bytes
    length = (q_hidden + kv_hidden) * query.itemsize
    if (address(key) != address(query) + q_hidden * query.itemsize or start < 0
            or start + length > base.nbytes or start % query.itemsize):
        return None
    return base.reshape(-1).view(np.uint8)[start:start + length].view(query.dtype)


def bias_rows(attention_bias: np.ndarray | None, num_heads: int) -> np.ndarray | None | bool:
    """One new token's attention bias as (heads | 1, width) rows (a view), None where
    there is none, False where its shape is not (1, heads | 1, 1, width):
    the one-token paths then do not apply."""
    if attention_bias is None:
        return None
    shape = attention_bias.shape
    if len(shape) != 4 or shape[0] != 1 or shape[2] != 1 or shape[1] not in (1, num_heads):
        return False
    return attention_bias[0, :, 0]


def caches_in(dtype: np.dtype, caches: tuple) -> bool:
    """Whether the past and present caches given (None: not preallocated) are all of
    `dtype`; the general path casts others."""
    return all(cache is None or cache.dtype == dtype for cache in caches)


def write_presents(outs: list, past_key: np.ndarray, past_value: np.ndarray, k_row: np.ndarray,
                   v_row: np.ndarray, present_shape: tuple, shared: list[bool], pos: int) -> list:
    """The present caches after one decode step (numpy): the new K/V rows written at
    `pos` of a buffer shared with the past, or past rows 0..pos-1, the new row and
    zeros after it in a present of its own (a growing cache's: exactly the past, then
    the new row: two slice copies, which take 0.7 of a concatenation's time on these
    small caches once the step's weight stream has left numpy's code out of cache).
    Into `outs[1:3]` where given."""
    present_len = present_shape[2]
    kept = min(past_key.shape[2], present_len, pos)
    appended = kept == past_key.shape[2] == pos == present_len - 1  # a growing cache
    presents = []
    for out, past, row, same in ((outs[1], past_key, k_row, shared[0]), (outs[2], past_value, v_row, shared[1])):
        if same:
            out[0, :, pos] = row
        else:
            if out is None:
                out = np.empty(present_shape, dtype=past.dtype)
            if appended:
                out[:, :, :pos] = past
                out[0, :, pos] = row
            else:
                out[:, :, :kept] = past[:, :, :kept]
                out[:, :, kept:] = 0
                out[0, :, pos] = row
        presents.append(out)
    return presents


class HostDecode:
    """The views and scratch of one set of arrays; `run` is one decode call."""

    __slots__ = ("alpha", "rotation", "rows", "halves", "swapped_halves", "pair", "rotated",
                 "rotated_rows", "swapped", "q", "k_rows", "v_rows", "out", "exact_rotary", "exact_attention",
                 "rotate_into", "grow_and_attend")

    @classmethod
    def prepare(cls, inputs: list, outs: list, *, num_heads: int, kv_heads: int, head_size: int,
                scale: float, rotary: bool, interleaved: bool,
                rotation: RotationMatrix | None, exact_rotary: bool = False,
                exact_attention: bool = False) -> HostDecode | None:
        """The prepared call for these arrays, or None where the plain configuration
        does not hold (the caller then takes the general one-token path)."""
        query, key, value = inputs[0], inputs[1], inputs[2]
        n_in = len(inputs)
        cos_cache = inputs[7] if n_in > 7 else None
        sin_cache = inputs[8] if n_in > 8 else None
        out = outs[0]
        ct = query.dtype
        q_hidden, kv_hidden = num_heads * head_size, kv_heads * head_size
        if (ct not in (np.float32, np.float64) or out is None or out.dtype != ct
                or out.shape != (1, 1, q_hidden) or not out.flags.c_contiguous
                or any(x is not None and x.dtype != ct for x in (key, value))
                or any(x is not None and not x.flags.c_contiguous for x in (query, key, value))):
            return None
        self = cls()
        self.alpha = ct.type(scale if scale != 0.0 else 1.0 / float(np.sqrt(head_size)))
        # onnxruntime's rounding applies to float32 only (the general path's condition too)
        exact_rotary = self.exact_rotary = exact_rotary and ct == np.float32
        # MLAS's rotation compiled (`mlas_jit`), chosen here once; None: the emulation
        self.rotate_into = mlas_jit.rotate_rows if exact_rotary and mlas_jit.available("rotate_rows") else None
        # MLAS's decode kernel (compiled or emulated: chosen here, once), or None
        self.exact_attention = decode_attention_function() if exact_attention and ct == np.float32 else None
        group = num_heads // kv_heads
        if key is None:
            v_rows = query.reshape(-1)[q_hidden + kv_hidden:q_hidden + 2 * kv_hidden]
        else:
            v_rows = value.reshape(-1)
        self.v_rows = v_rows.reshape(kv_heads, head_size)
        self.out = out.reshape(kv_heads, group, head_size)
        self.rotation = self.rows = self.halves = self.swapped_halves = self.pair = self.grow_and_attend = None
        if not rotary:
            self.rotated = self.rotated_rows = self.swapped = None
            self.q = query.reshape(-1)[:q_hidden].reshape(kv_heads, group, head_size)
            self.k_rows = (query.reshape(-1)[q_hidden:q_hidden + kv_hidden] if key is None
                           else key.reshape(-1)).reshape(kv_heads, head_size)
            return self
        if (interleaved or cos_cache is None or sin_cache is None or cos_cache.dtype != ct
                or sin_cache.dtype != ct or cos_cache.ndim != 2 or sin_cache.shape != cos_cache.shape
                or 2 * cos_cache.shape[1] != head_size):
            return None
        rows = num_heads + kv_heads
        half = head_size // 2
        source = _query_and_key_rows(query, key, q_hidden, kv_hidden)
        if source is None:  # two buffers: the rows are put side by side each call
            self.pair = (query.reshape(num_heads, head_size), key.reshape(kv_heads, head_size),
                         np.empty((rows, head_size), ct))
            source = self.pair[2]
        self.halves = source.reshape(rows, 2, half)
        self.swapped_halves = self.halves[:, ::-1]
        if not exact_rotary and rotation is not None and rotation.cos is cos_cache and rotation.sin is sin_cache:
            self.rotation, self.rows = rotation, source.reshape(rows, head_size)
        self.rotated = np.empty((rows, 2, half), ct)
        self.swapped = np.empty((rows, 2, half), ct)  # the elementwise form's scratch
        flat = self.rotated_rows = self.rotated.reshape(rows, head_size)
        self.q = flat[:num_heads].reshape(kv_heads, group, head_size)
        self.k_rows = flat[num_heads:]
        # onnxruntime's rounding throughout, compiled, on rows side by side in one buffer:
        # a growing cache's call is then one compiled call (`run`)
        self.grow_and_attend = mlas_jit.grow_and_attend if (
            self.rotate_into is not None and self.exact_attention is not None and self.pair is None
            and self.halves.flags.c_contiguous and self.v_rows.flags.c_contiguous and self.out.flags.c_contiguous
            and mlas_jit.available("grow_and_attend")) else None
        return self

    def grouped(self, rows: np.ndarray) -> np.ndarray:
        """`bias_rows`' (heads | 1, n) as the scores' (KV | 1, G | 1, n)."""
        kv_heads, group = self.out.shape[:2]
        if rows.shape[0] == 1:
            return rows.reshape(1, 1, rows.shape[-1])
        return rows.reshape(kv_heads, group, rows.shape[-1])

    def _grown(self, inputs: list, outs: list, present_shape: tuple, shared: list[bool], window: int,
               bias: np.ndarray | None, position: int, pos: int) -> list | None:
        """`run` for a growing cache (the past rows 0..pos-1, the presents one row longer,
        every row attended) in one compiled call (`mlas_jit.grow_and_attend`): the
        rotation, presents and attention of the steps below, bit for bit. None, with
        nothing written, where an array is not as that call takes it (the steps below
        then run)."""
        past_key, past_value, cos, sin = inputs[3], inputs[4], inputs[7], inputs[8]
        if shared[0] or shared[1] or 0 < window <= pos or not (
                past_key.flags.c_contiguous and past_value.flags.c_contiguous and past_value.shape == past_key.shape
                and cos.flags.c_contiguous and sin.flags.c_contiguous):
            return None
        if bias is not None:
            bias = self.grouped(bias.astype(np.float32, copy=False))
            if not kernel_reads_bias(bias, self.q.shape, pos + 1):
                return None
            if not bias.flags.c_contiguous:  # a head's mask row of a wider bias: the kernel reads rows whole
                bias = bias.copy()
        presents = []
        for out in outs[1:3]:
            if out is None:
                out = np.empty(present_shape, np.float32)
            elif out.shape != present_shape or out.dtype != np.float32 or not out.flags.c_contiguous:
                return None
            presents.append(out)
        self.grow_and_attend(self.halves, cos, sin, position, self.rotated, past_key[0], past_value[0], self.k_rows,
                             self.v_rows, presents[0][0], presents[1][0], self.q, self.alpha, self.out, bias)
        return [outs[0], presents[0], presents[1]] + [None] * (len(outs) - 3)

    def run(self, inputs: list, outs: list, present_shape: tuple, shared: list[bool], window: int,
            bias: np.ndarray | None = None) -> list | None:
        """One call, on caches in the compute dtype (`caches_in`): rotate, write the new K/V row at
        pos = seqlens_k[0], attend over rows 0..pos (the last `window` of them, for a
        positive local window) with `bias` (`bias_rows`) added to the scores, into the
        output buffer. None, with nothing written, where onnxruntime's rounding is asked
        and the bias is narrower than the rows attended (the general path pads it)."""
        past_key, past_value, seqlens_k = inputs[3], inputs[4], inputs[5]
        position_ids = inputs[9] if len(inputs) > 9 else None
        exact_rotary, exact_attention = self.exact_rotary, self.exact_attention  # flags `prepare` fixed
        p = numpy_first_int(seqlens_k)  # read every call: a recorded launch re-runs the kernel each replay
        present_len = present_shape[2]
        pos = min(max(p, 0), present_len - 1)
        if bias is not None and exact_attention and bias.shape[-1] <= pos:
            return None
        if self.halves is not None:
            cos, sin = inputs[7], inputs[8]  # read at each call: a graph may compute them every step
            if (cos.dtype != self.rotated.dtype or cos.ndim != 2 or sin.shape != cos.shape or sin.dtype != cos.dtype
                    or cos.shape[1] != self.rotated.shape[2]):
                return None
            r = p if position_ids is None else numpy_first_int(position_ids)
            r = min(max(r, 0), cos.shape[0] - 1)
            if self.grow_and_attend is not None and past_key.shape[2] == pos == present_len - 1:
                done = self._grown(inputs, outs, present_shape, shared, window, bias, r, pos)
                if done is not None:
                    return done
            if self.pair is not None:
                np.concatenate(self.pair[:2], out=self.pair[2])
            if exact_rotary:  # MLAS's rotary kernel's rounding
                if self.rotate_into is not None:
                    self.rotate_into(self.halves, cos, sin, r, self.rotated)
                else:
                    real, imag = rotate_pair(self.halves[:, 0], self.halves[:, 1], cos[r], sin[r])
                    self.rotated[:, 0] = real
                    self.rotated[:, 1] = imag
            elif self.rotation is not None and self.rotation.cos is cos and self.rotation.sin is sin:
                # the model's constant caches: one product (`rotary_matrix`)
                np.matmul(self.rows, self.rotation.at(r), out=self.rotated_rows)
            else:
                np.multiply(self.halves, cos[r], out=self.rotated)
                np.multiply(self.swapped_halves, sin[r] * SIGNS, out=self.swapped)
                np.add(self.rotated, self.swapped, out=self.rotated)

        presents = write_presents(outs, past_key, past_value, self.k_rows, self.v_rows, present_shape, shared, pos)

        if exact_attention:  # every row 0..pos, the window's masked as onnxruntime masks them
            total = pos + 1
            if bias is not None:  # its whole width: the kernel reads its first `total` columns
                bias = self.grouped(bias.astype(np.float32, copy=False))
            exact_attention(self.q, presents[0][0], presents[1][0], self.alpha,
                            total - window if 0 < window < total else 0, bias, out=self.out, total=total)
            return [outs[0], presents[0], presents[1]] + [None] * (len(outs) - 3)
        start = max(pos - window + 1, 0) if window > 0 else 0
        scores = np.matmul(self.q, presents[0][0, :, start:pos + 1].transpose(0, 2, 1))
        scores *= self.alpha  # [KV, G, n]
        if bias is not None and bias.shape[-1] > start:  # its first columns; past them zeros, as the general path
            columns = self.grouped(bias[:, start:pos + 1])
            scores[..., :columns.shape[-1]] += columns.astype(scores.dtype, copy=False)
        scores -= np.maximum.reduce(scores, axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= np.add.reduce(scores, axis=-1, keepdims=True)
        np.matmul(scores, presents[1][0, :, start:pos + 1], out=self.out)
        return [outs[0], presents[0], presents[1]] + [None] * (len(outs) - 3)
