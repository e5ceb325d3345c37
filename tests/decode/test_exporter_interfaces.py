"""Bring your own model: each exporter's exact decode interface decodes token-exact vs onnxruntime.

Every idiom is a tiny built-in decoder re-dressed in one exporter's interface
(`workbench.models.exports`): onnxruntime-genai's builder (symbolic `kv_cache_dim`
head size, int64 or int32 attention_mask, fp32 or int4), optimum's merged decoder
(`use_cache_branch`), torch dynamo at opset 23 (`Attention`), and transformers'
two-graph export (prefill.onnx + decode.onnx, `s70` / `s53 + s70` / '16' dims).
Each decodes through `Generator` and through `workbench report` in `--kv auto` and
`--kv fixed`, against onnxruntime driven by the same loop: tokens equal, logits
within 1e-4.
"""

from __future__ import annotations

import functools
import json

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import pytest

import workbench
from workbench import DecodeInterfaceError, Generator, models, reports
from workbench.cli.main import main
from workbench.cli.report import run_report
from workbench.decode import discover, find_export
from workbench.models import exports

PROMPT = [(5 * i + 3) % 500 + 3 for i in range(12)]
NEW_TOKENS = 20

IDIOMS = {
    "genai-builder": lambda: models.llama("tiny", flavor="genai", export="genai-builder"),
    "genai-builder-int32-mask": lambda: models.llama("tiny", flavor="genai", export="genai-builder",
                                                     mask_dtype="int32"),
    "genai-builder-int4": lambda: models.llama("tiny", flavor="genai", quant="int4", export="genai-builder"),
    "optimum-merged": lambda: models.llama("tiny", flavor="onnx", export="optimum-merged"),
    "torch-dynamo-attention23": lambda: models.llama("tiny", flavor="onnx", export="torch-dynamo-attention"),
}


@functools.cache
def _bytes(name: str) -> bytes:
    return IDIOMS[name]().SerializeToString()


def _ort(model) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(model if isinstance(model, bytes) else str(model), opts,
                                providers=["CPUExecutionProvider"])


def _assert_same(got, want, n=NEW_TOKENS):
    assert len(got.tokens) == n and len(want.tokens) == n
    assert got.tokens == want.tokens
    assert len(got.logits) == len(want.logits) == n
    for step, (a, b) in enumerate(zip(got.logits, want.logits)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4, err_msg=f"step {step}")


def _generate(gen: Generator, kv: str, **kw):
    return gen.generate(PROMPT, NEW_TOKENS, kv=kv, progress=False, return_logits=True, eos_token_id=-1, **kw)


# -- how each idiom is read -------------------------------------------------------------------


def test_genai_builder_head_size_comes_from_group_query_attention():
    for session in (workbench.InferenceSession(_bytes("genai-builder")), _ort(_bytes("genai-builder"))):
        io = Generator(session).interface
        assert [s.declared[3] for s in io.kv] == ["kv_cache_dim"] * 4
        assert [s.shape[1:] for s in io.kv] == [[2, "past_sequence_length", 16]] * 4
        assert io.head_size == 16
        assert "GroupQueryAttention" in io.head_size_source and "num_heads=4, kv_num_heads=2" in io.head_size_source
        text = str(io)
        for name in ("input_ids", "attention_mask", "past_key_values.1.value", "present.1.value", "logits"):
            assert name in text
        assert "past value, layer 1 -> present.1.value" in text and "head size: 16" in text
        assert io.position_ids is None


def test_genai_builder_int4_head_size_from_the_projection_when_shapes_are_not_inferred():
    io = discover(_ort(_bytes("genai-builder-int4")))  # onnxruntime: no inferred shapes, only the proto
    assert io.head_size == 16 and "MatMulNBits" in io.head_size_source and "N=64" in io.head_size_source


