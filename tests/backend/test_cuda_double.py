"""The device-discipline double's rules, its selection, and the device-correctness of
kernels it found wrong (Shape, Loop, Scan, string casts, bfloat16 initializers),
each against onnx.reference over runs at stable device addresses.

Marked `cuda`: on a GPU machine the kernel tests run on CuPy; the rule tests need the
double itself and skip there unless WORKBENCH_CUDA_DOUBLE=1 asks for it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import workbench
from workbench import SessionOptions
from workbench.backend import get_backend

pytestmark = pytest.mark.cuda


def _double():
    xp = get_backend("cuda").xp  # what the suite runs backend="cuda" on in this test
    if not getattr(xp, "__workbench_device_double__", False):
        pytest.skip("a real GPU runs the cuda tests: the double's own rules are not in use")
    return xp


@pytest.fixture
def cp():
    return _double()


# -- the rules ----------------------------------------------------------------------------


def test_device_arrays_are_not_numpy_and_never_convert_implicitly(cp):
    a = cp.arange(6, dtype=np.float32).reshape(2, 3)
    assert not isinstance(a, np.ndarray)
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(a)
    host = np.zeros((2, 3), np.float32)
    with pytest.raises(TypeError):
        host[...] = a
    with pytest.raises(TypeError, match="Unsupported type"):
        cp.add(a, host)
    with pytest.raises(TypeError, match="Unsupported type"):
        _ = a + host
    np.testing.assert_array_equal(a.get(), np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(cp.asnumpy(a * 2), np.arange(6).reshape(2, 3) * 2)
    assert isinstance(np.matmul(a, a.T), cp.ndarray)  # numpy calls dispatch to cupy (__array_ufunc__)
    assert float(a[1, 2]) == 5.0 and a[0, 1].item() == 1.0 and bool(a[0, 1])
    assert isinstance(a.sum(), cp.ndarray) and a.sum().shape == ()  # reductions stay on the device


def test_host_to_device_copies_need_set_or_asarray(cp):
    buf = cp.empty((2, 3), np.int64)
    with pytest.raises(ValueError, match="non-scalar numpy.ndarray cannot be used for fill"):
        buf[...] = np.ones((2, 3), np.int64)
    buf[...] = 7  # a scalar fill is a kernel
    assert (buf.get() == 7).all()
    buf.set(np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(buf.get(), np.arange(6).reshape(2, 3))
    with pytest.raises(TypeError):
        buf.set(np.arange(6, dtype=np.float32).reshape(2, 3))  # set keeps the dtype
    with pytest.raises(ValueError, match="Unsupported dtype"):
        cp.asarray(np.array(["a"], dtype=object))
    with pytest.raises(AttributeError):
        cp.not_a_cupy_function  # noqa: B018 - only CuPy's names exist


def _capture(cp, stream, fn):
    pool = cp.cuda.MemoryPool()
    default = cp.cuda.get_allocator()
    cp.cuda.set_allocator(pool.malloc)
    stream.begin_capture()
    try:
        result = fn()
    finally:
        if stream.is_capturing():
            graph = stream.end_capture()
        cp.cuda.set_allocator(default)
    return graph, result


def test_capture_refuses_host_transfers_and_syncs(cp):
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        a = cp.arange(4, dtype=np.float32)
        for act in (lambda: a.get(), lambda: int(a[0]), lambda: a.tolist(), lambda: cp.asarray(np.ones(2)),
                    lambda: a[a > 1]):
            pool = cp.cuda.MemoryPool()
            cp.cuda.set_allocator(pool.malloc)
            stream.begin_capture()
            with pytest.raises(RuntimeError, match="capturing"):
                act()
            stream.end_capture()
            cp.cuda.set_allocator(None)
        stream.begin_capture()
        with pytest.raises(cp.CUDARuntimeError, match="cudaErrorStreamCaptureUnsupported"):
            stream.synchronize()
        with pytest.raises(cp.CUDARuntimeError, match="Invalidated"):
            stream.end_capture()
    with pytest.raises(RuntimeError, match="legacy"):
        cp.cuda.Stream.null.begin_capture()


def test_capture_records_without_running_and_launch_replays_only_what_was_recorded(cp):
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        x = cp.zeros((3,), np.float32)
        y = cp.zeros((3,), np.float32)
        x.set(np.array([1, 2, 3], np.float32))
        graph, z = _capture(cp, stream, lambda: (cp.multiply(x, 2, out=y), y + 1)[1])
        assert (y.get() == 0).all(), "capture records; it does not run the work"
        assert np.isnan(z.get()).all(), "a buffer allocated while capturing holds nothing yet"
        graph.launch(stream)
        np.testing.assert_array_equal(y.get(), [2, 4, 6])
        np.testing.assert_array_equal(z.get(), [3, 5, 7])
        x.set(np.array([10, 20, 30], np.float32))  # new contents at the recorded address
        graph.launch(stream)
        np.testing.assert_array_equal(z.get(), [21, 41, 61])
        # a copy made outside the recording is not part of the graph
        staged = cp.zeros((3,), np.float32)
        staged.set(np.array([5, 5, 5], np.float32))
        graph.launch(stream)
        np.testing.assert_array_equal(z.get(), [21, 41, 61])


def test_allocations_while_capturing_must_come_from_a_private_pool(cp):
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        a = cp.ones((2,), np.float32)
        stream.begin_capture()
        with pytest.raises(RuntimeError, match="default memory pool"):
            _ = a + 1
        with pytest.raises(cp.CUDARuntimeError):
            stream.end_capture()


def test_the_package_runs_cuda_on_the_double_only_inside_cuda_module():
    """The switch is the suite's, not the package's: with WORKBENCH_CUDA_DOUBLE=1 set and the
    double importable, a plain `backend="cuda"` still means CuPy (refused without a GPU);
    only `cuda_module(double)` runs it on the double, and only inside the block."""
    try:
        import cupy

        if cupy.cuda.is_available():
            pytest.skip("a GPU is present")
    except Exception:  # noqa: BLE001
        pass
    code = ("import sys, os; os.environ['WORKBENCH_CUDA_DOUBLE']='1'; import workbench; "
            "from workbench.backend import get_backend, cuda_module\n"
            "print('imported', 'cupy' in sys.modules, 'cuda_double' in sys.modules)\n"
            "def pick():\n"
            " try:\n  return get_backend('cuda').xp.__name__\n"
            " except workbench.BackendUnavailableError:\n  return 'refused'\n"
            "print('plain', pick())\n"
            "import cuda_double\n"
            "with cuda_module(cuda_double):\n print('inside', pick())\n"
            "print('after', pick())")
    tests = str(Path(__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/",
                         env={**os.environ, "PYTHONPATH": tests}).stdout.split("\n")
    assert out[:4] == ["imported False False", "plain refused", "inside cuda_double", "after refused"], out


# -- kernels the double found wrong, against onnx.reference ----------------------------------


def _bound_runs(proto: onnx.ModelProto, make_feeds, runs: int = 6, peer: str = "reference"):
    """`runs` runs with every input bound to one device buffer (stable address, new
    contents each run), each compared with onnx.reference."""
    session = workbench.InferenceSession(proto.SerializeToString(), backend="cuda",
                                         options=SessionOptions(capture=True))
    backend = session.backend
    if peer == "reference":
        reference = ReferenceEvaluator(proto)
    else:
        import onnxruntime as ort

        reference = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    feeds = make_feeds(rng)
    device = {k: backend.from_host(v.copy()) for k, v in feeds.items()}
    names = [o.name for o in proto.graph.output]
    for run in range(runs):
        feeds = make_feeds(rng)
        for k, v in feeds.items():
            backend.copy_from_host(device[k], v)
        binding = session.io_binding()
        for k, v in device.items():
            binding.bind_input(k, v)
        for n in names:
            binding.bind_output(n)
        session.run_with_iobinding(binding)
        got = binding.copy_outputs_to_cpu()
        want = reference.run(None, feeds)
        for n, g, w in zip(names, got, want):
            assert g.dtype == w.dtype and g.shape == w.shape, (n, run)
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=f"{n} run {run}")
    return session


def test_shape_writes_its_values_on_the_device():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 8])
    s = helper.make_tensor_value_info("s", TensorProto.INT64, [3])
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Shape", ["x"], ["tail"], start=1),
             helper.make_node("Gather", ["tail", "zero"], ["d"], axis=0),
             helper.make_node("Concat", ["d", "minus1"], ["target"], axis=0),
             helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
             helper.make_node("Reshape", ["xt", "target"], ["y"])]
    inits = [helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
             helper.make_tensor("minus1", TensorProto.INT64, [1], [-1])]
    proto = helper.make_model(helper.make_graph(nodes, "g", [x], [y, s], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    session = _bound_runs(proto, lambda rng: {"x": rng.standard_normal((2, 3, 4)).astype(np.float32)})
    assert session.executor.slot_capture("primary").replays > 0
    assert not session.executor.kernel_allocated, "Shape fell back to just-in-time allocation"


def test_loop_and_scan_run_their_bodies_on_the_device():
    # Loop: acc += x * i for i in 0..trip-1, scanning acc each iteration
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["x", "fi"], ["xi"]),
         helper.make_node("Add", ["acc", "xi"], ["acc_out"]),
         helper.make_node("Identity", ["cond"], ["cond_out"]),
         helper.make_node("Identity", ["acc_out"], ["scan_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("scan_out", TensorProto.FLOAT, [3])])
    scan_body = helper.make_graph(
        [helper.make_node("Add", ["state", "elem"], ["state_out"]),
         helper.make_node("Identity", ["state_out"], ["scanned"])],
        "scan_body",
        [helper.make_tensor_value_info("state", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("elem", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("state_out", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("scanned", TensorProto.FLOAT, [3])])
    nodes = [helper.make_node("Loop", ["trip", "", "init"], ["final", "history"], body=body),
             helper.make_node("Scan", ["init", "seq"], ["total", "prefix"], body=scan_body, num_scan_inputs=1)]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("init", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("seq", TensorProto.FLOAT, [4, 3])],
        [helper.make_tensor_value_info("final", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("history", TensorProto.FLOAT, [4, 3]),
         helper.make_tensor_value_info("total", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("prefix", TensorProto.FLOAT, [4, 3])],
        [helper.make_tensor("trip", TensorProto.INT64, [], [4])])
    graph.node[0].input[0] = "trip"
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    # the body reads the outer `x`
    _bound_runs(proto, lambda rng: {"x": rng.standard_normal(3).astype(np.float32),
                                    "init": rng.standard_normal(3).astype(np.float32),
                                    "seq": rng.standard_normal((4, 3)).astype(np.float32)}, peer="ort")


def test_string_casts_and_bfloat16_initializers_stay_on_the_host_and_compute():
    import ml_dtypes

    bf = np.array([1.5, -2.0, 0.25], dtype=ml_dtypes.bfloat16)
    init = helper.make_tensor("w", TensorProto.BFLOAT16, [3], bf.view(np.uint16).tolist(), raw=False)
    nodes = [helper.make_node("Cast", ["x"], ["text"], to=TensorProto.STRING),
             helper.make_node("Cast", ["text"], ["back"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["back", "wf"], ["y"])]
    proto = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], [init]),
        opset_imports=[helper.make_opsetid("", 19)])
    _bound_runs(proto, lambda rng: {"x": np.round(rng.standard_normal(3), 3).astype(np.float32)})


def test_node_timings_wait_for_the_device(cp):
    """Every eager node timed in a traced run waits on an end event (kernel time, not
    launch time); replays wait once per captured segment."""
    from workbench import models

    proto = models.llama("tiny", flavor="genai")
    session = workbench.InferenceSession(proto.SerializeToString(), backend="cuda",
                                         options=SessionOptions(capture=False))
    feeds = {"input_ids": np.array([[1, 2, 3]], np.int64), "attention_mask": np.ones((1, 3), np.int64),
             **models.config_of(proto).empty_past(1, 0)}
    before = cp.RT.syncs
    session.run(None, feeds)
    timed = (session.recording.node_timings()["mode"] == "eager").sum()
    assert cp.RT.syncs - before >= timed > 0
