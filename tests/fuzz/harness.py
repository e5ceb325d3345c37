"""Run a multi-step case on the workbench and on onnxruntime, compare every output of
every step; save, load and shrink failing cases.

A `Case` is what runs: a model, each input's contents per step, the switches and the
slot schedule. Inputs sit at stable addresses with changing contents: each input
array is allocated once and refilled in place every step (capture replay bugs show
only that way). A fed-back input (a growing KV cache) takes the workbench's own
output of the previous step; an aliased input (io binding) is also bound as the
output it is updated into. The oracle always runs on copies of that step's inputs.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

import workbench
from workbench.backend import cuda_module

from .programs import SWITCHES, Program, build_model, without_op, without_output

RTOL = 1e-4
ATOL = 1e-5  # scaled by the output's largest magnitude


class OracleError(Exception):
    """onnxruntime rejected a generated program: a bug in the generator, not the executor."""


@dataclass
class Case:
    model: onnx.ModelProto
    steps: int
    feeds: dict  # input name -> contents per step (fed-back / aliased inputs: the first only)
    options: dict
    slots: list
    iobinding: bool = False
    feedback: dict = field(default_factory=dict)
    aliased: dict = field(default_factory=dict)


@dataclass
class Failure:
    kind: str  # "mismatch" | "exception"
    step: int  # -1: while creating the session
    output: str
    max_abs_err: float
    detail: str

    def same_bug(self, other: Failure | None) -> bool:
        """Whether `other` still shows this failure (what the shrinker must preserve)."""
        if other is None or other.kind != self.kind:
            return False
        return self.kind != "exception" or self.detail.splitlines()[-1:] == other.detail.splitlines()[-1:]

    def describe(self) -> str:
        where = "session creation" if self.step < 0 else f"step {self.step}"
        return f"{self.kind} at {where}, output {self.output!r}, max abs err {self.max_abs_err:.3g}: {self.detail}"


def case_from_program(prog: Program) -> Case:
    feeds = {i.value.name: [np.asarray(a) for a in i.steps[:prog.steps]] for i in prog.inputs}
    return Case(build_model(prog), prog.steps, feeds, dict(prog.options), list(prog.slots[:prog.steps]),
                prog.iobinding, dict(prog.feedback), dict(prog.aliased))


# -- running --------------------------------------------------------------------------------


def validate(model: onnx.ModelProto) -> None:
    """onnx's checker and strict shape inference must accept every generated model (cheap:
    well under a millisecond for these graphs)."""
    try:
        onnx.checker.check_model(model)
        # data_prop off: onnx's data propagation rejects a valid float broadcast such as
        # Sub([3], [6, 1]) ("Invalid rank for Sub broadcasting"), which onnxruntime runs
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=False)
    except Exception as e:  # noqa: BLE001
        raise OracleError(f"onnx rejects the model: {e}") from e


def oracle_session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    try:
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - any rejection means the program is invalid
        raise OracleError(f"onnxruntime rejects the model: {e}") from e


def workbench_session(case: Case) -> workbench.InferenceSession:
    switches = {k: bool(case.options.get(k, False)) for k in SWITCHES}
    # the suite's conftest turns memo verification on by default; the fuzzer tests the
    # unverified behaviour, so every switch is passed explicitly
    level = "all" if case.options.get("graph_optimization", True) else "disabled"
    opts = workbench.SessionOptions(**switches, trace=bool(case.options.get("trace", False)),
                                    decode_memo_verify=False, shadow="off", graph_optimization_level=level)
    backend = case.options.get("backend", "cpu")
    with _cuda_double() if backend == "cuda" else contextlib.nullcontext():
        return workbench.InferenceSession(case.model.SerializeToString(), options=opts, backend=backend)


def _cuda_double() -> contextlib.AbstractContextManager:
    """backend="cuda" on the device-discipline double (tests/cuda_double, importable
    from the tests folder), unless the run says WORKBENCH_CUDA_DOUBLE=0: then on CuPy
    and a real GPU (tools/gpu_check.sh)."""
    if os.environ.get("WORKBENCH_CUDA_DOUBLE") == "0":
        return contextlib.nullcontext()
    import cuda_double  # noqa: PLC0415 - only for cuda cases

    return cuda_module(cuda_double)


def _declared_shapes(model: onnx.ModelProto) -> dict[str, list]:
    out = {}
    for o in model.graph.output:
        out[o.name] = [d.dim_value if d.HasField("dim_value") else None for d in o.type.tensor_type.shape.dim]
    return out


def compare(actual, expected: np.ndarray, slack: np.ndarray | None = None) -> tuple[float, str] | None:
    """(max abs error, what is wrong), or None when `actual` matches within fp32 tolerance
    (plus `slack` per element: how far the oracle itself moves, see `_conditioning`)."""
    actual = np.asarray(actual)
    if actual.shape != expected.shape:
        return float("inf"), f"shape {actual.shape}, expected {expected.shape}"
    if actual.dtype != expected.dtype:
        return float("inf"), f"dtype {actual.dtype}, expected {expected.dtype}"
    if actual.size == 0:
        return None
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    both_nan = np.isnan(a) & np.isnan(e)
    err = np.where(both_nan, 0.0, np.abs(a - e))
    err = np.where(np.isnan(err), np.inf, err)
    scale = max(1.0, float(np.nanmax(np.abs(e))) if np.isfinite(e).any() else 1.0)
    bound = ATOL * scale + RTOL * np.abs(np.nan_to_num(e))
    if slack is not None:
        bound = bound + slack
    bad = err > bound
    if not bad.any():
        return None
    first = np.unravel_index(int(np.argmax(bad)), bad.shape)
    return float(err.max()), f"{int(bad.sum())}/{bad.size} elements differ, e.g. at {tuple(map(int, first))}: " \
                             f"got {a[first]:.6g}, expected {e[first]:.6g}"


class _Runner:
    """One workbench session driven step by step, ORT-style (`run`) or via io binding.

    On a device backend, io binding binds device arrays, as a GPU user does: each input
    has one device array for the whole case, refilled from the host every step (stable
    address, new contents), and a fixed output one device array the session writes."""

    def __init__(self, case: Case, outputs: list[str], fixed: dict[str, list]):
        self.case = case
        self.session = workbench_session(case)
        self.backend = self.session.backend
        self.outputs = outputs
        self.fixed = fixed  # outputs of a fixed declared shape: bound to one array for every step
        self.bound: dict[str, Any] = {}
        self.device: dict[str, Any] = {}  # input name -> its device array (device backends only)
        self.binding = self.session.io_binding() if case.iobinding else None

    def run(self, step: int, arrays: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> dict:
        ro = workbench.RunOptions(slot=self.case.slots[step])
        if self.binding is None:
            got = self.session.run(self.outputs, arrays, ro)
            return dict(zip(self.outputs, got))
        b = self.binding
        bound_in = arrays if self.backend.buffers_are_host else self._on_device(step, arrays)
        for name, arr in bound_in.items():
            b.bind_input(name, arr)
        aliased_out = {o: i for i, o in self.case.aliased.items()}
        for name in self.outputs:
            if name in aliased_out:
                b.bind_output(name, bound_in[aliased_out[name]])
            elif name in self.fixed:
                if name not in self.bound:  # allocated once: the same array every step
                    self.bound[name] = self.backend.from_host(np.zeros(expected[name].shape, expected[name].dtype))
                b.bind_output(name, self.bound[name])
            else:
                b.bind_output(name)
        self.session.run_with_iobinding(b, ro)
        got = dict(zip(b.outputs, b.get_outputs()))
        if self.backend.buffers_are_host:
            return got
        for inp in self.case.aliased:  # the state the device updated in place, for the oracle's next step
            arrays[inp][...] = self.backend.to_host(bound_in[inp])
        return {name: self.backend.to_host(arr) for name, arr in got.items()}

    def _on_device(self, step: int, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        for name, host in arrays.items():
            dev = self.device.get(name)
            if dev is None or dev.shape != host.shape:  # a growing fed-back input moves, as on the host
                self.device[name] = self.backend.from_host(np.array(host))
            elif not (step > 0 and name in self.case.aliased):  # an aliased state stays where the device wrote it
                self.backend.copy_from_host(dev, host)
        return self.device


def run_case(case: Case) -> Failure | None:
    """The first output of the first step where the workbench differs from onnxruntime."""
    validate(case.model)
    oracle = oracle_session(case.model)
    outputs = [o.name for o in oracle.get_outputs()]
    declared = _declared_shapes(case.model)
    fixed = {n: s for n, s in declared.items() if None not in s and n not in case.aliased.values()}
    try:
        runner = _Runner(case, outputs, fixed)
    except Exception:  # noqa: BLE001 - any exception on a valid model is a finding
        return Failure("exception", -1, "", float("inf"), traceback.format_exc(limit=6))
    arrays = {name: np.array(series[0]) for name, series in case.feeds.items()}
    fed_back = set(case.feedback) | set(case.aliased)
    for step in range(case.steps):
        for name, series in case.feeds.items():
            if name not in fed_back:
                arrays[name][...] = series[step]  # same array, new contents
        fed = {k: np.array(v) for k, v in arrays.items()}  # this step's inputs, before any in-place update
        expected = _oracle_step(oracle, outputs, fed, declared, step)
        try:
            got = runner.run(step, arrays, expected)
        except Exception:  # noqa: BLE001
            return Failure("exception", step, "", float("inf"), traceback.format_exc(limit=6))
        for name in outputs:
            wrong = compare(got[name], expected[name])
            if wrong is not None and np.asarray(got[name]).shape == expected[name].shape:
                wrong = compare(got[name], expected[name], _conditioning(oracle, name, fed, expected[name]))
                if wrong is not None and (_closer_to_exact(case.model, name, fed, got[name], expected[name])
                                          or _matches_second_float32_oracle(case.model, name, fed, got[name])):
                    wrong = None
            if wrong is not None:
                return Failure("mismatch", step, name, wrong[0], wrong[1])
        for inp, out in case.feedback.items():
            arrays[inp] = np.array(got[out])  # the next step's past is this step's present
    return None


#: relative size of the input perturbations `_conditioning` runs the oracle on (a few
#: float32 ulps), how many, and the multiple of the oracle's own spread a result may be off
PERTURBATION, PERTURBED_RUNS, SPREAD_FACTOR = 4 * 2.0**-23, 4, 4.0


def _conditioning(oracle, name: str, fed: dict[str, np.ndarray], expected: np.ndarray) -> np.ndarray:
    """Per element, how far onnxruntime's own `name` moves when every float input moves
    by a few ulps: an ill-conditioned program (a LayerNorm over two nearly equal values)
    puts float32 kernels 1e-5 apart that are equally far from the exact result, and that
    rounding is no executor bug. Only computed for a result that already failed the
    plain tolerance; a wrong value is off by far more than this."""
    rng = np.random.default_rng(0)
    spread = np.zeros(expected.shape, np.float64)
    for _ in range(PERTURBED_RUNS):
        moved = {k: (v * (1 + PERTURBATION * rng.uniform(-1, 1, v.shape))).astype(v.dtype)
                 if v.dtype.kind == "f" else v for k, v in fed.items()}
        try:
            out = oracle.run([name], moved)[0]
        except Exception:  # noqa: BLE001 - a perturbed input the program rejects: no slack from it
            continue
        if out.shape == expected.shape:
            spread = np.fmax(spread, np.abs(out.astype(np.float64) - expected.astype(np.float64)))
    return SPREAD_FACTOR * np.nan_to_num(spread, nan=0.0, posinf=0.0)


def _closer_to_exact(model: onnx.ModelProto, name: str, fed: dict[str, np.ndarray], got, expected) -> bool:
    """Whether the workbench's `name` is no farther from a float64 evaluation of the
    program (onnx.reference on the model with every float32 made float64) than
    onnxruntime's is, at its worst element, give or take the fp32 tolerance: a value
    whose float32 rounding is unstable (a LayerNorm over three equal values: x - mean is
    0 or a rounding residue, then divided by sqrt(eps); each implementation leaves its
    residue in other rows) is judged against the exact result, not against one float32
    implementation. False where the float64 program cannot run."""
    try:
        exact = _float64_reference(model).run([name], {k: v.astype(np.float64) if v.dtype == np.float32 else v
                                                       for k, v in fed.items()})[0]
    except Exception:  # noqa: BLE001 - no float64 evaluation: the plain verdict stands
        return False
    exact = np.asarray(exact, np.float64)
    a, e = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    if exact.shape != a.shape or not np.isfinite(exact).all():
        return False
    scale = max(1.0, float(np.abs(exact).max(initial=0.0)))
    ours, theirs = float(np.abs(a - exact).max(initial=0.0)), float(np.abs(e - exact).max(initial=0.0))
    return ours <= 2 * theirs + ATOL * scale


def _matches_second_float32_oracle(model: onnx.ModelProto, name: str, fed: dict[str, np.ndarray], got) -> bool:
    """Whether `name` matches onnx.reference's float32 evaluation within the fp32
    tolerance: two float32 implementations that round an unstable program alike (numpy's
    mean of three equal values leaves a residue that onnxruntime's does not; divided by
    sqrt(eps) it is 1.7e-5) disagree with onnxruntime by rounding, not by a mechanism:
    a mechanism's wrong value matches neither oracle."""
    from onnx.reference import ReferenceEvaluator  # noqa: PLC0415

    try:
        second = ReferenceEvaluator(model).run([name], {k: np.array(v) for k, v in fed.items()})[0]
    except Exception:  # noqa: BLE001 - onnx.reference cannot run it: the plain verdict stands
        return False
    second = np.asarray(second)
    return second.shape == np.asarray(got).shape and compare(got, second) is None


