"""Fusion rule ``attention``: the decomposed attention of torch-style exports as one node.

Matched, ending at the last MatMul (K, V: the present key / value [B, Hkv, L, D])::

    K_r = Reshape(Expand(Unsqueeze(K, 2), [B|1, Hkv, r, L|1, D]), [B|0|-1, Hkv*r, L|-1, D])
    V_r = the same for V, with the same r          (both absent: r = 1, as gpt2 writes it)
    out = MatMul(Softmax(Where(mask, Mul(MatMul(Q, Transpose(K_r, [0, 1, 3, 2])), scale), fill)
                         | Add(Mul(...), mask), axis=-1), V_r)

and replaced by one ``ai.workbench::MaskedSoftmaxAttention(Q, K, V, mask, scale, fill)``
(`ops.fused_attention`) that keeps the last MatMul's output value. The shape arithmetic
that only fed the repeats (Shape -> Gather -> Unsqueeze -> Concat) is removed with it.
The invariant: the kernel computes the very same ops (the same Where / Add, the same Softmax, the
masked fill constant as given), so the value is the chain's to float rounding, whatever
the mask: a fully masked row stays uniform under Where(mask, s, -3.4e38) and NaN under
an additive -inf mask. (The opset-23 Attention is not used: an additive mask
Where(mask, 0, -3.4e38) added to s is -3.4e38 only when |s| is below half an ulp of
3.4e38, about 1e31, which nothing here proves; and it needs opset 23.)

What is checked, so the fused node computes the same value:

- every intermediate (the repeats, K^T, the scores, the masked scores, the
  probabilities) is read by the chain alone: not by another node, a subgraph capture
  or the graph's outputs (K and V, the present outputs, may be read anywhere);
- the scale and the fill are constants of one element, of rank <= 4 (no broadcast
  growth), in the chain's dtype (float32 / float64); the Where's mask is bool, an
  additive mask in the chain's dtype, of rank <= 4;
- Softmax normalises the last axis (opset >= 13 default, or axis -1 / 3 on rank 4);
- the repeat really repeats heads by index: Unsqueeze at axis 2 of a rank-4 K with a
  static Hkv and D; the Expand's shape (a constant or a Concat of one-element parts)
  is [batch or 1, Hkv, r, length or 1, D] and the Reshape's [batch | 0 | -1, Hkv * r,
  length | -1, D] (at most one -1), where "batch" / "length" is Unsqueeze(Gather(Shape(t),
  i)) of K itself, or of a tensor whose dim i has K's dim's symbol (the symbols of the
  inferred shapes: the plan sizes its buffers by the same symbols, and two inputs
  disagreeing on one are refused when it binds them), or that dim as a constant; Q's
  heads are Hkv * r.

If / Loop / Scan bodies are searched too, on copies (optimum's merged decoder holds the
whole model in an If), with the enclosing scopes' initializers and the body's Constant
nodes as constants. Tests: tests/test_fusion_attention.py (differential against
onnxruntime, greedy tokens, blocked chains).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..ir.graph import Graph, Node
from ..ops.fused_attention import WORKBENCH_DOMAIN
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

OP = "MaskedSoftmaxAttention"
_EXACT = (np.dtype(np.float32), np.dtype(np.float64))


class _Ctx(MatchContext):
    """The match context, with the shape lookups the attention chain needs."""

    def only_into(self, vid: int, node: Node) -> bool:
        """`vid` is an intermediate read by `node` alone."""
        return self.sole_reader(vid) is node

    def ints(self, vid: int) -> list[int] | None:
        array = self.const(vid)
        if array is None or array.dtype.kind not in "iu" or array.ndim > 1:
            return None
        return [int(a) for a in array.reshape(-1)]



def _rank(ctx: _Ctx, vid: int) -> int | None:
    shape = ctx.shape(vid)
    return None if shape is None else len(shape)


def _small_const(ctx: _Ctx, vid: int, dtype: np.dtype) -> bool:
    """A one-element constant of rank <= 4 in `dtype` (multiplying / filling a rank-4
    tensor with it changes no shape)."""
    array = ctx.const(vid)
    return array is not None and array.size == 1 and array.ndim <= 4 and array.dtype == dtype


# --- the repeat of kv heads ----------------------------------------------------------


@dataclass(frozen=True)
class _Part:
    """A one-element, non-constant part of a Concat'd shape."""

    vid: int


