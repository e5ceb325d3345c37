"""SkipLayerNormalization and SkipSimplifiedLayerNormalization (com.microsoft).

    sum    = input + skip (+ bias)             (skip broadcasts: [B,S,H], [1,S,H], [S,H])
    output = (sum - mean) * inv_std * gamma (+ beta)       SkipLayerNormalization
    output = sum * inv_rms * gamma                         SkipSimplifiedLayerNormalization

Optional outputs, as onnxruntime's CPU kernel produces them: ``mean`` and
``inv_std_var`` (float32, shape ``sum.shape[:-1] + (1,)``; the simplified op's
``mean`` is all zeros) and ``input_skip_bias_sum`` (the sum, in the input dtype).
Like onnxruntime, the variance is ``E[x^2] - E[x]^2`` and half inputs are summed and
normalised in float32 (the sum output is rounded, the normalisation is not).
"""

from __future__ import annotations

from .contrib import F32, HALF_AND_FLOAT, MS_DOMAIN, compute_dtype, emit, out_dtype, pad_inputs
from .registry import KernelFn, NodeInfo, register


def _build_skip_norm(info: NodeInfo, simplified: bool) -> KernelFn:
    xp = info.xp
    eps = float(info.attr("epsilon", 1e-12))
    dtype = out_dtype(info)
    sum_dtype = out_dtype(info, 3)
    n_in = 4 if simplified else 5

    def run(inputs: list, outs: list) -> list:
        ins = pad_inputs(inputs, n_in)
        if simplified:
            x, skip, gamma, bias = ins[:4]
            beta = None
        else:
            x, skip, gamma, beta, bias = ins[:5]
        ct = compute_dtype(x.dtype)
        s = x.astype(ct) + skip.astype(ct)
        if bias is not None:
            s = s + bias.astype(ct)
        hidden = s.shape[-1]
        mean_sq = xp.sum(s * s, axis=-1, keepdims=True) / ct.type(hidden)
        if simplified:
            mean = None
            denom = xp.sqrt(mean_sq + ct.type(eps))
            y = s / denom * gamma.astype(ct)
        else:
            mean = xp.sum(s, axis=-1, keepdims=True) / ct.type(hidden)
            denom = xp.sqrt(mean_sq - mean * mean + ct.type(eps))
            y = (s - mean) / denom * gamma.astype(ct)
            if beta is not None:
                y = y + beta.astype(ct)
        results: list = [emit(outs[0], y, dtype), None, None, None]
        n_out = len(outs)
        if n_out > 1 and _wanted(info, 1, outs):
            m = xp.zeros(denom.shape, dtype=F32) if mean is None else mean
            results[1] = emit(outs[1], m, F32)
        if n_out > 2 and _wanted(info, 2, outs):
            results[2] = emit(outs[2], ct.type(1.0) / denom, F32)
        if n_out > 3 and _wanted(info, 3, outs):
            results[3] = emit(outs[3], s, sum_dtype)
        return results[:max(n_out, 1)]

    return run


def _wanted(info: NodeInfo, index: int, outs: list) -> bool:
    if outs[index] is not None:
        return True
    return not info.output_used or index >= len(info.output_used) or bool(info.output_used[index])


@register("SkipLayerNormalization", domain=MS_DOMAIN, dtypes=HALF_AND_FLOAT)
def build_skip_layer_norm(info: NodeInfo) -> KernelFn:
    return _build_skip_norm(info, simplified=False)


@register("SkipSimplifiedLayerNormalization", domain=MS_DOMAIN, dtypes=HALF_AND_FLOAT)
def build_skip_simplified_layer_norm(info: NodeInfo) -> KernelFn:
    return _build_skip_norm(info, simplified=True)
