"""Putting a freshly built plotly figure into a long-lived `FigureWidget`."""

from __future__ import annotations

from collections.abc import Callable

import plotly.graph_objects as go

__all__ = ["figure_widget", "show_figure"]


def figure_widget(height: int = 360) -> go.FigureWidget:
    fw = go.FigureWidget()
    fw.update_layout(height=height, template="plotly_white")
    return fw


def show_figure(fw: go.FigureWidget, fig: go.Figure, on_click: Callable[[object], None] | None = None) -> None:
    """Replace `fw`'s traces and layout with `fig`'s in one update.

    `on_click(customdata)` is called with the clicked point's customdata (the plan
    index or step the figure put there).
    """
    layout = fig.layout.to_plotly_json()
    for key in ("shapes", "annotations"):
        layout.setdefault(key, [])
    if fw.layout.template is not None and fw.layout.template == fig.layout.template:
        layout.pop("template", None)  # already there: do not resend it on every step
    with fw.batch_update():
        fw.data = ()
        fw.add_traces(list(fig.data))
        fw.update_layout(layout, overwrite=True)
    if on_click is not None:
        for trace in fw.data:
            trace.on_click(_clicked(on_click))


def _clicked(callback: Callable[[object], None]):
    def handler(trace, points, _state) -> None:
        inds = list(getattr(points, "point_inds", []) or [])
        data = trace.customdata
        if inds and data is not None and len(data) > inds[0]:
            callback(data[inds[0]])

    return handler
