"""Host variants: an op's numpy-only forms are registered as a kernel of their own, which
the registry chooses where the plan's arrays are numpy's and never elsewhere; kernels
do not ask which backend they run on.

Checked here: no kernel module tests the array module's identity; every host variant
has a generic twin (so a device backend always finds a kernel); `find_native` picks the
host variant on numpy and the generic kernel on the device double; and a model whose
every op has a host variant gives onnxruntime's values on both backends, run after run
with its inputs refilled in place at stable addresses.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import workbench
from workbench import SessionOptions
from workbench.ops import registry
from workbench.ops.registry import NodeInfo, find_native

OPS = Path(workbench.__file__).parent / "ops"

#: where an ops module may still name the array module: the registry's own test (the
#: one place a plan's arrays are told numpy's; kernels ask `NodeInfo.host_arrays`)
ALLOWED = {("registry.py", "return self.xp is np")}


def test_no_kernel_module_asks_which_backend_it_runs_on():
    found = set()
    for path in sorted(OPS.glob("*.py")):
        for line in path.read_text().splitlines():
            if re.search(r"\bxp is (not )?np\b", line):
                found.add((path.name, line.strip()))
    assert found == ALLOWED, sorted(found - ALLOWED)


def _specs():
    return [spec for specs in registry._REGISTRY.values() for spec in specs]


def test_every_host_variant_has_a_generic_twin():
    generic = {(s.domain, s.op_type, s.since, s.until) for s in _specs() if not s.host}
    hosts = [s for s in _specs() if s.host]
    assert len(hosts) >= 15, "the host variants registered"
    for spec in hosts:
        assert (spec.domain, spec.op_type, spec.since, spec.until) in generic, spec
    # an op with a host variant has one for each of its generic kernels' opset ranges
    with_host = {(s.domain, s.op_type) for s in hosts}
    host_keys = {(s.domain, s.op_type, s.since, s.until) for s in hosts}
    for spec in _specs():
        if not spec.host and (spec.domain, spec.op_type) in with_host:
            assert (spec.domain, spec.op_type, spec.since, spec.until) in host_keys, spec


@pytest.mark.cuda
def test_the_registry_chooses_the_host_variant_on_numpy_only():
    import cuda_double

    f32 = np.dtype(np.float32)
    for domain, op in (("", "Sigmoid"), ("", "Expand"), ("", "MatMul"), ("com.microsoft", "GroupQueryAttention"),
                       ("", "SimplifiedLayerNormalization"), ("com.microsoft", "QuickGelu")):
        kw = dict(name="n", op_type=op, domain=domain, opset=23, attrs={}, input_dtypes=(f32, f32),
                  output_dtypes=(f32,))
        on_host, on_device = find_native(NodeInfo(**kw)), find_native(NodeInfo(**kw, xp=cuda_double))
        assert on_host.host and not on_device.host, op
        assert (on_host.op_type, on_host.since) == (on_device.op_type, on_device.since)


def _model() -> onnx.ModelProto:
    """x [1, 1, 16] -> SimplifiedLayerNormalization -> MatMul -> Sigmoid -> QuickGelu
    -> Expand to [2, 1, 16] -> SkipSimplifiedLayerNormalization with the residual."""
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32) / 4, "w")
    gamma = numpy_helper.from_array(rng.uniform(0.5, 1.5, 16).astype(np.float32), "gamma")
    shape = numpy_helper.from_array(np.array([2, 1, 16], np.int64), "shape")
    nodes = [
        helper.make_node("SimplifiedLayerNormalization", ["x", "gamma"], ["n"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["n", "w"], ["m"]),
        helper.make_node("Sigmoid", ["m"], ["s"]),
        helper.make_node("QuickGelu", ["s"], ["g"], domain="com.microsoft", alpha=1.5),
        helper.make_node("Expand", ["g", "shape"], ["e"]),
        helper.make_node("SkipSimplifiedLayerNormalization", ["e", "residual", "gamma"], ["y"],
                         domain="com.microsoft", epsilon=1e-5),
    ]
    graph = helper.make_graph(
        nodes, "host_variants",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 16]),
         helper.make_tensor_value_info("residual", TensorProto.FLOAT, [2, 1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1, 16])],
        [w, gamma, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=10)


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["cpu", "cuda"])
@pytest.mark.parametrize("rounding", ["auto", "always", "never"])
def test_host_variants_and_generic_kernels_give_onnxruntimes_values(backend, rounding):
    proto = _model()
    oracle = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    session = workbench.InferenceSession(proto.SerializeToString(), backend=backend,
                                         options=SessionOptions(capture=True, onnxruntime_rounding=rounding))
    kinds = {p.node.op_type: p.spec.host for p in session.executor.plan.nodes}
    assert set(kinds.values()) == {backend == "cpu"}, kinds
    be = session.backend
    rng = np.random.default_rng(11)
    x_host, r_host = np.zeros((1, 1, 16), np.float32), np.zeros((2, 1, 16), np.float32)
    x, r = be.from_host(x_host), be.from_host(r_host)
    for run in range(8):
        x_host[...] = rng.standard_normal(x_host.shape)
        r_host[...] = rng.standard_normal(r_host.shape)
        be.copy_from_host(x, x_host)
        be.copy_from_host(r, r_host)
        binding = session.io_binding()
        binding.bind_input("x", x)
        binding.bind_input("residual", r)
        binding.bind_output("y")
        session.run_with_iobinding(binding)
        got = binding.copy_outputs_to_cpu()[0]
        want = oracle.run(None, {"x": x_host, "residual": r_host})[0]
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6, err_msg=f"run {run}")


def _erf_family_model():
    """Erf, Gelu (opset 20), com.microsoft Gelu and BiasGelu, one after another: the
    kernels that take the array module's erf (scipy's on numpy, cupyx's on CuPy)."""
    rng = np.random.default_rng(5)
    bias = helper.make_tensor("bias", TensorProto.FLOAT, [16], rng.standard_normal(16).astype(np.float32).tolist())
    nodes = [helper.make_node("Erf", ["x"], ["e"]),
             helper.make_node("Gelu", ["e"], ["g"]),
             helper.make_node("Gelu", ["g"], ["m"], domain="com.microsoft"),
             helper.make_node("BiasGelu", ["m", "bias"], ["y"], domain="com.microsoft")]
    graph = helper.make_graph(nodes, "erf_family", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])], [bias])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=10)


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_the_erf_kernels_take_the_array_modules_erf_and_give_onnxruntimes_values(backend):
    """Each backend's erf is chosen by the registry's `host_arrays`, not by the kernel
    asking for numpy: 8 runs on an input bound at one address, refilled, vs onnxruntime."""
    proto = _erf_family_model()
    oracle = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    session = workbench.InferenceSession(proto.SerializeToString(), backend=backend)
    be = session.backend
    rng = np.random.default_rng(17)
    x_host = np.zeros((2, 16), np.float32)
    x = be.from_host(x_host)
    for run in range(8):
        x_host[...] = rng.standard_normal(x_host.shape) * (1 + run)
        be.copy_from_host(x, x_host)
        binding = session.io_binding()
        binding.bind_input("x", x)
        binding.bind_output("y")
        session.run_with_iobinding(binding)
        got = binding.copy_outputs_to_cpu()[0]
        want = oracle.run(None, {"x": x_host})[0]
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6, err_msg=f"run {run}")
