"""Rule ``layout_round_trip`` (levels "extended", "all", before the fusions): layout ops
that undo each other.

What it rewrites: onnxruntime's optimizer writes the attention it could not fuse (its
"unfused attention", transformers' GPT-2 after its CPU fusions) with K, V and Q each
taken through Transpose -> Reshape (merge the heads) -> Reshape (split them again) ->
Transpose. Two Reshapes in a row whose result has the first one's input shape are
removed (the second's readers read that input), and two Transposes in a row become one,
or none where together they permute nothing. What is left is the attention chain the
`attention` fusion recognises, and a dozen eager layout nodes a layer fewer.

When it applies: the nodes are in the default domain, without subgraphs; a Reshape's
shape is a constant, and allowzero is 0 wherever that shape holds a 0; the input's
shape is known well enough to compute both results: a 0 copies the input's dim, and a
-1 is the input's size over the other dims' product, which must leave no symbol (a dim
the shape inference could not name stops the rule); a Transpose has its `perm`. The
first node's output is read by the second alone, and the value the second made is not
a graph output nor read by a subgraph (its readers are rewired by value).

The invariant: a Reshape keeps its input's elements in row-major order, so two of them
ending in the input's own shape give the input, element for element; Transpose(
Transpose(x, p), q) is Transpose(x, p[q]) (output axis i reads input axis p[q[i]]).
Only where the arrays live changes (views either way).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np

from ..ir.graph import Graph, Node
from .graph_edit import Rewrite, is_plain, readers, rewired


def drop_layout_round_trips(graph: Graph) -> list[Rewrite]:
    """Remove Reshape pairs that restore their input and merge Transpose pairs, until none is left."""
    rewrites: list[Rewrite] = []
    while True:
        found = _one_pass(graph)
        if not found:
            return rewrites
        rewrites += found


def _one_pass(graph: Graph) -> list[Rewrite]:
    outputs = set(graph.outputs)
    read_by = readers(graph)
    made_by = {o: n for n in graph.nodes for o in n.outputs if o >= 0}
    for second in graph.nodes:
        if not is_plain(second, "Reshape", "Transpose") or not second.inputs or second.inputs[0] < 0:
            continue
        first = made_by.get(second.inputs[0])
        if first is None or first.op_type != second.op_type or not is_plain(first, first.op_type):
            continue
        middle, result = first.outputs[0], second.outputs[0]
        if [n for n, _ in read_by.get(middle, [])] != [second] or middle in outputs:
            continue
        if second.op_type == "Reshape":
            if _restores(graph, first, second) and _rewirable(result, outputs, read_by):
                return _bypass(graph, (first, second), first.inputs[0], result)
        else:
            edit = _merged_transposes(graph, first, second, outputs, read_by)
            if edit is not None:
                return edit
    return []


def _rewirable(vid: int, outputs: set, read_by: dict) -> bool:
    """Readers of `vid` may read another value instead: no graph output, no subgraph capture."""
    return vid not in outputs and all(pos >= 0 for _, pos in read_by.get(vid, []))


def _bypass(graph: Graph, removed: tuple[Node, ...], source: int, result: int) -> list[Rewrite]:
    """`removed` leave the graph; readers of `result` read `source` instead."""
    gone = {id(n) for n in removed}
    graph.nodes = [rewired(n, {result: source}) for n in graph.nodes if id(n) not in gone]
    return [Rewrite("layout_round_trip", tuple(n.name for n in removed), tuple(n.op_type for n in removed),
                    "", len(removed), 0)]


# -- Reshape pairs ------------------------------------------------------------------------

def _restores(graph: Graph, first: Node, second: Node) -> bool:
    """Whether Reshape `second` of Reshape `first` of x has x's shape."""
    x = first.inputs[0]
    shape = graph.values[x].shape
    if shape is None or any(d is None for d in shape):
        return False
    middle = _reshaped(graph, first, tuple(shape))
    final = None if middle is None else _reshaped(graph, second, middle)
    return final is not None and final == tuple(shape)


def _reshaped(graph: Graph, node: Node, shape: tuple) -> tuple | None:
    """The shape Reshape `node` gives an input of `shape` (ints and symbol names), or None
    where it cannot be told: a shape that is not a constant, a 0 under allowzero, or a -1
    whose size would keep a symbol."""
    if len(node.inputs) != 2 or node.inputs[1] not in graph.initializers:
        return None
    target = np.asarray(graph.initializers[node.inputs[1]])
    if target.ndim != 1 or target.dtype.kind != "i":
        return None
    target = [int(t) for t in target]
    if 0 in target and int(node.attrs.get("allowzero", 0)):
        return None
    if target.count(-1) > 1 or any(t < -1 for t in target):
        return None
    out: list = []
    for i, t in enumerate(target):
        if t == 0:
            if i >= len(shape):
                return None
            out.append(shape[i])
        else:
            out.append(t)
    if -1 in out:
        size = _quotient(shape, [d for d in out if d != -1])
        if size is None:
            return None
        out[out.index(-1)] = size
    return tuple(out)


def _quotient(numerator: tuple, denominator: list) -> int | None:
    """prod(numerator) / prod(denominator) where the symbols cancel and it divides, else None."""
    top, bottom = _product(numerator), _product(denominator)
    if top[1] != bottom[1] or bottom[0] == 0 or top[0] % bottom[0]:
        return None
    return top[0] // bottom[0]


def _product(dims) -> tuple[int, Counter]:
    number, symbols = 1, Counter()
    for d in dims:
        if isinstance(d, (int, np.integer)):
            number *= int(d)
        else:
            symbols[str(d)] += 1
    return number, symbols


# -- Transpose pairs ----------------------------------------------------------------------

def _merged_transposes(graph: Graph, first: Node, second: Node, outputs: set,
                       read_by: dict) -> list[Rewrite] | None:
    p, q = first.attrs.get("perm"), second.attrs.get("perm")
    if p is None or q is None or len(p) != len(q) or sorted(p) != list(range(len(p))) \
            or sorted(q) != list(range(len(q))):
        return None
    perm = [int(p[i]) for i in q]
    x = first.inputs[0]
    if perm == list(range(len(perm))):
        if not _rewirable(second.outputs[0], outputs, read_by):
            return None
        return _bypass(graph, (first, second), x, second.outputs[0])
    merged = dataclasses.replace(second, inputs=(x,), attrs={**second.attrs, "perm": perm})
    graph.nodes = [merged if n is second else n for n in graph.nodes if n is not first]
    return [Rewrite("layout_round_trip", (first.name, second.name), ("Transpose", "Transpose"),
                    second.name, 1, 0)]
