"""Segmented capture on the CPU backend: coverage, a reason for every seam, token
exactness in every mode, speculative verify on its own slot, and injected faults."""

from __future__ import annotations

import numpy as np
import pytest
from builtin_models import BUILT_IN, PROMPT, move_a_kv_buffer_at

import workbench
from workbench import Generator, SessionOptions, models
from workbench.executor.capture import DECLINE_REASONS
from workbench.ops.registry import host_read

REPEATING = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]  # prompt lookup finds drafts here


def _session(name, **options):
    return workbench.InferenceSession(BUILT_IN[name]().SerializeToString(), options=SessionOptions(**options))


def _decode(session, prompt=PROMPT, tokens=64, **kw):
    return Generator(session).generate(prompt, tokens, progress=False, eos_token_id=-1, **kw)


def test_genai_llama_replays_at_least_90_percent_of_nodes_after_warm_up():
    session = _session("llama-genai")
    _decode(session, kv="fixed")
    rec = session.recording
    n_nodes = len(rec.nodes())
    events = rec.capture_events()
    first_replay = events[events.event == "replay"].step.min()
    assert first_replay == 4  # prefill, first decode, memo rebuild (warm), capture, then replay
    timings = rec.node_timings()
    decode_steps = range(first_replay, len(rec))
    for step in decode_steps:
        replayed = (timings[timings.step == step]["mode"] == "replayed").sum()
        assert replayed / n_nodes >= 0.9, (step, replayed, n_nodes)
    segments = rec.segments()
    assert set(segments[segments.step >= first_replay].query("kind == 'captured'").state) == {"replayed"}


def test_every_seam_has_a_documented_reason():
    session = _session("llama-onnx")
    _decode(session, tokens=8)
    rec = session.recording
    declines = rec.capture_declines()
    capture_step = rec.capture_events().query("event == 'capture'").step.min()
    at_capture = declines[declines.step == capture_step]
    segments = rec.segments()
    seams = segments[(segments.step == capture_step) & (segments.kind == "eager")]
    seam_nodes = {k for _, s in seams.iterrows() for k in range(s.first_node, s.last_node + 1)}
    assert seam_nodes == set(at_capture.plan_index), "every eager node has exactly one decline row"
    assert set(at_capture.reason) <= set(DECLINE_REASONS)
    assert (at_capture.detail.str.len() > 0).all()
    growing = at_capture[at_capture.reason == "growing_symbol"]
    assert len(growing) and all(len(s) for s in growing.symbols)


@pytest.mark.parametrize("kv", ["growing", "fixed"])
@pytest.mark.parametrize("name", list(BUILT_IN))
def test_token_exact_with_capture_on_and_off(name, kv):
    on = _decode(_session(name, capture=True), kv=kv)
    off_session = _session(name, capture=False)
    off = _decode(off_session, kv=kv)
    assert on.tokens == off.tokens
    declines = off_session.recording.capture_declines()
    assert set(declines.reason) == {"capture_disabled"}


@pytest.mark.parametrize("name", list(BUILT_IN))
def test_speculative_decoding_matches_greedy_and_both_slots_replay(name):
    plain = _decode(_session(name, capture=False), prompt=REPEATING, tokens=40)
    session = _session(name)
    spec = _decode(session, prompt=REPEATING, tokens=40, speculative=3)
    assert spec.tokens == plain.tokens
    assert len(spec.step_times) <= len(plain.step_times)  # never more runs than greedy
    events = session.recording.capture_events()
    replays = events[events.event == "replay"].groupby("slot").size().to_dict()
    assert replays.get("verify", 0) > 0
    phases = set(session.recording.steps().phase)
    assert "verify" in phases


def test_slots_keep_independent_bookkeeping():
    session = _session("llama-genai")
    spec = _decode(session, prompt=REPEATING, tokens=40, speculative=3)
    assert len(spec.step_times) < 40, "drafts were accepted: fewer runs than tokens"
    ex = session.executor
    primary, verify = ex.slot_capture("primary"), ex.slot_capture("verify")
    assert primary is not verify
    assert primary.replays > 0 and verify.replays > 0
    steps = session.recording.steps()
    assert set(steps.slot) == {"primary", "verify"}


