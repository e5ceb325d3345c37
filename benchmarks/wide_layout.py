"""Which order this machine reads wide MatMul weights faster in, measured where it
matters: whole SmolLM2 decodes with `wide_weight_layout` "column-major" (the default)
and "row-major", against onnxruntime in the same run (see workbench/rewrite/wide_layout.py).

Where a session's weights land in memory moves its decode by several percent (two
sessions of one setting in one process have differed by 5-8%), as much as the layout
itself, so each setting gets several sessions (`--sessions`), created alternately.
Every round decodes once with each session and with onnxruntime, the order reversed
from round to round; a decode's ratio is its median step over onnxruntime's in the
same round. Per setting: the median ratio over all its decodes, and the lowest and
highest session's own median. Tokens must match onnxruntime's.

Usage: python benchmarks/wide_layout.py [--rounds 6] [--sessions 3] [--tokens 32] [--model PATH]
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
    parser.add_argument("--sessions", type=int, default=3, help="sessions per setting (memory layouts)")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--model", help="an exported decoder (.onnx); default SmolLM2 as `workbench demo` converts it")
    args = parser.parse_args()
    path = args.model or str(models.smollm2()[0])
    ours = [(setting, workbench.InferenceSession(path, SessionOptions(wide_weight_layout=setting)))
            for _ in range(args.sessions) for setting in SETTINGS]
    peer = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    print(f"{path}: greedy decode of {args.tokens} tokens, {args.rounds} rounds of {args.sessions} sessions "
          "per setting; ratio: median of the decodes' steps over onnxruntime's in the same round")
    print(f"{'kv':<9}{'wide weights':<15}{'ms/token':>10}{'ratio':>8}{'per session':>16}{'tokens':>8}")
    for kv in ("fixed", "growing"):
        ratios: list[list[float]] = [[] for _ in ours]
        steps: dict[str, list[float]] = {name: [] for name in (*SETTINGS, "onnxruntime")}
        same = {setting: True for setting in SETTINGS}
        for r in range(args.rounds):
            order = [*enumerate(ours), (-1, ("onnxruntime", peer))]
            medians, tokens = {}, {}
            for i, (name, session) in order if r % 2 == 0 else order[::-1]:
                gc.collect()
                got = Generator(session).generate(PROMPT, args.tokens, kv=kv, progress=False, eos_token_id=-1)
                medians[i] = statistics.median(got.step_times[2:])
                tokens[i] = got.tokens
                steps[name].append(medians[i])
            for i, (setting, _) in enumerate(ours):
                ratios[i].append(medians[i] / medians[-1])
                same[setting] &= tokens[i] == tokens[-1]
        for setting in SETTINGS:
            mine = [r for (s, _), rs in zip(ours, ratios) if s == setting for r in rs]
            each = [statistics.median(rs) for (s, _), rs in zip(ours, ratios) if s == setting]
            print(f"{kv:<9}{setting:<15}{statistics.median(steps[setting]) * 1e3:>10.2f}"
                  f"{statistics.median(mine):>8.3f}{f'{min(each):.3f}..{max(each):.3f}':>16}"
                  f"{'same' if same[setting] else 'DIFFER':>8}")
        print(f"{kv:<9}{'onnxruntime':<15}{statistics.median(steps['onnxruntime']) * 1e3:>10.2f}")


if __name__ == "__main__":
    main()