def _entries(ctx: _Ctx, vid: int, n: int) -> list | None:
    """A shape tensor's n entries: an int (a constant) or a `_Part` of the Concat that
    builds it."""
    ints = ctx.ints(vid)
    if ints is not None:
        return ints if len(ints) == n else None
    concat = ctx.made(vid, "Concat")
    if concat is None or int(concat.attrs.get("axis", 0)) not in (0, -1):
        return None
    out: list = []
    for part in concat.inputs:
        if part < 0:
            return None
        ints = ctx.ints(part)
        if ints is not None:
            out += ints
        elif ctx.shape(part) == (1,):
            out.append(_Part(part))
        else:
            return None
    return out if len(out) == n else None


def _is_dim(ctx: _Ctx, entry: int | _Part, x: int, axis: int) -> bool:
    """The entry is dim `axis` of x: that constant, or Unsqueeze(Gather(Shape(t), i))
    with t = x and i = axis, or t's dim i carrying the same symbol (or int) as x's."""
    want = ctx.shape(x)[axis]
    if isinstance(entry, int):
        return isinstance(want, int) and entry == want
    unsq = ctx.made(entry.vid, "Unsqueeze")
    if unsq is None:
        return False
    axes = _unsqueeze_axes(ctx, unsq)
    gather = None if axes != [0] else ctx.made(unsq.inputs[0], "Gather")
    if gather is None or int(gather.attrs.get("axis", 0)) != 0:
        return False
    index = ctx.const(gather.inputs[1])
    shape_node = ctx.made(gather.inputs[0], "Shape")
    if index is None or index.ndim != 0 or index.dtype.kind not in "iu" or shape_node is None:
        return False
    if int(shape_node.attrs.get("start", 0)) != 0 or "end" in shape_node.attrs:
        return False
    t = shape_node.inputs[0]
    t_shape = ctx.shape(t)
    if t_shape is None:
        return False
    i = int(index)
    if not -len(t_shape) <= i < len(t_shape):
        return False
    i %= len(t_shape)
    if t == x:
        return i == axis
    got = t_shape[i]
    return isinstance(got, (int, str)) and isinstance(want, (int, str)) and got == want


def _unsqueeze_axes(ctx: _Ctx, node: Node) -> list[int] | None:
    if len(node.inputs) > 1:
        return ctx.ints(node.inputs[1])
    axes = node.attrs.get("axes")
    return None if axes is None else [int(a) for a in axes]


def _repeated(ctx: _Ctx, vid: int) -> tuple[int, int, list[Node]] | None:
    """(x, r, nodes) when `vid` = Reshape(Expand(Unsqueeze(x, 2))) repeats x's heads r
    times by index; None when it is not that pattern."""
    reshape = ctx.made(vid, "Reshape")
    if reshape is None or len(reshape.inputs) != 2 or int(reshape.attrs.get("allowzero", 0)) != 0:
        return None
    expand = ctx.made(reshape.inputs[0], "Expand")
    if expand is None or not ctx.only_into(expand.outputs[0], reshape):
        return None
    unsq = ctx.made(expand.inputs[0], "Unsqueeze")
    if unsq is None or not ctx.only_into(unsq.outputs[0], expand):
        return None
    x = unsq.inputs[0]
    shape = ctx.shape(x)
    if shape is None or len(shape) != 4 or _unsqueeze_axes(ctx, unsq) not in ([2], [-3]):
        return None
    kv_heads, width = shape[1], shape[3]
    if not isinstance(kv_heads, int) or not isinstance(width, int):
        return None
    wide = _entries(ctx, expand.inputs[1], 5)
    if wide is None or wide[1] != kv_heads or wide[4] != width or not isinstance(wide[2], int) or wide[2] < 1:
        return None
    repeat = wide[2]
    if not (wide[0] == 1 or _is_dim(ctx, wide[0], x, 0)) or not (wide[3] == 1 or _is_dim(ctx, wide[3], x, 2)):
        return None
    flat = _entries(ctx, reshape.inputs[1], 4)
    if flat is None or flat[1] != kv_heads * repeat or flat[3] != width or flat.count(-1) > 1:
        return None
    if not (flat[0] in (0, -1) or _is_dim(ctx, flat[0], x, 0)) or not (flat[2] == -1 or _is_dim(ctx, flat[2], x, 2)):
        return None
    return x, repeat, [unsq, expand, reshape]


