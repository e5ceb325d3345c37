"""The Recording: emission API, frames, typed events, memory summary, save/load."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from workbench.trace import (
    BufferEvent,
    InPlaceAlias,
    LivenessRow,
    Materialized,
    NodeExecuted,
    Recording,
    StepBegan,
    StepEnded,
    TableRow,
    TraceError,
    ViewCreated,
)
from workbench.trace.memory import liveness_intervals
from workbench.trace.memory_planner import validate_plan

# A 6-node graph:  h = MatMul(x, w); h_r = Reshape(h) [view]; h_t = Transpose(h_r) [view of h];
# g = Relu(h_t) (needs h_t contiguous); s = Sigmoid(g); y = Add(s, x) computed in place into s.
NODES = [
    dict(plan_index=i, name=name, op_type=op, domain="", kernel="native", produces_view=view,
         capture_supported=ok, capture_reason=None if ok else "data_dependent_shape",
         capture_detail="" if ok else "output shape depends on data", inputs=ins, outputs=outs)
    for i, (name, op, view, ok, ins, outs) in enumerate([
        ("mm", "MatMul", False, True, ["x", "w"], ["h"]),
        ("rs", "Reshape", True, True, ["h"], ["h_r"]),
        ("tr", "Transpose", True, True, ["h_r"], ["h_t"]),
        ("relu", "Relu", False, True, ["h_t"], ["g"]),
        ("sig", "Sigmoid", False, False, ["g"], ["s"]),
        ("add", "Add", False, True, ["s", "x"], ["y"]),
    ])
]
VALUES = [
    dict(value_id=i, name=name, dtype="float32", shape=shape, kind="tensor", role=role)
    for i, (name, shape, role) in enumerate([
        ("x", "[batch, 4]", "input"), ("w", "[4, 8]", "initializer"),
        ("h", "[batch, 8]", "intermediate"), ("h_r", "[batch, 2, 4]", "intermediate"),
        ("h_t", "[batch, 4, 2]", "intermediate"), ("g", "[batch, 4, 2]", "intermediate"),
        ("s", "[batch, 4, 2]", "intermediate"), ("y", "[batch, 4, 2]", "output"),
    ])
]
X, W, H, H_R, H_T, G, S, Y = range(8)
N_NODES = 6


def liveness_rows(unit: int) -> list[tuple]:
    # (value_id, storage, owner_id, nbytes, first_def, last_use, pinned, released_at)
    return [
        (X, "input", X, unit // 2, -1, 5, False, -1),
        (W, "initializer", W, 128, -1, 0, False, -1),
        (H, "owner", H, unit, 0, 1, True, -1),  # its views keep it alive until node 3
        (H_R, "view", H, unit, 1, 2, False, -1),
        (H_T, "view", H, unit, 2, 3, False, -1),
        (G, "owner", G, unit, 3, 4, False, 4),
        (S, "owner", S, 2 * unit, 4, 5, False, -1),
        (Y, "alias", S, 2 * unit, 5, N_NODES, False, -1),
    ]


def emit_step(rec: Recording, batch: int, step_mode: str, **extra) -> int:
    unit = batch * 8 * 4  # bytes of one [batch, 8] float32 activation
    step = rec.begin_step(slot="primary", phase="decode" if batch == 3 else "prefill",
                          bindings={"batch": np.int64(batch)})
    rec.buffer("alloc" if batch == 2 else "reuse", H, unit, 0)
    rec.node(0, step_mode, 10e-6)
    rec.view(H_R, H, (batch, 2, 4), (8, 4, 1), 0, 1)
    rec.buffer("pin", H, unit, 1)
    rec.node(1, "elided" if batch == 3 else "eager", 1e-6)
    rec.view(H_T, H, (batch, 4, 2), (8, 1, 4) if batch == 2 else (8, -1, 0), 0 if batch == 2 else 12, 2)
    rec.node(2, "elided" if batch == 3 else "eager", 1e-6)
    rec.materialize(3, H_T, unit, "non_contiguous_input")
    rec.buffer("alloc", G, unit, 3)
    rec.node(3, step_mode, 4e-6)
    rec.buffer("alloc", S, 2 * unit, 4)
    rec.node(4, "eager", 3e-6)
    rec.buffer("release", G, unit, 4)
    rec.alias(Y, S, 5)
    rec.node(5, step_mode, 2e-6)
    rec.add_row("memo", action="primed" if batch == 2 else "replayed",
                **({"varying": ["batch"]} if batch == 3 else {}))
    rec.liveness(liveness_rows(unit))
    rec.end_step(0.5e-3 * batch, resident_peak_bytes=1000 * batch, **extra)
    return step


@pytest.fixture
def rec() -> Recording:
    r = Recording()
    r.set_static(NODES, VALUES)
    assert emit_step(r, 2, "eager", token=11, text="a") == 0
    assert emit_step(r, 3, "replayed", token=12, text="b", accepted=2) == 1
    r.add_row("segments", start=0, end=2, reason=None, addresses=(1, 2))
    return r


def test_len_and_steps(rec):
    assert len(rec) == 2
    assert rec.current_step == 1 and not rec.step_open
    df = rec.steps()
    assert list(df.columns) == ["step", "slot", "phase", "bindings", "wall_ms", "resident_peak_bytes",
                                "token", "text", "accepted"]
    assert df["step"].tolist() == [0, 1]
    assert df["phase"].tolist() == ["prefill", "decode"]
    assert df["bindings"].tolist() == [{"batch": 2}, {"batch": 3}]
    assert type(df["bindings"][0]["batch"]) is int
    assert df["wall_ms"].tolist() == pytest.approx([1.0, 1.5])
    assert df["resident_peak_bytes"].tolist() == [2000, 3000]
    assert df["token"].tolist() == [11, 12]
    assert df["text"].tolist() == ["a", "b"]
    assert pd.isna(df["accepted"][0]) and df["accepted"][1] == 2  # missing extras read as NA


def test_static_frames(rec):
    nodes = rec.nodes()
    assert list(nodes.columns) == ["plan_index", "name", "op_type", "domain", "kernel", "produces_view",
                                   "capture_supported", "capture_reason", "capture_detail", "inputs",
                                   "outputs"]
    assert nodes["name"].tolist() == ["mm", "rs", "tr", "relu", "sig", "add"]
    assert nodes["produces_view"].tolist() == [False, True, True, False, False, False]
    assert pd.isna(nodes["capture_reason"][3]) and nodes["capture_reason"][4] == "data_dependent_shape"
    assert nodes["inputs"][5] == ["s", "x"]
    values = rec.values()
    assert list(values.columns) == ["value_id", "name", "dtype", "shape", "kind", "role"]
    assert values["name"].tolist() == ["x", "w", "h", "h_r", "h_t", "g", "s", "y"]
    assert values["shape"][0] == "[batch, 4]"


def test_views_frame(rec):
    df = rec.views()
    assert list(df.columns) == ["step", "value", "source", "shape", "strides", "byte_offset", "producer",
                                "op", "value_id", "source_id", "plan_index", "seq"]
    assert df["step"].tolist() == [0, 0, 1, 1]
    assert df["value"].tolist() == ["h_r", "h_t"] * 2
    assert df["source"].tolist() == ["h"] * 4  # flattened: a view's source is always an owner
    assert df["shape"].tolist() == [(2, 2, 4), (2, 4, 2), (3, 2, 4), (3, 4, 2)]
    assert df["strides"].tolist() == [(8, 4, 1), (8, 1, 4), (8, 4, 1), (8, -1, 0)]
    assert df["byte_offset"].tolist() == [0, 0, 0, 12]
    assert df["producer"].tolist() == ["rs", "tr"] * 2
    assert df["op"].tolist() == ["Reshape", "Transpose"] * 2


def test_liveness_frame(rec):
    df = rec.liveness()
    assert df.equals(rec.liveness_frame())
    assert list(df.columns) == ["step", "value", "storage", "owner", "bytes", "first_def", "last_use",
                                "pinned", "released_at", "value_id", "owner_id", "seq"]
    assert len(df) == 16
    s0 = df[df.step == 0].set_index("value")
    assert s0.loc["h_t", "storage"] == "view" and s0.loc["h_t", "owner"] == "h"
    assert s0.loc["y", "owner"] == "s" and s0.loc["y", "last_use"] == N_NODES
    assert s0.loc["h", "pinned"] and s0.loc["g", "released_at"] == 4
    assert s0.loc["x", "first_def"] == -1
    assert df[df.step == 1].set_index("value").loc["s", "bytes"] == 192


def test_liveness_nbytes_patch_is_the_rows_with_those_nbytes():
    """A step passing its last rows with an nbytes patch reads back exactly as if it had
    passed the patched rows; a bad patch is refused at once."""
    rows = ((0, "input", 0, 16, -1, 1, False, -1), (1, "owner", 1, 32, 0, 2, False, -1),
            (2, "view", 1, 0, 1, 2, False, -1))
    patched, plain = Recording(), Recording()
    for nbytes in (None, (48,), (48,), (64,)):
        for r in (patched, plain):
            r.begin_step()
        patched.liveness(rows, None if nbytes is None else ((1,), nbytes))
        plain.liveness(rows if nbytes is None else tuple(
            (v, k, o, nbytes[0] if i == 1 else b, f, lu, pin, rel)
            for i, (v, k, o, b, f, lu, pin, rel) in enumerate(rows)))
        for r in (patched, plain):
            r.end_step(0.0)
    assert patched.liveness().equals(plain.liveness())
    assert patched.liveness().query("value_id == 1").bytes.tolist() == [32, 48, 48, 64]
    r = Recording()
    r.begin_step()
    with pytest.raises(TraceError, match="positions must lie within the 3 rows"):
        r.liveness(rows, ((3,), (8,)))
    with pytest.raises(TraceError, match="2 positions for 1 sizes"):
        r.liveness(rows, ((0, 1), (8,)))


def test_buffer_node_alias_materialize_frames(rec):
    b = rec.buffer_events()
    assert list(b.columns) == ["step", "event", "value", "bytes", "plan_index", "node", "value_id", "seq"]
    assert b[b.step == 0]["event"].tolist() == ["alloc", "pin", "alloc", "alloc", "release"]
    assert b[b.step == 1]["event"].tolist() == ["reuse", "pin", "alloc", "alloc", "release"]
    assert b[b.step == 0]["value"].tolist() == ["h", "h", "g", "s", "g"]
    assert b[b.step == 0]["node"].tolist() == ["mm", "rs", "relu", "sig", "sig"]
    assert b[b.step == 1]["bytes"].tolist() == [96, 96, 96, 192, 96]

    t = rec.node_timings()
    assert list(t.columns) == ["step", "plan_index", "node", "op", "mode", "duration_us", "seq"]
    assert len(t) == 12
    assert t[t.step == 1]["mode"].tolist() == ["replayed", "elided", "elided", "replayed", "eager",
                                               "replayed"]
    assert t["duration_us"].tolist()[:6] == pytest.approx([10, 1, 1, 4, 3, 2])
    assert t["op"].tolist()[:2] == ["MatMul", "Reshape"]

    a = rec.aliases()
    assert list(a.columns) == ["step", "value", "into", "plan_index", "node", "value_id", "into_id", "seq"]
    assert a[["step", "value", "into", "node"]].values.tolist() == [[0, "y", "s", "add"], [1, "y", "s", "add"]]

    m = rec.materializations()
    assert list(m.columns) == ["step", "plan_index", "node", "op", "value", "bytes", "reason", "value_id",
                               "seq"]
    assert m[["step", "node", "value", "bytes", "reason"]].values.tolist() == [
        [0, "relu", "h_t", 64, "non_contiguous_input"], [1, "relu", "h_t", 96, "non_contiguous_input"]]


def test_generic_tables(rec):
    assert rec.tables == ["memo", "segments"]
    memo = rec.table("memo")
    assert list(memo.columns) == ["step", "action", "varying", "seq"]
    assert memo["action"].tolist() == ["primed", "replayed"]
    assert memo["varying"][0] is None and memo["varying"][1] == ["batch"]
    seg = rec.table("segments")
    assert seg["step"].tolist() == [1]  # emitted after step 1 ended: carries the last step begun
    assert seg["addresses"][0] == (1, 2)
    assert rec.table("node_exec")["mode"].tolist()[0] == "eager"  # raw built-in columns
    with pytest.raises(TraceError, match="no table 'nope'"):
        rec.table("nope")


def test_unknown_ids_read_as_hash_id():
    r = Recording()
    r.begin_step()
    r.buffer("alloc", 42, 8, -1)
    r.end_step(0.0)
    b = r.buffer_events()
    assert b["value"].tolist() == ["#42"] and b["node"].tolist() == [""]


def test_seq_replays_emission_order(rec):
    frames = [rec.node_timings(), rec.buffer_events(), rec.views(), rec.aliases(), rec.materializations(),
              rec.liveness(), rec.table("memo"), rec.table("segments")]
    seqs = np.sort(np.concatenate([f["seq"].to_numpy() for f in frames]))
    # everything but the 4 step begin/end events
    assert len(seqs) == rec.n_events - 4 and len(set(seqs)) == len(seqs)
    merged = pd.concat([rec.node_timings().assign(kind="node"), rec.buffer_events().assign(kind="buffer")])
    first = merged.sort_values("seq").head(3)
    assert first["kind"].tolist() == ["buffer", "node", "buffer"]


def test_events_in_emission_order(rec):
    evs = list(rec.events())
    assert len(evs) == rec.n_events
    kinds = [type(e).__name__ for e in evs[:8]]
    assert kinds == ["StepBegan", "BufferEvent", "NodeExecuted", "ViewCreated", "BufferEvent",
                     "NodeExecuted", "ViewCreated", "NodeExecuted"]
    assert evs[0] == StepBegan(0, "primary", "prefill", {"batch": 2})
    assert evs[1] == BufferEvent(0, "alloc", H, 64, 0)
    assert evs[2] == NodeExecuted(0, 0, "eager", 10e-6)
    assert evs[3] == ViewCreated(0, H_R, H, (2, 2, 4), (8, 4, 1), 0, 1)
    assert InPlaceAlias(1, Y, S, 5) in evs
    assert Materialized(0, 3, H_T, 64, "non_contiguous_input") in evs
    assert LivenessRow(1, Y, "alias", S, 192, 5, N_NODES, False, -1) in evs
    ends = [e for e in evs if isinstance(e, StepEnded)]
    assert ends == [StepEnded(0, 1e-3, 2000, {"token": 11, "text": "a"}),
                    StepEnded(1, 1.5e-3, 3000, {"token": 12, "text": "b", "accepted": 2})]
    assert evs[-1] == TableRow("segments", 1, {"step": 1, "start": 0, "end": 2, "reason": None,
                                               "addresses": (1, 2)})
    with pytest.raises(Exception):  # noqa: B017 - frozen dataclass
        evs[2].mode = "elided"


def test_liveness_intervals_extend_owners_through_views_and_aliases():
    rows = liveness_rows(64)
    ivs = {iv.key: (iv.size, iv.start, iv.end) for iv in liveness_intervals(*zip(*[r[:6] for r in rows]))}
    # h is read last by node 1 but its view h_t by node 3; y (alias of s) is a graph output
    assert ivs == {H: (64, 0, 3), G: (64, 3, 4), S: (128, 4, N_NODES)}


def test_memory_summary_hand_computed(rec):
    df = rec.memory_summary()
    assert list(df.columns) == ["step", "one_buffer_per_value_bytes", "planner_peak_bytes",
                                "lower_bound_bytes", "resident_peak_bytes"]
    # step 0 (unit 64): h[0,3]=64, g[3,4]=64, s[4,6]=128 -> one buffer each 256;
    #   live at t=3: h+g=128, t=4: g+s=192 -> lower bound 192; s and h share offset 0, g at 128
    # step 1 (unit 96): 96+96+192=384; t=4: 96+192=288; s@0, h@0, g@192 (64-aligned) -> 288
    assert df["one_buffer_per_value_bytes"].tolist() == [256, 384]
    assert df["lower_bound_bytes"].tolist() == [192, 288]
    assert df["planner_peak_bytes"].tolist() == [192, 288]
    assert df["resident_peak_bytes"].tolist() == [2000, 3000]
    fast = rec.memory_summary(heuristics=["size_first_fit"])
    assert fast["planner_peak_bytes"].tolist() == [192, 288]
    plan = rec.memory_plan(0)
    assert plan.offsets[H] == plan.offsets[S] == 0 and plan.offsets[G] == 128
    from workbench.trace.memory import step_intervals
    validate_plan(step_intervals(rec, 0), plan, 64)


def test_memory_summary_without_liveness_is_na():
    r = Recording()
    r.begin_step()
    r.end_step(0.1, resident_peak_bytes=5)
    df = r.memory_summary()
    assert df["planner_peak_bytes"].isna().all() and df["resident_peak_bytes"].tolist() == [5]


def _all_frames(r: Recording) -> dict[str, pd.DataFrame]:
    return {"steps": r.steps(), "nodes": r.nodes(), "values": r.values(), "views": r.views(),
            "liveness": r.liveness(), "buffer": r.buffer_events(), "timings": r.node_timings(),
            "aliases": r.aliases(), "mat": r.materializations(), "memory": r.memory_summary(),
            **{f"t:{n}": r.table(n) for n in r.tables}}


def test_save_load_round_trip(rec, tmp_path):
    rec.add_row("mixed", a=1, b={"k": [1, 2]}, c=np.float32(0.5), arr=np.arange(3))
    rec.add_row("mixed", a="one", b=None, c=2.0, d=(1, (2, 3)))
    rec.save(tmp_path / "rec")
    meta = json.loads((tmp_path / "rec" / "meta.json").read_text())
    assert meta["format"] == "workbench-recording" and meta["version"] == 1
    back = Recording.load(tmp_path / "rec")
    assert len(back) == 2 and back.tables == ["memo", "segments", "mixed"]
    assert back.current_step == rec.current_step and back.step_open == rec.step_open
    frames, back_frames = _all_frames(rec), _all_frames(back)
    assert frames.keys() == back_frames.keys()
    for name, df in frames.items():
        if name != "t:mixed":  # holds a numpy array, which comes back as a list (see below)
            pd.testing.assert_frame_equal(df, back_frames[name], obj=name)
    def not_mixed(evs):
        return [e for e in evs if not (isinstance(e, TableRow) and e.table == "mixed")]

    assert not_mixed(back.events()) == not_mixed(rec.events())
    assert [type(e) for e in back.events()] == [type(e) for e in rec.events()]
    # exact Python values, tuples stay tuples
    assert back._t == rec._t and back._static == rec._static and back._order == rec._order
    assert back._t["steps"]["bindings"] == [{"batch": 2}, {"batch": 3}]
    assert back.views()["shape"][0] == (2, 2, 4) and type(back.views()["strides"][3]) is tuple
    mixed = back.table("mixed")
    assert mixed["a"].tolist() == [1, "one"]
    assert mixed["b"].tolist() == [{"k": [1, 2]}, None]
    assert mixed["c"].tolist() == [0.5, 2.0]
    assert mixed["arr"].tolist() == [[0, 1, 2], None]  # numpy arrays are stored as lists
    assert mixed["d"].tolist() == [None, (1, [2, 3])]  # outer tuples kept, nested ones become lists
    # a loaded recording keeps recording
    back.begin_step(bindings={"batch": 4})
    back.node(0, "eager", 1e-6)
    back.add_row("memo", action="rebuilt")
    back.end_step(0.1)
    assert len(back) == 3 and back.table("memo")["step"].tolist() == [0, 1, 2]
    assert back.node_timings()["seq"].tolist()[-1] == back.n_events - 3


def test_save_writes_only_non_empty_tables(tmp_path):
    r = Recording()
    r.set_static(NODES, VALUES)
    r.begin_step()
    r.node(0, "eager", 1e-6)
    r.end_step(0.01)
    r.save(tmp_path / "a")
    files = sorted(p.name for p in (tmp_path / "a").glob("*.parquet"))
    assert files == ["event_order.parquet", "node_exec.parquet", "static_nodes.parquet",
                     "static_values.parquet", "steps.parquet"]
    back = Recording.load(tmp_path / "a")
    assert back.views().empty and list(back.views().columns)[:2] == ["step", "value"]
    pd.testing.assert_frame_equal(back.node_timings(), r.node_timings())
    # re-saving a smaller recording into the same directory drops the stale files
    Recording().save(tmp_path / "a")
    assert sorted(p.name for p in (tmp_path / "a").glob("*.parquet")) == []
    empty = Recording.load(tmp_path / "a")
    assert len(empty) == 0 and empty.nodes().empty


def test_load_rejects_foreign_directories(tmp_path):
    with pytest.raises(TraceError, match="meta.json is missing"):
        Recording.load(tmp_path)
    (tmp_path / "meta.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(TraceError, match="format"):
        Recording.load(tmp_path)


def test_clear(rec):
    rec.clear()
    assert len(rec) == 0 and rec.n_events == 0 and rec.tables == [] and rec.current_step == -1
    assert not rec.nodes().empty  # static tables survive a plain clear
    assert rec.begin_step() == 0
    rec.node(1, "eager", 1e-6)
    rec.end_step(0.0)
    assert rec.node_timings()["node"].tolist() == ["rs"]
    rec.clear(static=True)
    assert rec.nodes().empty and rec.values().empty


def test_misuse_is_reported():
    r = Recording()
    with pytest.raises(TraceError, match="without an open step"):
        r.end_step(0.0)
    r.begin_step()
    with pytest.raises(TraceError, match="clash"):
        r.end_step(0.0, wall_ms=3)
    with pytest.raises(TraceError, match="4 fields; expected 8"):
        r.liveness([(1, "owner", 1, 8)])
    with pytest.raises(TraceError, match="table name"):
        r.add_row("../evil", a=1)
    with pytest.raises(TraceError, match="built-in"):
        r.add_row("liveness", a=1)
    with pytest.raises(TraceError, match="reserved"):
        r.add_row("memo", seq=1)
    assert r.tables == [] and r.n_events == 1
    r.end_step(0.0)
    with pytest.raises(TraceError, match="without an open step"):
        r.end_step(0.0)


def test_events_outside_steps_carry_minus_one():
    r = Recording()
    r.buffer("pin", 1, 8, -1)
    assert r.buffer_events()["step"].tolist() == [-1]
    r.begin_step()
    assert math.isnan(r.steps()["wall_ms"][0])  # still open


def test_emitting_never_imports_pandas():
    code = (
        "import sys\n"
        "from workbench.trace import Recording\n"
        "before = 'pandas' in sys.modules or 'pyarrow' in sys.modules\n"
        "r = Recording(); r.set_static([], []); r.begin_step(bindings={'n': 1})\n"
        "r.node(0, 'eager', 1e-6); r.buffer('alloc', 0, 8, 0); r.view(1, 0, (2,), (1,), 0, 0)\n"
        "r.alias(2, 0, 1); r.materialize(1, 1, 8, 'x'); r.add_row('t', a=1)\n"
        "r.liveness([(0, 'owner', 0, 8, 0, 1, False, -1)]); r.end_step(0.1, token=3)\n"
        "list(r.events())\n"
        "assert before or ('pandas' not in sys.modules and 'pyarrow' not in sys.modules)\n"
        "assert 'plotly' not in sys.modules and 'ipywidgets' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_node_span_reads_as_one_node_row_each_in_order():
    """A replayed segment's span (kept as one entry while emitting) reads back exactly as
    one `node` call per plan index, in emission order with the events around it; the
    indices are taken as they were at the call."""
    spanned, one_by_one = Recording(), Recording()
    nodes = [4, 5, 6]
    for r in (spanned, one_by_one):
        r.begin_step()
        r.node(0, "eager", 1e-6)
        r.buffer("alloc", 7, 8, 0)
    spanned.node_span(nodes, "replayed", 3e-6)
    for k in nodes:
        one_by_one.node(k, "replayed", 1e-6)
    nodes.append(9)  # changed afterwards: not what was recorded
    for r in (spanned, one_by_one):
        r.node(8, "elided", 0.0)
        r.node_span([], "replayed", 1.0)  # no nodes: no rows
        r.end_step(1e-3)
        r.begin_step()
    spanned.node_span([1, 2], "replayed", 4e-6)
    one_by_one.node(1, "replayed", 2e-6)
    one_by_one.node(2, "replayed", 2e-6)
    a, b = spanned.node_timings(), one_by_one.node_timings()
    pd.testing.assert_frame_equal(a, b)
    assert a["plan_index"].tolist() == [0, 4, 5, 6, 8, 1, 2]
    assert list(spanned.events()) == list(one_by_one.events())
    spanned.node_span([3], "replayed", 1e-6)  # emitted after a read: laid out on the next read
    assert spanned.node_timings()["plan_index"].tolist()[-1] == 3


def test_buffer_and_view_spans_are_the_rows_of_single_calls():
    """A replayed segment hands its pins and views over as one span each: every table,
    and the events in emission order, are what one `buffer` / `view` call per row in
    the same order gives, across steps and between other events."""
    pins = (("pin", 3, 0, 1), ("pin", 7, 0, 4))
    views = ((4, 3, (2, 4), (4, 1), 0, 1), (5, 3, (4, 2), (1, 4), 0, 2), (8, 7, (8,), (1,), 16, 4))
    spans, singles = Recording(), Recording()
    for step in range(3):
        for r in (spans, singles):
            r.begin_step(phase="decode")
            r.node(0, "eager", 1e-6)
        spans.buffer_span(pins[step % 2:])
        spans.view_span(views)
        for row in pins[step % 2:]:
            singles.buffer(*row)
        for row in views:
            singles.view(*row)
        for r in (spans, singles):
            r.node_span([1, 2, 4], "replayed", 3e-6)
            r.buffer("alloc", 9, 64, 5)
            r.end_step(1e-3)
    spans.buffer_span(())  # nothing: no rows, no events
    spans.view_span(())
    assert spans.n_events == singles.n_events
    for frame in ("buffer_events", "views", "node_timings"):
        pd.testing.assert_frame_equal(getattr(spans, frame)(), getattr(singles, frame)())
    assert list(spans.events()) == list(singles.events())
    assert len(spans.views()) == 9 and (spans.buffer_events().event == "pin").sum() == 5


def test_buffer_rows_are_the_rows_of_single_calls():
    """A memo-replayed step hands the buffer events of its preallocation over as one
    flat block of fields: every table and the events in emission order are what one
    `buffer` call per row gives; fields that are not whole rows are refused."""
    rows = (("alloc", 3, 64, 1), ("reuse", 7, 32, 4), ("alloc", 9, 128, 6))
    flat, singles = Recording(), Recording()
    for step in range(3):
        for r in (flat, singles):
            r.begin_step(phase="decode")
            r.node(0, "eager", 1e-6)
        flat.buffer_rows(tuple(field for row in rows[step % 2:] for field in row))
        for row in rows[step % 2:]:
            singles.buffer(*row)
        for r in (flat, singles):
            r.buffer("release", 9, 128, 7)
            r.end_step(1e-3)
    flat.buffer_rows(())  # nothing: no rows, no events
    assert flat.n_events == singles.n_events
    pd.testing.assert_frame_equal(flat.buffer_events(), singles.buffer_events())
    assert list(flat.events()) == list(singles.events())
    assert flat.buffer_events().event.tolist()[:4] == ["alloc", "reuse", "alloc", "release"]
    with pytest.raises(TraceError, match="not whole rows of 4"):
        flat.buffer_rows(("alloc", 3, 64))


def test_node_spans_and_flat_rows_are_the_rows_of_single_calls():
    """A replayed segment's node span is one `node` row per index, the duration shared
    evenly; `add_flat_rows` is `add_rows` with the fields one after another: the same
    tables and events, between other events and across steps."""
    columns = ("value_id", "role", "address", "nbytes")
    rows = ((1, "feed", 4096, 16), (2, "output", 8192, 64))
    spans, singles = Recording(), Recording()
    for step in range(3):
        for r in (spans, singles):
            r.begin_step(phase="decode")
            r.alias(5, 4, 2)
        spans.node_span((1, 2, 4), "replayed", 3e-6)
        spans.add_flat_rows("io_buffers", columns, tuple(f for row in rows[step % 2:] for f in row))
        for k in (1, 2, 4):
            singles.node(k, "replayed", 1e-6)
        singles.add_rows("io_buffers", columns, list(rows[step % 2:]))
        for r in (spans, singles):
            r.materialize(3, 6, 32, "kernel needs a contiguous input")
            r.end_step(1e-3)
    assert spans.n_events == singles.n_events
    for frame in ("node_timings", "aliases", "materializations"):
        pd.testing.assert_frame_equal(getattr(spans, frame)(), getattr(singles, frame)())
    pd.testing.assert_frame_equal(spans.table("io_buffers"), singles.table("io_buffers"))
    assert list(spans.events()) == list(singles.events())
    assert len(spans.table("io_buffers")) == 5
    with pytest.raises(TraceError, match="not whole rows"):
        spans.add_flat_rows("io_buffers", columns, (1, "feed", 4096))


def test_emitting_keeps_no_object_per_row_for_the_garbage_collector():
    """Each kept container counts towards the garbage collector's next young collection;
    a traced decode step emits a hundred rows or more, so a row must not keep one."""
    import gc

    rec = Recording()
    rec.begin_step(phase="decode")
    indices = tuple(range(40))
    flat = tuple(range(6 * 50))
    columns = ("a", "b", "c", "d", "e", "f")
    gc.disable()
    try:
        before = gc.get_count()[0]
        for k in range(1000):
            rec.node(k, "eager", 1e-6)
            rec.buffer("alloc", k, 64, k)
            rec.alias(k, k + 1, k)
            rec.materialize(k, k, 64, "copy")
        for _ in range(50):
            rec.node_span(indices, "replayed", 1e-5)
            rec.add_flat_rows("io_buffers", columns, flat)
        kept = gc.get_count()[0] - before
    finally:
        gc.enable()
    assert kept < 300, f"{kept} containers kept for 4,000 rows and 100 spans"
    assert len(rec.node_timings()) == 1000 + 50 * 40 and len(rec.table("io_buffers")) == 50 * 50


def _emit_every_kind(rec, nodes):
    """Two steps where node rows (through `nodes(rec, triples)`) sit between every
    other kind of event, and before and after the steps' bounds."""
    nodes(rec, [(0, "eager", 1e-6)])  # before the first step
    rec.begin_step(bindings={"n": 1})
    nodes(rec, [(1, "eager", 2e-6), ((2, 3, 4), "replayed", 3e-6)])
    rec.buffer("alloc", 7, 8, 1)
    nodes(rec, [(5, "elided", 0.0)])
    rec.buffer_span((("pin", 7, 0, 5),))
    nodes(rec, [(6, "eager", 1e-6)])
    rec.buffer_rows(("reuse", 8, 16, 6))
    nodes(rec, [(7, "eager", 1e-6)])
    rec.view(9, 7, (2,), (1,), 0, 7)
    nodes(rec, [(8, "eager", 1e-6)])
    rec.view_span(((10, 7, (2,), (1,), 8, 8),))
    nodes(rec, [(9, "eager", 1e-6)])
    rec.alias(11, 8, 9)
    nodes(rec, [(10, "eager", 1e-6)])
    rec.materialize(10, 9, 8, "kernel needs a contiguous input")
    nodes(rec, [((11, 12), "replayed", 2e-6)])
    rec.add_row("memo", action="replayed")
    nodes(rec, [(13, "eager", 1e-6)])
    rec.add_rows("capture_segments", ("segment",), [(0,)])
    nodes(rec, [(14, "eager", 1e-6)])
    rec.add_flat_rows("io_buffers", ("value_id", "role"), (1, "feed"))
    nodes(rec, [(15, "eager", 1e-6)])
    rec.liveness([(7, "owner", 7, 8, 1, 9, True, -1)])
    nodes(rec, [(16, "eager", 1e-6)])
    rec.end_step(1e-3)
    nodes(rec, [(17, "eager", 1e-6)])  # after the step ended: still that step's
    rec.begin_step()
    nodes(rec, [(18, "eager", 1e-6)])
    rec.end_step(1e-3)


