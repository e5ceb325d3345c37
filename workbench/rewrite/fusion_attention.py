"""Fusion rule ``attention``: the decomposed attention of torch-style exports as one node.

Matched, ending at the last MatMul (K, V: the present key / value [B, Hkv, L, D])::

    K_r = Reshape(Expand(Unsqueeze(K, 2), [B|1, Hkv, r, L|1, D]), [B|0|-1, Hkv*r, L|-1, D])
    V_r = the same for V, with the same r          (both absent: r = 1, as gpt2 writes it)
    out = MatMul(Softmax(Where(mask, Mul(MatMul(Q, Transpose(K_r, [0, 1, 3, 2])), scale), fill)
                         | Add(Mul(...), mask), axis=-1), V_r)

and torch's scaled_dot_product_attention as torch.onnx's TorchScript exporter (and
optimum through it) writes it: the scale split over both sides, a NaN guard after the
Softmax, the Expand's shape passed through Where(Equal(s, -1s), 1s, s), the heads of the
Reshape as Hkv * r, and the repeated K / V's shapes read for their dims 0, 2, 3 (those
Shape nodes then read K / V)::

    out = MatMul(Where(IsNaN(p), 0, p), V_r),
          p = Softmax(Add(MatMul(Mul(Q, s), Mul(Transpose(K_r), s')), mask))

torch.onnx's dynamo exporter writes the same with its sizes read off shapes (Shape with
start / end, Slices of a Shape, a length as past + new, or as past + 1 in a decode step
as transformers' exporter writes it), repeat_kv's Reshape with
allowzero=1, and K^T as a transpose over the rows of the leading dims:
Reshape(Transpose(Reshape(K_r, [-1, L, D]), [0, 2, 1]), [B, H, D, L]).

Either written by onnxruntime's optimizer: the scaled scores as com.microsoft
FusedMatMul(Q, K^T, alpha) (its MatMulScaleFusion folds a scale on either side into
alpha), which computes alpha * (Q @ K^T), the scale applied once to each dot product
as Mul(MatMul(Q, K^T), scale) applies it; one that transposes a side is not taken.

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
  i)) of K itself, or of a tensor whose dim i has K's dim's symbol, or a sum of such
  reads and constant counts whose symbol is K's dim's (the symbols of the
  inferred shapes: the plan sizes its buffers by the same symbols, and two inputs
  disagreeing on one are refused when it binds them), or that dim as a constant; Q's
  heads are Hkv * r.

If / Loop / Scan bodies are searched too, on copies (optimum's merged decoder holds the
whole model in an If), with the enclosing scopes' initializers and the body's own
initializers and Constant nodes as constants. Tests: tests/rewrite/test_fusion_attention.py (differential against
onnxruntime, greedy tokens, blocked chains).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..ir.graph import Graph, Node
from ..ops.fused_attention import WORKBENCH_DOMAIN
from .constant_folding import evaluate
from .graph_edit import (
    MatchContext,
    Rewrite,
    add_initializer,
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


@dataclass(frozen=True)
class _Dim:
    """A size read off a shape: dim `axis` of tensor `of` (None for a sum of such
    reads), and what the inferred shapes call it (an int, a symbol, or None)."""

    of: int | None
    axis: int
    symbol: int | str | None


def _shape_reads(ctx: _Ctx, vid: int) -> list[_Dim] | None:
    """The dims a 1-D `vid` holds when it is read off a shape: Shape(t, start, end), or a
    Slice of such a read along its one axis with step 1."""
    node = ctx.made(vid, "Shape", "Slice")
    if node is None:
        return None
    if node.op_type == "Shape":
        t_shape = ctx.shape(node.inputs[0])
        if t_shape is None:
            return None
        start, end = node.attrs.get("start", 0), node.attrs.get("end")
        axes = range(len(t_shape))[slice(int(start), None if end is None else int(end))]
        return [_Dim(node.inputs[0], a, t_shape[a]) for a in axes]
    if len(node.inputs) < 3:
        return None
    axes = ctx.ints(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] >= 0 else [0]
    steps = ctx.ints(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] >= 0 else [1]
    starts, ends = ctx.ints(node.inputs[1]), ctx.ints(node.inputs[2])
    reads = _shape_reads(ctx, node.inputs[0])
    if reads is None or axes not in ([0], [-1]) or steps != [1] or starts is None or ends is None:
        return None
    if len(starts) != 1 or len(ends) != 1:
        return None
    return reads[slice(starts[0], ends[0])]


def _scalar_read(ctx: _Ctx, vid: int) -> _Dim | None:
    """The size a scalar or one-element `vid` holds when it is read off a shape:
    Gather(Shape(t), i), Shape(t, i, i + 1), through Squeeze / Unsqueeze(0) /
    Reshape([-1]), or the Add of two such reads, or of one and a constant count (a
    symbol "a + b", as the inferred shapes write a Concat's length)."""
    node = ctx.made(vid, "Unsqueeze", "Squeeze", "Reshape", "Gather", "Add")
    if node is None:
        reads = _shape_reads(ctx, vid)
        return reads[0] if reads is not None and len(reads) == 1 else None
    if node.op_type == "Unsqueeze" and _unsqueeze_axes(ctx, node) != [0]:
        return None
    if node.op_type == "Squeeze" and (len(node.inputs) > 1 and ctx.ints(node.inputs[1]) not in ([0], [-1])
                                      or node.attrs.get("axes") not in (None, [0], [-1])):
        return None
    if node.op_type == "Reshape" and ctx.ints(node.inputs[1]) not in ([-1], [1], []):
        return None
    if node.op_type in ("Unsqueeze", "Squeeze", "Reshape"):
        return _scalar_read(ctx, node.inputs[0])
    if node.op_type == "Add":
        a, b = (_term(ctx, v) for v in node.inputs)
        if a is None or b is None or a.symbol is None or b.symbol is None:
            return None
        both_ints = isinstance(a.symbol, int) and isinstance(b.symbol, int)
        return _Dim(None, -1, a.symbol + b.symbol if both_ints else f"{a.symbol} + {b.symbol}")
    # Gather(Shape(t), i)
    index = ctx.const(node.inputs[1])
    if int(node.attrs.get("axis", 0)) != 0 or index is None or index.ndim != 0 or index.dtype.kind not in "iu":
        return None
    reads = _shape_reads(ctx, node.inputs[0])
    if reads is None:
        return None
    i = int(index)
    return reads[i] if -len(reads) <= i < len(reads) else None


def _term(ctx: _Ctx, vid: int) -> _Dim | None:
    """A term of a size's sum: a size read off a shape (`_scalar_read`), or a one-element
    non-negative integer constant, a count (transformers' exporter writes a decode step's
    cache length as past + 1), whose symbol is the int, as the inferred shapes write it
    ("s + 1")."""
    ints = ctx.ints(vid)
    if ints is not None and len(ints) == 1 and ints[0] >= 0:
        return _Dim(None, -1, ints[0])
    return _scalar_read(ctx, vid)


def _reads_dim(got: _Dim | None, want_of: int, want_axis: int, want: int | str | None) -> bool:
    """`got` is dim `want_axis` of tensor `want_of` (whose inferred size is `want`): read
    off that very tensor, or carrying the same int or symbol (the plan sizes its
    buffers by these symbols, and two inputs disagreeing on one are refused when it
    binds them)."""
    if got is None:
        return False
    if got.of == want_of and got.axis == want_axis:
        return True
    return isinstance(got.symbol, (int, str)) and isinstance(want, (int, str)) and got.symbol == want


def _entries(ctx: _Ctx, vid: int, n: int) -> list | None:
    """A shape tensor's n entries: an int (a constant) or a `_Part` of the Concat that
    builds it. torch.onnx's expand writes its shape as Where(Equal(s, -1s), 1s, s) of a
    flattened Concat s (a -1 keeps the input's dim, which a 1 does in Expand): seen
    through, with its -1 entries read as 1."""
    ints = ctx.ints(vid)
    if ints is not None:
        return ints if len(ints) == n else None
    kept = _minus_one_kept(ctx, vid, n)
    if kept is not None:
        entries = _entries(ctx, kept, n)
        return None if entries is None else [1 if e == -1 else e for e in entries]
    flat = ctx.made(vid, "Reshape")
    if flat is not None and ctx.ints(flat.inputs[1]) == [-1] and _rank(ctx, flat.inputs[0]) == 1:
        return _entries(ctx, flat.inputs[0], n)
    concat = ctx.made(vid, "Concat")
    if concat is None or int(concat.attrs.get("axis", 0)) not in (0, -1):
        return None
    out: list = []
    for part in concat.inputs:
        if part < 0:
            return None
        ints = ctx.ints(part)
        reads = None if ints is not None else _shape_reads(ctx, part)
        if ints is not None:
            out += ints
        elif reads is not None:
            out += reads
        elif ctx.shape(part) == (1,):
            out.append(_Part(part))
        else:
            return None
    return out if len(out) == n else None


def _minus_one_kept(ctx: _Ctx, vid: int, n: int) -> int | None:
    """s when `vid` = Where(Equal(s, -1s), 1s, s) for a length-n s, where 1s is a
    constant or ConstantOfShape(Shape(s)) of ones and -1s a constant or 1s * -1."""
    where = ctx.made(vid, "Where")
    if where is None or len(where.inputs) != 3:
        return None
    cond, ones, s = where.inputs
    equal = ctx.made(cond, "Equal")
    if equal is None or not _ones(ctx, ones, s, n, 1):
        return None
    if s not in equal.inputs or not _ones(ctx, equal.inputs[1 - equal.inputs.index(s)], s, n, -1):
        return None
    return s


def _ones(ctx: _Ctx, vid: int, s: int, n: int, sign: int) -> bool:
    """`vid` holds n entries equal to `sign` (1 or -1), as a constant or built from s's
    shape: ConstantOfShape(Shape(s)) of ones, times -1 for -1s."""
    ints = ctx.ints(vid)
    if ints is not None:
        return ints == [sign] * n
    if sign == -1:
        mul = ctx.made(vid, "Mul")
        return mul is not None and any(ctx.ints(a) == [-1] and _ones(ctx, b, s, n, 1)
                                       for a, b in (mul.inputs, mul.inputs[::-1]))
    fill = ctx.made(vid, "ConstantOfShape")
    if fill is None or _rank(ctx, s) != 1 or ctx.shape(s)[0] != n:
        return False
    value = fill.attrs.get("value")
    shape_of = ctx.made(fill.inputs[0], "Shape")
    return (value is not None and np.asarray(value).size == 1 and np.asarray(value).reshape(()) == 1
            and shape_of is not None and shape_of.inputs[0] == s and not shape_of.attrs)


def _is_dim(ctx: _Ctx, entry: int | _Part | _Dim, x: int, axis: int) -> bool:
    """The entry is dim `axis` of x: that constant, or a size read off a shape
    (`_scalar_read`, `_reads_dim`)."""
    want = ctx.shape(x)[axis]
    if isinstance(entry, int):
        return isinstance(want, int) and entry == want
    got = entry if isinstance(entry, _Dim) else _scalar_read(ctx, entry.vid)
    return _reads_dim(got, x, axis, want)


def _is_heads_times(ctx: _Ctx, entry: int | _Part | _Dim, x: int, repeat: int) -> bool:
    """The entry is x's head count (dim 1) times `repeat`: that constant, or
    Unsqueeze(Mul(dim 1 of x, repeat)) as torch.onnx writes repeat_kv's reshape."""
    heads = ctx.shape(x)[1]
    if isinstance(entry, int):
        return isinstance(heads, int) and entry == heads * repeat
    if isinstance(entry, _Dim):
        return False
    unsq = ctx.made(entry.vid, "Unsqueeze")
    mul = None if unsq is None or _unsqueeze_axes(ctx, unsq) != [0] else ctx.made(unsq.inputs[0], "Mul")
    return mul is not None and any(ctx.ints(r) == [repeat] and _reads_dim(_scalar_read(ctx, d), x, 1, heads)
                                   for d, r in (mul.inputs, mul.inputs[::-1]))


def _unsqueeze_axes(ctx: _Ctx, node: Node) -> list[int] | None:
    if len(node.inputs) > 1:
        return ctx.ints(node.inputs[1])
    axes = node.attrs.get("axes")
    return None if axes is None else [int(a) for a in axes]


def _repeated(ctx: _Ctx, vid: int) -> tuple[int, int, list[Node]] | None:
    """(x, r, nodes) when `vid` = Reshape(Expand(Unsqueeze(x, 2))) repeats x's heads r
    times by index; None when it is not that pattern."""
    reshape = ctx.made(vid, "Reshape")
    if reshape is None or len(reshape.inputs) != 2:
        return None
    literal_zeros = bool(int(reshape.attrs.get("allowzero", 0)))  # torch.onnx dynamo writes allowzero=1
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
    if wide is None or not isinstance(wide[2], int) or wide[2] < 1:
        return None
    repeat = wide[2]
    if not all(wide[w] == 1 or _is_dim(ctx, wide[w], x, axis) for w, axis in ((0, 0), (3, 2))):
        return None
    if not (_is_dim(ctx, wide[1], x, 1) and _is_dim(ctx, wide[4], x, 3)):
        return None
    flat = _entries(ctx, reshape.inputs[1], 4)
    if flat is None or flat.count(-1) > 1:
        return None
    if not (_is_heads_times(ctx, flat[1], x, repeat) and _is_dim(ctx, flat[3], x, 3)):
        return None
    copies = (-1,) if literal_zeros else (0, -1)  # a 0 copies the input's dim only without allowzero
    if not (flat[0] in copies or _is_dim(ctx, flat[0], x, 0)) or not (flat[2] == -1 or _is_dim(ctx, flat[2], x, 2)):
        return None
    return x, repeat, [unsq, expand, reshape]


# --- the chain -----------------------------------------------------------------------


def _softmax_last_axis(ctx: _Ctx, node: Node, rank: int) -> bool:
    default = -1 if ctx.graph.opsets.get("", 1) >= 13 else 1
    return int(node.attrs.get("axis", default)) in (-1, rank - 1)


def _nan_guarded(ctx: _Ctx, vid: int) -> tuple[int, list[Node]] | None:
    """(p, [IsNaN, Where]) when `vid` = Where(IsNaN(p), 0, p), the guard torch's
    scaled_dot_product_attention writes after its Softmax, p read by those two alone."""
    where = ctx.made(vid, "Where")
    if where is None or len(where.inputs) != 3:
        return None
    cond, zero, p = where.inputs
    isnan = ctx.made(cond, "IsNaN")
    if isnan is None or isnan.inputs[0] != p or not ctx.only_into(cond, where):
        return None
    zero_value = ctx.const(zero)
    if zero_value is None or zero_value.size != 1 or zero_value.ndim > 4 or zero_value.dtype != ctx.dtype(p):
        return None
    if zero_value.reshape(-1)[0] != 0 or np.signbit(zero_value.reshape(-1)[0]):
        return None
    readers = ctx.read_by.get(p, [])
    if p in ctx.outputs or {id(n) for n, _ in readers} != {id(isnan), id(where)} or any(pos < 0 for _, pos in readers):
        return None
    return p, [isnan, where]


def _scaled_scores(ctx: _Ctx, vid: int) -> tuple[int, int, Node, list, list[Node]] | None:
    """(q, k_t, k_t's reader, scales, nodes) for the scores `vid` (read by the masker alone), in one of
    the forms exporters write: Mul(MatMul(q, k_t), scale), scales [scale]; or
    MatMul(Mul(q, scale), Mul(k_t, key_scale)) (torch's scaled_dot_product_attention
    splits the scale as its square root over both sides), scales [scale, key_scale]; or
    com.microsoft FusedMatMul(q, k_t, alpha) with nothing transposed (onnxruntime's
    optimizer folds either of those into it), scales [alpha as a constant array, made
    an initializer only once the chain is fused]."""
    fused = ctx.made_by.get(vid)
    if (fused is not None and fused.op_type == "FusedMatMul" and fused.domain == "com.microsoft"
            and not fused.subgraphs and len(fused.inputs) == 2 and not any(
                int(fused.attrs.get(t, 0)) for t in ("transA", "transB", "transBatchA", "transBatchB"))):
        alpha = np.asarray(float(fused.attrs.get("alpha", 1.0)), dtype=ctx.dtype(fused.inputs[0]))
        return fused.inputs[0], fused.inputs[1], fused, [alpha], [fused]
    scaler = ctx.made(vid, "Mul")
    if scaler is not None:
        if len(scaler.inputs) != 2:
            return None
        raw, scale = scaler.inputs
        if ctx.made(raw, "MatMul") is None:
            raw, scale = scale, raw
        qk = ctx.made(raw, "MatMul")
        if qk is None or not ctx.only_into(raw, scaler) or len(qk.inputs) != 2:
            return None
        return qk.inputs[0], qk.inputs[1], qk, [scale], [qk, scaler]
    qk = ctx.made(vid, "MatMul")
    if qk is None or len(qk.inputs) != 2:
        return None
    sides = []
    for side in qk.inputs:
        mul = ctx.made(side, "Mul")
        if mul is None or len(mul.inputs) != 2 or not ctx.only_into(side, qk):
            return None
        x, scale = mul.inputs if _one_element(ctx, mul.inputs[1]) else mul.inputs[::-1]
        sides.append((x, scale, mul))
    (q, q_scale, q_mul), (k_t, k_scale, k_mul) = sides
    return q, k_t, k_mul, [q_scale, k_scale], [q_mul, k_mul, qk]


def _keys_transposed(ctx: _Ctx, k_t: int) -> tuple[int, list[Node], set[int]] | None:
    """(K_r, nodes, the ids of the nodes reading K_r among them) when `k_t` =
    Transpose(K_r, [0, 1, 3, 2]), or the same written as torch.onnx's dynamo exporter
    writes a transpose of the last two dims, over the rows of all leading ones:
    Reshape(Transpose(Reshape(K_r, [-1, d2, d3]), [0, 2, 1]), [d0, d1, d3, d2]), each d
    a size read off a shape (its Shape, Slice and Concat nodes then read by the
    chain alone)."""
    turn = ctx.made(k_t, "Transpose")
    if turn is not None:
        return (turn.inputs[0], [turn], {id(turn)}) if list(turn.attrs.get("perm", ())) == [0, 1, 3, 2] else None
    outer = ctx.made(k_t, "Reshape")
    turn = None if outer is None else ctx.made(outer.inputs[0], "Transpose")
    if turn is None or list(turn.attrs.get("perm", ())) != [0, 2, 1] or not ctx.only_into(outer.inputs[0], outer):
        return None
    inner = ctx.made(turn.inputs[0], "Reshape")
    if inner is None or not ctx.only_into(turn.inputs[0], turn):
        return None
    x = inner.inputs[0]
    if _rank(ctx, x) != 4 or any(int(n.attrs.get("allowzero", 0)) for n in (inner, outer)):
        return None
    rows, dims = _entries(ctx, inner.inputs[1], 3), _entries(ctx, outer.inputs[1], 4)
    if rows is None or dims is None or rows[0] != -1:
        return None
    if not (_is_dim(ctx, rows[1], x, 2) and _is_dim(ctx, rows[2], x, 3)):
        return None
    if not all(_is_dim(ctx, d, x, axis) for d, axis in zip(dims, (0, 1, 3, 2))):
        return None
    # the shape arithmetic of the two Reshapes (Shape(K_r) -> Slice -> Concat) dies with them
    dying = {id(inner), id(outer)}
    shapes = [n for n, _ in ctx.read_by.get(x, []) if is_plain(n, "Shape") and _feeds_only(ctx, n, dying, 3)]
    return x, [inner, turn, outer], {id(inner)} | {id(n) for n in shapes}


def _feeds_only(ctx: _Ctx, node: Node, targets: set[int], depth: int) -> bool:
    """Every output of `node` is read by the `targets` alone, directly or through at most
    `depth` further nodes that are themselves read so (and by no graph output)."""
    for o in node.outputs:
        if o < 0:
            continue
        if o in ctx.outputs:
            return False
        for reader, pos in ctx.read_by.get(o, []):
            if pos < 0 or (id(reader) not in targets and (depth == 0 or not _feeds_only(ctx, reader, targets, depth - 1))):
                return False
    return True


def _one_element(ctx: _Ctx, vid: int) -> bool:
    """`vid` holds one element: a constant of size 1, or a tensor whose inferred dims are all 1."""
    array = ctx.const(vid)
    if array is not None:
        return array.size == 1
    shape = ctx.shape(vid)
    return shape is not None and all(d == 1 for d in shape)


def _shapes_of_repeat(ctx: _Ctx, rep: int, reader: Node | set[int]) -> list[Node] | None:
    """The Shape nodes reading a repeated K or V besides the chain's `reader`, when each
    is only gathered at dims the repeat leaves as they were (0, 2 and 3: optimum slices
    the mask by the repeated K's length, torch.onnx reads the head width off the
    repeated V): those can read the unrepeated tensor instead. None when another node
    reads it."""
    if rep in ctx.outputs:
        return None
    readers = {id(reader)} if isinstance(reader, Node) else reader
    shapes = []
    for node, pos in ctx.read_by.get(rep, []):
        if id(node) in readers:
            continue
        if pos < 0 or not is_plain(node, "Shape") or node.attrs:
            return None
        for gather, _ in ctx.read_by.get(node.outputs[0], []):
            index = ctx.const(gather.inputs[1]) if is_plain(gather, "Gather") else None
            if (index is None or index.ndim != 0 or index.dtype.kind not in "iu" or int(gather.attrs.get("axis", 0))
                    or int(index) % 4 == 1 or not -4 <= int(index) < 4):
                return None
        if node.outputs[0] in ctx.outputs:
            return None
        shapes.append(node)
    return shapes


#: the ops a scale computed from Q's width may go through (`_width_scale`)
_SCALE_OPS = ("Cast", "Sqrt", "Div", "Mul", "Pow", "Reciprocal", "Squeeze", "Unsqueeze", "Reshape")


def _width_scale(ctx: _Ctx, vid: int, q: int, dtype: np.dtype) -> np.ndarray | None:
    """The scale `vid` as a one-element array, when it is computed from Q's width (dim
    3) alone and the inferred shapes give that width as an int: optimum's gpt2 computes
    1 / sqrt(sqrt(d)) from Slice(Shape(q), -1) at run time. The value is what the
    graph's own kernels compute for that width (`constant_folding.evaluate`); the fused
    kernel checks Q's width at run time (`q_width`), so a width the inferred shapes got
    wrong fails there, naming the node, instead of scaling by the wrong constant."""
    width = (ctx.shape(q) or (None,) * 4)[3]
    if not isinstance(width, int):
        return None
    values: dict[int, np.ndarray] = {}

    def value_of(v: int, depth: int) -> np.ndarray | None:
        if v in values:
            return values[v]
        array = ctx.const(v)
        if array is None:
            reads = _shape_reads(ctx, v)
            read = _scalar_read(ctx, v) if reads is None else None
            if reads and all(_reads_dim(r, q, 3, width) for r in reads):
                array = np.full(len(reads), width, np.int64)
            elif read is not None and _reads_dim(read, q, 3, width) and ctx.shape(v) in ((), (1,)):
                array = np.full(ctx.shape(v), width, np.int64)
            else:
                node = ctx.made(v, *_SCALE_OPS)
                if node is None or depth == 0 or len(node.outputs) != 1:
                    return None
                ins = [None if i < 0 else value_of(i, depth - 1) for i in node.inputs]
                if any(a is None for i, a in zip(node.inputs, ins) if i >= 0):
                    return None
                array = (evaluate(ctx.graph, node, ins) or {}).get(v)
        if array is not None:
            values[v] = array
        return array

    array = value_of(vid, 8)
    if array is None or array.size != 1 or array.ndim > 4 or array.dtype != dtype:
        return None
    return array


def _match(ctx: _Ctx, pv: Node) -> Rewrite | None:
    if not is_plain(pv, "MatMul") or len(pv.inputs) != 2 or len(pv.outputs) != 1:
        return None
    probs, v_rep = pv.inputs
    guard = _nan_guarded(ctx, probs)
    soft, guard_nodes = guard if guard is not None else (probs, [])
    softmax = ctx.made(soft, "Softmax")
    if softmax is None or not ctx.only_into(probs, pv):
        return None
    masker = ctx.made(softmax.inputs[0], "Where", "Add")
    if masker is None or not ctx.only_into(softmax.inputs[0], softmax):
        return None
    # the scores' dtype is the chain's; every tensor it touches must have it
    scores = None
    if masker.op_type == "Where":
        if len(masker.inputs) != 3:
            return None
        mask, scaled, fill = masker.inputs
        scores = _scaled_scores(ctx, scaled)
    else:
        fill = -1
        for scaled, mask in (masker.inputs, masker.inputs[::-1]):
            scores = None if scaled == mask else _scaled_scores(ctx, scaled)
            if scores is not None:
                break
    if scores is None or not ctx.only_into(scaled, masker):
        return None
    q, k_t, k_t_reader, scales, score_nodes = scores
    turned = _keys_transposed(ctx, k_t) if ctx.only_into(k_t, k_t_reader) else None
    if turned is None:
        return None
    k_rep, transpose, k_readers = turned
    k_shapes = _shapes_of_repeat(ctx, k_rep, k_readers)
    v_shapes = _shapes_of_repeat(ctx, v_rep, pv)
    k_side = _repeated(ctx, k_rep) if k_shapes is not None else None
    v_side = _repeated(ctx, v_rep) if v_shapes is not None else None
    if k_side is None and v_side is None:  # no repeat: K and V (read anywhere) go in as they are
        k, v, repeat, repeats, k_shapes, v_shapes = k_rep, v_rep, 1, [], [], []
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
    # Q's head count an int other than Hkv * r: the plain MatMul would not take it as
    # grouped heads either (a symbol: the kernel checks at run time and, off the grouped
    # form, runs the plain broadcast MatMuls as the chain did)
    if repeat > 1 and isinstance(q_shape[1], int) and q_shape[1] != k_shape[1] * repeat:
        return None
    if not _softmax_last_axis(ctx, softmax, 4):
        return None
    q_width, computed = 0, {}
    for scale in scales:
        if isinstance(scale, np.ndarray):  # FusedMatMul's alpha (the chain's dtype by construction)
            continue
        if not _small_const(ctx, scale, dtype):
            computed[scale] = _width_scale(ctx, scale, q, dtype)
            if computed[scale] is None:
                return None
            q_width = ctx.shape(q)[3]
    mask_rank = _rank(ctx, mask)
    if mask_rank is None or mask_rank > 4:
        return None
    if masker.op_type == "Where":
        if ctx.dtype(mask) != np.bool_ or not _small_const(ctx, fill, dtype):
            return None
        mode = "where"
    else:
        if ctx.dtype(mask) != dtype:
            return None
        mode = "add"
    for scale, array in computed.items():  # one weight per computed scale, shared by both sides
        computed[scale] = add_initializer(ctx.graph, f"{ctx.graph.values[scale].name}/at_load", array)
    scales = [computed.get(scale, scale) if not isinstance(scale, np.ndarray)
              else add_initializer(ctx.graph, f"{score_nodes[0].name}/alpha", scale) for scale in scales]
    inputs = [q, k, v, mask, scales[0], fill] + scales[1:]
    for shape_node in k_shapes:  # dims 0, 2, 3 are the repeated tensor's
        _reread(ctx, shape_node, k_rep, k)
    for shape_node in v_shapes:
        _reread(ctx, shape_node, v_rep, v)
    chain = repeats + [*transpose, *score_nodes, masker, softmax, *guard_nodes, pv]
    return _emit(ctx, chain, inputs, repeat, mode, nan_guard=bool(guard_nodes), q_width=q_width)


def _reread(ctx: _Ctx, node: Node, old: int, new: int) -> None:
    """`node` reads `new` where it read `old`, the indexes kept in step."""
    node.inputs = tuple(new if v == old else v for v in node.inputs)
    ctx.read_by[old] = [u for u in ctx.read_by.get(old, []) if u[0] is not node]
    ctx.read_by.setdefault(new, []).extend((node, pos) for pos, v in enumerate(node.inputs) if v == new)


def _fused_name(chain: list[Node]) -> str:
    prefix = os.path.commonprefix([n.name for n in chain])
    cut = prefix.rfind("/")
    return f"{prefix[:cut]}/{OP}" if cut > 0 else f"{chain[-1].name}/{OP}"


def _emit(ctx: _Ctx, chain: list[Node], inputs: list[int], repeat: int, mode: str, nan_guard: bool,
          q_width: int) -> Rewrite:
    graph = ctx.graph
    out = chain[-1].outputs[0]
    while inputs[-1] < 0:  # a trailing optional left out
        inputs = inputs[:-1]
    fused = make_node(graph, _fused_name(chain), OP, inputs, [out], domain=WORKBENCH_DOMAIN,
                      kv_repeat=repeat, mask_mode=mode, nan_guard=int(nan_guard),
                      **({"q_width": q_width} if q_width else {}))
    ensure_opset(graph, WORKBENCH_DOMAIN, 1)
    replace_nodes(graph, chain, [fused])
    gone = list(chain)
    _forget(ctx, chain)
    ctx.made_by[out] = fused
    for pos, vid in enumerate(fused.inputs):
        if vid >= 0:
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
