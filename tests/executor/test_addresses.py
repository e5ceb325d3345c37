"""`addresses.address` reads numpy's data pointer out of the array object (the
`__array_struct__` capsule where its import-time check fails): both readings must give
exactly what `__array_interface__` gives, for every kind of array the executor meets,
and `KnownAddresses.where` (its main reader) must stay right for arrays that own their
bytes (the one-read path) as well as views."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from workbench.addresses import address, rooted_addresses
from workbench.executor.views import KnownAddresses, storage_root


def _arrays(tmp_path):
    base = np.arange(4 * 6 * 8, dtype=np.float32).reshape(4, 6, 8)
    path = tmp_path / "weights.bin"
    np.arange(64, dtype=np.float32).tofile(path)
    mapped = np.memmap(path, dtype=np.float32, mode="r", shape=(8, 8))
    raw = np.empty(3 * 5 * 4, np.uint8)
    yield "contiguous", base
    yield "slice with an offset", base[1:3, 2:]
    yield "negative strides", base[::-1, :, ::-2]
    yield "transposed", base.transpose(2, 0, 1)
    yield "broadcast (zero strides)", np.broadcast_to(base[0, 0], (5, 8))
    yield "0-d", np.array(3.5)
    yield "zero-size", base[:, :0]
    yield "read-only memmap row", mapped[3]
    yield "uint8 buffer viewed as float32", raw.view(np.float32).reshape(3, 5)
    yield "float16", np.ones((3, 3), np.float16)[1:]
    yield "bool", np.zeros(7, bool)[2:]
    yield "structured", np.zeros(4, dtype=[("a", "<i4"), ("b", "<f8")])[1:]
    yield "object", np.array(["x", None, 3], dtype=object)[1:]
    yield "numpy scalar", np.float32(2.0)


def test_address_is_what_the_array_interface_says(tmp_path):
    from workbench import addresses

    assert addresses._DATA_FIELD is not None, "the import-time check refused the direct reading here"
    checked = 0
    for label, a in _arrays(tmp_path):
        assert address(a) == a.__array_interface__["data"][0], label
        if isinstance(a, np.ndarray):
            assert addresses._address_from_capsule(a) == address(a), label
        checked += 1
    assert checked == 14


def test_address_falls_back_to_the_capsule_where_the_check_fails(monkeypatch, tmp_path):
    from workbench import addresses

    assert addresses._data_field_offset(addresses._DATA_FIELD + 8) is None  # the field after it: refused
    monkeypatch.setattr(addresses, "_DATA_FIELD", None)
    for label, a in _arrays(tmp_path):
        assert address(a) == a.__array_interface__["data"][0], label


def test_an_array_that_owns_its_bytes_and_a_view_are_found_where_they_are():
    """Fresh arrays (freed each step, so ids come back for other arrays) and views of a
    bigger buffer, over eight steps: `where` must report each one's address now."""
    known = KnownAddresses()
    big = np.zeros((16, 8), np.float32)
    for step in range(8):
        known.next_step()
        fresh = np.full((2, 8), step, np.float32)
        view = big[step:step + 2]
        for a in (fresh, view, fresh, view):  # the second ask is served from the cache
            root = storage_root(a)
            assert known.where(a) == (address(a), a.nbytes, address(root), root.nbytes), step
        del fresh, view
        gc.collect()



def test_same_objects_is_identity_position_by_position():
    from workbench.addresses import same_objects

    a, b = np.zeros(3), np.zeros(3)
    assert same_objects([a, None, b], (a, None, b))
    assert not same_objects([a, b], (b, a)), "equal contents, other objects"
    assert not same_objects([a], (a, b)) and not same_objects([a, a.view()], (a, a))


def test_same_arrays_keeps_a_value_for_exactly_those_arrays():
    from workbench.addresses import SameArrays

    a, b, out = np.zeros(3), np.zeros(3), np.zeros(3)
    kept = SameArrays()
    assert kept.kept_for([a, b], [out]) is None
    kept.keep([a, b], [out], "plan")
    assert kept.kept_for([a, b], [out]) == "plan"
    assert kept.kept_for([a, b.copy()], [out]) is None and kept.kept_for([a, b], [None]) is None
    kept.keep([a, b], [out], None)
    assert kept.kept_for([a, b], [out]) is None, "None forgets"


def test_holds_now_is_true_only_while_the_very_objects_are_there():
    from workbench.addresses import holds_now

    a, b, c = np.zeros(2), np.zeros(2), np.zeros(2)
    arrays = [a, b, c]
    for keys in ((), (1,), (0, 2)):
        check = holds_now(arrays, keys)
        assert check(arrays)
        if keys:
            arrays[keys[-1]] = arrays[keys[-1]].copy()  # equal values, another object
            assert not check(arrays)
            arrays[:] = [a, b, c]
            assert check(arrays)
    buffers = {"x": a}
    check = holds_now(buffers, ["x"])
    del buffers["x"]
    with pytest.raises(KeyError):
        check(buffers)


def test_rooted_addresses_read_each_array_and_the_one_under_it():
    """Owning arrays and views of them read in bulk give what reading each one does
    (`KnownAddresses.where`); an array over another kind of buffer, or a subclass,
    gives None (read one at a time)."""
    cache = np.zeros((2, 3, 16, 8), np.float32)
    owned = np.arange(6, dtype=np.int64).reshape(1, 6)
    arrays = (owned, cache[:, :, :5], cache[:, 1:, 2:9], np.empty(0, np.float32))
    got = rooted_addresses(arrays)
    where = KnownAddresses()
    want = [where.where(a) for a in arrays]
    assert list(got[0]) == [w[0] for w in want]
    assert list(got[1]) == [w[2] for w in want]
    foreign = np.frombuffer(bytearray(32), np.float32)  # its base is no numpy array
    assert rooted_addresses((owned, foreign)) is None
    assert rooted_addresses((owned, cache.view(np.recarray))) is None
    assert rooted_addresses(()) is None
