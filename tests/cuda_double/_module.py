"""The `cupy`-shaped module: functions over device arrays, computed by numpy.

Only names the real `cupy` module has are served (`_namespace.CUPY_NAMES`); each is
numpy's function run through `_core.call`, which refuses host arrays as CuPy's
kernels do and records the call while a stream captures. Rules where CuPy differs
from "numpy on other memory" are spelled out below.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import numpy as np

from . import _core
from ._core import RT, _allocate, _d2h, _forbid_during_capture, _h2d, call, check_dtype, ndarray
from ._namespace import CUPY_NAMES

__version__ = "13.6.0+workbench-device-double"

#: cupy functions whose result size is decided on the host from device data: CuPy
#: synchronises (a D2H read of a count) inside them, so they cannot be captured
_SYNCING = frozenset({"nonzero", "argwhere", "flatnonzero", "unique", "compress", "extract"})

#: creation from host data (from_data.py array/asarray/asanyarray/ascontiguousarray ->
#: _core.array): an H2D copy when given host data
_FROM_HOST = frozenset({"array", "asarray", "asanyarray", "ascontiguousarray"})


def _host_data(x: Any) -> bool:
    return not isinstance(x, ndarray)


def _from_host(name: str):

    def fn(a: Any, dtype: Any = None, *args: Any, **kwargs: Any) -> ndarray:
        if dtype is not None:
            check_dtype(dtype)
        if isinstance(a, ndarray):
            copy = name == "array" and kwargs.get("copy", True) is not False
            if name == "asarray" and kwargs.get("copy") is True:
                copy = True
            if not copy and (dtype is None or np.dtype(dtype) == a.dtype) \
                    and (name != "ascontiguousarray" or a.flags.c_contiguous):
                return a
            return call(lambda x, d: np.array(x, dtype=d, order="C"), (a, dtype), {})
        if isinstance(a, (list, tuple)) and any(isinstance(v, ndarray) for v in a):
            # a sequence holding device arrays: CuPy concatenates on the device
            return call(lambda *xs: np.array(list(xs), dtype=dtype), tuple(a), {})
        host = np.asarray(a, dtype=dtype)
        check_dtype(host.dtype)
        return _h2d(host)

    fn.__name__ = name
    return fn


def asnumpy(a: Any, stream: Any = None, order: str = "C", out: Any = None, blocking: bool = True) -> np.ndarray:
    if isinstance(a, ndarray):
        return a.get(stream=stream, out=out)
    return np.asarray(a, order=order)


def get_array_module(*args: Any) -> Any:
    import sys  # noqa: PLC0415

    if any(isinstance(a, ndarray) for a in args):
        return sys.modules[__name__.rsplit(".", 1)[0]]
    return np


class ufunc:  # noqa: N801 - CuPy's name
    """cupy._core.ufunc: elementwise kernels; numpy.ndarray operands are refused."""

    def __init__(self, np_ufunc: np.ufunc):
        self._u = np_ufunc
        self.__name__ = np_ufunc.__name__
        self.nin, self.nout, self.nargs = np_ufunc.nin, np_ufunc.nout, np_ufunc.nargs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if "dtype" in kwargs and kwargs["dtype"] is not None:
            check_dtype(kwargs["dtype"])
        return call(self._u, args, kwargs, where=f"cupy.{self.__name__}")

    def _method(self, name: str):
        method = getattr(self._u, name)

        def run(*args: Any, **kwargs: Any) -> Any:
            return call(method, args, kwargs, where=f"cupy.{self.__name__}.{name}")

        return run

    def __getattr__(self, name: str) -> Any:
        if name in ("reduce", "accumulate", "reduceat", "outer", "at"):
            return self._method(name)
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"<ufunc '{self.__name__}'>"


def _function(name: str, np_fn: Any):
    sync = name in _SYNCING

    @functools.wraps(np_fn)
    def fn(*args: Any, **kwargs: Any) -> Any:
        if sync or (name == "where" and len(args) == 1 and not kwargs):
            _forbid_during_capture(f"D2H transfers (cupy.{name} sizes its result on the host)")
        if "dtype" in kwargs and kwargs["dtype"] is not None:
            check_dtype(kwargs["dtype"])
        return call(np_fn, args, kwargs, where=f"cupy.{name}")

    return fn


_cache: dict[str, Any] = {}


def lookup(name: str) -> Any:
    """cupy.NAME, or None where CuPy has no such name."""
    got = _cache.get(name)
    if got is not None:
        return got
    if name in _FROM_HOST:
        got = _from_host(name)
    elif name in _SPECIAL:
        got = _SPECIAL[name]
    elif name in CUPY_NAMES and hasattr(np, name):
        attr = getattr(np, name)
        if isinstance(attr, np.ufunc):
            got = ufunc(attr)
        elif isinstance(attr, type) or not callable(attr):
            got = attr  # dtypes, scalar types, constants, finfo/iinfo classes
        else:
            got = _function(name, attr)
    else:
        return None
    _cache[name] = got
    return got


def _shape_only(np_fn: Any):
    """Queries of shape / dtype only: no device work, nothing recorded."""

    def fn(*args: Any, **kwargs: Any) -> Any:
        return np_fn(*_core._unwrap(args), **_core._unwrap(kwargs))

    return fn


def _copyto(dst: ndarray, src: Any, casting: str = "same_kind", where: Any = True) -> None:
    if not isinstance(dst, ndarray):
        raise TypeError(f"destination must be a cupy.ndarray, got {type(dst)}")
    if isinstance(src, np.ndarray) and src.shape != ():
        # _manipulation/basic.py copyto: a host source is taken as a scalar (fill) only
        raise TypeError(f"Unsupported type {type(src)} (copyto from a non-scalar numpy.ndarray)")
    call(np.copyto, (dst, src), {"casting": casting, "where": where}, strict=False)


_SPECIAL: dict[str, Any] = {
    "ndarray": ndarray,
    "ufunc": ufunc,
    "asnumpy": asnumpy,
    "get_array_module": get_array_module,
    "copyto": _copyto,
    "shape": _shape_only(np.shape),
    "ndim": _shape_only(np.ndim),
    "size": _shape_only(np.size),
    "result_type": _shape_only(np.result_type),
    "can_cast": _shape_only(np.can_cast),
    "dtype": np.dtype,
    "may_share_memory": _shape_only(np.may_share_memory),
    "shares_memory": _shape_only(np.shares_memory),
}


def _erf(x: Any, out: Any = None) -> Any:
    from scipy.special import erf  # noqa: PLC0415

    if out is None:
        return call(erf, (x,), {})
    return call(erf, (x,), {"out": out})


#: stands in for `cupyx.scipy.special` (workbench's Erf kernel asks the array module
#: for it before importing cupyx)
__cupyx_scipy_special__ = types.SimpleNamespace(erf=_erf)


# --- cupy.cuda -------------------------------------------------------------------------


class _RuntimeModule(types.SimpleNamespace):
    pass


runtime = _RuntimeModule(
    CUDARuntimeError=_core.CUDARuntimeError,
    getDeviceProperties=lambda device=0: {"name": b"workbench device-discipline double (numpy)",
                                          "totalGlobalMem": 1 << 34},
    getDeviceCount=lambda: 1,
    runtimeGetVersion=lambda: 13000,
    driverGetVersion=lambda: 13000,
    deviceSynchronize=lambda: _core.Device(0).synchronize(),
    streamCaptureModeRelaxed=2,
    streamCaptureModeGlobal=0,
)

cuda = types.SimpleNamespace(
    Stream=_core.Stream,
    Event=_core.Event,
    Graph=_core.Graph,
    Device=_core.Device,
    MemoryPool=_core.MemoryPool,
    MemoryPointer=_core.MemoryPointer,
    get_allocator=_core.get_allocator,
    set_allocator=_core.set_allocator,
    get_current_stream=_core.get_current_stream,
    get_elapsed_time=_core.get_elapsed_time,
    is_available=lambda: True,
    runtime=runtime,
    memory=types.SimpleNamespace(MemoryPool=_core.MemoryPool),
)


def is_available() -> bool:
    return True


def get_default_memory_pool() -> Any:
    return RT.default_pool


__all__ = ["RT", "asnumpy", "cuda", "get_array_module", "get_default_memory_pool", "is_available",
           "lookup", "ndarray", "runtime", "ufunc", "_allocate", "_d2h"]
