"""The device-discipline double's machinery: device arrays, streams, capture, graphs, pools.

Arrays compute with numpy, but every boundary CuPy draws between host and device,
and every rule CUDA stream capture imposes, is enforced here. Each rule names the
CuPy source it mirrors (github.com/cupy/cupy, commit 6b6d956).

How capture is made faithful: while the current stream captures, every operation
on device arrays is *recorded* as a node -- (numpy function, arguments holding the
concrete device arrays, result arrays) -- and also computed, so that shapes and
dtypes are known to the code that issued it. At `end_capture` that computation is
undone, because stream capture records work without running it: every buffer that
existed before the capture gets back its old contents, and every buffer allocated
during the capture (from the graph's pool) is filled with poison. `Graph.launch`
then re-runs exactly the recorded nodes on the recorded buffers, writing each
result into the buffer the capture returned. A copy made outside the recording is
therefore not replayed, as on the GPU.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

# --- errors -----------------------------------------------------------------------------


class CUDARuntimeError(RuntimeError):
    """cupy_backends.cuda.api.runtime.CUDARuntimeError: a failed CUDA runtime call."""

    def __init__(self, status: str, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status


CAPTURE_UNSUPPORTED = "cudaErrorStreamCaptureUnsupported"
CAPTURE_INVALIDATED = "cudaErrorStreamCaptureInvalidated"

# --- dtypes: cupy/_core/_dtype.pyx `all_type_chars` and `check_supported_dtype` -----------

_SUPPORTED_CHARS = frozenset("?bhilqBHILQefdFD")


def check_dtype(dtype: Any) -> np.dtype:
    """CuPy 13 supports exactly these dtypes ('Unsupported dtype ...' otherwise: no strings,
    objects, structured types or bfloat16)."""
    dt = np.dtype(dtype)
    if dt.char not in _SUPPORTED_CHARS or dt.byteorder == ">":
        raise ValueError(f"Unsupported dtype {dt}")
    return dt


# --- runtime state ----------------------------------------------------------------------


class _Runtime:
    def __init__(self) -> None:
        self.null_stream: Stream | None = None
        self.current: Stream | None = None
        self.capture: _Capture | None = None
        self.default_pool: MemoryPool | None = None
        self.allocator: Callable | None = None
        #: counters tests read: device->host and host->device transfers, syncs
        self.d2h = 0
        self.h2d = 0
        self.syncs = 0

    def capturing(self) -> _Capture | None:
        """The capture the current stream is recording into, if any."""
        cap = self.capture
        if cap is not None and self.current is cap.stream:
            return cap
        return None


RT = _Runtime()


def _forbid_during_capture(what: str, *, sync: bool = False) -> None:
    """A host<->device transfer or a synchronisation while capturing.

    cupy/cuda/memory.pyx `copy_to_host_async` / `copy_from_host_async` raise
    RuntimeError('the current stream is capturing, so D2H|H2D transfers are
    disallowed') before calling CUDA. A synchronisation (cudaStreamSynchronize,
    cudaEventSynchronize) reaches CUDA, which returns cudaErrorStreamCaptureUnsupported
    and invalidates the capture sequence (CUDA Programming Guide, "Prohibited and
    Unhandled Operations")."""
    cap = RT.capture
    if cap is None:
        return
    if sync:
        cap.invalidated = f"{what} during stream capture"
        raise CUDARuntimeError(CAPTURE_UNSUPPORTED, f"operation not permitted when stream is capturing ({what})")
    if RT.current is cap.stream:
        raise RuntimeError(f"the current stream is capturing, so {what} are disallowed")


# --- memory: cupy/cuda/memory.pyx MemoryPool / set_allocator / get_allocator -----------


class MemoryPointer:
    def __init__(self, pool: MemoryPool | None, size: int, ptr: int = 0):
        self.pool, self.size, self.ptr = pool, size, ptr


class MemoryPool:
    """A pool: allocations are attributed to the pool whose `malloc` is the current
    allocator. The pool keeps its blocks alive (a graph's private pool lives with it)."""

    def __init__(self, allocator: Any = None) -> None:
        self.blocks: list[ndarray] = []
        self._bytes = 0

    def malloc(self, size: int) -> MemoryPointer:
        self._bytes += size
        return MemoryPointer(self, size)

    def used_bytes(self) -> int:
        return self._bytes

    def total_bytes(self) -> int:
        return self._bytes

    def free_all_blocks(self, stream: Any = None) -> None:
        self.blocks.clear()


def get_allocator() -> Callable:
    return RT.allocator


def set_allocator(allocator: Callable | None = None) -> None:
    RT.allocator = allocator if allocator is not None else RT.default_pool.malloc


def _allocate(a: np.ndarray) -> ndarray:
    """A new owner device array holding `a`'s storage, allocated by the current allocator.

    Workbench rule (the design's "memory touched inside a capture comes from a pool
    private to that graph"): during capture the current allocator must not be the
    default pool, whose blocks CuPy recycles (memory.pyx SingleDeviceMemoryPool
    free lists) while the graph still addresses them."""
    check_dtype(a.dtype)
    mem = RT.allocator(a.nbytes)
    cap = RT.capturing()
    if cap is not None:
        if mem.pool is RT.default_pool:
            cap.invalidated = "allocation from the default memory pool during capture"
            raise RuntimeError("allocation during stream capture from the default memory pool: its blocks "
                               "are recycled after the capture while the graph still addresses them; "
                               "switch in a pool private to the graph (cupy.cuda.set_allocator)")
    arr = ndarray._make(a, None)
    arr._mem = mem
    if cap is not None:
        cap.fresh.append(arr)
        cap.fresh_ids.add(id(arr))
        if mem.pool is not None:
            mem.pool.blocks.append(arr)
    return arr


# --- streams and events: cupy/cuda/stream.pyx --------------------------------------------


class Stream:
    null: Stream  # set below

    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False):
        self.ptr = 0 if null else id(self)
        self._prev: list = []

    def use(self) -> Stream:
        RT.current = self
        return self

    def __enter__(self) -> Stream:
        self._prev.append(RT.current)
        RT.current = self
        return self

    def __exit__(self, *exc: Any) -> None:
        RT.current = self._prev.pop()

    def synchronize(self) -> None:
        RT.syncs += 1
        _forbid_during_capture("cudaStreamSynchronize", sync=True)

    def begin_capture(self, mode: Any = None) -> None:
        # stream.pyx begin_capture: "cannot capture on the default (legacy) stream"
        if self.ptr in (0, 1):
            raise RuntimeError("cannot capture on the default (legacy) stream")
        if RT.capture is not None:
            raise CUDARuntimeError("cudaErrorIllegalState", "a stream capture is already in progress")
        RT.capture = _Capture(self)

    def end_capture(self) -> Graph:
        cap = RT.capture
        if cap is None or cap.stream is not self:
            raise CUDARuntimeError("cudaErrorIllegalState", "the stream is not capturing")
        RT.capture = None
        cap.undo()
        if cap.invalidated:
            raise CUDARuntimeError(CAPTURE_INVALIDATED, f"the capture was invalidated: {cap.invalidated}")
        return Graph._from_capture(cap)

    def is_capturing(self) -> bool:
        return RT.capture is not None and RT.capture.stream is self


