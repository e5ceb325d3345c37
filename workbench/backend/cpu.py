"""numpy backend: host memory, no device, synchronous."""

from __future__ import annotations

import contextlib
import operator
import time

import numpy as np

_NO_SCOPE = contextlib.nullcontext()


class CpuGraph:
    """A recorded segment: the exact kernel launches with their concrete buffers."""

    def __init__(self) -> None:
        self.launches: list[tuple] = []

    def __len__(self) -> int:
        return len(self.launches)


class CpuBackend:
    name = "cpu"
    xp = np
    supports_capture = True
    #: numpy runs each launch as it is recorded, so a capture pass also computes
    capture_executes_work = True
    buffers_are_host = True

    def allocate(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return np.empty(shape, dtype=dtype)

    def from_host(self, array: np.ndarray) -> np.ndarray:
        return array

    def adopt(self, value):
        """A kernel's fresh result as a backend array."""
        return value if isinstance(value, np.ndarray) else np.asarray(value)

    def to_host(self, array: np.ndarray) -> np.ndarray:
        return np.array(array, copy=True)

    def copy_from_host(self, dst: np.ndarray, src: np.ndarray) -> np.ndarray:
        dst[...] = src
        return dst

    def synchronize(self) -> None:
        return None

    def work_scope(self) -> contextlib.nullcontext:
        return _NO_SCOPE  # numpy has no streams: work runs where it is called

    #: the timers are the host's wall clock: an eager node's time is two reads of
    #: `host_clock` (the executor calls it directly, a C function, where a traced step
    #: would otherwise make two Python calls per node)
    host_clock = staticmethod(time.perf_counter)
    start_timer = host_clock

    def stop_timer(self, start: float) -> float:
        return time.perf_counter() - start

    # -- device graphs: recorded launch lists ---------------------------------------

    def begin_capture(self) -> CpuGraph:
        return CpuGraph()

    def record(self, graph: CpuGraph, fn, ins: list, outs: list) -> None:
        graph.launches.append((fn, list(ins), list(outs)))

    def end_capture(self, graph: CpuGraph) -> CpuGraph:
        return graph

    def abort_capture(self, graph: CpuGraph) -> None:
        graph.launches.clear()

    def launch(self, graph: CpuGraph) -> None:
        is_not = operator.is_not
        for fn, ins, outs in graph.launches:
            results = fn(ins, outs)
            if any(map(is_not, results, outs)):  # one pass in C; a kernel nearly always wrote in place
                for out, r in zip(outs, results):
                    if out is not None and r is not out:
                        out[...] = r  # a kernel that computed out of place still lands in its buffer
