"""Every model onnxruntime's own toolchain makes from the project's builders loads and
decodes onnxruntime's tokens.

Variants, each decoded greedily through the same `Generator` loop on onnxruntime and on
workbench and compared token for token:

- `onnxruntime.transformers.optimizer.optimize_model` for the model types that apply:
  gpt2 (GPT-2), bert and qwen3 (the llama), gpt2 on the genai llama (GroupQueryAttention),
  phi3 through the bert/gpt2 fusions, at opt levels 0, 1, 2 and 99. Level 0 writes
  com.microsoft nodes without importing the domain (the loader reads it as version 1
  and says so). Levels >= 1 run onnxruntime's session optimizer first, which imports
  `torch` only to read `torch.version.hip`: a stub module stands in for torch for the
  duration of that call (the suite stays free of torch). model_type "phi" is onnxruntime
  1.32's phi-2 dynamo optimizer, which fails inside onnxruntime on any model
  (`TypeError: 'method' object is not iterable` in its preprocessor): xfailed while it does.
- `onnxruntime.transformers.float16.convert_float_to_float16`, keep_io_types on and off:
  tokens against onnxruntime's own run of the float16 model.
- `onnxruntime.quantization.quantize_dynamic`: QInt8 / QUInt8, per-channel off / on, and
  the defaults (the quantized embedding Gather dequantized with DequantizeLinear at the
  model's opset 18, which onnx.reference cannot run).
- `MatMulNBitsQuantizer` (needs `onnx-ir`): block 32, symmetric and asymmetric, accuracy
  levels 0 and 4.
- onnxruntime's saved optimized graph (`SessionOptions.optimized_model_filepath`) at basic
  and extended (FusedMatMul, QuickGelu, SimplifiedLayerNormalization, ...), also of a
  dynamically quantized model (MatMulIntegerToFloat, DynamicQuantizeMatMul).

Plus `workbench report` on a GroupQueryAttention export whose present is not its past
(onnxruntime's fused layout) and on a model onnxruntime cannot run.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import onnx
import pytest

import workbench
from workbench import Generator, models
from workbench.models import exports

ort = pytest.importorskip("onnxruntime")

PROMPT = [1, 17, 99, 250, 3, 42]
STEPS = 8


@pytest.fixture(scope="module")
def bases() -> dict[str, onnx.ModelProto]:
    return {"llama": models.llama("tiny"), "gpt2": models.gpt2("tiny"),
            "genai": models.llama("tiny", flavor="genai"), "phi3": models.phi3("tiny", longrope=False),
            "phi3_longrope": models.phi3("tiny")}


def _peer(data: bytes):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def decode_both(model: onnx.ModelProto, *, expect_ops: set[str] = frozenset(), kv: str = "auto"):
    """Greedy STEPS tokens on both runtimes; returns (ours, peer, session)."""
    data = model.SerializeToString()
    present = {n.op_type for n in model.graph.node}
    assert expect_ops <= present, f"the variant lacks {expect_ops - present}: the test would not bite"
    session = workbench.InferenceSession(data)
    assert session.fallback_nodes() == [], session.fallback_nodes()
    want = Generator(_peer(data)).generate(PROMPT, STEPS, kv=kv, progress=False, eos_token_id=-1)
    got = Generator(session).generate(PROMPT, STEPS, kv=kv, progress=False, eos_token_id=-1)
    assert got.tokens == want.tokens, (got.tokens, want.tokens)
    return got, want, session


# --- optimize_model ---------------------------------------------------------------------------


@pytest.fixture
def torch_stub(monkeypatch):
    """`optimize_model` at opt_level >= 1 reads `torch.version.hip` (to pick ROCm's
    provider) and nothing else of torch: a stub, only while the test runs."""
    if "torch" in sys.modules:
        return
    stub = types.ModuleType("torch")
    stub.version = types.SimpleNamespace(hip=None, cuda=None)
    monkeypatch.setitem(sys.modules, "torch", stub)


def _optimized(model: onnx.ModelProto, tmp_path: Path, model_type: str, opt_level: int) -> onnx.ModelProto:
    from onnxruntime.transformers.optimizer import optimize_model  # noqa: PLC0415

    path = tmp_path / "in.onnx"
    onnx.save(model, path)
    return optimize_model(str(path), model_type=model_type, opt_level=opt_level, num_heads=0, hidden_size=0,
                          verbose=False).model


OPTIMIZE_CASES = [
    pytest.param(base, model_type, level, ops, id=f"{base}-{model_type}-opt{level}")
    for base, model_type, ops in [
        ("gpt2", "gpt2", {"SkipLayerNormalization", "FastGelu"}),
        ("llama", "bert", {"SkipSimplifiedLayerNormalization"}),
        ("llama", "qwen3", {"SkipSimplifiedLayerNormalization"}),
        ("genai", "gpt2", {"GroupQueryAttention", "SkipSimplifiedLayerNormalization"}),
        ("phi3", "bert", {"SkipSimplifiedLayerNormalization"}),
    ]
    for level in (0, 1, 2, 99)
]


@pytest.mark.parametrize("base,model_type,opt_level,ops", OPTIMIZE_CASES)
def test_optimize_model(bases, tmp_path, torch_stub, base, model_type, opt_level, ops):
    model = _optimized(bases[base], tmp_path, model_type, opt_level)
    imported = {o.domain for o in model.opset_import}
    _, _, session = decode_both(model, expect_ops=ops)
    rules = [r.rule for r in session.rewrites]
    if "com.microsoft" not in imported:  # opt_level 0: the nodes are there, the import is not
        assert "opset_import_assumed" in rules
    assert all(v.dtype is not None for v in session.loaded_graph.values if v.kind == "tensor"), \
        "every value typed: shape inference went through"


def test_optimize_model_breaks_an_if_branch_and_both_runtimes_refuse_it(bases, tmp_path):
    """optimize_model prunes the Constant nodes inside the longrope phi3's If branches
    (their only readers are the branch outputs), leaving outputs nothing produces;
    onnxruntime refuses that model too. The load error names the branch and the output."""
    model = _optimized(bases["phi3_longrope"], tmp_path, "bert", 0)
    with pytest.raises(Exception, match="does not exist in the graph"):
        _peer(model.SerializeToString())
    with pytest.raises(workbench.ModelLoadError, match="cos_cache_small.*not produced|not produced.*cos_cache"):
        workbench.InferenceSession(model)


def test_optimize_model_phi(bases, tmp_path):
    try:
        model = _optimized(bases["phi3"], tmp_path, "phi", 0)
    except TypeError as e:  # onnxruntime 1.32: PhiOnnxModel iterates self.model.functions (a method)
        pytest.xfail(f"onnxruntime's phi optimizer fails inside onnxruntime: {e}")
    decode_both(model)


def test_loader_reads_an_unimported_domain_as_version_1(bases, tmp_path):
    """The issue's third failure: the com.microsoft nodes of opt_level 0 without their
    import. Onnxruntime runs it; the loader imports the domain at version 1, shape
    inference goes through, and the load row says so."""
    model = _optimized(bases["gpt2"], tmp_path, "gpt2", 0)
    assert "com.microsoft" not in {o.domain for o in model.opset_import}
    session = workbench.InferenceSession(model)
    rows = session.recording.rewrites()
    row = rows[rows.rule == "opset_import_assumed"].iloc[0]
    assert "com.microsoft" in row.result and "version 1" in row.result
    assert "SkipLayerNormalization" in row.original_ops
    assert "shape_inference_failed" not in set(rows.rule)


def test_a_shape_inference_failure_is_a_load_row_and_runtime_dtypes_decode(bases, monkeypatch):
    """With ONNX shape inference failing outright every intermediate value loses its static
    dtype: the failure is a row of recording.rewrites(), and kernels take their inputs'
    runtime dtypes (Range over int64 positions stays int64, never a float32 default)."""
    import onnx.shape_inference as inference  # noqa: PLC0415

    def fail(*args, **kwargs):
        raise onnx.shape_inference.InferenceError("inference failing for the test")

    monkeypatch.setattr(inference, "infer_shapes", fail)
    model = bases["llama"]
    session = workbench.InferenceSession(model.SerializeToString())
    rows = session.recording.rewrites()
    assert "inference failing for the test" in rows[rows.rule == "shape_inference_failed"].iloc[0].result
    assert sum(v.dtype is None for v in session.loaded_graph.values) > 50
    want = Generator(_peer(model.SerializeToString())).generate(PROMPT, STEPS, progress=False, eos_token_id=-1)
    got = Generator(session).generate(PROMPT, STEPS, progress=False, eos_token_id=-1)
    assert got.tokens == want.tokens


def test_range_and_div_take_runtime_dtypes():
    from workbench.ops.registry import NodeInfo, find_native  # noqa: PLC0415

    def build(op, n_in):
        info = NodeInfo(name=op.lower(), op_type=op, domain="", opset=18, attrs={},
                        input_dtypes=(None,) * n_in, output_dtypes=(None,))
        return find_native(info).build(info)

    (r,) = build("Range", 3)([np.array(2, np.int64), np.array(7, np.int64), np.array(2, np.int64)], [None])
    assert r.dtype == np.int64 and r.tolist() == [2, 4, 6]
    (d,) = build("Div", 2)([np.array([7, -7], np.int64), np.array([2, 2], np.int64)], [None])
    assert d.dtype == np.int64 and d.tolist() == [3, -3]
    (f,) = build("Div", 2)([np.array([7.0], np.float32), np.array([2.0], np.float32)], [None])
    assert f.dtype == np.float32 and f.tolist() == [3.5]


# --- float16 ----------------------------------------------------------------------------------


@pytest.mark.parametrize("base", ["llama", "gpt2"])
@pytest.mark.parametrize("keep_io_types", [True, False])
def test_float16(bases, base, keep_io_types):
    from onnxruntime.transformers.float16 import convert_float_to_float16  # noqa: PLC0415

    model = convert_float_to_float16(bases[base], keep_io_types=keep_io_types)
    assert onnx.TensorProto.FLOAT16 in {t.data_type for t in model.graph.initializer}
    io = {v.type.tensor_type.elem_type for v in model.graph.output}
    assert io == ({onnx.TensorProto.FLOAT} if keep_io_types else {onnx.TensorProto.FLOAT16})
    decode_both(model, expect_ops={"Cast"} if keep_io_types else set())


# --- quantize_dynamic -------------------------------------------------------------------------


QUANT_CASES = [
    pytest.param(base, kw, id=f"{base}-{name}")
    for base in ("llama", "gpt2")
    for name, kw in [("defaults", {}), ("qint8", {"weight_type": "QInt8"}), ("quint8", {"weight_type": "QUInt8"}),
                     ("qint8-per-channel", {"weight_type": "QInt8", "per_channel": True}),
                     ("quint8-per-channel", {"weight_type": "QUInt8", "per_channel": True})]
]


def _quantized(model: onnx.ModelProto, tmp_path: Path, **kw) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType, quantize_dynamic  # noqa: PLC0415

    if "weight_type" in kw:
        kw["weight_type"] = getattr(QuantType, kw["weight_type"])
    src, dst = tmp_path / "f32.onnx", tmp_path / "q.onnx"
    onnx.save(model, src)
    quantize_dynamic(str(src), str(dst), **kw)
    return onnx.load(dst)


@pytest.mark.parametrize("base,kw", QUANT_CASES)
def test_quantize_dynamic(bases, tmp_path, base, kw):
    model = _quantized(bases[base], tmp_path, **kw)
    assert model.opset_import[0].version < 19  # DequantizeLinear below onnx.reference's 19
    decode_both(model, expect_ops={"DynamicQuantizeLinear", "MatMulInteger", "DequantizeLinear"})


# --- MatMulNBitsQuantizer ---------------------------------------------------------------------


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("accuracy_level", [0, 4])
def test_matmul_nbits_quantizer(bases, symmetric, accuracy_level):
    pytest.importorskip("onnx_ir")
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer  # noqa: PLC0415

    quantizer = MatMulNBitsQuantizer(onnx.ModelProto.FromString(bases["llama"].SerializeToString()),
                                     block_size=32, is_symmetric=symmetric, accuracy_level=accuracy_level)
    quantizer.process()
    model = quantizer.model.model
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    levels = {next((a.i for a in n.attribute if a.name == "accuracy_level"), 0) for n in nbits}
    assert nbits and levels == {accuracy_level}
    decode_both(model, expect_ops={"MatMulNBits"})


# --- onnxruntime's saved optimized graph ------------------------------------------------------


def _saved(source: onnx.ModelProto | str, tmp_path: Path, level: str) -> onnx.ModelProto:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                   "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED}[level]
    path = tmp_path / f"saved_{level}.onnx"
    so.optimized_model_filepath = str(path)
    data = source if isinstance(source, str) else source.SerializeToString()
    ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    return onnx.load(path)


@pytest.mark.parametrize("base", ["llama", "gpt2"])
@pytest.mark.parametrize("level", ["basic", "extended"])
def test_onnxruntime_saved_optimized_model(bases, tmp_path, base, level):
    model = _saved(bases[base], tmp_path, level)
    decode_both(model, expect_ops={"FusedMatMul"} if level == "extended" else set())


def test_onnxruntime_saved_optimized_quantized_model(bases, tmp_path):
    quantized = _quantized(bases["llama"], tmp_path, weight_type="QInt8", per_channel=True)
    onnx.save(quantized, tmp_path / "q.onnx")
    model = _saved(str(tmp_path / "q.onnx"), tmp_path, "extended")
    decode_both(model, expect_ops={"MatMulIntegerToFloat", "DynamicQuantizeMatMul", "FusedMatMul"})


# --- workbench report -------------------------------------------------------------------------


@pytest.mark.parametrize("kv", ["auto", "fixed", "growing"])
def test_report_on_a_gqa_export_whose_present_is_not_its_past(tmp_path, capsys, kv):
    """onnxruntime's fused layout: GroupQueryAttention without an attention mask, present
    declared past + n. The peer loop must not bind a full-capacity present onnxruntime
    would size one longer."""
    from workbench.cli.report import run_report  # noqa: PLC0415

    model = exports.fused_gqa_without_mask(models.llama("tiny", flavor="genai"))
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    run = run_report(str(path), PROMPT, STEPS, out_dir=tmp_path / "report", kv=kv)
    assert run.code == 0 and run.peer_error is None
    assert run.peer.tokens == run.ours.tokens
    assert (tmp_path / "report" / "report.html").exists()
    assert "tokens identical" in capsys.readouterr().out


def test_report_when_onnxruntime_cannot_run_the_loop(tmp_path, capsys, monkeypatch):
    from workbench.cli import report  # noqa: PLC0415

    class Refusing:
        def __init__(self, *args, **kwargs):
            raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : a made-up refusal\nsecond line of detail")

    monkeypatch.setattr(ort, "InferenceSession", Refusing)
    run = report.run_report(models.llama("tiny"), PROMPT, 4, out_dir=tmp_path / "report")
    out = capsys.readouterr().out
    assert run.code == 0 and run.peer is None
    assert run.peer_error == "RuntimeError: [ONNXRuntimeError] : 1 : FAIL : a made-up refusal"
    line = next(line for line in out.splitlines() if "could not run the decode loop" in line)
    assert "a made-up refusal" in line and "second line" not in out
    assert (tmp_path / "report" / "report.html").exists() and len(run.ours.tokens) == 4


def test_an_op_shape_inference_skips_is_a_load_row():
    """onnx passes over an op it has no schema for without a word, leaving the values past
    it untyped: the loader says which."""
    from onnx import TensorProto, helper  # noqa: PLC0415

    from workbench.ir.loader import prepare  # noqa: PLC0415

    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Mystery", ["r"], ["m"], name="mystery", domain="org.example"),
             helper.make_node("Neg", ["m"], ["y"], name="neg")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("org.example", 1)])
    notes = []
    prepare(model, {}, notes)
    (note,) = notes
    assert note.rule == "shape_inference_incomplete" and note.nodes == ("mystery",)
    assert "org.example::Mystery" in note.detail


def test_report_on_transformers_export_after_onnxruntime_fusions(tmp_path, capsys):
    """transformers' prefill.onnx + decode.onnx, each replaced by onnxruntime's saved
    extended graph (FusedMatMul, QuickGelu, ...), through `workbench report`'s own path."""
    from workbench.cli.main import main  # noqa: PLC0415

    folder = models.transformers_export(tmp_path / "export")
    for name in ("prefill", "decode"):
        optimized = _saved(str(folder / f"{name}.onnx"), tmp_path, "extended")
        assert "FusedMatMul" in {n.op_type for n in optimized.graph.node}
        onnx.save(optimized, folder / f"{name}.onnx")
    code = main(["report", str(folder), "--steps", "6", "--prompt-tokens", "5", "--out", str(tmp_path / "report")])
    out = capsys.readouterr().out
    assert code == 0, out[-2000:]
    assert "tokens identical" in out
    assert (tmp_path / "report" / "report.html").exists()


def test_quantized_model_under_shadow_verification(bases, tmp_path):
    """Every mechanism (memo, views, capture replay) on the dynamically quantized llama
    re-checked eagerly at every step: no value changes."""
    model = _quantized(bases["llama"], tmp_path)
    data = model.SerializeToString()
    session = workbench.InferenceSession(data, workbench.SessionOptions(shadow="raise"))
    want = Generator(_peer(data)).generate(PROMPT, STEPS, progress=False, eos_token_id=-1)
    got = Generator(session).generate(PROMPT, STEPS, progress=False, eos_token_id=-1)
    assert got.tokens == want.tokens
    assert session.recording.divergences().empty
    assert len(session.recording.shadow_checks()) > 0
