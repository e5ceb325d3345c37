"""GroupQueryAttention's one-token decode path (`OneTokenDecode`): batch 1, one new
token, a past and both presents, with the checks it keeps per node between calls.

K/V go straight into the present buffer at pos = seqlens_k[0]. In the host variant the
position is read on the host at every call (`numpy_first_int`) and attention runs over
rows 0..pos only, through the prepared call (`gqa_host_decode.HostDecode`) where the
configuration is plain. On a device backend the position stays on the device and
attention masks the rows past it. Either agrees with the general path
(`group_query_attention.general_attention`) to float32 rounding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..addresses import SameArrays, items_at
from . import mlas_attention
from .attention_math import _clamp, _first_int, _host_int, _overlap, _same_buffer
from .contrib import F32, compute_dtype, emit
from .gqa_host_decode import HostDecode, bias_rows, caches_in, write_presents
from .registry import numpy_first_int
from .rotary import _rotate_rows
from .rotary_matrix import RotationMatrix, rotation_matrix

if TYPE_CHECKING:
    from .group_query_attention import GqaAttributes

#: `write_presents`' flags for a present in a buffer of its own, key's and value's
NOT_SHARED = (False, False)


def total_length(const_total: int | None, total_tensor: Any) -> int:
    """total_sequence_length: the constant input's value, else read on the host."""
    return const_total if const_total is not None else _host_int(total_tensor)


class CacheSetup(NamedTuple):
    """What `OneTokenDecode.cache_setup` found the past/present caches to be."""

    head_size: int
    past_len: int
    present_len: int
    present_shape: tuple
    #: per present (key, value): whether it is its past's very buffer
    shared: list
    #: present_len came from total_sequence_length's value (no present buffer given)
    read_total: bool