def _one_call_each(rec, triples):
    for k, mode, duration in triples:
        (rec.node_span if type(k) is tuple else rec.node)(k, mode, duration)


def _through_the_log(rec, triples):
    log = rec.node_log()
    for triple in triples:
        log += triple


def test_node_rows_through_the_log_take_their_place_among_the_events(tmp_path):
    """Node rows extended onto `node_log` between other events read back exactly as one
    `node` / `node_span` call each: the same rows, steps and interleaving (`events()`,
    every frame's `seq`), also after a save and load."""
    logged, called = Recording(), Recording()
    _emit_every_kind(logged, _through_the_log)
    _emit_every_kind(called, _one_call_each)
    node = "NodeExecuted"
    assert [(type(e).__name__, getattr(e, "plan_index", None)) for e in logged.events()] == [
        (node, 0), ("StepBegan", None), (node, 1), (node, 2), (node, 3), (node, 4),
        ("BufferEvent", 1), (node, 5), ("BufferEvent", 5), (node, 6), ("BufferEvent", 6), (node, 7),
        ("ViewCreated", 7), (node, 8), ("ViewCreated", 8), (node, 9), ("InPlaceAlias", 9), (node, 10),
        ("Materialized", 10), (node, 11), (node, 12), ("TableRow", None), (node, 13), ("TableRow", None),
        (node, 14), ("TableRow", None), (node, 15), ("LivenessRow", None), (node, 16),
        ("StepEnded", None), (node, 17), ("StepBegan", None), (node, 18), ("StepEnded", None)]
    assert list(logged.events()) == list(called.events())
    assert logged.n_events == called.n_events == len(list(called.events()))
    pd.testing.assert_frame_equal(logged.node_timings(), called.node_timings())
    pd.testing.assert_frame_equal(logged.buffer_events(), called.buffer_events())
    pd.testing.assert_frame_equal(logged.table("io_buffers"), called.table("io_buffers"))
    nodes = logged.node_timings()
    assert nodes["plan_index"].tolist() == [0, 1, 2, 3, 4, *range(5, 19)]
    assert nodes["step"].tolist() == [-1] + [0] * 17 + [1]
    logged.save(tmp_path / "logged")
    back = Recording.load(tmp_path / "logged")
    assert list(back.events()) == list(called.events())



