"""Per-token decode latency: workbench vs onnxruntime, same model file, same loop, same run.

Usage: python benchmarks/decode.py [--size small] [--tokens 32]
"""

from __future__ import annotations

import argparse

import onnxruntime as ort

import workbench
from workbench import Generator, models

PROMPT = list(range(3, 19))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", default="small")
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    print(f"greedy decode of {args.tokens} tokens after a {len(PROMPT)}-token prompt, {args.size} models")
    print(f"{'model':<22}{'kv':<9}{'workbench ms/tok':>18}{'onnxruntime ms/tok':>20}{'ratio':>8}{'tokens':>10}")
    for label, build in (("llama (onnx ops)", lambda: models.llama(args.size, flavor="onnx")),
                         ("llama (genai ops)", lambda: models.llama(args.size, flavor="genai"))):
        data = build().SerializeToString()
        ours = workbench.InferenceSession(data)
        peer = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        a = Generator(ours).generate(PROMPT, args.tokens, progress=False, eos_token_id=-1)
        b = Generator(peer).generate(PROMPT, args.tokens, progress=False, eos_token_id=-1)
        same = "same" if a.tokens == b.tokens else "DIFFER"
        print(f"{label:<22}{a.kv_mode:<9}{a.decode_latency * 1e3:>18.2f}{b.decode_latency * 1e3:>20.2f}"
              f"{a.decode_latency / b.decode_latency:>8.2f}{same:>10}")


if __name__ == "__main__":
    main()