def test_int32_attention_mask_is_fed_as_int32():
    session = workbench.InferenceSession(_bytes("genai-builder-int32-mask"))
    gen = Generator(session)
    assert gen.interface.dtypes["attention_mask"] == np.int32
    seen = []
    original = session.run_with_iobinding

    def spy(binding, run_options=None):
        seen.append(binding.inputs["attention_mask"].dtype)
        original(binding, run_options)

    session.run_with_iobinding = spy
    gen.generate(PROMPT, 3, kv="fixed", progress=False)
    assert seen and set(seen) == {np.dtype(np.int32)}


def test_optimum_merged_reads_use_cache_branch():
    io = Generator(workbench.InferenceSession(_bytes("optimum-merged"))).interface
    assert io.use_cache_branch == "use_cache_branch" and io.position_ids == "position_ids"
    assert "use_cache_branch (past > 0)" in io.describe()
    assert io.head_size == 16 and io.head_size_source == "declared dim of 'past_key_values.0.key'"


def test_transformers_export_reads_both_graphs(tmp_path):
    folder = models.transformers_export(tmp_path / "tf")
    files = find_export(folder)
    assert (files.prefill.name, files.decode.name, files.config_file) == ("prefill.onnx", "decode.onnx",
                                                                          "config.json")
    assert files.head_size_hint() == (16, "config.json head_dim")
    decode = onnx.load(folder / "decode.onnx")
    dims = [d.dim_param for d in decode.graph.output[1].type.tensor_type.shape.dim]
    assert dims == ["s0", "2", "s53 + s70", "16"]  # the exporter's symbols, expressions, numeric strings
    gen = Generator.from_pair(workbench.InferenceSession(folder / "prefill.onnx"),
                              workbench.InferenceSession(folder / "decode.onnx"))
    pre, dec = gen.prefill_interface, gen.interface
    assert pre.is_prefill_graph and [s.present for s in pre.kv][:2] == ["cache.layers.0.keys", "cache.layers.0.values"]
    assert [(s.past, s.present) for s in dec.kv][:1] == [("input.cache.layers.0.keys", "output.cache.layers.0.keys")]
    assert dec.attention_mask is None and dec.position_ids == "position_ids"
    assert "a number written as a symbol" in dec.head_size_source and dec.head_size == 16
    text = gen.describe()
    assert "prefill graph" in text and "decode graph" in text and "starts the cache" in text


# -- decoding: Generator directly ----------------------------------------------------------------


@pytest.mark.parametrize("kv", ["auto", "fixed"])
@pytest.mark.parametrize("name", list(IDIOMS))
def test_generator_token_exact_vs_onnxruntime(name, kv):
    got = _generate(Generator(workbench.InferenceSession(_bytes(name))), kv)
    want = _generate(Generator(_ort(_bytes(name))), kv)
    _assert_same(got, want)
    assert got.kv_mode == want.kv_mode == ("growing" if kv == "auto" and "genai" not in name else "fixed")
    assert got.shared_buffer == ("genai" in name)


@pytest.mark.parametrize("kv", ["auto", "growing", "fixed"])
def test_transformers_pair_token_exact_vs_onnxruntime(tmp_path, kv):
    folder = models.transformers_export(tmp_path / "tf")
    ours = Generator(workbench.InferenceSession(folder / "decode.onnx"),
                     prefill=workbench.InferenceSession(folder / "prefill.onnx"))
    peer = Generator.from_pair(_ort(folder / "prefill.onnx"), _ort(folder / "decode.onnx"))
    got, want = _generate(ours, kv), _generate(peer, kv)
    _assert_same(got, want)
    # the same model as one graph with the builtin interface decodes the same tokens
    base = _generate(Generator(workbench.InferenceSession(models.llama("tiny", flavor="onnx"))), kv)
    assert base.tokens == got.tokens
    # the prefill graph ran once, the decode graph every later step
    pre_steps = ours.prefill_session.recording.steps()
    dec_steps = ours.session.recording.steps()
    assert list(pre_steps["phase"]) == ["prefill"] and len(dec_steps) == NEW_TOKENS - 1
    assert set(dec_steps["phase"]) == {"decode"}
    tokens = ours.session.recording.table("tokens")
    assert set(tokens["graph"]) == {"decode"}
    assert list(ours.prefill_session.recording.table("tokens")["graph"]) == ["prefill"]


