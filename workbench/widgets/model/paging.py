"""`page_of`: one page of a filtered DataFrame -- tables never render thousands of rows."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

__all__ = ["Page", "page_of"]


@dataclass
class Page:
    rows: pd.DataFrame
    page: int  # 0-based, clamped into range
    pages: int  # at least 1
    total: int  # rows after filtering

    @property
    def label(self) -> str:
        return f"page {self.page + 1} of {self.pages} · {self.total:,} rows"


def page_of(df: pd.DataFrame, page: int = 0, size: int = 25, query: str = "",
            columns: list[str] | None = None) -> Page:
    """Rows matching `query` (case-insensitive substring of any of `columns`, default all
    text columns; words separated by spaces must all match), then page `page` of `size`."""
    if query.strip():
        cols = columns or [c for c in df.columns
                           if df[c].dtype == object or pd.api.types.is_string_dtype(df[c])]
        text = pd.Series([""] * len(df), index=df.index)
        for c in cols:
            text = text + " " + df[c].astype(str).str.lower()
        mask = pd.Series(True, index=df.index)
        for word in query.lower().split():
            mask &= text.str.contains(word, regex=False)
        df = df[mask]
    total = len(df)
    pages = max(1, -(-total // size))
    page = max(0, min(page, pages - 1))
    return Page(df.iloc[page * size:(page + 1) * size], page, pages, total)
