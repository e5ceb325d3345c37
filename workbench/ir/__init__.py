"""ONNX -> Graph: value ids, symbolic shapes, initializers, subgraphs."""

from .graph import Graph, Node, Value, ValueId
from .loader import load_graph, read_model

__all__ = ["Graph", "Node", "Value", "ValueId", "load_graph", "read_model"]
