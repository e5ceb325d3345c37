"""The elementwise pattern rules as one family: their order, and their run inside bodies.

`PATTERN_RULES` are the four rules that fuse an op-by-op chain into one node, each in
its own module: ``layer_norm``, ``rms_norm``, ``gelu``, ``silu`` (shared matching in
`chain_match`). LayerNorm runs before RMSNorm: a LayerNorm's tail, x - mean normalised
by its RMS, is an RMSNorm of x - mean, which `rms_norm` alone would take, leaving the
mean and the Sub unfused.

`fuse_in_subgraphs` runs the same four rules inside If / Loop / Scan bodies, on copies
(optimum's merged decoder holds the whole model in an If). The invariant it adds to
theirs: a body's constants are read as the body would read them at run time, by name
from the nearest scope that defines the name, and only an initializer there (or a
Constant node of the body) counts as a constant; a name shadowed by a non-constant
value is no constant. The node gets the edited copy and the loaded graph's bodies
stay as they were. A Constant node of the body a fusion leaves unread goes with it,
as a ``dead_node`` row (nothing reads it: see `dead_nodes`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..ir.graph import Graph
from .gelu import fuse_gelu
from .graph_edit import Rewrite, in_bodies, read_values
from .identity_ops import drop_identity_ops
from .layer_norm import fuse_layer_norm
from .rms_norm import fuse_rms_norm
from .silu import fuse_silu

#: LayerNorm before RMSNorm: a LayerNorm's tail (x - mean normalised by its RMS) is an RMSNorm of x - mean
PATTERN_RULES = [fuse_layer_norm, fuse_rms_norm, fuse_gelu, fuse_silu]


def fuse_in_subgraphs(graph: Graph, release: dict | None, level: str = "extended",
                      outer: Callable[[str], np.ndarray | None] | None = None) -> list[Rewrite]:
    """The pattern rules inside If / Loop / Scan bodies (optimum's merged decoder holds
    the whole model in an If), after `identity_ops`' rule there. A body is copied
    before it is edited (the loaded graph stays as it was) and the node given the copy.
    Its constants are mostly the enclosing graph's initializers, read by name: a name
    resolves in the nearest scope that defines it, and only an initializer there counts
    as a constant; and its own, which `constant_folding` made of its Constant nodes. A
    Constant node a fusion leaves unread is dropped with it (a body initializer is, by
    the rule that fused, as at the top level)."""

    def rewrite_body(copy: Graph, here, consts: dict) -> list[Rewrite]:
        read_before = read_values(copy)
        found = drop_identity_ops(copy)  # the top level's basic rule, which does not enter bodies
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



#: the family as `fusion.RULES` runs it: at the top level, then inside bodies
RULES = [*PATTERN_RULES, fuse_in_subgraphs]
