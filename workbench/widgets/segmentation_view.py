"""`SegmentationView`: captured segments and eager seams per step; declines by reason."""

from __future__ import annotations

import html

import ipywidgets as W

from ..reports import NOT_RECORDED, retire_markers
from ..reports.figures import declines_figure, segments_figure
from .base import RecordingView
from .figure import FigureHolder
from .model import SegmentationModel
from .table import PagedTable

__all__ = ["SegmentationView"]

_ALL = "all reasons"


class SegmentationView(RecordingView):
    """Segments of every step of the slot (the selected step boxed, its declines ✕),
    declines by reason (click a bar to filter the table), a filterable declines table,
    and the selected seam's node, reason code, detail and symbols."""

    def _build(self) -> list[W.Widget]:
        self.model = SegmentationModel(self.frames)
        self.segments_fig = FigureHolder(max_height=480, follows_step=True)
        self.reasons_fig = FigureHolder(max_height=320, follows_step=True)
        self.reason = W.Dropdown(options=[_ALL], value=_ALL, description="reason", layout=W.Layout(width="320px"))
        self.seam_pick = W.Dropdown(options=[("(select a seam)", -1)], value=-1, description="seam",
                                    layout=W.Layout(width="520px"))
        self.table = PagedTable(size=15)
        self.detail = W.HTML()
        self.detail.add_class("wb-seam-detail")
        self._syncing = False
        self.reason.observe(lambda _c: self._reason_changed(), names="value")
        self.seam_pick.observe(self._seam_picked, names="value")
        return [self.segments_fig, self.reasons_fig, W.HBox([self.reason, self.seam_pick]), self.detail,
                self.table]

    def _render(self) -> None:
        c = self.cursor
        recorded = self.model.recorded
        self.segments_fig.layout.display = None if recorded else "none"
        self.message.value = "" if recorded else (
            f"<b>Capture segmentation: {NOT_RECORDED}.</b> Shown instead: the plan's static capture "
            "verdicts (which nodes could never be captured, and why).")
        if recorded:
            segs = self.model.segments_per_step(c.slot)
            self.segments_fig.show(segments_figure(
                segs, self.model.declines(c.step, c.slot), c.step, c.node,
                title=f"Capture segments per step · slot {html.escape(c.slot)}",
                retires=retire_markers(self.frames, c.slot)), self.select_node, step=c.step)
        reasons = self.model.reasons(c.step, c.slot)
        title = f"Declines by reason at step {c.step}" if recorded else "Static verdicts by reason"
        self.reasons_fig.show(declines_figure(reasons, title), self._reason_clicked, step=c.step)
        self._syncing = True
        try:
            keep = self.reason.value
            self.reason.options = [_ALL] + [str(r) for r in reasons["reason"]]
            self.reason.value = keep if keep in self.reason.options else _ALL
            self._fill_seams()
        finally:
            self._syncing = False
        self._render_table()
        self.detail.value = seam_html(self.model.seam(c.step, c.slot, c.node)) if c.node >= 0 else ""

    def _fill_seams(self) -> None:
        """The seam picker lists the seams of the chosen reason (all of them for "all reasons")."""
        c = self.cursor
        reason = None if self.reason.value == _ALL else self.reason.value
        rows = self.model.table(c.step, c.slot, reason, size=10_000).rows
        options = [("(select a seam)", -1)] + [
            (f"#{int(p)} {o} {n} — {r}", int(p)) for p, o, n, r in
            zip(rows["plan_index"], rows["op_type"], rows["node"], rows["reason"]) if int(p) >= 0]
        self.seam_pick.options = options
        self.seam_pick.value = c.node if c.node in {v for _, v in options} else -1

    def _reason_changed(self) -> None:
        if self._syncing:
            return
        self._syncing = True
        try:
            self._fill_seams()
        finally:
            self._syncing = False
        self._render_table()

    def _render_table(self) -> None:
        c = self.cursor
        reason = None if self.reason.value == _ALL else self.reason.value
        rows = self.model.table(c.step, c.slot, reason, size=10_000).rows
        node = c.node
        page = None  # the page holding the selected seam's row (unless a filter is typed)
        if node >= 0 and not self.table.query.value and "plan_index" in rows:
            at = [i for i, p in enumerate(rows["plan_index"]) if p == node]
            page = at[0] // self.table.size if at else None
        self.table.set_frame(rows, page, lambda r: r.get("plan_index") == node)

    def _reason_clicked(self, reason) -> None:
        r = html.unescape(str(reason))  # the figure carries the escaped text
        if r in self.reason.options:
            self.reason.value = r

    def _seam_picked(self, change) -> None:
        if not self._syncing and change["new"] is not None and change["new"] >= 0:
            self.cursor.select_node(change["new"])


def seam_html(d: dict | None) -> str:
    if d is None:
        return "<i>The selected node is not a seam at this step: it runs inside a captured segment.</i>"
    e = html.escape
    symbols = ", ".join(e(str(s)) for s in d["symbols"]) or "—"
    seg = "—" if d["segment"] is None else str(d["segment"])
    return (f"<div style='border-left:3px solid #ff7f0e;padding-left:8px'><b>#{d['plan_index']} {e(str(d['node']))}"
            f"</b> ({e(str(d['op_type']))})<br>reason code: <code>{e(str(d['reason']))}</code> "
            f"<span style='color:#777'>({e(d['source'])})</span><br>detail: {e(str(d['detail']))}<br>"
            f"symbols: {symbols}<br>segment: {seg}</div>")
