"""Numbers with units, for tables, hover text and the summary (bytes, ms, us, tokens/s)."""

from __future__ import annotations

import math

__all__ = ["fmt_bytes", "fmt_count", "fmt_ms", "fmt_rate", "fmt_us", "mib"]

_BYTE_UNITS = ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def _missing(x) -> bool:
    try:
        return x is None or (isinstance(x, float) and math.isnan(x)) or bool(x != x)
    except (TypeError, ValueError):  # pd.NA compares to NA
        return True


def fmt_bytes(n) -> str:
    """1536 -> '1.50 KiB'; 12 -> '12 B'; missing -> '—'."""
    if _missing(n):
        return "—"
    n = int(n)
    for scale, unit in _BYTE_UNITS:
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def mib(n) -> float:
    """Bytes as MiB (float), for plot axes."""
    return float("nan") if _missing(n) else int(n) / (1 << 20)


def fmt_ms(x) -> str:
    return "—" if _missing(x) else f"{float(x):.3f} ms"


def fmt_us(x) -> str:
    return "—" if _missing(x) else f"{float(x):.1f} µs"


def fmt_rate(x, unit: str = "tok/s") -> str:
    return "—" if _missing(x) else f"{float(x):.1f} {unit}"


def fmt_count(x) -> str:
    return "—" if _missing(x) else f"{int(x):,}"
