"""Fusion rules (graph optimization levels ``extended`` and ``all``).

A fusion replaces several nodes of the loaded graph with fewer that compute the same
values (to float rounding: a fused kernel may sum in another order, as onnxruntime's
fusions do), and is recorded as a `Rewrite` naming every node it replaced.

`RULES` runs in order; each rule takes the graph being rewritten (edited in place),
`release` (the loaded graph's initializers when the caller wants replaced weights
dropped as it goes, so load never holds the model twice) and the level.

- ``matmul_siblings``: MatMuls that read the same input with their own 2-D weights
  (Q/K/V projections, an MLP's gate and up) become one MatMul over the concatenated
  weights and a Split back into the original outputs. One-token decode is bound by
  memory bandwidth, and one larger matrix-vector product streams its weights faster
  than several small ones (measured on SmolLM2-135M, 2 cores: about 3 ms a token).
  For one token the Split's parts are contiguous views, so nothing is copied.
- ``rms_norm`` (`fusion_patterns`): RMSNorm written out op by op (Pow, ReduceMean,
  Add, Sqrt, Div, Mul, Mul; Casts for mixed precision) as SimplifiedLayerNormalization.
- ``layer_norm`` (`fusion_patterns`): LayerNorm written out (ReduceMean, Sub, Pow,
  ReduceMean, Add, Sqrt, Div, Mul, Add) as LayerNormalization (opset >= 17).
- ``gelu`` (`fusion_patterns`): the erf GELU and its tanh approximation as Gelu
  (opset >= 20), else com.microsoft Gelu / FastGelu.
- ``silu`` (`fusion_patterns`): Mul(x, Sigmoid(x)) as com.microsoft QuickGelu(alpha=1).
  One-token decode pays per node dispatched: each rule saves 1 to 8 nodes a pattern.
  These four also run inside If / Loop bodies (on copies; optimum's merged decoder).
- ``attention`` (`fusion_attention`): repeat_kv (Unsqueeze, Expand, Reshape) of K and V,
  Transpose, MatMul, Mul(scale), Where(mask) | Add(mask), Softmax, MatMul as one
  ai.workbench MaskedSoftmaxAttention (no copy of the KV cache per head; also in bodies).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..ir.graph import Graph, Node
from . import fusion_attention, fusion_patterns
from .graph_edit import Rewrite, add_initializer, add_value, make_node, readers, replace_nodes
from .huge_pages import new_weight, write_weight
from .matvec_threads import matvec_order
from .weight_sharing import once

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def fuse(graph: Graph, release: dict | None, level: str) -> list[Rewrite]:
    rewrites: list[Rewrite] = []
    for rule in RULES:
        rewrites += rule(graph, release, level)
    return rewrites


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


RULES: list[Callable[[Graph, dict | None, str], list[Rewrite]]] = [fuse_sibling_matmuls, *fusion_patterns.RULES,
                                                                    *fusion_attention.RULES]
