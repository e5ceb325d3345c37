"""Host fallback: any standard op without a native kernel runs through `onnx.reference`.

Each fallback node is wrapped in a one-node model evaluated by
`onnx.reference.ReferenceEvaluator` on host arrays. Such nodes are reported by the
session and decline device-graph capture (`host_fallback_kernel`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator

from .registry import KernelFn, KernelSpec, NodeInfo, declined, host_read

FALLBACK_VERDICT = declined("host_fallback_kernel", "runs through onnx.reference on the host")


def build_fallback(info: NodeInfo, node_proto: onnx.NodeProto, input_types: list[int],
                   outer_read_names: tuple[str, ...], outer_read_types: list[int],
                   opsets: dict[str, int]) -> KernelFn:
    """Build a fallback kernel, or raise if onnx.reference cannot run this node."""
    names = [n for n in node_proto.input if n]
    seen = set(names)
    graph_inputs = []
    for name, et in zip(node_proto.input, input_types):
        if name and name in seen:
            graph_inputs.append(helper.make_tensor_value_info(name, et, None))
            seen.discard(name)
    extra = [n for n in outer_read_names if n not in names]
    for name, et in zip(outer_read_names, outer_read_types):
        if name in extra:
            graph_inputs.append(helper.make_tensor_value_info(name, et, None))
    outputs = [helper.make_tensor_value_info(n, 0, None) for n in node_proto.output if n]
    graph = helper.make_graph([node_proto], "fallback", graph_inputs, outputs)
    opsets = [helper.make_opsetid(d, v) for d, v in opsets.items()]
    model = helper.make_model(graph, opset_imports=opsets or [helper.make_opsetid("", info.opset)])
    evaluator = ReferenceEvaluator(model)
    input_names = list(node_proto.input)
    output_positions = [i for i, n in enumerate(node_proto.output) if n]
    n_out = len(node_proto.output)

    def to_host(value: Any) -> Any:  # onnx.reference computes on host arrays
        return value if value is None or isinstance(value, (list, np.ndarray)) else host_read(value)

    def run(inputs: list, outs: list) -> list:
        feed: dict[str, Any] = {}
        for name, arr in zip(input_names, inputs):
            if name:
                feed[name] = to_host(arr)
        for name, arr in zip(outer_read_names, inputs[len(input_names):]):
            feed.setdefault(name, to_host(arr))
        got = evaluator.run(None, feed)
        results: list[Any] = [None] * n_out
        for position, value in zip(output_positions, got):
            if isinstance(value, np.generic):
                value = np.asarray(value)  # host-ok: onnx.reference returned a host numpy scalar
            results[position] = value
        return results

    return run


def fallback_spec(info: NodeInfo) -> KernelSpec:
    return KernelSpec(domain=info.domain, op_type=info.op_type, since=1, until=None,
                      build=lambda _info: None, capture=FALLBACK_VERDICT,
                      data_dependent_shape=True, kind="host_fallback")
