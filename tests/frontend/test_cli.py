"""The `workbench` command: run, report and demo, end to end in a subprocess-free way."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from workbench import models
from workbench.cli.main import main


def _save(model: onnx.ModelProto, tmp_path, name="model.onnx") -> str:
    path = tmp_path / name
    onnx.save(model, path)
    return str(path)


def test_run_prints_outputs_and_plan(tmp_path, capsys):
    path = _save(models.gpt2("tiny"), tmp_path)
    assert main(["run", path, "--dim", "sequence_length=3", "--dim", "past_sequence_length=2",
                 "--dim", "total_sequence_length=5"]) == 0
    out = capsys.readouterr().out
    assert "output logits: float32[1, 3, 256]" in out
    assert "plan:" in out and "0 on the onnx.reference fallback" in out


@pytest.mark.parametrize("build", [lambda: models.gpt2("tiny"), lambda: models.llama("tiny", flavor="genai"),
                                   lambda: models.phi3("tiny")], ids=["gpt2", "llama-genai", "phi3"])
def test_report_on_a_saved_model(tmp_path, capsys, build):
    path = _save(build(), tmp_path)
    out_dir = tmp_path / "report"
    code = main(["report", path, "--prompt-tokens", "6", "--steps", "8", "--out", str(out_dir)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert (out_dir / "report.html").stat().st_size > 10_000
    assert list((out_dir / "frames").glob("*.csv"))
    for section in ("[plan]", "[decode]", "[memo]", "[capture]", "[latency]"):
        assert section in printed
    assert "tokens identical" in printed


def test_report_names_the_inputs_it_cannot_interpret(tmp_path, capsys):
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"])
    extra = helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["b", 3])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)
    emb = helper.make_tensor("emb", TensorProto.FLOAT, [8, 8], np.eye(8, dtype=np.float32).ravel())
    nodes = [helper.make_node("Gather", ["emb", "input_ids"], ["g"]),
             helper.make_node("ReduceSum", ["pixel_values"], ["r"], keepdims=1),
             helper.make_node("Add", ["g", "r"], ["logits"])]
    model = helper.make_model(helper.make_graph(nodes, "odd", [ids, extra], [logits], [emb]),
                              opset_imports=[helper.make_opsetid("", 13)])
    code = main(["report", _save(model, tmp_path), "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2
    assert "cannot interpret the model's inputs ['pixel_values']" in err


def test_demo_with_the_builtin_model(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--builtin", "--tokens", "6"]) == 0
    out = capsys.readouterr().out
    assert "built-in llama" in out and "tokens identical" in out
    assert (tmp_path / "workbench-report" / "report.html").exists()


@pytest.mark.network
def test_demo_chats_with_smollm2(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = main(["demo", "--tokens", "12"])
    out = capsys.readouterr().out
    if "could not be obtained" in out:
        pytest.skip("the package registry is unreachable: the demo fell back to the built-in model")
    assert code == 0, out
    reply = next(line for line in out.splitlines() if line.startswith("assistant:"))
    words = reply.removeprefix("assistant:").split()
    assert len(words) >= 5 and all(w.isprintable() for w in words)
    assert "tokens identical" in out and "[capture]" in out
    assert (tmp_path / "workbench-report" / "report.html").exists()
