"""CuPy backend: kernels run on the same array code through CuPy on one stream;
captured segments become `cupy.cuda.Graph`s recorded by stream capture.

Every allocation made while a segment is being captured comes from a memory pool
private to that graph (switched in for the capture, kept alive with the graph), so
the addresses baked into the graph are never handed to anything else.

The array module is passed in: real CuPy, or (tests only, through `backend.cuda_module`)
the device-discipline double that enforces CuPy's host/device and capture rules.

Host <-> device discipline: a host array reaches the device only through
`from_host` / `adopt` / `copy_from_host` (cupy.asarray / ndarray.set), and leaves it
only through `to_host` (cupy.asnumpy); CuPy refuses implicit conversions either way
(`device[...] = host` routes to `fill`, which rejects non-scalar arrays).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np


class CudaGraph:
    """A segment under capture, then its instantiated graph and private pool."""

    def __init__(self, pool: Any):
        self.pool = pool
        self.graph: Any = None


#: dtypes CuPy 13 cannot hold (cupy/_core/_dtype.pyx supports '?bhilqBHILQefdFD'):
#: such values stay on the host and the kernels reading them are host fallbacks
_DEVICE_CHARS = frozenset("?bhilqBHILQefdFD")


def on_device_dtype(dtype: np.dtype) -> bool:
    return np.dtype(dtype).char in _DEVICE_CHARS


class CudaBackend:
    name = "cuda"
    supports_capture = True
    #: stream capture records without executing: a captured segment must be launched
    capture_executes_work = False
    buffers_are_host = False  # a caller gets host copies
    host_clock = None  # nodes are timed by events on the stream

    def __init__(self, cupy: Any = None) -> None:
        if cupy is None:
            import cupy  # noqa: PLC0415 - optional dependency, checked by get_backend

        self.cp = cupy
        self.xp = cupy
        # capture is refused on the legacy default stream: all work goes to our own,
        # made current only inside `work_scope` (never for the whole thread: another
        # session, or the user's own CuPy code, has a current stream of its own)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self._default_allocator = cupy.cuda.get_allocator()

    # -- memory ---------------------------------------------------------------------

    def allocate(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        dtype = np.dtype(dtype)
        if not on_device_dtype(dtype):  # strings, objects, bfloat16: host storage
            return np.empty(shape, dtype=dtype)
        count = 1
        for d in shape:
            count *= d
        raw = self.cp.empty(max(count * dtype.itemsize, 1), dtype=self.cp.uint8)
        return raw[: count * dtype.itemsize].view(dtype).reshape(shape)

    def from_host(self, array: Any) -> Any:
        if isinstance(array, self.cp.ndarray):
            return array
        array = np.asarray(array)
        if not on_device_dtype(array.dtype):
            return array  # strings / objects / bfloat16 stay on the host
        return self.cp.asarray(array)

    def adopt(self, value: Any) -> Any:
        """A kernel's fresh result as a device array (host fallbacks return numpy)."""
        if isinstance(value, (np.ndarray, np.generic)) and on_device_dtype(value.dtype):
            return self.cp.asarray(np.asarray(value))
        return value

    def to_host(self, array: Any) -> np.ndarray:
        if isinstance(array, self.cp.ndarray):
            return self.cp.asnumpy(array, stream=self.stream)
        return np.array(array, copy=True)

    def copy_from_host(self, dst: Any, src: np.ndarray) -> Any:
        """`dst[...] = host` would route to ndarray.fill, which rejects a non-scalar
        numpy array (cupy/_core/core.pyx fill); ndarray.set copies H2D in place."""
        if not isinstance(dst, self.cp.ndarray):
            dst[...] = src
            return dst
        src = np.asarray(src, dtype=dst.dtype, order="C")  # ascontiguousarray would make a 0-d value 1-d
        if src.shape != dst.shape:
            src = np.broadcast_to(src, dst.shape).copy()
        if dst.flags.c_contiguous:
            dst.set(src, stream=self.stream)
        else:  # a strided destination: stage contiguously on the device, then copy there
            dst[...] = self.cp.asarray(src)
        return dst

    def synchronize(self) -> None:
        self.stream.synchronize()

    def work_scope(self) -> Any:
        # cupy's Stream is a context manager: current on entry, the previous one restored
        # on exit (stream.pyx __enter__ / __exit__)
        return self.stream

    def start_timer(self) -> Any:
        if self.stream.is_capturing():  # nothing runs while recording; events cannot sync
            return (time.perf_counter(), None)
        start = self.cp.cuda.Event()
        start.record(self.stream)
        return (time.perf_counter(), start)

    def stop_timer(self, start: Any) -> float:
        t0, event = start
        if event is None or self.stream.is_capturing():
            return time.perf_counter() - t0
        end = self.cp.cuda.Event()
        end.record(self.stream)
        end.synchronize()
        return self.cp.cuda.get_elapsed_time(event, end) / 1e3

    # -- device graphs --------------------------------------------------------------

    def begin_capture(self) -> CudaGraph:
        current = self.cp.cuda.get_current_stream()
        if current is not self.stream and getattr(current, "ptr", None) != self.stream.ptr:
            # a capture in relaxed mode (CuPy's default) lets kernels issued on another
            # stream run eagerly, unrecorded: the graph would replay nothing
            raise RuntimeError(
                "begin_capture outside the backend's work_scope: the current CUDA stream is not the "
                "session's own, so its kernels would not be recorded")
        pool = self.cp.cuda.MemoryPool()
        self.cp.cuda.set_allocator(pool.malloc)
        try:
            self.stream.begin_capture()
        except Exception:
            self.cp.cuda.set_allocator(self._default_allocator)
            raise
        return CudaGraph(pool)

    def record(self, graph: CudaGraph, fn, ins: list, outs: list) -> None:
        return None  # stream capture has recorded the kernel's launches already

    def end_capture(self, graph: CudaGraph) -> CudaGraph:
        try:
            graph.graph = self.stream.end_capture()
        finally:
            self.cp.cuda.set_allocator(self._default_allocator)
        return graph

    def abort_capture(self, graph: CudaGraph) -> None:
        """End a capture a kernel broke; the partial graph is discarded."""
        try:
            if self.stream.is_capturing():
                self.stream.end_capture()
        except Exception:  # noqa: BLE001 - an invalidated capture ends with an error
            pass
        finally:
            self.cp.cuda.set_allocator(self._default_allocator)

    def launch(self, graph: CudaGraph) -> None:
        graph.graph.launch(stream=self.stream)
