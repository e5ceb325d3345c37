"""Bad models and bad inputs get a WorkbenchError naming the culprit, never a numpy traceback."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import workbench
from workbench import InputError, ModelLoadError, UnsupportedOperatorError, WorkbenchError


def _add_model(shape_x=("batch", 4), shape_y=("batch", 4)) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape_x))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape_y))
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, None)
    node = helper.make_node("Add", ["x", "y"], ["z"], name="add0")
    graph = helper.make_graph([node], "g", [x, y], [z])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def session():
    return workbench.InferenceSession(_add_model())


def _ok():
    return np.ones((2, 4), np.float32)


def test_errors_share_one_root():
    for cls in (InputError, ModelLoadError, UnsupportedOperatorError, workbench.KernelError):
        assert issubclass(cls, WorkbenchError)


def test_truncated_model_bytes():
    data = _add_model().SerializeToString()
    with pytest.raises(ModelLoadError, match="not a valid ONNX model"):
        workbench.InferenceSession(data[: len(data) // 2])


@pytest.mark.parametrize("garbage", [b"", b"\x00\x01\x02garbage", b"hello world" * 10, bytes(range(256))])
def test_garbage_model_bytes(garbage):
    with pytest.raises(ModelLoadError):
        workbench.InferenceSession(garbage)


def test_missing_model_file(tmp_path):
    with pytest.raises(ModelLoadError, match="nope.onnx"):
        workbench.InferenceSession(tmp_path / "nope.onnx")


def test_wrong_model_type():
    with pytest.raises(ModelLoadError, match="int"):
        workbench.InferenceSession(42)


def test_missing_input(session):
    with pytest.raises(InputError, match="missing input 'y'"):
        session.run(None, {"x": _ok()})


def test_unknown_input(session):
    with pytest.raises(InputError, match="unknown input 'w'.*'x', 'y'"):
        session.run(None, {"x": _ok(), "y": _ok(), "w": _ok()})


def test_a_misspelt_input_is_named_as_unknown(session):
    """One name wrong: the feed has the right count, one input missing and one unknown."""
    with pytest.raises(InputError, match="unknown input 'yy'.*'x', 'y'"):
        session.run(None, {"x": _ok(), "yy": _ok()})


def test_feeds_that_need_converting_still_run(session):
    """A list, a memmap-like subclass and a non-contiguous view are taken as onnxruntime
    takes them; the checked fast path is only for plain arrays of the declared form."""
    class Sub(np.ndarray):
        pass

    y0 = np.arange(8, dtype=np.float32).reshape(2, 4)
    want = session.run(None, {"x": _ok(), "y": y0})
    for y in (y0.tolist(), y0.view(Sub), np.repeat(y0, 2, axis=1)[:, ::2]):
        got = session.run(None, {"x": _ok(), "y": y})
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)


def test_wrong_dtype(session):
    with pytest.raises(InputError, match=r"input 'y': expected dtype tensor\(float\).*got float64"):
        session.run(None, {"x": _ok(), "y": np.ones((2, 4))})


def test_wrong_rank(session):
    with pytest.raises(InputError, match=r"input 'x': expected rank 2.*got rank 3"):
        session.run(None, {"x": np.ones((2, 4, 1), np.float32), "y": _ok()})


def test_dim_contradicts_static_dim(session):
    with pytest.raises(InputError, match=r"input 'y': dim 1 must be 4.*got 5"):
        session.run(None, {"x": _ok(), "y": np.ones((2, 5), np.float32)})


def test_inputs_disagree_on_a_symbol(session):
    with pytest.raises(InputError, match=r"symbol 'batch'.*'x' axis 0 is 2.*'y' axis 0 is 3"):
        session.run(None, {"x": _ok(), "y": np.ones((3, 4), np.float32)})


def test_unknown_output_name(session):
    with pytest.raises(InputError, match="unknown output 'q'"):
        session.run(["q"], {"x": _ok(), "y": _ok()})


def test_unsupported_ops_listed_at_session_creation():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])
    nodes = [
        helper.make_node("FrobnicateA", ["x"], ["a"], name="fa", domain="com.example"),
        helper.make_node("FrobnicateB", ["a"], ["z"], name="fb", domain="com.example"),
    ]
    graph = helper.make_graph(nodes, "g", [x], [z])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)])
    with pytest.raises(UnsupportedOperatorError) as info:
        workbench.InferenceSession(model)
    message = str(info.value)
    assert "com.example::FrobnicateA (opset 1)" in message and "'fa'" in message
    assert "com.example::FrobnicateB (opset 1)" in message and "'fb'" in message
    assert {m[1] for m in info.value.missing} == {"FrobnicateA", "FrobnicateB"}


def test_kernel_failure_names_the_node():
    # Reshape to an impossible shape: the failure must name node and inputs.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, None)
    s = helper.make_tensor_value_info("s", TensorProto.INT64, None)
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, None)
    node = helper.make_node("Reshape", ["x", "s"], ["z"], name="bad_reshape")
    model = helper.make_model(helper.make_graph([node], "g", [x, s], [z]),
                              opset_imports=[helper.make_opsetid("", 17)])
    session = workbench.InferenceSession(model)
    with pytest.raises(workbench.KernelError, match="bad_reshape.*Reshape"):
        session.run(None, {"x": np.ones(6, np.float32), "s": np.array([4, 4], np.int64)})


# -- external data stays inside the model's folder ------------------------------------


def _external_model(location: str) -> onnx.ModelProto:
    weight = numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")
    weight.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", "16")):
        entry = weight.external_data.add()
        entry.key, entry.value = k, v
    weight.ClearField("raw_data")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["z"])], "g", [x], [z], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _save(model: onnx.ModelProto, folder) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return str(path)


def test_external_data_inside_folder_loads(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "weights.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    session = workbench.InferenceSession(_save(_external_model("weights.bin"), tmp_path / "m"))
    (z,) = session.run(None, {"x": np.ones(4, np.float32)})
    np.testing.assert_array_equal(z, np.arange(4, dtype=np.float32) + 1)


@pytest.mark.parametrize("location", ["../secret.bin", "sub/../../secret.bin"])
def test_external_data_escaping_folder_is_refused(tmp_path, location):
    (tmp_path / "secret.bin").write_bytes(b"\x00" * 16)
    with pytest.raises(ModelLoadError, match="escapes the model's folder"):
        workbench.InferenceSession(_save(_external_model(location), tmp_path / "m"))


def test_external_data_absolute_path_is_refused(tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\x00" * 16)
    with pytest.raises(ModelLoadError, match="absolute"):
        workbench.InferenceSession(_save(_external_model(str(secret)), tmp_path / "m"))


def test_external_data_symlink_escaping_folder_is_refused(tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\x00" * 16)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "link.bin").symlink_to(secret)
    with pytest.raises(ModelLoadError, match="escapes the model's folder"):
        workbench.InferenceSession(_save(_external_model("link.bin"), tmp_path / "m"))


def test_external_data_from_bytes_is_refused():
    with pytest.raises(ModelLoadError, match="initializer 'w'.*external"):
        workbench.InferenceSession(_external_model("weights.bin").SerializeToString())


def _overcommits_always() -> bool:
    try:
        with open("/proc/sys/vm/overcommit_memory") as f:
            return f.read().strip() == "1"
    except OSError:
        return False


@pytest.mark.skipif(_overcommits_always(), reason="vm.overcommit_memory=1 grants any allocation (then OOM)")
def test_an_impossible_shape_is_an_allocation_error_naming_the_value():
    # 512 GiB: under load validation's 1 TiB "corrupted dim" bound, but no machine here holds it
    shape = numpy_helper.from_array(np.array([2**19, 2**18], np.int64), "shape")
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["big"]),
             helper.make_node("ReduceMax", ["big"], ["y"], keepdims=0)]
    graph = helper.make_graph(nodes, "huge", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
                              [shape])
    session = workbench.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    with pytest.raises(workbench.AllocationError, match=r"512.0 GiB for value 'big' \(shape \(524288, 262144\)"):
        session.run(None, {})
