"""Int4 decode: workbench vs onnxruntime per token, same model, same loop, same run.

Usage: python benchmarks/int4.py [--model /tmp/smollm2-genai/onnx_int4] [--tokens 32] [--repeats 3]

Rows: the built-in small genai int4 llama at accuracy_level 0 and 4, and with --model an
onnxruntime-genai int4 export (a plain run() loop, present -> past, as its builder's
smoke test decodes). Each repeat decodes with both back to back, who goes first
alternating; ms/tok are medians over all decode steps (prefill and the first step left
out), ratio the median of the pairs' ratios. "floor" is the time numpy takes to stream
the model's weights once as float32 (one matrix-vector product per MatMulNBits weight,
fastest of 5): numpy has no 4-bit or int8 BLAS, so at levels 0-3 (weights dequantized
once) workbench reads 8x the bytes onnxruntime reads, and a row near its floor is bound
by that, not by the executor. Level 4 runs MLAS's int8 kernel compiled by numba over the
4-bit bytes themselves (`ops/nbits_int8_jit.py`), so its rows can go below the floor.
"logits" is the largest |difference| of the last step's logits over their largest value.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort

import workbench
from workbench import Generator, models
from workbench.ops.contrib_quant import dequantize_nbits

PROMPT = list(range(100, 116))


def _ort(model: str | bytes) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = os.cpu_count() or 1
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def floor_ms(model: onnx.ModelProto) -> float:
    """Streaming every MatMulNBits weight once as float32, one matrix-vector product each."""
    inits = {i.name: i for i in model.graph.initializer}
    weights = []
    for n in model.graph.node:
        if n.op_type == "MatMulNBits" and n.input[1] in inits:
            at = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            arr = [onnx.numpy_helper.to_array(inits[x]) if x in inits else None for x in list(n.input[1:4]) + [""] * 3]
            w = dequantize_nbits(np, arr[0], arr[1], arr[2], None, N=at["N"], K=at["K"], bits=at.get("bits", 4),
                                 block_size=at["block_size"])
            weights.append(np.ascontiguousarray(w.T))
    vecs = [np.ones((1, w.shape[0]), np.float32) for w in weights]
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for v, w in zip(vecs, weights):
            v @ w
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def _head_size(model: onnx.ModelProto) -> int:
    """K / V head size of a genai export: hidden size over attention heads."""
    gqa = next(n for n in model.graph.node if n.op_type == "GroupQueryAttention")
    heads = next(a.i for a in gqa.attribute if a.name == "num_heads")
    norm = next(n for n in model.graph.node if "LayerNormalization" in n.op_type)
    inits = {i.name: i for i in model.graph.initializer}
    hidden = next(int(inits[x].dims[0]) for x in norm.input if x in inits)
    return hidden // heads


def genai_loop(session, tokens: int, heads: int, head_size: int) -> tuple[list[float], list[int], np.ndarray]:
    """Greedy decode with plain run(): step times, tokens, last logits."""
    pasts = sorted(i.name for i in session.get_inputs() if i.name.startswith("past_key_values."))
    names = [o.name for o in session.get_outputs()]
    feed = {"input_ids": np.array([PROMPT], np.int64), "attention_mask": np.ones((1, len(PROMPT)), np.int64)}
    feed.update({p: np.zeros((1, heads, 0, head_size), np.float32) for p in pasts})
    times, out, total, logits = [], [], len(PROMPT), None
    for _ in range(tokens):
        start = time.perf_counter()
        o = dict(zip(names, session.run(None, feed)))
        times.append(time.perf_counter() - start)
        logits = o["logits"][0, -1]
        nxt = int(np.argmax(logits))
        out.append(nxt)
        total += 1
        feed = {"input_ids": np.array([[nxt]], np.int64), "attention_mask": np.ones((1, total), np.int64)}
        feed.update({p: o[p.replace("past_key_values", "present")] for p in pasts})
    return times, out, logits


def generator_loop(session, tokens: int):
    r = Generator(session).generate(PROMPT, tokens, progress=False, return_logits=True, eos_token_id=-1)
    return list(r.step_times), list(r.tokens), np.asarray(r.logits[-1], np.float32)


def compare(label: str, ours, peer, loop, tokens: int, repeats: int, floor: float) -> None:
    steps = {"ours": [], "peer": []}
    ratios, last = [], {}
    for repeat in range(repeats):
        pair = {}
        order = [("ours", ours), ("peer", peer)]
        for name, session in order if repeat % 2 == 0 else order[::-1]:
            times, toks, logits = loop(session, tokens)
            steps[name] += times[2:]
            pair[name] = statistics.median(times[2:])
            last[name] = (toks, logits)
        ratios.append(pair["ours"] / pair["peer"])
    mine, theirs = statistics.median(steps["ours"]) * 1e3, statistics.median(steps["peer"]) * 1e3
    same = sum(a == b for a, b in zip(last["ours"][0], last["peer"][0]))
    lo, lp = last["ours"][1], last["peer"][1]
    err = float(np.abs(lo - lp).max() / np.abs(lp).max())
    print(f"{label:<30}{mine:>10.2f}{theirs:>10.2f}{statistics.median(ratios):>8.2f}{floor:>9.2f}"
          f"{floor / theirs:>8.2f}{same:>5}/{len(last['peer'][0]):<4}{err:>10.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", help="an onnxruntime-genai int4 export folder (model.onnx inside)")
    parser.add_argument("--size", default="small")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"greedy decode of {args.tokens} tokens after {len(PROMPT)}; {args.repeats} pairs; "
          "ms/tok medians; floor: float32 weights streamed once (ms, and over onnxruntime's ms/tok)")
    print(f"{'model':<30}{'ours':>10}{'ort':>10}{'ratio':>8}{'floor':>9}{'/ort':>8}{'same':>10}{'logits':>10}")
    for level in (0, 4):
        model = models.llama(args.size, flavor="genai", quant="int4")
        for node in model.graph.node:
            if node.op_type == "MatMulNBits":
                next(a for a in node.attribute if a.name == "accuracy_level").i = level
        data = model.SerializeToString()
        compare(f"llama {args.size} int4 level {level}", workbench.InferenceSession(data), _ort(data),
                generator_loop, args.tokens, args.repeats, floor_ms(model))
    if args.model:
        path = os.path.join(args.model, "model.onnx") if os.path.isdir(args.model) else args.model
        ours, peer = workbench.InferenceSession(path), _ort(path)
        past = next(i for i in peer.get_inputs() if i.name.startswith("past_key_values."))
        heads = past.shape[1]
        head_size = _head_size(onnx.load(path))  # symbolic (kv_cache_dim) in genai's export
        compare(os.path.basename(os.path.dirname(path)) + " (run loop)", ours, peer,
                lambda s, n: genai_loop(s, n, heads, head_size), args.tokens, args.repeats, floor_ms(onnx.load(path)))


if __name__ == "__main__":
    main()