def test_transformers_pair_speculative_matches_greedy(tmp_path):
    folder = models.transformers_export(tmp_path / "tf")
    gen = Generator.from_pair(workbench.InferenceSession(folder / "prefill.onnx"),
                              workbench.InferenceSession(folder / "decode.onnx"))
    greedy = gen.generate(PROMPT + PROMPT, 16, kv="fixed", progress=False, eos_token_id=-1)
    spec = gen.generate(PROMPT + PROMPT, 16, kv="fixed", progress=False, eos_token_id=-1, speculative=3)
    assert spec.tokens == greedy.tokens


# -- decoding: through `workbench report` ------------------------------------------------------


@pytest.mark.parametrize("kv", ["auto", "fixed"])
@pytest.mark.parametrize("name", list(IDIOMS))
def test_report_token_exact_vs_onnxruntime(tmp_path, capsys, name, kv):
    path = tmp_path / "model.onnx"
    path.write_bytes(_bytes(name))
    run = run_report(str(path), PROMPT, NEW_TOKENS, out_dir=tmp_path / "r", kv=kv, eos_token_id=-1,
                     label=name, return_logits=True)
    printed = capsys.readouterr().out
    assert run.code == 0 and "tokens identical" in printed
    _assert_same(run.ours, run.peer)
    assert (tmp_path / "r" / "report.html").stat().st_size > 10_000
    assert (tmp_path / "r" / "frames" / "steps.csv").exists()


@pytest.mark.parametrize("kv", ["auto", "fixed"])
def test_report_on_a_transformers_folder(tmp_path, capsys, kv):
    folder = models.transformers_export(tmp_path / "tf")
    out = tmp_path / "r"
    run = run_report(str(folder / "decode.onnx"), PROMPT, NEW_TOKENS, out_dir=out, kv=kv, eos_token_id=-1,
                     label="tf", prefill=str(folder / "prefill.onnx"), return_logits=True)
    assert run.code == 0 and "tokens identical" in capsys.readouterr().out
    _assert_same(run.ours, run.peer)
    assert set(run.sessions) == {"prefill", "decode"}
    # each graph: its own report and frames; report.html shows both, every run tagged with its graph
    assert (out / "prefill.html").stat().st_size > 10_000 and (out / "decode.html").stat().st_size > 10_000
    for graph in ("prefill", "decode"):
        steps = pd.read_csv(out / "frames" / graph / "steps.csv")
        assert len(steps) == (1 if graph == "prefill" else NEW_TOKENS - 1)
        assert reports.summary(run.sessions[graph].recording).shape[0] > 0
    index = (out / "report.html").read_text()
    assert 'src="prefill.html"' in index and 'src="decode.html"' in index
    assert index.count("<td>prefill</td>") >= 2 and index.count("<td>decode</td>") >= NEW_TOKENS - 1

    # the command line on the folder itself
    code = main(["report", str(folder), "--prompt-tokens", "8", "--steps", "16", "--kv", kv,
                 "--out", str(tmp_path / "cli")])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "prefill + decode graphs (config.json beside it)" in printed
    assert "decode interface of prefill.onnx" in printed and "decode interface of decode.onnx" in printed
    assert "== prefill graph ==" in printed and "== decode graph ==" in printed and "tokens identical" in printed


@pytest.mark.parametrize("kv", ["auto", "fixed"])
def test_cli_report_on_a_genai_builder_folder(tmp_path, capsys, kv):
    folder = tmp_path / "genai"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(_bytes("genai-builder-int32-mask"))
    (folder / "genai_config.json").write_text(json.dumps({"model": {"decoder": {"head_size": 16}}}))
    code = main(["report", str(folder), "--prompt-tokens", "8", "--steps", "16", "--kv", kv,
                 "--out", str(tmp_path / "r")])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "GroupQueryAttention" in printed and "tokens identical" in printed
    assert (tmp_path / "r" / "report.html").exists()


