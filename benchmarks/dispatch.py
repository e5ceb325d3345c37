"""Per-node dispatch overhead on a long chain of small elementwise ops.

Prints µs/node for workbench, onnxruntime and onnx.reference measured in the same
run, and workbench's ratio to each. Usage: python benchmarks/dispatch.py [--nodes N]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnx
from onnx import TensorProto, helper

import workbench


def chain_model(n_nodes: int, width: int) -> onnx.ModelProto:
    ops = ("Add", "Mul", "Sub", "Max")
    nodes, prev = [], "x"
    for i in range(n_nodes):
        out = f"v{i}" if i < n_nodes - 1 else "y"
        nodes.append(helper.make_node(ops[i % len(ops)], [prev, "c"], [out], name=f"n{i}"))
        prev = out
    c = helper.make_tensor("c", TensorProto.FLOAT, [width], np.full(width, 0.5, np.float32))
    graph = helper.make_graph(
        nodes, "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [width])], [c])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def per_node_us(run, n_nodes: int, repeats: int) -> float:
    run()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return best / n_nodes * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    model = chain_model(args.nodes, args.width)
    feed = {"x": np.linspace(-1, 1, args.width, dtype=np.float32)}

    results = {}
    quiet = workbench.InferenceSession(model, options=workbench.SessionOptions(trace=False))
    results["workbench"] = per_node_us(lambda: quiet.run(None, feed), args.nodes, args.repeats)
    ours = workbench.InferenceSession(model)  # recording every node, as in the workbench
    results["workbench+trace"] = per_node_us(lambda: ours.run(None, feed), args.nodes, args.repeats)
    eager = workbench.InferenceSession(model, options=workbench.SessionOptions(trace=False, capture=False))
    results["workbench eager"] = per_node_us(lambda: eager.run(None, feed), args.nodes, args.repeats)
    try:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep every node
        peer = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        results["onnxruntime"] = per_node_us(lambda: peer.run(None, feed), args.nodes, args.repeats)
        np.testing.assert_allclose(ours.run(None, feed)[0], peer.run(None, feed)[0], rtol=1e-5)
    except ImportError:
        pass
    from onnx.reference import ReferenceEvaluator

    ref = ReferenceEvaluator(model)
    results["onnx.reference"] = per_node_us(lambda: ref.run(None, feed), args.nodes, max(3, args.repeats // 4))

    print(f"dispatch overhead, chain of {args.nodes} elementwise ops on float32[{args.width}] (best of runs);")
    print("workbench replays its captured launch list on repeated runs; 'eager' dispatches node by node")
    print(f"{'runtime':<18}{'µs/node':>10}{'workbench ÷ it':>18}")
    for name, us in results.items():
        print(f"{name:<18}{us:>10.2f}{results['workbench'] / us:>18.2f}")
    verdict = "meets" if results["workbench eager"] < 10 else "misses"
    print(f"workbench (eager) {verdict} the 10 µs/node aim")


if __name__ == "__main__":
    main()
