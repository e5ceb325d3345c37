"""Backends: numpy on the CPU; CuPy on CUDA (selected with backend="cuda").

Inside `with cuda_module(module):` backend="cuda" runs on `module`, a CuPy-compatible
array module, instead of CuPy. The test suite passes its device-discipline double
(`tests/cuda_double`, a numpy stand-in for CuPy that enforces CuPy's host/device and
stream-capture rules) this way; the package itself never looks for the double, so a
user's `backend="cuda"` always means CuPy on a real GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ..errors import BackendUnavailableError
from .base import Backend
from .cpu import CpuBackend

#: the array module backend="cuda" runs on instead of CuPy (None: CuPy); see `cuda_module`
_cuda_module: Any = None


@contextlib.contextmanager
def cuda_module(module: Any) -> Iterator[None]:
    """Within the block, backend="cuda" runs on `module` (CuPy's API) instead of CuPy.
    Sessions made inside keep their backend after the block."""
    global _cuda_module
    before, _cuda_module = _cuda_module, module
    try:
        yield
    finally:
        _cuda_module = before


def get_backend(name: str) -> Backend:
    if name == "cpu":
        return CpuBackend()
    if name == "cuda":
        return _cuda_backend()
    raise BackendUnavailableError(f"unknown backend {name!r}; expected 'cpu' or 'cuda'")


def _cuda_backend() -> Backend:
    from .cuda import CudaBackend  # noqa: PLC0415 - only where cuda is asked for

    if _cuda_module is not None:
        return CudaBackend(_cuda_module)
    try:
        import cupy  # noqa: PLC0415 - optional dependency
    except ImportError:
        raise BackendUnavailableError(
            "backend='cuda' needs CuPy: pip install 'workbench[cuda12]' or 'workbench[cuda13]'"
        ) from None
    # With CuPy installed but no usable GPU the import succeeds and device calls fail,
    # so ask the runtime rather than trusting the import.
    try:
        available = bool(cupy.cuda.is_available())
    except Exception:  # noqa: BLE001 - CUDARuntimeError and friends
        available = False
    if not available:
        raise BackendUnavailableError("backend='cuda' was requested but CuPy finds no usable CUDA GPU")
    return CudaBackend(cupy)


__all__ = ["Backend", "CpuBackend", "cuda_module", "get_backend"]
