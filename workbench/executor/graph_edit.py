"""What the load-time rewrites share: the `Rewrite` record and a small graph editor.

`optimize` (folding, dead nodes, layout) and the fusion rules (`fusion`) both edit a
copy of the loaded `Graph` in place through these helpers, so new values, weights and
nodes get unique names, consistent ids and the shapes the plan needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import helper

from ..ir.graph import Graph, Node, Value


@dataclass(frozen=True)
class Rewrite:
    rule: str
    #: the loaded graph's nodes the rewrite replaced or removed
    original_nodes: tuple[str, ...]
    original_ops: tuple[str, ...]
    #: what stands in their place: node or initializer names, or "" when simply removed
    result: str
    #: nodes fewer in the plan (a fusion of two nodes into two can save none)
    nodes_saved: int
    #: resident bytes the rewrite adds (a folded initializer) or frees (negative)
    bytes_delta: int
    #: the original nodes stay in the plan, changed (e.g. a weight relaid)
    kept: bool = False


def readers(graph: Graph) -> dict[int, list[tuple[Node, int]]]:
    """value id -> (node, input position) of every read; -1 for a subgraph's capture."""
    out: dict[int, list[tuple[Node, int]]] = {}
    for node in graph.nodes:
        for pos, vid in enumerate(node.inputs):
            if vid >= 0:
                out.setdefault(vid, []).append((node, pos))
        for vid in node.captures:
            out.setdefault(vid, []).append((node, -1))
    return out


def producers(graph: Graph) -> dict[int, Node]:
    return {o: n for n in graph.nodes for o in n.outputs if o >= 0}


def unique_name(graph: Graph, base: str, taken: set[str] | None = None) -> str:
    """`base`, or `base_2`, `base_3`, ... : a name no value (or node in `taken`) has."""
    name, k = base, 1
    while name in graph.by_name or (taken is not None and name in taken):
        k += 1
        name = f"{base}_{k}"
    return name


def add_value(graph: Graph, name: str, dtype: np.dtype | None, shape: tuple | None) -> int:
    """A new tensor value (intermediate or initializer) named uniquely after `name`."""
    name = unique_name(graph, name)
    dtype = None if dtype is None else np.dtype(dtype)
    elem = helper.np_dtype_to_tensor_dtype(dtype) if dtype is not None and dtype.kind != "O" else 0
    vid = len(graph.values)
    graph.values.append(Value(vid, name, elem, dtype, None if shape is None else tuple(shape)))
    graph.by_name[name] = vid
    return vid


def add_initializer(graph: Graph, name: str, array: np.ndarray) -> int:
    vid = add_value(graph, name, array.dtype, tuple(array.shape))
    graph.initializers[vid] = array
    return vid


def make_node(graph: Graph, name: str, op_type: str, inputs: list[int], outputs: list[int],
              domain: str = "", **attrs: Any) -> Node:
    """A node for the rewritten graph (its index is set when the node list is final)."""
    taken = {n.name for n in graph.nodes}
    return Node(index=-1, name=unique_name(graph, name, taken), op_type=op_type, domain=domain,
                inputs=tuple(inputs), outputs=tuple(outputs), attrs=dict(attrs))


def replace_nodes(graph: Graph, old: list[Node], new: list[Node]) -> None:
    """Put `new` where the first of `old` stood and drop the rest of `old` (the plan
    orders nodes topologically, so only membership matters for correctness)."""
    gone = {id(n) for n in old}
    first = min(i for i, n in enumerate(graph.nodes) if id(n) in gone)
    kept = [n for n in graph.nodes if id(n) not in gone]
    at = sum(1 for n in graph.nodes[:first] if id(n) not in gone)
    graph.nodes = kept[:at] + list(new) + kept[at:]


def ensure_opset(graph: Graph, domain: str, version: int = 1) -> None:
    """A fusion that emits a contrib op makes sure the graph imports its domain."""
    graph.opsets.setdefault(domain, version)
