"""Backends: numpy on the CPU; CuPy on CUDA (selected with backend="cuda")."""

from __future__ import annotations

from ..errors import BackendUnavailableError
from .base import Backend
from .cpu import CpuBackend


def get_backend(name: str) -> Backend:
    if name == "cpu":
        return CpuBackend()
    if name == "cuda":
        return _cuda_backend()
    raise BackendUnavailableError(f"unknown backend {name!r}; expected 'cpu' or 'cuda'")


def _cuda_backend() -> Backend:
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

    return CudaBackend()


__all__ = ["Backend", "CpuBackend", "get_backend"]
