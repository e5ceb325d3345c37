"""GroupQueryAttention (com.microsoft): the attention of onnxruntime-genai's exports,
with its rotary embedding, KV cache writes and one-token decode paths. RotaryEmbedding
is `rotary`, the default domain's Attention `attention`, the pieces they share
`attention_math`.

It runs on the backend's array module and keep per-batch lengths
(``seqlens_k``, ``query_seqlens``, ``nonpad_kv_seqlen``) on the device: masks and KV
cache writes are built from those arrays with elementwise ops and fancy indexing, never
from host copies of their values, so the kernels stay recordable into a device graph.
The one unavoidable host read is GroupQueryAttention's ``total_sequence_length`` when a
present / output_qk shape depends on it and the executor could not preallocate it.

The exception is GroupQueryAttention's one-token decode fast path (batch 1, one new
token) on the numpy backend: it reads ``seqlens_k`` on the host (`numpy_first_int`) to
attend over rows 0..pos only. That is sound there because a CPU recorded-launch graph
re-runs the kernel on every replay (the value is read afresh, never baked in); on a
device backend the same path keeps the position on the device and masks instead.

Where the plan asks for onnxruntime's rounding (`NodeInfo.onnxruntime_rounding`: a model
that requantizes activations, such as a genai int4 export), float32 on the numpy backend
rounds as onnxruntime's CPU kernels do, bit for bit: rotary embeddings by MLAS's rotary
kernel (`ort_float32.rotate_pair`, `onnxruntime_rotary`) and GroupQueryAttention's
attention by MLAS's flash and decode kernels (`mlas_attention`, where MLAS takes its
AVX2 kernels), in the general path (`attention_as_onnxruntime`) and in both one-token
paths. Elsewhere numpy's own arithmetic (within a few ulps), and the rotation matrix of
constant cos/sin caches (`rotary_matrix`) in the prepared decode call.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..addresses import SameArrays, items_at
from ..errors import KernelError
from . import mlas_attention, mlas_isa, mlas_jit
from .attention_math import _clamp, _first_int, _host_int, _masked_softmax, _overlap, _same_buffer, _softcap
from .contrib import (
    F32,
    HALF_AND_FLOAT,
    MS_DOMAIN,
    attr_str,
    compute_dtype,
    emit,
    out_dtype,
    pad_inputs,
    used,
)
from .gqa_host_decode import HostDecode, bias_rows, caches_in, write_presents
from .registry import (
    CAPTURE_SUPPORTED,
    CaptureVerdict,
    KernelFn,
    NodeInfo,
    declined,
    numpy_first_int,
    register_with_host_variant,
    with_fixed_arrays_form,
)
from .rotary import _gather_rows, _rotate_rows, onnxruntime_rotary, rotate
from .rotary_matrix import RotationMatrix, rotation_matrix


def attention_as_onnxruntime(q: Any, k_cache: Any, v_cache: Any, seqlens_k: Any, attention_bias: Any, *,
                             kv_heads: int, scale: float, local_window: int) -> Any:
    """GroupQueryAttention's general path where onnxruntime takes MLAS's flash kernel
    (numpy, float32): attention as that kernel rounds it (`mlas_attention`), [B, N, S, H];
    None where onnxruntime takes its other path (a total length of 1) or the attention
    bias is narrower than a row's keys. q [B, N, S, H] (rotated), caches [B, KV, L, H]
    holding each entry's rows 0..T_b-1 (T_b = seqlens_k[b] + 1, read on the host: the
    numpy backend re-runs a recorded kernel at every replay)."""
    batch, num_heads, seq, head_size = q.shape
    group = num_heads // kv_heads
    flat = seqlens_k.reshape(-1)
    totals = [numpy_first_int(flat[b:b + 1]) + 1 for b in range(batch)]
    if max(totals) <= 1 or min(totals) < 1 or max(totals) > k_cache.shape[2]:
        return None
    alpha = scale if scale != 0.0 else 1.0 / float(np.sqrt(head_size))
    attn = np.empty(q.shape, F32)
    for b, total in enumerate(totals):
        bias = None
        if attention_bias is not None:
            if attention_bias.shape[3] < total:
                return None
            rows = attention_bias[min(b, attention_bias.shape[0] - 1)].astype(F32, copy=False)  # [N|1, S, L]
            bias = rows.reshape(((kv_heads, group) if rows.shape[0] != 1 else (1, 1)) + (seq, rows.shape[-1]))
        keys, values = k_cache[b, :, :total], v_cache[b, :, :total]
        if seq == 1:
            window_start = total - local_window if 0 < local_window < total else 0
            attn[b, :, 0] = mlas_attention.decode_attention(
                q[b, :, 0].reshape(kv_heads, group, head_size), keys, values, alpha, window_start,
                None if bias is None else bias[:, :, 0, :total]).reshape(num_heads, head_size)
        else:
            out = mlas_attention.flash_attention(
                q[b].reshape(kv_heads, group, seq, head_size), keys, values, alpha, max(total - seq, 0), total,
                local_window if local_window > 0 else -1, bias)
            attn[b] = out.reshape(num_heads, seq, head_size)
    return attn


_GQA_INPUTS = 17
_I_TOTAL = 6

#: `write_presents`' flags for a present in a buffer of its own, key's and value's
NOT_SHARED = (False, False)

#: GroupQueryAttention's one-token decode fast path (numpy backend); tests switch it off
#: to compare it with the general path
DECODE_FAST_PATH = True


def _gqa_capture(info: NodeInfo) -> CaptureVerdict:
    """Capturable unless a used output's shape needs total_sequence_length's value and the
    model gives no static or symbolic dimension for it."""
    if _I_TOTAL in info.constant_inputs:
        return CAPTURE_SUPPORTED
    for index, axis in ((1, 2), (2, 2), (3, 3)):
        if not used(info, index):
            continue
        shape = info.output_shapes[index] if index < len(info.output_shapes) else None
        dim = shape[axis] if shape is not None and len(shape) > axis else None
        if not isinstance(dim, (int, str)) or isinstance(dim, bool) or dim == "":
            return declined("host_read", "GroupQueryAttention reads total_sequence_length on the "
                            "host to size its present/output_qk outputs (their shape is unknown)")
    return CAPTURE_SUPPORTED


# query/key/value are reshaped to heads internally: a strided view (e.g. a Split of
# packed QKV) would be copied silently there, so the executor copies and records it
@register_with_host_variant("GroupQueryAttention", domain=MS_DOMAIN, dtypes=HALF_AND_FLOAT, capture=_gqa_capture,
                            contiguous_inputs=(0, 1, 2), per_node=True)
def build_group_query_attention(info: NodeInfo, host: bool) -> KernelFn:
    """com.microsoft GroupQueryAttention, as onnxruntime's CPU kernel computes it.

    Inputs: query, key?, value?, past_key?, past_value?, seqlens_k, total_sequence_length,
    cos_cache?, sin_cache?, position_ids?, attention_bias?, head_sink?, k_scale?, v_scale?
    (ignored: the quantized cache they serve is rejected), q_norm_weight?, k_norm_weight?
    (rejected, as onnxruntime's CPU kernel does), query_seqlens?.
    Outputs: output, present_key?, present_value?, output_qk?.

    Per batch entry b: T_b = seqlens_k[b] + 1 keys exist after this step. Query row s sits
    at absolute position P_b + s, where P_b = T_b - query_seqlens[b] when query_seqlens is
    given, else max(T_b - S, 0) (a first prompt, S == total_sequence_length, has P_b = 0
    and may be right-padded). New key/value rows (all S, or the valid query_seqlens[b])
    land at [P_b, ...) of the present cache; the present cache holds past rows [0, P_b),
    the new rows and zeros elsewhere, or, when present is the very buffer of past (shared
    KV buffer), only the new rows are written. The present length is max(total, past).

    One-token decode (batch 1, S 1, no query_seqlens or output_qk, a past and both
    presents) takes a fast path: Q/K are rotated with the one cos/sin row, K/V written at
    pos = seqlens_k[0] straight into the present buffer, and attention runs over rows
    0..pos (numpy: a view of them; device backends: the whole buffer, masked past pos);
    every other case takes the general path, with which it agrees to float32 rounding.

    The host variant (`host`) adds the prepared one-token decode (`HostDecode`) with its
    compiled forms, MLAS's rotary and flash attention where the plan asks for
    onnxruntime's rounding, and reads the position from host arrays as views.
    """
    xp = info.xp
    num_heads = int(info.attr("num_heads"))
    kv_num_heads = int(info.attr("kv_num_heads"))
    if num_heads <= 0 or kv_num_heads <= 0 or num_heads % kv_num_heads:
        raise KernelError(f"GroupQueryAttention node {info.name!r}: num_heads={num_heads} must "
                          f"be a positive multiple of kv_num_heads={kv_num_heads}")
    group = num_heads // kv_num_heads
    scale_attr = float(info.attr("scale", 0.0))
    softcap = float(info.attr("softcap", 0.0))
    local_window = int(info.attr("local_window_size", -1))
    do_rotary = int(info.attr("do_rotary", 0)) == 1
    interleaved = int(info.attr("rotary_interleaved", 0)) == 1
    smooth_softmax = int(info.attr("smooth_softmax", 0)) == 1
    causal = int(info.attr("causal", 1)) == 1
    qk_output = int(info.attr("qk_output", 0))
    for name in ("k_quant_type", "v_quant_type"):
        if attr_str(info, name, "NONE") != "NONE":
            raise KernelError(f"GroupQueryAttention node {info.name!r}: {name}="
                              f"{attr_str(info, name, 'NONE')} (quantized KV cache) is not supported")
    if int(info.attr("kv_cache_bit_width", 0)) != 0:
        raise KernelError(f"GroupQueryAttention node {info.name!r}: kv_cache_bit_width must be 0")
    if int(info.attr("sliding_window_cache", 0)) != 0:
        raise KernelError(f"GroupQueryAttention node {info.name!r}: sliding_window_cache=1 "
                          "(windowed KV cache) is not supported")
    if qk_output not in (0, 1, 2):
        raise KernelError(f"GroupQueryAttention node {info.name!r}: qk_output={qk_output}, "
                          "expected 0, 1 or 2")
    if not causal and local_window >= 0:
        raise KernelError(f"GroupQueryAttention node {info.name!r}: local_window_size must be -1 "
                          "when causal=0")
    dtype = out_dtype(info)
    const_total = info.constant_inputs.get(_I_TOTAL)
    const_total = None if const_total is None else int(np.asarray(const_total).reshape(-1)[0])

    def total_length(total_tensor: Any) -> int:
        return const_total if const_total is not None else _host_int(total_tensor)

    used_present = (used(info, 1), used(info, 2))
    used_qk = bool(qk_output) and used(info, 3)

    # numpy: what ndarray.max / .sum call, without their Python wrappers
    def row_max(a: Any) -> Any:
        return np.maximum.reduce(a, axis=-1, keepdims=True) if host else a.max(axis=-1, keepdims=True)

    def row_sum(a: Any) -> Any:
        return np.add.reduce(a, axis=-1, keepdims=True) if host else a.sum(axis=-1, keepdims=True)

    def attend_one_token(q: Any, keys: Any, values: Any, bias: Any, allowed: Any, head_sink: Any,
                         out: Any, ct: np.dtype) -> Any:
        """One query token's attention over `keys`/`values` [KV, n, H] into `out`:
        scaled scores, softcap, `bias` added to the first columns (past them: zeros, as
        the general path pads), columns outside `allowed` masked, the (sink) softmax,
        the weighted sum. Shared by the one-token path's host and device forms."""
        head_size = q.shape[-1]
        if keys.dtype != ct:
            keys, values = keys.astype(ct), values.astype(ct)
        alpha = scale_attr if scale_attr != 0.0 else 1.0 / float(np.sqrt(head_size))
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
        elif smooth_softmax:
            sink = xp.zeros((1, 1, 1), dtype=ct)
        top = row_max(scores)
        if sink is not None:
            top = xp.maximum(top, sink)
        scores -= top
        xp.exp(scores, out=scores)
        denom = row_sum(scores)
        if sink is not None:
            denom += xp.exp(sink - top)
        scores /= denom
        q_hidden = num_heads * head_size
        if out is not None and out.dtype == ct and out.shape == (1, 1, q_hidden) and out.flags.c_contiguous:
            xp.matmul(scores, values, out=out.reshape(kv_num_heads, group, head_size))
            return out
        return emit(out, xp.matmul(scores, values).reshape(1, 1, q_hidden), dtype)

    checked = SameArrays()  # the last call's setup, for the very same arrays
    # what holds for the arrays other than the past/present caches (a growing cache's are
    # new every step; these are not): the head size and, on numpy in the plain
    # configuration, the prepared `HostDecode`
    steady = SameArrays()
    plain_host = host and softcap == 0.0 and not smooth_softmax
    # float32 on the host where the plan asks for onnxruntime's rounding: MLAS's rotary
    # kernel, and, where onnxruntime runs MLAS's FMA3 or AVX-512F softmax, its flash attention
    # (`mlas_attention`; softcap and smooth softmax take onnxruntime's other path)
    exact_rotary = host and onnxruntime_rotary(info)
    mlas_host = plain_host and local_window != 0 and mlas_isa.isa() in ("avx2", "avx512")
    exact_attention = exact_rotary and mlas_host
    # the one-token decode on the host takes onnxruntime's rounding also where the plan
    # does not ask for it, when that runs compiled (`mlas_jit`): then it is the fastest form
    # too (a few microseconds a call against numpy's twenty calls)
    compiled_decode = (info.faster_onnxruntime_rounding and mlas_host and mlas_jit.available("rotate_rows")
                       and mlas_jit.available("decode_attention"))
    decode_rotary, decode_attention = exact_rotary or compiled_decode, exact_attention or compiled_decode

    def rotation_of(inputs: list) -> RotationMatrix | None:
        """The shared rotation matrix of the model's own cos/sin caches (initializers, never
        written); None for caches computed or fed at run time, whose contents may change."""
        n_in = len(inputs)
        cos_cache, sin_cache = (inputs[7], inputs[8]) if n_in > 8 else (None, None)
        if (cos_cache is None or cos_cache is not info.initializer_inputs.get(7)
                or sin_cache is not info.initializer_inputs.get(8)):
            return None
        return rotation_matrix(cos_cache, sin_cache)

    def decode_token(inputs: list, outs: list) -> list | None:
        """One new token of batch entry 0 (batch 1, S 1, past given, present wanted): the
        general path's result computed over views of 0..pos, or None where it does not
        apply. K/V go straight into the present buffer at pos = seqlens_k[0].

        The checks' outcome is a function of the arrays' shapes and addresses only, so
        for the very same input and output arrays as the last call (a replayed launch
        passes the same ones every step) it is reused; the arrays are held meanwhile.
        With new caches only, only their checks are redone. An attention bias (a mask
        the graph computes, new every step) is read at every call."""
        bias = bias_rows(inputs[10], num_heads) if len(inputs) > 10 else None
        if bias is False:
            return None
        kept = checked.kept_for(inputs, outs)
        if kept is not None:
            setup, plan = kept
        else:
            fixed_in, fixed_out = fixed_arrays(len(inputs), len(outs))
            fixed_inputs, fixed_outs = fixed_in(inputs), fixed_out(outs)
            fixed = steady.kept_for(fixed_inputs, fixed_outs)
            if fixed is not None:
                head_size, plan = fixed
                if head_size and not rotary_fits(inputs, head_size):
                    return None
                if plan and grown(inputs, outs, head_size, plan.out.dtype):
                    checked.keep(inputs, outs, None)  # nothing of a growing cache's call is kept
                    present_shape = (1, kv_num_heads, inputs[3].shape[2] + 1, head_size)
                    return plan.run(inputs, outs, present_shape, NOT_SHARED, local_window, bias)
            else:
                head_size = steady_head_size(inputs, outs)
                plan = host_plan(inputs, outs, head_size) if head_size and plain_host else None
                steady.keep(fixed_inputs, fixed_outs, (head_size, plan))
            setup = cache_setup(inputs, outs, head_size) if head_size else None
            if plan and (setup is None or not caches_in(plan.out.dtype, (inputs[3], inputs[4], outs[1], outs[2]))):
                plan = None
            # not kept: a setup that read total_sequence_length's value (that may change), nor
            # one for a growing cache (the next call has new caches; holding these would keep
            # a spent past alive per layer)
            keep = setup is not None and not setup[-1] and not (setup[2] > setup[1] and not any(setup[4]))
            checked.keep(inputs, outs, (setup, plan) if keep else None)
        if setup is None:
            return None
        if plan:
            result = plan.run(inputs, outs, setup[3], setup[4], local_window, bias)
            if result is not None:
                return result
        return decode_with(inputs, outs, *setup[:-1])

    getters: dict = {}  # (inputs, outputs) -> items_at of the arrays `steady` is kept for

    def fixed_arrays(n_in: int, n_out: int) -> tuple:
        """Getters of the arrays other than the caches, the position inputs, the cos/sin
        caches and the attention bias (computed in the graph, those may be new arrays
        every step), one C call each."""
        found = getters.get((n_in, n_out))
        if found is None:
            found = getters[(n_in, n_out)] = (items_at([0, 1, 2, *range(11, n_in)]),
                                              items_at([0, *range(3, n_out)]))
        return found

    def rotary_fits(inputs: list, head_size: int) -> bool:
        """Whether the cos/sin caches suit the one-token path (`steady_head_size`'s
        check, for caches that may be new arrays every step)."""
        if not do_rotary:
            return True
        cos_cache = inputs[7] if len(inputs) > 7 else None
        sin_cache = inputs[8] if len(inputs) > 8 else None
        return cos_cache is not None and sin_cache is not None and 2 * cos_cache.shape[1] <= head_size

    def grown(inputs: list, outs: list, head_size: int, dtype: np.dtype) -> bool:
        """Whether the caches are a growing cache's, as its decode loop and the executor
        hand them over: past key and value (1, kv heads, L, head), presents one row
        longer, all four of `dtype` and each owning its memory (so none shares or
        overlaps another). `cache_setup` then finds (L, L + 1, not shared), without
        reading an address."""
        past_key, past_value = inputs[3], inputs[4]
        out_k, out_v = outs[1], outs[2]
        if (type(past_key) is not np.ndarray or type(past_value) is not np.ndarray
                or type(out_k) is not np.ndarray or type(out_v) is not np.ndarray
                or past_key.base is not None or past_value.base is not None
                or out_k.base is not None or out_v.base is not None
                or past_key is past_value or out_k is out_v or inputs[5].size != 1):
            return False
        shape = past_key.shape
        present = (1, kv_num_heads, shape[2] + 1, head_size) if len(shape) == 4 else None
        return (shape == (1, kv_num_heads, shape[2], head_size) == past_value.shape
                and out_k.shape == present == out_v.shape
                and past_key.dtype == past_value.dtype == out_k.dtype == out_v.dtype == dtype)

    def host_plan(inputs: list, outs: list, head_size: int) -> HostDecode | None:
        """The prepared numpy call for these arrays (no head sink), or None."""
        if len(inputs) > 11 and inputs[11] is not None:
            return None
        return HostDecode.prepare(inputs, outs, num_heads=num_heads, kv_heads=kv_num_heads,
                                  head_size=head_size, scale=scale_attr, rotary=do_rotary,
                                  interleaved=interleaved,
                                  rotation=None if decode_rotary else rotation_of(inputs),
                                  exact_rotary=decode_rotary, exact_attention=decode_attention)

    def steady_head_size(inputs: list, outs: list) -> int | None:
        """The head size when the one-token path applies to the arrays other than the
        caches, else None."""
        n_in, n_out = len(inputs), len(outs)
        query = inputs[0]
        if n_in < 7 or n_out < 3 or query.shape[0] != 1 or query.shape[1] != 1:
            return None
        key, value = inputs[1], inputs[2]
        cos_cache = inputs[7] if n_in > 7 else None
        sin_cache = inputs[8] if n_in > 8 else None
        if any(extra is not None for extra in inputs[14:17]):  # q/k norm (the general path rejects them), query_seqlens
            return None
        if n_out > 3 and (outs[3] is not None or used_qk):
            return None
        if key is None:
            head_size = query.shape[2] // (num_heads + 2 * kv_num_heads)
        else:
            head_size = query.shape[2] // num_heads
            if (value is None or key.shape != (1, 1, kv_num_heads * head_size)
                    or value.shape != key.shape):
                return None
        if do_rotary and (cos_cache is None or sin_cache is None or 2 * cos_cache.shape[1] > head_size):
            return None
        return head_size

    def cache_setup(inputs: list, outs: list, head_size: int) -> tuple | None:
        """(head_size, past_len, present_len, present_shape, shared, read_total)
        when the caches suit the one-token path, else None."""
        past_key, past_value, seqlens_k, total_tensor = inputs[3:7]
        if past_key is None or past_value is None or seqlens_k.size != 1:
            return None
        out_k, out_v = outs[1], outs[2]
        if (out_k is None and not used_present[0]) or (out_v is None and not used_present[1]):
            return None
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
            present_len = max(total_length(total_tensor), past_len)
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
        return head_size, past_len, present_len, present_shape, shared, read_total

    def decode_with(inputs: list, outs: list, head_size: int, past_len: int, present_len: int,
                    present_shape: tuple, shared: list) -> list:
        """`decode_token`'s computation, once its setups have checked the arrays."""
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
        if do_rotary:
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
            qk = _rotate_rows(xp, q_rows.astype(ct, copy=False), c, sn, 2 * c.shape[0], interleaved,
                              decode_rotary, host)
            if qdt != ct:  # onnxruntime stores the rotated Q/K in T
                qk = qk.astype(qdt).astype(ct)
            q, k_row = qk[:num_heads], qk[num_heads:]
        else:
            q = q_rows[:num_heads].astype(ct, copy=False)
            k_row = q_rows[num_heads:] if key is None else key.reshape(kv_num_heads, head_size)

        if host:
            return attend_on_host_position(inputs, outs, q, k_row, v_row, present_shape, shared, ct)
        pos = _clamp(xp, _first_int(xp, seqlens_k), 0, present_len - 1)  # [1]
        slots = xp.arange(present_len, dtype=np.int64)  # [L]

        # the present caches: rows 0..pos-1 from past, the new row at pos, zeros after
        # (a shared buffer keeps its other rows)
        presents = []
        kept = min(past_len, present_len)
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
        if local_window > 0:
            allowed = allowed & (slots > pos - local_window)
        bias = None
        if attention_bias is not None:
            bias = attention_bias[0, :, 0, :min(attention_bias.shape[3], present_len)]
        out = attend_one_token(q, presents[0][0], presents[1][0], bias, allowed, head_sink, outs[0], ct)
        return [out, presents[0], presents[1]] + [None] * (n_out - 3)

    def attend_on_host_position(inputs: list, outs: list, q: Any, k_row: Any, v_row: Any,
                                present_shape: tuple, shared: list, ct: np.dtype) -> list:
        """The one-token path's second half on the numpy backend: pos read on the host,
        attention over rows 0..pos only (a fixed-size cache is not scanned past the
        current length; `decode_token`'s masked form computes the same values)."""
        past_key, past_value, seqlens_k = inputs[3], inputs[4], inputs[5]
        attention_bias = inputs[10] if len(inputs) > 10 else None
        head_sink = inputs[11] if len(inputs) > 11 else None
        present_len = present_shape[2]
        pos = min(max(numpy_first_int(seqlens_k), 0), present_len - 1)
        presents = write_presents(outs, past_key, past_value, k_row, v_row, present_shape, shared, pos)
        if decode_attention and ct == F32 and head_sink is None and presents[0].dtype == F32:
            out = onnxruntime_decode(q, presents[0][0, :, :pos + 1], presents[1][0, :, :pos + 1],
                                     attention_bias, 0, outs[0])
            if out is not None:
                return [out, presents[0], presents[1]] + [None] * (len(outs) - 3)
        start = max(pos - local_window + 1, 0) if local_window > 0 else 0
        bias = None
        if attention_bias is not None and min(attention_bias.shape[3], pos + 1) > start:
            bias = attention_bias[0, :, 0, start:min(attention_bias.shape[3], pos + 1)]
        out = attend_one_token(q, presents[0][0, :, start:pos + 1], presents[1][0, :, start:pos + 1], bias,
                               None, head_sink, outs[0], ct)
        return [out, presents[0], presents[1]] + [None] * (len(outs) - 3)

    def onnxruntime_decode(q: Any, keys: Any, values: Any, attention_bias: Any, batch_index: int,
                           out: Any) -> Any:
        """One token's attention as onnxruntime's decode kernel rounds it
        (`mlas_attention.decode_attention`): q [N, H] or [1, N, H], keys / values
        [KV, T, H] (rows 0..T-1), into `out` ([1, 1, N * H]) or a new array; None
        where the attention bias is narrower than T (onnxruntime reads T columns)."""
        total, head_size = keys.shape[1], keys.shape[2]
        bias = None
        if attention_bias is not None:
            if attention_bias.shape[3] < total:
                return None
            row = attention_bias[min(batch_index, attention_bias.shape[0] - 1), :, 0, :total].astype(F32, copy=False)
            bias = row.reshape(kv_num_heads, group, total) if row.shape[0] != 1 else row.reshape(1, 1, total)
        window_start = total - local_window if 0 < local_window < total else 0
        alpha = scale_attr if scale_attr != 0.0 else 1.0 / float(np.sqrt(head_size))
        q_hidden = num_heads * head_size
        fits = out is not None and out.dtype == F32 and out.shape == (1, 1, q_hidden) and out.flags.c_contiguous
        target = out.reshape(kv_num_heads, group, head_size) if fits else None
        result = mlas_attention.decode_attention(q.reshape(kv_num_heads, group, head_size), keys, values, alpha,
                                                 window_start, bias, out=target)
        return out if fits else emit(out, result.reshape(1, 1, q_hidden), dtype)

    def general(inputs: list, outs: list) -> list:
        (query, key, value, past_key, past_value, seqlens_k, total_tensor, cos_cache, sin_cache,
         position_ids, attention_bias, head_sink, k_scale, v_scale, q_norm, k_norm,
         query_seqlens) = pad_inputs(inputs, _GQA_INPUTS)[:_GQA_INPUTS]
        if q_norm is not None or k_norm is not None:
            raise KernelError(f"GroupQueryAttention node {info.name!r}: q_norm_weight/"
                              "k_norm_weight inputs are not supported (onnxruntime's CPU kernel "
                              "rejects them too)")
        del k_scale, v_scale  # only read for a quantized cache, which the builder rejected
        n_out = len(outs)
        ct = compute_dtype(query.dtype)
        batch, seq, _ = query.shape
        packed = key is None
        if packed:
            head_size = query.shape[2] // (num_heads + 2 * kv_num_heads)
            q_hidden, kv_hidden = num_heads * head_size, kv_num_heads * head_size
            q_in = query[..., :q_hidden]
            k_in = query[..., q_hidden:q_hidden + kv_hidden]
            v_in = query[..., q_hidden + kv_hidden:q_hidden + 2 * kv_hidden]
        else:
            head_size = query.shape[2] // num_heads
            q_in, k_in, v_in = query, key, value
        kv_seq = k_in.shape[1]
        cache_dtype = past_key.dtype if past_key is not None else dtype
        past_len = past_key.shape[2] if past_key is not None else 0

        # [B, N, S, H] / [B, KV, L, H] in the compute dtype
        q = q_in.reshape(batch, seq, num_heads, head_size).transpose(0, 2, 1, 3).astype(ct)
        k_new = k_in.reshape(batch, kv_seq, kv_num_heads, head_size).transpose(0, 2, 1, 3).astype(ct)
        v_new = v_in.reshape(batch, kv_seq, kv_num_heads, head_size).transpose(0, 2, 1, 3).astype(ct)

        # per-batch lengths, on the device
        total_b = seqlens_k.reshape(batch).astype(np.int64) + 1  # T_b
        rows = xp.arange(seq, dtype=np.int64)[None, :]  # [1, S]
        if query_seqlens is not None:
            valid_b = query_seqlens.reshape(batch).astype(np.int64)
            start_b = total_b - valid_b  # P_b
            first_prompt = None
        else:
            valid_b = None
            start_b = xp.maximum(total_b - seq, 0)
            # onnxruntime's "first prompt" (S == total_sequence_length) without its value:
            # every entry fits in the chunk (total_sequence_length is the batch max of T_b)
            first_prompt = xp.all(total_b <= seq)
        qpos = start_b[:, None] + rows  # [B, S] absolute query positions

        if do_rotary:
            if cos_cache is None or sin_cache is None:
                raise KernelError(f"GroupQueryAttention node {info.name!r}: do_rotary=1 needs "
                                  "cos_cache and sin_cache")
            rot_dim = cos_cache.shape[1] * 2
            if position_ids is not None:
                pid = position_ids.reshape(batch, -1)[:, :seq].astype(np.int64)
                if first_prompt is not None:
                    # onnxruntime uses only position_ids[0] (as an offset) for a first prompt
                    pid = xp.where(first_prompt, pid.reshape(-1)[0] + rows, pid)
                positions = pid
            else:
                positions = qpos
            cos = _gather_rows(xp, cos_cache, positions, ct)[:, None]  # [B, 1, S, rot/2]
            sin = _gather_rows(xp, sin_cache, positions, ct)[:, None]
            q = rotate(xp, q, cos, sin, rot_dim, interleaved, exact_rotary)
            if kv_seq:
                k_new = rotate(xp, k_new, cos[:, :, :kv_seq], sin[:, :, :kv_seq], rot_dim, interleaved,
                               exact_rotary)
            if np.dtype(query.dtype) != ct:  # onnxruntime stores the rotated Q/K in T
                q = q.astype(query.dtype).astype(ct)
                k_new = k_new.astype(query.dtype).astype(ct)
        if np.dtype(cache_dtype) != ct:
            k_new = k_new.astype(cache_dtype).astype(ct)
            v_new = v_new.astype(cache_dtype).astype(ct)

        # present length
        present_len = None
        for index in (1, 2):
            if index < n_out and outs[index] is not None:
                present_len = outs[index].shape[2]
        want_present = any(index < n_out and (outs[index] is not None or used(info, index))
                           for index in (1, 2))
        if present_len is None and want_present:
            present_len = max(total_length(total_tensor), past_len)
        work_len = max(past_len + kv_seq, present_len or 0, 1)

        # the working KV cache: past rows [0, P_b), new rows at P_b + s, zeros elsewhere;
        # one extra trailing row takes the writes of padded (not appended) rows
        slots = xp.arange(work_len, dtype=np.int64)[None, :]  # [1, L]
        keep_past = (slots[:, :past_len] < start_b[:, None])[:, None, :, None]
        new_rows = xp.arange(kv_seq, dtype=np.int64)[None, :]
        dest = start_b[:, None] + new_rows  # [B, S_kv]
        if valid_b is not None:
            dest = xp.where(new_rows < valid_b[:, None], dest, work_len)
        dest = _clamp(xp, dest, 0, work_len)
        batch_idx = xp.arange(batch, dtype=np.int64)[:, None]

        def working_cache(past: Any, new: Any) -> Any:
            cache = xp.zeros((batch, kv_num_heads, work_len + 1, head_size), dtype=ct)
            if past is not None and past_len:
                cache[:, :, :past_len] = xp.where(keep_past, past.astype(ct), ct.type(0.0))
            if kv_seq:
                cache[batch_idx, :, dest, :] = new.transpose(0, 2, 1, 3)
            return cache[:, :, :work_len]

        k_cache = working_cache(past_key, k_new)
        v_cache = working_cache(past_value, v_new)

        qk_wanted = n_out > 3 and (outs[3] is not None or (used(info, 3) and bool(qk_output)))
        attn = None
        if (exact_attention and causal and query_seqlens is None and head_sink is None and not qk_wanted
                and ct == F32 and np.dtype(query.dtype) == F32 and np.dtype(cache_dtype) == F32
                and all(index < n_out and (outs[index] is not None or used(info, index)) for index in (1, 2))):
            attn = attention_as_onnxruntime(q, k_cache, v_cache, seqlens_k, attention_bias, kv_heads=kv_num_heads,
                                            scale=scale_attr, local_window=local_window)  # [B, N, S, H]
        if attn is None:
            # scores [B, KV, G, S, L]
            alpha = scale_attr if scale_attr != 0.0 else 1.0 / float(np.sqrt(head_size))
            qg = q.reshape(batch, kv_num_heads, group, seq, head_size)
            scores = xp.matmul(qg, k_cache[:, :, None].swapaxes(-1, -2)) * ct.type(alpha)
            scores = _softcap(xp, scores, softcap)
            if attention_bias is not None:
                bias_len = attention_bias.shape[-1]
                span = min(bias_len, work_len)
                bias = attention_bias.astype(ct, copy=False)
                bias = bias.reshape(bias.shape[0], bias.shape[1], 1, seq, bias_len)[..., :span]
                if bias.shape[1] != 1:
                    bias = bias.reshape(bias.shape[0], kv_num_heads, group, seq, span)
                if span < work_len:
                    pad = xp.zeros(bias.shape[:-1] + (work_len - span,), dtype=ct)
                    bias = xp.concatenate([bias, pad], axis=-1)
                scores = scores + bias

            key_pos = slots[:, None, :]  # [1, 1, L]
            allowed = key_pos < total_b[:, None, None]  # [B, 1, L]
            if causal:
                allowed = allowed & (key_pos <= qpos[:, :, None])
            if local_window > 0:
                allowed = allowed & (key_pos > qpos[:, :, None] - local_window)
            allowed = allowed[:, None, None]  # [B, 1, 1, S|1, L]

            sink = None
            if head_sink is not None:
                sink = head_sink.astype(ct).reshape(1, kv_num_heads, group, 1, 1)
            elif smooth_softmax:
                sink = xp.zeros((1, 1, 1, 1, 1), dtype=ct)
            probs = _masked_softmax(xp, scores, allowed, sink)

            attn = xp.matmul(probs, v_cache[:, :, None])  # [B, KV, G, S, H]
        attn = attn.reshape(batch, num_heads, seq, head_size).transpose(0, 2, 1, 3)
        results: list = [emit(outs[0], attn.reshape(batch, seq, num_heads * head_size), dtype, like=query)]

        if want_present:
            written = slots < start_b[:, None]
            if kv_seq:
                written = written | ((slots >= start_b[:, None])
                                     & (slots < start_b[:, None] + (kv_seq if valid_b is None
                                                                    else valid_b[:, None])))
            written = written[:, None, :present_len, None]
            for index, past, cache in ((1, past_key, k_cache), (2, past_value, v_cache)):
                if index >= n_out:
                    continue
                out = outs[index]
                if out is None and not used(info, index):
                    results.append(None)
                    continue
                value = cache[:, :, :present_len]
                if out is not None and _same_buffer(out, past):
                    value = xp.where(written, value, out.astype(ct))
                results.append(emit(out, value, cache_dtype))
        results += [None] * (n_out - len(results))

        if n_out > 3 and (outs[3] is not None or (used(info, 3) and qk_output)):
            qk_len = outs[3].shape[3] if outs[3] is not None else total_length(total_tensor)
            qk = probs if qk_output == 2 else xp.where(allowed, scores, ct.type(0.0))
            qk = qk.reshape(batch, num_heads, seq, work_len)
            if qk_len <= work_len:
                qk = qk[..., :qk_len]
            else:
                pad = xp.zeros(qk.shape[:-1] + (qk_len - work_len,), dtype=ct)
                qk = xp.concatenate([qk, pad], axis=-1)
            results[3] = emit(outs[3], qk, dtype, like=query)
        return results

    def run(inputs: list, outs: list) -> list:
        if DECODE_FAST_PATH:
            results = decode_token(inputs, outs)
            if results is not None:
                return results
        return general(inputs, outs)

    def fixed_arrays_form(inputs: list, outs: list) -> Any:
        """The prepared numpy call itself, for the arrays `decode_token` last kept its
        setup for (a launch recorded right after that call passes the same ones)."""
        kept = checked.kept_for(inputs, outs) if DECODE_FAST_PATH else None
        if kept is None or not kept[1]:
            return None
        setup, plan = kept
        present_shape, shared = setup[3], setup[4]
        return lambda ins, outs_: plan.run(ins, outs_, present_shape, shared, local_window)

    return with_fixed_arrays_form(run, fixed_arrays_form)
