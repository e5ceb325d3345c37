"""The attention and embedding ops ``onnxruntime.transformers`` fusions write for BERT- and
GPT-style models (``com.microsoft``): Attention, MultiHeadAttention,
EmbedLayerNormalization.

Semantics of onnxruntime's CPU kernels (``contrib_ops/cpu/bert``), pinned against it by
``tests/ops/test_bert_ops_ort.py``:

- Attention: ``QKV = input @ weights (+ bias)``, split by ``qkv_hidden_sizes`` (default
  three equal parts) into ``num_heads`` heads; ``past`` ``[2, B, N, P, H]`` is prepended to
  K and V and ``present`` is the concatenation. MultiHeadAttention: separate query / key /
  value (``[B, S, D]``), a packed QKV query ``[B, S, N, 3, H]``, a packed KV key
  ``[B, L, N, 2, H]``, or key / value already in heads ``[B, N, L, H]`` (cross attention:
  no bias on them, no past); ``past_key`` / ``past_value`` ``[B, N, P, H]``.
- Scores ``scale * Q K^T`` (``scale`` default ``1 / sqrt(head_size)``) plus a mask term:
  a raw 0/1 mask (2-D ``[B, T]`` or 3-D ``[B, S, T]``) adds ``mask_filter_value``
  (default -10000) where it is 0; a 1-D ``[B]`` mask index masks positions at or past
  each batch's end, ``[2B]`` also those before its start; ``unidirectional`` sets future
  positions to the float32 lowest value (not -inf: a fully masked row stays finite, as
  onnxruntime leaves it). ``attention_bias`` ``[B|1, N|1, S, T]`` is added, then softmax
  over T, then ``@ V``, heads merged back to ``[B, S, N * Hv]``.
- EmbedLayerNormalization: ``word[input_ids] + position[position_ids] (+ segment[segment_ids])``
  (position ids default ``0..S-1``), layer-normalized over the hidden axis with ``gamma`` /
  ``beta``; ``mask_index`` (output 1) is each batch row's count of nonzero mask entries
  (zeros without a mask), ``embedding_sum`` (output 2) the sum before normalization.
  An id outside its table raises KernelError on the CPU (onnxruntime refuses it too).

Half-precision inputs are widened to float32 and rounded once at the end.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import KernelError
from .contrib import F32, HALF_AND_FLOAT, MS_DOMAIN, compute_dtype, emit, out_dtype, pad_inputs, used
from .registry import KernelFn, NodeInfo, register

_LOWEST = np.finfo(np.float32).min


def _where(info: NodeInfo) -> str:
    return f"{info.op_type} node {info.name!r}"


def _split_heads(x: Any, heads: int, where: str, what: str) -> Any:
    """[B, S, N * H] -> [B, N, S, H]."""
    b, s, d = x.shape
    if d % heads:
        raise KernelError(f"{where}: {what} width {d} is not a multiple of num_heads={heads}")
    return x.reshape(b, s, heads, d // heads).transpose(0, 2, 1, 3)


def mask_term(xp: Any, mask: Any, batch: int, seq: int, past: int, total: int, causal: bool, filter_value: float,
              where: str) -> Any:
    """onnxruntime's PrepareMask: the additive term [B, 1, S, T] (None: no mask at all)."""
    term = None
    if mask is not None:
        if mask.ndim == 2:
            if tuple(mask.shape) != (batch, total):
                raise KernelError(f"{where}: a 2-D mask must be [batch, total_sequence_length] = "
                                  f"{(batch, total)}, got {tuple(mask.shape)}")
            term = xp.where(mask > 0, np.float32(0), np.float32(filter_value))[:, None, None, :]
            term = xp.broadcast_to(term, (batch, 1, seq, total))
        elif mask.ndim == 3:
            if tuple(mask.shape) != (batch, seq, total):
                raise KernelError(f"{where}: a 3-D mask must be [batch, sequence, total] = {(batch, seq, total)}, "
                                  f"got {tuple(mask.shape)}")
            term = xp.where(mask > 0, np.float32(0), np.float32(filter_value))[:, None]
        elif mask.ndim == 1 and mask.shape[0] in (batch, 2 * batch):
            pos = xp.arange(total)[None, :]
            end = mask[:batch].astype(np.int64)[:, None]
            masked = pos >= end
            if mask.shape[0] == 2 * batch:
                start = xp.minimum(mask[batch:].astype(np.int64), total)[:, None]
                masked = masked | (pos < start)
            term = xp.where(masked, np.float32(filter_value), np.float32(0))[:, None, None, :]
            term = xp.broadcast_to(term, (batch, 1, seq, total))
        else:
            raise KernelError(f"{where}: mask of shape {tuple(mask.shape)} is not supported (expected [B], [2B], "
                              f"[B, T] or [B, S, T]; onnxruntime's CPU kernel has no 4-D mask)")
    if causal:
        rows = xp.arange(seq)[:, None] + past
        future = xp.arange(total)[None, :] > rows  # [S, T]
        base = xp.zeros((batch, 1, seq, total), dtype=F32) if term is None else term.astype(F32)
        term = xp.where(future[None, None], np.float32(_LOWEST), base)
    return term


