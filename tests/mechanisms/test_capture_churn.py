"""Capture churn is a first-class diagnostic: which segments were recorded again and
why, in a frame, in the summary, the HTML report and the segmentation figure (the
retire reason written beside its marker, not only in a hover); seam costs and
coverage answer for plain `session.run` loops (no Generator, no phase) too."""

from __future__ import annotations

import numpy as np
import pytest
from test_capture_holds import range_positions, sliding_window

import workbench
from workbench import SessionOptions, reports
from workbench.reports import figures
from workbench.trace import Recording


def _plain_loop(proto, feeds_of, runs: int = 16) -> workbench.InferenceSession:
    session = workbench.InferenceSession(proto.SerializeToString(), options=SessionOptions(trace=True))
    for run in range(runs):
        session.run(None, feeds_of(run))
    return session


@pytest.fixture(scope="module")
def churning():
    """A view at a moving offset read by the layers: retired three times, then kept eager."""
    return _plain_loop(sliding_window(), lambda r: {"start": np.array([(7 * r) % 60], np.int64)}).recording


@pytest.fixture(scope="module")
def holding():
    return _plain_loop(range_positions(), lambda r: {"input_ids": np.array([[r % 30]], np.int64),
                                                     "position": np.array([5 + r], np.int64)}).recording


def test_the_churn_frame_names_the_segment_its_records_and_the_reason(churning):
    churn = reports.capture_churn(churning)
    assert list(churn.columns) == reports.CHURN_COLUMNS
    top = churn.iloc[0]
    assert (top.captures, top.re_records, top.retires, top.replays) == (3, 2, 3, 0)
    assert top.top_retire_reason == "binding_changed: row address"
    assert top.retire_reasons == "binding_changed: row address: 3"
    assert bool(top.limited) and top.first_node <= top.last_node and top.capture_ms > 0


def test_the_summary_says_which_segment_re_recorded_and_why(churning, holding):
    s = reports.summary(churning).set_index("metric")
    assert s.loc["segments re-recorded", "value"] == 1
    line = reports.summary(churning).query("metric == 're-recorded'")["text"].iloc[0]
    assert "retired 3 times (binding_changed: row address: 3)" in line and "re-recorded 2 times" in line
    assert "rerecord_limit" in line
    assert "re-recorded 2 times" in reports.summary_text(churning)
    quiet = reports.summary(holding).set_index("metric")
    assert quiet.loc["segments re-recorded", "value"] == 0
    assert quiet.loc["segments re-recorded", "text"].startswith("none")
    assert reports.churn_lines(holding) == []


def test_the_html_report_has_a_churn_section_and_prints_the_retire_reason(churning):
    page = reports.render_html(churning)
    assert "Capture churn" in page
    assert "re-recorded 2 times" in page
    assert "retired: binding_changed: row address" in page  # beside the marker in the figure


def test_the_segmentation_figure_writes_each_retire_reason_beside_its_marker(churning):
    markers = reports.retire_markers(churning, "primary")
    assert len(markers) == 3 and set(markers["label"]) == {"retired: binding_changed: row address"}
    seg = churning.segments()
    fig = figures.segments_figure(seg, retires=markers)
    retire = [t for t in fig.data if t.name == "retire"]
    assert retire and retire[0].mode == "markers+text"
    assert list(retire[0].text) == list(markers["label"])


def test_seam_costs_and_coverage_answer_for_a_plain_run_loop(holding):
    assert set(holding.steps()["phase"]) == {""}
    costs = reports.seam_costs(holding, by="reason")
    assert not costs.empty and set(costs["reason"]) >= {"host_read"}
    cov = reports.decode_coverage(holding)
    assert cov["steps"] == 16 and cov["time_share"] is not None and cov["time_share"] > 0


def test_churn_reads_the_same_from_a_saved_recording(churning, tmp_path):
    path = tmp_path / "churn.rec"
    churning.save(path)
    again = Recording.load(path)
    a, b = reports.capture_churn(churning), reports.capture_churn(again)
    assert a[["captures", "retires", "re_records", "retire_reasons", "limited"]].equals(
        b[["captures", "retires", "re_records", "retire_reasons", "limited"]])
