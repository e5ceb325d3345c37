"""CuPy backend: kernels run on the same array code through CuPy on one stream;
captured segments become `cupy.cuda.Graph`s recorded by stream capture.

Every allocation made while a segment is being captured comes from a memory pool
private to that graph (switched in for the capture, kept alive with the graph), so
the addresses baked into the graph are never handed to anything else.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class CudaGraph:
    """A segment under capture, then its instantiated graph and private pool."""

    def __init__(self, pool: Any):
        self.pool = pool
        self.graph: Any = None


class CudaBackend:
    name = "cuda"
    supports_capture = True
    #: stream capture records without executing: a captured segment must be launched
    capture_executes_work = False

    def __init__(self) -> None:
        import cupy  # noqa: PLC0415 - optional dependency, checked by get_backend

        self.cp = cupy
        self.xp = cupy
        # capture is refused on the legacy default stream: all work goes to our own
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.stream.use()
        self._default_allocator = cupy.cuda.get_allocator()

    # -- memory ---------------------------------------------------------------------

    def allocate(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        dtype = np.dtype(dtype)
        count = 1
        for d in shape:
            count *= d
        raw = self.cp.empty(max(count * dtype.itemsize, 1), dtype=self.cp.uint8)
        return raw[: count * dtype.itemsize].view(dtype).reshape(shape)

    def from_host(self, array: Any) -> Any:
        if isinstance(array, self.cp.ndarray):
            return array
        array = np.asarray(array)
        if array.dtype.hasobject:
            return array  # strings stay on the host
        return self.cp.asarray(array)

    def adopt(self, value: Any) -> Any:
        """A kernel's fresh result as a device array (host fallbacks return numpy)."""
        if isinstance(value, np.ndarray) and not value.dtype.hasobject:
            return self.cp.asarray(value)
        return value

    def to_host(self, array: Any) -> np.ndarray:
        if isinstance(array, self.cp.ndarray):
            return self.cp.asnumpy(array, stream=self.stream)
        return np.array(array, copy=True)

    def synchronize(self) -> None:
        self.stream.synchronize()

    # -- device graphs --------------------------------------------------------------

    def begin_capture(self) -> CudaGraph:
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