def _float64_reference(model: onnx.ModelProto):
    """onnx.reference over `model` computed in float64: float32 inputs, outputs,
    value_info, initializers, Constant / ConstantOfShape values and Cast targets."""
    from onnx import numpy_helper  # noqa: PLC0415
    from onnx.reference import ReferenceEvaluator  # noqa: PLC0415

    m = copy.deepcopy(model)
    g = m.graph
    for vi in [*g.input, *g.output, *g.value_info]:
        if vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    for k, t in enumerate(g.initializer):
        if t.data_type == onnx.TensorProto.FLOAT:
            g.initializer[k].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))
    for node in g.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == onnx.TensorProto.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float64), a.t.name))
            elif node.op_type == "Cast" and a.name == "to" and a.i == onnx.TensorProto.FLOAT:
                a.i = onnx.TensorProto.DOUBLE
    return ReferenceEvaluator(m)


def _oracle_step(oracle, outputs, arrays, declared, step) -> dict[str, np.ndarray]:
    try:
        res = oracle.run(outputs, {k: np.array(v) for k, v in arrays.items()})
    except Exception as e:  # noqa: BLE001
        raise OracleError(f"onnxruntime fails at step {step}: {e}") from e
    expected = dict(zip(outputs, res))
    for name, dims in declared.items():  # the generator's own shape bookkeeping, checked
        shape = expected[name].shape
        if len(shape) != len(dims) or any(d is not None and d != s for d, s in zip(dims, shape)):
            raise OracleError(f"output {name!r} has shape {shape} at step {step}, the generator said {dims}")
    return expected


