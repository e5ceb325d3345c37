"""Fusion rules for the elementwise patterns torch / optimum exports write out op by op.

Each rule finds one chain, checks that the fused op computes the same value (the
same constants, the normalised axis, the same precision), and replaces the chain by
one node. The chain's last node keeps its output value (its id, dtype and shape), so
nothing downstream changes. A chain is matched only when every value it makes
before the last one is read by the chain alone: a value also read elsewhere (or a
graph output, or a subgraph's capture) blocks the fusion. If / Loop / Scan bodies
are searched too, on copies (`fuse_in_subgraphs`: optimum's merged decoder holds the
whole model in an If). The invariant: the fused node's output equals the chain's
last output to float rounding (the fused kernel may order the arithmetic differently,
as onnxruntime's fusions do); every rule has a differential test against
onnxruntime running the unfused graph (tests/test_fusion_patterns.py).

- ``rms_norm``: x -> Pow(2) | Mul(x, x) -> ReduceMean(last axis, keepdims) -> Add(eps)
  -> Sqrt -> Reciprocal | Div(1, .) -> Mul(x, .) -> Mul(weight), or Div(x, Sqrt)
  -> Mul(weight), as default-domain SimplifiedLayerNormalization(axis=-1, epsilon).
  Mixed precision (Cast(x to float32) ... Cast(back) -> Mul(weight)) is matched when
  the chain computes in float32 and casts back to x's dtype; without Casts the
  chain's dtype must be float32 or float64 (what the kernel computes in).
- ``silu``: Mul(x, Sigmoid(x)) as com.microsoft QuickGelu(alpha=1.0).
- ``gelu``: 0.5 x (1 + erf(x / sqrt 2)) (Div(sqrt 2) or Mul(1/sqrt 2)) and the tanh
  approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), with the 0.5 applied
  where exporters put it: default-domain Gelu (approximate "none" / "tanh") from
  opset 20; below, com.microsoft Gelu / FastGelu.
- ``layer_norm``: ReduceMean -> Sub -> Pow(2) -> ReduceMean -> Add(eps) -> Sqrt -> Div
  -> Mul(scale) (-> Add(bias)) over the last axis as LayerNormalization (opset >= 17).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import numpy as np

from ..ir.graph import Graph, Node
from .graph_edit import (
    MatchContext,
    Rewrite,
    drop_orphans,
    ensure_opset,
    in_bodies,
    is_plain,
    make_node,
    match_everywhere,
    read_values,
    replace_nodes,
)

MS_DOMAIN = "com.microsoft"
_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)
#: dtypes the fused kernels compute in themselves (float16 chains would be widened)
_EXACT = (_F32, _F64)
#: a constant matches a named one to this relative tolerance (float32 rounding of it)
_CONST_RTOL = 1e-6


class _Ctx(MatchContext):
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



def _close(value: float | None, want: float) -> bool:
    return value is not None and abs(value - want) <= _CONST_RTOL * abs(want)


def _other(node: Node, vid: int) -> int | None:
    """The binary node's input that is not `vid` (None when `vid` is not one of them)."""
    if len(node.inputs) != 2:
        return None
    a, b = node.inputs
    if a == vid:
        return b
    return a if b == vid else None


def _const_operand(ctx: _Ctx, node: Node, vid: int) -> float | None:
    other = _other(node, vid)
    return None if other is None else ctx.scalar(other)


def _last_axis_mean(ctx: _Ctx, node: Node, rank: int) -> bool:
    """ReduceMean over exactly the last axis, keeping dims."""
    if not is_plain(node, "ReduceMean") or int(node.attrs.get("keepdims", 1)) != 1:
        return False
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1] >= 0:
        array = ctx.const(node.inputs[1])
        axes = None if array is None else [int(a) for a in np.asarray(array).reshape(-1)]
    return axes is not None and len(axes) == 1 and int(axes[0]) in (-1, rank - 1)


def _square_of(ctx: _Ctx, node: Node) -> int | None:
    """x when the node is Pow(x, 2) or Mul(x, x)."""
    if is_plain(node, "Pow") and len(node.inputs) == 2 and ctx.scalar(node.inputs[1]) == 2.0:
        return node.inputs[0]
    if is_plain(node, "Mul") and len(node.inputs) == 2 and node.inputs[0] == node.inputs[1]:
        return node.inputs[0]
    return None


