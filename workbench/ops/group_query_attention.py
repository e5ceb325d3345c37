"""GroupQueryAttention (com.microsoft), as onnxruntime's CPU kernel computes it: the
node's attributes (`GqaAttributes`), the general path (`general_attention`, a pure
function of them and the arrays) and the kernel builder, which puts the one-token
decode path (`gqa_decode.OneTokenDecode`) in front of the general one. RotaryEmbedding
is `rotary`, the default domain's Attention `attention`, the pieces they share
`attention_math`.

Per-batch lengths stay on the device: masks and KV cache writes are built from those
arrays, never from host copies of their values, so the kernels stay recordable into a
device graph. The host reads are total_sequence_length's value where an output's shape
needs it and the executor could not preallocate it, and the one-token path's position
in the host variant (read at every call). Where the plan asks for onnxruntime's rounding
(`NodeInfo.onnxruntime_rounding`), float32 on the numpy backend rounds as onnxruntime's
CPU kernels do, bit for bit (MLAS's rotary kernel, `onnxruntime_rotary`, and its flash
and decode attention kernels, `mlas_attention`); elsewhere numpy's own arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from ..errors import KernelError
from . import mlas_attention, mlas_isa, mlas_jit
from .attention_math import _clamp, _masked_softmax, _same_buffer, _softcap
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
from .gqa_decode import OneTokenDecode, total_length
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
from .rotary import _gather_rows, onnxruntime_rotary, rotate


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

#: GroupQueryAttention's one-token decode fast path; tests switch it off to compare it
#: with the general path
DECODE_FAST_PATH = True


@dataclass(frozen=True, slots=True)
class GqaAttributes:
    """A GroupQueryAttention node's attributes, parsed and checked once (`parse`)."""

    name: str  # the node's, for error messages
    num_heads: int
    kv_num_heads: int
    group: int  # query heads per KV head
    scale: float  # 0.0: 1 / sqrt(head size)
    softcap: float  # 0.0: none
    local_window: int  # -1: none
    do_rotary: bool
    interleaved: bool
    smooth_softmax: bool
    causal: bool
    qk_output: int  # output_qk: 0 none, 1 the masked scores, 2 the probabilities

    @classmethod
    def parse(cls, info: NodeInfo) -> GqaAttributes:
        """The attributes of `info`'s node; KernelError for what onnxruntime's CPU kernel
        rejects or this one does not support (a quantized or windowed KV cache)."""
        num_heads = int(info.attr("num_heads"))
        kv_num_heads = int(info.attr("kv_num_heads"))
        if num_heads <= 0 or kv_num_heads <= 0 or num_heads % kv_num_heads:
            raise KernelError(f"GroupQueryAttention node {info.name!r}: num_heads={num_heads} must "
                              f"be a positive multiple of kv_num_heads={kv_num_heads}")
        scale = float(info.attr("scale", 0.0))
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
        return cls(info.name, num_heads, kv_num_heads, num_heads // kv_num_heads, scale, softcap, local_window,
                   do_rotary, interleaved, smooth_softmax, causal, qk_output)


