"""`PagedTable`: a filterable, paged HTML table (never thousands of rows in the DOM)."""

from __future__ import annotations

import html
from collections.abc import Callable

import ipywidgets as W
import pandas as pd

from ..reports.vocabulary import explain
from .model.paging import page_of

__all__ = ["STYLE", "PagedTable", "frame_html"]

#: the widgets' stylesheet: JupyterLab's theme variables (light and dark), light fallbacks
#: elsewhere. Tables never scroll sideways: a fixed layout over the full width, each
#: column as wide as its content asks (capped), long cells cut with an ellipsis (hover
#: for the whole text), headers wrapped. Plots follow the theme (see `figure.THEME`).
STYLE = ("<style>"
         ".wb-tbl{border-collapse:collapse;font-size:12px;font-family:var(--jp-code-font-family,monospace);"
         "width:100%;table-layout:fixed;color:var(--jp-ui-font-color1,#222)}"
         ".wb-tbl th,.wb-tbl td{border:1px solid var(--jp-border-color2,#e3e3e3);padding:1px 4px;"
         "text-align:left;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}"
         ".wb-tbl th{background:var(--jp-layout-color2,#f3f3f3);color:var(--jp-ui-font-color0,#000);"
         "white-space:normal;overflow-wrap:anywhere;vertical-align:bottom}"
         ".wb-tbl td.wb-wrap{white-space:normal;overflow-wrap:anywhere}"
         ".wb-tbl tr.wb-sel td{background:var(--jp-brand-color3,#ffe8e8);color:var(--jp-ui-font-color0,#000);"
         "font-weight:600}"
         "body[data-jp-theme-light='false'] .wb-tbl tr.wb-sel td{background:var(--jp-brand-color0,#1565c0);"
         "color:var(--jp-ui-inverse-font-color0,#fff)}"
         ".wb-view,.wb-workbench{max-width:100%;overflow-x:hidden}"
         # ipywidgets gives HTML a button's line height (28 px): tables and details of many
         # lines were twice as tall as their text (the Plan tab ~1,400 px at 1366x768)
         ".wb-view .widget-html-content,.wb-workbench .widget-html-content{line-height:1.4}"
         ".wb-tbl{line-height:1.35}"
         # a width:100% child plus ipywidgets' margins would be 4 px too wide (and cut off)
         ".wb-view>*,.wb-workbench>*,.wb-view .widget-box>*,.wb-workbench .widget-box>*{"
         "max-width:calc(100% - 2 * var(--jp-widgets-margin,2px))}"
         ".wb-figure .main-svg{background:transparent!important}"
         "body[data-jp-theme-light='false'] .wb-figure .main-svg text{fill:var(--jp-ui-font-color1,#ddd)!important}"
         "body[data-jp-theme-light='false'] .wb-figure .gridlayer path,"
         "body[data-jp-theme-light='false'] .wb-figure .zerolinelayer path{stroke:var(--jp-border-color2,#555)!important}"
         "body[data-jp-theme-light='false'] .wb-figure .legend .bg{fill:var(--jp-layout-color1,#222)!important}"
         "</style>")
_STYLE = STYLE


def _text(v) -> str:
    if v is None or (isinstance(v, float) and v != v) or v is pd.NA:
        return "—"
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    if isinstance(v, dict):
        return ", ".join(f"{k}={x}" for k, x in v.items())
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def _hover(v) -> str:
    """A cell's hover: the glossary sentence for jargon (a reason code, a mode, a slot),
    else the full text (cells are cut short)."""
    text = _text(v)
    return (f"{text}: {explain(text)}" if isinstance(v, str) and explain(text) else text)


_WRAP = ' class="wb-wrap"'


def _widths(df: pd.DataFrame, formatters: dict[str, Callable], wrap: set[str]) -> list[float]:
    """Each column's share of the table width: its header's and longest cell's length, capped."""
    weights = []
    for c in df.columns:
        cells = [len(formatters.get(c, _text)(v)) for v in df[c].head(50)]
        longest = max(cells, default=0)
        cap = 60 if c in wrap else 28
        weights.append(max(4, min(max(longest, min(len(str(c)), 12)), cap)) + 2)
    total = sum(weights) or 1
    return [100 * w / total for w in weights]


def _header(name: str) -> str:
    return html.escape(name).replace("_", "_<wbr>")


def frame_html(df: pd.DataFrame, formatters: dict[str, Callable] | None = None,
               selected: Callable[[pd.Series], bool] | None = None, wrap: list[str] | None = None) -> str:
    """An escaped HTML table of `df` (every cell through `html.escape`); hovering a cell
    shows its full text, and for jargon (`reports.GLOSSARY`) what it means. It fits its
    container's width: cells cut short with an ellipsis, except the `wrap` columns'
    (wrapped); a header breaks at its underscores."""
    formatters = formatters or {}
    wrapped = set(wrap or [])
    cols = "".join(f'<col style="width:{w:.1f}%">' for w in _widths(df, formatters, wrapped))
    head = "".join(f"<th title=\"{html.escape(_hover(str(c)))}\">{_header(str(c))}</th>" for c in df.columns)
    body = []
    for _, row in df.iterrows():
        cls = ' class="wb-sel"' if selected is not None and selected(row) else ""
        cells = "".join(
            f"<td{_WRAP if c in wrapped else ''} title=\"{html.escape(_hover(row[c]))}\">"
            f"{html.escape(formatters.get(c, _text)(row[c]))}</td>"
            for c in df.columns)
        body.append(f"<tr{cls}>{cells}</tr>")
    return (f'{STYLE}<div class="wb-table-box" style="max-width:100%"><table class="wb-tbl"><colgroup>{cols}'
            f'</colgroup><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>')


class PagedTable(W.VBox):
    """Filter box, previous/next page, and one page of a DataFrame."""

    def __init__(self, size: int = 20, formatters: dict[str, Callable] | None = None,
                 filter_columns: list[str] | None = None, placeholder: str = "filter (words: all must match)",
                 wrap: list[str] | None = None):
        self.size = size
        self.formatters = formatters or {}
        self.filter_columns = filter_columns
        self.frame = pd.DataFrame()
        self.page = 0
        self.selected: Callable[[pd.Series], bool] | None = None
        self.wrap = list(wrap or [])
        self.query = W.Text(placeholder=placeholder, continuous_update=False,
                            layout=W.Layout(width="280px", max_width="60%"))
        self.prev_btn = W.Button(description="‹", layout=W.Layout(width="36px"), tooltip="previous page")
        self.next_btn = W.Button(description="›", layout=W.Layout(width="36px"), tooltip="next page")
        self.label = W.Label()
        self.html = W.HTML()
        self.query.observe(lambda _c: self._go(0), names="value")
        self.prev_btn.on_click(lambda _b: self._go(self.page - 1))
        self.next_btn.on_click(lambda _b: self._go(self.page + 1))
        super().__init__([W.HBox([self.query, self.prev_btn, self.label, self.next_btn]), self.html],
                         layout=W.Layout(width="100%"))

    def set_frame(self, df: pd.DataFrame, page: int | None = None,
                  selected: Callable[[pd.Series], bool] | None = None) -> None:
        self.frame = df
        self.selected = selected
        self._go(self.page if page is None else page)

    def _go(self, page: int) -> None:
        p = page_of(self.frame, page, self.size, self.query.value, self.filter_columns)
        self.page = p.page
        self.label.value = p.label
        self.prev_btn.disabled = p.page == 0
        self.next_btn.disabled = p.page >= p.pages - 1
        self.html.value = frame_html(p.rows, self.formatters, self.selected, self.wrap)
