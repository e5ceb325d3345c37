"""Fusion rule ``silu`` (levels "extended", "all"): Mul(x, Sigmoid(x)) as one node.

What it rewrites: Sigmoid(x) read by one Mul whose other input is x itself, as
com.microsoft QuickGelu(x, alpha=1.0).

When it applies: x is float32 / float64, and the Sigmoid's output is read by that
Mul alone (`chain_match`).

The invariant: QuickGelu computes x * sigmoid(alpha * x); with alpha = 1 that is
x * sigmoid(x), the chain's value, elementwise in the same dtype (no reduction, so
only the kernel's sigmoid formula's rounding may differ).
"""

from __future__ import annotations

from ..ir.graph import Graph, Node
from .chain_match import (
    EXACT,
    MS_DOMAIN,
    ChainContext,
    emit_fused,
    other_input,
    run_rule,
)
from .graph_edit import Rewrite, is_plain


def fuse_silu(graph: Graph, release: dict | None, level: str = "extended",
              consts: dict | None = None) -> list[Rewrite]:
    return run_rule(graph, release, _match_silu, consts)


def _match_silu(ctx: ChainContext, sigmoid: Node) -> Rewrite | None:
    if not is_plain(sigmoid, "Sigmoid") or len(sigmoid.inputs) != 1:
        return None
    x = sigmoid.inputs[0]
    mul = ctx.next_op(sigmoid, "Mul")
    if mul is None or other_input(mul, sigmoid.outputs[0]) != x or ctx.dtype(x) not in EXACT:
        return None
    return emit_fused(ctx, "silu", [sigmoid, mul], "QuickGelu", [x], domain=MS_DOMAIN, alpha=1.0)

