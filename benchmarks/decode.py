"""Per-token decode latency: workbench vs onnxruntime, same model file, same loop, same run.

Usage: python benchmarks/decode.py [--size small] [--tokens 32]
"""

from __future__ import annotations

import argparse

import onnxruntime as ort

import workbench
from workbench import Generator, WorkbenchError, models

PROMPT = list(range(3, 19))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", default="small")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--no-smollm2", action="store_true", help="skip the real model (needs a download once)")
    args = parser.parse_args()
    print(f"greedy decode of {args.tokens} tokens after a {len(PROMPT)}-token prompt; built-ins at size {args.size}")
    print(f"{'model':<22}{'kv':<9}{'workbench ms/tok':>18}{'onnxruntime ms/tok':>20}{'ratio':>8}{'tokens':>10}")
    for label, data in _models(args):
        ours = workbench.InferenceSession(data)
        peer = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        a = Generator(ours).generate(PROMPT, args.tokens, progress=False, eos_token_id=-1)
        b = Generator(peer).generate(PROMPT, args.tokens, progress=False, eos_token_id=-1)
        same = "same" if a.tokens == b.tokens else "DIFFER"
        print(f"{label:<22}{a.kv_mode:<9}{a.decode_latency * 1e3:>18.2f}{b.decode_latency * 1e3:>20.2f}"
              f"{a.decode_latency / b.decode_latency:>8.2f}{same:>10}")


def _models(args):
    yield "llama (onnx ops)", models.llama(args.size, flavor="onnx").SerializeToString()
    yield "llama (genai ops)", models.llama(args.size, flavor="genai").SerializeToString()
    if args.no_smollm2:
        return
    try:
        path, _ = models.smollm2()
    except WorkbenchError as e:
        print(f"(SmolLM2 skipped: {e})")
        return
    yield "SmolLM2-135M fp32", str(path)


if __name__ == "__main__":
    main()
