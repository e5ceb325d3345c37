"""The diagnostic calls of `workbench.reports` on real decodes of the built-ins, live and
saved-and-loaded: capture coverage, seam costs, peak values, alias hazards, KV growth,
diff / diff_steps; plus the vocabulary, the glossary and the shadow summary."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from builtin_models import BUILT_IN, PROMPT
from test_widgets import build_recording

import workbench
from workbench import Generator, Recording, SessionOptions, reports
from workbench.executor.capture import DECLINE_REASONS
from workbench.reports import vocabulary

TOKENS = 10
_CACHE: dict = {}


def _decode(name: str, kv: str = "auto", **options) -> tuple[Recording, object]:
    key = (name, kv, tuple(sorted(options.items())))
    if key not in _CACHE:
        session = workbench.InferenceSession(BUILT_IN[name](), SessionOptions(**options))
        result = Generator(session).generate(PROMPT, TOKENS, progress=False, eos_token_id=-1, kv=kv)
        _CACHE[key] = (session.recording, result)
    return _CACHE[key]


def _loaded(rec: Recording, tmp: Path) -> Recording:
    rec.save(tmp / "rec")
    return Recording.load(tmp / "rec")


@pytest.fixture(params=["live", "loaded"])
def how(request):
    return request.param


def _rec(name: str, how: str, tmp_path: Path, kv: str = "auto", **options) -> Recording:
    rec, _ = _decode(name, kv, **options)
    return rec if how == "live" else _loaded(rec, tmp_path)


# --------------------------------------------------------------------------- 1. capture coverage

@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_capture_coverage_shares_sum_to_one_and_match_the_node_timings(name, how, tmp_path):
    rec = _rec(name, how, tmp_path)
    cov = reports.capture_coverage(rec)
    assert list(cov["step"]) == list(rec.steps()["step"])
    kinds = reports.COVERAGE_KINDS
    np.testing.assert_allclose(cov[[f"{k}_share" for k in kinds]].sum(axis=1), 1.0)
    np.testing.assert_allclose(cov[[f"{k}_time_share" for k in kinds]].sum(axis=1), 1.0)
    t = rec.node_timings()
    fallback = set(rec.nodes().query("kernel == 'host_fallback'").plan_index)
    # an If branch run as a graph of its own (phi3's LongRoPE selector) counts as its
    # nodes, with what its branch_capture row says it replayed
    branches = rec.table("branch_capture") if "branch_capture" in rec.tables else None
    for r in cov.itertuples(index=False):
        at = t[t.step == r.step]
        rows = branches[branches.step == r.step] if branches is not None else at.iloc[:0]
        extra = int((rows.nodes - 1).sum()) if len(rows) else 0
        # the If's own time gives way to its branch's node time: replayed and eager kernels
        if_us = float(at[at.plan_index.isin(rows.plan_index)].duration_us.sum()) if len(rows) else 0.0
        branch_us = float((rows.replayed_us + rows.eager_us).sum()) if len(rows) else 0.0
        if len(rows):
            assert rows.eager_us.notna().all() and (rows.eager_us >= 0).all()
            assert branch_us <= if_us, "the branch's node time lies inside the If's"
        assert r.nodes == len(at) + extra and r.time_us == pytest.approx(at.duration_us.sum() - if_us + branch_us)
        native = at[~at.plan_index.isin(fallback)]
        replayed = int(rows.replayed_nodes.sum()) if len(rows) else 0
        replayed_us = float(rows.replayed_us.sum()) if len(rows) else 0.0
        assert r.replayed_nodes == (native["mode"] == "replayed").sum() + replayed
        assert r.replayed_us == pytest.approx(
            native.loc[native["mode"] == "replayed", "duration_us"].sum() + replayed_us)
        assert r.host_fallback_nodes == at.plan_index.isin(fallback).sum()
    # captured graphs replay on the CPU backend too: the decode is partly covered
    decode = cov[cov.phase == "decode"]
    assert decode.replayed_nodes.iloc[-1] > 0 and (cov.loc[cov.phase == "prefill", "replayed_nodes"] == 0).all()
    figure = reports.decode_coverage(rec)
    assert figure["time_share"] == pytest.approx(decode.replayed_us.sum() / decode.time_us.sum())
    s = reports.summary(rec).set_index("metric")
    assert s.loc["capture coverage (decode, time-weighted)", "value"] == pytest.approx(figure["time_share"])
    assert s.loc["capture coverage (decode, time-weighted)", "text"].endswith("% of node time replayed")


def test_capture_coverage_counts_host_fallback_nodes_apart():
    rec = build_recording()  # node 5 (Cast) runs on the host fallback
    cov = reports.capture_coverage(rec)
    assert (cov.host_fallback_nodes == 1).all() and (cov.nodes == 6).all()
    last = cov.iloc[-1]  # step 3: nodes 0, 2, 3 replayed, 1 elided, 4 eager, 5 host fallback
    assert (last.replayed_nodes, last.elided_nodes, last.eager_nodes) == (3, 1, 1)
    assert last.host_fallback_us == pytest.approx(6.0)


# --------------------------------------------------------------------------- 2. seam costs

@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_seam_costs_are_sorted_documented_and_add_up(name, how, tmp_path):
    rec = _rec(name, how, tmp_path)
    seams = reports.seam_costs(rec)
    assert not seams.empty
    assert seams.us_per_token.is_monotonic_decreasing
    assert set(seams.reason) <= set(DECLINE_REASONS)
    assert (seams.share_of_step > 0).all() and (seams.share_of_step < 1).all()
    # the top seam's total is its node time over the decode steps its decline was in force
    top = seams.iloc[0]
    dec = rec.capture_declines()
    first = dec[(dec.plan_index == top.plan_index) & (dec.slot == top.slot)].step.min()
    st = rec.steps()
    steps = st[st.phase.isin(["decode", "verify"]) & (st.step >= first) & (st.slot == top.slot)].step
    t = rec.node_timings()
    expected = t[t.step.isin(steps) & (t.plan_index == top.plan_index)].duration_us.sum()
    assert top.total_us == pytest.approx(expected) and top.steps == len(steps)
    assert top.us_per_token == pytest.approx(expected / len(steps))  # one token per decode step
    by_reason = reports.seam_costs(rec, by="reason")
    assert by_reason.us_per_token.is_monotonic_decreasing
    totals = seams.groupby("reason").total_us.sum()
    for r in by_reason.itertuples(index=False):
        assert r.total_us == pytest.approx(totals[r.reason])
        assert r.seams == (seams.reason == r.reason).sum()


def test_seam_costs_with_capture_off_charge_every_node_to_capture_disabled(how, tmp_path):
    rec = _rec("llama-genai", how, tmp_path, capture=False)
    seams = reports.seam_costs(rec)
    assert list(seams.reason) == ["capture_disabled"] and seams.plan_index.iloc[0] == -1
    decode = rec.steps().query("phase == 'decode'").step
    t = rec.node_timings()
    assert seams.total_us.iloc[0] == pytest.approx(t[t.step.isin(decode)].duration_us.sum())
    # the node time's share of the decode steps' wall time (a ratio of two timings: no
    # bound on it holds on a loaded machine, only the identity and that it is a share)
    steps = rec.steps().set_index("step")
    wall_us = float(steps.loc[list(decode), "wall_ms"].sum()) * 1e3
    assert seams.share_of_step.iloc[0] == pytest.approx(seams.total_us.iloc[0] / wall_us)
    assert 0.0 < seams.share_of_step.iloc[0] <= 1.0


def test_the_reports_know_every_documented_decline_reason():
    assert vocabulary.DECLINE_REASONS == DECLINE_REASONS
    assert set(DECLINE_REASONS) <= set(reports.GLOSSARY)


# --------------------------------------------------------------------------- 3. peak values

@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_peak_values_sum_to_the_recorded_peak(name, how, tmp_path):
    rec = _rec(name, how, tmp_path)
    step = reports.peak_step(rec)
    peaks = {s: rec.memory_plan(s).lower_bound for s in rec.steps().step}
    assert peaks[step] == max(peaks.values())
    for s in (None, len(rec) - 1):
        pv = reports.peak_values(rec, s)
        at = step if s is None else s
        assert (pv.step == at).all() and pv.bytes.sum() == peaks[at]
        assert pv.bytes.is_monotonic_decreasing and pv.share.sum() == pytest.approx(1.0)
        lv = rec.liveness_frame()
        lv = lv[lv.step == at].set_index("value")
        # every row owns its bytes; views and aliases appear only under their owner, once
        assert set(lv.loc[pv.value, "storage"]) == {"owner"}
        shared = [v for vs in pv.shared_with for v in vs]
        assert len(shared) == len(set(shared)) and set(lv.loc[shared, "storage"]) <= {"view", "alias"}
        # the value is live at the peak's plan index
        assert ((pv.first_def <= pv.peak_index) & (pv.peak_index <= pv.last_use)).all()
    assert set(pv.kind) <= {"kv", "activation"}


@pytest.mark.parametrize("name", ["llama-onnx", "llama-genai-int4"])
def test_resident_breakdown_explains_memory_against_the_model_file(name, how, tmp_path):
    rec = _rec(name, how, tmp_path)
    rb = reports.resident_breakdown(rec).set_index("category")
    lv = rec.liveness_frame()
    lv = lv[lv.step == len(rec) - 1]
    assert rb.loc["weights", "bytes"] == lv.query("storage == 'initializer'").bytes.sum() > 0
    assert rb.loc["weights", "x_weights"] == 1.0
    parts = list(reports.RESIDENT_CATEGORIES)
    assert rb.loc["total", "bytes"] == rb.loc[parts, "bytes"].sum()
    assert rb.loc[parts, "share"].sum() == pytest.approx(1.0)
    assert rb.loc["kv_cache", "bytes"] > 0 and rb.loc["activations", "bytes"] > 0
    assert rb.loc["activation peak (liveness)", "bytes"] == rec.memory_plan(len(rec) - 1).lower_bound
    assert rb.loc["resident peak (recorded)", "bytes"] == rec.steps().resident_peak_bytes.iloc[-1]


# --------------------------------------------------------------------------- 4. alias hazards

@pytest.mark.parametrize("name", sorted(BUILT_IN))
@pytest.mark.parametrize("kv", ["growing", "fixed"])
def test_no_alias_hazard_in_a_sound_decode(name, kv, how, tmp_path):
    rec = _rec(name, how, tmp_path, kv, compute_in_place=True)
    assert len(rec.aliases()) > 0, "in-place writes happened: the check had something to look at"
    hz = reports.alias_hazards(rec)
    assert hz.empty and list(hz.columns) == reports.HAZARD_COLUMNS


def test_an_injected_in_place_hazard_is_reported(tmp_path):
    rec, _ = _decode("llama-onnx", compute_in_place=True)
    bad = _loaded(rec, tmp_path)
    al = bad.aliases()
    hit = al[al.step == 2].iloc[0]  # value written in place into `into`'s dead buffer at node k
    lv = bad._t["liveness"]
    i = next(i for i, (s, v) in enumerate(zip(lv["step"], lv["value_id"])) if s == 2 and v == hit.into_id)
    lv["last_use"][i] = int(hit.plan_index) + 3  # ...but `into` is still read after the write
    hz = reports.alias_hazards(bad)
    assert len(hz) == 1
    h = hz.iloc[0]
    assert (h.step, h.plan_index, h.write, h.value, h.victim) == (2, hit.plan_index, "in place", hit.value, hit.into)
    assert h.victim_last_use == hit.plan_index + 3 and "still read until plan index" in h.detail
    assert reports.alias_hazards(rec).empty  # the live recording was not touched


def _hand_built(io_rows: list[dict], mode: str = "eager") -> Recording:
    """x -> A (writes a) -> v = view(a) -> B (writes b in place into a) -> C reads v."""
    rec = Recording()
    rec.set_static(
        [dict(plan_index=i, name=n, op_type=op, domain="", kernel="native", produces_view=pv,
              capture_supported=True, capture_reason=None, capture_detail="", inputs=ins, outputs=outs)
         for i, (n, op, pv, ins, outs) in enumerate([
             ("A", "Relu", False, ["x"], ["a"]), ("V", "Reshape", True, ["a"], ["v"]),
             ("B", "Neg", False, ["x"], ["b"]), ("C", "Add", False, ["v", "b"], ["y"])])],
        [dict(value_id=i, name=n, dtype="float", shape="[4]", kind="tensor", role=r) for i, (n, r) in
         enumerate([("x", "input"), ("a", "intermediate"), ("v", "intermediate"), ("b", "intermediate"),
                    ("y", "output")])])
    rec.begin_step(bindings={})
    for p in range(4):
        rec.node(p, mode, 1e-6)
    rows = [(0, "input", 0, 16, -1, 2, False, -1), (1, "owner", 1, 16, 0, 1, True, -1),
            (2, "view", 1, 0, 1, 3, False, -1), (3, "owner", 3, 16, 2, 3, False, -1),
            (4, "owner", 4, 16, 3, 4, False, -1)]
    rec.liveness(rows)
    for r in io_rows:
        rec.add_row("io_buffers", **r)
    rec.end_step(1e-3)
    return rec


def test_hazards_through_shared_addresses_bound_outputs_and_replays():
    assert reports.alias_hazards(_hand_built([])).empty  # without addresses b has its own buffer
    # b is bound to the caller's array, which is the buffer behind a (and its live view v)
    io = [dict(value_id=1, role="output", address=4096, nbytes=16),
          dict(value_id=3, role="bound_output", address=4096, nbytes=16)]
    hz = reports.alias_hazards(_hand_built(io))
    assert list(zip(hz.write, hz.value, hz.victim)) == [("bound output", "b", "v")]
    assert hz.buffer.iloc[0] == "a" and hz.victim_storage.iloc[0] == "view"
    # the same overlap inside a replayed graph (b not bound: its buffer overlaps a's)
    io = [dict(value_id=1, role="output", address=4096, nbytes=16),
          dict(value_id=3, role="output", address=4104, nbytes=16)]
    hz = reports.alias_hazards(_hand_built(io, mode="replayed"))
    assert set(hz.write) == {"replayed"} and "v" in set(hz.victim)


# --------------------------------------------------------------------------- 5. KV growth

@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_kv_growth_in_growing_mode_grows_by_one_per_decode_step(name, how, tmp_path):
    rec = _rec(name, how, tmp_path, "growing")
    pairs = reports.kv_pairs(rec)
    assert len(pairs) >= 4 and set(pairs.past) == {p for p in pairs.past if "past" in p}
    kv = reports.kv_growth(rec)
    assert len(kv) == 2 * len(pairs) * len(rec)
    for (_key, io), g in kv.groupby(["kv", "io"]):
        g = g.sort_values("step")
        decode = g[g.phase == "decode"]
        # the past takes the prompt's rows at the first decode step, then one per step
        assert (decode.growth.iloc[1 if io == "past" else 0:] == 1).all(), (io, decode)
        assert (g.capacity == g.length).all()  # growing: the buffer is exactly full
        assert g.bytes.is_monotonic_increasing
        if io == "present":
            assert g.length.iloc[0] == len(PROMPT) and g.length.iloc[-1] == len(PROMPT) + TOKENS - 1
            assert (g.how == "new buffer").all() and g.moved.all()
    past = kv[kv.io == "past"].set_index(["kv", "step"]).length
    present = kv[kv.io == "present"].set_index(["kv", "step"]).length
    for (key, step), n in past.items():
        if step > 0:
            assert n == present[(key, step - 1)]  # the cache fed is what the last step made


@pytest.mark.parametrize("name", ["llama-genai", "llama-genai-int4", "phi3"])
def test_kv_growth_in_fixed_mode_keeps_the_capacity(name, how, tmp_path):
    rec = _rec(name, how, tmp_path, "fixed")
    _, result = _decode(name, "fixed")
    assert result.shared_buffer
    kv = reports.kv_growth(rec)
    capacity = len(PROMPT) + TOKENS
    assert (kv.capacity == capacity).all()
    for (_key, io), g in kv.groupby(["kv", "io"]):
        g = g.sort_values("step")
        assert (g[g.phase == "decode"].growth.iloc[1 if io == "past" else 0:] == 1).all()
        assert g.bytes.nunique() == 1
        assert (g.free == capacity - g.length).all()
        if io == "present":
            assert (g.how == "bound").all() and (g.copied_bytes == 0).all()


def test_kv_growth_counts_the_concat_copy(how, tmp_path):
    rec = _rec("llama-onnx", how, tmp_path, "growing")
    kv = reports.kv_growth(rec)
    present = kv[(kv.io == "present") & (kv.phase == "decode")]
    past = kv[kv.io == "past"].set_index(["kv", "step"]).bytes
    for r in present.itertuples(index=False):
        assert r.copied_bytes == past[(r.kv, r.step)] > 0  # Concat rewrote the whole past


# --------------------------------------------------------------------------- 6. diff / diff_steps

def test_diff_of_capture_on_and_off_shows_the_segments(how, tmp_path):
    on = _rec("llama-genai", how, tmp_path)
    off, _ = _decode("llama-genai", capture=False)
    d = reports.diff(on, off)
    assert list(d.columns) == reports.DIFF_COLUMNS
    assert list(dict.fromkeys(d.aspect)) == [a for a in reports.DIFF_ASPECTS if a in set(d.aspect)]
    seg = d[d.aspect == "segments"].set_index("item")
    assert seg.loc["captured segments", "a"] > 0 and seg.loc["captured segments", "b"] == 0
    assert seg.loc["captured segments", "changed"] and seg.loc["segment plan", "changed"]
    assert seg.loc["nodes in captured segments", "delta"] < 0
    dec = d[d.aspect == "declines"].set_index("item")
    assert dec.loc["capture_disabled", "a"] == 0 and dec.loc["capture_disabled", "b"] == 1
    cov = d[(d.aspect == "time") & (d.item == "decode time replayed (share)")].iloc[0]
    assert cov.a > 0 and cov.b == 0
    mode = d[d.aspect == "mode"]
    # capture off: nodes run eagerly, or are elided by the memo (the fused Q/K/V's Split
    # is a view the cached view plan reinstates); none is replayed
    assert (mode.a == "replayed").any() and "eager" in set(mode.b) and set(mode.b) <= {"eager", "elided"}
    plan = d[(d.aspect == "plan") & d.changed]
    assert plan.empty, "same model: the plans agree"


def test_diff_of_a_recording_with_itself_changes_nothing(how, tmp_path):
    rec = _rec("phi3", how, tmp_path)
    live, _ = _decode("phi3")
    assert reports.diff(live, rec, changed_only=True).empty


def test_diff_of_two_models_lists_the_plan_differences():
    a, _ = _decode("llama-onnx")
    b, _ = _decode("llama-genai")
    plan = reports.diff(a, b).query("aspect == 'plan'").set_index("item")
    assert plan.loc["nodes", "a"] == len(a.nodes()) and plan.loc["nodes", "b"] == len(b.nodes())
    assert plan.loc["op GroupQueryAttention", "a"] == 0 and plan.loc["op GroupQueryAttention", "b"] > 0
    assert plan.loc["nodes only in b", "b"] > 0


def test_diff_steps_prefill_vs_decode(how, tmp_path):
    rec = _rec("llama-onnx", how, tmp_path)
    d = reports.diff_steps(rec, 0, 1)
    b = d[d.aspect == "bindings"].set_index("item")
    assert (b.loc["sequence_length", "a"], b.loc["sequence_length", "b"]) == (len(PROMPT), 1)
    assert b.loc["past_sequence_length", "changed"] and b.loc["batch_size", "changed"] == False  # noqa: E712
    plan = d[d.aspect == "plan"].set_index("item")
    assert (plan.loc["phase", "a"], plan.loc["phase", "b"]) == ("prefill", "decode")
    shapes = d[d.aspect == "shapes"]
    assert len(shapes) == len(rec.nodes()) and shapes.changed.sum() > len(rec.nodes()) // 2
    gather = shapes[shapes.item == "/model/embed_tokens/Gather"].iloc[0]
    assert gather.a == f"[1, {len(PROMPT)}, 64]" and gather.b == "[1, 1, 64]"
    only = reports.diff_steps(rec, 0, 1, changed_only=True)
    assert only.changed.all() and len(only) < len(d)
    later = reports.diff_steps(rec, len(rec) - 2, len(rec) - 1, changed_only=True)
    assert set(later.query("aspect == 'memo'").item) <= {"reason"}  # replayed, and replayed again


# --------------------------------------------------------------------------- vocabulary, shadow, the report

def test_the_vocabulary_names_every_column_the_calls_return(how, tmp_path):
    rec = _rec("llama-onnx", how, tmp_path)
    frames = {
        "capture_coverage": reports.capture_coverage(rec), "seam_costs": reports.seam_costs(rec),
        "peak_values": reports.peak_values(rec), "alias_hazards": reports.alias_hazards(rec),
        "kv_growth": reports.kv_growth(rec), "diff": reports.diff_steps(rec, 0, 1),
        "resident_breakdown": reports.resident_breakdown(rec),
    }
    readme = (Path(reports.__file__).parent / "README.md").read_text(encoding="utf-8")
    table = {m.group(1) for m in re.finditer(r"^\| `([a-z_0-9<>]+)` \|", readme, re.M)}
    for name, df in frames.items():
        assert f"`reports.{name}" in readme, name
        for col in df.columns:
            generic = re.sub(r"^(replayed|eager|host_fallback|elided)_", "<kind>_", col)
            assert col in table or generic in table, f"{name}: column {col!r} is not in the README's table"
    assert "op_type" in reports.canonical(rec.node_timings(), "node_timings")
    assert "op" not in reports.canonical(rec.views(), "views")
    assert set(reports.COLUMNS) <= table


def test_summary_and_report_say_what_shadow_verification_found(tmp_path):
    rec, _ = _decode("llama-genai", shadow="record")
    checks = rec.shadow_checks()
    assert len(checks) > 0
    s = reports.summary(rec).set_index("metric")
    assert s.loc["shadow verification", "text"] == f"shadow checked {len(checks)} steps, 0 divergences"
    plain, _ = _decode("llama-genai")
    assert reports.summary(plain).set_index("metric").loc["shadow verification", "text"] == reports.NOT_RECORDED
    page = reports.to_html(rec, tmp_path / "r.html").read_text(encoding="utf-8")
    for heading in ("Shadow verification", "Capture coverage", "Seam costs", "Activation peak",
                    "Alias hazards", "KV cache growth", "Prefill vs decode"):
        assert heading in page, heading
    assert f"shadow checked {len(checks)} steps, 0 divergences" in page
    assert '<abbr title="capture decline: a shape references a length' in page  # glossary hover


def test_summary_reports_divergences_when_there_are_some():
    rec = build_recording()
    rec.add_row("shadow", step=3, slot="primary", checked=True, divergences=1, mechanisms=["capture_replay"])
    rec.add_row("divergences", step=3, slot="primary", plan_index=3, node="relu", op_type="Relu", value="g",
                mechanism="capture_replay", max_abs_err=0.5, shape_expected=[3, 4, 2], shape_got=[3, 4, 2])
    s = reports.summary(rec).set_index("metric")
    assert s.loc["shadow verification", "text"] == "shadow checked 1 steps, 1 divergences (capture_replay)"
    assert s.loc["shadow verification", "value"] == 1
    page = reports.render_html(rec)
    assert "capture_replay" in page and "relu" in page
