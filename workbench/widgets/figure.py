"""Putting a freshly built plotly figure into a long-lived `FigureWidget`."""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable

import ipywidgets as W
import plotly.graph_objects as go
import plotly.io as pio

from .figure_code import Figure, preload

__all__ = ["THEME", "WIDGET_COLORS", "FigureHolder", "glance", "show_figure"]

#: the widgets' plotly template: plotly_white with transparent backgrounds, so a plot
#: sits on the notebook's own background in JupyterLab's light and dark themes alike
#: (in the dark theme the stylesheet, `table.STYLE`, turns its text and grid light)
THEME = copy.deepcopy(pio.templates["plotly_white"])
THEME.layout.paper_bgcolor = "rgba(0,0,0,0)"
THEME.layout.plot_bgcolor = "rgba(0,0,0,0)"

#: colours the widgets give names the reports' palette does not know (one per meaning)
WIDGET_COLORS = {"warm-up": "#9e9e9e"}

#: legend names that said one word twice ("capture capture") -> what the marker means
_LEGEND = {"capture capture": "graph recorded (capture)", "capture replay": "graph replayed",
           "capture retire": "graph retired", "capture quarantine": "op type quarantined",
           "capture bake": "host value baked in (bake)"}


class FigureHolder(W.VBox):
    """A full-width slot for one plotly `FigureWidget`, made on the first `show()`.

    A FigureWidget carries plotly.js itself (about 5 MB of JavaScript the browser must
    receive and evaluate per widget), so a workbench that made all of its figures up
    front appeared only seconds after the cell ran. The figure is a `figure_code.Figure`,
    which takes plotly from the page's one import of it; and made lazily, only the
    figures of the tabs a person opens exist; views render only while shown, so a figure
    is first drawn inside a visible container and is sized to it.

    `follows_step`: the view redraws this figure for every step it shows; `show(...,
    step=)` writes the step into the layout's `meta`, and the step label and tokens
    (`step_html.StepHTML`) wait for it, so the page shows them together.
    """

    def __init__(self, max_height: int | None = None, follows_step: bool = False) -> None:
        self.widget: go.FigureWidget | None = None
        self.max_height = max_height
        self.follows_step = follows_step
        super().__init__([], layout=W.Layout(width="100%"))
        self.add_class("wb-figure")
        if follows_step:
            self.add_class("wb-step-figure")

    def ensure(self) -> go.FigureWidget:
        """Make the FigureWidget now (empty), so its view exists before a live decode's first
        step is drawn into it."""
        if self.widget is None:
            self.widget = Figure(layout={"template": THEME, "height": 120, "autosize": True})
            self.children = [self.widget]
        return self.widget

    def show(self, fig: go.Figure, on_click: Callable[[object], None] | None = None,
             step: int | None = None) -> None:
        glance(fig, self.max_height)
        if self.follows_step and step is not None:
            fig.update_layout(meta={"wb_step": int(step)})
        show_figure(self.ensure(), fig, on_click)


def glance(fig: go.Figure, max_height: int | None = None) -> go.Figure:
    """The widgets' look on a reports figure: the theme-following template, the widget
    colours, legends that name what a marker means, a count on merged markers, no NaN
    (plotly sends figures as JSON, where NaN is not valid), and at most `max_height` px."""
    fig.update_layout(template=THEME, autosize=True, width=None)
    if max_height is not None and (fig.layout.height or 0) > max_height:
        fig.update_layout(height=max_height)
    for trace in fig.data:
        name = getattr(trace, "name", None)
        if name in WIDGET_COLORS and hasattr(trace, "marker"):
            trace.marker.color = WIDGET_COLORS[name]
        if name in _LEGEND:
            trace.name = _LEGEND[name]
            hover = trace.hovertext
            counts = [_count(h) for h in (list(hover) if hover is not None and not isinstance(hover, str) else [])]
            if any(c > 1 for c in counts):  # "×8" beside a marker that stands for 8 events
                trace.mode = "markers+text"
                trace.text = [f"×{c}" if c > 1 else "" for c in counts]
                trace.textposition = "top center"
                trace.textfont = {"size": 9}
        if getattr(trace, "type", None) == "heatmap" and trace.z is not None:
            trace.z = [[None if _nan(v) else v for v in row] for row in trace.z]
    return fig


def _count(hover: str) -> int:
    m = re.search(r"×(\d+)", str(hover))
    return int(m.group(1)) if m else 1


def _nan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


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


# in a kernel, importing the views sends plotly's widget code to the browser now: it is
# evaluated while the next cells run, not when the first figure is waited for
preload()
