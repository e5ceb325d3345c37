"""Fusion rule ``matmul_siblings`` (levels "extended", "all"): MatMuls of one input as one.

What it rewrites: MatMuls that read the same A, each with its own 2-D float weight of
the same row count and dtype (Q/K/V projections, an MLP's gate and up), become one
MatMul over the weights concatenated along their columns and a Split along the last
axis back into the original output values. One-token decode is bound by memory
bandwidth, and one larger matrix-vector product streams its weights faster than
several small ones (measured on SmolLM2-135M, 2 cores: about 3 ms a token). For one
token the Split's parts are contiguous views, so nothing is copied.

When it applies: each weight is an initializer read by that MatMul alone and is no
graph output; A is no initializer and has a known rank >= 2 (a 1-D A drops the
product's first axis). At level "all" the fused weight is written once, in the
memory order `matvec_layout` would give it (`matvec_threads.matvec_order`), so load
never holds a second copy of the model's largest weights; the two branches of an If
share it (`weight_sharing`).

The invariant: column j of A @ [W1 | W2 | ...] is column j of the product with the
weight that column came from: each output element is the same dot product of a row
of A with the same column, so splitting the fused product at the weights' widths gives
each original output, with its value id, dtype and shape. Only BLAS's blocking of the
larger product may differ (float rounding).
"""

from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Node
from .graph_edit import Rewrite, add_initializer, add_value, make_node, readers, replace_nodes
from .huge_pages import new_weight, write_weight
from .matvec_threads import matvec_order
from .weight_sharing import once

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def fuse_sibling_matmuls(graph: Graph, release: dict | None, level: str) -> list[Rewrite]:
    column_major = level == "all"
    read_by = readers(graph)
    outputs = set(graph.outputs)
    groups: dict[tuple, list[Node]] = {}
    for node in graph.nodes:
        weight = _own_weight(graph, node, read_by, outputs)
        if weight is not None:
            groups.setdefault((node.inputs[0], weight.shape[0], weight.dtype.str), []).append(node)
    rewrites = []
    for members in groups.values():
        if len(members) >= 2:
            rewrites.append(_fuse_group(graph, members, release, column_major))
    return rewrites


def _own_weight(graph: Graph, node: Node, read_by: dict, outputs: set[int]) -> np.ndarray | None:
    """The node's B when it is a MatMul of a 2-D float weight that nothing else reads."""
    if node.op_type != "MatMul" or node.domain or len(node.inputs) != 2 or node.outputs[0] < 0:
        return None
    a, b = node.inputs
    weight = graph.initializers.get(b)
    if (weight is None or a < 0 or a in graph.initializers or weight.ndim != 2 or weight.dtype not in _FLOATS
            or b in outputs or len(read_by.get(b, ())) != 1):
        return None
    shape = graph.values[a].shape
    if shape is None or len(shape) < 2:  # a 1-D A drops the product's first axis: not worth the cases
        return None
    return weight


def _fuse_group(graph: Graph, members: list[Node], release: dict | None, column_major: bool) -> Rewrite:
    weights = [graph.initializers[n.inputs[1]] for n in members]
    widths = [w.shape[1] for w in weights]
    # written once, in the layout level "all" gives MatMul weights on the cpu (matvec_layout
    # then leaves it; another backend's is relaid): a second copy of the model's largest
    # weights would double load time
    rows, cols = weights[0].shape[0], sum(widths)
    order = matvec_order(rows, cols) if column_major else "C"
    fused = once(("matmul_siblings", order), tuple(weights), _concatenated, weights, order)  # one for both If branches
    for n in members:
        del graph.initializers[n.inputs[1]]
        if release is not None:
            release.pop(n.inputs[1], None)
    del weights
    first = members[0]
    a_shape = graph.values[first.inputs[0]].shape
    w_id = add_initializer(graph, f"{graph.values[first.inputs[1]].name}/siblings", fused)
    product = add_value(graph, f"{graph.values[first.outputs[0]].name}/siblings", fused.dtype,
                        tuple(a_shape[:-1]) + (fused.shape[1],))
    matmul = make_node(graph, f"{first.name}/siblings", "MatMul", [first.inputs[0], w_id], [product])
    split = _split_node(graph, f"{first.name}/siblings_split", product, [n.outputs[0] for n in members], widths)
    replace_nodes(graph, members, [matmul, split])
    return Rewrite("matmul_siblings", tuple(n.name for n in members), tuple(n.op_type for n in members),
                   f"{matmul.name} + {split.name}", len(members) - 2, 0)


def _concatenated(weights: list[np.ndarray], order: str) -> np.ndarray:
    """The weights side by side along their columns, in a new weight of `order`."""
    fused = new_weight((weights[0].shape[0], sum(w.shape[1] for w in weights)), weights[0].dtype, order)
    at = 0
    for w in weights:
        write_weight(fused[:, at:at + w.shape[1]], w)
        at += w.shape[1]
    return fused


def _split_node(graph: Graph, name: str, source: int, parts: list[int], widths: list[int]) -> Node:
    """Split along the last axis into `parts` of `widths`, in the form the graph's opset reads."""
    if graph.opsets.get("", 1) >= 13:
        sizes = add_initializer(graph, f"{name}/sizes", np.array(widths, np.int64))
        return make_node(graph, name, "Split", [source, sizes], parts, axis=-1)
    return make_node(graph, name, "Split", [source], parts, axis=-1, split=list(widths))
