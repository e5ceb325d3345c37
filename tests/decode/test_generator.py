"""Greedy decode through workbench is token-exact against onnxruntime running the same loop."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from builtin_models import BUILT_IN
from onnx import TensorProto, helper

import workbench
from workbench import DecodeInterfaceError, Generator, models

MODELS = BUILT_IN
SHORT_PROMPT = list(range(3, 11))  # 8 tokens
LONG_PROMPT = [(7 * i + 5) % 200 + 3 for i in range(20)]  # past phi3 tiny's LongRoPE threshold (16)


@functools.cache
def _model_bytes(name: str) -> bytes:
    return MODELS[name]().SerializeToString()


def _sessions(name: str):
    data = _model_bytes(name)
    return (workbench.InferenceSession(data),
            ort.InferenceSession(data, providers=["CPUExecutionProvider"]))


@pytest.mark.parametrize("prompt", [SHORT_PROMPT, LONG_PROMPT], ids=["prompt8", "prompt20"])
@pytest.mark.parametrize("kv", ["growing", "fixed"])
@pytest.mark.parametrize("name", list(MODELS))
def test_decode_64_tokens_token_exact_vs_onnxruntime(name, kv, prompt):
    ours, peer = _sessions(name)
    got = Generator(ours).generate(prompt, 64, kv=kv, progress=False, return_logits=True, eos_token_id=-1)
    want = Generator(peer).generate(prompt, 64, kv=kv, progress=False, return_logits=True, eos_token_id=-1)
    assert len(got.tokens) == 64
    assert got.tokens == want.tokens
    for step, (a, b) in enumerate(zip(got.logits, want.logits)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"step {step}")
    assert got.kv_mode == kv
    assert got.shared_buffer == (kv == "fixed" and "genai" in name or kv == "fixed" and "phi3" in name)


def test_onnxruntime_loop_keeps_its_binding_and_matches_its_unbound_run():
    """The peer's fixed-KV loop binds its caches once per generation, not every step,
    and copies back only the logits; across two generations on one session (new
    caches, a prefill of another length) it still decodes what onnxruntime's plain
    `run` (growing KV, no binding) does, logit for logit."""
    from workbench.decode import runners

    _, peer = _sessions("llama-genai")
    calls = {"bind_output": 0}
    for prompt in (SHORT_PROMPT, LONG_PROMPT):
        fixed = Generator(peer).generate(prompt, 12, kv="fixed", progress=False, return_logits=True,
                                         eos_token_id=-1)
        kept = runners._BINDINGS[peer].binding
        if not calls["bind_output"]:
            real = kept.bind_output

            def counting(*args, _real=real, **kwargs):
                calls["bind_output"] += 1
                return _real(*args, **kwargs)
            kept.bind_output = counting
        plain = Generator(peer).generate(prompt, 12, kv="growing", progress=False, return_logits=True,
                                         eos_token_id=-1)
        assert fixed.shared_buffer and fixed.tokens == plain.tokens
        for step, (a, b) in enumerate(zip(fixed.logits, plain.logits)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=f"step {step}")
    # the second generation: its caches bound once (two per layer), the logits once a step
    layers = sum(1 for i in peer.get_inputs() if i.name.startswith("past_key_values") and i.name.endswith("key"))
    assert calls["bind_output"] == 2 * layers + 12


def test_auto_kv_uses_the_shared_buffer_for_group_query_attention():
    ours, _ = _sessions("llama-genai")
    result = Generator(ours).generate(SHORT_PROMPT, 4, progress=False)
    assert (result.kv_mode, result.shared_buffer) == ("fixed", True)
    ours, _ = _sessions("gpt2")
    assert Generator(ours).generate(SHORT_PROMPT, 4, progress=False).kv_mode == "growing"


def test_fixed_kv_buffers_never_move():
    ours, _ = _sessions("llama-genai")
    gen = Generator(ours)
    seen = []
    original = ours.run_with_iobinding

    def spy(binding, run_options=None):
        seen.append(tuple(a.ctypes.data for a in binding.outputs.values() if a is not None))
        original(binding, run_options)

    ours.run_with_iobinding = spy
    gen.generate(SHORT_PROMPT, 6, kv="fixed", progress=False)
    assert len(seen) == 6 and len(set(seen)) == 1 and len(seen[0]) == 2 * 2  # 2 layers x key/value


def test_the_growing_attention_mask_is_fed_from_one_row_of_ones():
    """Each step's mask is all ones, one longer than the last, at one address (a prefix of
    a row kept by the Generator) until the row must grow; the logits returned for every
    step stay as they were when later steps ran (they are the session's own copies)."""
    ours, peer = _sessions("llama-genai")
    seen = []
    original = ours.run_with_iobinding

    def spy(binding, run_options=None):
        mask = binding.inputs["attention_mask"]
        seen.append((mask.ctypes.data, mask.shape, bool((mask == 1).all())))
        original(binding, run_options)

    ours.run_with_iobinding = spy
    got = Generator(ours).generate(LONG_PROMPT, 80, kv="fixed", progress=False, return_logits=True,
                                   eos_token_id=-1)
    want = Generator(peer).generate(LONG_PROMPT, 80, kv="fixed", progress=False, return_logits=True,
                                    eos_token_id=-1)
    assert got.tokens == want.tokens
    for step, (a, b) in enumerate(zip(got.logits, want.logits)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"step {step}")
    assert [shape for _, shape, _ in seen] == [(1, len(LONG_PROMPT) + k) for k in range(80)]
    assert all(ones for _, _, ones in seen)
    addresses = [address for address, _, _ in seen]
    moves = [k for k in range(1, len(addresses)) if addresses[k] != addresses[k - 1]]
    assert len(moves) <= 2 and (not moves or moves[0] > 20), moves  # the row grows by doubling


def test_eos_stops_generation():
    ours, _ = _sessions("gpt2")
    first = Generator(ours).generate(SHORT_PROMPT, 8, progress=False, eos_token_id=-1)
    eos = first.tokens[2]
    stopped = Generator(ours).generate(SHORT_PROMPT, 8, progress=False, eos_token_id=eos)
    assert stopped.stopped_by_eos
    assert stopped.tokens == first.tokens[: first.tokens.index(eos) + 1]
    assert len(stopped.step_times) == len(stopped.tokens)


def test_builders_are_fast_at_tiny_size():
    import time

    for name, build in MODELS.items():
        t0 = time.perf_counter()
        build()
        assert time.perf_counter() - t0 < 1.0, name


# -- wrong use ---------------------------------------------------------------------


def _no_kv_model() -> onnx.ModelProto:
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)
    emb = helper.make_tensor("emb", TensorProto.FLOAT, [16, 16], np.eye(16, dtype=np.float32).ravel())
    graph = helper.make_graph([helper.make_node("Gather", ["emb", "input_ids"], ["logits"])], "nokv",
                              [ids], [logits], [emb])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_fixed_kv_without_kv_inputs_is_refused():
    gen = Generator(workbench.InferenceSession(_no_kv_model()))
    with pytest.raises(DecodeInterfaceError, match="kv='fixed' needs past/present KV inputs"):
        gen.generate([1, 2], 3, kv="fixed", progress=False)
    # growing (no cache at all) still decodes
    assert len(gen.generate([1, 2], 3, kv="growing", progress=False).tokens) == 3


