"""Recognising zero-copy views: which owner a result aliases, with what geometry."""

from __future__ import annotations

import weakref
from typing import Any

from ..addresses import address


def storage_root(a: Any) -> Any:
    """The array at the bottom of a view chain (numpy and CuPy keep views alive through `.base`)."""
    while getattr(a, "base", None) is not None and hasattr(a.base, "shape"):
        a = a.base
    return a


def is_view_of(result: Any, source: Any) -> bool:
    if getattr(result, "base", None) is None or not hasattr(source, "shape"):
        return False
    return storage_root(result) is storage_root(source)


class KnownAddresses:
    """Data addresses of the arrays seen this step and the last, by object.

    Reading an array's address goes through `__array_interface__` (a dict built per
    call); a decode step asks again for the same buffers every step. The very same
    array object with the same nbytes is where it was: its data pointer only moves
    when it is resized in place (numpy `ndarray.resize`, which changes its size; a
    CuPy array never moves). Entries hold weak references, so nothing is kept alive,
    and an id reused by a new object never matches; only two steps are kept.
    """

    __slots__ = ("_last", "_now", "_roots_last", "_roots_now")

    def __init__(self) -> None:
        self._last: dict[int, tuple] = {}
        self._now: dict[int, tuple] = {}
        self._roots_last: dict[int, tuple] = {}
        self._roots_now: dict[int, tuple] = {}

    def address(self, arr: Any) -> int:
        key = id(arr)
        entry = self._now.get(key) or self._last.get(key)
        nbytes = arr.nbytes
        if entry is None or entry[0]() is not arr or entry[1] != nbytes:
            try:
                entry = (weakref.ref(arr), nbytes, address(arr))
            except TypeError:  # no weak references to it: read its address every time
                return address(arr)
        self._now[key] = entry
        return entry[2]

    def where(self, arr: Any) -> tuple[int, int, int]:
        """(address, root address, root nbytes) of `arr` and of the array at the bottom
        of its view chain (`storage_root`). An object's `.base` chain is fixed, so the
        same object has the same root; the root is checked like `arr` itself."""
        key = id(arr)
        nbytes = arr.nbytes
        entry = self._roots_now.get(key) or self._roots_last.get(key)
        if entry is not None and entry[0]() is arr and entry[1] == nbytes:
            root_ref = entry[2]  # None: arr is its own root
            root = arr if root_ref is None else root_ref()
            if root is not None and root.nbytes == entry[3]:
                self._roots_now[key] = entry
                return entry[4]
        root = storage_root(arr)
        if root is arr:  # owns its bytes (a fresh array): one address read, one weak reference
            addr = self.address(arr)
            found = (addr, addr, int(nbytes))
            entry = self._now.get(key)  # absent: no weak references to it, read every time
            if entry is not None:
                self._roots_now[key] = (entry[0], nbytes, None, nbytes, found)
            return found
        root_nbytes = int(getattr(root, "nbytes", nbytes))
        # read directly: this entry is what the next step looks up (a view's own address
        # entry would be a second weak reference to it, rarely asked for)
        found = (address(arr), address(root), root_nbytes)
        try:
            self._roots_now[key] = (weakref.ref(arr), nbytes, weakref.ref(root), root_nbytes, found)
        except TypeError:
            pass
        return found

    def next_step(self) -> None:
        """Forget what was seen before the last step."""
        self._roots_last, self._roots_now = self._roots_now, {}
        self._last, self._now = self._now, {}

    def clear(self) -> None:
        for d in (self._last, self._now, self._roots_last, self._roots_now):
            d.clear()
