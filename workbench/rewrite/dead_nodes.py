"""Rule ``dead_node`` (every level but "disabled"): nodes whose outputs nothing reads.

What it rewrites: a node none of whose outputs is read by another node, by a
subgraph of the graph (a capture from the enclosing scope) or as a graph output is
removed, repeatedly, until every node left has a reader (folding leaves such nodes
behind; so do model files).

The invariant: a run observes only the graph's outputs, and a value reaches them
only through reads (`graph_edit.read_values` counts node inputs, subgraph captures
and the outputs); a node with no read output contributes to no output, and a node's
only effect is the values it writes.
"""

from __future__ import annotations

from ..ir.graph import Graph
from .graph_edit import Rewrite, read_values


def drop_dead_nodes(graph: Graph) -> list[Rewrite]:
    rewrites = []
    while True:
        read = read_values(graph)
        dead = [n for n in graph.nodes if not any(o >= 0 and o in read for o in n.outputs)]
        if not dead:
            return rewrites
        gone = {id(n) for n in dead}
        graph.nodes = [n for n in graph.nodes if id(n) not in gone]
        rewrites += [Rewrite("dead_node", (n.name,), (n.op_type,), "", 1, 0) for n in dead]
