"""`MemoTimeline`: memo action, Stage-2 state and capture events per step, with latency."""

from __future__ import annotations

import html

import ipywidgets as W

from ..reports import NOT_RECORDED
from ..reports.figures import memo_figure
from ..reports.units import fmt_ms, fmt_rate
from .base import RecordingView
from .figure import FigureHolder
from .model import MemoModel
from .table import PagedTable

__all__ = ["MemoTimeline"]


class MemoTimeline(RecordingView):
    """One lane per mechanism across steps (hover a marker for the reason); per-step wall
    time below. Click any marker or bar to go to that step."""

    def _build(self) -> list[W.Widget]:
        self.model = MemoModel(self.frames)
        self.figure = FigureHolder(max_height=540, follows_step=True)
        self.at_step = W.HTML()
        self.at_step.add_class("wb-memo-at-step")
        self.table = PagedTable(size=12, formatters={"resolve_ms": fmt_ms})
        return [self.figure, self.at_step, self.table]

    def _render(self) -> None:
        c = self.cursor
        missing = self.model.missing()
        self.message.value = "".join(f"<div><i>{html.escape(m)}: {NOT_RECORDED}.</i></div>" for m in missing)
        self.figure.show(memo_figure(self.model.lanes(), self.model.latency(), c.step, missing),
                         self._go, step=c.step)
        at = self.model.at(c.step)
        info = at["info"]
        lat = self.model.latency()
        row = lat[lat["step"] == c.step]
        rate = row["tokens_per_s"].iloc[0] if not row.empty else None
        lines = "".join(f"<li><b>{html.escape(k)}</b> (this step): {html.escape(v)}</li>"
                        for k, v in at["lanes"].items())
        totals = self.model.totals()
        if totals:  # the Summary's numbers are these totals
            lines += ("<li><b>all steps</b> (as the Summary counts): "
                      + ", ".join(f"{html.escape(k)} {v}" for k, v in totals.items()) + "</li>")
        self.at_step.value = (f"<b>step {c.step}</b> · {html.escape(str(info.get('phase') or 'run'))} · "
                              f"{fmt_ms(info.get('wall_ms'))} · {fmt_rate(rate)}<ul>{lines or '<li>—</li>'}</ul>")
        memo = self.frames.optional("memo_timeline")
        if memo is not None:
            step = c.step
            per_step = {c: f"{c} (this step)" for c in ("views_reused", "dispatch_elided") if c in memo}
            self.table.set_frame(memo.drop(columns=[x for x in ("seq",) if x in memo]).rename(columns=per_step),
                                 None, lambda r: r["step"] == step)
        self.table.layout.display = None if memo is not None else "none"

    def _go(self, step) -> None:
        try:
            self.cursor.follow = False
            self.cursor.go(int(step))
        except (TypeError, ValueError):
            pass
