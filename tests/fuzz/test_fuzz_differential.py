"""Differential fuzzing: random multi-step programs must give onnxruntime's values under
every combination of the executor's mechanisms (capture, memo, Stage 2, views, in-place,
release, If skipping, both slots, io binding), step after step.

Each hypothesis example is one program, run for 6-9 steps with inputs at stable
addresses and changing contents. A failing example prints the program, its switches
and the first differing step / output; `benchmarks/fuzz.py` runs longer campaigns and
writes shrunk reproductions for tests/fuzz/regressions/.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from .harness import OracleError, case_from_program, run_case, save_case
from .programs import HypothesisDraw, generate

#: hypothesis's final (shrunk) failing example is saved here, loadable by `harness.load_case`
LAST_FAILURE = Path(tempfile.gettempdir()) / "workbench-fuzz-last-failure"
#: WORKBENCH_FUZZ_EXAMPLES scales the run (2,000 by default: about 25 s on 2 cores, plus
#: hypothesis's shrinking when one fails); the device double runs half as many (1,000:
#: about 30 s), since each of its kernel calls wraps numpy's
EXAMPLES = int(os.environ.get("WORKBENCH_FUZZ_EXAMPLES", "2000"))

_SETTINGS = dict(deadline=None, derandomize=True, database=None, print_blob=False,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@settings(max_examples=EXAMPLES, **_SETTINGS)
@given(st.data())
def test_every_mechanism_keeps_every_value(data):
    _check(data, "cpu")


@pytest.mark.cuda
@settings(max_examples=max(1, EXAMPLES // 2), **_SETTINGS)
@given(st.data())
def test_every_mechanism_keeps_every_value_on_the_cuda_backend(data):
    """The same programs on backend="cuda", on the device double (capture records without
    running, no implicit host<->device transfer); on a GPU, `benchmarks/fuzz.py --backend
    cuda` with WORKBENCH_CUDA_DOUBLE=0 runs them on CuPy."""
    _check(data, "cuda")


def _check(data, backend: str) -> None:
    prog = generate(HypothesisDraw(data), backend=backend)
    case = case_from_program(prog)
    try:
        failure = run_case(case)
    except OracleError:
        # the generator's rare invalid program (about 1 in 4,000: onnx rejects a
        # broadcast it believed sound) says nothing about the executor; hypothesis's
        # filter_too_much health check still fails the test if this stops being rare
        reject()
    if failure is not None:
        save_case(case, LAST_FAILURE, failure, {"program": prog.summary()})
    assert failure is None, f"{failure.describe()}\nprogram: {prog.summary()}\nsaved to {LAST_FAILURE}"
