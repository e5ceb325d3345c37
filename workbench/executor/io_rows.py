"""The io_buffers rows of a step: where each feed, bound output and graph output lives.

One row per array: (value_id, role, address, nbytes, base_address, base_nbytes), the
base being the buffer at the bottom of the array's view chain (`KnownAddresses.where`).

This runs at the end of every traced step, and a decode loop hands the executor new
arrays most steps (a growing cache: every past and present; a fixed cache: new views
of the same buffers, one row longer), so it must be cheap. The numbers lie in
arrays('Q'), a column each, that the Recording keeps with the layout as one block
(`IoBlock`): no int or tuple per row for the step to make, nor for the garbage
collector to count. A step whose arrays are the last step's very objects hands it the
very same block again; otherwise the last block's columns are copied and only the new
arrays read, a new view of the buffer the last step's view at that position viewed
keeping its base's numbers (`IoRows._patched`). A first step, or a new layout, reads
them all in a few passes of C calls where they are plain numpy arrays
(`owned_addresses`, `rooted_addresses`), else one at a time.
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Iterator
from itertools import compress
from typing import Any

import numpy as np

from ..addresses import address, owned_addresses, rooted_addresses, same_objects
from ..tables import IO_BUFFERS_COLUMNS
from .views import KnownAddresses

NUMBERS = len(IO_BUFFERS_COLUMNS) - 2  # a row's numbers: all but value id and role
_NBYTES = operator.attrgetter("nbytes")
_BASE = operator.attrgetter("base")


class IoBlock:
    """One step's io_buffers rows: the layout's (value id, role) of each position that
    holds an array, and its address, nbytes, base address and base nbytes, each a
    column in an array('Q') (an array owning its bytes is its own base: where all do,
    the base columns are the very address and nbytes arrays); what a Recording's table
    keeps of a block of rows (its length, its rows)."""

    __slots__ = ("layout", "positions", "columns")

    def __init__(self, layout: tuple, positions: tuple | None, columns: tuple[array, ...]) -> None:
        self.layout = layout
        self.positions = positions  # the positions that hold an array; None: all of them
        self.columns = columns  # (addresses, nbytes, base addresses, base nbytes)

    def __len__(self) -> int:
        return len(self.columns[0])

    def __iter__(self) -> Iterator[tuple]:
        layout = self.layout if self.positions is None else [self.layout[i] for i in self.positions]
        for (vid, role), *numbers in zip(layout, *self.columns):
            yield (vid, role, *numbers)

    def same_rows(self, layout: tuple, positions: tuple | None, columns: tuple[array, ...]) -> bool:
        return self.layout is layout and self.positions == positions and self.columns == columns


class IoRows:
    """The last step's block, handed again while the numbers stay the same; and while
    the arrays are the very objects of the last step (a fixed cache's bound arrays, the
    staged feeds, the executor's own output buffers), without reading them: an array's
    address, size and base cannot change while it is held, and these are held here
    until the next step."""

    __slots__ = ("_last", "_arrays")

    def __init__(self) -> None:
        self._last: IoBlock | None = None
        self._arrays: tuple = ()

    def block(self, layout: tuple, arrays: tuple, addresses: KnownAddresses) -> IoBlock:
        """This step's rows for `arrays`, one per position of `layout` ((vid, role) each)
        that holds an array."""
        last = self._last
        if last is not None and last.layout is layout:
            if same_objects(arrays, self._arrays):
                return last
            patched = self._patched(last, arrays, addresses)
            if patched is not None:
                self._arrays = arrays
                if last.same_rows(layout, None, patched):
                    return last
                self._last = IoBlock(layout, None, patched)
                return self._last
        self._arrays = arrays
        positions = None
        addrs = owned_addresses(arrays)
        if addrs is not None:  # each its own base
            sizes = array("Q", map(_NBYTES, arrays))
            columns = (addrs, sizes, addrs, sizes)
        else:
            rooted = rooted_addresses(arrays)
            if rooted is not None:  # each its own base, or a view of one that is
                sizes = array("Q", map(_NBYTES, arrays))
                bases = [a if b is None else b for a, b in zip(arrays, map(_BASE, arrays))]
                columns = (rooted[0], sizes, rooted[1], array("Q", map(_NBYTES, bases)))
            else:
                positions, columns = self._read_each(arrays, addresses)
        if last is not None and last.same_rows(layout, positions, columns):
            return last
        self._last = IoBlock(layout, positions, columns)
        return self._last

    def _patched(self, last: IoBlock, arrays: tuple, addresses: KnownAddresses) -> tuple[array, ...] | None:
        """The last block's columns with the arrays that are not the last step's very
        objects read again, where every position held an array; else None (read them
        all). A new view of the array the last step's view at its position viewed (a
        fixed cache's past, one row longer each step, an attention mask's prefix) keeps
        that base's columns: the base is held (by the last step's view, kept here), so
        its address and size stand; only the view's own address and size are read, and
        the base columns stay the last block's very arrays (a block's columns are never
        written once made: these copies are made before any write)."""
        then = self._arrays
        if last.positions is not None or len(arrays) != len(then):
            return None
        addrs, sizes, base_addrs, base_sizes = last.columns
        addrs, sizes = addrs[:], sizes[:]  # an owning block shares them with its base columns
        rebased = False
        for i in compress(range(len(arrays)), map(operator.is_not, arrays, then)):
            arr = arrays[i]
            on_host = type(arr) is np.ndarray
            if not on_host and not hasattr(arr, "nbytes"):
                return None
            base = arr.base if on_host else None
            if base is not None and base is getattr(then[i], "base", None) and type(base) is np.ndarray \
                    and base.base is None:  # a new view of the buffer the last step's view viewed
                addrs[i], sizes[i] = address(arr), arr.nbytes
                continue
            if not rebased:
                base_addrs, base_sizes, rebased = base_addrs[:], base_sizes[:], True
            if on_host and base is None:  # owns its bytes: its own base
                addrs[i] = base_addrs[i] = address(arr)
                sizes[i] = base_sizes[i] = arr.nbytes
            else:
                addrs[i], sizes[i], base_addrs[i], base_sizes[i] = addresses.where(arr)
        return addrs, sizes, base_addrs, base_sizes

    @staticmethod
    def _read_each(arrays: tuple, addresses: KnownAddresses) -> tuple[tuple | None, tuple[array, ...]]:
        """The positions of the arrays that hold bytes (None: all of them) and their
        columns, each array read on its own (a view's base found under it)."""
        columns: tuple[array, ...] = tuple(array("Q") for _ in range(NUMBERS))
        held = []
        for i, arr in enumerate(arrays):
            if hasattr(arr, "nbytes"):
                for column, number in zip(columns, addresses.where(arr)):
                    column.append(number)
                held.append(i)
        return None if len(held) == len(arrays) else tuple(held), columns


def io_layout(feeds: dict[int, Any], bound: dict[int, Any], outputs: tuple[int, ...]) -> tuple:
    """(value id, role) of each position: the feeds, the bound outputs, then the unbound
    graph outputs, as `StepTrace.io_buffers` lists their arrays."""
    return (*((vid, "feed") for vid in feeds), *((vid, "bound_output") for vid in bound),
            *((vid, "output") for vid in outputs))
