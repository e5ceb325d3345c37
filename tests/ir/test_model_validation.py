"""Load-time validation: a structurally broken model fails at load with a ModelLoadError
that names its culprit (node, value, initializer, attribute), not later in a kernel."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import workbench
from workbench import ModelLoadError

OPSET = [helper.make_opsetid("", 17)]


def _vi(name, shape=(4,), elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, list(shape) if shape is not None else None)


def _model(nodes, inputs=("x",), outputs=("z",), initializers=(), value_info=()) -> onnx.ModelProto:
    graph = helper.make_graph(
        list(nodes), "g", [i if isinstance(i, onnx.ValueInfoProto) else _vi(i) for i in inputs],
        [o if isinstance(o, onnx.ValueInfoProto) else _vi(o) for o in outputs], list(initializers),
        value_info=list(value_info),
    )
    return helper.make_model(graph, opset_imports=OPSET)


def _load(model: onnx.ModelProto | bytes):
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return workbench.InferenceSession(data)


def _raises(model, *fragments: str) -> str:
    with pytest.raises(ModelLoadError) as info:
        _load(model)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


# -- undefined inputs -------------------------------------------------------------------


def test_undefined_node_input_names_node_and_input():
    model = _model([helper.make_node("Add", ["x", "ghost"], ["z"], name="add0")])
    _raises(model, "'add0'", "(Add)", "'ghost'")


def test_undefined_input_in_a_subgraph_names_the_subgraph_node():
    then_g = helper.make_graph([helper.make_node("Identity", ["nowhere"], ["t"], name="then_id")],
                               "then", [], [_vi("t")])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e"], name="else_id")],
                               "else", [], [_vi("e")])
    cond = numpy_helper.from_array(np.array(True), "cond")
    node = helper.make_node("If", ["cond"], ["z"], name="branch", then_branch=then_g, else_branch=else_g)
    _raises(_model([node], initializers=[cond]), "'then_id'", "(Identity)", "'nowhere'", "enclosing scope")


def test_subgraph_reading_outer_values_still_loads_and_runs():
    then_g = helper.make_graph([helper.make_node("Neg", ["y"], ["t"])], "then", [], [_vi("t")])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [], [_vi("e")])
    cond = numpy_helper.from_array(np.array(True), "cond")
    nodes = [helper.make_node("If", ["cond"], ["z"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Abs", ["x"], ["y"])]  # y is produced after the If in node order
    session = _load(_model(nodes, initializers=[cond]))
    (z,) = session.run(None, {"x": np.array([1, -2, 3, -4], np.float32)})
    np.testing.assert_array_equal(z, [-1, -2, -3, -4])


def test_nodes_out_of_order_still_load_and_run():
    nodes = [helper.make_node("Neg", ["y"], ["z"]), helper.make_node("Abs", ["x"], ["y"])]
    (z,) = _load(_model(nodes)).run(None, {"x": np.array([1, -2, 3, -4], np.float32)})
    np.testing.assert_array_equal(z, [-1, -2, -3, -4])


# -- values defined twice, outputs never defined ------------------------------------------


def test_value_produced_by_two_nodes():
    nodes = [helper.make_node("Abs", ["x"], ["y"], name="first"),
             helper.make_node("Neg", ["x"], ["y"], name="second"),
             helper.make_node("Identity", ["y"], ["z"])]
    _raises(_model(nodes), "'y'", "defined twice", "'first' (Abs)", "'second' (Neg)")


def test_node_output_overwriting_a_graph_input():
    nodes = [helper.make_node("Abs", ["x"], ["x"], name="clobber"), helper.make_node("Identity", ["x"], ["z"])]
    _raises(_model(nodes), "'x'", "graph input 'x'", "'clobber' (Abs)")


def test_duplicate_initializer():
    w = numpy_helper.from_array(np.ones(4, np.float32), "w")
    model = _model([helper.make_node("Add", ["x", "w"], ["z"])], initializers=[w, w])
    _raises(model, "initializer 'w'", "defined twice")


def test_graph_output_nobody_produces():
    model = _model([helper.make_node("Abs", ["x"], ["z"])], outputs=("z", "orphan"))
    _raises(model, "output 'orphan'", "not produced")


# -- cycles ---------------------------------------------------------------------------------


def test_cycle_names_the_nodes_on_it():
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="na"),
             helper.make_node("Abs", ["a"], ["b"], name="nb"),
             helper.make_node("Identity", ["a"], ["z"], name="out")]
    message = _raises(_model(nodes), "cycle", "'na' (Add)", "'nb' (Abs)")
    assert "'out'" not in message  # downstream of the cycle, not on it


def test_node_reading_its_own_output_is_a_cycle():
    nodes = [helper.make_node("Add", ["x", "z"], ["z"], name="selfie")]
    _raises(_model(nodes), "cycle", "'selfie' (Add)")


# -- initializers: data vs dims, element types -------------------------------------------------


def _raw_tensor(name: str, dims: list[int], floats: list[float]) -> onnx.TensorProto:
    t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=dims)  # helper.make_tensor would refuse
    t.float_data.extend(floats)
    return t


def test_initializer_raw_data_shorter_than_dims():
    w = numpy_helper.from_array(np.ones(4, np.float32), "w")
    w.raw_data = w.raw_data[:12]
    _raises(_model([helper.make_node("Add", ["x", "w"], ["z"])], initializers=[w]),
            "initializer 'w'", "dims [4]", "16 bytes", "stores 12 bytes")


def test_initializer_typed_values_disagree_with_dims():
    w = _raw_tensor("w", [4], [1.0, 2.0, 3.0])  # 3 values for 4 elements
    _raises(_model([helper.make_node("Add", ["x", "w"], ["z"])], initializers=[w]),
            "initializer 'w'", "4 FLOAT elements", "3 values")


def test_initializer_with_no_data():
    w = _raw_tensor("w", [4], [])
    _raises(_model([helper.make_node("Add", ["x", "w"], ["z"])], initializers=[w]), "initializer 'w'", "0 values")


def test_initializer_negative_dims():
    w = helper.make_tensor("w", TensorProto.FLOAT, [4], [1.0] * 4)
    w.dims[0] = -4
    _raises(_model([helper.make_node("Add", ["x", "w"], ["z"])], initializers=[w]), "initializer 'w'", "negative")


def test_initializer_unknown_elem_type():
    w = numpy_helper.from_array(np.ones(4, np.float32), "w")
    w.data_type = 99
    _raises(_model([helper.make_node("Add", ["x", "w"], ["z"])], initializers=[w]),
            "initializer 'w'", "unknown element type 99")


def test_packed_int4_initializer_size_is_checked():
    w = helper.make_tensor("w", TensorProto.INT4, [5], [1, 2, 3, 4, 5])  # packs into 3 bytes
    cast = helper.make_node("Cast", ["w"], ["z"], to=TensorProto.FLOAT)
    ok = _model([cast], inputs=(), outputs=[_vi("z", (5,))], initializers=[w])
    (z,) = _load(ok).run(None, {})
    np.testing.assert_array_equal(z, [1, 2, 3, 4, 5])
    w.ClearField("int32_data")
    w.raw_data = b"\x21\x43"  # 4 elements' worth
    _raises(_model([cast], inputs=(), outputs=[_vi("z", (5,))], initializers=[w]),
            "initializer 'w'", "3 bytes", "stores 2 bytes")


def test_graph_input_unknown_elem_type():
    _raises(_model([helper.make_node("Abs", ["x"], ["z"])], inputs=[_vi("x", elem=77)]),
            "input 'x'", "unknown element type 77")


def test_graph_input_without_elem_type():
    _raises(_model([helper.make_node("Abs", ["x"], ["z"])], inputs=[_vi("x", elem=TensorProto.UNDEFINED)]),
            "input 'x'", "no element type")


def test_value_info_unknown_elem_type():
    model = _model([helper.make_node("Abs", ["x"], ["y"]), helper.make_node("Neg", ["y"], ["z"])],
                   value_info=[_vi("y", elem=55)])
    _raises(model, "'y'", "unknown element type 55")


def test_cast_to_unknown_elem_type():
    _raises(_model([helper.make_node("Cast", ["x"], ["z"], name="c", to=-1)]),
            "'c' (Cast)", "attribute 'to'", "unknown element type -1")


def test_declared_shape_too_big_for_any_tensor():
    model = _model([helper.make_node("Abs", ["x"], ["z"])], outputs=[_vi("z", ("batch", 2**40, 4))])
    _raises(model, "output 'z'", "corrupted dim")


def test_negative_declared_dim_is_treated_as_unknown():
    # some exporters write -1 for "dynamic"
    session = _load(_model([helper.make_node("Abs", ["x"], ["z"])], inputs=[_vi("x", (-1,))]))
    (z,) = session.run(None, {"x": -np.ones(6, np.float32)})
    np.testing.assert_array_equal(z, np.ones(6))


# -- attributes and arity against the op's schema ---------------------------------------------------


def test_unknown_attribute():
    _raises(_model([helper.make_node("Softmax", ["x"], ["z"], name="sm", axsi=0)]),
            "'sm' (Softmax)", "unknown attribute 'axsi'", "axis")


def test_attribute_of_the_wrong_type():
    _raises(_model([helper.make_node("Softmax", ["x"], ["z"], name="sm", axis=[0, 1])]),
            "'sm' (Softmax)", "'axis'", "INTS", "INT")


def test_attribute_without_a_type():
    node = helper.make_node("Softmax", ["x"], ["z"], name="sm", axis=0)
    node.attribute[0].type = onnx.AttributeProto.UNDEFINED
    _raises(_model([node]), "'sm' (Softmax)", "attribute 'axis'", "invalid type 0")


def test_missing_required_attribute():
    nodes = [helper.make_node("Concat", ["x", "x"], ["z"], name="cat")]
    _raises(_model(nodes, outputs=[_vi("z", (8,))]), "'cat' (Concat)", "required attribute 'axis'")


def test_constant_without_a_value():
    nodes = [helper.make_node("Constant", [], ["c"], name="k"), helper.make_node("Add", ["x", "c"], ["z"])]
    _raises(_model(nodes), "'k' (Constant)", "exactly one of value")


def test_too_many_inputs():
    _raises(_model([helper.make_node("Abs", ["x", "x"], ["z"], name="abs2")]), "'abs2' (Abs)", "2 inputs", "1")


# -- undecodable strings ---------------------------------------------------------------------------------


def test_invalid_utf8_in_a_node_input_name():
    data = _model([helper.make_node("Abs", ["x"], ["yMARK"]), helper.make_node("Neg", ["yMARK"], ["z"])]
                  ).SerializeToString()
    data = data.replace(b"yMARK", b"y\xffARK")
    _raises(data, "graph.node[0]", "'output'", "not valid UTF-8")


def test_invalid_utf8_in_a_dim_param():
    data = _model([helper.make_node("Abs", ["x"], ["z"])], inputs=[_vi("x", ("SYMBOL",))]).SerializeToString()
    _raises(data.replace(b"SYMBOL", b"SYM\xc3OL"), "graph.input[0] ('x')", "dim_param", "not valid UTF-8")


def test_invalid_utf8_in_a_doc_string_is_tolerated():
    model = _model([helper.make_node("Abs", ["x"], ["z"], doc_string="DOCDOC")])
    data = model.SerializeToString().replace(b"DOCDOC", b"DOC\xffOC")
    (z,) = _load(data).run(None, {"x": -np.ones(4, np.float32)})
    np.testing.assert_array_equal(z, np.ones(4))


def test_every_builtin_model_passes_validation():
    from workbench import models

    for model in (models.gpt2("tiny"), models.llama("tiny", flavor="onnx"), models.llama("tiny", flavor="genai"),
                  models.phi3("tiny"), models.llama("tiny", flavor="genai", quant="int4")):
        session = _load(model)
        assert session.get_inputs()


# -- external data: weird locations and ranges are refused, naming the tensor ------------------------------


def _external_model(entries: dict[str, str]) -> onnx.ModelProto:
    weight = numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")
    weight.data_location = TensorProto.EXTERNAL
    for k, v in entries.items():
        entry = weight.external_data.add()
        entry.key, entry.value = k, v
    weight.ClearField("raw_data")
    return _model([helper.make_node("Add", ["x", "w"], ["z"])], initializers=[weight])


def _load_external(folder, entries: dict[str, str]):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "weights.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    (folder / "model.onnx").write_bytes(_external_model(entries).SerializeToString())
    return workbench.InferenceSession(folder / "model.onnx")


def test_external_data_in_range_loads(tmp_path):
    session = _load_external(tmp_path, {"location": "weights.bin", "offset": "0", "length": "16"})
    (z,) = session.run(None, {"x": np.ones(4, np.float32)})
    np.testing.assert_array_equal(z, np.arange(4) + 1)


@pytest.mark.parametrize("entries, fragments", [
    ({"location": ""}, ["empty"]),
    ({"location": "weights\x00.bin"}, ["NUL"]),
    ({"location": "a" * 5000}, ["characters long"]),
    ({"location": ("d/" * 120) + "weights.bin"}, ["does not exist"]),
    ({"location": "."}, ["not a regular file"]),
    ({"location": "sub"}, ["not a regular file"]),
    ({"location": "missing.bin"}, ["does not exist"]),
    ({"offset": "0"}, ["no 'location'"]),
    ({"location": "weights.bin", "offset": "64"}, ["16 bytes", "offset 64", "past its end"]),
    ({"location": "weights.bin", "offset": "8", "length": "16"}, ["offset 8 + length 16 = 24", "past its end"]),
    ({"location": "weights.bin", "length": "1000000000000000"}, ["past its end"]),
    ({"location": "weights.bin", "offset": "-4"}, ["negative"]),
    ({"location": "weights.bin", "offset": "four"}, ["'four'", "not an integer"]),
])
def test_weird_external_data_is_refused_naming_the_tensor(tmp_path, entries, fragments):
    (tmp_path / "sub").mkdir()
    with pytest.raises(ModelLoadError) as info:
        _load_external(tmp_path, entries)
    message = str(info.value)
    assert "initializer 'w'" in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_external_data_fifo_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "pipe.bin")  # opening it for reading would block forever
    with pytest.raises(ModelLoadError, match="initializer 'w'.*'pipe.bin' is not a regular file"):
        _load_external(tmp_path, {"location": "pipe.bin"})


def test_external_data_shorter_than_dims_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match=r"initializer 'w' has dims \[4\].*16 bytes.*stores 12"):
        _load_external(tmp_path, {"location": "weights.bin", "offset": "4"})
