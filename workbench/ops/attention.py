"""Attention (the default domain, opset 23+): its masks, causality, softcap and
qk_matmul_output modes, against onnxruntime's CPU kernel and onnx.reference.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import KernelError
from .attention_math import _masked_softmax, _softcap
from .contrib import (
    F16,
    F32,
    F64,
    compute_dtype,
    emit,
    out_dtype,
    pad_inputs,
    used,
)
from .registry import (
    KernelFn,
    NodeInfo,
    register,
)


@register("Attention", domain="", since=23, dtypes=frozenset({F16, F32, F64}))
def build_attention(info: NodeInfo) -> KernelFn:
    """ONNX Attention (23, 24's nonpad_kv_seqlen, 25's left/right_window_size).

    qk_matmul_output: mode 0 is the scaled Q K^T (before softcap), 1 after softcap, 2 after
    softcap plus the mask, 3 the softmax (onnxruntime's CPU kernel and onnx.reference agree
    on these, except that in mode 2 onnxruntime writes float32's lowest value where a bool
    mask / causality masks, and onnx.reference and the ONNX conformance cases -inf: we
    write -inf). Fully masked rows produce zeros. Causal masking is aligned bottom-right
    behind the past (j <= i + past_len; with nonpad_kv_seqlen j <= i + nonpad[b] - S).
    An attn_mask shorter than the total sequence is padded with masked columns (as
    onnx.reference does; onnxruntime rejects it). bfloat16 is left to the onnx.reference
    fallback, whose bfloat16 intermediate rounding the conformance cases pin down.
    """
    xp = info.xp
    is_causal = int(info.attr("is_causal", 0)) == 1
    q_num_heads = int(info.attr("q_num_heads", 0))
    kv_num_heads = int(info.attr("kv_num_heads", 0))
    scale_attr = info.attr("scale", None)
    softcap = float(info.attr("softcap", 0.0))
    mode = int(info.attr("qk_matmul_output_mode", 0))
    left_window = int(info.attr("left_window_size", -1))
    right_window = int(info.attr("right_window_size", -1))
    if mode not in (0, 1, 2, 3):
        raise KernelError(f"Attention node {info.name!r}: qk_matmul_output_mode={mode}, "
                          "expected 0..3")
    dtype = out_dtype(info)

    def run(inputs: list, outs: list) -> list:
        q_in, k_in, v_in, mask, past_key, past_value, nonpad = pad_inputs(inputs, 7)[:7]
        n_out = len(outs)
        ct = compute_dtype(q_in.dtype)
        three_d = q_in.ndim == 3
        batch = q_in.shape[0]
        if three_d:
            if q_num_heads <= 0 or kv_num_heads <= 0:
                raise KernelError(f"Attention node {info.name!r}: q_num_heads and kv_num_heads "
                                  "are required for 3D inputs")
            head_size = q_in.shape[2] // q_num_heads
            v_head = v_in.shape[2] // kv_num_heads
            q = q_in.reshape(batch, q_in.shape[1], q_num_heads, head_size).transpose(0, 2, 1, 3)
            k = k_in.reshape(batch, k_in.shape[1], kv_num_heads, head_size).transpose(0, 2, 1, 3)
            v = v_in.reshape(batch, v_in.shape[1], kv_num_heads, v_head).transpose(0, 2, 1, 3)
        else:
            q, k, v = q_in, k_in, v_in
        n_q, seq, head_size = q.shape[1], q.shape[2], q.shape[3]
        n_kv = k.shape[1]
        if n_q % n_kv:
            raise KernelError(f"Attention node {info.name!r}: {n_q} query heads are not a "
                              f"multiple of {n_kv} key/value heads")
        group = n_q // n_kv
        past_len = past_key.shape[2] if past_key is not None else 0
        if past_key is not None:
            present_k = xp.concatenate([past_key, k.astype(past_key.dtype, copy=False)], axis=2)
            present_v = xp.concatenate([past_value, v.astype(past_value.dtype, copy=False)], axis=2)
        else:  # present is a copy of K/V (never the caller's input array itself)
            present_k, present_v = k.copy(), v.copy()
        total = present_k.shape[2]
        scale = (1.0 / float(np.sqrt(head_size))) if scale_attr is None else float(scale_attr)

        qg = q.astype(ct, copy=False).reshape(batch, n_kv, group, seq, head_size)
        kc = present_k.astype(ct, copy=False)[:, :, None]
        vc = present_v.astype(ct, copy=False)[:, :, None]
        raw = xp.matmul(qg, kc.swapaxes(-1, -2)) * ct.type(scale)  # [B, KV, G, S, T]
        capped = _softcap(xp, raw, softcap)

        # allowed positions and the additive float mask, broadcast to [B, KV, G, S, T]
        rows = xp.arange(seq, dtype=np.int64)[:, None]
        cols = xp.arange(total, dtype=np.int64)[None, :]
        allowed = xp.ones((1, 1, 1, 1, 1), dtype=bool)
        additive = None
        if mask is not None:
            m = _mask_to_5d(xp, mask, n_kv, group, total, info)
            if m.dtype == np.bool_:
                allowed = allowed & m
            else:
                additive = m.astype(ct, copy=False)
        if nonpad is not None:
            offset = nonpad.reshape(batch, 1, 1).astype(np.int64) - seq  # [B, 1, 1]
            valid_cols = cols[None] < nonpad.reshape(batch, 1, 1).astype(np.int64)
            allowed = allowed & valid_cols[:, None, None]
        else:
            offset = past_len
        if is_causal:
            causal = cols <= rows + offset  # [S, T] or [B, S, T]
            allowed = allowed & (causal[:, None, None] if causal.ndim == 3 else causal)
        if left_window >= 0 or right_window >= 0:
            diff = rows + offset - cols
            win = xp.ones(diff.shape, dtype=bool)
            if left_window >= 0:
                win = win & (diff <= left_window)
            if right_window >= 0:
                win = win & (-diff <= right_window)
            allowed = allowed & (win[:, None, None] if win.ndim == 3 else win)

        biased = capped if additive is None else capped + additive
        structural = allowed  # bool mask, causal, windows, padding (not the float mask)
        allowed = allowed & ~xp.isneginf(biased)
        probs = _masked_softmax(xp, biased, allowed)
        y = xp.matmul(probs, vc)  # [B, KV, G, S, Hv]
        y = y.reshape(batch, n_q, seq, y.shape[-1])
        if three_d:
            y = y.transpose(0, 2, 1, 3).reshape(batch, seq, -1)
        results: list = [emit(outs[0], y, dtype, like=q_in)]
        if n_out > 1:
            results.append(emit(outs[1], present_k, out_dtype(info, 1)) if _want(info, outs, 1)
                           else None)
        if n_out > 2:
            results.append(emit(outs[2], present_v, out_dtype(info, 2)) if _want(info, outs, 2)
                           else None)
        if n_out > 3:
            if _want(info, outs, 3):
                if mode == 0:
                    qk = raw
                elif mode == 1:
                    qk = capped
                elif mode == 2:
                    qk = xp.where(structural, biased, ct.type(-np.inf))
                else:
                    qk = probs
                results.append(emit(outs[3], qk.reshape(batch, n_q, seq, total),
                                    out_dtype(info, 3)))
            else:
                results.append(None)
        return results

    return run


def _want(info: NodeInfo, outs: list, index: int) -> bool:
    return outs[index] is not None or used(info, index)


def _mask_to_5d(xp: Any, mask: Any, n_kv: int, group: int, total: int, info: NodeInfo) -> Any:
    """attn_mask broadcast right-aligned to [B|1, N|1, S|1, T] and split N into (KV, G)."""
    if mask.shape[-1] > total:
        raise KernelError(f"Attention node {info.name!r}: attn_mask has last dimension "
                          f"{mask.shape[-1]}, more than the total sequence length {total}")
    if mask.shape[-1] < total:  # the missing key columns are masked
        fill = False if mask.dtype == np.bool_ else -np.inf
        pad = xp.full(mask.shape[:-1] + (total - mask.shape[-1],), fill, dtype=mask.dtype)
        mask = xp.concatenate([mask, pad], axis=-1)
    m = mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape))
    b, n = m.shape[0], m.shape[1]
    if n == 1:
        return m.reshape(b, 1, 1, m.shape[2], total)
    return m.reshape(b, n_kv, group, m.shape[2], total)
