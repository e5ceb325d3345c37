"""backend="cuda" on the decoders exporters make: each found wrong on the device double
has a named regression here, differential against onnxruntime over runs at stable
device addresses with changing contents, and every export idiom the project's builders
make decodes the CPU backend's tokens under `shadow="raise"` with capture on.

Marked `cuda`: on the double without a GPU (as in CI), on CuPy with one
(`tools/gpu_check.sh`).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import workbench
from workbench import SessionOptions, models
from workbench.decode.interface import find_export
from workbench.models import exports

pytestmark = pytest.mark.cuda

RUNS = 8


def _ort(proto: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


class _BoundRuns:
    """A cuda session whose inputs are bound to one device array each (stable address,
    contents refilled from the host every run), its outputs compared with onnxruntime's."""

    def __init__(self, proto: onnx.ModelProto, **options):
        self.proto = proto
        self.session = workbench.InferenceSession(proto.SerializeToString(), backend="cuda",
                                                  options=SessionOptions(**options))
        self.peer = _ort(proto)
        self.device: dict = {}
        self.names = [o.name for o in proto.graph.output]

    def run(self, feeds: dict[str, np.ndarray], label: str) -> None:
        backend = self.session.backend
        for name, host in feeds.items():
            if name not in self.device:
                self.device[name] = backend.from_host(np.array(host))
            backend.copy_from_host(self.device[name], host)
        binding = self.session.io_binding()
        for name, arr in self.device.items():
            binding.bind_input(name, arr)
        for name in self.names:
            binding.bind_output(name)
        self.session.run_with_iobinding(binding)
        got = binding.copy_outputs_to_cpu()
        want = self.peer.run(self.names, feeds)
        for name, g, w in zip(self.names, got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, (label, name, g.shape, w.shape)
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"{label}: {name}")


