"""Fusion rule ``nbits_siblings`` (levels "extended", "all"): MatMulNBits of one input as one.

What it rewrites: MatMulNBits nodes (com.microsoft, onnxruntime-genai's int4 exports)
that read the same A with the same K, bits, block size and accuracy level, each with
its own packed weight, scales and (all or none) zero points and biases, become one
MatMulNBits over those concatenated along N and a Split of its last axis back into the
original outputs: a layer's Q/K/V projections, its MLP's gate and up. The int8 compute
of accuracy level 4 (`ops.nbits_int8`) costs a fixed number of numpy calls per node
whatever N is, so three projections in one call cost about a third.

When it applies: the nodes are computed in int8 (accuracy level 4 where onnxruntime
has a CompInt8 kernel; a weight dequantized at build time is cached only up to a size,
so those are left); every packed weight, scale, zero-point and bias input is an
initializer read by that node alone and is no graph output; no g_idx; every node's N is
a multiple of 4; A is no initializer and has a known rank >= 2.

The invariant: each output column of MatMulNBits is computed from A and that column's
own packed row, scales and zero points alone (A's int8 quantization is per row of A and
per block of K, the same for every column), so column j of the concatenated product is
the column it came from. Onnxruntime's MLAS kernel sums a group of 4 columns in one
order and the last N % 4 columns in another; with every N a multiple of 4 each column
keeps its kind of group, so the fused product is onnxruntime's unfused one bit for bit
where `nbits_int8` is (tests/rewrite/test_nbits_siblings.py).
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node
from ..ops.contrib_quant import int8_compute_layout
from .graph_edit import Rewrite, add_initializer, add_value, make_node, readers, replace_nodes
from .matmul_siblings import _split_node

#: MatMulNBits' weight inputs, by position: B, scales, zero_points, g_idx, bias
_B, _SCALES, _ZERO_POINTS, _G_IDX, _BIAS = 1, 2, 3, 4, 5


def fuse_sibling_nbits(graph: Graph, release: dict | None, level: str) -> list[Rewrite]:
    read_by = readers(graph)
    outputs = set(graph.outputs)
    groups: dict[tuple, list[Node]] = {}
    for node in graph.nodes:
        key = _group_key(graph, node, read_by, outputs)
        if key is not None:
            groups.setdefault(key, []).append(node)
    return [_fuse_group(graph, members, release) for members in groups.values() if len(members) >= 2]


def _group_key(graph: Graph, node: Node, read_by: dict, outputs: set[int]) -> tuple | None:
    """What siblings must share, or None when `node` is no MatMulNBits this rule fuses."""
    if node.op_type != "MatMulNBits" or len(node.outputs) != 1 or node.outputs[0] < 0:
        return None
    inputs = list(node.inputs) + [-1] * (6 - len(node.inputs))
    a = inputs[0]
    if a < 0 or a in graph.initializers or inputs[_G_IDX] >= 0 or int(node.attrs.get("N", 0)) % 4:
        return None
    zero_points = graph.initializers.get(inputs[_ZERO_POINTS]) if inputs[_ZERO_POINTS] >= 0 else None
    if not int8_compute_layout(node.attrs, None if zero_points is None else zero_points.dtype, False):
        return None  # a weight dequantized at build time is cached only up to a size: leave it
    for pos in (_B, _SCALES, _ZERO_POINTS, _BIAS):
        vid = inputs[pos]
        if vid < 0:
            if pos in (_B, _SCALES):
                return None
            continue
        if vid not in graph.initializers or vid in outputs or len(read_by.get(vid, ())) != 1:
            return None
    shape = graph.values[a].shape
    if shape is None or len(shape) < 2:
        return None
    attrs = {k: v for k, v in node.attrs.items() if k != "N"}
    present = tuple(inputs[pos] >= 0 for pos in (_ZERO_POINTS, _BIAS))
    dtypes = tuple(graph.initializers[inputs[pos]].dtype.str if inputs[pos] >= 0 else ""
                   for pos in (_B, _SCALES, _ZERO_POINTS, _BIAS))
    return (a, node.domain, tuple(sorted(attrs.items())), present, dtypes, graph.values[node.outputs[0]].dtype)


def _fuse_group(graph: Graph, members: list[Node], release: dict | None) -> Rewrite:
    first = members[0]
    widths = [int(n.attrs["N"]) for n in members]
    n_total = sum(widths)
    fused_inputs = [first.inputs[0]]
    for pos in range(_B, len(first.inputs)):
        if first.inputs[pos] < 0:
            fused_inputs.append(-1)
            continue
        parts = [graph.initializers[n.inputs[pos]] for n in members]
        # per output row: B [N, blocks, blob], scales and zero points [N, ...] or flat, bias [N]
        joined = np.concatenate([p.reshape(w, -1) for p, w in zip(parts, widths)], axis=0)
        if parts[0].ndim == 1:
            joined = joined.reshape(-1)
        elif parts[0].ndim == 3:
            joined = joined.reshape((n_total,) + parts[0].shape[1:])
        name = f"{graph.values[first.inputs[pos]].name}/siblings"
        fused_inputs.append(add_initializer(graph, name, np.ascontiguousarray(joined)))
        for n in members:
            del graph.initializers[n.inputs[pos]]
            if release is not None:
                release.pop(n.inputs[pos], None)
    out = graph.values[first.outputs[0]]
    a_shape = graph.values[first.inputs[0]].shape
    product = add_value(graph, f"{out.name}/siblings", out.dtype, tuple(a_shape[:-1]) + (n_total,))
    attrs = dict(first.attrs, N=n_total)
    node = make_node(graph, f"{first.name}/siblings", "MatMulNBits", fused_inputs, [product], first.domain, **attrs)
    split = _split_node(graph, f"{first.name}/siblings_split", product, [n.outputs[0] for n in members], widths)
    replace_nodes(graph, members, [node, split])
    return Rewrite("nbits_siblings", tuple(n.name for n in members), tuple(n.op_type for n in members),
                   f"{node.name} + {split.name}", len(members) - 2, 0)
