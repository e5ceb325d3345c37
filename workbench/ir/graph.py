"""The workbench's in-memory model: values addressed by integer ids, nodes, subgraphs.

A `Graph` is built once from an `onnx.GraphProto` (see `workbench.ir.loader`) and is
read-only afterwards. Shapes are symbolic: a tuple whose entries are `int` (static)
or `str` (a symbol such as "batch_size" or a fresh "unk_3"); `None` when even the
rank is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

ValueId = int
Shape = tuple  # tuple[int | str, ...]


@dataclass
class Value:
    id: ValueId
    name: str
    elem_type: int  # onnx.TensorProto element type; 0 when unknown
    dtype: np.dtype | None
    shape: Shape | None
    #: "tensor", "sequence", "optional", "map" or "unknown"
    kind: str = "tensor"


@dataclass
class Node:
    index: int  # position in the graph's node list (not the plan order)
    name: str
    op_type: str
    domain: str
    inputs: tuple[ValueId, ...]  # -1 for an omitted optional input
    outputs: tuple[ValueId, ...]  # -1 for an omitted optional output
    attrs: dict[str, Any]
    subgraphs: dict[str, Graph] = field(default_factory=dict)
    #: outer-scope values read by the subgraphs (ids in *this* graph), in a fixed order
    outer_reads: tuple[ValueId, ...] = ()
    proto: Any = None  # the onnx.NodeProto, for the host fallback

    @property
    def label(self) -> str:
        return f"node {self.name!r} ({self.domain + '::' if self.domain else ''}{self.op_type})"


@dataclass
class Graph:
    name: str
    values: list[Value]
    nodes: list[Node]
    inputs: list[ValueId]  # caller-fed inputs (initializers excluded)
    outputs: list[ValueId]
    initializers: dict[ValueId, np.ndarray]
    opsets: dict[str, int]  # domain ("" for ai.onnx) -> version
    #: for a subgraph: names it reads from enclosing scopes, as values of this graph
    outer_inputs: list[ValueId] = field(default_factory=list)
    by_name: dict[str, ValueId] = field(default_factory=dict)
    #: what loading had to assume or could not do (`LoadNote`s): shown with the load-time
    #: rewrites (`recording.rewrites()`), never silent
    load_notes: list[LoadNote] = field(default_factory=list)


@dataclass(frozen=True)
class LoadNote:
    """One load-time fact about the model as read: `rule` (``opset_import_assumed``: a
    domain its nodes use but the model does not import, read as version 1 as onnxruntime
    reads it; ``shape_inference_failed``: ONNX shape inference stopped, with why, so the
    values past that point have no static dtype or shape and are resolved at run time;
    ``shape_inference_incomplete``: it went through but left some nodes' outputs untyped,
    an op it has no schema for; ``value_info_dropped``: value_info entries contradicting
    the initializer or Constant they name, dropped before inference),
    the nodes it concerns, and what was concluded."""

    rule: str
    nodes: tuple[str, ...]
    ops: tuple[str, ...]
    detail: str
