"""Fusion rule ``gelu`` (levels "extended", "all"): GELU written out op by op, as one node.

What it rewrites: the erf form 0.5 x (1 + erf(x / sqrt 2)) (a Div by sqrt 2 or a Mul by
1 / sqrt 2) and the tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
with the 0.5 applied where exporters put it (Mul(Mul(x, 0.5), t), Mul(Mul(x, t), 0.5),
Mul(Mul(t, 0.5), x)): as default-domain Gelu (approximate "none" / "tanh") from opset
20; below, com.microsoft Gelu / FastGelu.

When it applies: x is float32 / float64, every constant is a one-element float equal
to the named one within float32 rounding (`close_to`), the cube is Pow(x, 3.0), and
each intermediate is read by the chain alone (`chain_match`).

The invariant: each fused op is defined as exactly that formula (Gelu "none" the erf
form, "tanh" / FastGelu the tanh approximation with the same two constants), applied
elementwise in the chain's dtype, so the value is the chain's to float rounding.
"""

from __future__ import annotations

import math

from ..ir.graph import Graph, Node
from .chain_match import (
    EXACT,
    MS_DOMAIN,
    ChainContext,
    close_to,
    const_operand,
    emit_fused,
    other_input,
    run_rule,
    same_shape,
)
from .graph_edit import Rewrite, is_plain

_SQRT2 = math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_CUBIC = 0.044715


def fuse_gelu(graph: Graph, release: dict | None, level: str = "extended",
              consts: dict | None = None) -> list[Rewrite]:
    return run_rule(graph, release, _match_gelu, consts)


def _match_gelu(ctx: ChainContext, node: Node) -> Rewrite | None:
    if is_plain(node, "Erf"):
        front = _erf_front(ctx, node)
        approximate = "none"
    elif is_plain(node, "Tanh"):
        front = _tanh_front(ctx, node)
        approximate = "tanh"
    else:
        return None
    if front is None:
        return None
    x, chain = front
    if ctx.dtype(x) not in EXACT:
        return None
    one = ctx.next_op(node, "Add")
    if one is None or not close_to(const_operand(ctx, one, node.outputs[0]), 1.0):
        return None
    tail = _gelu_tail(ctx, one, x)
    if tail is None:
        return None
    chain = chain + [node, one] + tail
    if not same_shape(ctx, x, chain[-1]):
        return None
    if ctx.graph.opsets.get("", 1) >= 20:
        return emit_fused(ctx, "gelu", chain, "Gelu", [x], approximate=approximate)
    if approximate == "tanh":
        return emit_fused(ctx, "gelu", chain, "FastGelu", [x], domain=MS_DOMAIN)
    return emit_fused(ctx, "gelu", chain, "Gelu", [x], domain=MS_DOMAIN)


def _erf_front(ctx: ChainContext, erf: Node) -> tuple[int, list[Node]] | None:
    """Erf(x / sqrt 2) or Erf(x * (1 / sqrt 2)) -> (x, [the Div / Mul])."""
    scale = ctx.made(erf.inputs[0], "Div", "Mul")
    if scale is None or ctx.sole_reader(scale.outputs[0]) is not erf or len(scale.inputs) != 2:
        return None
    x, c = scale.inputs
    if scale.op_type == "Div":
        ok = close_to(ctx.scalar(c), _SQRT2)
    else:
        if ctx.scalar(x) is not None:
            x, c = c, x
        ok = close_to(ctx.scalar(c), 1.0 / _SQRT2)
    return (x, [scale]) if ok and ctx.scalar(x) is None else None


def _tanh_front(ctx: ChainContext, tanh: Node) -> tuple[int, list[Node]] | None:
    """Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)) -> (x, [Pow, Mul, Add, Mul])."""
    outer = ctx.made(tanh.inputs[0], "Mul")
    if outer is None or ctx.sole_reader(outer.outputs[0]) is not tanh:
        return None
    inner = next((ctx.made(v, "Add") for v in outer.inputs if ctx.made(v, "Add") is not None), None)
    if inner is None or not close_to(const_operand(ctx, outer, inner.outputs[0]), _SQRT_2_OVER_PI):
        return None
    if ctx.sole_reader(inner.outputs[0]) is not outer:
        return None
    for x, term in (inner.inputs, inner.inputs[::-1]):
        cubic = ctx.made(term, "Mul")
        if cubic is None or ctx.sole_reader(cubic.outputs[0]) is not inner:
            continue
        power = next((ctx.made(v, "Pow") for v in cubic.inputs if ctx.made(v, "Pow") is not None), None)
        if (power is None or power.inputs[0] != x or ctx.scalar(power.inputs[1]) != 3.0
                or ctx.sole_reader(power.outputs[0]) is not cubic
                or not close_to(const_operand(ctx, cubic, power.outputs[0]), _CUBIC)):
            continue
        return x, [power, cubic, inner, outer]
    return None


def _gelu_tail(ctx: ChainContext, one: Node, x: int) -> list[Node] | None:
    """What multiplies (1 + erf / tanh) by x and 0.5, in the orders exporters emit:
    Mul(Mul(x, 0.5), t), Mul(Mul(x, t), 0.5), Mul(Mul(t, 0.5), x)."""
    t = one.outputs[0]
    first = ctx.next_op(one, "Mul")
    if first is None:
        return None
    other = other_input(first, t)
    if other == x:  # x * t, then * 0.5
        last = ctx.next_op(first, "Mul")
        if last is not None and close_to(const_operand(ctx, last, first.outputs[0]), 0.5):
            return [first, last]
        return None
    if other is not None and close_to(ctx.scalar(other), 0.5):  # t * 0.5, then * x
        last = ctx.next_op(first, "Mul")
        if last is not None and other_input(last, first.outputs[0]) == x:
            return [first, last]
        return None
    half = None if other is None else ctx.made(other, "Mul")  # (x * 0.5) * t
    if (half is not None and ctx.sole_reader(half.outputs[0]) is first
            and other_input(half, x) is not None and close_to(const_operand(ctx, half, x), 0.5)):
        return [half, first]
    return None

