"""What the elementwise fusion rules share: matching an op-by-op chain, emitting its fused node.

A pattern rule (`rms_norm`, `layer_norm`, `gelu`, `silu`) walks a `ChainContext`: from
a node it follows sole readers (`next_op`), sole producers (`made`) and one-element
constants (`scalar`, `close_to`: within float32 rounding of the named constant), and
returns a `Rewrite` from `emit_fused`, or None. `run_rule` applies a matcher at every
node still in the graph, then drops the constants only the fused chains read.

The invariants every pattern rule relies on, kept here:

- a chain is matched only when every value it makes before the last one is read by
  the chain alone (`sole_reader`: not another node, a subgraph capture or a graph
  output), so removing those values changes no other reader;
- the fused node writes the chain's last output value itself (its id, dtype and
  shape), so nothing downstream changes; `same_shape` refuses a chain whose result
  broadcasts to another shape than its input, which the fused op would not;
- the fused kernels compute in float32 / float64 (`EXACT`): a chain in another dtype is
  matched only where the rule says how its precision is kept.

What remains for each rule to show is that its fused op computes the chain's value,
to float rounding (a fused kernel may order the arithmetic differently, as
onnxruntime's fusions do); each does so in its docstring, and has a differential test
against onnxruntime running the unfused graph (tests/rewrite/test_fusion_patterns.py).
"""

from __future__ import annotations

import os

import numpy as np

from ..ir.graph import Graph, Node
from .graph_edit import (
    MatchContext,
    Rewrite,
    drop_orphans,
    ensure_opset,
    is_plain,
    make_node,
    match_everywhere,
    replace_nodes,
)

MS_DOMAIN = "com.microsoft"
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
#: dtypes the fused kernels compute in themselves (float16 chains would be widened)
EXACT = (F32, F64)
#: a constant matches a named one to this relative tolerance (float32 rounding of it)
_CONST_RTOL = 1e-6


class ChainContext(MatchContext):
    """The match context, with the dtype / shape lookups the pattern chains need."""

    def next_op(self, node: Node, *ops: str) -> Node | None:
        """The sole reader of the node's (only) output when it is one of `ops`."""
        if len(node.outputs) != 1:
            return None
        nxt = self.sole_reader(node.outputs[0])
        return nxt if nxt is not None and is_plain(nxt, *ops) else None

    def scalar(self, vid: int) -> float | None:
        """The value of a one-element initializer of rank <= 1 (no broadcast growth)."""
        array = self.const(vid)
        if not isinstance(array, np.ndarray) or array.size != 1 or array.ndim > 1 or array.dtype.kind != "f":
            return None
        return float(array.reshape(-1)[0])



def close_to(value: float | None, want: float) -> bool:
    return value is not None and abs(value - want) <= _CONST_RTOL * abs(want)


def other_input(node: Node, vid: int) -> int | None:
    """The binary node's input that is not `vid` (None when `vid` is not one of them)."""
    if len(node.inputs) != 2:
        return None
    a, b = node.inputs
    if a == vid:
        return b
    return a if b == vid else None


def const_operand(ctx: ChainContext, node: Node, vid: int) -> float | None:
    other = other_input(node, vid)
    return None if other is None else ctx.scalar(other)


def last_axis_mean(ctx: ChainContext, node: Node, rank: int) -> bool:
    """ReduceMean over exactly the last axis, keeping dims."""
    if not is_plain(node, "ReduceMean") or int(node.attrs.get("keepdims", 1)) != 1:
        return False
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1] >= 0:
        array = ctx.const(node.inputs[1])
        axes = None if array is None else [int(a) for a in np.asarray(array).reshape(-1)]
    return axes is not None and len(axes) == 1 and int(axes[0]) in (-1, rank - 1)


def square_of(ctx: ChainContext, node: Node) -> int | None:
    """x when the node is Pow(x, 2) or Mul(x, x)."""
    if is_plain(node, "Pow") and len(node.inputs) == 2 and ctx.scalar(node.inputs[1]) == 2.0:
        return node.inputs[0]
    if is_plain(node, "Mul") and len(node.inputs) == 2 and node.inputs[0] == node.inputs[1]:
        return node.inputs[0]
    return None


def static_rank(ctx: ChainContext, vid: int) -> int | None:
    shape = ctx.shape(vid)
    return None if shape is None or not shape else len(shape)


def weight_fits(ctx: ChainContext, vid: int, width) -> bool:
    """A 1-D scale / bias of the normalised width (broadcasting it changes nothing)."""
    shape = ctx.shape(vid)
    return shape is not None and len(shape) == 1 and isinstance(width, int) and shape[0] == width


def same_shape(ctx: ChainContext, x: int, last: Node) -> bool:
    """The chain's result has x's shape (a constant of shape (1,) on a 0-d x, or a
    weight broadcast onto a width-1 x, would change it: the fused op would not)."""
    shape = ctx.shape(x)
    return shape is not None and ctx.shape(last.outputs[0]) == shape


def _fused_name(graph: Graph, chain: list[Node], op: str) -> str:
    prefix = os.path.commonprefix([n.name for n in chain])
    cut = prefix.rfind("/")
    return f"{prefix[:cut]}/{op}" if cut > 0 else f"{chain[0].name}/{op}"


def emit_fused(ctx: ChainContext, rule: str, chain: list[Node], op: str, inputs: list[int], domain: str = "",
          **attrs) -> Rewrite:
    graph = ctx.graph
    out = chain[-1].outputs[0]
    fused = make_node(graph, _fused_name(graph, chain, op), op, inputs, [out], domain=domain, **attrs)
    if domain:
        ensure_opset(graph, domain, 1)
    replace_nodes(graph, chain, [fused])
    # keep the indexes in step for the rules still matching in this pass
    for n in chain:
        for o in n.outputs:
            ctx.made_by.pop(o, None)
    ctx.made_by[out] = fused
    gone = {id(n) for n in chain}
    ctx.gone |= gone
    for vid in {v for n in chain for v in n.inputs if v >= 0}:
        uses = [u for u in ctx.read_by.get(vid, []) if id(u[0]) not in gone]
        ctx.read_by[vid] = uses
    for pos, vid in enumerate(fused.inputs):
        if vid >= 0:
            ctx.read_by.setdefault(vid, []).append((fused, pos))
    return Rewrite(rule, tuple(n.name for n in chain), tuple(n.op_type for n in chain), fused.name,
                   len(chain) - 1, 0)


def run_rule(graph: Graph, release: dict | None, match, consts: dict | None) -> list[Rewrite]:
    """Apply `match(ctx, node) -> Rewrite | None` at every node still in the graph; the
    constants only the fused chains read (eps, 2.0, 0.5, ...) go with them."""
    return drop_orphans(graph, match_everywhere(ChainContext.of(graph, consts), match), release)

