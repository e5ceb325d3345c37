"""ONNX backend node test cases: pass counts for workbench, onnx.reference and onnxruntime.

All three run in one process on the same in-memory cases (onnx's
`collect_testcases`), with each case's own rtol/atol. Also reports how many of
workbench's node executions ran on native kernels vs the onnx.reference fallback.
Usage: python benchmarks/conformance.py [--failures]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from conformance import node_cases, run_case  # noqa: E402

import workbench  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--failures", action="store_true", help="list each runtime's failures")
    args = parser.parse_args()
    cases = node_cases()
    kinds: Counter = Counter()
    fallback_ops: Counter = Counter()

    def ours(model):
        session = workbench.InferenceSession(model)
        for p in session.plan.nodes:
            kinds[p.kernel_kind] += 1
            if p.kernel_kind == "host_fallback":
                fallback_ops[p.node.op_type] += 1
        return lambda feed: session.run(None, feed)

    def reference(model):
        from onnx.reference import ReferenceEvaluator

        evaluator = ReferenceEvaluator(model)
        return lambda feed: evaluator.run(None, feed)

    def with_onnxruntime(model):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        return lambda feed: session.run(None, feed)

    runners = {"workbench": ours, "onnx.reference": reference}
    try:
        import onnxruntime  # noqa: F401

        runners["onnxruntime"] = with_onnxruntime
    except ImportError:
        pass
    print(f"{len(cases)} ONNX node test cases (onnx {__import__('onnx').__version__})")
    print(f"{'runtime':<16}{'passed':>8}{'failed':>8}{'seconds':>9}")
    failures = {}
    for name, make in runners.items():
        t0 = time.perf_counter()
        failed = {c.name: why for c in cases if (why := run_case(c, make))}
        failures[name] = failed
        print(f"{name:<16}{len(cases) - len(failed):>8}{len(failed):>8}{time.perf_counter() - t0:>9.1f}")
    total = sum(kinds.values())
    print(f"workbench plan nodes: {kinds['native']} native, {kinds['host_fallback']} on the fallback "
          f"({100 * kinds['native'] / max(total, 1):.1f}% native)")
    print("fallback ops (node count): " + ", ".join(f"{op} {n}" for op, n in fallback_ops.most_common(25)))
    only_ref = sorted(set(failures["workbench"]) - set(failures["onnx.reference"]))
    print(f"cases onnx.reference passes and workbench fails: {len(only_ref)} {only_ref[:10]}")
    if args.failures:
        for name, failed in failures.items():
            print(f"\n{name} failures:")
            for case, why in sorted(failed.items()):
                print(f"  {case}: {why[:160]}")


if __name__ == "__main__":
    main()
