"""`LivenessView`: value lifetimes over the plan at a step, live bytes, peak and bound."""

from __future__ import annotations

import html

import ipywidgets as W

from ..reports.figures import liveness_figure
from ..reports.liveness import MEMORY_MEASURES
from ..reports.source import MEMORY_NOT_RECORDED
from ..reports.units import fmt_bytes
from .base import RecordingView
from .figure import FigureHolder
from .model import LivenessModel

__all__ = ["LivenessView"]


class LivenessView(RecordingView):
    """A Gantt of value lifetimes over plan index at the selected step (owners, pinned
    owners, views, aliases, inputs; released buffers marked), the live-bytes curve
    against one-buffer-per-value, the planner's peak and the lower bound. Click a bar to
    select the node that defines the value."""

    def _build(self) -> list[W.Widget]:
        self.model = LivenessModel(self.frames)
        self.constants = W.Checkbox(value=False, description="show weights and constants", indent=False)
        self.constants.observe(lambda _c: self.render(force=True), names="value")
        self.numbers = W.HTML()
        self.numbers.add_class("wb-memory-numbers")
        self.figure = FigureHolder(max_height=560, follows_step=True)
        return [W.HBox([self.numbers, self.constants]), self.figure]

    def _render(self) -> None:
        c = self.cursor
        if not self.frames.memory:
            self.message.value = f"<i>Liveness: {html.escape(MEMORY_NOT_RECORDED)}.</i>"
            self.numbers.value = ""
            self.figure.layout.display = "none"
            return
        lt = self.model.lifetimes(c.step, self.constants.value)
        mem = self.model.memory(c.step)
        self.message.value = "" if not lt.empty else "<i>No liveness rows were recorded for this step.</i>"
        at = ""
        if c.node >= 0:
            live = self.model.live_at(c.step, c.node)
            at = (f" · at node #{c.node}: {fmt_bytes(live['live_bytes'])} live in "
                  f"{len(live['values'])} values")
        def term(label: str, shown: str | None = None) -> str:  # each number says on hover what it measures
            return f"<abbr title='{html.escape(MEMORY_MEASURES[label], quote=True)}'>{shown or label}</abbr>"

        # every number here is this step's (the Summary's resident peak is the highest step's)
        self.numbers.value = (
            f"<b>step {c.step}</b> (numbers of this step) · {term('planner peak')} "
            f"<b>{fmt_bytes(mem['planner_peak_bytes'])}</b> · "
            f"{term('lower bound')} {fmt_bytes(mem['lower_bound_bytes'])} · {term('one buffer per value')} "
            f"{fmt_bytes(mem['one_buffer_per_value_bytes'])} · {term('resident peak', 'resident peak (this step)')} "
            f"{fmt_bytes(mem['resident_peak_bytes'])}{html.escape(at)}")
        self.figure.show(liveness_figure(lt, self.model.curve(c.step), mem, c.node,
                                                 self.model.highlight(c.node),
                                                 title=f"Buffer liveness at step {c.step}"), self.select_node,
                         step=c.step)
