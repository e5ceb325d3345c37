"""Per-token decode latency: workbench vs onnxruntime, same model file, same loop, same run.

Usage: python benchmarks/decode.py [--size small] [--tokens 32] [--repeats 5] [--model PATH]
       [--no-smollm2 | --smollm2-only] [--exports DIR [--only SUBSTRING]]

`--exports DIR` (tools/real_exports.py's folder, or any folder with a manifest.json
of {"name", "path"} rows: SmolLM2's genai exports) measures those exports instead, in
both loops users drive: `run`, a plain `session.run` loop with default options and
fresh numpy feeds each step (benchmarks/loops.py), and `gen`, `Generator(kv="fixed")`;
onnxruntime (2 intra-op threads) runs the same loop, pairs interleaved as below.

One row per export idiom the project's builders make (workbench's own llama in both
op flavours, onnxruntime-genai's builder layout with and without tied embeddings and
int4 weights, optimum's merged decoder, torch dynamo's opset-23 Attention), SmolLM2
(converted from its GGUF, and that conversion with its embeddings tied as
onnxruntime-genai's builder writes them: the embedding Gather reads
`Transpose(lm_head weight)`) with growing and with fixed KV (where capture replays),
and any `--model`. The tied-embeddings row also runs with the load-time optimizer off,
to show what constant folding of `Transpose(lm_head)` is worth.

Each repeat decodes with workbench and onnxruntime back to back (which goes first
alternates from pair to pair); the ratio is
the median over repeats of that pair's ratio (with the lowest and highest in
brackets), since a noisy machine slows a whole pair alike far more often than it
slows one decode of it. The ms/tok columns are the medians of all decode steps.
The first and last lines give the rate numpy streams weights at just then: on these
shared machines it has been seen between 7 and 50 GB/s, and every row scales with it.

"products" is the floor under workbench's step: its graph's weight products (MatMul
over a 2-D weight, in the layout the load-time optimizer gave it), one row each, back
to back with nothing in between, the fastest of 9 passes; "floor" is that over
onnxruntime's median step. A row whose ratio sits near its floor is bound by the bytes
its weights stream, not by the executor: the int4 row, whose 4-bit weights numpy can
only multiply as dequantized float32 (8x the bytes onnxruntime reads). An If's
then-branch counts (optimum's merged decoder: the branch a step with a past runs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

import workbench
from workbench import Generator, SessionOptions, WorkbenchError, models
from workbench.decode.interface import find_export
from workbench.models import exports

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loops import generator_loop, plain_loop  # noqa: E402

PROMPT = list(range(3, 19))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", default="small")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5,
                        help="decode pairs (one decode each, the first alternating); the pairs' ratios are summarised")
    parser.add_argument("--no-smollm2", action="store_true", help="skip the real model (needs a download once)")
    parser.add_argument("--smollm2-only", action="store_true", help="only the real model's rows")
    parser.add_argument("--model", action="append", default=[], help="an exported decoder (.onnx) to add")
    parser.add_argument("--exports", type=Path, default=None, help="a folder with a manifest.json of exports")
    parser.add_argument("--only", default="", help="with --exports: names containing this")
    args = parser.parse_args()
    if args.exports is not None:
        real_exports(args)
        return
    print(f"greedy decode of {args.tokens} tokens after a {len(PROMPT)}-token prompt; built-ins at size {args.size}; "
          f"{args.repeats} decode pairs each; ratio: median of the pairs' ratios [lowest, highest]")
    print(f"weight streaming now: {streaming_rate():.1f} GB/s (numpy matrix-vector products over 226 MB of "
          "float32 weights: this machine's share of memory bandwidth, which sets every row's ms/tok)")
    print(f"wide MatMul weights {SessionOptions().wide_weight_layout} (wide_weight_layout; "
          "benchmarks/wide_layout.py decodes SmolLM2 with both orders)")
    print(f"{'model':<22}{'kv':<9}{'workbench ms/tok':>18}{'onnxruntime ms/tok':>20}{'ratio':>8}{'range':>14}"
          f"{'tokens':>8}{'products ms':>13}{'floor':>7}")
    for label, data, level, kv in _models(args):
        ours = workbench.InferenceSession(data, SessionOptions(graph_optimization_level=level))
        peer = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        steps: dict[str, list[float]] = {"ours": [], "peer": []}
        ratios: list[float] = []
        tokens, mode = {}, ""
        for repeat in range(max(args.repeats, 1)):  # pairs back to back: a noisy neighbour slows both alike
            pair = {}
            order = (("ours", ours), ("peer", peer))
            for name, session in order if repeat % 2 == 0 else order[::-1]:  # who goes first alternates
                r = Generator(session).generate(PROMPT, args.tokens, kv=kv, progress=False, eos_token_id=-1)
                got = r.step_times[2:]  # the prefill and the first (re-planning) step left out
                steps[name] += got
                pair[name] = statistics.median(got)
                tokens[name], mode = r.tokens, mode or r.kv_mode
            ratios.append(pair["ours"] / pair["peer"])
        a, b = statistics.median(steps["ours"]), statistics.median(steps["peer"])
        same = "same" if tokens["ours"] == tokens["peer"] else "DIFFER"
        spread = f"[{min(ratios):.2f}, {max(ratios):.2f}]"
        floor = products_alone(ours)
        floor_cells = f"{floor * 1e3:>13.2f}{floor / b:>7.2f}" if floor else f"{'-':>13}{'-':>7}"
        print(f"{label:<22}{mode:<9}{a * 1e3:>18.2f}{b * 1e3:>20.2f}{statistics.median(ratios):>8.2f}"
              f"{spread:>14}{same:>8}{floor_cells}")
    print(f"weight streaming at the end: {streaming_rate():.1f} GB/s")


def streaming_rate(count: int = 64) -> float:
    """GB/s of a one-token decode's kind of work: a 1 x 576 row times `count` 576 x 1536
    float32 weights (more than any cache holds), the best of three passes. A neighbour
    taking memory bandwidth slows both runtimes' MatMuls alike, and the ratios with them
    drift; this says how loaded the machine was."""
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((576, 1536), dtype=np.float32) for _ in range(count)]
    x = rng.standard_normal((1, 576), dtype=np.float32)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for w in weights:
            np.matmul(x, w)
        best = min(best, time.perf_counter() - t)
    return sum(w.nbytes for w in weights) / best / 1e9


def products_alone(session: workbench.InferenceSession, rounds: int = 9) -> float | None:
    """The least seconds, over `rounds`, of the step's weight products (MatMul over a
    2-D initializer) run one row each, back to back, on the weights as loaded (a floor:
    the least those bytes took); None where there are none."""
    weights = _product_weights(session.graph)
    if not weights:
        return None
    calls = [(np.ones((1, w.shape[0]), w.dtype), w, np.empty((1, w.shape[1]), w.dtype)) for w in weights]
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for x, w, out in calls:
            np.matmul(x, w, out=out)
        times.append(time.perf_counter() - t)
    return min(times)


def _product_weights(graph) -> list[np.ndarray]:
    """The 2-D weights `graph`'s MatMuls read as B, and those of an If's then-branch
    (optimum's merged decoder: the branch a decode step with a past runs)."""
    weights = []
    for node in graph.nodes:
        if node.op_type == "If" and "then_branch" in node.subgraphs:
            weights += _product_weights(node.subgraphs["then_branch"])
        elif node.op_type == "MatMul" and len(node.inputs) == 2 and node.inputs[1] in graph.initializers:
            w = graph.initializers[node.inputs[1]]
            if w.ndim == 2:
                weights.append(w)
    return weights


def real_exports(args) -> None:
    """One row per export and loop: workbench with default options against onnxruntime."""
    print(f"{args.tokens} tokens per decode, {args.repeats} pairs each (workbench and onnxruntime back to back, "
          "the first alternating); ms/tok: median step after warm-up; ratio: median of the pairs' ratios")
    print("host us/node: workbench's (step wall time - the time its trace puts inside kernels and replayed "
          "segments) / plan nodes, median over steps (trace on, the default)")
    print(f"{'export':<34}{'loop':<5}{'nodes':>6}{'workbench ms/tok':>18}{'onnxruntime':>13}{'ratio':>8}"
          f"{'range':>14}{'tokens':>8}{'host us/node':>14}")
    ratios_by_loop: dict[str, list[float]] = {"run": [], "gen": []}
    for entry in json.loads((args.exports / "manifest.json").read_text()):
        if args.only not in entry["name"]:
            continue
        files = find_export(entry["path"])
        ours = [workbench.InferenceSession(str(f)) if f else None for f in (files.decode, files.prefill)]
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        peer = [ort.InferenceSession(str(f), so, providers=["CPUExecutionProvider"]) if f else None
                for f in (files.decode, files.prefill)]
        for loop_name, loop in (("run", plain_loop), ("gen", generator_loop)):
            ours[0].new_recording()
            times: dict[str, list[float]] = {"ours": [], "peer": []}
            tokens, ratios = {}, []
            try:
                for repeat in range(max(args.repeats, 1)):
                    order = (("ours", ours), ("peer", peer))
                    for name, (session, prefill) in order if repeat % 2 == 0 else order[::-1]:
                        if loop_name == "gen" and name == "peer":
                            got, ms = plain_loop(session, prefill, args.tokens)  # its own best loop
                        else:
                            got, ms = loop(session, prefill, args.tokens)
                        times[name].append(ms)
                        tokens[name] = got
                    ratios.append(times["ours"][-1] / times["peer"][-1])
            except Exception as error:  # noqa: BLE001 - a row that cannot run says why; the rest go on
                print(f"{entry['name']:<34}{loop_name:<5}ERROR {type(error).__name__}: {str(error)[:100]}")
                continue
            ratios_by_loop[loop_name].append(statistics.median(ratios))
            same = "same" if tokens["ours"] == tokens["peer"] else "DIFFER"
            nodes = len(ours[0].executor.plan.nodes)
            print(f"{entry['name']:<34}{loop_name:<5}{nodes:>6}"
                  f"{statistics.median(times['ours']):>18.2f}{statistics.median(times['peer']):>13.2f}"
                  f"{statistics.median(ratios):>8.2f}{f'[{min(ratios):.2f}, {max(ratios):.2f}]':>14}{same:>8}"
                  f"{host_us_per_node(ours[0].recording, nodes):>14.2f}", flush=True)
    for loop_name, ratios in ratios_by_loop.items():
        if ratios:
            print(f"{loop_name}: median ratio {statistics.median(ratios):.2f}, worst {max(ratios):.2f} "
                  f"over {len(ratios)} exports")


def host_us_per_node(rec: workbench.Recording, nodes: int) -> float:
    """Median over the recording's steps of (wall - kernel and replay time) / nodes, in us."""
    steps = rec.steps()
    timings = rec.node_timings()
    inside = timings["duration_us"].groupby(timings["step"]).sum()
    host = [(wall * 1e3 - inside.get(step, 0.0)) / nodes for step, wall in zip(steps["step"], steps["wall_ms"])]
    return statistics.median(host) if host else float("nan")


def _models(args):
    if not args.smollm2_only:
        yield from _small_models(args)
    if args.no_smollm2:
        return
    try:
        path, _ = models.smollm2()
    except WorkbenchError as e:
        print(f"(SmolLM2 skipped: {e})")
        return
    # converted from the GGUF; growing KV, then the fixed KV buffer the capture replays
    yield "SmolLM2-135M fp32", str(path), "all", "growing"
    yield "SmolLM2-135M fp32", str(path), "all", "fixed"
    with tempfile.TemporaryDirectory() as folder:  # as onnxruntime-genai's builder ties its embeddings
        tied = str(exports.save_tied_embeddings(path, folder))
        yield "SmolLM2 tied emb.", tied, "all", "growing"
        yield "SmolLM2 tied emb.", tied, "all", "fixed"


def _small_models(args):
    size = args.size
    yield "llama (onnx ops)", models.llama(size, flavor="onnx").SerializeToString(), "all", "auto"
    yield "llama (genai ops)", models.llama(size, flavor="genai").SerializeToString(), "all", "auto"
    yield "genai builder", models.llama(size, flavor="genai", export="genai-builder").SerializeToString(), "all", "auto"
    tied = exports.tied_embeddings(models.llama(size, flavor="genai")).SerializeToString()
    yield "genai tied emb.", tied, "all", "auto"
    yield "genai tied, no fold", tied, "disabled", "auto"
    yield "genai int4", models.llama(size, flavor="genai", quant="int4").SerializeToString(), "all", "auto"
    yield "optimum merged", models.llama(size, flavor="onnx", export="optimum-merged").SerializeToString(), "all", "auto"
    yield "torch opset-23 Attn", models.llama(size, flavor="onnx", export="torch-dynamo-attention"
                                              ).SerializeToString(), "all", "auto"
    for path in args.model:
        yield path[-22:], path, "all", "auto"


if __name__ == "__main__":
    main()