# -- injected faults -----------------------------------------------------------------


def test_host_read_while_capturing_quarantines_the_op_and_stays_exact():
    reference = _decode(_session("llama-genai", capture=False), tokens=16)
    session = _session("llama-genai")
    victim = next(p for p in session.plan.nodes if p.node.op_type == "MatMul")
    original = victim.fn

    def sneaky(ins, outs):
        host_read(ins[0])  # claims capturable, but syncs with the host
        return original(ins, outs)

    victim.fn = sneaky
    got = _decode(session, tokens=16)
    assert got.tokens == reference.tokens
    rec = session.recording
    events = rec.capture_events()
    quarantine = events[events.event == "quarantine"]
    assert len(quarantine) == 1 and "MatMul" in quarantine.reason.iloc[0]
    assert events[events.event == "retire"].reason.str.startswith("capture_failed: host read").any()
    assert ("", "MatMul") in session.executor.capture_runner.quarantined
    declines = rec.capture_declines()
    later = declines[declines.step > quarantine.step.iloc[0]]
    assert set(later[later.op_type == "MatMul"].reason) == {"quarantined_op"}
    assert (events.event == "replay").sum() > 0, "the re-planned segments still replay"


def test_rebinding_a_kv_buffer_at_a_new_address_retires_with_reason():
    session = _session("llama-genai")
    gen = Generator(session)
    move_a_kv_buffer_at(gen)
    reference = _decode(_session("llama-genai", capture=False), tokens=16, kv="fixed")
    got = gen.generate(PROMPT, 16, kv="fixed", progress=False, eos_token_id=-1)
    assert got.tokens == reference.tokens
    events = session.recording.capture_events()
    retired = events[events.event == "retire"]
    assert retired.reason.str.contains("past_key_values.0.key").any() or \
        retired.reason.str.contains("present.0.key").any()
    assert (events[events.step > retired.step.min()].event == "capture").any()


def test_longrope_if_flip_retires_and_recaptures():
    session = _session("phi3")
    _decode(session, tokens=20, kv="fixed")  # total length passes original_max (16)
    events = session.recording.capture_events()
    flip = events[(events.event == "retire") & events.reason.str.startswith("control_flow_shape_flip")]
    assert len(flip) == 1 and "cos_cache" in flip.reason.iloc[0]
    assert (events[events.step > flip.step.iloc[0]].event == "capture").any()
    assert (events[events.step > flip.step.iloc[0]].event == "replay").any()
    # while the predicate holds, the If's branch is not re-run
    timings = session.recording.node_timings()
    if_index = session.recording.nodes().query("op_type == 'If'").plan_index.iloc[0]
    assert (timings[timings.plan_index == if_index]["mode"] == "elided").sum() > 10


def test_cuda_backend_is_refused_without_a_gpu():
    try:
        import cupy

        if cupy.cuda.is_available():
            pytest.skip("a GPU is present: covered by the cuda-marked tests")
    except ImportError:
        pass
    with pytest.raises(workbench.BackendUnavailableError):
        workbench.InferenceSession(models.gpt2("tiny"), backend="cuda")


def test_capture_events_and_declines_survive_save_and_load(tmp_path):
    session = _session("llama-genai")
    _decode(session, tokens=8)
    session.recording.save(tmp_path / "rec")
    loaded = workbench.Recording.load(tmp_path / "rec")
    for frame in ("segments", "capture_declines", "capture_events"):
        a, b = getattr(session.recording, frame)(), getattr(loaded, frame)()
        assert len(a) == len(b) and list(a.columns) == list(b.columns)
    assert np.isfinite(loaded.capture_events().duration_s).all()


