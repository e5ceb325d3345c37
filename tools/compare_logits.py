"""Greedy decode of an onnxruntime-genai export with workbench and with onnxruntime,
token by token: are the tokens the same, and how far apart are the logits?

Usage: python tools/compare_logits.py --model /tmp/smollm2-genai/onnx_int4 [--tokens 64]
           [--threads 2] [--prompt TEXT] [--loops run,fixed] [--rounding auto]

onnxruntime decodes with a plain run() loop (present -> past, as the genai builder's
smoke test does), `--threads` intra-op threads. workbench decodes the same prompt with
each loop asked for: "run" (the same plain run() loop) and "fixed"
(``workbench.Generator(kv="fixed")``: caches of fixed capacity bound in place). Each
loop chooses its own tokens (greedy); per step the table gives whether the token equals
onnxruntime's and the largest |difference| of the step's logits over the largest
|logit| of onnxruntime's (only meaningful while the tokens so far agree: after a
different token the inputs differ). The last lines summarize: tokens equal before the
first difference, and the worst relative logit difference over those steps.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import workbench  # noqa: E402
from workbench import Generator, SessionOptions  # noqa: E402

CHAT_PROMPT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
               "<|im_start|>user\nWrite one sentence about the sea.<|im_end|>\n<|im_start|>assistant\n")


def prompt_ids(folder: str, text: str) -> list[int]:
    from tokenizers import Tokenizer
    return Tokenizer.from_file(os.path.join(folder, "tokenizer.json")).encode(text, add_special_tokens=False).ids


def run_loop(session, ids: list[int], tokens: int, head_size: int) -> tuple[list[int], list[np.ndarray], float]:
    """Greedy decode with plain run() calls, present -> past: tokens, each step's last
    logits, seconds per decode step (median, the prefill left out)."""
    inputs = session.get_inputs()
    pasts = sorted((i for i in inputs if i.name.startswith("past_key_values.")), key=lambda i: i.name)
    names = [o.name for o in session.get_outputs()]
    shapes = {p.name: (1, p.shape[1], 0, head_size) for p in pasts}
    feed = {"input_ids": np.array([ids], np.int64), "attention_mask": np.ones((1, len(ids)), np.int64)}
    feed.update({name: np.zeros(shape, np.float32) for name, shape in shapes.items()})
    out, logits, times, total = [], [], [], len(ids)
    for _ in range(tokens):
        start = time.perf_counter()
        o = dict(zip(names, session.run(None, feed)))
        times.append(time.perf_counter() - start)
        row = np.asarray(o["logits"])[0, -1].astype(np.float32)
        logits.append(row)
        nxt = int(np.argmax(row))
        out.append(nxt)
        total += 1
        feed = {"input_ids": np.array([[nxt]], np.int64), "attention_mask": np.ones((1, total), np.int64)}
        feed.update({name: o[name.replace("past_key_values", "present")] for name in shapes})
    return out, logits, float(np.median(times[1:])) if len(times) > 1 else float("nan")


def fixed_loop(session, ids: list[int], tokens: int) -> tuple[list[int], list[np.ndarray], float]:
    result = Generator(session).generate(ids, tokens, kv="fixed", progress=False, return_logits=True,
                                         eos_token_id=-1)
    times = list(result.step_times)
    return (list(result.tokens), [np.asarray(r, np.float32) for r in result.logits],
            float(np.median(times[1:])) if len(times) > 1 else float("nan"))


def compare(label: str, ours: tuple, peer: tuple) -> tuple[int, float]:
    toks, logits, ms = ours
    ptoks, plogits, pms = peer
    agree, worst = 0, 0.0
    rows = []
    for step, (t, p, lo, lp) in enumerate(zip(toks, ptoks, logits, plogits)):
        rel = float(np.abs(lo.astype(np.float64) - lp).max() / np.abs(lp).max())
        if agree == step:  # every token so far the same: the same inputs
            worst = max(worst, rel)
            if t == p:
                agree += 1
        rows.append(f"{step:>4} {t:>7} {p:>7} {'=' if t == p else 'x':>2} {rel:>10.2e}")
    print(f"\n{label}: step, token (workbench, onnxruntime), same, max|dlogit| / max|logit|")
    print("\n".join(rows))
    print(f"{label}: {agree} of {len(ptoks)} tokens equal before the first difference; worst relative logit "
          f"difference over those steps {worst:.2e}; decode {ms * 1e3:.1f} ms/token (onnxruntime {pms * 1e3:.1f})")
    return agree, worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="an onnxruntime-genai export folder (model.onnx inside)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime's intra-op threads")
    parser.add_argument("--prompt", default=CHAT_PROMPT)
    parser.add_argument("--loops", default="run,fixed", help="workbench loops: run, fixed")
    parser.add_argument("--rounding", default="auto", help="SessionOptions.onnxruntime_rounding")
    args = parser.parse_args()
    path = os.path.join(args.model, "model.onnx")
    ids = prompt_ids(args.model, args.prompt)
    with open(os.path.join(args.model, "genai_config.json")) as f:
        head_size = json.load(f)["model"]["decoder"]["head_size"]

    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    peer = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    print(f"{args.model}: prompt of {len(ids)} tokens, {args.tokens} greedy steps, onnxruntime "
          f"{ort.__version__} ({args.threads} threads), workbench rounding={args.rounding}")
    reference = run_loop(peer, ids, args.tokens, head_size)
    summary = []
    for loop in args.loops.split(","):
        ours = workbench.InferenceSession(path, SessionOptions(onnxruntime_rounding=args.rounding))
        if loop == "run":
            got = run_loop(ours, ids, args.tokens, head_size)
        elif loop == "fixed":
            got = fixed_loop(ours, ids, args.tokens)
        else:
            raise SystemExit(f"unknown loop {loop!r}")
        summary.append((loop, *compare(f"workbench {loop}", got, reference)))
    print()
    for loop, agree, worst in summary:
        print(f"SUMMARY {loop}: {agree}/{args.tokens} tokens equal, worst relative logit difference {worst:.2e}")


if __name__ == "__main__":
    main()
