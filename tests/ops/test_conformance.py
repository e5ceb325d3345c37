"""The ONNX backend node test cases, run through workbench.InferenceSession.

Every case must pass unless it is listed in `EXPECTED_FAILURES` with its reason (or draws
random numbers: `RANDOM_CASES`);
every op in `NATIVE_OPS` must run on its native kernel (not the onnx.reference
fallback) for the dtypes numpy computes natively.
"""

from __future__ import annotations

import numpy as np
import pytest
from conformance import node_cases, run_case

import workbench

# Standard ops that decoder-LLM exporters emit; each has a native numpy kernel.
NATIVE_OPS = frozenset("""
Add Sub Mul Div Pow Sqrt Reciprocal Neg Abs Exp Log Erf Tanh Sigmoid Relu Gelu Softmax
LogSoftmax MatMul Gemm ReduceMean ReduceSum ReduceMax Cast CastLike Reshape Transpose Squeeze
Unsqueeze Flatten Concat Split Slice Gather GatherND GatherElements ScatterND Shape Size Expand
Tile ConstantOfShape Constant Range Where Equal Less Greater LessOrEqual GreaterOrEqual And Or
Not Max Min Trilu CumSum ArgMax TopK Identity Cos Sin IsNaN LayerNormalization
RMSNormalization SimplifiedLayerNormalization If Loop Scan
""".split())

# Every case we do not pass, with the reason. onnx.reference fails these too.
EXPECTED_FAILURES = {
    "test_if_opt": "onnx.reference's Optional wraps the sequence one level deeper than the "
                   "stored expectation (onnx.reference fails it the same way)",
}
# Bernoulli draws random numbers: a run matches the stored sample only by chance (ten
# draws: now and then they do), so these pass or fail; neither says anything
RANDOM_CASES = {name: "Bernoulli draws random numbers: no implementation can match the stored sample"
                for name in ("test_bernoulli", "test_bernoulli_double", "test_bernoulli_double_expanded",
                             "test_bernoulli_expanded", "test_bernoulli_seed", "test_bernoulli_seed_expanded")}

# Input/output dtypes numpy has no arithmetic for: cases using them may run on the fallback.
_EXOTIC_KINDS = ("bfloat16", "float8", "float4", "int4", "uint4", "int2", "uint2")


def _cases():
    return [pytest.param(c, id=c.name) for c in node_cases()]


def _make_runner(model):
    session = workbench.InferenceSession(model)
    _make_runner.session = session
    return lambda feed: session.run(None, feed)


@pytest.mark.parametrize("case", _cases())
def test_node_case(case):
    why = run_case(case, _make_runner)
    if case.name in RANDOM_CASES and why is not None:
        pytest.xfail(RANDOM_CASES[case.name])
    if case.name in EXPECTED_FAILURES:
        assert why is not None, f"{case.name} now passes: remove it from EXPECTED_FAILURES"
        pytest.xfail(EXPECTED_FAILURES[case.name])
    assert why is None, why
    session = _make_runner.session
    fallback_ops = {op for _, domain, op in session.fallback_nodes() if domain == ""}
    native_missed = fallback_ops & NATIVE_OPS
    if native_missed and not _uses_exotic_dtype(session):
        pytest.fail(f"native ops ran on the fallback: {sorted(native_missed)}")


def _uses_exotic_dtype(session) -> bool:
    for v in session.graph.values:
        if v.dtype is not None and any(k in str(v.dtype) for k in _EXOTIC_KINDS):
            return True
        if v.dtype is not None and v.dtype == np.dtype(object):
            return True
    return False
