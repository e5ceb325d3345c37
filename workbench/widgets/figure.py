"""Putting a freshly built plotly figure into a long-lived `FigureWidget`."""

from __future__ import annotations

from collections.abc import Callable

import ipywidgets as W
import plotly.graph_objects as go

__all__ = ["FigureHolder", "show_figure"]


class FigureHolder(W.VBox):
    """A full-width slot for one plotly `FigureWidget`, made on the first `show()`.

    A FigureWidget carries plotly.js itself (about 5 MB of JavaScript the browser must
    receive and evaluate per widget), so a workbench that made all of its figures up
    front appeared only seconds after the cell ran. Made lazily, only the figures of
    the tabs a person opens exist; views render only while shown, so a figure is first
    drawn inside a visible container and is sized to it.
    """

    def __init__(self) -> None:
        self.widget: go.FigureWidget | None = None
        super().__init__([], layout=W.Layout(width="100%"))
        self.add_class("wb-figure")

    def show(self, fig: go.Figure, on_click: Callable[[object], None] | None = None) -> None:
        if self.widget is None:
            self.widget = go.FigureWidget(layout={"template": "plotly_white", "height": 120})
            self.children = [self.widget]
        show_figure(self.widget, fig, on_click)


def show_figure(fw: go.FigureWidget, fig: go.Figure, on_click: Callable[[object], None] | None = None) -> None:
    """Make `fw` show `fig`, in as few front-end redraws as possible.

    Traces like the ones shown (same position, type and properties set) are restyled
    in place, in one batched restyle + relayout: one redraw. Only the traces after the
    first that differs are deleted (before the relayout) or added (after it), each a
    redraw of its own. `on_click(customdata)` is called with the clicked point's
    customdata (the plan index or step the figure put there).
    """
    layout = fig.layout.to_plotly_json()
    for key in ("shapes", "annotations"):
        layout.setdefault(key, [])
    if fw.layout.template is not None and fw.layout.template == fig.layout.template:
        layout.pop("template", None)  # already there: do not resend it on every step
    new = [t.to_plotly_json() for t in fig.data]
    old = [t.to_plotly_json() for t in fw.data]
    kept = 0  # leading traces of the same type and properties: restyled in place
    for a, b in zip(old, new):
        # a FigureWidget gives each of its traces a `uid`; a fresh figure's traces have none
        if a.get("type") != b.get("type") or set(a) - {"uid"} != set(b) - {"uid"}:
            break
        kept += 1
    if kept < len(old):  # each deletion or addition is a full plotly.js redraw
        fw.data = fw.data[:kept]
    with fw.batch_update():
        for trace, data in zip(fw.data, new):
            trace.update(data, overwrite=True)
        fw.update_layout(layout, overwrite=True)
    # added only once the new layout is there: drawn against the last figure's axes
    # (the coverage figure's one tick per step), the seam costs' bars of µs got a tick
    # label per µs, and laying those out blocked the browser for tens of seconds
    if kept < len(new):
        fw.add_traces(list(fig.data[kept:]))
    if on_click is not None:  # kept traces keep their (replaced) handler
        for trace in fw.data[kept:]:
            trace.on_click(_clicked(on_click))


def _clicked(callback: Callable[[object], None]):
    def handler(trace, points, _state) -> None:
        inds = list(getattr(points, "point_inds", []) or [])
        data = trace.customdata
        if inds and data is not None and len(data) > inds[0]:
            callback(data[inds[0]])

    return handler