# --- the chain -----------------------------------------------------------------------


def _softmax_last_axis(ctx: _Ctx, node: Node, rank: int) -> bool:
    default = -1 if ctx.graph.opsets.get("", 1) >= 13 else 1
    return int(node.attrs.get("axis", default)) in (-1, rank - 1)


def _match(ctx: _Ctx, pv: Node) -> Rewrite | None:
    if not is_plain(pv, "MatMul") or len(pv.inputs) != 2 or len(pv.outputs) != 1:
        return None
    probs, v_rep = pv.inputs
    softmax = ctx.made(probs, "Softmax")
    if softmax is None or not ctx.only_into(probs, pv):
        return None
    masker = ctx.made(softmax.inputs[0], "Where", "Add")
    if masker is None or not ctx.only_into(softmax.inputs[0], softmax):
        return None
    # the scores' dtype is the chain's; every tensor it touches must have it
    if masker.op_type == "Where":
        if len(masker.inputs) != 3:
            return None
        mask, scaled, fill = masker.inputs
        scaler = ctx.made(scaled, "Mul")
    else:
        scaler, mask, fill = None, None, -1
        for a, b in (masker.inputs, masker.inputs[::-1]):
            if a != b and ctx.made(a, "Mul") is not None:
                scaled, mask, scaler = a, b, ctx.made(a, "Mul")
                break
    if scaler is None or not ctx.only_into(scaled, masker) or len(scaler.inputs) != 2:
        return None
    raw, scale = scaler.inputs
    if ctx.made(raw, "MatMul") is None:
        raw, scale = scale, raw
    qk = ctx.made(raw, "MatMul")
    if qk is None or not ctx.only_into(raw, scaler) or len(qk.inputs) != 2:
        return None
    q, k_t = qk.inputs
    transpose = ctx.made(k_t, "Transpose")
    if transpose is None or not ctx.only_into(k_t, qk) or list(transpose.attrs.get("perm", ())) != [0, 1, 3, 2]:
        return None
    k_rep = transpose.inputs[0]
    k_side = _repeated(ctx, k_rep) if ctx.only_into(k_rep, transpose) else None
    v_side = _repeated(ctx, v_rep) if ctx.only_into(v_rep, pv) else None
    if k_side is None and v_side is None:
        k, v, repeat, repeats = k_rep, v_rep, 1, []
    elif k_side is not None and v_side is not None and k_side[1] == v_side[1]:
        (k, repeat, k_nodes), (v, _, v_nodes) = k_side, v_side
        repeats = k_nodes + v_nodes
    else:
        return None
    dtype = ctx.dtype(q)
    if dtype not in _EXACT or any(ctx.dtype(t) != dtype for t in (k, v, pv.outputs[0], scaled, probs)):
        return None
    q_shape, k_shape, v_shape = ctx.shape(q), ctx.shape(k), ctx.shape(v)
    if any(s is None or len(s) != 4 for s in (q_shape, k_shape, v_shape)):
        return None
    if repeat > 1 and not (isinstance(q_shape[1], int) and q_shape[1] == k_shape[1] * repeat):
        return None
    if not _small_const(ctx, scale, dtype) or not _softmax_last_axis(ctx, softmax, 4):
        return None
    mask_rank = _rank(ctx, mask)
    if mask_rank is None or mask_rank > 4:
        return None
    if masker.op_type == "Where":
        if ctx.dtype(mask) != np.bool_ or not _small_const(ctx, fill, dtype):
            return None
        inputs, mode = [q, k, v, mask, scale, fill], "where"
    else:
        if ctx.dtype(mask) != dtype:
            return None
        inputs, mode = [q, k, v, mask, scale], "add"
    chain = repeats + [transpose, qk, scaler, masker, softmax, pv]
    return _emit(ctx, chain, inputs, repeat, mode)