def test_blocks_of_logged_rows_read_back_as_one_call_each_between_reads(tmp_path):
    """A traced step places its logged rows a run of eager nodes at a time, as one block
    each, written out row by row only when read. Runs of one to five rows (spans among
    them) between other events, over steps read part-way (events, n_events and frames
    after some steps, then more steps, then a clear and more): every read as one call
    each would give, and after a save and load."""
    logged, called = Recording(), Recording()
    runs = [[(1, "eager", 1e-6), (2, "eager", 2e-6)],
            [((3, 4, 5), "replayed", 3e-6), (6, "eager", 1e-6), ((7, 8), "replayed", 2e-6)],
            [(9, "elided", 0.0)],
            [(10, "eager", 1e-6), (11, "eager", 1e-6), (12, "eager", 1e-6), (13, "eager", 1e-6),
             ((14,), "replayed", 1e-6)]]

    def step(rec, nodes, n):
        rec.begin_step(bindings={"n": n})
        for i, run in enumerate(runs):
            nodes(rec, run)
            (rec.buffer("alloc", i, 8 * n, i) if i % 2 else rec.view(i, 0, (n,), (1,), 0, i))
        rec.liveness([(0, "owner", 0, 8 * n, 0, 9, False, -1)])
        nodes(rec, runs[1])
        rec.end_step(1e-3)

    def same():
        assert list(logged.events()) == list(called.events())
        assert logged.n_events == called.n_events
        pd.testing.assert_frame_equal(logged.node_timings(), called.node_timings())
        pd.testing.assert_frame_equal(logged.views(), called.views())

    for n in range(3):
        step(logged, _through_the_log, n)
        step(called, _one_call_each, n)
    same()
    for n in range(3, 7):
        step(logged, _through_the_log, n)
        step(called, _one_call_each, n)
        if n == 4:
            same()
    same()
    assert len(logged.node_timings()) == 7 * (2 + 6 + 1 + 5 + 6)  # every row of every run, spans in full
    logged.save(tmp_path / "logged")
    assert list(Recording.load(tmp_path / "logged").events()) == list(called.events())
    for rec in (logged, called):
        rec.clear()
    step(logged, _through_the_log, 9)
    step(called, _one_call_each, 9)
    same()