class OneTokenDecode:
    """The one-token decode of one node: `decode_token(inputs, outs)` gives the general
    path's result (Q/K rotated with the one cos/sin row, K/V written at pos, attention
    over rows 0..pos), or None where the path does not apply.

    The checks' outcome is a function of the arrays' shapes and addresses only, so it is
    kept (`checked`) for the very same input and output arrays as the last call (a
    replayed launch passes the same ones every step); with new caches only, only their
    checks are redone (`steady`). The node's attributes are copied to fields of its own:
    this runs once per layer per token, where each lookup counts."""

    __slots__ = ("xp", "host", "num_heads", "kv_num_heads", "group", "scale", "softcap", "local_window",
                 "do_rotary", "interleaved", "smooth_softmax", "dtype", "const_total", "used_present",
                 "used_qk", "plain_host", "decode_rotary", "decode_attention", "initializers", "checked",
                 "steady", "getters")

    def __init__(self, attrs: GqaAttributes, *, xp: Any, host: bool, dtype: np.dtype | None,
                 const_total: int | None, used_present: tuple, used_qk: bool, plain_host: bool,
                 decode_rotary: bool, decode_attention: bool, initializers: dict) -> None:
        self.xp, self.host = xp, host
        self.num_heads, self.kv_num_heads, self.group = attrs.num_heads, attrs.kv_num_heads, attrs.group
        self.scale, self.softcap, self.local_window = attrs.scale, attrs.softcap, attrs.local_window
        self.do_rotary, self.interleaved = attrs.do_rotary, attrs.interleaved
        self.smooth_softmax = attrs.smooth_softmax
        self.dtype, self.const_total = dtype, const_total
        self.used_present, self.used_qk = used_present, used_qk
        #: numpy, no softcap or smooth softmax: `HostDecode` may serve the call
        self.plain_host = plain_host
        #: onnxruntime's rounding (MLAS's rotary kernel / decode attention kernel)
        self.decode_rotary, self.decode_attention = decode_rotary, decode_attention
        self.initializers = initializers  # the node's initializer inputs, by position
        #: the last call's (CacheSetup, HostDecode | None), for the very same arrays
        self.checked = SameArrays()
        # what holds for the arrays other than the past/present caches (a growing cache's
        # are new every step; these are not): (head size, HostDecode | None)
        self.steady = SameArrays()
        self.getters: dict = {}  # (inputs, outputs) -> items_at of the arrays `steady` is kept for

    def decode_token(self, inputs: list, outs: list) -> list | None:
        """The one-token path's result, or None where it does not apply. An attention bias
        (a mask the graph computes, new every step) is read at every call."""
        bias = bias_rows(inputs[10], self.num_heads) if len(inputs) > 10 else None
        if bias is False:
            return None
        kept = self.checked.kept_for(inputs, outs)
        if kept is None:
            return self.decode_new_arrays(inputs, outs, bias)
        setup, plan = kept
        if plan:
            result = plan.run(inputs, outs, setup.present_shape, setup.shared, self.local_window, bias)
            if result is not None:
                return result
        return self.decode_with(inputs, outs, setup)

    def decode_new_arrays(self, inputs: list, outs: list, bias: Any) -> list | None:
        """`decode_token` for other arrays than the last call's: the checks redone (only
        the caches' where the other arrays are the steady ones) and kept where they may
        hold for the next call."""
        fixed_in, fixed_out = self.fixed_arrays(len(inputs), len(outs))
        fixed_inputs, fixed_outs = fixed_in(inputs), fixed_out(outs)
        fixed = self.steady.kept_for(fixed_inputs, fixed_outs)
        if fixed is not None:
            head_size, plan = fixed
            if head_size and not self.rotary_fits(inputs, head_size):
                return None
            if plan and self.grown(inputs, outs, head_size, plan.out.dtype):
                self.checked.keep(inputs, outs, None)  # nothing of a growing cache's call is kept
                present_shape = (1, self.kv_num_heads, inputs[3].shape[2] + 1, head_size)
                return plan.run(inputs, outs, present_shape, NOT_SHARED, self.local_window, bias)
        else:
            head_size = self.steady_head_size(inputs, outs)
            plan = self.host_plan(inputs, outs, head_size) if head_size and self.plain_host else None
            self.steady.keep(fixed_inputs, fixed_outs, (head_size, plan))
        setup = self.cache_setup(inputs, outs, head_size) if head_size else None
        if plan and (setup is None or not caches_in(plan.out.dtype, (inputs[3], inputs[4], outs[1], outs[2]))):
            plan = None
        # not kept: a setup that read total_sequence_length's value (that may change), nor
        # one for a growing cache (the next call has new caches; holding these would keep
        # a spent past alive per layer)
        keep = (setup is not None and not setup.read_total
                and not (setup.present_len > setup.past_len and not any(setup.shared)))
        self.checked.keep(inputs, outs, (setup, plan) if keep else None)
        if setup is None:
            return None
        if plan:
            result = plan.run(inputs, outs, setup.present_shape, setup.shared, self.local_window, bias)
            if result is not None:
                return result
        return self.decode_with(inputs, outs, setup)

    def fixed_arrays(self, n_in: int, n_out: int) -> tuple:
        """Getters of the arrays other than the caches, the position inputs, the cos/sin
        caches and the attention bias (computed in the graph, those may be new arrays
        every step), one C call each."""
        found = self.getters.get((n_in, n_out))
        if found is None:
            found = self.getters[(n_in, n_out)] = (items_at([0, 1, 2, *range(11, n_in)]),
                                                   items_at([0, *range(3, n_out)]))
        return found

    def rotary_fits(self, inputs: list, head_size: int) -> bool:
        """Whether the cos/sin caches suit the one-token path (`steady_head_size`'s
        check, for caches that may be new arrays every step)."""
        if not self.do_rotary:
            return True
        cos_cache = inputs[7] if len(inputs) > 7 else None
        sin_cache = inputs[8] if len(inputs) > 8 else None
        return cos_cache is not None and sin_cache is not None and 2 * cos_cache.shape[1] <= head_size

    def grown(self, inputs: list, outs: list, head_size: int, dtype: np.dtype) -> bool:
        """Whether the caches are a growing cache's, as its decode loop and the executor
        hand them over: past key and value (1, kv heads, L, head), presents one row
        longer, all four of `dtype`; the presents each owning its memory and the pasts
        owning theirs or views of an array that does (a fixed cache's rows 0..L-1)
        other than the presents, so no present overlaps another or a past (numpy's
        views name the array owning their memory as their base). `cache_setup` then
        finds (L, L + 1, not shared), without reading an address."""
        past_key, past_value = inputs[3], inputs[4]
        out_k, out_v = outs[1], outs[2]
        if (type(past_key) is not np.ndarray or type(past_value) is not np.ndarray
                or type(out_k) is not np.ndarray or type(out_v) is not np.ndarray
                or out_k.base is not None or out_v.base is not None
                or past_key is past_value or out_k is out_v or inputs[5].size != 1):
            return False
        for past in (past_key, past_value):
            base = past.base
            if base is not None and (type(base) is not np.ndarray or base.base is not None
                                     or base is out_k or base is out_v):
                return False
        kv_num_heads = self.kv_num_heads
        shape = past_key.shape
        present = (1, kv_num_heads, shape[2] + 1, head_size) if len(shape) == 4 else None
        return (shape == (1, kv_num_heads, shape[2], head_size) == past_value.shape
                and out_k.shape == present == out_v.shape
                and past_key.dtype == past_value.dtype == out_k.dtype == out_v.dtype == dtype)

    def rotation_of(self, inputs: list) -> RotationMatrix | None:
        """The shared rotation matrix of the model's own cos/sin caches (initializers, never
        written); None for caches computed or fed at run time, whose contents may change."""
        n_in = len(inputs)
        cos_cache, sin_cache = (inputs[7], inputs[8]) if n_in > 8 else (None, None)
        if (cos_cache is None or cos_cache is not self.initializers.get(7)
                or sin_cache is not self.initializers.get(8)):
            return None
        return rotation_matrix(cos_cache, sin_cache)

    def host_plan(self, inputs: list, outs: list, head_size: int) -> HostDecode | None:
        """The prepared numpy call for these arrays (no head sink), or None."""
        if len(inputs) > 11 and inputs[11] is not None:
            return None
        return HostDecode.prepare(inputs, outs, num_heads=self.num_heads, kv_heads=self.kv_num_heads,
                                  head_size=head_size, scale=self.scale, rotary=self.do_rotary,
                                  interleaved=self.interleaved,
                                  rotation=None if self.decode_rotary else self.rotation_of(inputs),
                                  exact_rotary=self.decode_rotary, exact_attention=self.decode_attention)

    def steady_head_size(self, inputs: list, outs: list) -> int | None:
        """The head size when the one-token path applies to the arrays other than the
        caches, else None."""
        n_in, n_out = len(inputs), len(outs)
        query = inputs[0]
        if n_in < 7 or n_out < 3 or query.shape[0] != 1 or query.shape[1] != 1:
            return None
        num_heads, kv_num_heads = self.num_heads, self.kv_num_heads
        key, value = inputs[1], inputs[2]
        cos_cache = inputs[7] if n_in > 7 else None
        sin_cache = inputs[8] if n_in > 8 else None
        if any(extra is not None for extra in inputs[14:17]):  # q/k norm (the general path rejects them), query_seqlens
            return None
        if n_out > 3 and (outs[3] is not None or self.used_qk):
            return None
        if key is None:
            head_size = query.shape[2] // (num_heads + 2 * kv_num_heads)
        else:
            head_size = query.shape[2] // num_heads
            if (value is None or key.shape != (1, 1, kv_num_heads * head_size)
                    or value.shape != key.shape):
                return None
        if self.do_rotary and (cos_cache is None or sin_cache is None or 2 * cos_cache.shape[1] > head_size):
            return None
        return head_size

    def cache_setup(self, inputs: list, outs: list, head_size: int) -> CacheSetup | None:
        """The caches' setup when they suit the one-token path, else None."""
        past_key, past_value, seqlens_k, total_tensor = inputs[3:7]
        if past_key is None or past_value is None or seqlens_k.size != 1:
            return None
        out_k, out_v = outs[1], outs[2]
        if (out_k is None and not self.used_present[0]) or (out_v is None and not self.used_present[1]):
            return None
        kv_num_heads = self.kv_num_heads
        cache_shape = past_key.shape
        past_len = cache_shape[2]
        if (past_value.shape != cache_shape or cache_shape[0] != 1 or cache_shape[1] != kv_num_heads
                or cache_shape[3] != head_size):
            return None
        read_total = out_k is None and out_v is None
        if out_v is not None:
            present_len = out_v.shape[2]
        elif out_k is not None:
            present_len = out_k.shape[2]
        else:
            present_len = max(total_length(self.const_total, total_tensor), past_len)
        if present_len < 1:
            return None
        present_shape = (1, kv_num_heads, present_len, head_size)
        shared = []
        for out, past in ((out_k, past_key), (out_v, past_value)):
            if out is None:
                shared.append(False)
                continue
            if out.shape != present_shape:
                return None
            same = _same_buffer(out, past)
            if not same and (_overlap(out, past_key) or _overlap(out, past_value)):
                return None
            shared.append(same)
        return CacheSetup(head_size, past_len, present_len, present_shape, shared, read_total)

    def decode_with(self, inputs: list, outs: list, setup: CacheSetup) -> list:
        """`decode_token`'s computation, once its setups have checked the arrays."""
        xp, host = self.xp, self.host
        num_heads, kv_num_heads, head_size = self.num_heads, self.kv_num_heads, setup.head_size
        n_in, n_out = len(inputs), len(outs)
        query, key, value, past_key, past_value, seqlens_k = inputs[:6]
        cos_cache = inputs[7] if n_in > 7 else None
        sin_cache = inputs[8] if n_in > 8 else None
        position_ids = inputs[9] if n_in > 9 else None
        attention_bias = inputs[10] if n_in > 10 else None
        head_sink = inputs[11] if n_in > 11 else None
        out_k, out_v = outs[1], outs[2]

        # The position pos = seqlens_k[0] stays where the backend computes (a (1,) array):
        # the new K/V row is scattered to it and attention masks the rows after it, so
        # nothing is read on the host and a captured graph replays with every step's
        # value. (A seqlens_k outside 0..present_len-1 is no decode step; it is clamped.)
        ct = compute_dtype(query.dtype)
        qdt = query.dtype
        cache_dtype = past_key.dtype
        q_hidden, kv_hidden = num_heads * head_size, kv_num_heads * head_size
        if key is None:
            flat = query.reshape(-1)
            q_rows = flat[:q_hidden + kv_hidden].reshape(num_heads + kv_num_heads, head_size)
            v_row = flat[q_hidden + kv_hidden:q_hidden + 2 * kv_hidden].reshape(kv_num_heads, head_size)
        else:
            q_rows = query.reshape(num_heads, head_size)
            v_row = value.reshape(kv_num_heads, head_size)
        if self.do_rotary:
            if host:  # the row itself, a view (the position read on the host, as below)
                p = numpy_first_int(seqlens_k if position_ids is None else position_ids)
                p = min(max(p, 0), cos_cache.shape[0] - 1)
                c, sn = cos_cache[p], sin_cache[p]
            else:
                p = _first_int(xp, seqlens_k) if position_ids is None else _first_int(xp, position_ids)
                p = _clamp(xp, p, 0, cos_cache.shape[0] - 1)
                c, sn = xp.take(cos_cache, p, axis=0)[0], xp.take(sin_cache, p, axis=0)[0]
            if key is not None:
                q_rows = xp.concatenate((q_rows, key.reshape(kv_num_heads, head_size)))
            if c.dtype != ct:
                c, sn = c.astype(ct), sn.astype(ct)
            qk = _rotate_rows(xp, q_rows.astype(ct, copy=False), c, sn, 2 * c.shape[0], self.interleaved,
                              self.decode_rotary, host)
            if qdt != ct:  # onnxruntime stores the rotated Q/K in T
                qk = qk.astype(qdt).astype(ct)
            q, k_row = qk[:num_heads], qk[num_heads:]
        else:
            q = q_rows[:num_heads].astype(ct, copy=False)
            k_row = q_rows[num_heads:] if key is None else key.reshape(kv_num_heads, head_size)

        if host:
            return self.attend_on_host_position(inputs, outs, q, k_row, v_row, setup.present_shape, setup.shared,
                                                ct)
        present_len, present_shape, shared = setup.present_len, setup.present_shape, setup.shared
        pos = _clamp(xp, _first_int(xp, seqlens_k), 0, present_len - 1)  # [1]
        slots = xp.arange(present_len, dtype=np.int64)  # [L]

        # the present caches: rows 0..pos-1 from past, the new row at pos, zeros after
        # (a shared buffer keeps its other rows)
        presents = []
        kept = min(setup.past_len, present_len)
        before = (slots[:kept] < pos)[None, None, :, None]
        for out, past, row, same in ((out_k, past_key, k_row, shared[0]),
                                     (out_v, past_value, v_row, shared[1])):
            if not same:
                if out is None:
                    out = xp.empty(present_shape, dtype=cache_dtype)
                out[:, :, :kept] = xp.where(before, past[:, :, :kept], cache_dtype.type(0))
                if kept < present_len:
                    out[:, :, kept:] = 0
            out[0][:, pos] = row.reshape(kv_num_heads, 1, head_size)
            presents.append(out)

        allowed = slots <= pos  # [L]
        if self.local_window > 0:
            allowed = allowed & (slots > pos - self.local_window)
        bias = None
        if attention_bias is not None:
            bias = attention_bias[0, :, 0, :min(attention_bias.shape[3], present_len)]
        out = self.attend_one_token(q, presents[0][0], presents[1][0], bias, allowed, head_sink, outs[0], ct)
        return [out, presents[0], presents[1]] + [None] * (n_out - 3)

    def attend_on_host_position(self, inputs: list, outs: list, q: Any, k_row: Any, v_row: Any,
                                present_shape: tuple, shared: list, ct: np.dtype) -> list:
        """The one-token path's second half on the numpy backend: pos read on the host,
        attention over rows 0..pos only (a fixed-size cache is not scanned past the
        current length; `decode_with`'s masked form computes the same values)."""
        past_key, past_value, seqlens_k = inputs[3], inputs[4], inputs[5]
        attention_bias = inputs[10] if len(inputs) > 10 else None
        head_sink = inputs[11] if len(inputs) > 11 else None
        local_window = self.local_window
        present_len = present_shape[2]
        pos = min(max(numpy_first_int(seqlens_k), 0), present_len - 1)
        presents = write_presents(outs, past_key, past_value, k_row, v_row, present_shape, shared, pos)
        if self.decode_attention and ct == F32 and head_sink is None and presents[0].dtype == F32:
            out = self.onnxruntime_decode(q, presents[0][0, :, :pos + 1], presents[1][0, :, :pos + 1],
                                          attention_bias, 0, outs[0])
            if out is not None:
                return [out, presents[0], presents[1]] + [None] * (len(outs) - 3)
        start = max(pos - local_window + 1, 0) if local_window > 0 else 0
        bias = None
        if attention_bias is not None and min(attention_bias.shape[3], pos + 1) > start:
            bias = attention_bias[0, :, 0, start:min(attention_bias.shape[3], pos + 1)]
        out = self.attend_one_token(q, presents[0][0, :, start:pos + 1], presents[1][0, :, start:pos + 1], bias,
                                    None, head_sink, outs[0], ct)
        return [out, presents[0], presents[1]] + [None] * (len(outs) - 3)

    def onnxruntime_decode(self, q: Any, keys: Any, values: Any, attention_bias: Any, batch_index: int,
                           out: Any) -> Any:
        """One token's attention as onnxruntime's decode kernel rounds it
        (`mlas_attention.decode_attention`): q [N, H] or [1, N, H], keys / values
        [KV, T, H] (rows 0..T-1), into `out` ([1, 1, N * H]) or a new array; None
        where the attention bias is narrower than T (onnxruntime reads T columns)."""
        kv_num_heads, group, local_window = self.kv_num_heads, self.group, self.local_window
        total, head_size = keys.shape[1], keys.shape[2]
        bias = None
        if attention_bias is not None:
            if attention_bias.shape[3] < total:
                return None
            row = attention_bias[min(batch_index, attention_bias.shape[0] - 1), :, 0, :total].astype(F32, copy=False)
            bias = row.reshape(kv_num_heads, group, total) if row.shape[0] != 1 else row.reshape(1, 1, total)
        window_start = total - local_window if 0 < local_window < total else 0
        alpha = self.scale if self.scale != 0.0 else 1.0 / float(np.sqrt(head_size))
        q_hidden = self.num_heads * head_size
        fits = out is not None and out.dtype == F32 and out.shape == (1, 1, q_hidden) and out.flags.c_contiguous
        target = out.reshape(kv_num_heads, group, head_size) if fits else None
        result = mlas_attention.decode_attention(q.reshape(kv_num_heads, group, head_size), keys, values, alpha,
                                                 window_start, bias, out=target)
        return out if fits else emit(out, result.reshape(1, 1, q_hidden), self.dtype)

    def attend_one_token(self, q: Any, keys: Any, values: Any, bias: Any, allowed: Any, head_sink: Any,
                         out: Any, ct: np.dtype) -> Any:
        """One query token's attention over `keys`/`values` [KV, n, H] into `out`:
        scaled scores, softcap, `bias` added to the first columns (past them: zeros, as
        the general path pads), columns outside `allowed` masked, the (sink) softmax,
        the weighted sum. Shared by the one-token path's host and device forms."""
        xp, kv_num_heads, group, softcap = self.xp, self.kv_num_heads, self.group, self.softcap
        head_size = q.shape[-1]
        if keys.dtype != ct:
            keys, values = keys.astype(ct), values.astype(ct)
        alpha = self.scale if self.scale != 0.0 else 1.0 / float(np.sqrt(head_size))
        scores = xp.matmul(q.reshape(kv_num_heads, group, head_size), keys.transpose(0, 2, 1))
        scores *= ct.type(alpha)  # [KV, G, n]
        if softcap > 0.0:
            cap = ct.type(softcap)
            xp.divide(scores, cap, out=scores)
            xp.tanh(scores, out=scores)
            xp.multiply(scores, cap, out=scores)
        if bias is not None:
            width = bias.shape[-1]
            if bias.shape[0] != 1:
                bias = bias.reshape(kv_num_heads, group, width)
            scores[..., :width] += bias.astype(ct, copy=False)
        if allowed is not None:
            scores = xp.where(allowed, scores, ct.type(-np.inf))
        sink = None
        if head_sink is not None:
            sink = head_sink.reshape(kv_num_heads, group, 1).astype(ct, copy=False)
        elif self.smooth_softmax:
            sink = xp.zeros((1, 1, 1), dtype=ct)
        # numpy: what ndarray.max / .sum call, without their Python wrappers
        if self.host:
            top = np.maximum.reduce(scores, axis=-1, keepdims=True)
        else:
            top = scores.max(axis=-1, keepdims=True)
        if sink is not None:
            top = xp.maximum(top, sink)
        scores -= top
        xp.exp(scores, out=scores)
        denom = np.add.reduce(scores, axis=-1, keepdims=True) if self.host else scores.sum(axis=-1, keepdims=True)
        if sink is not None:
            denom += xp.exp(sink - top)
        scores /= denom
        q_hidden = self.num_heads * head_size
        if out is not None and out.dtype == ct and out.shape == (1, 1, q_hidden) and out.flags.c_contiguous:
            xp.matmul(scores, values, out=out.reshape(kv_num_heads, group, head_size))
            return out
        return emit(out, xp.matmul(scores, values).reshape(1, 1, q_hidden), self.dtype)