# -- saving and loading -------------------------------------------------------------------


def save_case(case: Case, folder: Path, failure: Failure | None = None, extra: dict | None = None) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(case.model, str(folder / "model.onnx"))
    arrays = {f"{name}__{k}": a for name, series in case.feeds.items() for k, a in enumerate(series)}
    np.savez(folder / "inputs.npz", **arrays)
    meta = {"steps": case.steps, "options": case.options, "slots": case.slots, "iobinding": case.iobinding,
            "feedback": case.feedback, "aliased": case.aliased, **(extra or {})}
    if failure is not None:
        meta["failure"] = {"kind": failure.kind, "step": failure.step, "output": failure.output,
                           "max_abs_err": failure.max_abs_err if np.isfinite(failure.max_abs_err) else None,
                           "detail": failure.detail}
    (folder / "case.json").write_text(json.dumps(meta, indent=1) + "\n")
    return folder


def load_case(folder: Path) -> Case:
    folder = Path(folder)
    meta = json.loads((folder / "case.json").read_text())
    feeds: dict[str, list] = {}
    with np.load(folder / "inputs.npz") as npz:
        for key in sorted(npz.files, key=lambda k: (k.rsplit("__", 1)[0], int(k.rsplit("__", 1)[1]))):
            feeds.setdefault(key.rsplit("__", 1)[0], []).append(npz[key])
    return Case(onnx.load(str(folder / "model.onnx")), meta["steps"], feeds, meta["options"], meta["slots"],
                meta["iobinding"], meta["feedback"], meta["aliased"])