# -- what discovery cannot read, stated by the user ----------------------------------------------


class _Opaque:
    """An ORT-shaped session that shows its inputs and outputs and nothing of its graph."""

    def __init__(self, session):
        self._s = session

    def get_inputs(self):
        return self._s.get_inputs()

    def get_outputs(self):
        return self._s.get_outputs()

    def run(self, *args):
        return self._s.run(*args)

    def io_binding(self):
        return self._s.io_binding()

    def run_with_iobinding(self, binding):
        return self._s.run_with_iobinding(binding)


def test_symbolic_head_size_without_evidence_fails_early_then_head_size_decodes():
    peer = _ort(_bytes("genai-builder"))
    with pytest.raises(DecodeInterfaceError) as err:
        Generator(_Opaque(peer))
    text = str(err.value)
    for name in ("past_key_values.0.key", "past_key_values.1.value"):
        assert f"{name}: axis 3 is the symbol 'kv_cache_dim'" in text
    assert "head_size=N" in text
    gen = Generator(_Opaque(peer), head_size=16)
    assert gen.interface.head_size_source == "user override (head_size=)"
    _assert_same(_generate(gen, "fixed"), _generate(Generator(workbench.InferenceSession(_bytes("genai-builder"))),
                                                     "fixed"))


def test_head_size_that_contradicts_the_graph_is_refused():
    with pytest.raises(DecodeInterfaceError, match="head_size=32 contradicts the model"):
        Generator(workbench.InferenceSession(_bytes("optimum-merged")), head_size=32)


def _odd_names() -> onnx.ModelProto:
    """KV names no pattern knows, and token ids called `tokens`."""
    model = models.llama("tiny", flavor="onnx")
    mapping = {"input_ids": "tokens"}
    for i in range(2):
        for kind in ("key", "value"):
            mapping[f"past_key_values.{i}.{kind}"] = f"cache_in_{kind[0]}{i}"
            mapping[f"present.{i}.{kind}"] = f"cache_out_{kind[0]}{i}"
    return exports.rename_values(model, mapping)


def test_unknown_names_fail_naming_each_input_then_kv_map_and_roles_decode():
    data = _odd_names().SerializeToString()
    with pytest.raises(DecodeInterfaceError) as err:
        Generator(workbench.InferenceSession(data))
    text = str(err.value)
    assert "no 'input_ids' input" in text
    for name in ("tokens", "cache_in_k0", "cache_in_v1"):
        assert f"  - {name}: no role" in text
    kv_map = {f"cache_in_{k}{i}": f"cache_out_{k}{i}" for i in range(2) for k in "kv"}
    roles = {"tokens": "input_ids"}
    ours = Generator(workbench.InferenceSession(data), kv_map=kv_map, roles=roles)
    assert [(s.layer, s.kind) for s in ours.interface.kv] == [(0, "key"), (0, "value"), (1, "key"), (1, "value")]
    assert "kv_map= override" in str(ours.interface) and "roles= override" in str(ours.interface)
    for kv in ("auto", "fixed"):
        _assert_same(_generate(ours, kv), _generate(Generator(_ort(data), kv_map=kv_map, roles=roles), kv))


def test_kv_map_naming_a_missing_output_is_refused():
    with pytest.raises(DecodeInterfaceError, match="kv_map= names it, but the model has no such output"):
        Generator(workbench.InferenceSession(_odd_names()), roles={"tokens": "input_ids"},
                  kv_map={"cache_in_k0": "nope"})


def test_pair_whose_graphs_do_not_fit_is_refused(tmp_path):
    folder = models.transformers_export(tmp_path / "tf")
    other = models.transformers_export(tmp_path / "tf3", num_layers=3)
    with pytest.raises(DecodeInterfaceError, match="prefill and decode graphs do not fit together"):
        Generator.from_pair(workbench.InferenceSession(folder / "prefill.onnx"),
                            workbench.InferenceSession(other / "decode.onnx"))


