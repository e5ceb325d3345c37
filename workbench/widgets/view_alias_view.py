"""`ViewAliasView`: zero-copy views and in-place writes at a step, and a view's walk."""

from __future__ import annotations

import html

import ipywidgets as W

from ..reports.figures import view_walk_figure
from ..reports.source import MEMORY_NOT_RECORDED
from .base import RecordingView
from .figure import FigureHolder
from .model import ViewsModel, explain_walk
from .table import PagedTable

__all__ = ["ViewAliasView"]

_VIEW_COLUMNS = ["value", "source", "shape", "strides", "byte_offset", "op", "plan_index", "contiguous"]


class ViewAliasView(RecordingView):
    """Which values are views of which owners at the step (shape, strides, byte offset),
    in-place aliases, and a drawing of how the chosen view walks its source buffer:
    the source as a grid of elements, each read cell coloured by the view element that
    reads it, a line following the view's order."""

    def _build(self) -> list[W.Widget]:
        self.model = ViewsModel(self.frames)
        self.pick = W.Dropdown(description="view", layout=W.Layout(width="640px", max_width="100%"))
        self.pick.add_class("wb-view-pick")
        # side by side where there is room, the text under the drawing where not (never clipped)
        self.explain = W.HTML(layout=W.Layout(flex="1 1 320px", min_width="0"))
        self.walk_fig = FigureHolder(max_height=520)
        self.walk_fig.layout = W.Layout(flex="2 1 560px", min_width="0", max_width="100%")
        self.views_table = PagedTable(size=12)
        self.alias_table = PagedTable(size=8)
        self._syncing = False
        self._value: str | None = None
        self.pick.observe(self._picked, names="value")
        self.views_head = W.HTML("<b>Views at this step</b>")
        self.views_head.add_class("wb-views-head")
        self.alias_head = W.HTML("<b>In-place writes at this step</b>")
        walk = W.HBox([self.walk_fig, self.explain], layout=W.Layout(flex_flow="row wrap", width="100%"))
        return [self.pick, walk, self.views_head, self.views_table,
                self.alias_head, self.alias_table]

    def _render(self) -> None:
        c = self.cursor
        if not self.frames.memory:
            self.message.value = f"<i>Views and in-place writes: {html.escape(MEMORY_NOT_RECORDED)}.</i>"
            self.walk_fig.layout.display = "none"
            return
        views = self.model.views(c.step)
        node_view = self.model.value_for_node(c.step, c.node) if c.node >= 0 else None
        names = list(views["value"])
        if node_view:
            self._value = node_view
        elif self._value not in names:
            self._value = self.model.default_value(c.step)
        self._syncing = True
        try:
            self.pick.options = [(f"{v} ← {s} ({o})", v) for v, s, o in zip(views["value"], views["source"],
                                                                          views["op"])]
            self.pick.value = self._value if self._value in names else None
        finally:
            self._syncing = False
        self.message.value = "" if names else "<i>No zero-copy views were created at this step.</i>"
        self._render_walk()
        value = self._value
        self.views_table.set_frame(views[_VIEW_COLUMNS], None, lambda r: r["value"] == value)
        aliases = self.model.aliases(c.step)
        self.views_head.value = f"<b>Views at step {c.step}</b> ({len(views)} values that own no bytes)"
        written = int(aliases["written_this_step"].sum()) if len(aliases) else 0
        self.alias_head.value = (f"<b>In-place storage at step {c.step}</b>: {len(aliases)} values live in an "
                                 "earlier value's buffer (the purple alias bars in Liveness); "
                                 f"{written} in-place writes by nodes dispatched this step, the other "
                                 f"{len(aliases) - written} inside replayed device graphs")
        self.alias_table.set_frame(aliases)

    def _render_walk(self) -> None:
        walk = self.model.walk(self.cursor.step, self._value)
        self.walk_fig.layout.display = None if walk else "none"
        if walk is None:
            self.explain.value = ""
            return
        self.walk_fig.show(view_walk_figure(walk))  # the figure shortens the name, shape and strides below
        self.explain.value = ("<div style='max-width:420px;padding-left:10px;overflow-wrap:anywhere'>"
                              + "<br>".join(html.escape(s) for s in explain_walk(walk)) + "</div>")

    def _picked(self, change) -> None:
        if self._syncing or change["new"] is None:
            return
        self._value = change["new"]
        self._render_walk()
        views = self.model.views(self.cursor.step)
        value = self._value
        self.views_table.set_frame(views[_VIEW_COLUMNS], None, lambda r: r["value"] == value)
