"""The CUDA backend runs the whole decode loop: same tokens as the CPU backend, captured
graphs replay on both slots, faults quarantine / retire, io_binding with device buffers.

Marked `cuda`: on a GPU machine these run on CuPy (`tools/gpu_check.sh`); elsewhere
conftest selects the device-discipline double (`tests/cuda_double`), which enforces
CuPy's host/device and stream-capture rules, so they run in every plain pytest run.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from builtin_models import BUILT_IN, PROMPT, move_a_kv_buffer_at

import workbench
from workbench import Generator, SessionOptions, models
from workbench.ops.registry import host_read

pytestmark = pytest.mark.cuda

REPEATING = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]  # prompt lookup finds drafts here
TOKENS = 20


def _session(model, backend="cuda", **options):
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return workbench.InferenceSession(data, backend=backend, options=SessionOptions(**options))


def _decode(session, prompt=PROMPT, tokens=TOKENS, **kw):
    return Generator(session).generate(prompt, tokens, progress=False, eos_token_id=-1, **kw)


_CPU_TOKENS: dict = {}


def _cpu_tokens(name, prompt=PROMPT, tokens=TOKENS, **kw):
    key = (name, tuple(prompt), tokens, tuple(sorted(kw.items())))
    if key not in _CPU_TOKENS:
        _CPU_TOKENS[key] = _decode(_session(BUILT_IN[name](), "cpu", capture=False), prompt, tokens, **kw).tokens
    return _CPU_TOKENS[key]


@pytest.mark.parametrize("kv", ["growing", "fixed"])
@pytest.mark.parametrize("name", list(BUILT_IN))
def test_cuda_decodes_the_same_tokens_as_the_cpu(name, kv):
    session = _session(BUILT_IN[name]())
    got = _decode(session, kv=kv)
    assert got.tokens == _cpu_tokens(name, kv=kv)
    events = session.recording.capture_events()
    assert (events.event == "capture").any(), events.to_string()
    if kv == "fixed":
        assert (events.event == "replay").sum() > 0, events.to_string()


@pytest.mark.parametrize("name", list(BUILT_IN))
def test_cuda_eager_decode_matches_the_cpu(name):
    got = _decode(_session(BUILT_IN[name](), capture=False), kv="fixed")
    assert got.tokens == _cpu_tokens(name, kv="fixed")


@pytest.mark.parametrize("name", ["llama-genai", "llama-genai-int4"])
def test_cuda_speculative_matches_greedy_and_both_slots_replay(name):
    session = _session(BUILT_IN[name]())
    spec = _decode(session, prompt=REPEATING, tokens=30, speculative=3, kv="fixed")
    assert spec.tokens == _cpu_tokens(name, prompt=REPEATING, tokens=30, kv="fixed")
    ex = session.executor
    assert ex.slot_capture("primary").replays > 0 and ex.slot_capture("verify").replays > 0
    events = session.recording.capture_events()
    assert set(events[events.event == "replay"].slot) == {"primary", "verify"}


def test_cuda_genai_llama_replays_nearly_every_node_with_device_timings():
    session = _session(BUILT_IN["llama-genai"]())
    _decode(session, kv="fixed")
    rec = session.recording
    timings = rec.node_timings()
    events = rec.capture_events()
    first = events[events.event == "replay"].step.min()
    late = timings[timings.step >= first]
    assert (late["mode"] == "replayed").mean() >= 0.9  # the GQA one-token path is captured too
    assert (timings.duration_us >= 0).all() and timings.duration_us.notna().all()
    segments = rec.segments()
    assert set(segments[(segments.step >= first) & (segments.kind == "captured")].state) == {"replayed"}
    for frame in (rec.steps(), rec.capture_declines(), rec.nodes(), segments):
        assert len(frame) > 0


def test_cuda_gguf_model_decodes_token_exact(tmp_path):
    pytest.importorskip("gguf")  # a bare GPU image may lack it; the CPU CI always has it
    from test_gguf import write_tiny_gguf

    from workbench.models import from_gguf

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, tied=False)
    model = from_gguf(path)
    prompt = [7, 200, 31, 150, 64, 9]
    want = _decode(_session(model, "cpu", capture=False), prompt, 12).tokens
    for kv in ("growing", "fixed"):
        session = _session(model)
        assert _decode(session, prompt, 12, kv=kv).tokens == want, kv
    assert len(set(want)) > 1


# -- faults -------------------------------------------------------------------------------


def test_cuda_declared_host_read_while_capturing_quarantines_and_stays_exact():
    session = _session(BUILT_IN["llama-genai"]())
    victim = next(p for p in session.plan.nodes if p.node.op_type == "MatMul")
    original = victim.fn

    def sneaky(ins, outs):
        host_read(ins[0])  # claims capturable, but reads the device on the host
        return original(ins, outs)

    victim.fn = sneaky
    got = _decode(session, kv="fixed")
    assert got.tokens == _cpu_tokens("llama-genai", kv="fixed")
    events = session.recording.capture_events()
    quarantine = events[events.event == "quarantine"]
    assert len(quarantine) == 1 and "MatMul" in quarantine.reason.iloc[0]
    assert ("", "MatMul") in session.executor.capture_runner.quarantined
    assert (events[events.step > quarantine.step.iloc[0]].event == "replay").any()


def test_cuda_undeclared_sync_while_capturing_fails_naming_the_node_and_leaves_no_capture_open():
    """A kernel converting a device value to a Python int (a hidden D2H sync) cannot be
    captured: CuPy refuses the transfer; the step fails with a KernelError naming the node,
    the capture is ended and the default allocator is back."""
    session = _session(BUILT_IN["llama-genai"]())
    victim = next(p for p in session.plan.nodes if p.node.op_type == "MatMul")
    original = victim.fn

    def syncing(ins, outs):
        int(ins[0].reshape(-1)[:1].astype(np.int64).sum())
        return original(ins, outs)

    victim.fn = syncing
    with pytest.raises(workbench.WorkbenchError, match=victim.node.name):
        _decode(session, kv="fixed")
    backend = session.backend
    assert not backend.stream.is_capturing()
    assert backend.cp.cuda.get_allocator() is backend._default_allocator


def test_cuda_moving_a_kv_buffer_retires_and_recaptures():
    session = _session(BUILT_IN["llama-genai"]())
    gen = Generator(session)
    move_a_kv_buffer_at(gen)
    got = gen.generate(PROMPT, TOKENS, kv="fixed", progress=False, eos_token_id=-1)
    assert got.tokens == _cpu_tokens("llama-genai", kv="fixed")
    events = session.recording.capture_events()
    retired = events[events.event == "retire"]
    assert retired.reason.str.contains("past_key_values.0.key|present.0.key").any(), events.to_string()
    assert (events[events.step > retired.step.min()].event == "capture").any()
    assert (events[events.step > retired.step.min()].event == "replay").any()


# -- io_binding with device buffers vs onnxruntime ------------------------------------------


def test_cuda_io_binding_device_buffers_stable_addresses_vs_onnxruntime():
    """Eight runs of one decode-shaped step with inputs and outputs bound to device
    buffers at fixed addresses, contents changed in place each run (so captured graphs
    replay), compared with onnxruntime every run."""
    proto = models.llama("tiny", flavor="genai")
    cfg = models.config_of(proto)
    session = _session(proto)
    backend = session.backend
    peer = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    past_len, total = 5, 6
    host_past = {k: rng.standard_normal(v.shape[:2] + (past_len,) + v.shape[3:]).astype(v.dtype)
                 for k, v in cfg.empty_past(1, 0).items()}
    feeds_host = {"input_ids": np.array([[3]], np.int64), "attention_mask": np.ones((1, total), np.int64),
                  **host_past}
    device = {k: backend.from_host(v.copy()) for k, v in feeds_host.items()}
    logits = backend.allocate((1, 1, cfg.vocab), np.float32)
    addresses = {k: _ptr(v) for k, v in device.items()}
    for run in range(8):
        feeds_host["input_ids"][...] = rng.integers(0, cfg.vocab)
        for k in host_past:
            feeds_host[k] = rng.standard_normal(feeds_host[k].shape).astype(feeds_host[k].dtype)
        for k, v in feeds_host.items():
            backend.copy_from_host(device[k], v)
        binding = session.io_binding()
        for k, v in device.items():
            binding.bind_input(k, v)
        binding.bind_output("logits", logits)
        session.run_with_iobinding(binding)
        want = peer.run(["logits"], feeds_host)[0]
        np.testing.assert_allclose(backend.to_host(logits), want, rtol=1e-4, atol=1e-4, err_msg=f"run {run}")
        assert {k: _ptr(v) for k, v in device.items()} == addresses
    assert session.executor.slot_capture("primary").replays > 0


def test_cuda_run_matches_onnxruntime_on_one_step():
    proto = models.llama("tiny", flavor="genai")
    cfg = models.config_of(proto)
    feeds = {"input_ids": np.array([[5, 6, 7]], np.int64), "attention_mask": np.ones((1, 3), np.int64)}
    feeds.update(cfg.empty_past(1, 0))
    ours = _session(proto).run(["logits"], feeds)[0]
    assert isinstance(ours, np.ndarray)  # run() hands host arrays back
    peer = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0]
    np.testing.assert_allclose(ours, peer, rtol=1e-4, atol=1e-4)


def _ptr(a):
    iface = getattr(a, "__array_interface__", None)
    return iface["data"][0] if iface is not None else a.data.ptr


def test_cuda_gqa_one_token_path_runs_and_replays_on_the_device(monkeypatch):
    """GroupQueryAttention's one-token decode path keeps the position on the device (no
    host read, nothing baked into a graph): with the general path forbidden after the
    prefill, a fixed-KV decode on the device is still token-exact and replays."""
    import workbench.ops.group_query_attention as ca

    want = _cpu_tokens("llama-genai", kv="fixed")
    session = _session(BUILT_IN["llama-genai"]())
    gen = Generator(session)
    original_step = gen._step

    def step(tokens, cache, phase, slot):
        if phase == "decode":
            monkeypatch.setattr(ca, "_masked_softmax", _forbidden)
        return original_step(tokens, cache, phase, slot)

    gen._step = step
    got = gen.generate(PROMPT, TOKENS, kv="fixed", progress=False, eos_token_id=-1)
    assert got.tokens == want
    assert session.executor.slot_capture("primary").replays > 0
    gqa = {p.index for p in session.plan.nodes if p.node.op_type == "GroupQueryAttention"}
    timings = session.recording.node_timings()
    assert (timings[timings.plan_index.isin(gqa)]["mode"] == "replayed").sum() > 0


def _forbidden(*args, **kwargs):
    raise AssertionError("GroupQueryAttention took the general path")
