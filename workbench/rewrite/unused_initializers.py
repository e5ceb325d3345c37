"""Rule ``unused_initializer`` (every level but "disabled"): weights nothing reads.

What it rewrites: an initializer no node, subgraph capture or graph output reads
(after folding, after a fusion or a relayout replaced it, or unread in the file) is
dropped from the rewritten graph; with `release` (the loaded graph's initializers)
the loaded graph's reference goes too, so its memory is freed at once and load never
holds the model twice.

The invariant: an initializer is a value only its readers see (`read_values`); with
none, no output depends on it.
"""

from __future__ import annotations

from ..ir.graph import Graph
from .graph_edit import Rewrite, read_values


def drop_unused_initializers(graph: Graph, release: dict | None) -> list[Rewrite]:
    read = read_values(graph)
    unused = [vid for vid in graph.initializers if vid not in read]
    rewrites = []
    for vid in unused:
        array = graph.initializers.pop(vid)
        if release is not None:
            release.pop(vid, None)  # the loaded graph's reference too: its memory goes now
        rewrites.append(Rewrite("unused_initializer", (), (), graph.values[vid].name, 0, -array.nbytes))
    return rewrites
