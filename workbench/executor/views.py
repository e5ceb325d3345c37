"""Recognising zero-copy views: which owner a result aliases, with what geometry."""

from __future__ import annotations

from typing import Any


def storage_root(a: Any) -> Any:
    """The array at the bottom of a view chain (numpy and CuPy keep views alive through `.base`)."""
    while getattr(a, "base", None) is not None and hasattr(a.base, "shape"):
        a = a.base
    return a


def is_view_of(result: Any, source: Any) -> bool:
    if getattr(result, "base", None) is None or not hasattr(source, "shape"):
        return False
    return storage_root(result) is storage_root(source)


def address(a: Any) -> int:
    """The address of an array's first element (byte offsets are differences of these)."""
    iface = getattr(a, "__array_interface__", None)
    return iface["data"][0] if iface is not None else a.data.ptr
