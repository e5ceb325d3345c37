"""Where an array's first element lives (host pointer for numpy, device pointer for
CuPy), and whether two sequences hold the very same arrays (`SameArrays` keeps a value
per kernel call on that test).

Addresses are how the executor tells a buffer that stayed from one that moved
(capture bindings, memo guards, view offsets, io_buffers rows), so they are read
hundreds of times a decode step. numpy's `__array_interface__` builds a dict (shape,
typestr, descr, strides, data) to hand out one integer. The pointer itself is the
first field of numpy's array object after the Python object header
(`PyArrayObject_fields.data`): every compiled extension reads it there through
numpy's inline `PyArray_DATA`, so numpy keeps it there across releases. Reading those
eight bytes is five times as cheap as the dict; the reading is checked against
`__array_interface__` on probe arrays at import, and the documented
`__array_struct__` capsule is read instead wherever that check fails.
"""

from __future__ import annotations

import ctypes
import operator
from array import array
from typing import Any

import numpy as np


class _ArrayInterface(ctypes.Structure):
    """numpy's PyArrayInterface (the `__array_struct__` protocol, version 2)."""

    _fields_ = [("two", ctypes.c_int), ("nd", ctypes.c_int), ("typekind", ctypes.c_char),
                ("itemsize", ctypes.c_int), ("flags", ctypes.c_int),
                ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p), ("data", ctypes.c_void_p)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _address_from_capsule(a: np.ndarray) -> int:
    capsule = a.__array_struct__  # kept alive while the struct it owns is read
    return _ArrayInterface.from_address(_capsule_pointer(capsule, None)).data or 0


_read_pointer = ctypes.c_void_p.from_address


def _data_field_offset(offset: int = object.__basicsize__) -> int | None:
    """Where numpy's array object keeps its data pointer, right after the object
    header, if reading it there gives `__array_interface__`'s pointer for every probe
    (an offset view, a transpose, a negative stride, a 0-d and a zero-size array, a
    subclass); else None."""
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    probes = (base, base[1:, 2:], base.T, base[::-1, ::-2], np.array(1.5), base[:, :0],
              base.view(np.recarray), np.frombuffer(bytearray(16), np.int32)[1:])
    for probe in probes:
        if (_read_pointer(id(probe) + offset).value or 0) != probe.__array_interface__["data"][0]:
            return None
    return offset


_DATA_FIELD = _data_field_offset()


def address(a: Any) -> int:
    """The address of `a`'s first element (byte offsets are differences of these)."""
    if isinstance(a, np.ndarray):
        if _DATA_FIELD is None:
            return _address_from_capsule(a)
        return _read_pointer(id(a) + _DATA_FIELD).value or 0  # `a` is alive: its object is there
    iface = getattr(a, "__array_interface__", None)
    return iface["data"][0] if iface is not None else a.data.ptr


_VALUE = operator.attrgetter("value")
_BASE = operator.attrgetter("base")


def owned_addresses(arrays: tuple) -> array | None:
    """`address` of each of `arrays` in one pass of C calls, where every one is a plain
    numpy array owning its bytes (base None), else None. One array at a time costs a
    Python call and a ctypes object each; a traced decode step reads some thirty."""
    try:
        if _DATA_FIELD is None or not arrays or set(map(type, arrays)) != {np.ndarray} \
                or set(map(_BASE, arrays)) != {None}:
            return None
        return array("Q", map(_VALUE, map(_read_pointer, map(_DATA_FIELD.__add__, map(id, arrays)))))
    except TypeError:  # a base that cannot be hashed (an array: a view), or a null pointer read as None
        return None


def rooted_addresses(arrays: tuple) -> tuple[array, array] | None:
    """(`address` of each array, `address` of the array under it) in a few passes of C
    calls, where every one is a plain numpy array that owns its bytes or is a view of
    one that does (a KV cache's past, a slice of a bigger buffer); else None. The array
    under an owning one is itself."""
    try:
        if _DATA_FIELD is None or not arrays or set(map(type, arrays)) != {np.ndarray}:
            return None
        bases = [a if b is None else b for a, b in zip(arrays, map(_BASE, arrays))]
        if set(map(type, bases)) != {np.ndarray} or set(map(_BASE, bases)) != {None}:
            return None
        read = _DATA_FIELD.__add__
        return (array("Q", map(_VALUE, map(_read_pointer, map(read, map(id, arrays))))),
                array("Q", map(_VALUE, map(_read_pointer, map(read, map(id, bases))))))
    except TypeError:  # a base that cannot be hashed, or a null pointer read as None
        return None


def same_objects(now: Any, then: tuple) -> bool:
    """Whether two sequences hold the very same objects, position by position (for a
    cache keyed on arrays that are held meanwhile, so no identity is reused)."""
    return len(now) == len(then) and all(map(operator.is_, now, then))


def holds_now(container: Any, keys: Any) -> Any:
    """A check of a container like `container` (a list or dict): True while it holds,
    at `keys`, the very objects it holds there now (a key gone raises KeyError). The
    objects are held by the check, so no identity can be reused meanwhile."""
    keys = tuple(keys)
    if not keys:
        return lambda _: True
    if len(keys) == 1:
        key, = keys
        only = container[key]
        return lambda c: c[key] is only
    get = items_at(keys)
    objects = get(container)
    return lambda c: same_objects(get(c), objects)


def items_at(keys: Any) -> Any:
    """A function giving a container's items at `keys` as a tuple (one C call for two
    keys or more)."""
    keys = tuple(keys)
    if len(keys) > 1:
        return operator.itemgetter(*keys)
    if keys:
        key, = keys
        return lambda c: (c[key],)
    return lambda c: ()


class SameArrays:
    """One value worked out from a kernel call's arrays (shapes, strides, addresses,
    views of them, never their contents), kept for the next call with the very same
    input and output arrays: a replayed launch passes the same ones every step. The
    arrays are held meanwhile, so no identity can be reused by another array."""

    __slots__ = ("_key",)

    def __init__(self) -> None:
        self._key: tuple | None = None  # (inputs, outputs, value)

    def kept_for(self, inputs: list, outs: list) -> Any:
        """The value kept for exactly these arrays, else None."""
        key = self._key
        if key is not None and same_objects(inputs, key[0]) and same_objects(outs, key[1]):
            return key[2]
        return None

    def keep(self, inputs: list, outs: list, value: Any) -> None:
        """Keep `value` for these arrays (None forgets)."""
        self._key = None if value is None else (tuple(inputs), tuple(outs), value)
