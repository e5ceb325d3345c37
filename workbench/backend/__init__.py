"""Backends: numpy on the CPU; CuPy on CUDA (selected with backend="cuda").

`WORKBENCH_CUDA_DOUBLE=1` makes backend="cuda" run on the device-discipline double
(`tests/cuda_double`, a numpy stand-in for CuPy that enforces CuPy's host/device
and stream-capture rules) instead of CuPy. The double is not part of the installed
package: it is importable only where the repository's `tests/` folder is on the
path (pytest's conftest), so a user's `backend="cuda"` always means a real GPU.
"""

from __future__ import annotations

import importlib
import os

from ..errors import BackendUnavailableError
from .base import Backend
from .cpu import CpuBackend

#: the environment switch selecting the test double for backend="cuda"
CUDA_DOUBLE_ENV = "WORKBENCH_CUDA_DOUBLE"


def get_backend(name: str) -> Backend:
    if name == "cpu":
        return CpuBackend()
    if name == "cuda":
        return _cuda_backend()
    raise BackendUnavailableError(f"unknown backend {name!r}; expected 'cpu' or 'cuda'")


def _cuda_backend() -> Backend:
    if os.environ.get(CUDA_DOUBLE_ENV, "") == "1":
        return _double_backend()
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
    from .cuda import CudaBackend  # noqa: PLC0415

    return CudaBackend(cupy)


def _double_backend() -> Backend:
    try:
        double = importlib.import_module("cuda_double")
    except ImportError:
        raise BackendUnavailableError(
            f"{CUDA_DOUBLE_ENV}=1 selects the device-discipline test double, which lives in the "
            "repository's tests/ folder and is importable only under its pytest run; unset "
            f"{CUDA_DOUBLE_ENV} to use CuPy on a GPU") from None
    if not getattr(double, "__workbench_device_double__", False):
        raise BackendUnavailableError(f"{CUDA_DOUBLE_ENV}=1 but the importable 'cuda_double' is not "
                                      "workbench's device-discipline double")
    from .cuda import CudaBackend  # noqa: PLC0415

    return CudaBackend(double)


__all__ = ["CUDA_DOUBLE_ENV", "Backend", "CpuBackend", "get_backend"]