def general_attention(attrs: GqaAttributes, inputs: list, outs: list, *, xp: Any, dtype: np.dtype | None,
                      used_outputs: tuple, const_total: int | None, exact_rotary: bool,
                      exact_attention: bool) -> list:
    """GroupQueryAttention for any batch and sequence: [output, present_key?,
    present_value?, output_qk?] (into `outs` where given).

    Per batch entry b: T_b = seqlens_k[b] + 1 keys exist after this step. Query row s sits
    at absolute position P_b + s, where P_b = T_b - query_seqlens[b] when query_seqlens is
    given, else max(T_b - S, 0) (a first prompt, S == total_sequence_length, has P_b = 0
    and may be right-padded). New key/value rows (all S, or the valid query_seqlens[b])
    land at [P_b, ...) of the present cache; the present cache holds past rows [0, P_b),
    the new rows and zeros elsewhere, or, when present is the very buffer of past (shared
    KV buffer), only the new rows are written. The present length is max(total, past).

    `xp` is the backend's array module, `dtype` the output's (None: the query's),
    `used_outputs[i]` whether output i was asked for, `const_total` the constant
    total_sequence_length (None: read on the host where a shape needs it);
    `exact_rotary` / `exact_attention` take onnxruntime's rounding (numpy, float32)."""
    num_heads, kv_num_heads, group = attrs.num_heads, attrs.kv_num_heads, attrs.group
    scale, softcap, local_window = attrs.scale, attrs.softcap, attrs.local_window
    causal, qk_output = attrs.causal, attrs.qk_output
    (query, key, value, past_key, past_value, seqlens_k, total_tensor, cos_cache, sin_cache,
     position_ids, attention_bias, head_sink, k_scale, v_scale, q_norm, k_norm,
     query_seqlens) = pad_inputs(inputs, _GQA_INPUTS)[:_GQA_INPUTS]
    if q_norm is not None or k_norm is not None:
        raise KernelError(f"GroupQueryAttention node {attrs.name!r}: q_norm_weight/"
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

    if attrs.do_rotary:
        if cos_cache is None or sin_cache is None:
            raise KernelError(f"GroupQueryAttention node {attrs.name!r}: do_rotary=1 needs "
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
        q = rotate(xp, q, cos, sin, rot_dim, attrs.interleaved, exact_rotary)
        if kv_seq:
            k_new = rotate(xp, k_new, cos[:, :, :kv_seq], sin[:, :, :kv_seq], rot_dim, attrs.interleaved,
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
    want_present = any(index < n_out and (outs[index] is not None or used_outputs[index])
                       for index in (1, 2))
    if present_len is None and want_present:
        present_len = max(total_length(const_total, total_tensor), past_len)
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

    qk_wanted = n_out > 3 and (outs[3] is not None or (used_outputs[3] and bool(qk_output)))
    attn = None
    if (exact_attention and causal and query_seqlens is None and head_sink is None and not qk_wanted
            and ct == F32 and np.dtype(query.dtype) == F32 and np.dtype(cache_dtype) == F32
            and all(index < n_out and (outs[index] is not None or used_outputs[index]) for index in (1, 2))):
        attn = attention_as_onnxruntime(q, k_cache, v_cache, seqlens_k, attention_bias, kv_heads=kv_num_heads,
                                        scale=scale, local_window=local_window)  # [B, N, S, H]
    if attn is None:
        # scores [B, KV, G, S, L]
        alpha = scale if scale != 0.0 else 1.0 / float(np.sqrt(head_size))
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
        elif attrs.smooth_softmax:
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
            if out is None and not used_outputs[index]:
                results.append(None)
                continue
            value = cache[:, :, :present_len]
            if out is not None and _same_buffer(out, past):
                value = xp.where(written, value, out.astype(ct))
            results.append(emit(out, value, cache_dtype))
    results += [None] * (n_out - len(results))

    if n_out > 3 and (outs[3] is not None or (used_outputs[3] and qk_output)):
        qk_len = outs[3].shape[3] if outs[3] is not None else total_length(const_total, total_tensor)
        qk = probs if qk_output == 2 else xp.where(allowed, scores, ct.type(0.0))
        qk = qk.reshape(batch, num_heads, seq, work_len)
        if qk_len <= work_len:
            qk = qk[..., :qk_len]
        else:
            pad = xp.zeros(qk.shape[:-1] + (qk_len - work_len,), dtype=ct)
            qk = xp.concatenate([qk, pad], axis=-1)
        results[3] = emit(outs[3], qk, dtype, like=query)
    return results


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

    One-token decode (batch 1, S 1, no query_seqlens or output_qk, a past and both
    presents) takes `OneTokenDecode`; every other case `general_attention`, with which it
    agrees to float32 rounding. The host variant (`host`) adds the prepared one-token
    decode (`HostDecode`) with its compiled forms, MLAS's rotary and flash attention where
    the plan asks for onnxruntime's rounding, and reads the position from host arrays.
    """
    attrs = GqaAttributes.parse(info)
    dtype = out_dtype(info)
    const_total = info.constant_inputs.get(_I_TOTAL)
    const_total = None if const_total is None else int(np.asarray(const_total).reshape(-1)[0])

    plain_host = host and attrs.softcap == 0.0 and not attrs.smooth_softmax
    # float32 on the host where the plan asks for onnxruntime's rounding: MLAS's rotary
    # kernel, and, where onnxruntime runs MLAS's FMA3 or AVX-512F softmax, its flash attention
    # (`mlas_attention`; softcap and smooth softmax take onnxruntime's other path)
    exact_rotary = host and onnxruntime_rotary(info)
    mlas_host = plain_host and attrs.local_window != 0 and mlas_isa.isa() in ("avx2", "avx512")
    exact_attention = exact_rotary and mlas_host
    # the one-token decode on the host takes onnxruntime's rounding also where the plan
    # does not ask for it, when that runs compiled (`mlas_jit`): then it is the fastest form
    # too (a few microseconds a call against numpy's twenty calls)
    compiled_decode = (info.faster_onnxruntime_rounding and mlas_host and mlas_jit.available("rotate_rows")
                       and mlas_jit.available("decode_attention"))

    used_outputs = tuple(used(info, index) for index in range(4))
    decode = OneTokenDecode(attrs, xp=info.xp, host=host, dtype=dtype, const_total=const_total,
                            used_present=used_outputs[1:3], used_qk=bool(attrs.qk_output) and used_outputs[3],
                            plain_host=plain_host, decode_rotary=exact_rotary or compiled_decode,
                            decode_attention=exact_attention or compiled_decode,
                            initializers=info.initializer_inputs)
    general = partial(general_attention, attrs, xp=info.xp, dtype=dtype, used_outputs=used_outputs,
                      const_total=const_total, exact_rotary=exact_rotary, exact_attention=exact_attention)
    decode_token, checked, local_window = decode.decode_token, decode.checked, attrs.local_window

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
        present_shape, shared = setup.present_shape, setup.shared
        return lambda ins, outs_: plan.run(ins, outs_, present_shape, shared, local_window)

    return with_fixed_arrays_form(run, fixed_arrays_form)
