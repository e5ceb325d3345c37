import os
import sys
from pathlib import Path

# every decode-plan memo replay in the suite is checked against a full resolve
os.environ.setdefault("WORKBENCH_DECODE_MEMO_VERIFY", "1")

sys.path.insert(0, str(Path(__file__).parent))


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU and CuPy (skipped without)")
    config.addinivalue_line("markers", "browser: drives a real headless browser")
    config.addinivalue_line("markers", "network: needs the package registry; skips when unreachable")
