"""The oracle the differential tests compare against, and a value-info shorthand.

onnxruntime runs with its graph optimizations off, so what a test checks is our
executor against the model as written, not against another set of rewrites.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper


def ort_session(model) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def tensor(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def runs_on_one_buffer(session, oracle, shape, runs, rng, input_name="x", names=None):
    """The decode loop's pattern: `runs` runs that feed the same float32 array (new
    contents each run) to `session` and a copy of it to `oracle`; yields (run, output
    name, ours, theirs) for every output of every run."""
    x = np.empty(shape, np.float32)
    for run in range(runs):
        x[...] = rng.standard_normal(shape)
        got = session.run(None, {input_name: x})
        want = oracle.run(None, {input_name: x.copy()})
        for name, g, w in zip(names or range(len(want)), got, want, strict=True):
            yield run, name, g, w
