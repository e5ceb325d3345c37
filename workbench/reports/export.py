"""`export(recording, dir)`: every frame as CSV and as parquet, plus an index of files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .source import FRAME_NAMES, OPTIONAL_TABLES, Frames, as_frames
from .summary import summary

if TYPE_CHECKING:  # pragma: no cover
    from ..trace import Recording

__all__ = ["export", "portable"]


def _jsonable(v):
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, (set, frozenset)):
        return sorted(v)
    return str(v)


def portable(df: pd.DataFrame) -> pd.DataFrame:
    """A copy every CSV reader and parquet writer accepts: list / tuple / dict cells
    become JSON text, object columns mixing types become text (missing stays missing)."""
    out = df.copy()
    for c in out.columns:
        col = out[c]
        if col.dtype != object:
            continue
        vals = [v for v in col if v is not None and not (isinstance(v, float) and np.isnan(v))]
        if any(isinstance(v, (list, tuple, dict, set, frozenset, np.ndarray)) for v in vals):
            out[c] = [None if v is None else json.dumps(v, default=_jsonable) for v in col]
        elif len({type(v) for v in vals}) > 1:
            out[c] = [None if v is None or (isinstance(v, float) and np.isnan(v)) else str(v) for v in col]
    return out


def export(src: Recording | Frames, directory: str | Path) -> pd.DataFrame:
    """Write `<frame>.csv` and `<frame>.parquet` for every frame the recording has
    (optional ones only when recorded), plus memory_summary and summary.

    Returns the index of what was written: frame, rows, csv, parquet (paths).
    """
    f = as_frames(src)
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    frames: dict[str, pd.DataFrame] = {name: f.get(name) for name in FRAME_NAMES}
    for name in OPTIONAL_TABLES:
        df = f.optional(name)
        if df is not None:
            frames[name] = df
    frames["memory_summary"] = f.recording.memory_summary()
    frames["summary"] = summary(f)
    written = []
    for name, df in frames.items():
        p = portable(df)
        csv, parquet = root / f"{name}.csv", root / f"{name}.parquet"
        p.to_csv(csv, index=False)
        p.to_parquet(parquet, index=False)
        written.append((name, len(df), str(csv), str(parquet)))
    return pd.DataFrame(written, columns=["frame", "rows", "csv", "parquet"])
