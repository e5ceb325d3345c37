"""What the load-time rewrites share: the `Rewrite` record and a small graph editor.

Every rule edits the copy of the loaded `Graph` that `optimize` made, in place,
through these helpers, so new values, weights and nodes get unique names, consistent
ids and the shapes the plan needs; `read_values` / `readers` are what the rules mean
by "read": node inputs, subgraph captures and the graph's outputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
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
        for vid in node.outer_reads:
            out.setdefault(vid, []).append((node, -1))
    return out


def read_values(graph: Graph) -> set[int]:
    """Every value some node (or subgraph capture) reads, and the graph's outputs."""
    read = set(graph.outputs)
    for node in graph.nodes:
        read.update(v for v in (*node.inputs, *node.outer_reads) if v >= 0)
    return read


@dataclass
class MatchContext:
    """What a pattern rule consults while it matches chains in one graph."""

    graph: Graph
    read_by: dict
    made_by: dict
    outputs: set
    #: constants that are not this graph's initializers: in a subgraph, the enclosing
    #: scopes' initializers it reads and its own Constant nodes' values
    consts: dict = field(default_factory=dict)
    #: ids of the nodes fused away in this pass
    gone: set = field(default_factory=set)

    @classmethod
    def of(cls, graph: Graph, consts: dict | None = None) -> MatchContext:
        """The context for matching in `graph` as it is now."""
        return cls(graph, readers(graph), producers(graph), set(graph.outputs), consts or {})

    def const(self, vid: int) -> np.ndarray | None:
        array = self.graph.initializers.get(vid)
        array = self.consts.get(vid) if array is None else array
        return array if isinstance(array, np.ndarray) else None

    def dtype(self, vid: int) -> np.dtype | None:
        return self.graph.values[vid].dtype

    def shape(self, vid: int) -> tuple | None:
        return self.graph.values[vid].shape

    def made(self, vid: int, *ops: str) -> Node | None:
        """The node that makes `vid`, when it is a plain one of `ops`."""
        node = self.made_by.get(vid)
        return node if node is not None and is_plain(node, *ops) else None

    def sole_reader(self, vid: int) -> Node | None:
        """The one node that reads `vid` (possibly at several positions), when nothing
        else does: not another node, a subgraph capture or the graph's outputs."""
        if vid < 0 or vid in self.outputs or vid in self.graph.initializers:
            return None
        uses = self.read_by.get(vid, [])
        if len({id(n) for n, _ in uses}) != 1 or any(pos < 0 for _, pos in uses):
            return None
        return uses[0][0]


def is_plain(node: Node, *ops: str) -> bool:
    """`node` is one of the default-domain `ops`, without subgraphs."""
    return node.op_type in ops and not node.domain and not node.subgraphs


def match_everywhere(ctx: MatchContext, match: Callable[[Any, Node], Rewrite | None]) -> list[Rewrite]:
    """`match(ctx, node) -> Rewrite | None` at every node not yet fused away."""
    rewrites = []
    for node in list(ctx.graph.nodes):
        if id(node) not in ctx.gone:
            r = match(ctx, node)
            if r is not None:
                rewrites.append(r)
    return rewrites


def drop_orphans(graph: Graph, rewrites: list[Rewrite], release: dict | None,
                 read_before: set[int] | None = None) -> list[Rewrite]:
    """Initializers nothing reads after `rewrites` (only the fused chains did; with
    `read_before`, only those that were read before) are dropped, their bytes charged
    to the last rewrite's bytes_delta."""
    if not rewrites:
        return rewrites
    read = read_values(graph)
    freed = 0
    for vid in [v for v in graph.initializers if v not in read and (read_before is None or v in read_before)]:
        freed += graph.initializers.pop(vid).nbytes
        if release is not None:
            release.pop(vid, None)
    rewrites[-1] = dataclasses.replace(rewrites[-1], bytes_delta=rewrites[-1].bytes_delta - freed)
    return rewrites


def rewired(node: Node, through: dict[int, int]) -> Node:
    """`node` reading `through[v]` wherever it read a value `v` that `through` maps (a
    removed node's output -> the value its readers read instead)."""
    if not any(v in through for v in node.inputs):
        return node
    return dataclasses.replace(node, inputs=tuple(through.get(v, v) for v in node.inputs))


