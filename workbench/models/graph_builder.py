"""A small wrapper over `onnx.helper` that hands out unique node/value names."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 10  # opset 18 needs IR >= 8; 10 is read by every onnxruntime >= 1.17
DEFAULT_OPSET = 18
MS_DOMAIN = "com.microsoft"


class GraphBuilder:
    """Accumulates nodes, initializers and graph I/O, then makes a ModelProto.

    `node()` names a node after its path (`/model/layers.0/attn/MatMul`) and its
    outputs `<node name>/output_<i>`, the way exporters do. Constants are cached by
    value; `constant_nodes=True` emits them as `Constant` nodes (TorchScript style),
    otherwise as initializers named like the genai builder's
    `/model/constants/TensorProto.INT64/1D/0, 1`.
    """

    def __init__(self, name: str, *, constant_nodes: bool = False):
        self.name = name
        self.constant_nodes = constant_nodes
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._names: set[str] = set()
        self._consts: dict[tuple, str] = {}
        self.domains: dict[str, int] = {"": DEFAULT_OPSET}

    # -- names -----------------------------------------------------------------
    def unique(self, base: str) -> str:
        name, i = base, 0
        while name in self._names:
            i += 1
            name = f"{base}_{i}"
        self._names.add(name)
        return name

    # -- graph I/O -------------------------------------------------------------
    def input(self, name: str, elem_type: int, shape: Sequence[int | str]) -> str:
        self._names.add(name)
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def output(self, name: str, elem_type: int, shape: Sequence[int | str]) -> str:
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    # -- weights and constants -------------------------------------------------
    def initializer(self, name: str, array: np.ndarray) -> str:
        name = self.unique(name)
        self.initializers.append(numpy_helper.from_array(np.require(array, requirements="C"), name))
        return name

    def const(self, value, dtype=np.int64, *, scalar: bool = False) -> str:
        """A cached constant: a 1-D tensor, or 0-D with `scalar=True`."""
        arr = np.asarray(value, dtype=dtype)
        arr = arr.reshape(()) if scalar else arr.reshape(-1)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key in self._consts:
            return self._consts[key]
        onnx_type = helper.np_dtype_to_tensor_dtype(arr.dtype)
        rank = f"{arr.ndim}D"
        text = ", ".join(str(v) for v in arr.reshape(-1).tolist())
        base = f"/model/constants/TensorProto.{TensorProto.DataType.Name(onnx_type)}/{rank}/{text}"
        if self.constant_nodes:
            out = self.node("Constant", [], name=f"{base}/Constant", value=numpy_helper.from_array(arr))
        else:
            out = self.initializer(base, arr)
        self._consts[key] = out
        return out

    def i64(self, *values: int) -> str:
        return self.const(list(values), np.int64)

    def i64_scalar(self, value: int) -> str:
        return self.const(value, np.int64, scalar=True)

    def f32_scalar(self, value: float) -> str:
        return self.const(value, np.float32, scalar=True)

    # -- nodes -----------------------------------------------------------------
    def node(
        self,
        op_type: str,
        inputs: Sequence[str],
        *,
        name: str,
        n_outputs: int = 1,
        outputs: Sequence[str] | None = None,
        domain: str = "",
        **attrs,
    ):
        """Add a node; returns its output name (or the list when n_outputs > 1)."""
        node_name = self.unique(name)
        if outputs is None:
            outputs = [f"{node_name}/output_{i}" for i in range(n_outputs)]
        for out in outputs:
            if out:
                self._names.add(out)
        if domain and domain not in self.domains:
            self.domains[domain] = 1
        self.nodes.append(
            helper.make_node(
                op_type, list(inputs), list(outputs), name=node_name, domain=domain or None, **attrs
            )
        )
        return outputs[0] if len(outputs) == 1 else list(outputs)

    # -- common chains ---------------------------------------------------------
    def dim(self, value: str, axis: int, *, name: str) -> str:
        """`Shape -> Gather(axis)`: a 0-D int64 holding one dimension of `value`."""
        shape = self.node("Shape", [value], name=f"{name}/Shape")
        return self.node("Gather", [shape, self.i64_scalar(axis)], name=f"{name}/Gather", axis=0)

    def unsqueeze0(self, scalar: str, *, name: str) -> str:
        return self.node("Unsqueeze", [scalar, self.i64(0)], name=f"{name}/Unsqueeze")

    def shape_of(self, parts: Sequence[str | int], *, name: str) -> str:
        """`Concat` of 1-element int64 pieces; ints become constants."""
        pieces = [self.i64(p) if isinstance(p, int) else p for p in parts]
        return self.node("Concat", pieces, name=f"{name}/Concat", axis=0)

    # -- result ----------------------------------------------------------------
    def make_model(self, *, producer: str = "workbench.models") -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers)
        opsets = [helper.make_opsetid(d, v) for d, v in self.domains.items()]
        model = helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION, producer_name=producer)
        return model