def test_a_replayed_launch_that_computes_out_of_place_still_lands_in_its_buffer():
    """The CPU replay checks every launch's results against its output buffers in one
    pass; a kernel that returned a fresh array (or wrote only some outputs in place)
    is copied into the recorded buffers, eight replays with new input contents."""
    from workbench.backend.cpu import CpuBackend, CpuGraph

    backend = CpuBackend()
    x = np.empty(4, np.float32)
    first, second, kept = np.empty(4, np.float32), np.empty(4, np.float32), np.empty(4, np.float32)

    def in_place(ins, outs):
        np.negative(ins[0], out=outs[0])
        return (outs[0],)

    def half_fresh(ins, outs):  # output 0 in place, output 1 a fresh array
        np.multiply(ins[0], 2, out=outs[0])
        return (outs[0], ins[0] + 1)

    graph = CpuGraph()
    graph.launches = [(in_place, [x], [kept]), (half_fresh, [x], [first, second])]
    rng = np.random.default_rng(0)
    for run in range(8):
        x[...] = rng.standard_normal(4)
        backend.launch(graph)
        np.testing.assert_array_equal(kept, -x, err_msg=f"run {run}")
        np.testing.assert_array_equal(first, x * 2, err_msg=f"run {run}")
        np.testing.assert_array_equal(second, x + 1, err_msg=f"run {run}")


def _two_segment_model():
    """Two captured runs of nodes with an If between them (an eager seam)."""
    from onnx import TensorProto, helper, numpy_helper
    from oracles import tensor

    rng = np.random.default_rng(7)
    w1, w2 = (numpy_helper.from_array(rng.standard_normal((6, 6)).astype(np.float32), n) for n in ("w1", "w2"))
    then = helper.make_graph([helper.make_node("Constant", [], ["t"], value=numpy_helper.from_array(
        np.full((6,), 0.5, np.float32)))], "then", [], [tensor("t", [6])])
    other = helper.make_graph([helper.make_node("Constant", [], ["e"], value=numpy_helper.from_array(
        np.full((6,), -2.0, np.float32)))], "else", [], [tensor("e", [6])])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("Tanh", ["a"], ["b"]),
         helper.make_node("Neg", ["b"], ["c"]),
         helper.make_node("If", ["cond"], ["scale"], then_branch=then, else_branch=other),
         helper.make_node("Mul", ["c", "scale"], ["d"]), helper.make_node("MatMul", ["d", "w2"], ["e2"]),
         helper.make_node("Sigmoid", ["e2"], ["y"])],
        "two_segments", [tensor("x", [3, 6]), tensor("cond", [], TensorProto.BOOL)], [tensor("y", [3, 6])],
        [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_each_replayed_segment_has_one_replay_event_timed_as_its_nodes_vs_onnxruntime():
    """Eight runs at a stable input address with new contents, two captured segments
    each: every output against onnxruntime; and in the trace, each replaying step has
    one capture_events "replay" row per captured segment, in segment order, whose
    duration is what that segment's replayed node rows share."""
    from oracles import ort_session

    model = _two_segment_model()
    session = workbench.InferenceSession(model)
    oracle = ort_session(model)
    rng = np.random.default_rng(8)
    x = np.empty((3, 6), np.float32)
    cond = np.array(True)
    for run in range(8):
        x[...] = rng.standard_normal(x.shape)
        (got,) = session.run(None, {"x": x, "cond": cond})
        (want,) = oracle.run(None, {"x": x.copy(), "cond": cond.copy()})
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"run {run}")
    rec = session.recording
    segments = rec.segments()
    captured = segments[(segments.kind == "captured") & (segments.state == "replayed")]
    events = rec.capture_events()
    replays = events[events.event == "replay"]
    nodes = rec.node_timings()
    replaying_steps = sorted(set(captured.step))
    assert len(replaying_steps) >= 5 and len(set(captured.segment)) == 2
    for step in replaying_steps:
        rows = replays[replays.step == step]
        assert list(rows.segment) == list(captured[captured.step == step].segment)
        assert set(rows.reason) == {"binding signature unchanged"} and set(rows.slot) == {"primary"}
        for _, seg in captured[captured.step == step].iterrows():
            shared = nodes[(nodes.step == step) & nodes.plan_index.between(seg.first_node, seg.last_node)]
            assert set(shared["mode"]) == {"replayed"} and len(shared) == seg.node_count
            duration = float(rows[rows.segment == seg.segment].duration_s.iloc[0])
            assert shared.duration_us.sum() == pytest.approx(duration * 1e6, rel=1e-9)
