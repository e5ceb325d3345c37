"""Shared harness: the ONNX backend node test cases, run through any runner."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np


@functools.lru_cache(maxsize=1)
def node_cases() -> tuple:
    from onnx.backend.test.case.node import collect_testcases  # noqa: PLC0415

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tuple(collect_testcases(None))


def outputs_match(case: Any, expected: list, got: list) -> str | None:
    """None when `got` matches `expected` under the case's tolerances, else why not."""
    if len(got) != len(expected):
        return f"{len(got)} outputs, expected {len(expected)}"
    for i, (e, g) in enumerate(zip(expected, got)):
        why = _value_match(case, e, g)
        if why:
            return f"output {i}: {why}"
    return None


def _value_match(case: Any, e: Any, g: Any) -> str | None:
    if isinstance(e, list):
        if not isinstance(g, list) or len(e) != len(g):
            return f"expected a sequence of {len(e)}, got {type(g).__name__}"
        for x, y in zip(e, g):
            why = _value_match(case, x, y)
            if why:
                return why
        return None
    if e is None:
        return None if g is None else "expected None"
    e = np.asarray(e)
    g = np.asarray(g)
    if e.dtype != g.dtype and not (e.dtype.kind in "OUS" and g.dtype.kind in "OUS"):
        return f"dtype {g.dtype}, expected {e.dtype}"
    if e.shape != g.shape:
        return f"shape {g.shape}, expected {e.shape}"
    if e.dtype.kind in "OUSb" or e.dtype.kind in "iu":
        return None if np.array_equal(e, g) else "values differ"
    try:
        np.testing.assert_allclose(g.astype(np.float64) if e.dtype.kind == "f" and e.dtype.itemsize < 2 else g,
                                   e, rtol=case.rtol, atol=case.atol)
    except AssertionError:
        return "values differ beyond tolerance"
    except TypeError:
        return None if np.array_equal(e.view(np.uint8), g.view(np.uint8)) else "values differ"
    return None


def to_python(value: Any) -> Any:
    """Test data may hold TensorProto/SequenceProto/OptionalProto: make them arrays/lists."""
    import onnx  # noqa: PLC0415
    from onnx import numpy_helper  # noqa: PLC0415

    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, onnx.SequenceProto):
        return [to_python(v) for v in numpy_helper.to_list(value)]
    if isinstance(value, onnx.OptionalProto):
        return to_python(numpy_helper.to_optional(value))
    if isinstance(value, list):
        return [to_python(v) for v in value]
    return value


def run_case(case: Any, make_runner: Callable[[Any], Callable[[dict], list]]) -> str | None:
    """Run every data set of a case; None when all pass, else the first failure."""
    try:
        runner = make_runner(case.model)
    except Exception as e:  # noqa: BLE001
        return f"load: {type(e).__name__}: {str(e)[:200]}"
    graph = case.model.graph
    init_names = {t.name for t in graph.initializer}
    names = [i.name for i in graph.input if i.name not in init_names]
    for inputs, expected in case.data_sets:
        feed = dict(zip(names, (to_python(x) for x in inputs)))
        expected = [to_python(x) for x in expected]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = runner(feed)
        except Exception as e:  # noqa: BLE001
            return f"run: {type(e).__name__}: {str(e)[:200]}"
        why = outputs_match(case, list(expected), got)
        if why:
            return why
    return None
