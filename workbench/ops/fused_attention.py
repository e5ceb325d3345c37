"""ai.workbench MaskedSoftmaxAttention: the decomposed attention torch-style exports
write out op by op, as one kernel (emitted by the load-time rule
`rewrite.fusion_attention`; no model file carries it).

Inputs ``(Q, K, V, mask, scale, fill?, key_scale?)``, attributes ``kv_repeat`` (r >= 1),
``mask_mode`` ("where" | "add"), ``nan_guard`` (0 | 1) and ``q_width`` (a scale computed at
load from Q's width, checked at run time; 0: none). It computes exactly what the
chain it replaces computes, op for op, in the inputs' dtype::

    K_r, V_r = K, V with each head repeated r times (head h reads kv head h // r:
               Unsqueeze(2) -> Expand(r) -> Reshape, i.e. repeat_kv)
    scores   = MatMul(Q, Transpose(K_r, [0, 1, 3, 2])) * scale
             | MatMul(Q * scale, Transpose(K_r, [0, 1, 3, 2]) * key_scale)
                                                  # key_scale given: the scale split
                                                  # over both sides, as torch's
                                                  # scaled_dot_product_attention exports
    masked   = Where(mask, scores, fill)          # mask_mode "where" (mask bool)
             | scores + mask                      # mask_mode "add"
    probs    = Softmax(masked, axis=-1)
             | Where(IsNaN(probs), 0, probs)      # nan_guard 1: torch's guard for rows
                                                  # an additive -inf mask masks fully
    out      = MatMul(probs, V_r)

so a fully masked row behaves as it did unfused: Where(mask, s, -3.4e38) gives a
uniform softmax, an additive -inf mask NaN (no special casing of either). One float32
query token on the host runs compiled where numba is (`attention_jit`: the same
arithmetic in one call, its sums in another order than BLAS's), unless the model
rounds as onnxruntime.

The repeated heads are never materialised on the common path: Q [B, Hkv * r, S, D] is
read as [B, Hkv, r * S, D] (query heads of one kv head are adjacent), one batched
MatMul per kv head gives the scores of its r query heads, and the probabilities are
multiplied by V the same way. Each score is the same length-D dot product as before
(only the BLAS blocking may differ: float rounding). Where broadcasting would make the
masked scores larger than [B, Hq, S, L] (a mask with more rows than the scores), or Q's
heads are not Hkv * r, K / V are repeated explicitly and the plain broadcast MatMuls
run, as the unfused graph would. Branches depend on shapes only, never on values: the
kernel makes no host read and records into a device graph.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import attention_jit
from .contrib import F32, F64, attr_str, emit, out_dtype, pad_inputs
from .registry import KernelFn, NodeInfo, register
from .softmax import _softmax_into

#: the private domain of kernels the load-time rewrites emit (not an ONNX standard op)
WORKBENCH_DOMAIN = "ai.workbench"


def _repeat_heads(xp: Any, x: Any, repeat: int) -> Any:
    """x [B, Hkv, L, D] -> [B, Hkv * r, L, D], head h a copy of head h // r."""
    return x if repeat == 1 else xp.repeat(x, repeat, axis=1)


def _settings(info: NodeInfo) -> tuple:
    """(kv_repeat, mask_mode, nan_guard, q_width, output dtype) of a node."""
    return (int(info.attr("kv_repeat", 1)), attr_str(info, "mask_mode", "where"), bool(info.attr("nan_guard", 0)),
            int(info.attr("q_width", 0)), out_dtype(info))


