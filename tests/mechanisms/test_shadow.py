"""Shadow verification: a served step is re-run eagerly and every value compared.

Every test that expects a divergence injects a real fault into a mechanism (a
dropped launch in a captured graph, a skipped If that should have run); a sound
run must show none, on every built-in model under every switch.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from builtin_models import BUILT_IN, PROMPT

import workbench
from workbench import Generator, MechanismDivergenceError, SessionOptions

SWITCHES = ("capture", "decode_memo", "view_plan", "views", "compute_in_place", "release_dead_values")


def _session(name, **options):
    options.setdefault("decode_memo_verify", False)
    return workbench.InferenceSession(BUILT_IN[name]().SerializeToString(), options=SessionOptions(**options))


def _decode(session, tokens=16, **kw):
    return Generator(session).generate(PROMPT, tokens, progress=False, eos_token_id=-1, **kw)


def test_shadow_options_parse_and_reject_nonsense(monkeypatch):
    assert SessionOptions(shadow=True).shadow == "record"
    assert SessionOptions(shadow="RAISE").shadow == "raise"
    assert SessionOptions(shadow="0").shadow == "off"
    monkeypatch.setenv("WORKBENCH_SHADOW", "raise")
    assert SessionOptions().shadow == "raise"
    with pytest.raises(ValueError, match="shadow must be one of"):
        SessionOptions(shadow="sometimes")
    with pytest.raises(ValueError, match="shadow_fraction"):
        SessionOptions(shadow_fraction=2.0)


def _combinations():
    """Pairwise cover of the six switches (every pair of values of every two
    switches appears), plus all-on and all-off: 8 combinations instead of 64."""
    rows = [dict.fromkeys(SWITCHES, True), dict.fromkeys(SWITCHES, False)]
    for bits in itertools.product([False, True], repeat=3):
        a, b, c = bits
        rows.append(dict(zip(SWITCHES, (a, b, c, a ^ b, b ^ c, a ^ c))))
    seen, unique = set(), []
    for r in rows:
        key = tuple(r.values())
        if key not in seen:
            seen.add(key)
            unique.append(r)
    return unique


def _combo_id(combo):
    return "-".join(k[:4] + ("1" if v else "0") for k, v in combo.items())


@pytest.mark.parametrize("combo", _combinations(), ids=_combo_id)
@pytest.mark.parametrize("name", list(BUILT_IN))
def test_every_switch_combination_decodes_with_zero_divergences(name, combo):
    reference = _decode(_session(name, capture=False, decode_memo=False, views=False,
                                 compute_in_place=False), kv="fixed")
    session = _session(name, shadow="raise", **combo)
    got = _decode(session, kv="fixed")
    assert got.tokens == reference.tokens
    rec = session.recording
    assert rec.divergences().empty
    memo = rec.memo_timeline()
    events = rec.capture_events()
    timings = rec.node_timings()
    served = (set(memo[memo.action == "replayed"].step) | set(events[events.event == "replay"].step)
              | set(timings[timings["mode"] == "elided"].step))
    assert set(rec.shadow_checks().step) == served, "shadow checked exactly the served steps"
    if combo["decode_memo"]:
        assert served, "the memo replayed, so shadow had something to check"


def _drop_a_launch_once_installed(session):
    """An on_token hook: the first time the primary slot holds captured graphs, drop
    one launch from the middle of the longest (a replay that silently skips work)."""
    dropped = []

    def on_token(_):
        cap = session.executor.slot_capture("primary")
        if dropped or not cap.graphs:
            return
        graph = max(cap.graphs.values(), key=lambda g: len(g.graph.launches)).graph
        kernels = [i for i, launch in enumerate(graph.launches) if launch[0].__name__ != "copy_launch"]
        dropped.append(graph.launches.pop(kernels[len(kernels) // 2]))  # a node's own kernel

    return on_token, dropped


def test_shadow_names_a_captured_graph_that_dropped_a_launch():
    session = _session("llama-genai", shadow="record")
    on_token, dropped = _drop_a_launch_once_installed(session)
    _decode(session, tokens=10, kv="fixed", on_token=on_token)
    assert dropped
    divergences = session.recording.divergences()
    assert not divergences.empty
    assert set(divergences.mechanism) == {"capture_replay"}
    first = session.plan.nodes[divergences.plan_index.min()]
    assert first.fn is dropped[0][0], \
        "the first divergent node is the one whose launch was dropped"
    assert (divergences.max_abs_err > 0).all()


def test_shadow_raise_names_node_and_mechanism_of_a_wrongly_skipped_if():
    session = _session("phi3", shadow="raise", capture=False)
    executor = session.executor
    if_node = next(p for p in session.plan.nodes if p.node.op_type == "If")
    _decode(session, tokens=4)
    executor._if_unchanged = lambda p, predicate, env: True  # a skip that ignores the predicate
    long_prompt = list(range(3, 3 + 40))  # past LongRoPE's threshold: the predicate flips
    with pytest.raises(MechanismDivergenceError, match=r"if_skip changed a value: node .*"
                       + if_node.node.name.replace("/", ".")):
        Generator(session).generate(long_prompt, 4, progress=False, eos_token_id=-1)


def test_shadow_fraction_checks_an_even_share_of_served_steps():
    session = _session("llama-genai", shadow="record", shadow_fraction=0.25)
    _decode(session, tokens=33, kv="fixed")
    checks = session.recording.shadow_checks()
    served = session.executor.shadow.served
    assert served >= 28
    assert len(checks) == served // 4
    assert checks.mechanisms.map(len).min() >= 1


def test_divergences_survive_save_and_load(tmp_path):
    session = _session("llama-genai", shadow="record")
    on_token, dropped = _drop_a_launch_once_installed(session)
    _decode(session, tokens=8, kv="fixed", on_token=on_token)
    session.recording.save(tmp_path / "rec")
    loaded = workbench.Recording.load(tmp_path / "rec")
    a, b = session.recording.divergences(), loaded.divergences()
    assert len(a) == len(b) > 0
    np.testing.assert_allclose(a.max_abs_err.to_numpy(float), b.max_abs_err.to_numpy(float))
    assert list(a.node) == list(b.node)


def test_the_same_infinity_is_no_divergence_and_a_different_one_is():
    """A Constant of -inf (a mask's fill value, optimum's merged decoder) compared with
    itself gave inf - inf = NaN, read as a divergence of inf: every shadowed step of
    that export raised. The same infinity matches; another value or sign does not."""
    from workbench.backend import CpuBackend
    from workbench.executor.shadow import difference

    cpu = CpuBackend()
    fill = np.array([-np.inf, 1.0, np.inf], np.float32)
    assert difference(cpu, fill, fill.copy()) is None
    assert difference(cpu, fill, np.array([np.inf, 1.0, np.inf], np.float32)) == np.inf
    assert difference(cpu, fill, np.array([-np.inf, 1.0, 3.0], np.float32)) == np.inf
    assert difference(cpu, np.array([np.nan], np.float32), np.array([np.nan], np.float32)) is None


def test_a_minus_infinity_mask_decodes_under_shadow_raise():
    """Where(mask, scores, -inf) over 8 memo-replayed runs on one input buffer, shadowed
    at every step, against onnxruntime."""
    nodes = [onnx.helper.make_node("Constant", [], ["fill"], value=onnx.numpy_helper.from_array(
                 np.array([-np.inf], np.float32), "fill")),
             onnx.helper.make_node("Greater", ["x", "zero"], ["keep"]),
             onnx.helper.make_node("Where", ["keep", "x", "fill"], ["masked"]),
             onnx.helper.make_node("Softmax", ["masked"], ["y"], axis=-1)]
    graph = onnx.helper.make_graph(
        nodes, "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 6])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 6])],
        [onnx.numpy_helper.from_array(np.float32(0), "zero")])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    session = workbench.InferenceSession(model, workbench.SessionOptions(shadow="raise", trace=True))
    import onnxruntime as ort

    peer = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.zeros((1, 6), np.float32)
    rng = np.random.default_rng(0)
    for run in range(8):
        x[...] = rng.standard_normal((1, 6))
        x[0, 0] = abs(x[0, 0]) + 0.1  # one kept entry at least
        np.testing.assert_allclose(session.run(None, {"x": x})[0], peer.run(None, {"x": x.copy()})[0],
                                   rtol=1e-6, atol=1e-7, err_msg=f"run {run}")
    assert session.recording.divergences().empty and len(session.recording.shadow_checks()) >= 4
