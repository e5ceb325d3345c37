"""Where a one-token SmolLM2 step's time goes on the CPU, and why a small kernel costs
more inside a decode step than alone.

Decodes with capture off, so the Recording holds every node's own time, and prints
per op type: calls per step, the median time per call inside the decode steps, the
same kernel called back to back on the same arrays after the decode ("hot"), and
their ratio (a product's hot call finds a small weight in cache: its ratio is the
weight's, not the code's). Then per step: the weight products, the other kernels in the step and
hot, the rest of the step (dispatch and the executor's bookkeeping), and onnxruntime's
whole step in the same run.

What it shows on this project's 2-core machines: a one-token step streams ~540 MB of
weights, which evicts from every cache level the interpreter's and numpy's code and
data as well as the step's small arrays. Each small kernel between two products
(norms, attention, activations; about 150 a step) then pays memory latency for lines a
back-to-back call finds in cache: measured 2-3x its hot time. onnxruntime's C++
kernels touch far fewer lines per call, which is most of why the non-product part of
its step is several times shorter, while the products themselves run within a few
percent of each other (SmolLM2's 121 products alone, chained, when this was written:
numpy with workbench's weight layouts 22.8 ms, onnxruntime 21.9 ms).

Usage: python benchmarks/step_anatomy.py [--tokens 24] [--kv growing|fixed]
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import tempfile
import time

import numpy as np
import onnxruntime as ort

import workbench
from workbench import Generator, SessionOptions, models

PROMPT = list(range(3, 19))
HOT_CALLS = 15


def in_step_times(session: workbench.InferenceSession, tokens: int, kv: str) -> tuple[dict, list[float]]:
    """(plan index -> its per-call times in the decode steps, the decode steps' wall times)."""
    result = Generator(session).generate(PROMPT, tokens, kv=kv, progress=False, eos_token_id=-1)
    timings = session.recording.node_timings()
    timings = timings[timings["step"] >= 2]  # the prefill and the re-planning first step left out
    per_node = {int(k): list(group["duration_us"] * 1e-6) for k, group in timings.groupby("plan_index")}
    return per_node, result.step_times[2:]


def hot_time(executor, plan_index: int) -> float:
    """Median seconds of the node's kernel called back to back on the last step's arrays
    (the session is spent afterwards: in-place kernels have rewritten their inputs)."""
    p = executor.plan.nodes[plan_index]
    ins = [executor.arrays[i] if i >= 0 else None for i in p.inputs]
    outs = list(executor.state.dispatch[plan_index].outs)
    times = []
    with np.errstate(all="ignore"):  # a kernel writing in place re-reads its own result: values drift
        for _ in range(HOT_CALLS):
            t = time.perf_counter()
            p.fn(ins, outs)
            times.append(time.perf_counter() - t)
    return statistics.median(times[2:])


def peer_kernel_times(path: str, tokens: int, kv: str) -> tuple[dict[str, list[float]], int]:
    """(op type -> onnxruntime's kernel seconds per call in its decode steps, the number
    of those steps), from a profiled session of its own: the same decode, the same steps
    left out. Profiling lengthens the run more than the kernels it times, so the whole
    step compared is an unprofiled session's."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as folder:
        options.profile_file_prefix = os.path.join(folder, "step_anatomy")
        peer = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        Generator(peer).generate(PROMPT, tokens, kv=kv, progress=False, eos_token_id=-1)
        with open(peer.end_profiling()) as f:
            events = json.load(f)
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")
    starts = [start for start, _ in runs]
    per_op: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        run = bisect.bisect_right(starts, e["ts"]) - 1
        if run >= 2 and e["ts"] <= runs[run][1]:  # the prefill and the first decode step left out
            per_op.setdefault(e["args"].get("op_name", "?"), []).append(e["dur"] * 1e-6)
    return per_op, max(len(runs) - 2, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--kv", default="growing", choices=["growing", "fixed"])
    args = parser.parse_args()
    path, _ = models.smollm2()
    ours = workbench.InferenceSession(str(path), SessionOptions(capture=False))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    peer = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    per_node, steps = in_step_times(ours, args.tokens, args.kv)
    peer_steps = Generator(peer).generate(PROMPT, args.tokens, kv=args.kv, progress=False,
                                          eos_token_id=-1).step_times[2:]
    peer_ops, peer_n = peer_kernel_times(str(path), args.tokens, args.kv)
    executor = ours.executor
    by_op: dict[str, dict] = {}
    for k, times in per_node.items():
        op = executor.plan.nodes[k].node.op_type
        row = by_op.setdefault(op, {"calls": 0, "in_step": [], "hot": []})
        row["calls"] += len(times)
        row["in_step"] += times
        row["hot"].append(hot_time(executor, k))
    n_steps = len(steps)
    print(f"SmolLM2, {args.kv} KV, capture off, {n_steps} decode steps (median per call); onnxruntime: "
          "its kernels' own times in a profiled decode")
    print(f"{'op':34s} {'calls/step':>10s} {'in step us':>11s} {'hot us':>8s} {'ratio':>6s} {'ms/step':>8s}"
          f" {'ort us':>7s} {'ort ms/step':>11s}")
    totals = {"products": 0.0, "other in step": 0.0, "other hot": 0.0, "peer products": 0.0, "peer other": 0.0}
    for op, row in sorted(by_op.items(), key=lambda item: -sum(item[1]["in_step"])):
        calls = row["calls"] / n_steps
        in_step, hot = statistics.median(row["in_step"]), statistics.median(row["hot"])
        per_step = sum(row["in_step"]) / n_steps
        peer_times = peer_ops.pop(op, [])
        peer_per_step = sum(peer_times) / peer_n
        product = op in ("MatMul", "Gemm", "MatMulNBits")
        if product:
            totals["products"] += per_step
        else:
            totals["other in step"] += per_step
            totals["other hot"] += hot * calls
        totals["peer products" if product else "peer other"] += peer_per_step
        peer_cells = (f" {statistics.median(peer_times) * 1e6:7.1f} {peer_per_step * 1e3:11.2f}" if peer_times
                      else f" {'-':>7s} {'-':>11s}")
        print(f"{op:34s} {calls:10.1f} {in_step * 1e6:11.1f} {hot * 1e6:8.1f} {in_step / hot:6.2f} "
              f"{per_step * 1e3:8.2f}{peer_cells}")
    for op, peer_times in sorted(peer_ops.items()):  # onnxruntime's own ops (its fusions, say)
        peer_per_step = sum(peer_times) / peer_n
        totals["peer other"] += peer_per_step
        print(f"{op:34s} {'-':>10s} {'-':>11s} {'-':>8s} {'-':>6s} {'-':>8s} "
              f"{statistics.median(peer_times) * 1e6:7.1f} {peer_per_step * 1e3:11.2f}")
    step, peer_step = statistics.median(steps), statistics.median(peer_steps)
    kernels = totals["products"] + totals["other in step"]
    print(f"\nper step (ms): weight products {totals['products'] * 1e3:.2f}; other kernels "
          f"{totals['other in step'] * 1e3:.2f} in the step, {totals['other hot'] * 1e3:.2f} hot; "
          f"outside kernels {(step - kernels) * 1e3:.2f}")
    print(f"onnxruntime's kernels (profiled): weight products {totals['peer products'] * 1e3:.2f}; other kernels "
          f"{totals['peer other'] * 1e3:.2f}")
    print(f"whole step: workbench (capture off) {step * 1e3:.2f}, onnxruntime (unprofiled) {peer_step * 1e3:.2f}, "
          f"ratio {step / peer_step:.2f}")


if __name__ == "__main__":
    main()
