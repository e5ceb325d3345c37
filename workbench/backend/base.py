"""The one object the executor talks to for memory, device work and graph capture.

`CpuBackend` (numpy) and `CudaBackend` (CuPy) both implement all of it; the
executor never touches numpy or CuPy memory APIs directly.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np


class Backend(Protocol):
    name: str
    #: the array module kernels compute with (numpy or cupy)
    xp: Any
    #: whether begin/end_capture record launches into replayable graphs
    supports_capture: bool
    #: True when a capture also runs the work (CPU); False when it only records (CUDA)
    capture_executes_work: bool
    #: True when buffers are host arrays a caller can be handed as they are (CPU)
    buffers_are_host: bool

    def allocate(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        """A fresh owner buffer: flat bytes with a typed array view of `shape` over them."""

    def from_host(self, array: np.ndarray) -> Any:
        """Place a host array on the backend (may share memory on the CPU)."""

    def adopt(self, value: Any) -> Any:
        """A kernel's fresh result as a backend array (host fallbacks return numpy)."""

    def to_host(self, array: Any) -> np.ndarray:
        """An independent host copy of a backend array."""

    def copy_from_host(self, dst: Any, src: np.ndarray) -> Any:
        """Write host array `src` into the existing backend array `dst` in place (same
        shape and dtype; `dst` keeps its address, so a captured graph reading it sees
        the new contents). Returns `dst`."""

    def synchronize(self) -> None:
        """Wait for queued device work to finish."""

    def work_scope(self) -> AbstractContextManager:
        """The context every piece of this backend's device work is issued in. On CUDA
        it makes the backend's stream the current one: CuPy launches each kernel on the
        current stream, and each session has a stream of its own, so without it one
        session's kernels land on whichever stream another session made current last
        (work a capture of this session would not record, and its syncs not wait for)."""

    #: a zero-argument clock in seconds whose differences are what `stop_timer` would
    #: give (a host backend's wall clock), or None where timing takes the backend's
    #: own timers (device events)
    host_clock: Any

    def start_timer(self) -> Any:
        """Mark the start of timed work on the backend's stream."""

    def stop_timer(self, start: Any) -> float:
        """Seconds the backend spent on the work queued since `start_timer` (device
        time on CUDA: events, then a wait for the end event; host time while capturing,
        when nothing runs)."""

    def begin_capture(self) -> Any:
        """Start recording kernel launches; returns the graph being recorded."""

    def record(self, graph: Any, fn: Callable, ins: list, outs: list) -> None:
        """Note one launch with its concrete buffers (a no-op where the stream records)."""

    def end_capture(self, graph: Any) -> Any:
        """Finish recording; returns a graph `launch` can replay."""

    def abort_capture(self, graph: Any) -> None:
        """Abandon a recording a kernel broke."""

    def launch(self, graph: Any) -> None:
        """Replay a captured graph against the buffers it was recorded with."""