def _fused_name(chain: list[Node]) -> str:
    prefix = os.path.commonprefix([n.name for n in chain])
    cut = prefix.rfind("/")
    return f"{prefix[:cut]}/{OP}" if cut > 0 else f"{chain[-1].name}/{OP}"


def _emit(ctx: _Ctx, chain: list[Node], inputs: list[int], repeat: int, mode: str) -> Rewrite:
    graph = ctx.graph
    out = chain[-1].outputs[0]
    fused = make_node(graph, _fused_name(chain), OP, inputs, [out], domain=WORKBENCH_DOMAIN,
                      kv_repeat=repeat, mask_mode=mode)
    ensure_opset(graph, WORKBENCH_DOMAIN, 1)
    replace_nodes(graph, chain, [fused])
    gone = list(chain)
    _forget(ctx, chain)
    ctx.made_by[out] = fused
    for pos, vid in enumerate(fused.inputs):
        ctx.read_by.setdefault(vid, []).append((fused, pos))
    # the shape arithmetic only the repeats read
    frontier = [v for n in chain for v in n.inputs if v >= 0]
    dead: list[Node] = []
    while frontier:
        node = ctx.made_by.get(frontier.pop())
        if node is None or id(node) in ctx.gone or node.subgraphs or node.outer_reads:
            continue
        if any(o >= 0 and (o in ctx.outputs or ctx.read_by.get(o)) for o in node.outputs):
            continue
        dead.append(node)
        _forget(ctx, [node])
        frontier += [v for v in node.inputs if v >= 0]
    if dead:
        drop = {id(n) for n in dead}
        graph.nodes = [n for n in graph.nodes if id(n) not in drop]
        gone += dead
    return Rewrite("attention", tuple(n.name for n in gone), tuple(n.op_type for n in gone), fused.name,
                   len(gone) - 1, 0)


def _forget(ctx: _Ctx, nodes: list[Node]) -> None:
    """Keep the indexes in step with `nodes` leaving the graph."""
    ids = {id(n) for n in nodes}
    ctx.gone |= ids
    for n in nodes:
        for o in n.outputs:
            if ctx.made_by.get(o) is n:
                ctx.made_by.pop(o, None)
        for vid in {v for v in n.inputs if v >= 0}:
            ctx.read_by[vid] = [u for u in ctx.read_by.get(vid, []) if id(u[0]) not in ids]


def _fuse_here(graph: Graph, release: dict | None, consts: dict) -> list[Rewrite]:
    """Initializers only the fused chains read (axes, shape pieces) go with them."""
    read_before = read_values(graph)
    return drop_orphans(graph, match_everywhere(_Ctx.of(graph, consts), _match), release, read_before)


def fuse_attention(graph: Graph, release: dict | None, level: str = "extended",
                   outer: Callable[[str], np.ndarray | None] | None = None, consts: dict | None = None,
                   ) -> list[Rewrite]:
    """The rule, on `graph` and (on copies) inside its If / Loop / Scan bodies."""
    rewrites = _fuse_here(graph, release, consts or {})

    return rewrites + in_bodies(graph, outer, lambda copy, here, inner: fuse_attention(copy, None, level, here, inner))


RULES = [fuse_attention]