def test_export_variants_carry_no_workbench_config_and_builders_are_unchanged():
    for name in IDIOMS:
        model = IDIOMS[name]()
        assert not [p for p in model.metadata_props if p.key == "workbench.model_config"], name
    assert models.config_of(models.llama("tiny", flavor="genai")).flavor == "genai"
    with pytest.raises(models.ModelBuildError, match="export='genai-builder' needs flavor='genai'"):
        models.llama("tiny", flavor="onnx", export="genai-builder")


# -- named regression: constants an If branch reads from the enclosing graph --------------------


def test_optimum_merged_with_outer_scope_constants():
    data = exports.optimum_merged(models.llama("tiny", flavor="onnx"), constants="outer").SerializeToString()
    _assert_same(_generate(Generator(workbench.InferenceSession(data)), "growing"),
                 _generate(Generator(_ort(data)), "growing"))


def test_cli_run_takes_numeric_string_dims_as_sizes(tmp_path, capsys):
    folder = models.transformers_export(tmp_path / "tf")
    assert main(["run", str(folder / "decode.onnx"), "--dim", "s53=3", "--dim", "s70=2"]) == 0
    out = capsys.readouterr().out
    assert "input  input.cache.layers.0.keys: float32[1, 2, 3, 16]" in out
    assert "output logits: float32[1, 2, 512]" in out


def test_inputs_the_generator_cannot_feed_are_decode_interface_errors():
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Cast", ["input_ids"], ["logits"], to=TensorProto.FLOAT)], "g",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT8, [1, "s"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "s"])])
    session = workbench.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    with pytest.raises(workbench.DecodeInterfaceError, match=r"input 'input_ids' is int8.*int32 or int64"):
        Generator(session).generate([300, 4], 2, progress=False)


@pytest.mark.parametrize("kv", ["fixed", "auto", "growing"])
def test_gqa_fed_no_mask_never_shares_its_past_buffer(kv):
    """transformers' export after onnxruntime's CPU fusions: GroupQueryAttention with no
    attention_mask input and presents declared past + n. Fed a full-capacity past bound
    as its own present (the shared-buffer mode genai exports take), its mask of ones
    spans the unwritten rows: wrong tokens from the fourth on, no error. Such an export
    decodes fixed KV through views of the filled rows; every step's logits match
    onnxruntime's own decode."""
    model = exports.fused_gqa_without_mask(models.llama("tiny", flavor="genai"))
    peer = Generator(ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]))
    want = peer.generate([3, 4, 5, 6], 12, kv="growing", progress=False, return_logits=True)
    generator = Generator(workbench.InferenceSession(model))
    assert not generator.supports_shared_buffer
    got = generator.generate([3, 4, 5, 6], 12, kv=kv, progress=False, return_logits=True)
    assert got.tokens == want.tokens
    for step, (a, b) in enumerate(zip(got.logits, want.logits)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=f"step {step}")


def test_a_genai_export_converted_to_fp16_keeping_its_io_types_decodes_fixed_kv():
    """onnxruntime's fp16 converter with keep_io_types=True puts a Cast before and after
    GroupQueryAttention: discovery reads the head size through the present's Cast, and
    the past is no longer the buffer GQA writes (it reads a cast copy), so a fixed cache
    goes through views of its filled rows. It bound the full buffer as its own present
    and failed ('bound output present.0.key has shape (1, 2, 16, 16) but the model
    produced (1, 2, 4, 16)'). Tokens against onnxruntime's own fp16 decode."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(exports.genai_builder(models.llama("tiny", flavor="genai")),
                                     keep_io_types=True)
    peer = Generator(ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]))
    want = peer.generate([3, 4, 5, 6], 12, kv="growing", progress=False, eos_token_id=-1).tokens
    generator = Generator(workbench.InferenceSession(model))
    assert not generator.supports_shared_buffer
    for kv in ("fixed", "auto"):
        assert generator.generate([3, 4, 5, 6], 12, kv=kv, progress=False, eos_token_id=-1).tokens == want, kv
