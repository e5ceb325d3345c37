"""numpy backend: host memory, no device, synchronous."""

from __future__ import annotations

import numpy as np


class CpuBackend:
    name = "cpu"
    xp = np

    def allocate(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        if dtype.hasobject:  # strings: no flat byte storage
            return np.empty(shape, dtype=dtype)
        count = 1
        for d in shape:
            count *= d
        raw = np.empty(max(count * dtype.itemsize, 1), dtype=np.uint8)
        return raw[: count * dtype.itemsize].view(dtype).reshape(shape)

    def from_host(self, array: np.ndarray) -> np.ndarray:
        return array

    def to_host(self, array: np.ndarray) -> np.ndarray:
        return np.array(array, copy=True)

    def synchronize(self) -> None:
        return None
