"""`DiagnosticsView`: the reports' diagnostic calls, one click each, at the selected step."""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as W
import pandas as pd

from ..reports import capture_coverage, kv_growth, seam_costs
from ..reports.figures import coverage_figure, kv_growth_figure, seam_costs_figure
from ..reports.units import fmt_us
from .base import RecordingView, as_frames
from .figure import FigureHolder
from .model import CALLS, DiagnosticsModel
from .table import PagedTable

__all__ = ["DiagnosticsView"]


class DiagnosticsView(RecordingView):
    """Buttons for capture coverage, seam costs, peak values, resident memory, alias
    hazards, KV growth and diff; the chosen call's table (the selected node's rows
    highlighted) and, where it has one, its figure. `compare` (a Recording or its
    directory) makes "diff" compare the two recordings instead of two steps."""

    def __init__(self, source: Any, *, compare: Any = None, **kwargs: Any):
        self._other_frames = as_frames(compare) if compare is not None else None
        super().__init__(source, **kwargs)

    def _build(self) -> list[W.Widget]:
        self.model = DiagnosticsModel(self.frames, self._other_frames)
        self.call = W.ToggleButtons(options=list(CALLS), value="coverage", tooltips=list(CALLS.values()),
                                    style={"button_width": "110px"})
        self.call.add_class("wb-diagnostic-call")
        self.other = W.Dropdown(description="vs step", options=[], layout=W.Layout(width="200px"))
        self.changed_only = W.Checkbox(value=True, description="differences only", indent=False)
        self.headline = W.HTML()
        self.headline.add_class("wb-diagnostic-headline")
        self.figure = FigureHolder(max_height=540)
        self.table = PagedTable(size=15, formatters={"us_per_token": fmt_us, "total_us": fmt_us})
        self._syncing = False
        self.call.observe(lambda _c: self.render(force=True), names="value")
        self.other.observe(lambda _c: None if self._syncing else self.render(force=True), names="value")
        self.changed_only.observe(lambda _c: self.render(force=True), names="value")
        self.diff_controls = W.HBox([self.other, self.changed_only])
        return [self.call, self.diff_controls, self.headline, self.figure, self.table]

    def _render(self) -> None:
        c = self.cursor
        call = self.call.value
        self.message.value = ""
        is_diff = call == "diff"
        self.diff_controls.layout.display = None if is_diff and self._other_frames is None else "none"
        other = None
        if is_diff and self._other_frames is None:
            steps = [int(s) for s in self.frames.get("steps")["step"] if int(s) != c.step]
            self._syncing = True
            try:
                keep = self.other.value
                self.other.options = steps
                default = self.model.default_other(c.step)
                self.other.value = keep if keep in steps and keep != c.step else default
            finally:
                self._syncing = False
            other = self.other.value
        df, headline = self.model.frame(call, c.step, c.slot, other, self.changed_only.value)
        self.headline.value = f"<b>{html.escape(call)}</b> · {html.escape(headline)}"
        fig = self._figure(call)
        self.figure.layout.display = None if fig is not None else "none"
        if fig is not None:
            self.figure.show(fig, self._clicked)
        node, model = c.node, self.model
        shown = df.drop(columns=[x for x in ("value_id",) if x in df])
        page = 0
        if is_diff:  # open on the headline rows (plan, bindings, memo, segments, memory...), after
            # the selected node's rows (those used to open page 3 of 16, near row 200)
            shown = headline_first(shown, [model.matches_node(r, node) for _, r in shown.iterrows()])
        elif node >= 0:  # open the page holding the selected node's first row
            hits = [i for i, (_, r) in enumerate(shown.iterrows()) if model.matches_node(r, node)]
            page = hits[0] // self.table.size if hits and not self.table.query.value else 0
        self.table.set_frame(shown, page, lambda r: model.matches_node(r, node))

    def _figure(self, call: str):
        if call == "coverage":
            return coverage_figure(capture_coverage(self.frames))
        if call == "seam costs":
            by_reason = seam_costs(self.frames, by="reason")
            return seam_costs_figure(by_reason) if not by_reason.empty else None
        if call == "KV growth":
            kv = kv_growth(self.frames)
            return kv_growth_figure(kv) if not kv.empty else None
        return None

    def _clicked(self, value) -> None:
        try:
            step = int(value)
        except (TypeError, ValueError):
            return
        if self.call.value in ("coverage", "KV growth"):
            self.cursor.follow = False
            self.cursor.go(step)

    def show(self, call: str) -> None:
        """Select a call by name (what clicking its button does)."""
        self.call.value = call


def headline_first(diff: pd.DataFrame, selected: list[bool]) -> pd.DataFrame:
    """A diff's rows on one first page: the selected node's few rows (shapes, mode, time),
    then those about the step as a whole, then every other node's."""
    if diff.empty or "aspect" not in diff:
        return diff
    per_node = diff["aspect"].isin(["shapes", "mode", "time"])
    sel = pd.Series(selected, index=diff.index, dtype=bool) if len(selected) == len(diff) else per_node & False
    return pd.concat([diff[per_node & sel], diff[~per_node], diff[per_node & ~sel]])