# -- shrinking ----------------------------------------------------------------------------


def check_program(prog: Program) -> Failure | None:
    return run_case(case_from_program(prog))


def shrink(prog: Program, failure: Failure, budget_s: float = 60.0,
           check: Callable[[Program], Failure | None] = check_program) -> tuple[Program, Failure]:
    """Greedy delta debugging over the description: fewer steps, switches off, one slot,
    no io binding, fewer outputs, fewer ops — each kept while the same failure remains."""
    deadline = time.monotonic() + budget_s

    def attempt(candidate: Program | None) -> bool:
        nonlocal prog, failure
        if candidate is None or time.monotonic() > deadline:
            return False
        try:
            got = check(candidate)
        except OracleError:
            return False
        if failure.same_bug(got):
            prog, failure = candidate, got
            return True
        return False

    progress = True
    while progress and time.monotonic() < deadline:
        progress = False
        if failure.step >= 0 and prog.steps > failure.step + 1:
            progress |= attempt(_edit(prog, steps=failure.step + 1))
        for name in list(prog.options):
            if name == "backend":  # a failure that stays on the CPU backend is the simpler one
                if prog.options[name] != "cpu":
                    progress |= attempt(_edit(prog, options={**prog.options, name: "cpu"}))
            elif prog.options[name]:
                progress |= attempt(_edit(prog, options={**prog.options, name: False}))
        if len(set(prog.slots[:prog.steps])) > 1:  # one slot, primary preferred
            progress |= attempt(_edit(prog, slots=["primary"] * prog.steps)) or \
                attempt(_edit(prog, slots=["verify"] * prog.steps))
        elif prog.slots[0] != "primary":
            progress |= attempt(_edit(prog, slots=["primary"] * prog.steps))
        if prog.iobinding and not prog.aliased:
            progress |= attempt(_edit(prog, iobinding=False))
        for name in list(prog.outputs):
            if name in prog.outputs:
                progress |= attempt(without_output(prog, name))
        k = len(prog.ops) - 1
        while k >= 0:
            if k < len(prog.ops):
                progress |= attempt(without_op(prog, k))
            k -= 1
    return prog, failure


def _edit(prog: Program, **changes) -> Program:
    p = copy.deepcopy(prog)
    for k, v in changes.items():
        setattr(p, k, v)
    return p
