"""The plan and the graph's values as plain rows, for recordings and reports."""

from __future__ import annotations

from ..dtypes import elem_type_name
from ..ir.graph import Graph
from .plan import Plan


def _shape_text(shape) -> str:
    return "?" if shape is None else "[" + ", ".join(str(d) for d in shape) + "]"


def plan_rows(plan: Plan) -> list[dict]:
    values = plan.graph.values
    rows = []
    for p in plan.nodes:
        rows.append({
            "plan_index": p.index, "name": p.node.name, "op_type": p.node.op_type,
            "domain": p.node.domain, "kernel": p.kernel_kind, "produces_view": p.spec.produces_view,
            "capture_supported": p.capture.supported, "capture_reason": p.capture.reason,
            "capture_detail": p.capture.detail,
            "inputs": [values[i].name for i in p.inputs if i >= 0],
            "outputs": [values[o].name for o in p.outputs if o >= 0],
        })
    return rows


def value_rows(graph: Graph) -> list[dict]:
    inputs, outputs = set(graph.inputs), set(graph.outputs)
    rows = []
    for v in graph.values:
        role = ("input" if v.id in inputs else "output" if v.id in outputs
                else "initializer" if v.id in graph.initializers else "intermediate")
        rows.append({"value_id": v.id, "name": v.name, "dtype": elem_type_name(v.elem_type),
                     "shape": _shape_text(v.shape), "kind": v.kind, "role": role})
    return rows