def _mlp(width: int = 8, seed: int = 0) -> onnx.ModelProto:
    """x @ W1 -> Relu -> @ W2 + x: a chain capture records as one segment."""
    rng = np.random.default_rng(seed)
    w1 = helper.make_tensor("w1", TensorProto.FLOAT, [width, width], rng.standard_normal((width, width)).ravel())
    w2 = helper.make_tensor("w2", TensorProto.FLOAT, [width, width], rng.standard_normal((width, width)).ravel())
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["o"]), helper.make_node("Add", ["o", "x"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# -- named regressions ----------------------------------------------------------------------


def test_a_session_captures_on_its_own_stream_when_another_session_was_made_later():
    """Each CudaBackend has a stream of its own, and used to make it current once, when
    it was made: a session created later (a prefill graph beside its decode graph, a
    second model) took the current stream, so the first session's captures recorded
    nothing (CuPy's relaxed capture mode runs work issued on another stream eagerly,
    unrecorded) and its replays left last step's values in place: wrong tokens without
    an error on transformers' prefill + decode exports after onnxruntime's fusions,
    stale mask shapes on others."""
    first = _BoundRuns(_mlp(seed=1))
    second = _BoundRuns(_mlp(seed=2))  # made after `first`: on the old code its stream was current
    rng = np.random.default_rng(0)
    for run in range(RUNS):
        first.run({"x": rng.standard_normal((1, 8)).astype(np.float32)}, f"first, run {run}")
        second.run({"x": rng.standard_normal((1, 8)).astype(np.float32)}, f"second, run {run}")
    for runs in (first, second):
        cap = runs.session.executor.slot_capture("primary")
        assert cap.captures == 1 and cap.replays >= RUNS - 3, (cap.captures, cap.replays)


def test_capture_refuses_to_begin_off_the_sessions_stream():
    """A capture begun while another stream is current would record nothing: the backend
    refuses it, and the capture runner finishes that step eagerly with the reason."""
    session = workbench.InferenceSession(_mlp().SerializeToString(), backend="cuda")
    backend = session.backend
    other = backend.cp.cuda.Stream(non_blocking=True)
    with other:
        with pytest.raises(RuntimeError, match="work_scope"):
            backend.begin_capture()
    with backend.work_scope():
        graph = backend.begin_capture()
        backend.abort_capture(graph)


def test_gathernd_indexes_the_last_axis_of_its_indices_on_the_device():
    """GatherND's kernel indexes `indices[..., j]`; the double appended a second Ellipsis
    to every integer index (CuPy appends one only where the index has none:
    _routines_indexing.pyx `_view_getitem`), failing every torch.onnx dynamo export."""
    data = helper.make_tensor_value_info("data", TensorProto.FLOAT, [3, 4, 5])
    idx = helper.make_tensor_value_info("idx", TensorProto.INT64, [2, 2])
    bidx = helper.make_tensor_value_info("bidx", TensorProto.INT64, [3, 1])
    nodes = [helper.make_node("GatherND", ["data", "idx"], ["y"]),
             helper.make_node("GatherND", ["data", "bidx"], ["z"], batch_dims=1),
             helper.make_node("Relu", ["y"], ["y2"])]
    graph = helper.make_graph(nodes, "g", [data, idx, bidx],
                              [helper.make_tensor_value_info("y2", TensorProto.FLOAT, [2, 5]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [3, 5])])
    runs = _BoundRuns(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    rng = np.random.default_rng(3)
    for run in range(RUNS):
        runs.run({"data": rng.standard_normal((3, 4, 5)).astype(np.float32),
                  "idx": np.stack([rng.integers(0, 3, 2), rng.integers(0, 4, 2)], axis=1).astype(np.int64),
                  "bidx": rng.integers(0, 4, (3, 1)).astype(np.int64)}, f"run {run}")


def test_a_zero_dimensional_input_is_refilled_in_place_on_the_device():
    """`copy_from_host` staged through np.ascontiguousarray, which makes a 0-d value 1-d:
    refilling a bound scalar input (a position, a temperature) raised a broadcast error."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    t = helper.make_tensor_value_info("t", TensorProto.FLOAT, [])
    nodes = [helper.make_node("Mul", ["x", "t"], ["m"]), helper.make_node("Exp", ["m"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x, t], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    runs = _BoundRuns(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    rng = np.random.default_rng(4)
    for run in range(RUNS):
        runs.run({"x": rng.standard_normal(4).astype(np.float32),
                  "t": np.array(rng.uniform(0.1, 2.0), np.float32)}, f"run {run}")


def test_a_host_array_bound_as_an_output_is_refused_by_name():
    session = workbench.InferenceSession(_mlp().SerializeToString(), backend="cuda")
    binding = session.io_binding()
    with pytest.raises(workbench.InputError, match="output 'y'.*device array"):
        binding.bind_output("y", np.zeros((1, 8), np.float32))


# -- every builder export idiom, decoded on the device ------------------------------------------


def _idioms(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("transformers-export")
    models.transformers_export(folder)
    return {
        "genai builder": models.llama("tiny", flavor="genai", export="genai-builder"),
        "genai GQA": models.llama("tiny", flavor="genai"),
        "GQA without a mask (onnxruntime's fused layout)":
            exports.fused_gqa_without_mask(models.llama("tiny", flavor="genai")),
        "genai int4": models.llama("tiny", flavor="genai", quant="int4"),
        "optimum merged": models.llama("tiny", export="optimum-merged"),
        "torch Attention-23": models.llama("tiny", export="torch-dynamo-attention"),
        "transformers prefill + decode": str(folder),
        "gpt2": models.gpt2("tiny"),
        "phi3 LongRoPE": models.phi3("tiny"),
    }


IDIOMS = ["genai builder", "genai GQA", "GQA without a mask (onnxruntime's fused layout)", "genai int4", "optimum merged",
          "torch Attention-23", "transformers prefill + decode", "gpt2", "phi3 LongRoPE"]


@pytest.fixture(scope="module")
def idioms(tmp_path_factory):
    return _idioms(tmp_path_factory)


def decode(model, backend: str, options: SessionOptions, tokens: int = 12, kv: str = "fixed"):
    """(tokens, the decode session) of a greedy decode; a folder is transformers' two graphs."""
    if isinstance(model, str):
        files = find_export(model)
        session = workbench.InferenceSession(str(files.decode), options, backend=backend)
        prefill = workbench.InferenceSession(str(files.prefill), options, backend=backend)
        generator = workbench.Generator(session, prefill=prefill)
    else:
        session = workbench.InferenceSession(model, options, backend=backend)
        generator = workbench.Generator(session)
    result = generator.generate([3, 4, 5, 6], tokens, kv=kv, progress=False)
    return result.tokens, session


@pytest.mark.parametrize("idiom", IDIOMS)
def test_every_export_idiom_decodes_the_cpu_tokens_on_the_device_under_shadow(idioms, idiom):
    model = idioms[idiom]
    want, _ = decode(model, "cpu", SessionOptions())
    got, session = decode(model, "cuda", SessionOptions(shadow="raise", trace=True))
    assert got == want, f"{idiom}: cuda {got} vs cpu {want}"
    rec = session.recording
    assert rec.divergences().empty
    if idiom == "optimum merged":  # one top-level If holds the whole model: its seam, with the reason
        assert set(rec.capture_declines()["reason"]) == {"control_flow"}
    else:
        events = rec.capture_events()
        assert (events["event"] == "replay").any(), f"{idiom}: nothing replayed on the device"
