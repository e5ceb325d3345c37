"""Recognising zero-copy views: which owner a result aliases, with what geometry."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from ..addresses import address


def storage_root(a: Any) -> Any:
    """The array at the bottom of a view chain (numpy and CuPy keep views alive through `.base`)."""
    base = getattr(a, "base", None)
    while base is not None and hasattr(base, "shape"):
        a, base = base, getattr(base, "base", None)
    return a


def is_view_of(result: Any, source: Any) -> bool:
    if getattr(result, "base", None) is None or not hasattr(source, "shape"):
        return False
    return storage_root(result) is storage_root(source)


#: (byte strides, itemsize) -> strides in elements (`element_strides`): a decode step's layout nodes make
#: views of a handful of geometries, again every step (a growing cache's adds one a step)
ELEMENT_STRIDES: dict[tuple, tuple] = {}
ELEMENT_STRIDES_KEPT = 4096


def element_strides(view: Any) -> tuple:
    """`view`'s strides counted in elements (bytes for a zero-size dtype)."""
    key = (view.strides, view.itemsize)
    found = ELEMENT_STRIDES.get(key)
    if found is None:
        if len(ELEMENT_STRIDES) >= ELEMENT_STRIDES_KEPT:
            ELEMENT_STRIDES.clear()  # a long decode's spent geometries
        itemsize = view.itemsize or 1
        found = ELEMENT_STRIDES[key] = tuple(st // itemsize for st in key[0])
    return found


class KnownAddresses:
    """Where the arrays seen this step and the last live, and the buffer under each.

    An array's own address is one cheap read (`address`); the buffer at the bottom of
    its view chain takes a walk down `.base`, and a decode step asks again for the same
    arrays every step. An object's `.base` chain is fixed, and the very same array
    object with the same nbytes is where it was: its data pointer only moves when it is
    resized in place (numpy `ndarray.resize`, which changes its size; a CuPy array
    never moves). Entries hold weak references, so nothing is kept alive, and an id
    reused by a new object never matches; only two steps are kept.
    """

    __slots__ = ("_roots_last", "_roots_now")

    def __init__(self) -> None:
        self._roots_last: dict[int, tuple] = {}
        self._roots_now: dict[int, tuple] = {}

    def where(self, arr: Any) -> tuple[int, int, int, int]:
        """(address, nbytes, root address, root nbytes): where `arr` is and what it spans,
        and the same of the array at the bottom of its view chain (`storage_root`); the
        root is checked like `arr` itself."""
        if type(arr) is np.ndarray and arr.base is None:  # owns its bytes: it is its own base
            addr, nbytes = address(arr), arr.nbytes
            return (addr, nbytes, addr, nbytes)
        key = id(arr)
        nbytes = arr.nbytes
        entry = self._roots_now.get(key) or self._roots_last.get(key)
        if entry is not None and entry[0]() is arr and entry[1] == nbytes:
            root = entry[2]()
            if root is not None and root.nbytes == entry[3]:
                self._roots_now[key] = entry
                return entry[4]
        root = storage_root(arr)
        if root is arr:  # owns its bytes (a device array, say): nothing under it to find again
            addr = address(arr)
            return (addr, int(nbytes), addr, int(nbytes))
        root_nbytes = int(getattr(root, "nbytes", nbytes))
        found = (address(arr), int(nbytes), address(root), root_nbytes)
        try:
            self._roots_now[key] = (weakref.ref(arr), nbytes, weakref.ref(root), root_nbytes, found)
        except TypeError:
            pass
        return found

    def next_step(self) -> None:
        """Forget what was seen before the last step."""
        self._roots_last, self._roots_now = self._roots_now, {}

    def clear(self) -> None:
        self._roots_last.clear()
        self._roots_now.clear()
