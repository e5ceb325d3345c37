"""The oracle the differential tests compare against, and a value-info shorthand.

onnxruntime runs with its graph optimizations off, so what a test checks is our
executor against the model as written, not against another set of rewrites.
"""

from __future__ import annotations

import onnxruntime as ort
from onnx import TensorProto, helper


def ort_session(model) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def tensor(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)