Stream.null = Stream(null=True)


def get_current_stream() -> Stream:
    return RT.current


class Event:
    """cupy/cuda/stream.pyx Event: `record` notes the host clock (the double runs each
    kernel synchronously, so that is when the stream reached the event)."""

    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False):
        self.t: float | None = None

    def record(self, stream: Any = None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        RT.syncs += 1
        _forbid_during_capture("cudaEventSynchronize", sync=True)

    @property
    def done(self) -> bool:
        return True


def get_elapsed_time(start: Event, end: Event) -> float:
    """Milliseconds between two recorded events (stream.pyx get_elapsed_time)."""
    if start.t is None or end.t is None:
        raise CUDARuntimeError("cudaErrorInvalidResourceHandle", "event not recorded")
    return (end.t - start.t) * 1e3


# --- capture and graphs: cupy/cuda/graph.pyx ---------------------------------------------


class _Node:
    __slots__ = ("fn", "args", "kwargs", "results")

    def __init__(self, fn: Callable, args: tuple, kwargs: dict, results: list):
        self.fn, self.args, self.kwargs, self.results = fn, args, kwargs, results


class _Capture:
    def __init__(self, stream: Stream):
        self.stream = stream
        self.nodes: list[_Node] = []
        self.fresh: list[ndarray] = []  # allocated during capture (graph pool)
        self.fresh_ids: set[int] = set()
        self.saved: dict[int, tuple[ndarray, np.ndarray]] = {}  # pre-capture roots touched
        self.invalidated: str = ""

    def touch(self, arrays: list[ndarray]) -> None:
        """Keep the pre-capture contents of every existing buffer an op may write."""
        for a in arrays:
            root = a._root()
            key = id(root)
            if key not in self.saved and key not in self.fresh_ids:
                self.saved[key] = (root, root._a.copy())

    def undo(self) -> None:
        """Stream capture records and does not execute: nothing the capture pass
        computed may remain visible (CUDA Programming Guide, "Stream Capture")."""
        for root, before in self.saved.values():
            root._a[...] = before
        for a in self.fresh:
            _poison(a._a)
        self.saved.clear()


def _poison(a: np.ndarray) -> None:
    if a.dtype.kind == "f" or a.dtype.kind == "c":
        a[...] = np.nan
    elif a.dtype.kind == "b":
        a[...] = True
    elif a.dtype.kind in "iu":
        a[...] = np.iinfo(a.dtype).max // 3
    else:
        a.view(np.uint8)[...] = 0xA5


class Graph:
    """graph.pyx Graph: made only by stream capture; `launch` replays its nodes."""

    def __init__(self, *args: Any, **kwargs: Any):
        raise NotImplementedError("currently this class cannot be initiated by the user and must be "
                                  "created via stream capture")

    @classmethod
    def _from_capture(cls, cap: _Capture) -> Graph:
        g = object.__new__(cls)
        g.nodes = cap.nodes
        g.pool_arrays = cap.fresh  # the graph owns what was allocated while capturing
        g.launches = 0
        return g

    def launch(self, stream: Any = None) -> None:
        if RT.capture is not None:
            raise CUDARuntimeError(CAPTURE_UNSUPPORTED, "graph launch during capture is not modelled")
        self.launches += 1
        for node in self.nodes:
            result = node.fn(*_unwrap(node.args), **_unwrap(node.kwargs))
            for target, value in zip(node.results, _flatten(result)):
                if target is not None:
                    target._a[...] = value

    def upload(self, stream: Any = None) -> None:
        return None

    def __len__(self) -> int:
        return len(self.nodes)


# --- host <-> device ----------------------------------------------------------------------


def _h2d(value: Any, dtype: Any = None) -> ndarray:
    """A host value copied to a new device array (core.array / ndarray.set): refused
    while capturing (memory.pyx copy_from_host_async)."""
    _forbid_during_capture("H2D transfers")
    RT.h2d += 1
    host = np.array(value, dtype=dtype, copy=True)
    return _allocate(host)


def _d2h(a: ndarray) -> np.ndarray:
    """core.pyx `get`: a D2H copy then a stream synchronize; refused while capturing."""
    _forbid_during_capture("D2H transfers")
    RT.d2h += 1
    return a._a.copy()


# --- wrapping numpy calls -------------------------------------------------------------------


def _unwrap(x: Any) -> Any:
    if isinstance(x, ndarray):
        return x._a
    if type(x) is tuple:
        return tuple(_unwrap(v) for v in x)
    if type(x) is list:
        return [_unwrap(v) for v in x]
    if type(x) is dict:
        return {k: _unwrap(v) for k, v in x.items()}
    return x


def _collect(x: Any, found: list) -> None:
    if isinstance(x, ndarray):
        found.append(x)
    elif type(x) in (tuple, list):
        for v in x:
            _collect(v, found)
    elif type(x) is dict:
        for v in x.values():
            _collect(v, found)


def _flatten(result: Any) -> list:
    if type(result) in (tuple, list):
        return list(result)
    return [result]


def _np_root(a: Any) -> Any:
    while isinstance(getattr(a, "base", None), np.ndarray):
        a = a.base
    return a


def reject_host_arrays(x: Any, where: str) -> None:
    """cupy/_core/_kernel.pyx `_preprocess_arg` -> _scalar.pyx CScalar: an argument that
    is neither a device array nor a Python/NumPy scalar raises TypeError('Unsupported
    type ...'), so a numpy.ndarray (even 0-d) never reaches a kernel implicitly."""
    if isinstance(x, np.ndarray):
        raise TypeError(f"Unsupported type {type(x)} (a numpy.ndarray passed to {where}; "
                        "copy it to the device with cupy.asarray first)")
    if type(x) in (tuple, list):
        for v in x:
            reject_host_arrays(v, where)


def _wrap(result: Any, args_found: list[ndarray]) -> tuple[Any, list]:
    """Numpy results as device arrays: an input itself (out=), a view of an input's
    storage, or a fresh allocation. Returns (wrapped, per-result recording targets)."""
    by_id = {id(a._a): a for a in args_found}
    roots = {}
    for a in args_found:
        roots.setdefault(id(_np_root(a._a)), a._root())
    targets: list = []

    def one(r: Any) -> Any:
        if isinstance(r, np.ndarray):
            same = by_id.get(id(r))
            if same is not None:
                targets.append(None)  # written in place through out=: the replay writes it again
                return same
            root = roots.get(id(_np_root(r)))
            if root is not None:
                targets.append(None)  # a view: no kernel, its replay is the view itself
                return ndarray._make(r, root)
            arr = _allocate(r)
            targets.append(arr)
            return arr
        if isinstance(r, np.generic):  # CuPy reductions return 0-d device arrays
            arr = _allocate(np.asarray(r))
            targets.append(arr)
            return arr
        targets.append(None)
        return r

    if type(result) in (tuple, list):
        return type(result)(one(r) for r in result), targets
    return one(result), targets


def call(fn: Callable, args: tuple, kwargs: dict, *, strict: bool = True, where: str = "") -> Any:
    """Run numpy `fn` on device arrays; record it when the current stream captures."""
    if strict:
        reject_host_arrays(args, where or getattr(fn, "__name__", "a cupy function"))
        reject_host_arrays(tuple(kwargs.values()), where or getattr(fn, "__name__", "a cupy function"))
    found: list[ndarray] = []
    _collect(args, found)
    _collect(kwargs, found)
    cap = RT.capturing()
    if cap is not None:
        cap.touch(found)
    result = fn(*_unwrap(args), **_unwrap(kwargs))
    wrapped, targets = _wrap(result, found)
    if cap is not None:
        cap.nodes.append(_Node(fn, args, kwargs, targets))
    return wrapped


# --- the device array -----------------------------------------------------------------------


class _Flags:
    def __init__(self, a: np.ndarray):
        self.c_contiguous = a.flags.c_contiguous
        self.f_contiguous = a.flags.f_contiguous
        self.owndata = False

    def __getitem__(self, key: str) -> bool:
        return {"C_CONTIGUOUS": self.c_contiguous, "F_CONTIGUOUS": self.f_contiguous}[key]


class _Data:
    def __init__(self, a: np.ndarray, mem: MemoryPointer | None):
        self.ptr = a.__array_interface__["data"][0] if a.size else 0
        self.mem = mem


#: numpy methods that write into the array they are called on
_IN_PLACE_METHODS = frozenset({"fill", "sort", "put", "partition", "itemset", "resize"})


class ndarray:  # noqa: N801 - CuPy's name
    """A device array: wraps a numpy array but is not one (core.pyx `_ndarray_base`)."""

    __slots__ = ("_a", "_base", "_mem", "__weakref__")
    __array_priority__ = 100  # core.pyx: outranks numpy in mixed binary operators

    def __init__(self, shape: Any, dtype: Any = float, memptr: Any = None, strides: Any = None,
                 order: str = "C"):
        if memptr is not None or strides is not None:
            raise NotImplementedError("the double does not model memptr/strides construction")
        made = _allocate(np.empty(shape, dtype=check_dtype(dtype), order=order))
        self._a, self._base, self._mem = made._a, None, made._mem

    @classmethod
    def _make(cls, a: np.ndarray, base: ndarray | None) -> ndarray:
        obj = object.__new__(cls)
        obj._a, obj._base, obj._mem = a, base, None
        return obj

    def _root(self) -> ndarray:
        return self._base if self._base is not None else self

    # -- attributes ----------------------------------------------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    strides = property(lambda self: self._a.strides)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    base = property(lambda self: self._base)
    flags = property(lambda self: _Flags(self._a))
    data = property(lambda self: _Data(self._a, self._mem))
    T = property(lambda self: self.transpose())
    device = property(lambda self: Device(0))

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.data.ptr, False),
                "strides": self.strides, "version": 3}

    # -- the host boundary (core.pyx) ---------------------------------------------------

    def __array__(self, dtype: Any = None, copy: Any = None):
        # core.pyx __array__
        raise TypeError("Implicit conversion to a NumPy array is not allowed. "
                        "Please use `.get()` to construct a NumPy array explicitly.")

    def get(self, stream: Any = None, order: str = "C", out: Any = None, blocking: bool = True) -> np.ndarray:
        host = _d2h(self)
        if out is not None:
            out[...] = host
            return out
        return host

    def set(self, arr: Any, stream: Any = None) -> None:
        # core.pyx set: numpy only, same dtype and shape, contiguous destination
        if not isinstance(arr, np.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if self.dtype != arr.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if self.shape != arr.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        if not (self._a.flags.c_contiguous or self._a.flags.f_contiguous):
            raise RuntimeError("Cannot set to non-contiguous array")
        _forbid_during_capture("H2D transfers")
        RT.h2d += 1
        self._a[...] = arr

    def item(self) -> Any:
        # core.pyx item: size check, then self.get().item()
        if self.size != 1:
            raise ValueError("can only convert an array of size 1 to a Python scalar")
        return self.get().item()

    def tolist(self) -> Any:
        return self.get().tolist()

    def __int__(self) -> int:
        return int(self.get())

    def __float__(self) -> float:
        return float(self.get())

    def __complex__(self) -> complex:
        return complex(self.get())

    def __index__(self) -> int:
        return self.get().__index__()

    def __bool__(self) -> bool:
        # core.pyx __nonzero__: a one-element array's truth is read from the device
        return bool(self.get())

    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    def __repr__(self) -> str:
        return f"<device array shape={self.shape} dtype={self.dtype}>"

    def __reduce__(self):
        raise TypeError("the double does not pickle device arrays")

    # -- numpy protocol: numpy functions called on device arrays dispatch to cupy -----

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        # core.pyx __array_ufunc__: dispatch to the cupy ufunc; numpy.ndarray inputs then
        # raise TypeError in _preprocess_args
        from . import _module  # noqa: PLC0415

        fn = _module.lookup(ufunc.__name__)
        if fn is None:
            return NotImplemented
        if method != "__call__":
            fn = getattr(fn, method, None)
            if fn is None:
                return NotImplemented
        if "out" in kwargs:
            out = kwargs["out"]
            if isinstance(out, tuple):
                if len(out) != 1:
                    raise ValueError("The 'out' parameter must have exactly one array value")
                kwargs["out"] = out[0]
        return fn(*inputs, **kwargs)

    def __array_function__(self, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        # core.pyx __array_function__: the cupy function of the same name, if any
        from . import _module  # noqa: PLC0415

        fn = _module.lookup(func.__name__)
        if fn is None:
            return NotImplemented
        return fn(*args, **kwargs)

    # -- indexing (core.pyx __getitem__ / __setitem__, _routines_indexing.pyx) ----------

    def __getitem__(self, key: Any) -> Any:
        key = _device_key(key)
        if _mask_index(key):
            # _routines_indexing.pyx: a boolean-mask selection sizes its result from the
            # mask's count, read on the host (a D2H copy and a sync)
            _forbid_during_capture("D2H transfers (boolean-mask indexing sizes its result on the host)")
        if _basic(key):
            # an integer index gives a 0-d device view, never a numpy scalar:
            # _routines_indexing.pyx `_view_getitem` appends an Ellipsis to the
            # index only where it has none (a second one is its "an index can only have
            # a single ellipsis" IndexError), and numpy returns a 0-d view for such a key
            keys = key if type(key) is tuple else (key,)
            if not any(k is Ellipsis for k in keys):
                key = keys + (Ellipsis,)
        return call(_getitem, (self, key), {}, strict=False)

    def __setitem__(self, key: Any, value: Any) -> None:
        key = _device_key(key)
        if not isinstance(value, ndarray):
            advanced = _advanced(key)
            if advanced:
                # _scatter_op_single: `core.array(value, dtype=a.dtype)` -- an H2D copy
                if isinstance(value, (np.ndarray, list, tuple)):
                    value = _h2d(value, self.dtype)
            else:
                # _scatter_op 'update' -> fill (core.pyx fill): refuses non-scalar host arrays
                host = np.asarray(value, dtype=self.dtype) if not isinstance(value, np.ndarray) else value
                if host.shape != ():
                    raise ValueError("non-scalar numpy.ndarray cannot be used for fill")

        def setitem(a: np.ndarray, k: Any, v: Any) -> None:
            a[k] = v

        call(setitem, (self, key, value), {}, strict=False)

    # -- methods ---------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        method = getattr(np.ndarray, name, None)
        if method is None or not callable(method):
            raise AttributeError(f"'cupy.ndarray' object has no attribute {name!r}")

        def bound(*args: Any, **kwargs: Any) -> Any:
            return call(method, (self, *args), kwargs, where=f"ndarray.{name}")

        return bound

    def astype(self, dtype: Any, order: str = "K", casting: Any = None, subok: Any = None,
               copy: bool = True) -> ndarray:
        check_dtype(dtype)
        return call(np.ndarray.astype, (self, dtype), {"copy": copy})

    def view(self, dtype: Any = None) -> ndarray:
        if dtype is not None:
            check_dtype(dtype)
            return call(np.ndarray.view, (self, dtype), {})
        return call(np.ndarray.view, (self,), {})

    def copy(self, order: str = "C") -> ndarray:
        return call(np.ndarray.copy, (self,), {"order": order})


def _getitem(a: np.ndarray, key: Any) -> Any:
    return a[key]


def _device_key(key: Any) -> Any:
    """Index arrays given on the host are copied to the device (_prepare_slice_list calls
    core.array on a list / numpy array index): an H2D transfer."""
    if isinstance(key, (np.ndarray, list)):
        return _h2d(key)
    if type(key) is tuple:
        return tuple(_h2d(k) if isinstance(k, (np.ndarray, list)) else k for k in key)
    return key


def _advanced(key: Any) -> bool:
    keys = key if type(key) is tuple else (key,)
    return any(isinstance(k, (ndarray, np.ndarray, list)) for k in keys)


def _mask_index(key: Any) -> bool:
    keys = key if type(key) is tuple else (key,)
    return any(isinstance(k, ndarray) and k.dtype == np.bool_ for k in keys)


def _basic(key: Any) -> bool:
    keys = key if type(key) is tuple else (key,)
    return all(isinstance(k, (int, np.integer, slice)) or k is None or k is Ellipsis for k in keys) \
        and any(isinstance(k, (int, np.integer)) for k in keys)


def _operator(name: str, reflected: bool = False, in_place: bool = False) -> Callable:
    op = getattr(np.ndarray, name)

    def method(self: ndarray, other: Any = None, *rest: Any) -> Any:
        if other is None and name in ("__neg__", "__pos__", "__abs__", "__invert__"):
            return call(op, (self,), {})
        if isinstance(other, np.ndarray):
            # core.pyx binary operators go through cupy ufuncs: a numpy.ndarray operand is
            # an 'Unsupported type' (_kernel.pyx _preprocess_arg)
            raise TypeError(f"Unsupported type {type(other)} (numpy.ndarray operand of {name})")
        return call(op, (self, other, *rest), {}, where=name)

    method.__name__ = name
    return method


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
              "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__",
              "__rpow__", "__matmul__", "__rmatmul__", "__and__", "__rand__", "__or__", "__ror__",
              "__xor__", "__rxor__", "__lshift__", "__rlshift__", "__rshift__", "__rrshift__",
              "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__", "__neg__", "__pos__",
              "__abs__", "__invert__", "__iadd__", "__isub__", "__imul__", "__itruediv__",
              "__ifloordiv__", "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__",
              "__ilshift__", "__irshift__"):
    setattr(ndarray, _name, _operator(_name))
ndarray.__hash__ = None  # type: ignore[assignment]


class Device:
    def __init__(self, device: int = 0):
        self.id = device

    def synchronize(self) -> None:
        RT.syncs += 1
        _forbid_during_capture("cudaDeviceSynchronize", sync=True)

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def _init_runtime() -> None:
    RT.null_stream = Stream.null
    RT.current = Stream.null
    RT.default_pool = MemoryPool()
    RT.allocator = RT.default_pool.malloc


_init_runtime()

__all__ = ["RT", "CUDARuntimeError", "Device", "Event", "Graph", "MemoryPool", "Stream", "call",
           "check_dtype", "get_allocator", "get_current_stream", "get_elapsed_time", "ndarray",
           "set_allocator", "weakref"]
