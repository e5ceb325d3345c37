"""The execution plan: nodes in topological order, each bound to its kernel."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ModelLoadError, UnsupportedOperatorError
from ..ir.graph import Graph, Node
from ..ops import registry
from ..ops.fallback import build_fallback, fallback_spec
from ..ops.registry import CaptureVerdict, KernelFn, KernelSpec, NodeInfo
from ..rewrite.kernel_info import node_info


@dataclass
class PlanNode:
    index: int  # position in the plan
    node: Node
    spec: KernelSpec
    fn: KernelFn
    info: NodeInfo
    inputs: tuple[int, ...]  # formal inputs then the outer-scope values a subgraph reads (`Node.outer_reads`); -1 = omitted
    outputs: tuple[int, ...]
    capture: CaptureVerdict
    #: for each input position, the plan index of that value's last read
    last_use: tuple[int, ...] = ()

    @property
    def kernel_kind(self) -> str:
        return self.spec.kind

    @property
    def skippable_if(self) -> bool:
        """An If whose branches read nothing from the enclosing graph: its outputs
        depend on the predicate alone, so a step with an unchanged predicate may skip
        it. Its output buffers must then stay as the branch left them (no in-place
        write into them, see `plan_storage`)."""
        return self.node.op_type == "If" and not self.node.outer_reads


@dataclass
class Plan:
    graph: Graph
    nodes: list[PlanNode]
    #: value id -> plan index of its last consumer (graph outputs never die)
    last_use: dict[int, int] = field(default_factory=dict)

    def fallback_nodes(self) -> list[PlanNode]:
        return [p for p in self.nodes if p.spec.kind == "host_fallback"]


def topological_order(graph: Graph) -> list[Node]:
    """Kahn's algorithm, ties broken by the model's own node order."""
    producer: dict[int, int] = {}
    for n in graph.nodes:
        for o in n.outputs:
            if o >= 0:
                producer[o] = n.index
    deps: list[set[int]] = []
    users: dict[int, list[int]] = {}
    for n in graph.nodes:
        d = {producer[v] for v in (*n.inputs, *n.outer_reads) if v >= 0 and v in producer}
        d.discard(n.index)
        deps.append(d)
        for p in d:
            users.setdefault(p, []).append(n.index)
    remaining = [len(d) for d in deps]
    ready = [n.index for n in graph.nodes if remaining[n.index] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(graph.nodes[i])
        for u in users.get(i, ()):
            remaining[u] -= 1
            if remaining[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(graph.nodes):
        stuck = [graph.nodes[i].name for i in range(len(graph.nodes)) if remaining[i] > 0]
        raise ModelLoadError(f"graph {graph.name!r} has a cycle through nodes {stuck[:5]}")
    return order


class KernelCache:
    """Built kernels keyed by (domain, op, opset, dtypes, shapes, attributes)."""

    def __init__(self) -> None:
        self._built: dict[Any, KernelFn] = {}

    def get(self, spec: KernelSpec, info: NodeInfo) -> KernelFn:
        key = _cache_key(spec, info)
        if key is None:
            return spec.build(info)
        fn = self._built.get(key)
        if fn is None:
            fn = self._built[key] = spec.build(info)
        return fn


def _cache_key(spec: KernelSpec, info: NodeInfo) -> Any:
    if info.subgraphs or spec.per_node:
        return None  # control flow, and kernels keeping their call site's arrays, own per-node state
    try:
        attrs = tuple(sorted((k, _freeze(v)) for k, v in info.attrs.items()))
        consts = tuple(sorted((i, _freeze(v)) for i, v in info.constant_inputs.items()))
    except TypeError:
        return None
    # weights by identity: each initializer array lives as long as the session's graph
    weights = tuple(sorted((i, id(v)) for i, v in info.initializer_inputs.items()))
    return (id(spec), info.domain, info.op_type, info.opset, info.input_dtypes,
            info.output_dtypes, info.input_shapes, info.output_shapes, info.output_used, info.input_present,
            info.onnxruntime_rounding, info.faster_onnxruntime_rounding, attrs, consts, weights)


def _freeze(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return (v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    hash(v)
    return v


def build_plan(graph: Graph, xp: Any, cache: KernelCache,
               make_subgraph_runner: Callable | None = None, onnxruntime_rounding: bool = True,
               faster_onnxruntime_rounding: bool = True) -> Plan:
    order = topological_order(graph)
    missing: dict[tuple[str, str, int], list[str]] = {}
    nodes: list[PlanNode] = []
    for node in order:
        info = node_info(graph, node, xp, make_subgraph_runner, onnxruntime_rounding, faster_onnxruntime_rounding)
        spec = registry.find_native(info)
        fn = None
        if spec is not None:
            fn = cache.get(spec, info)
        else:
            try:
                fn = build_fallback(
                    info, node.proto,
                    [graph.values[i].elem_type if i >= 0 else 0 for i in node.inputs],
                    info.outer_read_names,
                    [graph.values[c].elem_type for c in node.outer_reads],
                    graph.opsets,
                )
                spec = fallback_spec(info)
            except Exception:  # noqa: BLE001 - onnx.reference signals "unknown op" in many ways
                missing.setdefault((node.domain or "ai.onnx", node.op_type, info.opset), []).append(node.name)
                continue
        nodes.append(PlanNode(
            index=len(nodes), node=node, spec=spec, fn=fn, info=info,
            inputs=tuple(node.inputs) + tuple(node.outer_reads), outputs=tuple(node.outputs),
            capture=spec.capture_verdict(info),
        ))
    if missing:
        lines = [f"{d}::{op} (opset {v}) at nodes {', '.join(map(repr, names[:5]))}"
                 + (f" and {len(names) - 5} more" if len(names) > 5 else "")
                 for (d, op, v), names in sorted(missing.items())]
        raise UnsupportedOperatorError(
            "no native kernel and no onnx.reference implementation for: " + "; ".join(lines),
            missing=[(d, op, v, names) for (d, op, v), names in sorted(missing.items())],
        )
    plan = Plan(graph=graph, nodes=nodes)
    _compute_last_use(plan)
    return plan


def _compute_last_use(plan: Plan) -> None:
    last: dict[int, int] = {}
    for p in plan.nodes:
        for v in p.inputs:
            if v >= 0:
                last[v] = p.index
    for v in plan.graph.outputs:
        last[v] = len(plan.nodes)  # outputs outlive the run
    plan.last_use = last
    for p in plan.nodes:
        p.last_use = tuple(last.get(v, -1) if v >= 0 else -1 for v in p.inputs)
