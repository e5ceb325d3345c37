"""Fusion rule ``layer_norm`` (levels "extended", "all"): LayerNorm written out, as one node.

What it rewrites: mean = ReduceMean(x) -> d = Sub(x, mean) -> Pow(d, 2) | Mul(d, d) ->
ReduceMean -> Add(eps) -> Sqrt -> Div(d, .) -> Mul(scale) (-> Add(bias)) over the last
axis, as LayerNormalization(x, scale[, bias], axis=-1, epsilon=eps).

When it applies: the graph's opset is >= 17 (where LayerNormalization exists), x has
a static rank and is float32 / float64, both means are over the last axis only, eps
is a constant >= 0, d is read by the square and the Div alone, and scale (and bias,
taken only when it fits too) are 1-D of x's last width in x's dtype.

The invariant: LayerNormalization computes (x - mean(x)) / sqrt(var(x) + eps) * scale
(+ bias) with the population variance mean((x - mean)^2), which is the chain, op for
op; only the summation order of the two means may differ (float rounding). It runs
before `rms_norm` (`fusion_patterns.PATTERN_RULES`): a LayerNorm's tail, d normalised
by its RMS, is an RMSNorm of d and would otherwise be taken by it alone.
"""

from __future__ import annotations

from ..ir.graph import Graph, Node
from .chain_match import (
    EXACT,
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


def fuse_layer_norm(graph: Graph, release: dict | None, level: str = "extended",
                    consts: dict | None = None) -> list[Rewrite]:
    if graph.opsets.get("", 1) < 17:
        return []
    return run_rule(graph, release, _match_layer_norm, consts)


def _match_layer_norm(ctx: ChainContext, mean: Node) -> Rewrite | None:
    if not is_plain(mean, "ReduceMean"):
        return None
    x = mean.inputs[0]
    rank, dtype = static_rank(ctx, x), ctx.dtype(x)
    if rank is None or dtype not in EXACT or not last_axis_mean(ctx, mean, rank):
        return None
    sub = ctx.next_op(mean, "Sub")
    if sub is None or sub.inputs != (x, mean.outputs[0]):
        return None
    d = sub.outputs[0]
    uses = ctx.read_by.get(d, [])
    if d in ctx.outputs or len({id(n) for n, _ in uses}) != 2 or any(p < 0 for _, p in uses):
        return None
    square = next((n for n, _ in uses if is_plain(n, "Pow", "Mul") and square_of(ctx, n) == d), None)
    var = None if square is None else ctx.next_op(square, "ReduceMean")
    if var is None or not last_axis_mean(ctx, var, rank):
        return None
    add = ctx.next_op(var, "Add")
    eps = None if add is None else const_operand(ctx, add, var.outputs[0])
    sqrt = None if add is None else ctx.next_op(add, "Sqrt")
    div = None if sqrt is None else ctx.next_op(sqrt, "Div")
    if eps is None or eps < 0 or div is None or div.inputs != (d, sqrt.outputs[0]):
        return None
    if {id(n) for n, _ in uses} != {id(square), id(div)}:
        return None
    weigh = ctx.next_op(div, "Mul")
    scale = None if weigh is None else other_input(weigh, div.outputs[0])
    width = ctx.shape(x)[-1]
    if scale is None or not weight_fits(ctx, scale, width) or ctx.dtype(scale) != dtype:
        return None
    chain = [mean, sub, square, var, add, sqrt, div, weigh]
    inputs = [x, scale]
    shift = ctx.next_op(weigh, "Add")
    bias = None if shift is None else other_input(shift, weigh.outputs[0])
    if bias is not None and weight_fits(ctx, bias, width) and ctx.dtype(bias) == dtype:
        chain.append(shift)
        inputs.append(bias)
    if not same_shape(ctx, x, chain[-1]):
        return None
    return emit_fused(ctx, "layer_norm", chain, "LayerNormalization", inputs, axis=-1, epsilon=eps)


