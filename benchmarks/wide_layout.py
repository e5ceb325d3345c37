"""Which order this machine reads wide MatMul weights faster in, measured where it
matters: whole SmolLM2 decodes with `wide_weight_layout` "column-major" (the default)
and "row-major", against onnxruntime in the same run (see workbench/executor/wide_layout.py).

Two workbench sessions (one per setting) and an onnxruntime session decode in turn,
the order reversed every round; per mode, the median step of each decode, and each
setting's median ratio to onnxruntime's decode of the same round. Tokens must match.

Usage: python benchmarks/wide_layout.py [--rounds 6] [--tokens 32] [--model PATH]
"""

from __future__ import annotations

import argparse
import gc
import statistics

import onnxruntime as ort

import workbench
from workbench import Generator, SessionOptions, models

PROMPT = list(range(3, 19))
SETTINGS = ("column-major", "row-major")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--model", help="an exported decoder (.onnx); default SmolLM2 as `workbench demo` converts it")
    args = parser.parse_args()
    path = args.model or str(models.smollm2()[0])
    sessions = {s: workbench.InferenceSession(path, SessionOptions(wide_weight_layout=s)) for s in SETTINGS}
    sessions["onnxruntime"] = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    print(f"{path}: greedy decode of {args.tokens} tokens, {args.rounds} rounds; ratio: median over rounds "
          "of the setting's step over onnxruntime's")
    print(f"{'kv':<9}{'wide weights':<15}{'ms/token':>10}{'ratio':>8}{'tokens':>8}")
    for kv in ("fixed", "growing"):
        steps: dict[str, list[float]] = {name: [] for name in sessions}
        tokens = {}
        for r in range(args.rounds):
            order = list(sessions.items())
            for name, session in order if r % 2 == 0 else order[::-1]:
                gc.collect()
                got = Generator(session).generate(PROMPT, args.tokens, kv=kv, progress=False, eos_token_id=-1)
                steps[name].append(statistics.median(got.step_times[2:]))
                tokens[name] = got.tokens
        for name in SETTINGS:
            ratio = statistics.median(a / b for a, b in zip(steps[name], steps["onnxruntime"]))
            same = "same" if tokens[name] == tokens["onnxruntime"] else "DIFFER"
            print(f"{kv:<9}{name:<15}{statistics.median(steps[name]) * 1e3:>10.2f}{ratio:>8.3f}{same:>8}")
        print(f"{kv:<9}{'onnxruntime':<15}{statistics.median(steps['onnxruntime']) * 1e3:>10.2f}")


if __name__ == "__main__":
    main()