def _static_rank(ctx: _Ctx, vid: int) -> int | None:
    shape = ctx.shape(vid)
    return None if shape is None or not shape else len(shape)


def _weight_fits(ctx: _Ctx, vid: int, width) -> bool:
    """A 1-D scale / bias of the normalised width (broadcasting it changes nothing)."""
    shape = ctx.shape(vid)
    return shape is not None and len(shape) == 1 and isinstance(width, int) and shape[0] == width


def _same_shape(ctx: _Ctx, x: int, last: Node) -> bool:
    """The chain's result has x's shape (a constant of shape (1,) on a 0-d x, or a
    weight broadcast onto a width-1 x, would change it: the fused op would not)."""
    shape = ctx.shape(x)
    return shape is not None and ctx.shape(last.outputs[0]) == shape


def _fused_name(graph: Graph, chain: list[Node], op: str) -> str:
    prefix = os.path.commonprefix([n.name for n in chain])
    cut = prefix.rfind("/")
    return f"{prefix[:cut]}/{op}" if cut > 0 else f"{chain[0].name}/{op}"


def _emit(ctx: _Ctx, rule: str, chain: list[Node], op: str, inputs: list[int], domain: str = "",
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


def _run(graph: Graph, release: dict | None, match, consts: dict | None) -> list[Rewrite]:
    """Apply `match(ctx, node) -> Rewrite | None` at every node still in the graph; the
    constants only the fused chains read (eps, 2.0, 0.5, ...) go with them."""
    return drop_orphans(graph, match_everywhere(_Ctx.of(graph, consts), match), release)


# --- RMSNorm -------------------------------------------------------------------------


def fuse_rms_norm(graph: Graph, release: dict | None, level: str = "extended",
                  consts: dict | None = None) -> list[Rewrite]:
    return _run(graph, release, _match_rms_norm, consts)


def _match_rms_norm(ctx: _Ctx, mean: Node) -> Rewrite | None:
    if not is_plain(mean, "ReduceMean"):
        return None
    square = ctx.made(mean.inputs[0], "Pow", "Mul")
    x = None if square is None else _square_of(ctx, square)
    if x is None or ctx.sole_reader(square.outputs[0]) is not mean:
        return None
    rank, dtype = _static_rank(ctx, x), ctx.dtype(x)
    if rank is None or dtype not in _EXACT or not _last_axis_mean(ctx, mean, rank):
        return None
    add = ctx.next_op(mean, "Add")
    eps = None if add is None else _const_operand(ctx, add, mean.outputs[0])
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
        if scaled is None or _other(scaled, inv.outputs[0]) != x:
            return None
        chain += [inv, scaled]
    # the normalised x; mixed precision casts back before the weight
    normed, src = chain[-1], x
    cast_in = ctx.made(x, "Cast")
    back = ctx.next_op(normed, "Cast")
    if back is not None:
        if cast_in is None or dtype != _F32:
            return None
        src = cast_in.inputs[0]
        # float16 (the kernel widens it to float32 itself; bfloat16 has no kernel here)
        if ctx.dtype(src) != np.float16 or ctx.dtype(back.outputs[0]) != np.float16:
            return None
        normed = back
    weigh = ctx.next_op(normed, "Mul")
    if weigh is None:
        return None
    weight = _other(weigh, normed.outputs[0])
    width = ctx.shape(x)[-1]
    if weight is None or weight == normed.outputs[0] or not _weight_fits(ctx, weight, width):
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
    if not _same_shape(ctx, src, weigh):
        return None
    return _emit(ctx, "rms_norm", chain, "SimplifiedLayerNormalization", [src, weight], axis=-1, epsilon=eps)


# --- SiLU ----------------------------------------------------------------------------


def fuse_silu(graph: Graph, release: dict | None, level: str = "extended",
              consts: dict | None = None) -> list[Rewrite]:
    return _run(graph, release, _match_silu, consts)


def _match_silu(ctx: _Ctx, sigmoid: Node) -> Rewrite | None:
    if not is_plain(sigmoid, "Sigmoid") or len(sigmoid.inputs) != 1:
        return None
    x = sigmoid.inputs[0]
    mul = ctx.next_op(sigmoid, "Mul")
    if mul is None or _other(mul, sigmoid.outputs[0]) != x or ctx.dtype(x) not in _EXACT:
        return None
    return _emit(ctx, "silu", [sigmoid, mul], "QuickGelu", [x], domain=MS_DOMAIN, alpha=1.0)


# --- GELU ----------------------------------------------------------------------------

_SQRT2 = math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_CUBIC = 0.044715


def fuse_gelu(graph: Graph, release: dict | None, level: str = "extended",
              consts: dict | None = None) -> list[Rewrite]:
    return _run(graph, release, _match_gelu, consts)


def _match_gelu(ctx: _Ctx, node: Node) -> Rewrite | None:
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
    if ctx.dtype(x) not in _EXACT:
        return None
    one = ctx.next_op(node, "Add")
    if one is None or not _close(_const_operand(ctx, one, node.outputs[0]), 1.0):
        return None
    tail = _gelu_tail(ctx, one, x)
    if tail is None:
        return None
    chain = chain + [node, one] + tail
    if not _same_shape(ctx, x, chain[-1]):
        return None
    if ctx.graph.opsets.get("", 1) >= 20:
        return _emit(ctx, "gelu", chain, "Gelu", [x], approximate=approximate)
    if approximate == "tanh":
        return _emit(ctx, "gelu", chain, "FastGelu", [x], domain=MS_DOMAIN)
    return _emit(ctx, "gelu", chain, "Gelu", [x], domain=MS_DOMAIN)


def _erf_front(ctx: _Ctx, erf: Node) -> tuple[int, list[Node]] | None:
    """Erf(x / sqrt 2) or Erf(x * (1 / sqrt 2)) -> (x, [the Div / Mul])."""
    scale = ctx.made(erf.inputs[0], "Div", "Mul")
    if scale is None or ctx.sole_reader(scale.outputs[0]) is not erf or len(scale.inputs) != 2:
        return None
    x, c = scale.inputs
    if scale.op_type == "Div":
        ok = _close(ctx.scalar(c), _SQRT2)
    else:
        if ctx.scalar(x) is not None:
            x, c = c, x
        ok = _close(ctx.scalar(c), 1.0 / _SQRT2)
    return (x, [scale]) if ok and ctx.scalar(x) is None else None


def _tanh_front(ctx: _Ctx, tanh: Node) -> tuple[int, list[Node]] | None:
    """Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)) -> (x, [Pow, Mul, Add, Mul])."""
    outer = ctx.made(tanh.inputs[0], "Mul")
    if outer is None or ctx.sole_reader(outer.outputs[0]) is not tanh:
        return None
    inner = next((ctx.made(v, "Add") for v in outer.inputs if ctx.made(v, "Add") is not None), None)
    if inner is None or not _close(_const_operand(ctx, outer, inner.outputs[0]), _SQRT_2_OVER_PI):
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
                or not _close(_const_operand(ctx, cubic, power.outputs[0]), _CUBIC)):
            continue
        return x, [power, cubic, inner, outer]
    return None


