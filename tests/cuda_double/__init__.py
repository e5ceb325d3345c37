"""A device-discipline double for `cupy` (test-only; modelled on tinygrad's MOCKGPU).

`workbench.backend.get_backend("cuda")` imports this package instead of CuPy when
`WORKBENCH_CUDA_DOUBLE=1` and the package is importable -- which it is only from the
repository's `tests/` folder (conftest puts it on `sys.path`); it is not part of the
installed `workbench` distribution, so it is never on a user's path.

It computes with numpy and enforces CuPy's and CUDA's rules (each cites its source
in `_core.py` / `_module.py`):

- `ndarray` is not a numpy.ndarray subclass; `__array__` raises TypeError (core.pyx),
  so `np.asarray(device)` and `host[...] = device` fail; `.get()` / `asnumpy` copy.
- `int()/float()/bool()/.item()/.tolist()` read through `.get()` (core.pyx): a D2H
  copy, refused while the current stream captures (memory.pyx).
- numpy.ndarray operands of kernels raise TypeError 'Unsupported type' (_kernel.pyx
  `_preprocess_arg` -> _scalar.pyx CScalar); `device[...] = host_nonscalar` raises
  'non-scalar numpy.ndarray cannot be used for fill' (core.pyx fill via
  _routines_indexing.pyx `_scatter_op`); `.set()` / `asarray` copy H2D, refused while
  capturing (memory.pyx copy_from_host_async).
- `Stream.synchronize` / `Event.synchronize` while capturing raise
  CUDARuntimeError(cudaErrorStreamCaptureUnsupported) and invalidate the capture, whose
  `end_capture` then raises cudaErrorStreamCaptureInvalidated (CUDA semantics);
  capture on the legacy default stream is refused (stream.pyx begin_capture).
- allocations while capturing must come from a non-default pool (workbench rule; the
  pool keeps them alive with the graph).
- capture records and does not execute: the capture pass's writes are undone and its
  fresh buffers poisoned at `end_capture`; `Graph.launch` replays exactly the recorded
  operations on the recorded buffers (graph.pyx; CUDA stream capture).
- dtypes outside CuPy 13's `?bhilqBHILQefdFD` raise 'Unsupported dtype' (_dtype.pyx).
- only names the real `cupy` module has exist (`_namespace.py`, from cupy/__init__.py).
"""

from __future__ import annotations

from typing import Any

from . import _core, _module
from ._module import *  # noqa: F403
from ._module import __cupyx_scipy_special__, __version__, cuda, runtime  # noqa: F401

RT = _core.RT
CUDARuntimeError = _core.CUDARuntimeError


def __getattr__(name: str) -> Any:
    got = _module.lookup(name)
    if got is None:
        raise AttributeError(f"module 'cupy' has no attribute {name!r}")
    return got


#: what workbench.backend checks before trusting an importable `cuda_double`
__workbench_device_double__ = True
