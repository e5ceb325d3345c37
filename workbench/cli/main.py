"""The `workbench` command."""

from __future__ import annotations

import argparse
import sys
from collections import Counter

import numpy as np

from ..errors import WorkbenchError
from . import demo, report


def _random_input(arg, dims: dict[str, int], rng: np.random.Generator) -> np.ndarray:
    from onnx import helper  # noqa: PLC0415

    from ..dtypes import numpy_dtype  # noqa: PLC0415

    # exporters write some static dims as numeric strings ('16'); every other symbol is --dim or 1
    shape = [d if isinstance(d, int) else int(d) if d.strip().isdigit() else dims.get(d, 1)
             for d in (arg.shape or [])]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(_dtype_of(arg.type)))
    dtype = numpy_dtype(elem)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 8, size=shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    raise WorkbenchError(f"cannot make a random value for input {arg.name!r} of type {arg.type}")


def _dtype_of(ort_type: str) -> str:
    name = ort_type[len("tensor("):-1]
    return {"float": "float32", "double": "float64"}.get(name, name)


def cmd_run(args: argparse.Namespace) -> int:
    from .. import InferenceSession  # noqa: PLC0415

    session = InferenceSession(args.model)
    dims = dict(_parse_kv(args.dim))
    rng = np.random.default_rng(args.seed)
    feed = {}
    for arg in session.get_inputs():
        given = dict(_parse_kv(args.input, int_values=False)).get(arg.name)
        feed[arg.name] = np.load(given) if given else _random_input(arg, dims, rng)
    outputs = session.run(None, feed)
    print(f"model: {args.model}")
    for arg, value in zip(session.get_inputs(), feed.values()):
        print(f"  input  {arg.name}: {value.dtype}{list(value.shape)}")
    for arg, value in zip(session.get_outputs(), outputs):
        arr = np.asarray(value)
        stats = f" mean={arr.mean():.6g} min={arr.min():.6g} max={arr.max():.6g}" if arr.size and arr.dtype.kind in "fiu" else ""
        print(f"  output {arg.name}: {arr.dtype}{list(arr.shape)}{stats}")
    print(plan_summary(session))
    return 0


def plan_summary(session) -> str:
    plan = session.plan
    ops = Counter(p.node.op_type for p in plan.nodes)
    kinds = Counter(p.kernel_kind for p in plan.nodes)
    declines = Counter(p.capture.reason for p in plan.nodes if not p.capture.supported)
    lines = [f"plan: {len(plan.nodes)} nodes, {kinds.get('native', 0)} native, "
             f"{kinds.get('host_fallback', 0)} on the onnx.reference fallback"]
    lines.append("  ops: " + ", ".join(f"{op}×{n}" for op, n in ops.most_common()))
    if declines:
        lines.append("  static capture declines: " + ", ".join(f"{r}×{n}" for r, n in declines.most_common()))
    by_op: dict[str, list[str]] = {}
    for name, domain, op in session.fallback_nodes():
        by_op.setdefault(f"{domain + '::' if domain else ''}{op}", []).append(name)
    for op, names in sorted(by_op.items()):
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        lines.append(f"  fallback {op}×{len(names)}: {', '.join(names[:3])}{more}")
    return "\n".join(lines)


def _parse_kv(items: list[str] | None, int_values: bool = True):
    for item in items or []:
        key, _, value = item.partition("=")
        yield key, int(value) if int_values else value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workbench", description="ONNX Decode Workbench")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a model once on random (or given) inputs; print outputs and the plan")
    run.add_argument("model")
    run.add_argument("--dim", action="append", metavar="SYMBOL=N", help="value for a symbolic dim (default 1)")
    run.add_argument("--input", action="append", metavar="NAME=FILE.npy", help="feed an input from a .npy file")
    run.add_argument("--seed", type=int, default=0)
    run.set_defaults(func=cmd_run)
    demo.add_parser(sub)
    report.add_parser(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except WorkbenchError as e:
        print(f"workbench: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
