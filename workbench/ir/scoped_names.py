"""Give every subgraph-local value a name no other graph of the model defines, for the
length of ONNX shape inference, and restore the names afterwards.

Why: onnx's data propagation (`infer_shapes(data_prop=True)`) keeps the values it
propagates by name for the whole model, not per graph. optimum's merged decoder holds
two different decoders in the branches of one If, and both name their values alike
(`/model/Shape_5_output_0` is the shape of a 4-D mask in one branch and of a 1-D tensor
in the other): the second branch inferred the first branch's shapes, its Equal was
preallocated 4-D, and a broadcasting kernel filled it without a word. Names are
scoped per graph in ONNX; this makes the scopes plain to onnx, then undoes it, so no
name a user sees changes.

The two protos are matched by walking their graphs in the same order (node by node,
attribute by attribute): inference adds value_info, never nodes or subgraphs.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import onnx

__all__ = ["restore_names", "scope_names"]

_SUFFIX = "__wb_scope"


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            yield from a.graphs


def _walk(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """Every graph below `graph` (not itself), in a fixed order."""
    for node in graph.node:
        for sub in _subgraphs(node):
            yield sub
            yield from _walk(sub)


def _defined(graph: onnx.GraphProto) -> set[str]:
    names = {vi.name for vi in graph.input} | {t.name for t in graph.initializer}
    names |= {o for n in graph.node for o in n.output if o}
    return names


def _rename(graph: onnx.GraphProto, mapping: dict[str, str]) -> None:
    """Rename references to `mapping`'s names in `graph` and the graphs below it that do
    not define those names again (an inner definition shadows the outer one)."""
    if not mapping:
        return
    for vi in itertools.chain(graph.input, graph.output, graph.value_info):
        vi.name = mapping.get(vi.name, vi.name)
    for t in graph.initializer:
        t.name = mapping.get(t.name, t.name)
    for node in graph.node:
        node.input[:] = [mapping.get(n, n) for n in node.input]
        node.output[:] = [mapping.get(n, n) for n in node.output]
        for sub in _subgraphs(node):
            shadowed = _defined(sub)
            _rename(sub, {k: v for k, v in mapping.items() if k not in shadowed})


def scope_names(model: onnx.ModelProto) -> list[dict[str, str]] | None:
    """Rename, in place, each subgraph-local value whose name another graph also
    defines; returns per subgraph (in walk order) new name -> old name, or None when no
    name needed it (the model is left as it was)."""
    graphs = [model.graph, *_walk(model.graph)]
    count: dict[str, int] = {}
    for g in graphs:
        for name in _defined(g):
            count[name] = count.get(name, 0) + 1
    if all(n == 1 for n in count.values()):
        return None
    restores: list[dict[str, str]] = []
    for k, g in enumerate(graphs[1:], start=1):
        clash = {name: f"{name}{_SUFFIX}{k}" for name in _defined(g) if count[name] > 1}
        _rename(g, clash)
        restores.append({new: old for old, new in clash.items()})
    return restores


def restore_names(model: onnx.ModelProto, restores: list[dict[str, str]] | None) -> None:
    """Undo `scope_names` on `model` (the same model after shape inference)."""
    if restores is None:
        return
    graphs = list(_walk(model.graph))
    for g, back in zip(graphs, restores):
        _rename(g, back)