def test_max_length_smaller_than_prompt_is_refused():
    ours, _ = _sessions("gpt2")
    with pytest.raises(DecodeInterfaceError, match="max_length 5 is smaller than the prompt"):
        Generator(ours).generate(SHORT_PROMPT, 4, max_length=5, progress=False)


def test_kv_dtype_mismatch_is_refused():
    model = models.gpt2("tiny")
    for out in model.graph.output:
        if out.name.startswith("present"):
            out.type.tensor_type.elem_type = TensorProto.FLOAT16
    with pytest.raises(DecodeInterfaceError, match="KV dtype mismatch.*past_key_values.0.key.*float32.*float16"):
        Generator(_FakeSession(model))


class _FakeSession:
    """Just the ORT-shaped description of a model, for interface checks."""

    def __init__(self, model):
        self._model_bytes = model.SerializeToString()
        s = workbench.session.inference_session
        g = workbench.ir.loader.GraphBuilder(workbench.ir.loader.opset_map(model)).build(model.graph)
        self._in = [s._node_arg(g.values[v]) for v in g.inputs]
        self._out = [s._node_arg(g.values[v]) for v in g.outputs]

    def get_inputs(self):
        return self._in

    def get_outputs(self):
        return self._out

    def get_modelmeta(self):
        raise RuntimeError


def test_length_beyond_the_models_positions_is_refused():
    ours, _ = _sessions("gpt2")
    with pytest.raises(DecodeInterfaceError, match="exceeds the model's 128 positions"):
        Generator(ours).generate(SHORT_PROMPT, 200, progress=False)
