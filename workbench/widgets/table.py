"""`PagedTable`: a filterable, paged HTML table (never thousands of rows in the DOM)."""

from __future__ import annotations

import html
from collections.abc import Callable

import ipywidgets as W
import pandas as pd

from ..reports.vocabulary import explain
from .model.paging import page_of

__all__ = ["PagedTable", "frame_html"]

_STYLE = ("<style>.wb-tbl{border-collapse:collapse;font-size:12px;font-family:var(--jp-code-font-family,"
          "monospace)}.wb-tbl th,.wb-tbl td{border:1px solid #e3e3e3;padding:1px 6px;text-align:left;"
          "white-space:nowrap;max-width:360px;overflow:hidden;text-overflow:ellipsis}"
          ".wb-tbl th{background:#f3f3f3}.wb-tbl tr.wb-sel td{background:#ffe8e8;font-weight:600}</style>")


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


def frame_html(df: pd.DataFrame, formatters: dict[str, Callable] | None = None,
               selected: Callable[[pd.Series], bool] | None = None) -> str:
    """An escaped HTML table of `df` (every cell through `html.escape`); hovering a cell
    shows its full text, and for jargon (`reports.GLOSSARY`) what it means."""
    formatters = formatters or {}
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    body = []
    for _, row in df.iterrows():
        cls = ' class="wb-sel"' if selected is not None and selected(row) else ""
        cells = "".join(
            f"<td title=\"{html.escape(_hover(row[c]))}\">{html.escape(formatters.get(c, _text)(row[c]))}</td>"
            for c in df.columns)
        body.append(f"<tr{cls}>{cells}</tr>")
    return (f'{_STYLE}<div style="overflow-x:auto;max-width:100%"><table class="wb-tbl"><thead><tr>{head}'
            f'</tr></thead><tbody>{"".join(body)}</tbody></table></div>')


class PagedTable(W.VBox):
    """Filter box, previous/next page, and one page of a DataFrame."""

    def __init__(self, size: int = 20, formatters: dict[str, Callable] | None = None,
                 filter_columns: list[str] | None = None, placeholder: str = "filter (words: all must match)"):
        self.size = size
        self.formatters = formatters or {}
        self.filter_columns = filter_columns
        self.frame = pd.DataFrame()
        self.page = 0
        self.selected: Callable[[pd.Series], bool] | None = None
        self.query = W.Text(placeholder=placeholder, continuous_update=False,
                            layout=W.Layout(width="280px"))
        self.prev_btn = W.Button(description="‹", layout=W.Layout(width="36px"), tooltip="previous page")
        self.next_btn = W.Button(description="›", layout=W.Layout(width="36px"), tooltip="next page")
        self.label = W.Label()
        self.html = W.HTML()
        self.query.observe(lambda _c: self._go(0), names="value")
        self.prev_btn.on_click(lambda _b: self._go(self.page - 1))
        self.next_btn.on_click(lambda _b: self._go(self.page + 1))
        super().__init__([W.HBox([self.query, self.prev_btn, self.label, self.next_btn]), self.html])

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
        self.html.value = frame_html(p.rows, self.formatters, self.selected)