def attend(xp: Any, q: Any, k: Any, v: Any, scale: float, term: Any, bias: Any) -> tuple[Any, Any]:
    """softmax(scale * q k^T + term + bias) @ v for [B, N, S, H] heads; (out, probs)."""
    scores = xp.matmul(q, xp.swapaxes(k, -1, -2)) * np.float32(scale)
    if term is not None:
        scores = scores + term
    if bias is not None:
        scores = scores + bias.astype(F32, copy=False)
    top = scores.max(axis=-1, keepdims=True)
    e = xp.exp(scores - top)
    probs = e / e.sum(axis=-1, keepdims=True)
    return xp.matmul(probs, v), probs


def _merge_heads(x: Any) -> Any:
    b, n, s, h = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, s, n * h)


def _scale(info: NodeInfo, head_size: int) -> float:
    scale = float(info.attr("scale", 0.0))
    return scale if scale != 0.0 else 1.0 / float(np.sqrt(head_size))


@register("Attention", domain=MS_DOMAIN, dtypes=HALF_AND_FLOAT)
def build_attention(info: NodeInfo) -> KernelFn:
    xp = info.xp
    where = _where(info)
    heads = int(info.attr("num_heads", 0))
    causal = bool(info.attr("unidirectional", 0))
    filter_value = float(info.attr("mask_filter_value", -10000.0))
    sizes = list(info.attr("qkv_hidden_sizes", []) or [])
    if heads <= 0:
        raise KernelError(f"{where}: num_heads must be positive, got {heads}")
    if int(info.attr("do_rotary", 0)):
        raise KernelError(f"{where}: do_rotary=1 is not supported (onnxruntime's CPU kernel rejects it too)")
    if sizes and len(sizes) != 3:
        raise KernelError(f"{where}: qkv_hidden_sizes must have 3 entries, got {sizes}")
    dtype = out_dtype(info)

    def run(inputs: list, outs: list) -> list:
        x, weights, bias, mask, past, attention_bias, past_len = pad_inputs(inputs, 7)[:7]
        if x.ndim != 3 or weights.ndim != 2 or weights.shape[0] != x.shape[2]:
            raise KernelError(f"{where}: input {tuple(x.shape)} and weights {tuple(weights.shape)} do not fit "
                              "(expected [B, S, D] and [D, q + k + v])")
        if past_len is not None:
            raise KernelError(f"{where}: past_sequence_length (a shared past/present buffer) is CUDA-only; "
                              "the CPU kernel takes past [2, B, N, P, H]")
        if past is not None and attention_bias is not None:
            raise KernelError(f"{where}: past and attention_bias together are not supported (as in onnxruntime)")
        ct = compute_dtype(x.dtype)
        qs, ks, vs = sizes if sizes else [weights.shape[1] // 3] * 3
        if qs + ks + vs != weights.shape[1] or qs != ks:
            raise KernelError(f"{where}: weights have {weights.shape[1]} columns for q/k/v sizes {(qs, ks, vs)} "
                              "(q and k must be equal)")
        qkv = xp.matmul(x.astype(ct, copy=False), weights.astype(ct, copy=False))
        if bias is not None:
            qkv = qkv + bias.astype(ct, copy=False)
        q = _split_heads(qkv[..., :qs], heads, where, "q")
        k = _split_heads(qkv[..., qs:qs + ks], heads, where, "k")
        v = _split_heads(qkv[..., qs + ks:], heads, where, "v")
        batch, seq = x.shape[0], x.shape[1]
        past_seq = 0
        if past is not None:
            if past.ndim != 5 or past.shape[0] != 2 or past.shape[1] != batch or past.shape[2] != heads:
                raise KernelError(f"{where}: past must be [2, {batch}, {heads}, P, H], got {tuple(past.shape)}")
            past_seq = past.shape[3]
            k = xp.concatenate([past[0].astype(ct), k], axis=2)
            v = xp.concatenate([past[1].astype(ct), v], axis=2)
        total = past_seq + seq
        term = mask_term(xp, mask, batch, seq, past_seq, total, causal, filter_value, where)
        y, _ = attend(xp, q, k, v, _scale(info, qs // heads), term, attention_bias)
        results = [emit(outs[0], _merge_heads(y), dtype, like=x)]
        if len(outs) > 1:
            results.append(emit(outs[1], xp.stack([k, v]), out_dtype(info, 1), like=x) if used(info, 1) else None)
        return results

    return run


@register("MultiHeadAttention", domain=MS_DOMAIN, dtypes=HALF_AND_FLOAT)
def build_multi_head_attention(info: NodeInfo) -> KernelFn:
    xp = info.xp
    where = _where(info)
    heads = int(info.attr("num_heads", 0))
    causal = bool(info.attr("unidirectional", 0))
    filter_value = float(info.attr("mask_filter_value", -10000.0))
    if heads <= 0:
        raise KernelError(f"{where}: num_heads must be positive, got {heads}")
    dtype = out_dtype(info)

    def run(inputs: list, outs: list) -> list:
        (query, key, value, bias, key_padding_mask, attention_bias, past_key, past_value,
         past_len, cache_indirection) = pad_inputs(inputs, 10)[:10]
        if past_len is not None or cache_indirection is not None:
            raise KernelError(f"{where}: past_sequence_length / cache_indirection (decoder masked attention, beam "
                              "search) are not supported")
        ct = compute_dtype(query.dtype)
        batch, seq = query.shape[0], query.shape[1]
        kv_in_heads = False
        if query.ndim == 5:  # packed QKV [B, S, N, 3, H]
            if key is not None or value is not None or query.shape[2] != heads or query.shape[3] != 3:
                raise KernelError(f"{where}: a 5-D query must be packed QKV [B, S, {heads}, 3, H] with no key/value")
            h = query.shape[4]
            qkv = query.astype(ct)
            if bias is not None:
                qkv = qkv + bias.astype(ct).reshape(3, heads, h).transpose(1, 0, 2)
            q, k, v = (qkv[:, :, :, i].transpose(0, 2, 1, 3) for i in range(3))
        else:
            if query.ndim != 3 or key is None:
                raise KernelError(f"{where}: query must be [B, S, D] with a key (or packed QKV [B, S, N, 3, H]), "
                                  f"got query {tuple(query.shape)}")
            d = query.shape[2]
            q = query.astype(ct)
            if bias is not None:
                q = q + bias[:d].astype(ct)
            q = _split_heads(q, heads, where, "query")
            if key.ndim == 5:  # packed KV [B, L, N, 2, H]
                if value is not None or key.shape[2] != heads or key.shape[3] != 2:
                    raise KernelError(f"{where}: a 5-D key must be packed KV [B, L, {heads}, 2, H] with no value")
                kv = key.astype(ct)
                if bias is not None:
                    h = key.shape[4]
                    kv = kv + bias[d:].astype(ct).reshape(2, heads, h).transpose(1, 0, 2)
                k, v = kv[:, :, :, 0].transpose(0, 2, 1, 3), kv[:, :, :, 1].transpose(0, 2, 1, 3)
            elif key.ndim == 4:  # already in heads [B, N, L, H] (cross attention)
                if value is None or value.ndim != 4:
                    raise KernelError(f"{where}: a 4-D key needs a 4-D value [B, N, L, Hv]")
                k, v = key.astype(ct), value.astype(ct)
                kv_in_heads = True
            else:
                if value is None or key.ndim != 3 or value.ndim != 3:
                    raise KernelError(f"{where}: key and value must be [B, L, D], got {tuple(key.shape)} and "
                                      f"{None if value is None else tuple(value.shape)}")
                kb, vb = key.astype(ct), value.astype(ct)
                if bias is not None:
                    kb = kb + bias[d:2 * d].astype(ct)
                    vb = vb + bias[2 * d:].astype(ct)
                k, v = _split_heads(kb, heads, where, "key"), _split_heads(vb, heads, where, "value")
        past_seq = 0
        if past_key is not None and not kv_in_heads:
            if past_value is None or past_key.ndim != 4:
                raise KernelError(f"{where}: past_key / past_value must both be [B, N, P, H]")
            past_seq = past_key.shape[2]
            k = xp.concatenate([past_key.astype(ct), k], axis=2)
            v = xp.concatenate([past_value.astype(ct), v], axis=2)
        total = k.shape[2]
        term = mask_term(xp, key_padding_mask, batch, seq, past_seq, total, causal, filter_value, where)
        y, probs = attend(xp, q, k, v, _scale(info, q.shape[-1]), term, attention_bias)
        results = [emit(outs[0], _merge_heads(y), dtype, like=query)]
        for index, value_out in ((1, k), (2, v)):
            if len(outs) > index:
                results.append(emit(outs[index], value_out, out_dtype(info, index), like=query)
                               if used(info, index) else None)
        if len(outs) > 3:
            results.append(emit(outs[3], probs, out_dtype(info, 3), like=query) if used(info, 3) else None)
        return results

    return run


@register("EmbedLayerNormalization", domain=MS_DOMAIN, dtypes=frozenset({np.dtype(np.int32)}))
def build_embed_layer_normalization(info: NodeInfo) -> KernelFn:
    xp = info.xp
    where = _where(info)
    eps = np.float32(info.attr("epsilon", 1e-12))
    mask_index_type = int(info.attr("mask_index_type", 1))

    def gather(table: Any, ids: Any, what: str) -> Any:
        try:  # numpy raises on an id outside the table (as onnxruntime refuses it); CuPy clips
            return xp.take(table.astype(F32, copy=False), ids.astype(np.int64), axis=0)
        except IndexError:
            raise KernelError(f"{where}: {what} holds an id outside [0, {table.shape[0]})") from None

    def run(inputs: list, outs: list) -> list:
        (ids, segment_ids, word, position, segment, gamma, beta, mask,
         position_ids) = pad_inputs(inputs, 9)[:9]
        if ids.ndim != 2:
            raise KernelError(f"{where}: input_ids must be [batch, sequence], got {tuple(ids.shape)}")
        batch, seq = ids.shape
        dtype = word.dtype
        total = gather(word, ids, "input_ids")
        if position_ids is None:
            pos = xp.broadcast_to(xp.arange(seq, dtype=np.int64)[None, :], (batch, seq))
        else:
            pos = xp.broadcast_to(position_ids.reshape(-1, seq), (batch, seq))
        total = total + gather(position, pos, "position_ids")
        if segment_ids is not None and segment is not None:
            total = total + gather(segment, segment_ids, "segment_ids")
        mean = total.mean(axis=-1, keepdims=True)
        centred = total - mean
        var = (centred * centred).mean(axis=-1, keepdims=True)
        y = centred / xp.sqrt(var + eps) * gamma.astype(F32) + beta.astype(F32)
        results = [emit(outs[0], y, dtype)]
        if len(outs) > 1:
            if not used(info, 1) or mask_index_type == 0:
                results.append(None)
            else:
                count = (mask != 0).sum(axis=1).astype(np.int32) if mask is not None else \
                    xp.zeros((batch,), dtype=np.int32)
                results.append(emit(outs[1], count, np.dtype(np.int32)))
        if len(outs) > 2:
            results.append(emit(outs[2], total, dtype) if used(info, 2) else None)
        return results

    return run
