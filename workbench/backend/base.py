"""The one object the executor talks to for memory and device work."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Backend(Protocol):
    name: str
    #: the array module kernels compute with (numpy or cupy)
    xp: Any

    def allocate(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        """A fresh owner buffer: flat bytes with a typed array view of `shape` over them."""

    def from_host(self, array: np.ndarray) -> Any:
        """Place a host array on the backend (may share memory on the CPU)."""

    def to_host(self, array: Any) -> np.ndarray:
        """An independent host copy of a backend array."""

    def synchronize(self) -> None:
        """Wait for queued device work to finish."""