@register("MaskedSoftmaxAttention", domain=WORKBENCH_DOMAIN, dtypes=frozenset({F32, F64}))
def build_masked_softmax_attention(info: NodeInfo) -> KernelFn:
    xp = info.xp
    repeat, mode, nan_guard, q_width, dtype = _settings(info)

    def run(inputs: list, outs: list) -> tuple:
        q, k, v, mask, scale, fill, key_scale = pad_inputs(inputs, 7)[:7]
        if q_width and q.shape[-1] != q_width:
            raise ValueError(f"Q is {q.shape[-1]} wide; the scale was computed at load for width {q_width} "
                             "(the model's inferred shapes)")
        if key_scale is not None:
            # each element scaled as the chain scales it; K before the repeat (a copy of
            # heads) and the transpose, which move elements without changing them
            q, k = q * scale, k * key_scale
        grouped = (repeat > 1 and q.ndim == 4 and k.ndim == 4 and v.ndim == 4
                   and q.shape[1] == k.shape[1] * repeat and v.shape[1] == k.shape[1])
        if grouped:
            batch, heads, seq, width = q.shape
            kv_heads = k.shape[1]
            scores = xp.matmul(q.reshape(batch, kv_heads, repeat * seq, width), xp.swapaxes(k, -1, -2))
            scores = scores.reshape(scores.shape[0], heads, seq, scores.shape[-1])
        else:
            scores = xp.matmul(q, xp.swapaxes(_repeat_heads(xp, k, repeat), -1, -2))
        if key_scale is None:
            scores = xp.multiply(scores, scale, out=scores) if scale.ndim <= scores.ndim else scores * scale
        masked = xp.where(mask, scores, fill) if mode == "where" else xp.add(scores, mask)
        if masked.size:
            masked = _softmax_into(xp, masked, (-1,), masked)
            if nan_guard:
                xp.copyto(masked, 0, where=xp.isnan(masked))
        if grouped and tuple(masked.shape) == tuple(scores.shape):
            rows = masked.reshape(masked.shape[0], kv_heads, repeat * seq, masked.shape[-1])
            y = xp.matmul(rows, v)
            y = y.reshape(y.shape[0], heads, seq, y.shape[-1])
        else:
            y = xp.matmul(masked, _repeat_heads(xp, v, repeat))
        return (emit(outs[0], y, dtype, like=q),)

    return run


@register("MaskedSoftmaxAttention", domain=WORKBENCH_DOMAIN, dtypes=frozenset({F32, F64}), host=True)
def build_masked_softmax_attention_host(info: NodeInfo) -> KernelFn:
    """The host variant: one float32 query token compiled (`attention_jit`; not where
    the model rounds as onnxruntime), the generic kernel for the rest."""
    generic = build_masked_softmax_attention(info)
    if info.onnxruntime_rounding or not attention_jit.available():
        return generic
    repeat, mode, nan_guard, q_width, dtype = _settings(info)

    def one_token(q: Any, k: Any, v: Any, mask: Any, scale: Any, fill: Any, key_scale: Any, out: Any) -> Any:
        """`attention_jit.decode` where the arrays are one float32 token's (Q [1, H, 1, D],
        K / V [1, H / r, T, D], a mask of one row per head or one for all, scalar scales
        and fill), else None."""
        batch, heads, seq, width = q.shape
        if (batch != 1 or seq != 1 or q.dtype != F32 or k.dtype != F32 or v.dtype != F32 or k.ndim != 4
                or k.shape != v.shape or k.shape[0] != 1 or k.shape[3] != width or k.shape[1] * repeat != heads
                or scale.size != 1 or scale.dtype != F32 or mask.ndim != 4 or mask.shape[0] != 1
                or mask.shape[2] != 1 or mask.shape[1] not in (1, heads) or mask.shape[3] != k.shape[2]
                or (key_scale is not None and (key_scale.size != 1 or key_scale.dtype != F32))):
            return None
        if mode == "where":
            if mask.dtype != np.bool_ or fill is None or fill.size != 1:
                return None
            keep, bias, fill_value = mask[0, :, 0], None, F32.type(fill.reshape(-1)[0])
        else:
            if mask.dtype != F32:
                return None
            keep, bias, fill_value = None, mask[0, :, 0], F32.type(0)
        target = out if out is not None and out.dtype == F32 and out.shape == q.shape and out.flags.c_contiguous \
            else np.empty(q.shape, F32)
        attention_jit.decode(q.reshape(heads, width), k[0], v[0], repeat, F32.type(scale.reshape(-1)[0]), keep,
                             bias, fill_value, nan_guard, target.reshape(heads, width),
                             None if key_scale is None else F32.type(key_scale.reshape(-1)[0]))
        return target

    def run(inputs: list, outs: list) -> tuple:
        q, k, v, mask, scale, fill, key_scale = pad_inputs(inputs, 7)[:7]
        if q.ndim == 4 and (not q_width or q.shape[-1] == q_width):
            y = one_token(q, k, v, mask, scale, fill, key_scale, outs[0])
            if y is not None:
                return (emit(outs[0], y, dtype, like=q),)
        return generic(inputs, outs)

    return run