def _gelu_tail(ctx: _Ctx, one: Node, x: int) -> list[Node] | None:
    """What multiplies (1 + erf / tanh) by x and 0.5, in the orders exporters emit:
    Mul(Mul(x, 0.5), t), Mul(Mul(x, t), 0.5), Mul(Mul(t, 0.5), x)."""
    t = one.outputs[0]
    first = ctx.next_op(one, "Mul")
    if first is None:
        return None
    other = _other(first, t)
    if other == x:  # x * t, then * 0.5
        last = ctx.next_op(first, "Mul")
        if last is not None and _close(_const_operand(ctx, last, first.outputs[0]), 0.5):
            return [first, last]
        return None
    if other is not None and _close(ctx.scalar(other), 0.5):  # t * 0.5, then * x
        last = ctx.next_op(first, "Mul")
        if last is not None and _other(last, first.outputs[0]) == x:
            return [first, last]
        return None
    half = None if other is None else ctx.made(other, "Mul")  # (x * 0.5) * t
    if (half is not None and ctx.sole_reader(half.outputs[0]) is first
            and _other(half, x) is not None and _close(_const_operand(ctx, half, x), 0.5)):
        return [half, first]
    return None


# --- LayerNormalization --------------------------------------------------------------


def fuse_layer_norm(graph: Graph, release: dict | None, level: str = "extended",
                    consts: dict | None = None) -> list[Rewrite]:
    if graph.opsets.get("", 1) < 17:
        return []
    return _run(graph, release, _match_layer_norm, consts)


