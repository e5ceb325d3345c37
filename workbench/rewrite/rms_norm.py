"""Fusion rule ``rms_norm`` (levels "extended", "all"): RMSNorm written out op by op, as one node.

What it rewrites: x -> Pow(2) | Mul(x, x) -> ReduceMean(last axis, keepdims) -> Add(eps)
-> Sqrt -> Reciprocal | Div(1, .) -> Mul(x, .) -> Mul(weight), or Div(x, Sqrt)
-> Mul(weight), as default-domain SimplifiedLayerNormalization(x, weight, axis=-1,
epsilon=eps).

When it applies: x has a static rank and is float32 / float64, the mean is over the
last axis only, eps is a constant >= 0, and the weight is 1-D of x's last width in
the chain's dtype. Mixed precision, Cast(x to float32) ... Cast(back to float16) ->
Mul(weight in float16), is matched too: the leading Cast goes with the chain when the
chain alone reads its output, else it stays and the fused node normalises its float32
output.

The invariant: SimplifiedLayerNormalization computes x / sqrt(mean(x^2) + eps) * weight
over the last axis, which is what the chain computes; only the summation order of
the mean may differ (float rounding). With the Casts, the kernel does as they did:
statistics and normalisation in float32, Y in the weight's dtype (float16); the chain
rounds to float16 before the weight and after it, the kernel once, at the end, so the
values agree to float16 rounding. The chain's own invariants are `chain_match`'s.
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node
from .chain_match import (
    EXACT,
    F32,
    ChainContext,
    const_operand,
    emit_fused,
    last_axis_mean,
    other_input,
    run_rule,
    same_shape,
    square_of,
    static_rank,
    weight_fits,
)
from .graph_edit import Rewrite, is_plain


def fuse_rms_norm(graph: Graph, release: dict | None, level: str = "extended",
                  consts: dict | None = None) -> list[Rewrite]:
    return run_rule(graph, release, _match_rms_norm, consts)


def _match_rms_norm(ctx: ChainContext, mean: Node) -> Rewrite | None:
    if not is_plain(mean, "ReduceMean"):
        return None
    square = ctx.made(mean.inputs[0], "Pow", "Mul")
    x = None if square is None else square_of(ctx, square)
    if x is None or ctx.sole_reader(square.outputs[0]) is not mean:
        return None
    rank, dtype = static_rank(ctx, x), ctx.dtype(x)
    if rank is None or dtype not in EXACT or not last_axis_mean(ctx, mean, rank):
        return None
    add = ctx.next_op(mean, "Add")
    eps = None if add is None else const_operand(ctx, add, mean.outputs[0])
    sqrt = None if add is None else ctx.next_op(add, "Sqrt")
    if eps is None or eps < 0 or sqrt is None:
        return None
    chain = [square, mean, add, sqrt]
    inv = ctx.next_op(sqrt, "Reciprocal", "Div")
    if inv is None:
        return None
    if inv.op_type == "Div" and inv.inputs == (x, sqrt.outputs[0]):
        chain.append(inv)  # x / sqrt(.)
    else:
        if inv.op_type == "Div" and (inv.inputs[1] != sqrt.outputs[0] or ctx.scalar(inv.inputs[0]) != 1.0):
            return None
        scaled = ctx.next_op(inv, "Mul")
        if scaled is None or other_input(scaled, inv.outputs[0]) != x:
            return None
        chain += [inv, scaled]
    # the normalised x; mixed precision casts back before the weight
    normed, src = chain[-1], x
    cast_in = ctx.made(x, "Cast")
    back = ctx.next_op(normed, "Cast")
    if back is not None:
        if cast_in is None or dtype != F32:
            return None
        src = cast_in.inputs[0]
        # float16 (the kernel widens it to float32 itself; bfloat16 has no kernel here)
        if ctx.dtype(src) != np.float16 or ctx.dtype(back.outputs[0]) != np.float16:
            return None
        normed = back
    weigh = ctx.next_op(normed, "Mul")
    if weigh is None:
        return None
    weight = other_input(weigh, normed.outputs[0])
    width = ctx.shape(x)[-1]
    if weight is None or weight == normed.outputs[0] or not weight_fits(ctx, weight, width):
        return None
    if ctx.dtype(weight) != ctx.dtype(normed.outputs[0]) or ctx.dtype(weigh.outputs[0]) != ctx.dtype(weight):
        return None
    if back is not None:
        chain.append(back)
        # the leading Cast goes too when the chain is all that reads it
        uses = {id(n) for n, _ in ctx.read_by.get(x, [])}
        if x not in ctx.outputs and uses <= {id(n) for n in chain} and not any(
                p < 0 for _, p in ctx.read_by.get(x, [])):
            chain.insert(0, cast_in)
        else:
            src = x  # keep the Cast; the fused node normalises its float32 output
    chain.append(weigh)
    if not same_shape(ctx, src, weigh):
        return None
    return emit_fused(ctx, "rms_norm", chain, "SimplifiedLayerNormalization", [src, weight], axis=-1, epsilon=eps)