def producers(graph: Graph) -> dict[int, Node]:
    return {o: n for n in graph.nodes for o in n.outputs if o >= 0}


def matmul_weights(graph: Graph) -> Iterator[tuple[int, list[tuple[Node, int]]]]:
    """(value id, its reads) of each 2-D float initializer that MatMuls alone read, as B,
    and that is no graph output: the weights the one-token layout rules rewrite. Ids
    only, so a caller that replaces a weight lets the original go at once."""
    read_by = readers(graph)
    outputs = set(graph.outputs)
    for vid in list(graph.initializers):
        array = graph.initializers[vid]
        uses = read_by.get(vid, [])
        weight = array.ndim == 2 and array.dtype.kind == "f" and vid not in outputs
        del array
        if weight and uses and all(n.op_type == "MatMul" and not n.domain and pos == 1 for n, pos in uses):
            yield vid, uses


def replace_weight(graph: Graph, vid: int, array: np.ndarray, release: dict | None) -> None:
    """Initializer `vid` of the rewritten graph is `array` from now on; with `release`
    (the loaded graph's initializers) the last reference to the old one goes too, so its
    memory (or map) is freed at once."""
    graph.initializers[vid] = array
    if release is not None:
        release.pop(vid, None)


def weight_rewrite(rule: str, graph: Graph, vid: int, uses: list[tuple[Node, int]]) -> Rewrite:
    """The row of a rule that changed a MatMul weight's memory, not its readers."""
    return Rewrite(rule, tuple(n.name for n, _ in uses), tuple(n.op_type for n, _ in uses),
                   graph.values[vid].name, 0, 0, kept=True)


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


#: a constant by value name in an enclosing scope (None: not a constant there)
Lookup = Callable[[str], "np.ndarray | None"]
#: rewrites a body copy given the enclosing scopes' lookup and the body's own constants
BodyRewrite = Callable[[Graph, Lookup, dict], list[Rewrite]]


def copy_graph(graph: Graph) -> Graph:
    """A copy whose node, value, initializer, name and opset tables can be edited
    without touching `graph` (the arrays and nodes themselves are shared)."""
    return dataclasses.replace(graph, values=list(graph.values), nodes=list(graph.nodes),
                               initializers=dict(graph.initializers), by_name=dict(graph.by_name),
                               opsets=dict(graph.opsets))


def in_bodies(graph: Graph, outer: Lookup | None, rewrite: BodyRewrite) -> list[Rewrite]:
    """`rewrite` run on a copy of every If / Loop / Scan body of `graph`; a node whose
    body changed gets the copy (the loaded graph stays as it was). A body's constants
    are its initializers (what `constant_folding` made of its Constant nodes, say), its
    Constant nodes and the enclosing graphs' initializers it reads by name (a
    name resolves in the nearest scope that defines it; only an initializer there is a
    constant)."""

    def here(name: str) -> np.ndarray | None:
        vid = graph.by_name.get(name)
        if vid is None:
            return None if outer is None else outer(name)
        if vid in graph.initializers:
            return graph.initializers[vid]
        return outer(name) if outer is not None and vid in graph.outer_inputs else None

    rewrites: list[Rewrite] = []
    for i, node in enumerate(graph.nodes):
        changed = {}
        for attr, body in node.subgraphs.items():
            copy = copy_graph(body)
            consts = {vid: a for vid in body.outer_inputs if (a := here(body.values[vid].name)) is not None}
            consts.update(body.initializers)
            consts.update({n.outputs[0]: n.attrs["value"] for n in body.nodes
                           if n.op_type == "Constant" and not n.domain and len(n.outputs) == 1
                           and isinstance(n.attrs.get("value"), np.ndarray)})
            found = rewrite(copy, here, consts)
            if found:
                copy.nodes = [dataclasses.replace(n, index=k) for k, n in enumerate(copy.nodes)]
                changed[attr] = copy
                rewrites += found
        if changed:
            graph.nodes[i] = dataclasses.replace(node, subgraphs={**node.subgraphs, **changed})
    return rewrites