def _match_layer_norm(ctx: _Ctx, mean: Node) -> Rewrite | None:
    if not is_plain(mean, "ReduceMean"):
        return None
    x = mean.inputs[0]
    rank, dtype = _static_rank(ctx, x), ctx.dtype(x)
    if rank is None or dtype not in _EXACT or not _last_axis_mean(ctx, mean, rank):
        return None
    sub = ctx.next_op(mean, "Sub")
    if sub is None or sub.inputs != (x, mean.outputs[0]):
        return None
    d = sub.outputs[0]
    uses = ctx.read_by.get(d, [])
    if d in ctx.outputs or len({id(n) for n, _ in uses}) != 2 or any(p < 0 for _, p in uses):
        return None
    square = next((n for n, _ in uses if is_plain(n, "Pow", "Mul") and _square_of(ctx, n) == d), None)
    var = None if square is None else ctx.next_op(square, "ReduceMean")
    if var is None or not _last_axis_mean(ctx, var, rank):
        return None
    add = ctx.next_op(var, "Add")
    eps = None if add is None else _const_operand(ctx, add, var.outputs[0])
    sqrt = None if add is None else ctx.next_op(add, "Sqrt")
    div = None if sqrt is None else ctx.next_op(sqrt, "Div")
    if eps is None or eps < 0 or div is None or div.inputs != (d, sqrt.outputs[0]):
        return None
    if {id(n) for n, _ in uses} != {id(square), id(div)}:
        return None
    weigh = ctx.next_op(div, "Mul")
    scale = None if weigh is None else _other(weigh, div.outputs[0])
    width = ctx.shape(x)[-1]
    if scale is None or not _weight_fits(ctx, scale, width) or ctx.dtype(scale) != dtype:
        return None
    chain = [mean, sub, square, var, add, sqrt, div, weigh]
    inputs = [x, scale]
    shift = ctx.next_op(weigh, "Add")
    bias = None if shift is None else _other(shift, weigh.outputs[0])
    if bias is not None and _weight_fits(ctx, bias, width) and ctx.dtype(bias) == dtype:
        chain.append(shift)
        inputs.append(bias)
    if not _same_shape(ctx, x, chain[-1]):
        return None
    return _emit(ctx, "layer_norm", chain, "LayerNormalization", inputs, axis=-1, epsilon=eps)


#: LayerNorm before RMSNorm: a LayerNorm's tail (x - mean normalised by its RMS) is an RMSNorm of x - mean
PATTERN_RULES = [fuse_layer_norm, fuse_rms_norm, fuse_gelu, fuse_silu]


# --- inside subgraphs ----------------------------------------------------------------


def fuse_in_subgraphs(graph: Graph, release: dict | None, level: str = "extended",
                      outer: Callable[[str], np.ndarray | None] | None = None) -> list[Rewrite]:
    """The pattern rules inside If / Loop / Scan bodies (optimum's merged decoder holds
    the whole model in an If). A body is copied before it is edited (the loaded graph
    stays as it was) and the node given the copy. Its constants are mostly the
    enclosing graph's initializers, read by name: a name resolves in the nearest scope
    that defines it, and only an initializer there counts as a constant. A Constant
    node a fusion leaves unread is dropped with it."""

    def rewrite_body(copy: Graph, here, consts: dict) -> list[Rewrite]:
        read_before = read_values(copy)
        found: list[Rewrite] = []
        for rule in PATTERN_RULES:
            found += rule(copy, None, level, consts)
        found += fuse_in_subgraphs(copy, None, level, here)
        if found:
            found += _drop_unread_constants(copy, read_before)
        return found

    return in_bodies(graph, outer, rewrite_body)



def _drop_unread_constants(graph: Graph, read_before: set[int]) -> list[Rewrite]:
    read = read_values(graph)
    dead = [n for n in graph.nodes if n.op_type == "Constant" and not n.domain
            and all(o in read_before and o not in read for o in n.outputs)]
    gone = {id(n) for n in dead}
    graph.nodes = [n for n in graph.nodes if id(n) not in gone]
    return [Rewrite("dead_node", (n.name,), (n.op_type,), "", 1, 0) for n in dead]


RULES = [*PATTERN_RULES, fuse_in_subgraphs]
