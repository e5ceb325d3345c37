"""The io_buffers rows of a step: where each feed, bound output and graph output lives.

One row per array: (value_id, role, address, nbytes, base_address, base_nbytes), the
base being the buffer at the bottom of the array's view chain (`KnownAddresses.where`).
A decode loop hands the executor mostly the very arrays of the last step (a fixed-KV
decode all of them but the attention mask, which grows; a growing one its caches as
last step's outputs), and an array's row is a function of the array alone: its view
chain never changes, and numpy refuses to resize (move) an array that has weak
references, as these rows hold. So a row is read afresh only for an array that is not
the one at its position last step, and a step of only such arrays hands the Recording
the very fields tuple of the last. The Recording gets the rows' fields one after
another in one tuple (`Recording.add_flat_rows`): a step that keeps a tuple per row
gives the garbage collector's young generation one more object per row to count (a
growing SmolLM2 cache: 120 a step).
"""

from __future__ import annotations

import weakref
from itertools import chain
from typing import Any

from .views import KnownAddresses

IO_COLUMNS = ("value_id", "role", "address", "nbytes", "base_address", "base_nbytes")
WIDTH = len(IO_COLUMNS)  # fields a row


class IoRows:
    """The last step's rows, per position, and weak references to the arrays they describe."""

    __slots__ = ("_layout", "_refs", "_fields", "_held", "_emitted")

    def __init__(self) -> None:
        self._layout: tuple | None = None  # ((vid, role), ...) of the last step's positions
        self._refs: list = []  # per position: a weak reference to the array, or None
        self._fields: list = []  # per position: its row's WIDTH fields, one position after another
        self._held: list = []  # per position: whether it holds an array (else it has no row)
        self._emitted: tuple = ()  # the last fields tuple handed to the Recording

    def fields(self, layout: tuple, arrays: tuple, addresses: KnownAddresses) -> tuple:
        """This step's rows for `arrays`, one per position of `layout` ((vid, role) each)
        that holds an array, as one flat tuple: each row's `IO_COLUMNS` fields in turn."""
        if layout != self._layout:
            self._layout, self._refs, self._held = layout, [None] * len(layout), [False] * len(layout)
            self._fields = [f for position in layout for f in (*position, *(None,) * (WIDTH - 2))]
            self._emitted = ()
        refs, fields, held = self._refs, self._fields, self._held
        changed = False
        for i, arr in enumerate(arrays):
            ref = refs[i]
            if ref is not None and ref() is arr:
                continue
            changed = True
            if hasattr(arr, "nbytes"):
                at = i * WIDTH + 2  # value id and role stay as the layout says
                fields[at:at + WIDTH - 2] = addresses.where(arr)
                held[i] = True
                try:
                    refs[i] = weakref.ref(arr)
                except TypeError:  # no weak references: read afresh every step
                    refs[i] = None
            else:
                held[i], refs[i] = False, None
        if changed or not self._emitted:
            self._emitted = tuple(fields) if all(held) else tuple(chain.from_iterable(
                fields[i * WIDTH:(i + 1) * WIDTH] for i, h in enumerate(held) if h))
        return self._emitted


def io_layout(feeds: dict[int, Any], bound: dict[int, Any], outputs: tuple[int, ...]) -> tuple:
    """(value id, role) of each position: the feeds, the bound outputs, then the unbound
    graph outputs, as `Executor._emit_io_buffers` lists their arrays."""
    return (*((vid, "feed") for vid in feeds), *((vid, "bound_output") for vid in bound),
            *((vid, "output") for vid in outputs))
