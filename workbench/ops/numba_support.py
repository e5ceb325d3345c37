"""What the kernels numba compiles share: whether numba may be used at all, and whether
its parallel loops may run here.

numba is an optional import: the GPU image has none, and ``WORKBENCH_NUMBA=0`` turns
every compiled kernel off (the numpy forms run instead, the same values; tests run both).
"""

from __future__ import annotations

import functools
import os

import numpy as np

_OFF = frozenset({"0", "false", "no", "off"})


def enabled() -> bool:
    """numba's kernels may be used: not turned off by ``WORKBENCH_NUMBA=0``, numba importable.
    (A kernel being built asks this once; it is not for a per-call path.)"""
    return os.environ.get("WORKBENCH_NUMBA", "1").strip().lower() not in _OFF and _importable()


@functools.cache
def _importable() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def threads() -> int:
    """Threads a compiled product splits its work between: this process's cores, at most 2."""
    return min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


@functools.cache
def parallel() -> bool:
    """Whether numba's parallel loops run on a thread-safe layer here (OpenMP or TBB:
    sessions may run from several threads, and numba's own workqueue layer aborts on
    concurrent use). Asks for one where the user has not chosen a layer, and leaves the
    choice as it was where neither is installed."""
    import numba

    chosen = numba.config.THREADING_LAYER
    if chosen == "default":
        numba.config.THREADING_LAYER = "threadsafe"
    elif chosen not in ("threadsafe", "omp", "tbb"):
        return False
    prange = numba.prange

    def probe(x):
        for i in prange(x.shape[0]):
            x[i] += 1.0
        return x

    try:
        numba.njit(parallel=True)(probe)(np.zeros(2))
        return numba.threading_layer() in ("omp", "tbb")
    except (ValueError, ImportError, RuntimeError):
        numba.config.THREADING_LAYER = chosen
        return False
