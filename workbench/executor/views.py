"""Recognising zero-copy views: which owner a result aliases, with what geometry."""

from __future__ import annotations

from typing import Any

import numpy as np


def storage_root(a: Any) -> Any:
    """The array at the bottom of a view chain (numpy keeps views alive through `.base`)."""
    while isinstance(getattr(a, "base", None), np.ndarray):
        a = a.base
    return a


def is_view_of(result: Any, source: Any) -> bool:
    if not isinstance(result, np.ndarray) or not isinstance(source, np.ndarray):
        return False
    if result.base is None:
        return False
    return storage_root(result) is storage_root(source)


def address(a: Any) -> int:
    """The address of an array's first element (byte offsets are differences of these)."""
    return a.__array_interface__["data"][0]
