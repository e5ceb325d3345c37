import os
import sys
from pathlib import Path

import pytest

from workbench.backend import cuda_module

# every decode-plan memo replay in the suite is checked against a full resolve
os.environ.setdefault("WORKBENCH_DECODE_MEMO_VERIFY", "1")

TESTS = Path(__file__).parent
# the helper modules here (oracles, builtin_models, ...) and the packages cuda_double and fuzz
sys.path.insert(0, str(TESTS))
# the test folders (one per layer, plus mechanisms/ and regressions/; no __init__.py, so every
# test module's basename is unique): a test module imports another's helpers by its basename
# (test_widgets' known recording, test_quant_ops_ort's packing, ...) from any folder, whichever
# folders a run collects
for _folder in sorted(p for p in TESTS.iterdir() if p.is_dir() and not (p / "__init__.py").exists()):
    if any(_folder.glob("test_*.py")):
        sys.path.insert(1, str(_folder))

#: WORKBENCH_CUDA_DOUBLE as the run was started (1: cuda tests on the double even with a GPU)
_DOUBLE_ASKED = os.environ.pop("WORKBENCH_CUDA_DOUBLE", "")


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU and CuPy (on the device-discipline double without)")
    config.addinivalue_line("markers", "browser: drives a real headless browser")
    config.addinivalue_line("markers", "network: needs the package registry; skips when unreachable")


def _real_gpu() -> bool:
    try:
        import cupy

        return bool(cupy.cuda.is_available())
    except Exception:  # noqa: BLE001 - no CuPy, or CuPy without a driver
        return False


_ON_DOUBLE: bool | None = None


def cuda_on_double() -> bool:
    """Whether backend="cuda" runs on tests/cuda_double in this run: asked for with
    WORKBENCH_CUDA_DOUBLE=1, or because no GPU is present."""
    global _ON_DOUBLE
    if _ON_DOUBLE is None:
        _ON_DOUBLE = _DOUBLE_ASKED == "1" or not _real_gpu()
    return _ON_DOUBLE


@pytest.fixture(autouse=True)
def _cuda_backend_selection(request):
    """cuda-marked tests run on a real GPU when there is one, else on the device-discipline
    double (so the plain `pytest -q` runs them on any machine); every other test sees no
    double (backend="cuda" without a GPU stays a BackendUnavailableError there)."""
    if request.node.get_closest_marker("cuda") is None or not cuda_on_double():
        yield
        return
    import cuda_double

    with cuda_module(cuda_double):
        yield