def test_node_rows_still_logged_are_placed_by_any_read_and_dropped_by_clear():
    """A read between two events sees the logged rows (they are placed, in order, on
    reading); `clear` drops rows not yet placed with everything else."""
    rec = Recording()
    rec.begin_step()
    log = rec.node_log()
    log += (3, "eager", 1e-6)
    assert rec.n_events == 2
    assert rec.node_timings()["plan_index"].tolist() == [3]
    log += ((4, 5), "replayed", 2e-6)
    assert [type(e).__name__ for e in rec.events()] == ["StepBegan"] + ["NodeExecuted"] * 3
    log += (6, "eager", 1e-6)
    rec.clear()
    assert rec.n_events == 0 and rec.node_log() is log and not log
    rec.begin_step()
    rec.end_step(1e-3)
    assert rec.node_timings().empty


def test_view_buffer_and_alias_rows_logged_among_node_rows_keep_their_place_and_fields():
    """View, buffer and alias rows emitted while node rows wait in the log (a traced
    step's layout nodes): every frame holds the rows with their steps and fields, and
    `seq` and `events()` give the order of the calls, across steps and a read part-way."""
    rec = Recording()
    expected = []
    for step in range(3):
        rec.begin_step()
        expected.append("StepBegan")
        log = rec.node_log()
        for k in range(4):
            log += (10 * step + k, "eager", 1e-6)
            rec.buffer("pin", k, 0, 10 * step + k)
            rec.view(100 + k, k, (1, step + 1), (step + 1, 1), 4 * k, 10 * step + k)
            rec.alias(200 + k, 100 + k, 10 * step + k)
            expected += ["NodeExecuted", "BufferEvent", "ViewCreated", "InPlaceAlias"]
        log += ((10 * step + 4, 10 * step + 5), "replayed", 2e-6)
        expected += ["NodeExecuted"] * 2
        if step == 1:  # a read part-way places what waits
            assert len(rec.views()) == 8
        rec.end_step(1e-3)
        expected.append("StepEnded")
    assert [type(e).__name__ for e in rec.events()] == expected
    views = rec.views()
    assert views["step"].tolist() == [s for s in range(3) for _ in range(4)]
    assert views["value_id"].tolist() == [100, 101, 102, 103] * 3
    assert [tuple(x) for x in views["shape"]] == [(1, s + 1) for s in range(3) for _ in range(4)]
    assert views["byte_offset"].tolist() == [0, 4, 8, 12] * 3
    buffers = rec.buffer_events()
    assert buffers["event"].tolist() == ["pin"] * 12 and buffers["plan_index"].tolist() == [
        10 * s + k for s in range(3) for k in range(4)]
    aliases = rec.aliases()
    assert aliases["value_id"].tolist() == [200, 201, 202, 203] * 3
    nodes = rec.node_timings()
    seq = pd.concat([nodes.assign(kind="node"), buffers.assign(kind="buffer"), views.assign(kind="view"),
                     aliases.assign(kind="alias")]).sort_values("seq")
    assert seq["kind"].tolist()[:6] == ["node", "buffer", "view", "alias", "node", "buffer"]
    assert nodes["plan_index"].tolist() == [10 * s + k for s in range(3) for k in range(6)]
