"""Cost of tracing: per-token decode latency with the Recording on vs off (small llama).

Usage: python benchmarks/trace_overhead.py [--tokens 32] [--rounds 3]
"""

from __future__ import annotations

import argparse

import workbench
from workbench import Generator, SessionOptions, models

PROMPT = list(range(3, 19))


def latency(data: bytes, trace: bool, tokens: int) -> float:
    session = workbench.InferenceSession(data, options=SessionOptions(trace=trace))
    return Generator(session).generate(PROMPT, tokens, progress=False, eos_token_id=-1).decode_latency


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"per-token decode latency, {args.tokens} tokens, best of {args.rounds} interleaved rounds")
    print(f"{'model':<20}{'trace off ms':>14}{'trace on ms':>13}{'overhead':>10}")
    for label, flavor in (("llama small (onnx)", "onnx"), ("llama small (genai)", "genai")):
        data = models.llama("small", flavor=flavor).SerializeToString()
        off = min(latency(data, False, args.tokens) for _ in range(args.rounds))
        on = min(latency(data, True, args.tokens) for _ in range(args.rounds))
        print(f"{label:<20}{off * 1e3:>14.2f}{on * 1e3:>13.2f}{on / off - 1:>10.1%}")


if __name__ == "__main__":
    main()
